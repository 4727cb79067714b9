"""Saving and loading a net: one versioned ``.npz`` format, written atomically.

NOTE [ The file format ]
A fastckpt file is an ``.npz`` archive (``numpy.load(path)`` opens it, no
pickle needed) holding:

* ``meta``: a 0-d unicode array, a JSON object with ``format``
  (``"fastckpt-network"``), ``version`` (:data:`FORMAT_VERSION`),
  ``fastckpt_version``, ``sizes``, ``dtype``, ``loss``, ``l2`` (one per
  layer), ``strategy`` (its spelling, e.g. ``"revolve(4)"``),
  ``optimizer_in_backward`` and ``training`` (``null``, or the training state
  below);
* ``weights_0 .. weights_{L-1}``, each (n_out, n_in), and ``biases_0 ..
  biases_{L-1}``, each (n_out, 1), in the stored dtype, bit for bit;
* with a training state, ``rng_keys``: the 624 uint32 words of
  ``numpy.random``'s Mersenne Twister (its other three fields are in
  ``training["rng"]``).

The training state says where a run stopped, so that it can go on exactly:
``epochs_done``, ``updates_done``, ``accuracies`` so far, and the settings
that must not change (``batch_size``, ``eta``, ``drop_last``, ``seed``,
``data``, ``n_train``).  ``fastckpt train --resume`` reads it.

Version 0 is what ``fastckpt train --save`` wrote in fastckpt 0.1.0: the
weights then the biases as ``arr_0, arr_1, ...``, with no metadata.  It
loads with the sizes and dtype read from the arrays, the quadratic loss, no
L2 and plain backprop.
"""
import json
import os
import zipfile
import zlib

import numpy as np

from ._files import atomic_write, npz_name

FORMAT = "fastckpt-network"
FORMAT_VERSION = 1
_UNREADABLE = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error)


