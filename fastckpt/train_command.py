"""``fastckpt train``: one net on one process, on threads or on MPI ranks; saved after every epoch, resumable.

NOTE [ Resuming ]
The lab's loop has no randomness after the initial draw (mini-batches in
order), so the parameters at the end of epoch ``k`` and the settings that
shape an epoch (data, batch size, eta, loss, l2, strategy, dtype) decide the
rest of the run.  ``--save`` stores them after every epoch with
``numpy.random``'s state; ``--resume`` restores all of it and runs epochs
``k .. --epochs - 1``, so the result is the uninterrupted run's bit for bit.
"""
import hashlib
import json
import os
import time

import numpy as np

from .data import load_mnist
from .distributed import launched_ranks
from .planning import plan as make_plan
from .saving import load, save_arrays
from .strategies import format_bytes, parse_strategy

DEFAULTS = {"sizes": [784, 40, 30, 10], "batch_size": 10, "dtype": "float64", "strategy": "plain", "loss": "quadratic",
            "l2": 0.0, "eta": 3.0, "seed": 0}                 # filled in after a --resume file is read
SETTINGS = ("sizes", "dtype", "strategy", "loss", "l2", "batch_size", "eta", "seed", "data")


def _model_parallel(args):
    """The pipeline or tensor-parallel trainer of ``args`` (a collective: every rank makes it)."""
    if args.pipeline:
        from .pipeline import PipelineTrainer
        return PipelineTrainer(args.sizes, args.micro_batches, schedule=args.schedule, strategy=args.strategy,
                               dtype=args.dtype, loss=args.loss, l2=args.l2, partition=args.partition,
                               transport=args.transport, batch_size=args.batch_size)
    from .tensor_parallel import TensorParallelTrainer
    return TensorParallelTrainer(args.sizes, dtype=args.dtype, loss=args.loss, l2=args.l2)


# what a --resume file's training state must hold: (kind, least value)
STATE = {"epochs_done": (int, 1), "updates_done": (int, 1), "batch_size": (int, 1), "eta": (float, 0),
         "seed": (int, None), "n_train": (int, 1), "parallel_batches": (int, 1)}


def _check_state(state, path):
    """Every field ``train`` reads from a --resume file, of its kind and range, or a ValueError naming the file."""
    where = f"--resume {path!r}: its training state"
    for key, (kind, least) in STATE.items():
        value = state.get(key)
        ok = type(value) is int or (kind is float and type(value) is float and np.isfinite(value))
        if not ok or (least is not None and value < least):
            raise ValueError(f"{where} needs {key} as {'an integer' if kind is int else 'a number'}"
                             + (f" >= {least}" if least is not None else "") + f", got {value!r}")
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


