"""The activations, fused with the bias: sigmoid, tanh, ReLU, identity and log-softmax, with an exp written
in the kernel, which LLVM vectorises on AVX2 and AVX-512 alike (Numba's ``np.exp`` and
``np.tanh`` are scalar libm calls here).

.. math::

    \\sigma(x) = \\frac{1}{1 + e^{-x}}, \\qquad
    \\tanh(x) = \\mathrm{sign}(x) \\frac{e^{2|x|} - 1}{e^{2|x|} + 1}, \\qquad
    \\mathrm{relu}(x) = \\max(x, 0), \\qquad \\mathrm{identity}(x) = x,

    e^{t} = 2^{k} p(r), \\quad k = \\mathrm{round}(t / \\ln 2), \\quad r = t - k \\ln 2

- ``k`` is rounded by adding and subtracting 1.5 * 2**52, and ``r`` is reduced with ``ln 2``
  split in two parts (Cody-Waite), so ``|r| <= ln(2)/2``.
- ``p`` is the degree-11 Chebyshev interpolant of exp on that interval (float64; error 3e-18)
  or degree 6 (float32; error 2e-9), evaluated by Horner's rule with fused multiply-adds.
  ``benchmarks/exp_polynomial.py`` derives the coefficients.
- ``2**k`` is built by writing the exponent field: the low bits of ``t / ln 2 + 1.5 * 2**52``
  already hold ``k``, so there is no int64-to-double conversion (AVX2 has none in packed form).

Every step is one branch-free loop over a row, with fused multiply-adds and integer shifts on
packed vectors.  Measured (``kernel.inspect_asm``): ymm on AVX2, zmm on AVX-512, no scalar
division.  Relative error against a long-double reference: 2.4e-16 (float64), 1.4e-7 (float32).

Outputs that would be subnormal are flushed to exactly 0 (``x`` below -708 in float64, -87 in
float32; tanh, ReLU and identity of a subnormal): subnormals make later GEMMs crawl and carry no
information at these precisions.  NaN stays NaN: the clamps below keep a NaN, and it flows
through every fused multiply-add.

tanh uses ``e^{2|x|} - 1`` without cancellation: ``p(r) - 1 = r (p_1 + r (p_2 + ...))`` since
``p_0 = 1`` exactly, then ``2^k (p(r) - 1) + (2^k - 1)`` in one fused multiply-add, so small
``x`` keep their relative accuracy (3 ulp against a long-double reference in float64).
``|x|`` is clamped at 20 (float64) or 9 (float32), where tanh rounds to 1.

Each activation has a code (:data:`SIGMOID`, :data:`TANH`, :data:`RELU`,
:data:`LOG_SOFTMAX`, :data:`IDENTITY`) that the layer kernels dispatch on, outside their loops over elements.
"""
import math

import numpy as np

from ._jit import inline, kernel
from .bits import fma, pow2

_INV_LN2 = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01                   # low 32 bits zero: k * _LN2_HI is exact
_LN2_LO = 1.90821492927058770002e-10
_ROUND = 6755399441055744.0                            # 1.5 * 2**52
_P0, _P1, _P2, _P3, _P4, _P5, _P6, _P7, _P8, _P9, _P10, _P11 = (
    1.0, 1.0, 0.5000000000000019, 0.1666666666666668, 0.04166666666648795, 0.008333333333319589,
    0.0013888888952352863, 0.00019841269890076403, 2.4801485441561313e-05, 2.755724088722987e-06,
    2.763265472252779e-07, 2.5110049204818658e-08)

_F = np.float32
_INV_LN2_F, _LN2_HI_F, _LN2_LO_F = _F(1.4426950408889634), _F(0.693359375), _F(-2.12194440e-4)
_ROUND_F = _F(12582912.0)                              # 1.5 * 2**23
_Q0, _Q1, _Q2, _Q3, _Q4, _Q5, _Q6 = (
    _F(1.0), _F(1.0000000377388714), _F(0.5000000047146057), _F(0.16666415414041177),
    _F(0.04166635277111221), _F(0.008375134774624326), _F(0.0013941118895837))
_ONE_F, _LIMIT_F, _ZERO_F = _F(1.0), _F(87.0), _F(0.0)
_TWO_F, _TANH_LIMIT_F, _TINY_F = _F(2.0), _F(18.0), _F(1.1754943508222875e-38)

SIGMOID, TANH, RELU, LOG_SOFTMAX, IDENTITY = 0, 1, 2, 3, 4   # activation codes, as the layer kernels take them


