"""Tensor (model) parallelism: every layer's units split over the shards of a stage, Megatron-LM's way.

The split is :func:`fastckpt.core.layout.tensor_split`: counted from the output, layers alternate between
*row-split* (a shard holds ``W[:, cols]`` and the whole bias; the partial products ``a_r W_r^T`` are summed
over the shards, then every shard adds the bias and applies ``f``) and *column-split* (``W[rows, :]``,
``b[rows]``; the output slice ``f(a W_r^T + b_r)`` is whole).  So each pair needs one sum forward, and as
the last layer is row-split the output and the loss (a softmax too) are whole and the same on every shard.
Backward, a row-split layer gives its input slice's delta locally and a column-split one ``l > 0`` the parts
``(dz_r W_r) * f'(a)`` of its whole input's delta, summed over the shards (``f'`` applied before the sum,
in the same kernel as one process, which moves the result by a rounding).

A shard is a plan of its own widths that the one :class:`~fastckpt.engine.engine.Engine` runs (NOTE [ One
engine for every part ]): every strategy (``revolve``, ``budget``, ``fit`` too), byte bounds and the
optimizer in the backward pass come from its op table, the sums from :class:`ShardSums`, which the engine
calls between a row-split layer's two halves.  Every shard runs the same ops: the plan's tree is chosen on
the widest shard (:func:`~fastckpt.planner.plan.shard_plan`), since a recomputed row-split layer sums over
all of them again.

Bytes a shard sends per update of ``B`` rows (counted by :class:`ShardSums` as they are sent):

.. math::  S = \\frac{2 (T - 1)}{T} \\sum_{\\mathrm{sums}} s B n

an ``Allreduce`` of ``N`` bytes counted as a bandwidth-optimal one (ring, Rabenseifner) sends,
``2 (T - 1) / T * N`` (MPICH's recursive doubling, for small messages on more ranks, sends ``log2(T) N``).
"""
import numpy as np

from fastckpt.core.layout import tensor_split


class ShardSums:
    """What the engine of a tensor shard asks of the shards' communicator ``comm``: :meth:`sum` a buffer over them
    in place, :meth:`total` a float; ``sent`` counts the bytes it sent, as the module docstring counts them."""

    def __init__(self, comm, MPI):
        self.comm, self.MPI = comm, MPI
        self.share = 2 * (comm.Get_size() - 1) / comm.Get_size()      # an Allreduce's bytes sent per byte summed
        self.sent = 0
        self._one = np.zeros(1, dtype=np.float64)

    def sum(self, buf):
        self.comm.Allreduce(self.MPI.IN_PLACE, buf)
        self.sent += round(self.share * buf.nbytes)

    def total(self, value):
        self._one[0] = value
        self.sum(self._one)
        return float(self._one[0])

    def gather_columns(self, part, whole, widths, scratch):
        """Every shard's column slice ``part`` (rows, widths[t]) of ``whole`` (rows, sum of widths) gathered into
        ``whole`` on each, through ``scratch`` (at least rows x widest x shards elements)."""
        rows, step = part.shape[0], part.shape[0] * max(widths)
        counts, displs = [rows * w for w in widths], [step * t for t in range(len(widths))]
        mine = self.comm.Get_rank()
        scratch[displs[mine]:displs[mine] + counts[mine]] = part.reshape(-1)
        self.comm.Allgatherv(self.MPI.IN_PLACE, [scratch, (counts, displs)])
        col = 0
        for t, width in enumerate(widths):
            whole[:, col:col + width] = scratch[displs[t]:displs[t] + rows * width].reshape(rows, width)
            col += width
        self.sent += round(self.share / 2 * whole.nbytes)                 # an Allgather: half an Allreduce


def pieces(sizes, shards, shard, weights, biases, first=0):
    """A shard's ``(layer, rows, cols, w, b)`` of its ``weights`` and ``biases`` (views of its parameters or of a
    buffer in their layout), as :meth:`~fastckpt.parallel.mpi.Group.gather_net` takes them: a row-split
    layer's whole bias from shard 0 alone; ``first``: the index of the first of ``sizes``' layers."""
    _, row_split, slices = tensor_split(sizes, shards, shard)
    return [(first + i, rows, cols, w.copy(), b.copy() if not row or shard == 0 else None)
            for i, (w, b, (rows, cols), row) in enumerate(zip(weights, biases, slices, row_split))]


def take(slices, weights, biases, whole_weights, whole_biases, first=0):
    """Set a shard's ``weights`` and ``biases`` (views) from the whole net's lab-shaped arrays, by its ``slices``
    (:func:`~fastckpt.core.layout.tensor_split`'s)."""
    for i, (w, b, ((r0, r1), (c0, c1))) in enumerate(zip(weights, biases, slices)):
        w[...] = whole_weights[first + i][r0:r1, c0:c1]
        b[...] = np.asarray(whole_biases[first + i]).reshape(-1)[r0:r1]
