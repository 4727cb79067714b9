"""The layers of a :class:`~fastckpt.parallel.tensor.TensorParallelTrainer` rank: forward, backward and the
recomputation of what a checkpointing strategy did not keep.

NOTE [ Checkpoints in tensor parallelism ]
With a strategy (``every_nth(n)``, ``segments(k)``, ``sqrt``), a rank keeps after the forward pass only its
slices of the states the strategy's plan keeps (:func:`kept_states`: the plan of the whole net, whose
``kept`` states and one recomputation of each other state are the same on every rank).  The other states
share one buffer, as long as the longest run of them; before the backward pass reaches a run, the run is
computed again from the kept state below it, with the same kernels and the same ``Allreduce`` of each
row-split layer, so its values are the first forward's bit for bit and training is plain tensor
parallelism's, at the cost of one more forward pass (and its messages) over the recomputed layers.
"""
import gc

import numpy as np

from fastckpt.core.losses import l2_penalty
from fastckpt.core.resources import shown_bytes
from fastckpt.kernels import (
    NO_TRANS,
    TRANS,
    bias_activation,
    dense_backward,
    dense_forward_layer,
    gemm,
    output_delta,
)
from fastckpt.planner import InfeasiblePlan, parse_strategy
from fastckpt.planner import plan as make_plan
from fastckpt.planner.costs import describe_sizes
from fastckpt.planner.strategies import EveryNth, Fit, Plain, Segments, Sqrt


def check_tensor_strategy(strategy):
    """``strategy`` parsed, refused unless tensor parallelism runs it (each dropped state computed once more)."""
    strategy = parse_strategy(strategy)
    if not isinstance(strategy, (Plain, EveryNth, Segments, Sqrt, Fit)):
        raise ValueError(f"strategy {strategy} does not apply to tensor parallelism, which recomputes each "
                         "dropped state once: use plain, every_nth(n), segments(k), sqrt or fit(bytes)")
    return strategy


def fit_strategy(sizes, fit, total_of, what, top_free=False):
    """``fit(bytes)`` in tensor parallelism (NOTE [ Checkpoints in tensor parallelism ]): of plain,
    every_nth(n), segments(k) and sqrt, the one that computes the least forward work again (the GEMM
    FLOPs of the layers whose output it drops; the top run none when ``top_free``: still in its buffer)
    among those whose ``total_of(strategy)`` bytes fit; ties to fewer bytes.  InfeasiblePlan, naming the
    least bytes of all of them and ``what`` they were planned for, when none fits."""
    n_layers = len(sizes) - 1
    family = [Plain(), Sqrt()] + [EveryNth(n) for n in range(2, n_layers + 1)] + \
        [Segments(k) for k in range(1, n_layers + 1)]
    found = []
    for strategy in family:
        _, runs = kept_states(sizes, strategy)
        work = sum(sizes[j - 1] * sizes[j] for run in runs[:len(runs) - top_free] for j in run)
        found.append((work, total_of(strategy), str(strategy), strategy))
    fits = [f for f in found if f[1] <= fit.nbytes]
    if not fits:
        least = min(f[1] for f in found)
        raise InfeasiblePlan(f"{fit}: {describe_sizes(sizes)} at {what} needs at least {least} bytes "
                             f"({shown_bytes(least)}) on its widest tensor shard, keeping the fewest states "
                             f"that plain, every_nth(n), segments(k) or sqrt keep; got {fit.nbytes}", least)
    gc.collect()                          # the candidates' plans hold reference cycles: not to sit beside the buffers
    return min(fits)[3]


def kept_states(sizes, strategy):
    """The states ``a[j]`` a tensor-parallel rank keeps after the forward pass under ``strategy`` (NOTE
    [ Checkpoints in tensor parallelism ]), and the runs of the others, as lists of consecutive ``j``."""
    strategy = check_tensor_strategy(strategy)
    if isinstance(strategy, Fit):
        raise ValueError(f"{strategy} keeps what fit_strategy chooses for a batch size; choose it first")
    strategy.check(sizes)
    kept = set(make_plan(sizes, 1, np.float64, strategy).kept)
    runs, run = [], []
    for j in range(1, len(sizes)):
        if j in kept:
            runs, run = runs + [run] * bool(run), []
        else:
            run.append(j)
    return sorted(kept), runs + [run] * bool(run)


def split_layer(a, w, b, act, row, comm, MPI, scratch, out):
    """One split layer forward: ``out = f(a W_r^T + b_r)`` for a column-split layer; for a row-split one the
    partial ``a_r W_r^T``, summed over ``comm`` by an ``Allreduce``, then the whole bias and ``f``."""
    if not row:
        dense_forward_layer(a, w, b, act, scratch, out)
        return
    n_out, n_in = w.shape
    gemm(NO_TRANS, TRANS, a.shape[0], n_out, n_in, 1.0, a, n_in, w, n_in, 0.0, out, n_out)
    comm.Allreduce(MPI.IN_PLACE, out)                         # partial pre-activations -> whole
    bias_activation(out, b, act, scratch)


