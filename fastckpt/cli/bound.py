"""``--max-memory BYTES`` on one process bounds the whole run, not only a step (NOTE [ The whole run ]).

The step gets what the data, the staging rows, the result lists and the larger of an evaluation and
a save leave of BYTES, and plans ``fit`` of that; a bound the run cannot keep is refused before
training, line by line.
"""
from fastckpt.planner import plan as make_plan
from fastckpt.planner.run import fit_the_run, run_bytes


def whole_run(run, training, test, epochs, save):
    """The predicted whole run of ``run`` (its strategy planned for this batch) by part: a dict."""
    step = make_plan(run.sizes, run.batch_size, run.dtype, run.strategy, optimizer_in_backward=run.sgd_in_backward,
                     optimizer=run.optimizer)
    updates = epochs * (len(training[0]) // run.batch_size)
    return run_bytes(step, training, test, updates=updates, save=save)


def step_strategy(run, training, test, epochs, save):
    """``fit`` of what ``--max-memory`` (``run.strategy``, a Fit) leaves the step once the rest of the run
    is counted (its optimizer's state too); refused, naming each part, when the run cannot fit."""
    return fit_the_run(run.sizes, run.batch_size, run.dtype, run.strategy.nbytes, training, test,
                       updates=epochs * (len(training[0]) // run.batch_size), save=save,
                       optimizer_in_backward=run.sgd_in_backward, optimizer=run.optimizer, name="--max-memory")
