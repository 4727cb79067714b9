"""The losses a net can train with, and the L2 penalty, in one place for every mode.

* ``"quadratic"`` (the lab's): sigmoid output, ``0.5 * ||a - y||^2`` per sample;
* ``"cross_entropy"``: log-softmax output, ``-sum(y * log p)`` per sample;
* ``"squared_error"``: identity (linear) output, ``0.5 * ||a - y||^2`` per sample: regression, the
  lab's quadratic cost over a linear output (scikit-learn's ``MLPRegressor``).

Either may add the L2 penalty ``0.5 * l2 * ||W||^2`` per layer (biases carry none).
"""
import numpy as np

from fastckpt.kernels import sum_squares

LOSSES = ("quadratic", "cross_entropy", "squared_error")


def check_loss(loss):
    """``loss`` if it names a loss, else a ValueError naming it."""
    if not isinstance(loss, str) or loss not in LOSSES:
        raise ValueError(f"loss must be 'quadratic' (sigmoid output), 'cross_entropy' (softmax output) or "
                         f"'squared_error' (identity output), got {loss!r}")
    return loss


def is_regression(loss):
    """Whether ``loss`` trains a regression net (real targets, no classes): the squared error's."""
    return loss == "squared_error"


def l2_penalty(l2, weights):
    """``sum over layers of 0.5 * l2[i] * ||weights[i]||^2``, as a float.

    float64 weights are summed through BLAS; float32 ones are summed in float64
    (where their squares cannot overflow), the same in every mode.
    """
    total = 0.0
    for coef, w in zip(l2, weights):
        if coef:
            flat = w.reshape(-1)
            total += 0.5 * coef * (float(np.dot(flat, flat)) if flat.itemsize == 8 else sum_squares(flat))
    return total
