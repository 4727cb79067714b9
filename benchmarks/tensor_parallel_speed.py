"""Samples per second of TensorParallelTrainer on this job's ranks against one process's Network.

    mpiexec -n 2 python benchmarks/tensor_parallel_speed.py [--rounds 7]

Rounds alternate, so slow drifts of a shared machine hit every contender alike: rank 0 times
``fastckpt.Network`` alone, BLAS on every core and then on one thread (the other ranks wait in a
non-blocking barrier, sleeping, so they take no core), then every rank times the trainer (BLAS
on ``cores // ranks`` threads each).  A round is ``updates`` SGD steps on consecutive MNIST
minibatches; rates are medians over the rounds after one warm-up round, which also compiles.
After timing, the trainer's next step is checked against the Network's from the same weights:
not the whole run, as the deep net at this eta is chaotic in one process already (one ulp in one
weight grows to 1e-2 within 16 updates), so the two runs drift apart by their roundings.  float64.
"""
import argparse
import os
import time

import numpy as np
from fastckpt.kernels import set_blas_threads

import fastckpt
from fastckpt.distributed import mpi_world
from fastckpt.parallel import TensorParallelTrainer
from fastckpt.planner.costs import describe_sizes
from fastckpt.report.machine import cpu_summary

MPI, WORLD = mpi_world()
# (name, sizes, minibatch, updates per round, eta)
CASES = [("lab", [784, 40, 30, 10], 10, 400, 3.0),
         ("deep-narrow", [784] + [256] * 16 + [10], 256, 8, 0.5)]


def alone_on_rank_0(comm, work):
    """``work()`` on rank 0 while the other ranks sleep in a non-blocking barrier; its result on rank 0."""
    result = work() if comm.rank == 0 else None
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.002)
    return result


def timed(model, x, y, batch, updates, eta, start, comm=None):
    """Seconds for ``updates`` steps of ``model`` from minibatch ``start`` on; with ``comm``, the slowest rank's."""
    if comm is not None:
        comm.Barrier()
    t0 = time.perf_counter()
    for k in range(start, start + updates):
        s = k * batch % (len(x) - batch + 1)
        model.update_mini_batch(x[s:s + batch], y[s:s + batch], eta)
    seconds = time.perf_counter() - t0
    return seconds if comm is None else comm.allreduce(seconds, op=MPI.MAX)


def run_case(comm, sizes, batch, updates, eta, rounds, x, y):
    """Rates (samples/s) per round of Network (all cores), Network (1 thread) and the trainer, and the trainer."""
    np.random.seed(0)
    trainer = TensorParallelTrainer(sizes, comm=comm)
    nets = []
    if comm.rank == 0:
        for _ in range(2):
            np.random.seed(0)
            nets.append(fastckpt.Network(sizes))
    cores = os.cpu_count() or 1
    rates, start = [], 0
    for r in range(rounds + 1):                                       # round 0: warm-up
        row = []
        for net, threads in zip(nets or [None, None], (cores, 1)):
            def network_round(net=net, threads=threads, start=start):
                set_blas_threads(threads)
                seconds = timed(net, x, y, batch, updates, eta, start)
                set_blas_threads(trainer.blas_threads)
                return seconds
            row.append(alone_on_rank_0(comm, network_round))
        row.append(timed(trainer, x, y, batch, updates, eta, start, comm))
        start += updates
        if r > 0 and comm.rank == 0:
            rates.append([updates * batch / s for s in row])
    weights, biases = trainer.gather()                                # the timed trainer computes right
    if comm.rank == 0:
        nets[0].weights, nets[0].biases = weights, biases
        nets[0].update_mini_batch(x[:batch], y[:batch], eta)
    trainer.update_mini_batch(x[:batch], y[:batch], eta)
    weights, biases = trainer.gather()
    if comm.rank == 0:
        for got, want in zip(weights + biases, list(nets[0].weights) + list(nets[0].biases)):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-13)
    return np.array(rates), trainer


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    comm = WORLD
    (x, y), _ = fastckpt.load_mnist()
    if comm.rank == 0:
        print(cpu_summary())
        print(f"{comm.size} ranks; float64; medians of {args.rounds} rounds after a warm-up round\n")
        print(f"| net | mini-batch | updates/round | Network, BLAS on {os.cpu_count()} cores (samples/s) | "
              "Network, 1 BLAS thread | TensorParallelTrainer | vs Network | bytes sent/update/rank |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, sizes, batch, updates, eta in CASES:
        rates, trainer = run_case(comm, sizes, batch, updates, eta, args.rounds, x, y)
        if comm.rank == 0:
            net_all, net_one, tp = np.median(rates, axis=0)
            ratios = rates[:, 2] / rates[:, 0]
            print(f"| {name} {describe_sizes(sizes)} | {batch} | {updates} | {net_all:,.0f} | {net_one:,.0f} | "
                  f"{tp:,.0f} | {np.median(ratios):.2f}x ({ratios.min():.2f}-{ratios.max():.2f}) | "
                  f"{trainer.bytes_per_update:,} |", flush=True)


if __name__ == "__main__":
    main()
