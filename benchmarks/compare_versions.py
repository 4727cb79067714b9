"""Step time of two fastckpt installs, alternated round by round in fresh processes: is a change slower?

    python benchmarks/compare_versions.py OLD_PYTHON NEW_PYTHON [--rounds 7] [--no-pipeline]

Each interpreter must import the fastckpt to measure (e.g. two virtual
environments with editable installs of two checkouts).  Every round runs the
old one, then the new one, each in a fresh process that warms up (kernels
compiled or loaded, first BLAS call made) and then times ``update_mini_batch``
on the lab net [784, 40, 30, 10] at batch 10 and on the deep-narrow net
[784] + [256]*64 + [10] at batch 2048 (plain and sqrt), in float64; then, under
``mpiexec -n 2`` (its own, beside each interpreter), a 2-stage pipeline of
[784] + [256]*8 + [10] at batch 512 in 4 micro-batches, 1F1B, ``sqrt`` inside each
stage.  It prints each side's median ms per step and the median over rounds of
new / old, so load on a shared machine hits both sides of a ratio alike.
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

CHILD = r"""
import json, time
import numpy as np
from fastckpt import Network, NetworkWithCheckpointing

def per_step(net, x, y, steps):
    net.update_mini_batch(x, y, 1e-3)                       # warm-up: workspace, kernels, BLAS
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        net.update_mini_batch(x, y, 1e-3)
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))

rng = np.random.default_rng(0)
out = {}
np.random.seed(0)
x, y = rng.random((10, 784)), rng.random((10, 10))
out["lab net, batch 10"] = per_step(Network([784, 40, 30, 10]), x, y, 2000)
x, y = rng.random((2048, 784)), rng.random((2048, 10))
deep = [784] + [256] * 64 + [10]
out["deep-narrow, batch 2048, plain"] = per_step(Network(deep), x, y, 5)
out["deep-narrow, batch 2048, sqrt"] = per_step(NetworkWithCheckpointing(deep, strategy="sqrt"), x, y, 5)
print(json.dumps(out))
"""


PIPELINE = r"""
import json, time
import numpy as np
from mpi4py import MPI
from fastckpt.distributed import PipelineTrainer

rng = np.random.default_rng(0)
x, y = rng.random((512, 784)), rng.random((512, 10))
np.random.seed(0)
trainer = PipelineTrainer([784] + [256] * 8 + [10], 4, schedule="1f1b", strategy="sqrt")
trainer.update_mini_batch(x, y, 1e-3)                       # warm-up
times = []
for _ in range(30):
    MPI.COMM_WORLD.Barrier()
    t0 = time.perf_counter()
    trainer.update_mini_batch(x, y, 1e-3)
    times.append(time.perf_counter() - t0)
if MPI.COMM_WORLD.rank == 0:
    print(json.dumps({"2-rank pipeline, batch 512": 1e3 * float(np.median(times))}))
"""

WHERE = "import fastckpt, fastckpt.kernels as k; print(fastckpt.__file__, k.__file__)"


def run(python, pipeline=True):
    # -c puts the working directory first on sys.path: run where no checkout's fastckpt/ can shadow the install
    proc = subprocess.run([python, "-c", CHILD], capture_output=True, text=True, check=True,
                          cwd=tempfile.gettempdir())
    out = json.loads(proc.stdout.splitlines()[-1])
    if pipeline:
        mpiexec = os.path.join(os.path.dirname(python), "mpiexec")
        proc = subprocess.run([mpiexec, "-n", "2", python, "-c", PIPELINE], capture_output=True, text=True,
                              check=True, cwd=tempfile.gettempdir())
        out.update(json.loads(proc.stdout.splitlines()[-1]))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", help="python of the install to compare against")
    parser.add_argument("new", help="python of the install being checked")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--no-pipeline", action="store_true", help="leave out the 2-rank pipeline (needs mpiexec)")
    args = parser.parse_args()
    for python in (args.old, args.new):
        where = subprocess.run([python, "-c", WHERE], capture_output=True, text=True, check=True,
                               cwd=tempfile.gettempdir()).stdout.strip()
        print(f"{python}: {where}")
    rounds = []
    for r in range(args.rounds):
        old, new = run(args.old, not args.no_pipeline), run(args.new, not args.no_pipeline)
        rounds.append((old, new))
        print(f"round {r + 1}: " + ", ".join(f"{k} {old[k]:.3f} -> {new[k]:.3f} ms" for k in old), flush=True)
    print(f"\n{'case':<34} {'old ms':>9} {'new ms':>9} {'new/old (median of rounds)':>28}")
    for case in rounds[0][0]:
        old = statistics.median(o[case] for o, _ in rounds)
        new = statistics.median(n[case] for _, n in rounds)
        ratio = statistics.median(n[case] / o[case] for o, n in rounds)
        print(f"{case:<34} {old:>9.3f} {new:>9.3f} {ratio:>28.3f}")


if __name__ == "__main__":
    main()
