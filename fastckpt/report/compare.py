"""The ``compare`` job: train plainly and with strategies from one seed, measure, and report.

Each run trains in its own process (see ``_CHILD``), so the lab's
RSS-per-update series of one run carries nothing of another.
Results are plain dicts, so the same numbers feed the table, ``--json`` and the
files of ``--out`` (:mod:`fastckpt.report.summary`).
"""
import contextlib
import json
import os
import signal
import subprocess
import sys

import numpy as np
import psutil

from fastckpt.data import load_mnist
from fastckpt.engine.progress import Progress
from fastckpt.nets import Network, NetworkWithCheckpointing

from .measure import memray_peak

MEMRAY_STEPS = 5  # training steps in the memray-measured build-and-train


def run_compare(sizes, strategies, data_path, *, epochs, batch_size, eta, dtype, seed, quiet=False,
                on_result=None, hold=contextlib.nullcontext, sgd_in_backward=False):
    """Train plain and each strategy from ``seed``, each in a fresh process; one result dict per run.

    A fresh process per run keeps its RSS series clean of what earlier runs
    left in the heap.  ``on_result(results)`` is called after each finished
    run, so a caller can write what is done before an interrupt.  A run that
    fails raises :class:`RunFailed` with the child's one-line error; any
    exception here (a signal turned into :class:`Stopped`, say) ends the
    running child's process group before it propagates.  ``hold()`` wraps
    what a signal must not cut in two (starting a child, ``on_result``):
    a ``Stopper``'s ``deferred`` (:mod:`fastckpt.cli.signals`).
    """
    results = []
    for strategy in ["plain", *map(str, strategies)]:
        spec = {"sizes": list(sizes), "strategy": strategy, "data": data_path, "epochs": epochs,
                "batch_size": batch_size, "eta": eta, "dtype": dtype, "seed": seed, "quiet": quiet,
                "sgd_in_backward": bool(sgd_in_backward)}
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
    try:
        print(json.dumps(result), flush=True)
    except BrokenPipeError:                       # the parent stopped reading: interrupted, it keeps what it has
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())     # nothing more to say at exit
        return 130
    return 0


_EXPECTED = {"ValueError", "TypeError", "OSError", "RuntimeError", "FloatingPointError", "MemoryError"}


# The child imports the very package this process runs (an installed copy, not a source
# tree that happens to be the working directory), then runs one spec.
_CHILD = ("import sys; sys.path.insert(0, sys.argv[1]); from fastckpt.report.compare import child_main; "
          "sys.exit(child_main(*sys.argv[1:]))")


def _package_root():
    """The folder that holds this fastckpt package (the ``fastckpt/`` folder's parent)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_one(spec):
    """One run: warm up, train with the lab's SGD (RSS and time per update), then measure with memray."""
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
        return _build(sizes, strategy, dtype, spec.get("sgd_in_backward", False))
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
    peak = memray_peak(build_and_train)
    plan = net.plan(batch_size)
    return {"name": spec["strategy"], "strategy": str(plan.strategy), "accuracies": accuracies,
            "ms_per_update": float(np.median(times) * 1e3) if times else float("nan"),
            "memray_peak_bytes": int(peak), "predicted_bytes": int(plan.bytes()["total"]),
            "recompute_factor": plan.recompute_factor, "extra_flop_fraction": plan.extra_flop_fraction,
            "rss_bytes": [int(m) for m in mem], "rss_base_bytes": int(rss_base),
            "update_seconds": [float(t) for t in times]}


def _build(sizes, strategy, dtype, sgd_in_backward=False):
    if strategy is None or strategy == "plain":
        return Network(sizes, dtype=dtype, optimizer_in_backward=sgd_in_backward)
    return NetworkWithCheckpointing(sizes, strategy=strategy, dtype=dtype, optimizer_in_backward=sgd_in_backward)
