"""``train`` shows a bar on a terminal and the lab's lines elsewhere; the accuracies are the same either way."""
import os
import pty
import subprocess
import sys

import pytest

TRAIN = [sys.executable, "-m", "fastckpt", "train", "--sizes", "784,12,10", "--epochs", "2", "--batch-size", "50"]


def _on_a_terminal(args, columns=None):
    """stderr on a pseudo-terminal (``columns`` wide, when given); (stdout, what the terminal showed)."""
    main, side = pty.openpty()
    if columns is not None:
        import fcntl
        import struct
        import termios
        fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=side, text=True)
    os.close(side)
    shown = b""
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:                                  # the child closed its end
            break
        if not chunk:
            break
        shown += chunk
    out, _ = proc.communicate(timeout=120)
    os.close(main)
    assert proc.returncode == 0, shown
    return out, shown.decode()


@pytest.mark.parametrize("mode", [[], ["--threads", "2"]])
def test_a_terminal_gets_a_bar_per_epoch_and_a_log_gets_the_lab_s_lines(mode):
    out, shown = _on_a_terminal(TRAIN + mode)
    assert "\r" in shown and "[" + "#" * 30 + "] 100%" in shown, shown
    accuracies = [line.split("test accuracy ")[1].split()[0] for line in shown.replace("\r", "\n").splitlines()
                  if "test accuracy" in line]
    assert [line.split()[1] for line in shown.replace("\r", "\n").splitlines() if "test accuracy" in line] == \
        ["epoch", "epoch"]
    assert "Epoch: " not in out                           # the bar replaces the lab's lines, not doubles them
    logged = subprocess.run(TRAIN + mode, capture_output=True, text=True, timeout=120)
    assert logged.returncode == 0 and "\r" not in logged.stderr + logged.stdout
    lab = [line.split("Accuracy: ")[1] for line in logged.stdout.splitlines() if line.startswith("Epoch: ")]
    assert len(lab) == 2 and [f"{float(a):.4f}" for a in lab] == accuracies


SCRIPT = ("import numpy as np, fastckpt; (x, y), test = fastckpt.load_mnist(); np.random.seed(1); "
          "net = fastckpt.Network([784, 12, 10]); net.SGD((x[:1000], y[:1000]), 2, 50, 3.0, test_data=test{})")


@pytest.mark.parametrize("given", ["", ", progress='auto'"])
def test_sgd_draws_a_bar_on_a_terminal_and_wipes_it_before_the_lab_s_line(given):
    out, shown = _on_a_terminal([sys.executable, "-c", SCRIPT.format(given)])
    assert "[" + "#" * 30 + "] 100%" in shown and "epoch 2/2" in shown, shown
    assert shown.endswith("\r"), shown[-200:]                 # wiped: the terminal's line is empty again
    assert [line.split(",")[0] for line in out.splitlines()] == ["Epoch: 0", "Epoch: 1"]   # the lab's lines


def test_sgd_draws_no_bar_into_a_pipe_unless_asked(capfd):
    for given, bar in [("", False), (", progress=False", False), (", progress=True", True)]:
        proc = subprocess.run([sys.executable, "-c", SCRIPT.format(given)], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert ("] 100%" in proc.stderr) == bar, (given, proc.stderr)
        assert [line.split(",")[0] for line in proc.stdout.splitlines()] == ["Epoch: 0", "Epoch: 1"]


def test_a_progress_that_is_not_a_bar_or_a_callable_is_refused_before_training():
    import numpy as np

    import fastckpt
    net = fastckpt.Network([4, 3, 2])
    before = [w.copy() for w in net.weights]
    with pytest.raises(ValueError, match=r"progress must be 'auto', True, False, None or a callable.*'yes'"):
        net.SGD((np.zeros((4, 4)), np.zeros((4, 2))), 1, 2, 1.0, progress="yes")
    assert all(np.array_equal(a, b) for a, b in zip(before, net.weights))


def test_the_bar_never_wraps_on_a_narrow_terminal():
    """A bar wider than the terminal would wrap, and each redraw would leave a stale line behind."""
    _, shown = _on_a_terminal([sys.executable, "-c", SCRIPT.format("")], columns=40)
    drawn = shown.split("\r")
    assert any("epoch 1/2 [" in part for part in drawn), drawn
    assert max(len(part) for part in drawn) <= 39, max(drawn, key=len)
