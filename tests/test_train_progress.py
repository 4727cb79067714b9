"""``train`` prints the same line per epoch on a terminal and in a pipe, and a bar with the running loss and the time
left on a terminal; ``SGD`` keeps the lab's lines and draws its bar on a terminal."""
import os
import pty
import re
import subprocess
import sys

import pytest
from cli_runner import run_cli

TRAIN = [sys.executable, "-m", "fastckpt", "train", "--sizes", "784,12,10", "--epochs", "2", "--batch-size", "50"]


def _on_a_terminal(args, columns=None, stdout_too=False):
    """stderr (and stdout, with ``stdout_too``) on a pseudo-terminal (``columns`` wide, when given); (stdout,
    what the terminal showed)."""
    main, side = pty.openpty()
    if columns is not None:
        import fcntl
        import struct
        import termios
        fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    proc = subprocess.Popen(args, stdout=side if stdout_too else subprocess.PIPE, stderr=side, text=True)
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
    return out or "", shown.decode()


def _epoch_lines(text):
    """The per-epoch lines, their times left out: ``epoch 1/2: test accuracy ...``."""
    lines = [line.split("\r")[-1] for line in text.replace("\r\n", "\n").split("\n")]   # after a wiped bar
    return [re.sub(r" \(\d+\.\d s\)$", "", line) for line in lines if re.match(r"epoch \d+/\d+: ", line)]


@pytest.mark.parametrize("mode", [[], ["--threads", "2"]])
def test_train_prints_one_line_per_epoch_from_1_on_a_terminal_and_in_a_pipe_and_a_bar_only_on_a_terminal(mode):
    _, shown = _on_a_terminal(TRAIN + mode + ["--validation", "0.1"] * (not mode), stdout_too=True)
    logged = run_cli(*TRAIN[3:], *mode, *["--validation", "0.1"] * (not mode))
    assert logged.returncode == 0 and "\r" not in logged.stderr + logged.stdout and "ETA" not in logged.stderr
    assert "Epoch: " not in logged.stdout + shown                         # the lab's lines are the API's
    lines = _epoch_lines(logged.stdout)
    assert lines == _epoch_lines(shown) and len(lines) == 2, (lines, shown)
    bars = [part for part in shown.split("\r") if "] " in part and "ETA" in part]
    assert any("[" + "#" * 30 + "] 100%" in bar for bar in bars), shown
    times = [float(t) for t in re.findall(r"^epoch \d/2: .* \((\d+\.\d) s\)$", logged.stdout, re.M)]
    total = float(re.search(r", (\d+\.\d) s in all", logged.stdout).group(1))
    assert len(times) == 2 and sum(times) <= total + 0.2                  # each epoch's own time, not a running sum
    if not mode:                                                           # the API's numbers, rounded alike
        import numpy as np

        import fastckpt
        (x, y), test = fastckpt.load_mnist()
        np.random.seed(0)
        net = fastckpt.Network([784, 12, 10])
        net.SGD((x, y), 2, 50, 3.0, test_data=test, verbose=False, validation=0.1)
        assert lines == [f"epoch {j + 1}/2: test accuracy {a:.4f}, training loss {loss:.4g}, validation loss "
                         f"{vl:.4g}, validation accuracy {v:.4f}"
                         for j, (a, loss, vl, v) in enumerate(zip(net.accuracies, net.history["loss"],
                                                                  net.history["val_loss"],
                                                                  net.history["val_accuracy"]))]
        assert all(re.search(r"% loss \d+(\.\d+)? ETA (\d+ s|\d+:\d\d)$", bar) for bar in bars), bars   # running loss


def test_a_resumed_run_counts_its_epochs_on_from_the_file_s(tmp_path):
    first = run_cli(*TRAIN[3:], "--save", tmp_path / "n.npz")
    assert first.returncode == 0, first.stderr
    resumed = run_cli("train", "--resume", tmp_path / "n.npz", "--epochs", "3", "--save", tmp_path / "n.npz")
    assert resumed.returncode == 0, resumed.stderr
    assert [line.split(":")[0] for line in _epoch_lines(resumed.stdout)] == ["epoch 3/3"]


def test_the_time_left_reads_as_a_clock():
    from fastckpt.engine.progress import clock
    assert [clock(s) for s in (0.4, 42, 59.6, 185, 3725)] == ["0 s", "42 s", "1:00", "3:05", "1:02:05"]


SCRIPT = ("import numpy as np, fastckpt; (x, y), test = fastckpt.load_mnist(); np.random.seed(1); "
          "net = fastckpt.Network([784, 12, 10]); net.SGD((x[:1000], y[:1000]), 2, 50, 3.0, test_data=test{})")


@pytest.mark.parametrize("given", ["", ", progress='auto'"])
def test_sgd_draws_a_bar_on_a_terminal_and_wipes_it_before_the_lab_s_line(given):
    out, shown = _on_a_terminal([sys.executable, "-c", SCRIPT.format(given)])
    assert "[" + "#" * 30 + "] 100%" in shown and "epoch 2/2" in shown, shown
    assert shown.endswith("\r"), shown[-200:]                 # wiped: the terminal's line is empty again
    assert [line.split(",")[0] for line in out.splitlines()] == ["Epoch: 0", "Epoch: 1"]   # the lab's lines


def test_sgd_draws_no_bar_into_a_pipe_unless_asked(capfd):
    import numpy as np

    import fastckpt
    (x, y), test = fastckpt.load_mnist()
    for given, bar in [({}, False), ({"progress": False}, False), ({"progress": True}, True)]:
        np.random.seed(1)
        fastckpt.Network([784, 12, 10]).SGD((x[:1000], y[:1000]), 2, 50, 3.0, test_data=test, **given)
        out, err = capfd.readouterr()
        assert ("] 100%" in err) == bar, (given, err)
        assert [line.split(",")[0] for line in out.splitlines()] == ["Epoch: 0", "Epoch: 1"]


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
