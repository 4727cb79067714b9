"""The whole run's memory (NOTE [ The whole run ]): memray's peak over a whole SGD and a whole ``fastckpt train``
on data of Fashion-MNIST's shape, made here, against fastckpt.planner.run.run_bytes, and --max-memory as a bound
on all of it."""
import gzip
import json
import re

import numpy as np
import pytest

import fastckpt
from fastckpt.cli import app as cli
from fastckpt.data.images import Images
from fastckpt.planner.run import run_bytes
from fastckpt.report.measure import memray_peak

MiB = 2**20
pytestmark = pytest.mark.memory


def _close(peak, predicted):
    """The issue's contract: within 2% + 1 MiB."""
    return abs(peak - predicted) <= 0.02 * predicted + MiB


@pytest.fixture(scope="module")
def fashion_shaped(tmp_path_factory):
    """An IDX folder of 60,000 + 10,000 random 28x28 images and labels: Fashion-MNIST's shape."""
    folder = tmp_path_factory.mktemp("fashion")
    rng = np.random.default_rng(0)
    for name, shape in (("train-images-idx3-ubyte", (60_000, 28, 28)), ("train-labels-idx1-ubyte", (60_000,)),
                        ("t10k-images-idx3-ubyte", (10_000, 28, 28)), ("t10k-labels-idx1-ubyte", (10_000,))):
        arr = rng.integers(0, 10 if len(shape) == 1 else 256, shape, dtype=np.uint8)
        header = bytes([0, 0, 8, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
        with gzip.open(folder / (name + ".gz"), "wb", compresslevel=1) as f:
            f.write(header + arr.tobytes())
    return folder


@pytest.mark.parametrize("strategy,n_train,n_test", [("plain", 12_000, 2_000), ("plain", 60_000, 10_000),
                                                     ("sqrt", 60_000, 10_000)], ids=["plain-12k", "plain", "sqrt"])
@pytest.mark.sweep('plain-12k')
def test_a_whole_sgd_run_peaks_where_run_bytes_says(strategy, n_train, n_test):
    """Fashion-MNIST's shape (60,000 + 10,000 images) in the long run, a fifth of it by default."""
    rng = np.random.default_rng(1)
    sizes, batch = [784, 256, 256, 256, 256, 10], 256
    warm = fastckpt.NetworkWithCheckpointing(sizes, strategy=strategy, activation="relu", init="he")
    x_warm = Images(rng.integers(0, 256, (512, 784), dtype=np.uint8))
    memray_peak(lambda: warm.SGD((x_warm, np.zeros(512, np.uint8)), 1, batch, 0.1, verbose=False,
                                 test_data=(x_warm, np.zeros(512, np.uint8))))   # the same kernels compiled, BLAS's
    held = {}                                                                   # buffers made, memray warm too

    def run():                                                 # the data is made inside: all of the run
        x = Images(rng.integers(0, 256, (n_train, 784), dtype=np.uint8))
        y = rng.integers(0, 10, n_train).astype(np.uint8)
        test = (Images(rng.integers(0, 256, (n_test, 784), dtype=np.uint8)), rng.integers(0, 10, n_test))
        net = fastckpt.NetworkWithCheckpointing(sizes, strategy=strategy, activation="relu", init="he")
        net.SGD((x, y), 1, batch, 0.01, test_data=test, verbose=False)
        held.update(net=net, training=(x, y), test=test)
    peak = memray_peak(run)
    predicted = run_bytes(held["net"].plan(batch), held["training"], held["test"], updates=n_train // batch)
    assert _close(peak, predicted["total"]), (peak, predicted)
    assert predicted["data"] == (n_train + n_test) * 784 + n_train + n_test * 8    # bytes, and int64 test labels


@pytest.mark.slow
def test_a_whole_train_run_peaks_where_plan_data_says_and_max_memory_bounds_it(fashion_shaped, tmp_path, capsys):
    common = ["--sizes", ",".join(["784"] + ["256"] * 8 + ["10"]), "--batch-size", "1024", "--data",
              str(fashion_shaped)]
    assert cli.main(["train", *common, "--epochs", "1", "--json"]) == 0                          # warm-up
    adam = ["--optimizer", "adam", "--strategy", "sqrt"]
    for flags, extra in ((["--strategy", "plain"], []), (["--max-memory", "90MiB"], []), (adam, ["--eta", "0.001"])):
        capsys.readouterr()                               # plain's run needs 94.4 MiB, sqrt's 86.4
        assert cli.main(["plan", *common, "--epochs", "1", *flags, "--json"]) == 0
        planned = json.loads(capsys.readouterr().out)
        peak = memray_peak(lambda flags=flags, extra=extra: cli.main(["train", *common, "--epochs", "1", *flags,
                                                                       *extra, "--json"]))
        trained = json.loads(capsys.readouterr().out)
        assert trained["strategy"] == planned["strategy"]
        assert _close(peak, planned["whole_run"]["total"]), (peak, planned["whole_run"])
        if flags[0] == "--max-memory":
            assert planned["recompute_factor"] > 1 and peak <= 90 * MiB, (peak, planned)
        if flags is adam:                                 # Adam's two moments are in the plan and the run
            assert planned["optimizer"] == "adam"
            assert planned["bytes"]["optimizer_state"] == 2 * planned["bytes"]["parameters"] > 0
            assert planned["whole_run"]["step: optimizer_state"] == planned["bytes"]["optimizer_state"]


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
@pytest.mark.sweep('adam')
def test_a_saved_run_holds_no_copy_of_the_optimizer_state(optimizer, tmp_path, capsys):
    """--save writes the state from where it is: the whole run's peak is the plan's with its save counted."""
    from fastckpt.cli.data import load_data
    sizes, batch = [784, 1000, 1000, 10], 50
    common = ["--sizes", ",".join(map(str, sizes)), "--batch-size", str(batch), "--epochs", "1", "--optimizer",
              optimizer, "--eta", "0.001", "--json"]
    assert cli.main(["train", *common]) == 0                                                     # warm-up
    peak = memray_peak(lambda: cli.main(["train", *common, "--save", str(tmp_path / "net.npz")]))
    capsys.readouterr()
    training, test = load_data(None, sizes)
    step = fastckpt.plan(sizes, batch, optimizer=optimizer)
    predicted = run_bytes(step, training, test, updates=len(training[0]) // batch, save=True)
    assert predicted["step: optimizer_state"] >= step.bytes()["parameters"] > 8 * MiB         # a copy would show
    assert _close(peak, predicted["total"]), (peak, predicted)
    assert peak < predicted["total"] + step.bytes()["parameters"] // 2, (peak, predicted)   # no copy of a buffer


@pytest.mark.parametrize("strategy,fused", [("plain", False), ("sqrt", False), ("sqrt", True)])
def test_the_largest_batch_is_the_one_a_scan_of_every_batch_finds(strategy, fused):
    from fastckpt.planner.run import largest_batch
    rng = np.random.default_rng(2)
    training = (Images(rng.integers(0, 256, (600, 64), dtype=np.uint8)), rng.integers(0, 10, 600).astype(np.uint8))
    sizes, bound = [64, 96, 96, 96, 10], 600_000
    found = largest_batch(sizes, bound, training, dtype=np.float64, strategy=strategy, optimizer_in_backward=fused)

    def total(b):
        p = fastckpt.plan(sizes, b, strategy=strategy, optimizer_in_backward=fused)
        return run_bytes(p, training, updates=600 // b)["total"]
    fitting = [b for b in range(1, 601) if total(b) <= bound]
    assert found[0] == max(fitting) and fitting == list(range(1, max(fitting) + 1))
    assert found[2]["total"] == total(found[0]) <= bound < total(found[0] + 1)


def test_plan_max_batch_prints_the_largest_batches(capsys):
    assert cli.main(["plan", "--sizes", "784,64,64,10", "--max-memory", "40MiB", "--max-batch", "--epochs", "1",
                     "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["largest"]
    training, test = fastckpt.load_mnist(compact=True)
    from fastckpt.data import loading_bytes
    from fastckpt.planner.run import largest_batch
    loading = loading_bytes(None)                  # what loading the embedded digits holds besides them
    for row in rows:
        batch = largest_batch([784, 64, 64, 10], 40 * MiB, training, test, strategy=row["strategy"],
                              optimizer_in_backward=row["optimizer_in_backward"], command=True, loading=loading)[0]
        assert row["batch"] == batch, row
    assert cli.main(["plan", "--sizes", "784,64,64,10", "--max-memory", "40MiB", "--max-batch", "--epochs", "1",
                     "--optimizer", "adam", "--json"]) == 0
    adam = json.loads(capsys.readouterr().out)
    assert adam["optimizer"] == "adam"
    for row, sgd in zip(adam["largest"], rows):
        batch, p, parts = largest_batch([784, 64, 64, 10], 40 * MiB, training, test, strategy=row["strategy"],
                                        optimizer_in_backward=row["optimizer_in_backward"], optimizer="adam",
                                        command=True, loading=loading)
        assert (row["batch"], row["whole_run_bytes"]) == (batch, parts["total"]) and row["batch"] < sgd["batch"]
        assert parts["step: optimizer_state"] == 2 * p.bytes()["parameters"]
    assert cli.main(["plan", "--max-batch"]) == 2
    assert "--max-batch finds the largest batch that fits --max-memory BYTES" in capsys.readouterr().err


def _fashion_arrays(rng):
    x = Images(rng.integers(0, 256, (60_000, 784), dtype=np.uint8))
    y = rng.integers(0, 10, 60_000).astype(np.uint8)
    return (x, y), (Images(rng.integers(0, 256, (10_000, 784), dtype=np.uint8)), rng.integers(0, 10, 10_000))


@pytest.mark.slow
def test_sgd_max_memory_refuses_a_run_over_it_and_its_fit_keeps_memray_within_it():
    rng = np.random.default_rng(2)
    sizes, batch, bound = [784] + [256] * 8 + [10], 1024, 90 * MiB      # plain's run needs 94.4 MiB
    training, test = _fashion_arrays(rng)
    net = fastckpt.Network(sizes)
    before = [w.copy() for w in net.weights]
    predicted = run_bytes(net.plan(batch), training, test, updates=60_000 // batch)["total"]
    assert predicted > bound
    with pytest.raises(ValueError, match=r"max_memory 90MiB: this run needs 94\.\d\d MiB with strategy plain .*"
                                         r"strategy='fit\((\d+)\)' plans a step") as caught:
        net.SGD(training, 1, batch, 0.01, test_data=test, verbose=False, max_memory="90MiB")
    assert all(np.array_equal(a, b) for a, b in zip(before, net.weights))                  # nothing trained
    hint = caught.value.args[0].split("strategy='")[1].split("'")[0]
    with pytest.raises(ValueError, match="max_memory 1MiB: the whole run needs more than"):
        net.SGD(training, 1, batch, 0.01, test_data=test, verbose=False, max_memory=MiB)
    warm = fastckpt.NetworkWithCheckpointing(sizes, strategy=hint)
    warm.SGD((training[0][:2048], training[1][:2048]), 1, batch, 0.01, test_data=(test[0][:2048], test[1][:2048]),
             verbose=False)
    held = {}

    def run():
        (x, y), t = _fashion_arrays(np.random.default_rng(3))
        fitted = fastckpt.NetworkWithCheckpointing(sizes, strategy=hint)
        fitted.SGD((x, y), 1, batch, 0.01, test_data=t, verbose=False, max_memory=bound)
        held["net"] = fitted
    peak = memray_peak(run)
    assert peak <= bound and held["net"].plan(batch).recompute_factor > 1, (peak, hint)


@pytest.mark.parametrize("kwargs", [{}, {"shuffle": True}, {"validation": 0.5}, {"shuffle": 3, "validation": 0.5},
                                    {"validation": "pair"}])
def test_sgd_max_memory_counts_shuffled_copies_and_data_held_back_for_validation(kwargs):
    from fastckpt.engine.loop import held_arrays, split_validation
    from fastckpt.planner.run import bound_the_run
    sizes, batch = [784, 32, 10], 1000
    rng = np.random.default_rng(4)

    def data():
        x, y = rng.random((4000, 784)), rng.integers(0, 10, 4000)
        extra = {"validation": (rng.random((2000, 784)), rng.integers(0, 10, 2000))} \
            if kwargs.get("validation") == "pair" else {}
        return (x, y), (rng.random((1000, 784)), rng.integers(0, 10, 1000)), extra
    training, test, extra = data()
    options = dict(kwargs, **extra)
    memray_peak(lambda: fastckpt.Network(sizes).SGD(training, 1, batch, 0.1, test_data=test, verbose=False,
                                                    max_memory="1GiB", **options))   # warm-up, under memray too
    held = {}

    def run():
        training, test, extra = data()
        net = fastckpt.Network(sizes)
        net.SGD(training, 1, batch, 0.1, test_data=test, verbose=False, max_memory="1GiB", **dict(kwargs, **extra))
        held.update(net=net, training=training, test=test, options=dict(kwargs, **extra))
    peak = memray_peak(run)
    options = held["options"]
    split, val = split_validation(held["net"], held["training"], options.get("validation"))
    predicted = bound_the_run(held["net"].plan(batch), split, held["test"], updates=len(split[0]) // batch,
                              bound=2**30, shuffled=bool(options.get("shuffle")), validation=val,
                              held=held_arrays(held["training"], held["test"], options.get("validation"), val))
    assert _close(peak, predicted["total"]), (peak, predicted)
    assert -64 * 1024 <= peak - predicted["total"] <= 0, (peak, predicted)      # the bound holds, and is close


def test_sgd_max_memory_takes_data_given_as_lists():
    (x, y), test = fastckpt.load_mnist()
    rows, labels = [r for r in x[:200]], list(y[:200])
    for shuffle in (False, 3):
        net = fastckpt.Network([784, 16, 10])
        net.SGD((rows, labels), 1, 20, 0.1, verbose=False, max_memory="1GiB", shuffle=shuffle)
        with pytest.raises(ValueError, match="max_memory 1MiB"):
            net.SGD((rows, labels), 1, 20, 0.1, verbose=False, max_memory="1MiB", shuffle=shuffle)


def test_a_bound_below_the_data_names_the_bytes_in_a_unit_that_shows_them():
    """A run of a few hundred bytes used to need "more than 0.00 MiB"; every part is now in bytes, KiB, MiB or GiB."""
    from fastckpt.core.resources import shown_bytes
    from fastckpt.planner.run import object_bytes
    x, y = np.zeros((20, 4)), np.zeros((20, 3))
    net = fastckpt.Network([4, 3])
    with pytest.raises(ValueError) as info:
        net.SGD((x, y), 1, 5, 0.1, verbose=False, max_memory="1 KiB")
    records = int(re.search(r"records (\d+) bytes", str(info.value)).group(1))     # 4 updates' and an epoch's
    data = x.nbytes + y.nbytes                                                      # 1120 bytes
    objects = object_bytes(fastckpt.plan([4, 3], 5))                             # the net's, engine's and plan's
    assert str(info.value) == (f"max_memory 1KiB: the whole run needs more than "
                               f"{(data + records + objects) / 1024:.2f} KiB before its training step: data "
                               f"{data / 1024:.2f} KiB, staging 0 bytes, records {records} bytes, python objects "
                               f"{objects / 1024:.2f} KiB") and 4 * 80 < records < 1024
    assert [shown_bytes(n) for n in (0, 1, 1023, 1024, 1536, 2**20 - 1, 2**20, 3 * 2**30 + 2**29, 2**40)] == [
        "0 bytes", "1 byte", "1023 bytes", "1.00 KiB", "1.50 KiB", "1024.00 KiB", "1.00 MiB", "3.50 GiB", "1.00 TiB"]


@pytest.fixture(scope="module")
def small_test_set(tmp_path_factory):
    """6,000 training images and 600 test images (fewer than an evaluation chunk, so that a validation set's
    evaluation is the larger), as the lab's mnist.npz."""
    path = tmp_path_factory.mktemp("small") / "mnist.npz"
    rng = np.random.default_rng(5)
    np.savez(path, x_train=rng.integers(0, 256, (6_000, 784), dtype=np.uint8),
             y_train=rng.integers(0, 10, 6_000).astype(np.uint8),
             x_test=rng.integers(0, 256, (600, 784), dtype=np.uint8), y_test=rng.integers(0, 10, 600).astype(np.uint8))
    return path


@pytest.mark.parametrize("flags", [["--batch-size", "10"], ["--batch-size", "500", "--max-memory", "30MiB"],
                                   ["--batch-size", "500", "--validation", "0.5", "--max-memory", "30MiB"],
                                   ["--batch-size", "20", "--validation", "0.3", "--shuffle", "3", "--epochs", "2"]],
                         ids=["updates", "bound", "validation", "shuffled"])
def test_nothing_of_a_train_run_grows_beside_its_prediction(small_test_set, flags, capsys):
    """memray's peak over a whole train run, after a warm-up under memray too, is at most the whole-run prediction of
    the same run and within 64 KiB of it, whatever the batch, the updates, the validation set and the order.  The
    prediction used to miss NumPy's 64 KiB cast buffer of an evaluation, 0.2 KiB of objects per update, the
    validation set's evaluation, the shuffled order and the Python objects of the net, engine and settings."""
    from types import SimpleNamespace

    from fastckpt.cli.bound import whole_run
    from fastckpt.cli.data import load_data
    from fastckpt.planner import parse_strategy
    args = ["train", "--sizes", "784,128,128,10", "--data", str(small_test_set), "--json", *flags]
    args += [] if "--epochs" in flags else ["--epochs", "1"]
    memray_peak(lambda: cli.main(args))                                    # the warm-up, under memray too
    capsys.readouterr()
    peak = memray_peak(lambda: cli.main(args))
    trained = json.loads(capsys.readouterr().out)

    def given(flag, kind, default=None):
        return kind(args[args.index(flag) + 1]) if flag in args else default
    run = SimpleNamespace(sizes=[784, 128, 128, 10], batch_size=trained["batch_size"], dtype="float64",
                          strategy=parse_strategy(trained["strategy"]), sgd_in_backward=False, optimizer="sgd",
                          validation=given("--validation", float), shuffle=given("--shuffle", int),
                          data=str(small_test_set))
    training, test = load_data(str(small_test_set), run.sizes)
    predicted = whole_run(run, training, test, given("--epochs", int), False)
    assert -64 * 1024 <= peak - predicted["total"] <= 0, (peak, predicted)      # the bound holds, and is close
    if "--max-memory" in flags:
        assert predicted["total"] <= 30 * MiB and trained["strategy"].startswith("fit(")


def test_the_records_count_a_list_s_slots_as_cpython_grows_it():
    import sys

    from fastckpt.planner.run import list_slots
    grown, sizes = [], {}
    for n in range(1, 5000):
        grown.append(0.5)
        sizes[n] = (sys.getsizeof(grown) - sys.getsizeof([])) // 8
    assert all(list_slots(n) == sizes[n] for n in sizes), [(n, list_slots(n), sizes[n]) for n in sizes
                                                            if list_slots(n) != sizes[n]][:5]


def test_a_bound_just_below_what_the_run_needs_says_the_least_it_found_and_that_is_taken():
    """Near the least bound, fit's search used to run out of tries (each plan's Python objects put the run a
    byte over, and the next try asked for a byte less of the same plan) and then said "needs more than 16.76
    MiB before its training step" of a 29.34 MiB bound.  Whatever the refusal says the run needs is now true:
    the least whole run it names is taken, and one byte less is refused."""
    from cli_runner import run_cli

    from fastckpt.cli.data import load_data
    from fastckpt.planner.run import fit_the_run
    sizes, batch, epochs = [784] + [256] * 8 + [10], 500, 2
    training, test = load_data(None, sizes)
    around = {"updates": epochs * (len(training[0]) // batch), "epochs": epochs, "command": True}

    def fits(bound):
        try:
            fit_the_run(sizes, batch, "float64", bound, training, test, **around)
        except ValueError:
            return False
        return True
    low, high = 1, 2**31                                           # the least bound that fits, by bisection
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if fits(mid) else (mid + 1, high)
    common = ["--data", "embedded", "--sizes", ",".join(map(str, sizes)), "--batch-size", str(batch), "--epochs",
              str(epochs), "--json"]
    refused = run_cli("plan", *common, "--max-memory", str(low - 1))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    found = re.search(r"The least whole run found needs (\d+) bytes", refused.stderr)
    if found:                                                      # no plan tried fits: the least one tried is named
        need = int(found.group(1))
        assert need >= low and f", {need - low + 1} more, " in refused.stderr, refused.stderr
    else:                                                          # or the least any plan could need is above it
        shown = re.search(r"the whole run needs at least ([\d.]+) MiB", refused.stderr)
        assert shown, refused.stderr
        need = low
        assert float(shown.group(1)) * MiB >= low - 1 - 0.005 * MiB
    taken = run_cli("plan", *common, "--max-memory", str(need))
    assert taken.returncode == 0, taken.stderr
    assert json.loads(taken.stdout)["whole_run"]["total"] <= need


@pytest.mark.parametrize("fused", [False, True], ids=["after", "in-backward"])
@pytest.mark.parametrize("optimizer", ["momentum", "adam", "adamw"])
@pytest.mark.sweep("adam-after", "adamw-in-backward")
@pytest.mark.bounds
def test_sgd_max_memory_holds_with_every_optimizer(optimizer, fused):
    """A run accepted at exactly its predicted peak stays within it with every optimizer, its update after the
    backward pass or in it.  Each step used to make a list that CPython's free list of lists then kept (of the
    state's rows, and of Adam's betas to compare the optimizer with the plan's), up to 80 of 56 bytes: the run
    went 1.6-3.5 KB over its bound."""
    sizes, batch = [784, 128, 64, 10], 100

    def data(seed):
        rng = np.random.default_rng(seed)
        return ((rng.random((3000, 784)), rng.integers(0, 10, 3000)),
                (rng.random((700, 784)), rng.integers(0, 10, 700)))
    training, test = data(6)
    net = fastckpt.Network(sizes, optimizer=optimizer, optimizer_in_backward=fused)
    bound = run_bytes(net.plan(batch), training, test, updates=3000 // batch)["total"]

    def run():
        training, test = data(7)
        fastckpt.Network(sizes, optimizer=optimizer, optimizer_in_backward=fused).SGD(
            training, 1, batch, 0.001, test_data=test, verbose=False, max_memory=bound)
    memray_peak(run)                                                    # the warm-up, under memray too
    peak = memray_peak(run)
    assert -64 * 1024 <= peak - bound <= 0, (peak, bound)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.bounds
def test_a_train_run_on_float_images_holds_them_once(dtype, tmp_path, capsys):
    """``train --data`` on an npz of float images: the loader used to copy float64 images (``astype``) and check
    them all at once (a bool array an eighth of their size), and to make float32 ones float64, so that loading
    peaked at twice the data, over the whole run's bound.  Now the images are held as the file has them (float32
    rows converted a minibatch at a time) and checked a few rows at a time: the run peaks where it is predicted."""
    from types import SimpleNamespace

    from fastckpt.cli.bound import whole_run
    from fastckpt.cli.data import load_data
    rng = np.random.default_rng(8)
    path = tmp_path / "floats.npz"
    np.savez(path, x_train=rng.random((3000, 784), dtype=dtype), y_train=rng.integers(0, 10, 3000),
             x_test=rng.random((500, 784), dtype=dtype), y_test=rng.integers(0, 10, 500))
    sizes = [784, 32, 10]
    training, test = load_data(str(path), sizes)
    assert training[0].dtype == dtype and test[0].dtype == dtype
    run = SimpleNamespace(sizes=sizes, batch_size=100, dtype="float64", strategy=fastckpt.planner.parse_strategy(
        "plain"), sgd_in_backward=False, optimizer="sgd", validation=None, shuffle=None, data=str(path))
    predicted = whole_run(run, training, test, 1, False)["total"]
    del training, test
    args = ["train", "--sizes", "784,32,10", "--data", str(path), "--batch-size", "100", "--epochs", "1", "--json"]
    bounded = args + ["--max-memory", str(predicted)]
    memray_peak(lambda: (cli.main(args), cli.main(bounded)))               # the warm-up, under memray too
    capsys.readouterr()
    peak = memray_peak(lambda: cli.main(args))
    assert json.loads(capsys.readouterr().out)["strategy"] == "plain"
    assert -64 * 1024 <= peak - predicted <= 0, (peak, predicted)      # 2x the data before: 44 MB over, float64
    peak = memray_peak(lambda: cli.main(bounded))
    assert json.loads(capsys.readouterr().out)["strategy"].startswith("fit(")
    assert peak <= predicted, (peak, predicted)


def _idx_folder(folder, rng, n_train, n_test):
    for name, shape in (("train-images-idx3-ubyte", (n_train, 28, 28)), ("train-labels-idx1-ubyte", (n_train,)),
                        ("t10k-images-idx3-ubyte", (n_test, 28, 28)), ("t10k-labels-idx1-ubyte", (n_test,))):
        arr = rng.integers(0, 10 if len(shape) == 1 else 256, shape, dtype=np.uint8)
        header = bytes([0, 0, 8, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
        with gzip.open(folder / (name + ".gz"), "wb", compresslevel=1) as f:
            f.write(header + arr.tobytes())
    return folder


@pytest.mark.parametrize("source", ["embedded", "idx", "npz-int64", "npz-onehot-deflated", "npz-big-endian"])
def test_the_loader_holds_the_data_and_what_loading_bytes_says(source, tmp_path):
    """memray's peak over ``load_mnist(path, compact=True)`` is the arrays it returns and, besides them, the file's
    arrays it converts and at most READ_BYTES of reading and checking (it read npz members through numpy, two
    buffers of 256 KiB, and IDX files 1 MiB at a time)."""
    from fastckpt.data import READ_BYTES, loading_bytes
    rng = np.random.default_rng(9)
    path = None if source == "embedded" else tmp_path / "data.npz"
    if source == "idx":
        path = _idx_folder(tmp_path, rng, 6000, 1000)
    elif source != "embedded":
        x, xt = rng.random((6000, 784)), rng.random((1000, 784))
        y, yt = rng.integers(0, 10, 6000), rng.integers(0, 10, 1000)
        if source == "npz-onehot-deflated":
            np.savez_compressed(path, x_train=x, y_train=np.eye(10)[y], x_test=xt, y_test=np.eye(10)[yt])
        else:
            kind = ">f8" if source == "npz-big-endian" else "<f8"
            np.savez(path, x_train=x.astype(kind), y_train=y, x_test=xt.astype(kind), y_test=yt)
    held = {}

    def load():
        held["data"] = fastckpt.load_mnist(path, compact=True)
    memray_peak(load)
    held.clear()
    peak = memray_peak(load)
    kept = sum(a.nbytes for pair in held["data"] for a in pair)
    assert 0 <= loading_bytes(path) - (peak - kept) <= READ_BYTES, (peak - kept, loading_bytes(path))


@pytest.mark.bounds
def test_a_train_run_whose_peak_is_loading_its_data_is_bounded(tmp_path, capsys):
    """One-hot float64 labels are 80 bytes a sample in the file and one as the class indices a run keeps: loading
    them can be the run's peak (a narrow float32 net on float32 images adds less), counted as ``loading``."""
    from fastckpt.data import READ_BYTES
    rng = np.random.default_rng(10)
    path = tmp_path / "onehot.npz"
    np.savez(path, x_train=rng.random((12_000, 784), dtype=np.float32), y_train=np.eye(10)[rng.integers(0, 10, 12_000)],
             x_test=rng.random((1000, 784), dtype=np.float32), y_test=np.eye(10)[rng.integers(0, 10, 1000)])
    args = ["--sizes", "784,10", "--data", str(path), "--batch-size", "1000", "--epochs", "1", "--dtype", "float32",
            "--json"]
    assert cli.main(["plan", *args]) == 0
    predicted = json.loads(capsys.readouterr().out)["whole_run"]
    assert predicted["loading"] > 0, predicted
    bound = ["--max-memory", str(predicted["total"])]
    memray_peak(lambda: (cli.main(["train", *args]), cli.main(["train", *args, *bound])))   # the warm-up
    for flags in ([], bound):
        peak = memray_peak(lambda flags=flags: cli.main(["train", *args, *flags]))
        assert -READ_BYTES <= peak - predicted["total"] <= 0, (peak, predicted)
    capsys.readouterr()
    assert cli.main(["train", *args, "--max-memory", str(predicted["total"] - 1)]) == 2
    assert f"--max-memory {predicted['total'] - 1}: loading the data needs" in capsys.readouterr().err


def test_the_bytes_of_listed_data_are_found_without_making_it_an_array():
    """data_bytes used to make a list an array to measure it: a copy of all of it, beside the list."""
    from fastckpt.planner.run import data_bytes, listed_layout
    rng = np.random.default_rng(11)
    rows, labels = [rng.random(784) for _ in range(2000)], [int(v) for v in rng.integers(0, 10, 2000)]
    for listed in (rows, labels, [[0.5] * 784] * 50, [rng.random((784, 1)).astype(np.float32)] * 40, [1, 2.5], []):
        made = np.asarray(listed)
        assert listed_layout(listed) == (made.shape, made.dtype) and data_bytes(listed) == made.nbytes
    memray_peak(lambda: data_bytes(rows, labels))
    assert memray_peak(lambda: data_bytes(rows, labels)) < 16 * 1024          # the rows are 12.5 MB


@pytest.mark.bounds
def test_sgd_max_memory_holds_for_data_given_as_lists():
    """Checking listed rows made them one array (as measuring them did): 15 MB over the bound of a 27 MB run."""
    from fastckpt.engine.loop import held_arrays
    from fastckpt.planner.run import bound_the_run
    sizes, batch = [784, 128, 64, 10], 100

    def data(seed):
        rng = np.random.default_rng(seed)
        return ([rng.random(784) for _ in range(3000)], [int(v) for v in rng.integers(0, 10, 3000)]), \
            (rng.random((700, 784)), rng.integers(0, 10, 700))
    training, test = data(12)
    net = fastckpt.Network(sizes)
    bound = bound_the_run(net.plan(batch), training, test, updates=30, bound=2**30,
                          held=held_arrays(training, test, None))["total"]

    def run():
        training, test = data(13)
        fastckpt.Network(sizes).SGD(training, 1, batch, 0.01, test_data=test, verbose=False, max_memory=bound)
    memray_peak(run)                                                    # the warm-up, under memray too
    peak = memray_peak(run)
    assert peak <= bound, (peak, bound)


def _narrow_deep_budget(sizes, batch, fraction, once=""):
    """A budget ``fraction`` of the way from the least activation memory to plain's."""
    with pytest.raises(fastckpt.InfeasiblePlan) as info:
        fastckpt.plan(sizes, batch, strategy=f"budget(1{once})")
    plain = fastckpt.plan(sizes, batch).bytes()["activation_memory"]
    least = info.value.minimum_bytes
    return f"budget({int(least + fraction * (plain - least))}{once})"


@pytest.mark.bounds
@pytest.mark.parametrize("strategy", ["revolve(2)", "revolve(2)-adam", "budget", "budget-once"])
def test_a_search_s_tables_are_the_planning_part_where_they_are_the_peak(strategy):
    """revolve(2) over 150 narrow layers plans with 1.2 MB of tables before the step's 60 KB of buffers exist,
    budget(bytes) near its least with 4 MB of fronts: the whole run used to be predicted at a third of memray's
    peak (and a bound there taken).  What the search held is counted (revolve's tables as memray measures them,
    the fronts as they grew, at most), the run's prediction holds memray's peak (planned once: a second search
    met the tuples the first left on CPython's free lists, 90 KB), and a bound a byte under it is refused naming
    the planning."""
    sizes, batch = [20] + [3] * 150 + [3], 4
    strategy, _, optimizer = strategy.partition("-")          # Adam's state is made with the net, before its plan
    if strategy.startswith("budget"):
        strategy, optimizer = _narrow_deep_budget(sizes, batch, 0.05, ", once" if optimizer == "once" else ""), ""

    def data(seed):
        rng = np.random.default_rng(seed)
        return rng.random((200, 20)), np.eye(3)[rng.integers(0, 3, 200)]
    net = fastckpt.NetworkWithCheckpointing(sizes, strategy=strategy, optimizer=optimizer or "sgd")
    predicted = run_bytes(net.plan(batch), data(0), updates=50)
    assert predicted["planning"] > predicted["step: total"], predicted
    if optimizer:                                # held while planning: the state beside the tables, all of it
        sgd = run_bytes(fastckpt.NetworkWithCheckpointing(sizes, strategy=strategy).plan(batch), data(0), updates=50)
        assert predicted["total"] - sgd["total"] == predicted["step: optimizer_state"] > 0, (predicted, sgd)
    with pytest.raises(ValueError, match=r"max_memory \d+: this run needs .*, planning \d"):
        net.SGD(data(0), 1, batch, 0.1, verbose=False, max_memory=predicted["total"] - 1)

    def run():
        fastckpt.NetworkWithCheckpointing(sizes, strategy=strategy, optimizer=optimizer or "sgd").SGD(
            data(1), 1, batch, 0.1, verbose=False, max_memory=predicted["total"])
    memray_peak(run)                                                    # the warm-up, under memray too
    peak = memray_peak(run)
    assert 0 <= predicted["total"] - peak <= 256 * 1024, (peak, predicted)     # objects counted at their most


@pytest.mark.bounds
def test_a_plan_of_twenty_thousand_ops_keeps_its_whole_run_within_the_bound():
    """revolve(1) over 200 layers plans 20,503 ops; the engine's table of them was built from a list of rows held
    beside the array (2 MB), and the run went 330 KB over a bound it took.  The table is written in place."""
    sizes, batch = [8] + [4] * 200 + [3], 2

    def data(seed):
        rng = np.random.default_rng(seed)
        return rng.random((20, 8)), rng.integers(0, 3, 20)
    net = fastckpt.NetworkWithCheckpointing(sizes, strategy="revolve(1)")
    assert len(net.plan(batch).ops) > 20_000
    bound = run_bytes(net.plan(batch), data(0), updates=10)["total"]

    def run():
        fastckpt.NetworkWithCheckpointing(sizes, strategy="revolve(1)").SGD(
            data(1), 1, batch, 0.01, verbose=False, max_memory=bound)
    memray_peak(run)                                                    # the warm-up, under memray too
    assert memray_peak(run) <= bound


@pytest.mark.parametrize("slots", [1, 2, 5])
def test_revolve_s_tables_are_what_memray_measures(slots):
    from fastckpt.planner.costs import forward_flops, state_bytes
    from fastckpt.planner.search import revolve_table_bytes, revolve_tree
    sizes, batch = [20] + [3] * 150 + [3], 4
    w = state_bytes(sizes, batch, 8)
    revolve_tree(forward_flops(sizes, batch), w, slots)                             # compiled
    tables = memray_peak(lambda: revolve_tree(forward_flops(sizes, batch), w, slots))
    assert 0 <= tables - revolve_table_bytes(len(w), slots) <= 16 * 1024, (slots, tables)


@pytest.mark.parametrize("fraction", [0.02, 0.05, 0.3, 0.7])
@pytest.mark.parametrize("kind", ["budget", "budget-once", "fit"])
def test_what_a_search_held_is_at_least_memray_s_peak_of_it(kind, fraction):
    """What budget(bytes) and fit(bytes) say their search held (``Plan.table_bytes``) bounds memray's peak over
    the search, within a tenth and 64 KiB: their fronts, counted as they grow, and the trees' objects."""
    from fastckpt.planner.strategies import parse_strategy
    for sizes, batch in (([20] + [16] * 150 + [3], 64), ([784] + [256, 64, 512, 32] * 20 + [10], 64)):
        if kind == "fit":
            with pytest.raises(fastckpt.InfeasiblePlan) as info:
                fastckpt.plan(sizes, batch, strategy="fit(1)")
            least, plain = info.value.minimum_bytes, fastckpt.plan(sizes, batch).bytes()["total"]
            strategy = parse_strategy(f"fit({int(least + fraction * (plain - least))})")
        else:
            strategy = parse_strategy(_narrow_deep_budget(sizes, batch, fraction, ", once" * (kind != "budget")))

        def search(strategy=strategy, sizes=sizes, batch=batch):
            return strategy.step_search(sizes, batch, 8, False, 1)
        search()                                                                      # compiled
        peak = memray_peak(search)
        held = search()[2]
        assert peak <= held <= 1.1 * peak + 64 * 1024, (sizes[:3], strategy, held, peak)


def test_a_run_bounded_with_an_engine_already_built_counts_that_engine_s_plan():
    """SGD(max_memory=...) checks the plan its steps run with: an engine built for a larger batch is kept (a
    smaller batch uses its first rows), so its workspace, not a new plan's, is what the bound must hold; and
    engine() takes a plan of this net only."""
    rng = np.random.default_rng(0)
    x, y = rng.random((64, 30)), np.eye(4)[rng.integers(0, 4, 64)]
    net = fastckpt.Network([30, 40, 4])
    net.SGD((x, y), 1, 32, 0.1, verbose=False)                          # an engine of 32 rows
    small = run_bytes(net.plan(8), (x, y), updates=8)["total"]
    held = run_bytes(net.step_plan(8), (x, y), updates=8)["total"]
    assert net.step_plan(8).batch_size == 32 and held > small
    with pytest.raises(ValueError, match=f"max_memory {small}: "):
        net.SGD((x, y), 1, 8, 0.1, verbose=False, max_memory=small)
    net.SGD((x, y), 1, 8, 0.1, verbose=False, max_memory=held)
    with pytest.raises(ValueError, match=r"plan: Plan\(\[30, 40, 4\].* is not of this net \(\[30, 40, 4\], dtype "
                                         r"float32"):
        fastckpt.Network([30, 40, 4], dtype=np.float32).engine(8, net.plan(8))


@pytest.mark.bounds
def test_a_deep_narrow_train_run_keeps_within_its_max_memory(capsys):
    """300 layers of width 4: fastckpt train's objects came to some 430 bytes a layer more than counted (its
    evaluation's engine, its parameters' views) and a run taken at --max-memory 12080000 peaked 128 KB over."""
    net = ["--sizes", ",".join(["784"] + ["4"] * 300 + ["10"]), "--batch-size", "32", "--optimizer-in-backward",
           "--epochs", "1", "--json"]
    common = ["train", *net]
    assert cli.main(["plan", *net, "--data", "embedded"]) == 0
    bound = int(json.loads(capsys.readouterr().out)["whole_run"]["total"] * 0.985)  # 12,080,000 of 12,267,898 here
    assert cli.main([*common, "--max-memory", str(bound)]) == 0                    # warm-up: its kernels loaded
    capsys.readouterr()
    peak = memray_peak(lambda: cli.main([*common, "--max-memory", str(bound)]))
    assert json.loads(capsys.readouterr().out)["strategy"].startswith("fit(")
    assert peak <= bound, peak
