"""Bytes outside the training step: evaluation and prediction in chunks of rows.

NOTE [ Inference bytes ]
``evaluate``/``predict``/``feedforward`` (fastckpt.engine.inference) run the net over at most
:data:`EVAL_CHUNK` rows at a time.  Per call they make: a staging buffer of the chunk's inputs in
the net's dtype (unless the data already is C-contiguous in it), two buffers of the chunk at the
widest layer that the layers alternate between, and a float64 scratch row.  ``predict`` holds its
int64 result for every row, ``feedforward`` its output for every row.  On top of these, at
different times: OpenBLAS's job table inside a forward GEMM that runs threaded (NOTE [ BLAS job
table ]), and after each chunk's forward pass ``evaluate``'s int64 arg-max and comparison of the
chunk; the larger of the two counts.  tests/test_compact.py holds memray's peak to this.
"""
import numpy as np

from fastckpt.kernels import blas_core as current_blas_core
from fastckpt.kernels import blas_threads as current_blas_threads

from .costs import BLAS_JOB_BYTES, gemm_mallocs

EVAL_CHUNK = 4096          # rows per forward pass in evaluate() and predict()


def inference_bytes(sizes, n_rows, dtype=np.float64, *, staged=True, chunk=EVAL_CHUNK, what="evaluate",
                    blas_threads=None, core=None):
    """The bytes one ``evaluate`` (or ``predict``, ``feedforward``) call on ``n_rows`` rows adds to the
    peak (NOTE [ Inference bytes ]); ``staged``: the data is not C-contiguous in ``dtype`` (Images are not)."""
    if what not in ("evaluate", "predict", "feedforward"):
        raise ValueError(f"what must be 'evaluate', 'predict' or 'feedforward', got {what!r}")
    itemsize = np.dtype(dtype).itemsize
    rows = min(int(chunk), int(n_rows))
    widest = max(sizes[1:])
    total = 2 * rows * widest * itemsize + widest * 8 + (rows * sizes[0] * itemsize if staged else 0)
    if what == "predict":
        total += int(n_rows) * 8                        # every row's class (int64)
    elif what == "feedforward":
        total += int(n_rows) * sizes[-1] * itemsize     # every row's output
    threads = current_blas_threads() if blas_threads is None else blas_threads
    core = current_blas_core() if core is None else core
    blas = BLAS_JOB_BYTES if any(gemm_mallocs(m, n_out, n_in, False, True, core, threads)
                                 for m in {rows, int(n_rows) % rows or rows}
                                 for n_in, n_out in zip(sizes[:-1], sizes[1:])) else 0
    after = rows * 9 if what == "evaluate" else 0       # a chunk's int64 arg-max and its comparison
    return total + max(blas, after)
