"""Drop-in replacements for the lab's ``Network`` and ``NetworkWithCheckpointing``."""
import os
import time
import warnings

import numpy as np
import psutil

from fastckpt.kernels import dense_forward, dense_forward_log_softmax, sgd_step

from ._checks import as_batch, check_dtype, check_eta, check_finite, check_positive_int, check_sizes
from .engine import Engine
from .schedule import param_blocks, param_layout
from .strategies import EveryNth, Plain, parse_strategy
from .strategies import plan as make_plan

_EVAL_CHUNK = 4096  # rows per forward pass in evaluate()
_DRAW_CHUNK = 32768  # normals drawn per call at initialisation (same stream as one big draw)


class Network:
    """A fully connected sigmoid network trained by SGD on the quadratic loss.

    Parameters
    ----------
    sizes : sequence of int
        Units per layer, input first, e.g. ``[784, 40, 30, 10]``.
    dtype : {numpy.float64, numpy.float32}, optional
        Precision of parameters and activations.  Parameters are drawn in
        float64 exactly as the lab does (biases, then weights, with
        ``np.random.randn``), so the same ``np.random.seed`` gives the same
        starting network, then cast.

    Attributes
    ----------
    num_layers, sizes : int, list of int
    biases : list of numpy.ndarray
        ``biases[i]`` has shape (sizes[i+1], 1).
    weights : list of numpy.ndarray
        ``weights[i]`` has shape (sizes[i+1], sizes[i]).  Training updates
        weights and biases in place; they are views of one flat buffer, and
        arrays assigned to them are copied into it.
    """

    def __init__(self, sizes, *, dtype=np.float64, optimizer_in_backward=False, loss="quadratic", l2=0.0):
        sizes = check_sizes(sizes)
        self.dtype = check_dtype(dtype)
        if loss not in ("quadratic", "cross_entropy"):
            raise ValueError(f"loss must be 'quadratic' (sigmoid output) or 'cross_entropy' (softmax output), "
                             f"got {loss!r}")
        self.loss = loss
        self.l2 = _check_l2(l2, len(sizes) - 1)
        if not isinstance(optimizer_in_backward, (bool, np.bool_)):
            raise TypeError(f"optimizer_in_backward must be True or False, got {optimizer_in_backward!r}")
        self.optimizer_in_backward = bool(optimizer_in_backward)
        self.num_layers = len(sizes)
        self.sizes = list(sizes)
        self._flat, self._weight_views, self._bias_views = self._flat_buffer()
        self._blocks = param_blocks(self.sizes, self.dtype.itemsize)   # what SGD updates: no padding
        for view in self._bias_views + self._weight_views:     # the lab's draw order
            _draw_normal(view.reshape(-1))
        self.biases = list(self._bias_views)
        self.weights = list(self._weight_views)
        self._engine = None
        self._grads = None
        self._param_key = None
        self.last_loss = None

    def _flat_buffer(self):
        """A zeroed flat buffer and its (n_out, n_in) and (n_out, 1) per-layer views."""
        offsets, total = param_layout(self.sizes, self.dtype.itemsize)
        flat = np.zeros(total, dtype=self.dtype)
        w, b = [], []
        for (w_at, b_at), n_in, n_out in zip(offsets, self.sizes[:-1], self.sizes[1:]):
            w.append(flat[w_at:w_at + n_out * n_in].reshape(n_out, n_in))
            b.append(flat[b_at:b_at + n_out].reshape(n_out, 1))
        return flat, w, b

    # -- the schedule -----------------------------------------------------------------------
    strategy = Plain()

    def plan(self, batch_size):
        """The :class:`~fastckpt.schedule.Plan` a training step of ``batch_size`` samples follows."""
        return make_plan(self.sizes, batch_size, self.dtype, self.strategy,
                         optimizer_in_backward=self.optimizer_in_backward)

    def _engine_for(self, batch):
        if self._engine is None or self._engine.plan.batch_size < batch:
            self._engine = None                      # free the old workspace first
            self._engine = Engine(self.plan(batch), self.loss, self.l2)
        return self._engine

    # -- parameters -------------------------------------------------------------------------
    def _params(self):
        """Weights (2-D) and biases (1-D) as views of the flat buffer, re-synced when replaced."""
        key = (id(self.weights), id(self.biases), *map(id, self.weights), *map(id, self.biases))
        if key != self._param_key:
            n = self.num_layers - 1
            if len(self.weights) != n or len(self.biases) != n:
                raise ValueError(f"weights and biases must hold {n} arrays each, "
                                 f"got {len(self.weights)} and {len(self.biases)}")
            new_w = [self._param(w, view, f"weights[{i}]") for i, (w, view) in
                     enumerate(zip(self.weights, self._weight_views))]
            new_b = [self._param(b, view, f"biases[{i}]") for i, (b, view) in
                     enumerate(zip(self.biases, self._bias_views))]
            for view, value in zip(self._weight_views + self._bias_views, new_w + new_b):
                if value is not view:
                    view[...] = value
            self.weights = list(self._weight_views)
            self.biases = list(self._bias_views)
            self._param_key = (id(self.weights), id(self.biases), *map(id, self.weights), *map(id, self.biases))
            self._bias_rows = [b.reshape(-1) for b in self._bias_views]
        return self._weight_views, self._bias_rows

    def _param(self, value, view, name):
        """``value`` checked against the shape of ``view`` (the view itself if unchanged)."""
        if value is view:
            return view
        arr = np.asarray(value)
        if arr.dtype.kind not in "biuf":
            raise TypeError(f"{name} must hold real numbers, got dtype {arr.dtype}")
        if arr.shape != view.shape and arr.ndim == 1 and view.shape[1] == 1:
            arr = arr.reshape(-1, 1)
        if arr.shape != view.shape:
            raise ValueError(f"{name} must have shape {view.shape}, got {arr.shape}")
        check_finite(np.ascontiguousarray(arr), name)
        return arr

    def _grad_buffers(self):
        """Gradient views (per-layer weights, flat biases) and the flat gradient buffer.

        Training keeps them at the top of the engine's workspace (NOTE [ Gradients in
        the arena ]); with the optimizer in backward the plan has none, and backprop
        gets a buffer of its own.
        """
        if not self.optimizer_in_backward and self._engine is not None:
            flat, w, b = self._engine.workspace.gradients()
            return w, b, flat
        if self._grads is None:
            flat, w, b = self._flat_buffer()
            self._grads = (w, [v.reshape(-1) for v in b], flat)
        return self._grads

    # -- training ---------------------------------------------------------------------------
    def _batch(self, x, y, x_name, y_name, engine=None):
        """The engine for this batch size (or the one given) and x, y checked, in its dtype and layout."""
        xb = as_batch(x, self.sizes[0], x_name, "input")
        yb = as_batch(y, self.sizes[-1], y_name, "output")
        if xb.shape[0] != yb.shape[0]:
            raise ValueError(f"{x_name} has {xb.shape[0]} samples but {y_name} has {yb.shape[0]}")
        engine = self._engine_for(xb.shape[0]) if engine is None else engine
        out = []
        for arr, name in ((xb, x_name), (yb, y_name)):
            if arr.dtype != self.dtype or not arr.flags.c_contiguous:
                stage = engine.workspace.stage(name, arr.shape[0], arr.shape[1])
                with np.errstate(over="ignore"):         # overflow to inf is reported below
                    np.copyto(stage, arr, casting="unsafe")
                arr = stage
            check_finite(arr, name)
            out.append(arr)
        return engine, out[0], out[1]

    def _gradients(self, x, y, x_name, y_name):
        engine, xb, yb = self._batch(x, y, x_name, y_name)
        w2, b1 = self._params()
        gw, gb, _ = self._grad_buffers()
        self.last_loss = engine.step(xb, yb, w2, b1, gw, gb)
        return engine

    def backprop(self, x_batch, y_batch):
        """Batch-mean gradients ``(nabla_b, nabla_w)`` in the lab's shapes.

        ``x_batch`` is (batch, n_in) or the lab's (batch, n_in, 1); ``y_batch`` likewise.
        """
        self._gradients(x_batch, y_batch, "x_batch", "y_batch")
        gw, gb, _ = self._grad_buffers()
        return [b.reshape(-1, 1).copy() for b in gb], [w.copy() for w in gw]

    def update_mini_batch(self, x_mini_batch, y_mini_batch, eta):
        """One SGD step on the batch-mean gradient; parameters are updated in place."""
        eta = check_eta(eta)
        if self.optimizer_in_backward:
            engine, xb, yb = self._batch(x_mini_batch, y_mini_batch, "x_mini_batch", "y_mini_batch")
            w2, b1 = self._params()
            self.last_loss = engine.step(xb, yb, w2, b1, eta=eta)
            return
        self._gradients(x_mini_batch, y_mini_batch, "x_mini_batch", "y_mini_batch")
        if not sgd_step(self._flat, self._grad_buffers()[2], eta, self._blocks):
            raise FloatingPointError("the update would make a parameter NaN or inf; weights left unchanged")

    def cost_derivative(self, output_activations, y):
        return output_activations - y

    # -- inference --------------------------------------------------------------------------
    def _forward(self, a, start, end):
        """[a, a[start+1], ..., a[end]] for a (batch, sizes[start]) array, fresh arrays."""
        w2, b1 = self._params()
        scratch = np.empty(max(self.sizes[1:]), dtype=np.float64)
        outs = [a]
        for layer in range(start, end):
            out = np.empty((a.shape[0], self.sizes[layer + 1]), dtype=self.dtype)
            if self.loss == "cross_entropy" and layer == self.num_layers - 2:
                dense_forward_log_softmax(a, w2[layer], b1[layer], scratch, out)
                np.exp(out, out=out)                             # probabilities for the caller
            else:
                dense_forward(a, w2[layer], b1[layer], scratch, out)
            outs.append(out)
            a = out
        return outs

    def _as_input(self, a, width, name):
        """(batch, width) contiguous array in the network's dtype, and how to shape results."""
        arr = np.asarray(a)
        if arr.ndim == 1 and arr.shape[0] == width:
            layout = "vector"
            arr = arr.reshape(1, width)
        elif arr.ndim == 2 and arr.shape == (width, 1):
            layout = "column"
            arr = arr.reshape(1, width)
        else:
            layout = "batch3" if arr.ndim == 3 else "batch"
        arr = as_batch(arr, width, name, "input" if width == self.sizes[0] else "receiving")
        arr = np.ascontiguousarray(arr, dtype=self.dtype)
        check_finite(arr, name)
        return arr, layout

    @staticmethod
    def _shape_like(out, layout):
        if layout == "vector":
            return out.reshape(-1)
        if layout == "column":
            return out.reshape(-1, 1)
        if layout == "batch3":
            return out[:, :, None]
        return out

    def feedforward(self, a):
        """Network output for one (n_in, 1) column, one (n_in,) vector or a batch."""
        arr, layout = self._as_input(a, self.sizes[0], "a")
        return self._shape_like(self._forward(arr, 0, self.num_layers - 1)[-1], layout)

    def evaluate(self, x_test_data, y_test_data):
        """Fraction of samples whose arg-max output matches the label (one-hot or integer)."""
        x = as_batch(x_test_data, self.sizes[0], "x_test_data", "input")
        y = np.asarray(y_test_data)
        if y.ndim == 3 and y.shape[2] == 1:
            y = y[:, :, 0]
        if y.ndim == 2:
            y = as_batch(y, self.sizes[-1], "y_test_data", "output").argmax(axis=1)
        elif y.ndim != 1 or y.dtype.kind not in "iu":
            raise ValueError(f"y_test_data must be one-hot (n, {self.sizes[-1]}) or integer labels (n,), "
                             f"got shape {y.shape} and dtype {y.dtype}")
        if y.shape[0] != x.shape[0]:
            raise ValueError(f"x_test_data has {x.shape[0]} samples but y_test_data has {y.shape[0]}")
        hits = 0
        for i in range(0, x.shape[0], _EVAL_CHUNK):
            chunk = np.ascontiguousarray(x[i:i + _EVAL_CHUNK], dtype=self.dtype)
            check_finite(chunk, "x_test_data")
            out = self._forward(chunk, 0, self.num_layers - 1)[-1]
            hits += int(np.count_nonzero(out.argmax(axis=1) == y[i:i + _EVAL_CHUNK]))
        return hits / x.shape[0]

    # -- the lab's training loop ------------------------------------------------------------
    def SGD(self, training_data, epochs, mini_batch_size, eta, test_data=None, *,
            drop_last=True, verbose=True, progress=None):
        """The lab's loop: mini-batches in order, accuracy per epoch; returns (memusage, updatetime).

        ``memusage`` is the process RSS (bytes) before each update and
        ``updatetime`` its duration (s), as in the lab.  Like the lab,
        ``drop_last=True`` skips the samples after the last full mini-batch (with
        a warning saying how many); ``drop_last=False`` trains on them too.
        The accuracies are kept in ``self.accuracies``.  ``progress``, if given,
        is called as ``progress(epoch, updates_done, updates_per_epoch)`` after
        every update.
        """
        x_train, y_train, epochs, mini_batch_size, eta = check_training(
            self, training_data, epochs, mini_batch_size, eta)
        n = len(x_train)
        starts = list(range(0, n - mini_batch_size + 1, mini_batch_size))
        if not drop_last and n % mini_batch_size:
            starts.append(starts[-1] + mini_batch_size)
        elif n % mini_batch_size:
            warnings.warn(f"SGD: the last {n % mini_batch_size} of {n} training samples do not fill a "
                          f"mini-batch of {mini_batch_size} and are skipped every epoch, as in the lab; "
                          "pass drop_last=False to train on them", stacklevel=2)

        def update(group):
            s = group[0]
            self.update_mini_batch(x_train[s:s + mini_batch_size], y_train[s:s + mini_batch_size], eta)
        return run_epochs(self, epochs, [[s] for s in starts], update, test_data, verbose, progress)


