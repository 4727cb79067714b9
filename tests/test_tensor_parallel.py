"""Tensor parallelism over MPI, driven through mpiexec as a user would; every run has a time limit.

One job per rank count trains every case below (MPI startup dominates), each rank saving
what it holds; the tests compare that with one process's ``fastckpt.Network``.  Ranks are
found by the PID each one writes at start, never by name.
"""
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest
from test_distributed import assert_same_saved_net

import fastckpt

MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
needs_mpi = pytest.mark.skipif(MPIEXEC is None or not __import__("importlib").util.find_spec("mpi4py"),
                               reason="needs mpi4py and mpiexec (pip install mpi4py mpich)")
pytestmark = needs_mpi
LIMIT = 120                        # seconds before a job counts as hung

# name: trainer arguments; every case trains on batches of 10, 10, 7 (leading rows of the buffers),
# 16 (new buffers) and 10 samples
CASES = {
    "lab": dict(sizes=[784, 40, 30, 10]),                                        # 3 layers: layer 0 row-split
    "even": dict(sizes=[784, 30, 10]),                                           # 2 layers: layer 0 column-split
    # widths that neither rank count divides; split are sizes[1] and [3] (even depth), [0] and [2] (odd)
    "uneven": dict(sizes=[33, 9, 6, 5, 3]),
    "uneven_odd": dict(sizes=[33, 7, 5, 3]),
    "cross_entropy_l2": dict(sizes=[784, 40, 30, 10], loss="cross_entropy", l2=[1e-3, 0.0, 2e-2]),
    "float32": dict(sizes=[784, 40, 30, 10], dtype="float32"),
    # checkpointing inside the split layers (NOTE [ Checkpoints in tensor parallelism ]) and its plain twin
    "deep_plain": dict(sizes=[40, 12, 11, 10, 9, 8, 7, 3]),
    "deep_sqrt": dict(sizes=[40, 12, 11, 10, 9, 8, 7, 3], strategy="sqrt"),
    "every2_l2": dict(sizes=[784, 40, 30, 20, 16, 10], strategy="every_nth(2)", loss="cross_entropy", l2=1e-3),
    # the strategies that recompute a state more than once, byte bounds and the optimizer in backward: the
    # engine's, in a shard's plan (NOTE [ One engine for every part ])
    "deep_revolve": dict(sizes=[40, 12, 11, 10, 9, 8, 7, 3], strategy="revolve(1)"),
    "deep_budget": dict(sizes=[40, 12, 11, 10, 9, 8, 7, 3], strategy="budget(6000)", loss="cross_entropy", l2=1e-3),
    # a bound each rank meets only by recomputing at batch 16 (plain there: 22,112 and 15,584 bytes)
    "deep_fit": dict(sizes=[40, 12, 11, 10, 9, 8, 7, 3], strategy_of_ranks={"2": "fit(21500)", "4": "fit(15000)"}),
    "deep_fused": dict(sizes=[40, 12, 11, 10, 9, 8, 7, 3], strategy="revolve(2)", optimizer_in_backward=True),
    "deep_fused_momentum": dict(sizes=[40, 12, 11, 10, 9, 8, 7, 3], strategy="sqrt", optimizer="momentum",
                                optimizer_in_backward=True),
    # regression: a linear output and the squared error, a linear hidden layer, at a rate it does not diverge at
    "regression": dict(sizes=[33, 9, 6, 5, 3], loss="squared_error", activation=["identity", "tanh", "relu"],
                       eta=0.05),
}
BATCHES = [10, 10, 7, 16, 10]
ETA = 3.0

