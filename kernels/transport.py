"""Encoding of (rows, width) float rows into the narrow formats sent between pipeline stages, and back.

:mod:`fastckpt.parallel.pipeline.transport` lays the messages out and checks every argument; these loops only compute.

- ``float16`` (IEEE half) and ``bfloat16`` (the top half of a float32): one uint16 code per element,
  the value rounded to nearest, ties to even, *once*, from the source's own bit pattern (float64 or
  float32), never through float32 first.  Integer operations only, so the compiled kernels and their
  Python runs (``NUMBA_DISABLE_JIT=1``) give the same codes.  Decoding looks each code up in a table.
- ``int8``: per row

  .. math::

      s = \\mathrm{RZ}(\\max_j |v_j| / 127), \\qquad
      q_j = \\mathrm{clip}(\\mathrm{rint}(v_j / s), -127, 127), \\qquad
      \\hat v_j = q_j s

  ``RZ`` rounds toward zero in the source dtype (so ``127 s <= max|v|``: decoding never overflows),
  ``v_j / s`` is one float64 division, ``rint`` ties to even, and a row with ``s = 0`` has ``q = 0``.
  ``q_j s`` is a float64 product rounded once to the output dtype.

NOTE [ Rounding once ]
A finite source of magnitude bits ``a`` (``frac`` fraction bits, exponent bias ``bias``) lands in the
target format (``t_frac``, ``t_bias <= bias``) either as a normal number or beyond, by rebiasing the
pattern and shifting it right ``frac - t_frac`` bits with round-half-even on the integer: a carry out
of the fraction moves into the exponent, and past the largest finite code into the infinity code,
which is how overflow shows.  Or as a subnormal: the significand ``M`` (with its implicit bit)
shifted right ``s`` bits with the same rounding, 0 when ``s > frac + 1`` (below half the smallest
subnormal).  Rounding float64 to float32 first and then to the target would round twice: 1 + 2**-11
+ 2**-40 would go to 1 + 2**-11 in float32, a tie, and then to 1.0 instead of half's 1 + 2**-10.
"""
import numpy as np

from ._jit import inline, kernel
from .bits import fma

OK, NONFINITE, OVERFLOW = 0, 1, 2      # status bits of the encoders
FLOAT16 = (10, 15, 0x7C00)             # fraction bits, exponent bias, infinity code
BFLOAT16 = (7, 127, 0x7F80)
SIGN = 0x8000
_BIG = 1.7976931348623157e308          # the largest float64: abs(v) <= _BIG is False for NaN and inf


@inline
def _source_format(bits):
    """(fraction bits, exponent bias, magnitude mask, all-ones exponent) of the float viewed as ``bits``."""
    if bits.itemsize == 8:
        return 52, 1023, 0x7FFFFFFFFFFFFFFF, 2047
    return 23, 127, 0x7FFFFFFF, 255


@inline
def _round_to(a, frac, bias, t_frac, t_bias):
    """The magnitude code of the target nearest (ties to even) to the finite magnitude bits ``a``."""
    shift = frac - t_frac
    field = a >> frac
    if field - bias + t_bias >= 1:                      # the target's normal range, or overflow
        n = a - ((bias - t_bias) << frac)
        return (n + ((1 << (shift - 1)) - 1) + ((n >> shift) & 1)) >> shift
    m = a & ((1 << frac) - 1)
    if field > 0:
        m |= 1 << frac
    else:
        field = 1                                       # a source subnormal: m * 2**(1 - bias - frac)
    s = shift + 1 - (field - bias + t_bias)
    if s > frac + 1:
        return 0
    q = m >> s
    rest = m - (q << s)
    half = 1 << (s - 1)
    if rest > half or (rest == half and (q & 1) == 1):
        q += 1
    return q


