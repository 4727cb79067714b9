"""Step-time overhead of checkpoint strategies over plain, measured interleaved.

Each round times one step of every strategy in turn, so slow drifts of a shared
machine hit all of them alike; the overhead is the median over rounds of each
round's ratio to plain, printed beside the plan's extra-FLOP fraction.

    python benchmarks/interleaved.py [--rounds 11] [--sgd-in-backward]
    python benchmarks/interleaved.py --sizes 784,40,30,10 --batch-size 100 --strategies every_nth(2) --rounds 3000
"""
import argparse
import time

import numpy as np

from fastckpt import NetworkWithCheckpointing
from fastckpt.planner.costs import describe_sizes
from fastckpt.planner.strategies import parse_strategies

SIZES = [784] + [256] * 64 + [10]
BATCH = 2048
STRATEGIES = ["plain", "segments(8)", "sqrt", "revolve(4)", "budget(24MiB)"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--sgd-in-backward", action="store_true")
    parser.add_argument("--sizes", type=lambda t: [int(v) for v in t.split(",")], default=SIZES)
    parser.add_argument("--batch-size", type=int, default=BATCH)
    parser.add_argument("--strategies", type=lambda t: [str(s) for s in parse_strategies(t)],
                        default=STRATEGIES[1:], help="strategies besides plain, comma-separated as in "
                                                     "fastckpt compare (default: %(default)s)")
    args = parser.parse_args(argv)
    sizes, batch, strategies = args.sizes, args.batch_size, ["plain", *args.strategies]
    rng = np.random.default_rng(0)
    x, y = rng.random((batch, sizes[0])), rng.random((batch, sizes[-1]))
    nets = {}
    for s in strategies:
        np.random.seed(0)
        nets[s] = NetworkWithCheckpointing(sizes, strategy=s, optimizer_in_backward=args.sgd_in_backward)
        nets[s].update_mini_batch(x, y, 1e-3)                     # warm-up
    times = {s: [] for s in strategies}
    for _ in range(args.rounds):
        for s in strategies:
            t0 = time.perf_counter()
            nets[s].update_mini_batch(x, y, 1e-3)
            times[s].append(time.perf_counter() - t0)
    print(f"{describe_sizes(sizes)}, batch {batch}, float64, {args.rounds} interleaved rounds"
          f"{', SGD in backward' if args.sgd_in_backward else ''}")
    print("| strategy | median ms/step | overhead over plain (median of per-round ratios) | extra FLOPs | difference |")
    print("|---|---:|---:|---:|---:|")
    plain = np.array(times["plain"])
    for s in strategies:
        ratio = np.median(np.array(times[s]) / plain)
        extra = nets[s].plan(batch).extra_flop_fraction
        print(f"| {s} | {1e3 * np.median(times[s]):.3f} | {100 * (ratio - 1):+.1f}% | {100 * extra:.1f}% | "
              f"{100 * (ratio - 1 - extra):+.1f} pp |")


if __name__ == "__main__":
    main()
