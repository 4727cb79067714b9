"""Runs a plan: the one training step that every network, thread, rank and strategy shares.

The public verbs are :meth:`Engine.gradients` (the batch-mean gradients of
``(x, y)`` at some :class:`~fastckpt.core.params.Parameters`, into the engine's own
buffer or one you pass), :meth:`Engine.sgd` (one SGD step) and :meth:`Engine.step`
(one step of any optimizer, with its state);
:meth:`Parameters.update <fastckpt.core.params.Parameters.update>` applies a flat
update.  :class:`~fastckpt.nets.network.Network`, the threads' and MPI's data
parallelism and pipeline stages use nothing else.

The workspace (activations, deltas, scratch, and the gradients at the top of
the activations' arena) is allocated once per plan and reused for every step;
a smaller batch uses leading rows of the same buffers.  A step is one call of
a run kernel (:func:`fastckpt.kernels.runner`) per run of the plan's ops (a segment); inference
(:func:`fastckpt.engine.inference.forward`) runs the same forward kernel.
"""
import threading

import numpy as np

from fastckpt.core.activations import check_activation, state_codes
from fastckpt.core.checks import check_eta, check_finite, check_l2
from fastckpt.core.interrupts import whole
from fastckpt.core.layout import layer_views, param_layout
from fastckpt.core.losses import check_loss, l2_penalty
from fastckpt.kernels import BAD_INPUT, BAD_LOSS, BAD_UPDATE, Floats, Ints, Net, Table, new_gate, runner

from .sharing import tick
from .workspace import Workspace


