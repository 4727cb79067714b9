"""What a shard of a tensor-parallel pipeline stage holds (NOTE [ Tensor-parallel stages ] in :mod:`.tensor_stage`):
its slices and states, its bytes by part, and its forward pass for evaluation."""
import numpy as np

from ..shards import shard_nbytes, split_layers
from ..tensor_layers import kept_states, split_layer


class TensorLayout:
    """A shard's view of a stage of ``sizes`` split ``shards`` ways: its slices, the local width of every
    state, the states a micro-batch keeps and the runs of the others (NOTE [ Tensor-parallel stages ])."""

    def __init__(self, sizes, strategy, shards, shard, last_stage):
        self.sizes, self.n = list(sizes), len(sizes) - 1
        self.row_split, self.slices = split_layers(self.sizes, shards, shard)
        self.widths = [self.sizes[0]] + [r1 - r0 for (r0, r1), _ in self.slices]
        kept, runs = kept_states(self.sizes, strategy)
        top = self.n + (1 if last_stage else 0)                      # states past this are not kept
        self.kept = [j for j in kept if 0 < j < top]
        self.runs = [r for r in ([j for j in run if j < top] for run in runs) if r]
        self.first_cols = self.slices[0][1]                          # the input columns of layer 0
        self.shard, self.shards = shard, shards

    def kept_elems(self):
        return sum(self.widths[j] for j in self.kept)

    def run_elems(self):
        return max([sum(self.widths[j] for j in run) for run in self.runs] + [0])

    def delta_elems(self):
        return max(self.widths[1:])

    def stash_widths(self):
        """Per layer the (input, output) widths of its slice, as zb1's stash keeps them."""
        return [(c1 - c0, r1 - r0) for (r0, r1), (c0, c1) in self.slices]


def tensor_infer(layout, shard, params, acts, comm, MPI, a):
    """A tensor-parallel stage's output of ``a`` (rows, sizes[0]) for evaluation, in buffers of its own."""
    ws, bs = shard.views(params)
    scratch = np.empty(max(layout.sizes[1:]), dtype=np.float64)
    if layout.row_split[0]:
        a = np.ascontiguousarray(a[:, slice(*layout.first_cols)])
    for layer in range(layout.n):
        out = np.empty((a.shape[0], layout.widths[layer + 1]), dtype=shard.dtype)
        split_layer(a, ws[layer], bs[layer], acts[layer + 1], layout.row_split[layer], comm, MPI, scratch, out)
        a = out
    return a


def slice_widths(n, shards):
    """The widths ``np.array_split`` gives ``n`` units over ``shards``."""
    q, extra = divmod(n, shards)
    return [q + (t < extra) for t in range(shards)]


def gather_width(layout):
    """Columns per row of the input-delta gather buffer: the widest slice, for every shard."""
    return max(slice_widths(layout.sizes[0], layout.shards)) * layout.shards


def tensor_stage_bytes(layout, rows, dtype, flight, deferred, *, first_stage, last_stage, slots, replicated):
    """A shard's own bytes by part (NOTE [ Tensor-parallel stages ]), for ``flight`` micro-batches in flight
    and ``deferred`` with W pending; ``slots`` optimizer state buffers; ``replicated``: summed over replicas.
    ``comm_buffers`` is MPI's temporary of the largest in-place ``Allreduce``, made the message's size."""
    item = np.dtype(dtype).itemsize
    params = shard_nbytes(layout.slices, dtype)
    stash = sum(a + d for a, d in layout.stash_widths()) * rows
    row0, sizes = layout.row_split[0], layout.sizes
    elems = rows * (layout.run_elems() + 2 * layout.delta_elems() + (0 if last_stage else sizes[-1])
                    + (layout.first_cols[1] - layout.first_cols[0] if row0 else 0)
                    + (0 if first_stage else sizes[0] + (gather_width(layout) if row0 else 0)))
    messages = [sizes[layer + 1] for layer, row in enumerate(layout.row_split) if row] + \
        [sizes[layer] for layer, row in enumerate(layout.row_split) if not row and (layer or not first_stage)]
    comm = rows * max(messages) * item if layout.shards > 1 else 0
    return {"parameters": params, "gradients": params, "optimizer_state": slots * params,
            "micro_gradients": params, "stored_micro_batches": flight * rows * layout.kept_elems() * item,
            "activations": elems * item, "scratch": 8 * max(sizes[1:]), "deferred_weights": deferred * stash * item,
            "comm_buffers": max(comm, params if replicated else 0)}
