"""``fastckpt evaluate FILE`` and ``fastckpt predict FILE`` against the slow NumPy forward pass of tests/naive.py;
without ``--data`` they take the data FILE records, and ``--data embedded`` names the shipped digits everywhere."""
import json
import shutil
import sys

import numpy as np
import pytest
from cli_runner import run_cli
from naive import forward

import fastckpt

FASTCKPT = [sys.executable, "-m", "fastckpt"]


def _run(*args, cwd):
    return run_cli(*args, cwd=cwd)


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
    proc = _run("evaluate", "net.npz", "--split", split, "--data", "embedded", cwd=folder)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (f"net.npz: accuracy {correct / len(labels[split]):.4f} ({correct} of "
                           f"{len(labels[split])} {split} samples of the embedded digits)\n")


def test_predict_gives_the_slow_forward_pass_s_classes_on_stdout_in_a_file_and_from_a_npy(saved):
    folder, expected, _ = saved
    proc = _run("predict", "net.npz", "--data", "embedded", cwd=folder)
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_array_equal(np.array(proc.stdout.split(), dtype=int), expected["test"])
    assert proc.stderr == ("fastckpt predict: the classes of the 1000 test samples of the embedded digits, one per "
                           "line\n")
    assert len(set(expected["test"].tolist())) > 2
    assert _run("predict", "net.npz", "--data", "embedded", "--output", "p.npy", cwd=folder).returncode == 0
    np.testing.assert_array_equal(np.load(folder / "p.npy"), expected["test"])
    assert _run("predict", "net.npz", "--data", "embedded", "--output", "p.txt", "--split", "train",
                cwd=folder).returncode == 0
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
    (["predict", "net.npz", "--data", "embedded", "--output", "taken.txt"],
     "--output 'taken.txt' exists; pass --force to overwrite it"),
    # --output is checked before the prediction (the NaN in nan.npy, found by it, is not what is said) and named
    (["predict", "net.npz", "--data", "nan.npy", "--output", "/sys/p.txt"],
     "fastckpt predict: error: --output '/sys/p.txt': cannot write in '/sys': Permission denied"),
    (["predict", "net.npz", "--data", "nan.npy", "--output", "."],
     "fastckpt predict: error: --output '.': is a folder; name the file to write"),
    (["predict", "net.npz", "--data", "nan.npy", "--output", "no/such/p.npy"],
     "fastckpt predict: error: --output 'no/such/p.npy': no such folder 'no/such'"),
    (["predict", "net.npz", "--data", "nan.npy", "--output", ""], "fastckpt predict: error: --output '': name the "
                                                                  "file to write"),
    (["predict", "net.npz", "--data", "nan.npy", "--output", "taken.txt"],
     "fastckpt predict: error: --output 'taken.txt' exists; pass --force to overwrite it"),
    (["evaluate", "net.npz"], "FILE 'net.npz' records no training data (train --save records it; net.save does not): "
                              "give --data PATH, or --data embedded"),
    (["predict", "net.npz"], "FILE 'net.npz' records no training data"),
    (["predict", "net.npz", "--data", "huge.npy"], "row 1 makes the net's output nan: a value overflowed float64 "
                                                     "inside the net"),      # it used to print class 0, exit 0
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


# -- the data FILE was trained on ----------------------------------------------------------------
def _labelled(folder, name, x, y, xt, yt):
    np.savez(folder / name, x_train=x, y_train=y.argmax(axis=1), x_test=xt, y_test=yt.argmax(axis=1))
    return folder / name


@pytest.fixture(scope="module")
def trained_on_a_file(tmp_path_factory):
    """A net that train --save trained on data.npz, which is not the embedded digits (their test digits to train
    on, 500 of their training digits to test on), and the classes the slow forward pass gives that data."""
    folder = tmp_path_factory.mktemp("recorded")
    (x, y), (xt, yt) = fastckpt.load_mnist()
    _labelled(folder, "data.npz", xt, yt, x[:500], y[:500])
    proc = _run("train", "--sizes", "784,16,10", "--epochs", "2", "--batch-size", "20", "--data", "data.npz",
                "--save", "net.npz", "--json", cwd=folder)
    assert proc.returncode == 0, proc.stderr
    net = fastckpt.load(folder / "net.npz")
    classes = {"test": forward(net.weights, net.biases, x[:500])[-1].argmax(axis=1),
               "train": forward(net.weights, net.biases, xt)[-1].argmax(axis=1),
               "embedded": forward(net.weights, net.biases, xt)[-1].argmax(axis=1)}
    labels = {"test": y[:500].argmax(axis=1), "train": yt.argmax(axis=1)}
    return folder, classes, labels


