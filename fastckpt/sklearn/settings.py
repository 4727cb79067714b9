"""The estimators' constructor arguments, checked in ``fit`` (scikit-learn's rule), and what they become in the
engine: the net's hidden activation, its optimizer, the learning rate's schedule and its early stopping.

Each error names the argument and the value.  The mapping, and where it differs from scikit-learn's
own MLPs (``docs/sklearn.md``):

* ``activation``: ``"identity"``, ``"logistic"`` (fastckpt's ``"sigmoid"``), ``"tanh"``, ``"relu"``;
* ``solver="adam"``: :class:`~fastckpt.optimizers.Adam` with ``betas=(beta_1, beta_2)`` and ``eps=epsilon``
  (PyTorch's form: ``epsilon`` is added to the bias-corrected ``sqrt(v)``, scikit-learn adds it before the
  correction, a difference below ``epsilon``);
* ``solver="sgd"``: :class:`~fastckpt.optimizers.Momentum` (``momentum``, ``nesterovs_momentum``), plain SGD
  with ``momentum=0``; ``learning_rate`` ``"constant"``, ``"invscaling"``
  (:class:`~fastckpt.core.lr.InverseScaling`) or ``"adaptive"`` (the rate divided by 5 where early
  stopping would stop, NOTE [ Early stopping ]);
* ``alpha``: scikit-learn's penalty ``alpha / (2 n_batch) ||W||^2`` per minibatch of ``n_batch`` samples is
  the engine's ``l2 = alpha / batch_size`` (the last, smaller minibatch of an epoch keeps it);
* ``solver="lbfgs"`` is not offered: the engine trains by minibatches.
"""
import numbers

import numpy as np

from fastckpt.core.checks import check_bool, check_dtype, check_nonnegative, check_positive_int
from fastckpt.core.lr import InverseScaling
from fastckpt.core.optimizers import Adam, Momentum
from fastckpt.engine.stopping import EarlyStopping
from fastckpt.planner import parse_strategy
from fastckpt.planner.strategies import parse_bytes

ACTIVATIONS = {"identity": "identity", "logistic": "sigmoid", "tanh": "tanh", "relu": "relu"}
LEARNING_RATES = ("constant", "invscaling", "adaptive")


def _choice(value, name, choices):
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def _between(value, name, low, high, closed_high=False):
    v = check_nonnegative(value, name) if low == 0 else value
    if not isinstance(v, numbers.Real) or not (low <= v < high or closed_high and v == high):
        raise ValueError(f"{name} must be in [{low}, {high}{']' if closed_high else ')'}, got {value!r}")
    return float(v)


def hidden_sizes(value):
    """``hidden_layer_sizes`` as a tuple of widths >= 1 (one int, or any sequence of them; not an iterator, which
    a first fit would use up, leaving the next one no hidden layers)."""
    if hasattr(value, "__next__"):
        raise TypeError(f"hidden_layer_sizes must be an int or a sequence of ints such as (100,), got "
                        f"{type(value).__name__} {value!r}: an iterator is used up by the first fit")
    values = [value] if not hasattr(value, "__iter__") or isinstance(value, str) else list(value)
    return tuple(check_positive_int(v, "hidden_layer_sizes") for v in values)


def checked(est):
    """Every argument of the estimator ``est`` checked, as a dict of what the engine takes."""
    out = {"hidden": hidden_sizes(est.hidden_layer_sizes),
           "activation": ACTIVATIONS[_choice(est.activation, "activation", tuple(ACTIVATIONS))],
           "solver": _choice(est.solver, "solver", ("adam", "sgd")),
           "alpha": check_nonnegative(est.alpha, "alpha"),
           "learning_rate": _choice(est.learning_rate, "learning_rate", LEARNING_RATES),
           "max_iter": check_positive_int(est.max_iter, "max_iter"),
           "tol": check_nonnegative(est.tol, "tol"),
           "dtype": check_dtype(est.dtype),
           "strategy": parse_strategy(est.strategy),
           "max_memory": None if est.max_memory is None else parse_bytes(est.max_memory, "max_memory")}
    if est.batch_size != "auto":
        out["batch_size"] = check_positive_int(est.batch_size, "batch_size")
    try:
        eta = check_nonnegative(est.learning_rate_init, "learning_rate_init")
    except ValueError:                                  # one rule for every value it refuses
        eta = 0.0
    if eta <= 0:
        raise ValueError(f"learning_rate_init must be finite and > 0, got {est.learning_rate_init!r}")
    out["eta"] = eta
    check_nonnegative(est.power_t, "power_t")
    if isinstance(est.verbose, str) or not isinstance(est.verbose, (numbers.Integral, np.bool_)):
        raise ValueError(f"verbose must be True, False or an int, got {est.verbose!r}")
    for name in ("shuffle", "warm_start", "early_stopping", "nesterovs_momentum", "optimizer_in_backward"):
        out[name] = check_bool(getattr(est, name), name)
    if est.n_iter_no_change != np.inf:
        check_positive_int(est.n_iter_no_change, "n_iter_no_change")
    _between(est.validation_fraction, "validation_fraction", 0, 1)
    out["optimizer"] = optimizer(est)
    return out


def optimizer(est):
    """The engine's optimizer of ``solver``: Adam, or SGD with (Nesterov's) momentum.  Every solver's settings
    are checked whichever is chosen, as scikit-learn checks them (a bad one would surface at a later
    ``set_params(solver=...)`` otherwise)."""
    betas = (_between(est.beta_1, "beta_1", 0, 1), _between(est.beta_2, "beta_2", 0, 1))
    eps = _positive(est.epsilon, "epsilon")
    momentum = _between(est.momentum, "momentum", 0, 1, closed_high=True)
    nesterov = check_bool(est.nesterovs_momentum, "nesterovs_momentum")
    if est.solver == "adam":
        return Adam(betas=betas, eps=eps)
    return Momentum(momentum, nesterov=nesterov) if momentum else "sgd"


def _positive(value, name):
    v = check_nonnegative(value, name)
    if v <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return v


def schedule(est, solver, samples, samples_before, first_epoch, incremental):
    """The learning rate per epoch: constant, or with ``learning_rate="invscaling"`` and SGD scikit-learn's
    ``learning_rate_init / (t + 1) ** power_t`` (``samples`` per epoch, ``samples_before`` already); a fit that
    is not a ``partial_fit`` has a new optimizer, whose first epoch is at ``learning_rate_init``."""
    if solver == "sgd" and est.learning_rate == "invscaling":
        return InverseScaling(est.power_t, samples, samples_before, first_epoch, fresh=not incremental)
    return None


def stopping(est, settings, incremental):
    """The run's :class:`~fastckpt.engine.stopping.EarlyStopping`: on the validation score with
    ``early_stopping`` (the best weights restored), else on the training loss (the last weights kept), as
    scikit-learn's; ``learning_rate="adaptive"`` with SGD divides the rate by 5 instead of stopping."""
    adaptive = settings["solver"] == "sgd" and settings["learning_rate"] == "adaptive"
    counted = est.n_iter_no_change != np.inf and (adaptive or not incremental)   # partial_fit: adaptive shrinks
    patience = int(est.n_iter_no_change) if counted else None
    return EarlyStopping(patience, settings["tol"], monitor="val_score" if settings["early_stopping"] else "loss",
                         restore_best_weights=settings["early_stopping"], shrink=5.0 if adaptive else None)
