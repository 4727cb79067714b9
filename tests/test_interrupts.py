"""Ctrl-C during a step with the optimizer in the backward pass: the step ends whole, then KeyboardInterrupt
(NOTE [ A whole step ]); a handler of the user's gets the signal after the step, an ignored one is dropped, and
a step in another thread is not touched."""
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from fastckpt import Network, NetworkWithCheckpointing

SIZES = [9, 8, 7, 6, 8, 5, 7, 4]


def _net(optimizer):
    np.random.seed(4)
    return NetworkWithCheckpointing(SIZES, strategy="revolve(2)", optimizer=optimizer, optimizer_in_backward=True)


def _data(seed):
    rng = np.random.default_rng(seed)
    return rng.random((6, 9)), np.eye(4)[rng.integers(0, 4, 6)]


def _state(net):
    return [np.array(a) for a in list(net.weights) + list(net.biases) + list(net.optimizer_state.buffers)]


class Interrupter:
    """Around the engine's run kernels: once armed, a real SIGINT is raised as the next call returns; ``calls``
    counts them."""

    def __init__(self):
        self.calls, self.armed = 0, False

    def __call__(self, kernel, *args):
        out = kernel(*args)
        self.calls += 1
        if self.armed:
            self.armed = False
            signal.raise_signal(signal.SIGINT)
        return out

    def arm(self):
        self.calls, self.armed = 0, True


@pytest.fixture
def interrupter(wrap_run_kernels):
    wrapper = Interrupter()
    wrap_run_kernels(wrapper)
    return wrapper


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
def test_ctrl_c_between_runs_ends_the_step_whole_then_raises(interrupter, optimizer):
    ref, net = _net(optimizer), _net(optimizer)
    for seed in range(3):                                        # the first step, and the later ones follow too
        x, y = _data(seed)
        ref.update_mini_batch(x, y, 0.05)
        runs = len(ref._engine.workspace.runs)
        assert runs > 1                                          # else there is no "between"
        interrupter.arm()
        with pytest.raises(KeyboardInterrupt):
            net.update_mini_batch(x, y, 0.05)
        assert interrupter.calls == runs                         # every run ran, then the interrupt
        assert net.optimizer_state.steps == ref.optimizer_state.steps == (0 if optimizer == "sgd" else seed + 1)
        for a, b in zip(_state(net), _state(ref)):
            np.testing.assert_array_equal(a, b)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_users_handler_gets_the_signal_once_after_the_step(interrupter):
    net, seen = _net("adam"), []

    def handler(signum, frame):
        seen.append((signum, interrupter.calls))
    old = signal.signal(signal.SIGINT, handler)
    try:
        interrupter.arm()
        net.update_mini_batch(*_data(0), 0.05)
        assert signal.getsignal(signal.SIGINT) is handler
    finally:
        signal.signal(signal.SIGINT, old)
    assert seen == [(signal.SIGINT, len(net._engine.workspace.runs))]


def test_an_ignored_sigint_stays_ignored(interrupter):
    ref, net = _net("adam"), _net("adam")
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        interrupter.arm()
        net.update_mini_batch(*_data(0), 0.05)
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, old)
    ref.update_mini_batch(*_data(0), 0.05)
    for a, b in zip(_state(net), _state(ref)):
        np.testing.assert_array_equal(a, b)


def test_a_step_in_another_thread_leaves_the_handlers_alone(wrap_run_kernels):
    ref, net, seen, errors = _net("momentum"), _net("momentum"), [], []

    def looking(kernel, *args):
        seen.append(signal.getsignal(signal.SIGINT))
        return kernel(*args)
    wrap_run_kernels(looking)

    def train():
        try:
            net.update_mini_batch(*_data(0), 0.05)
        except BaseException as exc:                             # noqa: BLE001 - shown below
            errors.append(exc)
    thread = threading.Thread(target=train)
    thread.start()
    thread.join()
    assert errors == [] and seen and all(h is signal.default_int_handler for h in seen)
    ref.update_mini_batch(*_data(0), 0.05)
    for a, b in zip(_state(net), _state(ref)):
        np.testing.assert_array_equal(a, b)


def test_a_sigint_left_to_the_system_ends_the_process_after_the_step(tmp_path):
    """With SIGINT at SIG_DFL the signal is raised again once the step is whole: the process dies of it then."""
    script = tmp_path / "dfl.py"
    script.write_text(f"""
import signal, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
import test_interrupts as t
import fastckpt.engine.engine as engine_module
real, wrapper = engine_module.runner, t.Interrupter()
engine_module.runner = lambda *a: (lambda *args, kernel=real(*a): wrapper(kernel, *args))
net = t._net("adam")
net.update_mini_batch(*t._data(0), 0.05)
runs = len(net._engine.workspace.runs)
signal.signal(signal.SIGINT, signal.SIG_DFL)
def counting(kernel, *args):
    out = wrapper(kernel, *args)
    print(wrapper.calls, runs, flush=True)
    return out
engine_module.runner = lambda *a: (lambda *args, kernel=real(*a): counting(kernel, *args))
wrapper.arm()
net.update_mini_batch(*t._data(1), 0.05)
print("survived", flush=True)
""")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGINT, done.stderr
    lines = done.stdout.split()
    assert "survived" not in lines and lines[-2] == lines[-1] != "1"     # died after the step's last run


@pytest.mark.parametrize("kwargs", [{}, {"optimizer": "adam", "optimizer_in_backward": True}])
def test_a_flood_of_ctrl_c_never_leaves_a_lock_taken(kwargs):
    """SIGINTs at random moments of many small steps: after each KeyboardInterrupt the engine and the
    parameters are free (a lock taken, then wrapped in Python, stayed taken when the interrupt fell between
    the two: every later step was refused as "already running").  The handler raises only while a step is
    armed, so the checks themselves are not interrupted."""
    np.random.seed(0)
    net = Network([6, 5, 4, 3], **kwargs)
    x, y = np.random.rand(4, 6), np.eye(3)[[0, 1, 2, 0]]
    net.update_mini_batch(x, y, 0.01)
    armed, stop, leaks, interrupts = [False], threading.Event(), [], [0]

    def handler(signum, frame):
        if armed[0]:
            armed[0] = False
            raise KeyboardInterrupt

    def send():
        while not stop.is_set():
            time.sleep(random.random() * 0.0004)
            os.kill(os.getpid(), signal.SIGINT)

    def free(lock, out):
        out.append(lock.acquire(timeout=1))
        if out[-1]:
            lock.release()
    old = signal.signal(signal.SIGINT, handler)
    sender = threading.Thread(target=send, daemon=True)
    try:
        sender.start()
        end = time.monotonic() + 4
        while time.monotonic() < end and not leaks:
            try:
                armed[0] = True
                net.update_mini_batch(x, y, 0.01)
                armed[0] = False
            except KeyboardInterrupt:
                armed[0] = False
                interrupts[0] += 1
            if net._engine._busy.locked():
                leaks.append("the engine's lock")
            out = []
            checker = threading.Thread(target=free, args=(net.params.lock, out))
            checker.start()
            checker.join()
            if out != [True]:
                leaks.append("the parameters' lock")
    finally:
        stop.set()
        sender.join()
        signal.signal(signal.SIGINT, old)
    assert leaks == [] and interrupts[0] > 50