def save(net, path, *, training=None):
    """Write ``net`` (and optionally a training state) to ``path`` (``.npz`` appended if missing).

    The file appears whole or not at all: it is written to a temporary file in
    the same folder, flushed to disk and renamed over ``path``.  Returns the
    path written.  ``training`` is a dict as described in NOTE [ The file
    format ]; its ``rng`` entry, if present, is ``numpy.random.get_state()``.
    """
    from . import __version__
    with net.params.lock:                                  # one consistent set of parameters
        weights = [np.array(w) for w in net.weights]
        biases = [np.array(b) for b in net.biases]
    meta = {"format": FORMAT, "version": FORMAT_VERSION, "fastckpt_version": __version__,
            "sizes": list(net.sizes), "dtype": net.dtype.name, "loss": net.loss, "l2": list(net.l2),
            "strategy": str(net.strategy), "optimizer_in_backward": net.optimizer_in_backward,
            "training": None}
    arrays = {f"weights_{i}": w for i, w in enumerate(weights)}
    arrays.update({f"biases_{i}": b for i, b in enumerate(biases)})
    if training is not None:
        training = dict(training)
        rng = training.pop("rng", None)
        if rng is not None:
            kind, keys, pos, has_gauss, cached = rng
            if kind != "MT19937":
                raise ValueError(f"training['rng'] must be numpy.random.get_state(), got a {kind!r} state")
            arrays["rng_keys"] = np.asarray(keys, dtype=np.uint32)
            training["rng"] = {"pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
        meta["training"] = training
    arrays["meta"] = np.array(json.dumps(meta))
    return atomic_write(path, lambda f: np.savez(f, **arrays))


def save_arrays(path, sizes, dtype, weights, biases, *, loss="quadratic", l2=0.0, strategy="plain",
                training=None):
    """:func:`save` for a net known by its arrays (a pipeline or tensor-parallel trainer's gathered ones)."""
    net = _empty(sizes, dtype, loss=loss, l2=l2, strategy=strategy, optimizer_in_backward=False)
    net.weights, net.biases = weights, biases
    return save(net, path, training=training)


def load(path):
    """The net saved at ``path`` by :meth:`Network.save <fastckpt.network.Network.save>` or ``fastckpt train --save``.

    Returns a :class:`~fastckpt.checkpointing.NetworkWithCheckpointing` when
    the file names a strategy other than ``plain``, else a
    :class:`~fastckpt.network.Network`, with the saved parameters bit for bit.
    If the file holds a training state it is in ``net.training_state`` (a
    dict; ``rng`` is a tuple for ``numpy.random.set_state``), else that is None.
    ``numpy.random``'s own state is not touched.

    Raises
    ------
    ValueError
        A file that is not a fastckpt net, of an unknown format version, with
        missing arrays, shapes that do not match its sizes, or NaN or inf.
    """
    path = os.fspath(path)
    if not os.path.exists(path) and os.path.exists(npz_name(path)):
        path = npz_name(path)
    try:
        archive = np.load(path, allow_pickle=False)
    except _UNREADABLE as exc:
        raise ValueError(f"path {path!r}: not a readable .npz file ({exc})") from None
    if not hasattr(archive, "files"):
        raise ValueError(f"path {path!r}: holds one array, not a saved net (.npz)")
    with archive:
        try:
            members = {name: archive[name] for name in archive.files}
        except _UNREADABLE as exc:
            raise ValueError(f"path {path!r}: the archive is damaged ({exc})") from None
    meta = _meta(members, path)
    n = len(meta["sizes"]) - 1
    weights = [_member(members, f"weights_{i}", path) for i in range(n)]
    biases = [_member(members, f"biases_{i}", path) for i in range(n)]
    for kind, arrays in (("weights", weights), ("biases", biases)):
        for i, arr in enumerate(arrays):
            want = (meta["sizes"][i + 1], meta["sizes"][i] if kind == "weights" else 1)
            if arr.shape != want:
                raise ValueError(f"path {path!r}: {kind}_{i} has shape {arr.shape}, but sizes "
                                 f"{meta['sizes']} need {want}")
            if arr.dtype != np.dtype(meta["dtype"]):
                raise ValueError(f"path {path!r}: {kind}_{i} is {arr.dtype}, but the file says {meta['dtype']}")
    try:
        net = _empty(meta["sizes"], meta["dtype"], loss=meta["loss"], l2=meta["l2"],
                     strategy=meta["strategy"], optimizer_in_backward=meta["optimizer_in_backward"])
        net.weights, net.biases = weights, biases
    except (TypeError, ValueError) as exc:
        raise ValueError(f"path {path!r}: {exc}") from None
    net.training_state = _training(meta.get("training"), members, path)
    return net


# -- helpers ----------------------------------------------------------------------------------
def _empty(sizes, dtype, *, loss, l2, strategy, optimizer_in_backward):
    """A net with zero parameters, made without drawing from ``numpy.random``: a
    :class:`NetworkWithCheckpointing` unless ``strategy`` is plain."""
    from .checkpointing import NetworkWithCheckpointing
    from .network import Network
    from .strategies import Plain, parse_strategy
    strategy = parse_strategy(strategy)
    kwargs = {"optimizer_in_backward": optimizer_in_backward, "loss": loss, "l2": l2}
    if isinstance(strategy, Plain):
        return Network.blank(sizes, dtype, **kwargs)
    return NetworkWithCheckpointing.blank(sizes, dtype, strategy=strategy, **kwargs)


def _meta(members, path):
    """The checked metadata; a version-0 file's is made from its arrays."""
    if "meta" not in members:
        return _legacy_meta(members, path)
    try:
        meta = json.loads(str(members["meta"][()]))
    except (ValueError, TypeError, IndexError) as exc:
        raise ValueError(f"path {path!r}: its metadata is not JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        shown = meta.get("format") if isinstance(meta, dict) else meta
        raise ValueError(f"path {path!r}: not a fastckpt net (format {shown!r})")
    version = meta.get("version")
    if version != FORMAT_VERSION:
        raise ValueError(f"path {path!r}: format version {version!r}, but this fastckpt reads versions 0 and "
                         f"{FORMAT_VERSION}; it was written by fastckpt {meta.get('fastckpt_version', '?')}")
    keys = ("sizes", "dtype", "loss", "l2", "strategy", "optimizer_in_backward")
    missing = [k for k in keys if k not in meta]
    if missing:
        raise ValueError(f"path {path!r}: its metadata lacks {', '.join(missing)}")
    sizes = meta["sizes"]
    if not isinstance(sizes, list) or len(sizes) < 2 or not all(isinstance(s, int) and s >= 1 for s in sizes):
        raise ValueError(f"path {path!r}: sizes must be a list of at least two integers >= 1, got {sizes!r}")
    if meta["dtype"] not in ("float32", "float64"):
        raise ValueError(f"path {path!r}: dtype must be float32 or float64, got {meta['dtype']!r}")
    return meta


def _legacy_meta(members, path):
    """Version 0: ``arr_0 .. arr_{2L-1}``, the weights then the biases."""
    count = len(members)
    names = [f"arr_{i}" for i in range(count)]
    if count < 2 or count % 2 or sorted(members) != sorted(names):
        raise ValueError(f"path {path!r}: not a fastckpt net: it holds {sorted(members)[:6]}, neither 'meta' "
                         "nor the weights and biases arr_0, arr_1, ... of a version-0 file")
    n = count // 2
    weights = [members[f"arr_{i}"] for i in range(n)]
    biases = [members[f"arr_{n + i}"] for i in range(n)]
    if any(w.ndim != 2 for w in weights):
        raise ValueError(f"path {path!r}: a version-0 file's first {n} arrays must be 2-D weights, got shapes "
                         f"{[w.shape for w in weights]}")
    sizes = [int(weights[0].shape[1])] + [int(w.shape[0]) for w in weights]
    for i in range(n):
        members[f"weights_{i}"] = weights[i]
        members[f"biases_{i}"] = biases[i].reshape(-1, 1) if biases[i].ndim == 1 else biases[i]
    return {"sizes": sizes, "dtype": weights[0].dtype.name, "loss": "quadratic", "l2": 0.0, "strategy": "plain",
            "optimizer_in_backward": False, "training": None}


def _member(members, name, path):
    if name not in members:
        raise ValueError(f"path {path!r}: the array {name!r} is missing")
    return members[name]


def _training(training, members, path):
    if training is None:
        return None
    if not isinstance(training, dict):
        raise ValueError(f"path {path!r}: its training state must be a JSON object, got {training!r}")
    training = dict(training)
    rng = training.get("rng")
    if rng is not None:
        keys = _member(members, "rng_keys", path)
        if keys.shape != (624,) or keys.dtype != np.uint32:
            raise ValueError(f"path {path!r}: rng_keys must be 624 uint32 words, got {keys.shape} {keys.dtype}")
        training["rng"] = ("MT19937", keys, rng["pos"], rng["has_gauss"], rng["cached_gaussian"])
    return training
