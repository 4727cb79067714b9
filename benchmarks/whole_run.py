"""A whole ``fastckpt train`` run on the real Fashion-MNIST: memray's peak beside the prediction ``plan --data``
prints, for the README's table ("The whole run").

    python benchmarks/whole_run.py [--sizes 784,512x16,10] [--batch-size 256] [--strategies plain,sqrt]

Needs Debian's ``dataset-fashion-mnist`` (``/usr/share/datasets/fashion-mnist``); skips otherwise.  Each
run is measured in this process after a warm-up run, itself under memray (memray counts the Python objects
a first run leaves behind otherwise), with BLAS on the threads the plan counts.
"""
import argparse
import contextlib
import io
import json
import os
import time

FASHION = "/usr/share/datasets/fashion-mnist"


def measure(sizes, batch, strategy):
    """(memray's peak, the predicted total) of ``fastckpt train`` of one epoch."""
    from types import SimpleNamespace

    from fastckpt.cli import app as cli
    from fastckpt.cli.bound import whole_run
    from fastckpt.cli.data import load_data
    from fastckpt.planner import parse_strategy
    from fastckpt.report.measure import memray_peak
    args = ["train", "--sizes", ",".join(map(str, sizes)), "--batch-size", str(batch), "--epochs", "1",
            "--strategy", strategy, "--data", FASHION, "--json"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        memray_peak(lambda: cli.main(args))                      # the warm-up, under memray too
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        peak = memray_peak(lambda: cli.main(args))
    run = SimpleNamespace(sizes=sizes, batch_size=batch, dtype="float64", strategy=parse_strategy(strategy),
                          sgd_in_backward=False, optimizer="sgd", validation=None, shuffle=None)
    training, test = load_data(FASHION, sizes)
    predicted = whole_run(run, training, test, 1, False)
    return peak, predicted["total"], json.loads(out.getvalue())["accuracies"][-1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="784," + ",".join(["512"] * 16) + ",10")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--strategies", default="plain,sqrt")
    args = parser.parse_args()
    if not os.path.isdir(FASHION):
        print(f"skipped: {FASHION} is absent (apt-get install dataset-fashion-mnist)")
        return
    from fastckpt.report.machine import cpu_summary
    print(cpu_summary())
    print(f"{time.strftime('%Y-%m-%d')}; command: python benchmarks/whole_run.py --sizes {args.sizes} "
          f"--batch-size {args.batch_size} --strategies {args.strategies}")
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"{'run':<10}{'predicted MiB':>15}{'memray peak MiB':>17}{'peak - predicted KiB':>22}{'accuracy':>10}")
    for strategy in args.strategies.split(","):
        peak, predicted, accuracy = measure(sizes, args.batch_size, strategy)
        print(f"{strategy:<10}{predicted / 2**20:>15.2f}{peak / 2**20:>17.2f}{(peak - predicted) / 1024:>22.1f}"
              f"{accuracy:>10.4f}")


if __name__ == "__main__":
    main()
