"""Throughput with 1 and 2 workers: threads (fastckpt.parallel) and MPI ranks (mpiexec).

Each worker takes one minibatch per update, so samples per second is the fair
measure: the speed-up is the ratio of samples per second.

    python benchmarks/scaling.py
"""
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

import fastckpt
from fastckpt.parallel import DataParallel
from fastckpt.strategies import describe_sizes

CASES = [([784, 40, 30, 10], 10, 400), ([784, 40, 30, 10], 100, 200), ([784] + [256] * 64 + [10], 512, 4)]


def threads_rate(sizes, batch, updates, threads):
    rng = np.random.default_rng(0)
    xs, ys = rng.random((threads, batch, sizes[0])), rng.random((threads, batch, sizes[-1]))
    np.random.seed(0)
    with DataParallel(fastckpt.Network(sizes), threads=threads) as dp:
        dp.update_mini_batches(xs, ys, 1e-3)
        times = []
        for _ in range(updates):
            t0 = time.perf_counter()
            dp.update_mini_batches(xs, ys, 1e-3)
            times.append(time.perf_counter() - t0)
    return threads * batch / np.median(times)


def ranks_rate(sizes, batch, ranks):
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
    if mpiexec is None:
        return float("nan")
    (x, _), _ = fastckpt.load_mnist()
    if sizes[0] != x.shape[1]:
        return float("nan")
    cmd = [mpiexec, "-n", str(ranks), sys.executable, "-m", "fastckpt", "train", "--mpi", "--json",
           "--sizes", ",".join(map(str, sizes)), "--batch-size", str(batch), "--epochs", "2", "--eta", "0.001"]
    result = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=3600).stdout)
    return ranks * batch / (result["ms_per_update"] / 1e3)


def main():
    print("| net | minibatch per worker | threads 1 -> 2 (samples/s) | speed-up | MPI ranks 1 -> 2 (samples/s) | speed-up |")
    print("|---|---:|---:|---:|---:|---:|")
    for sizes, batch, updates in CASES:
        t1, t2 = threads_rate(sizes, batch, updates, 1), threads_rate(sizes, batch, updates, 2)
        r1, r2 = ranks_rate(sizes, batch, 1), ranks_rate(sizes, batch, 2)
        print(f"| {describe_sizes(sizes)} | {batch} | {t1:,.0f} -> {t2:,.0f} | {t2 / t1:.2f}x | "
              f"{r1:,.0f} -> {r2:,.0f} | {r2 / r1:.2f}x |")


if __name__ == "__main__":
    main()
