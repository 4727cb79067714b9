"""DataParallel's crew: flags waited on without the GIL, turns in order, errors, shutdown (NOTE [ Waking workers ])."""
import gc
import os
import threading
import time

import numpy as np
import pytest
from fastckpt.kernels import add_in_turn, new_gate, raise_flag, wait_flag

from fastckpt import Network
from fastckpt.parallel import DataParallel
from fastckpt.parallel.crew import Crew, Stopped


def test_wait_flag_returns_what_it_saw():
    flags, gate = np.array([3, 0, -1], dtype=np.int64), new_gate()
    assert wait_flag(flags, 0, 3, 10**9, gate, 0) == 3             # already there: no spinning
    assert wait_flag(flags, 0, 2, 10**9, gate, 0) == 3
    assert wait_flag(flags, 1, 1, 1000, gate, 0) == 0              # never raised: gives up after its turns
    assert wait_flag(flags, 2, 5, 10**9, gate, 0) == -1            # stopped: returns at once
    raise_flag(flags, 1, 7)
    assert flags[1] == 7


def test_a_flag_raised_by_another_thread_ends_the_spin():
    flags = np.zeros(1, dtype=np.int64)
    seen = []
    waiter = threading.Thread(target=lambda: seen.append(wait_flag(flags, 0, 1, 10**12, new_gate(), 0)))
    waiter.start()
    time.sleep(0.01)
    raise_flag(flags, 0, 1)
    waiter.join(10)
    assert not waiter.is_alive() and seen == [1]


def test_add_in_turn_adds_the_blocks_in_turn_only(rng):
    flags = np.zeros(1, dtype=np.int64)
    blocks = np.array([[0, 3], [5, 9]], dtype=np.int64)
    total, grads = rng.random(10), rng.standard_normal((3, 10))
    expected = np.zeros(10)                                  # k = 0 starts the sum from zero, gaps too
    before = total.copy()
    gate = new_gate()
    assert add_in_turn(flags, 1, total, grads[1], blocks, 100, gate, 0) == 0    # not its turn: nothing added
    np.testing.assert_array_equal(total, before)
    for k in range(3):
        assert add_in_turn(flags, k, total, grads[k], blocks, 1, gate, 0) == k + 1
        for lo, hi in blocks:
            expected[lo:hi] += grads[k, lo:hi]
    np.testing.assert_array_equal(total, expected)
    flags[0] = -1
    assert add_in_turn(flags, 3, total, grads[0], blocks, 10**9, gate, 0) == -1


def test_a_gated_kernel_leaves_the_gate_as_it_starts_and_takes_it_when_free_as_it_ends():
    """NOTE [ Turns at the GIL ]: ``gate = [holder, spins]``."""
    flags = np.array([3], dtype=np.int64)
    gate = np.array([0, 1000], dtype=np.int64)
    assert wait_flag(flags, 0, 3, 10, gate, 0) == 3 and gate[0] == 0      # left, then taken back
    assert wait_flag(flags, 0, 3, 10, gate, 1) == 3 and gate[0] == 0      # held by 0: 1 spins, goes on
    assert wait_flag(flags, 0, 9, 10, gate, 0) == 3 and gate[0] == -1     # gave up waiting: left, not taken
    gate[1] = 0
    assert wait_flag(flags, 0, 3, 10, gate, 0) == 3 and gate[0] == -1     # no spins: never taken
    total, g, blocks = np.zeros(4), np.ones(4), np.array([[0, 4]], dtype=np.int64)
    flags[0], gate[:] = 0, (1, 1000)
    assert add_in_turn(flags, 0, total, g, blocks, 10, gate, 2) == 1 and gate[0] == 1
    gate[0] = 2
    assert add_in_turn(flags, 1, total, g, blocks, 10, gate, 2) == 2 and gate[0] == 2
    np.testing.assert_array_equal(total, 2.0)