@inline
def smallest_normal(x):
    """The smallest positive normal number of x's dtype (float32 or float64)."""
    return 1.1754943508222875e-38 if x.itemsize == 4 else 2.2250738585072014e-308


@inline
def exp64(t):
    """e**t for float64 t in [-708, 708] (or NaN, which stays NaN): a normal number."""
    kd = fma(t, _INV_LN2, _ROUND)
    k = kd - _ROUND
    r = fma(-k, _LN2_LO, fma(-k, _LN2_HI, t))
    p = fma(r, fma(r, fma(r, fma(r, fma(r, fma(r, fma(r, fma(r, fma(r, fma(
        r, fma(r, _P11, _P10), _P9), _P8), _P7), _P6), _P5), _P4), _P3), _P2), _P1), _P0)
    return p * pow2(kd)


@inline
def exp32(t):
    """e**t for float32 t in [-87, 87] (or NaN), in float32: a normal number."""
    kd = fma(t, _INV_LN2_F, _ROUND_F)
    k = kd - _ROUND_F
    r = fma(-k, _LN2_LO_F, fma(-k, _LN2_HI_F, t))
    p = fma(r, fma(r, fma(r, fma(r, fma(r, fma(r, _Q6, _Q5), _Q4), _Q3), _Q2), _Q1), _Q0)
    return p * pow2(kd)


@inline
def _sigmoid64(x):
    """sigma(x) for float64 x, 0 below -708."""
    t0 = -x
    t = 708.0 if t0 > 708.0 else t0                    # written so that NaN stays NaN
    t = -708.0 if t < -708.0 else t
    s = 1.0 / (1.0 + exp64(t))
    return 0.0 if t0 > 708.0 else s


@inline
def _sigmoid32(x):
    """sigma(x) in float32, 0 below -87."""
    t0 = -x
    t = _LIMIT_F if t0 > _LIMIT_F else t0
    t = -_LIMIT_F if t < -_LIMIT_F else t
    s = _ONE_F / (_ONE_F + exp32(t))
    return _ZERO_F if t0 > _LIMIT_F else s


@kernel
def bias_sigmoid(z, b):
    """In place: ``z = sigmoid(z + b)``; z (batch, n), b (n,), both float64 or both float32."""
    if b.shape[0] != z.shape[1]:
        raise ValueError("bias_sigmoid: bias and row differ in length")
    sigmoid_rows(z, b)


@inline
def sigmoid_rows(z, b):
    """:func:`bias_sigmoid` without its check, for the kernels that run a plan's ops."""
    batch, n = z.shape
    for i in range(batch):
        zi = z[i]
        if z.itemsize == 4:
            for j in range(n):
                zi[j] = _sigmoid32(zi[j] + b[j])
        else:
            for j in range(n):
                zi[j] = _sigmoid64(zi[j] + b[j])


@inline
def _expm1_64(t):
    """e**t - 1 for float64 t in [0, 40] (or NaN), accurate for small t too."""
    kd = fma(t, _INV_LN2, _ROUND)
    k = kd - _ROUND
    r = fma(-k, _LN2_LO, fma(-k, _LN2_HI, t))
    q = r * fma(r, fma(r, fma(r, fma(r, fma(r, fma(r, fma(r, fma(r, fma(
        r, fma(r, _P11, _P10), _P9), _P8), _P7), _P6), _P5), _P4), _P3), _P2), _P1)   # p(r) - 1
    s = pow2(kd)
    return fma(s, q, s - 1.0)


@inline
def _expm1_32(t):
    """e**t - 1 for float32 t in [0, 18] (or NaN), in float32."""
    kd = fma(t, _INV_LN2_F, _ROUND_F)
    k = kd - _ROUND_F
    r = fma(-k, _LN2_LO_F, fma(-k, _LN2_HI_F, t))
    q = r * fma(r, fma(r, fma(r, fma(r, fma(r, _Q6, _Q5), _Q4), _Q3), _Q2), _Q1)
    s = pow2(kd)
    return fma(s, q, s - _ONE_F)


@inline
def _tanh64(x):
    """tanh(x) for float64 x; |tanh| below the smallest normal is flushed to 0."""
    t0 = 2.0 * abs(x)
    t = 40.0 if t0 > 40.0 else t0                      # NaN stays NaN
    e = _expm1_64(t)
    r = e / (e + 2.0)
    r = 0.0 if r < 2.2250738585072014e-308 else r
    return -r if x < 0.0 else r