class TensorLayers:
    """Forward, backward and recomputation on a rank's slices (the trainer's ``_w``, ``_b``, ``_slices``...)."""

    def _buffers(self, batch):
        """Activations (kept states their own, the others one shared run buffer), the input slice and two
        delta buffers for ``batch`` rows, made once per batch size."""
        if batch <= self._cap:
            return
        self._cap = 0                                                         # free the old ones first
        self._kept, self._runs = kept_states(self.sizes, self.step_strategy(batch))   # fit(bytes): for this batch
        widths, runs = self._widths, self._runs
        pool = np.empty(batch * max([sum(widths[j] for j in run) for run in runs] + [0]), dtype=self.dtype)
        self._a = [None] * len(widths)
        for run in runs:
            at = 0
            for j in run:
                self._a[j] = pool[at:at + batch * widths[j]].reshape(batch, widths[j])
                at += batch * widths[j]
        for j in range(1, len(widths)):
            if self._a[j] is None:
                self._a[j] = np.empty((batch, widths[j]), dtype=self.dtype)
        c0, c1 = self._slices[0][1]
        self._x_part = np.empty((batch, c1 - c0), dtype=self.dtype) if self.row_split[0] else None
        most = batch * max(widths[1:])
        self._deltas = (np.empty(most, dtype=self.dtype), np.empty(most, dtype=self.dtype))
        self._cap = batch

    def _delta(self, layer, batch):
        """The delta of ``layer``'s output, shaped like ``a[layer + 1]``: the two buffers alternate."""
        width = self._widths[layer + 1]
        return self._deltas[layer % 2][:batch * width].reshape(batch, width)

    def _layers(self, a, lo, hi, batch):
        """States ``a[lo + 1 .. hi]`` from ``a`` (state ``lo``); returns state ``hi``."""
        for layer in range(lo, hi):
            out = self._a[layer + 1][:batch]                  # (batch, local n_out)
            split_layer(a, self._w[layer], self._b[layer], self._acts[layer + 1], self.row_split[layer], self.comm,
                        self.MPI, self._scratch, out)
            a = out
        return a

    def _forward(self, x, y, total=None):
        """Forward over every layer and the loss delta; returns (layer 0's input, mean loss + penalty), the
        loss that of the whole minibatch of ``total`` rows, over the replicas, when given."""
        batch, n_layers = x.shape[0], len(self._w)
        penalty = self._penalty()
        a0 = x
        if self.row_split[0]:                                 # layer 0 takes its columns of x
            a0 = self._x_part[:batch]
            a0[...] = x[:, slice(*self._slices[0][1])]
        a = self._layers(a0, 0, n_layers, batch)
        dz = self._delta(n_layers - 1, batch)
        data = output_delta(a, y, dz, self._acts[n_layers])       # the output's code names the loss
        if total is not None and self.replicas.data is not None:   # the replicas' rows, weighted by their share
            self._loss_sum[0] = data * batch / total
            self.replicas.data.Allreduce(self.MPI.IN_PLACE, self._loss_sum, op=self.MPI.SUM)
            data = float(self._loss_sum[0])
        return a0, data + penalty

    def _backward(self, a0, batch, total):
        """Gradients of this rank's slices into the gradient buffer, top layer first, for ``batch`` rows of a
        minibatch of ``total`` (the L2 term on replica 0 alone: the replicas' sum counts it once); each run
        of dropped states computed again as the pass reaches it (NOTE [ Checkpoints in tensor parallelism ])."""
        scale, l2 = 1.0 / total, self.replicas.own_l2(self.l2)
        starts = {run[-1]: run[0] for run in self._runs[:-1]}  # the top run is still in its buffer
        for layer in reversed(range(len(self._w))):
            if layer in starts:                               # a[layer] was dropped: its run again
                lo = starts[layer] - 1
                self._layers(a0 if lo == 0 else self._a[lo][:batch], lo, layer, batch)
            a_in = a0 if layer == 0 else self._a[layer][:batch]
            dz_in = self._no_delta if layer == 0 else self._delta(layer - 1, batch)
            dense_backward(a_in, self._w[layer], self._delta(layer, batch), scale, self._scratch,
                           self._gw[layer], self._gb[layer], dz_in, l2[layer], self._acts[layer])
            if layer > 0 and not self.row_split[layer]:
                self.comm.Allreduce(self.MPI.IN_PLACE, dz_in)  # sum_r (dz_r W_r) * a (1 - a): whole delta

    def _penalty(self):
        """``sum 0.5 * l2 * ||W||^2`` over the whole net: this rank's slices, then one Allreduce."""
        if not any(self.l2):
            return 0.0
        self._penalty_sum[0] = l2_penalty(self.l2, self._w)
        self.comm.Allreduce(self.MPI.IN_PLACE, self._penalty_sum)
        return float(self._penalty_sum[0])
