"""A training step when other programs share the cores: alone, beside a second training job, beside a busy loop.

    python benchmarks/shared_cores.py [--seconds 8] [--rounds 3] [--sizes 784,512,512,512,10] [--batch-size 256]

Each case starts its processes at once: job A (timed), and what shares the machine with it: nothing, a
second job B alike, one busy loop (one core held), or a PyTorch job training the same net (when torch
is installed).  Every job warms up, then steps for ``--seconds`` and reports its median step; the rounds
alternate the cases, and the table gives the median over rounds and its ratio to A alone in the same
setting and to A alone with ``auto``.  The settings are fastckpt's BLAS threads: ``auto`` (the default,
NOTE [ Threads on a shared machine ]), fixed at the library's count (what 0.3 did), and fixed at 1.
PyTorch runs on its own default threads, alone and beside a second PyTorch job.  Goal (issue: as fast as
the machine): beside another job or a busy loop, each step within 2.2x its time alone with auto, and
never slower than the same step on one thread.  A quiet machine is needed: nothing else running.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

JOB = r"""
import json, os, sys, time
import numpy as np
kind, sizes, batch, seconds, start = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), \
    float(sys.argv[5])
rng = np.random.default_rng(0)
x, y = rng.random((batch, sizes[0])), np.eye(sizes[-1])[np.arange(batch) % sizes[-1]]
if kind == "torch":
    import torch
    layers = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [torch.nn.Linear(a, b, dtype=torch.float64), torch.nn.Sigmoid()]
    net = torch.nn.Sequential(*layers)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    def step():
        opt.zero_grad()
        loss = 0.5 * ((net(xt) - yt) ** 2).sum() / batch
        loss.backward()
        opt.step()
else:
    from fastckpt import Network
    np.random.seed(0)
    net = Network(sizes)
    def step():
        net.update_mini_batch(x, y, 0.01)
step()
while time.time() < start:                      # every process of the case starts stepping together
    time.sleep(0.001)
times = []
end = time.monotonic() + seconds
while time.monotonic() < end:
    t0 = time.perf_counter()
    step()
    times.append(time.perf_counter() - t0)
threads = None
if kind != "torch":
    from fastckpt.kernels import blas_threads_running
    threads = blas_threads_running()
print(json.dumps({"median": float(np.median(times)), "steps": len(times), "threads_at_end": threads}))
"""
SPIN = "import time, sys\nend = time.time() + float(sys.argv[1])\nwhile time.time() < end: pass"


def run_case(setting, beside, sizes, batch, seconds, warmup=6.0):
    """Each job's ``{"median", "steps", "threads_at_end"}`` (A's first) with ``beside`` running; ``warmup``
    seconds for imports and a first step before every process starts stepping together."""
    env = dict(os.environ, FASTCKPT_BLAS_THREADS=setting)
    start = time.time() + warmup
    argv = [json.dumps(sizes), str(batch), str(seconds), str(start)]
    kind = "torch" if setting == "torch" else "fastckpt"
    procs = [subprocess.Popen([sys.executable, "-c", JOB, kind, *argv], stdout=subprocess.PIPE, text=True, env=env)]
    if beside == "second job":
        procs.append(subprocess.Popen([sys.executable, "-c", JOB, kind, *argv], stdout=subprocess.PIPE, text=True,
                                      env=env))
    elif beside == "busy loop":
        procs.append(subprocess.Popen([sys.executable, "-c", SPIN, str(start + seconds + 1 - time.time())]))
    elif beside == "PyTorch job":
        procs.append(subprocess.Popen([sys.executable, "-c", JOB, "torch", *argv], stdout=subprocess.PIPE,
                                      text=True, env=env))
    out = []
    for p in procs:
        text, _ = p.communicate(timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"a job of {setting} beside {beside} failed")
        if text:
            out.append(json.loads(text))
    return out


def cases(library_threads, with_torch):
    settings = ["auto", str(library_threads), "1"]
    besides = ["alone", "second job", "busy loop"] + (["PyTorch job"] if with_torch else [])
    out = [(s, b) for s in settings for b in besides]
    if with_torch:
        out += [("torch", "alone"), ("torch", "second job")]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default="784,512,512,512,10")
    ap.add_argument("--batch-size", type=int, default=256)
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    from fastckpt.kernels import blas_core, blas_threads

    from fastckpt.report.machine import cpu_summary
    try:
        import torch
        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    todo = cases(blas_threads(), torch_version is not None)
    got = {case: [] for case in todo}
    for _ in range(args.rounds):
        for case in todo:
            got[case].append(run_case(*case, sizes, args.batch_size, args.seconds))
    print(f"# {cpu_summary()}; OpenBLAS {blas_core()} kernels, {blas_threads()} threads by default; "
          f"PyTorch {torch_version or 'not installed'}; {datetime.date.today()}")
    print(f"# python benchmarks/shared_cores.py --seconds {args.seconds:g} --rounds {args.rounds} --sizes "
          f"{args.sizes} --batch-size {args.batch_size}")
    print(f"# {sizes}, batch {args.batch_size}, float64; median step of job A over {args.rounds} rounds")
    print("| A's BLAS threads | beside A | A's step (ms) | / A alone, same setting | / A alone, auto | "
          "BLAS threads at the end |")
    print("|---|---|---:|---:|---:|---:|")
    med = {case: statistics.median(r[0]["median"] for r in runs) for case, runs in got.items()}
    for (setting, beside), runs in got.items():
        alone = med[(setting, "alone")]
        auto = med[("auto", "alone")] if setting != "torch" else alone
        ends = sorted({r[0]["threads_at_end"] for r in runs} - {None})
        print(f"| {setting if setting != 'torch' else 'PyTorch (its own)'} | {beside} | "
              f"{1e3 * med[(setting, beside)]:.1f} | {med[(setting, beside)] / alone:.2f}x | "
              f"{med[(setting, beside)] / auto:.2f}x | {', '.join(map(str, ends)) or '-'} |")


if __name__ == "__main__":
    main()
