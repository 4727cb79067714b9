"""A pipeline stage whose layers are split over tensor ranks: the stage of a ``Grid(pipeline=P, tensor=T)``.

NOTE [ Tensor-parallel stages ]
With ``T`` shards per stage, each stage's layers are split as a
:class:`~fastckpt.parallel.tensor.TensorParallelTrainer` splits a whole net
(:func:`~fastckpt.parallel.shards.split_layers` of the stage's own sizes: Megatron's column/row pairs
counted from the stage's output), over the stage's ``tensor`` communicator.  So a stage's last layer is
row-split and its output is whole, the same on every shard after that layer's ``Allreduce``: shard
``t`` sends it to shard ``t`` of the next stage, over the pipe of shard index ``t``, and the messages
between stages are a plain pipeline's, ``T`` times over.  Backward, the delta of the stage input is
made whole on every shard too: summed by an ``Allreduce`` when the stage's first layer is column-split,
its column slices gathered (``Allgatherv``) when row-split, then sent back to the shard's own
predecessor.

Each micro-batch in flight keeps its own copy of this shard's slices of the states the strategy keeps
(:func:`~fastckpt.parallel.tensor_layers.kept_states` of the stage's sizes; a stage given its output's
delta keeps no output).  The dropped states of every micro-batch share one buffer and are computed again,
with their ``Allreduce``s, run by run as its backward pass reaches them: the top run too, which
another micro-batch's forward pass may have overwritten.  ``zb1``'s B stashes each layer's input and
delta for W, as a plain stage does.  The last stage computes the loss on every shard; only shard 0
counts it in the trainer's sum.  The memory of a shard is
:func:`~.tensor_layout.tensor_stage_bytes`.
"""
import numpy as np

from fastckpt.kernels import BAD_LOSS, OK, dense_backward, dense_backward_input, output_delta

from ..tensor_layers import split_layer
from .tensor_layout import gather_width, slice_widths


