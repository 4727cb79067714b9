"""``fastckpt train``: one net on one process, on threads or on MPI ranks; saved after every epoch, resumable.

The parsed arguments are read, never changed: :func:`settle` makes the run's
:class:`Run` from them, the --resume file and :data:`~fastckpt.cli.options.TRAIN_DEFAULTS`.
"""
import gc
import sys
import time
import warnings
from dataclasses import dataclass, replace

import numpy as np

from fastckpt.core.lr import parse_lr_schedule
from fastckpt.engine.loop import SkippedSamples
from fastckpt.nets import NetworkWithCheckpointing
from fastckpt.nets.io import save_arrays
from fastckpt.parallel import DataParallel, MPITrainer, PipelineTrainer, TensorParallelTrainer
from fastckpt.parallel.mpi import launched_ranks
from fastckpt.planner import parse_strategy
from fastckpt.planner.run import refuse_under_mkl

from .best import one_process
from .bound import bounded
from .data import check_trainable, fingerprint, load_data
from .guard import RankGuard
from .notes import say_before_training
from .options import TRAIN_DEFAULTS, check_grid, check_lone_flags, pipeline_options, tensor_shards
from .progress import TrainBar
from .result import report
from .resume import SETTINGS, Saver, resumed, run_mode, training_state


@dataclass(frozen=True)
class Run:
    """The settings of one ``train`` run: given on the command line, else the --resume file's, else the default."""

    sizes: list
    dtype: str
    strategy: object
    loss: str
    l2: object
    batch_size: int
    eta: float
    seed: int
    data: str | None
    sgd_in_backward: bool
    activation: str
    optimizer: str
    parallel_batches: int | None
    shuffle: int | None = None
    validation: float | None = None
    max_memory: int | None = None
    data_sha256: str | None = None
    lr_schedule: str | None = None
    early_stopping: int | None = None
    mode: str = "on one process"
    pipeline: dict | None = None


def settle(args, saved=None):
    """The :class:`Run` of ``args``; ``saved`` holds the --resume file's settings (already checked against them)."""
    values = {}
    for key in SETTINGS:
        given = getattr(args, key)
        values[key] = given if given is not None else (saved or {}).get(key, TRAIN_DEFAULTS.get(key))
    values["strategy"] = parse_strategy(values["strategy"])
    values["parallel_batches"] = args.parallel_batches if saved is None else saved["parallel_batches"]
    for key in ("shuffle", "validation"):       # the file's run's, unless given (the same, checked)
        values[key] = getattr(args, key) if saved is None or getattr(args, key) is not None else saved.get(key)
    schedule = args.lr_schedule if args.lr_schedule is not None else (saved or {}).get("lr_schedule")
    values["lr_schedule"] = str(parse_lr_schedule(schedule).resolved(args.epochs))   # cosine's T fixed, for resumes
    values["early_stopping"] = args.early_stopping
    pipeline = (saved or {}).get("pipeline")
    return Run(**values, mode=run_mode(args, pipeline), pipeline=pipeline_options(args, pipeline))


def modes_of(args):
    """The one MPI mode of ``args`` as a list of its flag (empty: one process or threads), checked."""
    modes = [flag for flag, on in (("--mpi", args.mpi), ("--pipeline", args.pipeline),     # stages may be split
                                   ("--tensor-parallel", args.tensor_parallel and not args.pipeline)) if on]
    if len(modes) > 1:
        raise ValueError(f"train takes one of --mpi, --pipeline (with --tensor-parallel or not) and "
                         f"--tensor-parallel, got {' and '.join(modes)}")
    if modes and args.threads > 1:
        raise ValueError(f"--threads {args.threads} trains on threads of one process; it does not combine "
                         f"with {modes[0]}")
    if not args.pipeline:
        given = [flag for flag, key in (("--micro-batches", "micro_batches"), ("--schedule", "schedule"),
                                        ("--partition", "partition"), ("--transport", "transport"),
                                        ("--data-parallel", "data_parallel"))
                 if getattr(args, key) is not None and not (key == "data_parallel" and args.tensor_parallel)]
        if given:
            also = " or --tensor-parallel" if given[0] == "--data-parallel" else ""
            value = getattr(args, given[0][2:].replace("-", "_"))
            shown = ",".join(map(str, value)) if isinstance(value, list) else value
            raise ValueError(f"{given[0]} {shown} is an option of --pipeline P{also}; without "
                             f"{'them' if also else '--pipeline'} it would change nothing")
    if args.max_memory is not None:
        refuse_under_mkl("--max-memory", args.max_memory)
    check_lone_flags(args)
    if args.sgd_in_backward and (modes or args.threads > 1 or args.parallel_batches):
        raise ValueError("--optimizer-in-backward steps each layer as its gradient is final, on one process; with "
                         f"{modes[0] if modes else '--threads or --parallel-batches'} the gradients of several "
                         "mini-batches are summed first, so leave it out")
    for flag in ("--shuffle", "--validation", "--early-stopping", "--save-best"):
        given = getattr(args, flag[2:].replace("-", "_"))
        if given not in (None, "lab", "sgd", "sigmoid") and (modes or args.threads > 1 or args.parallel_batches):
            raise ValueError(f"{flag} {given} trains one process's net; with "
                             f"{modes[0] if modes else '--threads or --parallel-batches'} leave it out")
    if not modes and launched_ranks() > 1:
        raise ValueError(f"train runs as one of {launched_ranks()} processes started by mpiexec, but without "
                         "--mpi, --pipeline P or --tensor-parallel: add one to every rank's command, or run it "
                         "without mpiexec")
    return modes


