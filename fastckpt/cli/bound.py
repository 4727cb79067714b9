"""``--max-memory BYTES`` on one process bounds the whole run, not only a step (NOTE [ The whole run ]).

The step gets what the data, the staging rows, the result lists and the larger of an evaluation and
a save leave of BYTES, and plans ``fit`` of that; a bound the run cannot keep is refused before
training, line by line.
"""
from fastckpt.planner import InfeasiblePlan
from fastckpt.planner import plan as make_plan
from fastckpt.planner.run import run_bytes
from fastckpt.planner.strategies import Fit, format_bytes

MiB = 2**20


def whole_run(run, training, test, epochs, save):
    """The predicted whole run of ``run`` (its strategy planned for this batch) by part: a dict."""
    step = make_plan(run.sizes, run.batch_size, run.dtype, run.strategy, optimizer_in_backward=run.sgd_in_backward)
    updates = epochs * (len(training[0]) // run.batch_size)
    return run_bytes(step, training, test, updates=updates, save=save)


def step_strategy(run, training, test, epochs, save):
    """``fit`` of what ``--max-memory`` (``run.strategy``, a Fit) leaves the step once the rest of the run
    is counted; refused, naming each part, when the run cannot fit."""
    bound = run.strategy.nbytes
    rest = run_bytes(make_plan(run.sizes, run.batch_size, run.dtype, "plain",
                               optimizer_in_backward=run.sgd_in_backward),
                     training, test, updates=epochs * (len(training[0]) // run.batch_size), save=save)
    others = rest["data"] + rest["staging"] + rest["records"]
    after = max(rest.get("evaluation", 0), rest.get("saving", 0))
    budget = bound - others - max(0, after - rest["step: blas"])
    parts = ", ".join(f"{name} {value / MiB:.2f} MiB" for name, value in rest.items()
                      if name in ("data", "staging", "records", "evaluation", "saving"))
    least = None
    if budget > 0:
        try:
            make_plan(run.sizes, run.batch_size, run.dtype, Fit(budget), optimizer_in_backward=run.sgd_in_backward)
            return Fit(budget)
        except InfeasiblePlan as exc:
            least = exc.minimum_bytes
    need = others + max(0, after - rest["step: blas"]) + (least or 0)
    if least is None:
        raise ValueError(f"--max-memory {format_bytes(bound)}: the whole run needs more than {need / MiB:.2f} MiB "
                         f"before its training step: {parts}")
    raise ValueError(f"--max-memory {format_bytes(bound)}: the whole run needs at least {need / MiB:.2f} MiB: "
                     f"{parts}, and the least training step {least / MiB:.2f} MiB")
