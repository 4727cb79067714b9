"""fastckpt.sklearn against scikit-learn's own MLPs: the same estimator settings, the same data, the same dtype.

    python benchmarks/sklearn_peer.py [--repeats 5] [--cases fashion,friedman] [--dtypes float64,float32]
                                      [--data /usr/share/datasets/fashion-mnist] [--threads N]

Cases (the issue's):

* ``fashion``: Fashion-MNIST (60,000 images scaled to [0, 1], the 10,000 test images scored), ``MLPClassifier(
  hidden_layer_sizes=(256, 128), activation="relu", solver="adam", batch_size=256, max_iter=5)``; skipped when
  the IDX folder is absent (``apt-get install dataset-fashion-mnist`` puts it in the default ``--data``);
* ``friedman``: ``make_friedman1`` 60,000 rows (50,000 to fit, 10,000 scored by R²),
  ``MLPRegressor(hidden_layer_sizes=(128, 64), batch_size=200, max_iter=10)``.

Both with ``random_state=0``, so both libraries start from the same weights (fastckpt draws them as
scikit-learn does); a binary classifier would not, but these are not binary.  Each run is a fresh process: the
data is made, a warm-up fit of one epoch on 2,048 rows loads the compiled kernels (neither library's fit is
timed with a compilation in it), then the timed ``fit`` and the score.  A repeat runs every (library, case,
dtype) once, in a new random order, so the drifts of a shared machine fall on both libraries alike; the table
gives medians over the repeats and, per case, the median of each repeat's own ratio fastckpt / scikit-learn,
of the wall time and of the process's CPU time (the threads' time together: on a busy machine, where a
process waits for a core, the CPU time still counts its work alone).
Prints the CPU, AVX-512 or not, the versions, the date, the command and the load average before and after.

BLAS threads: by default each library takes its own (numpy's OpenBLAS its cores' count; fastckpt as many as
the other programs leave free, NOTE [ Threads on a shared machine ]), which on a busy machine favours fastckpt;
``--threads N`` runs both on exactly N (``OPENBLAS_NUM_THREADS`` and ``FASTCKPT_BLAS_THREADS``).
"""
import argparse
import datetime
import json
import os
import random
import statistics
import subprocess
import sys

FASHION = "/usr/share/datasets/fashion-mnist"
SETTINGS = {"fashion": dict(hidden_layer_sizes=(256, 128), activation="relu", solver="adam", batch_size=256,
                            max_iter=5, random_state=0),
            "friedman": dict(hidden_layer_sizes=(128, 64), batch_size=200, max_iter=10, random_state=0)}

CHILD = r"""
import json, sys, time, warnings
import numpy as np
from sklearn.exceptions import ConvergenceWarning
warnings.simplefilter("ignore", ConvergenceWarning)
lib, case, dtype, folder = sys.argv[1], sys.argv[2], np.dtype(sys.argv[3]), sys.argv[4]
settings = json.loads(sys.argv[5])
settings["hidden_layer_sizes"] = tuple(settings["hidden_layer_sizes"])
if case == "fashion":
    import fastckpt
    (x, y), (xt, yt) = fastckpt.load_mnist(folder)
    x, xt = (np.ascontiguousarray(a.reshape(len(a), -1), dtype=dtype) for a in (x, xt))
    y, yt = y.argmax(axis=1) if y.ndim == 2 else y, yt.argmax(axis=1) if yt.ndim == 2 else yt
else:
    from sklearn.datasets import make_friedman1
    data, target = make_friedman1(60_000, random_state=0)
    x, xt, y, yt = data[:50_000].astype(dtype), data[50_000:].astype(dtype), target[:50_000], target[50_000:]
if lib == "floor":                       # the fit's GEMMs and Adam steps alone, nothing else
    from fastckpt.kernels import adam_step
    outputs = 10 if case == "fashion" else 1
    sizes = [x.shape[1], *settings["hidden_layer_sizes"], outputs]
    sys.path.insert(0, sys.argv[6])
    from step_parts import gemm_step
    batch, rng = settings["batch_size"], np.random.default_rng(0)
    gemms = gemm_step(sizes, batch, dtype)
    n = sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))
    p, g = rng.random(n).astype(dtype), (rng.random(n) * 1e-3).astype(dtype)
    m, v = np.zeros(n, dtype), np.zeros(n, dtype)
    blocks = np.array([[0, n]], dtype=np.int64)
    def step():
        gemms()
        adam_step(p, g, m, v, 1e-3, 0.9, 0.999, 1e-8, 0.0, False, 0.1, 0.001, blocks)
    steps = settings["max_iter"] * -(-len(x) // batch)
    for _ in range(10):
        step()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(json.dumps({"seconds": seconds, "cpu": cpu, "score": float("nan"), "epochs": settings["max_iter"]}))
    sys.exit(0)
if lib == "fastckpt":
    from fastckpt.sklearn import MLPClassifier, MLPRegressor
    extra = {"dtype": dtype}
else:
    from sklearn.neural_network import MLPClassifier, MLPRegressor
    extra = {}
Model = MLPClassifier if case == "fashion" else MLPRegressor
Model(**dict(settings, max_iter=1), **extra).fit(x[:2048], y[:2048])          # warm-up: kernels loaded
model = Model(**settings, **extra)
t0, c0 = time.perf_counter(), time.process_time()
model.fit(x, y)
seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
print(json.dumps({"seconds": seconds, "cpu": cpu, "score": float(model.score(xt, yt)), "epochs": model.n_iter_}))
"""


