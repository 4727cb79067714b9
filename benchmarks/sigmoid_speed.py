"""Nanoseconds per element of ``bias_sigmoid`` on one core, and whether its loop is vectorised.

    python benchmarks/sigmoid_speed.py [--rows 2048] [--cols 256] [--rounds 60]

Prints the CPU, the target Numba compiles for (``NUMBA_CPU_NAME``/``NUMBA_CPU_FEATURES`` change
it; with ``-avx512f`` an AVX-512 machine emulates an AVX2 one), and per dtype the median time
per element and the vector registers in the compiled kernel (``inspect_asm``).
"""
import argparse
import atexit
import os
import shutil
import tempfile
import time

import numpy as np

# Compiled afresh, not loaded from the kernel cache: Numba shows no assembly for cached code.
os.environ["FASTCKPT_CACHE_DIR"] = tempfile.mkdtemp(prefix="fastckpt-sigmoid-")
atexit.register(shutil.rmtree, os.environ["FASTCKPT_CACHE_DIR"], True)

from fastckpt.kernels import bias_sigmoid  # noqa: E402

from fastckpt.report.machine import cpu_summary  # noqa: E402


def per_element(rows, cols, dtype, rounds):
    rng = np.random.default_rng(0)
    z0 = (rng.standard_normal((rows, cols)) * 4).astype(dtype)
    b = rng.standard_normal(cols).astype(dtype)
    z = z0.copy()
    bias_sigmoid(z, b)
    times = []
    for _ in range(rounds):
        z[...] = z0
        start = time.perf_counter()
        bias_sigmoid(z, b)
        times.append(time.perf_counter() - start)
    return float(np.median(times)) / z.size * 1e9


def registers(dtype):
    sig = next(s for s in bias_sigmoid.signatures if str(s[0].dtype) == np.dtype(dtype).name)
    asm = bias_sigmoid.inspect_asm(sig)
    return {reg: asm.count(reg) for reg in ("xmm", "ymm", "zmm")}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--cols", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args(argv)
    print(cpu_summary())
    print(f"bias_sigmoid on {args.rows}x{args.cols}, median of {args.rounds} calls")
    for dtype in (np.float64, np.float32):
        ns = per_element(args.rows, args.cols, dtype, args.rounds)
        print(f"  {np.dtype(dtype).name}: {ns:.2f} ns per element; registers in the kernel {registers(dtype)}")


if __name__ == "__main__":
    main()
