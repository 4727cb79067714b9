"""The parameters of a network: one flat buffer, and the lab's per-layer views of it.

NOTE [ One owner ]
The kernels update one flat buffer in the layout of
:func:`fastckpt.core.layout.param_layout`; the lab's ``weights[i]`` (n_out, n_in)
and ``biases[i]`` (n_out, 1) are views of it, and :class:`Parameters` is the
only object that holds the buffer.  Nothing else keeps a copy in step:

* ``weights[i]`` returns the view, so ``net.weights[0][2, 3] += 1e-5`` changes
  the net, as in the lab.
* ``weights[i] = value`` copies ``value`` in, after checking its shape and
  that it is finite in the stored dtype.  A value that is itself a view of
  this buffer (``w[0], w[1] = w[1], w[0]``) is copied when it is assigned and
  written at the next access to the parameters, so the values of one swap
  statement are all read before any is written, as a Python user expects.
* ``weights = [...]`` assigns every layer at once, all checked before any is
  written.
* copying (``copy.copy``, ``copy.deepcopy``) or pickling gives an
  independent buffer with its own views.
* ``lock`` is held by every operation that reads or writes the parameters
  of a step, so threads sharing a net take turns (see :class:`Network`).
"""
from collections.abc import Sequence

import numpy as np

from fastckpt.kernels import all_finite, sgd_step

from .checks import check_dtype, check_eta, check_sizes, nonfinite_error, refuse_masked
from .layout import layer_views, param_blocks, param_layout
from .locks import Refused, params_lock
from .resources import machine_bytes, shown_bytes


