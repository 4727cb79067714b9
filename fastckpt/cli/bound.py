"""``--max-memory BYTES`` on one process bounds the whole run, not only a step (NOTE [ The whole run ]).

The step gets what the data, the staging rows, a ``--shuffle`` order, the result lists and the larger of
an evaluation (the test set's or ``--validation``'s) and a save leave of BYTES (and ``--early-stopping``'s
best weights, and a regression net's one-hot validation rows), and plans ``fit`` of that; a bound the run
cannot keep is refused before training, line by line.
"""
from dataclasses import replace

from fastckpt.core.losses import is_regression
from fastckpt.data import loading_bytes
from fastckpt.planner import plan as make_plan
from fastckpt.planner.run import fit_the_run, refuse_under_mkl, run_bytes
from fastckpt.planner.strategies import Fit

from .data import data_path


def whole_run(run, training, test, epochs, save):
    """The predicted whole run of ``run`` (its strategy planned for this batch) by part: a dict."""
    step = make_plan(run.sizes, run.batch_size, run.dtype, run.strategy, optimizer_in_backward=run.sgd_in_backward,
                     optimizer=run.optimizer)
    training, around = _around(run, training, epochs)
    parts = run_bytes(step, training, test, updates=epochs * (len(training[0]) // run.batch_size), save=save,
                      **around)
    extra = _besides(run, around["validation"])
    if extra:
        parts["besides"] = extra
        parts["total"] += extra
    return parts


def step_strategy(run, training, test, epochs, save):
    """``fit`` of what ``--max-memory`` (``run.strategy``, a Fit) leaves the step once the rest of the run
    is counted (its optimizer's state too); refused, naming each part, when the run cannot fit."""
    training, around = _around(run, training, epochs)
    return fit_the_run(run.sizes, run.batch_size, run.dtype, run.strategy.nbytes, training, test,
                       updates=epochs * (len(training[0]) // run.batch_size), save=save,
                       optimizer_in_backward=run.sgd_in_backward, optimizer=run.optimizer, name="--max-memory",
                       extra=_besides(run, around["validation"]), **around)


def _around(run, training, epochs):
    """The pair ``train`` trains on (its --validation held out of the end, as ``Network.SGD`` holds it out)
    and :func:`~fastckpt.planner.run.run_bytes`' ``epochs``, ``validation``, ``shuffled``, ``command`` and
    ``loading`` (what loading ``--data`` holds besides it) of ``run``."""
    (x, y), validation = training, None
    if run.validation:
        split = int(len(x) * (1 - run.validation))
        (x, y), validation = (x[:split], y[:split]), (x[split:], y[split:])
    return (x, y), {"epochs": epochs, "validation": validation, "shuffled": run.shuffle is not None, "command": True,
                    "best": getattr(run, "early_stopping", None) is not None,
                    "loading": loading_bytes(data_path(run.data))}


def _besides(run, validation):
    """What the run holds beside its parts: a regression net's validation targets, made one-hot float rows of
    the labels (``Network.SGD`` validates a ``squared_error`` net on target rows)."""
    if validation is None or not is_regression(getattr(run, "loss", "quadratic")):
        return 0
    return len(validation[1]) * run.sizes[-1] * 8


def bounded(args, run, state, *, whole, training, test, kept=None):
    """``run`` with its memory bound settled: ``--max-memory`` as the whole run's bound on one process
    (``whole``: its step gets the ``fit`` the rest leaves), as given or as the ``--resume`` file's (kept for
    the next resume; on one process it bounds the resumed run too, whose step planned by ``kept``, the file's
    strategy, goes on while it keeps to it); a bound MKL cannot keep refused (NOTE [ MKL's own buffers ])."""
    if args.max_memory is not None and whole and state is None:
        run = replace(run, strategy=step_strategy(run, training, test, args.epochs, args.save is not None),
                      max_memory=args.max_memory)
    elif state is not None and whole and state.get("max_memory") is not None:
        run = _resumed_bound(args, run, state, kept, training, test)
    elif state is not None and args.max_memory is not None:     # the file's bound (checked): kept for the next resume
        run = replace(run, max_memory=args.max_memory)
    elif state is not None and state.get("max_memory") is not None:     # not given: the file's, still kept
        refuse_under_mkl(f"--resume {args.resume!r} was trained with --max-memory", state["max_memory"])
        run = replace(run, max_memory=state["max_memory"])
    if isinstance(run.strategy, Fit):          # a bound on each step (or stage): MKL's buffers break it too
        refuse_under_mkl("--strategy", run.strategy.nbytes, "a bound on a step's bytes",
                         shown=f"--strategy {run.strategy}")
    return run


def _resumed_bound(args, run, state, kept, training, test):
    """A one-process run resumed from a file trained under ``--max-memory B``: B bounds the whole run of
    ``--epochs`` (more epochs, longer result lists).  The file's step (``kept``) goes on while the run keeps
    within B; else the step gets the ``fit`` of what the longer run leaves, which computes the same gradients
    bit for bit (tests/test_strategies.py); refused, naming the file and the epochs, when nothing fits."""
    bound = state["max_memory"]
    refuse_under_mkl(f"--resume {args.resume!r} was trained with --max-memory", bound)
    same = replace(run, strategy=kept, max_memory=bound)
    if whole_run(same, training, test, args.epochs, True)["total"] <= bound:
        return same
    try:
        step = step_strategy(replace(run, strategy=Fit(bound)), training, test, args.epochs, True)
    except ValueError as exc:
        raise ValueError(f"--resume {args.resume!r} was trained under --max-memory, which bounds the resumed run "
                         f"too: for --epochs {args.epochs} in all, {exc}") from None
    return replace(run, strategy=step, max_memory=bound)
