"""Two parts of a scikit-learn-sized step timed alone: the Adam kernel, and the GEMMs of one step.

    python benchmarks/step_parts.py

* Adam: :func:`fastckpt.kernels.adam_step` on the parameter counts of ``MLPRegressor((128, 64))`` on 10 features
  (9,729) and of ``MLPClassifier((256, 128))`` on Fashion-MNIST (235,146), float64; the median of 7 runs of 500
  steps.  Run it in two checkouts to compare kernels.
* The eight GEMMs of one ``make_friedman1`` step, ``(128, 64)`` at batch 200, through numpy's BLAS (three
  forward, three weight gradients, two deltas), and those of one Fashion-MNIST step, ``(256, 128)`` at batch
  256: the floor under any step of these nets on this BLAS.

Prints the CPU, AVX-512 or not, the BLAS and its core type, the versions, the date and the command.
"""
import datetime
import sys
import time

import numpy as np


def median_us(fn, rounds=7, calls=500):
    fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return float(np.median(times))


def adam(n):
    from fastckpt.kernels import adam_step
    rng = np.random.default_rng(0)
    p, g, m, v = rng.random(n), rng.random(n) * 1e-3, np.zeros(n), np.zeros(n)
    blocks = np.array([[0, n]], dtype=np.int64)
    return median_us(lambda: adam_step(p, g, m, v, 1e-3, 0.9, 0.999, 1e-8, 0.0, False, 0.1, 0.001, blocks))


def gemm_step(sizes, batch, dtype=np.float64):
    """A callable that runs the GEMMs of one step of a net of ``sizes`` at ``batch`` rows through numpy's BLAS:
    each layer's forward and weight gradient, and every delta but the input's (random operands)."""
    rng = np.random.default_rng(0)
    acts = [rng.random((batch, n)).astype(dtype) for n in sizes]
    ws = [rng.random((a, b)).astype(dtype) for a, b in zip(sizes[:-1], sizes[1:])]
    deltas = [rng.random((batch, n)).astype(dtype) for n in sizes[1:]]
    grads = [np.empty_like(w) for w in ws]

    def step():
        for i, w in enumerate(ws):
            np.matmul(acts[i], w, out=acts[i + 1])
        for i in range(len(ws) - 1, -1, -1):
            np.matmul(acts[i].T, deltas[i], out=grads[i])
            if i:
                np.matmul(deltas[i], ws[i].T, out=deltas[i - 1])
    return step


def step_gemms(sizes, batch):
    """The median microseconds of :func:`gemm_step` in float64."""
    calls = max(20, int(2e9 / (batch * sum(a * b for a, b in zip(sizes, sizes[1:])) * 6)))
    return median_us(gemm_step(sizes, batch), calls=calls)


def main():
    import fastckpt
    from fastckpt.report.machine import cpu_summary
    print(f"{cpu_summary()}; fastckpt {fastckpt.__version__}, numpy {np.__version__}; {datetime.date.today()}; "
          f"command: python benchmarks/step_parts.py {' '.join(sys.argv[1:])}")
    for n in (9729, 235146):
        print(f"adam_step, {n} float64 parameters: {adam(n):.1f} us")
    print(f"the GEMMs of one make_friedman1 (128, 64) step at batch 200: {step_gemms([10, 128, 64, 1], 200):.0f} us")
    print(f"the GEMMs of one Fashion-MNIST (256, 128) step at batch 256: "
          f"{step_gemms([784, 256, 128, 10], 256):.0f} us")


if __name__ == "__main__":
    main()
