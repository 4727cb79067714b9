"""Runs a plan: the one training step that every network and strategy shares.

The workspace (activations, deltas, scratch) is allocated once per plan and
reused for every step; a smaller batch uses leading rows of the same buffers.
"""
import numpy as np

from fastckpt.kernels import (
    cross_entropy_delta,
    dense_backward,
    dense_backward_sgd,
    dense_forward,
    dense_forward_log_softmax,
    quadratic_delta,
)

from .schedule import delta_elems, param_layout


def layer_views(flat, sizes):
    """(n_out, n_in) weight and (n_out,) bias views of a flat buffer in the parameter layout."""
    offsets, _ = param_layout(sizes, flat.itemsize)
    w = [flat[w_at:w_at + o * i].reshape(o, i) for (w_at, _), i, o in zip(offsets, sizes[:-1], sizes[1:])]
    b = [flat[b_at:b_at + o] for (_, b_at), o in zip(offsets, sizes[1:])]
    return w, b

FWD, LOSS, BWD = 0, 1, 2
_KINDS = {"fwd": FWD, "loss": LOSS, "bwd": BWD}


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
        """The flat gradients at the arena's top (parameter layout), and per-layer views of them."""
        flat = self.activations[self.plan.grad_offset:]
        return flat, *layer_views(flat, self.plan.sizes)

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


class Engine:
    """Forward and backward over a plan for one network's parameters."""

    def __init__(self, plan, loss="quadratic", l2=None):
        self.plan = plan
        self.workspace = Workspace(plan)
        self.forward_counts = [0] * plan.n_layers
        self.trace = None                        # set to a list to record (op, layer) events
        self.softmax = loss == "cross_entropy"   # log-softmax output and cross-entropy, else sigmoid and quadratic
        self.l2 = tuple(l2) if l2 is not None else (0.0,) * plan.n_layers

    def penalty(self, weights):
        """The L2 term of the loss, sum over layers of ``0.5 * l2 * ||W||^2``."""
        total = 0.0
        if not any(self.l2):
            return total
        for coef, w in zip(self.l2, weights):
            if coef:
                flat = w.reshape(-1)
                total += 0.5 * coef * float(np.dot(flat, flat))
        return total

    def step(self, x, y, weights, biases, grad_w=None, grad_b=None, eta=None):
        """One pass over the plan; returns the mean loss.

        With ``grad_w``/``grad_b`` the batch-mean gradients are written there.
        With ``eta`` instead, each layer's SGD update is applied as soon as its
        gradient is final (optimizer in backward): no gradient buffers at all.
        """
        batch = x.shape[0]
        scale = 1.0 / batch
        step = None if eta is None else eta * scale
        scratch = self.workspace.scratch
        counts = self.forward_counts
        for i in range(len(counts)):
            counts[i] = 0
        trace = self.trace
        loss = np.nan
        last, l2 = self.plan.n_layers - 1, self.l2
        for kind, layer, a, d_out, d_in in self.workspace.ops(batch):
            if a is None:
                a = x
            if kind == FWD:
                if self.softmax and layer == last:
                    dense_forward_log_softmax(a, weights[layer], biases[layer], scratch, d_out)
                else:
                    dense_forward(a, weights[layer], biases[layer], scratch, d_out)
                counts[layer] += 1
            elif kind == LOSS:
                loss = cross_entropy_delta(a, y, d_out) if self.softmax else quadratic_delta(a, y, d_out)
                loss += self.penalty(weights)
                if not np.isfinite(loss):
                    raise FloatingPointError(f"the loss is {loss} (non-finite); weights left unchanged")
            elif step is None:
                dense_backward(a, weights[layer], d_out, scale, scratch, grad_w[layer], grad_b[layer], d_in,
                               l2[layer])
            elif not dense_backward_sgd(a, weights[layer], biases[layer], d_out, step, scratch, d_in,
                                        eta * l2[layer]):
                raise FloatingPointError(
                    f"the update made layer {layer}'s parameters NaN or inf; with the optimizer in "
                    f"backward, layers {layer}..{self.plan.n_layers - 1} are already updated")
            if trace is not None:
                trace.append(("fwd" if kind == FWD else "loss" if kind == LOSS else "bwd", layer))
        return loss
