"""os.fork() and a net's parameters' lock (NOTE [ A fork inside a step ]): a child forked while another thread
trained the net gets a clear error, not a hang; forked between steps, or by the training thread itself, it trains
the net, bit for bit as the parent would."""
import copy
import hashlib
import os
import signal
import threading
import time

import numpy as np
import pytest

from fastckpt import Network

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _in_child(work, thread=False):
    """``work()`` in a forked child (in a new thread of it with ``thread``), which ends within 60 s whatever
    happens; what it returned, as text."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        signal.alarm(60)                                      # not a Timer: its thread would take a stack
        out = []

        def run():
            try:
                out.append(str(work()))
            except BaseException as exc:                      # noqa: BLE001 - sent to the parent
                out.append(f"{type(exc).__name__}: {exc}")
        if thread:
            worker = threading.Thread(target=run)
            worker.start()
            worker.join()
        else:
            run()
        os.write(write, out[0].encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        out = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, out
    return out


def _forked_inside(run, work, thread=False):
    """``work()`` in a child forked while another thread is inside ``run(on_epoch=...)``, held in its first
    on_epoch (so the fork lands there every time); what it returned, as text (:func:`_in_child`)."""
    inside, stop = threading.Event(), threading.Event()

    def hold(epoch, updates):
        inside.set()
        stop.wait(60)
    trainer = threading.Thread(target=lambda: run(on_epoch=hold))
    trainer.start()
    assert inside.wait(60)
    try:
        return _in_child(work, thread)
    finally:
        stop.set()
        trainer.join()


def _data(rng):
    return rng.random((20, 30)), np.eye(5)[rng.integers(0, 5, 20)]


@pytest.mark.parametrize("thread", [False, True])
def test_a_child_forked_while_another_thread_trains_the_net_is_refused_not_hung(rng, thread):
    """The other thread is inside its SGD run (held in on_epoch, so the fork lands there every time).  A new
    thread of the child often gets that thread's ident (the C library reuses its stack): refused too."""
    np.random.seed(0)
    net = Network([30, 200, 200, 5])
    x, y = _data(rng)
    out = _forked_inside(lambda **kw: net.SGD((x, y), 2, 10, 0.1, verbose=False, **kw),
                         lambda: net.update_mini_batch(x, y, 0.1), thread)
    assert out.startswith("RuntimeError: this process was forked while another thread held this net's parameters")


def test_a_child_forked_between_steps_trains_like_the_parent(rng):
    np.random.seed(0)
    net = Network([30, 20, 5])
    x, y = _data(rng)
    net.update_mini_batch(x, y, 0.1)
    child = _in_child(lambda: (net.update_mini_batch(x, y, 0.1), net.params.flat.tobytes().hex())[1])
    net.update_mini_batch(x, y, 0.1)
    assert child == net.params.flat.tobytes().hex()


def test_a_child_forked_by_the_training_thread_itself_goes_on(rng):
    """From on_epoch, inside the run that holds the lock: the child holds it too and may use the net."""
    np.random.seed(0)
    net = Network([30, 20, 5])
    x, y = _data(rng)
    seen = []

    def on_epoch(epoch, *args, **kwargs):
        if epoch == 0:
            seen.append(_in_child(lambda: (net.update_mini_batch(x, y, 0.1), "trained")[1]))
    net.SGD((x, y), 2, 5, 0.1, verbose=False, on_epoch=on_epoch)
    assert seen == ["trained"]


def test_only_the_held_net_is_refused_and_at_every_use(rng):
    """A copy made before the fork has a lock of its own: it trains in the child, the held one never does."""
    np.random.seed(0)
    net = Network([30, 20, 5])
    spare = copy.deepcopy(net)
    x, y = _data(rng)

    def work():
        seen = []
        for use in (lambda: net.update_mini_batch(x, y, 0.1), lambda: net.feedforward(x), lambda: net.backprop(x, y),
                    lambda: net.weights[0], lambda: net.params.flat):
            try:
                use()
                seen.append("ran")
            except RuntimeError:
                seen.append("refused")
        spare.update_mini_batch(x, y, 0.1)
        return seen + [hashlib.sha256(spare.params.flat.tobytes()).hexdigest()]
    out = _forked_inside(lambda **kw: net.SGD((x, y), 1, 5, 0.1, verbose=False, **kw), work)
    spare.update_mini_batch(x, y, 0.1)
    assert out.split(", ")[:5] == ["['refused'"] + ["'refused'"] * 4, out
    assert hashlib.sha256(spare.params.flat.tobytes()).hexdigest() in out


def test_a_child_of_a_data_parallel_run_is_refused_in_a_new_thread_too(rng):
    from fastckpt.parallel import DataParallel

    np.random.seed(0)
    net = Network([30, 200, 200, 5])
    x, y = _data(rng)
    with DataParallel(net, threads=2) as dp:
        out = _forked_inside(lambda **kw: dp.SGD((x, y), 2, 5, 0.1, verbose=False, **kw),
                             lambda: dp.update_mini_batches([x[:10], x[10:]], [y[:10], y[10:]], 0.1), thread=True)
    assert out.startswith("RuntimeError: this process was forked while another thread"), out


def test_a_fork_waits_for_a_compilation_in_another_thread(rng):
    """Numba's compiler lock held by another thread at the fork would stay held in the child, and the child's
    first compilation or kernel-cache load (of a net built anew, as the error advises) would wait forever."""
    from numba.core.compiler_lock import global_compiler_lock

    taken, released = threading.Event(), []

    def compile_for_a_while():
        with global_compiler_lock:
            taken.set()
            time.sleep(0.3)
            released.append(time.monotonic())
    other = threading.Thread(target=compile_for_a_while)
    other.start()
    assert taken.wait(60)
    out = _in_child(lambda: (global_compiler_lock._lock.acquire(timeout=5), time.monotonic()))
    other.join()
    got, at = out.strip("()").split(", ")
    assert got == "True" and float(at) >= released[0]          # the child began once the lock was free


def test_a_forked_child_looks_at_its_own_cpu_time(rng):
    """The load sampler kept the parent's process: the child counted the parent's CPU time as its own, and
    raised NoSuchProcess once the parent had exited."""
    from fastckpt.engine.sharing import Sharing

    sharing = Sharing()
    sharing.look()
    parent = os.getpid()

    def child():
        first = sharing.look()                                  # a new start in the child
        return f"{first} {sharing.process.pid == os.getpid()} {sharing.process.pid != parent}"
    assert _in_child(child) == "None True True"


def test_a_fork_after_import_says_nothing():
    """The compile notice's fork hook makes the child a new lock: it made one by the parent lock's type, which
    Python 3.11 cannot make ('cannot create _thread.lock instances'), and every fork printed that traceback."""
    import subprocess
    import sys
    code = ("import os, fastckpt.sklearn, fastckpt\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    os._exit(0)\n"
            "os.waitpid(pid, 0)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