@inline
def _tanh32(x):
    """tanh(x) in float32; |tanh| below the smallest normal is flushed to 0."""
    t0 = _TWO_F * abs(x)
    t = _TANH_LIMIT_F if t0 > _TANH_LIMIT_F else t0
    e = _expm1_32(t)
    r = e / (e + _TWO_F)
    r = _ZERO_F if r < _TINY_F else r
    return -r if x < _ZERO_F else r


@kernel
def bias_tanh(z, b):
    """In place: ``z = tanh(z + b)``; z (batch, n), b (n,), both float64 or both float32."""
    if b.shape[0] != z.shape[1]:
        raise ValueError("bias_tanh: bias and row differ in length")
    tanh_rows(z, b)


@inline
def tanh_rows(z, b):
    """:func:`bias_tanh` without its check."""
    batch, n = z.shape
    for i in range(batch):
        zi = z[i]
        if z.itemsize == 4:
            for j in range(n):
                zi[j] = _tanh32(zi[j] + b[j])
        else:
            for j in range(n):
                zi[j] = _tanh64(zi[j] + b[j])


@kernel
def bias_relu(z, b):
    """In place: ``z = max(z + b, 0)``, subnormal results flushed to 0 and NaN kept; z (batch, n), b (n,)."""
    if b.shape[0] != z.shape[1]:
        raise ValueError("bias_relu: bias and row differ in length")
    relu_rows(z, b)


@inline
def relu_rows(z, b):
    """:func:`bias_relu` without its check."""
    batch, n = z.shape
    tiny = smallest_normal(z)
    for i in range(batch):
        zi = z[i]
        for j in range(n):
            v = zi[j] + b[j]
            zi[j] = 0.0 if v < tiny else v             # NaN < tiny is False: NaN stays


@kernel
def bias_identity(z, b):
    """In place: ``z = z + b`` (a linear layer: a regression net's output), subnormal results flushed to 0 and
    NaN kept; z (batch, n), b (n,)."""
    if b.shape[0] != z.shape[1]:
        raise ValueError("bias_identity: bias and row differ in length")
    identity_rows(z, b)


@inline
def identity_rows(z, b):
    """:func:`bias_identity` without its check."""
    batch, n = z.shape
    tiny = smallest_normal(z)
    for i in range(batch):
        zi = z[i]
        for j in range(n):
            v = zi[j] + b[j]
            zi[j] = 0.0 if abs(v) < tiny else v        # NaN < tiny is False: NaN stays


@kernel
def bias_activation(z, b, act, scratch):
    """In place: ``z = f(z + b)`` for the activation of code ``act``; scratch float64 (>= n,) for log-softmax."""
    if b.shape[0] != z.shape[1] or (act == LOG_SOFTMAX and scratch.shape[0] < z.shape[1]):
        raise ValueError("bias_activation: bias or scratch shorter than the row")
    if act == SIGMOID:
        sigmoid_rows(z, b)
    elif act == TANH:
        tanh_rows(z, b)
    elif act == RELU:
        relu_rows(z, b)
    elif act == IDENTITY:
        identity_rows(z, b)
    elif act == LOG_SOFTMAX:
        log_softmax_rows(z, b, scratch)
    else:
        raise ValueError("bias_activation: unknown activation code")


@kernel
def bias_log_softmax(z, b, scratch):
    """In place, row by row: ``z = log_softmax(z + b)`` in float64, stored in z's dtype.

    .. math::  \\log p_j = (z_j + b_j) - m - \\log \\textstyle\\sum_k e^{z_k + b_k - m}, \\quad m = \\max_k (z_k + b_k)

    Exact for any finite logits (no overflow, no log of 0).  scratch float64 (>= n,).
    """
    if scratch.shape[0] < z.shape[1] or b.shape[0] != z.shape[1]:
        raise ValueError("bias_log_softmax: scratch or bias shorter than the row")
    log_softmax_rows(z, b, scratch)


@inline
def log_softmax_rows(z, b, scratch):
    """:func:`bias_log_softmax` without its check."""
    batch, n = z.shape
    for i in range(batch):
        zi = z[i]
        m = -np.inf
        for j in range(n):
            v = np.float64(zi[j]) + np.float64(b[j])
            m = v if v > m else m
        for j in range(n):                             # e^(v - m), v - m in [-inf, 0]
            t = np.float64(zi[j]) + np.float64(b[j]) - m
            scratch[j] = exp64(-708.0 if t < -708.0 else t)
        total = 0.0
        for j in range(n):
            total += scratch[j]
        lse = m + math.log(total)                  # libm's log, compiled or not
        for j in range(n):
            zi[j] = np.float64(zi[j]) + np.float64(b[j]) - lse
