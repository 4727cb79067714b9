"""Sizes, bytes and FLOPs of a chain of dense layers: the arithmetic every plan is made of.

States ``a[0] .. a[L]`` are batch-major (batch, sizes[j]) arrays; in the
workspace each starts on a cache line.  Parameters and gradients live in one
flat buffer in the layout of :func:`fastckpt.core.layout.param_layout`.
"""
import numpy as np

from fastckpt.core.layout import ALIGN_BYTES, grad_bytes, param_layout
from fastckpt.kernels import blas_core, float_record_elems

BLAS_JOB_BYTES = 512 * 1024      # OpenBLAS's job table: MAX_CPU_NUMBER (64 in numpy's build) job_t entries
SMALL_KERNEL_CORES = {"SkylakeX", "CooperLake", "SapphireRapids"}   # OpenBLAS cores with small-matrix GEMMs


def act_bytes(sizes, batch_size, itemsize, j):
    """Workspace bytes of state ``a[j]`` (j >= 1), rounded up to a cache line."""
    return -(-batch_size * sizes[j] * itemsize // ALIGN_BYTES) * ALIGN_BYTES


def state_bytes(sizes, batch_size, itemsize):
    """``w[j]`` = workspace bytes of ``a[j]`` for j = 0 .. L (``w[0] = 0``: the input)."""
    return [0] + [act_bytes(sizes, batch_size, itemsize, j) for j in range(1, len(sizes))]


def gradient_bytes(sizes, itemsize, optimizer_in_backward=False, optimizer_slots=0):
    """Bytes of a step's gradient buffers: the whole flat layout; none with SGD in the backward pass
    (each layer's update is folded into its GEMM); one layer's block, the largest, with a stateful
    optimizer in the backward pass (each layer's gradient is made, applied and forgotten in turn)."""
    if not optimizer_in_backward:
        return param_layout(sizes, itemsize)[1] * itemsize
    return max(grad_bytes(sizes, itemsize)) if optimizer_slots else 0


def forward_flops(sizes, batch_size):
    """FLOPs of each layer's forward GEMM, as an array of length L."""
    return np.array([2 * batch_size * i * o for i, o in zip(sizes[:-1], sizes[1:])], dtype=np.float64)


def step_flops(sizes, batch_size):
    """GEMM FLOPs of one plain training step: forward, weight gradients, input deltas."""
    fwd = forward_flops(sizes, batch_size)
    return float(2 * fwd.sum() + fwd[1:].sum())


def scratch_bytes(sizes):
    """The float64 record a step's kernel takes its settings and scratch row in (:mod:`kernels.runs`)."""
    return float_record_elems(len(sizes) - 1, max(sizes[1:])) * 8


def delta_elems(sizes, batch_size):
    """Elements of the two ping-pong delta buffers (odd and even state indices)."""
    widths = sizes[1:]
    odd = max(widths[0::2])
    even = max(widths[1::2], default=0)
    return batch_size * (odd + even)


def gemm_mallocs(m, n, k, trans_a, trans_b, core, threads):
    """Whether OpenBLAS mallocs its job table in a row-major ``C (m, n) = op(A) op(B)``, inner size ``k``.

    NOTE [ BLAS job table ]
    OpenBLAS (0.3.x, ``interface/gemm.c``) sees a row-major call as the
    column-major ``C^T = op(B)^T op(A)^T``: ``M = n``, ``N = m``, ``transa =
    trans_b``, ``transb = trans_a``.  Then, in order:

    * ``M == 1`` or ``N == 1``: the call is a GEMV, which allocates nothing;
    * on the SkylakeX kernels (also chosen for Cooper Lake and Sapphire
      Rapids) a small-matrix kernel takes every call with ``M N K <= 10^6``,
      except ``transa and not transb`` with ``M N > 1200`` or ``K < 32``, and
      allocates nothing; the Haswell kernels (also chosen for AMD Zen) have none;
    * otherwise it runs on ``min(threads, M N K / 262144)`` threads, and from
      two threads (``M N K >= 524288``) it mallocs and frees the job table.

    float32 and float64, any alpha and beta, alike.  Checked against memray
    on 3,780 calls per core type (``tests/test_blas_model.py`` repeats a
    sample under every ``OPENBLAS_CORETYPE`` the machine can run).
    """
    if threads < 2 or core == "mkl":          # MKL keeps its buffers between calls (NOTE [ BLAS backends ])
        return False
    big_m, big_n, ta = n, m, trans_b
    if big_m == 1 or big_n == 1:
        return False
    mnk = big_m * big_n * k
    if core in SMALL_KERNEL_CORES and mnk <= 10**6 and not (ta and not trans_a and (big_m * big_n > 1200 or k < 32)):
        return False
    return mnk >= 2 * 262144


def step_gemms(sizes, batch_size, input_delta=False):
    """``(m, n, k, trans_a, trans_b)`` of every GEMM a training step calls: each layer's forward,
    weight gradient and (above layer 0, or at it with ``input_delta``) the delta below."""
    gemms = []
    for layer, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        gemms.append((batch_size, n_out, n_in, False, True))            # a_out = a_in @ w.T
        gemms.append((n_out, n_in, batch_size, True, False))            # grad_w = dz_out.T @ a_in
        if layer or input_delta:
            gemms.append((batch_size, n_in, n_out, False, False))       # dz_in = dz_out @ w
    return gemms


def blas_bytes(sizes, batch_size, threads, core=None, input_delta=False):
    """Transient bytes the BLAS mallocs inside a step's GEMMs: OpenBLAS's job table if any GEMM of the
    step runs threaded (NOTE [ BLAS job table ]).  ``core``: the BLAS core type, default the running one."""
    core = blas_core() if core is None else core
    threaded = any(gemm_mallocs(*g, core, threads) for g in step_gemms(sizes, batch_size, input_delta))
    return BLAS_JOB_BYTES if threaded else 0


# One elementwise value of a step (a sigmoid, a sigma' product, a bias sum) takes about as long
# as this many GEMM FLOPs: 0.5-1.2 ns per value against 70-130 GFLOP/s (README, "On AVX2 and
# AVX-512 CPUs").  Only the balance between layers depends on it.
ELEMENT_FLOPS = 64


def layer_costs(sizes, batch_size):
    """Predicted work of each layer in a plain training step, in GEMM FLOPs: the forward, weight
    and input-delta GEMMs (none for layer 0) plus ``ELEMENT_FLOPS`` per elementwise value."""
    costs = []
    for layer, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        gemms = (3 if layer else 2) * 2 * batch_size * n_in * n_out
        elements = batch_size * (2 * n_out + (n_in if layer else 0))
        costs.append(float(gemms + ELEMENT_FLOPS * elements))
    return costs


def describe_sizes(sizes):
    """``[784] + [256]*64 + [10]`` for long runs of equal widths, else the plain list."""
    runs = []
    for size in sizes:
        if runs and runs[-1][0] == size:
            runs[-1][1] += 1
        else:
            runs.append([size, 1])
    if all(n < 4 for _, n in runs):
        return str(list(sizes))
    return " + ".join(f"[{size}]*{n}" if n > 1 else f"[{size}]" for size, n in runs)


def sum_bytes(sizes, row_split, batch_size, itemsize, input_delta=False):
    """MPI's temporary for a tensor shard's largest in-place ``Allreduce`` (mpich makes one the message's size):
    the output of each row-split layer forward, the input delta of each column-split one backward (layer 0's
    only with ``input_delta``), ``sizes`` the shard's own widths; 0 for a net that is not split."""
    messages = [sizes[layer + 1] for layer, row in enumerate(row_split) if row] + \
        [sizes[layer] for layer, row in enumerate(row_split) if not row and (layer or input_delta)]
    return batch_size * max(messages, default=0) * itemsize
