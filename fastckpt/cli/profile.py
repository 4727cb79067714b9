"""``fastckpt profile``: memray's picture of training the net a user trains, and what the plan predicts for it.

The net is made from the flags ``train`` takes (``--activation``, ``--optimizer``, ``--strategy`` or
``--max-memory`` ...), or is the one a saved FILE holds, with its weights and optimizer state, trained at the
batch size, rate and data its training state records.  memray records building it and ``--steps`` steps on
the first minibatch of the data, with BLAS held on the threads the plan counts; the planned figure counts
what that picture shows: the step's plan and the staging rows a minibatch of compact data is converted into
(NOTE [ The whole run ] in fastckpt/planner/run.py).  They differ by the Python objects a net and its plan
add (some 2 KiB a layer), which memray counts one by one.
"""
import copy
import os
import subprocess
import sys
import tempfile
from types import SimpleNamespace

import numpy as np

from fastckpt.engine.sharing import threads_held
from fastckpt.nets import NetworkWithCheckpointing
from fastckpt.planner import parse_strategy
from fastckpt.planner.costs import describe_sizes
from fastckpt.planner.run import staging_bytes
from fastckpt.report.flame import write_peak_picture

from .bound import step_strategy
from .data import check_trainable, data_name, data_path, fingerprint, load_data, recorded_data
from .options import TRAIN_DEFAULTS
from .use import load_net

SHAPING = ("sizes", "dtype", "strategy", "loss", "l2", "sgd_in_backward", "activation", "init", "optimizer", "seed")
MiB = 2**20


def profile(args):
    import memray
    saved = load_net(args.file) if args.file is not None else None
    run, data = run_settings(args, saved)
    training, test = load_data(data, run.sizes)
    if run.batch_size > len(training[0]):
        raise ValueError(f"--batch-size {run.batch_size} is more than the {len(training[0])} training samples of "
                         f"{data_name(data)}")
    if args.max_memory is not None:
        run.strategy = step_strategy(run, training, test, args.epochs, False)
    check_trainable(run.sizes, run.batch_size, run.dtype, run.strategy, optimizer_in_backward=run.sgd_in_backward,
                    optimizer=run.optimizer)
    x, y = training[0][:run.batch_size], training[1][:run.batch_size]

    def build():
        if saved is not None:
            return copy.deepcopy(saved)
        np.random.seed(run.seed)
        return NetworkWithCheckpointing(run.sizes, strategy=run.strategy, dtype=run.dtype, loss=run.loss, l2=run.l2,
                                        optimizer_in_backward=run.sgd_in_backward, activation=run.activation,
                                        init=run.init, optimizer=run.optimizer)
    build().update_mini_batch(x, y, 0.0)                 # kernels compiled, BLAS's buffers made, outside the record
    os.makedirs(args.out, exist_ok=True)
    html = os.path.join(args.out, "memray-flamegraph.html")
    title = f"{describe_sizes(run.sizes)}, {run.strategy}, batch {run.batch_size}, {args.steps} steps"
    with tempfile.TemporaryDirectory() as tmp, threads_held():     # BLAS on the threads the plan counts
        capture = os.path.join(tmp, "profile.bin")
        with memray.Tracker(capture, native_traces=args.native, trace_python_allocators=True):   # as memray_peak
            net = build()
            for _ in range(args.steps):
                net.update_mini_batch(x, y, run.eta)
        peak = memray.FileReader(capture).metadata.peak_memory
        step = net.plan(run.batch_size)
        proc = subprocess.run([sys.executable, "-m", "memray", "flamegraph", "-f", "-o", html, capture],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"memray flamegraph failed: {proc.stderr.strip().splitlines()[-1]}")
        pictures = write_peak_picture(capture, os.path.join(args.out, "memory-peak"), title=title)
    _say(args, run, data, step, staging_bytes(step, x, y), peak, html, pictures)
    return 0


