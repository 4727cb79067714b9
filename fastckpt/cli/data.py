"""The data a command trains on: ``--data`` or the embedded digits, refused when ``--sizes`` do not fit it.

``--data embedded`` names the digits shipped with fastckpt (what every command reads without ``--data``);
a folder of that name is ``--data ./embedded``.  A file saved by ``train --save`` records its data (the
path, or None for the embedded digits, and the files' SHA-256), which :func:`recorded_data` reads back.
"""
import hashlib
import os

from fastckpt.core.resources import check_fits
from fastckpt.data import load_mnist, source_files
from fastckpt.planner import plan as make_plan

CLASSES = 10                # what every MNIST file holds
EMBEDDED = "embedded"       # --data embedded: the digits shipped with the package


def data_path(data):
    """What :func:`~fastckpt.data.load_mnist` reads for ``--data``: None for the embedded digits (``--data``
    not given, or ``embedded``), else the path as given."""
    return None if data is None or data == EMBEDDED else data


def data_name(data):
    """``--data`` for people: ``the embedded digits`` or the path, quoted."""
    return "the embedded digits" if data_path(data) is None else repr(data)


def load_data(path, sizes):
    """``load_mnist(path, compact=True)`` (images as bytes, labels as class indices), after checking that a
    net of ``sizes`` takes its images and gives its classes."""
    (x_train, y_train), (x_test, y_test) = load_mnist(data_path(path), compact=True)
    if x_train.shape[1] != sizes[0] or sizes[-1] != CLASSES:
        raise ValueError(f"--sizes {','.join(map(str, sizes))} do not fit the data: it has "
                         f"{x_train.shape[1]} inputs and {CLASSES} classes")
    return (x_train, y_train), (x_test, y_test)


def fingerprint(data):
    """SHA-256 of the files the loader reads for ``data`` (the file, or an IDX folder's four files by name,
    nothing else in the folder); None for the embedded digits."""
    data = data_path(data)
    if data is None:
        return None
    digest = hashlib.sha256()
    folder = os.path.isdir(data)
    for name in source_files(data):
        if folder:
            digest.update(os.path.basename(name).encode() + b"\0")
        with open(name, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def recorded_data(file, state):
    """The data the net in ``file`` was trained on, from its training ``state``: None for the embedded digits,
    else the path.  Refused, pointing at ``--data``, when the file records none (``net.save`` from Python
    writes no training state) or when the recorded files are gone or their contents changed."""
    if not isinstance(state, dict) or "data" not in state:
        raise ValueError(f"FILE {file!r} records no training data (train --save records it; net.save does not): "
                         f"give --data PATH, or --data {EMBEDDED} for the digits shipped with fastckpt")
    data = state["data"]
    if data is None:
        return None
    if not isinstance(data, str):
        raise ValueError(f"FILE {file!r}: its training state's data must be a path or null, got {data!r}")
    if not (os.path.isfile(data) or os.path.isdir(data)):
        raise ValueError(f"FILE {file!r} was trained on {data!r}, which is not a file or folder now: give --data "
                         "PATH with the data to use")
    if fingerprint(data) != state.get("data_sha256"):
        raise ValueError(f"FILE {file!r} was trained on {data!r}, whose contents have changed since: give --data "
                         f"{data!r} to use them as they are now, or other --data")
    return data


def check_trainable(sizes, batch_size, dtype, strategy, *, optimizer_in_backward=False, optimizer="sgd"):
    """The plan of a training step, refused (naming --sizes) when this process could not hold it."""
    plan = make_plan(sizes, batch_size, dtype, strategy, optimizer_in_backward=optimizer_in_backward,
                     optimizer=optimizer)
    check_fits(plan.bytes()["total"], f"a training step of {','.join(map(str, sizes))} at batch {batch_size} "
               f"({strategy})", f"--sizes {','.join(map(str, sizes))} with --batch-size {batch_size}")
    return plan
