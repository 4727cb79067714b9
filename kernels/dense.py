"""Dense layer, forward and backward, on batch-major C-contiguous arrays.

Forward, for a layer with weights ``W`` (n_out, n_in), bias ``b`` (n_out,) and activation ``f``
(sigmoid, tanh, ReLU, identity, or log-softmax for a softmax net's output):

.. math::  A_{out} = f(A_{in} W^T + b)

Backward works on pre-activation deltas ``G = dL/dZ`` and needs only the
layer's stored input, the output of the layer below, whose activation's
derivative is a function of that output:

.. math::

    \\nabla W = s\\, G_{out}^T A_{in}, \\quad
    \\nabla b = s \\textstyle\\sum_i G_{out,i,:}, \\quad
    G_{in} = (G_{out} W) \\odot f'(A_{in}),

    \\sigma' = a (1 - a), \\quad \\tanh' = (1 - a) (1 + a), \\quad \\mathrm{relu}' = [a > 0], \\quad
    \\mathrm{identity}' = 1

with ``s`` the batch-mean scale 1/batch (relu'(0) = 0, as in PyTorch).  So reversing layer ``l`` reads one
activation, ``a[l]``: the checkpointing model of one stored state per step.
Deltas that would be subnormal are flushed to 0, as activations are: through
many sigmoid layers float32 deltas sink below 1.2e-38, where the CPU computes
slowly and they carry no information the next GEMM could keep.
Every kernel writes into arrays its caller passes; none allocates.
"""

import numpy as np

from ._jit import inline, kernel
from .activations import IDENTITY, RELU, SIGMOID, TANH, bias_activation, bias_log_softmax, bias_sigmoid, smallest_normal
from .blas import NO_TRANS, ROW_MAJOR, TRANS, cblas_dgemm, cblas_sgemm


@inline
def gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    """Row-major ``c = alpha * op(a) @ op(b) + beta * c`` through numpy's BLAS."""
    if c.itemsize == 8:
        cblas_dgemm(ROW_MAJOR, trans_a, trans_b, m, n, k, alpha, a.ctypes.data, lda,
                    b.ctypes.data, ldb, beta, c.ctypes.data, ldc)
    else:
        cblas_sgemm(ROW_MAJOR, trans_a, trans_b, m, n, k, np.float32(alpha), a.ctypes.data, lda,
                    b.ctypes.data, ldb, np.float32(beta), c.ctypes.data, ldc)


@inline
def linear(a_in, w, a_out):
    """``a_out = a_in @ w.T`` after checking that the shapes chain."""
    batch, n_in = a_in.shape
    n_out = w.shape[0]
    if w.shape[1] != n_in or a_out.shape[0] != batch or a_out.shape[1] != n_out:
        raise ValueError("dense_forward: shapes do not chain")
    gemm(NO_TRANS, TRANS, batch, n_out, n_in, 1.0, a_in, n_in, w, n_in, 0.0, a_out, n_out)


@kernel
def dense_forward(a_in, w, b, a_out):
    """``a_out = sigmoid(a_in @ w.T + b)``; a_in (batch, n_in), w (n_out, n_in), a_out (batch, n_out)."""
    linear(a_in, w, a_out)
    bias_sigmoid(a_out, b)


@inline
def _check_backward(a_in, w, dz_out, scratch, dz_in):
    batch, n_in = a_in.shape
    n_out = w.shape[0]
    if (w.shape[1] != n_in or dz_out.shape[0] != batch or dz_out.shape[1] != n_out
            or scratch.shape[0] < n_out or (dz_in.shape[0] > 0 and (dz_in.shape[0] != batch
                                                                   or dz_in.shape[1] != n_in))):
        raise ValueError("dense_backward: shapes do not chain")


@inline
def _bias_sums(dz_out, acc):
    """acc[j] = sum over rows of dz_out[:, j], accumulated in float64."""
    acc[:] = 0.0
    for i in range(dz_out.shape[0]):
        di = dz_out[i]
        for j in range(dz_out.shape[1]):
            acc[j] += di[j]


