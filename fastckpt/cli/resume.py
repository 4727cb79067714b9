"""``train --save`` and ``--resume``: the training state a saved file carries, and reading it back.

NOTE [ Resuming ]
The lab's loop has no randomness after the initial draw (mini-batches in
order), so the parameters at the end of epoch ``k`` and the settings that
shape an epoch (data, batch size, eta, loss, l2, strategy, dtype) decide the
rest of the run.  ``--save`` stores them after every epoch with
``numpy.random``'s state; ``--resume`` restores all of it and runs epochs
``k .. --epochs - 1``, so the result is the uninterrupted run's bit for bit.
That holds in every mode: one process or threads, MPI data parallelism, pipeline
and tensor parallelism (every rank reads the file and takes its part of the
net and of the optimizer's state).  The file records how it was trained
(:func:`run_mode`), and a resume in another mode or on other ranks is refused:
its sums would round otherwise.  ``--eta`` alone may change: the run then goes
on at the new rate (fine-tuning), and is no longer the unbroken one's.
"""
import os

import numpy as np

from fastckpt.core.checks import shown_value
from fastckpt.core.files import npz_name
from fastckpt.core.lr import parse_lr_schedule
from fastckpt.engine.sharing import fix_threads, fixed_threads
from fastckpt.nets.io import blank
from fastckpt.parallel.mpi import launched_ranks
from fastckpt.planner.strategies import format_bytes

from .data import EMBEDDED, data_path, fingerprint
from .options import grid_axes, on_ranks, pipeline_options
from .paths import load_named

SETTINGS = ("sizes", "dtype", "strategy", "loss", "l2", "batch_size", "eta", "seed", "data", "sgd_in_backward",
            "activation", "optimizer")

FLAGS = {"sgd_in_backward": "--optimizer-in-backward"}     # a setting's flag, where it is not its key's spelling

# what a --resume file's training state must hold: (kind, least value, greatest value); counts fit an int64
INT64 = 2**63 - 1
STATE = {"epochs_done": (int, 1, INT64), "updates_done": (int, 1, INT64), "batch_size": (int, 1, INT64),
         "eta": (float, 0, None), "seed": (int, 0, 2**32 - 1), "n_train": (int, 1, INT64),
         "parallel_batches": (int, 1, INT64)}


def run_mode(args, saved_pipeline=None):
    """How ``args`` trains, as a --resume file records it: ``"on one process"`` (threads too: their sums
    follow the mini-batch order), or the MPI grid with what shapes its sums (the pipeline's options not
    given taken from ``saved_pipeline``, a --resume file's)."""
    if not on_ranks(args):
        return "on one process"
    data, pipeline, tensor = grid_axes(args, launched_ranks())
    pipe = pipeline_options(args, saved_pipeline)
    mode = f"with --data-parallel {data} --pipeline {pipeline} --tensor-parallel {tensor} --micro-batches " \
        f"{pipe['micro_batches']}"
    if pipeline > 1:
        mode += f" --schedule {pipe['schedule']} --transport {pipe['transport']}" + \
            (f" --partition {','.join(map(str, pipe['partition']))}" if pipe["partition"] else "")
    return mode


def file_mode(mode, path):
    """A --resume file's recorded ``mode`` as :func:`run_mode` writes it today: 0.3's ``--mpi`` on N ranks is
    ``--data-parallel N``, its pipelines and tensor splits of one replica are the same grids; its replicas
    of a pipeline or a tensor split, which split each mini-batch, have no run that goes on as they did."""
    words = mode.split()
    if words[:1] != ["with"] or words[1:2] == ["--data-parallel"]:
        return mode
    given = {w: words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else None
             for i, w in enumerate(words) if w.startswith("--")}
    ranks = int(words[words.index("on") + 1]) if "on" in words else 1
    if "--data-parallel" in given and "--mpi" not in given and int(given["--data-parallel"]) > 1:
        raise ValueError(f"--resume {path!r} was trained by fastckpt 0.3 {mode}, whose replicas split each "
                         "mini-batch; today each replica takes a mini-batch of its own (docs/data-parallel.md), so "
                         "that run cannot go on as it was trained: fastckpt.load reads its net")
    if "--mpi" in given:
        return f"with --data-parallel {ranks} --pipeline 1 --tensor-parallel 1 --micro-batches 1"
    if "--pipeline" not in given:
        return f"with --data-parallel 1 --pipeline 1 --tensor-parallel {ranks} --micro-batches 1"
    tensor = given.get("--tensor-parallel") or 1
    return (f"with --data-parallel 1 --pipeline {given['--pipeline']} --tensor-parallel {tensor} --micro-batches "
            f"{given['--micro-batches']} --schedule {given['--schedule']} --transport {given['--transport']}"
            + (f" --partition {given['--partition']}" if given.get("--partition") else ""))


