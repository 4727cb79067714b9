"""Flags that would change nothing are refused, not ignored (exit 2, one line naming the flag)."""
import subprocess
import sys

import pytest

TRAIN = [sys.executable, "-m", "fastckpt", "train", "--epochs", "1"]


@pytest.mark.parametrize("flags, said", [
    (["--micro-batches", "3"], "--micro-batches 3 is an option of training over MPI ranks (--data-parallel, "
                               "--pipeline, --tensor-parallel); on one process it would change nothing"),
    (["--schedule", "1f1b"], "--schedule 1f1b is an option of training over MPI ranks"),
    (["--data-parallel", "2"], "--data-parallel 2 needs 2 ranks (mpiexec -n 2), got 1"),
    (["--mpi", "--data-parallel", "2"], "--mpi is --data-parallel over every rank of the job; it does not combine "
                                        "with --data-parallel, --pipeline or --tensor-parallel"),
    (["--transport", "int8"], "--transport int8 is an option of training over MPI ranks"),
    (["--partition", "2,1"], "--partition 2,1 is an option of training over MPI ranks"),
    (["--mpi", "--transport", "float16"], "--transport float16 is an option of --pipeline P; without it it would "
                                          "change nothing"),
    (["--tensor-parallel", "--max-memory", "1KiB"], "--max-memory 1KiB: this rank's part of the net at 10 rows a pass "
                                                     "holds at least 860288 bytes (840.12 KiB) with its gradient sum "
                                                     "and message buffers"),
])
@pytest.mark.sweep(first=4)
def test_a_flag_its_mode_does_not_use_is_refused(flags, said):
    proc = subprocess.run([*TRAIN, *flags], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("fastckpt train: error: ") and said in proc.stderr, \
        proc.stderr
    assert proc.stderr.count("\n") == 1 and "epoch 1/" not in proc.stdout