@inline
def delta_gemm(w, dz_out, dz_in):
    """``dz_in = dz_out @ w``: the layer below's delta before its activation's derivative."""
    batch, n_in = dz_in.shape
    gemm(NO_TRANS, NO_TRANS, batch, n_in, w.shape[0], 1.0, dz_out, w.shape[0], w, n_in, 0.0, dz_in, n_in)


@inline
def sigmoid_delta(a_in, dz_in):
    """``dz_in *= a_in (1 - a_in)`` in float64, subnormals flushed to 0."""
    tiny = smallest_normal(dz_in)
    for i in range(dz_in.shape[0]):
        ai = a_in[i]
        di = dz_in[i]
        for j in range(dz_in.shape[1]):
            aij = np.float64(ai[j])               # float64 in Python too (NumPy 2 keeps float32)
            v = np.float64(di[j]) * aij * (1.0 - aij)
            di[j] = v if abs(v) >= tiny else 0.0


@inline
def tanh_delta(a_in, dz_in):
    """``dz_in *= (1 - a_in) (1 + a_in)`` in float64, subnormals flushed to 0."""
    tiny = smallest_normal(dz_in)
    for i in range(dz_in.shape[0]):
        ai = a_in[i]
        di = dz_in[i]
        for j in range(dz_in.shape[1]):
            aij = np.float64(ai[j])
            v = np.float64(di[j]) * ((1.0 - aij) * (1.0 + aij))
            di[j] = v if abs(v) >= tiny else 0.0


@inline
def relu_delta(a_in, dz_in):
    """``dz_in *= [a_in > 0]``, subnormals flushed to 0."""
    tiny = smallest_normal(dz_in)
    for i in range(dz_in.shape[0]):
        ai = a_in[i]
        di = dz_in[i]
        for j in range(dz_in.shape[1]):
            v = np.float64(di[j]) if ai[j] > 0 else 0.0
            di[j] = v if abs(v) >= tiny else 0.0


@inline
def identity_delta(dz_in):
    """``dz_in *= 1``: the derivative of a linear layer; only subnormals are flushed to 0."""
    tiny = smallest_normal(dz_in)
    for i in range(dz_in.shape[0]):
        di = dz_in[i]
        for j in range(dz_in.shape[1]):
            v = di[j]
            di[j] = 0.0 if abs(v) < tiny else v


@inline
def _delta_in(a_in, w, dz_out, dz_in, act_in):
    """dz_in = (dz_out @ w) * f'(a_in), f the activation of code ``act_in`` that made a_in: the delta of
    the layer below, subnormals flushed to 0."""
    if act_in != SIGMOID and act_in != TANH and act_in != RELU and act_in != IDENTITY:
        raise ValueError("dense_backward: the layer below has no derivative from its output")
    delta_gemm(w, dz_out, dz_in)
    if act_in == RELU:
        relu_delta(a_in, dz_in)
    elif act_in == IDENTITY:
        identity_delta(dz_in)
    elif act_in == TANH:
        tanh_delta(a_in, dz_in)
    else:
        sigmoid_delta(a_in, dz_in)


@inline
def layer_gradients(a_in, w, dz_out, scale, scratch, grad_w, grad_b, l2):
    """``grad_b = scale * sum(dz_out)`` (summed in float64 in ``scratch``), ``grad_w = scale * dz_out^T a_in``
    and ``+ l2 * w``."""
    batch, n_in = a_in.shape
    n_out = w.shape[0]
    acc = scratch[:n_out]                              # (n_out,) float64 bias-gradient sums
    _bias_sums(dz_out, acc)
    for j in range(n_out):
        grad_b[j] = scale * acc[j]
    gemm(TRANS, NO_TRANS, n_out, n_in, batch, scale, dz_out, n_out, a_in, n_in, 0.0, grad_w, n_in)
    if l2 != 0.0:
        for r in range(n_out):
            for c in range(n_in):
                grad_w[r, c] += np.float64(l2) * np.float64(w[r, c])


