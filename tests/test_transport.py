"""Transport codecs against independent references: the nearest code found by search in the list of every
finite float16 / bfloat16 value (ties to the even code), NumPy's float16 cast, bfloat16's textbook bit
trick, a slow exact int8 twin; then error bounds, byte counts, refusals, and the kernels as Python."""
import re
from fractions import Fraction

import numpy as np
import pytest

from fastckpt.parallel.pipeline.transport import TRANSPORTS, Codec, decode_table

DTYPES = [np.float64, np.float32]
NARROW = ["float16", "bfloat16"]
INF_CODE = {"float16": 0x7C00, "bfloat16": 0x7F80}
TOP = {"float16": 2.0**16, "bfloat16": 2.0**128}          # one ulp past the largest finite value


# ---------------------------------------------------------------------------------------------- references

def _finite_values(kind):
    """Every finite non-negative value of ``kind`` (float64, ascending) and its code, by NumPy's own means."""
    codes = np.arange(INF_CODE[kind], dtype=np.uint16)
    if kind == "float16":
        return codes.view(np.float16).astype(np.float64), codes
    return (codes.astype(np.uint32) << 16).view(np.float32).astype(np.float64), codes


def nearest_codes(x, kind):
    """The code of the value of ``kind`` nearest to each element of ``x``, ties to the even code, found by
    search; ``|x|`` from ``TOP - ulp/2`` on gives the infinity code (its neighbour past the largest finite)."""
    vals, codes = _finite_values(kind)
    vals, codes = np.append(vals, TOP[kind]), np.append(codes, INF_CODE[kind])
    a = np.abs(x.astype(np.float64)).ravel()
    lo = np.searchsorted(vals, a, side="right") - 1
    beyond = lo == len(vals) - 1
    lo = np.minimum(lo, len(vals) - 2)
    d_lo, d_hi = a - vals[lo], vals[lo + 1] - a                 # exact: neighbours within a factor 2
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (codes[lo] % 2 == 1))
    out = np.where(pick_hi, codes[lo + 1], codes[lo]).astype(np.uint16)
    out[beyond] = INF_CODE[kind]
    out[np.signbit(x.ravel())] |= 0x8000
    return out.reshape(x.shape)


def bfloat16_bit_trick(x32):
    """The textbook float32 -> bfloat16 rounding: add 0x7FFF plus the kept lowest bit, keep the top half."""
    b = x32.view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def rz_scale(m, dtype):
    """The largest float of ``dtype`` that is <= m / 127, exactly."""
    exact = Fraction(float(m)) / 127
    s = dtype(float(exact))
    while Fraction(float(s)) > exact:
        s = np.nextafter(s, dtype(0))
    while Fraction(float(np.nextafter(s, dtype(np.inf)))) <= exact:
        s = np.nextafter(s, dtype(np.inf))
    return s


def int8_twin(x):
    """(scales, q, decoded) of int8 transport, row by row in NumPy."""
    x64 = x.astype(np.float64)
    s = np.array([rz_scale(m, x.dtype.type) for m in np.abs(x64).max(axis=1)], x.dtype)
    s64 = s.astype(np.float64)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.clip(np.where(s64 > 0, np.rint(x64 / s64), 0.0), -127, 127).astype(np.int8)
    return s, q, (q * s64).astype(x.dtype)


def roundtrip(kind, x, rows=None):
    """(message, decoded, codec) of ``x`` through a codec sized for it."""
    codec = Codec(kind, x.dtype, rows or x.shape[0], x.shape[1])
    msg = codec.encode(x, codec.buffer())
    out = np.full_like(x, np.nan)
    codec.decode(msg, out)
    return msg, out, codec


