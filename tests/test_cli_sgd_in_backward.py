"""``train --sgd-in-backward`` and ``compare --sgd-in-backward``: the net the Python API trains with
``optimizer_in_backward=True``, the plan without gradient buffers, and the refusals where it cannot apply."""
import json
import sys

import numpy as np
import pytest
from cli_runner import run_cli

import fastckpt

FASTCKPT = [sys.executable, "-m", "fastckpt"]
SMALL = ["--sizes", "784,16,10", "--epochs", "1", "--batch-size", "20"]


def _run(*args, cwd):
    return run_cli(*args, cwd=cwd)


def test_train_trains_what_the_api_trains_with_the_optimizer_in_backward_and_resumes_with_it(tmp_path):
    assert _run("train", *SMALL, "--sgd-in-backward", "--save", "a.npz", cwd=tmp_path).returncode == 0
    (x, y), _ = fastckpt.load_mnist()
    np.random.seed(0)
    net = fastckpt.NetworkWithCheckpointing([784, 16, 10], optimizer_in_backward=True)
    net.SGD((x, y), 1, 20, 3.0, verbose=False)
    saved = fastckpt.load(tmp_path / "a.npz")
    assert saved.optimizer_in_backward
    for got, want in zip(saved.weights + saved.biases, net.weights + net.biases):
        np.testing.assert_array_equal(got, want)
    plain = fastckpt.Network([784, 16, 10])
    np.random.seed(0)
    plain = fastckpt.Network([784, 16, 10])
    plain.SGD((x, y), 1, 20, 3.0, verbose=False)
    assert any(not np.array_equal(a, b) for a, b in zip(saved.weights, plain.weights))   # the flag did something
    refused = _run("train", "--resume", "a.npz", "--epochs", "2", "--save", "a.npz", "--sgd-in-backward", cwd=tmp_path)
    assert refused.returncode == 0, refused.stderr                  # the same as the file's: fine
    assert fastckpt.load(tmp_path / "a.npz").optimizer_in_backward
    assert _run("train", *SMALL, "--save", "b.npz", cwd=tmp_path).returncode == 0
    other = _run("train", "--resume", "b.npz", "--epochs", "2", "--save", "b.npz", "--sgd-in-backward", cwd=tmp_path)
    assert other.returncode == 2
    assert "--optimizer-in-backward True differs from the --resume file's False" in other.stderr


@pytest.mark.parametrize("flags,said", [(["--threads", "2"], "with --threads or --parallel-batches"),
                                        (["--parallel-batches", "2"], "with --threads or --parallel-batches")])
def test_train_refuses_it_where_gradients_are_summed_first(tmp_path, flags, said):
    proc = _run("train", *SMALL, "--sgd-in-backward", *flags, cwd=tmp_path)
    assert proc.returncode == 2 and said in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_compare_plans_and_trains_every_run_without_gradient_buffers(tmp_path):
    sizes = [784, 64, 64, 64, 10]
    proc = _run("compare", "--sizes", ",".join(map(str, sizes)), "--epochs", "1", "--batch-size", "50",
                "--sgd-in-backward", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    runs = {r["name"]: r for r in json.loads(proc.stdout)["runs"]}
    for name, r in runs.items():
        strategy = "plain" if name == "plain" else name
        fused = fastckpt.plan(sizes, 50, strategy=strategy, optimizer_in_backward=True).bytes()["total"]
        assert r["predicted_bytes"] == fused, name
        assert fused < fastckpt.plan(sizes, 50, strategy=strategy).bytes()["total"]
