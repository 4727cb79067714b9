"""Saving, loading and resuming: bit for bit, versioned, atomic, and loud about bad files; labels and predict."""
import copy
import json
import os
import pickle

import numpy as np
import pytest
from cli_runner import run_cli

import fastckpt
from fastckpt import Network, NetworkWithCheckpointing
from fastckpt.core.fileformat import FORMAT_VERSION


def _data(rng, n=120, n_in=12, n_out=4):
    x = rng.random((n, n_in))
    y = np.eye(n_out)[rng.integers(0, n_out, n)]
    return x, y


def _same(a, b):
    for p, q in zip(a.weights + a.biases, b.weights + b.biases):
        assert p.dtype == q.dtype
        np.testing.assert_array_equal(p, q)


def _rng_equal(a, b):
    return all(np.array_equal(p, q) if isinstance(p, np.ndarray) else p == q for p, q in zip(a, b))


# -- save -> load -> go on ----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind", ["plain", "revolve(1)", "every_nth(2)-in-backward"])
@pytest.mark.sweep('plain-float64', 'every_nth(2)-in-backward-float32')
def test_save_load_and_go_on_equals_the_uninterrupted_run(tmp_path, rng, dtype, kind):
    x, y = _data(rng)
    strategy = kind.split("-")[0]
    kwargs = dict(dtype=dtype, loss="cross_entropy", l2=(1e-3, 0.0, 2e-3), optimizer_in_backward="in" in kind)
    np.random.seed(3)
    whole = (Network([12, 9, 7, 4], **kwargs) if strategy == "plain"
             else NetworkWithCheckpointing([12, 9, 7, 4], strategy=strategy, **kwargs))
    part = copy.deepcopy(whole)
    whole.SGD((x, y), 5, 10, 0.7, verbose=False)
    part.SGD((x, y), 2, 10, 0.7, verbose=False)
    before = np.random.get_state()
    path = part.save(tmp_path / "net")
    assert path == str(tmp_path / "net.npz") and os.listdir(tmp_path) == ["net.npz"]
    loaded = fastckpt.load(path)
    assert _rng_equal(np.random.get_state(), before)               # loading draws nothing
    assert type(loaded) is type(whole) and str(loaded.strategy) == strategy
    assert (loaded.sizes, loaded.dtype, loaded.loss, loaded.l2, loaded.optimizer_in_backward) == \
        (part.sizes, part.dtype, part.loss, part.l2, part.optimizer_in_backward)
    _same(loaded, part)
    loaded.SGD((x, y), 3, 10, 0.7, verbose=False)
    _same(loaded, whole)


def test_the_file_is_documented_npz_with_its_metadata(tmp_path):
    np.random.seed(0)
    net = NetworkWithCheckpointing([5, 4, 3], strategy="budget(3KiB, once)", dtype=np.float32, l2=0.5)
    state = {"epochs_done": 2, "rng": np.random.get_state(), "note": "mine"}
    path = net.save(tmp_path / "n.npz", training=state)
    with np.load(path, allow_pickle=False) as f:                   # no pickle needed to read it
        assert sorted(f.files) == ["biases_0", "biases_1", "meta", "rng_keys", "weights_0", "weights_1"]
        meta = json.loads(str(f["meta"]))
        assert f["weights_1"].shape == (3, 4) and f["biases_1"].shape == (3, 1) and f["weights_1"].dtype == np.float32
    assert meta == {"format": "fastckpt-network", "version": FORMAT_VERSION, "fastckpt_version": fastckpt.__version__,
                    "sizes": [5, 4, 3], "dtype": "float32", "loss": "quadratic", "l2": [0.5, 0.5],
                    "strategy": "budget(3KiB, once)", "optimizer_in_backward": False, "activation": ["sigmoid"],
                    "optimizer": {"name": "sgd"}, "optimizer_steps": 0, "training": {"epochs_done": 2, "note": "mine",
                                 "rng": {"pos": state["rng"][2], "has_gauss": state["rng"][3],
                                         "cached_gaussian": state["rng"][4]}}}
    loaded = fastckpt.load(path)
    assert loaded.training_state["epochs_done"] == 2 and _rng_equal(loaded.training_state["rng"], state["rng"])


def test_a_training_state_prints_in_a_few_lines_and_its_rng_still_sets_numpy_s_state(tmp_path):
    """The 624 key words of numpy's state are in the loaded tuple, not in what print shows."""
    np.random.seed(7)
    np.random.random(3)
    saved = np.random.get_state()
    path = Network([5, 3]).save(tmp_path / "n.npz", training={"epochs_done": 1, "rng": saved})
    state = fastckpt.load(path).training_state
    shown = repr(state)
    assert len(shown) < 200 and f"pos {saved[2]}" in shown and str(saved[1][0]) not in shown, shown
    for kept in (state, copy.deepcopy(state), pickle.loads(pickle.dumps(state))):
        assert len(repr(kept)) < 200
        np.random.seed(0)
        np.random.set_state(kept["rng"])
        assert _rng_equal(np.random.get_state(), saved)
        drawn = np.random.random(4)
        np.random.set_state(saved)
        np.testing.assert_array_equal(drawn, np.random.random(4))


def test_a_version_0_file_from_the_old_train_save_loads(tmp_path):
    np.random.seed(1)
    net = Network([6, 5, 2], dtype=np.float32)
    np.savez(tmp_path / "old.npz", *net.weights, *net.biases)       # what train --save wrote before
    loaded = fastckpt.load(tmp_path / "old.npz")
    assert loaded.sizes == [6, 5, 2] and loaded.dtype == np.float32 and loaded.training_state is None
    _same(loaded, net)


