"""Three machine operations the kernels need and Numba does not expose: fused multiply-add and
reinterpreting a float's bits as an integer and back.

``fma(a, b, c)`` is ``a * b + c`` with one rounding (LLVM's ``llvm.fma``: one ``vfmadd`` on any
x86-64 CPU with FMA3, which every AVX2 CPU has).  Unlike ``fastmath``, it is an explicit
operation: the same inputs give the same bits on every CPU and in every recomputation, and
NaN and infinities keep their IEEE meaning.

``pow2(kd)`` is ``2**k`` for ``kd = 1.5 * 2**52 + k`` (float64) or ``1.5 * 2**23 + k``
(float32), built by writing ``k`` into the exponent field with integer operations of the
float's own width.  So there is no int64-to-double conversion (AVX2 has none in packed form),
and float32 keeps 8 (16) lanes per vector: in Numba's own integer arithmetic an int32
expression widens to int64.

NOTE [ No JIT ]
With ``NUMBA_DISABLE_JIT=1`` the kernels run as Python and these are Python functions with the
same results: ``fma`` computes ``a * b + c`` exactly with fractions and rounds once to the
dtype of ``a`` (correcting float32's double rounding through float64), so the numbers match
the compiled kernels bit for bit.
"""
from fractions import Fraction

import numpy as np
from numba import config, types

_INT_OF = {np.dtype(np.float64): np.int64, np.dtype(np.float32): np.int32}


def _round_exact(exact, dtype):
    """The float of *dtype* nearest to the Fraction *exact* (ties to even), or +-inf."""
    try:
        x = dtype(float(exact))
    except OverflowError:
        return dtype(np.inf if exact > 0 else -np.inf)
    if not np.isfinite(x) or Fraction(float(x)) == exact:
        return x
    toward = dtype(np.inf) if Fraction(float(x)) < exact else dtype(-np.inf)
    other = np.nextafter(x, toward)
    if not np.isfinite(other):
        return x
    dx, do = abs(Fraction(float(x)) - exact), abs(Fraction(float(other)) - exact)
    odd = int(np.asarray(x).view(_INT_OF[np.dtype(dtype)])) & 1
    return other if do < dx or (do == dx and odd) else x


def fma_python(a, b, c):
    """``a * b + c`` rounded once, in the dtype of *a* (float64 for a Python float)."""
    dtype = np.asarray(a).dtype.type if isinstance(a, np.floating) else np.float64
    a, b, c = dtype(a), dtype(b), dtype(c)
    if not (np.isfinite(a) and np.isfinite(b) and np.isfinite(c)):
        with np.errstate(all="ignore"):
            return dtype(a * b + c)
    return _round_exact(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c)), dtype)


_POW2 = {  # dtype: (bits of 1.5 * 2**m, exponent bias, mantissa bits m)
    np.dtype(np.float64): (0x4338000000000000, 1023, 52),
    np.dtype(np.float32): (0x4B400000, 127, 23),
}


def pow2_python(kd):
    kd = kd if isinstance(kd, np.floating) else np.float64(kd)
    rounded, bias, shift = _POW2[kd.dtype]
    itype = _INT_OF[kd.dtype]
    bits = np.asarray(kd).view(itype)[()]
    with np.errstate(over="ignore"):
        out = (bits - itype(rounded) + itype(bias)) << itype(shift)
    return np.asarray(itype(out)).view(kd.dtype)[()]


if config.DISABLE_JIT:
    fma, pow2 = fma_python, pow2_python
else:
    from llvmlite import ir
    from numba.extending import intrinsic

    @intrinsic
    def fma(typingctx, a, b, c):
        """``a * b + c`` with a single rounding, in a's float type (b and c are cast to it)."""
        if not isinstance(a, types.Float):
            return None

        def codegen(context, builder, signature, args):
            x, y, z = (context.cast(builder, v, t, a) for v, t in zip(args, signature.args))
            return builder.fma(x, y, z)
        return a(a, b, c), codegen

    @intrinsic
    def pow2(typingctx, kd):
        """``2**k`` for ``kd = 1.5 * 2**m + k`` (m = 52 for float64, 23 for float32), in kd's type."""
        if kd not in (types.float64, types.float32):
            return None

        def codegen(context, builder, signature, args):
            rounded, bias, shift = _POW2[np.dtype(kd.name)]
            ftype = args[0].type
            itype = ir.IntType(kd.bitwidth)
            bits = builder.bitcast(args[0], itype)
            bits = builder.add(builder.sub(bits, itype(rounded)), itype(bias))
            return builder.bitcast(builder.shl(bits, itype(shift)), ftype)
        return kd(kd), codegen