def test_a_gate_changes_no_number_and_a_holder_that_never_leaves_only_costs_a_spin(rng):
    net = Network([5, 4, 3])
    x, y = rng.random((6, 5)), rng.random((6, 3))
    plain = net.engine(6)
    plain.gradients(net.params, x, y)
    gated = net.engine(6)
    gated.gate, gated.me = np.array([1, 10**5], dtype=np.int64), 0    # thread 1 holds it and never leaves
    gated.gradients(net.params, x, y)
    assert gated.gate[0] == 1
    gated.gate[0] = -1
    gated.gradients(net.params, x, y)
    assert gated.gate[0] == 0                                          # free: taken at the end
    np.testing.assert_array_equal(gated.grad, plain.grad)


def _summing_job(crew, grads, total, delays):
    """Worker w adds minibatches w, w + workers, ... in turn, after the given delays."""
    blocks = np.array([[0, grads.shape[1]]], dtype=np.int64)
    turns = crew.turns()

    def work(w):
        for k in range(w, len(grads), crew.workers):
            time.sleep(delays[k])                 # holding the crew's gate: the others spin, then go on
            turns.add(total, k, grads[k], blocks, w)
        return w
    return work, turns


@pytest.mark.parametrize("workers", [2, 3])
def test_the_sum_is_in_minibatch_order_however_long_the_workers_take(rng, workers):
    """Delays long enough that waiting threads fall asleep (past the spin) and must be woken."""
    grads = rng.standard_normal((7, 50)) * 10.0 ** rng.integers(-8, 8, size=(7, 1))
    expected = np.zeros(50)
    for g in grads:
        expected = expected + g
    crew = Crew(workers)
    try:
        for delays in ([0.0] * 7, [0.02, 0, 0, 0.01, 0, 0, 0.005], list(rng.random(7) * 0.004)):
            total = np.full(50, np.nan)
            work, turns = _summing_job(crew, grads, total, delays)
            assert crew.run(work, workers, turns.fail) == list(range(workers))
            np.testing.assert_array_equal(total, expected)
    finally:
        crew.close()


def test_a_worker_error_wins_and_every_worker_ends_first(rng):
    crew = Crew(3)
    grads, total = rng.random((6, 4)), np.zeros(4)
    ended = []
    blocks = np.array([[0, 4]], dtype=np.int64)
    turns = crew.turns()

    def work(w):
        try:
            for k in range(w, 6, 3):
                if k == 4:
                    raise ValueError("minibatch 4 is bad")
                turns.add(total, k, grads[k], blocks, w)
        except BaseException:
            turns.fail()
            raise
        finally:
            ended.append(w)
    with pytest.raises(ValueError, match="minibatch 4 is bad"):
        crew.run(work, 3, turns.fail)
    assert sorted(ended) == [0, 1, 2]
    work, turns = _summing_job(crew, grads, total, [0.0] * 6)      # the crew still works afterwards
    crew.run(work, 3, turns.fail)
    np.testing.assert_array_equal(total, ((((grads[0] + grads[1]) + grads[2]) + grads[3]) + grads[4]) + grads[5])
    crew.close()


def test_a_stopped_turn_is_named():
    crew = Crew(2)
    turns = crew.turns()
    turns.fail()
    with pytest.raises(Stopped, match="minibatch 1: another worker failed first"):
        turns.add(np.zeros(2), 1, np.ones(2), np.array([[0, 2]], dtype=np.int64))
    crew.close()


def test_fewer_workers_than_threads_and_many_generations():
    crew = Crew(3)
    for n in range(200):
        used = 1 + n % 3
        assert crew.run(lambda w, n=n: (n, w), used, lambda: None) == [(n, w) for w in range(used)]
    crew.close()
    with pytest.raises(RuntimeError, match="closed"):
        crew.run(lambda w: w, 1, lambda: None)


def _crew_threads():
    return [t for t in threading.enumerate() if t.name.startswith("fastckpt-")]


def test_threads_end_on_close_and_when_the_crew_is_dropped():
    before = len(_crew_threads())
    crew = Crew(3)
    crew.run(lambda w: w, 3, lambda: None)
    assert len(_crew_threads()) == before + 2
    crew.close()
    assert len(_crew_threads()) == before
    crew = Crew(2)
    crew.run(lambda w: w, 2, lambda: None)
    del crew
    gc.collect()
    assert len(_crew_threads()) == before


