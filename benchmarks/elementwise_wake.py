"""Bias and sigmoid in the GEMM's wake: the forward pass of deep-narrow's 64 hidden layers, per row block.

    python benchmarks/elementwise_wake.py [--dtype float64] [--rounds 9]

Times, for 64 layers of (2048 x 256) @ (256 x 256)^T: the GEMMs alone; the kernels' forward step now
(one GEMM, then bias and sigmoid over its whole output); and the same with the GEMM cut into blocks of
64-512 rows, each block's bias and sigmoid applied while it is still in cache.  The cases alternate in
each round; medians.  Prints the CPU line, the date and the command.
"""
import argparse
import sys
import time

import numba
import numpy as np
from fastckpt.kernels.activations import SIGMOID, bias_activation
from fastckpt.kernels.blas import NO_TRANS, TRANS
from fastckpt.kernels.dense import dense_forward_layer, gemm


@numba.njit(nogil=True)
def forward_blocked(a, w, b, act, scratch, out, block):
    batch, n_in = a.shape
    n_out = w.shape[0]
    for r0 in range(0, batch, block):
        rows = min(block, batch - r0)
        gemm(NO_TRANS, TRANS, rows, n_out, n_in, 1.0, a[r0:], n_in, w, n_in, 0.0, out[r0:], n_out)
        bias_activation(out[r0:r0 + rows], b, act, scratch)


@numba.njit(nogil=True)
def gemm_only(a, w, out):
    batch, n_in = a.shape
    n_out = w.shape[0]
    gemm(NO_TRANS, TRANS, batch, n_out, n_in, 1.0, a, n_in, w, n_in, 0.0, out, n_out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args(argv)
    from fastckpt.report.machine import cpu_summary
    print(cpu_summary())
    print(f"{time.strftime('%Y-%m-%d')}: python benchmarks/elementwise_wake.py --dtype {args.dtype} "
          f"--rounds {args.rounds}")
    layers, batch, width, dtype = 64, 2048, 256, np.dtype(args.dtype)
    rng = np.random.default_rng(0)
    ws = [(rng.standard_normal((width, width)) * 0.05).astype(dtype) for _ in range(layers)]
    bs = [(rng.standard_normal(width) * 0.05).astype(dtype) for _ in range(layers)]
    acts = [rng.random((batch, width)).astype(dtype) for _ in range(layers + 1)]
    scratch = np.zeros(width)
    cases = {"GEMMs alone": lambda: [gemm_only(acts[i], ws[i], acts[i + 1]) for i in range(layers)],
             "GEMM, then bias + sigmoid (the kernels' step)":
                 lambda: [dense_forward_layer(acts[i], ws[i], bs[i], SIGMOID, scratch, acts[i + 1])
                          for i in range(layers)]}
    for block in (64, 128, 256, 512):
        cases[f"per block of {block} rows"] = lambda block=block: [
            forward_blocked(acts[i], ws[i], bs[i], SIGMOID, scratch, acts[i + 1], block) for i in range(layers)]
    times = {name: [] for name in cases}
    for run in cases.values():
        run()
    for _ in range(args.rounds):
        for name, run in cases.items():
            t0 = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t0)
    base = np.median(times["GEMMs alone"])
    print("| forward pass, 64 layers | ms | / GEMMs alone |")
    print("|---|---:|---:|")
    for name, t in times.items():
        print(f"| {name} | {np.median(t) * 1e3:.1f} | {np.median(t) / base:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