@pytest.mark.parametrize("activation", ["tanh", "relu", ["relu", "tanh"]])
def test_the_activation_is_saved_and_the_loaded_net_computes_the_same(tmp_path, rng, activation):
    np.random.seed(4)
    net = NetworkWithCheckpointing([6, 5, 4, 3], strategy="sqrt", activation=activation, loss="cross_entropy")
    loaded = fastckpt.load(net.save(tmp_path / "a.npz"))
    x = rng.random((7, 6))
    names = [activation] * 2 if isinstance(activation, str) else activation
    assert loaded.activation == tuple(names)
    np.testing.assert_array_equal(loaded.feedforward(x), net.feedforward(x))


@pytest.mark.parametrize("optimizer", ["momentum", "adam", "adamw"])
def test_the_optimizer_and_its_state_are_saved_and_training_goes_on_bit_for_bit(tmp_path, rng, optimizer):
    x, y = rng.random((6, 5)), rng.random((6, 3))
    np.random.seed(3)
    net = NetworkWithCheckpointing([5, 4, 4, 3], strategy="sqrt", optimizer=optimizer, activation="relu", init="he",
                                   dtype=np.float32)
    for _ in range(4):
        net.update_mini_batch(x, y, 0.01)
    path = net.save(tmp_path / "o.npz")
    with np.load(path, allow_pickle=False) as f:
        names = net.optimizer.state_names
        assert sorted(f.files) == sorted(["meta"] + [f"{kind}_{i}" for kind in ("weights", "biases") for i in range(3)]
                                         + [f"{n}_{kind}_{i}" for n in names for kind in ("weights", "biases")
                                            for i in range(3)])
        assert f[f"{names[-1]}_biases_2"].shape == (3, 1) and f[f"{names[-1]}_weights_2"].dtype == np.float32
    loaded = fastckpt.load(path)
    assert loaded.optimizer == net.optimizer and loaded.optimizer_state.steps == 4
    for _ in range(3):
        net.update_mini_batch(x, y, 0.01)
        loaded.update_mini_batch(x, y, 0.01)
    _same(loaded, net)
    for a, b in zip(loaded.optimizer_state.buffers, net.optimizer_state.buffers):
        np.testing.assert_array_equal(a, b)


def test_a_version_2_file_without_an_optimizer_trains_by_sgd(tmp_path):
    path = Network([5, 4, 3], optimizer="adam").save(tmp_path / "n.npz")
    with np.load(path) as f:
        arrays = {k: f[k] for k in f.files if not k.startswith(("m_", "v_"))}
    meta = json.loads(str(arrays["meta"]))
    del meta["optimizer"], meta["optimizer_steps"]
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez(path, **arrays)
    loaded = fastckpt.load(path)
    assert loaded.optimizer.name == "sgd" and loaded.optimizer_state.buffers == []


def test_a_version_1_file_loads_as_a_sigmoid_net(tmp_path, rng):
    """What fastckpt 0.3 wrote: no activation in the metadata, version 1."""
    np.random.seed(1)
    net = NetworkWithCheckpointing([6, 5, 4, 2], strategy="sqrt")
    path = net.save(tmp_path / "v1.npz")
    with np.load(path) as f:
        arrays = {k: f[k] for k in f.files}
    meta = json.loads(str(arrays["meta"]))
    del meta["activation"], meta["optimizer"], meta["optimizer_steps"]
    meta["version"] = 1
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez(path, **arrays)
    loaded = fastckpt.load(path)
    assert loaded.activation == ("sigmoid", "sigmoid") and str(loaded.strategy) == "sqrt"
    assert loaded.optimizer.name == "sgd"
    _same(loaded, net)


