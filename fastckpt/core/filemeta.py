"""Checks of a saved net's members and metadata, read from the ``.npy`` headers before any data
(NOTE [ The file format ] in :mod:`fastckpt.core.fileformat`)."""
import json

import numpy as np

from .optimizers import MAX_STEPS, parse_optimizer

FORMAT = "fastckpt-network"
FORMAT_VERSION = 2
READS = (0, 1, 2)                      # the versions this fastckpt reads
NET_FIELDS = ("sizes", "dtype", "loss", "l2", "strategy", "optimizer_in_backward", "activation", "optimizer")


def read_headers(archive, path):
    """``{member: (shape, dtype)}`` from each ``.npy`` header, read before any data (no allocation)."""
    headers = {}
    for member in archive.zip.namelist():
        if not member.endswith(".npy"):
            raise ValueError(f"path {path!r}: member {member!r} is not a .npy array; a saved net holds only those")
        name = member[:-len(".npy")]
        with archive.zip.open(member) as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, _, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f"path {path!r}: member {name!r} is .npy version {version}, which a saved net "
                                 "never has")
        if dtype.hasobject:
            raise ValueError(f"path {path!r}: member {name!r} holds Python objects; a saved net holds numbers only")
        headers[name] = (tuple(shape), dtype)
    return headers


def checked_meta(archive, headers, path):
    """The checked metadata; a version-0 file's is made from its headers."""
    if "meta" not in headers:
        return legacy_meta(headers, path)
    shape, dtype = headers["meta"]
    if shape != () or dtype.kind != "U" or dtype.itemsize > 2**22:
        raise ValueError(f"path {path!r}: its meta member must be one JSON string, got shape {shape} of {dtype}")
    try:
        meta = json.loads(str(archive["meta"][()]))
    except (ValueError, TypeError, IndexError, RecursionError) as exc:
        raise ValueError(f"path {path!r}: its metadata is not JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        shown = meta.get("format") if isinstance(meta, dict) else meta
        raise ValueError(f"path {path!r}: not a fastckpt net (format {shown!r})")
    version = meta.get("version")
    if type(version) is not int or version not in READS:
        raise ValueError(f"path {path!r}: format version {version!r}, but this fastckpt reads versions "
                         f"{', '.join(map(str, READS[:-1]))} and {READS[-1]}; it was written by fastckpt "
                         f"{meta.get('fastckpt_version', '?')}")
    if version == 1:
        if "activation" in meta:
            raise ValueError(f"path {path!r}: a version-1 file has no activation, but this one names "
                             f"{meta['activation']!r}")
        meta["activation"] = "sigmoid"
    meta.setdefault("optimizer", {"name": "sgd"})             # files written before optimizers: SGD
    meta.setdefault("optimizer_steps", 0)
    keys = NET_FIELDS
    missing = [k for k in keys if k not in meta]
    if missing:
        raise ValueError(f"path {path!r}: its metadata lacks {', '.join(missing)}")
    sizes, l2 = meta["sizes"], meta["l2"]
    if not isinstance(sizes, list) or len(sizes) < 2 or not all(type(v) is int and v >= 1 for v in sizes):
        raise ValueError(f"path {path!r}: sizes must be a list of at least two integers >= 1, got {sizes!r}")
    if meta["dtype"] not in ("float32", "float64"):
        raise ValueError(f"path {path!r}: dtype must be float32 or float64, got {meta['dtype']!r}")
    numbers = l2 if isinstance(l2, list) else [l2]
    if not all(type(v) in (int, float) for v in numbers):
        raise ValueError(f"path {path!r}: l2 must be a number or a list of numbers, got {l2!r}")
    if not isinstance(meta["strategy"], str) or not isinstance(meta["loss"], str):
        raise ValueError(f"path {path!r}: strategy and loss must be strings, got {meta['strategy']!r} and "
                         f"{meta['loss']!r}")
    names = meta["activation"] if isinstance(meta["activation"], list) else [meta["activation"]]
    if not all(isinstance(v, str) for v in names):
        raise ValueError(f"path {path!r}: activation must be a name or a list of names, got {meta['activation']!r}")
    if not isinstance(meta["optimizer"], dict) or type(meta["optimizer_steps"]) is not int \
            or not 0 <= meta["optimizer_steps"] <= MAX_STEPS:
        raise ValueError(f"path {path!r}: optimizer must be a JSON object and optimizer_steps an integer >= 0 "
                         f"and <= {MAX_STEPS} (the steps an int64 counts), got {meta['optimizer']!r} and "
                         f"{_shown(meta['optimizer_steps'])}")
    try:
        parse_optimizer(meta["optimizer"])
    except (TypeError, ValueError) as exc:
        raise ValueError(f"path {path!r}: {exc}") from None
    return meta


def legacy_meta(headers, path):
    """Version 0: ``arr_0 .. arr_{2L-1}``, the weights then the biases, float32 or float64."""
    count = len(headers)
    names = [f"arr_{i}" for i in range(count)]
    if count < 2 or count % 2 or sorted(headers) != sorted(names):
        raise ValueError(f"path {path!r}: not a fastckpt net: it holds {sorted(headers)[:6]}, neither 'meta' "
                         "nor the weights and biases arr_0, arr_1, ... of a version-0 file")
    n = count // 2
    shapes = [headers[f"arr_{i}"][0] for i in range(n)]
    if any(len(shape) != 2 for shape in shapes):
        raise ValueError(f"path {path!r}: a version-0 file's first {n} arrays must be 2-D weights, got shapes "
                         f"{shapes}")
    dtype = headers["arr_0"][1]
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"path {path!r}: a version-0 file's weights must be float32 or float64, got {dtype}")
    return {"sizes": [int(shapes[0][1])] + [int(shape[0]) for shape in shapes], "dtype": dtype.name,
            "loss": "quadratic", "l2": 0.0, "strategy": "plain", "optimizer_in_backward": False, "training": None,
            "activation": "sigmoid", "optimizer": {"name": "sgd"}, "optimizer_steps": 0, "version": 0}


