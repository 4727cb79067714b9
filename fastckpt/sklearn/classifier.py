"""``MLPClassifier``: scikit-learn's multi-layer perceptron classifier, trained by fastckpt's engine."""
import numpy as np
from sklearn.metrics import accuracy_score
from sklearn.utils import ClassifierTags
from sklearn.utils.multiclass import check_classification_targets, unique_labels
from sklearn.utils.validation import column_or_1d

from .base import BaseMLP


class MLPClassifier(BaseMLP):
    """A multi-layer perceptron classifier with scikit-learn's parameters, trained by fastckpt's engine.

    A drop-in for :class:`sklearn.neural_network.MLPClassifier` (``solver`` ``"adam"`` or ``"sgd"``): a
    softmax output over the classes (two for a binary problem, where scikit-learn has one logistic unit)
    and cross-entropy; every epoch is :meth:`fastckpt.Network.SGD` with checkpointing ``strategy`` and a
    bound on the whole fit (``max_memory``).  What differs from scikit-learn's is in ``docs/sklearn.md``.

    Parameters
    ----------
    hidden_layer_sizes, activation, solver, alpha, batch_size, learning_rate, learning_rate_init, power_t, \
max_iter, shuffle, random_state, tol, verbose, warm_start, momentum, nesterovs_momentum, early_stopping, \
validation_fraction, beta_1, beta_2, epsilon, n_iter_no_change
        As :class:`sklearn.neural_network.MLPClassifier`'s, with its defaults (:mod:`fastckpt.sklearn.settings`).
    strategy : str, optional
        The checkpointing strategy of the training step (:func:`fastckpt.plan`): ``"plain"`` (default),
        ``"sqrt"``, ``"every_nth(2)"``, ``"fit(64MiB)"``...; every strategy trains to the same bits.
    max_memory : int or str, optional
        A bound on the whole ``fit`` as memray measures it (bytes, or ``"256MiB"``): a fit that would need
        more is refused before training, its parts named (:mod:`fastckpt.sklearn.data`).
    dtype : {numpy.float64, numpy.float32}, optional
        The precision the net trains and predicts in (default float64).
    optimizer_in_backward : bool, optional
        Apply each layer's update as soon as its gradient is final (the same numbers, less memory).

    Attributes
    ----------
    classes_, n_features_in_, feature_names_in_, n_outputs_, out_activation_, n_layers_
        As scikit-learn's; ``n_outputs_`` is the number of classes, ``out_activation_`` ``"softmax"``.
    coefs_, intercepts_ : list of numpy.ndarray
        (n_in, n_out) weights and (n_out,) biases per layer: views of :attr:`net_`'s parameters.
    loss_, loss_curve_, best_loss_, validation_scores_, best_validation_score_, n_iter_, t_
        As scikit-learn's: the mean training loss (the L2 term included) per epoch, the validation accuracy
        per epoch with ``early_stopping``, the epochs of the last fit and the samples seen by all fits.
    net_ : fastckpt.NetworkWithCheckpointing
        The trained net: ``net_.save(path)`` writes it in fastckpt's format.
    """

    loss_name = "cross_entropy"

    def __init__(self, hidden_layer_sizes=(100,), activation="relu", *, solver="adam", alpha=0.0001,
                 batch_size="auto", learning_rate="constant", learning_rate_init=0.001, power_t=0.5, max_iter=200,
                 shuffle=True, random_state=None, tol=1e-4, verbose=False, warm_start=False, momentum=0.9,
                 nesterovs_momentum=True, early_stopping=False, validation_fraction=0.1, beta_1=0.9, beta_2=0.999,
                 epsilon=1e-8, n_iter_no_change=10, strategy="plain", max_memory=None, dtype=np.float64,
                 optimizer_in_backward=False):
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
        """Train on ``X`` (n_samples, n_features) and the class labels ``y`` (n_samples,); returns self."""
        return self._fit(X, y)

    def partial_fit(self, X, y, classes=None):
        """One epoch over ``X``, ``y``; ``classes`` (every label there will be) on the first call."""
        return self._fit(X, y, incremental=True, classes=classes)

    def predict_proba(self, X):
        """The probability of each class (n_samples, n_classes), in the order of :attr:`classes_`."""
        return self._output(X)

    def predict_log_proba(self, X):
        """``log(predict_proba(X))``."""
        proba = self.predict_proba(X)
        with np.errstate(divide="ignore"):
            return np.log(proba, out=proba)

    def predict(self, X):
        """The most probable class of each sample."""
        proba = self.predict_proba(X)                  # refused first when not fitted
        return self.classes_[proba.argmax(axis=1)]

    def _targets(self, y, first, incremental, classes):
        """Class labels as indices into :attr:`classes_` (set on a first fit, or from ``classes``)."""
        if y.ndim == 2 and y.shape[1] == 1:
            y = column_or_1d(y, warn=True)
        if y.ndim != 1:
            raise ValueError(f"y must hold one class label per sample, got shape {y.shape}: multi-label "
                             "classification is not supported")
        check_classification_targets(y)
        if first:
            if incremental and classes is None:
                raise ValueError("classes must be passed on the first call to partial_fit")
            self.classes_ = unique_labels(y if classes is None else classes)
        elif classes is not None and not np.array_equal(unique_labels(classes), self.classes_):
            raise ValueError(f"classes={classes!r} is not the classes of the first partial_fit: {self.classes_}")
        labels = np.searchsorted(self.classes_, y)
        found = (labels < len(self.classes_)) & (self.classes_[np.minimum(labels, len(self.classes_) - 1)] == y)
        if not found.all():
            raise ValueError(f"y holds labels not in classes_ {self.classes_}: {np.unique(y[~found])}")
        if self.warm_start and not incremental and not first and len(np.unique(labels)) != len(self.classes_):
            raise ValueError(f"warm_start can only be used where y has the same classes as in the previous call to "
                             f"fit: previously {self.classes_}, y has {unique_labels(y)}")
        return labels.astype(np.int64, copy=False), len(self.classes_)

    def score(self, X, y, sample_weight=None):
        """The accuracy of :meth:`predict` on ``X`` against ``y`` (scikit-learn's ``ClassifierMixin.score``)."""
        return accuracy_score(y, self.predict(X), sample_weight=sample_weight)

    def __sklearn_tags__(self):
        """A classifier's tags, as scikit-learn's ``ClassifierMixin`` sets them (one base class here, no mixin),
        of one label per sample."""
        tags = super().__sklearn_tags__()
        tags.estimator_type = "classifier"
        tags.classifier_tags = ClassifierTags(multi_label=False)
        tags.target_tags.required = True
        return tags