@inline
def _encode_codes(bits, t_frac, t_bias, t_inf, codes):
    """Codes of ``bits`` (r, w) into ``codes`` (r, w); an element that is NaN/inf or overflows sets its status
    bit and gets a code that is no finite number."""
    frac, bias, mag_mask, top = _source_format(bits)
    status = OK
    for i in range(bits.shape[0]):
        for j in range(bits.shape[1]):
            b = np.int64(bits[i, j])
            a = b & mag_mask
            if (a >> frac) == top:
                status |= NONFINITE
                c = t_inf
            else:
                c = _round_to(a, frac, bias, t_frac, t_bias)
                if c >= t_inf:
                    status |= OVERFLOW
                    c = t_inf
            codes[i, j] = c | (SIGN if b < 0 else 0)
    return status


@kernel
def float16_encode(bits, codes):
    """IEEE half codes (r, w) uint16 of the floats whose bit patterns are ``bits`` (r, w) int64 (float64) or
    int32 (float32); returns the status bits ``NONFINITE`` and ``OVERFLOW`` (``|v| >= 65520``)."""
    return _encode_codes(bits, FLOAT16[0], FLOAT16[1], FLOAT16[2], codes)


@kernel
def bfloat16_encode(bits, codes):
    """bfloat16 codes (r, w) uint16 of the floats whose bit patterns are ``bits`` (r, w) int64 (float64) or
    int32 (float32); returns the status bits ``NONFINITE`` and ``OVERFLOW`` (``|v| >= 2**128 - 2**119``)."""
    return _encode_codes(bits, BFLOAT16[0], BFLOAT16[1], BFLOAT16[2], codes)


@kernel
def table_decode(codes, table, out):
    """``out[i, j] = table[codes[i, j]]``: codes (r, w) uint16, table (65536,) float32, out (r, w)."""
    for i in range(codes.shape[0]):
        for j in range(codes.shape[1]):
            out[i, j] = table[codes[i, j]]


@inline
def _scale_toward_zero(m, scales):
    """``m / 127`` rounded toward zero to the dtype of ``scales``, as a float64 (``m`` >= 0, finite)."""
    s = m / 127.0
    if scales.itemsize == 4:
        s = np.float64(np.float32(s))
        if fma(s, 127.0, -m) > 0.0:                     # 127 * s > m, decided exactly
            s = np.float64(np.nextafter(np.float32(s), np.float32(0.0)))
    elif fma(s, 127.0, -m) > 0.0:
        s = np.nextafter(s, 0.0)
    return s


@kernel
def int8_encode(src, scales, q):
    """Per row ``i`` of ``src`` (r, w): ``scales[i]`` (r,) of src's dtype and ``q[i]`` (r, w) int8, as in the
    module docstring.  Returns False, with the message incomplete, if a row holds NaN or inf."""
    width = src.shape[1]
    for i in range(src.shape[0]):
        m = 0.0
        bad = 0
        for j in range(width):
            v = abs(np.float64(src[i, j]))
            bad |= np.int64(not v <= _BIG)
            m = max(m, v)
        if bad:
            return False
        s = _scale_toward_zero(m, scales)
        scales[i] = s
        for j in range(width):
            t = 0.0 if s == 0.0 else np.rint(np.float64(src[i, j]) / s)
            q[i, j] = np.int8(min(max(t, -127.0), 127.0))
    return True


@kernel
def int8_decode(scales, q, out):
    """``out[i, j] = q[i, j] * scales[i]``, a float64 product rounded once to out's dtype; out (r, w)."""
    for i in range(q.shape[0]):
        s = np.float64(scales[i])
        for j in range(q.shape[1]):
            out[i, j] = np.float64(q[i, j]) * s


@kernel
def copy_finite(src, dst):
    """``dst[...] = src`` (both (r, w)); returns True when every element is finite."""
    bad = 0
    for i in range(src.shape[0]):
        for j in range(src.shape[1]):
            v = src[i, j]
            dst[i, j] = v
            bad |= np.int64(not abs(np.float64(v)) <= _BIG)
    return bad == 0
