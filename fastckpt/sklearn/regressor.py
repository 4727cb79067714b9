"""``MLPRegressor``: scikit-learn's multi-layer perceptron regressor, trained by fastckpt's engine."""
import numpy as np
from sklearn.metrics import r2_score
from sklearn.utils import RegressorTags
from sklearn.utils.validation import column_or_1d

from .base import BaseMLP


class MLPRegressor(BaseMLP):
    """A multi-layer perceptron regressor with scikit-learn's parameters, trained by fastckpt's engine.

    A drop-in for :class:`sklearn.neural_network.MLPRegressor` (``solver`` ``"adam"`` or ``"sgd"``): an
    identity output and the squared error (``loss="squared_error"``, fastckpt's), one output or several.
    The parameters and attributes are :class:`~fastckpt.sklearn.MLPClassifier`'s, but ``classes_``;
    ``validation_scores_`` hold R², ``out_activation_`` is ``"identity"``.  The training loss is
    ``0.5 ||y - f(x)||^2`` summed over the outputs (scikit-learn's reports it divided by the outputs).
    """

    loss_name = "squared_error"

    def __init__(self, loss="squared_error", hidden_layer_sizes=(100,), activation="relu", *, solver="adam",
                 alpha=0.0001, batch_size="auto", learning_rate="constant", learning_rate_init=0.001, power_t=0.5,
                 max_iter=200, shuffle=True, random_state=None, tol=1e-4, verbose=False, warm_start=False,
                 momentum=0.9, nesterovs_momentum=True, early_stopping=False, validation_fraction=0.1, beta_1=0.9,
                 beta_2=0.999, epsilon=1e-8, n_iter_no_change=10, strategy="plain", max_memory=None,
                 dtype=np.float64, optimizer_in_backward=False):
        self.loss = loss
        self.hidden_layer_sizes = hidden_layer_sizes
        self.activation = activation
        self.solver = solver
        self.alpha = alpha
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.learning_rate_init = learning_rate_init
        self.power_t = power_t
        self.max_iter = max_iter
        self.shuffle = shuffle
        self.random_state = random_state
        self.tol = tol
        self.verbose = verbose
        self.warm_start = warm_start
        self.momentum = momentum
        self.nesterovs_momentum = nesterovs_momentum
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.n_iter_no_change = n_iter_no_change
        self.strategy = strategy
        self.max_memory = max_memory
        self.dtype = dtype
        self.optimizer_in_backward = optimizer_in_backward

    def fit(self, X, y):
        """Train on ``X`` (n_samples, n_features) and the targets ``y`` (n_samples,) or (n_samples, n_outputs)."""
        return self._fit(X, y)

    def partial_fit(self, X, y):
        """One epoch over ``X``, ``y``."""
        return self._fit(X, y, incremental=True)

    def predict(self, X):
        """The predictions (n_samples,), or (n_samples, n_outputs) for several outputs."""
        out = self._output(X)
        return out.ravel() if out.shape[1] == 1 else out

    def _targets(self, y, first, incremental, classes):
        """The targets as rows (n, outputs), a view of ``y`` where it can be."""
        if self.loss != "squared_error":
            raise ValueError(f"loss must be 'squared_error' (fastckpt has no Poisson output), got {self.loss!r}")
        if y.ndim == 2 and y.shape[1] == 1:
            y = column_or_1d(y, warn=True)
        rows = y.reshape(-1, 1) if y.ndim == 1 else y
        return rows, rows.shape[1]

    def score(self, X, y, sample_weight=None):
        """R² of :meth:`predict` on ``X`` against ``y``, averaged over the outputs (scikit-learn's
        ``RegressorMixin.score``)."""
        return r2_score(y, self.predict(X), sample_weight=sample_weight)

    def __sklearn_tags__(self):
        """A regressor's tags, as scikit-learn's ``RegressorMixin`` sets them (one base class here, no mixin),
        of one output or several."""
        tags = super().__sklearn_tags__()
        tags.estimator_type = "regressor"
        tags.regressor_tags = RegressorTags()
        tags.target_tags.required = True
        tags.target_tags.multi_output = True
        return tags
