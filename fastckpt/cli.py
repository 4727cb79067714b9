"""The ``fastckpt`` command: ``compare`` trains with and without checkpointing; ``plan`` and
``analyze`` answer memory questions from the planner."""
import argparse
import os
import sys

import numpy as np

from . import memory
from .data import load_mnist
from .memory import memray_peak
from .network import Network, NetworkWithCheckpointing
from .strategies import parse_strategy
from .strategies import plan as make_plan


def _sizes(text):
    try:
        sizes = [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sizes must be comma-separated integers, got {text!r}") from None
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
    return [_strategy(p) for p in parts]


def _depths(text):
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--depths must be comma-separated integers, got {text!r}") from None
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"--depths must be >= 1, got {text!r}")
    return values


def show_plan(args):
    p = make_plan(args.sizes, args.batch_size, args.dtype, args.strategy,
                  optimizer_in_backward=args.sgd_in_backward)
    print(p.describe())
    return 0


def analyze(args):
    rows = memory.depth_table(args.depths, width=args.width, n_in=args.n_in, n_out=args.n_out,
                              batch_size=args.batch_size, dtype=args.dtype, strategies=args.strategies,
                              optimizer_in_backward=args.sgd_in_backward)
    names = [str(s) for s in args.strategies]
    print(f"predicted peak MiB of a training step: [{args.n_in}] + [{args.width}]*H + [{args.n_out}], "
          f"batch {args.batch_size}, {args.dtype}")
    print(f"{'H':>4} " + " ".join(f"{n:>14}" for n in names))
    for r in rows:
        cells = [f"{r[n]['total'] / 2**20:>14.2f}" if r[n] else f"{'-':>14}" for n in names]
        print(f"{r['hidden_layers']:>4} " + " ".join(cells))
    print("activations grow linearly with H in plain backprop; see fastckpt.memory for the formulas")
    sizes = rows[-1]["sizes"]
    curve = memory.tradeoff(sizes, args.batch_size, args.dtype)
    print(f"\nbudget trade-off for H = {rows[-1]['hidden_layers']}: activation MiB -> extra FLOPs "
          "(% of a plain step)")
    for nbytes, extra in _thin(curve, 12):
        print(f"  {nbytes / 2**20:10.2f} MiB  {100 * extra:7.1f}%")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        depth_png = memory.plot_depth(rows, os.path.join(args.out, "memory_vs_depth.png"),
                                      title=f"[{args.n_in}] + [{args.width}]*H + [{args.n_out}], "
                                            f"batch {args.batch_size}, {args.dtype}")
        marks = []
        for s in args.strategies:
            try:
                p = make_plan(sizes, args.batch_size, args.dtype, s)
            except ValueError:
                continue
            marks.append((str(s), p.bytes()["activation_memory"], p.extra_flop_fraction))
        curve_png = memory.plot_tradeoff(curve, os.path.join(args.out, "budget_tradeoff.png"), marks=marks,
                                         title=f"H = {rows[-1]['hidden_layers']}, batch {args.batch_size}, "
                                               f"{args.dtype}")
        print(f"\nwrote {depth_png} and {curve_png}")
    return 0


def _thin(points, n):
    """About ``n`` points of a long curve, ends included."""
    if len(points) <= n:
        return points
    keep = sorted(set(np.linspace(0, len(points) - 1, n).round().astype(int)))
    return [points[k] for k in keep]


def _build_and_train(build, x, y, eta, steps=5):
    """Build a network and run a few training steps: the work whose peak memory compare reports."""
    net = build()
    for _ in range(steps):
        net.update_mini_batch(x, y, eta)


def compare(args):
    (x_train, y_train), (x_test, y_test) = load_mnist(args.data)
    if x_train.shape[1] != args.sizes[0] or y_train.shape[1] != args.sizes[-1]:
        raise ValueError(f"--sizes {args.sizes} do not fit the data: {x_train.shape[1]} inputs and "
                         f"{y_train.shape[1]} classes")
    runs = [("plain", lambda: Network(args.sizes, dtype=args.dtype))]
    for strategy in args.strategies or [parse_strategy(f"every_nth({args.every})")]:
        strategy.tree(args.sizes, args.batch_size, np.dtype(args.dtype).itemsize)   # refuse before training
        runs.append((str(strategy), lambda s=strategy: NetworkWithCheckpointing(args.sizes, strategy=s,
                                                                                 dtype=args.dtype)))
    xb, yb = x_train[:args.batch_size], y_train[:args.batch_size]
    Network(args.sizes, dtype=args.dtype).update_mini_batch(xb, yb, args.eta)   # warm-up: BLAS, kernels
    results = []
    for name, build in runs:
        def seeded(build=build):
            np.random.seed(args.seed)
            return build()
        peak = memray_peak(lambda: _build_and_train(seeded, xb, yb, args.eta))
        net = seeded()
        print(f"training {name} ...", flush=True)
        _, times = net.SGD((x_train, y_train), args.epochs, args.batch_size, args.eta,
                           test_data=(x_test, y_test), verbose=False)
        plan = net.plan(args.batch_size)
        results.append({"name": name, "accuracies": net.accuracies, "ms": float(np.median(times) * 1e3),
                        "peak": peak, "predicted": plan.bytes()["total"], "recompute": plan.recompute_factor})
    _print_table(args, results)
    return 0


