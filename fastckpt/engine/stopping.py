"""Early stopping: the epoch a run stops at once its score no longer improves, and the best weights it keeps.

NOTE [ Early stopping ]
The rule is scikit-learn's (``BaseMultilayerPerceptron._update_no_improvement_count``), so that ``tol`` and
``n_iter_no_change`` mean what they mean there, and its estimators' ``n_iter_`` comes out the same:

* a score, higher is better (the validation accuracy, or R² for a regression net): an epoch does not improve
  when its score is below ``best + tol``; the best is replaced whenever the score is above it, by any amount;
* a loss, lower is better (the training loss, or the validation loss): an epoch does not improve when its
  loss is above ``best - tol``; the best is replaced whenever the loss is below it;
* an epoch that improves sets the count of epochs without improvement to 0, any other adds one, and the
  run stops once that count exceeds ``n_iter_no_change`` (scikit-learn's ``>``, so a run of patience 10
  stops after 11 epochs in a row that did not improve); with ``shrink``, the learning rate is first
  divided by it instead, while it is above ``min_eta`` (scikit-learn's ``learning_rate="adaptive"``).

With ``restore_best_weights`` the parameters of the best epoch are copied into one buffer of the
parameters' layout (allocated once, when the run starts; counted by the whole run's plan as ``best
weights``) each time the best is replaced, and copied back when the run ends: Keras'
``EarlyStopping(restore_best_weights=True)``, and what scikit-learn's ``early_stopping=True`` does with
the validation score.  Only the weights and biases: the optimizer's state goes on from the last epoch.
"""
import math

from fastckpt.core.checks import check_nonnegative, check_positive_int

MONITORS = ("auto", "loss", "val_loss", "val_score")