def wanted_members(meta, headers, path):
    """``{name: (stored member, shape, dtype)}`` of every array the file must hold."""
    sizes, dtype = meta["sizes"], np.dtype(meta["dtype"])
    n = len(sizes) - 1
    legacy = meta.get("version") == 0
    wanted = {}
    for i in range(n):
        bias_shape = headers.get(f"arr_{n + i}" if legacy else f"biases_{i}", ((),))[0]
        wanted[f"weights_{i}"] = (f"arr_{i}" if legacy else f"weights_{i}", (sizes[i + 1], sizes[i]), dtype)
        wanted[f"biases_{i}"] = (f"arr_{n + i}" if legacy else f"biases_{i}",
                                 (sizes[i + 1],) if legacy and len(bias_shape) == 1 else (sizes[i + 1], 1), dtype)
    for name in parse_optimizer(meta["optimizer"]).state_names:
        for i in range(n):
            wanted[f"{name}_weights_{i}"] = (f"{name}_weights_{i}", (sizes[i + 1], sizes[i]), dtype)
            wanted[f"{name}_biases_{i}"] = (f"{name}_biases_{i}", (sizes[i + 1], 1), dtype)
    training = meta.get("training")
    if isinstance(training, dict) and training.get("rng") is not None:
        wanted["rng_keys"] = ("rng_keys", (624,), np.dtype(np.uint32))
    for stored, _, _ in wanted.values():
        if stored not in headers:
            raise ValueError(f"path {path!r}: the array {stored!r} is missing")
    return wanted


def training_state(training, members, path):
    """The training state as saved, with ``rng`` made a ``numpy.random.set_state`` tuple."""
    if training is None:
        return None
    if not isinstance(training, dict):
        raise ValueError(f"path {path!r}: its training state must be a JSON object, got {training!r}")
    training = dict(training)
    rng = training.get("rng")
    if rng is not None:
        fields = ("pos", "has_gauss", "cached_gaussian")
        if not isinstance(rng, dict) or any(k not in rng for k in fields) or type(rng["pos"]) is not int \
                or not 0 <= rng["pos"] <= 624 or rng["has_gauss"] not in (0, 1) \
                or not finite_number(rng["cached_gaussian"]):
            raise ValueError(f"path {path!r}: its training state's rng must hold pos (0..624), has_gauss (0 or 1) "
                             f"and a finite cached_gaussian, got {_shown(rng)}")
        training["rng"] = RandomState(("MT19937", members["rng_keys"], rng["pos"], rng["has_gauss"],
                                       rng["cached_gaussian"]))
    return training


class RandomState(tuple):
    """``numpy.random.get_state()``'s tuple as a file keeps it, shown in one short line: its 624 key words
    are in the tuple (``numpy.random.set_state`` takes it) but not in its repr."""

    def __repr__(self):
        return f"<MT19937 state: 624 words, pos {self[2]}>"


def finite_number(value):
    """Whether a JSON value is an int or float that a float64 holds finite (JSON's 1e400 reads as inf)."""
    try:
        return type(value) in (int, float) and bool(np.isfinite(float(value)))
    except OverflowError:                      # an int past float64's range
        return False


def _shown(value, most=120):
    """``repr(value)`` cut to ``most`` characters: a file may hold a 400-digit number."""
    text = repr(value)
    return text if len(text) <= most else text[:most] + "..."