def file_pipeline(mode):
    """The pipeline options a file's recorded ``mode`` (:func:`run_mode`) was trained with, as
    :func:`~fastckpt.cli.options.pipeline_options` gives them; empty for one process."""
    words = mode.split()
    if words[:1] != ["with"]:
        return {}
    given = dict(zip(words[1::2], words[2::2]))          # "with --data-parallel D --pipeline P ..."
    found = {"micro_batches": int(given["--micro-batches"])}
    if "--schedule" in given:
        found.update(schedule=given["--schedule"], transport=given["--transport"])
    if "--partition" in given:
        found["partition"] = [int(n) for n in given["--partition"].split(",")]
    return found


def training_state(run, accuracies, epochs_done, updates_done, n_train, per_update):
    """What ``--save`` stores beside the net after an epoch (NOTE [ Resuming ])."""
    return {"mode": run.mode, "epochs_done": epochs_done, "updates_done": updates_done, "accuracies": list(accuracies),
            "max_memory": run.max_memory, "shuffle": run.shuffle, "validation": run.validation,
            "lr_schedule": run.lr_schedule, "early_stopping": run.early_stopping,
            "batch_size": run.batch_size, "eta": run.eta, "seed": run.seed,
            "data": None if data_path(run.data) is None else os.path.abspath(run.data), "data_sha256": run.data_sha256,
            "n_train": n_train, "parallel_batches": per_update, "rng": np.random.get_state(),
            "blas_threads": fixed_threads()}


class Saver:
    """``--save FILE`` after every epoch, by rank 0: ``saver(write)`` calls ``write(path, exclusive)`` on
    every rank (each must call it: with a ``guard``, rank 0's failure is raised on all).  Unless ``force``
    or FILE is the ``resume`` file, the run's first save is exclusive: the command line refused an existing
    FILE as it started, so a file there now is another process's and is never replaced (the save fails
    instead); later saves replace the run's own file."""

    def __init__(self, path, force, guard=None, resume=None):
        self.path, self.guard = path, guard
        self.lead = guard is None or guard.rank == 0
        same = resume is not None and os.path.exists(npz_name(path or "")) and os.path.exists(npz_name(resume)) \
            and os.path.samefile(npz_name(path), npz_name(resume))
        self.exclusive = path is not None and not force and not same

    def __call__(self, write):
        if self.path is None:
            return
        if self.guard is not None:
            self.guard.lead_does(lambda: write(self.path, self.exclusive))
        elif self.lead:
            write(self.path, self.exclusive)
        self.exclusive = False


def resumed(args):
    """The net and training state of ``--resume``, checked against ``args``, and the settings it fixes:
    ``(net, state, saved)``.  ``numpy.random`` is left where the file's run left it."""
    net = load_named(args.resume, "--resume")
    state = net.training_state
    if state is None:
        raise ValueError(f"--resume {args.resume!r}: the file holds a net but no training state; "
                         "train --save writes one after every epoch")
    _check_state(state, args.resume)
    trained, pipeline = _trained_mode(state, args.resume)
    now = run_mode(args, pipeline)                    # --micro-batches, --schedule ... default to the file's
    if trained != now:
        raise ValueError(f"--resume {args.resume!r} was trained {trained}, and this run would go on {now}: resume "
                         "it as it was trained (fastckpt.load reads its net anywhere)")
    saved = {"sizes": list(net.sizes), "dtype": net.dtype.name, "strategy": str(net.strategy), "loss": net.loss,
             "l2": net.l2[0] if len(set(net.l2)) == 1 else list(net.l2), "batch_size": state["batch_size"],
             "eta": state["eta"], "seed": state["seed"], "data": state.get("data"),
             "sgd_in_backward": net.optimizer_in_backward,
             "activation": net.activation[0] if len(set(net.activation)) == 1 else list(net.activation),
             "optimizer": net.optimizer.name}
    for key in SETTINGS:
        if key == "strategy" and args.max_memory is not None and state.get("max_memory") == args.max_memory:
            continue                        # the whole-run bound the file's run had, which fixed its fit
        if key == "eta":
            continue                        # another rate fine-tunes: said by cli/notes.py
        _check_same(args, key, saved[key], state)
    data = args.data if args.data is not None else saved["data"]
    if args.data is None and data is not None and not (os.path.isfile(data) or os.path.isdir(data)):
        raise ValueError(f"--resume {args.resume!r} was trained on --data {data!r}, which is not a file or folder "
                         "now; give --data with the same data")
    if data_path(data) is not None and fingerprint(data) != state.get("data_sha256"):
        raise ValueError(f"--resume {args.resume!r} was trained on {data!r}, whose contents have changed since")
    if state["epochs_done"] >= args.epochs:
        raise ValueError(f"--epochs {args.epochs}: the --resume file has already trained {state['epochs_done']} "
                         "epochs; give more epochs in all")
    per_update = args.parallel_batches
    if per_update is None and state["parallel_batches"] > 1:
        per_update = state["parallel_batches"]                    # the file's, as for every other setting
    if state["parallel_batches"] != (per_update or args.threads):
        raise ValueError(f"--threads {args.threads} and --parallel-batches {per_update or args.threads} "
                         f"average {per_update or args.threads} mini-batches per update, but the --resume file's "
                         f"run averaged {state['parallel_batches']}: give the same")
    _refuse_what_cannot_go_on(args, state)
    for key in ("shuffle", "validation"):
        if getattr(args, key) is not None and getattr(args, key) != state.get(key):
            raise ValueError(f"--{key} {getattr(args, key)} differs from the --resume file's {state.get(key)}; leave "
                             f"--{key} out to go on with the file's")
    np.random.set_state(state["rng"])
    _take_threads(state)
    return net, state, dict(saved, data=data, parallel_batches=per_update, shuffle=state.get("shuffle"),
                            validation=state.get("validation"), lr_schedule=state.get("lr_schedule"),
                            pipeline=pipeline)


