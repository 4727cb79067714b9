"""One stage's part of a minibatch: its micro-batches' passes in the schedule's order, with the messages."""
import time

import numpy as np

from fastckpt.kernels import BAD_LOSS, BAD_UPDATE, OK, all_finite

from .links import Link
from .schedules import in_flight


class StageRunner:
    """A :class:`~.stage.Stage`, its links and stage-input buffers, for micro-batches of up to ``rows`` rows in the
    schedule ``order`` on stage ``index`` of ``stages`` of a replica's ``pipe``
    (:class:`~fastckpt.parallel.mpi.Group`, None for one stage); ``widths``: the stage's whole input and
    output widths; ``transport``: how messages between stages are encoded; ``lo``: its first layer's number."""

    def __init__(self, stage, rows, order, pipe, index, stages, transport, widths, lo=0):
        self.stage, self.rows, self.order, self.lo = stage, rows, order, lo
        self.first, self.last = index == 0, index == stages - 1
        self.split = any(op == "W" for op, _ in order)          # zb1: B computes the deltas, W the gradients
        dtype = stage.plan.dtype
        self.inputs = [] if self.first else [np.empty((rows, widths[0]), dtype=dtype)
                                             for _ in range(in_flight(order))]
        self.up = None if self.first else Link(pipe, index - 1, transport, dtype, rows, widths[0])
        self.down = None if self.last else Link(pipe, index + 1, transport, dtype, rows, widths[1])
        self.busy = 0.0
        self.reported = (stage.copied_bytes, stage.sent_bytes)   # already in the trainer's stats (a shard's sums
                                                                 # outlive a runner made anew)

    def run(self, params, acc, xb, yb, edges, stats, add=False, step=None):
        """Every pass of ``order`` for the micro-batches ``xb[edges[k]:edges[k+1]]``; the gradients' sum, the
        mini-batch's mean gradient, goes to ``acc``, or is added to what it holds with ``add``; with ``step``,
        ``(eta, optimizer state)`` of a plan for the optimizer in backward, each layer steps instead (NOTE [ The
        optimizer in backward across stages ]).  Returns (a loss was not finite, the mini-batch's mean loss on
        the last stage) and adds this mini-batch's time, busy time and bytes to ``stats``."""
        start = time.perf_counter()
        self.busy, bad, loss_sum, backwards, weights = 0.0, False, 0.0, 0, 0
        self.nonfinite = False               # a message that would carry NaN or inf: sent as zeros, update refused
        inputs, free, batch = {}, list(range(len(self.inputs))), edges[-1]
        for op, k in self.order:
            lo, hi = edges[k], edges[k + 1]
            if op == "F":
                inputs[k] = self._forward(params, xb, k, lo, hi, free)
                continue
            if op == "W":
                t0 = time.perf_counter()
                self.stage.backward_weights(params, k, acc, 1.0 / batch, add=add or weights > 0, l2=weights == 0)
                self.busy += time.perf_counter() - t0
                weights += 1
                continue
            x = inputs.pop(k)
            status, loss = self._backward(params, acc, x, yb, k, lo, hi, batch, add=add or backwards > 0,
                                          l2=backwards == 0, step=step)
            backwards += 1
            bad = bad or status == BAD_LOSS
            loss_sum += loss * (hi - lo) / batch if self.last else 0.0
            if not self.first:
                free.append(next(i for i, buf in enumerate(self.inputs) if np.shares_memory(buf, x)))
        for link in (self.up, self.down):
            if link is not None:
                link.wait()
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

    def _backward(self, params, acc, x, yb, k, lo, hi, batch, add, l2, step=None):
        """Micro-batch ``k``'s backward pass, its input's delta sent back; returns (status, loss).

        NOTE [ The optimizer in backward across stages ]
        With one micro-batch and one replica each stage's layers step as their
        gradients are final, as one process's do, from the last stage back.  A
        loss that is not finite stops the step before any layer steps: the last
        stage sends an empty message instead of its input's delta, and each stage
        that receives one skips its backward pass and sends one on, so every
        rank reports the loss with the weights unchanged.  An update that would
        make a layer NaN or inf (or an input delta that is) ends the job, as a
        shard's own refused update does (NOTE [ Errors on every rank ]): the
        layers after it have already stepped."""
        stage = self.stage
        if not self.last and not self.down.recv(stage.output_delta(hi - lo), 2 * k + 1):
            stage.skip(k)
            if not self.first:
                self.up.stop(2 * k + 1)
            return BAD_LOSS, 0.0
        t0 = time.perf_counter()
        y = yb[lo:hi] if self.last else None
        if self.split:
            status, loss = stage.backward_input(params, x, y, k)
        else:
            status, loss = stage.backward(params, x, y, k, acc, 1.0 / batch, add=add, l2=l2, step=step)
        self.busy += time.perf_counter() - t0
        if step is not None:
            if status >= BAD_UPDATE or not (self.first or status != OK or all_finite(stage.input_delta(hi - lo))):
                what = f"layer {self.lo + status - BAD_UPDATE}'s update" if status >= BAD_UPDATE else \
                    f"the delta of layer {self.lo}'s input"
                raise FloatingPointError(f"{what} would be NaN or inf with the optimizer in backward; the layers "
                                         "after it (if any) have stepped")
            if status != OK and not self.first:
                self.up.stop(2 * k + 1)
                return status, loss
        if not self.first:
            if status == BAD_LOSS:
                stage.input_delta(hi - lo)[...] = 0.0      # the others' gradients are thrown away
            self.up.send(self._finite(stage.input_delta(hi - lo)), 2 * k + 1)
        return status, loss
