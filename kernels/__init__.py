"""Numba kernels of fastckpt: batched dense layers, losses, update steps, the planner's tables, codecs.

Kernels trust their callers (``fastckpt`` checks shapes, dtypes and
contiguity) but still refuse shapes that do not chain, so a wrong call is an
error rather than a crash.  They import nothing of ``fastckpt``, and every
kernel writes into arrays its caller passes (the planner's table builders,
which run once per plan, are the exception: they size their own tables).

The names below are the kernels' public face: ``fastckpt`` imports them from
here, never from the modules that define them.
"""
from ._jit import CompileNotice, KernelCacheWarning
from .activations import (
    IDENTITY,
    LOG_SOFTMAX,
    RELU,
    SIGMOID,
    TANH,
    bias_activation,
    bias_identity,
    bias_log_softmax,
    bias_relu,
    bias_sigmoid,
    bias_tanh,
)
from .blas import NO_TRANS, TRANS, blas_core, blas_threads, blas_threads_running, run_blas_threads, set_blas_threads
from .dense import (
    dense_backward,
    dense_backward_input,
    dense_backward_sgd,
    dense_forward,
    dense_forward_layer,
    dense_forward_log_softmax,
    gemm,
)
from .elementwise import (
    accumulate,
    all_finite,
    cross_entropy_delta,
    label_sums,
    quadratic_delta,
    sgd_step,
    squared_error_delta,
    sum_squares,
    target_sums,
)
from .fronts import NO_ROOM, OUT_OF_STEPS, band_ends, bounded_fronts
from .optimizers import ADAM, MOMENTUM, adam_step, counted_adam_step, counted_momentum_step, momentum_step
from .runs import (
    BAD_INPUT,
    BAD_LOSS,
    BAD_UPDATE,
    BWD,
    FWD,
    LOSS,
    MODES,
    N_INTS,
    OK,
    WEIGHTS,
    Floats,
    Ints,
    Net,
    Table,
    float_record_elems,
    runner,
)
from .schedules import least_arena, once_points, region_table_of, revolve_splits
from .staging import label_range, one_hot, scale_into
from .sync import add_in_turn, new_gate, raise_flag, wait_flag
from .transport import (
    NONFINITE,
    OVERFLOW,
    bfloat16_encode,
    copy_finite,
    float16_encode,
    int8_decode,
    int8_encode,
    table_decode,
)

__all__ = [
    "ADAM", "BAD_INPUT", "BAD_LOSS", "BAD_UPDATE", "BWD", "CompileNotice", "FWD", "Floats", "IDENTITY", "Ints",
    "KernelCacheWarning", "LOG_SOFTMAX", "LOSS", "MODES", "MOMENTUM", "NONFINITE", "NO_ROOM", "NO_TRANS", "N_INTS",
    "Net", "OK", "OUT_OF_STEPS", "OVERFLOW", "RELU", "SIGMOID", "TANH", "TRANS", "Table", "WEIGHTS", "accumulate",
    "adam_step", "add_in_turn", "all_finite", "band_ends", "bfloat16_encode", "bias_activation", "bias_identity",
    "bias_log_softmax", "bias_relu", "bias_sigmoid", "bias_tanh", "blas_core", "blas_threads", "blas_threads_running",
    "bounded_fronts", "copy_finite", "counted_adam_step", "counted_momentum_step", "cross_entropy_delta",
    "dense_backward", "dense_backward_input", "dense_backward_sgd", "dense_forward", "dense_forward_layer",
    "dense_forward_log_softmax", "float16_encode", "float_record_elems", "gemm", "int8_decode", "int8_encode",
    "label_range", "label_sums", "least_arena", "momentum_step", "new_gate", "once_points", "one_hot",
    "quadratic_delta", "raise_flag",
    "region_table_of", "revolve_splits", "run_blas_threads", "runner", "scale_into", "set_blas_threads", "sgd_step",
    "squared_error_delta", "sum_squares", "table_decode", "target_sums", "wait_flag",
]
