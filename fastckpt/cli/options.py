"""The command line's option types, help texts and defaults, each written once."""
import argparse
import math

from fastckpt.core.lr import parse_lr_schedule
from fastckpt.planner.strategies import format_bytes, parse_bytes, parse_strategies, parse_strategy

from .guard import leave_job

#: ``train``'s settings when neither the command line nor a --resume file gives them
TRAIN_DEFAULTS = {"sizes": [784, 40, 30, 10], "batch_size": 10, "dtype": "float64", "strategy": "plain",
                  "loss": "quadratic", "l2": 0.0, "eta": 3.0, "seed": 0, "sgd_in_backward": False,
                  "activation": "sigmoid", "optimizer": "sgd", "init": "lab"}

#: ``train --pipeline``'s options when not given; without --pipeline they may not be given
PIPELINE_DEFAULTS = {"micro_batches": 4, "schedule": "gpipe", "transport": "native", "partition": None}


def pipeline_options(args, saved=None):
    """``--micro-batches``, ``--schedule``, ``--transport`` and ``--partition`` as given, else the --resume
    file's (``saved``), else their defaults."""
    return {key: getattr(args, key) if getattr(args, key) is not None else (saved or {}).get(key, default)
            for key, default in PIPELINE_DEFAULTS.items()}

STRATEGIES = ("plain, every_nth(n), segments(k), sqrt, revolve(slots), budget(bytes[, once]) (a bound on "
              "activation memory) or fit(bytes) (a bound on the whole step)")
TRAIN_MAX_MEMORY = ("on one process, bound the whole run's memory to BYTES (e.g. 256MiB), as memray measures it "
                    "above the process after its imports: the data, the training step, the staging rows, the "
                    "evaluations (the test set's and --validation's) or a save, a --shuffle order, and the result "
                    "lists; the step gets what the rest leaves and plans "
                    "the least recomputation that fits it (fastckpt plan --data shows the parts). With --threads, "
                    "--mpi, --pipeline or --tensor-parallel it bounds each worker's step (default: off, --strategy "
                    "decides)")
PROFILE_MAX_MEMORY = ("profile the step train --max-memory BYTES plans on one process without --save: the fit of "
                      "what the data, the staging rows, an evaluation and the result lists of --epochs leave of "
                      "BYTES (default: off, --strategy decides)")
MAX_MEMORY = ("plan the least recomputation whose predicted training step fits BYTES (e.g. 64MiB): parameters, "
              "gradients, activations and buffers, which memray measures to within a few tens of KiB; the same "
              "as --strategy fit(BYTES). "
              "The process's RSS adds the interpreter, libraries and data (default: off, --strategy decides)")


class Parser(argparse.ArgumentParser):
    def parse_args(self, args=None, namespace=None):
        """As argparse's, but a flag the command does not know is refused by the command's own parser, so
        the line names it (``fastckpt profile: error: unrecognized arguments: --nope``)."""
        found, extra = self.parse_known_args(args, namespace)
        if extra:
            command = getattr(found, "command", None)
            (getattr(self, "subcommands", {}).get(command) or self).error(f"unrecognized arguments: {' '.join(extra)}")
        return found

    def error(self, message):
        """One line and exit 2, as argparse does, without the usage block (and the MPI job's end, if
        other ranks may wait for this one: :func:`~fastckpt.cli.guard.leave_job`)."""
        line = f"{self.prog}: error: {message}"
        leave_job(line, 2)
        self.exit(2, line + "\n")