class TensorStage:
    """One shard of a tensor-parallel pipeline stage, with :class:`~fastckpt.parallel.pipeline.stage.Stage`'s
    interface for :class:`~fastckpt.parallel.pipeline.runner.StageRunner`.

    ``layout`` (:class:`~.tensor_layout.TensorLayout`), ``shard`` (the trainer's
    :class:`~fastckpt.parallel.shards.Shard`, whose ``flat`` the passes get as ``params``), ``rows`` the
    largest micro-batch, ``comm`` the stage's shards,
    ``flight`` and ``deferred`` the micro-batches in flight and with W pending; the rest as for ``Stage``.
    """

    def __init__(self, layout, shard, rows, comm, MPI, *, first_stage, last_stage, softmax, l2, acts, flight,
                 deferred):
        self.layout, self.shard, self.comm, self.MPI = layout, shard, comm, MPI
        self.first_stage, self.last_stage, self.softmax = first_stage, last_stage, bool(softmax and last_stage)
        self.l2, self.acts, self.rows = np.asarray(l2, dtype=np.float64), list(acts), rows
        dtype, widths = shard.dtype, layout.widths
        self._kept_at = {}
        at = 0
        for j in layout.kept:
            self._kept_at[j] = at
            at += widths[j]
        self._slots = [np.empty(rows * at, dtype=dtype) for _ in range(flight)]
        self._slot_of, self._free = {}, list(range(flight))[::-1]
        self._run = np.empty(rows * layout.run_elems(), dtype=dtype)
        self._run_at = {j: sum(widths[i] for i in run[:run.index(j)]) for run in layout.runs for j in run}
        self._out = None if last_stage else np.empty((rows, layout.sizes[-1]), dtype=dtype)
        c0, c1 = layout.first_cols
        self._x_part = np.empty((rows, c1 - c0), dtype=dtype) if layout.row_split[0] else None
        most = rows * layout.delta_elems()
        self._deltas = (np.empty(most, dtype=dtype), np.empty(most, dtype=dtype))
        self._in_delta = None if first_stage else np.empty((rows, layout.sizes[0]), dtype=dtype)
        self._gathered = None if first_stage or not layout.row_split[0] else np.empty(
            rows * gather_width(layout), dtype=dtype)
        self._scratch = np.empty(max(layout.sizes[1:]), dtype=np.float64)
        self._grads = shard.new_buffer()                   # a micro-batch's gradient, before it is summed
        self._no_delta = np.empty((0, 1), dtype=dtype)
        self._no_l2 = np.zeros_like(self.l2)
        stash = sum(a + d for a, d in layout.stash_widths()) * rows
        self._stash = [np.empty(stash, dtype=dtype) for _ in range(deferred)]
        self._stashed = {}                                 # micro-batch -> (stash slot, rows)
        self.copied_bytes = 0
        self.sent_bytes = 0                                # over the stage's shards, counted as tensor.py counts
        self._share = 2 * (layout.shards - 1) / layout.shards  # an Allreduce's bytes sent per byte summed

    # -- the states -----------------------------------------------------------------------
    def _state(self, j, rows, k):
        """State ``a[j]`` (rows, local width) of micro-batch ``k``: its slot's, the run buffer's or the output."""
        width = self.layout.widths[j]
        if j == self.layout.n and not self.last_stage:
            return self._out[:rows]
        if j in self._kept_at:
            at = rows * self._kept_at[j]
            return self._slots[self._slot_of[k]][at:at + rows * width].reshape(rows, width)
        at = rows * self._run_at[j]
        return self._run[at:at + rows * width].reshape(rows, width)

    def _input(self, x):
        """Layer 0's input: ``x``, or its columns when layer 0 is row-split."""
        if self._x_part is None:
            return x
        part = self._x_part[:x.shape[0]]
        part[...] = x[:, slice(*self.layout.first_cols)]
        return part

    def _layers(self, ws, bs, a, lo, hi, k):
        """States ``lo + 1 .. hi`` of micro-batch ``k`` from ``a`` (state ``lo``)."""
        row = self.layout.row_split
        for layer in range(lo, hi):
            out = self._state(layer + 1, a.shape[0], k)
            split_layer(a, ws[layer], bs[layer], self.acts[layer + 1], row[layer], self.comm, self.MPI,
                        self._scratch, out)
            self.sent_bytes += round(self._share * out.nbytes) if row[layer] else 0
            a = out

    def _delta(self, layer, rows):
        width = self.layout.widths[layer + 1]
        return self._deltas[layer % 2][:rows * width].reshape(rows, width)

    # -- Stage's interface ----------------------------------------------------------------
    def forward(self, params, x, k):
        """Micro-batch ``k``'s forward pass; returns the stage output (whole, valid until the next pass) unless last."""
        ws, bs = self.shard.views(params)
        self._slot_of[k] = self._free.pop()
        self._layers(ws, bs, self._input(x), 0, self.layout.n, k)
        return None if self.last_stage else self._out[:x.shape[0]]

    def output_delta(self, rows):
        return self._delta(self.layout.n - 1, rows)

    def input_delta(self, rows):
        return self._in_delta[:rows]

    def backward(self, params, x, y, k, acc, scale, first):
        """Micro-batch ``k``'s backward pass: its gradients, ``scale``-weighted, copied into ``acc`` when
        ``first`` (with the L2 term), else added.  Returns (status, loss)."""
        out = acc if first else self._grads
        gws, gbs = self.shard.views(out)
        l2 = self.l2 if first else self._no_l2

        def layer_pass(layer, w, a_in, dz, dz_in):
            dense_backward(a_in, w, dz, scale, self._scratch, gws[layer], gbs[layer], dz_in, l2[layer],
                           self.acts[layer])
        status, loss = self._backward(params, x, y, k, layer_pass)
        if not first:
            acc += self._grads
        return status, loss

    def backward_input(self, params, x, y, k):
        """zb1's B: the deltas, each layer's input and delta stashed for :meth:`backward_weights`."""
        used = {slot for slot, _ in self._stashed.values()}
        slot = next(i for i in range(len(self._stash)) if i not in used)
        self._stashed[k] = (slot, x.shape[0])
        pieces = self._stash_views(slot, x.shape[0])

        def layer_pass(layer, w, a_in, dz, dz_in):
            kept_a, kept_dz = pieces[layer]
            kept_a[...], kept_dz[...] = a_in, dz
            dense_backward_input(a_in, w, dz, self._scratch, dz_in, self.acts[layer])
        return self._backward(params, x, y, k, layer_pass)

    def backward_weights(self, params, k, acc, scale, first):
        """zb1's W from micro-batch ``k``'s stash, into ``acc`` as :meth:`backward` does."""
        slot, rows = self._stashed.pop(k)
        out = acc if first else self._grads
        gws, gbs = self.shard.views(out)
        ws, _ = self.shard.views(params)
        l2 = self.l2 if first else self._no_l2
        for layer, (a_in, dz) in enumerate(self._stash_views(slot, rows)):
            dense_backward(a_in, ws[layer], dz, scale, self._scratch, gws[layer], gbs[layer], self._no_delta,
                           l2[layer], self.acts[layer])
        if not first:
            acc += self._grads

    def _stash_views(self, slot, rows):
        views, at, buf = [], 0, self._stash[slot]
        for width_in, width_out in self.layout.stash_widths():
            a = buf[at:at + rows * width_in].reshape(rows, width_in)
            at += rows * width_in
            views.append((a, buf[at:at + rows * width_out].reshape(rows, width_out)))
            at += rows * width_out
        return views

    def _backward(self, params, x, y, k, layer_pass):
        """The deltas from the top, each run of dropped states computed again as the pass reaches it, and
        ``layer_pass(layer, w, a_in, dz, dz_in)`` per layer; the input delta made whole.  (status, loss)."""
        ws, bs = self.shard.views(params)
        lay, rows = self.layout, x.shape[0]
        a0 = self._input(x)
        done, loss = set(), np.nan
        status = OK
        if self.last_stage:
            self._again(ws, bs, a0, lay.n, k, done)
            dz = self._delta(lay.n - 1, rows)
            a_out = self._state(lay.n, rows, k)
            loss = output_delta(a_out, y, dz, self.acts[-1])       # the output's code names the loss
            status = OK if np.isfinite(loss) else BAD_LOSS
        for layer in reversed(range(lay.n)):
            self._again(ws, bs, a0, layer, k, done)
            a_in = a0 if layer == 0 else self._state(layer, rows, k)
            dz_in = self._delta(layer - 1, rows) if layer else self._first_delta(rows)
            layer_pass(layer, ws[layer], a_in, self._delta(layer, rows), dz_in)
            if dz_in.shape[0] and not lay.row_split[layer]:
                self.comm.Allreduce(self.MPI.IN_PLACE, dz_in)     # partial (dz_r W_r) * f'(a): whole
                self.sent_bytes += round(self._share * dz_in.nbytes)
        if not self.first_stage and lay.row_split[0]:
            self._gather_input_delta(rows)
            self.sent_bytes += round(self._share / 2 * self._in_delta[:rows].nbytes)   # an Allgather: half
        self._free.append(self._slot_of.pop(k))
        return status, loss

    def _again(self, ws, bs, a0, j, k, done):
        """Compute state ``j`` again, with the states of its run below it, unless kept or done already."""
        for index, run in enumerate(self.layout.runs):
            if j in run and index not in done:
                done.add(index)
                lo = run[0] - 1
                self._layers(ws, bs, a0 if lo == 0 else self._state(lo, a0.shape[0], k), lo, j, k)

    def _first_delta(self, rows):
        """Where layer 0's input delta goes: nowhere on the first stage, the whole buffer (summed), or this
        shard's column slice of the gather buffer."""
        if self.first_stage:
            return self._no_delta
        if not self.layout.row_split[0]:
            return self._in_delta[:rows]
        c0, c1 = self.layout.first_cols
        at = rows * gather_width(self.layout) // self.layout.shards * self.layout.shard
        return self._gathered[at:at + rows * (c1 - c0)].reshape(rows, c1 - c0)

    def _gather_input_delta(self, rows):
        """Every shard's column slice of the input delta, gathered into the whole (rows, n_in) on each."""
        widths = slice_widths(self.layout.sizes[0], self.layout.shards)
        step = rows * gather_width(self.layout) // self.layout.shards
        counts, displs = [rows * w for w in widths], [step * t for t in range(self.layout.shards)]
        self.comm.Allgatherv(self.MPI.IN_PLACE, [self._gathered, (counts, displs)])
        col = 0
        for t, w in enumerate(widths):
            self._in_delta[:rows, col:col + w] = self._gathered[displs[t]:displs[t] + rows * w].reshape(rows, w)
            col += w
