"""Codecs for the activations and deltas sent between pipeline stages: fewer bytes per message.

A message is one micro-batch's (r, width) C-contiguous array of the net's dtype, ``1 <= r <= rows``.
Sender and receiver both know ``kind``, ``dtype``, ``rows`` and ``width``, and the receiver learns
the message's length from MPI; so a message is only the data the receiver cannot know, with no
header naming its format or shape: ``r`` is its length divided by the bytes per row.

==========  ======================  ====================================================
kind        bytes per element       layout of a message of r rows
==========  ======================  ====================================================
native      8 (float64), 4 (f32)    the r * width values as they are
float16     2                       r * width IEEE half codes (uint16, native byte order)
bfloat16    2                       r * width bfloat16 codes (uint16, native byte order)
int8        1 + itemsize / width    r scales of the dtype, then r * width int8 values
==========  ======================  ====================================================

NOTE [ Transport error bounds ]
``bound(src)`` is what ``|decode(encode(src)) - src|`` can reach, element by element.  Sources:
float64 or float32, every value finite (NaN and inf are refused by every kind, native included).

* native: 0, the values are copied.
* float16: ``max(|v| * 2**-11, 2**-25)``.  One rounding to nearest (ties to even) from the exact
  source value; 11 significant bits put half an ulp at ``2**(e-11) <= |v| * 2**-11`` for
  ``2**e <= |v|``, and below ``2**-14`` the subnormals' spacing ``2**-24`` gives ``2**-25``.
  ``|v| >= 65520`` (= 65504 + half its ulp, a tie that goes to the even code: inf) would be inf,
  so it raises FloatingPointError.  NumPy's ``astype(np.float16)`` also rounds float64 once
  (``npy_double_to_half``), and the tests check ours against it.
* bfloat16: ``max(|v| * 2**-8, 2**-134)``, the same argument with 8 significant bits and
  float32's exponent range (subnormal spacing ``2**-133``).  Rounded once from float64 too; going
  through float32 would round twice, allowing ``|v| * (2**-8 + 2**-24)`` and missing ties.
  ``|v| >= 2**128 - 2**119`` would be inf and raises FloatingPointError.
* int8, per row ``i`` with stored scale ``s_i = RZ(m_i / 127) <= m_i / 127``, ``m_i = max|row i|``:
  ``s_i * (1/2 + 2**-16) + 2**-141`` (float32), ``s_i * (1/2 + 2**-44) + 2**-1066`` (float64).
  Unclipped: ``|v/s - q| <= 1/2 + 2**-45`` (rint of a float64 quotient below 128, rounded to
  ``2**-53``) and the product ``q * s`` is rounded once to the dtype, ``<= 127 * u * s``
  (``u = 2**-24`` or ``2**-53``): ``s * (1/2 + 2**-45 + 127 u)``.  A normal ``s`` has
  ``m / s < 127.0001``, so nothing clips; a subnormal ``s`` may clip, losing at most
  ``m - 127 s < 127 * ulp(s)``, and ``s = 0`` (``m < 127 * 2**-149``, resp. ``2**-1074``) loses
  ``m``: both below the additive term.  So about half the scale: a row with one large value
  rounds all its small ones to multiples of ``max/127``, zero among them.  That is what int8 costs.
  The scale has the source's dtype: a float32 scale for float64 data would overflow above
  ``127 * 3.4e38`` and vanish below about ``1e-43`` (float64 deltas can be anywhere), and rounding
  it toward zero needs the range of the data; the 4 more bytes cost ``4 / width`` per element.

The bound holds for every source the codec accepts; it is checked in ``tests/test_transport.py``
together with bit-exact agreement with NumPy twins and exhaustive checks of the 16-bit formats.
"""
import functools

import numpy as np

from fastckpt.core.checks import check_dtype, check_positive_int
from fastckpt.kernels import (
    NONFINITE,
    OK,
    bfloat16_encode,
    copy_finite,
    float16_encode,
    int8_decode,
    int8_encode,
    table_decode,
)

TRANSPORTS = ("native", "float16", "bfloat16", "int8")


def check_transport(kind):
    """``kind`` if it names a transport, else a ValueError naming it."""
    if not isinstance(kind, str) or kind not in TRANSPORTS:
        raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, got {kind!r}")
    return kind

_LIMIT = {"float16": 65520.0, "bfloat16": 2.0**128 - 2.0**119}     # |v| from here rounds to inf
_REL = {"float16": (2.0**-11, 2.0**-25), "bfloat16": (2.0**-8, 2.0**-134)}
_INT8 = {np.dtype(np.float32): (0.5 + 2.0**-16, 2.0**-141), np.dtype(np.float64): (0.5 + 2.0**-44, 2.0**-1066)}
_BITS = {np.dtype(np.float32): np.int32, np.dtype(np.float64): np.int64}


