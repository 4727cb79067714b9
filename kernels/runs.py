"""A run of a plan's ops in one kernel call: one GIL release per run instead of one per op.

The plan (Python) decides what is kept and what is recomputed, and lays every activation
and delta out in the workspace; it hands a run kernel an op table and the buffers, and
drives the runs, one per segment.  A kernel takes twelve arguments, in records:

``run(table, net, ints, floats, x, y, params, grads, work, state, acc, gate)``

- ``table`` (n_ops, 7) int64, one row per op: ``kind, layer, read, write, d_out, d_in, ran``.
  ``kind`` is :data:`FWD`, :data:`LOSS`, :data:`BWD`, :data:`WEIGHTS`, or the two halves of a forward op,
  :data:`LINEAR` (``out = a W^T`` alone) and :data:`ACTIVATE` (``out = f(out + b)`` in place), between
  which the caller sums the partial products of a row-split layer over its tensor shards (NOTE [ One
  engine for every part ] in :mod:`fastckpt.engine.engine`); ``read``/``write`` are
  element offsets of the layer's input and output activations in ``work`` (``read = -1``: the
  input ``x``); ``d_out``/``d_in`` offsets of the deltas in ``work`` (``d_in = -1``: none, the
  first layer); the kernel sets ``ran`` to 1 for each op it runs.
- ``net`` (L + 1, 7) int64, one row per state ``a[j]``: :data:`SIZE`, the code :data:`ACT` of the
  activation that makes it (``acts[0]``, for the input, is read only when the first layer's
  backward gives the input's delta, as a pipeline stage's does; the output's names the loss:
  ``LOG_SOFTMAX`` for a softmax net with cross-entropy, ``IDENTITY`` for a linear output with the squared
  error, ``SIGMOID`` for the quadratic loss), and for
  layer ``j`` (``j < L``) the offsets :data:`W_AT`/:data:`B_AT` of its weights and bias in the
  flat parameter layout, where its input and delta go in a stash slot (:data:`STASH_A`,
  :data:`STASH_DZ`), and its forward ops counted (:data:`COUNT`, added to).
- ``ints`` int64: ops ``[LO, HI)`` of the table run now; :data:`CHECK` the input's finiteness
  first; :data:`ACC_MODE`; this thread's number :data:`ME` at the gate; the offsets in ``work``
  of the layer gradient (:data:`LAYER_GRAD_AT`) and of the stash slot (:data:`STASH_AT`).
- ``floats`` float64: :data:`SCALE` (1 / batch), :data:`ETA`, :data:`PENALTY` (added to the loss),
  the optimizer's :data:`HYPER` (:func:`kernels.optimizers.layer_step`), the L2 term of each
  layer from :data:`L2`, and float64 scratch after them (at least the widest layer).
- ``x``, ``y``: the batch; ``params``, ``grads``: flat buffers in the parameter layout;
  ``work``: the workspace (activations, deltas, a layer's gradient, stash slots); ``state``
  (slots, n): the optimizer's state; ``acc``: the accumulator; ``gate``: NOTE [ Turns at the GIL ]
  (:func:`~kernels.sync.new_gate` outside a crew).

Every op runs the same inline steps as the layer kernels of :mod:`kernels.dense` (the GEMMs,
the activations of :mod:`kernels.activations`, the derivatives), so the numbers are the same
bit for bit.

NOTE [ Run kernels made to measure ]
A kernel that could run every activation, every loss and every backward mode took 30-40 s to
compile on a 2-core AMD EPYC, most of it Numba's own work on code a run never reached.  So
:func:`runner` makes one kernel per *kind of run*: the activation codes its tables use, what a
backward op does with a layer's gradient (:data:`MODES`), and whether the gradients are added
into an accumulator at the end.  These are constants of the kernel (Python closure variables,
which Numba compiles as constants and prunes the branches of), so a kernel holds only the code
its runs reach; each is compiled the first time it is asked for and cached on disk under its
own key (Numba's cache index hashes a closure's values).  The steps it calls are compiled
once each and shared by every kernel, and LLVM inlines them where they are called.  A table
that needs what its kernel was not made for gets a ValueError, never a wrong number.

``MODES``, what a backward op does with the layer's gradient:

- ``"forward"``: there are no backward ops (inference);
- ``"gradients"``: batch-mean gradients (``SCALE`` = 1 / batch) into ``grads``;
- ``"sgd"``: SGD applied at once with learning rate ``ETA`` (the optimizer in backward);
- ``"momentum"``, ``"adam"``: that optimizer applied at once (``HYPER`` and ``state``), each
  layer's gradient computed into the layer gradient (its weights first, its bias at the offset
  the layout puts it) and the layer checked first and left unchanged if a value would be NaN
  or inf;
- ``"stash"``: a backward op computes only the delta of its input and copies its input ``a`` and
  its delta ``dz`` to the stash slot, and a :data:`WEIGHTS` op makes that layer's gradient from
  them later, by the same steps as a whole backward op (a pipeline stage's ``zb1`` B and W passes).

With ``accumulate``, after the table's last op the gradients' blocks are copied into ``acc``
(``ACC_MODE`` 1: the rest of ``acc`` zeroed) or added to it (2); 0 leaves ``acc`` alone.

A kernel returns ``(status, loss)``.  ``status``: ``OK``; ``BAD_LOSS`` when the loss (plus
``PENALTY``) is not finite, before any backward op ran; ``BAD_UPDATE + layer`` when the
optimizer in backward would make that layer's parameters (or its state) non-finite; ``BAD_INPUT``
when ``CHECK`` and ``x`` or ``y`` holds a NaN or inf (nothing ran).
"""
import numpy as np

