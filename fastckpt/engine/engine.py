"""Runs a plan: the one training step that every network, thread, rank, stage and shard shares.

The public verbs are :meth:`Engine.gradients` (the batch-mean gradients of
``(x, y)`` at some :class:`~fastckpt.core.params.Parameters`, into the engine's own
buffer or one you pass), :meth:`Engine.sgd` (one SGD step) and :meth:`Engine.step`
(one step of any optimizer, with its state); a pipeline stage runs a micro-batch's
passes one at a time with :meth:`Engine.forward`, :meth:`Engine.backward` and
:meth:`Engine.weights`.
:meth:`Parameters.update <fastckpt.core.params.Parameters.update>` applies a flat
update.  :class:`~fastckpt.nets.network.Network`, the threads' data parallelism and
every rank of :class:`~fastckpt.parallel.trainer.Trainer` use nothing else.

The workspace (activations, deltas, scratch, and the gradients at the top of
the activations' arena) is allocated once per plan and reused for every step;
a smaller batch uses leading rows of the same buffers.  A step is one call of
a run kernel (:func:`fastckpt.kernels.runner`) per run of the plan's ops (a segment); inference
(:mod:`fastckpt.engine.inference`) runs a forward table through :func:`run_spans` too.

NOTE [ One engine for every part ]
A whole net, a pipeline stage and a tensor shard are each a plan this engine runs,
so recomputation, every strategy, byte bounds and the optimizer in backward come
from the op table alone, in every mode.  A stage's plan is of its own layers: its
first layer's backward gives the delta of its input (``input_delta``), and the delta
of its output comes from the next stage (``given_delta``: no loss op).  A tensor
shard's plan (:func:`~fastckpt.planner.plan.shard_plan`) is of the shard's own widths;
a row-split layer's forward op is two rows of the table, the partial product
``a W_r^T`` and then ``f(. + b)``, and the engine ends its kernel call between them,
hands the partial products to ``sums.sum`` (an ``Allreduce`` over the shards, as
Megatron-LM's RowParallelLinear does inside the layer) and goes on; a column-split
layer's input delta is summed the same way after its backward op.  The L2 penalty of
the loss is each shard's own part, totalled by ``sums.total``.  The kernels never
communicate; the engine never knows what a sum is made of.

NOTE [ A short step ]
A step's Python runs right after its GEMMs have filled the caches, where each of its lines costs
several times what it costs in a loop of its own: on the lab net (Zen 3, 2026-11-29), timed right after
a GEMM, the whole step took 90-150 us more than a bare kernel call and update, against ~10 us in a warm
loop.  So the
common step does the least it can: a net whose rows are ready reuses its engine without reading
them twice, an engine remembers the parameters it has checked, and the record values a pass writes are
written only when they change (the kernels never write them; every value is a Python number, compared by
value, so a caller's array given as ``scale`` and changed in place since is never taken for the old one).
"""
import threading

import numpy as np

from fastckpt.core.activations import check_activation, state_codes
from fastckpt.core.checks import check_eta, check_finite, check_l2, check_nonnegative
from fastckpt.core.interrupts import whole
from fastckpt.core.layout import layer_views, param_layout
from fastckpt.core.losses import check_loss, l2_penalty
from fastckpt.core.params import Parameters
from fastckpt.kernels import BAD_INPUT, BAD_LOSS, BAD_UPDATE, OK, Floats, Ints, Net, Table, new_gate, runner

from .batches import ready
from .sharing import tick
from .workspace import Workspace


def run_spans(kernel, records, spans, rows, sums=None, after=None):
    """Every call of ``kernel`` for one pass: ``records`` are its arguments, ``(table, net, ints, floats, x, y,
    params, grads, work, state, acc, gate)``; ``spans`` the ``[lo, hi)`` row ranges of one call each.  After a
    call whose last row is a key of ``sums`` (a dict of ``row -> (offset, width)``, with its ``hook`` the
    caller's sums), ``hook.sum`` gets that ``(rows, width)`` buffer of ``work``; then ``after(hi)``.
    Returns ``(status, loss)``: the first status that is not OK ends the pass."""
    ints, work = records[2], records[8]
    status, loss = OK, np.nan
    for lo, hi in spans:
        ints[Ints.LO], ints[Ints.HI] = lo, hi
        status, part = kernel(*records)
        loss = part if part == part else loss                      # not NaN
        if status != OK:
            break
        if sums and hi - 1 in sums:
            at, width = sums[hi - 1]
            sums.hook.sum(work[at:at + rows * width].reshape(rows, width))
        if after is not None:
            after(hi)
        ints[Ints.CHECK] = 0
    return status, loss


