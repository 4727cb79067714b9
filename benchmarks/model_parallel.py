"""Samples per second of data, pipeline and tensor parallelism on 2 MPI ranks, against one process.

    python benchmarks/model_parallel.py [--rounds 5] [--quick]

Runs one process (BLAS on every core) in this process, then ``mpiexec -n 2`` of
this script with ``--ranks`` for the distributed cases; prints one table.  Each
rate is the median over ``--rounds`` rounds of timed updates after a warm-up.
Pipeline rows also give the measured bubble (the share of the stages' time not
spent computing, averaged over the ranks) beside the schedule's formula
(``(P-1)/(M+P-1)`` for gpipe and 1f1b, ``(P-1)/(3M+P-1)`` for zb1), and every
row the bytes a rank sends per update.  ``--pipeline-only`` skips the data and
tensor rows.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from functools import partial

import numpy as np

import fastckpt
from fastckpt.planner.costs import describe_sizes
from fastckpt.report.machine import cpu_summary

NETS = [("lab", [784, 40, 30, 10], 100), ("deep-narrow", [784] + [256] * 64 + [10], 512)]


def _rate(step, batch, rounds, updates):
    step()
    rates = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(updates):
            step()
        rates.append(batch * updates / (time.perf_counter() - t0))
    return float(np.median(rates))


def _data(sizes, batch):
    rng = np.random.default_rng(0)
    return rng.random((batch, sizes[0])), rng.random((batch, sizes[-1]))


def one_process(rounds, nets):
    rows = []
    for name, sizes, batch in nets:
        x, y = _data(sizes, batch)
        np.random.seed(0)
        net = fastckpt.Network(sizes)
        updates = 200 if len(sizes) < 10 else 2
        rows.append({"net": name, "mode": "one process", "rate": _rate(
            partial(net.update_mini_batch, x, y, 1e-3), batch, rounds, updates), "bytes": 0})
    return rows


IDEAL = {"gpipe": lambda p, m: (p - 1) / (m + p - 1), "1f1b": lambda p, m: (p - 1) / (m + p - 1),
         "zb1": lambda p, m: (p - 1) / (3 * m + p - 1)}


def ranks(rounds, nets, micro, pipeline_only=False):
    from fastckpt.distributed import MPITrainer, mpi_world
    from fastckpt.parallel import PipelineTrainer, TensorParallelTrainer
    _, comm = mpi_world()
    rank, size = comm.Get_rank(), comm.Get_size()
    rows = []
    for name, sizes, batch in nets:
        x, y = _data(sizes, batch)
        updates = 200 if len(sizes) < 10 else 2
        if not pipeline_only:
            np.random.seed(0)
            dp = MPITrainer(fastckpt.Network(sizes))
            half = slice(rank * batch // size, (rank + 1) * batch // size)
            rate = _rate(partial(dp.update, x[half], y[half], 1e-3), batch, rounds, updates)
            rows.append({"net": name, "mode": "data", "rate": rate, "bytes": dp.bytes_per_update // 2})
            np.random.seed(0)
            tp = TensorParallelTrainer(sizes)
            rate = _rate(partial(tp.update_mini_batch, x, y, 1e-3), batch, rounds, updates)
            rows.append({"net": name, "mode": "tensor", "rate": rate, "bytes": tp.bytes_per_update})
        for schedule in ("gpipe", "1f1b", "zb1"):
            for m in micro:
                np.random.seed(0)
                pp = PipelineTrainer(sizes, m, schedule=schedule, batch_size=batch)
                pp.update_mini_batch(x, y, 1e-3)
                pp.stats.update(busy=0.0, wall=0.0)
                rate = _rate(partial(pp.update_mini_batch, x, y, 1e-3), batch, rounds, updates)
                bubble = pp.bubble_fraction()
                rows.append({"net": name, "mode": f"pipeline {schedule} M={m}", "rate": rate,
                             "bytes": pp.bytes_per_update, "bubble": bubble,
                             "ideal": IDEAL[schedule](size, m), "partition": pp.partition})
    return rows if rank == 0 else None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="the lab net only, fewer micro-batch counts")
    parser.add_argument("--pipeline-only", action="store_true", help="only the pipeline rows (and one process)")
    parser.add_argument("--ranks", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    nets = NETS[:1] if args.quick else NETS
    micro = [1, 4] if args.quick else [1, 2, 4, 8, 16]
    if args.ranks:
        rows = ranks(args.rounds, nets, micro, args.pipeline_only)
        if rows is not None:
            print(json.dumps(rows))
        return 0
    print(cpu_summary())
    flags = [flag for flag, on in (("--quick", args.quick), ("--pipeline-only", args.pipeline_only)) if on]
    print(f"{time.strftime('%Y-%m-%d')}: python benchmarks/model_parallel.py --rounds {args.rounds} {' '.join(flags)}")
    rows = one_process(args.rounds, nets)
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
    if mpiexec is None:
        print("no mpiexec: only the one-process rates")
    else:
        cmd = [mpiexec, "-n", "2", sys.executable, os.path.abspath(__file__), "--ranks", "--rounds", str(args.rounds)]
        out = subprocess.run(cmd + flags, capture_output=True, text=True, check=True,
                             timeout=3600).stdout
        rows += json.loads(out.strip().splitlines()[-1])
    base = {r["net"]: r["rate"] for r in rows if r["mode"] == "one process"}
    print("| net | mode | samples/s | vs one process | bytes sent per update per rank | bubble (measured / ideal) |")
    print("|---|---|---:|---:|---:|---|")
    for r in rows:
        sizes = dict((n, s) for n, s, _ in NETS)[r["net"]]
        bubble = f"{r['bubble']:.2f} / {r['ideal']:.2f}" if "bubble" in r else ""
        print(f"| {r['net']} {describe_sizes(sizes)} | {r['mode']} | {r['rate']:,.0f} | "
              f"{r['rate'] / base[r['net']]:.2f} | {r['bytes']:,.0f} | {bubble} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
