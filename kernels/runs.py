"""A run of a plan's ops in one kernel call: one GIL release per run instead of one per op.

The plan (Python) decides what is kept and what is recomputed, and lays every activation
and delta out in the workspace; it hands this kernel an op table and the buffers, and
drives the runs, one per segment.  Each row of ``ops`` (int64) is

    kind, layer, read, write, d_out, d_in

- ``kind``: 0 forward, 1 loss, 2 backward (``fastckpt.engine.workspace.FWD/LOSS/BWD``);
- ``read``/``write``: element offsets of the layer's input and output activations in
  ``arena`` (``read = -1``: the input ``x``);
- ``d_out``/``d_in``: offsets of the deltas in ``deltas`` (``d_in = -1``: none, the first layer).

Every op calls the same layer kernels as a call from Python would, so the numbers are the
same bit for bit.  Parameters and gradients are flat buffers in the parameter layout
(``layout`` (L, 2): offsets of each layer's weights and bias).  ``acts`` (L + 1,) int64 holds
the code of the activation that makes each state ``a[j]`` (``acts[0]``, for the input, is read
only when the first layer's backward gives the input's delta, as a pipeline stage's does); the
output's is ``LOG_SOFTMAX`` for a softmax net with cross-entropy, else the quadratic loss.

``stash`` (non-empty): every backward op computes only the delta of its input
(:func:`~kernels.dense.dense_backward_input`) and copies its input ``a`` and
its delta ``dz`` to ``stash`` at ``stash_at[layer]`` (elements), for
:func:`run_weights` to make the weight gradients from later; a pipeline
stage's ``zb1`` B pass.

Returns ``(status, loss)``.  ``status``: ``OK``; ``BAD_LOSS`` when the loss (plus
``penalty``) is not finite, before any backward op ran; ``BAD_UPDATE + layer`` when the
optimizer in backward (``sgd``) would make that layer's parameters (or its state) non-finite; ``BAD_INPUT``
when ``check_input`` and ``x`` or ``y`` holds a NaN or inf (nothing ran).
"""
import numpy as np

from ._jit import inline, kernel
from .activations import LOG_SOFTMAX
from .dense import dense_backward, dense_backward_input, dense_backward_sgd, dense_forward_layer
from .elementwise import accumulate, all_finite, cross_entropy_delta, quadratic_delta
from .optimizers import layer_step
from .sync import leave_gate, take_gate

OK, BAD_LOSS, BAD_INPUT, BAD_UPDATE = 0, 1, 2, 16


@inline
def _matrix(buf, at, rows, cols):
    return buf[at:at + rows * cols].reshape(rows, cols)


@kernel
def run_ops(ops, lo, hi, x, y, params, grads, layout, sizes, arena, deltas, scratch,
            scale, sgd, eta, l2, acts, penalty, check_input, counts, trace, acc, acc_mode, blocks,
            hyper, state1, state2, layer_grad, stash, stash_at, gate, me):
    """Ops ``lo..hi-1`` of the table on a batch of ``x.shape[0]`` rows; see the module docstring.  Gated by
    ``gate`` for thread ``me`` (NOTE [ Turns at the GIL ]: :func:`~kernels.sync.new_gate` outside a crew)."""
    leave_gate(gate, me)
    done = _run_ops(ops, lo, hi, x, y, params, grads, layout, sizes, arena, deltas, scratch, scale, sgd, eta, l2,
                    acts, penalty, check_input, counts, trace, acc, acc_mode, blocks, hyper, state1, state2,
                    layer_grad, stash, stash_at)
    take_gate(gate, me)
    return done


