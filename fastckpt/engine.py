"""Runs a plan: the one training step that every network, thread, rank and strategy shares.

The public verbs are :meth:`Engine.gradients` (the batch-mean gradients of
``(x, y)`` at some :class:`~fastckpt.params.Parameters`, into the engine's own
buffer or one you pass) and :meth:`Engine.sgd` (one SGD step);
:meth:`Parameters.update <fastckpt.params.Parameters.update>` applies a flat
update.  :class:`~fastckpt.network.Network`, :class:`~fastckpt.parallel.DataParallel`
and :class:`~fastckpt.distributed.MPITrainer` use nothing else.

The workspace (activations, deltas, scratch, and the gradients at the top of
the activations' arena) is allocated once per plan and reused for every step;
a smaller batch uses leading rows of the same buffers.  :func:`forward` is
the one forward path: training, recomputation and inference all run
:func:`forward_layer`.
"""
import threading

import numpy as np

from fastckpt.kernels import (
    accumulate,
    cross_entropy_delta,
    dense_backward,
    dense_backward_sgd,
    dense_forward,
    dense_forward_log_softmax,
    quadratic_delta,
    sum_squares,
)

from ._checks import as_batch, check_eta, check_finite, check_l2
from .costs import layer_views, param_layout
from .workspace import FWD, LOSS, Workspace


def forward_layer(weights, biases, layer, softmax, a, scratch, out):
    """``out = a[layer + 1]`` from ``a = a[layer]``: a sigmoid layer, or the log-softmax output
    of a ``softmax`` net's last layer.  The only place that tells the two apart."""
    if softmax and layer == len(weights) - 1:
        dense_forward_log_softmax(a, weights[layer], biases[layer], scratch, out)
    else:
        dense_forward(a, weights[layer], biases[layer], out)


def forward(params, softmax, a, start, end):
    """``[a, a[start+1], ..., a[end]]`` for ``a = a[start]`` (batch, sizes[start]), in fresh arrays.

    A softmax net's output is given as probabilities (training keeps log-probabilities).
    """
    weights, biases = params.layers()
    scratch = np.empty(max(params.sizes[1:]), dtype=np.float64)
    outs = [a]
    for layer in range(start, end):
        out = np.empty((a.shape[0], params.sizes[layer + 1]), dtype=params.dtype)   # (batch, n_out)
        forward_layer(weights, biases, layer, softmax, a, scratch, out)
        outs.append(out)
        a = out
    if softmax and end == len(weights) and end > start:
        np.exp(outs[-1], out=outs[-1])
    return outs


