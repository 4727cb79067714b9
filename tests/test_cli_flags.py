"""Flags that would change nothing are refused, not ignored (exit 2, one line naming the flag)."""
import subprocess
import sys

import pytest

TRAIN = [sys.executable, "-m", "fastckpt", "train", "--epochs", "1"]


@pytest.mark.parametrize("flags, said", [
    (["--micro-batches", "3"], "--micro-batches 3 is an option of --pipeline P; without --pipeline it would change"),
    (["--schedule", "1f1b"], "--schedule 1f1b is an option of --pipeline P"),
    (["--data-parallel", "2"], "--data-parallel 2 is an option of --pipeline P or --tensor-parallel; without them it "
                               "would change nothing"),
    (["--mpi", "--data-parallel", "2"], "--data-parallel 2 is an option of --pipeline P or --tensor-parallel"),
    (["--transport", "int8"], "--transport int8 is an option of --pipeline P"),
    (["--partition", "2,1"], "--partition 2,1 is an option of --pipeline P"),
    (["--mpi", "--transport", "float16"], "--transport float16 is an option of --pipeline P"),
    (["--tensor-parallel", "--max-memory", "1KiB"], "fit(1KiB): [784, 40, 30, 10] at 10 rows a replica needs at "
                                                     "least 602880 bytes (588.75 KiB) on its widest tensor shard"),
    (["--tensor-parallel", "--strategy", "revolve(2)"], "strategy revolve(2) does not apply to tensor parallelism, "
                                                        "which recomputes each dropped state once"),
])
@pytest.mark.sweep(first=4)
def test_a_flag_its_mode_does_not_use_is_refused(flags, said):
    proc = subprocess.run([*TRAIN, *flags], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("fastckpt train: error: ") and said in proc.stderr, \
        proc.stderr
    assert proc.stderr.count("\n") == 1 and "epoch 1/" not in proc.stdout