from ._jit import inline, kernel
from .activations import (
    IDENTITY,
    LOG_SOFTMAX,
    RELU,
    SIGMOID,
    TANH,
    identity_rows,
    log_softmax_rows,
    relu_rows,
    sigmoid_rows,
    tanh_rows,
)
from .dense import (
    delta_gemm,
    identity_delta,
    layer_gradients,
    linear,
    relu_delta,
    sgd_layer,
    sigmoid_delta,
    tanh_delta,
)
from .elementwise import all_finite, cross_entropy_delta, quadratic_delta, squared_error_delta
from .optimizers import ADAM, MOMENTUM, layer_step
from .sync import leave_gate, take_gate

OK, BAD_LOSS, BAD_INPUT, BAD_UPDATE = 0, 1, 2, 16
FWD, LOSS, BWD, WEIGHTS, LINEAR, ACTIVATE = 0, 1, 2, 3, 4, 5   # op kinds, the first column of a table
KIND, LAYER, READ, WRITE, D_OUT, D_IN, RAN = range(7)  # a table's columns
SIZE, ACT, W_AT, B_AT, STASH_A, STASH_DZ, COUNT = range(7)    # the net's columns
LO, HI, CHECK, ACC_MODE, ME, LAYER_GRAD_AT, STASH_AT = range(7)   # ``ints``
N_INTS = 7
SCALE, ETA, PENALTY, HYPER, L2 = 0, 1, 2, 3, 11        # ``floats``: HYPER holds 8 values
MODES = ("forward", "gradients", "sgd", "momentum", "adam", "stash")


class Table:
    """Columns of an op table and its op kinds, for Python callers (kernels read the module's constants)."""
    KIND, LAYER, READ, WRITE, D_OUT, D_IN, RAN = KIND, LAYER, READ, WRITE, D_OUT, D_IN, RAN
    FWD, LOSS, BWD, WEIGHTS, LINEAR, ACTIVATE = FWD, LOSS, BWD, WEIGHTS, LINEAR, ACTIVATE


class Net:
    """Columns of the ``net`` record."""
    SIZE, ACT, W_AT, B_AT, STASH_A, STASH_DZ, COUNT = SIZE, ACT, W_AT, B_AT, STASH_A, STASH_DZ, COUNT


class Ints:
    """Slots of the ``ints`` record."""
    LO, HI, CHECK, ACC_MODE, ME, LAYER_GRAD_AT, STASH_AT, N = LO, HI, CHECK, ACC_MODE, ME, LAYER_GRAD_AT, STASH_AT, \
        N_INTS


class Floats:
    """Slots of the ``floats`` record: ``HYPER`` and the 7 after it hold the optimizer's hyper-parameters, the
    per-layer L2 terms start at ``L2``."""
    SCALE, ETA, PENALTY, HYPER, L2 = SCALE, ETA, PENALTY, HYPER, L2


def float_record_elems(n_layers, widest):
    """Length of the ``floats`` record of a net of ``n_layers`` layers whose widest layer has ``widest`` units."""
    return L2 + n_layers + widest


@inline
def _matrix(buf, at, rows, cols):
    return buf[at:at + rows * cols].reshape(rows, cols)


