"""The buffers a plan runs in: activations (with the gradients at the arena's top), deltas and scratch.

Allocated once per plan; a smaller batch uses the leading rows of the same
buffers.  :attr:`Workspace.table` is the plan's ops as the offsets of their
operands in these buffers, for :func:`fastckpt.kernels.run_ops`, and
:attr:`Workspace.runs` cuts it into one run per segment.
"""
import numpy as np

from .costs import delta_elems

FWD, LOSS, BWD = 0, 1, 2  # op kinds


class Workspace:
    """Buffers sized from a plan, and per-batch-size views of them for each op."""

    def __init__(self, plan):
        self.plan = plan
        sizes, batch = plan.sizes, plan.batch_size
        self.activations = np.empty(plan.arena_elems, dtype=plan.dtype)     # and the gradients at its top
        self.deltas = np.empty(delta_elems(sizes, batch), dtype=plan.dtype)
        self.scratch = np.empty(max(sizes[1:]), dtype=np.float64)
        self._odd_rows = max(sizes[1::2]) * batch          # deltas of a[1], a[3], ... first
        self._stage = {}
        self._gradients = self.activations[plan.grad_offset:]
        self.table = self._table()
        self.runs = self._runs()

    def gradients(self):
        """The flat gradients at the arena's top, in the parameters' layout."""
        return self._gradients

    def stage(self, name, batch, width):
        """A (batch, width) buffer to convert inputs into (allocated on first need)."""
        key = (name, width)
        if key not in self._stage:
            self._stage[key] = np.empty((self.plan.batch_size, width), dtype=self.plan.dtype)
        return self._stage[key][:batch]

    def _delta_at(self, index):
        """Offset of a[index]'s delta in ``deltas`` (-1 for the input, which has none)."""
        if index == 0:
            return -1
        return 0 if index % 2 == 1 else self._odd_rows

    def _table(self):
        """(n_ops, 6) int64 rows ``kind, layer, read, write, d_out, d_in`` (-1: x, or none)."""
        rows = []
        for (kind, layer), read, write in zip(self.plan.ops, self.plan.reads, self.plan.writes):
            read = -1 if read is None else read
            if kind == "fwd":
                rows.append((FWD, layer, read, write, -1, -1))
            elif kind == "loss":
                rows.append((LOSS, layer, read, -1, self._delta_at(layer), -1))
            else:
                rows.append((BWD, layer, read, -1, self._delta_at(layer + 1), self._delta_at(layer)))
        return np.array(rows, dtype=np.int64).reshape(-1, 6)

    def _runs(self):
        """[lo, hi) op ranges: a new run at every forward op that follows a backward one, so a
        plain plan is one run and a checkpointed one a run per recomputed segment."""
        kinds = self.table[:, 0]
        starts = [0] + [i for i in range(1, len(kinds)) if kinds[i] == FWD and kinds[i - 1] == BWD]
        return list(zip(starts, starts[1:] + [len(kinds)]))
