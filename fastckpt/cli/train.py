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
from fastckpt.parallel import DataParallel, Grid, Trainer
from fastckpt.parallel.mpi import launched_ranks
from fastckpt.planner import parse_strategy
from fastckpt.planner.run import refuse_under_mkl

from .best import one_process
from .bound import bounded
from .data import check_trainable, fingerprint, load_data
from .guard import RankGuard
from .notes import say_before_training
from .options import TRAIN_DEFAULTS, check_grid_options, check_lone_flags, grid_axes, on_ranks, pipeline_options
from .progress import TrainBar
from .result import report
from .resume import SETTINGS, Saver, check_resumed_samples, from_file, resumed, run_mode, training_state, with_strategy


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


def check_modes(args):
    """Refuse flags of ``train`` that do not go together: threads and MPI ranks, options of one without it,
    settings one process's net alone takes."""
    ranks = on_ranks(args)
    if ranks and args.threads > 1:
        raise ValueError(f"--threads {args.threads} trains on threads of one process; it does not combine with "
                         "--mpi, --data-parallel, --pipeline or --tensor-parallel")
    if args.max_memory is not None:
        refuse_under_mkl("--max-memory", args.max_memory)
    check_lone_flags(args)
    several = "--threads or --parallel-batches" if args.threads > 1 or args.parallel_batches else None
    if args.max_memory is not None and several and not ranks:
        given = f"--threads {args.threads}" if args.threads > 1 else f"--parallel-batches {args.parallel_batches}"
        raise ValueError(f"--max-memory bounds the whole run of one process training one step at a time; with "
                         f"{given} several steps' buffers and their sum are not planned as one whole, so the bound "
                         f"would not hold: give --strategy fit({args.max_memory}) to fit each step to those bytes, "
                         "or leave it out")
    if args.sgd_in_backward and several:
        raise ValueError("--optimizer-in-backward steps each layer as its gradient is final, on one process; with "
                         f"{several} the gradients of several mini-batches are summed first, so leave it out")
    for flag in ("--shuffle", "--validation", "--early-stopping", "--save-best"):
        given = getattr(args, flag[2:].replace("-", "_"))
        if given is not None and (ranks or several):
            raise ValueError(f"{flag} {given} trains one process's net; with "
                             f"{several or 'MPI ranks'} leave it out")
    if not ranks and launched_ranks() > 1:
        raise ValueError(f"train runs as one of {launched_ranks()} processes started by mpiexec, but without "
                         "--mpi, --data-parallel, --pipeline or --tensor-parallel: add one to every rank's command, "
                         "or run it without mpiexec")
    return ranks


def train(args):
    """Train one net (plainly or with a strategy) on one process, on threads, or on MPI ranks."""
    ranks = check_modes(args)
    net, state, saved = resumed(args) if args.resume else (None, None, None)
    run = settle(args, saved)
    done = state["epochs_done"] if state else 0
    parse_lr_schedule(run.lr_schedule).check_rates(run.eta, done, args.epochs - done, from_file(
        args, "lr_schedule", "--lr-schedule"))
    if not ranks:                                          # a rank plans (and bounds) its own part
        _check_trainable(args, run)                        # before any rank allocates it
    guard = RankGuard() if ranks else None                 # this rank leaving before training ends ends the job
    axes = None
    if guard is not None:
        guard.agree({"--save": "given" if args.save else "not given"})
        axes = grid_axes(args, guard.ranks)
        check_grid_options(args, run, axes)
    (x_train, y_train), test = load_data(run.data, run.sizes)
    run = replace(run, data_sha256=fingerprint(run.data) if args.save else None)
    if state is not None:
        check_resumed_samples(args.resume, state, len(x_train))
    lead = guard is None or guard.rank == 0
    run = bounded(args, run, state, whole=not ranks and args.threads == 1 and not run.parallel_batches,
                  training=(x_train, y_train), test=test, kept=None if net is None else net.strategy)
    bound = say_before_training(args, run, state, (x_train, y_train), test) if lead else None
    if not lead:
        warnings.filterwarnings("ignore", category=SkippedSamples)         # rank 0 says it, once
    if run.max_memory is not None:          # the parser's, the loader's and the plans' reference cycles, freed
        gc.collect()                        # here, not whenever the collector runs: not beside a bounded run
    t0 = time.perf_counter()
    if ranks:
        times, accuracies, workers = _on_ranks(args, run, guard, axes, (x_train, y_train), test, net, state)
    else:
        if net is None:
            np.random.seed(run.seed)
            net = NetworkWithCheckpointing(run.sizes, strategy=run.strategy, dtype=run.dtype, loss=run.loss,
                                           l2=run.l2, optimizer_in_backward=run.sgd_in_backward,
                                           activation=run.activation, init=args.init or TRAIN_DEFAULTS["init"],
                                           optimizer=run.optimizer)
        elif str(net.strategy) != str(run.strategy):       # the resumed run's bound planned its step anew
            net = with_strategy(net, run.strategy)
        times, accuracies, workers = _one_net(args, run, net, state, (x_train, y_train), test)
    if guard is not None:
        guard.finish()
    if lead:
        report(args, run, state, done, times, accuracies, workers, time.perf_counter() - t0, bound)
    return 0


