"""fastckpt against its peers, each case in its own process, the processes alternating: the issue's method.

    python benchmarks/peers_alternating.py [--repeats 3] [--nets lab,deep-narrow] [--dtypes float64,float32]

A case is one net x dtype x mode x peer of ``benchmarks/test_peers.py`` (fastckpt, the same step's GEMMs
through numpy's and PyTorch's BLAS, PyTorch, JAX and, for the lab net, the lab's NumPy code).  Each case
runs in a fresh process: build, one warm-up step, then ``--steps`` timed steps (their median).  A repeat
runs every case once, in a new order each time, so slow drifts of a shared machine hit all alike; the table
gives the median over repeats, and fastckpt's ratio to each peer (below 1: fastckpt is faster).  Prints the
CPU, AVX-512 or not, OpenBLAS's core type, the peers' versions, the date and the command.  A quiet machine is
needed: nothing else running.
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

CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
import test_peers
net, dtype, mode, peer, steps = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6])
sizes, batch, _, _, (strategy, segments) = test_peers.NETS[net]
rng = np.random.default_rng(0)
x, y = rng.random((batch, sizes[0])).astype(dtype), rng.random((batch, sizes[-1])).astype(dtype)
np.random.seed(0)
model = test_peers._build(peer, sizes, batch, dtype, mode, strategy, segments)
model.update_mini_batch(x, y, test_peers.ETA)
time.sleep(0.2)
times = []
for _ in range(steps):
    t0 = time.perf_counter()
    model.update_mini_batch(x, y, test_peers.ETA)
    times.append(time.perf_counter() - t0)
print(json.dumps(sorted(times)[len(times) // 2]))
"""


def cases(nets, dtypes):
    import test_peers
    for net in nets:
        for dtype in dtypes:
            for mode in ("plain", "checkpointed"):
                for peer in test_peers.PEERS:
                    if peer == "lab-numpy" and (net != "lab" or dtype != "float64"):
                        continue
                    if peer.startswith("gemm-only") and mode == "checkpointed":
                        continue
                    yield net, dtype, mode, peer


def available(peer):
    import jax_peer
    import torch_peer
    return not ((peer.endswith("torch") and not torch_peer.available()) or (peer == "jax" and not jax_peer.available()))


def versions():
    import numpy as np
    out = [f"numpy {np.__version__}"]
    for name in ("torch", "jax"):
        try:
            out.append(f"{name} {__import__(name).__version__}")
        except ImportError:
            out.append(f"{name} not installed")
    return ", ".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--nets", default="lab,deep-narrow")
    p.add_argument("--dtypes", default="float64,float32")
    p.add_argument("--steps", type=int, default=0, help="timed steps per process (default: 200 lab, 5 others)")
    args = p.parse_args(argv)
    sys.path.insert(0, HERE)
    from fastckpt.report.machine import cpu_summary
    todo = [c for c in cases(args.nets.split(","), args.dtypes.split(",")) if available(c[3])]
    runs = {c: [] for c in todo}
    order = random.Random(0)
    for _ in range(args.repeats):
        order.shuffle(todo)
        for c in todo:
            steps = args.steps or (200 if c[0] == "lab" else 5)
            proc = subprocess.run([sys.executable, "-c", CHILD, HERE, *c, str(steps)], capture_output=True,
                                  text=True, timeout=1800)
            if proc.returncode != 0:
                raise SystemExit(f"{c}: {proc.stderr.strip().splitlines()[-1]}")
            runs[c].append(json.loads(proc.stdout))
    print(f"{cpu_summary()}; {versions()}; {datetime.date.today()}; command: python benchmarks/"
          f"peers_alternating.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    groups = sorted({c[:3] for c in runs})
    print("| case | peer | median ms | fastckpt / peer |\n|---|---|---:|---:|")
    for g in groups:
        mine = statistics.median(runs[(*g, "fastckpt")])
        for c in sorted(c for c in runs if c[:3] == g):
            t = statistics.median(runs[c])
            print(f"| {' '.join(g)} | {c[3]} | {t * 1e3:.3f} | {mine / t:.2f} |")


if __name__ == "__main__":
    main()
