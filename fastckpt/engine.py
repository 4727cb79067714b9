"""Runs a plan: the one training step that every network and strategy shares.

The workspace (activations, deltas, scratch) is allocated once per plan and
reused for every step; a smaller batch uses leading rows of the same buffers.
"""
import numpy as np

from fastckpt.kernels import dense_backward, dense_forward, quadratic_delta

from .plan import delta_elems


class Workspace:
    """Buffers sized from a plan, and per-batch-size views of them for each op."""

    def __init__(self, plan):
        self.plan = plan
        sizes, batch = plan.sizes, plan.batch_size
        self.activations = np.empty(plan.workspace_elems, dtype=plan.dtype)
        self.deltas = np.empty(delta_elems(sizes, batch), dtype=plan.dtype)
        self.scratch = np.empty(max(sizes[1:]), dtype=np.float64)
        self._odd_rows = max(sizes[1::2]) * batch          # a[1], a[3], ... deltas first
        self._ops = {}
        self._stage = {}

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
        start = 0 if index % 2 == 1 else self._odd_rows
        return self.deltas[start:start + batch * width].reshape(batch, width)

    def _build(self, batch):
        plan = self.plan
        built = []
        for (kind, layer), reads, write in zip(plan.ops, plan.reads, plan.writes):
            if kind == "fwd":
                built.append((True, layer, self._act(reads[0], layer, batch),
                              self._act(write, layer + 1, batch), None, None))
            else:
                d_in = (self._delta(layer, batch) if layer > 0
                        else np.empty((0, plan.sizes[0]), dtype=plan.dtype))
                built.append((False, layer, self._act(reads[0], layer, batch),
                              self._act(reads[1], layer + 1, batch), self._delta(layer + 1, batch), d_in))
        return built


class Engine:
    """Forward and backward over a plan for one network's parameters."""

    def __init__(self, plan):
        self.plan = plan
        self.workspace = Workspace(plan)
        self.forward_counts = [0] * plan.n_layers
        self.trace = None                        # set to a list to record (op, layer) events

    def step(self, x, y, weights, biases, grad_w, grad_b):
        """Gradients of the mean loss over the batch into grad_w, grad_b; returns the loss."""
        batch = x.shape[0]
        scale = 1.0 / batch
        scratch = self.workspace.scratch
        counts = self.forward_counts
        for i in range(len(counts)):
            counts[i] = 0
        trace = self.trace
        loss = np.nan
        last = self.plan.n_layers - 1
        for is_fwd, layer, a_in, a_out, d_out, d_in in self.workspace.ops(batch):
            if a_in is None:
                a_in = x
            if is_fwd:
                dense_forward(a_in, weights[layer], biases[layer], scratch, a_out)
                counts[layer] += 1
            else:
                if layer == last:
                    loss = quadratic_delta(a_out, y, d_out)
                    if not np.isfinite(loss):
                        raise FloatingPointError(f"the loss is {loss} (non-finite); weights left unchanged")
                dense_backward(a_in, a_out, weights[layer], d_out, scale, scratch,
                               grad_w[layer], grad_b[layer], d_in)
            if trace is not None:
                trace.append(("fwd" if is_fwd else "bwd", layer))
        return loss