def train(args):
    """Train one net (plainly or with a strategy) on one process, on threads, or on MPI ranks."""
    modes = modes_of(args)
    net, state, saved = resumed(args, modes) if args.resume else (None, None, None)
    run = settle(args, saved)
    done = state["epochs_done"] if state else 0
    parse_lr_schedule(run.lr_schedule).check_rates(run.eta, done, args.epochs - done, "--lr-schedule")
    if not args.pipeline and not args.tensor_parallel:   # a stage or a shard plans (and bounds) its own part
        check_trainable(run.sizes, run.batch_size, run.dtype, run.strategy,  # before any rank allocates it
                        optimizer_in_backward=run.sgd_in_backward, optimizer=run.optimizer)
    guard = RankGuard() if modes else None                 # this rank leaving before training ends ends the job
    if guard is not None:
        guard.agree({"--save": "given" if args.save else "not given"})
    check_grid(args, run, guard.ranks if guard is not None else 1)
    (x_train, y_train), test = load_data(run.data, run.sizes)
    run = replace(run, data_sha256=fingerprint(run.data) if args.save else None)
    if state is not None and state["n_train"] != len(x_train):
        raise ValueError(f"--resume {args.resume!r} was trained on {state['n_train']} samples, but the data "
                         f"has {len(x_train)}")
    lead = guard is None or guard.rank == 0
    run = bounded(args, run, state, whole=not modes and args.threads == 1 and not run.parallel_batches and net is None,
                  training=(x_train, y_train), test=test)
    bound = say_before_training(args, run, state, (x_train, y_train), test) if lead else None
    if not lead:
        warnings.filterwarnings("ignore", category=SkippedSamples)         # rank 0 says it, once
    if run.max_memory is not None:          # the parser's, the loader's and the plans' reference cycles, freed
        gc.collect()                        # here, not whenever the collector runs: not beside a bounded run
    t0 = time.perf_counter()
    if args.pipeline or args.tensor_parallel:
        times, accuracies, workers = _model_parallel(args, run, guard, (x_train, y_train), test, lead, net, state)
    else:
        if net is None:
            np.random.seed(run.seed)
            net = NetworkWithCheckpointing(run.sizes, strategy=run.strategy, dtype=run.dtype, loss=run.loss,
                                           l2=run.l2, optimizer_in_backward=run.sgd_in_backward,
                                           activation=run.activation, init=args.init or TRAIN_DEFAULTS["init"],
                                           optimizer=run.optimizer)
        times, accuracies, workers = _one_net(args, run, net, state, guard, (x_train, y_train), test, lead)
    if guard is not None:
        guard.finish()
    if lead:
        report(args, run, state, done, times, accuracies, workers, time.perf_counter() - t0, bound)
    return 0