DRIVER = textwrap.dedent("""
    import json, pathlib, sys, traceback
    import numpy as np
    import fastckpt
    from fastckpt.parallel import TensorParallelTrainer

    def one_write(kind, exc, tb):    # the ranks share stderr: a traceback in one write is never cut by another's
        sys.stderr.write("".join(traceback.format_exception(kind, exc, tb)))
        sys.stderr.flush()
    sys.excepthook = one_write       # fastckpt's own hook chains in front of it

    spec = json.loads(sys.argv[1])
    out = pathlib.Path(spec["out"])
    (mnist_x, mnist_y), _ = fastckpt.load_mnist()
    for name, case in spec["cases"].items():
        case = dict(case)
        np.random.seed(case.pop("seed", 0))
        if "strategy_of_ranks" in case:
            from mpi4py import MPI
            case["strategy"] = case.pop("strategy_of_ranks")[str(MPI.COMM_WORLD.Get_size())]
        eta, width = case.pop("eta", 3.0), case.pop("x_width", case["sizes"][0])
        batches = case.pop("batches")
        y_scale, repeat = case.pop("y_scale", None) or [1.0] * len(batches), case.pop("repeat", 1)
        trainer = TensorParallelTrainer(**case)
        rank = trainer.group.rank                            # the world rank (the shard's with one replica)
        replicas, replica = trainer.grid.data, trainer.places.replica
        eta = spec.get("eta_of_rank", {}).get(str(rank), eta)
        if str(rank) in spec.get("refuse_on_rank", ()):      # this rank's step is refused, as by an overflow
            import fastckpt.core.params as params
            params.sgd_step = lambda *args: False
        n, sizes = sum(batches) * replicas, case["sizes"]
        if sizes[0] == 784 and sizes[-1] == 10:
            x, y = mnist_x[:n], mnist_y[:n]
        else:
            rng = np.random.default_rng(1)
            x, y = rng.random((n, sizes[0])), np.eye(sizes[-1])[rng.integers(0, sizes[-1], n)]
        w0, b0 = trainer.gather()
        losses, errors, start = [], [], 0
        for k in range(len(batches) * repeat):              # replica d takes the d-th of each update's mini-batches
            size, scale = batches[k % len(batches)], y_scale[k % len(batches)]
            start = start if start + replicas * size <= n else 0
            at = start + replica * size
            try:
                losses.append(trainer.update_mini_batch(x[at:at + size, :width], y[at:at + size] * scale, eta))
            except FloatingPointError as exc:
                losses.append(np.nan)
                errors.append(f"update {k}: {exc}")
            start += replicas * size
            if k == 0 and "started" in spec:
                pathlib.Path(spec["started"]).touch()
        w, b = trainer.gather()
        pred = trainer.predicted_bytes()
        arrays = {f"{kind}_{i}": v for kind, vs in (("w0", w0), ("b0", b0), ("w", w), ("b", b))
                  for i, v in enumerate(vs)}
        np.savez(out / f"{name}.rank{rank}.npz", x=x, y=y, losses=np.array(losses),
                 bytes_per_update=trainer.bytes_per_update, errors=np.array(errors, dtype=str),
                 **{f"pred {k}": v for k, v in pred.items()}, **arrays)
""")


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    path = tmp_path_factory.mktemp("tp") / "driver.py"
    path.write_text(DRIVER)
    return path


def run(driver, ranks, spec):
    """``mpiexec -n ranks python driver spec``: (returncode, stdout, stderr, seconds)."""
    t0 = time.monotonic()
    proc = subprocess.run([MPIEXEC, "-n", str(ranks), sys.executable, str(driver), json.dumps(spec)],
                          capture_output=True, text=True, timeout=LIMIT)
    return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0


@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def trained(request, driver, tmp_path_factory):
    """Every case trained on 2 or 4 ranks: (ranks, {case: [what rank r saved]})."""
    ranks, out = request.param, tmp_path_factory.mktemp(f"ranks{request.param}")
    cases = {name: dict(case, batches=BATCHES, eta=case.get("eta", ETA)) for name, case in CASES.items()}
    code, _, err, _ = run(driver, ranks, {"out": str(out), "cases": cases})
    assert code == 0, err
    return ranks, {name: [dict(np.load(out / f"{name}.rank{r}.npz")) for r in range(ranks)] for name in CASES}