class Engine:
    """Forward and backward over a plan, for any :class:`~fastckpt.core.params.Parameters` of its sizes and dtype.

    Parameters
    ----------
    plan : Plan
        The schedule, batch size and dtype (:func:`fastckpt.plan`).
    loss : {"quadratic", "cross_entropy"}, optional
        Sigmoid output with the quadratic loss, or softmax output with cross-entropy.
    l2 : float or sequence of float, optional
        L2 penalty ``0.5 * l2 * ||W||^2`` per layer.
    activation : str or sequence of str, optional
        The hidden layers' activation, ``"sigmoid"`` (default), ``"tanh"`` or ``"relu"``,
        or one per hidden layer (:mod:`fastckpt.core.activations`).

    An engine runs one step at a time: a second thread that calls it while a
    step runs gets a RuntimeError at once.  Give each thread its own engine.
    """

    def __init__(self, plan, loss="quadratic", l2=0.0, activation="sigmoid"):
        self.plan = plan
        self.loss = check_loss(loss)
        self.softmax = loss == "cross_entropy"   # log-softmax output and cross-entropy, else sigmoid and quadratic
        self.l2 = check_l2(l2, plan.n_layers)
        self.activation = check_activation(activation, plan.n_layers)
        self.acts = state_codes(self.activation, self.loss)      # (L + 1,) codes of the states' activations
        self.codes = set(self.acts[1:].tolist())                  # those a whole net's ops use
        self.workspace = Workspace(plan, self.acts)
        self.workspace.floats[Floats.L2:Floats.L2 + plan.n_layers] = self.l2
        self.forward_counts = [0] * plan.n_layers
        self.trace = None                        # set to a list to record (op, layer) events
        self._no_state = np.zeros((0, 0), dtype=plan.dtype)
        self.gate, self.me = new_gate(), 0       # a crew's gate and this engine's thread in it (kernels.sync)
        self._grad = None                        # gradients outside the arena, made on first need
        self._busy = threading.Lock()

    # -- public verbs ----------------------------------------------------------------------
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

    def gradients(self, params, x, y, *, out=None, add=False, names=("x", "y"), cuts=(), after=None):
        """The batch-mean gradients of ``(x, y)`` at ``params``; returns the mean loss.

        They are left in :attr:`grad`.  With ``out`` (a flat buffer from
        :meth:`Parameters.new_buffer`, not the parameters' own nor this
        engine's) their weight and bias blocks are also written there, or added
        to what it holds when ``add``.  The engine does not take ``params.lock``:
        hold it when other threads may change the same parameters.
        ``cuts`` (op indices) end kernel calls there too, and ``after(hi)`` is
        called after each call that ran the ops before ``hi``: a layer's
        gradient in :attr:`grad` is final once its backward op has run (the
        overlapped all-reduce of :mod:`fastckpt.parallel.buckets` starts then).
        """
        self._check(params)
        if out is not None:
            params.check_buffer(out, "out")
            if np.may_share_memory(out, params.flat) or np.may_share_memory(out, self.workspace.activations):
                raise ValueError("out must be a buffer of its own, not the parameters' nor the engine's workspace")
        mode = 0 if out is None else 2 if add else 1
        with self._running():
            return self._run(params, x, y, names, self.grad, None, out, mode, cuts=cuts, after=after)

    def sgd(self, params, x, y, eta, *, names=("x", "y")):
        """One SGD step on ``(x, y)``, in place; returns the mean loss.

        With a plan for the optimizer in backward each layer is updated as soon
        as its gradient is final, else the gradients are computed and then
        applied all at once (refused whole if a parameter would become NaN or inf).
        """
        eta = check_eta(eta)
        self._check(params)
        with self._running():
            if not self.plan.optimizer_in_backward:
                loss = self._run(params, x, y, names, self.grad, None)
                params.update(self.grad, eta)
                return loss
            with whole():                                    # NOTE [ A whole step ]
                return self._run(params, x, y, names, None, eta)

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
        if fused and state.optimizer != self.plan.optimizer:
            raise ValueError(f"this engine's plan applies {self.plan.optimizer} in the backward pass, not "
                             f"{state.optimizer}")
        with self._running():
            if not fused:
                loss = self._run(params, x, y, names, self.grad, None)
                state.apply(params, self.grad, eta)
                return loss
            with whole():                                    # NOTE [ A whole step ]
                try:
                    loss = self._run(params, x, y, names, None, eta, state=state)
                except FloatingPointError as exc:
                    if getattr(exc, "layers_updated", False):
                        state.steps += 1                     # the layers above took this step
                    raise
                state.steps += 1
                return loss

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

    def kernel(self, mode, accumulate=False):
        """The run kernel of this engine's activations for ``mode`` (:data:`fastckpt.kernels.MODES`), made for
        adding into an accumulator with ``accumulate`` (NOTE [ Run kernels made to measure ])."""
        return runner(self.codes, mode, accumulate)

    def penalty(self, weights):
        """The L2 term of the loss, sum over layers of ``0.5 * l2 * ||W||^2``."""
        return l2_penalty(self.l2, weights)

    # -- the step --------------------------------------------------------------------------
    def _check(self, params):
        plan = self.plan
        if tuple(params.sizes) != plan.sizes or params.dtype != plan.dtype:
            raise ValueError(f"params are for {list(params.sizes)} in {params.dtype.name}, but this engine's plan "
                             f"is for {list(plan.sizes)} in {plan.dtype.name}")

    def _running(self):
        """The engine's lock, for a ``with`` block around one step.  Refused at once when another caller holds
        it; a ``with`` block takes and leaves a C lock in C, so a Ctrl-C cannot leave it taken (a lock taken
        here, then wrapped, stayed taken when the interrupt fell between the two, and every later step was
        refused).  Two threads that both find it free take turns."""
        if self._busy.locked():
            raise RuntimeError("this Engine is already running a step in another thread; "
                               "give each thread its own Engine")
        return self._busy

    def _run(self, params, x, y, names, grads, eta, acc=None, acc_mode=0, state=None, cuts=(), after=None):
        """One pass over the plan, a kernel call per run of ops (:attr:`Workspace.runs`).  With
        ``eta``, each layer's update (SGD, or ``state``'s optimizer) is applied as soon as its
        gradient is final (optimizer in backward); else the gradients go to the flat buffer
        ``grads``, and their weight and bias blocks are copied (``acc_mode`` 1) or added (2) to ``acc``
        at the end."""
        tick()                                                # NOTE [ Threads on a shared machine ]
        plan, ws = self.plan, self.workspace
        xb, yb = ws.staging.minibatch(x, y, plan.sizes[0], plan.sizes[-1], names)
        sgd = eta is not None
        floats, ints, table, net = ws.floats, ws.ints, ws.table, ws.net
        floats[Floats.SCALE], floats[Floats.ETA], floats[Floats.PENALTY] = 1.0 / xb.shape[0], eta if sgd else 0.0, \
            self.penalty(params.layers()[0])
        hyper, state_rows = ((), self._no_state) if state is None else state.kernel_args()
        floats[Floats.HYPER:Floats.HYPER + len(hyper)] = hyper
        ints[Ints.ACC_MODE], ints[Ints.ME], ints[Ints.LAYER_GRAD_AT] = acc_mode, self.me, ws.layer_grad_at
        net[:, Net.COUNT] = 0
        table[:, Table.RAN] = 0
        grads = grads if grads is not None else ws.deltas[:0]
        acc = grads if acc is None else acc
        mode = "gradients" if not sgd else "sgd" if state is None else \
            "momentum" if state.optimizer.name == "momentum" else "adam"
        run_ops = self.kernel(mode, acc_mode != 0)
        loss = np.nan
        runs = ws.runs if not cuts else [(max(lo, a), min(hi, b)) for lo, hi in ws.runs
                                         for a, b in zip((0, *cuts), (*cuts, len(table))) if max(lo, a) < min(hi, b)]
        for first, (lo, hi) in enumerate(runs):
            ints[Ints.LO], ints[Ints.HI], ints[Ints.CHECK] = lo, hi, first == 0
            status, part = run_ops(table, net, ints, floats, xb, yb, params.flat, grads, ws.work, state_rows, acc,
                                   self.gate)
            loss = part if part == part else loss                  # not NaN
            if status == BAD_INPUT:
                check_finite(xb, names[0])
                check_finite(yb, names[1])
                raise AssertionError("the step found a NaN or inf in its input that check_finite did not")
            elif status == BAD_LOSS:
                raise FloatingPointError(f"the loss is {part} (non-finite); weights left unchanged")
            elif status >= BAD_UPDATE:
                raise self._bad_update(status - BAD_UPDATE, state)
            if after is not None:
                after(hi)
        self.forward_counts[:] = net[:-1, Net.COUNT].tolist()
        if self.trace is not None:
            names_of = ("fwd", "loss", "bwd")
            ran = table[table[:, Table.RAN] == 1]
            self.trace.extend((names_of[k], int(layer)) for k, layer in ran[:, [Table.KIND, Table.LAYER]])
        return loss
