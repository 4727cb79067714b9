"""Argument checks shared by the public API: each error names the argument and its value."""
import math
import operator
from collections.abc import Mapping, Set

import numpy as np

from fastckpt.data.images import Images
from fastckpt.kernels import all_finite, label_range, one_hot

_MAX = float(np.finfo(np.float64).max)


def shown_value(value, most=60):
    """``repr(value)`` for an error message, cut at ``most`` characters (a file's field can be megabytes)."""
    shown = repr(value)
    return shown if len(shown) <= most else shown[:most] + "..."


def check_sizes(sizes):
    """Layer widths as a tuple of positive ints."""
    if isinstance(sizes, (Mapping, Set, bytes, bytearray, memoryview)):   # no layer order, or bytes, not widths
        raise TypeError(f"sizes must be a sequence of integers, got {type(sizes).__name__} {sizes!r}")
    try:
        out = tuple(sizes)                                          # an iterator too, read once
        if any(isinstance(s, (bool, np.bool_)) for s in out):      # an index to Python, but True is no width
            raise TypeError
        out = tuple(operator.index(s) for s in out)
    except TypeError:
        raise TypeError(f"sizes must be a sequence of integers, got {sizes!r}") from None
    if len(out) < 2:
        raise ValueError(f"sizes needs at least two layer sizes (input and output), got {list(out)}")
    for i, s in enumerate(out):
        if s < 1:
            raise ValueError(f"sizes[{i}] must be >= 1, got {s}")
    return out


def check_dtype(dtype):
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be float32 or float64, got {dtype!r}") from None
    if dt not in (np.float32, np.float64):
        raise TypeError(f"dtype must be float32 or float64, got {dtype!r}")
    return dt


def check_positive_int(value, name, minimum=1, maximum=None):
    try:
        if isinstance(value, (bool, np.bool_)):      # an index to Python, but True is no count
            raise TypeError
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {value!r}") from None
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    if maximum is not None and v > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {v}")
    return v


def check_bool(value, name):
    """``value`` as a bool if it is True or False (NumPy's too), else a TypeError naming ``name``: ``"no"``
    is truthy, so a string would read as True."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_nonnegative(value, name):
    """``value`` as a finite float >= 0; the errors name ``name`` and the value.  A bool is refused: to
    Python it is the number 1 or 0, but ``eps=True`` is a slip, not a setting; so is a string, which
    ``float`` would read (``eta="0.1"``): strings are not numbers."""
    if type(value) is float and 0.0 <= value <= _MAX:         # the common case, at once (NaN fails both)
        return value
    try:
        if isinstance(value, (bool, np.bool_, str, bytes, bytearray)):
            raise TypeError
        v = float(value)
    except OverflowError:                            # an int past float64's range: not finite
        v = np.inf
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a real number, got {value!r}") from None
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
    return v


def check_eta(eta):
    return check_nonnegative(eta, "eta")


def as_batch(a, width, name, role):
    """View ``a`` as (batch, width): accepts (batch, width) and the lab's (batch, width, 1).  :class:`Images`
    stay Images (a minibatch is converted where it is staged)."""
    refuse_masked(a, name)
    try:
        arr = a if isinstance(a, Images) else np.asarray(a)
    except ValueError as exc:                            # rows of different lengths
        raise ValueError(f"{name} must have shape (batch, {width}), but its rows differ: {exc}") from None
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    shape = arr.shape
    if arr.ndim == 3 and shape[2] == 1:
        arr = arr[:, :, 0]
    if arr.ndim != 2:
        raise ValueError(f"{name} must have shape (batch, {width}) or (batch, {width}, 1), got {shape}")
    if arr.shape[1] != width:
        raise ValueError(f"{name} has shape {shape}: {arr.shape[1]} values per sample, "
                         f"but the network's {role} layer has {width} units")
    if arr.shape[0] == 0:
        raise ValueError(f"{name} has no samples (shape {shape})")
    return arr


def as_rows(a, width, name, role):
    """``a`` as (batch, width) rows, not yet converted (:func:`as_batch`), and how to shape results like
    it: one (width,) vector, one (width, 1) column, a (batch, width, 1) or a (batch, width) batch."""
    if isinstance(a, Images):
        return as_batch(a, width, name, role), "batch"
    arr = np.asarray(a)
    if arr.ndim == 1 and arr.shape[0] == width:
        return as_batch(arr.reshape(1, width), width, name, role), "vector"
    if arr.ndim == 2 and arr.shape == (width, 1):
        return as_batch(arr.reshape(1, width), width, name, role), "column"
    return as_batch(arr, width, name, role), "batch3" if arr.ndim == 3 else "batch"


def shaped_like(out, layout):
    """Per-row results ``out`` (batch, ...) shaped like the input :func:`as_rows` saw."""
    if layout == "vector":
        return out.reshape(-1)
    if layout == "column":
        return out.reshape(-1, 1)
    if layout == "batch3":
        return out[:, :, None]
    return out


def refuse_masked(a, name):
    """A masked array's mask would be silently ignored: refuse it."""
    if isinstance(a, np.ma.MaskedArray):
        raise TypeError(f"{name} is a masked array; its mask would be ignored: pass np.ma.filled(...) "
                        "or drop the masked samples first")


