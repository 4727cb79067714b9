"""``train --activation --init --optimizer --shuffle --validation``: the net the Python API trains with the
same options, bit for bit, resumed bit for bit, and refused where a mode cannot take them."""
import json
import sys

import numpy as np
import pytest
from cli_runner import run_cli

import fastckpt

FASTCKPT = [sys.executable, "-m", "fastckpt"]
DEEP = ["--sizes", "784,24,24,10", "--activation", "relu", "--init", "he", "--optimizer", "adam", "--eta", "0.001",
        "--batch-size", "20", "--shuffle", "5", "--validation", "0.1"]


def _run(*args, cwd):
    return run_cli(*args, cwd=cwd)


def test_train_trains_what_the_api_trains_with_the_same_options(tmp_path):
    proc = _run("train", *DEEP, "--epochs", "2", "--save", "a.npz", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    said = json.loads(proc.stdout)
    (x, y), test = fastckpt.load_mnist()
    np.random.seed(0)
    net = fastckpt.Network([784, 24, 24, 10], activation="relu", init="he", optimizer="adam")
    net.SGD((x, y), 2, 20, 0.001, test_data=test, verbose=False, shuffle=5, validation=0.1)
    saved = fastckpt.load(tmp_path / "a.npz")
    for got, want in zip(saved.weights + saved.biases, net.weights + net.biases):
        np.testing.assert_array_equal(got, want)
    assert said["accuracies"] == net.accuracies and said["training_loss"] == net.history["loss"]
    assert said["validation_accuracy"] == net.history["val_accuracy"] and said["updates"] == 2 * (3600 // 20)
    assert net.accuracies[-1] > 0.8                                       # it learns


def test_a_resumed_run_with_adam_shuffle_and_validation_goes_on_bit_for_bit(tmp_path):
    assert _run("train", *DEEP, "--epochs", "3", "--save", "whole.npz", cwd=tmp_path).returncode == 0
    assert _run("train", *DEEP, "--epochs", "2", "--save", "part.npz", cwd=tmp_path).returncode == 0
    resumed = _run("train", "--resume", "part.npz", "--epochs", "3", "--save", "part.npz", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    whole, part = fastckpt.load(tmp_path / "whole.npz"), fastckpt.load(tmp_path / "part.npz")
    for got, want in zip(part.weights + part.biases, whole.weights + whole.biases):
        np.testing.assert_array_equal(got, want)
    other = _run("train", "--resume", "part.npz", "--epochs", "4", "--save", "part.npz", "--validation", "0.2",
                 cwd=tmp_path)
    assert other.returncode == 2 and "--validation 0.2 differs from the --resume file's 0.1" in other.stderr


@pytest.mark.parametrize("flags,said", [
    (["--threads", "2", "--shuffle"], "--shuffle 0 trains one process's net; with --threads or --parallel-batches"),
    (["--threads", "2", "--validation", "0.1"], "--validation 0.1 trains one process's net"),
    (["--threads", "2", "--save-best", "lab"], "--save-best lab trains one process's net"),    # a file named lab
    (["--validation", "1.5"], "argument --validation: must be a fraction between 0 and 1 (exclusive), got '1.5'"),
    (["--activation", "softplus"], "argument --activation: invalid choice: 'softplus'"),
])
def test_options_a_mode_cannot_take_are_refused(tmp_path, flags, said):
    proc = _run("train", "--epochs", "1", *flags, cwd=tmp_path)
    assert proc.returncode == 2 and said in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