def run_settings(args, saved):
    """``(run, data)``: the net's settings and the batch size and rate to profile at, from the flags, or from
    FILE (``saved``) and its training state; and the data (None for the embedded digits)."""
    if saved is None:
        values = {key: getattr(args, key) if getattr(args, key) is not None else TRAIN_DEFAULTS[key]
                  for key in (*SHAPING, "batch_size", "eta")}
        values["strategy"] = parse_strategy(values["strategy"])
        # as train runs it without --validation or --shuffle, which profile does not take
        return SimpleNamespace(**values, validation=None, shuffle=None, data=args.data), args.data
    given = [f"--{key.replace('_', '-')}" for key in SHAPING if getattr(args, key) is not None]
    if args.max_memory is not None:
        given = [flag for flag in given if flag != "--strategy"] + ["--max-memory"]
    if given:
        raise ValueError(f"{given[0]} would change the net FILE {args.file!r} holds; profile FILE trains it as saved: "
                         f"leave {given[0]} out, or profile a new net with the flags and without FILE")
    state = saved.training_state or {}
    saved.training_state = None                           # not copied into each profiled net
    batch_size, eta = (_as_recorded(args, key, state) for key in ("batch_size", "eta"))
    data = _recorded_data(args, state)
    run = SimpleNamespace(sizes=list(saved.sizes), dtype=saved.dtype.name, strategy=saved.strategy,
                          sgd_in_backward=saved.optimizer_in_backward, optimizer=saved.optimizer,
                          batch_size=batch_size or TRAIN_DEFAULTS["batch_size"],
                          eta=eta if eta is not None else TRAIN_DEFAULTS["eta"])
    return run, data


def _as_recorded(args, key, state):
    """``--batch-size`` or ``--eta`` with FILE: the value FILE's training state records (the flag, if given,
    must agree with it), or the flag's when FILE records none (``net.save`` writes no training state)."""
    given, recorded = getattr(args, key), state.get(key)
    if given is not None and recorded is not None and given != recorded:
        flag = "--" + key.replace("_", "-")
        raise ValueError(f"{flag} {given} differs from the {recorded} FILE {args.file!r} records; profile FILE "
                         f"trains it as saved, at its training state's {key}: leave {flag} out")
    return recorded if recorded is not None else given


def _recorded_data(args, state):
    """The data to profile FILE on: what its training state records (``--data``, if given, must hold the same:
    the same path, or files of the same SHA-256), or ``--data`` when FILE records none."""
    if "data" not in state:
        return args.data
    if args.data is None:
        return recorded_data(args.file, state)
    recorded = state["data"]
    same = data_path(args.data) is None if recorded is None else data_path(args.data) is not None and (
        os.path.abspath(args.data) == os.path.abspath(recorded) or fingerprint(args.data) == state.get("data_sha256"))
    if not same:
        raise ValueError(f"--data {args.data!r} differs from the data FILE {args.file!r} was trained on "
                         f"({data_name(recorded)}); profile FILE trains it as saved, on its data: leave --data out")
    return args.data


def _say(args, run, data, step, staging, peak, html, pictures):
    planned = step.bytes()["total"] + staging
    net = f"the net {args.file!r} holds" if args.file is not None else describe_sizes(run.sizes)
    print(f"memray flamegraph of building {net} ({run.strategy}) and {args.steps} training steps at batch "
          f"{run.batch_size} on {data_name(data)}: {html}")
    print(f"where the peak goes, as pictures: {pictures[0]} and {pictures[1]}")
    print("the HTML needs a browser with internet access (it loads its scripts from a CDN); "
          "the PNG and SVG open offline")
    print(f"peak {peak / MiB:.3f} MiB measured, {planned / MiB:.3f} MiB planned: the step "
          f"{step.bytes()['total'] / MiB:.3f} MiB (fastckpt plan's) and the staging rows {staging / MiB:.3f} MiB a "
          "minibatch of compact data is converted into")