def midpoint_set(kind, dtype):
    """Every finite value of ``kind`` of both signs, the midpoints between neighbours, and the source dtype's
    floats just either side of each midpoint: ties and near-ties, where rounding twice goes wrong."""
    vals, _ = _finite_values(kind)
    mids = ((vals[:-1] + vals[1:]) / 2).astype(dtype)           # exact: 12 (9) significant bits
    assert np.array_equal(mids.astype(np.float64), (vals[:-1] + vals[1:]) / 2)
    near = [np.nextafter(mids, dtype(0)), np.nextafter(mids, dtype(np.inf))]
    x = np.concatenate([vals.astype(dtype), mids, *near])
    return np.concatenate([x, -x]).reshape(-1, 64 if x.size % 64 == 0 else 2)


def families(rng, kind, dtype, shape):
    """Named test arrays of ``shape``: activations, tiny deltas, subnormals, mixed signs and scales, zero rows."""
    top = {"float16": 14, "bfloat16": 120, "int8": 120 if dtype == np.float32 else 1000, "native": 120}[kind]
    low = -140 if dtype == np.float32 else -1070

    def wide(lo, hi):
        return rng.standard_normal(shape) * 2.0 ** rng.integers(lo, hi, shape)
    tiny = np.finfo(dtype).smallest_subnormal
    zero_rows = wide(-30, min(top, 10))
    zero_rows[::2] = 0.0
    out = {
        "activations": rng.random(shape),
        "deltas 1e-9": rng.standard_normal(shape) * 1e-9,
        "float16 subnormals": wide(-30, -14),
        "mixed": wide(-40, top),
        "row scales": rng.standard_normal(shape) * 2.0 ** rng.integers(low // 2, top, (shape[0], 1)),
        "source subnormals": rng.integers(-2**20, 2**20, shape) * float(tiny),
        "zero rows": zero_rows,
        "extreme": wide(low, top),
    }
    return {name: a.astype(dtype) for name, a in out.items()}


SHAPES = [(1, 1), (1, 7), (5, 1), (33, 17), (64, 300)]


# ------------------------------------------------------------------------------------------- float16, bfloat16

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", NARROW)
def test_every_value_midpoint_and_near_midpoint_gets_the_nearest_code(kind, dtype):
    x = midpoint_set(kind, dtype)
    msg, out, _ = roundtrip(kind, x)
    codes = msg.view(np.uint16).reshape(x.shape)
    np.testing.assert_array_equal(codes, nearest_codes(x, kind))
    vals, _ = _finite_values(kind)
    decoded = np.where(codes & 0x8000, -1.0, 1.0) * vals[codes & 0x7FFF]
    np.testing.assert_array_equal(out, decoded.astype(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind, x, expected", [
    ("float16", 1 + 2**-11, 1.0),                       # a tie: to the even code
    ("float16", 1 + 3 * 2**-11, 1 + 2**-9),             # a tie: up, to the even code
    ("float16", 2.0**-25, 0.0),                         # half the smallest subnormal: to 0
    ("float16", 3 * 2.0**-25, 2.0**-23),
    ("float16", 65519.0, 65504.0),
    ("bfloat16", 1 + 2**-8, 1.0),
    ("bfloat16", 1 + 3 * 2**-8, 1 + 2**-6),
    ("bfloat16", 2.0**-134, 0.0),
    ("bfloat16", 3 * 2.0**-134, 2.0**-132),
    ("bfloat16", -(2.0**-126 - 2.0**-140), -(2.0**-126)),
])
def test_hand_checked_roundings(kind, x, expected, dtype):
    _, out, _ = roundtrip(kind, np.array([[x, -x]], dtype))
    assert out.tolist() == [[expected, -expected]]


@pytest.mark.parametrize("kind, x, expected", [
    ("float16", 1 + 2**-11 + 2**-40, 1 + 2**-10),       # via float32 it would be a tie, and go to 1.0
    ("float16", 2.0**-25 + 2.0**-60, 2.0**-24),
    ("bfloat16", 1 + 2**-8 + 2**-40, 1 + 2**-7),
    ("bfloat16", 2.0**-134 + 2.0**-170, 2.0**-133),
])
def test_float64_is_rounded_once(kind, x, expected):
    through_float32 = nearest_codes(np.array([np.float32(x)]), kind)
    assert through_float32 != nearest_codes(np.array([x]), kind)     # a trap for rounding twice
    _, out, _ = roundtrip(kind, np.array([[x]]))
    assert out[0, 0] == expected


@pytest.mark.parametrize("dtype", DTYPES)
def test_numpy_rounds_to_float16_once_as_the_docs_say(dtype):
    x = midpoint_set("float16", dtype)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(x.astype(np.float16).view(np.uint16), nearest_codes(x, "float16"))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_float16_equals_numpy(rng, shape, dtype):
    for name, x in families(rng, "float16", dtype, shape).items():
        msg, out, _ = roundtrip("float16", x)
        np.testing.assert_array_equal(msg.view(np.uint16).reshape(shape), x.astype(np.float16).view(np.uint16),
                                      err_msg=name)
        np.testing.assert_array_equal(out, x.astype(np.float16).astype(dtype), err_msg=name)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_bfloat16_equals_the_bit_trick_and_the_search(rng, shape):
    for name, x in families(rng, "bfloat16", np.float32, shape).items():
        msg, _, _ = roundtrip("bfloat16", x)
        codes = msg.view(np.uint16).reshape(shape)
        np.testing.assert_array_equal(codes, bfloat16_bit_trick(x), err_msg=name)
        np.testing.assert_array_equal(codes, nearest_codes(x, "bfloat16"), err_msg=name)
    for name, x in families(rng, "bfloat16", np.float64, shape).items():
        msg, _, _ = roundtrip("bfloat16", x)
        np.testing.assert_array_equal(msg.view(np.uint16).reshape(shape), nearest_codes(x, "bfloat16"),
                                      err_msg=name)


def test_decode_tables_hold_every_code_exactly():
    codes = np.arange(65536, dtype=np.uint16)
    np.testing.assert_array_equal(decode_table("float16"), codes.view(np.float16).astype(np.float32))
    bf = decode_table("bfloat16")
    np.testing.assert_array_equal(bf.view(np.uint32) & 0xFFFF, 0)
    np.testing.assert_array_equal(bf.view(np.uint32) >> 16, codes)


# ---------------------------------------------------------------------------------------------------- int8

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_int8_equals_the_slow_twin(rng, shape, dtype):
    r, w = shape
    isz = np.dtype(dtype).itemsize
    for name, x in families(rng, "int8", dtype, shape).items():
        msg, out, _ = roundtrip("int8", x)
        s, q, decoded = int8_twin(x)
        np.testing.assert_array_equal(msg[:r * isz].view(dtype), s, err_msg=name)
        np.testing.assert_array_equal(msg[r * isz:].view(np.int8).reshape(shape), q, err_msg=name)
        np.testing.assert_array_equal(out, decoded, err_msg=name)


@pytest.mark.parametrize("dtype", DTYPES)
def test_int8_scale_is_rounded_toward_zero_and_never_overflows(dtype):
    big = np.finfo(dtype).max
    rows = [[big, -big / 3, 1.0], [-big, big, 0.0], [1.0, 1.0 / 3, 0.1], [0.0, 0.0, 0.0], [1e-3, 1.0, -2e-3]]
    x = np.array(rows, dtype)
    msg, out, codec = roundtrip("int8", x)
    scales = msg[:5 * x.itemsize].view(dtype)
    for m, s in zip(np.abs(x).max(axis=1), scales):
        assert Fraction(float(s)) * 127 <= Fraction(float(m)) < Fraction(float(np.nextafter(s, dtype(np.inf)))) * 127
    assert np.isfinite(out).all()
    assert np.all(np.abs(out.astype(np.float64) - x) <= codec.bound(x))
    assert out[3].tolist() == [0.0, 0.0, 0.0]
    # What int8 costs: next to a 1.0, values below 1/254 are gone
    assert out[4, 0] == 0.0 and out[4, 2] == 0.0 and abs(out[4, 1] - 1.0) <= 2.0**-20


@pytest.mark.parametrize("dtype", DTYPES)
def test_int8_bound_needs_its_rounding_term(rng, dtype):
    """Values just below the midpoints (q + 1/2) * s: rounding q * s to the dtype can add to the half-scale
    error, so |error| > s / 2 happens, exactly; the bound's extra term covers it."""
    codec = Codec("int8", dtype, 4, 127)
    x = np.zeros((4, 127), dtype)
    x[:, 0] = (rng.random(4) * 2 + 0.5).astype(dtype)
    scales = codec.encode(x, codec.buffer())[:4 * x.itemsize].view(dtype).copy()
    for i, s in enumerate(scales):
        for q in range(1, 127):
            mid = Fraction(float(s)) * (2 * q + 1) / 2
            v = dtype(float(mid))
            x[i, q] = v if Fraction(float(v)) < mid else np.nextafter(v, dtype(0))
    out = np.empty_like(x)
    codec.decode(codec.encode(x, codec.buffer()), out)
    bound = codec.bound(x)
    half_scale_exceeded = 0
    for i, s in enumerate(scales):
        for a, b in zip(out[i], x[i]):
            err = abs(Fraction(float(a)) - Fraction(float(b)))
            assert err <= Fraction(float(bound[i, 0]))
            half_scale_exceeded += err > Fraction(float(s)) / 2
    assert half_scale_exceeded > 0


# ----------------------------------------------------------------------------------------- bounds and bytes

def _expected_nbytes(kind, dtype, r, w):
    isz = np.dtype(dtype).itemsize
    return {"native": r * w * isz, "float16": 2 * r * w, "bfloat16": 2 * r * w, "int8": r * w + r * isz}[kind]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", TRANSPORTS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_roundtrip_within_bound_and_message_sizes(rng, kind, dtype, shape):
    r, w = shape
    codec = Codec(kind, dtype, r + 2, w)
    buf = codec.buffer()
    assert codec.nbytes == _expected_nbytes(kind, dtype, r + 2, w) == buf.nbytes
    for name, x in families(rng, kind, dtype, shape).items():
        msg = codec.encode(x, buf)
        assert msg.nbytes == _expected_nbytes(kind, dtype, r, w) == codec.message_nbytes(r), name
        out = np.full_like(x, np.nan)
        codec.decode(msg, out)
        err = np.abs(out.astype(np.float64) - x.astype(np.float64))
        bound = codec.bound(x)
        assert np.all(err <= bound), (name, np.max(err - bound))
        if kind == "native":
            np.testing.assert_array_equal(out, x)
        if kind == "int8":                                # about half of max|row| / 127, never more
            m = np.abs(x.astype(np.float64)).max(axis=1, keepdims=True)
            assert np.all(bound <= m / 254 * (1 + 2.0**-15) + 2.0**-141)
    full = np.ones((r + 2, w), dtype)
    assert codec.encode(full, buf).nbytes == codec.nbytes


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["float16", "bfloat16", "int8"])
def test_bound_is_reached(rng, kind, dtype):
    """Not a loose bound: some error comes within 1% of it, for int8 on ordinary rows, for the 16-bit formats
    near the ties just above each power of two (and on every subnormal tie)."""
    x = families(rng, kind, dtype, (64, 300))["mixed"] if kind == "int8" else midpoint_set(kind, dtype)
    _, out, codec = roundtrip(kind, x)
    ratio = np.abs(out.astype(np.float64) - x) / codec.bound(x)
    assert 0.99 < ratio.max() <= 1.0


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_partial_messages_and_the_rows_argument(rng, kind):
    x = rng.random((6, 5))
    codec = Codec(kind, np.float64, 8, 5)
    buf = codec.buffer()
    msg = codec.encode(x, buf, 4)
    assert msg.nbytes == codec.message_nbytes(4)
    assert np.shares_memory(msg, buf)
    out = np.empty((4, 5))
    codec.decode(bytes(msg.view(np.uint8)), out)                 # any bytes-like message
    np.testing.assert_array_equal(out, roundtrip(kind, x[:4])[1])
    with pytest.raises(ValueError, match=r"msg has \d+ bytes \(4 rows\), but 3 rows"):
        codec.decode(msg.view(np.uint8), np.empty((3, 5)))