@inline
def _copy_rows(src, dst):
    """``dst[:, :] = src`` for two (rows, cols) arrays, without the slice assignment's error formatting."""
    for i in range(src.shape[0]):
        si, di = src[i], dst[i]
        for j in range(src.shape[1]):
            di[j] = si[j]


@inline
def _accumulate(net, acc, grads, mode):
    """``acc`` += ``grads`` (``mode`` 2) or ``acc`` = ``grads`` with the rest zeroed (1), over the weight and
    bias blocks of every layer in ``net``."""
    if mode == 1:
        for k in range(acc.shape[0]):
            acc[k] = 0.0
    for layer in range(net.shape[0] - 1):
        n_w = net[layer, SIZE] * net[layer + 1, SIZE]
        for lo, n in ((net[layer, W_AT], n_w), (net[layer, B_AT], net[layer + 1, SIZE])):
            ak, gk = acc[lo:lo + n], grads[lo:lo + n]
            for i in range(n):
                ak[i] += gk[i]


_made = {}


def runner(acts, mode="gradients", accumulate=False):
    """The run kernel for tables whose states are made by the activation codes ``acts`` (any iterable of
    :data:`SIGMOID`, :data:`TANH`, :data:`RELU`, :data:`LOG_SOFTMAX`, :data:`IDENTITY`), whose backward ops do
    ``mode``
    (one of :data:`MODES`) and, with ``accumulate``, that add their gradients into an accumulator
    (NOTE [ Run kernels made to measure ]).  The same arguments give the same kernel."""
    codes = frozenset(int(a) for a in acts)
    known = {SIGMOID, TANH, RELU, LOG_SOFTMAX, IDENTITY}
    if not codes <= known:
        raise ValueError(f"runner: unknown activation codes {sorted(codes - known)}")
    if mode not in MODES:
        raise ValueError(f"runner: mode must be one of {MODES}, got {mode!r}")
    key = (codes, mode, bool(accumulate))
    if key not in _made:
        _made[key] = _make(SIGMOID in codes, TANH in codes, RELU in codes, LOG_SOFTMAX in codes,
                           MODES.index(mode), bool(accumulate), IDENTITY in codes)
    return _made[key]