def from_file(args, key, flag):
    """How a refusal names the setting ``key``: ``flag`` when given (or no file is resumed), else the --resume
    file's field it came from."""
    if getattr(args, key, None) is not None or not args.resume:
        return flag
    return f"--resume {args.resume!r}: its training state's {key}"


def check_resumed_samples(path, state, n):
    """The --resume file's run trained on ``n`` samples (the data's, before a validation split), and its
    validation fraction and batch size leave a mini-batch to train on: a file edited by hand is refused naming
    it, not by a check inside training that names neither."""
    if state["n_train"] != n:
        raise ValueError(f"--resume {path!r} was trained on {state['n_train']} samples, but the data has {n}")
    fraction = state.get("validation")
    left = n if fraction is None else int(n * (1 - fraction))
    held = "" if fraction is None else f" with validation {fraction} ({n - left} held out)"
    if fraction is not None and not 0 < left < n:
        raise ValueError(f"--resume {path!r}: its training state's validation {fraction} of {n} samples leaves "
                         f"{left} to train on and {n - left} to validate on; each needs at least one")
    if state["batch_size"] > left:
        raise ValueError(f"--resume {path!r}: its training state's batch_size {state['batch_size']} is more than "
                         f"the {left} samples it trains on{held}")


def _trained_mode(state, path):
    """The --resume file's recorded mode as :func:`run_mode` writes it today, and its pipeline options; a
    ValueError naming the file when the mode is none that run_mode writes."""
    trained = state.get("mode") or "on one process"          # null, as a file without it: one process
    try:
        if trained != "on one process" and not trained.startswith("with --"):
            raise ValueError("not a mode run_mode writes")
        trained = file_mode(trained, path)
        return trained, file_pipeline(trained)
    except (KeyError, ValueError, IndexError) as exc:
        if "fastckpt 0.3" in str(exc):
            raise
        raise ValueError(f"--resume {path!r}: its training state's mode {shown_value(trained)} is damaged") from None


def _refuse_what_cannot_go_on(args, state):
    """A resume without ``--save`` (it would keep nothing), and of a run with early stopping: its count of epochs
    without improvement, best score and best weights are not in the file (a resumed run trained on past the
    epoch the unbroken one stopped at)."""
    if args.save is None:
        raise ValueError(f"--resume {args.resume!r} without --save would train and keep nothing: add --save FILE "
                         f"(--save {args.resume!r} goes on in that file)")
    stopping = state.get("early_stopping") if state.get("early_stopping") is not None else args.early_stopping
    if stopping is not None:
        raise ValueError(f"--resume {args.resume!r}{' was trained' if state.get('early_stopping') else ''} with "
                         f"--early-stopping {stopping}: its count of epochs without improvement, best score and best "
                         "weights are not in the file, so the run cannot go on as it would have; train it again "
                         "from the start (its --save-best file keeps the best epoch)")


def _take_threads(state):
    """The --resume file's run's fixed BLAS threads, when this run fixed none: OpenBLAS rounds some GEMMs
    differently on another count (NOTE [ Threads on a shared machine ]).  When the machine cannot run them, the
    run goes on with threads that follow the load, and :func:`threads_note` says so."""
    if state.get("blas_threads") is not None and fixed_threads() is None:
        try:
            fix_threads(state["blas_threads"])
        except ValueError:
            pass


def threads_note(state):
    """A note when this run's BLAS threads are not the --resume file's fixed ones: not the unbroken run bit for
    bit; None when they are (or the file's followed the load)."""
    saved, now = state.get("blas_threads"), fixed_threads()
    if saved is None or saved == now:
        return None
    return (f"{'BLAS threads that follow the load' if now is None else f'--blas-threads {now}'} instead of the "
            f"--resume file's --blas-threads {saved}: "
            "BLAS rounds some sums differently on another count of threads, so the run is not the unbroken run's "
            "bit for bit")


