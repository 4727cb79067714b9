"""Saves happen when the help says, in every mode, and never replace a file another process made meanwhile."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from test_mpi_faults import MPIEXEC

import fastckpt
from fastckpt.cli.resume import Saver

TRAIN = [sys.executable, "-m", "fastckpt", "train", "--sizes", "784,16,10", "--epochs", "500"]


@pytest.mark.skipif(MPIEXEC is None or not __import__("importlib").util.find_spec("mpi4py"),
                    reason="needs mpi4py and mpiexec (pip install mpi4py mpich)")
@pytest.mark.parametrize("mode", [["--mpi"], ["--pipeline", "2"], ["--tensor-parallel"]],
                         ids=["mpi", "pipeline", "tensor"])
def test_every_mode_saves_after_every_epoch(tmp_path, mode):
    out, path = tmp_path / "out", tmp_path / "net.npz"
    with open(out, "w") as stdout:
        job = subprocess.Popen([MPIEXEC, "-n", "2", *TRAIN, *mode, "--save", str(path)], stdout=stdout,
                               stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while "epoch 2/" not in out.read_text():
            assert time.monotonic() < deadline and job.poll() is None, "two epochs within 120 s"
            time.sleep(0.1)
        job.send_signal(signal.SIGTERM)
        job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
    state = fastckpt.load(path).training_state
    assert state["epochs_done"] >= 2 and len(state["accuracies"]) == state["epochs_done"]


def test_a_first_save_never_replaces_a_file_made_meanwhile(tmp_path):
    path = tmp_path / "new.npz"
    np.random.seed(0)
    net = fastckpt.Network([4, 3, 2])
    save = Saver(str(path), force=False)            # the run begins: no file there yet
    other = fastckpt.Network([4, 3, 2])
    other.save(path)                                           # another process saves first
    with pytest.raises(ValueError, match=r"a file appeared there after this run began \(another process\?\); "
                       r"not replaced"):
        save(lambda p, exclusive: net.save(p, exclusive=exclusive))
    np.testing.assert_array_equal(fastckpt.load(path).weights[0], other.weights[0])
    assert [f for f in os.listdir(tmp_path) if f != "new.npz"] == []          # no temporary left behind


def test_later_saves_of_a_run_replace_its_own_file(tmp_path):
    path = tmp_path / "run.npz"
    np.random.seed(0)
    net = fastckpt.Network([4, 3, 2])
    save = Saver(str(path), force=False)
    save(lambda p, exclusive: net.save(p, exclusive=exclusive))
    net.weights[0][0, 0] = 7.0
    save(lambda p, exclusive: net.save(p, exclusive=exclusive))
    assert fastckpt.load(path).weights[0][0, 0] == 7.0


def test_two_runs_saving_to_one_new_file_do_not_both_say_saved(tmp_path):
    runs = [subprocess.Popen([sys.executable, "-m", "fastckpt", "train", "--sizes", "784,16,10", "--epochs", "2",
                              "--save", "same.npz", "--json"], cwd=tmp_path, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [run.communicate(timeout=300) + (run.returncode,) for run in runs]
    assert sorted(code for _, _, code in results) == [0, 2], results          # one run saved, one was refused
    refused = next(err for _, err, code in results if code == 2)
    assert "not replaced" in refused or "exists; pass --force to overwrite it" in refused, refused
    saved = json.loads(next(out for out, _, code in results if code == 0))
    assert fastckpt.load(tmp_path / "same.npz").training_state["accuracies"] == saved["accuracies"]
