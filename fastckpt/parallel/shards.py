"""Tensor parallelism's split of the layers, and one rank's slices of them in one flat buffer.

:func:`split_layers` says which layers are row-split (Megatron's column/row pairs counted from
the output, :mod:`fastckpt.parallel.tensor`) and which rows and columns of each weight a rank
holds; :class:`Shard` lays those slices out, each weight then its bias, in one flat buffer,
as parameters, gradients and the optimizer's state all are.
"""

import numpy as np

from fastckpt.core.checks import check_eta
from fastckpt.core.locks import params_lock
from fastckpt.kernels import sgd_step


def split_layers(sizes, ranks, rank, first=0):
    """``(row_split, slices)``: per layer whether it is row-split, and rank ``rank``'s
    ``((r0, r1), (c0, c1))`` of its weight ``W[r0:r1, c0:c1]`` (and bias ``b[r0:r1]``).

    Units are split as ``np.array_split`` splits them; a ValueError names a layer too narrow for
    the ranks (counting layers from ``first``: ``sizes`` a pipeline stage's part of a net)."""
    n_layers = len(sizes) - 1
    row_split = [(n_layers - 1 - layer) % 2 == 0 for layer in range(n_layers)]
    slices = []
    for layer, row in enumerate(row_split):
        k = layer if row else layer + 1                   # the width this layer splits
        if sizes[k] < ranks:
            raise ValueError(f"layer {layer + first} splits its {'inputs' if row else 'outputs'}, sizes[{k + first}] = "
                             f"{sizes[k]} units, over {ranks} ranks, but every rank needs at least one; "
                             f"use at most {sizes[k]} rank{'s' * (sizes[k] > 1)} or widen that layer")
        q, extra = divmod(sizes[k], ranks)                # as np.array_split: the first `extra` get q + 1
        lo = rank * q + min(rank, extra)
        part = (lo, lo + q + (rank < extra))
        slices.append(((0, sizes[k + 1]), part) if row else (part, (0, sizes[k - 1])))
    return row_split, slices


def shard_nbytes(slices, dtype):
    """The bytes of a :class:`Shard` of ``slices``, without making one."""
    return sum((r1 - r0) * (c1 - c0 + 1) for (r0, r1), (c0, c1) in slices) * np.dtype(dtype).itemsize


class Shard:
    """A rank's slices ``slices`` (of :func:`split_layers`) as parameters: ``flat`` holds each weight
    slice (local n_out, local n_in), then its bias slice; ``blocks`` is the one range they fill.

    It answers what :class:`~fastckpt.core.optimizers.OptimizerState` asks of parameters
    (``new_buffer``, ``check_buffer``, ``flat``, ``blocks``, ``lock``, ``update``), so the optimizer's
    state lies beside the slices in the same layout.
    """

    def __init__(self, slices, dtype):
        self.shapes = [(r1 - r0, c1 - c0) for (r0, r1), (c0, c1) in slices]   # (local n_out, local n_in)
        self.dtype = np.dtype(dtype)
        total = shard_nbytes(slices, self.dtype) // self.dtype.itemsize
        self.flat = np.zeros(total, dtype=self.dtype)
        self.blocks = np.array([[0, total]], dtype=np.int64)
        self.lock = params_lock(self)           # NOTE [ A fork inside a step ]

    def views(self, buf):
        """``(weights, biases)``: per layer the (local n_out, local n_in) and (local n_out,) views of ``buf``."""
        ws, bs, at = [], [], 0
        for n_out, n_in in self.shapes:
            ws.append(buf[at:at + n_out * n_in].reshape(n_out, n_in))
            bs.append(buf[at + n_out * n_in:at + n_out * (n_in + 1)])
            at += n_out * (n_in + 1)
        return ws, bs

    def layers(self):
        """``views(flat)``: the slices' weights and biases."""
        return self.views(self.flat)

    def update(self, grad, eta):
        """SGD, ``flat -= eta * grad``, refused whole (FloatingPointError) if a value would become NaN or inf."""
        self.check_buffer(grad, "grad")
        with self.lock:
            if not sgd_step(self.flat, grad, check_eta(eta), self.blocks):
                raise FloatingPointError("the update would make this rank's parameters NaN or inf; weights left "
                                         "unchanged")

    def new_buffer(self):
        """A zeroed buffer in this layout."""
        return np.zeros_like(self.flat)

    def check_buffer(self, buf, name):
        """Refuse ``buf`` unless it is a buffer of this layout."""
        if not isinstance(buf, np.ndarray) or buf.shape != self.flat.shape or buf.dtype != self.dtype:
            raise ValueError(f"{name} must be a flat {self.dtype.name} buffer of {self.flat.shape[0]} numbers")
        return buf