def reference(case, saved, y_scale=None):
    """fastckpt.Network after ``np.random.seed(0)``, trained on the batches the ranks trained on."""
    args = dict(case)
    args.pop("strategy", None)                          # one process, plain: the weights do not depend on it
    args.pop("strategy_of_ranks", None)
    eta = args.pop("eta", ETA)
    np.random.seed(0)
    net = fastckpt.Network(args.pop("sizes"), dtype=np.dtype(args.pop("dtype", "float64")), **args)
    start, losses = 0, []
    for size, scale in zip(BATCHES, y_scale or [1.0] * len(BATCHES)):
        try:
            net.update_mini_batch(saved["x"][start:start + size], saved["y"][start:start + size] * scale, eta)
            losses.append(net.last_loss)
        except FloatingPointError:
            losses.append(np.nan)
        start += size
    return net, losses


def layers(saved, kind, n):
    return [saved[f"{kind}_{i}"] for i in range(n)]


@pytest.mark.parametrize("name", [name for name in CASES if name != "float32"])
def test_training_gives_the_weights_of_one_process(trained, name):
    ranks, results = trained
    net, losses = reference(CASES[name], results[name][0])
    n = len(net.weights)
    for got, want in zip(layers(results[name][0], "w", n) + layers(results[name][0], "b", n),
                         list(net.weights) + list(net.biases)):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(results[name][0]["losses"], losses, rtol=1e-12)


def test_float32_training_is_close_to_one_process(trained):
    # float32 (unit roundoff 6e-8): the GEMMs sum in another order (each rank's partial sums, then the
    # all-reduce), so a result may differ in its last bit, and 5 updates carry that on.  Measured: at
    # most 1 ulp of the largest weight (4.8e-7 at |w| = 4.7) on 2 and 4 ranks; this allows ~4 ulps.
    ranks, results = trained
    net, losses = reference(CASES["float32"], results["float32"][0])
    n = len(net.weights)
    for got, want in zip(layers(results["float32"][0], "w", n) + layers(results["float32"][0], "b", n),
                         list(net.weights) + list(net.biases)):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-7)
    np.testing.assert_allclose(results["float32"][0]["losses"], losses, rtol=2e-6)