@inline
def sgd_layer(a_in, w, b, dz_out, step, scratch, decay):
    """``b -= step * sum(dz_out)``, ``w = (1 - decay) w - step * dz_out^T a_in``; True when both stay finite."""
    batch, n_in = a_in.shape
    n_out = w.shape[0]
    acc = scratch[:n_out]
    _bias_sums(dz_out, acc)
    bad = 0
    for j in range(n_out):
        b[j] = b[j] - step * acc[j]
        bad |= np.int64((b[j] - b[j]) != 0.0)
    gemm(TRANS, NO_TRANS, n_out, n_in, batch, -step, dz_out, n_out, a_in, n_in, 1.0 - decay, w, n_in)
    flat = w.ravel()
    for k in range(flat.shape[0]):
        v = flat[k]
        bad |= np.int64((v - v) != 0.0)
    return bad == 0


@kernel
def dense_forward_log_softmax(a_in, w, b, scratch, a_out):
    """The output layer of a softmax net: ``a_out = log_softmax(a_in @ w.T + b)`` (log-probabilities)."""
    linear(a_in, w, a_out)
    bias_log_softmax(a_out, b, scratch)


@kernel
def dense_forward_layer(a_in, w, b, act, scratch, a_out):
    """The one forward step of training, recomputation and inference: ``a_out = f(a_in @ w.T + b)``
    for the activation of code ``act`` (``SIGMOID``, ``TANH``, ``RELU``, ``IDENTITY``, or ``LOG_SOFTMAX`` for a
    softmax net's last layer); scratch float64 (>= n_out,)."""
    linear(a_in, w, a_out)
    bias_activation(a_out, b, act, scratch)


@kernel
def dense_backward(a_in, w, dz_out, scale, scratch, grad_w, grad_b, dz_in, l2=0.0, act_in=SIGMOID):
    """Gradients of one layer from its output delta, and the delta of the layer below.

    ``grad_w`` (n_out, n_in) and ``grad_b`` (n_out,) get ``scale``-weighted sums
    over the batch of ``dz_out`` (batch, n_out).  ``dz_in`` (batch, n_in) gets
    the layer below's pre-activation delta unless it has no rows (first layer).
    ``l2`` adds the weight penalty's gradient ``l2 * w`` (biases carry none).
    ``act_in`` is the code of the activation that made ``a_in``.
    """
    _check_backward(a_in, w, dz_out, scratch, dz_in)
    if grad_w.shape[0] != w.shape[0] or grad_w.shape[1] != w.shape[1] or grad_b.shape[0] != w.shape[0]:
        raise ValueError("dense_backward: gradient shapes do not match the layer")
    layer_gradients(a_in, w, dz_out, scale, scratch, grad_w, grad_b, l2)
    if dz_in.shape[0] > 0:
        _delta_in(a_in, w, dz_out, dz_in, act_in)


@kernel
def dense_backward_input(a_in, w, dz_out, scratch, dz_in, act_in=SIGMOID):
    """The input half of :func:`dense_backward`: ``dz_in`` alone, the same numbers bit for bit (the weight
    gradient put off, NOTE [ Zero bubble ] of the pipeline schedules); nothing when ``dz_in`` has no rows."""
    _check_backward(a_in, w, dz_out, scratch, dz_in)
    if dz_in.shape[0] > 0:
        _delta_in(a_in, w, dz_out, dz_in, act_in)


@kernel
def dense_backward_sgd(a_in, w, b, dz_out, step, scratch, dz_in, decay=0.0, act_in=SIGMOID):
    """Backward step that applies SGD at once: ``w -= step * dz_out^T a_in``, ``b -= step * sum(dz_out)``.

    ``dz_in`` is computed first, from the weights before the update, so the
    result equals computing the gradient and then updating (up to the rounding
    of folding ``step`` into the GEMM).  ``decay`` = eta * l2 shrinks ``w`` by
    ``1 - decay`` in the same GEMM (its beta); ``act_in`` as in :func:`dense_backward`.  Returns False when the updated
    ``w`` or ``b`` holds a NaN or inf.
    """
    _check_backward(a_in, w, dz_out, scratch, dz_in)
    if b.shape[0] != w.shape[0]:
        raise ValueError("dense_backward_sgd: bias shape does not match the layer")
    if dz_in.shape[0] > 0:
        _delta_in(a_in, w, dz_out, dz_in, act_in)
    return sgd_layer(a_in, w, b, dz_out, step, scratch, decay)