def test_the_write_is_atomic(tmp_path, monkeypatch):
    target = tmp_path / "w.npz"
    Network([3, 2]).save(target)
    old = target.read_bytes()

    def dies_half_way(f, **arrays):
        f.write(b"PK half a zip")
        raise KeyboardInterrupt
    monkeypatch.setattr(np, "savez", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        Network([3, 2]).save(target)
    assert target.read_bytes() == old and os.listdir(tmp_path) == ["w.npz"]


# -- bad files: a clear error, never a wrong net ----------------------------------------------------
def _rewrite(path, **changes):
    with np.load(path) as f:
        arrays = {k: f[k] for k in f.files}
    meta = json.loads(str(arrays["meta"]))
    for key, value in changes.items():
        if key == "meta":
            meta.update(value)
        elif value is None:
            del arrays[key]
        else:
            arrays[key] = value
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez(path, **arrays)


@pytest.mark.parametrize("change,message", [
    ({"meta": {"version": 99}}, "format version 99, but this fastckpt reads versions 0, 1 and 2"),
    ({"meta": {"version": 1}}, "a version-1 file has no activation, but this one names ['sigmoid']"),
    ({"meta": {"activation": "softplus"}}, "activation must be 'sigmoid', 'tanh', 'relu' or 'identity'"),
    ({"meta": {"activation": ["relu", "tanh"]}}, "activation must be one name or a list of one per hidden layer (1)"),
    ({"meta": {"activation": [3]}}, "activation must be a name or a list of names"),
    ({"meta": {"optimizer": "adam"}}, "optimizer must be a JSON object and optimizer_steps an integer >= 0"),
    ({"meta": {"optimizer_steps": -1}}, "optimizer must be a JSON object and optimizer_steps an integer >= 0"),
    ({"meta": {"optimizer_steps": 10**400}}, "optimizer_steps an integer >= 0 and <= 9223372036854775806 (the "
                                             "steps an int64 counts), got {'name': 'sgd'} and 1000000"),
    ({"meta": {"optimizer_steps": 2**63 - 1}}, "<= 9223372036854775806 (the steps an int64 counts)"),
    ({"meta": {"optimizer": {"name": "momentum", "momentum": 10**400}}}, "momentum must be finite and >= 0, got 1000"),
    ({"meta": {"optimizer": {"name": "rmsprop"}}}, "optimizer must name one of sgd, momentum, adam, adamw"),
    ({"meta": {"optimizer": {"name": []}}}, "optimizer must name one of sgd, momentum, adam, adamw, got {'name': []}"),
    ({"meta": {"optimizer": {"name": "adam", "betas": [0.9, 2]}}}, "betas[1] must be in [0, 1), got 2"),
    ({"meta": {"optimizer": {"name": "adam", "lr": 0.1}}}, "unexpected keyword argument 'lr'"),
    ({"meta": {"optimizer": {"name": "momentum"}}}, "the array 'velocity_weights_0' is missing"),
    ({"meta": {"format": "something-else"}}, "not a fastckpt net"),
    ({"weights_1": np.zeros((3, 5))}, "weights_1 has shape (3, 5), but sizes [5, 4, 3] need (3, 4)"),
    ({"biases_0": np.zeros((4, 1), np.float32)}, "biases_0 is float32, but the file's dtype is float64"),
    ({"weights_0": None}, "the array 'weights_0' is missing"),
    ({"meta": {"sizes": [5, 0, 3]}}, "sizes must be a list of at least two integers >= 1"),
    ({"meta": {"dtype": "int8"}}, "dtype must be float32 or float64"),
    ({"meta": {"strategy": "fastest"}}, "unknown strategy 'fastest'"),
    ({"meta": {"loss": "hinge"}}, "loss must be 'quadratic'"),
    ({"weights_0": np.full((4, 5), np.nan)}, "weights_0 holds NaN or inf, which no saved net does"),
    ({"weights_2": np.zeros((3, 3))}, "holds arrays a saved net of sizes [5, 4, 3] does not: weights_2"),
    ({"meta": {"l2": "0.1"}}, "l2 must be a number or a list of numbers"),
    ({"meta": {"version": True}}, "format version True"),
    ({"meta": {"sizes": [True, 4, 3]}}, "sizes must be a list of at least two integers"),
])
def test_a_bad_file_is_refused_with_its_reason(tmp_path, change, message):
    path = Network([5, 4, 3]).save(tmp_path / "n.npz")
    _rewrite(path, **change)
    with pytest.raises(ValueError) as info:
        fastckpt.load(path)
    assert message in str(info.value) and repr(str(path)) in str(info.value)


def test_damaged_and_foreign_files_are_refused(tmp_path):
    path = Network([5, 4, 3]).save(tmp_path / "n.npz")
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])                    # cut short
    with pytest.raises(ValueError, match="n.npz"):
        fastckpt.load(path)
    np.save(tmp_path / "one.npy", np.zeros(3))
    with pytest.raises(ValueError, match="not a saved net: an .npz file is a zip archive, and this is not one"):
        fastckpt.load(tmp_path / "one.npy")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ValueError, match="not a saved net: an .npz file is a zip archive") as info:
        fastckpt.load(tmp_path / "notes.txt")
    assert "pickle" not in str(info.value)
    np.savez(tmp_path / "other.npz", x_train=np.zeros(3))
    with pytest.raises(ValueError, match="not a fastckpt net"):
        fastckpt.load(tmp_path / "other.npz")
    with pytest.raises(ValueError, match="missing.npz': no such file"):
        fastckpt.load(tmp_path / "missing.npz")


def test_a_file_is_checked_before_its_arrays_are_read(tmp_path):
    """A header that declares a terabyte, or an object array, is refused without allocating or unpickling."""
    import zipfile
    path = Network([5, 4, 3]).save(tmp_path / "n.npz")
    header = {"descr": "<f8", "fortran_order": False, "shape": (10**12,)}
    with zipfile.ZipFile(path, "a") as z, z.open("junk.npy", "w") as f:
        np.lib.format.write_array_header_1_0(f, header)
    with pytest.raises(ValueError, match="holds arrays a saved net of sizes \\[5, 4, 3\\] does not: junk"):
        fastckpt.load(path)
    path = Network([5, 4, 3]).save(tmp_path / "m.npz")
    with zipfile.ZipFile(path, "a") as z, z.open("weights_0x.npy", "w") as f:
        np.lib.format.write_array(f, np.array([object()]), allow_pickle=True)
    with pytest.raises(ValueError, match="member 'weights_0x' holds Python objects"):
        fastckpt.load(path)


# -- the command: --save every epoch, --resume bit for bit ------------------------------------------
def _train(*args, cwd):
    return run_cli("train", "--sizes", "784,16,10", "--json", *args, cwd=cwd)


@pytest.mark.parametrize("dtype,extra", [("float64", ["--strategy", "sqrt"]),
                                         ("float32", ["--strategy", "revolve(1)", "--loss", "cross_entropy"]),
                                         ("float64", ["--strategy", "sqrt", "--threads", "2"])],
                         ids=["f64-sqrt", "f32-revolve", "f64-threads"])
