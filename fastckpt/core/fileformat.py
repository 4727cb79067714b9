"""The saved-net file: one versioned ``.npz`` format, written atomically and read with every check.

NOTE [ The file format ]
A fastckpt file is an ``.npz`` archive (``numpy.load(path)`` opens it, no
pickle needed) holding:

* ``meta``: a 0-d unicode array, a JSON object with ``format``
  (``"fastckpt-network"``), ``version`` (:data:`FORMAT_VERSION`),
  ``fastckpt_version``, ``sizes``, ``dtype``, ``loss``, ``l2`` (one per
  layer), ``activation`` (the hidden layers' names, one per layer), ``strategy``
  (its spelling, e.g. ``"revolve(4)"``), ``optimizer_in_backward`` and
  ``training`` (``null``, or the training state below);
* ``weights_0 .. weights_{L-1}``, each (n_out, n_in), and ``biases_0 ..
  biases_{L-1}``, each (n_out, 1), in the stored dtype, bit for bit;
* with a training state, ``rng_keys``: the 624 uint32 words of
  ``numpy.random``'s Mersenne Twister (its other three fields are in
  ``training["rng"]``).

The training state says where a run stopped, so that it can go on exactly:
``epochs_done``, ``updates_done``, ``accuracies`` so far, and the settings
that must not change (``batch_size``, ``eta``, ``drop_last``, ``seed``,
``data``, ``n_train``).  ``fastckpt train --resume`` reads it.

Version 1 (fastckpt 0.3) has no ``activation``: its nets are sigmoid nets.
Version 0 is what ``fastckpt train --save`` wrote in fastckpt 0.1.0: the
weights then the biases as ``arr_0, arr_1, ...``, with no metadata.  It
loads with the sizes and dtype read from the arrays, the quadratic loss, no
L2 and plain backprop.
"""
import json
import os
import zipfile
import zlib
from typing import NamedTuple

import numpy as np

from fastckpt._version import __version__
from fastckpt.data import npz_header

from .files import atomic_write, npz_name

FORMAT = "fastckpt-network"
FORMAT_VERSION = 2
READS = (0, 1, 2)                      # the versions this fastckpt reads
_UNREADABLE = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, RuntimeError, NotImplementedError)
# RuntimeError: an encrypted member; NotImplementedError: a compression method zipfile cannot read


NET_FIELDS = ("sizes", "dtype", "loss", "l2", "strategy", "optimizer_in_backward", "activation")


