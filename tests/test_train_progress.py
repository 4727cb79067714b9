"""``train`` shows a bar on a terminal and the lab's lines elsewhere; the accuracies are the same either way."""
import os
import pty
import subprocess
import sys

import pytest

TRAIN = [sys.executable, "-m", "fastckpt", "train", "--sizes", "784,12,10", "--epochs", "2", "--batch-size", "50"]


def _on_a_terminal(args):
    """stderr on a pseudo-terminal; (stdout, what the terminal showed)."""
    main, side = pty.openpty()
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
