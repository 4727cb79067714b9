"""The ``fastckpt`` command.

``compare`` trains with and without checkpointing and reports; ``analyze`` and
``plan`` answer memory questions from the planner; ``profile`` writes a memray
flamegraph of training; ``train`` trains one net.

Every failure is one line on stderr, ``fastckpt <command>: error: <reason>``,
never a traceback (``FASTCKPT_DEBUG=1`` shows it).  Exit codes:

* 0: done;
* 1: training failed on valid input (divergence, out of memory), or a bug,
  which the line says, asking for a report;
* 2: bad input: arguments, data, files (checked before any training);
* 128 + signal: ``compare`` stopped by SIGINT (130), SIGTERM (143) or SIGHUP
  (129) after ending its child and writing the finished runs;
* 141 (128 + SIGPIPE): stdout was closed early (``fastckpt plan | head``),
  quietly, as ``cat`` or ``yes`` would end.

docs/misuse.md has the table of cases.
"""
import argparse
import math
import os
import signal
import sys

from . import commands
from ._files import check_paths
from .distributed import leave_job
from .report import RunFailed, builtin_kinds
from .strategies import parse_strategy


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
    """Comma-separated strategies; commas inside parentheses belong to the strategy."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [_strategy(p) for p in parts if p.strip()]


def _depths(text):
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"must be integers >= 1, got {text!r}")
    return values


# -- the command line -------------------------------------------------------------------------
def _parser():
    parser = _Parser(prog="fastckpt", description="Fast MLP training with gradient checkpointing.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    strategies_help = "plain, every_nth(n), segments(k), sqrt, revolve(slots), budget(bytes[, once])"

    def common(p, sizes=True):
        if sizes:
            p.add_argument("--sizes", type=_sizes, default=[784, 40, 30, 10],
                           help="layer widths (default 784,40,30,10)")
        p.add_argument("--batch-size", type=_positive, default=10)
        p.add_argument("--dtype", choices=["float64", "float32"], default="float64")

    p = sub.add_parser("compare", help="train on MNIST plainly and with checkpointing, and compare",
                       description="Train the same net from the same seed plainly and with checkpoint strategies; "
                                   "print accuracy, ms per update, memray peak, planned peak and recompute factor.")
    common(p)
    p.add_argument("--strategies", type=_strategies, default=None,
                   help=f"comma-separated, each one of: {strategies_help} (default: every_nth(2),sqrt)")
    p.add_argument("--every", type=_positive, default=None, help="shorthand for --strategies every_nth(N),sqrt")
    p.add_argument("--epochs", type=_positive, default=10)
    p.add_argument("--eta", type=_rate, default=3.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default=None, help="the lab's mnist.npz or an IDX folder (default: embedded MNIST)")
    p.add_argument("--out", default=None, help="write summary.md and the plots (PNG) here")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of the table")

    p = sub.add_parser("plan", help="print the plan of one training step: kept, recomputed, bytes")
    common(p)
    p.add_argument("--strategy", type=_strategy, default="every_nth(2)", help=strategies_help)
    p.add_argument("--sgd-in-backward", action="store_true", help="plan for the optimizer in backward")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("analyze", help="memory against depth (the lab's task 1) and the budget trade-off")
    common(p, sizes=False)
    p.add_argument("--depths", type=_depths, default=[1, 2, 4, 8, 16, 32, 64], help="hidden layers to plan")
    p.add_argument("--measure", type=_depths, default=[1, 4, 16], help="depths also measured with memray")
    p.add_argument("--width", type=_positive, default=256)
    p.add_argument("--n-in", type=_positive, default=784)
    p.add_argument("--n-out", type=_positive, default=10)
    p.add_argument("--strategies", type=_strategies, default="plain,every_nth(2),sqrt,revolve(4)")
    p.add_argument("--sgd-in-backward", action="store_true")
    p.add_argument("--out", default=None, help="write memory_vs_depth.png and budget_tradeoff.png here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(batch_size=100)

    p = sub.add_parser("train", help="train one net: on one process, on threads, or on MPI ranks (mpiexec)")
    common(p)
    p.add_argument("--strategy", type=_strategy, default="plain", help=strategies_help)
    p.add_argument("--epochs", type=_positive, default=10)
    p.add_argument("--eta", type=_rate, default=3.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default=None)
    p.add_argument("--threads", type=_positive, default=1, help="worker threads (fastckpt.parallel)")
    p.add_argument("--parallel-batches", type=_positive, default=None,
                   help="mini-batches per update (default: one per thread or rank)")
    p.add_argument("--mpi", action="store_true", help="one mini-batch per MPI rank per update (run under mpiexec)")
    p.add_argument("--pipeline", type=_positive, default=None, metavar="P",
                   help="pipeline parallelism over P MPI ranks, a contiguous range of layers each "
                        "(run under mpiexec -n P; --strategy checkpoints inside every stage)")
    p.add_argument("--micro-batches", type=_positive, default=4, metavar="M",
                   help="micro-batches per mini-batch with --pipeline (default 4)")
    p.add_argument("--schedule", choices=["gpipe", "1f1b"], default="gpipe",
                   help="with --pipeline: gpipe (all forwards, then all backwards) or 1f1b (at most P "
                        "micro-batches in flight per stage); default gpipe")
    p.add_argument("--partition", type=_depths, default=None,
                   help="with --pipeline: layers per stage, e.g. 2,1 (default: balanced predicted time)")
    p.add_argument("--transport", choices=["native", "float16", "bfloat16", "int8"], default="native",
                   help="with --pipeline: how activations and deltas travel between stages (default native)")
    p.add_argument("--tensor-parallel", action="store_true",
                   help="tensor (model) parallelism: every layer's units split across the MPI ranks")
    p.add_argument("--loss", choices=["quadratic", "cross_entropy"], default="quadratic",
                   help="quadratic (sigmoid output, the lab's) or cross_entropy (softmax output)")
    p.add_argument("--l2", type=_rate, default=0.0, help="L2 weight penalty (0.5 * l2 * ||W||^2 per layer)")
    p.add_argument("--save", default=None,
                   help="rank 0 writes the trained weights and biases here (.npz), atomically; "
                        "the folder must exist and the file must not, unless --force")
    p.add_argument("--force", action="store_true", help="let --save overwrite an existing file")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("profile", help="train under memray and write its flamegraph HTML report")
    common(p)
    p.add_argument("--strategy", type=_strategy, default="every_nth(2)", help=strategies_help)
    p.add_argument("--steps", type=_positive, default=20)
    p.add_argument("--eta", type=_rate, default=3.0)
    p.add_argument("--data", default=None)
    p.add_argument("--native", action="store_true", help="record native (C) stacks too")
    p.add_argument("--out", default="fastckpt-profile", help="directory for the report (default fastckpt-profile)")
    return parser


def main(argv=None):
    command = "fastckpt"
    try:
        args = _parser().parse_args(argv)
        command = f"fastckpt {args.command}"
        run = {"compare": commands.compare, "plan": commands.show_plan, "analyze": commands.analyze,
               "profile": commands.profile, "train": commands.train}
        check_paths(args)                                          # before any training
        code = run[args.command](args)
        sys.stdout.flush()                                         # a closed pipe shows here, not at exit
        return code
    except BrokenPipeError:
        # the reader left (``| head``): send what is still buffered nowhere, and end as SIGPIPE would
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except KeyboardInterrupt:
        if os.environ.get("FASTCKPT_DEBUG"):
            raise
        if not leave_job(f"{command}: interrupted (SIGINT)", 130):
            _say(f"{command}: interrupted (SIGINT)")
        return 130
    except Exception as exc:
        if os.environ.get("FASTCKPT_DEBUG"):
            raise
        code, reason = _failure(exc)
        if not leave_job(f"{command}: error: {reason}", code):    # other MPI ranks may wait for this one
            _say(f"{command}: error: {reason}")
        return code


BUG = "(a bug: please report it; run with FASTCKPT_DEBUG=1 for the traceback)"


def _failure(exc):
    """(exit code, one-line reason) for an exception, or for a compare child's, by the builtin classes it is."""
    child = isinstance(exc, RunFailed)
    kinds = exc.kinds if child else builtin_kinds(exc)
    prefix = f"the {exc.run} run: " if child else ""
    reason = " ".join(str(exc.reason if child else exc).split()) or type(exc).__name__   # one line
    if "MemoryError" in kinds:
        return 1, f"{prefix}out of memory: {reason}; try a smaller --batch-size or --sizes"
    if "FloatingPointError" in kinds:
        return 1, f"{prefix}{reason}; try a smaller --eta"
    if kinds & {"ValueError", "TypeError", "OSError", "RuntimeError"}:
        return 2, prefix + reason
    if child:                               # a bug, its reason naming its type; or a death without a word
        return 1, f"{prefix}{reason} {BUG}" if kinds else prefix + reason
    return 1, f"{type(exc).__name__}: {reason} {BUG}"


def _say(line):
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:                                                 # stderr is gone too: nothing to tell
        pass


if __name__ == "__main__":
    sys.exit(main())
