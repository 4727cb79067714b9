"""``fastckpt evaluate FILE`` and ``fastckpt predict FILE``: a saved net on data, from the command line.

Without ``--data`` they take the data FILE was trained on, which ``train --save`` records (the path, or the
embedded digits, and the files' SHA-256): a net is judged on what it learnt, not on the embedded digits by
default.  A file that records none (``net.save`` from Python), or whose data is gone or changed, is
refused, pointing at ``--data``.  ``--data`` is what ``train`` reads (the lab's mnist.npz, an IDX folder, or
``embedded``); ``predict`` also reads a ``.npy`` array of inputs, one sample per row, which has no labels.
"""
import json
import os
import sys

import numpy as np

from fastckpt.data import load_mnist

from .data import CLASSES, EMBEDDED, data_name, data_path, recorded_data
from .paths import load_named, npz_name


def evaluate(args):
    """Accuracy of the saved net on one split of the data (and the count behind it)."""
    net = load_net(args.file)
    if args.data is not None and args.data.endswith(".npy"):
        raise ValueError(f"--data {args.data!r}: a .npy array holds inputs without labels; evaluate needs an "
                         "mnist.npz or an IDX folder (predict takes a .npy)")
    data, said = _data(args, net)
    x, y = _split(data, args.split, net)
    accuracy = net.evaluate(x, y)
    correct = int(round(accuracy * len(x)))
    if args.json:
        print(json.dumps({"file": args.file, "sizes": net.sizes, "data": data_path(data) or EMBEDDED,
                          "data_from": "--data" if args.data is not None else "FILE", "split": args.split,
                          "samples": len(x), "correct": correct, "accuracy": accuracy}, indent=2))
    else:
        print(f"{args.file}: accuracy {accuracy:.4f} ({correct} of {len(x)} {args.split} samples of {said})")
    return 0


def predict(args):
    """The class index of every sample, one per line on stdout or in ``--output``; which data, on stderr."""
    if args.force and args.output is None:
        raise ValueError("--force lets --output replace a file; without --output it would change nothing")
    net = load_net(args.file)
    if args.data is not None and args.data.endswith(".npy"):
        x = _inputs(args.data, net.sizes[0])
        said = f"the {len(x)} rows of {args.data!r}"
    else:
        data, source = _data(args, net)
        x, _ = _split(data, args.split, net)
        said = f"the {len(x)} {args.split} samples of {source}"
    labels = net.predict(x).astype(np.int64)
    if args.output is None:
        print(f"fastckpt predict: the classes of {said}, one per line", file=sys.stderr)
        sys.stdout.write("".join(f"{int(k)}\n" for k in labels))
        return 0
    if os.path.exists(args.output) and not args.force:           # made while the prediction ran
        raise ValueError(f"--output {args.output!r} exists; pass --force to overwrite it")
    try:
        if args.output.endswith(".npy"):
            np.save(args.output, labels)
        else:
            with open(args.output, "w") as f:
                f.write("".join(f"{int(k)}\n" for k in labels))
    except OSError as exc:
        raise ValueError(f"--output {args.output!r}: cannot write it: {exc.strerror or exc}") from None
    print(f"fastckpt predict: the classes of {said} written to {args.output}", file=sys.stderr)
    return 0


def load_net(path):
    """The net saved at ``path`` (``.npz`` appended as numpy does), or a ValueError naming FILE."""
    if not os.path.isfile(path) and not os.path.isfile(npz_name(path)):
        raise ValueError(f"FILE {path!r}: no such file")
    return load_named(path if os.path.isfile(path) else npz_name(path), "FILE")


def _data(args, net):
    """``(data, words)``: ``--data`` as given, else the data the file records (:func:`recorded_data`), and
    which it is, for the printed line."""
    if args.data is not None:
        return args.data, data_name(args.data)
    data = recorded_data(args.file, net.training_state)
    return data, f"{data_name(data)}, which it was trained on"


def _split(data, split, net):
    """(x, y) of ``split`` of ``data``, refused when the net does not take its images or give its classes."""
    train, test = load_mnist(data_path(data), compact=True)
    x, y = train if split == "train" else test
    if x.shape[1] != net.sizes[0] or net.sizes[-1] != CLASSES:
        raise ValueError(f"the net's sizes {net.sizes} do not fit the data: it has {x.shape[1]} inputs and "
                         f"{CLASSES} classes")
    return x, y


def _inputs(path, n_in):
    """The rows of a ``.npy`` file of inputs, checked without unpickling anything; uint8 rows are bytes / 255,
    as the data readers take uint8 images."""
    try:
        x = np.load(path, allow_pickle=False, mmap_mode="r")
    except (OSError, ValueError) as exc:
        raise ValueError(f"--data {path!r}: cannot read it as a .npy array: {exc}") from None
    if x.ndim != 2 or x.shape[1] != n_in or x.dtype.kind not in "fiu":
        raise ValueError(f"--data {path!r}: holds {x.dtype} of shape {x.shape}; the net takes rows of {n_in} "
                         "real numbers, one sample per row")
    if x.shape[0] == 0:
        raise ValueError(f"--data {path!r}: holds no rows (shape {x.shape}); give at least one sample")
    if x.dtype == np.uint8:                                     # as train and evaluate read uint8 images
        return x / 255.0
    if x.dtype.kind in "iu":
        raise ValueError(f"--data {path!r}: holds {x.dtype}; give floats as the net was trained on them, or "
                         "uint8 bytes (read as bytes / 255, as train reads uint8 images)")
    for i in range(0, x.shape[0], 4096):                       # in chunks: no temporary the size of the file
        with np.errstate(over="ignore"):                       # a longdouble past float64's range is inf here
            bad = np.argwhere(~np.isfinite(np.asarray(x[i:i + 4096], dtype=np.float64)))
        if len(bad):
            raise ValueError(f"--data {path!r} holds NaN or inf, or a number past float64's range (first at row "
                             f"{i + int(bad[0][0])}, column {int(bad[0][1])}), which no net can classify")
    return np.asarray(x, dtype=np.float64)
