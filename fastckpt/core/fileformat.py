"""The saved-net file: one versioned ``.npz`` format, written atomically and read with every check.

NOTE [ The file format ]
A fastckpt file is an ``.npz`` archive (``numpy.load(path)`` opens it, no
pickle needed) holding:

* ``meta``: a 0-d unicode array, a JSON object with ``format``
  (``"fastckpt-network"``), ``version`` (:data:`FORMAT_VERSION`),
  ``fastckpt_version``, ``sizes``, ``dtype``, ``loss``, ``l2`` (one per
  layer), ``activation`` (the hidden layers' names, one per layer), ``strategy``
  (its spelling, e.g. ``"revolve(4)"``), ``optimizer_in_backward``,
  ``optimizer`` (its name and settings, e.g. ``{"name": "adam", "betas": [0.9,
  0.999], "eps": 1e-08, "weight_decay": 0.0}``), ``optimizer_steps`` (the steps
  it has taken) and ``training`` (``null``, or the training state below);
* ``weights_0 .. weights_{L-1}``, each (n_out, n_in), and ``biases_0 ..
  biases_{L-1}``, each (n_out, 1), in the stored dtype, bit for bit;
* the optimizer's state in the same shapes and dtype, for each of its
  buffers (``velocity`` for momentum, ``m`` and ``v`` for Adam and AdamW):
  ``m_weights_0 .. m_weights_{L-1}``, ``m_biases_0 .. m_biases_{L-1}``, ...;
* with a training state, ``rng_keys``: the 624 uint32 words of
  ``numpy.random``'s Mersenne Twister (its other three fields are in
  ``training["rng"]``).

The training state says where a run stopped, so that it can go on exactly:
``epochs_done``, ``updates_done``, ``accuracies`` so far, and the settings
that must not change (``batch_size``, ``eta``, ``drop_last``, ``seed``,
``data``, ``n_train``).  ``fastckpt train --resume`` reads it.

Version 1 (fastckpt 0.3) has no ``activation`` nor ``optimizer``: its nets are
sigmoid nets trained by SGD.  A version-2 file without ``optimizer`` trains by SGD.
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

from .filemeta import FORMAT, FORMAT_VERSION, NET_FIELDS, checked_meta, read_headers, training_state, wanted_members
from .files import atomic_write, npz_name
from .optimizers import parse_optimizer

_UNREADABLE = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, RuntimeError, NotImplementedError)
# RuntimeError: an encrypted member; NotImplementedError: a compression method zipfile cannot read


def write(path, net, weights, biases, *, training=None, exclusive=False, optimizer_state=None):
    """Write a net to ``path`` (``.npz`` appended if missing); returns the path written.

    ``net`` is a dict of :data:`NET_FIELDS` (``strategy`` spelled as a string),
    ``weights`` and ``biases`` the lab's arrays.  The file appears whole or not
    at all: it is written to a temporary file in the same folder, flushed to
    disk and renamed over ``path``.  ``training`` is a dict as described in
    NOTE [ The file format ]; its ``rng`` entry, if present, is
    ``numpy.random.get_state()``.  With ``exclusive`` a file already at ``path`` (made by another
    process since the caller checked) is not replaced: ValueError.  ``optimizer_state`` is
    ``{"steps": int, "arrays": {state name: (weights, biases)}}`` in the lab's shapes, or None
    for none (SGD).
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
    if optimizer_state is not None:
        meta["optimizer_steps"] = int(optimizer_state["steps"])
        for name, (state_w, state_b) in optimizer_state["arrays"].items():
            arrays.update({f"{name}_weights_{i}": np.asarray(w) for i, w in enumerate(state_w)})
            arrays.update({f"{name}_biases_{i}": np.asarray(b) for i, b in enumerate(state_b)})
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
    """What :func:`read` found: the net's fields (:data:`NET_FIELDS`), its arrays, its training state
    and its optimizer's state (as :func:`write` takes it)."""

    net: dict
    weights: list
    biases: list
    training: dict | None
    optimizer_state: dict


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
    optimizer = parse_optimizer(meta["optimizer"])
    for name in (f"{state}_{part}_{i}" for state in optimizer.nonnegative_states for part in ("weights", "biases")
                 for i in range(n)):
        negative = members[name] < 0
        if negative.any():
            at = tuple(int(k) for k in np.argwhere(negative)[0])
            raise ValueError(f"path {path!r}: {name} holds {float(members[name][at])!r} at {at}, but "
                             f"{optimizer.name}'s {name.split('_')[0]} is a mean of squared gradients, never "
                             "negative: the file is damaged")
    weights = [members[f"weights_{i}"] for i in range(n)]
    biases = [members[f"biases_{i}"].reshape(-1, 1) for i in range(n)]
    names = optimizer.state_names
    state = {"steps": meta["optimizer_steps"],
             "arrays": {name: ([members[f"{name}_weights_{i}"] for i in range(n)],
                               [members[f"{name}_biases_{i}"] for i in range(n)]) for name in names}}
    return Saved({key: meta[key] for key in NET_FIELDS}, weights, biases,
                 training_state(meta.get("training"), members, path), state)


def _members(archive, path):
    """The checked metadata and every array the format names, read after their headers are checked."""
    headers = read_headers(archive, path)
    meta = checked_meta(archive, headers, path)
    wanted = wanted_members(meta, headers, path)
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