@kernel
def _run_ops(ops, lo, hi, x, y, params, grads, layout, sizes, arena, deltas, scratch,
             scale, sgd, eta, l2, acts, penalty, check_input, counts, trace, acc, acc_mode, blocks,
             hyper, state1, state2, layer_grad, stash, stash_at):
    """:func:`run_ops` without the gate.

    ``sgd``: the optimizer in backward with learning rate ``eta`` (``grads`` is then
    unused); with ``sgd`` and a non-empty ``hyper`` (:func:`fastckpt.kernels.optimizers.layer_step`)
    that layer's optimizer with its state ``state1``/``state2`` instead, each layer's
    gradient computed into ``layer_grad`` (its weights first, its bias at the offset the
    parameter layout puts it) and applied at once (the layer is checked first and left
    unchanged if a value would be NaN or inf); else the batch-mean gradients (``scale`` =
    1 / batch) go to ``grads``.
    ``l2`` (L,) per layer.  ``counts`` (L,) counts forward ops per layer; ``trace`` (n, 2)
    gets each op's (kind, layer), row ``i`` for op ``i``.  After the table's last op the
    gradients' ``blocks`` are copied into ``acc`` (``acc_mode`` 1: the rest of ``acc`` zeroed)
    or added to it (2); 0 leaves ``acc`` alone.
    """
    batch = x.shape[0]
    n_layers = layout.shape[0]
    if acts.shape[0] != n_layers + 1:
        raise ValueError("run_ops: acts needs one code per state")
    softmax = acts[n_layers] == LOG_SOFTMAX
    step = eta * scale
    if check_input and not (all_finite(x) and all_finite(y)):
        return BAD_INPUT, np.nan
    loss = np.nan
    for i in range(lo, hi):
        kind, layer = ops[i, 0], ops[i, 1]
        trace[i, 0], trace[i, 1] = kind, layer
        n_in = sizes[layer]
        a = x if ops[i, 2] < 0 else _matrix(arena, ops[i, 2], batch, n_in)
        if kind == 1:                                  # layer is the output's index L here
            dz = _matrix(deltas, ops[i, 4], batch, n_in)
            loss = (cross_entropy_delta(a, y, dz) if softmax else quadratic_delta(a, y, dz)) + penalty
            if not np.isfinite(loss):
                return BAD_LOSS, loss
            continue
        n_out = sizes[layer + 1]
        w = _matrix(params, layout[layer, 0], n_out, n_in)
        b = params[layout[layer, 1]:layout[layer, 1] + n_out]
        if kind == 0:
            out = _matrix(arena, ops[i, 3], batch, n_out)
            dense_forward_layer(a, w, b, acts[layer + 1], scratch, out)
            counts[layer] += 1
        else:
            dz_out = _matrix(deltas, ops[i, 4], batch, n_out)
            dz_in = _matrix(deltas, max(ops[i, 5], 0), batch if ops[i, 5] >= 0 else 0, n_in)
            if stash.shape[0] > 0:
                _matrix(stash, stash_at[layer, 0], batch, n_in)[:, :] = a
                _matrix(stash, stash_at[layer, 1], batch, n_out)[:, :] = dz_out
                dense_backward_input(a, w, dz_out, scratch, dz_in, acts[layer])
            elif sgd and hyper.shape[0] > 0:
                w_at, b_at = layout[layer, 0], layout[layer, 1]
                n_w = n_out * n_in
                gw = _matrix(layer_grad, 0, n_out, n_in)
                gb = layer_grad[b_at - w_at:b_at - w_at + n_out]
                dense_backward(a, w, dz_out, scale, scratch, gw, gb, dz_in, l2[layer], acts[layer])
                for write in (False, True):
                    bad = (layer_step(hyper, params, layer_grad, state1, state2, w_at, 0, n_w, eta, write)
                           | layer_step(hyper, params, layer_grad, state1, state2, b_at, b_at - w_at, n_out, eta,
                                        write))
                    if bad != 0:
                        return BAD_UPDATE + layer, loss
            elif sgd:
                if not dense_backward_sgd(a, w, b, dz_out, step, scratch, dz_in, eta * l2[layer], acts[layer]):
                    return BAD_UPDATE + layer, loss
            else:
                gw = _matrix(grads, layout[layer, 0], n_out, n_in)
                gb = grads[layout[layer, 1]:layout[layer, 1] + n_out]
                dense_backward(a, w, dz_out, scale, scratch, gw, gb, dz_in, l2[layer], acts[layer])
    if acc_mode != 0 and hi == ops.shape[0]:
        if acc_mode == 1:
            acc[:] = 0.0
        accumulate(acc, grads, blocks)
    return OK, loss


@kernel
def run_weights(stash, stash_at, batch, params, grads, layout, sizes, acts, scale, l2, scratch, acc, acc_mode,
                blocks):
    """The weight gradients that :func:`run_ops` put off into ``stash`` (``stash_at`` (L, 2): where each
    layer's input and delta are), for a batch of ``batch`` rows: each layer's ``scale``-weighted gradient
    (with ``l2``) into ``grads``, by the same kernel and so the same numbers as a whole backward op; then
    ``grads`` copied into ``acc`` (``acc_mode`` 1: the rest of ``acc`` zeroed) or added to it (2)."""
    no_rows = stash[:0].reshape(0, 1)
    for layer in range(layout.shape[0]):
        n_in, n_out = sizes[layer], sizes[layer + 1]
        a = _matrix(stash, stash_at[layer, 0], batch, n_in)
        dz_out = _matrix(stash, stash_at[layer, 1], batch, n_out)
        w = _matrix(params, layout[layer, 0], n_out, n_in)
        gw = _matrix(grads, layout[layer, 0], n_out, n_in)
        gb = grads[layout[layer, 1]:layout[layer, 1] + n_out]
        dense_backward(a, w, dz_out, scale, scratch, gw, gb, no_rows, l2[layer], acts[layer])
    if acc_mode == 1:
        acc[:] = 0.0
    accumulate(acc, grads, blocks)
