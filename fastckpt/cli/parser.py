"""The ``fastckpt`` command line: one function per command adds its options; :mod:`fastckpt.cli.main` runs it."""
import argparse

from fastckpt._version import __version__
from fastckpt.planner.strategies import Fit, format_bytes, parse_strategy

from . import options as o
from .options import (
    MAX_MEMORY,
    PIPELINE_DEFAULTS,
    PROFILE_MAX_MEMORY,
    STRATEGIES,
    TRAIN_DEFAULTS,
    TRAIN_MAX_MEMORY,
    Help,
    Parser,
)

DATA_KINDS = ("the lab's mnist.npz, an IDX folder, or embedded: the MNIST digits shipped with fastckpt (a folder "
              "named embedded is ./embedded)")
DATA_HELP = DATA_KINDS + " (default: embedded"


def parser():
    """The whole command line; ``parser().commands`` lists (name, one line) for a bare ``fastckpt``."""
    top = Parser(prog="fastckpt", description="Fast MLP training with gradient checkpointing.", formatter_class=Help)
    top.add_argument("--version", action="version", version=f"fastckpt {__version__}")
    sub = top.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    top.commands = []
    top.subcommands = sub.choices                      # whose own error names an unknown flag's command
    for name, summary, add, description in COMMANDS:
        top.commands.append((name, summary))
        add(sub.add_parser(name, help=summary, description=description or summary, formatter_class=Help))
    return top


def settled(args):
    """A copy of the parsed ``args`` with ``--max-memory B`` read as ``--strategy fit(B)`` and the
    command's default strategy filled in (``train``'s waits for its --resume file, ``profile``'s for its FILE)."""
    if not hasattr(args, "max_memory") or not hasattr(args, "strategy"):      # analyze: a bound per depth
        return args
    strategy = args.strategy
    if args.max_memory is not None:
        if args.strategy is not None:
            raise ValueError(f"give --strategy or --max-memory, not both; got --strategy {args.strategy} and "
                             f"--max-memory {format_bytes(args.max_memory)}")
        strategy = Fit(args.max_memory, named=f"--max-memory {format_bytes(args.max_memory)}")
    elif args.strategy is None and args.command not in ("train", "profile"):
        strategy = parse_strategy(TRAIN_DEFAULTS["strategy"])           # one default for every command
    return argparse.Namespace(**dict(vars(args), strategy=strategy))


def commands_list(top):
    """The subcommands with their one-line help, for a bare ``fastckpt``."""
    lines = ["usage: fastckpt COMMAND [options]   (fastckpt COMMAND --help for its options)", "", "commands:"]
    lines += [f"  {name:<9} {summary}" for name, summary in top.commands]
    lines += ["", "fastckpt --version prints the version."]
    return "\n".join(lines)


# -- option groups --------------------------------------------------------------------------------
def _common(p, sizes=True):
    if sizes:
        p.add_argument("--sizes", type=o.sizes, default=list(TRAIN_DEFAULTS["sizes"]),
                       help="layer widths, input first, comma-separated")
    p.add_argument("--batch-size", type=o.positive, default=TRAIN_DEFAULTS["batch_size"],
                   help="samples per mini-batch")
    p.add_argument("--dtype", choices=["float64", "float32"], default=TRAIN_DEFAULTS["dtype"],
                   help="precision of parameters and activations")
    _blas_threads(p)


def _blas_threads(p):
    p.add_argument("--blas-threads", type=o.blas_threads, default=None, metavar="N|auto",
                   help="threads BLAS may use: a number runs exactly that many; auto takes as many as the cores "
                        "other programs leave free, up to the library's count (default: FASTCKPT_BLAS_THREADS, "
                        "else auto)")


def _strategy(p, default, max_memory=MAX_MEMORY):
    p.add_argument("--strategy", type=o.strategy, default=None,
                   help=f"checkpoint strategy: {STRATEGIES} (default: {default})")
    p.add_argument("--max-memory", type=o.nbytes, default=None, metavar="BYTES", help=max_memory)


def _json(p):
    p.add_argument("--json", action="store_true", help="print the results as JSON for scripts")


