"""Step-time overhead of checkpoint strategies over plain, measured interleaved.

Each round times one step of every strategy in turn, so slow drifts of a shared
machine hit all of them alike; the overhead is the median over rounds of each
round's ratio to plain, printed beside the plan's extra-FLOP fraction.

    python benchmarks/interleaved.py [--rounds 11] [--sgd-in-backward]
"""
import argparse
import time

import numpy as np

from fastckpt import NetworkWithCheckpointing

SIZES = [784] + [256] * 64 + [10]
BATCH = 2048
STRATEGIES = ["plain", "segments(8)", "sqrt", "revolve(4)", "budget(24MiB)"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--sgd-in-backward", action="store_true")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    x, y = rng.random((BATCH, SIZES[0])), rng.random((BATCH, SIZES[-1]))
    nets = {}
    for s in STRATEGIES:
        np.random.seed(0)
        nets[s] = NetworkWithCheckpointing(SIZES, strategy=s, optimizer_in_backward=args.sgd_in_backward)
        nets[s].update_mini_batch(x, y, 1e-3)                     # warm-up
    times = {s: [] for s in STRATEGIES}
    for _ in range(args.rounds):
        for s in STRATEGIES:
            t0 = time.perf_counter()
            nets[s].update_mini_batch(x, y, 1e-3)
            times[s].append(time.perf_counter() - t0)
    print(f"{SIZES[1:-1].count(256)} hidden layers of 256, batch {BATCH}, float64, {args.rounds} interleaved rounds"
          f"{', SGD in backward' if args.sgd_in_backward else ''}")
    print("| strategy | median ms/step | overhead over plain (median of per-round ratios) | extra FLOPs | difference |")
    print("|---|---:|---:|---:|---:|")
    plain = np.array(times["plain"])
    for s in STRATEGIES:
        ratio = np.median(np.array(times[s]) / plain)
        extra = nets[s].plan(BATCH).extra_flop_fraction
        print(f"| {s} | {1e3 * np.median(times[s]):.1f} | {100 * (ratio - 1):+.1f}% | {100 * extra:.1f}% | "
              f"{100 * (ratio - 1 - extra):+.1f} pp |")


if __name__ == "__main__":
    main()
