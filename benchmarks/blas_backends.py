"""The kernels' one GEMM entry (``fastckpt.kernels.gemm``) under each BLAS backend this machine has
(NOTE [ BLAS backends ] in kernels/blas.py): numpy's OpenBLAS, and MKL when its wheel is installed.

    python benchmarks/blas_backends.py [--repeats 30]

Each backend runs in its own process (``FASTCKPT_BLAS`` is read once per process), on 2 threads,
timing the step's GEMM shapes of the lab net, deep-narrow and the deep Fashion-MNIST net; medians,
and each backend's time over OpenBLAS's.  Prints the CPU, AVX-512 or not, OpenBLAS's core type,
the date and the command.
"""
import argparse
import json
import os
import subprocess
import sys
import time

SHAPES = {  # name: (m, n, k, dtype): C (m, n) = A (m, k) @ W (n, k)^T, a forward GEMM of the net
    "lab (100x784) @ (784x40)^T f64": (100, 40, 784, "float64"),
    "deep-narrow (2048x256) @ (256x256)^T f64": (2048, 256, 256, "float64"),
    "deep-narrow (2048x256) @ (256x256)^T f32": (2048, 256, 256, "float32"),
    "fashion deep (128x512) @ (512x512)^T f32": (128, 512, 512, "float32"),
}

_CHILD = r"""
import json, sys, time
import numpy as np
from fastckpt.kernels import NO_TRANS, TRANS, blas_core, gemm, set_blas_threads
set_blas_threads(2)
out = {"blas": blas_core()}
for name, (m, n, k, dt) in json.loads(sys.argv[1]).items():
    rng = np.random.default_rng(0)
    a, w, c = rng.random((m, k)).astype(dt), rng.random((n, k)).astype(dt), np.empty((m, n), dt)
    for _ in range(3):
        gemm(NO_TRANS, TRANS, m, n, k, 1.0, a, k, w, k, 0.0, c, n)
    times = []
    for _ in range(int(sys.argv[2])):
        t0 = time.perf_counter()
        gemm(NO_TRANS, TRANS, m, n, k, 1.0, a, k, w, k, 0.0, c, n)
        times.append(time.perf_counter() - t0)
    out[name] = sorted(times)[len(times) // 2]
print(json.dumps(out))
"""


def measure(backend, repeats):
    env = dict(os.environ, FASTCKPT_BLAS=backend)
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(SHAPES), str(repeats)], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return None, proc.stderr.strip().splitlines()[-1]
    return json.loads(proc.stdout), None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=30)
    args = p.parse_args(argv)
    from fastckpt.report.machine import cpu_summary
    print(f"{cpu_summary()}; {time.strftime('%Y-%m-%d')}; command: python benchmarks/blas_backends.py "
          f"{' '.join(sys.argv[1:])}")
    results = {}
    for backend in ("openblas", "mkl"):
        got, why = measure(backend, args.repeats)
        if got is None:
            print(f"{backend}: skipped ({why})")
            continue
        results[backend] = got
    print(f"{'GEMM':<44}" + "".join(f"{name + ' us':>16}" for name in results) + f"{'x openblas':>12}")
    for shape in SHAPES:
        cells = "".join(f"{results[name][shape] * 1e6:>16.0f}" for name in results)
        ratio = results["mkl"][shape] / results["openblas"][shape] if "mkl" in results else float("nan")
        print(f"{shape:<44}{cells}{ratio:>12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