def _sgd_in_backward(p, verb="plan for", default=False, theirs=None):
    p.add_argument("--optimizer-in-backward", "--sgd-in-backward", dest="sgd_in_backward", action="store_true",
                   default=default,
                   help=f"{verb} the optimizer in backward: each layer's step as soon as its gradient is final, so "
                        "no gradient buffers with SGD and one layer's with another optimizer; --sgd-in-backward, its "
                        "older name, is the same flag (default: off" + (f", or {theirs})" if theirs else ")"))


def _optimizer(p, default="sgd", theirs=None):
    p.add_argument("--optimizer", choices=["sgd", "momentum", "adam", "adamw"], default=default,
                   help="the update, with PyTorch's defaults; --eta is its learning rate (adam wants ~0.001); its "
                        "state (velocity, or Adam's two moments) is planned with the parameters (default: sgd, the "
                        "lab's" + (f", or {theirs})" if theirs else ")"))


# -- the commands -------------------------------------------------------------------------------
def _compare(p):
    _common(p)
    p.add_argument("--strategies", type=o.strategies, default=None,
                   help=f"comma-separated strategies to compare with plain, each one of: {STRATEGIES} "
                        "(default: every_nth(2),sqrt)")
    p.add_argument("--every", type=o.positive, default=None, metavar="N",
                   help="shorthand for --strategies every_nth(N),sqrt (default: off)")
    p.add_argument("--epochs", type=o.positive, default=10, help="passes over the training data")
    p.add_argument("--eta", type=o.rate, default=3.0, help="SGD learning rate")
    p.add_argument("--seed", type=o.seed, default=0, help="numpy.random seed of the initial weights")
    p.add_argument("--data", default=None, help=DATA_HELP + ")")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="also write summary.md and the plots (PNG) in DIR (default: print only)")
    _sgd_in_backward(p, "train every run with")
    _json(p)


def _plan(p):
    _common(p)
    _strategy(p, TRAIN_DEFAULTS["strategy"])
    _sgd_in_backward(p)
    _optimizer(p)
    p.add_argument("--data", default=None,
                   help="also predict train's whole run on this data, part by part; --max-memory then bounds the "
                        "whole run as in train: " + DATA_KINDS + " (default: the step only)")
    p.add_argument("--epochs", type=o.positive, default=10, help="epochs of the whole run (with --data)")
    p.add_argument("--max-batch", action="store_true",
                   help="with --max-memory: the largest batch whose whole run fits it, for plain, every_nth(2) and "
                        "sqrt, with the gradients kept and with the optimizer in backward, and what each recomputes "
                        "(--data or the embedded digits; default: off)")
    _json(p)


