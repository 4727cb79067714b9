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
    file's (``saved``), else their defaults (one micro-batch without ``--pipeline`` or with
    ``--optimizer-in-backward``)."""
    several = args.pipeline and not getattr(args, "sgd_in_backward", False)     # one: each layer steps in backward
    defaults = dict(PIPELINE_DEFAULTS, micro_batches=PIPELINE_DEFAULTS["micro_batches"] if several else 1)
    return {key: getattr(args, key) if getattr(args, key) is not None else (saved or {}).get(key, default)
            for key, default in defaults.items()}

STRATEGIES = ("plain, every_nth(n), segments(k), sqrt, revolve(slots), budget(bytes[, once]) (a bound on "
              "activation memory) or fit(bytes) (a bound on the whole step)")
TRAIN_MAX_MEMORY = ("on one process, bound the whole run's memory to BYTES (e.g. 256MiB), as memray measures it "
                    "above the process after its imports: the data, the training step, the staging rows, the "
                    "evaluations (the test set's and --validation's) or a save, a --shuffle order, and the result "
                    "lists; the step gets what the rest leaves and plans the least recomputation that fits it "
                    "(fastckpt plan --data shows the parts). Refused with --threads "
                    "or --parallel-batches (--strategy fit(BYTES) bounds each step there); on MPI ranks it bounds "
                    "what each rank holds to train (default: off, --strategy decides)")
PROFILE_MAX_MEMORY = ("profile the step train --max-memory BYTES plans on one process without --save: the fit of "
                      "what the data, the staging rows, an evaluation and the result lists of --epochs leave of "
                      "BYTES (default: off, --strategy decides)")
MAX_MEMORY = ("plan the least recomputation whose predicted training step fits BYTES (e.g. 64MiB): parameters, "
              "gradients, activations and buffers, which memray measures to within some 2 KiB a layer; the same "
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


def on_ranks(args):
    """Whether ``train`` runs over MPI ranks: any of ``--mpi``, ``--data-parallel``, ``--pipeline`` and
    ``--tensor-parallel``."""
    return bool(args.mpi or args.data_parallel or args.pipeline or args.tensor_parallel)


def grid_axes(args, ranks):
    """``(D, P, T)`` of ``train``'s MPI flags on a job of ``ranks`` ranks: the given ones, ``--tensor-parallel``
    without T the ranks the others leave, ``--data-parallel`` not given the ranks ``--pipeline`` and
    ``--tensor-parallel`` leave; a ValueError when their product is not the job's ranks."""
    if args.mpi and (args.data_parallel or args.pipeline or args.tensor_parallel):
        raise ValueError("--mpi is --data-parallel over every rank of the job; it does not combine with "
                         "--data-parallel, --pipeline or --tensor-parallel")
    pipeline = args.pipeline or 1
    if args.tensor_parallel is True:
        data = args.data_parallel or 1
        tensor = max(1, ranks // (data * pipeline))
        if ranks % (data * pipeline):
            shown = " x ".join(f"--{flag} {n}" for flag, n, given in (
                ("data-parallel", data, args.data_parallel), ("pipeline", pipeline, args.pipeline)) if given)
            raise ValueError(f"{shown} with --tensor-parallel needs a multiple of {data * pipeline} ranks "
                             f"({data * pipeline} x T, T the ranks each stage is split over), got {ranks}")
    else:
        tensor = args.tensor_parallel or 1
        data = args.data_parallel or max(1, ranks // (pipeline * tensor))
    if data * pipeline * tensor != ranks:
        shown = " x ".join(f"--{flag} {n}" for flag, n, given in (
            ("data-parallel", data, args.data_parallel or args.mpi), ("pipeline", pipeline, args.pipeline),
            ("tensor-parallel", tensor, args.tensor_parallel)) if given)
        need = data * pipeline * tensor
        raise ValueError(f"{shown} needs {need} ranks (mpiexec -n {need}), got {ranks}")
    return data, pipeline, tensor


def check_grid_options(args, run, axes):
    """Refuse a flag of the MPI grid that would change nothing with ``axes`` = ``(D, P, T)``, or a batch too small
    for its micro-batches."""
    data, pipeline, tensor = axes
    if pipeline == 1:
        given = [flag for flag in ("schedule", "partition", "transport") if getattr(args, flag) is not None]
        if given:
            value = getattr(args, given[0])
            shown = ",".join(map(str, value)) if isinstance(value, list) else value
            raise ValueError(f"--{given[0]} {shown} is an option of --pipeline P; without it it would change nothing")
    if args.bucket_bytes is not None and (data == 1 or pipeline > 1 or tensor > 1):
        raise ValueError(f"--bucket-bytes {format_bytes(args.bucket_bytes)} sums a whole net's gradient over its "
                         "data-parallel replicas, of which there are none here "
                         f"{'to sum' if data == 1 else 'with the net split'}; it would change nothing")
    micro = run.pipeline["micro_batches"]
    if run.batch_size < micro:
        raise ValueError(f"--batch-size {run.batch_size} is too small for --micro-batches {micro}: every "
                         f"micro-batch needs at least one row (--batch-size {micro} or more)")


def check_lone_flags(args):
    """Refuse a flag of ``train`` that would change nothing without another: ``--force`` without
    ``--save``, ``--bucket-bytes`` or ``--micro-batches`` on one process."""
    if args.force and args.save is None:
        raise ValueError("--force lets --save overwrite a file; without --save it would change nothing")
    if not on_ranks(args):
        for flag, value in (("--bucket-bytes", args.bucket_bytes), ("--micro-batches", args.micro_batches),
                            ("--schedule", args.schedule), ("--partition", args.partition),
                            ("--transport", args.transport)):
            if value is not None:
                shown = format_bytes(value) if flag == "--bucket-bytes" else \
                    ",".join(map(str, value)) if isinstance(value, list) else value
                raise ValueError(f"{flag} {shown} is an option of training over MPI ranks (--data-parallel, "
                                 "--pipeline, --tensor-parallel); on one process it would change nothing")


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
    if value == 0 and any(c in "123456789" for c in text.lower().split("e")[0]):
        raise argparse.ArgumentTypeError(f"is too small for a float64 (it would be 0), got {text!r}")
    return value


def strategy(text):
    try:
        return parse_strategy(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def strategies(text):
    try:
        found = parse_strategies(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not found:                                    # "" used to mean the default list, silently
        raise argparse.ArgumentTypeError(f"names no strategy, got {text!r}; give one or more, comma-separated")
    return found


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


def lr_schedule(text):
    """``--lr-schedule``: constant, step(N[, gamma]) or cosine[(T[, eta_min])], checked and kept as its spelling."""
    try:
        return str(parse_lr_schedule(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