@pytest.mark.parametrize("split", ["test", "train"])
def test_evaluate_without_data_judges_the_net_on_the_data_it_was_trained_on(trained_on_a_file, split):
    folder, classes, labels = trained_on_a_file
    correct = int((classes[split] == labels[split]).sum())
    proc = _run("evaluate", "net.npz", "--split", split, cwd=folder)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (f"net.npz: accuracy {correct / len(labels[split]):.4f} ({correct} of {len(labels[split])} "
                           f"{split} samples of {str(folder / 'data.npz')!r}, which it was trained on)\n")
    said = json.loads(_run("evaluate", "net.npz", "--split", split, "--json", cwd=folder).stdout)
    assert (said["data"], said["data_from"], said["correct"]) == (str(folder / "data.npz"), "FILE", correct)


def test_predict_without_data_gives_the_classes_of_the_data_it_was_trained_on(trained_on_a_file):
    folder, classes, _ = trained_on_a_file
    proc = _run("predict", "net.npz", cwd=folder)
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_array_equal(np.array(proc.stdout.split(), dtype=int), classes["test"])
    assert proc.stderr == (f"fastckpt predict: the classes of the 500 test samples of {str(folder / 'data.npz')!r}, "
                           "which it was trained on, one per line\n")
    embedded = _run("predict", "net.npz", "--data", "embedded", cwd=folder)          # the shipped test digits
    np.testing.assert_array_equal(np.array(embedded.stdout.split(), dtype=int), classes["embedded"])


def test_data_that_is_gone_or_changed_is_refused_naming_file_and_data(trained_on_a_file, tmp_path):
    folder, _, _ = trained_on_a_file
    shutil.copy(folder / "net.npz", tmp_path / "net.npz")
    recorded = str(folder / "data.npz")
    for command in ("evaluate", "predict"):
        shutil.move(recorded, folder / "away.npz")
        try:
            gone = _run(command, "net.npz", cwd=tmp_path)
        finally:
            shutil.move(folder / "away.npz", recorded)
        assert gone.returncode == 2 and gone.stdout == "", gone.stderr
        assert gone.stderr == (f"fastckpt {command}: error: FILE 'net.npz' was trained on {recorded!r}, which is not a "
                               "file or folder now: give --data PATH with the data to use\n")
    original = (folder / "data.npz").read_bytes()
    try:
        (x, y), (xt, yt) = fastckpt.load_mnist()
        _labelled(folder, "data.npz", xt[:900], yt[:900], x[:500], y[:500])
        changed = _run("evaluate", "net.npz", cwd=tmp_path)
    finally:
        (folder / "data.npz").write_bytes(original)
    assert changed.returncode == 2 and changed.stderr.count("\n") == 1
    assert f"FILE 'net.npz' was trained on {recorded!r}, whose contents have changed since: give --data" \
        in changed.stderr
    assert _run("evaluate", "net.npz", cwd=tmp_path).returncode == 0                 # the same bytes again


def test_a_net_trained_on_the_embedded_digits_is_evaluated_on_them(tmp_path):
    proc = _run("train", "--sizes", "784,8,10", "--epochs", "1", "--data", "embedded", "--save", "e.npz", "--json",
                cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    trained = json.loads(proc.stdout)["accuracies"][-1]
    assert fastckpt.load(tmp_path / "e.npz").training_state["data"] is None
    said = _run("evaluate", "e.npz", cwd=tmp_path).stdout
    assert said == (f"e.npz: accuracy {trained:.4f} ({round(trained * 1000)} of 1000 test samples of the embedded "
                    "digits, which it was trained on)\n")


@pytest.mark.parametrize("command", ["compare", "plan", "train", "profile", "evaluate", "predict"])
def test_every_command_that_takes_data_takes_embedded_and_a_folder_of_that_name_is_dot_slash(command, tmp_path,
                                                                                              monkeypatch):
    from fastckpt.cli.data import data_path, load_data
    from fastckpt.cli.parser import parser, settled
    from fastckpt.cli.paths import check_paths
    monkeypatch.chdir(tmp_path)                                       # no folder named embedded here
    file = ["net.npz"] if command in ("evaluate", "predict") else []
    args = settled(parser().parse_args([command, *file, "--data", "embedded"]))
    check_paths(args)
    assert data_path(args.data) is None
    (x, y), (xt, yt) = load_data(args.data, [784, 10])
    (ex, ey), (ext, eyt) = fastckpt.load_mnist(compact=True)
    assert np.array_equal(x.raw if hasattr(x, "raw") else x, ex.raw if hasattr(ex, "raw") else ex)
    assert np.array_equal(yt, eyt)
    (tmp_path / "embedded").mkdir()
    args = settled(parser().parse_args([command, *file, "--data", "./embedded"]))
    check_paths(args)
    with pytest.raises(FileNotFoundError, match=r"\./embedded has no train-images-idx3-ubyte"):
        load_data(args.data, [784, 10])
