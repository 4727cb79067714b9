"""fma and pow2, compiled (LLVM intrinsics) against their plain-Python twins, which compute exactly with
fractions; and the sigmoid kernel really compiled to packed vector code on AVX2 and on AVX-512 targets."""
import json
import os
import platform
import subprocess
import sys
from fractions import Fraction

import numba
import numpy as np
import pytest
from fastckpt.kernels.bits import fma, fma_python, pow2, pow2_python


@numba.njit
def _fma_all(a, b, c, out):
    for i in range(a.shape[0]):
        out[i] = fma(a[i], b[i], c[i])


@numba.njit
def _pow2_all(kd, out):
    for i in range(kd.shape[0]):
        out[i] = pow2(kd[i])


def _operands(rng, dtype, n):
    """Random magnitudes over a wide range, with exact cancellations (c = -a*b rounded) mixed in."""
    def draw():
        return (rng.standard_normal(n) * 2.0 ** rng.integers(-30, 30, n)).astype(dtype)
    a, b, c = draw(), draw(), draw()
    c[::3] = -(a[::3].astype(np.float64) * b[::3]).astype(dtype)
    return a, b, c


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fma_rounds_once_like_the_exact_sum(rng, dtype):
    a, b, c = _operands(rng, dtype, 3000)
    out = np.empty_like(a)
    _fma_all(a, b, c, out)
    expected = np.array([fma_python(x, y, z) for x, y, z in zip(a, b, c)], dtype=dtype)
    np.testing.assert_array_equal(out, expected)
    # Independent of both: the exact value is within half an ulp, and a*b + c rounded twice differs somewhere.
    for x, y, z, got in list(zip(a, b, c, out))[:300]:
        exact = Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z))
        assert abs(Fraction(float(got)) - exact) <= Fraction(float(np.spacing(np.abs(got)))) / 2
    assert np.any(out != (a * b + c))


def test_fma_python_float32_corrects_double_rounding():
    """1 + 2**-24 + 2**-60 rounds up in one step, but to 1.0 through float64 then float32 (ties to even)."""
    a, b, c = np.float32(1 + 2**-12), np.float32(1 + 2**-12), np.float32(-2**-11)
    # a*b + c = 1 + 2**-24 exactly: a tie, which goes to even (1.0)
    assert fma_python(a, b, c) == np.float32(1.0)
    x = np.float32(1 + 2**-23)
    # x*x - 1 = 2**-22 + 2**-46: exact float64, exact enough; check the generic path against Fraction
    exact = Fraction(float(x)) ** 2 - 1
    assert Fraction(float(fma_python(x, x, np.float32(-1.0)))) == Fraction(float(np.float32(float(exact))))


def test_fma_keeps_ieee_specials():
    a = np.array([np.inf, np.nan, 1.0, 1e308, 0.0])
    b = np.array([0.0, 1.0, np.inf, 10.0, -0.0])
    c = np.array([1.0, 1.0, -np.inf, 0.0, 0.0])
    out = np.empty(5)
    _fma_all(a, b, c, out)
    expected = [fma_python(x, y, z) for x, y, z in zip(a, b, c)]
    assert np.isnan(out[0]) and np.isnan(out[1]) and np.isnan(out[2]) and out[3] == np.inf and out[4] == 0.0
    np.testing.assert_array_equal(out, np.array(expected))


@pytest.mark.parametrize("dtype, m, lo, hi", [(np.float64, 52, -1022, 1023), (np.float32, 23, -126, 127)])
def test_pow2_of_every_normal_exponent(dtype, m, lo, hi):
    k = np.arange(lo, hi + 1)
    kd = (1.5 * 2.0**m + k).astype(dtype)
    out = np.empty_like(kd)
    _pow2_all(kd, out)
    expected = np.ldexp(np.ones(k.size, dtype), k)
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(np.array([pow2_python(x) for x in kd], dtype=dtype), expected)