class Engine:
    """Forward and backward over a plan, for any :class:`~fastckpt.params.Parameters` of its sizes and dtype.

    Parameters
    ----------
    plan : Plan
        The schedule, batch size and dtype (:func:`fastckpt.plan`).
    loss : {"quadratic", "cross_entropy"}, optional
        Sigmoid output with the quadratic loss, or softmax output with cross-entropy.
    l2 : float or sequence of float, optional
        L2 penalty ``0.5 * l2 * ||W||^2`` per layer.

    An engine runs one step at a time: a second thread that calls it while a
    step runs gets a RuntimeError at once.  Give each thread its own engine.
    """

    def __init__(self, plan, loss="quadratic", l2=0.0):
        if loss not in ("quadratic", "cross_entropy"):
            raise ValueError(f"loss must be 'quadratic' (sigmoid output) or 'cross_entropy' (softmax output), "
                             f"got {loss!r}")
        self.plan = plan
        self.workspace = Workspace(plan)
        self.forward_counts = [0] * plan.n_layers
        self.trace = None                        # set to a list to record (op, layer) events
        self.loss = loss
        self.softmax = loss == "cross_entropy"   # log-softmax output and cross-entropy, else sigmoid and quadratic
        self.l2 = check_l2(l2, plan.n_layers)
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

    def batch(self, x, y, names=("x", "y")):
        """``x`` (batch, n_in) and ``y`` (batch, n_out) checked, as C-contiguous arrays of the plan's dtype.

        The lab's (batch, n, 1) is accepted too.  Inputs of another dtype or
        layout are converted into buffers of the workspace, not fresh arrays.
        """
        x_name, y_name = names
        xb = as_batch(x, self.plan.sizes[0], x_name, "input")
        yb = as_batch(y, self.plan.sizes[-1], y_name, "output")
        if xb.shape[0] != yb.shape[0]:
            raise ValueError(f"{x_name} has {xb.shape[0]} samples but {y_name} has {yb.shape[0]}")
        if xb.shape[0] > self.plan.batch_size:
            raise ValueError(f"{x_name} has {xb.shape[0]} samples, more than the {self.plan.batch_size} "
                             "this engine's plan is for")
        out = []
        for arr, name in ((xb, x_name), (yb, y_name)):
            if arr.dtype != self.plan.dtype or not arr.flags.c_contiguous:
                stage = self.workspace.stage(name, arr.shape[0], arr.shape[1])
                with np.errstate(over="ignore"):         # overflow to inf is reported below
                    np.copyto(stage, arr, casting="unsafe")
                arr = stage
            check_finite(arr, name)
            out.append(arr)
        return out[0], out[1]

    def gradients(self, params, x, y, *, out=None, add=False, names=("x", "y")):
        """The batch-mean gradients of ``(x, y)`` at ``params``; returns the mean loss.

        They are left in :attr:`grad`.  With ``out`` (a flat buffer from
        :meth:`Parameters.new_buffer`, not the parameters' own nor this
        engine's) their weight and bias blocks are also written there, or added
        to what it holds when ``add``.  The engine does not take ``params.lock``:
        hold it when other threads may change the same parameters.
        """
        self._check(params)
        if out is not None:
            params.check_buffer(out, "out")
            if np.may_share_memory(out, params.flat) or np.may_share_memory(out, self.workspace.activations):
                raise ValueError("out must be a buffer of its own, not the parameters' nor the engine's workspace")
        with self._running():
            loss = self._gradients(params, x, y, names)
            if out is not None:
                if not add:
                    out[...] = 0.0
                accumulate(out, self.grad, params.blocks)
            return loss

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
                loss = self._gradients(params, x, y, names)
                params.update(self.grad, eta)
                return loss
            xb, yb = self.batch(x, y, names)
            weights, biases = params.layers()
            return self._run(xb, yb, weights, biases, None, None, eta)

    def _gradients(self, params, x, y, names):
        xb, yb = self.batch(x, y, names)
        gw, gb = layer_views(self.grad, self.plan.sizes)
        weights, biases = params.layers()
        return self._run(xb, yb, weights, biases, gw, gb, None)

    def penalty(self, weights):
        """The L2 term of the loss, sum over layers of ``0.5 * l2 * ||W||^2``."""
        total = 0.0
        if not any(self.l2):
            return total
        for coef, w in zip(self.l2, weights):
            if coef:
                flat = w.reshape(-1)
                # float64 through BLAS; float32 summed in float64, where its squares cannot overflow
                total += 0.5 * coef * (float(np.dot(flat, flat)) if flat.itemsize == 8 else sum_squares(flat))
        return total

    # -- the step --------------------------------------------------------------------------
    def _check(self, params):
        plan = self.plan
        if tuple(params.sizes) != plan.sizes or params.dtype != plan.dtype:
            raise ValueError(f"params are for {list(params.sizes)} in {params.dtype.name}, but this engine's plan "
                             f"is for {list(plan.sizes)} in {plan.dtype.name}")

    def _running(self):
        if not self._busy.acquire(blocking=False):
            raise RuntimeError("this Engine is already running a step in another thread; "
                               "give each thread its own Engine")
        return _Release(self._busy)

    def _run(self, x, y, weights, biases, grad_w, grad_b, eta):
        """One pass over the plan.  With ``eta``, each layer's SGD update is applied as soon as its
        gradient is final (optimizer in backward); else the gradients go to ``grad_w``/``grad_b``."""
        batch = x.shape[0]
        scale = 1.0 / batch
        step = None if eta is None else eta * scale
        scratch = self.workspace.scratch
        counts = self.forward_counts
        for i in range(len(counts)):
            counts[i] = 0
        trace = self.trace
        loss = np.nan
        softmax, l2 = self.softmax, self.l2
        for kind, layer, a, d_out, d_in in self.workspace.ops(batch):
            if a is None:
                a = x
            if kind == FWD:
                forward_layer(weights, biases, layer, softmax, a, scratch, d_out)
                counts[layer] += 1
            elif kind == LOSS:
                loss = cross_entropy_delta(a, y, d_out) if softmax else quadratic_delta(a, y, d_out)
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


class _Release:
    """Releases a lock acquired before the ``with`` block, when the block ends."""

    def __init__(self, lock):
        self.lock = lock

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.lock.release()