# ------------------------------------------------------------------------------------------------ refusals

LIMITS = {"float16": 65520.0, "bfloat16": 2.0**128 - 2.0**119}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind, value", [("float16", 65520.0), ("float16", -1e5), ("bfloat16", -3.4e38),
                                         ("bfloat16", LIMITS["bfloat16"])])
def test_overflow_raises_naming_the_largest_magnitude(kind, value, dtype):
    x = np.array([[1.0, 2.0], [value, 0.5]], dtype)
    codec = Codec(kind, dtype, 2, 2)
    top = repr(float(np.abs(x).max()))
    with pytest.raises(FloatingPointError, match=re.escape(f"transport {kind} overflows: |value| up to {top},")):
        codec.encode(x, codec.buffer())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", NARROW)
def test_just_below_the_overflow_limit_is_the_largest_finite_value(kind, dtype):
    below = np.nextafter(dtype(LIMITS[kind]), dtype(0))
    _, out, _ = roundtrip(kind, np.array([[below, -below]], dtype))
    largest = _finite_values(kind)[0][-1]
    assert out.tolist() == [[largest, -largest]]


def test_overflow_in_float64_beyond_float32():
    with pytest.raises(FloatingPointError, match=r"up to 1e\+300"):
        roundtrip("bfloat16", np.array([[1e300, -1.0]]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", TRANSPORTS)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_are_refused(kind, dtype, bad):
    x = np.ones((3, 4), dtype)
    x[1, 2] = bad
    x[2, 0] = 1e6                                                # an overflow too: the NaN is named first
    codec = Codec(kind, dtype, 3, 4)
    with pytest.raises(ValueError, match=rf"src contains NaN or inf \(first at index \(1, 2\): .*{kind}"):
        codec.encode(x, codec.buffer())
    y = np.zeros((1, 4), dtype)
    y[0, 0] = bad                                                # first in its row, where max() would skip it
    with pytest.raises(ValueError, match="NaN or inf"):
        Codec(kind, dtype, 1, 4).encode(y, Codec(kind, dtype, 1, 4).buffer())


def test_bad_kind_dtype_and_sizes():
    with pytest.raises(ValueError, match=r"transport must be one of native, float16, bfloat16, int8, got 'fp16'"):
        Codec("fp16", np.float64, 2, 3)
    with pytest.raises(ValueError, match=r"transport .* got None"):
        Codec(None, np.float64, 2, 3)
    for dtype in (np.float16, np.int32, "bfloat16"):
        with pytest.raises(TypeError, match="dtype must be float32 or float64"):
            Codec("int8", dtype, 2, 3)
    with pytest.raises(ValueError, match="rows must be >= 1, got 0"):
        Codec("int8", np.float64, 0, 3)
    with pytest.raises(TypeError, match="width must be an integer"):
        Codec("int8", np.float64, 2, 2.5)


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_bad_arrays_are_refused_by_name(kind):
    codec = Codec(kind, np.float32, 4, 3)
    buf = codec.buffer()
    x = np.ones((2, 3), np.float32)
    cases = [
        (TypeError, "src has dtype float64, but this codec carries float32",
         lambda: codec.encode(x.astype(np.float64), buf)),
        (ValueError, r"src must have shape \(r, 3\), got \(6,\)", lambda: codec.encode(x.ravel(), buf)),
        (ValueError, r"src must have shape \(r, 3\), got \(2, 4\)", lambda: codec.encode(np.ones((2, 4), "f4"), buf)),
        (ValueError, "src must be C-contiguous", lambda: codec.encode(np.ones((2, 6), "f4")[:, ::2], buf)),
        (ValueError, "1 to 4 rows, got 5", lambda: codec.encode(np.ones((5, 3), "f4"), buf)),
        (ValueError, "rows is 3, but src has only 2 rows", lambda: codec.encode(x, buf, 3)),
        (ValueError, "rows must be >= 1, got 0", lambda: codec.encode(x, buf, 0)),
        (TypeError, "src must be a NumPy array, got list", lambda: codec.encode(x.tolist(), buf)),
        (TypeError, "buf must be a contiguous 1-D", lambda: codec.encode(x, buf.reshape(2, -1))),
        (TypeError, "buf must be a contiguous 1-D", lambda: codec.encode(x, np.empty(100, np.int16))),
        (ValueError, "buf holds 1 elements", lambda: codec.encode(x, buf[:1])),
        (ValueError, r"out must have shape \(r, 3\)", lambda: codec.decode(buf, np.empty((4, 2), "f4"))),
        (ValueError, "1 to 4 rows, got 0", lambda: codec.decode(buf[:0], np.empty((0, 3), "f4"))),
        (ValueError, r"msg has \d+ bytes", lambda: codec.decode(buf[:-1].view(np.uint8)[:-1], np.empty((4, 3), "f4"))),
        (ValueError, "msg must be a contiguous 1-D", lambda: codec.decode(np.zeros((4, 12), np.uint8),
                                                                          np.empty((4, 3), "f4"))),
    ]
    for error, match, call in cases:
        with pytest.raises(error, match=match):
            call()
    ro = np.empty((4, 3), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out is read-only"):
        codec.decode(codec.encode(np.ones((4, 3), np.float32), buf), ro)


# ------------------------------------------------------------------------------------------ compiled vs Python

SCRIPT = r"""
import json
import numpy as np
import numba
from fastckpt.kernels.transport import float16_encode
from fastckpt.parallel.pipeline.transport import TRANSPORTS, Codec
rng = np.random.default_rng(3)
out = {"jit_disabled": bool(numba.config.DISABLE_JIT), "python_kernel": not hasattr(float16_encode, "signatures")}
for dtype in (np.float64, np.float32):
    tiny = float(np.finfo(dtype).smallest_subnormal)
    big = float(np.finfo(dtype).max)
    cases = {
        "wide": rng.standard_normal((40, 33)) * 2.0 ** rng.integers(-150, 14, (40, 33)),
        "rows": rng.standard_normal((40, 9)) * 2.0 ** rng.integers(-1070 if dtype == np.float64 else -150, 120,
                                                                   (40, 1)),
        "ties": np.array([[1 + 2**-11, 1 + 3 * 2**-11, 2.0**-25, 3 * 2.0**-25, 1 + 2**-8, 2.0**-134,
                           1 + 2**-11 + 2**-40, 65519.0, -0.0, 0.0, tiny, 5 * tiny]]),
        "edges": np.array([[big, -big / 3, 1.0], [tiny, 3 * tiny, -tiny], [0.0, 0.0, 0.0], [1e-3, 1.0, -2e-3]]),
    }
    for name, x in cases.items():
        x = x.astype(dtype)
        for kind in TRANSPORTS:
            if (kind in ("float16", "bfloat16") and name == "edges") or (kind == "float16" and name == "rows"):
                continue
            codec = Codec(kind, dtype, x.shape[0], x.shape[1])
            msg = codec.encode(x, codec.buffer())
            dec = np.empty_like(x)
            codec.decode(msg, dec)
            out[f"{dtype.__name__} {name} {kind}"] = [msg.view(np.uint8).tobytes().hex(), dec.tobytes().hex()]
print(json.dumps(out))
"""


def test_the_kernels_as_python_give_the_compiled_bytes(jit_twins):
    compiled, python = jit_twins(SCRIPT)
    assert python["jit_disabled"] and python["python_kernel"] and not compiled["jit_disabled"]
    assert not compiled["python_kernel"]
    cases = [k for k in compiled if " " in k]
    assert len(cases) == 2 * (4 + 3 + 4 + 2) and set(cases) == {k for k in python if " " in k}
    for case in cases:
        assert python[case] == compiled[case], case