def _model_parallel(args, run, guard, training, test, lead, resumed_net=None, state=None):
    """Pipeline or tensor parallelism: (update times, accuracies, the workers' description); from
    ``resumed_net`` and its training ``state`` when resuming."""
    rng = np.random.get_state()                          # where a --resume file's run left it
    np.random.seed(run.seed)
    pipe = run.pipeline
    net = {"activation": run.activation, "init": args.init or TRAIN_DEFAULTS["init"], "optimizer": run.optimizer}
    if args.pipeline:
        trainer = guard.run(PipelineTrainer, run.sizes, pipe["micro_batches"], schedule=pipe["schedule"],
                            strategy=run.strategy, dtype=run.dtype, loss=run.loss, l2=run.l2,
                            partition=pipe["partition"], transport=pipe["transport"], batch_size=run.batch_size,
                            data_parallel=args.data_parallel or 1, tensor_parallel=tensor_shards(args, guard.ranks),
                            **net)
    else:
        trainer = guard.run(TensorParallelTrainer, run.sizes, dtype=run.dtype, loss=run.loss, l2=run.l2,
                            data_parallel=args.data_parallel or 1, strategy=run.strategy, **net)
    before, updates_before, done = ([], 0, 0) if state is None else \
        (list(state["accuracies"]), state["updates_done"], state["epochs_done"])
    if resumed_net is not None:
        guard.run(trainer.load_net, resumed_net)
        np.random.set_state(rng)
    save = Saver(args.save, args.force, guard, args.resume)
    bar = TrainBar(args, lead, done)

    def saved(epoch, updates):
        """After each epoch, on every rank: the whole net gathered (a collective), saved by rank 0."""
        if args.save:
            (weights, biases), state = trainer.gather(), trainer.gather_state()
            save(lambda path, exclusive: save_arrays(
                path, run.sizes, run.dtype, weights, biases, loss=run.loss, l2=run.l2, strategy=run.strategy,
                exclusive=exclusive, training=training_state(run, before + trainer.accuracies, epoch + 1,
                                                             updates_before + updates, len(training[0]), 1),
                activation=run.activation, optimizer=run.optimizer, optimizer_state=state))
    bar.watch(trainer)
    _, times = guard.run(trainer.SGD, training, args.epochs - done, run.batch_size, run.eta, test_data=test,
                         verbose=False, progress=bar.progress, on_epoch=bar.after(saved, trainer),
                         lr_schedule=run.lr_schedule, first_epoch=done)
    workers = {"ranks": guard.ranks, "bytes_sent_per_update": round(trainer.bytes_per_update)}   # every rank
    if args.pipeline:
        workers.update(pipeline=args.pipeline, data_parallel=args.data_parallel or 1, tensor_parallel=trainer.shards,
                       micro_batches=pipe["micro_batches"], schedule=pipe["schedule"],
                       partition=trainer.partition, transport=pipe["transport"],
                       bubble_fraction=trainer.bubble_fraction())
    else:
        workers.update(tensor_parallel=trainer.ranks, data_parallel=trainer.data_parallel)
    return times, before + list(trainer.accuracies), workers


def _one_net(args, run, net, state, guard, training, test, lead):
    """One net on one process, on threads or with MPI data parallelism: (times, accuracies, workers)."""
    before = list(state["accuracies"]) if state else []
    updates_before = state["updates_done"] if state else 0
    done = state["epochs_done"] if state else 0
    epochs = args.epochs - done
    per_update = run.parallel_batches
    save = Saver(args.save, args.force, guard, args.resume)
    bar = TrainBar(args, lead, done)
    # not under --mpi: the note would come before the ranks agree on their settings, whose refusal is one line
    averaged = per_update or (args.threads if not args.mpi else None)
    if lead and not args.json and averaged and averaged > 1:
        print(f"fastckpt train: note: each update averages {averaged} mini-batches, so an epoch makes {averaged} "
              f"times fewer updates at the same --eta {run.eta} (a larger --eta makes up for it)", file=sys.stderr)

    def saved(epoch, updates):
        """After each epoch: the net and where training stands, for --resume."""
        save(lambda path, exclusive: net.save(path, exclusive=exclusive, training=training_state(
            run, before + net.accuracies, epoch + 1, updates_before + updates, len(training[0]),
            per_update or args.threads)))
    if args.mpi:
        trainer = bar.watch(guard.run(MPITrainer, net, bucket_bytes=args.bucket_bytes))
        per_update = per_update or trainer.ranks
        _, times = guard.run(trainer.SGD, training, epochs, run.batch_size, run.eta, test_data=test,
                             parallel_batches=per_update, verbose=False, progress=bar.progress,
                             on_epoch=bar.after(saved, net), lr_schedule=run.lr_schedule, first_epoch=done)
        workers = {"ranks": trainer.ranks, "parallel_batches": per_update,
                   "bytes_sent_and_received_per_update": trainer.bytes_per_update}
    elif args.threads > 1 or per_update:
        with DataParallel(net, threads=args.threads) as dp:
            bar.watch(dp)
            _, times = dp.SGD(training, epochs, run.batch_size, run.eta, test_data=test, parallel_batches=per_update,
                              verbose=False, progress=bar.progress, on_epoch=bar.after(saved, net),
                              first_epoch=done, lr_schedule=run.lr_schedule)
        workers = {"threads": args.threads, "parallel_batches": per_update or args.threads}
    else:
        times, workers = one_process(args, run, bar.watch(net), bar, training, test, done, saved,
                                     lambda epoch, updates: training_state(run, before + net.accuracies, epoch + 1,
                                                                           updates_before + updates,
                                                                           len(training[0]), 1))
    return times, before + net.accuracies, workers