def test_a_thread_the_system_cannot_start_is_named(monkeypatch):
    def refuse(self):
        raise RuntimeError("can't start new thread")
    monkeypatch.setattr(threading.Thread, "start", refuse)
    crew = Crew(3)
    with pytest.raises(RuntimeError, match=r"could not start worker thread 2 of 3 \(can't start new thread\)"):
        crew.run(lambda w: w, 3, lambda: None)
    monkeypatch.undo()
    assert crew.run(lambda w: w, 3, lambda: None) == [0, 1, 2]
    crew.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_gets_threads_of_its_own(rng):
    """The parent's threads do not exist in a child: its first update starts new ones (it used to hang)."""
    xs, ys = rng.random((4, 4, 6)), rng.random((4, 4, 3))
    np.random.seed(0)
    net = Network([6, 5, 3])
    with DataParallel(net, threads=2, adapt=False) as dp:
        dp.update_mini_batches(xs, ys, 0.5)
        expected = net.params.flat.copy()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:                                         # the child: one more update, its weights to the pipe
            code = 1
            try:
                dp.update_mini_batches(xs, ys, 0.5)
                if all(engine.gate is dp._crew.gate for _, engine in dp._engines.values()):   # the child's gate
                    os.write(write, net.params.flat.tobytes())
                    code = 0
            finally:
                os._exit(code)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            child = np.frombuffer(pipe.read(), dtype=net.params.flat.dtype)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0
        dp.update_mini_batches(xs, ys, 0.5)                  # the parent's crew still works
        np.testing.assert_array_equal(child, net.params.flat)
    assert not np.array_equal(expected, net.params.flat)


def _finishes(fn, within=120.0):
    """``fn()``'s result, run in a thread of its own: a hang fails the test instead of stopping the suite."""
    out = []
    thread = threading.Thread(target=lambda: out.append(_outcome(fn)), daemon=True)
    thread.start()
    thread.join(within)
    assert not thread.is_alive(), "hung"
    ok, value = out[0]
    if not ok:
        raise value
    return value


def _outcome(fn):
    try:
        return True, fn()
    except BaseException as exc:
        return False, exc


def _updates(dp, rng, counts, sleep=0.0):
    for n in counts:
        time.sleep(sleep)
        dp.update_mini_batches(rng.random((n, 8, 50)), rng.random((n, 8, 10)), 0.01)
    return dp.net.params.flat.copy()


def test_jobs_that_need_fewer_workers_then_more_give_the_bits_of_one_thread():
    """A worker left out of one job (or two) and asleep must still run the next that needs it (it used to
    hang, or read the results of a job it had not run)."""
    counts = [2, 1, 4, 2, 1, 3] * 40
    weights = []
    for threads in (1, 3):
        np.random.seed(0)
        with DataParallel(Network([50, 30, 10]), threads=threads, adapt=False) as dp:
            weights.append(_finishes(lambda dp=dp: _updates(dp, np.random.default_rng(1), counts, sleep=0.001)))
    np.testing.assert_array_equal(weights[0], weights[1])


def test_a_dropped_data_parallel_frees_its_threads_and_its_net():
    import weakref
    before = len(_crew_threads())
    np.random.seed(0)
    net = Network([50, 30, 10])
    dp = DataParallel(net, threads=3, adapt=False)
    _updates(dp, np.random.default_rng(0), [3])
    gone = weakref.ref(dp)
    del dp
    gc.collect()
    assert gone() is None and len(_crew_threads()) == before


def test_two_python_threads_sharing_one_data_parallel_take_turns():
    """Updates from two threads run one after the other (one used to reset the other's turns and hang)."""
    rng = np.random.default_rng(0)
    xs, ys = rng.random((4, 64, 50)), rng.random((4, 64, 10))
    np.random.seed(0)
    alone = Network([50, 30, 10])
    with DataParallel(alone, threads=2, adapt=False) as dp:
        for _ in range(40):
            dp.update_mini_batches(xs, ys, 0.1)
    np.random.seed(0)
    shared = Network([50, 30, 10])
    with DataParallel(shared, threads=2, adapt=False) as dp:
        def twenty():
            for _ in range(20):
                dp.update_mini_batches(xs, ys, 0.1)
        other = threading.Thread(target=twenty)
        other.start()
        _finishes(twenty)
        other.join(120)
        assert not other.is_alive()
    np.testing.assert_array_equal(alone.params.flat, shared.params.flat)   # the same data: order cannot matter