_ASM_PROBE = r"""
import atexit, json, os, shutil, tempfile
os.environ["FASTCKPT_CACHE_DIR"] = tempfile.mkdtemp()         # compiled afresh: no assembly for cached code
atexit.register(shutil.rmtree, os.environ["FASTCKPT_CACHE_DIR"], True)
import re, numba
from fastckpt import kernels
out = {}
for name in ("bias_sigmoid", "bias_tanh", "bias_relu"):
    kernel = getattr(kernels, name)
    for dt in ("float64", "float32"):
        arr = numba.types.Array(getattr(numba.types, dt), 2, "C")
        sig = (arr, numba.types.Array(getattr(numba.types, dt), 1, "C"))
        kernel.compile(sig)
        asm = kernel.inspect_asm(sig)
        suffix = "pd" if dt == "float64" else "ps"
        # an instruction line, whatever its operands (AVX-512 reads constants as {1toN} broadcasts)
        ops = r"f[n]?m(?:add|sub)\w*|div" if name != "bias_relu" else r"add|max|cmp\w*|blendv"
        out[f"{name} {dt}"] = {reg: len(re.findall(r"\bv(?:%s)%s\b[^\n]*%%%s" % (ops, suffix, reg), asm))
                               for reg in ("ymm", "zmm")}
vec = numba.types.Array
for dt in ("float64", "float32"):
    flat, f64, flag = vec(getattr(numba.types, dt), 1, "C"), numba.types.float64, numba.types.boolean
    blocks = vec(numba.types.int64, 2, "C")
    sigs = {"adam_step": (flat,) * 4 + (f64,) * 5 + (flag, f64, f64, blocks),
            "momentum_step": (flat,) * 3 + (f64, f64, flag, blocks)}
    for name, sig in sigs.items():
        kernel = getattr(kernels, name)
        kernel.compile(sig)
        asm = kernel.inspect_asm(sig)
        # packed stores into the arrays (not spills to the stack): the update loop is vectorised (float32
        # results of float64 lanes are half as wide: xmm on AVX2)
        out[f"{name} {dt}"] = len(re.findall(r"\bvmov(?:up|ap|dqu|dqa)\w*\s+%[xyz]mm\d+, [-\w]*\((?!%rsp)", asm))
print(json.dumps(out))
"""

_AVX2_FEATURES = ("+64bit,+avx,+avx2,+bmi,+bmi2,+cmov,+cx16,+f16c,+fma,+fxsr,+lzcnt,+mmx,+movbe,+popcnt,"
                  "+sse,+sse2,+sse3,+sse4.1,+sse4.2,+ssse3,+xsave,-avx512f,-avx512dq,-avx512bw,-avx512vl,-avx512cd")


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 vector registers")
@pytest.mark.parametrize("target, register", [
    ({"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": _AVX2_FEATURES}, "ymm"),
    pytest.param({"NUMBA_CPU_NAME": "znver4"}, "zmm", marks=pytest.mark.avx512),   # (Skylake-X targets prefer ymm)
])
def test_activations_compile_to_packed_vector_instructions(target, register):
    """Compiled (not run) for an AVX2 and an AVX-512 CPU: the exp's fused multiply-adds and the division
    of the sigmoid and tanh, ReLU's add and compare, and the optimizer steps' arithmetic must be packed
    vector instructions on that CPU's widest registers, in float64 and float32."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU")} | target
    result = subprocess.run([sys.executable, "-c", _ASM_PROBE], env=env, capture_output=True, text=True, check=True)
    counts = json.loads(result.stdout)
    # Horner's fmas of the degree-11 (float64) and degree-6 (float32) polynomials, and the division
    for name in ("bias_sigmoid", "bias_tanh"):
        assert counts[f"{name} float64"][register] >= 12 and counts[f"{name} float32"][register] >= 7, counts
    assert counts["bias_relu float64"][register] >= 2 and counts["bias_relu float32"][register] >= 2, counts
    # the optimizers' update loops store packed vectors: p, m and v (Adam), p and the velocity (momentum);
    # indexing the whole arrays from a block's offset left them scalar, 6x slower than torch.optim
    for name, arrays in (("adam_step", 3), ("momentum_step", 2)):
        assert counts[f"{name} float64"] >= arrays and counts[f"{name} float32"] >= arrays, counts
