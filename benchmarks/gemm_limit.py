"""The hardware limit of a training step: its GEMMs alone, on the same shapes, with nothing else.

Per layer ``l``: the forward ``A[l] W[l]^T``, the weight gradient ``G[l+1]^T A[l]`` and,
above the first layer, the delta ``G[l+1] W[l]``, all into preallocated buffers.  No
sigmoid, no loss, no update: what is left when everything but the BLAS is free.
"""
import numpy as np


class NumpyGemms:
    """Through numpy's BLAS (the OpenBLAS numpy ships, which fastckpt's kernels call)."""

    def __init__(self, sizes, batch, dtype):
        rng = np.random.default_rng(0)
        dtype = np.dtype(dtype)
        self.w = [rng.standard_normal((o, i)).astype(dtype) for i, o in zip(sizes[:-1], sizes[1:])]
        self.g = [np.empty_like(w) for w in self.w]
        self.a = [rng.random((batch, n)).astype(dtype) for n in sizes]
        self.d = [np.empty((batch, n), dtype=dtype) for n in sizes]
        for d in self.d:
            d[...] = 1e-3

    def update_mini_batch(self, *_):
        a, d, w, g = self.a, self.d, self.w, self.g
        for layer, wl in enumerate(w):
            np.matmul(a[layer], wl.T, out=a[layer + 1])
        for layer in range(len(w) - 1, -1, -1):
            np.matmul(d[layer + 1].T, a[layer], out=g[layer])
            if layer:
                np.matmul(d[layer + 1], w[layer], out=d[layer])


class TorchGemms(NumpyGemms):
    """Through PyTorch's BLAS (MKL in the CPU wheels), on tensors sharing the same memory."""

    def __init__(self, sizes, batch, dtype, threads):
        import torch
        super().__init__(sizes, batch, dtype)
        torch.set_num_threads(threads)
        self.torch = torch
        self.w, self.g, self.a, self.d = ([torch.from_numpy(x) for x in xs] for xs in (self.w, self.g, self.a, self.d))

    def update_mini_batch(self, *_):
        torch, a, d, w, g = self.torch, self.a, self.d, self.w, self.g
        for layer, wl in enumerate(w):
            torch.matmul(a[layer], wl.T, out=a[layer + 1])
        for layer in range(len(w) - 1, -1, -1):
            torch.matmul(d[layer + 1].T, a[layer], out=g[layer])
            if layer:
                torch.matmul(d[layer + 1], w[layer], out=d[layer])
