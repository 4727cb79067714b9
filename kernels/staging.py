"""Minibatches into the staging rows: image bytes scaled, labels checked and one-hot, without the GIL.

These are numpy one-liners (``np.divide(raw, d, out=out)``, ``labels.min()``,
``out[np.arange(n), labels] = 1``), but on a minibatch of 10 each costs a few
microseconds of the GIL, and ``DataParallel``'s threads take turns at it.
Without the JIT (NOTE [ No JIT ] in :mod:`kernels.bits`) they are those numpy
one-liners again, the same numbers, rather than Python loops over every element.
"""
import numpy as np
from numba import config

from ._jit import kernel


@kernel
def scale_into(raw, divisor, out):
    """``out = raw / divisor`` for 2-D arrays of one shape, computed in float64 and rounded to out's dtype."""
    for i in range(raw.shape[0]):
        for j in range(raw.shape[1]):
            out[i, j] = np.float64(raw[i, j]) / divisor
    return out


@kernel
def label_range(labels):
    """The smallest and largest of the integer ``labels`` (1-D, not empty)."""
    lo = hi = labels[0]
    for i in range(1, labels.shape[0]):
        lo = min(lo, labels[i])
        hi = max(hi, labels[i])
    return lo, hi


@kernel
def one_hot(labels, out):
    """The one-hot rows of ``labels`` (each in ``0..out.shape[1]-1``) into ``out`` (len(labels), n)."""
    out[:, :] = 0
    for i in range(labels.shape[0]):
        out[i, labels[i]] = 1
    return out


if config.DISABLE_JIT:
    def scale_into(raw, divisor, out):  # noqa: F811
        np.divide(raw, divisor, out=out, casting="unsafe")
        return out

    def label_range(labels):  # noqa: F811
        return labels.min(), labels.max()

    def one_hot(labels, out):  # noqa: F811
        out[...] = 0
        out[np.arange(labels.shape[0]), labels] = 1
        return out
