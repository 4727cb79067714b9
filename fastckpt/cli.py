"""The ``fastckpt`` command.

``compare`` trains with and without checkpointing and reports; ``analyze`` and
``plan`` answer memory questions from the planner; ``profile`` writes a memray
flamegraph of training.  Exit codes: 0 on success, 2 with a one-line reason on
bad arguments or data, 130 when interrupted (after writing what was done).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from . import memory, report
from .data import load_mnist
from .strategies import parse_strategy
from .strategies import plan as make_plan


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        """One line and exit 2, as argparse does, without the usage block."""
        self.exit(2, f"{self.prog}: error: {message}\n")


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


# -- compare ----------------------------------------------------------------------------------
def compare(args):
    (x_train, y_train), _ = load_mnist(args.data)
    if x_train.shape[1] != args.sizes[0] or y_train.shape[1] != args.sizes[-1]:
        raise ValueError(f"--sizes {','.join(map(str, args.sizes))} do not fit the data: it has "
                         f"{x_train.shape[1]} inputs and {y_train.shape[1]} classes")
    if args.batch_size > len(x_train):
        raise ValueError(f"--batch-size {args.batch_size} is more than the {len(x_train)} training samples")
    if args.strategies and args.every:
        raise ValueError("give --strategies or --every, not both")
    strategies = args.strategies or [parse_strategy(f"every_nth({args.every or 2})"), parse_strategy("sqrt")]
    for s in strategies:                                          # refuse before any training
        make_plan(args.sizes, args.batch_size, args.dtype, s)
    setup = {"sizes": args.sizes, "batch_size": args.batch_size, "eta": args.eta, "epochs": args.epochs,
             "dtype": args.dtype, "seed": args.seed, "data": args.data or "embedded MNIST (4000 train, 1000 test)"}
    done = []

    def keep(results):
        done[:] = results
        if args.out:
            report.write_report(args.out, results, setup)
    try:
        results = report.run_compare(args.sizes, strategies, args.data, epochs=args.epochs, batch_size=args.batch_size,
                                     eta=args.eta, dtype=args.dtype, seed=args.seed, quiet=args.json,
                                     on_result=keep)
    except KeyboardInterrupt:
        kept = f"; {len(done)} finished runs written to {args.out}" if args.out and done else ""
        print(f"fastckpt compare: interrupted{kept}", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(report.summary(results, setup), indent=2))
    else:
        print("\n" + report.table(results, setup))
        if args.out:
            print(f"\nreport written to {args.out}: summary.md, memory_per_update.png, "
                  "cumulative_update_time.png, memory_vs_depth.png")
    return 0


# -- plan and analyze -------------------------------------------------------------------------
def show_plan(args):
    p = make_plan(args.sizes, args.batch_size, args.dtype, args.strategy, optimizer_in_backward=args.sgd_in_backward)
    if args.json:
        print(json.dumps({"sizes": list(p.sizes), "batch_size": p.batch_size, "dtype": p.dtype.name,
                          "strategy": p.strategy, "optimizer_in_backward": p.optimizer_in_backward,
                          "kept": list(p.kept), "recompute_order": list(p.recompute_order),
                          "forward_counts": p.forward_counts.tolist(), "recompute_factor": p.recompute_factor,
                          "extra_flop_fraction": p.extra_flop_fraction, "bytes": p.bytes()}, indent=2))
    else:
        print(p.describe())
    return 0


def _measured(sizes, batch, dtype, strategy, fused):
    """memray's peak over building a net and 3 training steps on random data."""
    from .network import NetworkWithCheckpointing
    rng = np.random.default_rng(0)
    x = rng.random((batch, sizes[0])).astype(dtype)
    y = rng.random((batch, sizes[-1])).astype(dtype)

    def build_and_train():
        net = NetworkWithCheckpointing(sizes, strategy=strategy, dtype=dtype, optimizer_in_backward=fused)
        for _ in range(3):
            net.update_mini_batch(x, y, 0.01)
    build_and_train()                                             # warm-up
    return memory.memray_peak(build_and_train)


def analyze(args):
    names = [str(s) for s in args.strategies]
    rows = memory.depth_table(args.depths, width=args.width, n_in=args.n_in, n_out=args.n_out,
                              batch_size=args.batch_size, dtype=args.dtype, strategies=args.strategies,
                              optimizer_in_backward=args.sgd_in_backward)
    for row in rows:
        row["measured"] = {}
        if row["hidden_layers"] in args.measure:
            for s in args.strategies:
                if row[str(s)] is not None:
                    row["measured"][str(s)] = _measured(row["sizes"], args.batch_size, args.dtype, s,
                                                        args.sgd_in_backward)
    curve = memory.tradeoff(rows[-1]["sizes"], args.batch_size, args.dtype)
    if args.json:
        print(json.dumps({"rows": rows, "tradeoff": [{"activation_bytes": b, "extra_flop_fraction": e}
                                                     for b, e in curve]}, indent=2))
    else:
        _print_analysis(args, rows, names, curve)
    if args.out:
        _plot_analysis(args, rows, curve)
    return 0


