"""Sizes, bytes and FLOPs of a chain of dense layers: the arithmetic every plan is made of.

States ``a[0] .. a[L]`` are batch-major (batch, sizes[j]) arrays; in the
workspace each starts on a cache line.  Parameters and gradients live in one
flat buffer in the layout of :func:`fastckpt.core.layout.param_layout`.
"""
import numpy as np

from fastckpt.core.layout import ALIGN_BYTES

# OpenBLAS runs a GEMM on min(threads, m*n*k / 262144) threads (interface/gemm.c), so
# on two or more from m*n*k >= 524288; each multi-threaded call mallocs and frees a job
# table, 512 KiB in numpy's build (seen in memray's native traces, and measured at the
# threshold).  It is part of a step's peak.
BLAS_JOB_BYTES = 512 * 1024
BLAS_THREAD_MNK = 2 * 65536 * 4



def act_bytes(sizes, batch_size, itemsize, j):
    """Workspace bytes of state ``a[j]`` (j >= 1), rounded up to a cache line."""
    return -(-batch_size * sizes[j] * itemsize // ALIGN_BYTES) * ALIGN_BYTES


def state_bytes(sizes, batch_size, itemsize):
    """``w[j]`` = workspace bytes of ``a[j]`` for j = 0 .. L (``w[0] = 0``: the input)."""
    return [0] + [act_bytes(sizes, batch_size, itemsize, j) for j in range(1, len(sizes))]


def forward_flops(sizes, batch_size):
    """FLOPs of each layer's forward GEMM, as an array of length L."""
    return np.array([2 * batch_size * i * o for i, o in zip(sizes[:-1], sizes[1:])], dtype=np.float64)


def step_flops(sizes, batch_size):
    """GEMM FLOPs of one plain training step: forward, weight gradients, input deltas."""
    fwd = forward_flops(sizes, batch_size)
    return float(2 * fwd.sum() + fwd[1:].sum())


def delta_elems(sizes, batch_size):
    """Elements of the two ping-pong delta buffers (odd and even state indices)."""
    widths = sizes[1:]
    odd = max(widths[0::2])
    even = max(widths[1::2], default=0)
    return batch_size * (odd + even)


def blas_bytes(sizes, batch_size, threads):
    """Transient bytes OpenBLAS mallocs inside a step's GEMMs (its threaded job table)."""
    if threads <= 1:
        return 0
    threaded = any(batch_size * i * o >= BLAS_THREAD_MNK for i, o in zip(sizes[:-1], sizes[1:]))
    return BLAS_JOB_BYTES if threaded else 0


# One elementwise value of a step (a sigmoid, a sigma' product, a bias sum) takes about as long
# as this many GEMM FLOPs: 0.5-1.2 ns per value against 70-130 GFLOP/s (README, "On AVX2 and
# AVX-512 CPUs").  Only the balance between layers depends on it.
ELEMENT_FLOPS = 64


def layer_costs(sizes, batch_size):
    """Predicted work of each layer in a plain training step, in GEMM FLOPs: the forward, weight
    and input-delta GEMMs (none for layer 0) plus ``ELEMENT_FLOPS`` per elementwise value."""
    costs = []
    for layer, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        gemms = (3 if layer else 2) * 2 * batch_size * n_in * n_out
        elements = batch_size * (2 * n_out + (n_in if layer else 0))
        costs.append(float(gemms + ELEMENT_FLOPS * elements))
    return costs


def describe_sizes(sizes):
    """``[784] + [256]*64 + [10]`` for long runs of equal widths, else the plain list."""
    runs = []
    for size in sizes:
        if runs and runs[-1][0] == size:
            runs[-1][1] += 1
        else:
            runs.append([size, 1])
    if all(n < 4 for _, n in runs):
        return str(list(sizes))
    return " + ".join(f"[{size}]*{n}" if n > 1 else f"[{size}]" for size, n in runs)
