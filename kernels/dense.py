"""Dense sigmoid layer, forward and backward, on batch-major C-contiguous arrays.

Forward, for a layer with weights ``W`` (n_out, n_in) and bias ``b`` (n_out,):

.. math::  A_{out} = \\sigma(A_{in} W^T + b)

Backward, from ``D = dL/dA_out`` (batch, n_out), using only the stored output
(sigma' = a (1 - a)):

.. math::

    G = D \\odot A_{out} \\odot (1 - A_{out}), \\quad
    \\nabla W = s\\, G^T A_{in}, \\quad
    \\nabla b = s \\textstyle\\sum_i G_{i,:}, \\quad
    dL/dA_{in} = G W

with ``s`` the batch-mean scale 1/batch.  Every kernel writes into arrays its
caller passes; none allocates.
"""
import numpy as np

from ._jit import inline, kernel
from .activations import bias_sigmoid
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


@kernel
def dense_forward(a_in, w, b, scratch, a_out):
    """``a_out = sigmoid(a_in @ w.T + b)``; a_in (batch, n_in), w (n_out, n_in), a_out (batch, n_out)."""
    batch, n_in = a_in.shape
    n_out = w.shape[0]
    if w.shape[1] != n_in or a_out.shape[0] != batch or a_out.shape[1] != n_out:
        raise ValueError("dense_forward: shapes do not chain")
    gemm(NO_TRANS, TRANS, batch, n_out, n_in, 1.0, a_in, n_in, w, n_in, 0.0, a_out, n_out)
    bias_sigmoid(a_out, b, scratch)


@kernel
def dense_backward(a_in, a_out, w, d_out, scale, scratch, grad_w, grad_b, d_in):
    """Backward step of one layer; ``d_out`` is overwritten with the pre-activation delta.

    grad_w (n_out, n_in) and grad_b (n_out,) get ``scale``-weighted sums over the
    batch.  ``d_in`` (batch, n_in) gets dL/dA_in unless it has no rows (first layer).
    """
    batch, n_in = a_in.shape
    n_out = w.shape[0]
    if (a_out.shape[0] != batch or a_out.shape[1] != n_out or d_out.shape[0] != batch
            or d_out.shape[1] != n_out or grad_w.shape[0] != n_out or grad_w.shape[1] != n_in
            or scratch.shape[0] < n_out or grad_b.shape[0] != n_out):
        raise ValueError("dense_backward: shapes do not chain")
    acc = scratch[:n_out]                              # (n_out,) float64 bias-gradient sums
    acc[:] = 0.0
    for i in range(batch):
        ai = a_out[i]
        di = d_out[i]
        for j in range(n_out):
            g = np.float64(di[j]) * ai[j] * (1.0 - ai[j])
            di[j] = g
            acc[j] += di[j]
    for j in range(n_out):
        grad_b[j] = scale * acc[j]
    gemm(TRANS, NO_TRANS, n_out, n_in, batch, scale, d_out, n_out, a_in, n_in, 0.0, grad_w, n_in)
    if d_in.shape[0] > 0:
        gemm(NO_TRANS, NO_TRANS, batch, n_in, n_out, 1.0, d_out, n_out, w, n_in, 0.0, d_in, n_in)
