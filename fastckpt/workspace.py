"""The buffers a plan runs in: activations (with the gradients at the arena's top), deltas and scratch.

Allocated once per plan; a smaller batch uses the leading rows of the same
buffers.  :meth:`Workspace.ops` turns the plan's ops into kernel arguments:
views of these buffers at the offsets the plan laid out.
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
        self._ops = {}
        self._stage = {}

    def gradients(self):
        """The flat gradients at the arena's top, in the parameters' layout."""
        return self.activations[self.plan.grad_offset:]

    def ops(self, batch):
        """Per-op kernel arguments for ``batch`` rows (<= the planned batch)."""
        if batch not in self._ops:
            self._ops[batch] = self._build(batch)
        return self._ops[batch]

    def stage(self, name, batch, width):
        """A (batch, width) buffer to convert inputs into (allocated on first need)."""
        key = (name, width)
        if key not in self._stage:
            self._stage[key] = np.empty((self.plan.batch_size, width), dtype=self.plan.dtype)
        return self._stage[key][:batch]

    def _act(self, offset, index, batch):
        if offset is None:
            return None
        width = self.plan.sizes[index]
        return self.activations[offset:offset + batch * width].reshape(batch, width)

    def _delta(self, index, batch):
        width = self.plan.sizes[index]
        if index == 0:
            return np.empty((0, width), dtype=self.plan.dtype)  # the input has no delta
        start = 0 if index % 2 == 1 else self._odd_rows
        return self.deltas[start:start + batch * width].reshape(batch, width)

    def _build(self, batch):
        built = []
        for (kind, layer), read, write in zip(self.plan.ops, self.plan.reads, self.plan.writes):
            a = self._act(read, layer, batch)
            if kind == "fwd":
                built.append((FWD, layer, a, self._act(write, layer + 1, batch), None))
            elif kind == "loss":
                built.append((LOSS, layer, a, self._delta(layer, batch), None))
            else:
                built.append((BWD, layer, a, self._delta(layer + 1, batch), self._delta(layer, batch)))
        return built
