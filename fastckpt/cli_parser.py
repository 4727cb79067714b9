"""The ``fastckpt`` command line: its options, their types, help and defaults; :mod:`fastckpt.cli` runs it."""
import argparse
import math

from .distributed import leave_job
from .strategies import Fit, format_bytes, parse_bytes, parse_strategies, parse_strategy


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        """One line and exit 2, as argparse does, without the usage block (and the MPI job's end, if
        other ranks may wait for this one: :func:`~fastckpt.distributed.leave_job`)."""
        line = f"{self.prog}: error: {message}"
        leave_job(line, 2)
        self.exit(2, line + "\n")


def _sizes(text):
    try:
        sizes = [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sizes must be comma-separated integers, got {text!r}") from None
    if len(sizes) < 2 or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"--sizes needs at least two widths >= 1, got {text!r}")
    return sizes


def _positive(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _rate(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be finite and >= 0, got {text!r}")
    return value


def _strategy(text):
    try:
        return parse_strategy(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _strategies(text):
    try:
        return parse_strategies(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _depths(text):
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"must be integers >= 1, got {text!r}")
    return values


# -- the command line -------------------------------------------------------------------------
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


STRATEGIES = ("plain, every_nth(n), segments(k), sqrt, revolve(slots), budget(bytes[, once]) (a bound on "
              "activation memory) or fit(bytes) (a bound on the whole step)")
MAX_MEMORY = ("plan the least recomputation whose predicted training step fits BYTES (e.g. 64MiB): parameters, "
              "gradients, activations and buffers, which memray measures to within a few tens of KiB; the same "
              "as --strategy fit(BYTES). "
              "The process's RSS adds the interpreter, libraries and data (default: off, --strategy decides)")

def parser():
    from . import __version__
    parser = _Parser(prog="fastckpt", description="Fast MLP training with gradient checkpointing.",
                     formatter_class=Help)
    parser.add_argument("--version", action="version", version=f"fastckpt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    parser.commands = []                                        # (name, one line), for a bare ``fastckpt``

    def command(name, summary, description=None):
        parser.commands.append((name, summary))
        return sub.add_parser(name, help=summary, description=description or summary, formatter_class=Help)

    def common(p, sizes=True, unset=False):
        """--sizes, --batch-size, --dtype; with ``unset`` their defaults are filled in later (train)."""
        if sizes:
            p.add_argument("--sizes", type=_sizes, default=None if unset else [784, 40, 30, 10],
                           help="layer widths, input first, comma-separated"
                                + (" (default: 784,40,30,10, or the --resume file's)" if unset else ""))
        p.add_argument("--batch-size", type=_positive, default=None if unset else 10,
                       help="samples per mini-batch" + (" (default: 10, or the --resume file's)" if unset else ""))
        p.add_argument("--dtype", choices=["float64", "float32"], default=None if unset else "float64",
                       help="precision of parameters and activations"
                            + (" (default: float64, or the --resume file's)" if unset else ""))

    def strategy(p, default):
        p.add_argument("--strategy", type=_strategy, default=None,
                       help=f"checkpoint strategy: {STRATEGIES} (default: {default})")
        p.add_argument("--max-memory", type=_bytes, default=None, metavar="BYTES", help=MAX_MEMORY)

    def data(p):
        p.add_argument("--data", default=None,
                       help="the lab's mnist.npz or an IDX folder (default: the embedded MNIST digits)")

    def as_json(p):
        p.add_argument("--json", action="store_true", help="print the results as JSON for scripts")

    p = command("compare", "train on MNIST plainly and with checkpointing, and compare",
                "Train the same net from the same seed plainly and with checkpoint strategies; print accuracy, "
                "ms per update, memray peak, planned peak and recompute factor.")
    common(p)
    p.add_argument("--strategies", type=_strategies, default=None,
                   help=f"comma-separated strategies to compare with plain, each one of: {STRATEGIES} "
                        "(default: every_nth(2),sqrt)")
    p.add_argument("--every", type=_positive, default=None, metavar="N",
                   help="shorthand for --strategies every_nth(N),sqrt (default: off)")
    p.add_argument("--epochs", type=_positive, default=10, help="passes over the training data")
    p.add_argument("--eta", type=_rate, default=3.0, help="SGD learning rate")
    p.add_argument("--seed", type=int, default=0, help="numpy.random seed of the initial weights")
    data(p)
    p.add_argument("--out", default=None, metavar="DIR",
                   help="also write summary.md and the plots (PNG) in DIR (default: print only)")
    as_json(p)

    p = command("plan", "print the plan of one training step: kept, recomputed, bytes")
    common(p)
    strategy(p, "every_nth(2)")
    p.add_argument("--sgd-in-backward", action="store_true",
                   help="plan for the optimizer in backward (no gradient buffers)")
    as_json(p)

    p = command("analyze", "memory against depth, planned and measured, and the budget trade-off")
    common(p, sizes=False)
    p.add_argument("--depths", type=_depths, default=[1, 2, 4, 8, 16, 32, 64], help="hidden layers to plan")
    p.add_argument("--measure", type=_depths, default=[1, 4, 16], help="depths also measured with memray")
    p.add_argument("--width", type=_positive, default=256, help="units per hidden layer")
    p.add_argument("--n-in", type=_positive, default=784, help="input units")
    p.add_argument("--n-out", type=_positive, default=10, help="output units")
    p.add_argument("--strategies", type=_strategies, default="plain,every_nth(2),sqrt,revolve(4)",
                   help="comma-separated strategies to plan")
    p.add_argument("--sgd-in-backward", action="store_true",
                   help="plan for the optimizer in backward (no gradient buffers)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="also write memory_vs_depth.png and budget_tradeoff.png in DIR (default: print only)")
    as_json(p)
    p.set_defaults(batch_size=100)

    p = command("train", "train one net: on one process, on threads, or on MPI ranks (mpiexec); save and resume")
    common(p, unset=True)
    strategy(p, "plain, or the --resume file's")
    p.add_argument("--epochs", type=_positive, default=10,
                   help="epochs in all; with --resume, counting those the file has done")
    p.add_argument("--eta", type=_rate, default=None, help="SGD learning rate (default: 3.0, or the --resume file's)")
    p.add_argument("--seed", type=int, default=None,
                   help="numpy.random seed of the initial weights (default: 0, or the --resume file's)")
    p.add_argument("--data", default=None,
                   help="the lab's mnist.npz or an IDX folder (default: the embedded MNIST digits, or the --resume "
                        "file's)")
    p.add_argument("--threads", type=_positive, default=1, help="worker threads (fastckpt.parallel)")
    p.add_argument("--parallel-batches", type=_positive, default=None,
                   help="mini-batches per update (default: one per thread or rank, or the --resume file's)")
    p.add_argument("--mpi", action="store_true", help="one mini-batch per MPI rank per update (run under mpiexec)")
    p.add_argument("--pipeline", type=_positive, default=None, metavar="P",
                   help="pipeline parallelism over P MPI ranks, a contiguous range of layers each "
                        "(run under mpiexec -n P; --strategy checkpoints inside every stage; default: off)")
    p.add_argument("--micro-batches", type=_positive, default=4, metavar="M",
                   help="micro-batches per mini-batch with --pipeline")
    p.add_argument("--schedule", choices=["gpipe", "1f1b"], default="gpipe",
                   help="with --pipeline: gpipe (all forwards, then all backwards) or 1f1b (at most P "
                        "micro-batches in flight per stage)")
    p.add_argument("--partition", type=_depths, default=None,
                   help="with --pipeline: layers per stage, e.g. 2,1 (default: balanced predicted time)")
    p.add_argument("--transport", choices=["native", "float16", "bfloat16", "int8"], default="native",
                   help="with --pipeline: how activations and deltas travel between stages")
    p.add_argument("--tensor-parallel", action="store_true",
                   help="tensor (model) parallelism: every layer's units split across the MPI ranks")
    p.add_argument("--loss", choices=["quadratic", "cross_entropy"], default=None,
                   help="quadratic (sigmoid output, the lab's) or cross_entropy (softmax output) "
                        "(default: quadratic, or the --resume file's)")
    p.add_argument("--l2", type=_rate, default=None,
                   help="L2 weight penalty, 0.5 * l2 * ||W||^2 per layer (default: 0, or the --resume file's)")
    p.add_argument("--save", default=None, metavar="FILE",
                   help="write the net and its training state to FILE (.npz) after every epoch, atomically, so "
                        "that --resume FILE can go on; the folder must exist and the file must not, unless --force "
                        "or it is the --resume file (default: not saved)")
    p.add_argument("--force", action="store_true", help="let --save overwrite an existing file")
    p.add_argument("--resume", default=None, metavar="FILE",
                   help="go on training the net a --save FILE holds, from its last epoch, bit for bit as if never "
                        "stopped (one process or --threads; default: start afresh)")
    as_json(p)

    p = command("profile", "train under memray: where the peak goes as PNG/SVG (open offline), and "
                           "memray's flamegraph HTML (needs internet)")
    common(p)
    strategy(p, "every_nth(2)")
    p.add_argument("--steps", type=_positive, default=20, help="training steps recorded")
    p.add_argument("--eta", type=_rate, default=3.0, help="SGD learning rate")
    data(p)
    p.add_argument("--native", action="store_true", help="record native (C) stacks too")
    p.add_argument("--out", default="fastckpt-profile", metavar="DIR", help="folder for the report")
    return parser


def _bytes(text):
    try:
        return parse_bytes(text, "BYTES")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("BYTES: ")) from None


def settle_strategy(args):
    """``--max-memory B`` as ``--strategy fit(B)``; the command's default strategy when neither is given."""
    if not hasattr(args, "max_memory"):
        return
    if args.max_memory is not None:
        if args.strategy is not None:
            raise ValueError(f"give --strategy or --max-memory, not both; got --strategy {args.strategy} and "
                             f"--max-memory {format_bytes(args.max_memory)}")
        args.strategy = Fit(args.max_memory)
    elif args.strategy is None and args.command != "train":           # train's waits for a --resume file
        args.strategy = parse_strategy("every_nth(2)")


def commands_list(parser):
    """The subcommands with their one-line help, for a bare ``fastckpt``."""
    lines = ["usage: fastckpt COMMAND [options]   (fastckpt COMMAND --help for its options)", "", "commands:"]
    lines += [f"  {name:<9} {summary}" for name, summary in parser.commands]
    lines += ["", "fastckpt --version prints the version."]
    return "\n".join(lines)