def with_strategy(net, strategy):
    """The resumed ``net`` with its step planned by ``strategy``: a blank net of the same settings given its
    parameters and optimizer state bit for bit.  Every strategy computes the same gradients bit for bit
    (tests/test_strategies.py), so the run goes on as the file's would."""
    other = blank(net.sizes, net.dtype, loss=net.loss, l2=list(net.l2), strategy=strategy,
                  optimizer_in_backward=net.optimizer_in_backward, activation=list(net.activation),
                  optimizer=net.optimizer)
    other.weights, other.biases = net.weights, net.biases
    other.optimizer_state.restore(net.sizes, net.optimizer_state.steps, net.optimizer_state.arrays(net.sizes))
    other.training_state = net.training_state
    return other


def _check_same(args, key, saved, state):
    """Refuse a flag that would change what the --resume file's run fixes."""
    given = getattr(args, key)
    flag = FLAGS.get(key, "--" + key.replace("_", "-"))
    if key == "data" and given is not None:
        same = saved is None if data_path(given) is None else \
            fingerprint(given) == state.get("data_sha256") and saved is not None
    else:
        same = given is None or (str(given) if key == "strategy" else given) == saved
    if not same:
        if key == "strategy" and args.max_memory is not None:
            flag, given = "--max-memory", format_bytes(args.max_memory)
        raise ValueError(f"{flag} {_shown(key, given)} differs from the --resume file's "
                         f"{_shown(key, saved)}; leave {flag} out to go on with the file's")


def _check_state(state, path):
    """Every field ``train`` reads from a --resume file, of its kind and range, or a ValueError naming the file."""
    where = f"--resume {path!r}: its training state"
    for key, (kind, least, most) in STATE.items():
        value = state.get(key)
        ok = type(value) is int or (kind is float and type(value) is float and np.isfinite(value))
        if not ok or value < least or (most is not None and value > most):
            shown = shown_value(value)
            raise ValueError(f"{where} needs {key} as {'an integer' if kind is int else 'a number'} >= {least}"
                             + (f" and <= {most}" if ok and value > least else "") + f", got {shown}")
    accuracies = state.get("accuracies")
    if not isinstance(accuracies, list) or len(accuracies) > state["epochs_done"] \
            or not all(type(a) in (int, float) and 0 <= a <= 1 for a in accuracies):
        raise ValueError(f"{where} needs accuracies as a list of at most epochs_done numbers in 0..1, "
                         f"got {accuracies!r}")
    for key in ("data", "data_sha256"):
        if not (state.get(key) is None or isinstance(state.get(key), str)):
            raise ValueError(f"{where} needs {key} as a string or null, got {state.get(key)!r}")
    if state.get("rng") is None:
        raise ValueError(f"{where} lacks numpy.random's state (rng)")
    _check_run_fields(state, where)


def _check_run_fields(state, where):
    """The fields that say how the run trained (each may be null): ``mode`` a string, ``max_memory`` a count of
    bytes, ``shuffle`` a seed, ``validation`` a fraction, ``lr_schedule`` a schedule's spelling,
    ``early_stopping`` the run's patience, ``blas_threads`` the BLAS threads it fixed."""
    checks = {"mode": ("a string", lambda v: isinstance(v, str)),
              "max_memory": (f"an integer of bytes from 1 to {INT64}", lambda v: type(v) is int and 1 <= v <= INT64),
              "shuffle": ("an integer seed from 0 to 2**32 - 1", lambda v: type(v) is int and 0 <= v < 2**32),
              "validation": ("a fraction between 0 and 1", lambda v: type(v) is float and 0 < v < 1),
              "lr_schedule": ("a learning-rate schedule such as 'cosine(10)'", _schedule),
              "early_stopping": ("a count of epochs from 1", lambda v: type(v) is int and v >= 1),
              "blas_threads": ("a count of threads from 1", lambda v: type(v) is int and 1 <= v < 2**31)}
    for key, (kind, ok) in checks.items():
        value = state.get(key)
        if value is not None and not ok(value):
            shown = shown_value(value)
            raise ValueError(f"{where} needs {key} as {kind} or null, got {shown}")


def _schedule(value):
    """Whether a file's ``lr_schedule`` is one :func:`~fastckpt.core.lr.parse_lr_schedule` reads."""
    try:
        return isinstance(value, str) and parse_lr_schedule(value) is not None
    except ValueError:
        return False


def _shown(key, value):
    if key == "sizes":
        return ",".join(map(str, value))
    if key == "data":
        return f"{EMBEDDED} (the embedded MNIST)" if data_path(value) is None else repr(value)
    return str(value)
