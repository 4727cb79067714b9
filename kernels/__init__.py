"""Numba kernels of fastckpt: batched dense sigmoid layers, loss and update steps.

Kernels trust their callers (``fastckpt`` checks shapes, dtypes and
contiguity) but still refuse shapes that do not chain, so a wrong call is an
error rather than a crash.
"""
from .activations import bias_sigmoid
from .blas import blas_threads, set_blas_threads
from .dense import dense_backward, dense_backward_sgd, dense_forward, dense_forward_log_softmax
from .elementwise import accumulate, all_finite, cross_entropy_delta, quadratic_delta, sgd_step, sum_squares

__all__ = [
    "accumulate", "all_finite", "bias_sigmoid", "blas_threads", "cross_entropy_delta", "dense_backward",
    "dense_backward_sgd", "dense_forward", "dense_forward_log_softmax", "quadratic_delta", "set_blas_threads",
    "sgd_step", "sum_squares",
]
