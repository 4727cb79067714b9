"""``fastckpt evaluate FILE`` and ``fastckpt predict FILE`` against the slow NumPy forward pass of tests/naive.py."""
import subprocess
import sys

import numpy as np
import pytest
from naive import forward

import fastckpt

FASTCKPT = [sys.executable, "-m", "fastckpt"]


def _run(*args, cwd):
    return subprocess.run([*FASTCKPT, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A net trained one epoch (so its answers are not all one class), saved, with the data it is judged on."""
    folder = tmp_path_factory.mktemp("use")
    (x, y), (xt, yt) = fastckpt.load_mnist()
    np.random.seed(3)
    net = fastckpt.Network([784, 20, 10])
    net.SGD((x, y), 1, 10, 3.0, verbose=False)
    net.save(folder / "net.npz")
    expected = {split: forward(net.weights, net.biases, data)[-1].argmax(axis=1)
                for split, data in (("test", xt), ("train", x))}
    labels = {"test": yt.argmax(axis=1), "train": y.argmax(axis=1)}
    return folder, expected, labels


@pytest.mark.parametrize("split", ["test", "train"])
def test_evaluate_counts_what_the_slow_forward_pass_gets_right(saved, split):
    folder, expected, labels = saved
    correct = int((expected[split] == labels[split]).sum())
    assert 0 < correct < len(labels[split])
    proc = _run("evaluate", "net.npz", "--split", split, cwd=folder)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (f"net.npz: accuracy {correct / len(labels[split]):.4f} ({correct} of "
                           f"{len(labels[split])} {split} samples)\n")


def test_predict_gives_the_slow_forward_pass_s_classes_on_stdout_in_a_file_and_from_a_npy(saved):
    folder, expected, _ = saved
    proc = _run("predict", "net.npz", cwd=folder)
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_array_equal(np.array(proc.stdout.split(), dtype=int), expected["test"])
    assert len(set(expected["test"].tolist())) > 2
    assert _run("predict", "net.npz", "--output", "p.npy", cwd=folder).returncode == 0
    np.testing.assert_array_equal(np.load(folder / "p.npy"), expected["test"])
    assert _run("predict", "net.npz", "--output", "p.txt", "--split", "train", cwd=folder).returncode == 0
    np.testing.assert_array_equal(np.loadtxt(folder / "p.txt", dtype=int), expected["train"])
    (_, _), (xt, _) = fastckpt.load_mnist()
    np.save(folder / "x.npy", xt[:7].astype(np.float32))
    proc = _run("predict", "net.npz", "--data", "x.npy", cwd=folder)
    np.testing.assert_array_equal(np.array(proc.stdout.split(), dtype=int), expected["test"][:7])


@pytest.mark.parametrize("args,said", [
    (["evaluate", "none.npz"], "FILE 'none.npz': no such file"),
    (["evaluate", "net.npz", "--data", "x.npy"], "a .npy array holds inputs without labels"),
    (["predict", "net.npz", "--data", "cols.npy"], "--data 'cols.npy': holds float64 of shape (3, 10); the net "
                                                     "takes rows of 784"),
    (["predict", "net.npz", "--data", "obj.npy"], "--data 'obj.npy': cannot read it as a .npy array"),
    (["predict", "net.npz", "--data", "nan.npy"], "holds NaN or inf"),
    (["predict", "net.npz", "--data", "huge.npy"], "row 1 makes the net's output nan: a value overflowed float64 "
                                                     "inside the net"),      # it used to print class 0, exit 0
    (["predict", "net.npz", "--output", "taken.txt"], "--output 'taken.txt' exists; pass --force to overwrite it"),
    (["evaluate", "notanet.npz"], "notanet.npz"),
])
def test_bad_input_is_one_line_naming_it(saved, args, said):
    folder, _, _ = saved
    np.save(folder / "x.npy", np.zeros((2, 784)))
    np.save(folder / "cols.npy", np.zeros((3, 10)))
    np.save(folder / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    np.save(folder / "nan.npy", np.full((2, 784), np.nan))
    np.save(folder / "huge.npy", np.vstack([np.zeros(784), np.full(784, 1e308)]))      # finite, but not in the net
    (folder / "taken.txt").write_text("mine\n")
    np.savez(folder / "notanet.npz", a=np.zeros(3))
    proc = _run(*args, cwd=folder)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and said in lines[0], proc.stderr
    assert (folder / "taken.txt").read_text() == "mine\n"
