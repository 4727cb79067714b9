"""The data of a fit as scikit-learn users hold it, held as the engine takes it, and the memory the fit needs.

NOTE [ A fit's data ]
``X`` is checked by scikit-learn's ``validate_data`` (feature names, finiteness, no sparse matrices) and
kept in the dtype it has: an array of float64 rows stays the caller's own array, and ints, float32 or a
DataFrame's values are converted by the engine a minibatch at a time into its staging rows, as a net's own
``SGD`` does.  Class labels (any type ``numpy.unique`` sorts: strings, ints) become one int64 index per
sample, one-hot only inside a minibatch's staging rows; regression targets are kept as given (n, outputs).
With ``early_stopping`` the validation set is drawn once, stratified by class for a classifier (as
scikit-learn's ``train_test_split(stratify=y)``): both parts are copies, as scikit-learn's are.

``max_memory`` bounds the whole fit as memray measures it: every array above counted whole (:func:`held`),
the split's index arrays while it is drawn, and the run's own parts
(:func:`fastckpt.planner.run.run_bytes`: the training step, staging rows, the epoch's order, the
validation pass, early stopping's best weights, the records and the Python objects), plus the
estimator's own objects (:data:`ESTIMATOR_OBJECTS`).  It is checked once the data is held and before the
first update, and refused with the parts named.
"""
import math

import numpy as np

from fastckpt.planner.run import bound_the_run, data_bytes
from fastckpt.planner.strategies import format_bytes

# The estimator's lists, dicts and settings, and the objects of scikit-learn's checks and of Python's ABC caches
# that a fit makes (isinstance against Mapping and friends): memray counted 78-118 KiB more than the 24 KiB once
# allowed, at the least bound a fit took (2026-11-29: (64, 64) and (256,) * 4 nets, 6,000 and 20,000 rows,
# classifier and regressor, early stopping, sqrt), so 160 KiB.
ESTIMATOR_OBJECTS = 160 * 1024


def split(x, y, fraction, rng, labels=None):
    """``(x_train, y_train), (x_val, y_val)``: ``ceil(fraction * n)`` samples held out at random (scikit-learn's
    ``test_size`` rule), from each class in proportion to its size when ``labels`` (class indices) are given."""
    n = x.shape[0]
    n_val = math.ceil(fraction * n)
    if n_val < 2 or n_val >= n:
        raise ValueError(f"validation_fraction={fraction!r} of {n} samples holds out {n_val}: the validation set "
                         "needs at least 2 and the training set at least 1; raise validation_fraction or give "
                         "more samples")
    order = rng.permutation(n)
    if labels is not None:                      # grouped by class, in random order inside each
        order = order[np.argsort(labels[order], kind="stable")]
        counts = np.bincount(labels)
        share = counts * (n_val / n)
        take = np.floor(share).astype(np.int64)
        rest = np.argsort(-(share - take), kind="stable")[:n_val - int(take.sum())]
        take[rest] += 1                          # the largest remainders get the samples left
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        val = np.concatenate([order[s:s + k] for s, k in zip(starts, take)])
        keep = np.ones(n, dtype=bool)
        keep[val] = False
        train = np.flatnonzero(keep)
        rng.shuffle(train)
    else:
        val, train = order[:n_val], order[n_val:]
    return (x[train], y[train]), (x[val], y[val])


def split_bytes(n, stratified):
    """The index arrays :func:`split` holds at once while it draws ``n`` samples' split."""
    return n * (8 * 4 + 1) if stratified else n * 8


def held(*arrays):
    """Each distinct buffer once, for :func:`bound`: a view counts as the whole array it keeps alive (a strided
    view of 16 MB counted as its own 8 MB let a fit pass its bound), and with any other view of it."""
    out = []
    for a in arrays:
        while isinstance(a, np.ndarray) and isinstance(a.base, np.ndarray):
            a = a.base
        if isinstance(a, np.ndarray) and not any(np.may_share_memory(a, b) for b in out):
            out.append(a)
    return out


def bound(bound, plan, training, validation, *, arrays, epochs, shuffled, best, split_at=0, replaced=0):
    """Refuse, before training, a fit whose whole run with ``plan``'s steps would need more than ``bound`` bytes
    (NOTE [ A fit's data ]); ``arrays``: every array the fit holds, ``split_at``: what drawing the validation split
    held, ``replaced``: the bytes of a fitted net that a warm fit replaced with the one ``plan`` is of (both were
    alive while it was made; counted over the whole run, which is more than it holds once training starts)."""
    n, batch = len(training[0]), plan.batch_size
    kept = data_bytes(*held(*arrays))
    if kept + split_at + ESTIMATOR_OBJECTS > bound:
        split = f" and the validation split {split_at:,} more" if split_at else ""
        raise ValueError(f"max_memory {format_bytes(bound)}: the data the fit holds needs {kept:,} bytes{split}, "
                         "before any training step")
    return bound_the_run(plan, training, None, updates=epochs * math.ceil(n / batch), bound=bound,
                         held=held(*arrays), extra=ESTIMATOR_OBJECTS + replaced, epochs=epochs, validation=validation,
                         shuffled=shuffled, best=best)
