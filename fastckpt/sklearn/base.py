"""What the two estimators share: ``fit`` and ``partial_fit`` over one fastckpt :class:`~fastckpt.nets.Network`.

A thin layer: the arguments are checked (:mod:`.settings`), the data held as the engine takes it
(:mod:`.data`), and every epoch is the net's own ``SGD``, its kernels, strategy and plan; early stopping is
the engine's (NOTE [ Early stopping ]).  The fitted net is :attr:`net_`; ``coefs_`` and ``intercepts_``
are views of its parameters in scikit-learn's (n_in, n_out) layout.
"""
import threading
import warnings
import weakref

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, validate_data

from fastckpt.core.checks import check_in_range
from fastckpt.core.layout import layer_views
from fastckpt.kernels import all_finite
from fastckpt.nets import NetworkWithCheckpointing

from . import data
from .settings import checked, schedule, stopping


class BaseMLP(BaseEstimator):
    """``fit``, ``partial_fit`` and the fitted attributes; a subclass gives ``_targets`` (the engine's targets
    and the net's outputs) and the net's ``loss``."""

    loss_name = None

    # -- fitted views of the net ---------------------------------------------------------------
    @property
    def coefs_(self):
        """Each layer's weights as scikit-learn lays them out, (n_in, n_out): views of :attr:`net_`'s."""
        check_is_fitted(self, "net_")
        return [w.T for w in self.net_.weights]

    @coefs_.setter
    def coefs_(self, values):
        check_is_fitted(self, "net_")
        values = _layers_like(values, self.coefs_, "coefs_")
        self.net_.weights = [np.asarray(v).T for v in values]

    @property
    def intercepts_(self):
        """Each layer's biases, (n_out,): views of :attr:`net_`'s."""
        check_is_fitted(self, "net_")
        return [b.reshape(-1) for b in self.net_.biases]

    @intercepts_.setter
    def intercepts_(self, values):
        check_is_fitted(self, "net_")
        values = _layers_like(values, self.intercepts_, "intercepts_")
        self.net_.biases = [np.asarray(v).reshape(-1, 1) for v in values]

    @property
    def n_layers_(self):
        check_is_fitted(self, "net_")
        return self.net_.num_layers

    # -- fitting -------------------------------------------------------------------------------
    def _fit(self, X, y, incremental=False, classes=None):
        with _FITTING_LOCK:
            if self in _FITTING:
                raise RuntimeError(f"this {type(self).__name__} is being fitted in another thread: one fit at a "
                                   "time (two would mix their counts and curves); clone it for a second fit")
            _FITTING.add(self)
        try:
            return self._fit_alone(X, y, incremental, classes)
        finally:
            _FITTING.discard(self)

    def _fit_alone(self, X, y, incremental, classes):
        settings = checked(self)
        if settings["early_stopping"] and incremental:
            raise ValueError("partial_fit does not support early_stopping=True; fit does")
        saved = dict(self.__dict__)                        # what a fit refused before training puts back
        l2 = self.net_.l2 if hasattr(self, "net_") else None
        try:
            training, validation, batch, epochs, stopper, rng, fresh = self._prepared(X, y, incremental, classes,
                                                                                      settings, saved)
        except BaseException:                              # refused before training: the estimator as it was
            self.__dict__.clear()
            self.__dict__.update(saved)
            if l2 is not None:
                self.net_.l2 = l2
            raise
        saved = None                                       # a net replaced is let go before training
        if fresh:                                          # a warm start: a new optimizer, as scikit-learn's
            self.net_.optimizer_state.reset()
        self._train(training, validation, batch, epochs, settings, stopper, rng, incremental)
        return self

    def _prepared(self, X, y, incremental, classes, settings, saved):
        """The data checked, the net this fit trains (:meth:`_net_for`) and its run checked against
        ``max_memory``: ``(training, validation, batch, epochs, stopper, rng, fresh)``.  ``saved``: the
        estimator's attributes before the fit."""
        first = not hasattr(self, "net_") or (not self.warm_start and not incremental)
        given = (X, y)
        X, y = validate_data(self, X, y, accept_sparse=False, dtype="numeric", multi_output=True,
                             y_numeric=self.loss_name == "squared_error", reset=first)
        X = _floats(X, settings["dtype"], "X")
        y, n_outputs = self._targets(y, first, incremental, classes)   # (n,) class indices, or (n, outputs) rows
        y = _floats(y, settings["dtype"], "y")
        if not first and self.net_.sizes[-1] != n_outputs:
            raise ValueError(f"y has {n_outputs} outputs, but the net fitted before has {self.net_.sizes[-1]}")
        self.n_outputs_ = n_outputs
        rng = check_random_state(self.random_state)
        fresh = self._net_for(first, incremental, X.shape[1], settings, rng)
        training, validation, split_at = (X, y), None, 0
        if settings["early_stopping"]:
            training, validation = data.split(X, y, self.validation_fraction, rng,
                                              labels=y if y.ndim == 1 else None)
            split_at = data.split_bytes(len(X), y.ndim == 1)
        batch = self._batch_size(len(training[0]))
        self.net_.l2 = settings["alpha"] / batch
        epochs = 1 if incremental else settings["max_iter"]
        stopper = stopping(self, settings, incremental)
        if not first and self._stopper is not None:
            stopper.go_on(self._stopper, rate=incremental)  # scikit-learn's count goes on over the fits
        planned = self.net_.step_plan(batch)                # planned here: a refused plan puts everything back
        if settings["max_memory"] is not None:
            old = saved.get("net_")
            data.bound(settings["max_memory"], planned, training, validation, epochs=epochs,
                       arrays=(*given, X, y, *training, *(validation or ())), shuffled=settings["shuffle"],
                       best=stopper.restore_best_weights, split_at=split_at,
                       replaced=0 if old is None or old is self.net_ else _net_bytes(old))
        self.net_.engine(batch, planned)
        return training, validation, batch, epochs, stopper, rng, fresh

    def _net_for(self, first, incremental, n_in, settings, rng):
        """The net this fit trains: a new one, the fitted one built anew after ``set_params``, or the fitted
        one itself, whose optimizer starts again (True: after the bound) on a warm ``fit``."""
        if first:
            if hasattr(self, "net_"):
                self.net_.release_workspace()               # only its parameters are held while the new is made
            self._initialize(n_in, settings, rng)
            return False
        if self._rebuilt(settings, incremental):
            return False
        if not all_finite(self.net_.params.flat):
            raise ValueError("coefs_ or intercepts_ hold NaN or inf (set through them since the last fit): "
                             "a warm start or partial_fit goes on from finite weights only")
        return not incremental

    @staticmethod
    def _built_with(settings):
        """What of ``settings`` the net is built with (the rest is read at every fit)."""
        return {"hidden_layer_sizes": tuple(settings["hidden"]), "activation": settings["activation"],
                "dtype": np.dtype(settings["dtype"]).name, "strategy": str(settings["strategy"]),
                "solver": repr(settings["optimizer"]), "optimizer_in_backward": settings["optimizer_in_backward"]}

    def _rebuilt(self, settings, incremental):
        """On a warm start or a partial fit after ``set_params``: the net built anew with the changed settings
        and the fitted weights (in the new dtype), with a new optimizer (True); False when nothing it is built
        with changed.  A partial fit keeps its optimizer's state (in the new dtype) unless the solver changed:
        scikit-learn's ``partial_fit`` goes on with its optimizer, and a new strategy or dtype is no reason to
        forget Adam's moments.  Other layers than the fitted ones are refused (scikit-learn's MLPs cannot go
        on either)."""
        was, now = getattr(self, "_built", None), self._built_with(settings)
        if was is None or was == now:                      # (an estimator pickled before this was recorded)
            self._built = now
            return False
        if was["hidden_layer_sizes"] != now["hidden_layer_sizes"]:
            raise ValueError(f"hidden_layer_sizes={now['hidden_layer_sizes']} differs from the fitted net's "
                             f"{was['hidden_layer_sizes']}: a warm start or partial_fit goes on with the fitted "
                             "layers; set warm_start=False (or a new estimator) to fit new ones")
        old, dtype = self.net_, np.dtype(settings["dtype"])
        old.release_workspace()                            # only its parameters are held while the new is made
        self.net_ = NetworkWithCheckpointing.blank(old.sizes, dtype, strategy=settings["strategy"],
                                                   loss=self.loss_name, activation=settings["activation"],
                                                   optimizer=settings["optimizer"],
                                                   optimizer_in_backward=settings["optimizer_in_backward"])
        self.net_.weights, self.net_.biases = old.weights, old.biases       # no copy of them unless converted
        kept, state = old.optimizer_state, self.net_.optimizer_state
        if incremental and kept.optimizer.name == state.optimizer.name:
            for source, target in zip(kept.state, state.state):         # a slot at a time, in each dtype's layout
                for a, b in zip(*(sum(layer_views(row, old.sizes), []) for row in (source, target))):
                    b[...] = a
            state.steps = kept.steps
        self._built = now
        return True

    def _initialize(self, n_in, settings, rng):
        """A new net, drawn as scikit-learn draws its MLPs' (Glorot-uniform weights and biases, bound
        ``sqrt(6 / (fan_in + fan_out))``, 2 for a logistic net's), and fresh fitted attributes."""
        sizes = [n_in, *settings["hidden"], self.n_outputs_]
        net = NetworkWithCheckpointing.blank(sizes, settings["dtype"], strategy=settings["strategy"],
                                             loss=self.loss_name, activation=settings["activation"],
                                             optimizer=settings["optimizer"],
                                             optimizer_in_backward=settings["optimizer_in_backward"])
        factor = 2.0 if self.activation == "logistic" else 6.0
        weights, biases = [], []
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            limit = np.sqrt(factor / (fan_in + fan_out))
            weights.append(rng.uniform(-limit, limit, (fan_in, fan_out)).T)
            biases.append(rng.uniform(-limit, limit, fan_out))
        net.weights, net.biases = weights, biases
        self.net_, self.n_iter_, self.t_, self.loss_curve_ = net, 0, 0, []
        self._built = self._built_with(settings)
        self._stopper, self._epochs = None, 0
        self.best_loss_ = None if settings["early_stopping"] else np.inf
        self.validation_scores_ = [] if settings["early_stopping"] else None
        self.best_validation_score_ = -np.inf if settings["early_stopping"] else None
        self.out_activation_ = "softmax" if self.loss_name == "cross_entropy" else "identity"

    def _batch_size(self, n):
        """``batch_size`` as scikit-learn takes it: ``"auto"`` is ``min(200, n)``; a larger one is clipped."""
        if self.batch_size == "auto":
            return min(200, n)
        if self.batch_size > n:
            warnings.warn(f"batch_size {self.batch_size} is larger than the {n} training samples; it is clipped "
                          f"to {n}", UserWarning, stacklevel=4)
        return min(self.batch_size, n)

    def _train(self, training, validation, batch, epochs, settings, stopper, rng, incremental):
        """The net's ``SGD`` over ``epochs`` epochs, then the fitted attributes from its history."""
        n, net = len(training[0]), self.net_
        seed = int(rng.randint(np.iinfo(np.int32).max)) if settings["shuffle"] else False
        net.history = {"loss": []}                         # this fit's epochs only, should it stop early
        try:
            net.SGD(training, epochs, batch, settings["eta"], validation=validation, shuffle=seed, drop_last=False,
                    verbose=False, progress=False, first_epoch=self._epochs, early_stopping=stopper,
                    lr_schedule=schedule(self, settings["solver"], n, self.t_, self._epochs, incremental),
                    on_epoch=self._said if self.verbose else None)
        except BaseException as exc:                       # the epochs done before it are counted, as trained
            self._record(net.history, n, stopper, validation)
            named = self._named(exc)
            if named is exc:
                raise
            raise named from (exc if isinstance(exc, FloatingPointError) else None)
        self._record(net.history, n, stopper, validation)
        if epochs > 1 and self.n_iter_ == epochs and stopper.stopped_epoch is None:
            warnings.warn(f"Stochastic Optimizer: Maximum iterations ({epochs}) reached and the optimization "
                          "hasn't converged yet.", ConvergenceWarning, stacklevel=3)

    def _named(self, exc):
        """``exc`` as the estimator says it: the net's names for the data made X and y, a non-finite update
        pointed at the data and the rates; ``exc`` itself otherwise."""
        if isinstance(exc, FloatingPointError):
            return ValueError(f"{exc} (the epochs before it were kept: n_iter_ counts them): the input may hold "
                              "values too large for these settings; scale it (for example with "
                              "sklearn.preprocessing.StandardScaler), or lower learning_rate_init (got "
                              f"{self.learning_rate_init!r}) or alpha (got {self.alpha!r})")
        text = str(exc)
        for inner, outer in (("training_data[0]", "X"), ("training_data[1]", "y")):
            if type(exc) is ValueError and text.startswith(inner):
                return ValueError(outer + text[len(inner):])
        return exc

    def _record(self, history, n, stopper, validation):
        """The fitted attributes after the epochs of ``history`` (this fit's)."""
        self.n_iter_ = len(history["loss"])
        self._epochs += self.n_iter_
        self.t_ += n * self.n_iter_
        self.loss_curve_ += history["loss"]
        self.loss_ = self.loss_curve_[-1] if self.loss_curve_ else None
        self._stopper = stopper
        if validation is not None:
            self.validation_scores_ = (self.validation_scores_ or []) + history.get(stopper.monitored, [])
            self.best_validation_score_ = stopper.best
        else:
            self.best_loss_ = stopper.best

    def _said(self, epoch, updates):
        """``verbose``: scikit-learn's line per epoch."""
        history = self.net_.history
        print(f"Iteration {epoch + 1}, loss = {history['loss'][-1]:.8f}")
        for key in ("val_accuracy", "val_r2"):
            if history.get(key):
                print(f"Validation score: {history[key][-1]:f}")

    def _output(self, X):
        """The net's output rows for ``X``: probabilities of a classifier, predictions of a regressor."""
        check_is_fitted(self, "net_")
        X = validate_data(self, X, accept_sparse=False, dtype="numeric", reset=False)
        return self.net_.feedforward(X, name="X")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = False
        return tags