def _analyze(p):
    _common(p, sizes=False)
    p.add_argument("--depths", type=o.depths, default=[1, 2, 4, 8, 16, 32, 64], help="hidden layers to plan")
    p.add_argument("--measure", type=o.measured_depths, default=[1, 4, 16],
                   help='depths also measured with memray; "" measures none')
    p.add_argument("--width", type=o.positive, default=256, help="units per hidden layer")
    p.add_argument("--n-in", type=o.positive, default=784, help="input units")
    p.add_argument("--n-out", type=o.positive, default=10, help="output units")
    p.add_argument("--strategies", type=o.strategies, default="plain,every_nth(2),sqrt,revolve(4)",
                   help="comma-separated strategies to plan")
    _sgd_in_backward(p)
    p.add_argument("--max-memory", type=o.nbytes, default=None, metavar="BYTES",
                   help="also the largest batch whose training step fits BYTES, per depth and strategy (default: "
                        "none)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="also write memory_vs_depth.png and budget_tradeoff.png in DIR (default: print only)")
    _json(p)
    p.set_defaults(batch_size=100)


def _net_flags(p, theirs, max_memory):
    """The flags that shape the net and its training step, shared by ``train`` and ``profile``: each defaults
    to ``theirs`` (the --resume file's, FILE's) first, then :data:`TRAIN_DEFAULTS`."""
    def unset(flag, kind, text, key, **kwargs):
        value = TRAIN_DEFAULTS[key]
        shown = ",".join(map(str, value)) if isinstance(value, list) else value
        p.add_argument(flag, type=kind, default=None, help=f"{text} (default: {shown}, or {theirs})", **kwargs)
    unset("--sizes", o.sizes, "layer widths, input first, comma-separated", "sizes")
    unset("--batch-size", o.positive, "samples per mini-batch", "batch_size")
    unset("--dtype", None, "precision of parameters and activations", "dtype", choices=["float64", "float32"])
    _strategy(p, f"plain, or {theirs}", max_memory)
    unset("--eta", o.rate, "the learning rate", "eta")
    unset("--seed", o.seed, "numpy.random seed of the initial weights", "seed")
    unset("--loss", None, "quadratic (sigmoid output, the lab's), cross_entropy (softmax output) or squared_error "
          "(identity output: regression, here on the one-hot rows of the data's classes)", "loss",
          choices=["quadratic", "cross_entropy", "squared_error"])
    unset("--l2", o.rate, "L2 weight penalty, 0.5 * l2 * ||W||^2 per layer", "l2")
    _sgd_in_backward(p, "train with", default=None, theirs=theirs)
    unset("--activation", None, "the hidden layers' activation", "activation",
          choices=["sigmoid", "tanh", "relu", "identity"])
    p.add_argument("--init", choices=["lab", "xavier", "glorot", "he", "kaiming"], default=None,
                   help="initial weights: the lab's N(0, 1), Glorot-uniform (xavier, Keras' Dense) or He-normal "
                        f"on fan_in (he, PyTorch's kaiming_normal_) (default: lab; {theirs} are its weights)")
    _optimizer(p, None, theirs=theirs)


def _train(p):
    _net_flags(p, "the --resume file's", TRAIN_MAX_MEMORY)
    p.add_argument("--epochs", type=o.positive, default=10,
                   help="epochs in all; with --resume, counting those the file has done")
    p.add_argument("--data", default=None, help=DATA_HELP + ", or the --resume file's)")
    _train_parallel(p)
    p.add_argument("--lr-schedule", type=o.lr_schedule, default=None, metavar="SCHEDULE",
                   help="--eta per epoch: constant, step(N[, gamma]) (times gamma, 0.1 by default, every N epochs) or "
                        "cosine[(T[, eta_min])] (down to eta_min over T epochs, by default all of --epochs), "
                        "PyTorch's StepLR and CosineAnnealingLR; may change on --resume (default: constant, or "
                        "the --resume file's)")
    p.add_argument("--shuffle", type=o.seed, nargs="?", const=0, default=None, metavar="SEED",
                   help="a new order of the mini-batches every epoch, drawn from SEED and the epoch (default: off, "
                        "the lab's order, or the --resume file's; SEED defaults to 0)")
    p.add_argument("--validation", type=o.fraction, default=None, metavar="FRACTION",
                   help="hold out this fraction of the training samples (the last ones, as Keras' "
                        "validation_split) and print its accuracy and the training loss every epoch (default: off, "
                        "or the --resume file's)")
    p.add_argument("--save", default=None, metavar="FILE",
                   help="write the net and its training state to FILE (.npz) after every epoch, atomically, so "
                        "that --resume FILE can go on; the folder must exist and the file must not, unless --force "
                        "or it is the --resume file (default: not saved)")
    p.add_argument("--force", action="store_true", help="let --save (and --save-best) overwrite an existing file")
    o.early_stopping_flags(p)
    p.add_argument("--resume", default=None, metavar="FILE",
                   help="go on training the net a --save FILE holds, from its last epoch, bit for bit as if never "
                        "stopped, in the file's mode (one process, --threads, or the same grid of MPI ranks; "
                        "default: start afresh)")
    _json(p)
    _blas_threads(p)


def _train_parallel(p):
    p.add_argument("--threads", type=o.positive, default=1, help="worker threads (fastckpt.parallel.DataParallel)")
    p.add_argument("--parallel-batches", type=o.positive, default=None,
                   help="mini-batches per update (default: one per thread or data-parallel replica, or the --resume "
                        "file's)")
    p.add_argument("--data-parallel", type=o.positive, default=None, metavar="D",
                   help="D replicas of the net over MPI ranks (run under mpiexec), each with a mini-batch of its own "
                        "per update, their gradients summed: an update averages D mini-batches of --batch-size, as "
                        "PyTorch's DistributedDataParallel does (default: all the ranks --pipeline and "
                        "--tensor-parallel leave)")
    p.add_argument("--mpi", action="store_true", help="--data-parallel over every rank of the job")
    p.add_argument("--pipeline", type=o.positive, default=None, metavar="P",
                   help="pipeline parallelism: the layers cut into P stages, a contiguous range each "
                        "(--strategy checkpoints inside every stage; default: 1)")
    p.add_argument("--tensor-parallel", type=o.positive, nargs="?", const=True, default=False, metavar="T",
                   help="tensor (model) parallelism: every layer's units split across T ranks (default T: the ranks "
                        "--data-parallel and --pipeline leave; default: 1)")
    p.add_argument("--bucket-bytes", type=o.nbytes, default=None, metavar="BYTES",
                   help="with --data-parallel alone: sum the gradient over the replicas in buckets of about BYTES "
                        "(e.g. 25MiB), each started while the backward pass goes on (default: one sum after it)")
    p.add_argument("--micro-batches", type=o.positive, default=None, metavar="M",
                   help="micro-batches per mini-batch on MPI ranks, each stage's passes run micro-batch by "
                        f"micro-batch (default: {PIPELINE_DEFAULTS['micro_batches']} with --pipeline, else 1; 1 with "
                        "--optimizer-in-backward)")
    p.add_argument("--schedule", choices=["gpipe", "1f1b", "zb1"], default=None,
                   help="with --pipeline: gpipe (all forwards, then all backwards), 1f1b (at most P "
                        "micro-batches in flight per stage) or zb1 (1f1b with each weight gradient put off into "
                        f"the bubble) (default: {PIPELINE_DEFAULTS['schedule']})")
    p.add_argument("--partition", type=o.depths, default=None,
                   help="with --pipeline: layers per stage, e.g. 2,1 (default: balanced predicted time)")
    p.add_argument("--transport", choices=["native", "float16", "bfloat16", "int8"], default=None,
                   help="with --pipeline: how activations and deltas travel between stages "
                        f"(default: {PIPELINE_DEFAULTS['transport']})")


def _profile(p):
    p.add_argument("file", metavar="FILE", nargs="?", default=None,
                   help="a net saved by train --save or net.save: profile training it as saved (its settings, "
                        "weights and optimizer state; the batch size, learning rate and data its training state "
                        "records); then give none of the flags that shape the net, and --batch-size, --eta and "
                        "--data only as its training state records them (default: a new net of those flags, as "
                        "train makes it)")
    _net_flags(p, "FILE's", PROFILE_MAX_MEMORY)
    p.add_argument("--epochs", type=o.positive, default=10,
                   help="with --max-memory: the epochs of the train run whose bound it is (its result lists)")
    p.add_argument("--data", default=None, help=DATA_HELP + ", or the data FILE was trained on)")
    p.add_argument("--steps", type=o.positive, default=20, help="training steps recorded")
    p.add_argument("--native", action="store_true", help="record native (C) stacks too")
    p.add_argument("--out", default="fastckpt-profile", metavar="DIR", help="folder for the report")
    _blas_threads(p)


def _use(p, what):
    p.add_argument("file", metavar="FILE", help="a net saved by train --save or net.save")
    p.add_argument("--data", default=None,
                   help=DATA_KINDS + (", or a .npy array of inputs, one sample per row" if what == "predict" else "")
                   + " (default: the data FILE was trained on, which train --save records; a file saved by net.save "
                     "records none and needs --data)")
    p.add_argument("--split", choices=["test", "train"], default="test", help="which part of --data (default: test)")


def _evaluate(p):
    _use(p, "evaluate")
    _json(p)


def _predict(p):
    _use(p, "predict")
    p.add_argument("--output", default=None, metavar="FILE",
                   help="write the class indices there (.npy: an int64 array; else one per line) "
                        "(default: stdout)")
    p.add_argument("--force", action="store_true", help="let --output overwrite an existing file")


COMMANDS = (  # name, one line, options, description
    ("compare", "train on MNIST plainly and with checkpointing, and compare", _compare,
     "Train the same net from the same seed plainly and with checkpoint strategies; print accuracy, ms per update, "
     "memray peak, planned peak and recompute factor."),
    ("plan", "print the plan of one training step: kept, recomputed, bytes", _plan, None),
    ("analyze", "memory against depth, planned and measured, and the budget trade-off", _analyze, None),
    ("train", "train one net: on one process, on threads, or on MPI ranks (mpiexec); save and resume", _train, None),
    ("evaluate", "the accuracy of a saved net on --data", _evaluate, None),
    ("predict", "the class index a saved net gives each sample of --data", _predict, None),
    ("profile", "train under memray: where the peak goes as PNG/SVG (open offline), and memray's flamegraph HTML "
                "(needs internet)", _profile, None),
)
