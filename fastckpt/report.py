"""The ``compare`` job: train plainly and with strategies from one seed, measure, and report.

Each run trains in its own process (see ``_CHILD``), so the lab's
RSS-per-update series of one run carries nothing of another.
Results are plain dicts, so the same numbers feed the table, ``--json`` and the
files of ``--out`` (two PNGs of the lab notebook, memory against depth, and a
markdown summary).
"""
import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil

from . import memory
from .checkpointing import NetworkWithCheckpointing
from .network import Network
from .plots import draw, figure, plot_depth, save

MiB = 2**20
MEMRAY_STEPS = 5  # training steps in the memray-measured build-and-train


class Progress:
    """A bar redrawn in place on a terminal, one line per epoch otherwise (no carriage returns in logs)."""

    def __init__(self, name, epochs, stream=None):
        self.name, self.epochs = name, epochs
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.t0 = time.perf_counter()

    def update(self, epoch, done, total):
        if self.tty and (done == total or done % max(1, total // 50) == 0):
            filled = int(30 * done / total)
            self.stream.write(f"\r{self.name:<16} epoch {epoch + 1}/{self.epochs} "
                              f"[{'#' * filled}{'.' * (30 - filled)}] {100 * done // total:3d}%")
            self.stream.flush()

    def epoch_done(self, epoch, accuracy):
        line = (f"{self.name:<16} epoch {epoch + 1}/{self.epochs} test accuracy {accuracy:.4f} "
                f"({time.perf_counter() - self.t0:.1f} s)")
        self.stream.write(("\r" + line + " " * 10 + "\n") if self.tty else line + "\n")
        self.stream.flush()


def run_compare(sizes, strategies, data_path, *, epochs, batch_size, eta, dtype, seed, quiet=False,
                on_result=None, hold=contextlib.nullcontext):
    """Train plain and each strategy from ``seed``, each in a fresh process; one result dict per run.

    A fresh process per run keeps its RSS series clean of what earlier runs
    left in the heap.  ``on_result(results)`` is called after each finished
    run, so a caller can write what is done before an interrupt.  A run that
    fails raises :class:`RunFailed` with the child's one-line error; any
    exception here (a signal turned into :class:`Stopped`, say) ends the
    running child's process group before it propagates.  ``hold()`` wraps
    what a signal must not cut in two (starting a child, ``on_result``):
    :meth:`Stopper.deferred <fastckpt._signals.Stopper.deferred>`.
    """
    results = []
    for strategy in ["plain", *map(str, strategies)]:
        spec = {"sizes": list(sizes), "strategy": strategy, "data": data_path, "epochs": epochs,
                "batch_size": batch_size, "eta": eta, "dtype": dtype, "seed": seed, "quiet": quiet}
        # its own session: a terminal's Ctrl-C or hang-up reaches this process only, which ends the child
        with hold():                                # never a child started and lost
            child = subprocess.Popen([sys.executable, "-c", _CHILD, _package_root(), json.dumps(spec)],
                                     stdout=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, _ = child.communicate()
        except BaseException:
            end_process_group(child)
            raise
        results.append(_child_result(strategy, child.returncode, out))
        _ratios(results)
        if on_result is not None:
            with hold():                            # never a half-written report
                on_result(results)
    return results


def end_process_group(child, grace=5.0):
    """SIGTERM the child's process group, SIGKILL it after ``grace`` seconds, and reap the child."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(child.pid, sig)                # not reaped yet, so its pid is still its group's
        except ProcessLookupError:
            pass
        try:
            child.wait(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue
    child.wait()
    if child.stdout is not None:
        child.stdout.close()


class RunFailed(Exception):
    """A compare run failed in its child process.

    ``kinds`` names the builtin exception classes the child's error was an
    instance of (``{"FloatingPointError", "ArithmeticError", ...}``), so the
    command can give it the exit code it would give the same error here.
    """

    def __init__(self, run, reason, kinds=()):
        super().__init__(f"the {run} run: {reason}")
        self.run, self.reason, self.kinds = run, reason, frozenset(kinds)


def builtin_kinds(exc):
    """Names of the builtin classes ``exc`` is an instance of."""
    return {c.__name__ for c in type(exc).__mro__ if c.__module__ == "builtins"}


def _child_result(strategy, returncode, out):
    last = out.strip().splitlines()[-1] if out.strip() else ""
    try:
        got = json.loads(last)
    except ValueError:
        got = None
    if returncode == 0 and isinstance(got, dict) and "error" not in got:
        return got
    if isinstance(got, dict) and "error" in got:
        raise RunFailed(strategy, got["error"], got.get("kinds", ()))
    if returncode < 0:
        raise RunFailed(strategy, f"ended by {signal.Signals(-returncode).name}")
    raise RunFailed(strategy, f"exited with code {returncode}, without a reason")


def child_main(package_root, spec_json):
    """The child's whole life: one run, its result as the last line of stdout; an error as one JSON line
    (its message and kinds) and exit 1, the traceback only with FASTCKPT_DEBUG=1."""
    try:
        result = run_one(json.loads(spec_json))
    except Exception as exc:
        if os.environ.get("FASTCKPT_DEBUG"):
            import traceback
            traceback.print_exc()
        kinds = builtin_kinds(exc)
        message = str(exc) if kinds & _EXPECTED else f"{type(exc).__name__}: {exc}"
        print(json.dumps({"error": message, "kinds": sorted(kinds)}), flush=True)
        return 1
    print(json.dumps(result), flush=True)
    return 0


_EXPECTED = {"ValueError", "TypeError", "OSError", "RuntimeError", "FloatingPointError", "MemoryError"}


# The child imports the very package this process runs (an installed copy, not a source
# tree that happens to be the working directory), then runs one spec.
_CHILD = ("import sys; sys.path.insert(0, sys.argv[1]); from fastckpt.report import child_main; "
          "sys.exit(child_main(*sys.argv[1:]))")


def _package_root():
    import fastckpt
    return os.path.dirname(os.path.dirname(os.path.abspath(fastckpt.__file__)))


def run_one(spec):
    """One run: warm up, train with the lab's SGD (RSS and time per update), then measure with memray."""
    from .data import load_mnist
    (x_train, y_train), (x_test, y_test) = load_mnist(spec["data"])
    sizes, batch_size, eta, dtype = spec["sizes"], spec["batch_size"], spec["eta"], spec["dtype"]
    strategy = None if spec["strategy"] == "plain" else spec["strategy"]
    xb, yb = x_train[:batch_size], y_train[:batch_size]
    warm = _build([sizes[0], 8, sizes[-1]], None, dtype)      # load the kernels; small, so the heap stays small
    warm.update_mini_batch(xb, yb, 0.0)
    warm.evaluate(x_test, y_test)
    del warm

    def seeded():
        np.random.seed(spec["seed"])
        return _build(sizes, strategy, dtype)
    rss_base = psutil.Process().memory_info().rss
    net = seeded()
    bar = None if spec["quiet"] else Progress(spec["strategy"], spec["epochs"])
    accuracies = []

    def progress(epoch, done, total):
        if bar is not None:
            bar.update(epoch, done, total)
        if done == total:
            accuracies.append(net.evaluate(x_test, y_test))
            if bar is not None:
                bar.epoch_done(epoch, accuracies[-1])
    mem, times = net.SGD((x_train, y_train), spec["epochs"], batch_size, eta, verbose=False, progress=progress)

    def build_and_train():
        fresh = seeded()
        for _ in range(MEMRAY_STEPS):
            fresh.update_mini_batch(xb, yb, eta)
    peak = memory.memray_peak(build_and_train)
    plan = net.plan(batch_size)
    return {"name": spec["strategy"], "strategy": str(plan.strategy), "accuracies": accuracies,
            "ms_per_update": float(np.median(times) * 1e3) if times else float("nan"),
            "memray_peak_bytes": int(peak), "predicted_bytes": int(plan.bytes()["total"]),
            "recompute_factor": plan.recompute_factor, "extra_flop_fraction": plan.extra_flop_fraction,
            "rss_bytes": [int(m) for m in mem], "rss_base_bytes": int(rss_base),
            "update_seconds": [float(t) for t in times]}


def _build(sizes, strategy, dtype):
    if strategy is None or strategy == "plain":
        return Network(sizes, dtype=dtype)
    return NetworkWithCheckpointing(sizes, strategy=strategy, dtype=dtype)


def _ratios(results):
    base = results[0]
    for r in results:
        r["time_ratio"] = r["ms_per_update"] / base["ms_per_update"]
        r["memory_ratio"] = r["memray_peak_bytes"] / base["memray_peak_bytes"]


def same_accuracy(results, tol=1e-3):
    """Whether every run reached the plain run's accuracy at every epoch, to ``tol``."""
    base = results[0]["accuracies"]
    return all(len(r["accuracies"]) == len(base) and np.allclose(r["accuracies"], base, atol=tol)
               for r in results)


def summary(results, setup):
    """The JSON-ready summary: setup, per-run numbers (no per-update series) and the verdict."""
    keep = ("name", "strategy", "accuracies", "ms_per_update", "memray_peak_bytes", "predicted_bytes",
            "recompute_factor", "extra_flop_fraction", "time_ratio", "memory_ratio")
    return {"setup": setup, "runs": [{k: r[k] for k in keep} for r in results],
            "same_accuracy": same_accuracy(results)}


def table(results, setup):
    """The text table ``fastckpt compare`` prints."""
    lines = [f"{setup['sizes']}, batch {setup['batch_size']}, eta {setup['eta']}, {setup['epochs']} epochs, "
             f"{setup['dtype']}, seed {setup['seed']}, {setup['data']}",
             "test accuracy per epoch:"]
    for r in results:
        lines.append(f"  {r['name']:<16} " + " ".join(f"{a:.3f}" for a in r["accuracies"]))
    lines += ["", f"{'run':<16} {'accuracy':>8} {'ms/update':>10} {'x time':>7} {'peak MiB':>9} "
                  f"{'x mem':>6} {'plan MiB':>9} {'recompute':>9}"]
    for r in results:
        final = r["accuracies"][-1] if r["accuracies"] else float("nan")
        lines.append(f"{r['name']:<16} {final:>8.4f} {r['ms_per_update']:>10.3f} {r['time_ratio']:>7.2f} "
                     f"{r['memray_peak_bytes'] / MiB:>9.3f} {r['memory_ratio']:>6.2f} "
                     f"{r['predicted_bytes'] / MiB:>9.3f} {r['recompute_factor']:>9.2f}")
    lines += ["", f"same accuracy with and without checkpointing: {'yes' if same_accuracy(results) else 'NO'}",
              f"ms/update: median over all updates; peak: memray, building the net and {MEMRAY_STEPS} training "
              "steps;",
              "plan: fastckpt's predicted bytes; recompute: forward FLOPs per step / one forward pass"]
    return "\n".join(lines)


def write_report(out, results, setup):
    """PNGs (memory per update, cumulative update time, memory against depth) and summary.md in ``out``."""
    os.makedirs(out, exist_ok=True)
    title = f"{setup['sizes']}, batch {setup['batch_size']}, {setup['dtype']}"
    paths = {}
    fig, ax = figure()
    draw(ax, [(r["name"], np.arange(len(r["rss_bytes"])),
               (np.array(r["rss_bytes"], dtype=np.float64) - r["rss_base_bytes"]) / MiB,
               f"{r['name']}: a step's own peak {r['memray_peak_bytes'] / MiB:.3f} MiB (memray)") for r in results],
         near=0.03, gap_text=lambda mib: f"{mib * 1024:.0f} KiB")
    paths["memory"] = save(fig, ax, os.path.join(out, "memory_per_update.png"), "weight update",
                           "process RSS before the update,\nabove its value before the net was built (MiB)",
                           f"Memory usage per weight update\n{title}", legend={"fontsize": "small"})
    fig, ax = figure()
    draw(ax, [(r["name"], np.arange(len(r["update_seconds"])), np.cumsum(r["update_seconds"]),
               f"{r['name']} ({r['ms_per_update']:.3f} ms/update)") for r in results])
    paths["time"] = save(fig, ax, os.path.join(out, "cumulative_update_time.png"), "weight update",
                         "cumulative update time (s)", f"Cumulative update time\n{title}")
    sizes = setup["sizes"]
    width = max(sizes[1:-1]) if len(sizes) > 2 else sizes[0]
    rows = memory.depth_table([1, 2, 4, 8, 16, 32], width=width, n_in=sizes[0], n_out=sizes[-1],
                              batch_size=setup["batch_size"], dtype=setup["dtype"],
                              strategies=["plain"] + [r["strategy"] for r in results[1:]])
    paths["depth"] = plot_depth(rows, os.path.join(out, "memory_vs_depth.png"),
                                title=f"[{sizes[0]}] + [{width}]*H + [{sizes[-1]}], batch "
                                      f"{setup['batch_size']}, {setup['dtype']} (planner)")
    paths["summary"] = os.path.join(out, "summary.md")
    with open(paths["summary"], "w") as f:
        f.write("# fastckpt compare\n\n```\n" + table(results, setup) + "\n```\n\n")
        f.write("![Memory per weight update](memory_per_update.png)\n\n"
                "![Cumulative update time](cumulative_update_time.png)\n\n"
                "![Memory against depth](memory_vs_depth.png)\n")
    return paths