class Help(argparse.HelpFormatter):
    """Every option's help ends with its default, unless it says it already or has none to say."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default in (None, argparse.SUPPRESS) or not action.option_strings:
            return text
        if action.default is False:
            return f"{text} (default: off)"
        shown = ",".join(map(str, action.default)) if isinstance(action.default, list) else "%(default)s"
        return f"{text} (default: {shown})"


def tensor_shards(args, ranks):
    """``T`` of ``--tensor-parallel [T]``: as given, or the ranks that ``--data-parallel`` and ``--pipeline``
    leave (1 without the flag)."""
    if not args.tensor_parallel:
        return 1
    if args.tensor_parallel is not True:
        return args.tensor_parallel
    others = (args.data_parallel or 1) * (args.pipeline or 1)
    if args.pipeline and ranks % others:
        shown = " x ".join([f"--data-parallel {args.data_parallel}"] * ((args.data_parallel or 1) > 1)
                           + [f"--pipeline {args.pipeline}"] * bool(args.pipeline))
        raise ValueError(f"{shown} with --tensor-parallel needs a multiple of {others} ranks ({others} x T, T the "
                         f"ranks each stage is split over), got {ranks}")
    return max(1, ranks // others)


def check_grid(args, run, ranks):
    """Refuse a grid of replicas that the job's ``ranks`` or the batch cannot make."""
    replicas = args.data_parallel or 1
    shards = tensor_shards(args, ranks)
    if args.pipeline and args.pipeline * replicas * shards != ranks:
        shown = " x ".join([f"--data-parallel {replicas}"] * (replicas > 1) + [f"--pipeline {args.pipeline}"]
                           + [f"--tensor-parallel {shards}"] * (shards > 1))
        need = args.pipeline * replicas * shards
        raise ValueError(f"{shown} needs {need} ranks (mpiexec -n {need}), got {ranks}")
    if args.tensor_parallel is not True and args.tensor_parallel and not args.pipeline and replicas * shards != ranks:
        shown = f"--data-parallel {replicas} x " * (replicas > 1) + f"--tensor-parallel {shards}"
        raise ValueError(f"{shown} needs {replicas * shards} ranks (mpiexec -n {replicas * shards}), got {ranks}")
    micro = run.pipeline["micro_batches"] if args.pipeline else 1
    if (args.pipeline or args.tensor_parallel) and run.batch_size < replicas * micro:
        each = f"--micro-batches {micro} on each of --data-parallel {replicas} replicas" if args.pipeline and \
            replicas > 1 else f"--micro-batches {micro}" if args.pipeline else f"--data-parallel {replicas}"
        raise ValueError(f"--batch-size {run.batch_size} is too small for {each}: every micro-batch of every "
                         f"replica needs at least one row (--batch-size {replicas * micro} or more)")
    if args.tensor_parallel and ranks % replicas:
        raise ValueError(f"--data-parallel {replicas} with --tensor-parallel needs a multiple of {replicas} ranks "
                         f"({replicas} replicas of the net split over the same number of ranks each), "
                         f"got {ranks}")


def check_lone_flags(args):
    """Refuse a flag of ``train`` that would change nothing without another: ``--force`` without
    ``--save``, ``--bucket-bytes`` without ``--mpi``."""
    if args.force and args.save is None:
        raise ValueError("--force lets --save overwrite a file; without --save it would change nothing")
    if args.bucket_bytes is not None and not args.mpi:
        raise ValueError(f"--bucket-bytes {format_bytes(args.bucket_bytes)} is an option of --mpi (the gradient's "
                         "sum over the ranks); without --mpi it would change nothing")


def early_stopping_flags(p):
    """``train``'s ``--early-stopping N``, ``--tol`` and ``--save-best FILE`` (:mod:`fastckpt.cli.best`)."""
    best = "the --validation score (else the training loss)"
    p.add_argument("--early-stopping", type=positive, default=None, metavar="N", help=f"stop once {best} has not "
                   "improved by --tol for more than N epochs in a row, back at the best epoch's weights (default: off)")
    p.add_argument("--tol", type=rate, default=None, help="the least improvement that counts (default: 1e-4)")
    p.add_argument("--save-best", default=None, metavar="FILE",
                   help=f"write the net to FILE (.npz) after each epoch whose {best} is the best yet (default: off)")


def sizes(text):
    try:
        values = [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sizes must be comma-separated integers, got {text!r}") from None
    if len(values) < 2 or min(values) < 1:
        raise argparse.ArgumentTypeError(f"--sizes needs at least two widths >= 1, got {text!r}")
    if max(values) > MAX_WIDTH:
        raise argparse.ArgumentTypeError(f"a layer of {max(values)} units is more than any machine holds "
                                         f"the weights of (at most {MAX_WIDTH})")
    return values


MAX_WIDTH = 2**31 - 1          # units in one layer: more than any machine holds the weights of


def seed(text):
    """A numpy.random seed: an integer 0 .. 2**32 - 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"must be an integer from 0 to 2**32 - 1 (numpy.random's seeds), got {value}")
    return value


def positive(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def blas_threads(text):
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return positive(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be auto or a whole number >= 1, got {text!r}") from None


def rate(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be finite and >= 0, got {text!r}")
    return value


def strategy(text):
    try:
        return parse_strategy(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def strategies(text):
    try:
        return parse_strategies(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def depths(text):
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"must be integers >= 1, got {text!r}")
    return values


def measured_depths(text):
    """``analyze --measure``: depths as :func:`depths` reads them, or ``""`` for none (no memray run)."""
    return [] if not text.strip() else depths(text)


def nbytes(text):
    try:
        return parse_bytes(text, "BYTES")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("BYTES: ")) from None


def fraction(text):
    """A number strictly between 0 and 1 (a validation split)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be a fraction between 0 and 1 (exclusive), got {text!r}")
    return value


def shuffle_seed(text):
    """``--shuffle``'s optional seed: an integer from 0 to 2**32 - 1."""
    return seed(text)


def lr_schedule(text):
    """``--lr-schedule``: constant, step(N[, gamma]) or cosine[(T[, eta_min])], checked and kept as its spelling."""
    try:
        return str(parse_lr_schedule(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