def _print_table(args, results):
    base = results[0]
    print(f"\n{args.sizes}, batch {args.batch_size}, eta {args.eta}, {args.epochs} epochs, {args.dtype}")
    print("test accuracy per epoch:")
    for r in results:
        print(f"  {r['name']:<14} " + " ".join(f"{a:.3f}" for a in r["accuracies"]))
    print(f"\n{'run':<14} {'accuracy':>8} {'ms/update':>10} {'x time':>7} {'peak MiB':>9} {'x mem':>6} "
          f"{'plan MiB':>9} {'recompute':>9}")
    for r in results:
        print(f"{r['name']:<14} {r['accuracies'][-1] if r['accuracies'] else float('nan'):>8.4f} "
              f"{r['ms']:>10.3f} {r['ms'] / base['ms']:>7.2f} {r['peak'] / 2**20:>9.3f} "
              f"{r['peak'] / base['peak']:>6.2f} {r['predicted'] / 2**20:>9.3f} {r['recompute']:>9.2f}")
    same = all(np.allclose(r["accuracies"], base["accuracies"], atol=1e-3) for r in results)
    print(f"\nsame accuracy with and without checkpointing: {'yes' if same else 'NO'}")
    print("ms/update: median over all updates; peak: memray, building the net and 5 training steps;")
    print("plan: fastckpt's predicted bytes; recompute: forward FLOPs per step / one forward pass")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="fastckpt", description="Fast MLP training with gradient checkpointing.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("compare", help="train on MNIST with and without checkpointing and compare")
    p.add_argument("--sizes", type=_sizes, default=[784, 40, 30, 10], help="layer widths (default 784,40,30,10)")
    p.add_argument("--epochs", type=_positive, default=10)
    p.add_argument("--batch-size", type=_positive, default=10)
    p.add_argument("--eta", type=float, default=3.0)
    p.add_argument("--every", type=_positive, default=2, help="checkpoint every n-th layer (default 2)")
    p.add_argument("--strategies", type=_strategies, default=None,
                   help="checkpoint strategies to compare with plain, e.g. 'every_nth(2),sqrt,budget(1MiB)' "
                        "(default: every_nth(EVERY))")
    p.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default=None, help="the lab's mnist.npz or an IDX folder (default: embedded MNIST)")
    p = sub.add_parser("plan", help="print the plan of one training step: kept, recomputed, bytes")
    p.add_argument("--sizes", type=_sizes, default=[784, 40, 30, 10], help="layer widths (default 784,40,30,10)")
    p.add_argument("--batch-size", type=_positive, default=10)
    p.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    p.add_argument("--strategy", type=_strategy, default="every_nth(2)",
                   help="plain, every_nth(n), segments(k), sqrt, revolve(slots), budget(bytes[, once])")
    p.add_argument("--sgd-in-backward", action="store_true", help="plan for the optimizer in backward")
    p = sub.add_parser("analyze", help="memory against depth (the lab's task 1) and the budget trade-off")
    p.add_argument("--depths", type=_depths, default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--width", type=_positive, default=256)
    p.add_argument("--n-in", type=_positive, default=784)
    p.add_argument("--n-out", type=_positive, default=10)
    p.add_argument("--batch-size", type=_positive, default=100)
    p.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    p.add_argument("--strategies", type=_strategies, default="plain,every_nth(2),sqrt,revolve(4)")
    p.add_argument("--sgd-in-backward", action="store_true")
    p.add_argument("--out", default=None, help="write memory_vs_depth.png and budget_tradeoff.png here")
    args = parser.parse_args(argv)
    try:
        return {"compare": compare, "plan": show_plan, "analyze": analyze}[args.command](args)
    except (ValueError, TypeError, FileNotFoundError) as exc:
        print(f"fastckpt {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"fastckpt {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
