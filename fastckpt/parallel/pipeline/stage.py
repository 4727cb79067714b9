"""One pipeline stage: a contiguous range of layers that trains micro-batch by micro-batch.

A stage runs the plan of its own layers (any strategy) through the same
run kernel as a whole net (:func:`fastckpt.kernels.runner`), cut in two: the forward pass of a
micro-batch (:meth:`Stage.forward`) and, later, its backward pass with the
plan's recomputation (:meth:`Stage.backward`).  Between the two, other
micro-batches run through the same workspace.

NOTE [ Micro-batches in flight ]
After its forward pass a micro-batch needs only what the plan's backward pass
reads before writing: the plan's kept activations (all of them for
``plain``, the checkpoints otherwise).  :attr:`Stage.live` is that set, as
element ranges of the arena, found from the op table.  The arena holds the
live set of one micro-batch, its *owner*; before another micro-batch's forward
pass overwrites it, the owner's live set is copied to a storage slot, and it
is copied back before the owner's backward pass.  The stage input of each
micro-batch in flight is kept by the caller.  So a stage's memory is one
workspace plus ``slots`` live sets, where ``slots`` is the largest number of
micro-batches waiting for their backward pass while another owns the arena
(:func:`fastckpt.parallel.pipeline.schedules.storage_slots`): ``M - 1`` for GPipe, whose backward passes run in
reverse so that the last forward's owner goes first; ``min(P - s, M)`` for
1F1B on stage ``s`` of ``P`` (a backward restores the oldest micro-batch
while the newest waits too); 0 on the last stage of 1F1B, whose backward
follows its forward at once.  Copies cost memory bandwidth, not FLOPs, and a
checkpointed stage copies only its checkpoints: recomputation inside the stage
is what bounds the memory of every micro-batch in flight.

Under ``zb1`` a micro-batch's backward pass is two calls (NOTE [ Zero bubble ]
in :mod:`.schedules`): :meth:`Stage.backward_input` runs the plan's backward
ops computing only the deltas, each layer's input and delta copied to one of
``deferred`` stash slots, and :meth:`Stage.backward_weights` later makes the
weight gradients from the slot, into a gradient buffer of its own (the arena's
may hold another micro-batch's live set by then).
"""
import numpy as np

from fastckpt.core.activations import state_codes
from fastckpt.core.layout import param_layout
from fastckpt.engine.workspace import Workspace
from fastckpt.kernels import OK, Floats, Ints, new_gate, runner


