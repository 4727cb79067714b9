"""Sigmoid with an exp that LLVM vectorizes (Numba's ``np.exp`` is a scalar libm call here).

.. math::

    \\sigma(x) = \\frac{1}{1 + e^{-x}}, \\qquad
    e^{t} = 2^{k} p(r), \\quad k = \\mathrm{round}(t / \\ln 2), \\quad r = t - k \\ln 2

with ``ln 2`` split in two parts (Cody-Waite) so ``r`` is exact, ``|r| <= ln(2)/2``
and ``p`` the degree-13 Taylor polynomial (truncation below 1e-17).  ``2^k`` is
added to the exponent bits of ``p``, so no integer-to-float conversion blocks
vectorisation.  float32 arrays get the same scheme in float32 (degree 7), which
fills twice the lanes: relative error below 3e-7.

Outputs that would be subnormal are flushed to exactly 0 (``x`` below -708 in
float64, -87 in float32): subnormals make later GEMMs crawl and carry no
information at these precisions.  NaN stays NaN.
"""
import math

import numpy as np

from ._jit import inline, kernel

_INV_LN2 = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_ROUND = 6755399441055744.0  # 1.5 * 2**52: adding then subtracting it rounds to an integer
_C = tuple(1.0 / math.factorial(i) for i in range(14))
_C3, _C4, _C5, _C6, _C7, _C8, _C9, _C10, _C11, _C12, _C13 = _C[3:]


@inline
def smallest_normal(x):
    """The smallest positive normal number of x's dtype (float32 or float64)."""
    return 1.1754943508222875e-38 if x.itemsize == 4 else 2.2250738585072014e-308


@inline
def _exp_parts(t):
    """Split e**t (t already clamped to [-708, 708]) into (k, p) with e**t = 2**k * p."""
    k = (t * _INV_LN2 + _ROUND) - _ROUND
    r = (t - k * _LN2_HI) - k * _LN2_LO
    p = 1.0 + r * (1.0 + r * (0.5 + r * (_C3 + r * (_C4 + r * (_C5 + r * (_C6 + r * (
        _C7 + r * (_C8 + r * (_C9 + r * (_C10 + r * (_C11 + r * (_C12 + r * _C13))))))))))))
    return k, p


@inline
def _neg_arg(z, b):
    """-(z + b) in float64, clamped so exp(-(z + b)) stays a normal number."""
    t = -(np.float64(z) + np.float64(b))
    t = t if t < 708.0 else 708.0
    return t if t > -708.0 else -708.0


# float32: the same scheme in single precision, 16 lanes per AVX-512 vector instead of 8.
# Degree 7 leaves a truncation below 6e-9 on |r| <= ln(2)/2, under float32's 6e-8 epsilon.
_F = np.float32
_INV_LN2_F, _LN2_HI_F, _LN2_LO_F = _F(1.4426950408889634), _F(0.693359375), _F(-2.12194440e-4)
_ROUND_F = _F(12582912.0)  # 1.5 * 2**23
_D = tuple(_F(1.0 / math.factorial(i)) for i in range(8))
_ONE_F, _LIMIT_F, _ZERO_F = _F(1.0), _F(87.0), _F(0.0)


@inline
def _exp_parts32(t):
    """e**t = 2**k * p in float32, for t already clamped to [-87, 87]."""
    k = (t * _INV_LN2_F + _ROUND_F) - _ROUND_F
    r = (t - k * _LN2_HI_F) - k * _LN2_LO_F
    p = _D[0] + r * (_D[1] + r * (_D[2] + r * (_D[3] + r * (_D[4] + r * (_D[5] + r * (_D[6] + r * _D[7]))))))
    return k, p


@inline
def _neg_arg32(z, b):
    t = -(z + b)
    t = t if t < _LIMIT_F else _LIMIT_F
    return t if t > -_LIMIT_F else -_LIMIT_F


@inline
def _bias_sigmoid32(z, b, scratch):
    batch, n = z.shape
    vals = scratch.view(np.float32)
    bits = scratch.view(np.int32)
    for i in range(batch):
        zi = z[i]
        for j in range(n):
            k, p = _exp_parts32(_neg_arg32(zi[j], b[j]))
            vals[j] = p
        for j in range(n):
            k, p = _exp_parts32(_neg_arg32(zi[j], b[j]))
            bits[j] += np.int32(k) << 23               # p * 2**k = exp(-(z + b))
        for j in range(n):
            t = -(zi[j] + b[j])
            s = _ONE_F / (_ONE_F + vals[j])
            zi[j] = s if t <= _LIMIT_F else (_ZERO_F if t > _LIMIT_F else t)  # t is NaN in the last case


@kernel
def bias_sigmoid(z, b, scratch):
    """In place: ``z = sigmoid(z + b)``; z (batch, n), b (n,), scratch float64 (>= n,)."""
    batch, n = z.shape
    if scratch.shape[0] < n or b.shape[0] != n:
        raise ValueError("bias_sigmoid: scratch or bias shorter than the row")
    if z.itemsize == 4:
        _bias_sigmoid32(z, b, scratch)
        return
    limit = 708.0
    bits = scratch.view(np.int64)
    for i in range(batch):
        zi = z[i]                                      # (n,)
        for j in range(n):
            k, p = _exp_parts(_neg_arg(zi[j], b[j]))
            scratch[j] = p
        for j in range(n):
            k, p = _exp_parts(_neg_arg(zi[j], b[j]))
            bits[j] += np.int64(k) << 52               # p * 2**k = exp(-(z + b))
        for j in range(n):
            t = -(np.float64(zi[j]) + np.float64(b[j]))
            s = 1.0 / (1.0 + scratch[j])
            zi[j] = s if t <= limit else (0.0 if t > limit else t)  # t is NaN in the last case


@kernel
def bias_log_softmax(z, b, scratch):
    """In place, row by row: ``z = log_softmax(z + b)`` in float64, stored in z's dtype.

    .. math::  \\log p_j = (z_j + b_j) - m - \\log \\textstyle\\sum_k e^{z_k + b_k - m}, \\quad m = \\max_k (z_k + b_k)

    Exact for any finite logits (no overflow, no log of 0).  scratch float64 (>= n,).
    """
    batch, n = z.shape
    if scratch.shape[0] < n or b.shape[0] != n:
        raise ValueError("bias_log_softmax: scratch or bias shorter than the row")
    bits = scratch.view(np.int64)
    for i in range(batch):
        zi = z[i]
        m = -np.inf
        for j in range(n):
            v = np.float64(zi[j]) + np.float64(b[j])
            m = v if v > m else m
        for j in range(n):                             # e^(v - m), v - m in [-inf, 0]
            t = np.float64(zi[j]) + np.float64(b[j]) - m
            t = t if t > -708.0 else -708.0
            k, p = _exp_parts(t)
            scratch[j] = p
        for j in range(n):
            t = np.float64(zi[j]) + np.float64(b[j]) - m
            t = t if t > -708.0 else -708.0
            k, p = _exp_parts(t)
            bits[j] += np.int64(k) << 52
        total = 0.0
        for j in range(n):
            total += scratch[j]
        lse = m + math.log(total)                  # libm's log, compiled or not
        for j in range(n):
            zi[j] = np.float64(zi[j]) + np.float64(b[j]) - lse
