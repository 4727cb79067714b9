"""One stage's part of a minibatch: its micro-batches' passes in the schedule's order, with the messages."""
import time

import numpy as np

from fastckpt.kernels import BAD_LOSS, all_finite

from .links import Link
from .schedules import in_flight, pending_weights, storage_slots
from .stage import Stage
from .tensor_layout import TensorLayout
from .tensor_stage import TensorStage


class StageRunner:
    """The stage (plan, workspace, stored micro-batches), its links and stage-input buffers, for micro-batches
    of up to ``rows`` rows on one rank of a :class:`~fastckpt.parallel.pipeline.PipelineTrainer`: a
    :class:`~.stage.Stage` of ``plan``, or a :class:`~.tensor_stage.TensorStage` of a ``TensorLayout``."""

    def __init__(self, trainer, rows, order, plan):
        self.rows, self.order = rows, order
        self.first, self.last = trainer.first, trainer.last
        kw = dict(first_stage=self.first, last_stage=self.last, softmax=trainer.loss == "cross_entropy",
                  l2=trainer.replicas.own_l2(trainer.l2[trainer.lo:trainer.hi]), acts=trainer.stage_acts,
                  deferred=pending_weights(order))
        if isinstance(plan, TensorLayout):                       # NOTE [ Tensor-parallel stages ]
            self.stage = TensorStage(plan, trainer.params, rows, trainer.replicas.tensor, trainer.MPI,
                                     flight=in_flight(order), **kw)
        else:
            self.stage = Stage(plan, slots=storage_slots(order), **kw)
        self.split = any(op == "W" for op, _ in order)          # zb1: B computes the deltas, W the gradients
        width_in, width_out, dtype = trainer.stage_sizes[0], trainer.stage_sizes[-1], trainer.dtype
        self.inputs = [] if self.first else [np.empty((self.rows, width_in), dtype=dtype)
                                             for _ in range(in_flight(order))]
        group, rank = trainer.pipe, trainer.rank                   # this replica's stages
        self.up = None if self.first else Link(group, rank - 1, trainer.transport, dtype, self.rows, width_in)
        self.down = None if self.last else Link(group, rank + 1, trainer.transport, dtype, self.rows, width_out)
        self.busy = 0.0
        self.reported = (0, 0)             # copied and sent bytes already added to the trainer's stats

    def run(self, params, acc, xb, yb, edges, stats, total=None):
        """Every pass of ``order`` for the micro-batches ``xb[edges[k]:edges[k+1]]``; the gradients' sum goes
        to ``acc``, scaled for a minibatch of ``total`` samples (default: these).  Returns (a loss was not
        finite, the loss summed over the micro-batches on the last stage) and adds this minibatch's time,
        busy time and bytes to ``stats``."""
        start = time.perf_counter()
        self.busy, bad, loss_sum, backwards, weights = 0.0, False, 0.0, 0, 0
        self.nonfinite = False               # a message that would carry NaN or inf: sent as zeros, update refused
        inputs, free, batch = {}, list(range(len(self.inputs))), total or edges[-1]
        for op, k in self.order:
            lo, hi = edges[k], edges[k + 1]
            if op == "F":
                inputs[k] = self._forward(params, xb, k, lo, hi, free)
                continue
            if op == "W":
                t0 = time.perf_counter()
                self.stage.backward_weights(params, k, acc, 1.0 / batch, weights == 0)
                self.busy += time.perf_counter() - t0
                weights += 1
                continue
            x = inputs.pop(k)
            status, loss = self._backward(params, acc, x, yb, k, lo, hi, batch, first=backwards == 0)
            backwards += 1
            bad = bad or status == BAD_LOSS
            loss_sum += loss * (hi - lo) / batch if self.last else 0.0
            if not self.first:
                free.append(next(i for i, buf in enumerate(self.inputs) if np.shares_memory(buf, x)))
        for link in (self.up, self.down):
            if link is not None:
                link.wait()
        stats["updates"] += 1
        stats["busy"] += self.busy
        stats["wall"] += time.perf_counter() - start
        sent = sum(link.sent for link in (self.up, self.down) if link is not None) + self.stage.sent_bytes
        stats["copied_bytes"] += self.stage.copied_bytes - self.reported[0]      # this runner's since its last
        stats["bytes_sent"] += sent - self.reported[1]                           # report: the stats are the run's
        self.reported = (self.stage.copied_bytes, sent)
        return bad or self.nonfinite, loss_sum

    def _finite(self, arr):
        """``arr`` to send: itself, or zeros when it holds NaN or inf (a diverged net), which refuses the
        update on every stage instead of a transport refusing the message."""
        if not all_finite(arr):
            arr[...] = 0.0
            self.nonfinite = True
        return arr

    def _forward(self, params, xb, k, lo, hi, free):
        """Micro-batch ``k``'s forward pass on this stage, its output sent on; returns its stage input."""
        if self.first:
            x = xb[lo:hi]
        else:
            x = self.inputs[free.pop()][:hi - lo]
            self.up.recv(x, 2 * k)
        t0 = time.perf_counter()
        out = self.stage.forward(params, x, k)
        self.busy += time.perf_counter() - t0
        if not self.last:
            self.down.send(self._finite(out), 2 * k)
        return x

    def _backward(self, params, acc, x, yb, k, lo, hi, batch, first):
        """Micro-batch ``k``'s backward pass, its input's delta sent back; returns (status, loss)."""
        stage = self.stage
        if not self.last:
            self.down.recv(stage.output_delta(hi - lo), 2 * k + 1)
        t0 = time.perf_counter()
        y = yb[lo:hi] if self.last else None
        if self.split:
            status, loss = stage.backward_input(params, x, y, k)
        else:
            status, loss = stage.backward(params, x, y, k, acc, 1.0 / batch, first)
        self.busy += time.perf_counter() - t0
        if not self.first:
            if status == BAD_LOSS:
                stage.input_delta(hi - lo)[...] = 0.0      # the others' gradients are thrown away
            self.up.send(self._finite(stage.input_delta(hi - lo)), 2 * k + 1)
        return status, loss