class Sums(dict):
    """The rows after which a shard's buffers are summed (:attr:`Workspace.sums`), with ``hook``, the object whose
    ``sum(buffer)`` sums a buffer over the shards in place and ``total(value)`` a float."""

    def __init__(self, rows, hook):
        super().__init__(rows)
        self.hook = hook


class Engine:
    """Forward and backward over a plan, for any :class:`~fastckpt.core.params.Parameters` of its sizes and dtype.

    Parameters
    ----------
    plan : Plan
        The schedule, batch size and dtype (:func:`fastckpt.plan`, or
        :func:`~fastckpt.planner.plan.shard_plan` for a tensor shard).
    loss : {"quadratic", "cross_entropy", "squared_error"}, optional
        Sigmoid output with the quadratic loss, softmax output with cross-entropy, or an identity (linear)
        output with the squared error (regression).
    l2 : float or sequence of float, optional
        L2 penalty ``0.5 * l2 * ||W||^2`` per layer.
    activation : str or sequence of str, optional
        The hidden layers' activation, ``"sigmoid"`` (default), ``"tanh"``, ``"relu"`` or ``"identity"``,
        or one per hidden layer (:mod:`fastckpt.core.activations`).
    acts : sequence of int, optional
        The activation codes of the states ``a[0] .. a[L]``, instead of ``activation`` and
        ``loss`` (a pipeline stage's, from its first layer: :func:`~fastckpt.core.activations.state_codes`).
    input_delta, given_delta : bool, optional
        A pipeline stage's plan: its first layer's backward gives its input's delta; its output's
        delta is given (:meth:`output_delta`), no loss op (NOTE [ One engine for every part ]).
    stash_slots : int, optional
        Slots for the micro-batches whose weight gradients are put off (``zb1``, :meth:`weights`).
    sums : object, optional
        For a tensor shard's plan: ``sums.sum(buffer)`` sums a buffer over the shards in place and
        ``sums.total(value)`` a float (NOTE [ One engine for every part ]).

    An engine runs one step at a time: a second thread that calls it while a
    step runs gets a RuntimeError at once.  Give each thread its own engine.
    """

    def __init__(self, plan, loss="quadratic", l2=0.0, activation="sigmoid", *, acts=None, input_delta=False,
                 given_delta=False, stash_slots=0, sums=None):
        self.plan = plan
        self.loss = check_loss(loss)
        self.l2 = check_l2(l2, plan.n_layers)
        self._l2_on, self._l2_written = bool(np.any(self.l2)), True
        if acts is None:
            self.activation = check_activation(activation, plan.n_layers)
            acts = state_codes(self.activation, self.loss)
        self.acts = np.asarray(acts, dtype=np.int64)             # (L + 1,) codes of the states' activations
        self.codes = set(self.acts[1:].tolist()) | ({int(self.acts[0])} if input_delta else set())
        if bool(plan.row_split) != (sums is not None):
            raise ValueError("a tensor shard's plan needs sums, and only it takes them")
        self.workspace = ws = Workspace(plan, self.acts, input_delta=input_delta, given_delta=given_delta,
                                        stash_slots=stash_slots)
        self.sums = Sums(ws.sums, sums) if sums is not None else None
        self.shared = sums
        ws.floats[Floats.L2:Floats.L2 + plan.n_layers] = self.l2
        self._counts = ws.net[:, Net.COUNT]                      # each layer's forward steps in the last pass
        self._counts.fill(0)
        self._spans_of, self._kernels = {}, {}                 # made once: a step's Python is on the clock
        self.trace = None                        # set to a list to record (op, layer) events
        self._no_state = np.zeros((0, 0), dtype=plan.dtype)
        self._no_y = np.zeros((0, plan.sizes[-1]), dtype=plan.dtype)
        self.gate, self.me = new_gate(), 0       # a crew's gate and this engine's thread in it (kernels.sync)
        self._grad = None                        # gradients outside the arena, made on first need
        self._w_grads = None                     # the weights pass's gradient (zb1), made on first need
        self._weights_table = ws.weights_table() if stash_slots else None
        self._rows = np.zeros((plan.batch_size, 0), dtype=plan.dtype)    # a batch's rows, for the WEIGHTS ops
        self._busy = threading.Lock()
        self._fits = None                        # the last Parameters _check passed (their sizes never change)
        self._written = None                     # the record values the last pass wrote (NOTE [ A short step ])

    # -- public verbs ----------------------------------------------------------------------
    @property
    def forward_counts(self):
        """How many times the last pass ran each layer's forward step (a list)."""
        return self._counts[:-1].tolist()

    @property
    def grad(self):
        """The flat gradients of the last :meth:`gradients` call, in the parameters' layout.

        They live at the top of the workspace's arena (NOTE [ Gradients in the
        arena ]); a plan with the optimizer in backward has none there, and the
        engine makes a buffer of its own the first time gradients are asked for.
        Only the weight and bias blocks are meaningful: padding holds anything.
        """
        if not self.plan.optimizer_in_backward:
            return self.workspace.gradients()
        if self._grad is None:
            self._grad = np.zeros(param_layout(self.plan.sizes, self.plan.itemsize)[1], dtype=self.plan.dtype)
        return self._grad

    def grad_layers(self):
        """Per-layer views (n_out, n_in) and (n_out,) of :attr:`grad`."""
        return layer_views(self.grad, self.plan.sizes)

    def gradients(self, params, x, y, *, out=None, add=False, names=("x", "y"), cuts=(), after=None, scale=None):
        """The batch-mean gradients of ``(x, y)`` at ``params``; returns the mean loss.

        They are left in :attr:`grad`.  With ``out`` (a flat buffer from
        :meth:`Parameters.new_buffer`, not the parameters' own nor this
        engine's) their weight and bias blocks are also written there, or added
        to what it holds when ``add``.  ``scale`` multiplies the gradients instead of ``1 / batch``.
        The engine does not take ``params.lock``: hold it when other threads may change the same
        parameters.  ``cuts`` (table rows) end kernel calls there too, and ``after(hi)`` is
        called after each call that ran the rows before ``hi``: a layer's
        gradient in :attr:`grad` is final once its backward op has run (the
        overlapped all-reduce of :mod:`fastckpt.parallel.buckets` starts then).
        """
        self._check(params)
        if out is not None:
            params.check_buffer(out, "out")
            if np.may_share_memory(out, params.flat) or np.may_share_memory(out, self.workspace.work) or \
                    np.may_share_memory(out, self.grad):
                raise ValueError("out must be a buffer of its own, not the parameters' nor the engine's workspace")
        mode = 0 if out is None else 2 if add else 1
        with self._running():
            return self._step(params, x, y, names, "gradients", self.grad, acc=out, acc_mode=mode, cuts=cuts,
                              after=after, scale=scale)

    def sgd(self, params, x, y, eta, *, names=("x", "y")):
        """One SGD step on ``(x, y)``, in place; returns the mean loss.

        With a plan for the optimizer in backward each layer is updated as soon as its gradient
        is final, else the gradients are computed and then applied all at once (refused whole if a
        parameter would become NaN or inf).
        """
        eta = check_eta(eta)
        self._check(params)
        with self._running():
            if not self.plan.optimizer_in_backward:
                grad = self.workspace.gradients()
                loss = self._step(params, x, y, names, "gradients", grad)
                params.update(grad, eta)
                return loss
            with whole():                                    # NOTE [ A whole step ]
                return self._step(params, x, y, names, "sgd", None, eta=eta)

    def step(self, params, x, y, eta, state, *, names=("x", "y")):
        """One step of ``state``'s optimizer (:class:`~fastckpt.core.optimizers.OptimizerState`) on
        ``(x, y)``, in place; returns the mean loss.

        SGD is :meth:`sgd`.  Any other optimizer computes the gradients, then applies its
        update, refused whole if a parameter or a state value would become NaN or inf; with a
        plan for the optimizer in backward each layer's update is applied as soon as its
        gradient is final, the same numbers bit for bit, and a layer whose update would
        go NaN or inf is left unchanged, after the layers above it were updated.
        """
        if state.optimizer.slots == 0:
            return self.sgd(params, x, y, eta, names=names)
        eta = check_eta(eta)
        self._check(params)
        fused = self.plan.optimizer_in_backward
        state.check_fits(params)
        if fused and state.optimizer != self.plan.optimizer:
            raise ValueError(f"this engine's plan applies {self.plan.optimizer} in the backward pass, not "
                             f"{state.optimizer}")
        with self._running():
            if not fused:
                loss = self._step(params, x, y, names, "gradients", self.grad)
                state.apply(params, self.grad, eta)
                return loss
            with whole():                                    # NOTE [ A whole step ]
                try:
                    loss = self._step(params, x, y, names, _fused_mode(state), None, eta=eta, state=state)
                except FloatingPointError as exc:
                    if getattr(exc, "layers_updated", False):
                        state.steps += 1                     # the layers above took this step
                    raise
                state.steps += 1
                return loss

    def forward(self, params, x):
        """A pipeline stage's forward pass of the micro-batch ``x`` (C-contiguous rows of the plan's dtype,
        checked by the caller): the plan's forward ops, which keep what its strategy keeps.  Returns the
        stage's output (a view of the workspace, valid until the next pass), or None on the last stage."""
        with self._running():
            self._pass(params, x, self._no_y, (0, self.workspace.forward_end), "gradients")
        return None if not self.workspace.given_delta else self.workspace.output(x.shape[0])

    def backward(self, params, x, y, *, out, add, scale, l2=True, slot=None, eta=None, state=None):
        """The rest of the micro-batch ``x``'s step after :meth:`forward` (its recomputation too): the gradients,
        times ``scale``, copied into ``out`` (with the L2 terms when ``l2``) or added to it (``add``).  With a
        stash ``slot`` (``zb1``'s B) only the deltas, each layer's input and delta stashed for
        :meth:`weights`.  With a plan for the optimizer in backward, each layer steps at ``eta`` (``state``'s
        optimizer, SGD if None) as its gradient is final instead, and ``out`` is unused.  ``y`` is None but
        on the last stage.  Returns ``(status, loss)``: the kernel's status (BAD_LOSS: the loss was not
        finite, no backward op ran; BAD_UPDATE + layer) and the mean loss of the last stage."""
        y = self._no_y if y is None else y
        span = (self.workspace.forward_end, len(self.workspace.table))
        with self._running():
            if slot is not None:
                return self._pass(params, x, y, span, "stash", slot=slot)
            if self.plan.optimizer_in_backward:
                state = None if state is None or state.optimizer.slots == 0 else state
                status, loss = self._pass(params, x, y, span, "sgd" if state is None else _fused_mode(state),
                                          eta=check_eta(eta), state=state, scale=scale, l2=l2)
                if state is not None and status == OK:
                    state.steps += 1
                return status, loss
            return self._pass(params, x, y, span, "gradients", grads=self.workspace.gradients(), acc=out,
                              acc_mode=2 if add else 1, scale=scale, l2=l2)

    def weights(self, params, rows, slot, *, out, add, scale, l2=True):
        """``zb1``'s W: the weight gradients of the micro-batch of ``rows`` rows stashed in ``slot`` by
        :meth:`backward`, into ``out`` as :meth:`backward` writes them."""
        if self._w_grads is None:
            self._w_grads = np.empty(param_layout(self.plan.sizes, self.plan.itemsize)[1], dtype=self.plan.dtype)
        with self._running():
            return self._pass(params, self._rows[:rows], self._no_y, (0, len(self._weights_table)), "stash", slot=slot,
                              table=self._weights_table, grads=self._w_grads, acc=out, acc_mode=2 if add else 1,
                              scale=scale, l2=l2)

    def input_delta(self, rows):
        """The delta of a stage's input after :meth:`backward` (``input_delta``)."""
        return self.workspace.delta(0, rows)

    def output_delta(self, rows):
        """Where the delta of a stage's output goes before :meth:`backward` (``given_delta``)."""
        return self.workspace.delta(self.plan.n_layers, rows)

    def takes(self, x):
        """Whether ``x`` is already rows this engine's plan holds: C-contiguous (batch, n_in) of its dtype, with
        ``batch`` at most the plan's (a caller with such rows needs no other engine)."""
        return ready(x, self.plan.sizes[0], self.plan.dtype) and x.shape[0] <= self.plan.batch_size

    def kernel(self, mode, accumulate=False):
        """The run kernel of this engine's activations for ``mode`` (:data:`fastckpt.kernels.MODES`), made for
        adding into an accumulator with ``accumulate`` (NOTE [ Run kernels made to measure ])."""
        key = (mode, accumulate, runner)            # the module's runner as it is now (tests wrap it)
        if key not in self._kernels:
            self._kernels[key] = runner(self.codes, mode, accumulate)
        return self._kernels[key]

    def penalty(self, weights):
        """The L2 term of the loss, sum over layers of ``0.5 * l2 * ||W||^2`` (of every shard's weights)."""
        value = l2_penalty(self.l2, weights)
        return value if self.shared is None or not any(self.l2) else self.shared.total(value)

    # -- the step --------------------------------------------------------------------------
    def _check(self, params):
        if params is self._fits:
            return
        if not isinstance(params, Parameters):
            raise TypeError(f"params must be a net's Parameters (net.params), got {type(params).__name__}")
        plan = self.plan
        if tuple(params.sizes) != plan.sizes or params.dtype != plan.dtype:
            raise ValueError(f"params are for {list(params.sizes)} in {params.dtype.name}, but this engine's plan "
                             f"is for {list(plan.sizes)} in {plan.dtype.name}")
        self._fits = params

    def _running(self):
        """The engine's lock, for a ``with`` block around one step.  Refused at once when another caller holds
        it; a ``with`` block takes and leaves a C lock in C, so a Ctrl-C cannot leave it taken (a lock taken
        here, then wrapped, stayed taken when the interrupt fell between the two, and every later step was
        refused).  Two threads that both find it free take turns."""
        if self._busy.locked():
            raise RuntimeError("this Engine is already running a step in another thread; "
                               "give each thread its own Engine")
        return self._busy

    def _step(self, params, x, y, names, mode, grads, *, eta=None, state=None, acc=None, acc_mode=0, cuts=(),
              after=None, scale=None):
        """One whole step on a minibatch given by the user: staged and checked, the whole table, errors raised."""
        tick()                                                # NOTE [ Threads on a shared machine ]
        plan, ws = self.plan, self.workspace
        xb, yb = ws.staging.minibatch(x, y, plan.sizes[0], plan.sizes[-1], names)
        if self._written_by_step(xb, acc) or plan.optimizer_in_backward and np.may_share_memory(xb, params.flat):
            xb = ws.staging.copied(xb, names[0])             # read after the step has written there
        if self._written_by_step(yb, acc):
            yb = ws.staging.copied(yb, names[1])
        status, loss = self._pass(params, xb, yb, (0, len(ws.table)), mode, grads=grads, eta=eta, state=state,
                                  acc=acc, acc_mode=acc_mode, cuts=cuts, after=after, scale=scale, check=True)
        if status == BAD_INPUT:
            check_finite(xb, names[0])
            check_finite(yb, names[1])
            raise AssertionError("the step found a NaN or inf in its input that check_finite did not")
        if status == BAD_LOSS:
            raise FloatingPointError(f"the loss is {loss} (non-finite); weights left unchanged")
        if status >= BAD_UPDATE:
            raise self._bad_update(status - BAD_UPDATE, state)
        return loss

    def _written_by_step(self, arr, acc):
        """Whether a step writes memory that ``arr`` (a minibatch) is in: the workspace, this engine's own
        gradient buffers or the accumulator ``acc``."""
        ours = (self.workspace.work, self._grad, self._w_grads)        # arrays of their own memory
        if acc is None and arr.base is None:                           # so is arr: only itself can be one
            return any(arr is b for b in ours)
        return any(b is not None and np.may_share_memory(arr, b) for b in (*ours, acc))

    def _pass(self, params, xb, yb, span, mode, *, grads=None, eta=None, state=None, acc=None, acc_mode=0, cuts=(),
              after=None, scale=None, l2=True, slot=None, table=None, check=False):
        """Rows ``span`` of the table (or of ``table``) in ``mode`` (:data:`fastckpt.kernels.MODES`), a kernel call
        per run of them, cut at ``cuts`` and at the shards' sums: ``(status, loss)``."""
        ws = self.workspace
        table = ws.table if table is None else table
        floats, ints, net = ws.floats, ws.ints, ws.net
        if self._l2_on and self._l2_written != l2:          # written at first: the engine's own l2
            floats[Floats.L2:Floats.L2 + self.plan.n_layers] = self.l2 if l2 else 0.0
            self._l2_written = l2
        scale = 1.0 / xb.shape[0] if scale is None else check_nonnegative(scale, "scale")   # a float: compared by value
        written = (scale, 0.0 if eta is None else eta,
                   self.penalty(params.layers()[0]) if check and l2 and self._l2_on else 0.0,
                   acc_mode, self.me, ws.layer_grad_at, ws.slot_at(slot) if slot is not None else 0)
        if written != self._written:                       # NOTE [ A short step ]
            floats[Floats.SCALE], floats[Floats.ETA], floats[Floats.PENALTY] = written[:3]
            ints[Ints.ACC_MODE], ints[Ints.ME], ints[Ints.LAYER_GRAD_AT], ints[Ints.STASH_AT] = written[3:]
            self._written = written
        ints[Ints.CHECK] = check
        state_rows = self._no_state
        if state is not None:
            hyper, state_rows = state.kernel_args()
            floats[Floats.HYPER:Floats.HYPER + len(hyper)] = hyper
        self._counts.fill(0)
        if self.trace is not None:
            table[:, Table.RAN] = 0
        grads = grads if grads is not None else ws.deltas[:0]
        own = table is ws.table
        kernel = self.kernel(mode, acc is not None)
        records = (table, net, ints, floats, xb, yb, params.flat, grads, ws.work, state_rows,
                   grads if acc is None else acc, self.gate)
        spans = self._spans(span, cuts) if own else [span]
        status, loss = run_spans(kernel, records, spans, xb.shape[0], self.sums if own else None, after)
        if self.trace is not None:
            names_of = {Table.FWD: "fwd", Table.ACTIVATE: "fwd", Table.LOSS: "loss", Table.BWD: "bwd"}
            ran = table[(table[:, Table.RAN] == 1) & np.isin(table[:, Table.KIND], list(names_of))]
            self.trace.extend((names_of[k], int(layer)) for k, layer in ran[:, [Table.KIND, Table.LAYER]])
        return status, loss

    def _spans(self, span, cuts):
        """The kernel calls of rows ``span``: one per run of the plan (:attr:`Workspace.runs`), cut at ``cuts`` and
        after each row whose buffer is summed over the shards."""
        key = (span, tuple(cuts))
        if key in self._spans_of:
            return self._spans_of[key]
        points = set(cuts) | {row + 1 for row in (self.sums or ())}
        spans = self._spans_of[key] = []
        for a, b in self.workspace.runs:
            a, b = max(a, span[0]), min(b, span[1])
            if a < b:
                edges = [a, *sorted(p for p in points if a < p < b), b]
                spans += zip(edges[:-1], edges[1:])
        return spans

    def _bad_update(self, layer, state):
        """The error of an update in the backward pass that went NaN or inf at ``layer``; its
        ``layers_updated`` says whether layers above it had taken the step."""
        top = self.plan.n_layers - 1
        if state is None:                                    # SGD: the layer itself is written too
            exc = FloatingPointError(f"the update made layer {layer}'s parameters NaN or inf; with the optimizer "
                                     f"in backward, layers {layer}..{top} are already updated")
        else:
            above = f"layers {layer + 1}..{top} are already updated" if layer < top else "no layer was updated"
            exc = FloatingPointError(f"the {state.optimizer.name} update would make layer {layer}'s parameters or "
                                     f"state NaN or inf, so that layer was left unchanged; with the optimizer in "
                                     f"backward, {above}")
        exc.layers_updated = layer < top or state is None
        return exc


def _fused_mode(state):
    """The run kernels' mode of ``state``'s optimizer applied in the backward pass."""
    return "momentum" if state.optimizer.name == "momentum" else "adam"
