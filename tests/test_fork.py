"""os.fork() and a net's parameters' lock (NOTE [ A fork inside a step ]): a child forked while another thread
trained the net gets a clear error, not a hang; forked between steps, or by the training thread itself, it trains
the net, bit for bit as the parent would."""
import os
import threading

import numpy as np
import pytest

from fastckpt import Network
from fastckpt.core.locks import ParamsLock

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _in_child(work):
    """``work()`` in a forked child, which ends within 60 s whatever happens; what it returned, as text."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        threading.Timer(60, lambda: os._exit(3)).start()
        try:
            out = str(work())
        except BaseException as exc:                          # noqa: BLE001 - sent to the parent
            out = f"{type(exc).__name__}: {exc}"
        os.write(write, out.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        out = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, out
    return out


def _data(rng):
    return rng.random((20, 30)), np.eye(5)[rng.integers(0, 5, 20)]


def test_a_child_forked_while_another_thread_trains_the_net_is_refused_not_hung(rng):
    """The other thread is inside its SGD run (held in on_epoch, so the fork lands there every time)."""
    np.random.seed(0)
    net = Network([30, 200, 200, 5])
    x, y = _data(rng)
    inside, stop = threading.Event(), threading.Event()

    def hold(epoch, updates):
        inside.set()
        stop.wait(60)
    trainer = threading.Thread(target=lambda: net.SGD((x, y), 2, 10, 0.1, verbose=False, on_epoch=hold))
    trainer.start()
    assert inside.wait(60)
    try:
        out = _in_child(lambda: net.update_mini_batch(x, y, 0.1))
    finally:
        stop.set()
        trainer.join()
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


def test_the_lock_is_reentrant_and_records_its_holder():
    lock, inside = ParamsLock(), []
    with lock:
        with lock:
            inside.append(lock._owner == threading.get_ident())
        inside.append(lock._owner == threading.get_ident())
    assert inside == [True, True] and lock._owner is None and lock._depth == 0

    def take():
        with lock:
            inside.append(lock._owner == threading.get_ident())
    other = threading.Thread(target=take)
    other.start()
    other.join(10)
    assert inside == [True, True, True] and lock._owner is None   # free for another thread once left
