"""The buffers a plan runs in: activations (with the gradients at the arena's top), deltas and scratch
(and one layer's gradient, for an optimizer with state applied in the backward pass).

Allocated once per plan; a smaller batch uses the leading rows of the same
buffers.  :attr:`Workspace.table` is the plan's ops as the offsets of their
operands in these buffers, for :func:`fastckpt.kernels.run_ops`, and
:attr:`Workspace.runs` cuts it into one run per segment.
"""
import numpy as np

from fastckpt.planner.costs import delta_elems

from .batches import Staging

FWD, LOSS, BWD = 0, 1, 2  # op kinds


class Workspace:
    """Buffers sized from a plan, and per-batch-size views of them for each op.

    A pipeline stage (:mod:`fastckpt.parallel.pipeline.stage`) runs a plan of its own layers
    with two changes: with ``input_delta`` the first layer's backward also
    gives the delta of its input ``a[0]`` (for the stage before), and with
    ``given_delta`` there is no loss op: the delta of the last state ``a[L]``
    is written into :meth:`delta` before the backward pass (it comes from the
    stage after).
    """

    def __init__(self, plan, *, input_delta=False, given_delta=False):
        self.plan = plan
        self.input_delta, self.given_delta = bool(input_delta), bool(given_delta)
        sizes, batch = plan.sizes, plan.batch_size
        self.activations = np.empty(plan.arena_elems, dtype=plan.dtype)     # and the gradients at its top
        self.deltas = np.empty(workspace_delta_elems(sizes, batch, self.input_delta), dtype=plan.dtype)
        self.scratch = np.empty(max(sizes[1:]), dtype=np.float64)
        stateful = plan.optimizer_in_backward and plan.optimizer.slots
        self.layer_grad = np.empty(plan.bytes()["gradients"] // plan.itemsize if stateful else 0, dtype=plan.dtype)
        self._odd_rows = max(sizes[1::2]) * batch          # deltas of a[1], a[3], ... first
        self.staging = Staging(batch, plan.dtype)           # minibatches of another dtype or layout
        self._gradients = self.activations[plan.grad_offset:]
        self.table = self._table()
        self.runs = self._runs()

    def gradients(self):
        """The flat gradients at the arena's top, in the parameters' layout."""
        return self._gradients

    def delta(self, index, rows):
        """The (rows, sizes[index]) delta of state ``a[index]`` in ``deltas``."""
        at, width = self._delta_at(index), self.plan.sizes[index]
        if at < 0:
            raise ValueError(f"a[{index}] has no delta in this workspace")
        return self.deltas[at:at + rows * width].reshape(rows, width)

    def _delta_at(self, index):
        """Offset of a[index]'s delta in ``deltas`` (-1 for the input, unless ``input_delta``)."""
        if index == 0 and not self.input_delta:
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
                if self.given_delta:
                    continue
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

    @property
    def forward_end(self):
        """Index in :attr:`table` of the first op after the forward pass: where the loss op is, or
        would be with ``given_delta`` (a recomputation may follow it at once)."""
        return self.plan.ops.index(("loss", self.plan.n_layers))


def workspace_delta_elems(sizes, batch_size, input_delta=False):
    """Elements of the two ping-pong delta buffers; with ``input_delta`` the even one holds a[0]'s too."""
    if not input_delta:
        return delta_elems(sizes, batch_size)
    return batch_size * (max(sizes[1::2]) + max(sizes[0::2]))
