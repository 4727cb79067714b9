"""Data parallelism over threads: one averaged update equals one step on the concatenated batch."""
import threading
import time

import numpy as np
import pytest

from fastckpt import InfeasiblePlan, Network, NetworkWithCheckpointing
from fastckpt.parallel import DataParallel


def _pair_of_nets(sizes, seed=3, **kwargs):
    nets = []
    for _ in range(2):
        np.random.seed(seed)
        nets.append(NetworkWithCheckpointing(sizes, **kwargs) if kwargs else Network(sizes))
    return nets


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("strategy", [None, "revolve(1)"])
def test_update_equals_one_step_on_the_concatenated_batch(rng, threads, strategy):
    sizes = [12, 9, 7, 5]
    one, many = _pair_of_nets(sizes, **({"strategy": strategy} if strategy else {}))
    xs = rng.random((5, 8, 12))                          # 5 minibatches of 8
    ys = rng.random((5, 8, 5))
    with DataParallel(many, threads=threads) as dp:
        for _ in range(3):
            one.update_mini_batch(xs.reshape(40, 12), ys.reshape(40, 5), 0.7)
            dp.update_mini_batches(xs, ys, 0.7)
            assert dp.last_loss == pytest.approx(one.last_loss, rel=1e-12)
    for a, b in zip(one.weights + one.biases, many.weights + many.biases):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-15)


def test_the_update_does_not_depend_on_thread_timing(rng, wrap_run_kernels):
    sizes = [30, 20, 10]
    xs, ys = rng.random((6, 16, 30)), rng.random((6, 16, 10))
    results = []
    for slow in (None, "main", "pool"):                  # no delay, worker 0 (this thread) late, worker 1 late
        def late(kernel, *args, slow=slow):              # a worker's whole step, ending with its gradients' sum
            main = threading.current_thread() is threading.main_thread()
            if slow is not None and main == (slow == "main"):
                time.sleep(0.02)                         # make the workers finish in another order
            return kernel(*args)
        wrap_run_kernels(late)
        np.random.seed(0)
        net = Network(sizes)
        with DataParallel(net, threads=2) as dp:
            for _ in range(2):
                dp.update_mini_batches(xs, ys, 0.5)
        results.append([w.copy() for w in net.weights + net.biases])
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)


def test_sgd_trains_like_the_lab_loop_on_grouped_minibatches(rng):
    sizes = [10, 8, 3]
    x, y = rng.random((100, 10)), rng.random((100, 3))
    one, many = _pair_of_nets(sizes)
    with DataParallel(many, threads=2) as dp:
        mem, times = dp.SGD((x, y), 2, 10, 1.0, test_data=(x, y.argmax(axis=1)), parallel_batches=3, verbose=False)
    assert len(mem) == len(times) == 2 * 4                  # 10 minibatches per epoch in groups of 3, 3, 3, 1
    for _ in range(2):
        for start in range(0, 100, 30):
            end = min(start + 30, 100)
            one.update_mini_batch(x[start:end], y[start:end], 1.0)
    for a, b in zip(one.weights, many.weights):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-15)
    assert len(many.accuracies) == 2


def test_bad_arguments_are_named():
    net = Network([4, 3, 2])
    with pytest.raises(ValueError, match="threads must be >= 1, got 0"):
        DataParallel(net, threads=0)
    with pytest.raises(TypeError, match="net must be a fastckpt Network, got list"):
        DataParallel([1, 2])
    with DataParallel(net, threads=2) as dp:
        with pytest.raises(ValueError, match=r"same number of samples, got sizes \[2, 3\]"):
            dp.update_mini_batches([np.ones((2, 4)), np.ones((3, 4))], [np.ones((2, 2)), np.ones((3, 2))], 0.1)
        with pytest.raises(ValueError, match="non-empty"):
            dp.update_mini_batches([], [], 0.1)
        with pytest.raises(ValueError, match=r"x_batches\[1\] contains NaN or inf"):
            dp.update_mini_batches([np.ones((2, 4)), np.full((2, 4), np.nan)], [np.ones((2, 2))] * 2, 0.1)
        before = [w.copy() for w in net.weights]
        with pytest.raises(FloatingPointError, match="weights left unchanged"):
            dp.update_mini_batches([np.ones((2, 4))] * 2, [np.full((2, 2), 1e300)] * 2, 1e300)
        for a, b in zip(before, net.weights):
            np.testing.assert_array_equal(a, b)


