"""A deep net that learns, beside PyTorch: [784] + [512]*16 + [10], ReLU, He init, Adam, on Fashion-MNIST.

    python benchmarks/fashion_deep.py [--epochs 3] [--batch-size 128] [--rounds 1] [--limit N] [--depth 16]

``--depth D`` trains ``[784] + [512]*D + [10]`` instead (the speed issue's row is ``--depth 8 --epochs 1
--batch-size 256``).

Both train the same net from the same initial weights (fastckpt's He-normal draws, copied into
PyTorch's ``nn.Linear`` layers), in float32, with log-softmax + cross-entropy, Adam (lr 1e-3,
PyTorch's defaults), the same minibatches in the same shuffled order each epoch, on two BLAS threads.
fastckpt runs plain and with ``sqrt`` checkpointing, PyTorch plain and with ``checkpoint_sequential``
(4 segments).  Prints the test accuracy after each epoch and the median seconds per epoch over the
rounds, and each time's ratio to PyTorch's plain one.  Needs the Debian package
``dataset-fashion-mnist`` (``/usr/share/datasets/fashion-mnist``) and torch; skips otherwise.
"""
import argparse
import os
import platform
import sys
import time

import numpy as np
from fastckpt.kernels import set_blas_threads

import fastckpt
from fastckpt.engine.loop import epoch_order

FASHION = "/usr/share/datasets/fashion-mnist"
SIZES = [784] + [512] * 16 + [10]                 # --depth changes it
LR, SEED, SHUFFLE = 1e-3, 0, 7


def fastckpt_run(strategy, data, epochs, batch):
    """(accuracies, seconds per epoch) of fastckpt's net."""
    (x, y), (xt, yt) = data
    np.random.seed(SEED)
    net = fastckpt.NetworkWithCheckpointing(SIZES, strategy=strategy, dtype=np.float32, loss="cross_entropy",
                                            activation="relu", init="he", optimizer="adam")
    for epoch in range(epochs):
        t0 = time.perf_counter()
        net.SGD((x, y), 1, batch, LR, verbose=False, shuffle=SHUFFLE, first_epoch=epoch)
        seconds = time.perf_counter() - t0
        yield net.evaluate(xt, yt), seconds


def initial_weights():
    np.random.seed(SEED)
    net = fastckpt.Network(SIZES, dtype=np.float32, loss="cross_entropy", activation="relu", init="he")
    return net.weights, net.biases


def torch_run(segments, data, epochs, batch):
    """(accuracy, seconds) per epoch of the same net in PyTorch."""
    import torch
    torch.set_num_threads(2)
    (x, y), (xt, yt) = data
    weights, biases = initial_weights()
    layers = []
    for w, b in zip(weights, biases):
        linear = torch.nn.Linear(w.shape[1], w.shape[0])
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(np.array(w)))
            linear.bias.copy_(torch.from_numpy(np.array(b).reshape(-1)))
        layers += [linear, torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    loss_fn = torch.nn.CrossEntropyLoss()
    xs, ys = torch.from_numpy(np.asarray(x, dtype=np.float32)), torch.from_numpy(np.asarray(y, dtype=np.int64))
    xts, yts = torch.from_numpy(np.asarray(xt, dtype=np.float32)), torch.from_numpy(np.asarray(yt, dtype=np.int64))
    order = epoch_order(SHUFFLE, len(ys))
    for epoch in range(epochs):
        rows = torch.from_numpy(order(epoch))
        t0 = time.perf_counter()
        for s in range(0, len(ys) - batch + 1, batch):
            take = rows[s:s + batch]
            xb, yb = xs[take], ys[take]
            opt.zero_grad(set_to_none=True)
            if segments:
                out = torch.utils.checkpoint.checkpoint_sequential(model, segments, xb, use_reentrant=False)
            else:
                out = model(xb)
            loss_fn(out, yb).backward()
            opt.step()
        seconds = time.perf_counter() - t0
        with torch.no_grad():
            acc = float((model(xts).argmax(1) == yts).float().mean())
        yield acc, seconds


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--limit", type=int, default=None, help="train on the first N samples only")
    p.add_argument("--depth", type=int, default=16, help="hidden layers of 512 units")
    args = p.parse_args(argv)
    if args.depth < 1:
        p.error(f"--depth must be at least 1, got {args.depth}")
    SIZES[1:-1] = [512] * args.depth
    if not os.path.isdir(FASHION):
        print(f"skipped: {FASHION} is absent (apt-get install dataset-fashion-mnist)")
        return 0
    try:
        import torch
    except ImportError:
        print("skipped: torch is not installed (pip install torch==2.13.0)")
        return 0
    (x, y), test = fastckpt.load_mnist(FASHION, compact=True)
    if args.limit:
        x, y = x[:args.limit], y[:args.limit]
    data = ((x, y), test)
    set_blas_threads(2)
    runs = {"fastckpt plain": lambda: fastckpt_run("plain", data, args.epochs, args.batch_size),
            "fastckpt sqrt": lambda: fastckpt_run("sqrt", data, args.epochs, args.batch_size),
            "torch plain": lambda: torch_run(0, data, args.epochs, args.batch_size),
            "torch checkpoint_sequential(4)": lambda: torch_run(4, data, args.epochs, args.batch_size)}
    small = ((x[:4 * args.batch_size], y[:4 * args.batch_size]), (test[0][:100], test[1][:100]))
    for warm in (lambda: fastckpt_run("plain", small, 1, args.batch_size),
                 lambda: fastckpt_run("sqrt", small, 1, args.batch_size),
                 lambda: torch_run(0, small, 1, args.batch_size), lambda: torch_run(4, small, 1, args.batch_size)):
        list(warm())                                    # kernels compiled, thread pools and buffers made
    results = {name: [] for name in runs}
    for _ in range(args.rounds):                       # interleaved: every run sees the machine alike
        for name, run in runs.items():
            results[name].append(list(run()))
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    avx512 = "avx512f" in open("/proc/cpuinfo").read()
    print(f"[{SIZES[0]}] + [512]*{len(SIZES) - 2} + [10] ReLU, He, Adam(lr {LR}), float32, batch {args.batch_size}, "
          f"{len(y)} training samples, {args.epochs} epochs, {args.rounds} rounds; CPU {cpu}, AVX-512 "
          f"{'yes' if avx512 else 'no'}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}; "
          f"command: python benchmarks/fashion_deep.py {' '.join(sys.argv[1:])}")
    base = np.median([s for rnd in results["torch plain"] for _, s in rnd])
    print(f"{'run':<32}{'test accuracy per epoch':<28}{'s/epoch (median)':>17}{'x torch plain':>15}")
    for name, rounds in results.items():
        accs = " ".join(f"{a:.4f}" for a, _ in rounds[-1])
        sec = np.median([s for rnd in rounds for _, s in rnd])
        print(f"{name:<32}{accs:<28}{sec:>17.2f}{sec / base:>15.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