def _fingerprint(data):
    """SHA-256 of the data file, or of an IDX folder's files in name order; None for the embedded digits."""
    if data is None:
        return None
    digest = hashlib.sha256()
    folder = not os.path.isfile(data)
    files = sorted(os.path.join(data, f) for f in os.listdir(data)) if folder else [data]
    for name in files:
        if os.path.isfile(name):
            if folder:
                digest.update(os.path.basename(name).encode() + b"\0")
            with open(name, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()


def _shown(key, value):
    if key == "sizes":
        return ",".join(map(str, value))
    if key == "data":
        return "the embedded MNIST" if value is None else repr(value)
    return str(value)


def _resumed(args, modes):
    """The net and training state of ``--resume``, with the settings it fixes put into ``args``."""
    if modes:
        raise ValueError(f"--resume goes on on one process or --threads; it does not combine with {modes[0]}")
    net = load(args.resume)
    state = net.training_state
    if state is None:
        raise ValueError(f"--resume {args.resume!r}: the file holds a net but no training state; "
                         "train --save writes one after every epoch")
    _check_state(state, args.resume)
    saved = {"sizes": list(net.sizes), "dtype": net.dtype.name, "strategy": str(net.strategy), "loss": net.loss,
             "l2": net.l2[0] if len(set(net.l2)) == 1 else list(net.l2), "batch_size": state["batch_size"],
             "eta": state["eta"], "seed": state["seed"], "data": state.get("data")}
    for key in SETTINGS:
        given = getattr(args, key)
        flag = "--" + key.replace("_", "-")
        if key == "data" and given is not None:
            same = _fingerprint(given) == state.get("data_sha256") and (given is None) == (saved["data"] is None)
        else:
            same = given is None or (str(given) if key == "strategy" else given) == saved[key]
        if not same:
            if key == "strategy" and args.max_memory is not None:
                flag, given = "--max-memory", format_bytes(args.max_memory)
            raise ValueError(f"{flag} {_shown(key, given)} differs from the --resume file's "
                             f"{_shown(key, saved[key])}; leave {flag} out to go on with the file's")
        if key != "data" or given is None:
            setattr(args, key, saved[key])
    if args.data is not None and _fingerprint(args.data) != state.get("data_sha256"):
        raise ValueError(f"--resume {args.resume!r} was trained on {args.data!r}, whose contents have changed since")
    args.strategy = parse_strategy(args.strategy)
    if state["epochs_done"] >= args.epochs:
        raise ValueError(f"--epochs {args.epochs}: the --resume file has already trained {state['epochs_done']} "
                         "epochs; give more epochs in all")
    if args.parallel_batches is None and args.threads == 1 and state["parallel_batches"] > 1:
        args.parallel_batches = state["parallel_batches"]           # the file's, as for every other setting
    per_update = args.parallel_batches or args.threads
    if state["parallel_batches"] != per_update:
        raise ValueError(f"--threads {args.threads} and --parallel-batches {args.parallel_batches or args.threads} "
                         f"average {per_update} mini-batches per update, but the --resume file's run averaged "
                         f"{state['parallel_batches']}: give the same")
    np.random.set_state(state["rng"])
    return net, state


def _state(args, accuracies, epochs_done, updates_done, n_train, per_update=None):
    return {"epochs_done": epochs_done, "updates_done": updates_done, "accuracies": list(accuracies),
            "batch_size": args.batch_size, "eta": args.eta, "seed": args.seed,
            "data": None if args.data is None else os.path.abspath(args.data), "data_sha256": args.data_sha256,
            "n_train": n_train, "parallel_batches": per_update or args.parallel_batches or args.threads,
            "rng": np.random.get_state()}


def train(args):
    """Train one net (plainly or with a strategy) on one process, on threads, or on MPI ranks."""
    from .checkpointing import NetworkWithCheckpointing
    trainer = rank = None
    modes = [flag for flag, on in (("--mpi", args.mpi), ("--pipeline", args.pipeline),
                                   ("--tensor-parallel", args.tensor_parallel)) if on]
    if len(modes) > 1:
        raise ValueError(f"train takes one of --mpi, --pipeline and --tensor-parallel, got {' and '.join(modes)}")
    if modes and args.threads > 1:
        raise ValueError(f"--threads {args.threads} trains on threads of one process; it does not combine "
                         f"with {modes[0]}")
    if not modes and launched_ranks() > 1:
        raise ValueError(f"train runs as one of {launched_ranks()} processes started by mpiexec, but without "
                         "--mpi, --pipeline P or --tensor-parallel: add one to every rank's command, or run it "
                         "without mpiexec")
    net = state = guard = None
    if args.resume:
        net, state = _resumed(args, modes)
    for key, value in DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, parse_strategy(value) if key == "strategy" else value)
    if modes:
        from .distributed import RankGuard
        guard = RankGuard()                        # this rank leaving before training ends ends the job
        rank = guard.rank
        if args.pipeline and args.pipeline != guard.ranks:
            raise ValueError(f"--pipeline {args.pipeline} needs {args.pipeline} ranks (mpiexec -n "
                             f"{args.pipeline}), got {guard.ranks}")
    (x_train, y_train), (x_test, y_test) = load_mnist(args.data)
    args.data_sha256 = _fingerprint(args.data) if args.save else None
    if x_train.shape[1] != args.sizes[0] or y_train.shape[1] != args.sizes[-1]:
        raise ValueError(f"--sizes {','.join(map(str, args.sizes))} do not fit the data: it has "
                         f"{x_train.shape[1]} inputs and {y_train.shape[1]} classes")
    if state is not None and state["n_train"] != len(x_train):
        raise ValueError(f"--resume {args.resume!r} was trained on {state['n_train']} samples, but the data "
                         f"has {len(x_train)}")
    lead = rank in (None, 0)
    done = state["epochs_done"] if state else 0
    epochs = args.epochs - done
    t0 = time.perf_counter()
    if args.pipeline or args.tensor_parallel:
        np.random.seed(args.seed)
        net = trainer = guard.run(_model_parallel, args)
        _, times = guard.run(trainer.SGD, (x_train, y_train), epochs, args.batch_size, args.eta,
                             test_data=(x_test, y_test), verbose=lead and not args.json)
        workers = {"ranks": trainer.ranks, "bytes_sent_per_update": trainer.bytes_per_update}
        if args.pipeline:
            workers.update(pipeline=args.pipeline, micro_batches=args.micro_batches, schedule=args.schedule,
                           partition=trainer.partition, transport=args.transport,
                           bubble_fraction=trainer.bubble_fraction())
        weights, biases = trainer.gather()
        if lead and args.save:
            save_arrays(args.save, args.sizes, args.dtype, weights, biases, loss=args.loss, l2=args.l2,
                        strategy=args.strategy,
                        training=_state(args, trainer.accuracies, args.epochs, len(times), len(x_train)))
        accuracies = list(trainer.accuracies)
    else:
        if net is None:
            make_plan(args.sizes, args.batch_size, args.dtype, args.strategy)
            np.random.seed(args.seed)
            net = NetworkWithCheckpointing(args.sizes, strategy=args.strategy, dtype=args.dtype, loss=args.loss,
                                           l2=args.l2)
        before = list(state["accuracies"]) if state else []
        updates_before = state["updates_done"] if state else 0

        def saved(epoch, updates):
            """After each epoch: the net and where training stands, for --resume."""
            if args.save and lead:
                net.save(args.save, training=_state(args, before + net.accuracies, epoch + 1,
                                                    updates_before + updates, len(x_train)))
        times, workers = _run(args, net, epochs, (x_train, y_train), (x_test, y_test), lead, saved, done,
                              guard if modes else None)
        accuracies = before + net.accuracies
    seconds = time.perf_counter() - t0
    if not lead:
        return 0
    result = {"sizes": args.sizes, "strategy": str(args.strategy), "loss": args.loss, "l2": args.l2,
              "batch_size": args.batch_size, "eta": args.eta, "epochs": args.epochs, "accuracies": accuracies,
              "updates": len(times), "ms_per_update": float(np.median(times) * 1e3) if times else float("nan"),
              "seconds": seconds, **workers}
    if args.resume:
        result["resumed_after_epoch"] = done                       # updates and ms_per_update are this run's
        result["updates_in_all"] = state["updates_done"] + len(times)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"trained {args.sizes} ({result['strategy']}) for {args.epochs} epochs"
              + (f" ({epochs} after the {done} of {args.resume})" if args.resume else "")
              + f": accuracy {accuracies[-1] if accuracies else float('nan'):.4f}, {len(times)} updates, "
              f"{result['ms_per_update']:.3f} ms per update, {seconds:.1f} s"
              + (f", {workers}" if workers else ""))
        if args.save:
            print(f"saved to {args.save}" + ("" if args.save.endswith(".npz") else ".npz"))
    return 0