class Stage:
    """Layers ``first .. first + len(plan.sizes) - 2`` of a net, on one rank.

    Parameters
    ----------
    plan : Plan
        The plan of the stage's own sizes, at the largest micro-batch size.
    first_stage, last_stage : bool
        The first stage has no input delta to give; the last computes the loss
        (``softmax``: log-softmax output and cross-entropy), the others are
        given the delta of their output.
    l2 : numpy.ndarray
        (layers,) float64 L2 coefficients of the stage's layers.
    slots : int
        Storage for the live sets of micro-batches in flight (NOTE [ Micro-batches in flight ]).
    acts : sequence of int, optional
        The activation codes of the stage's states ``a[0] .. a[L]`` (the whole net's
        :func:`~fastckpt.core.activations.state_codes` from the stage's first layer);
        default: sigmoid hidden states.
    deferred : int, optional
        Stash slots for micro-batches whose weight gradients are put off (``zb1``); 0 by default.
    """

    def __init__(self, plan, *, first_stage, last_stage, softmax, l2, slots, acts=None, deferred=0):
        self.plan = plan
        self.first_stage, self.last_stage = first_stage, last_stage
        self.softmax = bool(softmax and last_stage)
        if acts is None:                                  # every hidden state a sigmoid's
            acts = state_codes(("sigmoid",) * (plan.n_layers - 1), "cross_entropy" if self.softmax else "quadratic")
        self.acts = np.asarray(acts, dtype=np.int64)
        self._codes = set(self.acts[1:].tolist()) | ({int(self.acts[0])} if not first_stage else set())
        self.workspace = ws = Workspace(plan, self.acts, input_delta=not first_stage, given_delta=not last_stage,
                                        stash_slots=deferred)
        self.forward_end = ws.forward_end
        self.back_runs = [(max(lo, self.forward_end), hi) for lo, hi in ws.runs if hi > self.forward_end]
        self.l2 = np.asarray(l2, dtype=np.float64)
        self._no_state = np.zeros((0, 0), dtype=plan.dtype)      # no optimizer inside
        self._no_y = np.zeros((0, plan.sizes[-1]), dtype=plan.dtype)      # read only by the loss op
        self._rows = np.zeros((plan.batch_size, 0), dtype=plan.dtype)    # a batch's rows for the weights ops
        self.live = live_ranges(plan, loss=last_stage)
        self.live_elems = sum(hi - lo for lo, hi in self.live)
        self._storage = [np.empty(self.live_elems, dtype=plan.dtype) for _ in range(slots)]
        self._stored = {}                  # micro-batch -> storage slot holding its live set
        self._owner = None                 # micro-batch whose live set is in the arena
        self.copied_bytes = 0
        self.sent_bytes = 0                # messages inside the stage: none
        self._deferred = deferred
        self._weights_table = ws.weights_table()
        self._stashed = {}                 # micro-batch -> (stash slot, rows) waiting for its weight gradients
        self._w_grads = np.empty(param_layout(plan.sizes, plan.itemsize)[1] if deferred else 0, dtype=plan.dtype)
        self._gate = new_gate()

    def forward(self, params, x, k):
        """Micro-batch ``k``'s forward pass from its stage input ``x`` (rows, sizes[0]); returns
        the stage output (a view of the workspace, valid until the next pass) unless last."""
        self._evict()
        self._run(params, x, self._no_y, 0, self.forward_end, None, 0, None, 0.0)
        self._owner = k
        if self.last_stage:
            return None
        top = self.plan.n_layers
        at = self.plan.writes[self.forward_end - 1]
        return self.workspace.activations[at:at + x.shape[0] * self.plan.sizes[top]].reshape(x.shape[0], -1)

    def output_delta(self, rows):
        """Where the delta of the stage output goes before :meth:`backward` (not on the last stage)."""
        return self.workspace.delta(self.plan.n_layers, rows)

    def input_delta(self, rows):
        """The delta of the stage input after :meth:`backward` (not on the first stage)."""
        return self.workspace.delta(0, rows)

    def backward(self, params, x, y, k, acc, scale, first):
        """Micro-batch ``k``'s backward pass (with the plan's recomputation): its gradients,
        ``scale``-weighted, are copied into ``acc`` when ``first`` (with the L2 term) or added.
        Returns (status, loss): the kernel's status and, on the last stage, the mean loss."""
        if self._owner != k:
            self._evict()
            self._restore(k)
        y = self._no_y if y is None else y
        l2 = self.l2 if first else None
        loss = np.nan
        for lo, hi in self.back_runs:
            status, part = self._run(params, x, y, lo, hi, acc, 1 if first else 2, l2, scale)
            loss = part if not np.isnan(part) else loss
            if status != OK:
                break
        self._owner = None
        return status, loss

    def backward_input(self, params, x, y, k):
        """The input half of micro-batch ``k``'s backward pass (``zb1``'s B): the deltas, with the plan's
        recomputation, each layer's input and delta stashed for :meth:`backward_weights`.  Returns
        (status, loss) as :meth:`backward` does."""
        if self._owner != k:
            self._evict()
            self._restore(k)
        used = {slot for slot, _ in self._stashed.values()}
        slot = next(i for i in range(self._deferred) if i not in used)     # sized by pending_weights
        self._stashed[k] = (slot, x.shape[0])
        y = self._no_y if y is None else y
        loss = status = np.nan
        for lo, hi in self.back_runs:
            status, part = self._run(params, x, y, lo, hi, None, 0, None, 0.0, slot)
            loss = part if not np.isnan(part) else loss
            if status != OK:
                break
        self._owner = None
        return status, loss

    def backward_weights(self, params, k, acc, scale, first):
        """The weight half of micro-batch ``k``'s backward pass (``zb1``'s W), from its stash: copied into
        ``acc`` when ``first`` (with the L2 term) or added, as :meth:`backward` does."""
        slot, rows = self._stashed.pop(k)
        self._run(params, self._rows[:rows], self._no_y, 0, len(self._weights_table), acc, 1 if first else 2,
                  self.l2 if first else None, scale, slot, table=self._weights_table, grads=self._w_grads)

    def _run(self, params, x, y, lo, hi, acc, mode, l2, scale, slot=None, *, table=None, grads=None):
        """Ops ``lo..hi-1`` of the stage's table (or ``table``) in one kernel call; ``l2`` None: no L2 term;
        ``slot``: the stash slot the backward ops write (or the weights ops read)."""
        ws = self.workspace
        grads = ws.gradients() if grads is None else grads
        floats, ints = ws.floats, ws.ints
        floats[Floats.SCALE] = scale
        floats[Floats.L2:Floats.L2 + self.plan.n_layers] = 0.0 if l2 is None else l2
        ints[Ints.LO], ints[Ints.HI], ints[Ints.CHECK], ints[Ints.ACC_MODE] = lo, hi, 0, mode
        ints[Ints.STASH_AT] = ws.slot_at(slot) if slot is not None else 0
        kernel = runner(self._codes, "stash" if slot is not None else "gradients", acc is not None)
        return kernel(ws.table if table is None else table, ws.net, ints, floats, x, y, params, grads, ws.work,
                      self._no_state, grads if acc is None else acc, self._gate)

    def _evict(self):
        """Copy the arena owner's live set to a free slot: another pass is about to overwrite it."""
        k = self._owner
        if k is None:
            return
        used = set(self._stored.values())
        slot = next(i for i in range(len(self._storage)) if i not in used)   # sized by storage_slots
        store, arena, pos = self._storage[slot], self.workspace.activations, 0
        for lo, hi in self.live:
            store[pos:pos + hi - lo] = arena[lo:hi]
            pos += hi - lo
        self._stored[k] = slot
        self._owner = None
        self.copied_bytes += pos * arena.itemsize

    def _restore(self, k):
        store, arena, pos = self._storage[self._stored.pop(k)], self.workspace.activations, 0
        for lo, hi in self.live:
            arena[lo:hi] = store[pos:pos + hi - lo]
            pos += hi - lo
        self.copied_bytes += pos * arena.itemsize


def live_ranges(plan, loss=True):
    """Merged ``[lo, hi)`` arena ranges (elements) that the plan's backward pass reads before it
    writes them; without ``loss`` (a stage given its output's delta) the output is not read."""
    sizes, batch = plan.sizes, plan.batch_size
    end = next(i for i, (kind, _) in enumerate(plan.ops) if kind != "fwd")
    written, live = [], []
    for (kind, layer), read, write in zip(plan.ops[end:], plan.reads[end:], plan.writes[end:]):
        if read is not None and (loss or kind != "loss"):
            live += _minus(read, read + batch * sizes[layer], written)   # a[layer]; the loss reads a[L]
        if kind == "fwd":
            written.append((write, write + batch * sizes[layer + 1]))
    return _merge(live)


def _minus(lo, hi, intervals):
    """``[lo, hi)`` less the union of ``intervals``, as a list of ranges."""
    pieces = [(lo, hi)]
    for a, b in intervals:
        pieces = [p for x, y in pieces for p in ((x, min(y, a)), (max(x, b), y)) if p[0] < p[1]]
    return pieces


def _merge(ranges):
    out = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out