@pytest.mark.sweep(first=2)
def test_train_resume_goes_on_bit_for_bit(tmp_path, dtype, extra):
    common = ["--dtype", dtype, "--eta", "0.5", *extra]
    whole = _train("--epochs", "3", "--save", "whole.npz", *common, cwd=tmp_path)
    assert whole.returncode == 0, whole.stderr
    first = _train("--epochs", "1", "--save", "part.npz", *common, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    rest = _train("--resume", "part.npz", "--epochs", "3", "--save", "part.npz",
                  *(["--threads", "2"] if "--threads" in extra else []), cwd=tmp_path)
    assert rest.returncode == 0, rest.stderr
    a, b = fastckpt.load(tmp_path / "whole.npz"), fastckpt.load(tmp_path / "part.npz")
    _same(a, b)
    assert a.dtype == np.dtype(dtype) and str(b.strategy) == extra[1]
    assert json.loads(rest.stdout)["accuracies"] == json.loads(whole.stdout)["accuracies"]
    assert json.loads(rest.stdout)["resumed_after_epoch"] == 1
    per_update = 2 if "--threads" in extra else 1
    assert b.training_state["epochs_done"] == 3 and b.training_state["updates_done"] == 1200 // per_update


@pytest.mark.bounds
def test_resume_refuses_what_would_change_the_run(tmp_path):
    assert _train("--epochs", "1", "--save", "p.npz", cwd=tmp_path).returncode == 0
    for args, message in [(["--sizes", "784,8,10"], "--sizes 784,8,10 differs from the --resume file's 784,16,10"),
                          (["--batch-size", "20"], "--batch-size 20 differs from the --resume file's 10"),
                          (["--max-memory", "64MiB"], "--max-memory 64MiB differs from the --resume file's plain"),
                          (["--epochs", "1"], "has already trained 1 epochs"),
                          (["--mpi"], "was trained on one process, and this run would go on with --data-parallel 1 "
                                      "--pipeline 1 --tensor-parallel 1 --micro-batches 1:"),
                          (["--threads", "2"], "average 2 mini-batches per update, but the --resume file's run "
                                               "averaged 1")]:
        proc = run_cli("train", "--resume", "p.npz", *args, cwd=tmp_path)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)
    Network([784, 16, 10]).save(tmp_path / "bare.npz")
    proc = run_cli("train", "--resume", "bare.npz", cwd=tmp_path)
    assert proc.returncode == 2 and "holds a net but no training state" in proc.stderr
    proc = run_cli("train", "--resume", "nope.npz", cwd=tmp_path)
    assert proc.returncode == 2 and "--resume 'nope.npz': no such file" in proc.stderr