@functools.cache
def decode_table(kind):
    """The (65536,) float32 value of every float16 or bfloat16 code (inf and NaN codes included)."""
    codes = np.arange(65536, dtype=np.uint32)
    if kind == "bfloat16":
        table = (codes << 16).view(np.float32)
    else:
        e, f = (codes >> 10) & 31, (codes & 1023).astype(np.float64)
        mag = np.where(e == 0, np.ldexp(f, -24), np.ldexp(f + 1024, e.astype(np.int64) - 25))
        mag[e == 31] = np.where(f[e == 31] == 0, np.inf, np.nan)
        table = np.where(codes & 0x8000, -mag, mag).astype(np.float32)
    table.flags.writeable = False
    return table


class Codec:
    """Encodes (r, width) arrays of ``dtype`` into messages of ``kind`` and decodes them.

    Parameters
    ----------
    kind : {"native", "float16", "bfloat16", "int8"}
        The transport; error bounds in NOTE [ Transport error bounds ] of this module.
    dtype : float64 or float32
        The dtype of the arrays sent and received.
    rows : int
        The most rows of a message (a full micro-batch); buffers are sized for it.
    width : int
        Values per row.

    Every message a codec encodes is a view of the buffer passed to ``encode``: ``nbytes`` bytes for
    ``rows`` rows, ``message_nbytes(r)`` for ``r``.  A buffer's contents after an ``encode`` that
    raised are unspecified.
    """

    def __init__(self, kind, dtype, rows, width):
        check_transport(kind)
        self.kind = kind
        try:
            self.dtype = check_dtype(dtype)
        except TypeError:                       # also a name NumPy does not know, such as "bfloat16"
            raise TypeError(f"dtype must be float32 or float64, got {dtype!r}") from None
        self.rows = check_positive_int(rows, "rows")
        self.width = check_positive_int(width, "width")
        self._header = self.dtype.itemsize if kind == "int8" else 0      # bytes of one row's scale
        self._per_value = {"native": self.dtype.itemsize, "int8": 1}.get(kind, 2)

    def __repr__(self):
        return f"Codec({self.kind!r}, {self.dtype.name!r}, rows={self.rows}, width={self.width})"

    def message_nbytes(self, r):
        """Bytes of the message of ``r`` rows."""
        return r * (self._header + self.width * self._per_value)

    @property
    def nbytes(self):
        """Bytes of the message of ``rows`` rows, the largest."""
        return self.message_nbytes(self.rows)

    def buffer(self):
        """A new send or receive buffer for ``rows`` rows: (rows * width,) of ``dtype`` for native, else
        (nbytes,) uint8."""
        if self.kind == "native":
            return np.empty(self.rows * self.width, self.dtype)
        return np.empty(self.nbytes, np.uint8)

    def encode(self, src, buf, rows=None):
        """Encode the first ``rows`` rows of ``src`` (all of them by default) into ``buf``.

        Parameters
        ----------
        src : ndarray (r, width) of ``dtype``, C-contiguous, finite
        buf : ndarray from ``buffer()``, or any writeable C-contiguous 1-D array of its dtype and size
        rows : int, optional

        Returns
        -------
        ndarray
            The message, a view of ``buf``: ``message_nbytes(rows)`` bytes.

        Raises ValueError if ``src`` holds NaN or inf, FloatingPointError if a value is too large for
        float16 or bfloat16.
        """
        src = self._array(src, "src")
        r = src.shape[0] if rows is None else check_positive_int(rows, "rows")
        if r > src.shape[0]:
            raise ValueError(f"rows is {r}, but src has only {src.shape[0]} rows")
        self._check_rows(r, "src", src.shape)
        src = src[:r]
        msg = self._buffer_view(buf, r)
        if self.kind == "native":
            status = OK if copy_finite(src, msg.reshape(r, self.width)) else NONFINITE
        elif self.kind == "int8":
            scales, q = self._int8_parts(msg, r)
            status = OK if int8_encode(src, scales, q) else NONFINITE
        else:
            encode = float16_encode if self.kind == "float16" else bfloat16_encode
            status = encode(src.view(_BITS[self.dtype]), msg.view(np.uint16).reshape(r, self.width))
        if status != OK:
            self._raise_for(src)
        return msg

    def decode(self, msg, out):
        """Decode the message ``msg`` (a 1-D array or bytes-like object, as ``encode`` returned it) into
        ``out`` (r, width) of ``dtype``, C-contiguous; its length must be ``message_nbytes(r)``.

        The values are not checked: ``encode`` never writes a NaN or inf code, so one here (a corrupted
        message) decodes to NaN or inf, which the trainer's loss check then meets."""
        out = self._array(out, "out")
        r = out.shape[0]
        self._check_rows(r, "out", out.shape)
        if not out.flags.writeable:
            raise ValueError("out is read-only")
        raw = msg if isinstance(msg, np.ndarray) else np.frombuffer(msg, np.uint8)
        kinds = (np.dtype(np.uint8), self.dtype) if self.kind == "native" else (np.dtype(np.uint8),)
        if raw.ndim != 1 or not raw.flags.c_contiguous or raw.dtype not in kinds:
            raise ValueError(f"msg must be a contiguous 1-D array of {' or '.join(map(str, kinds))}, "
                             f"got shape {raw.shape} and dtype {raw.dtype}")
        raw = raw.view(np.uint8)
        expected = self.message_nbytes(r)
        if raw.size != expected:
            per_row = self.message_nbytes(1)
            got = f"{raw.size // per_row} rows" if raw.size % per_row == 0 else "no whole number of rows"
            raise ValueError(f"msg has {raw.size} bytes ({got}), but {r} rows of width {self.width} "
                             f"take {expected} bytes in transport {self.kind} ({self.dtype})")
        if self.kind == "native":
            np.copyto(out, raw.view(self.dtype).reshape(r, self.width))
        elif self.kind == "int8":
            int8_decode(*self._int8_parts(raw, r), out)
        else:
            table_decode(raw.view(np.uint16).reshape(r, self.width), decode_table(self.kind), out)

    def bound(self, src):
        """The most ``|decode(encode(src)) - src|`` can be: 0.0 for native, else a float64 array that
        broadcasts against ``src`` ((r, width) for float16 and bfloat16, (r, 1) for int8), by the
        formulas of NOTE [ Transport error bounds ].  For sources that ``encode`` accepts."""
        src = self._array(src, "src")
        if self.kind == "native":
            return 0.0
        if self.kind == "int8":
            per_scale, floor = _INT8[self.dtype]
            scales = np.empty(src.shape[0], self.dtype)
            if not int8_encode(src, scales, np.empty(src.shape, np.int8)):
                self._raise_for(src)
            return (scales.astype(np.float64) * per_scale + floor)[:, None]
        rel, floor = _REL[self.kind]
        return np.maximum(np.abs(src.astype(np.float64)) * rel, floor)

    def _array(self, a, name):
        """``a`` as a C-contiguous (r, width) array of the codec's dtype, or a clear error."""
        if not isinstance(a, np.ndarray) or isinstance(a, np.ma.MaskedArray):
            raise TypeError(f"{name} must be a NumPy array, got {type(a).__name__}")
        if a.dtype != self.dtype:
            raise TypeError(f"{name} has dtype {a.dtype}, but this codec carries {self.dtype}")
        if a.ndim != 2 or a.shape[1] != self.width:
            raise ValueError(f"{name} must have shape (r, {self.width}), got {a.shape}")
        if not a.flags.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous (np.ascontiguousarray({name}))")
        return a

    def _check_rows(self, r, name, shape):
        if not 1 <= r <= self.rows:
            raise ValueError(f"{name} has shape {shape}: a message holds 1 to {self.rows} rows, got {r}")

    def _buffer_view(self, buf, r):
        """The first ``message_nbytes(r)`` bytes of ``buf``, checked, as the message to send."""
        kind = self.dtype if self.kind == "native" else np.dtype(np.uint8)
        if not isinstance(buf, np.ndarray) or buf.dtype != kind or buf.ndim != 1 or not buf.flags.c_contiguous:
            got = f"shape {buf.shape} and dtype {buf.dtype}" if isinstance(buf, np.ndarray) else type(buf).__name__
            raise TypeError(f"buf must be a contiguous 1-D {kind} array (Codec.buffer()), got {got}")
        if not buf.flags.writeable:
            raise ValueError("buf is read-only")
        n = self.message_nbytes(r) // kind.itemsize
        if buf.size < n:
            raise ValueError(f"buf holds {buf.size} elements of {kind}, but {r} rows take {n} in "
                             f"transport {self.kind}; use Codec.buffer()")
        return buf[:n]

    def _int8_parts(self, msg, r):
        """The (r,) scales and (r, width) int8 values of an int8 message of ``r`` rows."""
        head = r * self._header
        return msg[:head].view(self.dtype), msg[head:head + r * self.width].view(np.int8).reshape(r, self.width)

    def _raise_for(self, src):
        """The error that ``src`` (the rows just encoded, which a kernel refused) deserves."""
        finite = np.isfinite(src)
        if not finite.all():
            bad = tuple(int(i) for i in np.argwhere(~finite)[0])
            raise ValueError(f"src contains NaN or inf (first at index {bad}: {src[bad]!r}); "
                             f"transport {self.kind} refuses non-finite values")
        top = float(np.abs(src).max())
        wider = "bfloat16 or native" if self.kind == "float16" else "native"
        raise FloatingPointError(f"transport {self.kind} overflows: |value| up to {top!r}, but values from "
                                 f"{_LIMIT[self.kind]!r} on round to inf; use transport {wider}, "
                                 "or scale the values down")
