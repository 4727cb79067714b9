"""Throughput with 1 and 2 workers: threads (fastckpt.parallel) and MPI ranks (mpiexec).

Updates take ``per_update`` minibatches in all (by default one per worker), so
samples per second is the fair measure: the speed-up is its ratio.

    python benchmarks/scaling.py [--rounds 5] [--no-mpi]

The adaptive column is ``DataParallel(threads=2)`` as it is by default: on one thread while that is
measured faster (NOTE [ One thread when it is faster ]); the other column always runs on both.
Thread rates are measured in alternating rounds (1 thread, then 2) and the speed-up is the
median of the per-round ratios: this machine's noise moves whole rounds.  By default each rate
is measured in a process of its own: in one process, OpenBLAS's second thread, woken by a
1-thread round's GEMMs, keeps spinning into the next 2-thread round (``--one-process`` shows it).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

import fastckpt
from fastckpt.parallel import DataParallel, pace
from fastckpt.planner.costs import describe_sizes

# (sizes, minibatch, timed updates, minibatches per update: None = one per worker)
CASES = [([784, 40, 30, 10], 10, 400, None), ([784, 40, 30, 10], 10, 300, 8), ([784, 40, 30, 10], 100, 200, None),
         ([784, 40, 30, 10], 100, 60, 8), ([784] + [256] * 64 + [10], 512, 4, None)]


def threads_rate(sizes, batch, updates, threads, per_update, adapt=False):
    per_update = per_update or threads
    rng = np.random.default_rng(0)
    xs, ys = rng.random((per_update, batch, sizes[0])), rng.random((per_update, batch, sizes[-1]))
    np.random.seed(0)
    with DataParallel(fastckpt.Network(sizes), threads=threads, adapt=adapt) as dp:
        for _ in range(1 + (pace.WARM + 2 * (pace.FIRST + 1) if adapt else 0)):   # past the adaptive's first choice
            dp.update_mini_batches(xs, ys, 1e-3)
        times = []
        for _ in range(updates):
            t0 = time.perf_counter()
            dp.update_mini_batches(xs, ys, 1e-3)
            times.append(time.perf_counter() - t0)
    return float(per_update * batch / np.median(times))


def threads_rate_apart(sizes, batch, updates, threads, per_update, adapt=False):
    """:func:`threads_rate` in a fresh process."""
    code = ("import sys, json; sys.path.insert(0, sys.argv[1]); import scaling; "
            "print(scaling.threads_rate(*json.loads(sys.argv[2])))")
    out = subprocess.run([sys.executable, "-P", "-c", code, os.path.dirname(os.path.abspath(__file__)),
                          json.dumps([sizes, batch, updates, threads, per_update, adapt])],
                         capture_output=True, text=True, check=True, timeout=3600).stdout
    return float(out.split()[-1])


def ranks_rate(sizes, batch, ranks, per_update):
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
    if mpiexec is None:
        return float("nan")
    (x, _), _ = fastckpt.load_mnist()
    if sizes[0] != x.shape[1]:
        return float("nan")
    cmd = [mpiexec, "-n", str(ranks), sys.executable, "-m", "fastckpt", "train", "--mpi", "--json",
           "--sizes", ",".join(map(str, sizes)), "--batch-size", str(batch), "--epochs", "2", "--eta", "0.001",
           "--parallel-batches", str(per_update or ranks)]
    result = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=3600).stdout)
    return (per_update or ranks) * batch / (result["ms_per_update"] / 1e3)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-mpi", action="store_true")
    parser.add_argument("--one-process", action="store_true", help="measure every thread rate in this process")
    args = parser.parse_args(argv)
    measure = threads_rate if args.one_process else threads_rate_apart
    from fastckpt.report.machine import cpu_summary
    print(cpu_summary() + "\n")
    print("| net | mini-batch | mini-batches per update | threads 1 -> 2 (samples/s) | speed-up |"
          " 2 threads, adaptive | speed-up | MPI ranks 1 -> 2 (samples/s) | speed-up |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for sizes, batch, updates, per_update in CASES:
        rates = np.array([[measure(sizes, batch, updates, t, per_update, adapt) for t, adapt in
                           ((1, False), (2, False), (2, True))] for _ in range(args.rounds)])
        t1, t2, ta = np.median(rates, axis=0)
        ratios, adaptive = rates[:, 1] / rates[:, 0], rates[:, 2] / rates[:, 0]
        r1, r2 = (float("nan"),) * 2 if args.no_mpi else (ranks_rate(sizes, batch, r, per_update) for r in (1, 2))
        print(f"| {describe_sizes(sizes)} | {batch} | {per_update or 'one per worker'} | {t1:,.0f} -> {t2:,.0f} | "
              f"{np.median(ratios):.2f}x ({ratios.min():.2f}-{ratios.max():.2f}) | {ta:,.0f} | "
              f"{np.median(adaptive):.2f}x ({adaptive.min():.2f}-{adaptive.max():.2f}) | {r1:,.0f} -> {r2:,.0f} | "
              f"{r2 / r1:.2f}x |")


if __name__ == "__main__":
    main()