class Parameters:
    """Weights and biases of a chain of dense layers in one flat buffer.

    Parameters
    ----------
    sizes : sequence of int
        Units per layer, input first.
    dtype : {numpy.float32, numpy.float64}
        Precision of the stored parameters.

    Attributes
    ----------
    weights, biases : sequence-like
        The lab's views: ``weights[i]`` (n_out, n_in) and ``biases[i]`` (n_out, 1).
    blocks : numpy.ndarray
        (2 L, 2) int64 ``[start, end)`` element ranges of every weight and
        bias in :attr:`flat`; the gaps between them are alignment padding.
    lock : threading.RLock
        Held while a step reads or writes the parameters.
    """

    def __init__(self, sizes, dtype=np.float64):
        self.sizes = check_sizes(sizes)
        self.dtype = check_dtype(dtype)
        elems = param_layout(self.sizes, self.dtype.itemsize)[1]
        need = elems * self.dtype.itemsize
        if need > machine_bytes():
            raise MemoryError(f"sizes {list(self.sizes)}: the parameters alone take {need} bytes ({shown_bytes(need)}) "
                              f"in {self.dtype.name}, more than this machine's memory ({shown_bytes(machine_bytes())})")
        self._flat = np.zeros(elems, dtype=self.dtype)
        self._setup()

    def _setup(self):
        self._w, self._b = layer_views(self._flat, self.sizes)          # (n_out, n_in) and (n_out,) per layer
        self._views = {"weights": self._w, "biases": [b.reshape(-1, 1) for b in self._b]}
        self.blocks = param_blocks(self.sizes, self.dtype.itemsize)
        self.lock = params_lock(self)           # NOTE [ A fork inside a step ]
        self._pending = {}                     # (kind, layer) -> checked copy, written at the next access
        self.weights = LayerList(self, "weights")
        self.biases = LayerList(self, "biases")

    @property
    def n_layers(self):
        return len(self.sizes) - 1

    # -- reading ---------------------------------------------------------------------------
    @property
    def flat(self):
        """The flat buffer itself (not a copy), with every pending assignment written."""
        if self._pending or type(self.lock) is Refused:      # the lock refuses: NOTE [ A fork inside a step ]
            self._flush()
        return self._flat

    def layers(self):
        """Per-layer weights (n_out, n_in) and biases (n_out,), views for the kernels."""
        if self._pending or type(self.lock) is Refused:
            self._flush()
        return self._w, self._b

    def view(self, kind, layer):
        """``weights[layer]`` or ``biases[layer]`` in the lab's shape."""
        if self._pending or type(self.lock) is Refused:
            self._flush()
        return self._views[kind][layer]

    def check_buffer(self, buf, name):
        """Refuse ``buf`` unless it is a flat buffer of this layout: 1-D, C-contiguous, of the stored dtype."""
        if not isinstance(buf, np.ndarray) or buf.shape != self._flat.shape or buf.dtype != self.dtype \
                or not buf.flags.c_contiguous:
            got = f"shape {buf.shape} of {buf.dtype}" if isinstance(buf, np.ndarray) else type(buf).__name__
            raise ValueError(f"{name} must be a flat {self.dtype.name} buffer of {self._flat.shape[0]} numbers "
                             f"(Parameters.new_buffer()), got {got}")
        return buf

    def new_buffer(self):
        """A zeroed flat buffer in the same layout and dtype (for gradients or their sums)."""
        return np.zeros_like(self._flat)

    # -- writing ---------------------------------------------------------------------------
    def assign(self, kind, layer, value):
        """``weights[layer] = value`` or ``biases[layer] = value``: check, then copy the values in."""
        with self.lock:
            view = self._views[kind][layer]
            if value is view and (kind, layer) not in self._pending:
                return
            arr = self._checked(kind, layer, value)
            if np.may_share_memory(arr, self._flat):
                self._pending[(kind, layer)] = arr.copy()
            else:
                self._pending.pop((kind, layer), None)
                view[...] = arr

    def assign_all(self, kind, values):
        """``weights = values``: one array per layer, every one checked before any is written."""
        with self.lock:
            values = list(values) if not isinstance(values, np.ndarray) else [values]
            if len(values) != self.n_layers:
                raise ValueError(f"{kind} must hold {self.n_layers} arrays (one per layer), got {len(values)}")
            checked = [self._checked(kind, i, v) for i, v in enumerate(values)]
            for i, arr in enumerate(checked):
                self._pending[(kind, i)] = arr.copy() if np.may_share_memory(arr, self._flat) else arr
            self._flush()

    def update(self, grad, eta):
        """``flat -= eta * grad`` over the blocks, unless a parameter would become NaN or inf in the
        stored dtype: then nothing changes and FloatingPointError is raised."""
        self.check_buffer(grad, "grad")
        eta = check_eta(eta)
        with self.lock:
            if not sgd_step(self.flat, grad, eta, self.blocks):
                raise FloatingPointError("the update would make a parameter NaN or inf; weights left unchanged")

    def copy_into(self, buf):
        """Copy every weight and bias into ``buf``, a flat buffer of :meth:`new_buffer` (a snapshot kept
        beside the parameters, as early stopping's best weights)."""
        self.check_buffer(buf, "buf")
        with self.lock:
            buf[...] = self.flat

    def restore_from(self, buf):
        """Copy a snapshot of :meth:`copy_into` back into the parameters."""
        self.check_buffer(buf, "buf")
        if not all_finite(buf):
            raise ValueError("buf holds NaN or inf: not a snapshot of these parameters")
        with self.lock:
            self.flat[...] = buf

    def _flush(self):
        with self.lock:
            pending, self._pending = self._pending, {}
            for (kind, layer), arr in pending.items():
                self._views[kind][layer][...] = arr

    def _checked(self, kind, layer, value):
        """``value`` as an array of the view's shape and the stored dtype, finite; never ``value`` cast in place."""
        name = f"{kind}[{layer}]"
        view = self._views[kind][layer]
        refuse_masked(value, name)
        arr = np.asarray(value)
        if arr.dtype.kind not in "biuf":
            raise TypeError(f"{name} must hold real numbers, got {type(value).__name__} of dtype {arr.dtype}")
        if kind == "biases" and arr.shape == view.shape[:1]:
            arr = arr.reshape(view.shape)
        if arr.shape != view.shape:
            raise ValueError(f"{name} must have shape {view.shape}, got {arr.shape}")
        if arr.dtype != self.dtype:
            with np.errstate(over="ignore"):                  # overflow to inf is refused just below
                arr = arr.astype(self.dtype)
        arr = np.ascontiguousarray(arr)
        if not all_finite(arr):
            raise nonfinite_error(f"{name} (as {self.dtype.name})", arr)
        return arr

    # -- copying ---------------------------------------------------------------------------
    def copy(self):
        """An independent copy: its own buffer and views."""
        new = Parameters.__new__(Parameters)
        new.__setstate__(self.__getstate__())
        return new

    __copy__ = copy

    def __deepcopy__(self, memo):
        return self.copy()

    def __getstate__(self):
        with self.lock:
            return {"sizes": self.sizes, "dtype": self.dtype.str, "flat": self.flat.copy()}

    def __setstate__(self, state):
        self.sizes = check_sizes(state["sizes"])
        self.dtype = check_dtype(state["dtype"])
        flat = np.asarray(state["flat"])
        expected = param_layout(self.sizes, self.dtype.itemsize)[1]
        if flat.shape != (expected,) or flat.dtype != self.dtype:
            raise ValueError(f"pickled parameters of {list(self.sizes)} need {expected} {self.dtype.name} "
                             f"numbers, got shape {flat.shape} of {flat.dtype}")
        if not all_finite(flat):
            raise ValueError(f"pickled parameters of {list(self.sizes)} hold NaN or inf")
        self._flat = np.array(flat, dtype=self.dtype, copy=True)
        self._setup()

    def __repr__(self):
        return f"Parameters(sizes={list(self.sizes)}, dtype={self.dtype.name})"


class LayerList(Sequence):
    """``net.weights`` or ``net.biases``: one view per layer; assigning copies values in (NOTE [ One owner ])."""

    def __init__(self, params, kind):
        self._params = params
        self._kind = kind

    def __len__(self):
        return self._params.n_layers

    def _index(self, i):
        n = len(self)
        try:
            k = i.__index__()
        except AttributeError:
            raise TypeError(f"{self._kind} indices must be integers or slices, got {type(i).__name__}") from None
        if not -n <= k < n:
            raise IndexError(f"{self._kind}[{k}] out of range: the net has {n} layers")
        return k % n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._params.view(self._kind, k) for k in range(len(self))[i]]
        return self._params.view(self._kind, self._index(i))

    def __setitem__(self, i, value):
        if isinstance(i, slice):
            raise TypeError(f"assign {self._kind}[i] one layer at a time, or the whole list with "
                            f"net.{self._kind} = [...]")
        self._params.assign(self._kind, self._index(i), value)

    def __delitem__(self, i):
        raise TypeError(f"a net's {self._kind} has one array per layer; it cannot lose one")

    def __add__(self, other):
        return list(self) + list(other)

    def __radd__(self, other):
        return list(other) + list(self)

    def __copy__(self):
        return list(self)

    def __deepcopy__(self, memo):
        return [v.copy() for v in self]

    def __reduce__(self):
        return list, ([v.copy() for v in self],)

    def __repr__(self):
        return repr(list(self))
