"""Loss derivative, SGD update and finiteness checks on contiguous arrays.

Finiteness is an integer OR over ``x - x != 0`` (NaN for NaN and inf): integer
reductions are associative, so LLVM vectorizes them without ``fastmath``.
"""
import math

import numpy as np

from ._jit import inline, kernel
from .activations import LOG_SOFTMAX, smallest_normal


@inline
def stored(v, like):
    """``v`` rounded to the dtype of the array ``like`` (float32 or float64), as a float64: an update
    that overflows float32 is inf here, though finite in the float64 it was computed in."""
    return np.float64(np.float32(v)) if like.itemsize == 4 else v


@kernel
def quadratic_delta(a, y, dz):
    """``dz = (a - y) * a * (1 - a)``, the output layer's pre-activation delta; returns the mean loss.

    ``a - y`` is the lab's ``cost_derivative``; the loss is the batch mean of 0.5 * ||a - y||^2.
    """
    batch, n = a.shape
    tiny = smallest_normal(dz)
    loss = 0.0
    for i in range(batch):
        for j in range(n):
            e = a[i, j] - y[i, j]
            aij = np.float64(a[i, j])                 # float64 in Python too (NumPy 2 keeps float32)
            v = np.float64(e) * aij * (1.0 - aij)
            dz[i, j] = v if abs(v) >= tiny else 0.0           # no subnormal deltas, as in dense.py
            loss += 0.5 * np.float64(e) * e
    return loss / batch


@kernel
def squared_error_delta(a, y, dz):
    """``dz = a - y``, the pre-activation delta of an identity (linear) output under ``0.5 * ||a - y||^2``;
    returns that loss's mean over the batch.  Computed in float64; subnormal deltas are flushed to 0."""
    batch, n = a.shape
    tiny = smallest_normal(dz)
    loss = 0.0
    for i in range(batch):
        for j in range(n):
            e = np.float64(a[i, j]) - np.float64(y[i, j])
            dz[i, j] = e if abs(e) >= tiny else 0.0
            loss += 0.5 * e * e
    return loss / batch


@kernel
def cross_entropy_delta(logp, y, dz):
    """``dz = exp(logp) - y``, the softmax output's pre-activation delta; returns the mean
    cross-entropy ``-sum(y * logp)`` over the batch.  Subnormal deltas are flushed to 0."""
    batch, n = logp.shape
    tiny = smallest_normal(dz)
    loss = 0.0
    for i in range(batch):
        for j in range(n):
            v = math.exp(np.float64(logp[i, j])) - np.float64(y[i, j])   # libm's exp, compiled or not
            dz[i, j] = v if abs(v) >= tiny else 0.0
            if y[i, j] != 0:
                loss -= np.float64(y[i, j]) * logp[i, j]
    return loss / batch


@kernel
def label_sums(p, labels, act, sums):
    """Over the rows of a net's output ``p`` (batch, n) and their class indices ``labels`` (batch,), in
    float64: ``sums[0] +=`` the rows' loss and ``sums[1] +=`` the rows whose arg-max (the first, as NumPy's)
    is their label.  The loss is the one the output code ``act`` names, against one-hot rows:
    ``-log max(p_label, tiny)`` for ``LOG_SOFTMAX`` (``p`` holds probabilities), else ``0.5 ||p - y||^2``."""
    batch, n = p.shape
    tiny = 2.2250738585072014e-308
    for i in range(batch):
        pi, label = p[i], labels[i]
        top = 0
        for j in range(1, n):
            top = j if pi[j] > pi[top] else top
        sums[1] += 1.0 if top == label else 0.0
        if act == LOG_SOFTMAX:
            q = np.float64(pi[label])
            sums[0] -= math.log(q if q > tiny else tiny)
        else:
            for j in range(n):
                e = np.float64(pi[j]) - (1.0 if j == label else 0.0)
                sums[0] += 0.5 * e * e


@kernel
def target_sums(out, y, mean, sums):
    """Over the rows of a regression net's output ``out`` and targets ``y`` (batch, n), per output ``j``, in
    float64: ``sums[0, j] += (out - y)^2`` and ``sums[1, j] += (y - mean[j])^2``: R²'s two sums."""
    batch, n = out.shape
    for i in range(batch):
        oi, yi = out[i], y[i]
        for j in range(n):
            e = np.float64(oi[j]) - np.float64(yi[j])
            c = np.float64(yi[j]) - mean[j]
            sums[0, j] += e * e
            sums[1, j] += c * c


@kernel
def all_finite(x):
    """True when no element of the C-contiguous array ``x`` is NaN or inf."""
    flat = x.ravel()                                   # a view: x is C-contiguous
    bad = 0
    for i in range(flat.shape[0]):
        v = flat[i]
        bad |= np.int64((v - v) != 0.0)
    return bad == 0


@kernel
def sgd_step(p, g, eta, blocks):
    """``p -= eta * g`` over the index ranges ``blocks`` (k, 2) of the 1-D arrays, unless a
    result would be NaN or inf in ``p``'s dtype: then nothing changes.  Returns True when applied.

    Only the blocks are read: gaps between them (alignment padding) may hold anything.
    Each block is a slice, so its loop is a plain vectorised one (indexing the whole arrays
    with the block's bounds measured 4x slower).
    """
    bad = 0
    for k in range(blocks.shape[0]):
        pk, gk = p[blocks[k, 0]:blocks[k, 1]], g[blocks[k, 0]:blocks[k, 1]]
        for i in range(pk.shape[0]):
            v = stored(pk[i] - np.float64(eta) * np.float64(gk[i]), p)
            bad |= np.int64((v - v) != 0.0)
    if bad != 0:
        return False
    for k in range(blocks.shape[0]):
        pk, gk = p[blocks[k, 0]:blocks[k, 1]], g[blocks[k, 0]:blocks[k, 1]]
        for i in range(pk.shape[0]):
            pk[i] = pk[i] - np.float64(eta) * np.float64(gk[i])
    return True


@kernel
def accumulate(acc, g, blocks):
    """``acc += g`` over the index ranges ``blocks`` (k, 2) of the 1-D arrays; gaps are left alone."""
    for k in range(blocks.shape[0]):
        ak, gk = acc[blocks[k, 0]:blocks[k, 1]], g[blocks[k, 0]:blocks[k, 1]]
        for i in range(ak.shape[0]):
            ak[i] += gk[i]


@kernel
def sum_squares(x):
    """The sum of squares of the C-contiguous array ``x``, accumulated in float64."""
    flat = x.ravel()
    total = 0.0
    for i in range(flat.shape[0]):
        v = np.float64(flat[i])
        total += v * v
    return total