@pytest.mark.parametrize("name", list(CASES))
def test_initial_weights_are_the_lab_draw_exactly(trained, name):
    ranks, results = trained
    args = dict(CASES[name])
    np.random.seed(0)
    net = fastckpt.Network(args["sizes"], dtype=np.dtype(args.get("dtype", "float64")))
    n = len(net.weights)
    for got, want in zip(layers(results[name][0], "w0", n) + layers(results[name][0], "b0", n),
                         list(net.weights) + list(net.biases)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", list(CASES))
def test_every_rank_gathers_the_same_net_and_loss_in_the_lab_shapes(trained, name):
    ranks, results = trained
    sizes = CASES[name]["sizes"]
    dtype = np.dtype(CASES[name].get("dtype", "float64"))
    first = results[name][0]
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        assert first[f"w_{i}"].shape == (n_out, n_in) and first[f"b_{i}"].shape == (n_out, 1)
        assert first[f"w_{i}"].dtype == dtype and first[f"b_{i}"].dtype == dtype
    for other in results[name][1:]:                    # replicated parts stay identical, bit for bit
        for key in first:
            if key[:2] in ("w_", "b_", "lo"):
                np.testing.assert_array_equal(other[key], first[key], err_msg=key)


def _payload(sizes, counts, rows, item, l2):
    """Bytes one shard's sums carry in an update of ``rows`` rows: each row-split layer's output as often as the
    layer is computed (``counts``, its forward passes), each column-split layer's input delta but layer 0's, and
    the L2 penalty's float64."""
    n = len(sizes) - 1
    row = [(n - 1 - layer) % 2 == 0 for layer in range(n)]
    return (rows * item * (sum(counts[layer] * sizes[layer + 1] for layer in range(n) if row[layer])
                           + sum(sizes[layer] for layer in range(1, n) if not row[layer]))
            + (8 if np.any(l2) else 0))


@pytest.mark.parametrize("name", ["lab", "cross_entropy_l2", "uneven", "uneven_odd"])
def test_bytes_per_update_and_predicted_memory(trained, name):
    from fastckpt.core.layout import param_layout, tensor_split
    ranks, results = trained
    sizes, l2 = CASES[name]["sizes"], CASES[name].get("l2", 0.0)
    sent = np.mean([_payload(sizes, [1] * (len(sizes) - 1), rows, 8, l2) for rows in BATCHES])
    for r, saved in enumerate(results[name]):                 # the mean over the updates, as an Allreduce sends
        assert float(saved["bytes_per_update"]) == pytest.approx(sent * 2 * (ranks - 1) / ranks, abs=1)
        parts = {k[5:]: int(v) for k, v in saved.items() if k.startswith("pred ") and k != "pred total"}
        assert int(saved["pred total"]) == sum(parts.values())
        local = tensor_split(sizes, ranks, r)[0]            # the shard's own widths, laid out as a net's
        assert parts["parameters"] == param_layout(local, 8)[1] * 8 == parts["gradients"]
        assert parts["sums"] == max(BATCHES) * 8 * max([local[layer + 1] for layer in range(len(local) - 1)
                                                       if (len(local) - 2 - layer) % 2 == 0]
                                                      + [local[layer] for layer in range(1, len(local) - 1)
                                                         if (len(local) - 2 - layer) % 2])
    # the slices add up to the net, and every rank holds the whole bias of each row-split layer
    n = len(sizes) - 1
    rows = [layer for layer in range(n) if (n - 1 - layer) % 2 == 0]
    held = [tensor_split(sizes, ranks, r)[0] for r in range(ranks)]
    weights = sum(a * b for a, b in zip(sizes[:-1], sizes[1:]))
    biases = sum(sizes[layer + 1] * (ranks if layer in rows else 1) for layer in range(n))
    assert sum(sum(a * b + b for a, b in zip(w[:-1], w[1:])) for w in held) == weights + biases


@pytest.mark.parametrize("name", ["deep_sqrt", "deep_revolve", "deep_fit"])
def test_checkpointed_split_layers_train_as_plain_ones_bit_for_bit(trained, name):
    """A strategy keeps fewer states and recomputes the rest, with their sums: the same bits as plain (fit
    recomputes at batch 16 only; the plan kept is the last batch's, 10 rows, plain)."""
    ranks, results = trained
    for plain, mine in zip(results["deep_plain"], results[name]):
        for key in plain:
            if key[:2] in ("w_", "b_", "lo"):
                np.testing.assert_array_equal(mine[key], plain[key], err_msg=key)
        assert int(mine["pred workspace"]) < int(plain["pred workspace"]) or name == "deep_fit"
        assert int(mine["bytes_per_update"]) > int(plain["bytes_per_update"])      # the recomputed messages


@pytest.mark.parametrize("name", ["deep_sqrt", "every2_l2", "deep_revolve"])
def test_checkpointed_split_layers_hold_and_send_what_they_say(trained, name):
    """A shard keeps what its plan keeps (of the widest shard's tree, NOTE [ One engine for every part ]) and
    sends each row-split layer's output once per forward pass, the recomputed ones' again."""
    from fastckpt.planner import plan, shard_plan
    ranks, results = trained
    sizes, strategy = CASES[name]["sizes"], CASES[name]["strategy"]
    whole = plan(sizes, BATCHES[-1], strategy=strategy)
    assert (whole.forward_counts > 1).any()               # something is dropped and recomputed
    for r, saved in enumerate(results[name]):
        mine = shard_plan(sizes, max(BATCHES), strategy=strategy, shards=ranks, shard=r)    # the buffers made
        assert list(mine.forward_counts) == list(shard_plan(sizes, 1, strategy=strategy, shards=ranks,
                                                            shard=0).forward_counts)
        sent = np.mean([_payload(sizes, list(mine.forward_counts), rows, 8, CASES[name].get("l2")) for rows in BATCHES])
        assert float(saved["bytes_per_update"]) == pytest.approx(sent * 2 * (ranks - 1) / ranks, abs=1)
        assert int(saved["pred workspace"]) == mine.arena_elems * 8


MEMRAY_DRIVER = textwrap.dedent("""
    import json, sys
    import numpy as np
    from mpi4py import MPI
    from fastckpt.parallel import TensorParallelTrainer
    from fastckpt.report.measure import memray_peak
    sizes, batch = [784] + [256] * 8 + [10], 512
    rng = np.random.default_rng(0)
    x, y = rng.random((batch, 784)), rng.random((batch, 10))
    out = {}
    for strategy in ("plain", "sqrt", "revolve(2)", "budget(4MiB)", "fit(24MiB)"):
        np.random.seed(0)
        memray_peak(lambda: TensorParallelTrainer(sizes, strategy=strategy).update_mini_batch(x, y, 0.1))  # warm-up
        held = {}

        def run():
            np.random.seed(0)
            held["t"] = t = TensorParallelTrainer(sizes, strategy=strategy)
            for _ in range(2):
                t.update_mini_batch(x, y, 0.1)
        out[strategy] = (memray_peak(run), held["t"].predicted_bytes())
    every = MPI.COMM_WORLD.gather(out)
    if MPI.COMM_WORLD.rank == 0:
        print(json.dumps(every))
""")


@pytest.mark.memory
def test_each_ranks_memray_peak_is_its_predicted_bytes_plain_and_checkpointed(tmp_path):
    script = tmp_path / "memray_driver.py"
    script.write_text(MEMRAY_DRIVER)
    proc = subprocess.run([MPIEXEC, "-n", "2", sys.executable, str(script)], capture_output=True, text=True,
                          timeout=LIMIT)
    assert proc.returncode == 0, proc.stderr
    for rank, out in enumerate(json.loads(proc.stdout.splitlines()[-1])):
        for strategy, (peak, predicted) in out.items():
            assert abs(peak - predicted["total"]) <= 64 * 1024, (rank, strategy, peak, predicted)
        saved = out["plain"][1]["workspace"] - out["sqrt"][1]["workspace"]
        assert saved > 0 and abs((out["plain"][0] - out["sqrt"][0]) - saved) <= 64 * 1024, (rank, out)


# D replicas x T shards on 4 ranks (NOTE [ Tensor x data ] in fastckpt/parallel/tensor.py)
GRID = {
    "lab_2x2": dict(sizes=[784, 40, 30, 10], data_parallel=2),
    "l2_2x2": dict(sizes=[784, 40, 30, 10], loss="cross_entropy", l2=[1e-3, 0.0, 2e-2], data_parallel=2),
    "adam_2x2": dict(sizes=[33, 9, 6, 5, 3], optimizer="adam", activation="relu", init="he", eta=0.01,
                     data_parallel=2),
    "lab_4x1": dict(sizes=[784, 40, 30, 10], data_parallel=4),
}


@pytest.fixture(scope="module")
def grid(driver, tmp_path_factory):
    out = tmp_path_factory.mktemp("grid")
    cases = {name: dict(case, batches=BATCHES) for name, case in GRID.items()}
    code, _, err, _ = run(driver, 4, {"out": str(out), "cases": cases})
    assert code == 0, err
    return {name: [dict(np.load(out / f"{name}.rank{r}.npz")) for r in range(4)] for name in GRID}


@pytest.mark.parametrize("name", list(GRID))
def test_a_tensor_x_data_grid_trains_as_one_process(grid, name):
    args = dict(GRID[name])
    args.pop("data_parallel")
    eta = args.pop("eta", ETA)
    np.random.seed(0)
    net = fastckpt.Network(args.pop("sizes"), **args)
    saved = grid[name][0]
    replicas = GRID[name]["data_parallel"]
    start, losses = 0, []
    for size in BATCHES:                                  # the replicas' mini-batches together
        net.update_mini_batch(saved["x"][start:start + replicas * size], saved["y"][start:start + replicas * size],
                              eta)
        losses.append(net.last_loss)
        start += replicas * size
    n = len(net.weights)
    for mine in grid[name]:                               # every rank gathers the same net, one process's
        for got, want in zip(layers(mine, "w", n) + layers(mine, "b", n), list(net.weights) + list(net.biases)):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(mine["losses"], losses, rtol=1e-12)
    shards = 4 // replicas
    grad = int(saved["pred gradients"])
    assert int(saved["pred replica_sum"]) == grad > 0     # mpich's temporary of the sum over the replicas
    assert saved["bytes_per_update"] >= grad * 2 * (replicas - 1) // replicas
    if shards == 1:                                       # no tensor messages: the gradient's sum alone
        assert int(saved["bytes_per_update"]) == grad * 2 * (replicas - 1) // replicas


@pytest.mark.parametrize("flags, said", [
    (["-n", "3", "--data-parallel", "2"], "--data-parallel 2 with --tensor-parallel needs a multiple of 2 ranks"),
    (["-n", "2", "--micro-batches", "2", "--batch-size", "1"],
     "--batch-size 1 is too small for --micro-batches 2: every micro-batch needs at least one row"),
])
def test_a_grid_that_cannot_be_made_is_refused_in_one_line(flags, said):
    ranks, rest = flags[:2], flags[2:]
    proc = subprocess.run([MPIEXEC, *ranks, sys.executable, "-m", "fastckpt", "train", "--tensor-parallel",
                           "--epochs", "1", *rest], capture_output=True, text=True, timeout=LIMIT)
    assert proc.returncode == 2 and said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_a_non_finite_loss_is_a_floating_point_error_on_every_rank_with_weights_unchanged(driver, tmp_path):
    scales = [1.0, 1e200, 1.0, 1.0, 1.0]                 # (a - y)^2 overflows at the second update
    case = dict(CASES["lab"], batches=BATCHES, y_scale=scales)
    code, _, err, seconds = run(driver, 2, {"out": str(tmp_path), "cases": {"lab": case}})
    assert code == 0 and seconds < LIMIT, err
    saved = [dict(np.load(tmp_path / f"lab.rank{r}.npz")) for r in range(2)]
    for mine in saved:
        assert list(mine["errors"]) == ["update 1: the loss is inf or a gradient is NaN or inf; weights left "
                                        "unchanged on every rank"]
    net, losses = reference(CASES["lab"], saved[0], scales)
    assert np.isnan(losses[1])
    for got, want in zip(layers(saved[0], "w", 3) + layers(saved[0], "b", 3), list(net.weights) + list(net.biases)):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("case, message", [
    (dict(sizes=[784, 1, 10]), "ValueError: layer 0 splits its outputs, sizes[1] = 1 units, over 2 ranks, but "
                               "every rank needs at least one; use at most 1 rank or widen that layer"),
    (dict(sizes=[784, 40, 30, 10], eta=-1), "ValueError: eta must be finite and >= 0, got -1"),
    (dict(sizes=[784, 40, 30, 10], x_width=783), "ValueError: x has shape (10, 783): 783 values per sample, "
                                                 "but the network's input layer has 784 units"),
    (dict(sizes=[784, 40, 10], dtype="float16"), "TypeError: dtype must be float32 or float64, got 'float16'"),
    (dict(sizes=[784, 40, 10], l2=[0.1]), "ValueError: l2 must be one number or one per layer (2), got 1 values"),
], ids=["narrow-layer", "eta", "x-shape", "dtype", "l2"])
@pytest.mark.sweep(first=2)
def test_a_bad_argument_is_the_same_clear_error_on_every_rank(driver, tmp_path, case, message):
    code, out, err, seconds = run(driver, 2, {"out": str(tmp_path), "cases": {"bad": dict(case, batches=[10])}})
    assert code != 0 and seconds < LIMIT
    assert err.count(message) == 2, err                  # raised by each rank, not one rank and an abort
    assert "Abort" not in err and not list(tmp_path.glob("*.npz"))


def test_ranks_seeded_differently_are_refused_on_every_rank(driver, tmp_path):
    specs = [json.dumps({"out": str(tmp_path), "cases": {"c": dict(sizes=[784, 40, 10], batches=[10], seed=s)}})
             for s in (0, 1)]
    proc = subprocess.run([MPIEXEC, "-n", "1", sys.executable, str(driver), specs[0], ":",
                           "-n", "1", sys.executable, str(driver), specs[1]],
                          capture_output=True, text=True, timeout=LIMIT)
    assert proc.returncode != 0
    said = "ValueError: the 2 ranks were started with different settings: np.random state (seed every rank alike)"
    assert proc.stderr.count(said) == 2, proc.stderr


def test_an_update_refused_on_one_rank_ends_the_job(driver, tmp_path):
    case = dict(CASES["float32"], batches=BATCHES)
    code, _, err, seconds = run(driver, 2, {"out": str(tmp_path), "cases": {"c": case}, "refuse_on_rank": ["1"]})
    assert code == 1 and seconds < LIMIT, err
    assert ("fastckpt: rank 1 of 2 failed: FloatingPointError: the update would make a parameter NaN or inf; "
            "weights left unchanged; ending the job") in err
    assert not list(tmp_path.glob("*.npz"))


def test_another_eta_on_one_rank_is_the_same_error_on_every_rank(driver, tmp_path):
    case = dict(CASES["float32"], batches=BATCHES)
    code, _, err, seconds = run(driver, 2, {"out": str(tmp_path), "cases": {"c": case}, "eta_of_rank": {"1": 1e300}})
    assert code != 0 and seconds < LIMIT, err
    assert err.count("ValueError: the 2 ranks were started with different settings: eta and mini-batches per "
                     "update") == 2
    assert "Abort" not in err


def test_a_dying_rank_ends_the_run_within_bounded_time(driver, tmp_path):
    # each rank's shell writes its PID (kept by exec) to pid.<rank>: the ranks are found by PID, not by name
    pid_of = ["sh", "-c", 'echo $$ > "$0.${PMI_RANK:-$OMPI_COMM_WORLD_RANK}" && exec "$@"', str(tmp_path / "pid")]
    started = tmp_path / "started"
    case = dict(CASES["lab"], batches=BATCHES, repeat=10**6)     # far longer than the test waits
    spec = {"out": str(tmp_path), "cases": {"c": case}, "started": str(started)}
    job = subprocess.Popen([MPIEXEC, "-n", "2", *pid_of, sys.executable, str(driver), json.dumps(spec)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        files = [tmp_path / f"pid.{rank}" for rank in range(2)]
        deadline = time.monotonic() + LIMIT
        while not (started.exists() and all(f.exists() and f.read_text().strip() for f in files)):
            assert time.monotonic() < deadline and job.poll() is None, "the ranks never started training"
            time.sleep(0.1)
        psutil.Process(int(files[1].read_text())).kill()
        t0 = time.monotonic()
        job.wait(timeout=LIMIT)                                 # raises if the survivor hangs
        assert job.returncode != 0 and time.monotonic() - t0 < 30
        assert not list(tmp_path.glob("*.npz"))                 # rank 0 did not finish either
    finally:
        if job.poll() is None:
            job.kill()


@needs_mpi
@pytest.mark.parametrize("net", [[], ["--activation", "tanh", "--init", "xavier", "--optimizer", "momentum",
                                      "--sizes", "784,48,32,24,10"], ["--data-parallel", "2"],
                                 ["--strategy", "sqrt", "--sizes", "784,48,40,32,24,16,10"]],
                         ids=["lab", "tanh-xavier-momentum", "2x2-grid", "sqrt"])
@pytest.mark.sweep('lab', '2x2-grid')
def test_cli_tensor_parallel_trains_like_one_process(tmp_path, net):
    outs = [tmp_path / "tp.npz", tmp_path / "one.npz"]
    # 10 updates: over hundreds, summation-order differences grow chaotically in one process too
    train = [sys.executable, "-m", "fastckpt", "train", "--epochs", "1", "--batch-size", "400", "--loss",
             "cross_entropy", "--l2", "0.001", "--json", *net, "--save"]
    grid = "--data-parallel" in net
    proc = subprocess.run([MPIEXEC, "-n", "4" if grid else "2", *train, str(outs[0]), "--tensor-parallel"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    if grid:                                   # 2 replicas' mini-batches of 400: one process's of 800
        said = json.loads(proc.stdout)
        assert (said["tensor_parallel"], said["data_parallel"]) == (2, 2), said
        train = [arg for arg in train if arg not in ("--data-parallel", "2")]
        train[train.index("--batch-size") + 1] = "800"
    one = subprocess.run([*train, str(outs[1])], capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr
    assert_same_saved_net(*outs)
    assert json.loads(proc.stdout)["accuracies"] == pytest.approx(json.loads(one.stdout)["accuracies"], abs=1e-9)
