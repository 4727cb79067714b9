"""Sigmoid with an exp that LLVM vectorizes (Numba's ``np.exp`` is a scalar libm call here).

.. math::

    \\sigma(x) = \\frac{1}{1 + e^{-x}}, \\qquad
    e^{t} = 2^{k} p(r), \\quad k = \\mathrm{round}(t / \\ln 2), \\quad r = t - k \\ln 2

with ``ln 2`` split in two parts (Cody-Waite) so ``r`` is exact, ``|r| <= ln(2)/2``
and ``p`` the degree-13 Taylor polynomial (truncation below 1e-17).  ``2^k`` is
added to the exponent bits of ``p``, so no integer-to-float conversion blocks
vectorisation.  The exp is evaluated in float64 for both dtypes.

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


@kernel
def bias_sigmoid(z, b, scratch):
    """In place: ``z = sigmoid(z + b)``; z (batch, n), b (n,), scratch float64 (>= n,)."""
    batch, n = z.shape
    if scratch.shape[0] < n or b.shape[0] != n:
        raise ValueError("bias_sigmoid: scratch or bias shorter than the row")
    limit = 708.0 if z.itemsize == 8 else 87.0
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