def write(path, net, weights, biases, *, training=None, exclusive=False):
    """Write a net to ``path`` (``.npz`` appended if missing); returns the path written.

    ``net`` is a dict of :data:`NET_FIELDS` (``strategy`` spelled as a string),
    ``weights`` and ``biases`` the lab's arrays.  The file appears whole or not
    at all: it is written to a temporary file in the same folder, flushed to
    disk and renamed over ``path``.  ``training`` is a dict as described in
    NOTE [ The file format ]; its ``rng`` entry, if present, is
    ``numpy.random.get_state()``.  With ``exclusive`` a file already at ``path`` (made by another
    process since the caller checked) is not replaced: ValueError.
    """
    path = os.fsdecode(os.fspath(path))
    if not path.strip() or path.endswith(os.sep):
        raise ValueError(f"path {path!r}: name the .npz file to write")
    target = os.path.realpath(npz_name(path))
    if os.path.isdir(path) or os.path.isdir(target):
        raise ValueError(f"path {path!r}: is a folder; name the .npz file to write")
    if not os.path.isdir(os.path.dirname(target)):
        raise ValueError(f"path {path!r}: no such folder {os.path.dirname(target)!r}")
    if training is not None and not isinstance(training, dict):
        raise TypeError(f"training must be a dict, got {type(training).__name__}")
    meta = {"format": FORMAT, "version": FORMAT_VERSION, "fastckpt_version": __version__,
            **{key: net[key] for key in NET_FIELDS}, "training": None}
    arrays = {f"weights_{i}": np.asarray(w) for i, w in enumerate(weights)}
    arrays.update({f"biases_{i}": np.asarray(b) for i, b in enumerate(biases)})
    if training is not None:
        training = dict(training)
        rng = training.pop("rng", None)
        if rng is not None:
            if not isinstance(rng, tuple) or len(rng) != 5:
                raise ValueError(f"training['rng'] must be numpy.random.get_state(), got {rng!r}")
            kind, keys, pos, has_gauss, cached = rng
            if kind != "MT19937":
                raise ValueError(f"training['rng'] must be numpy.random.get_state(), got a {kind!r} state")
            arrays["rng_keys"] = np.asarray(keys, dtype=np.uint32)
            training["rng"] = {"pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
        meta["training"] = training
    arrays["meta"] = np.array(json.dumps(meta))
    try:
        return atomic_write(path, lambda f: np.savez(f, **arrays), exclusive=exclusive)
    except FileExistsError:
        raise ValueError(f"path {path!r}: a file appeared there after this run began (another process?); "
                         "not replaced") from None


class Saved(NamedTuple):
    """What :func:`read` found: the net's fields (:data:`NET_FIELDS`), its arrays, its training state."""

    net: dict
    weights: list
    biases: list
    training: dict | None


def read(path):
    """The net saved at ``path`` by :func:`write` (or a version-0 file), checked, as :class:`Saved`.

    The lab's shapes: ``weights[i]`` (n_out, n_in), ``biases[i]`` (n_out, 1),
    bit for bit.  The training state's ``rng``, if any, is a tuple for
    ``numpy.random.set_state``.  ``numpy.random``'s own state is not touched.

    Raises
    ------
    ValueError
        A file that is not a fastckpt net, of an unknown format version, with
        missing arrays, shapes that do not match its sizes, or NaN or inf.
    """
    path = os.fspath(path)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not os.path.exists(path) and os.path.exists(npz_name(path)):
        path = npz_name(path)
    if not os.path.isfile(path):
        raise ValueError(f"path {path!r}: no such file" if not os.path.exists(path) else f"path {path!r}: not a file")
    if not zipfile.is_zipfile(path):
        raise ValueError(f"path {path!r}: not a saved net: an .npz file is a zip archive, and this is not one")
    try:
        with np.load(path, allow_pickle=False) as archive:
            meta, members = _members(archive, path)
    except ValueError as exc:
        if str(exc).startswith(f"path {path!r}: "):                  # ours, with its reason
            raise
        raise ValueError(f"path {path!r}: the archive is damaged ({type(exc).__name__}: {exc})") from None
    except _UNREADABLE as exc:
        raise ValueError(f"path {path!r}: the archive is damaged ({type(exc).__name__}: {exc})") from None
    for name, arr in members.items():
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            raise ValueError(f"path {path!r}: {name} holds NaN or inf, which no saved net does: the file is damaged")
    n = len(meta["sizes"]) - 1
    weights = [members[f"weights_{i}"] for i in range(n)]
    biases = [members[f"biases_{i}"].reshape(-1, 1) for i in range(n)]
    return Saved({key: meta[key] for key in NET_FIELDS}, weights, biases,
                 _training(meta.get("training"), members, path))


def _members(archive, path):
    """The checked metadata and every array the format names, read after their headers are checked."""
    headers = _headers(archive, path)
    meta = _meta(archive, headers, path)
    wanted = _wanted(meta, headers, path)
    extra = sorted(set(headers) - {stored for stored, _, _ in wanted.values()} - {"meta"})
    if extra:
        raise ValueError(f"path {path!r}: holds arrays a saved net of sizes {meta['sizes']} does not: "
                         f"{', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}")
    members = {}
    for name, (stored, shape, dtype) in wanted.items():
        got_shape, got_dtype = headers[stored]
        if got_shape != shape:
            raise ValueError(f"path {path!r}: {name} has shape {got_shape}, but sizes {meta['sizes']} "
                             f"need {shape}")
        if got_dtype != dtype:
            raise ValueError(f"path {path!r}: {name} is {got_dtype}, but "
                             + (f"the file's dtype is {dtype}" if "meta" in headers else
                                f"a version-0 file's weights and biases must all be {dtype}"))
        try:
            npz_header(archive, path, stored)        # its bytes are possible for the file: nothing huge allocated
        except ValueError as exc:
            raise ValueError(f"path {path!r}: {exc}") from None
        members[name] = archive[stored]
    return meta, members


# -- helpers ----------------------------------------------------------------------------------
def _headers(archive, path):
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


def _meta(archive, headers, path):
    """The checked metadata; a version-0 file's is made from its headers."""
    if "meta" not in headers:
        return _legacy_meta(headers, path)
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
    return meta


def _legacy_meta(headers, path):
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
            "activation": "sigmoid", "version": 0}


def _wanted(meta, headers, path):
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
    training = meta.get("training")
    if isinstance(training, dict) and training.get("rng") is not None:
        wanted["rng_keys"] = ("rng_keys", (624,), np.dtype(np.uint32))
    for stored, _, _ in wanted.values():
        if stored not in headers:
            raise ValueError(f"path {path!r}: the array {stored!r} is missing")
    return wanted


def _training(training, members, path):
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
                or type(rng["cached_gaussian"]) not in (int, float):
            raise ValueError(f"path {path!r}: its training state's rng must hold pos (0..624), has_gauss (0 or 1) "
                             f"and cached_gaussian, got {rng!r}")
        training["rng"] = ("MT19937", members["rng_keys"], rng["pos"], rng["has_gauss"], rng["cached_gaussian"])
    return training
