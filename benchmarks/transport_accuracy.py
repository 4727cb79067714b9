"""Accuracy and bytes per update of each pipeline transport, on 2 MPI ranks.

    python benchmarks/transport_accuracy.py [--data FOLDER] [--epochs 10] [--sizes 784,100,100,10]

Trains the same net from the same seed with ``fastckpt train --pipeline 2`` once
per transport (native, float16, bfloat16, int8) and prints the final test
accuracy and the bytes each rank sends per update.  ``--data`` takes an IDX
folder (e.g. Debian's dataset-fashion-mnist in /usr/share/datasets/fashion-mnist);
by default the embedded MNIST.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

from fastckpt.report.machine import cpu_summary

TRANSPORTS = ("native", "float16", "bfloat16", "int8")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=None)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--sizes", default="784,100,100,10")
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--micro-batches", type=int, default=2)
    parser.add_argument("--eta", type=float, default=3.0)
    args = parser.parse_args(argv)
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
    if mpiexec is None:
        print("needs mpiexec (pip install mpi4py mpich)")
        return 1
    print(cpu_summary())
    print(f"{time.strftime('%Y-%m-%d')}: python benchmarks/transport_accuracy.py " + " ".join(argv or sys.argv[1:]))
    print(f"net {args.sizes}, batch {args.batch_size}, {args.micro_batches} micro-batches, eta {args.eta}, "
          f"{args.epochs} epochs, data {args.data or 'embedded MNIST (4,000 train, 1,000 test)'}")
    print("| transport | test accuracy per epoch | final | bytes rank 0 sends per update |")
    print("|---|---|---:|---:|")
    for transport in TRANSPORTS:
        cmd = [mpiexec, "-n", "2", sys.executable, "-m", "fastckpt", "train", "--pipeline", "2", "--json",
               "--transport", transport, "--sizes", args.sizes, "--epochs", str(args.epochs),
               "--batch-size", str(args.batch_size), "--micro-batches", str(args.micro_batches),
               "--eta", str(args.eta)] + (["--data", args.data] if args.data else [])
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=7200)
        if proc.returncode != 0:
            print(f"| {transport} | failed: {proc.stderr.strip().splitlines()[-1]} | | |")
            continue
        result = json.loads(proc.stdout)
        accs = ", ".join(f"{a:.4f}" for a in result["accuracies"])
        print(f"| {transport} | {accs} | {result['accuracies'][-1]:.4f} | {result['bytes_sent_per_update']:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