def test_a_bad_minibatch_on_one_worker_changes_nothing_and_leaves_no_worker_running(rng):
    np.random.seed(0)
    net = Network([30, 20, 10])
    before = [a.copy() for a in net.weights + net.biases]
    xs, ys = rng.random((4, 64, 30)), rng.random((4, 64, 10))
    xs[1, 5, 3] = np.nan                                   # worker 1's first minibatch
    with DataParallel(net, threads=2) as dp:
        with pytest.raises(ValueError, match=r"x_batches\[1\] contains NaN"):
            dp.update_mini_batches(xs, ys, 0.5)
        for a, b in zip(before, net.weights + net.biases):
            np.testing.assert_array_equal(a, b)
        xs[1, 5, 3] = 0.5
        dp.update_mini_batches(xs, ys, 0.5)                # no engine is still busy from the failed update
    assert any(not np.array_equal(a, b) for a, b in zip(before, net.weights + net.biases))


@pytest.mark.parametrize("threads", [2, 3])
def test_the_sum_does_not_depend_on_the_number_of_threads(rng, threads):
    """NOTE [ Deterministic reduction ]: 1, 2 or 3 threads give the same weights, bit for bit."""
    sizes = [30, 20, 10]
    xs, ys = rng.random((5, 16, 30)), rng.random((5, 16, 10))
    nets = []
    for t in (1, threads):
        np.random.seed(0)
        nets.append(Network(sizes))
        with DataParallel(nets[-1], threads=t) as dp:
            for _ in range(3):
                dp.update_mini_batches(xs, ys, 0.7)
    for a, b in zip(nets[0].weights + nets[0].biases, nets[1].weights + nets[1].biases):
        np.testing.assert_array_equal(a, b)


@pytest.mark.memory
def test_fit_bounds_every_thread_together(rng):
    """fit(bytes) on threads bounds the parameters, the gradient sum and every worker's step (memray)."""
    from fastckpt.report.measure import memray_peak
    sizes, batch, bound = [784, 256, 256, 256, 256, 10], 500, 20 * 2**20
    xs, ys = rng.random((4, batch, 784)), rng.random((4, batch, 10))
    net = NetworkWithCheckpointing(sizes, strategy=f"fit({bound})")
    with DataParallel(net, threads=2) as dp:
        dp.update_mini_batches(xs, ys, 0.1)                                  # warm-up
        predicted = dp.predicted_bytes(batch)

    def build_and_train():
        fresh = NetworkWithCheckpointing(sizes, strategy=f"fit({bound})")
        with DataParallel(fresh, threads=2) as dp:
            for _ in range(2):
                dp.update_mini_batches(xs, ys, 0.1)
    peak = memray_peak(build_and_train)
    # memray counts Python's objects one by one: two worker threads' states, frames and queues, ~110 KiB
    assert predicted["total"] <= bound and peak <= bound + 128 * 1024
    assert abs(peak - predicted["total"]) <= 128 * 1024, (peak, predicted)
    with pytest.raises(InfeasiblePlan, match=r"fit\(16MiB\) with 2 threads: the parameters, the gradient "
                       r"sum and 2 workers' steps need at least \d+ bytes"):
        DataParallel(NetworkWithCheckpointing(sizes, strategy="fit(16MiB)"), threads=2).predicted_bytes(batch)


def test_threads_the_machine_cannot_hold_are_refused_before_any_is_made():
    with pytest.raises(ValueError, match=r"^threads: 1000000 worker threads needs [\d.]+ GiB, more than half"):
        DataParallel(Network([784, 40, 10]), threads=10**6)


