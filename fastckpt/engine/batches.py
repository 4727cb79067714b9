"""Minibatches as the kernels take them: checked, C-contiguous, in the net's dtype, labels one-hot.

One :class:`Staging` per workspace (or trainer) holds the buffers that inputs
of another dtype or layout, and integer labels, are converted into: made on
first need at the largest batch, then reused, so a step allocates nothing.
"""
import numpy as np

from fastckpt.core.checks import as_batch, as_targets, one_hot_into
from fastckpt.data.images import Images
from fastckpt.kernels import scale_into


class Staging:
    """Buffers of up to ``rows`` rows of ``dtype`` that minibatches are converted into."""

    def __init__(self, rows, dtype):
        self.rows, self.dtype = int(rows), np.dtype(dtype)
        self._buffers = {}

    def buffer(self, name, rows, width):
        """A (rows, width) view of the buffer for ``name`` (allocated on first need)."""
        key = (name, width)
        if key not in self._buffers:
            self._buffers[key] = np.empty((self.rows, width), dtype=self.dtype)
        return self._buffers[key][:rows]

    def minibatch(self, x, y, n_in, n_out, names=("x", "y"), *, grow=False, use=(True, True)):
        """``x`` (batch, n_in) and ``y`` (batch, n_out) or integer labels (batch,), checked and converted.

        The lab's (batch, n, 1) is accepted too.  A batch of more than ``rows``
        is refused unless ``grow``, which makes the buffers anew for it.  Of the
        two, only those ``use`` says are converted (a pipeline stage reads x or
        y, or neither); the others are returned checked but as they are.
        Finiteness is not checked here: the step's own kernel does it.
        """
        if ready(x, n_in, self.dtype) and ready(y, n_out, self.dtype) and x.shape[0] == y.shape[0] <= self.rows:
            return x, y                                   # rows as the kernels take them: nothing to check or copy
        x_name, y_name = names
        xb = as_batch(x, n_in, x_name, "input")
        yb = as_targets(y, n_out, y_name)
        if xb.shape[0] != yb.shape[0]:
            raise ValueError(f"{x_name} has {xb.shape[0]} samples but {y_name} has {yb.shape[0]}")
        if xb.shape[0] > self.rows:
            if not grow:
                raise ValueError(f"{x_name} has {xb.shape[0]} samples, more than the {self.rows} this engine's "
                                 "plan is for")
            self._buffers, self.rows = {}, xb.shape[0]
        staged_y = yb.ndim == 1 and use[1]
        if staged_y:                                     # integer labels: one-hot rows in a staging buffer
            yb = one_hot_into(yb, self.buffer(y_name, yb.shape[0], n_out))
        return ((self.converted(xb, x_name) if use[0] else xb),
                (self.converted(yb, y_name) if use[1] and not staged_y else yb))

    def copied(self, arr, name):
        """``arr``'s values in the buffer for ``name``."""
        out = self.buffer(name, arr.shape[0], arr.shape[1])
        out[...] = arr
        return out

    def holds(self, arr):
        """Whether ``arr`` is rows of one of the staging buffers (a minibatch was converted into it)."""
        return any(np.may_share_memory(arr, buf) for buf in self._buffers.values())

    def converted(self, arr, name):
        """``arr`` itself if C-contiguous in our dtype, else its values in the buffer for ``name``
        (:class:`~fastckpt.data.images.Images` computed into it from their bytes)."""
        if isinstance(arr, Images):                     # Images.into, without the GIL
            return scale_into(arr.raw, arr.divisor, self.buffer(name, arr.shape[0], arr.shape[1]))
        if arr.dtype == self.dtype and arr.flags.c_contiguous:
            return arr
        stage = self.buffer(name, arr.shape[0], arr.shape[1])
        with np.errstate(over="ignore"):                 # overflow to inf is reported by the finiteness check
            np.copyto(stage, arr, casting="unsafe")
        return stage


def ready(a, width, dtype):
    """Whether ``a`` is already (batch >= 1, width) C-contiguous rows of ``dtype`` (a plain ndarray)."""
    return type(a) is np.ndarray and a.ndim == 2 and a.shape[1] == width and a.shape[0] > 0 and \
        a.dtype == dtype and a.flags.c_contiguous
