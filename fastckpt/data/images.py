"""Images kept as the bytes they come as, read as the lab's floats a minibatch at a time.

A 60,000-image MNIST training set is 47 MB as uint8 and 376 MB as the lab's float64;
:class:`Images` keeps the uint8 bytes and stands for ``raw / 255.0``.  fastckpt's
training, evaluation and prediction convert each minibatch (or evaluation chunk) straight
into the workspace's staging rows, computing ``raw / 255.0`` in float64 and rounding to the
net's dtype, so a net trains on :class:`Images` bit for bit as on the lab's float64 arrays.
Everywhere else it behaves as a read-only 2-D float64 array: ``np.asarray(images)`` and
``images[i]`` give the float values, a slice of rows is :class:`Images` again (no copy).
"""
import numpy as np


class Images:
    """``raw / divisor`` as float64, stored as ``raw`` (a C-contiguous (n, width) uint8 array)."""

    __array_priority__ = 10.0                     # numpy asks us (through __array__) before mixing us in

    def __init__(self, raw, divisor=255.0):
        raw = np.asarray(raw)
        if raw.dtype != np.uint8 or raw.ndim != 2:
            raise ValueError(f"raw must be a 2-D uint8 array, got {raw.dtype} of shape {raw.shape}")
        self.raw = np.ascontiguousarray(raw)
        self.divisor = float(divisor)
        self.raw.flags.writeable = False

    shape = property(lambda self: self.raw.shape)
    ndim = 2
    dtype = np.dtype(np.float64)
    size = property(lambda self: self.raw.size)
    nbytes = property(lambda self: self.raw.nbytes)          # what it holds, not what it stands for

    def __len__(self):
        return self.raw.shape[0]

    def __repr__(self):
        return f"Images({self.raw.shape[0]} x {self.raw.shape[1]} uint8, read as raw / {self.divisor:g})"

    def __getitem__(self, key):
        """A slice of rows (step 1) is Images again, a view; anything else the float64 values."""
        if isinstance(key, slice) and key.step in (None, 1):
            return Images(self.raw[key], self.divisor)
        return np.divide(self.raw[key], self.divisor)

    def __array__(self, dtype=None, copy=None):
        if copy is False:
            raise ValueError("Images stands for raw / divisor: its float values are always a new array")
        return self.into(np.empty(self.raw.shape, dtype=dtype or np.float64))

    def astype(self, dtype, copy=True):
        return self.__array__(dtype)

    def into(self, out):
        """``raw / divisor`` computed in float64 and rounded into ``out`` (a float array of this shape)."""
        np.divide(self.raw, self.divisor, out=out, casting="unsafe")
        return out

    def __reduce__(self):
        return Images, (self.raw, self.divisor)