def _print_analysis(args, rows, names, curve):
    print(f"peak MiB of a training step, [{args.n_in}] + [{args.width}]*H + [{args.n_out}], batch "
          f"{args.batch_size}, {args.dtype}: planned (memray-measured where H is in --measure)")
    print(f"{'H':>4} " + " ".join(f"{n:>22}" for n in names))
    for r in rows:
        cells = []
        for n in names:
            if r[n] is None:
                cells.append(f"{'-':>22}")
                continue
            got = r["measured"].get(n)
            text = f"{r[n]['total'] / 2**20:.2f}" + (f" ({got / 2**20:.2f})" if got else "")
            cells.append(f"{text:>22}")
        print(f"{r['hidden_layers']:>4} " + " ".join(cells))
    print("plain activations grow linearly with H; the formulas are in fastckpt.memory")
    print(f"\nbudget trade-off for H = {rows[-1]['hidden_layers']}: activation MiB -> extra FLOPs "
          "(% of a plain step)")
    for nbytes, extra in _thin(curve, 12):
        print(f"  {nbytes / 2**20:10.2f} MiB  {100 * extra:7.1f}%")


def _plot_analysis(args, rows, curve):
    os.makedirs(args.out, exist_ok=True)
    depth_png = memory.plot_depth(rows, os.path.join(args.out, "memory_vs_depth.png"),
                                  title=f"[{args.n_in}] + [{args.width}]*H + [{args.n_out}], "
                                        f"batch {args.batch_size}, {args.dtype}")
    marks = []
    for s in args.strategies:
        try:
            p = make_plan(rows[-1]["sizes"], args.batch_size, args.dtype, s)
        except ValueError:
            continue
        marks.append((str(s), p.bytes()["activation_memory"], p.extra_flop_fraction))
    curve_png = memory.plot_tradeoff(curve, os.path.join(args.out, "budget_tradeoff.png"), marks=marks,
                                     title=f"H = {rows[-1]['hidden_layers']}, batch {args.batch_size}, {args.dtype}")
    print(f"\nwrote {depth_png} and {curve_png}", file=sys.stderr if args.json else sys.stdout)


def _thin(points, n):
    """About ``n`` points of a long curve, ends included."""
    if len(points) <= n:
        return points
    keep = sorted(set(np.linspace(0, len(points) - 1, n).round().astype(int)))
    return [points[k] for k in keep]


# -- profile ----------------------------------------------------------------------------------
def profile(args):
    import memray

    from .network import NetworkWithCheckpointing
    (x_train, y_train), _ = load_mnist(args.data)
    if x_train.shape[1] != args.sizes[0] or y_train.shape[1] != args.sizes[-1]:
        raise ValueError(f"--sizes {','.join(map(str, args.sizes))} do not fit the data: it has "
                         f"{x_train.shape[1]} inputs and {y_train.shape[1]} classes")
    make_plan(args.sizes, args.batch_size, args.dtype, args.strategy)
    x, y = x_train[:args.batch_size], y_train[:args.batch_size]
    NetworkWithCheckpointing(args.sizes, strategy=args.strategy, dtype=args.dtype).update_mini_batch(x, y, 0.0)
    os.makedirs(args.out, exist_ok=True)
    html = os.path.join(args.out, "memray-flamegraph.html")
    with tempfile.TemporaryDirectory() as tmp:
        capture = os.path.join(tmp, "profile.bin")
        with memray.Tracker(capture, native_traces=args.native):
            net = NetworkWithCheckpointing(args.sizes, strategy=args.strategy, dtype=args.dtype)
            for _ in range(args.steps):
                net.update_mini_batch(x, y, args.eta)
        peak = memray.FileReader(capture).metadata.peak_memory
        proc = subprocess.run([sys.executable, "-m", "memray", "flamegraph", "-f", "-o", html, capture],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"memray flamegraph failed: {proc.stderr.strip().splitlines()[-1]}")
    predicted = net.plan(args.batch_size).bytes()["total"]
    print(f"memray flamegraph of building {args.sizes} with {args.strategy} and {args.steps} training steps: {html}")
    print(f"peak {peak / 2**20:.3f} MiB measured, {predicted / 2**20:.3f} MiB planned")
    return 0