def run(lib, case, dtype, folder, threads=None):
    env = dict(os.environ)
    if threads:
        env.update(OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
                   FASTCKPT_BLAS_THREADS=str(threads))
    proc = subprocess.run([sys.executable, "-c", CHILD, lib, case, dtype, folder, json.dumps(SETTINGS[case]),
                           os.path.dirname(os.path.abspath(__file__))],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{lib} {case} {dtype}: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def versions():
    import numpy
    import sklearn

    import fastckpt
    return f"fastckpt {fastckpt.__version__}, scikit-learn {sklearn.__version__}, numpy {numpy.__version__}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--cases", default="fashion,friedman")
    p.add_argument("--dtypes", default="float64,float32")
    p.add_argument("--data", default=FASHION, help="Fashion-MNIST's IDX folder")
    p.add_argument("--threads", type=int, default=None, help="BLAS threads of both libraries (default: their own)")
    p.add_argument("--floor", action="store_true",
                   help="also time the fit's GEMMs and Adam steps alone, as many as the fit takes, in the same "
                        "rotation: the floor under any library's fit on this BLAS")
    args = p.parse_args(argv)
    from fastckpt.report.machine import cpu_summary
    cases = [c for c in args.cases.split(",") if c != "fashion" or os.path.isdir(args.data)]
    if len(cases) < len(args.cases.split(",")):
        print(f"note: no Fashion-MNIST at {args.data!r} (apt-get install dataset-fashion-mnist): fashion skipped")
    print(f"{cpu_summary()}; {versions()}; {datetime.date.today()}; command: python benchmarks/sklearn_peer.py "
          + " ".join(argv if argv is not None else sys.argv[1:]))
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    runs = [(lib, case, dtype) for case in cases for dtype in args.dtypes.split(",")
            for lib in ("fastckpt", "scikit-learn") + (("floor",) if args.floor else ())]
    results = {key: [] for key in runs}
    for repeat in range(args.repeats):
        order = random.Random(repeat).sample(runs, len(runs))
        for key in order:
            results[key].append(run(*key, args.data, args.threads))
            print(f"  repeat {repeat + 1}: {' '.join(key)}: {results[key][-1]}", flush=True)
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    table(results, cases, args.dtypes.split(","), args.floor)


def table(results, cases, dtypes, floor=False):
    """Medians per library, and the median of each repeat's ratio fastckpt / scikit-learn."""
    print("\n| case | dtype | library | fit (s) | CPU (s) | score | fit time / scikit-learn's | CPU time / "
          "scikit-learn's |")
    print("|---|---|---|---|---|---|---|---|")
    for case in cases:
        for dtype in dtypes:
            ours, theirs = results[("fastckpt", case, dtype)], results[("scikit-learn", case, dtype)]
            ratio = statistics.median(a["seconds"] / b["seconds"] for a, b in zip(ours, theirs))
            cpu = statistics.median(a["cpu"] / b["cpu"] for a, b in zip(ours, theirs))
            libs = [("fastckpt", ours, ratio, cpu), ("scikit-learn", theirs, None, None)]
            if floor:
                rows = results[("floor", case, dtype)]
                libs.append(("GEMMs + Adam alone", rows,
                             statistics.median(a["seconds"] / b["seconds"] for a, b in zip(rows, theirs)),
                             statistics.median(a["cpu"] / b["cpu"] for a, b in zip(rows, theirs))))
            for lib, rows, wall, cpu_ratio in libs:
                print(f"| {case} | {dtype} | {lib} | {statistics.median(r['seconds'] for r in rows):.2f} | "
                      f"{statistics.median(r['cpu'] for r in rows):.2f} | "
                      f"{statistics.median(r['score'] for r in rows):.4f} | "
                      f"{f'{wall:.2f}x' if wall else '1'} | {f'{cpu_ratio:.2f}x' if cpu_ratio else '1'} |")


if __name__ == "__main__":
    main()
