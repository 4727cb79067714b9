"""``--max-memory BYTES`` on one process bounds the whole run, not only a step (NOTE [ The whole run ]).

The step gets what the data, the staging rows, a ``--shuffle`` order, the result lists and the larger of
an evaluation (the test set's or ``--validation``'s) and a save leave of BYTES, and plans ``fit`` of that;
a bound the run cannot keep is refused before training, line by line.
"""
from dataclasses import replace

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
    return run_bytes(step, training, test, updates=epochs * (len(training[0]) // run.batch_size), save=save, **around)


def step_strategy(run, training, test, epochs, save):
    """``fit`` of what ``--max-memory`` (``run.strategy``, a Fit) leaves the step once the rest of the run
    is counted (its optimizer's state too); refused, naming each part, when the run cannot fit."""
    training, around = _around(run, training, epochs)
    return fit_the_run(run.sizes, run.batch_size, run.dtype, run.strategy.nbytes, training, test,
                       updates=epochs * (len(training[0]) // run.batch_size), save=save,
                       optimizer_in_backward=run.sgd_in_backward, optimizer=run.optimizer, name="--max-memory",
                       **around)


def _around(run, training, epochs):
    """The pair ``train`` trains on (its --validation held out of the end, as ``Network.SGD`` holds it out)
    and :func:`~fastckpt.planner.run.run_bytes`' ``epochs``, ``validation``, ``shuffled``, ``command`` and
    ``loading`` (what loading ``--data`` holds besides it) of ``run``."""
    (x, y), validation = training, None
    if run.validation:
        split = int(len(x) * (1 - run.validation))
        (x, y), validation = (x[:split], y[:split]), (x[split:], y[split:])
    return (x, y), {"epochs": epochs, "validation": validation, "shuffled": run.shuffle is not None, "command": True,
                    "loading": loading_bytes(data_path(run.data))}


def bounded(args, run, state, *, whole, training, test):
    """``run`` with its memory bound settled: ``--max-memory`` as the whole run's bound on one process
    (``whole``: its step gets the ``fit`` the rest leaves), as given or as the ``--resume`` file's (kept for
    the next resume); a bound MKL cannot keep refused (NOTE [ MKL's own buffers ])."""
    if args.max_memory is not None and whole:
        run = replace(run, strategy=step_strategy(run, training, test, args.epochs, args.save is not None),
                      max_memory=args.max_memory)
    elif state is not None and args.max_memory is not None:     # the file's bound (checked): kept for the next resume
        run = replace(run, max_memory=args.max_memory)
    elif state is not None and state.get("max_memory") is not None:     # not given: the file's, still kept
        refuse_under_mkl(f"--resume {args.resume!r} was trained with --max-memory", state["max_memory"])
        run = replace(run, max_memory=state["max_memory"])
    if isinstance(run.strategy, Fit):          # a bound on each step (or stage): MKL's buffers break it too
        refuse_under_mkl("--strategy", run.strategy.nbytes, "a bound on a step's bytes",
                         shown=f"--strategy {run.strategy}")
    return run
