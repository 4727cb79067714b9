"""NOTE [ BLAS job table ]'s model of when OpenBLAS mallocs, against memray, under every core type this CPU runs."""
import json
import os
import subprocess
import sys

import pytest
from fastckpt.kernels import blas_threads

from fastckpt.planner.costs import gemm_mallocs

PROBE = r"""
import ctypes, json, os, sys, tempfile
import memray, numpy as np
from fastckpt.kernels import blas, blas_core, blas_threads
for f, t in ((blas._dgemm, ctypes.c_double), (blas._sgemm, ctypes.c_float)):
    f.restype = None
    f.argtypes = [ctypes.c_int32] * 3 + [ctypes.c_int64] * 3 + [t, ctypes.c_void_p, ctypes.c_int64,
                                                               ctypes.c_void_p, ctypes.c_int64, t, ctypes.c_void_p,
                                                               ctypes.c_int64]
out = []
for dtype, m, n, k, ta, tb, alpha, beta in json.loads(sys.argv[1]):
    a = np.ones((k, m) if ta else (m, k), dtype); b = np.ones((n, k) if tb else (k, n), dtype)
    c = np.ones((m, n), dtype)
    gemm = blas._dgemm if dtype == "float64" else blas._sgemm
    def run():
        gemm(101, 112 if ta else 111, 112 if tb else 111, m, n, k, alpha, a.ctypes.data, a.shape[1],
             b.ctypes.data, b.shape[1], beta, c.ctypes.data, n)
    run()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "p.bin")
        with memray.Tracker(path, trace_python_allocators=True):
            run()
        out.append(memray.FileReader(path).metadata.peak_memory >= 256 * 1024)
print(json.dumps({"core": blas_core(), "threads": blas_threads(), "mallocs": out}))
"""

# around every edge of the model: m*n*k at 524288 and 10**6, M*N at 1200, K at 32, GEMV shapes, each transposition
SHAPES = [(m, n, k) for m, n, k in [(2, 512, 512), (3, 512, 512), (4, 512, 512), (1, 512, 784), (512, 1, 784),
                                     (2, 300, 1024), (3, 400, 512), (4, 300, 512), (40, 30, 784), (100, 30, 256),
                                     (8, 512, 256), (33, 512, 32), (64, 512, 31), (128, 128, 40), (256, 256, 16),
                                     (10, 1000, 100), (1000, 10, 100), (2048, 256, 256)]]
CASES = [[dtype, m, n, k, ta, tb, alpha, beta] for dtype in ("float64", "float32") for m, n, k in SHAPES
         for ta, tb in ((0, 0), (0, 1), (1, 0)) for alpha, beta in ((1.0, 0.0), (-0.25, 1.0))]


@pytest.mark.memory
@pytest.mark.parametrize("coretype", ["", "Haswell", pytest.param("SkylakeX", marks=pytest.mark.avx512), "Zen",
                                      pytest.param("CooperLake", marks=pytest.mark.avx512), "Sandybridge"])
@pytest.mark.sweep('')
def test_the_model_says_which_gemms_malloc(coretype):
    if blas_threads() < 2:
        pytest.skip("BLAS runs on one thread here: no job table to predict")
    env = dict(os.environ, OPENBLAS_CORETYPE=coretype) if coretype else \
        {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(CASES)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    wrong = [(case, measured) for case, measured in zip(CASES, got["mallocs"])
             if gemm_mallocs(*case[1:6], got["core"], got["threads"]) != measured]
    assert not wrong, (got["core"], wrong[:8])
    assert any(got["mallocs"]) and not all(got["mallocs"])            # the grid straddles the edges


def test_one_thread_never_mallocs():
    assert not any(gemm_mallocs(2048, 2048, 2048, ta, tb, core, 1) for ta in (0, 1) for tb in (0, 1)
                   for core in ("Haswell", "SkylakeX"))
