"""Data parallelism on 2 MPI ranks: the update with the ordered gradient sum against overlapped buckets.

    python benchmarks/overlap.py [--rounds 7] [--async-progress]

Starts ``mpiexec -n 2`` of itself.  Each rank trains its own minibatch of
[784] + [256]*16 + [10] (batch 256 per rank, float64, a 9.1 MiB gradient)
with ``MPITrainer``: its default on 2 ranks (one ``Allreduce`` after the
backward pass) and buckets of 1, 4 and 25 MiB (``bucket_bytes``), beside the
ordered sum of more ranks (a reduce to rank 0 and a broadcast, by hand after
the same step) and the rank's gradients alone (the step with no exchange: the
floor).  The settings alternate in each round, every rank
starting each timing together (a barrier); the table gives the median of the
rounds' ms per update and what the exchange adds to the floor.
``--async-progress`` runs mpich with ``MPIR_CVAR_ASYNC_PROGRESS=1`` (a thread
per rank that moves the messages on while the kernels run).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

SIZES, BATCH, UPDATES = [784] + [256] * 16 + [10], 256, 10
SETTINGS = [("one Allreduce (the default on 2 ranks)", None), ("buckets 1 MiB", 2**20), ("buckets 4 MiB", 4 * 2**20),
            ("buckets 25 MiB", 25 * 2**20)]


def ranks(rounds):
    import fastckpt
    from fastckpt.distributed import MPITrainer, mpi_world
    from fastckpt.engine import Engine
    _, comm = mpi_world()
    rng = np.random.default_rng(comm.Get_rank())
    x, y = rng.random((BATCH, SIZES[0])), rng.random((BATCH, SIZES[-1]))
    trainers = []
    for _, bucket in SETTINGS:
        np.random.seed(0)
        trainers.append(MPITrainer(fastckpt.Network(SIZES), bucket_bytes=bucket))
    alone = fastckpt.Network(SIZES)
    engine = Engine(alone.plan(BATCH))
    local, total = alone.params.new_buffer(), alone.params.new_buffer()

    def reduce_and_broadcast():
        engine.gradients(alone.params, x, y, out=local)
        comm.Reduce(local, total, root=0)
        comm.Bcast(total, root=0)
        alone.params.update(total, 1e-3 / 2)
    steps = [lambda t=t: t.update_mini_batch(x, y, 1e-3) for t in trainers]
    steps += [reduce_and_broadcast, lambda: engine.gradients(alone.params, x, y)]
    times = [[] for _ in steps]
    for step in steps:
        step()
    for r in range(rounds):
        for k in np.roll(np.arange(len(steps)), r):
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(UPDATES):
                steps[k]()
            times[k].append((time.perf_counter() - t0) / UPDATES * 1e3)
    medians = comm.gather([float(np.median(t)) for t in times])
    return medians if comm.Get_rank() == 0 else None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--async-progress", action="store_true")
    parser.add_argument("--ranks", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.ranks:
        rows = ranks(args.rounds)
        if rows is not None:
            print(json.dumps(rows))
        return 0
    from fastckpt.report.machine import cpu_summary
    print(cpu_summary())
    print(f"{time.strftime('%Y-%m-%d')}: python benchmarks/overlap.py --rounds {args.rounds}"
          + (" --async-progress" if args.async_progress else ""))
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
    if mpiexec is None:
        print("no mpiexec (pip install mpi4py mpich)")
        return 1
    env = dict(os.environ, **({"MPIR_CVAR_ASYNC_PROGRESS": "1"} if args.async_progress else {}))
    out = subprocess.run([mpiexec, "-n", "2", sys.executable, os.path.abspath(__file__), "--ranks", "--rounds",
                          str(args.rounds)], capture_output=True, text=True, check=True, timeout=3600, env=env).stdout
    medians = json.loads(out.strip().splitlines()[-1])
    floor = max(rank[-1] for rank in medians)
    print(f"{SIZES[:2]} + ... ({len(SIZES) - 1} layers), batch {BATCH} per rank, 2 ranks; medians of "
          f"{args.rounds} rounds of {UPDATES} updates")
    print("| exchange | ms per update (rank 0 / rank 1) | over the gradients alone |")
    print("|---|---:|---:|")
    for k, name in enumerate([name for name, _ in SETTINGS] + ["reduce to rank 0 + broadcast (ordered, > 2 ranks)"]):
        slowest = max(rank[k] for rank in medians)
        print(f"| {name} | {medians[0][k]:.2f} / {medians[1][k]:.2f} | +{slowest - floor:.2f} ms |")
    print(f"| gradients alone, no exchange | {medians[0][-1]:.2f} / {medians[1][-1]:.2f} | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