def _check_trainable(args, run):
    """Refuse a step that cannot be planned before anything is allocated; a --resume file's own strategy (a
    ``fit(bytes)`` too small for this machine's BLAS buffers, say) is named as the file's."""
    try:
        check_trainable(run.sizes, run.batch_size, run.dtype, run.strategy,
                        optimizer_in_backward=run.sgd_in_backward, optimizer=run.optimizer)
    except ValueError as exc:
        if args.resume and args.strategy is None and args.max_memory is None:
            raise ValueError(f"--resume {args.resume!r}: the strategy its run trained with, {exc}") from None
        raise


def _on_ranks(args, run, guard, axes, training, test, resumed_net=None, state=None):
    """Training over MPI ranks, one :class:`~fastckpt.parallel.trainer.Trainer` over the grid ``axes``: (update
    times, accuracies, the workers' description); from ``resumed_net`` and its training ``state`` when
    resuming."""
    rng = np.random.get_state()                          # where a --resume file's run left it
    np.random.seed(run.seed)
    pipe, (data, pipeline, tensor) = run.pipeline, axes
    trainer = guard.run(Trainer, run.sizes, grid=guard.run(Grid, data, pipeline, tensor),
                        micro_batches=pipe["micro_batches"], schedule=pipe["schedule"], strategy=run.strategy,
                        dtype=run.dtype, loss=run.loss, l2=run.l2, partition=pipe["partition"],
                        transport=pipe["transport"], batch_size=run.batch_size, activation=run.activation,
                        init=args.init or TRAIN_DEFAULTS["init"], optimizer=run.optimizer,
                        optimizer_in_backward=run.sgd_in_backward, bucket_bytes=args.bucket_bytes)
    before, updates_before, done = ([], 0, 0) if state is None else \
        (list(state["accuracies"]), state["updates_done"], state["epochs_done"])
    if resumed_net is not None:
        guard.run(trainer.load_net, resumed_net)
        np.random.set_state(rng)
    per_update = run.parallel_batches or data
    save = Saver(args.save, args.force, guard, args.resume)
    bar = TrainBar(args, guard.rank == 0, done)

    def saved(epoch, updates):
        """After each epoch, on every rank: the whole net gathered (a collective), saved by rank 0."""
        if args.save:
            (weights, biases), state = trainer.gather(), trainer.gather_state()
            save(lambda path, exclusive: save_arrays(
                path, run.sizes, run.dtype, weights, biases, loss=run.loss, l2=run.l2, strategy=run.strategy,
                exclusive=exclusive, training=training_state(run, before + trainer.accuracies, epoch + 1,
                                                             updates_before + updates, len(training[0]), per_update),
                activation=run.activation, optimizer=run.optimizer, optimizer_state=state,
                optimizer_in_backward=run.sgd_in_backward))
    bar.watch(trainer)
    _, times = guard.run(trainer.SGD, training, args.epochs - done, run.batch_size, run.eta, test_data=test,
                         parallel_batches=per_update, verbose=False, progress=bar.progress,
                         on_epoch=bar.after(saved, trainer), lr_schedule=run.lr_schedule, first_epoch=done)
    workers = {"ranks": guard.ranks, "data_parallel": data, "pipeline": pipeline, "tensor_parallel": tensor,
               "parallel_batches": per_update, "bytes_sent_per_update": round(trainer.bytes_per_update)}
    if pipeline > 1:
        workers.update(micro_batches=pipe["micro_batches"], schedule=pipe["schedule"], partition=trainer.partition,
                       transport=pipe["transport"], bubble_fraction=trainer.bubble_fraction())
    return times, before + list(trainer.accuracies), workers


def _one_net(args, run, net, state, training, test):
    """One net on one process or on threads: (times, accuracies, workers)."""
    before = list(state["accuracies"]) if state else []
    updates_before = state["updates_done"] if state else 0
    done = state["epochs_done"] if state else 0
    epochs = args.epochs - done
    per_update = run.parallel_batches
    save = Saver(args.save, args.force, None, args.resume)
    bar = TrainBar(args, True, done)
    averaged = per_update or args.threads
    batches = -(-len(training[0]) // run.batch_size)
    if per_update and per_update > batches:
        raise ValueError(f"{from_file(args, 'parallel_batches', '--parallel-batches')} {per_update} is more than "
                         f"the {batches} mini-batches of "
                         f"{run.batch_size} in an epoch of {len(training[0])} samples: give at most {batches}")
    if not args.json and averaged > 1:
        print(f"fastckpt train: note: each update averages {averaged} mini-batches, so an epoch makes {averaged} "
              f"times fewer updates at the same --eta {run.eta} (a larger --eta makes up for it)", file=sys.stderr)

    def saved(epoch, updates):
        """After each epoch: the net and where training stands, for --resume."""
        save(lambda path, exclusive: net.save(path, exclusive=exclusive, training=training_state(
            run, before + net.accuracies, epoch + 1, updates_before + updates, len(training[0]),
            per_update or args.threads)))
    if args.threads > 1 or per_update:
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