class NetworkWithCheckpointing(Network):
    """A :class:`Network` whose backprop keeps only some activations and recomputes the rest.

    Parameters
    ----------
    sizes : sequence of int
        Units per layer, input first.
    checkpoint_every_nth_layer : int, optional
        The lab's rule (default 2): keep the inputs of layers 0, n, 2n, ...
        after the forward pass and recompute every other activation at most
        once during backprop.  1 is plain backprop.  Same as
        ``strategy="every_nth(n)"``.
    strategy : Strategy or str, optional
        Any strategy of :func:`fastckpt.plan` instead: ``"sqrt"``,
        ``"segments(8)"``, ``"revolve(4)"``, ``"budget(24MiB)"``, ...
        Give this or ``checkpoint_every_nth_layer``, not both.
    dtype : {numpy.float64, numpy.float32}, optional
    optimizer_in_backward : bool, optional
        See :class:`Network`.
    """

    def __init__(self, sizes, checkpoint_every_nth_layer=None, *args, strategy=None, **kwargs):
        super().__init__(sizes, *args, **kwargs)
        if strategy is not None and checkpoint_every_nth_layer is not None:
            raise ValueError(f"give checkpoint_every_nth_layer or strategy, not both; got "
                             f"{checkpoint_every_nth_layer!r} and {strategy!r}")
        if strategy is None:
            n = 2 if checkpoint_every_nth_layer is None else checkpoint_every_nth_layer
            strategy = EveryNth(check_positive_int(n, "checkpoint_every_nth_layer"))
        self.strategy = parse_strategy(strategy)
        self.strategy.tree(self.sizes, 1, self.dtype.itemsize)      # refuse e.g. segments(k > L) now
        self.checkpoint_every_nth_layer = getattr(self.strategy, "n", None)

    @property
    def checkpoints_layer_idx(self):
        """Layers whose input is kept after the forward pass: the lab's 0, n, 2n, ... for
        ``every_nth(n)``; for other strategies, those of the plan in use (batch 1 before any step)."""
        if isinstance(self.strategy, EveryNth):
            return list(range(0, self.num_layers - 1, self.strategy.n))
        plan = self._engine.plan if self._engine is not None else self.plan(1)
        return [j for j in plan.kept if j < self.num_layers - 1]

    def forward_between_checkpoints(self, a, layer_idx_start, layer_idx_end):
        """Activations ``[a, a[start+1], ..., a[end]]`` from ``a``, the input of layer ``start``.

        ``a`` may be a batch (batch, n) or (batch, n, 1), or one (n, 1) column;
        results have the same layout.  Uses the same kernel as backprop, so the
        values are bit-identical to the ones training computes.
        """
        n = self.num_layers - 1
        start = check_positive_int(layer_idx_start, "layer_idx_start", minimum=0)
        end = check_positive_int(layer_idx_end, "layer_idx_end", minimum=0)
        if not start <= end <= n:
            raise ValueError(f"need 0 <= layer_idx_start <= layer_idx_end <= {n}, got {start} and {end}")
        arr, layout = self._as_input(a, self.sizes[start], "a")
        outs = self._forward(arr, start, end)
        return [a] + [self._shape_like(o, layout) for o in outs[1:]]


