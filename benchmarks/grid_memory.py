"""Pipelines of tensor-parallel stages: each rank's memray peak against its plan, on 4 and 8 ranks.

    python benchmarks/grid_memory.py

Starts ``mpiexec -n 4`` (1 x 2 x 2: 2 stages of 2 shards) and ``mpiexec -n 8`` (2 x 2 x 2) of itself.
Each rank trains [784] + [256] * 8 + [10] at batch 512 in 4 micro-batches, float64, with a
``PipelineTrainer(tensor_parallel=2)`` for each (schedule, strategy, optimizer) below: one warm-up
update, then memray's peak over making the trainer and two updates, against ``predicted_bytes()``.
Prints the range over the ranks of peak minus plan, per case and grid.
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np

SIZES, BATCH, MICRO = [784] + [256] * 8 + [10], 512, 4
CASES = [("1f1b", "plain", "sgd"), ("1f1b", "sqrt", "sgd"), ("zb1", "plain", "sgd"), ("gpipe", "every_nth(2)", "sgd"),
         ("1f1b", "sqrt", "adam")]


def rank(data):
    from fastckpt.distributed import Grid, PipelineTrainer, mpi_world
    from fastckpt.report.measure import memray_peak
    _, comm = mpi_world()
    rng = np.random.default_rng(0)
    x, y = rng.random((BATCH, SIZES[0])), rng.random((BATCH, SIZES[-1]))
    grid = Grid(data=data, pipeline=2, tensor=2)
    out = {}
    for schedule, strategy, optimizer in CASES:
        def run(held, case=(schedule, strategy, optimizer)):
            np.random.seed(0)
            held.append(PipelineTrainer(SIZES, MICRO, schedule=case[0], strategy=case[1], optimizer=case[2],
                                        batch_size=BATCH, grid=grid))
            for _ in range(2):
                held[-1].update_mini_batch(x, y, 0.01)
        run([])                                                  # warm-up: kernels, BLAS, MPI's buffers
        held = []
        peak = memray_peak(lambda h=held: run(h))
        out[f"{schedule}, {strategy}, {optimizer}"] = peak - held[0].predicted_bytes()["total"]
    every = comm.gather(out)
    if comm.Get_rank() == 0:
        print(json.dumps(every))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        rank(int(sys.argv[2]))
        return
    mpiexec = shutil.which("mpiexec") or os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = {}
    for data in (1, 2):
        proc = subprocess.run([mpiexec, "-n", str(4 * data), sys.executable, __file__, "--rank", str(data)],
                              capture_output=True, text=True, timeout=1200)
        if proc.returncode:
            sys.exit(proc.stderr[-3000:])
        found[data] = json.loads(proc.stdout.splitlines()[-1])
    print("| schedule, strategy, optimizer | 1 x 2 x 2 (4 ranks): peak - plan | 2 x 2 x 2 (8 ranks): peak - plan |")
    print("|---|---|---|")
    for key in found[1][0]:
        cells = []
        for data in (1, 2):
            diffs = [r[key] for r in found[data]]
            cells.append(f"{min(diffs) / 1e3:+.0f} to {max(diffs) / 1e3:+.0f} KB")
        print(f"| {key} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
