"""What ``train`` says about its run before it trains, on rank 0: what ``--max-memory`` chose, in words, on
stdout; and its notes on stderr: a strategy that saves nothing here, a ``--resume`` file's cosine schedule
that has ended, a ``--resume`` at another ``--eta`` (fine-tuning) or on other BLAS threads."""
import sys

from fastckpt.core.lr import parse_lr_schedule
from fastckpt.planner import plan as make_plan
from fastckpt.planner.pays import does_not_pay
from fastckpt.planner.strategies import Fit, format_bytes
from fastckpt.planner.words import spans

from .bound import whole_run
from .options import on_ranks
from .resume import threads_note

MiB = 2**20


def bound_in_words(args, run, training, test):
    """``(line, facts)``: what the run's memory bound (``--max-memory``, or the --resume file's) chose for the
    step, in words, and as a dict for ``--json``.  ``(None, None)`` without a bound on the whole run: on
    threads or MPI ranks ``--max-memory`` bounds each worker's step, which the worker plans for itself."""
    if run.max_memory is None or not isinstance(run.strategy, Fit) or on_ranks(args) or args.threads > 1 \
            or run.parallel_batches:
        return None, None
    p = make_plan(run.sizes, run.batch_size, run.dtype, run.strategy, optimizer_in_backward=run.sgd_in_backward,
                  optimizer=run.optimizer)
    layers = len(run.sizes) - 1
    again = int((p.forward_counts > 1).sum())
    facts = {"max_memory": run.max_memory, "kept": list(p.kept), "recomputed_layers": again,
             "extra_flop_fraction": p.extra_flop_fraction, "step_bytes": p.bytes()["total"]}
    if again:
        what = (f"keeps activations {spans(p.kept)} after the forward pass ({len(p.kept) - 1} of {layers} besides "
                f"the input) and recomputes {again} of the {layers} layers during backward "
                f"({100 * p.extra_flop_fraction:.1f}% more FLOPs than plain)")
    else:
        what = "keeps every activation: nothing is recomputed"
    facts["whole_run_bytes"] = whole_run(run, training, test, args.epochs, args.save is not None)["total"]
    return (f"--max-memory {format_bytes(run.max_memory)}: the step {what}; the whole run's predicted peak is "
            f"{facts['whole_run_bytes'] / MiB:.2f} MiB, its step's {facts['step_bytes'] / MiB:.2f} MiB"), facts


def say_before_training(args, run, state, training, test):
    """Print what the bound chose (stdout) and the notes (stderr); returns the bound's facts for ``--json``."""
    line, facts = bound_in_words(args, run, training, test)
    if args.json:
        return facts
    if line:
        print(line, flush=True)
    note = does_not_pay(run.sizes, run.batch_size, run.dtype, run.strategy, optimizer_in_backward=run.sgd_in_backward,
                        optimizer=run.optimizer)
    if note and not args.pipeline and not args.tensor_parallel:                # a whole net's bytes
        print(f"fastckpt train: note: {note}", file=sys.stderr)
    if state is not None and run.eta != state["eta"]:
        print(f"fastckpt train: note: --eta {run.eta:g} instead of the --resume file's {state['eta']:g}: the run "
              "goes on at the new rate (fine-tuning), so it is not the unbroken run's bit for bit", file=sys.stderr)
    threads = threads_note(state) if state is not None else None
    if threads:
        print(f"fastckpt train: note: {threads}", file=sys.stderr)
    schedule = parse_lr_schedule(run.lr_schedule)
    if state is not None and schedule.name == "cosine" and schedule.epochs < args.epochs:
        print(f"fastckpt train: note: the --resume file's --lr-schedule {schedule} reached its eta_min "
              f"{schedule.eta_min:g} at epoch {schedule.epochs + 1}, so epochs {schedule.epochs + 1}..{args.epochs} "
              f"train at {schedule.eta_min:g}; --lr-schedule 'cosine({args.epochs})' anneals over all "
              f"{args.epochs}", file=sys.stderr)
    return facts