def check_training(net, training_data, epochs, mini_batch_size, eta):
    """The lab loop's arguments checked: (x, y, epochs, mini_batch_size, eta)."""
    x_train, y_train = _pair(training_data, "training_data")
    epochs = check_positive_int(epochs, "epochs", minimum=0)
    mini_batch_size = check_positive_int(mini_batch_size, "mini_batch_size")
    eta = check_eta(eta)
    as_batch(x_train, net.sizes[0], "training_data[0]", "input")
    as_batch(y_train, net.sizes[-1], "training_data[1]", "output")
    n = len(x_train)
    if len(y_train) != n:
        raise ValueError(f"training_data[0] has {n} samples but training_data[1] has {len(y_train)}")
    if mini_batch_size > n:
        raise ValueError(f"mini_batch_size must be <= the {n} training samples, got {mini_batch_size}")
    return x_train, y_train, epochs, mini_batch_size, eta


def run_epochs(net, epochs, groups, update, test_data, verbose, progress=None):
    """The lab's loop over ``update(group)`` for each group of mini-batch starts, every epoch.

    Records the process RSS before each update and its duration, evaluates and
    prints per epoch as the lab does; returns (memusage, updatetime).
    """
    if test_data is not None:
        x_test, y_test = _pair(test_data, "test_data")
    process = psutil.Process(os.getpid())
    memusage, updatetime = [], []
    net.accuracies = []
    for j in range(epochs):
        for i, group in enumerate(groups):
            t0 = time.perf_counter()
            memusage.append(process.memory_info().rss)
            try:
                update(group)
            except FloatingPointError as exc:
                raise FloatingPointError(f"training stopped at epoch {j}, update {i}: {exc}") from exc
            updatetime.append(time.perf_counter() - t0)
            if progress is not None:
                progress(j, i + 1, len(groups))
        if test_data is not None:
            acc = net.evaluate(x_test, y_test)
            net.accuracies.append(acc)
            if verbose:
                print("Epoch: {0}, Accuracy: {1}".format(j, acc), flush=True)
        elif verbose:
            print("Epoch: {0}".format(j), flush=True)
    return memusage, updatetime


def _check_l2(l2, n_layers):
    """One non-negative finite float per layer."""
    values = list(l2) if np.ndim(l2) == 1 else [l2] * n_layers
    if len(values) != n_layers:
        raise ValueError(f"l2 must be one number or one per layer ({n_layers}), got {len(values)} values")
    out = []
    for v in values:
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise TypeError(f"l2 must hold real numbers, got {v!r}") from None
        if not np.isfinite(f) or f < 0:
            raise ValueError(f"l2 must be finite and >= 0, got {v!r}")
        out.append(f)
    return tuple(out)


def _draw_normal(out):
    """Fill the 1-D ``out`` from ``np.random.randn`` in chunks: the same numbers as one draw of
    its size (the legacy generator keeps its spare normal between calls), without a
    float64 temporary the size of the largest layer."""
    for i in range(0, out.shape[0], _DRAW_CHUNK):
        part = out[i:i + _DRAW_CHUNK]
        part[...] = np.random.randn(part.shape[0])


def _pair(data, name):
    try:
        x, y = data
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a pair (x, y), got {type(data).__name__}") from None
    return x, y