def test_one_thread_with_one_blas_thread_gives_the_bits_of_two(rng):
    """NOTE [ Deterministic reduction ]: at batch 100 OpenBLAS rounds the lab net's first GEMM differently on one
    thread and two, so one worker matches two (whose BLAS runs on one thread each) when its BLAS does too."""
    from fastckpt.kernels import blas_threads

    from fastckpt.engine import sharing
    xs, ys = rng.random((4, 100, 784)), rng.random((4, 100, 10))
    nets = []
    before = blas_threads()
    for threads, blas in ((1, 1), (2, before)):
        sharing.fix_threads(blas)
        try:
            np.random.seed(0)
            nets.append(Network([784, 40, 30, 10]))
            with DataParallel(nets[-1], threads=threads) as dp:
                for _ in range(2):
                    dp.update_mini_batches(xs, ys, 0.5)
        finally:
            sharing.fix_threads(before)
    np.testing.assert_array_equal(nets[0].params.flat, nets[1].params.flat)


def test_pace_runs_on_one_thread_while_that_is_faster_and_looks_again():
    from fastckpt.parallel.pace import FIRST, LOOK, PROBE, WARM, Pace

    pace, cost = Pace(2), {2: 1.0, 1: 1.5}                  # two threads faster at first

    def update(n=8):
        workers = pace.workers(n)
        pace.record(workers, cost[min(workers, n)] * n, n)
        return workers

    learn = [2] * (WARM + FIRST + 1) + [1] * (FIRST + 1)      # the first update on a count is not timed
    assert [update() for _ in range(len(learn))] == learn
    seen = [update() for _ in range(8 * LOOK)]
    runs = "".join(map(str, seen)).split("2")
    assert PROBE <= seen.count(1) <= 2 * PROBE and max(map(len, runs)) == PROBE   # short runs on the other count
    cost[2] = 2.0                                             # the machine changed: two threads slower
    seen = [update() for _ in range(12 * LOOK)]
    assert seen[-4 * LOOK:].count(2) <= PROBE                 # settled on one, looking at two now and then
    assert pace.workers(1) == 1 and update(1) == 1           # fewer minibatches than threads: not timed
    cost[2] = 1.0
    seen = [update() for _ in range(12 * LOOK)]
    assert seen[-4 * LOOK:].count(1) <= PROBE                 # and back
    assert Pace(1).workers(8) == 1


def test_an_adaptive_update_gives_the_bits_of_a_fixed_one_on_either_count(rng):
    sizes = [30, 20, 10]
    xs, ys = rng.random((4, 16, 30)), rng.random((4, 16, 10))
    weights, used = [], []
    for adapt in (False, True):
        np.random.seed(0)
        net = Network(sizes)
        with DataParallel(net, threads=2, adapt=adapt) as dp:
            for _ in range(16):
                dp.update_mini_batches(xs, ys, 0.5)
                used.append(dp.last_workers)
        weights.append([w.copy() for w in net.weights + net.biases])
    assert used[:16] == [2] * 16 and used[16:29] == [2] * 9 + [1] * 4     # pace.WARM, FIRST
    for a, b in zip(*weights):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError, match="adapt must be True or False, got 'yes'"):
        DataParallel(Network(sizes), adapt="yes")


def test_the_parallel_arguments_are_checked(rng):
    net = Network([6, 5, 3])
    with DataParallel(net, threads=2, adapt=np.True_) as dp:
        assert dp._pace is not None
        for bad in (0, False, -1):
            with pytest.raises((ValueError, TypeError), match="parallel_batches"):
                dp.SGD((rng.random((40, 6)), rng.random((40, 3))), 1, 10, 0.1, parallel_batches=bad, verbose=False)
        with pytest.raises(ValueError, match=r"x_batches hold minibatches of no samples, shape \(0, 6\)"):
            dp.update_mini_batches(rng.random((4, 0, 6)), rng.random((4, 0, 3)), 0.1)