_FITTING, _FITTING_LOCK = weakref.WeakSet(), threading.Lock()     # the estimators being fitted now


def _floats(a, dtype, name):
    """``a`` (X, or y as the net takes it) as the kernels read it: float16 in the net's ``dtype``, as
    scikit-learn's MLPs take it, and a long double in float64, checked first to be within its range; and
    checked within the range of the net's ``dtype`` before the fit lets go of anything it had fitted."""
    if a.dtype.kind != "f":
        return a
    if a.dtype.itemsize < 4:
        return a.astype(dtype)
    if a.dtype.itemsize > 8:
        check_in_range(a.reshape(len(a), -1), np.float64, name)
        a = a.astype(np.float64)
    check_in_range(a.reshape(len(a), -1), dtype, name)
    return a


def _net_bytes(net):
    """The bytes a net without its engine holds: its parameters and its optimizer's state."""
    return net.params.flat.nbytes + net.optimizer_state.state.nbytes


def _layers_like(values, now, name):
    """``values`` (one array per layer) checked against the shapes of the fitted ``now``, named as ``name[i]``
    in scikit-learn's layout (the net's own is the transpose)."""
    values = list(values)
    if len(values) != len(now):
        raise ValueError(f"{name} must hold {len(now)} arrays, one per layer, got {len(values)}")
    for i, (v, w) in enumerate(zip(values, now)):
        if np.shape(v) != w.shape:
            raise ValueError(f"{name}[{i}] must have shape {w.shape}, got {np.shape(v)}")
        v = np.asarray(v)
        if v.dtype.kind in "fc" and not np.isfinite(v).all():
            at = tuple(int(k) for k in np.argwhere(~np.isfinite(v))[0])
            raise ValueError(f"{name}[{i}] holds {v[at]!s} at index {at}: weights and biases must be finite")
    return values