# -- train ------------------------------------------------------------------------------------
def train(args):
    """Train one net (plainly or with a strategy) on one process, on threads, or on MPI ranks."""
    from .network import NetworkWithCheckpointing
    trainer = rank = None
    if args.mpi:
        from .distributed import MPITrainer, mpi_world
        rank = mpi_world()[1].Get_rank()
    (x_train, y_train), (x_test, y_test) = load_mnist(args.data)
    if x_train.shape[1] != args.sizes[0] or y_train.shape[1] != args.sizes[-1]:
        raise ValueError(f"--sizes {','.join(map(str, args.sizes))} do not fit the data: it has "
                         f"{x_train.shape[1]} inputs and {y_train.shape[1]} classes")
    make_plan(args.sizes, args.batch_size, args.dtype, args.strategy)
    np.random.seed(args.seed)
    net = NetworkWithCheckpointing(args.sizes, strategy=args.strategy, dtype=args.dtype, loss=args.loss, l2=args.l2)
    lead = rank in (None, 0)
    t0 = time.perf_counter()
    if args.mpi:
        trainer = MPITrainer(net)
        _, times = trainer.SGD((x_train, y_train), args.epochs, args.batch_size, args.eta,
                               test_data=(x_test, y_test), parallel_batches=args.parallel_batches,
                               verbose=lead and not args.json)
        workers = {"ranks": trainer.ranks, "parallel_batches": args.parallel_batches or trainer.ranks,
                   "bytes_sent_and_received_per_update": trainer.bytes_per_update}
    elif args.threads > 1 or args.parallel_batches:
        from .parallel import DataParallel
        with DataParallel(net, threads=args.threads) as dp:
            _, times = dp.SGD((x_train, y_train), args.epochs, args.batch_size, args.eta, test_data=(x_test, y_test),
                              parallel_batches=args.parallel_batches, verbose=not args.json)
        workers = {"threads": args.threads, "parallel_batches": args.parallel_batches or args.threads}
    else:
        _, times = net.SGD((x_train, y_train), args.epochs, args.batch_size, args.eta, test_data=(x_test, y_test),
                           verbose=not args.json)
        workers = {}
    seconds = time.perf_counter() - t0
    if not lead:
        return 0
    result = {"sizes": args.sizes, "strategy": str(args.strategy), "loss": args.loss, "l2": args.l2,
              "batch_size": args.batch_size, "eta": args.eta,
              "epochs": args.epochs, "accuracies": net.accuracies, "updates": len(times),
              "ms_per_update": float(np.median(times) * 1e3) if times else float("nan"),
              "seconds": seconds, **workers}
    if args.save:
        np.savez(args.save, *net.weights, *net.biases)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"trained {args.sizes} ({result['strategy']}) for {args.epochs} epochs: accuracy "
              f"{net.accuracies[-1] if net.accuracies else float('nan'):.4f}, {len(times)} updates, "
              f"{result['ms_per_update']:.3f} ms per update, {seconds:.1f} s"
              + (f", {workers}" if workers else ""))
    return 0


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
    p.add_argument("--eta", type=float, default=3.0)
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
    p.add_argument("--eta", type=float, default=3.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default=None)
    p.add_argument("--threads", type=_positive, default=1, help="worker threads (fastckpt.parallel)")
    p.add_argument("--parallel-batches", type=_positive, default=None,
                   help="mini-batches per update (default: one per thread or rank)")
    p.add_argument("--mpi", action="store_true", help="one mini-batch per MPI rank per update (run under mpiexec)")
    p.add_argument("--loss", choices=["quadratic", "cross_entropy"], default="quadratic",
                   help="quadratic (sigmoid output, the lab's) or cross_entropy (softmax output)")
    p.add_argument("--l2", type=float, default=0.0, help="L2 weight penalty (0.5 * l2 * ||W||^2 per layer)")
    p.add_argument("--save", default=None, help="rank 0 writes the trained weights and biases here (.npz)")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("profile", help="train under memray and write its flamegraph HTML report")
    common(p)
    p.add_argument("--strategy", type=_strategy, default="every_nth(2)", help=strategies_help)
    p.add_argument("--steps", type=_positive, default=20)
    p.add_argument("--eta", type=float, default=3.0)
    p.add_argument("--data", default=None)
    p.add_argument("--native", action="store_true", help="record native (C) stacks too")
    p.add_argument("--out", default="fastckpt-profile", help="directory for the report (default fastckpt-profile)")
    return parser


def main(argv=None):
    args = _parser().parse_args(argv)
    commands = {"compare": compare, "plan": show_plan, "analyze": analyze, "profile": profile, "train": train}
    try:
        return commands[args.command](args)
    except (ValueError, TypeError, OSError, RuntimeError) as exc:
        print(f"fastckpt {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"fastckpt {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