def test_resume_at_another_eta_fine_tunes_and_says_so(tmp_path):
    assert _train("--epochs", "1", "--save", "p.npz", cwd=tmp_path).returncode == 0
    proc = run_cli("train", "--sizes", "784,16,10", "--resume", "p.npz", "--epochs", "3", "--eta", "0.5",
                   "--save", "p.npz", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "fastckpt train: note: --eta 0.5 instead of the --resume file's 3: the run goes on at the new rate " \
           "(fine-tuning), so it is not the unbroken run's bit for bit" in proc.stderr.splitlines()
    (x, y), test = fastckpt.load_mnist()
    np.random.seed(0)
    twin = Network([784, 16, 10])
    twin.SGD((x, y), 1, 10, 3.0, test_data=test, verbose=False)
    twin.SGD((x, y), 2, 10, 0.5, test_data=test, verbose=False, first_epoch=1)
    tuned = fastckpt.load(tmp_path / "p.npz")
    _same(tuned, twin)
    assert tuned.training_state["eta"] == 0.5 and tuned.training_state["epochs_done"] == 3
    again = run_cli("train", "--resume", "p.npz", "--epochs", "4", "--save", "p.npz", cwd=tmp_path)
    assert again.returncode == 0 and "note: --eta" not in again.stderr, again.stderr     # the file's rate now
    twin.SGD((x, y), 1, 10, 0.5, test_data=test, verbose=False, first_epoch=3)
    _same(fastckpt.load(tmp_path / "p.npz"), twin)


def test_a_resume_goes_on_with_the_files_blas_threads(tmp_path):
    """A run with --blas-threads N records N; its resume goes on with N unless given another count (OpenBLAS
    rounds a (100 x 784) @ (784 x 40) product differently on one thread and on two), and says so when it is."""
    common = ["--sizes", "784,40,10", "--batch-size", "100", "--eta", "0.5"]
    whole = run_cli("train", *common, "--epochs", "2", "--blas-threads", "2", "--save", "whole.npz", cwd=tmp_path)
    first = run_cli("train", *common, "--epochs", "1", "--blas-threads", "2", "--save", "part.npz", cwd=tmp_path)
    assert whole.returncode == 0 and first.returncode == 0, (whole.stderr, first.stderr)
    assert fastckpt.load(tmp_path / "part.npz").training_state["blas_threads"] == 2
    rest = run_cli("train", "--resume", "part.npz", "--epochs", "2", "--save", "part.npz", cwd=tmp_path)
    assert rest.returncode == 0 and "note" not in rest.stderr, rest.stderr
    resumed = fastckpt.load(tmp_path / "part.npz")
    assert resumed.training_state["blas_threads"] == 2
    _same(fastckpt.load(tmp_path / "whole.npz"), resumed)
    again = run_cli("train", *common, "--epochs", "1", "--blas-threads", "2", "--save", "other.npz", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    one = run_cli("train", "--resume", "other.npz", "--epochs", "2", "--blas-threads", "1", "--save", "other.npz",
                  cwd=tmp_path)
    assert one.returncode == 0 and "fastckpt train: note: --blas-threads 1 instead of the --resume file's " \
        "--blas-threads 2: BLAS rounds some sums differently on another count of threads, so the run is not the " \
        "unbroken run's bit for bit" in one.stderr.splitlines(), one.stderr


# -- labels and predict -------------------------------------------------------------------------
def test_integer_labels_train_exactly_like_one_hot(rng):
    x, y = _data(rng)
    labels = y.argmax(axis=1)
    np.random.seed(0)
    a = NetworkWithCheckpointing([12, 8, 4], strategy="sqrt", dtype=np.float32)
    b, c, d = copy.deepcopy(a), copy.deepcopy(a), copy.deepcopy(a)
    a.SGD((x, y), 2, 10, 1.0, verbose=False)
    b.SGD((x, labels.astype(np.uint8)), 2, 10, 1.0, verbose=False)
    _same(a, b)
    c.update_mini_batch(x[:10], y[:10], 1.0)
    d.update_mini_batch(x[:10], labels[:10], 1.0)
    _same(c, d)
    np.testing.assert_array_equal(c.backprop(x[:7], y[:7])[1][0], d.backprop(x[:7], labels[:7])[1][0])
    assert a.evaluate(x, y) == a.evaluate(x, labels)


def test_bad_labels_are_refused(rng):
    x, y = _data(rng, n=20)
    net = Network([12, 5, 4])
    with pytest.raises(ValueError, match=r"y_mini_batch holds labels from 0 to 4, but the net has 4 outputs"):
        net.update_mini_batch(x[:3], np.array([0, 4, 1]), 1.0)
    with pytest.raises(TypeError, match="integer labels"):
        net.update_mini_batch(x[:3], np.array([0.0, 1.0, 2.0]), 1.0)
    with pytest.raises(ValueError, match="training_data\\[1\\] holds labels from -1"):
        net.SGD((x, np.full(20, -1)), 1, 10, 1.0, verbose=False)
    with pytest.raises(ValueError, match="x_mini_batch has 3 samples but y_mini_batch has 2"):
        net.update_mini_batch(x[:3], np.array([0, 1]), 1.0)


def test_predict_is_the_arg_max_of_the_output(rng):
    x, _ = _data(rng, n=9000)                                        # more than one evaluation chunk
    np.random.seed(2)
    net = Network([12, 7, 4], loss="cross_entropy")
    out = net.feedforward(x)
    got = net.predict(x)
    assert got.shape == (9000,) and got.dtype.kind == "i"
    np.testing.assert_array_equal(got, out.argmax(axis=1))
    assert net.predict(x[5]) == out[5].argmax() and isinstance(net.predict(x[5]), int)
    assert net.predict(x[5].reshape(-1, 1)) == out[5].argmax()
    np.testing.assert_array_equal(net.predict(x[:3, :, None]), out[:3].argmax(axis=1))
    with pytest.raises(ValueError, match="x has shape"):
        net.predict(np.zeros((2, 5)))


@pytest.mark.parametrize("kind", ["pipeline", "tensor"])
def test_model_parallel_trainers_take_integer_labels_too(rng, kind):
    """On one rank (no mpiexec): the same update from one-hot rows and from integer labels."""
    pytest.importorskip("mpi4py")
    from fastckpt.parallel import PipelineTrainer, TensorParallelTrainer
    x, y = _data(rng, n=40)
    trained = []
    for targets in (y, y.argmax(axis=1)):
        np.random.seed(0)
        trainer = PipelineTrainer([12, 8, 4], 2) if kind == "pipeline" else TensorParallelTrainer([12, 8, 4])
        trainer.update_mini_batch(x, targets, 1.0)
        trained.append(trainer.gather())
    for a, b in zip(trained[0][0] + trained[0][1], trained[1][0] + trained[1][1]):
        np.testing.assert_array_equal(a, b)


def test_save_refuses_what_it_cannot_write_and_keeps_links_and_permissions(tmp_path):
    net = Network([3, 2])
    for bad, message in [("", "name the .npz file to write"), (str(tmp_path / "no" / "n.npz"), "no such folder"),
                         (str(tmp_path), "is a folder")]:
        with pytest.raises(ValueError, match=message):
            net.save(bad)
    with pytest.raises(TypeError, match="training must be a dict, got list"):
        net.save(tmp_path / "n.npz", training=[1, 2])
    with pytest.raises(ValueError, match="must be numpy.random.get_state"):
        net.save(tmp_path / "n.npz", training={"rng": 5})
    assert os.listdir(tmp_path) == []
    real = tmp_path / "real.npz"
    net.save(real)
    os.chmod(real, 0o600)
    os.symlink(real, tmp_path / "latest.npz")
    np.random.seed(9)
    Network([3, 2]).save(tmp_path / "latest.npz")
    assert os.path.islink(tmp_path / "latest.npz") and os.stat(real).st_mode & 0o777 == 0o600
    assert not np.array_equal(fastckpt.load(real).weights[0], net.weights[0])     # the link's target was replaced
    assert fastckpt.load(bytes(tmp_path / "real.npz")).sizes == [3, 2]


@pytest.mark.parametrize("change,message", [
    ({}, "needs epochs_done as an integer >= 1, got None"),
    ({"epochs_done": -5}, "needs epochs_done as an integer >= 1, got -5"),
    ({"epochs_done": "1"}, "needs epochs_done as an integer >= 1, got '1'"),
    ({"epochs_done": 10**400}, "needs epochs_done as an integer >= 1 and <= 9223372036854775807, got 1000"),
    ({"batch_size": 10**400}, "needs batch_size as an integer >= 1 and <= 9223372036854775807, got 1000"),
    ({"seed": 2**32}, "needs seed as an integer >= 0 and <= 4294967295, got 4294967296"),
    ({"accuracies": "abc"}, "needs accuracies as a list of at most epochs_done numbers"),
    ({"updates_done": "x"}, "needs updates_done as an integer"),
    ({"n_train": "4000"}, "needs n_train as an integer"),
    ({"eta": "3.0"}, "needs eta as a number >= 0, got '3.0'"),
    ({"data": 5}, "needs data as a string or null, got 5"),
    ({"rng": None}, "lacks numpy.random's state"),
])
@pytest.mark.sweep(first=3)
def test_resume_checks_every_field_of_the_training_state(tmp_path, change, message):
    assert _train("--epochs", "1", "--save", "p.npz", cwd=tmp_path).returncode == 0
    path = tmp_path / "p.npz"
    with np.load(path) as f:
        arrays = {k: f[k] for k in f.files}
    meta = json.loads(str(arrays["meta"]))
    meta["training"] = {} if not change else {**meta["training"], **change}
    if meta["training"].get("rng") is None:
        arrays.pop("rng_keys")
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez(path, **arrays)
    proc = run_cli("train", "--resume", "p.npz", "--epochs", "3", cwd=tmp_path)
    assert proc.returncode == 2 and message in proc.stderr and "p.npz" in proc.stderr, proc.stderr


@pytest.mark.parametrize("change,message", [
    ({"mode": 3}, "needs mode as a string or null, got 3"),
    ({"max_memory": "lots"}, "needs max_memory as an integer of bytes from 1 to 9223372036854775807 or null, got "
                             "'lots'"),
    ({"max_memory": -5}, "needs max_memory as an integer of bytes from 1 to 9223372036854775807 or null, got -5"),
    ({"max_memory": True}, "needs max_memory as an integer of bytes from 1 to 9223372036854775807 or null, got True"),
    ({"shuffle": "x"}, "needs shuffle as an integer seed from 0 to 2**32 - 1 or null, got 'x'"),
    ({"validation": 5}, "needs validation as a fraction between 0 and 1 or null, got 5"),
    ({"lr_schedule": 3}, "needs lr_schedule as a learning-rate schedule such as 'cosine(10)' or null, got 3"),
    ({"lr_schedule": "bogus"}, "needs lr_schedule as a learning-rate schedule such as 'cosine(10)' or null, got "
                               "'bogus'"),
    ({"blas_threads": 0}, "needs blas_threads as a count of threads from 1 or null, got 0"),
])
def test_resume_refuses_a_damaged_mode_bound_order_split_or_schedule(tmp_path, change, message):
    """A mode of 3 used to end in AttributeError ("a bug"), a max_memory of "lots" or -5 to be taken and written
    on; the others were refused without naming the file.  Each is one line naming the file, field and value."""
    assert _train("--epochs", "1", "--save", "p.npz", cwd=tmp_path).returncode == 0
    _rewrite(tmp_path / "p.npz", meta={"training": {**fastckpt.load(tmp_path / "p.npz").training_state, **change,
                                                    "rng": _saved_rng(tmp_path / "p.npz")}})
    proc = run_cli("train", "--resume", "p.npz", "--epochs", "3", "--save", "p.npz", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr == (f"fastckpt train: error: --resume 'p.npz': its training state "
                                                    f"{message}\n"), proc.stderr
    assert fastckpt.load(tmp_path / "p.npz").training_state["epochs_done"] == 1


@pytest.mark.parametrize("training,meta,message", [
    ({"validation": 0.999}, {}, "its training state's batch_size 10 is more than the 4 samples it trains on with "
                                "validation 0.999 (3996 held out)"),
    ({"batch_size": 3601}, {}, "its training state's batch_size 3601 is more than the 3600 samples it trains on "
                               "with validation 0.1 (400 held out)"),
    ({}, {"strategy": "fit(10)"}, "the strategy its run trained with, fit(10): [784, 16, 10] at batch 10 in float64 "
                                  "needs at least"),
    ({}, {"strategy": "budget(10)"}, "the strategy its run trained with, budget(10): [784, 16, 10] at batch 10 "),
    ({}, {"strategy": "revolve(0)"}, "strategy 'revolve(0)': revolve(slots): slots must be an integer >= 1, got 0"),
    ({"lr_schedule": "step(1, 1e200)"}, {}, "its training state's lr_schedule step(1, 1e+200) from eta 3.0 gives "
                                            "epoch 3/3 a learning rate of inf"),
    ({"parallel_batches": 401}, {}, "its training state's parallel_batches 401 is more than the 400 mini-batches"),
    ({"mode": "on one process "}, {}, "its training state's mode 'on one process ' is damaged"),
    ({"mode": "x" * 1000}, {}, "its training state's mode 'xxxxxxxxxx"),
])
def test_resume_names_the_file_whose_split_batch_or_strategy_cannot_train(tmp_path, training, meta, message):
    """A file edited by hand (or a fit(bytes) too small for another machine's BLAS buffers) was refused by a check
    inside training naming neither the file nor the field ("mini_batch_size must be <= the 4 training samples"),
    or naming a flag not given (--lr-schedule, --parallel-batches); a mode with a space more read as the same
    mode ("was trained on one process , and this run would go on on one process"), and a long one was shown
    whole.  Each is one short line naming the file and the field."""
    assert _train("--epochs", "1", "--validation", "0.1", "--save", "p.npz", cwd=tmp_path).returncode == 0
    _rewrite(tmp_path / "p.npz", meta={"training": {**fastckpt.load(tmp_path / "p.npz").training_state, **training,
                                                    "rng": _saved_rng(tmp_path / "p.npz")}, **meta})
    edited = (tmp_path / "p.npz").read_bytes()
    proc = run_cli("train", "--resume", "p.npz", "--epochs", "3", "--save", "p.npz", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith(f"fastckpt train: error: --resume 'p.npz': {message}"), \
        proc.stderr
    assert proc.stderr.count("\n") == 1 and len(proc.stderr) < 400, proc.stderr
    assert (tmp_path / "p.npz").read_bytes() == edited                            # nothing trained or written


def test_resume_of_a_file_whose_mode_is_null_goes_on_on_one_process(tmp_path):
    """mode may be null (the training state's fields are checked so); it ended in AttributeError ("a bug")."""
    assert _train("--epochs", "1", "--save", "p.npz", cwd=tmp_path).returncode == 0
    _rewrite(tmp_path / "p.npz", meta={"training": {**fastckpt.load(tmp_path / "p.npz").training_state, "mode": None,
                                                    "rng": _saved_rng(tmp_path / "p.npz")}})
    proc = run_cli("train", "--resume", "p.npz", "--epochs", "2", "--save", "p.npz", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert fastckpt.load(tmp_path / "p.npz").training_state["epochs_done"] == 2


def _saved_rng(path):
    """The ``rng`` entry of a file's training state as the file holds it (its 624 key words are an array)."""
    with np.load(path) as f:
        return json.loads(str(f["meta"]))["training"]["rng"]


def test_resume_knows_its_data_by_contents_not_by_path(tmp_path):
    (x, y), (xt, yt) = fastckpt.load_mnist()
    np.savez(tmp_path / "a.npz", x_train=x[:400], y_train=y[:400].argmax(1), x_test=xt[:100], y_test=yt[:100].argmax(1))
    os.symlink(tmp_path / "a.npz", tmp_path / "link.npz")
    assert _train("--epochs", "1", "--save", "p.npz", "--data", "a.npz", cwd=tmp_path).returncode == 0
    same = _train("--resume", "p.npz", "--epochs", "2", "--data", "link.npz", "--save", "q.npz", cwd=tmp_path)
    assert same.returncode == 0, same.stderr                           # another path to the same bytes
    np.savez(tmp_path / "a.npz", x_train=x[400:800], y_train=y[400:800].argmax(1), x_test=xt[:100],
             y_test=yt[:100].argmax(1))
    changed = _train("--resume", "p.npz", "--epochs", "2", cwd=tmp_path)
    assert changed.returncode == 2 and "whose contents have changed since" in changed.stderr, changed.stderr
    other = _train("--resume", "p.npz", "--epochs", "2", "--data", "link.npz", cwd=tmp_path)
    assert other.returncode == 2 and "--data 'link.npz' differs from the --resume file's" in other.stderr


def test_threads_take_integer_labels_too(rng):
    from fastckpt.parallel import DataParallel
    x, y = _data(rng, n=80)
    np.random.seed(0)
    a = NetworkWithCheckpointing([12, 8, 4], strategy="sqrt")
    b = copy.deepcopy(a)
    with DataParallel(a, threads=2) as dp:
        dp.SGD((x, y), 2, 10, 1.0, verbose=False)
    with DataParallel(b, threads=2) as dp:
        dp.SGD((x, y.argmax(axis=1)), 2, 10, 1.0, verbose=False)
    _same(a, b)


@pytest.mark.bounds
def test_the_same_max_memory_resume_command_can_run_again_and_again(tmp_path):
    """A job script that resumes with the --max-memory the run started with: every rerun goes on, and the
    file ends as the unbroken run's, bit for bit."""
    def train(*args):
        proc = run_cli("train", "--max-memory", "40MiB", "--json", *args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    common = ["--sizes", "784,64,64,10", "--batch-size", "200"]
    train(*common, "--epochs", "2", "--save", "g.npz")
    for epochs in ("4", "6"):
        train("--epochs", epochs, "--resume", "g.npz", "--save", "g.npz")
    train(*common, "--epochs", "6", "--save", "whole.npz")
    a, b = fastckpt.load(tmp_path / "g.npz"), fastckpt.load(tmp_path / "whole.npz")
    assert a.training_state["max_memory"] == b.training_state["max_memory"] == 40 * 2**20
    for x, y in zip(a.weights + a.biases, b.weights + b.biases):
        np.testing.assert_array_equal(x, y)


@pytest.mark.bounds
def test_a_resume_without_max_memory_keeps_the_files_bound(tmp_path):
    """Leaving --max-memory out goes on under the file's bound, and writes it again, so a later resume that
    names the same bound still goes on."""
    def train(*args):
        proc = run_cli("train", "--json", *args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    train("--sizes", "784,64,64,10", "--batch-size", "200", "--max-memory", "40MiB", "--epochs", "1",
          "--save", "g.npz")
    train("--epochs", "2", "--resume", "g.npz", "--save", "g.npz")
    assert fastckpt.load(tmp_path / "g.npz").training_state["max_memory"] == 40 * 2**20
    train("--epochs", "3", "--resume", "g.npz", "--save", "g.npz", "--max-memory", "40MiB")
    assert fastckpt.load(tmp_path / "g.npz").training_state["epochs_done"] == 3


@pytest.mark.bounds
def test_a_resume_to_more_epochs_keeps_the_whole_run_within_the_files_bound(tmp_path):
    """More epochs make longer result lists: a file whose step kept its run within --max-memory to the byte would
    put the longer run over.  The resumed run plans its step anew (the same gradients: the unbroken plain run's
    weights, bit for bit), and one that no step fits is refused before it trains.  The file's step used to go on
    unchecked, over the bound."""
    def json_of(*args):
        proc = run_cli(*args, "--json", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)
    common = ["--sizes", ",".join(["784"] + ["256"] * 8 + ["10"]), "--batch-size", "500"]
    plain = json_of("plan", "--data", "embedded", *common, "--epochs", "1")["whole_run"]["total"]
    bound = json_of("plan", "--data", "embedded", *common, "--epochs", "1", "--max-memory",
                    str(plain - 1))["whole_run"]["total"]               # a step that recomputes, not a byte to spare
    first = json_of("train", *common, "--epochs", "1", "--max-memory", str(bound), "--save", "g.npz")
    assert first["bound"]["whole_run_bytes"] == bound
    over = json_of("plan", "--data", "embedded", *common, "--epochs", "3", "--strategy", first["strategy"])
    assert over["whole_run"]["total"] > bound                          # the file's step, over three epochs
    resumed = json_of("train", "--epochs", "3", "--resume", "g.npz", "--save", "g.npz")
    assert resumed["bound"]["whole_run_bytes"] <= bound < over["whole_run"]["total"]
    assert resumed["bound"]["step_bytes"] < first["bound"]["step_bytes"] and resumed["strategy"] != first["strategy"]
    json_of("train", *common, "--epochs", "3", "--strategy", "plain", "--save", "whole.npz")
    a, b = fastckpt.load(tmp_path / "g.npz"), fastckpt.load(tmp_path / "whole.npz")
    assert a.training_state["max_memory"] == bound and str(a.strategy) == resumed["strategy"]
    for x, y in zip(a.weights + a.biases, b.weights + b.biases):
        np.testing.assert_array_equal(x, y)
    refused = run_cli("train", "--epochs", "100000", "--resume", "g.npz", "--save", "g.npz", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.startswith(
        "fastckpt train: error: --resume 'g.npz' was trained under --max-memory, which bounds the resumed run too: "
        f"for --epochs 100000 in all, --max-memory {bound}: the whole run needs "), refused.stderr
    assert refused.stderr.count("\n") == 1 and fastckpt.load(tmp_path / "g.npz").training_state["epochs_done"] == 3


def _adam_file(tmp_path, rng):
    net = Network([6, 5, 3], optimizer="adam")
    x, y = rng.random((20, 6)), np.eye(3)[rng.integers(0, 3, 20)]
    net.SGD((x, y), 1, 10, 0.01, verbose=False)
    return net, net.save(tmp_path / "adam.npz")


@pytest.mark.parametrize("member, at", [("v_weights_0", (2, 3)), ("v_biases_1", (1, 0))])
def test_an_adam_state_with_a_negative_v_is_refused_as_damaged(tmp_path, rng, member, at):
    """v is a mean of squared gradients: a negative value is no state a run reaches (every later step used to raise
    FloatingPointError); -0.0 is one (the sign of a zero a step may write)."""
    net, path = _adam_file(tmp_path, rng)
    with np.load(path) as f:
        v = f[member].copy()
    assert (v >= 0).all()                                          # what a run writes
    v[at] = -0.0
    _rewrite(path, **{member: v})
    loaded = fastckpt.load(path).optimizer_state.arrays(net.sizes)["v"]
    assert np.array_equal(loaded[0 if "weights" in member else 1][int(member[-1])], v)
    v[at] = -1e-12
    _rewrite(path, **{member: v})
    with pytest.raises(ValueError) as info:
        fastckpt.load(path)
    assert str(info.value) == (f"path {str(path)!r}: {member} holds -1e-12 at {at}, but adam's v is a mean of "
                               "squared gradients, never negative: the file is damaged")


def test_a_rng_state_of_inf_is_refused(tmp_path):
    assert _train("--epochs", "1", "--save", "p.npz", cwd=tmp_path).returncode == 0
    path = tmp_path / "p.npz"
    with np.load(path) as f:
        meta = json.loads(str(f["meta"]))
    for gaussian in (10**400, float("inf")):                      # JSON's 1e400 reads as inf
        meta["training"]["rng"]["cached_gaussian"] = gaussian
        _rewrite(path, meta=meta)
        with pytest.raises(ValueError, match="its training state's rng must hold pos .*and a finite cached_gaussian"):
            fastckpt.load(path)


def test_evaluate_and_train_refuse_an_impossible_step_count_in_one_line(tmp_path, capsys):
    from fastckpt.cli import app as cli
    trained = _train("--epochs", "1", "--save", "p.npz", "--optimizer", "adam", "--eta", "0.001", cwd=tmp_path)
    assert trained.returncode == 0
    _rewrite(tmp_path / "p.npz", meta={"optimizer_steps": 10**400})
    for command in (["evaluate", str(tmp_path / "p.npz")],
                    ["train", "--resume", str(tmp_path / "p.npz"), "--epochs", "2", "--save", str(tmp_path / "p.npz")]):
        capsys.readouterr()
        assert cli.main(command) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "optimizer_steps an integer >= 0 and <= 9223372036854775806" in err, err
        assert "a bug" not in err