def check_finite_rows(arr, name, chunk=4096, offset=0):
    """Raise a ValueError naming ``name`` and the first bad index (its rows counted from ``offset``) if the (n, m)
    array holds NaN or inf, checked in chunks of rows: by the kernel where they are C-contiguous (no temporary
    at all), else through a NumPy temporary of at most 64 KiB."""
    if arr.dtype.kind != "f" or isinstance(arr, Images):          # Images are bytes / 255: always finite
        return
    contiguous = arr.flags.c_contiguous and _kernel_floats(arr)
    chunk = chunk if contiguous else max(1, 65536 // max(1, arr[:1].size))
    for i in range(0, arr.shape[0], chunk):
        part = arr[i:i + chunk]
        if not (all_finite(part) if contiguous else np.isfinite(part).all()):
            bad = np.argwhere(~np.isfinite(part))[0]
            bad[0] += i
            raise ValueError(f"{name} contains NaN or inf (first at index "
                             f"{(int(bad[0]) + offset, *map(int, bad[1:]))}: {arr[tuple(bad)]!r}); nothing was trained")


def check_in_range(arr, dtype, name, offset=0, chunk=4096, done="nothing was trained"):
    """Raise a ValueError naming ``name``, the first index (its rows counted from ``offset``) and the value when a
    value of the (n, m) finite rows ``arr`` is past ``dtype``'s range, so that a minibatch of it converted to
    ``dtype`` would hold inf.  Checked ``chunk`` values at a time, only for floats wider than ``dtype``."""
    dtype = np.dtype(dtype)
    if isinstance(arr, Images) or arr.dtype.kind != "f" or np.finfo(arr.dtype).max <= np.finfo(dtype).max:
        return
    rows = max(1, chunk // max(1, arr.shape[1]))
    with np.errstate(over="ignore"):
        for i in range(0, arr.shape[0], rows):
            part = arr[i:i + rows]
            over = np.isinf(part.astype(dtype))
            if over.any():
                row, col = (int(k) for k in np.argwhere(over)[0])
                raise ValueError(f"{name} holds {part[row, col]!s} at index ({offset + i + row}, {col}), past the "
                                 f"range of the net's {dtype} (magnitudes up to {np.finfo(dtype).max:.7g}): converted "
                                 f"to {dtype} it would be inf; scale the data"
                                 f"{' or use a float64 net' if dtype != np.float64 else ''}; {done}")


def check_rows(x, width, name, role, dtype, chunk=16384):
    """``x`` checked as (n, width) rows (:func:`as_batch`) of finite values, finite in ``dtype`` too
    (:func:`check_in_range`).  A list (or tuple) of rows is made an array ``chunk`` values at a time, each slice
    named as the slice it is, so that no array the size of the data is made."""
    step = max(1, chunk // max(1, width))
    if not isinstance(x, (list, tuple)) or len(x) <= step:
        parts = [(0, name, x)]
    else:                                               # a slice at a time, not a list of them
        parts = ((i, f"{name}[{i}:{i + step}]", x[i:i + step]) for i in range(0, len(x), step))
    for offset, part_name, part in parts:
        rows = as_batch(part, width, part_name, role)
        check_finite_rows(rows, name, offset=offset)
        check_in_range(rows, dtype, name, offset)


def nonfinite_error(name, arr, offset=0):
    """The error of ``arr`` holding NaN or inf, naming its first bad index (its rows counted from ``offset``)."""
    bad = np.argwhere(~np.isfinite(arr))[0]
    return ValueError(f"{name} contains NaN or inf (first at index {(int(bad[0]) + offset, *map(int, bad[1:]))}: "
                      f"{arr[tuple(bad)]!r}); clean the data or use a wider dtype")


def check_finite(arr, name, offset=0):
    """Raise a ValueError naming ``name`` if the contiguous array holds NaN or inf (rows from ``offset``)."""
    if arr.dtype.kind == "f" and not (all_finite(arr) if _kernel_floats(arr) else np.isfinite(arr).all()):
        raise nonfinite_error(name, arr, offset)


def _kernel_floats(arr):
    """Whether the kernels read ``arr``'s floats: native float32 or float64 (not float16 or a long double)."""
    return arr.dtype.isnative and arr.dtype in (np.float32, np.float64)


def check_l2(l2, n_layers):
    """One non-negative finite float per layer."""
    values = list(l2) if np.ndim(l2) == 1 else [l2] * n_layers
    if len(values) != n_layers:
        raise ValueError(f"l2 must be one number or one per layer ({n_layers}), got {len(values)} values")
    return tuple(check_nonnegative(v, "l2") for v in values)


def as_labels(y, n_out, n, names):
    """Class indices (n,) from one-hot rows (n, n_out) or integer labels (n,); ``names`` = (x's, y's)."""
    x_name, name = names
    refuse_masked(y, name)
    y = np.asarray(y)
    shape = y.shape
    if y.ndim == 3 and y.shape[2] == 1:
        y = y[:, :, 0]
    if y.ndim == 2:
        y = as_batch(y, n_out, name, "output")
        check_finite_rows(y, name)
        y = y.argmax(axis=1)
    elif y.ndim != 1:
        raise ValueError(f"{name} must be one-hot (n, {n_out}) or integer labels (n,), got shape {shape}")
    elif y.dtype.kind not in "iu":
        raise TypeError(f"{name} must be target rows (n, {n_out}) or integer labels (n,), got a 1-D array of "
                        f"dtype {y.dtype}")
    if y.shape[0] != n:
        raise ValueError(f"{x_name} has {n} samples but {name} has {y.shape[0]}")
    if y.size and (y.min() < 0 or y.max() >= n_out):
        raise ValueError(f"{name} holds labels from {y.min()} to {y.max()}, but the net has "
                         f"{n_out} outputs (labels 0..{n_out - 1})")
    return y


def as_targets(y, n_out, name):
    """``y`` as target rows (batch, n_out) (the lab's (batch, n_out, 1) too), or as integer labels
    (batch,) checked to lie in 0..n_out-1, which the caller turns into one-hot rows."""
    refuse_masked(y, name)
    arr = np.asarray(y)
    if arr.ndim != 1:
        return as_batch(arr, n_out, name, "output")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must be target rows (batch, {n_out}) or integer labels (batch,), got a 1-D "
                        f"array of dtype {arr.dtype}")
    if arr.shape[0] == 0:
        raise ValueError(f"{name} has no samples (shape {arr.shape})")
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    lo, hi = label_range(arr)
    if lo < 0 or hi >= n_out:
        raise ValueError(f"{name} holds labels from {lo} to {hi}, but the net has {n_out} outputs "
                         f"(labels 0..{n_out - 1})")
    return arr


def one_hot_into(labels, out):
    """Write the one-hot rows of integer ``labels`` into ``out`` (len(labels), n_out)."""
    return one_hot(labels, out)