def test_close_from_another_thread_waits_for_the_update():
    rng = np.random.default_rng(0)
    xs, ys = rng.random((6, 2000, 50)), rng.random((6, 2000, 10))
    np.random.seed(0)
    net = Network([50, 30, 10])
    before = net.params.flat.copy()
    dp = DataParallel(net, threads=2, adapt=False)
    updating = threading.Thread(target=lambda: dp.update_mini_batches(xs, ys, 0.1))
    updating.start()
    time.sleep(0.001)
    _finishes(dp.close)
    updating.join(120)
    assert not updating.is_alive() and not np.array_equal(before, net.params.flat)
    with pytest.raises(RuntimeError, match="closed"):
        dp.update_mini_batches(xs, ys, 0.1)


def test_worker_zero_refused_its_step_stops_the_others(monkeypatch):
    """The caller's own worker failing before its first minibatch ends the turns (it used to hang)."""
    import fastckpt.parallel.threads as threads
    rng = np.random.default_rng(0)
    xs, ys = rng.random((4, 8, 50)), rng.random((4, 8, 10))
    np.random.seed(0)
    net = Network([50, 30, 10])
    before = net.params.flat.copy()
    with DataParallel(net, threads=2, adapt=False) as dp:
        def refuse(nbytes, what, name):
            raise ValueError(f"{name}: {what} does not fit")
        monkeypatch.setattr(threads, "check_fits", refuse)
        with pytest.raises(ValueError, match="threads: training on 2 threads does not fit"):
            _finishes(lambda: dp.update_mini_batches(xs, ys, 0.1))
        np.testing.assert_array_equal(before, net.params.flat)
        monkeypatch.undo()
        _finishes(lambda: dp.update_mini_batches(xs, ys, 0.1))


def test_an_interrupt_as_the_job_starts_lets_every_worker_end_first(monkeypatch):
    import fastckpt.parallel.crew as crew
    rng = np.random.default_rng(0)
    xs, ys = rng.random((4, 8, 50)), rng.random((4, 8, 10))
    weights = []
    for interrupt in (False, True):
        np.random.seed(0)
        net = Network([50, 30, 10])
        with DataParallel(net, threads=2, adapt=False) as dp:
            if interrupt:
                wake = crew._Shared.wake

                def interrupted(self, room=0, wake=wake):
                    monkeypatch.setattr(crew._Shared, "wake", wake)
                    raise KeyboardInterrupt
                monkeypatch.setattr(crew._Shared, "wake", interrupted)
                with pytest.raises(KeyboardInterrupt):
                    _finishes(lambda: dp.update_mini_batches(xs, ys, 0.1))
            for _ in range(2):
                _finishes(lambda: dp.update_mini_batches(xs, ys, 0.1))
        weights.append(net.params.flat.copy())
    np.testing.assert_array_equal(weights[0], weights[1])


def test_a_stop_during_anothers_add_is_not_written_over(rng):
    """A worker failed (minibatch 2: NaN) while the other added minibatch 1: the adder passed the turn on over
    the stop, then waited for minibatch 2's turn for good (8 of 10 runs hung on a net this size)."""
    np.random.seed(0)
    net = Network([200, 1000, 1000, 10])                 # a long add: a wide window for the stop
    xs, ys = rng.random((4, 10, 200)), rng.random((4, 10, 10))
    bad = xs.copy()
    bad[2, 0, 0] = np.nan

    def run():
        with DataParallel(net, threads=2, adapt=False) as dp:
            for _ in range(25):
                before = net.params.flat.copy()
                with pytest.raises(ValueError, match=r"x_batches\[2\]"):
                    dp.update_mini_batches(bad, ys, 0.1)
                np.testing.assert_array_equal(net.params.flat, before)
                dp.update_mini_batches(xs, ys, 0.1)
    _finishes(run, within=300)


