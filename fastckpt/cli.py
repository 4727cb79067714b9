"""The ``fastckpt`` command: ``fastckpt compare`` trains with and without checkpointing."""
import argparse
import sys

import numpy as np

from .data import load_mnist
from .memory import memray_peak
from .network import Network, NetworkWithCheckpointing


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
    runs.append((f"every_nth({args.every})",
                 lambda: NetworkWithCheckpointing(args.sizes, args.every, dtype=args.dtype)))
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
    p.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default=None, help="the lab's mnist.npz or an IDX folder (default: embedded MNIST)")
    args = parser.parse_args(argv)
    try:
        return compare(args)
    except (ValueError, TypeError, FileNotFoundError) as exc:
        print(f"fastckpt {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"fastckpt {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