def _make(sigmoid, tanh, relu, softmax, mode, accumulating, identity):
    """A run kernel with these constants (NOTE [ Run kernels made to measure ])."""
    backward = mode != 0
    grads_mode, sgd_mode, stash_mode = mode == 1, mode == 2, mode == 5
    stateful = mode == 3 or mode == 4
    optimizer = MOMENTUM if mode == 3 else ADAM

    @kernel
    def run(table, net, ints, floats, x, y, params, grads, work, state, acc, gate):
        """Ops ``ints[LO]..ints[HI]-1`` of ``table`` on a batch of ``x.shape[0]`` rows (:mod:`kernels.runs`)."""
        me = ints[ME]
        leave_gate(gate, me)
        batch = x.shape[0]
        n_layers = net.shape[0] - 1
        scale, eta = floats[SCALE], floats[ETA]
        scratch = floats[L2 + n_layers:]
        hyper = floats[HYPER:L2]
        if stateful and hyper[0] != optimizer:
            raise ValueError("run: this kernel was made for another optimizer")
        status, loss = OK, np.nan
        hi = ints[HI]
        if ints[CHECK] != 0 and not (all_finite(x) and all_finite(y)):
            status = BAD_INPUT
        i = ints[LO] if status == OK else hi
        while i < hi:
            op = table[i]
            kind, layer = op[KIND], op[LAYER]
            op[RAN] = 1
            i += 1
            n_in = net[layer, SIZE]
            a = x if op[READ] < 0 else _matrix(work, op[READ], batch, n_in)
            if kind == LOSS:                             # layer is the output's index L here
                if not backward:
                    raise ValueError("run: a forward kernel was given a loss op")
                dz = _matrix(work, op[D_OUT], batch, n_in)
                if softmax and net[n_layers, ACT] == LOG_SOFTMAX:
                    loss = cross_entropy_delta(a, y, dz) + floats[PENALTY]
                elif sigmoid and net[n_layers, ACT] == SIGMOID:
                    loss = quadratic_delta(a, y, dz) + floats[PENALTY]
                elif identity and net[n_layers, ACT] == IDENTITY:
                    loss = squared_error_delta(a, y, dz) + floats[PENALTY]
                else:
                    raise ValueError("run: an output this kernel was not made for")
                if not np.isfinite(loss):
                    status, i = BAD_LOSS, hi
                continue
            n_out = net[layer + 1, SIZE]
            w_at, b_at = net[layer, W_AT], net[layer, B_AT]
            w = _matrix(params, w_at, n_out, n_in)
            b = params[b_at:b_at + n_out]
            if kind == FWD or kind == LINEAR or kind == ACTIVATE:
                out = _matrix(work, op[WRITE], batch, n_out)
                if kind != ACTIVATE:
                    linear(a, w, out)
                if kind == LINEAR:
                    continue
                act = net[layer + 1, ACT]
                if sigmoid and act == SIGMOID:
                    sigmoid_rows(out, b)
                elif tanh and act == TANH:
                    tanh_rows(out, b)
                elif relu and act == RELU:
                    relu_rows(out, b)
                elif identity and act == IDENTITY:
                    identity_rows(out, b)
                elif softmax and act == LOG_SOFTMAX:
                    log_softmax_rows(out, b, scratch)
                else:
                    raise ValueError("run: an activation this kernel was not made for")
                net[layer, COUNT] += 1
                continue
            if not backward:
                raise ValueError("run: a forward kernel was given a backward op")
            stash_a = ints[STASH_AT] + net[layer, STASH_A]
            stash_dz = ints[STASH_AT] + net[layer, STASH_DZ]
            if kind == WEIGHTS:
                if not stash_mode:
                    raise ValueError("run: a weights op needs a stash kernel")
                layer_gradients(_matrix(work, stash_a, batch, n_in), w, _matrix(work, stash_dz, batch, n_out),
                                scale, scratch, _matrix(grads, w_at, n_out, n_in), grads[b_at:b_at + n_out],
                                floats[L2 + layer])
                continue
            dz_out = _matrix(work, op[D_OUT], batch, n_out)
            dz_in = _matrix(work, max(op[D_IN], 0), batch if op[D_IN] >= 0 else 0, n_in)
            if stash_mode:
                _copy_rows(a, _matrix(work, stash_a, batch, n_in))
                _copy_rows(dz_out, _matrix(work, stash_dz, batch, n_out))
            elif grads_mode:
                layer_gradients(a, w, dz_out, scale, scratch, _matrix(grads, w_at, n_out, n_in),
                                grads[b_at:b_at + n_out], floats[L2 + layer])
            elif stateful:
                g_at = ints[LAYER_GRAD_AT]
                layer_gradients(a, w, dz_out, scale, scratch, _matrix(work, g_at, n_out, n_in),
                                work[g_at + b_at - w_at:g_at + b_at - w_at + n_out], floats[L2 + layer])
            if dz_in.shape[0] > 0:                       # the layer below's delta, from the weights before any update
                delta_gemm(w, dz_out, dz_in)
                act_in = net[layer, ACT]
                if sigmoid and act_in == SIGMOID:
                    sigmoid_delta(a, dz_in)
                elif tanh and act_in == TANH:
                    tanh_delta(a, dz_in)
                elif relu and act_in == RELU:
                    relu_delta(a, dz_in)
                elif identity and act_in == IDENTITY:
                    identity_delta(dz_in)
                else:
                    raise ValueError("run: the layer below has no derivative this kernel was made for")
            if sgd_mode:
                if not sgd_layer(a, w, b, dz_out, eta * scale, scratch, eta * floats[L2 + layer]):
                    status, i = BAD_UPDATE + layer, hi
            elif stateful:
                if _step_layer(hyper, params, work, state, ints[LAYER_GRAD_AT], w_at, b_at, n_out * n_in, n_out, eta):
                    status, i = BAD_UPDATE + layer, hi
        if accumulating and status == OK and ints[ACC_MODE] != 0 and hi == table.shape[0]:
            _accumulate(net, acc, grads, ints[ACC_MODE])
        take_gate(gate, me)
        return status, loss

    return run


@inline
def _step_layer(hyper, params, work, state, g_at, w_at, b_at, n_w, n_b, eta):
    """The optimizer of ``hyper`` on one layer from its gradient at ``work[g_at:]``: checked whole first, then
    written; True (nothing written) when a parameter or state value would be NaN or inf."""
    s2 = state[1] if state.shape[0] > 1 else state[0]
    g = work[g_at:]
    for write in (False, True):
        bad = (layer_step(hyper, params, g, state[0], s2, w_at, 0, n_w, eta, write)
               | layer_step(hyper, params, g, state[0], s2, b_at, b_at - w_at, n_b, eta, write))
        if bad != 0:
            return True
    return False