@pytest.mark.parametrize("started", [True, False])
def test_an_interrupt_while_a_worker_thread_starts_leaves_one_thread_per_worker(rng, monkeypatch, started):
    """Ctrl-C inside Thread.start() (it waits for the new thread) left a running worker unrecorded, and the
    next update started a second worker 1: later updates raised Stopped or 'already running'."""
    real = threading.Thread.start

    def interrupted(thread):
        if started:
            real(thread)
        raise KeyboardInterrupt

    xs, ys = rng.random((4, 8, 50)), rng.random((4, 8, 10))
    with DataParallel(Network([50, 30, 10]), threads=2, adapt=False) as dp:
        monkeypatch.setattr(threading.Thread, "start", interrupted)
        with pytest.raises(KeyboardInterrupt):
            dp.update_mini_batches(xs, ys, 0.1)
        monkeypatch.setattr(threading.Thread, "start", real)
        for _ in range(5):
            dp.update_mini_batches(xs, ys, 0.1)
        assert len([t for t in threading.enumerate() if t.name == "fastckpt-1" and t.is_alive()]) >= 1
        assert len(dp._crew._threads) == 1 and dp._crew._threads[0].is_alive()
    assert not any(t.name.startswith("fastckpt-") and t.is_alive() for t in dp._crew._threads)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("other", [False, True])
def test_a_child_forked_while_another_thread_updates_is_refused_not_hung(rng, other):
    """The other thread updates through this DataParallel, or through another one of the same net."""
    xs, ys = rng.random((8, 10, 200)), rng.random((8, 10, 10))
    dp = DataParallel(Network([200, 100, 10]), threads=2, adapt=False)
    trainer_dp = DataParallel(dp.net, threads=2) if other else dp
    stop = threading.Event()

    def train():
        while not stop.is_set():
            trainer_dp.update_mini_batches(xs, ys, 0.1)
    trainer = threading.Thread(target=train)
    trainer.start()
    time.sleep(0.2)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:                                           # the child: a clear error, then a normal exit
        threading.Timer(60, lambda: os._exit(3)).start()
        message = b"no error"
        try:
            dp.update_mini_batches(xs, ys, 0.1)
        except RuntimeError as exc:
            message = str(exc).encode()
        dp.close()
        os.write(write, message)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        message = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    stop.set()
    trainer.join()
    dp.close()
    trainer_dp.close()
    assert os.waitstatus_to_exitcode(status) == 0
    assert "forked while another thread held this net's parameters" in message


def test_a_second_interrupt_while_the_workers_end_leaves_no_worker_in_the_next_sum(rng, monkeypatch, wrap_run_kernels):
    """Ctrl-C twice while the caller waited for worker 1: the second escaped with worker 1 still in the old
    job, which then added its stale gradient to the next update's sum (wrong bits, or Stopped, silently)."""
    import fastckpt.parallel.crew as crew

    xs, ys, xs2 = rng.random((2, 10, 200)), rng.random((2, 10, 10)), rng.random((2, 10, 200))
    nets = []
    for _ in range(2):
        np.random.seed(0)
        nets.append(Network([200, 1000, 1000, 10]))
    with DataParallel(nets[0], threads=2, adapt=False) as dp:
        dp.update_mini_batches(xs, ys, 0.1)
        one = nets[0].params.flat.copy()
        dp.update_mini_batches(xs2, ys, 0.1)
    real, left = crew._Shared.wait, [2]

    def wait(self, i, value, room=0, me=0):
        if threading.current_thread() is threading.main_thread() and i == 2 and left[0]:
            left[0] -= 1
            raise KeyboardInterrupt
        return real(self, i, value, room, me)

    def late(kernel, *args):                           # worker 1 still computes when the caller is interrupted
        if threading.current_thread() is not threading.main_thread():
            time.sleep(0.2)
        return kernel(*args)
    with DataParallel(nets[1], threads=2, adapt=False) as dp:
        dp.update_mini_batches(xs, ys, 0.1)
        monkeypatch.setattr(crew._Shared, "wait", wait)
        wrap_run_kernels(late)
        with pytest.raises(KeyboardInterrupt):
            dp.update_mini_batches(xs, ys, 0.1)
        monkeypatch.setattr(crew._Shared, "wait", real)
        wrap_run_kernels(None)
        assert left == [0]
        np.testing.assert_array_equal(nets[1].params.flat, one)                   # the interrupted one: not applied
        dp.update_mini_batches(xs2, ys, 0.1)
    np.testing.assert_array_equal(nets[1].params.flat, nets[0].params.flat)
