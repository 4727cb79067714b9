"""Two parts of a scikit-learn-sized step timed alone: the Adam kernel, and the GEMMs of a make_friedman1 step.

    python benchmarks/step_parts.py

* Adam: :func:`fastckpt.kernels.adam_step` on the parameter counts of ``MLPRegressor((128, 64))`` on 10 features
  (9,729) and of ``MLPClassifier((256, 128))`` on Fashion-MNIST (235,146), float64; the median of 7 runs of 500
  steps.  Run it in two checkouts to compare kernels.
* The eight GEMMs of one ``make_friedman1`` step, ``(128, 64)`` at batch 200, through numpy's BLAS (three
  forward, three weight gradients, two deltas): the floor under any step of that net on this BLAS.

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


def friedman_gemms(batch=200):
    rng = np.random.default_rng(0)
    x, w1, w2, w3 = rng.random((batch, 10)), rng.random((10, 128)), rng.random((128, 64)), rng.random((64, 1))
    h1, h2, out = np.empty((batch, 128)), np.empty((batch, 64)), np.empty((batch, 1))
    d3, d2, d1 = rng.random((batch, 1)), np.empty((batch, 64)), np.empty((batch, 128))
    g1, g2, g3 = np.empty((10, 128)), np.empty((128, 64)), np.empty((64, 1))

    def step():
        np.matmul(x, w1, out=h1)
        np.matmul(h1, w2, out=h2)
        np.matmul(h2, w3, out=out)
        np.matmul(h2.T, d3, out=g3)
        np.matmul(d3, w3.T, out=d2)
        np.matmul(h1.T, d2, out=g2)
        np.matmul(d2, w2.T, out=d1)
        np.matmul(x.T, d1, out=g1)
    return median_us(step, calls=1000)


def main():
    import fastckpt
    from fastckpt.report.machine import cpu_summary
    print(f"{cpu_summary()}; fastckpt {fastckpt.__version__}, numpy {np.__version__}; {datetime.date.today()}; "
          f"command: python benchmarks/step_parts.py {' '.join(sys.argv[1:])}")
    for n in (9729, 235146):
        print(f"adam_step, {n} float64 parameters: {adam(n):.1f} us")
    print(f"the GEMMs of one make_friedman1 (128, 64) step at batch 200: {friedman_gemms():.0f} us")


if __name__ == "__main__":
    main()