class EarlyStopping:
    """Stop a run when its monitored value has not improved by ``tol`` for more than ``n_iter_no_change``
    epochs in a row, and give it back the best epoch's weights (NOTE [ Early stopping ]).

    Parameters
    ----------
    n_iter_no_change : int or None, optional
        Epochs without improvement that a run goes on through (default 10, scikit-learn's); None never
        stops the run, and only keeps its best epoch (``fastckpt train --save-best`` without
        ``--early-stopping``).
    tol : float, optional
        The least improvement that counts (default 1e-4, scikit-learn's).
    monitor : {"auto", "loss", "val_loss", "val_score"}, optional
        What is watched: ``"auto"`` (default) the validation score when the run validates, else the
        training loss (scikit-learn's choice); ``"val_score"`` is the validation accuracy, or R² for a
        regression net (``loss="squared_error"``).
    restore_best_weights : bool, optional
        Copy the best epoch's weights back into the net when the run ends (default True).
    shrink : float or None, optional
        Divide the learning rate by this instead of stopping, while the rate is above ``min_eta``
        (default None: stop).

    Attributes
    ----------
    best : float
        The best value seen (a score: the highest; a loss: the lowest).
    best_epoch, stopped_epoch : int or None
        The epoch (counted from 0, as the run counts them) of the best value, and the one the run stopped
        after (None while it has not stopped early).
    improved : bool
        Whether the last epoch replaced the best (``--save-best`` saves the net then).
    monitored : str
        The history key watched in the last run: ``"loss"``, ``"val_loss"``, ``"val_accuracy"`` or ``"val_r2"``.
    """

    def __init__(self, n_iter_no_change=10, tol=1e-4, *, monitor="auto", restore_best_weights=True, shrink=None,
                 min_eta=1e-6):
        self.n_iter_no_change = None if n_iter_no_change is None else check_positive_int(
            n_iter_no_change, "n_iter_no_change")
        self.tol = check_nonnegative(tol, "tol")
        if monitor not in MONITORS:
            raise ValueError(f"monitor must be one of {', '.join(MONITORS)}, got {monitor!r}")
        if not isinstance(restore_best_weights, bool):
            raise TypeError(f"restore_best_weights must be True or False, got {restore_best_weights!r}")
        self.monitor, self.restore_best_weights = monitor, restore_best_weights
        self.shrink = None if shrink is None else check_nonnegative(shrink, "shrink")
        self.min_eta = check_nonnegative(min_eta, "min_eta")
        self.start(None, validating=False)

    def go_on(self, previous, *, rate=True):
        """Let the next run go on from the ``previous`` run's best value and count instead of starting afresh (a
        ``partial_fit`` or a ``warm_start`` fit of :mod:`fastckpt.sklearn`, as scikit-learn's go on), and from its
        shrunk rate when ``rate`` (a ``partial_fit``: scikit-learn's goes on with its optimizer; a warm ``fit``
        makes a new one, at ``learning_rate_init``).  Until this run beats that best, the best weights are the
        parameters as the run starts: those the previous run ended with, its best when it restored them."""
        self._kept = (previous.best, previous.best_epoch, previous.wait, previous.factor if rate else 1.0,
                      previous.monitored)
        return self

    def start(self, params, *, validating, regression=False):
        """Begin a run of ``params`` (a :class:`~fastckpt.core.params.Parameters`, or None): resolve what
        is monitored and make the buffer of the best weights."""
        kept, self._kept = getattr(self, "_kept", None), None
        watch = self.monitor if self.monitor != "auto" else "val_score" if validating else "loss"
        if watch.startswith("val") and not validating and params is not None:
            raise ValueError(f"early stopping monitors {watch!r}, but the run has no validation set: give "
                             "validation=, or monitor='loss'")
        self.monitored = ("val_r2" if regression else "val_accuracy") if watch == "val_score" else watch
        self.higher = watch == "val_score"
        self.best = -math.inf if self.higher else math.inf
        self.best_epoch = self.stopped_epoch = None
        self.wait, self.factor, self.improved = 0, 1.0, False
        if kept is not None and kept[-1] == self.monitored:
            self.best, self.best_epoch, self.wait, self.factor = kept[:4]
        self._params = params
        self._best = params.new_buffer() if params is not None and self.restore_best_weights else None
        if self._best is not None and self.best_epoch is not None:      # a best carried over (go_on)
            params.copy_into(self._best)

    def update(self, history, epoch, eta):
        """After epoch ``epoch`` (trained at rate ``eta``), whose values ``history`` holds last: True when the
        run should stop now."""
        value = history[self.monitored][-1]
        if self.higher:
            worse, better = value < self.best + self.tol, value > self.best
        else:
            worse, better = value > self.best - self.tol, value < self.best
        self.wait = self.wait + 1 if worse else 0
        self.improved = bool(better)
        if better:
            self.best, self.best_epoch = value, epoch
            if self._best is not None:
                self._params.copy_into(self._best)
        if self.n_iter_no_change is None or self.wait <= self.n_iter_no_change:
            return False
        if self.shrink is not None and eta > self.min_eta:
            self.factor /= self.shrink
            self.wait = 0
            return False
        self.stopped_epoch = epoch
        return True

    def finish(self):
        """End the run: the best epoch's weights back into the parameters (when kept and some epoch ran)."""
        if self._best is not None and self.best_epoch is not None:
            self._params.restore_from(self._best)
        self._best = self._params = None

    def __repr__(self):
        return (f"EarlyStopping(n_iter_no_change={self.n_iter_no_change}, tol={self.tol}, monitor={self.monitor!r}, "
                f"restore_best_weights={self.restore_best_weights})")


def check_early_stopping(early_stopping):
    """An :class:`EarlyStopping` from itself, None (none) or an int (its ``n_iter_no_change``)."""
    if early_stopping is None or isinstance(early_stopping, EarlyStopping):
        return early_stopping
    if isinstance(early_stopping, int) and not isinstance(early_stopping, bool):
        return EarlyStopping(early_stopping)
    raise TypeError(f"early_stopping must be an EarlyStopping, an int (its n_iter_no_change) or None, "
                    f"got {early_stopping!r}")
