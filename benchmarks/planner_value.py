"""The planner's value: at the memory PyTorch's ``checkpoint_sequential(8)`` peaks at, fastckpt's best plan.

    python benchmarks/planner_value.py [--repeats 3] [--steps 5] [--dtype float64]

On deep-narrow ([784] + [256]*64 + [10], batch 2048), in fresh processes:

1. memray's peak of PyTorch's ``checkpoint_sequential(8)`` step (building the net and 3 steps, after a
   warm-up step; as ``benchmarks/test_peers.py`` measures every peer), ``P``;
2. the same for fastckpt's ``fit(P)`` (the least-recompute plan whose step fits ``P``) and ``segments(8)``
   (the same segments as PyTorch's), to show that they keep to it;
3. the step time of each, every case in its own process, the processes alternating in a new order each
   repeat; the median step of each process, the median over repeats.

Prints the CPU, AVX-512 or not, OpenBLAS's core type, the versions, the date and the command.  Needs torch;
a quiet machine.
"""
import argparse
import datetime
import json
import os
import random
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES, BATCH = [784] + [256] * 64 + [10], 2048

CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
import fastckpt
from fastckpt.report.measure import memray_peak
spec = json.loads(sys.argv[2])
sizes, batch, dtype = spec["sizes"], spec["batch"], spec["dtype"]
rng = np.random.default_rng(0)
x, y = rng.random((batch, sizes[0])).astype(dtype), rng.random((batch, sizes[-1])).astype(dtype)

def build():
    np.random.seed(0)
    if spec["peer"] == "torch":
        import torch_peer
        from fastckpt.kernels import blas_threads
        like = fastckpt.NetworkWithCheckpointing(sizes, dtype=dtype)
        return torch_peer.TorchNet(sizes, dtype=dtype, segments=8, threads=blas_threads(), like=like)
    return fastckpt.NetworkWithCheckpointing(sizes, strategy=spec["strategy"], dtype=dtype)

model = build()
model.update_mini_batch(x, y, 1e-3)                     # warm-up: the first BLAS calls' buffers, the kernels
if spec["what"] == "peak":
    def run():
        m = build()
        for _ in range(3):
            m.update_mini_batch(x, y, 1e-3)
    out = {"peak": memray_peak(run)}
    if spec["peer"] == "fastckpt":
        plan = model.plan(batch)
        out.update(planned=plan.bytes()["total"], kept=len(plan.kept), recompute=plan.recompute_factor)
    print(json.dumps(out))
else:
    time.sleep(0.2)
    times = []
    for _ in range(spec["steps"]):
        t0 = time.perf_counter()
        model.update_mini_batch(x, y, 1e-3)
        times.append(time.perf_counter() - t0)
    print(json.dumps(sorted(times)[len(times) // 2]))
"""


def child(**spec):
    out = subprocess.run([sys.executable, "-c", CHILD, HERE, json.dumps(spec)], capture_output=True, text=True,
                         check=True, timeout=3600).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    args = parser.parse_args(argv)
    sys.path.insert(0, HERE)
    import torch_peer

    from fastckpt.report.machine import cpu_summary
    if not torch_peer.available():
        print("needs torch (pip install torch==2.13.0, CPU)")
        return 1
    import torch
    print(cpu_summary())
    print(f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}; torch {torch.__version__}")
    print(f"{datetime.date.today()}: python benchmarks/planner_value.py --repeats {args.repeats} --steps "
          f"{args.steps} --dtype {args.dtype}")
    base = dict(sizes=SIZES, batch=BATCH, dtype=args.dtype, steps=args.steps)
    bound = child(**base, what="peak", peer="torch")["peak"]
    cases = {"torch checkpoint_sequential(8)": dict(peer="torch"),
             f"fastckpt fit({bound})": dict(peer="fastckpt", strategy=f"fit({bound})"),
             "fastckpt segments(8)": dict(peer="fastckpt", strategy="segments(8)")}
    peaks = {name: child(**base, **spec, what="peak") for name, spec in cases.items() if spec["peer"] == "fastckpt"}
    times = {name: [] for name in cases}
    for _ in range(args.repeats):
        order = list(cases)
        random.shuffle(order)
        for name in order:
            times[name].append(child(**base, **cases[name], what="time"))
    torch_ms = statistics.median(times["torch checkpoint_sequential(8)"]) * 1e3
    print(f"deep-narrow, batch {BATCH}, {args.dtype}; PyTorch checkpoint_sequential(8) peaks at "
          f"{bound / 2**20:.1f} MiB (memray)")
    print("| step | peak MiB (memray) | planned MiB | kept states | forward FLOPs / one forward pass | ms (median) "
          "| / PyTorch |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in cases:
        ms = statistics.median(times[name]) * 1e3
        p = peaks.get(name)
        cells = ([f"{p['peak'] / 2**20:.1f}", f"{p['planned'] / 2**20:.1f}", str(p["kept"]), f"{p['recompute']:.3f}"]
                 if p else [f"{bound / 2**20:.1f}", "", "", ""])
        print(f"| {name} | {' | '.join(cells)} | {ms:.0f} | {ms / torch_ms:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