def _run(args, net, epochs, training, test, lead, on_epoch, first_epoch, guard):
    """Train ``net`` with the lab's loop where ``args`` says: (update times, the workers' description)."""
    if args.mpi:
        from .distributed import MPITrainer
        trainer = MPITrainer(net)
        _, times = guard.run(trainer.SGD, training, epochs, args.batch_size, args.eta, test_data=test,
                                   parallel_batches=args.parallel_batches, verbose=lead and not args.json)
        args.parallel_batches = args.parallel_batches or trainer.ranks
        on_epoch(epochs - 1, len(times))                         # saved once, at the end
        return times, {"ranks": trainer.ranks, "parallel_batches": args.parallel_batches or trainer.ranks,
                       "bytes_sent_and_received_per_update": trainer.bytes_per_update}
    if args.threads > 1 or args.parallel_batches:
        from .parallel import DataParallel
        with DataParallel(net, threads=args.threads) as dp:
            _, times = dp.SGD(training, epochs, args.batch_size, args.eta, test_data=test,
                              parallel_batches=args.parallel_batches, verbose=not args.json, on_epoch=on_epoch,
                              first_epoch=first_epoch)
        return times, {"threads": args.threads, "parallel_batches": args.parallel_batches or args.threads}
    _, times = net.SGD(training, epochs, args.batch_size, args.eta, test_data=test, verbose=not args.json,
                       on_epoch=on_epoch, first_epoch=first_epoch)
    return times, {}
