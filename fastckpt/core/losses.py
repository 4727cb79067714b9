"""The losses a net can train with, and the L2 penalty, in one place for every mode.

* ``"quadratic"`` (the lab's): sigmoid output, ``0.5 * ||a - y||^2`` per sample;
* ``"cross_entropy"``: log-softmax output, ``-sum(y * log p)`` per sample.

Either may add the L2 penalty ``0.5 * l2 * ||W||^2`` per layer (biases carry none).
"""
import numpy as np

from fastckpt.kernels import sum_squares

LOSSES = ("quadratic", "cross_entropy")


def check_loss(loss):
    """``loss`` if it names a loss, else a ValueError naming it."""
    if loss not in LOSSES:
        raise ValueError(f"loss must be 'quadratic' (sigmoid output) or 'cross_entropy' (softmax output), "
                         f"got {loss!r}")
    return loss


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
