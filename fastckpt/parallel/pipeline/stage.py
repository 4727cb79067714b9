"""One pipeline stage: a contiguous range of layers (or one tensor shard of them) that trains micro-batch by
micro-batch.

A stage is an :class:`~fastckpt.engine.engine.Engine` over the plan of its own layers (any strategy; a
shard's plan of its own widths, NOTE [ One engine for every part ]) and the bookkeeping of the
micro-batches in flight: the forward pass of a micro-batch (:meth:`Stage.forward`) and, later, its
backward pass with the plan's recomputation (:meth:`Stage.backward`).  Between the two, other
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

A stage split over tensor shards (:mod:`fastckpt.parallel.tensor`) differs in two places only: a row-split
first layer takes its columns of the stage input, copied into a buffer of the stage, and its input's delta
is then this shard's columns, gathered from every shard before it is sent back; a column-split first
layer's input delta is summed by the engine.  Its output, after a row-split last layer, is whole on every
shard: shard ``t`` sends it to shard ``t`` of the next stage.
"""
import numpy as np

from fastckpt.engine import Engine
from fastckpt.kernels import OK


class Stage:
    """Layers ``first .. first + len(plan.sizes) - 2`` of a net (or a tensor shard of them), on one rank.

    Parameters
    ----------
    plan : Plan
        The plan of the stage's own sizes (a shard's own widths), at the largest micro-batch size.
    first_stage, last_stage : bool
        The first stage has no input delta to give; the last computes the loss, the others are
        given the delta of their output.
    loss : str
        The net's loss (the last stage's output and loss op).
    l2 : numpy.ndarray
        (layers,) L2 coefficients of the stage's layers.
    acts : sequence of int
        The activation codes of the stage's states ``a[0] .. a[L]`` (the whole net's
        :func:`~fastckpt.core.activations.state_codes` from the stage's first layer).
    slots : int
        Storage for the live sets of micro-batches in flight (NOTE [ Micro-batches in flight ]).
    deferred : int, optional
        Stash slots for micro-batches whose weight gradients are put off (``zb1``); 0 by default.
    shard : tuple, optional
        ``(sums, first_cols, widths)`` of a tensor shard: its :class:`~fastckpt.parallel.tensor.ShardSums`,
        the stage input's columns its first layer takes when row-split (else None), and every shard's
        width of them (to gather the input delta).
    """

    def __init__(self, plan, *, first_stage, last_stage, loss, l2, acts, slots, deferred=0, shard=None):
        self.plan = plan
        self.sums, self.cols, self.widths = shard if shard is not None else (None, None, None)
        self.engine = Engine(plan, loss, l2, acts=acts, input_delta=not first_stage, given_delta=not last_stage,
                             stash_slots=deferred, sums=self.sums)
        self.live = live_ranges(plan, loss=last_stage)
        self.live_elems = sum(hi - lo for lo, hi in self.live)
        self._storage = [np.empty(self.live_elems, dtype=plan.dtype) for _ in range(slots)]
        self._stored = {}                  # micro-batch -> storage slot holding its live set
        self._owner = None                 # micro-batch whose live set is in the arena
        self.copied_bytes = 0
        self._deferred = deferred
        self._stashed = {}                 # micro-batch -> (stash slot, rows) waiting for its weight gradients
        rows, dtype = plan.batch_size, plan.dtype
        self._x_cols = None if self.cols is None else np.empty((rows, self.cols[1] - self.cols[0]), dtype=dtype)
        self._whole_delta = None
        if self.cols is not None and not first_stage:          # the input delta gathered from the shards' columns
            self._whole_delta = np.empty((rows, sum(self.widths)), dtype=dtype)
            self._gathered = np.empty(rows * max(self.widths) * len(self.widths), dtype=dtype)

    @property
    def sent_bytes(self):
        """Bytes sent inside the stage: its sums over the tensor shards (0 for a stage that is not split)."""
        return 0 if self.sums is None else self.sums.sent

    def forward(self, params, x, k):
        """Micro-batch ``k``'s forward pass from its stage input ``x`` (rows, sizes[0]); returns
        the stage output (a view of the workspace, valid until the next pass) unless last."""
        self._evict()
        out = self.engine.forward(params, self.columns(x))
        self._owner = k
        return out

    def output_delta(self, rows):
        """Where the delta of the stage output goes before :meth:`backward` (not on the last stage)."""
        return self.engine.output_delta(rows)

    def input_delta(self, rows):
        """The delta of the whole stage input after :meth:`backward` (not on the first stage)."""
        return self.engine.input_delta(rows) if self._whole_delta is None else self._whole_delta[:rows]

    def backward(self, params, x, y, k, acc, scale, *, add, l2, step=None):
        """Micro-batch ``k``'s backward pass (with the plan's recomputation): its gradients,
        ``scale``-weighted (with the L2 terms when ``l2``), are copied into ``acc``, or added with ``add``
        (with ``step``, ``(eta, optimizer state)``, each layer steps instead, :meth:`Engine.backward
        <fastckpt.engine.engine.Engine.backward>`).  Returns (status, loss): the kernel's status and, on the
        last stage, the mean loss."""
        self._own(k)
        eta, state = step or (None, None)
        status, loss = self.engine.backward(params, self.columns(x), y, out=acc, add=add, scale=scale, l2=l2,
                                            eta=eta, state=state)
        self._owner = None
        self._gather(x.shape[0], status)
        return status, loss

    def skip(self, k):
        """Micro-batch ``k``'s backward pass is not run: its live set is not kept."""
        self._stored.pop(k, None)
        self._owner = None if self._owner == k else self._owner

    def backward_input(self, params, x, y, k):
        """The input half of micro-batch ``k``'s backward pass (``zb1``'s B): the deltas, with the plan's
        recomputation, each layer's input and delta stashed for :meth:`backward_weights`.  Returns
        (status, loss) as :meth:`backward` does."""
        self._own(k)
        used = {slot for slot, _ in self._stashed.values()}
        slot = next(i for i in range(self._deferred) if i not in used)     # sized by pending_weights
        self._stashed[k] = (slot, x.shape[0])
        status, loss = self.engine.backward(params, self.columns(x), y, out=None, add=False, scale=0.0, slot=slot)
        self._owner = None
        self._gather(x.shape[0], status)
        return status, loss

    def backward_weights(self, params, k, acc, scale, *, add, l2):
        """The weight half of micro-batch ``k``'s backward pass (``zb1``'s W), from its stash, into ``acc`` as
        :meth:`backward` writes its gradients."""
        slot, rows = self._stashed.pop(k)
        self.engine.weights(params, rows, slot, out=acc, add=add, scale=scale, l2=l2)

    def columns(self, x):
        """Layer 0's input: ``x``, or its columns when layer 0 is row-split (copied into the stage's buffer)."""
        if self.cols is None:
            return x
        part = self._x_cols[:x.shape[0]]
        part[...] = x[:, self.cols[0]:self.cols[1]]
        return part

    def _gather(self, rows, status):
        """A row-split first layer's input delta, this shard's columns, made whole from every shard's."""
        if self._whole_delta is not None and status == OK:
            self.sums.gather_columns(self.engine.input_delta(rows), self._whole_delta[:rows], self.widths,
                                     self._gathered)

    def _own(self, k):
        """Micro-batch ``k``'s live set in the arena."""
        if self._owner != k:
            self._evict()
            self._restore(k)

    def _evict(self):
        """Copy the arena owner's live set to a free slot: another pass is about to overwrite it."""
        k = self._owner
        if k is None:
            return
        used = set(self._stored.values())
        slot = next(i for i in range(len(self._storage)) if i not in used)   # sized by storage_slots
        store, arena, pos = self._storage[slot], self.engine.workspace.activations, 0
        for lo, hi in self.live:
            store[pos:pos + hi - lo] = arena[lo:hi]
            pos += hi - lo
        self._stored[k] = slot
        self._owner = None
        self.copied_bytes += pos * arena.itemsize

    def _restore(self, k):
        store, arena, pos = self._storage[self._stored.pop(k)], self.engine.workspace.activations, 0
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
