"""Pipeline parallelism as MPI jobs (mpiexec -n 2 and -n 4): against one process, memory, errors.

Every run has a time limit; a hang fails the test instead of stalling the suite.
"""
import json
import os
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
from test_distributed import MPIEXEC, TRAIN, assert_same_saved_net, needs_mpi

import fastckpt

JOB = [sys.executable, os.path.join(os.path.dirname(__file__), "pipeline_job.py")]
DEEP = [784, 48, 40, 36, 32, 28, 24, 10]
MiB = 2**20


def _job(ranks, cases, timeout=300):
    proc = subprocess.run([MPIEXEC, "-n", str(ranks), *JOB, json.dumps(cases)], capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


# Each rank's printed lines are kept and written by rank 0 alone, rank by rank: mpiexec forwards the ranks' writes
# as they come, so two ranks printing at once interleave even inside a line ('trainedtrained 2 steps 1').
ONE_WRITER = ("import io, sys\nsys.stdout = io.StringIO()\n", "\nfrom mpi4py import MPI\n"
              "said = MPI.COMM_WORLD.gather(sys.stdout.getvalue())\nsys.stdout = sys.__stdout__\n"
              "print(''.join(said) if said else '', end='')\n")


def python_on_ranks(code, ranks=2):
    """``mpiexec -n ranks python -c code``, within two minutes: stdout is every rank's printed lines, rank 0's
    first, each rank's whole."""
    code = ONE_WRITER[0] + code + ONE_WRITER[1]
    return subprocess.run([MPIEXEC, "-n", str(ranks), sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)


def _one_process(case, x, y):
    np.random.seed(0)
    net = fastckpt.Network(case["sizes"], dtype=case.get("dtype", np.float64), loss=case.get("loss", "quadratic"),
                           l2=case.get("l2", 0.0), optimizer=case.get("optimizer", "sgd"),
                           activation=case.get("activation", "sigmoid"), init=case.get("init", "lab"))
    before = [w.copy() for w in net.weights + net.biases]
    batch = case.get("batch", 20) * case.get("data_parallel", 1)       # the replicas' mini-batches together
    for u in range(case.get("updates", 3)):
        net.update_mini_batch(x[u * batch:(u + 1) * batch], y[u * batch:(u + 1) * batch], case.get("eta", 1.0))
    return before, net


CASES = {
    2: [dict(sizes=[784, 40, 30, 10]),
        dict(sizes=DEEP, schedule="1f1b", micro=5, batch=23, strategy="sqrt"),
        dict(sizes=DEEP, schedule="gpipe", micro=6, batch=23, strategy="revolve(1)", partition=[4, 3]),
        dict(sizes=DEEP, schedule="1f1b", micro=3, strategy="plain", partition=[5, 2], loss="cross_entropy",
             l2=[0.1, 0, 0, 0.2, 0, 0, 0.3]),
        dict(sizes=DEEP, schedule="zb1", micro=5, batch=23, strategy="sqrt"),
        dict(sizes=DEEP, schedule="zb1", micro=3, strategy="plain", partition=[5, 2], loss="cross_entropy",
             l2=[0.1, 0, 0, 0.2, 0, 0, 0.3], optimizer="adam", eta=0.01),
        # regression: a linear output and the squared error, a linear hidden layer among them
        dict(sizes=DEEP, schedule="1f1b", micro=3, strategy="sqrt", loss="squared_error", init="xavier",
             activation=["tanh", "identity", "relu", "tanh", "relu", "tanh"], l2=0.01, eta=0.05),
        # the optimizer in backward: each stage's layers step as their gradients are final
        dict(sizes=DEEP, micro=1, batch=24, strategy="sqrt", optimizer_in_backward=True),
        dict(sizes=DEEP, schedule="1f1b", micro=1, batch=23, strategy="revolve(1)", optimizer="adam", eta=0.01,
             loss="cross_entropy", l2=0.01, partition=[4, 3], optimizer_in_backward=True),
        dict(sizes=DEEP, schedule="gpipe", micro=1, strategy="plain", optimizer="momentum", eta=0.1,
             optimizer_in_backward=True)],
    4: [dict(sizes=DEEP, schedule="gpipe", micro=5, batch=23, strategy="every_nth(2)", partition=[2, 2, 2, 1]),
        dict(sizes=DEEP, schedule="1f1b", micro=8, batch=24, strategy="plain", partition=[1, 3, 2, 1]),
        dict(sizes=DEEP, schedule="1f1b", micro=3, strategy="revolve(1)", loss="cross_entropy", l2=0.01),
        # data parallelism around the pipeline: 2 replicas x 2 stages, and 4 replicas of one stage
        dict(sizes=DEEP, schedule="1f1b", micro=3, batch=26, strategy="sqrt", data_parallel=2, loss="cross_entropy",
             l2=0.01),
        dict(sizes=DEEP, schedule="gpipe", micro=2, batch=23, strategy="plain", data_parallel=2, partition=[5, 2],
             optimizer="adam", eta=0.01),
        dict(sizes=[784, 40, 30, 10], micro=2, batch=24, data_parallel=4, l2=[0.1, 0.0, 0.2]),
        dict(sizes=DEEP, schedule="zb1", micro=8, batch=24, strategy="revolve(1)", partition=[1, 3, 2, 1],
             loss="cross_entropy", l2=0.01),
        dict(sizes=DEEP, schedule="zb1", micro=3, batch=26, strategy="every_nth(2)", data_parallel=2,
             optimizer="adam", eta=0.01),
        dict(sizes=DEEP, micro=1, batch=24, strategy="plain", partition=[2, 2, 2, 1], l2=0.01, optimizer="adam",
             eta=0.01, optimizer_in_backward=True)],
}


@needs_mpi
@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.sweep('2')
def test_pipelines_equal_one_process_on_the_same_minibatches(ranks, tmp_path):
    cases = [dict(case, out=str(tmp_path / f"{k}.npz")) for k, case in enumerate(CASES[ranks])]
    _job(ranks, cases)
    assert_equal_one_process(cases)


def assert_equal_one_process(cases):
    """Each case's saved run (pipeline_job.py) began from one process's weights, bit for bit, and ended at
    its weights and loss to 1e-10; every replica's copy of a stage (or shard) holds the same bits."""
    (x, y), _ = fastckpt.load_mnist()
    for case in cases:
        before, net = _one_process(case, x, y)
        saved = np.load(case["out"])
        n = 2 * (len(case["sizes"]) - 1)
        for k, ref in enumerate(before):
            np.testing.assert_array_equal(saved[f"arr_{n + k}"], ref)      # the same initial weights
        for k, ref in enumerate(net.weights + net.biases):
            np.testing.assert_allclose(saved[f"arr_{k}"], ref, rtol=1e-10, atol=1e-13, err_msg=str(case))
        assert float(saved["loss"]) == pytest.approx(net.last_loss, rel=1e-10)
        assert 0.0 <= float(saved["bubble"]) < 1.0 and bool(saved["replicas_agree"])


@needs_mpi
@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.sweep('2')
def test_zb1_trains_bit_for_bit_as_1f1b(ranks, tmp_path):
    """zb1 runs 1F1B's passes with each weight gradient put off, summed in the same order: the same bits."""
    base = dict(sizes=DEEP, micro=2 * ranks, batch=24, strategy="sqrt", loss="cross_entropy", l2=0.01,
                optimizer="adam", eta=0.01)
    cases = [dict(base, schedule=kind, out=str(tmp_path / f"{kind}.npz")) for kind in ("1f1b", "zb1")]
    _job(ranks, cases)
    ones, zb1 = (np.load(case["out"]) for case in cases)
    for key in ones.files:
        if key != "bubble":
            np.testing.assert_array_equal(zb1[key], ones[key], err_msg=key)


@needs_mpi
def test_float32_pipelines_follow_one_process(tmp_path):
    case = dict(sizes=DEEP, schedule="1f1b", micro=4, strategy="sqrt", dtype="float32", out=str(tmp_path / "f.npz"))
    _job(2, [case])
    (x, y), _ = fastckpt.load_mnist()
    _, net = _one_process(case, x, y)
    saved = np.load(case["out"])
    for k, ref in enumerate(net.weights + net.biases):          # float32 sums in another order
        np.testing.assert_allclose(saved[f"arr_{k}"], ref, rtol=1e-4, atol=1e-6)


@needs_mpi
@pytest.mark.memory
def test_each_ranks_memray_peak_is_its_plan(tmp_path):
    sizes = [784] + [256] * 8 + [10]
    cases = [dict(sizes=sizes, batch=256, micro=4, schedule=schedule, strategy=strategy, transport=transport,
                  optimizer=optimizer, memray=True, out=str(tmp_path / f"{schedule}-{strategy}-{transport}-"
                                                                      f"{optimizer}.json"))
             for schedule, strategy, transport, optimizer in [
                 ("gpipe", "plain", "native", "sgd"), ("gpipe", "sqrt", "native", "sgd"),
                 ("1f1b", "plain", "native", "sgd"), ("1f1b", "revolve(1)", "int8", "sgd"),
                 ("gpipe", "every_nth(2)", "float16", "sgd"), ("1f1b", "sqrt", "native", "adam"),
                 ("zb1", "plain", "native", "sgd"), ("zb1", "sqrt", "bfloat16", "adam")]]
    cases.append(dict(cases[-1], x_dtype="float32", out=str(tmp_path / "float32-x.json")))   # x copied: counted
    cases.append(dict(cases[5], micro=1, optimizer_in_backward=True, out=str(tmp_path / "fused.json")))
    bound = 11_500_000                                # fit with x converted: the partition and plans leave room
    cases.append(dict(cases[0], strategy=f"fit({bound})", x_dtype="float32", out=str(tmp_path / "fit-x.json")))
    _job(2, cases, timeout=400)
    for case in cases:
        for rank, (peak, predicted) in enumerate(json.load(open(case["out"]))):
            total = predicted["total"]
            assert (predicted["optimizer_state"] == 2 * predicted["parameters"]) == (case["optimizer"] == "adam")
            assert (predicted["deferred_weights"] > 0) == (case["schedule"] == "zb1")
            assert (predicted["gradients"] == 0) == case.get("optimizer_in_backward", False)
            converted = case.get("x_dtype") is not None and rank == 0         # MNIST's float64 rows go as they are
            assert predicted["staging"] == (256 * 784 * 8 if converted else 0)
            if case["strategy"].startswith("fit"):
                assert peak <= bound + 128 * 1024, (rank, peak, predicted)
            assert abs(peak - total) <= 0.02 * total + MiB, (case["out"], rank, peak, predicted)


@needs_mpi
@pytest.mark.memory
@pytest.mark.slow
def test_each_ranks_memray_peak_is_its_plan_with_replicas(tmp_path):
    """2 data-parallel replicas of 2 stages: each rank's plan counts the Allreduce's temporary too."""
    cases = [dict(sizes=[784] + [256] * 8 + [10], batch=256, micro=4, schedule="1f1b", strategy=strategy,
                  data_parallel=2, memray=True, out=str(tmp_path / f"{strategy}.json"))
             for strategy in ("plain", "sqrt")]
    _job(4, cases, timeout=400)
    for case in cases:
        for rank, (peak, predicted) in enumerate(json.load(open(case["out"]))):
            assert predicted["replica_sum"] == predicted["parameters"] > 0
            total = predicted["total"]
            assert abs(peak - total) <= 0.02 * total + MiB, (case["out"], rank, peak, predicted)


@needs_mpi
@pytest.mark.parametrize("ranks, grid", [(4, ["--schedule", "1f1b"]), (8, ["--tensor-parallel", "--schedule", "zb1"])],
                         ids=["2x2", "2x2x2"])
@pytest.mark.sweep('2x2')
def test_cli_data_parallel_pipelines_train_like_one_process(tmp_path, ranks, grid):
    """NOTE [ One meaning of data parallelism ]: --data-parallel 2 x --pipeline 2 on 4 ranks (and with its stages
    split over 2 tensor ranks each on 8) trains the net, and Adam's state, of --data-parallel 2 on 2 ranks, and
    of one process on the replicas' mini-batches together (--batch-size 20 for 2 x 10)."""
    outs = [tmp_path / "grid.npz", tmp_path / "data.npz", tmp_path / "one.npz"]
    net = ["--activation", "relu", "--init", "he", "--optimizer", "adam", "--eta", "0.002", "--sizes",
           "784,48,32,24,10", "--epochs", "1", "--strategy", "sqrt", "--json", "--save"]
    proc = subprocess.run([MPIEXEC, "-n", str(ranks), *TRAIN, "--pipeline", "2", "--data-parallel", "2",
                           "--micro-batches", "2", *grid, *net, str(outs[0])], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert (result["pipeline"], result["data_parallel"], result["ranks"]) == (2, 2, ranks)
    assert result["tensor_parallel"] == ranks // 4 and result["updates"] == 4000 // 20
    data = subprocess.run([MPIEXEC, "-n", "2", *TRAIN, "--data-parallel", "2", *net, str(outs[1])],
                          capture_output=True, text=True, timeout=300)
    assert data.returncode == 0, data.stderr[-3000:]
    one = subprocess.run([*TRAIN, "--batch-size", "20", *net, str(outs[2])], capture_output=True, text=True,
                         timeout=300)
    assert one.returncode == 0, one.stderr
    assert_same_saved_net(outs[0], outs[1])
    assert_same_saved_net(outs[0], outs[2])
    bad = subprocess.run([MPIEXEC, "-n", "2", *TRAIN, "--pipeline", "2", "--data-parallel", "2", "--epochs", "1"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--data-parallel 2 x --pipeline 2 needs 4 ranks (mpiexec -n 4), got 2" in bad.stderr


@needs_mpi
@pytest.mark.memory
def test_checkpointing_inside_stages_lowers_their_peak(tmp_path):
    """A net whose plain step needs more than a set limit per process trains on 2 ranks with
    checkpointing inside each stage, each rank within the limit."""
    sizes, batch = [784] + [256] * 16 + [10], 4000
    limit = 32 * MiB
    assert fastckpt.plan(sizes, batch).bytes()["total"] > 4 * limit            # 154 MiB in one process
    from fastckpt.parallel.pipeline.partition import stage_bytes
    from fastckpt.parallel.pipeline.schedules import schedule
    for strategy, fits in (("plain", False), ("sqrt", True)):
        totals = [stage_bytes(sizes, lo, hi, batch // 8, np.float64, strategy, schedule("1f1b", s, 2, 8))["total"]
                  for s, (lo, hi) in enumerate([(0, 8), (8, 17)])]
        assert (max(totals) <= limit) == fits, (strategy, totals)
    cases = [dict(sizes=sizes, batch=batch, micro=8, schedule="1f1b", strategy="sqrt", partition=[8, 9],
                  updates=1, memray=True, out=str(tmp_path / "big.json"))]
    _job(2, cases, timeout=400)
    for peak, predicted in json.load(open(cases[0]["out"])):
        assert peak <= limit, (peak, predicted)


@needs_mpi
@pytest.mark.parametrize("net", [[], ["--activation", "relu", "--init", "he", "--optimizer", "adam", "--eta", "0.001",
                                      "--sizes", "784,48,32,24,10"]], ids=["lab", "relu-he-adam"])
@pytest.mark.sweep('lab')
def test_cli_pipeline_trains_like_one_process(tmp_path, net):
    """Each stage its own layers' activation, initial draw and optimizer state, as one process has them."""
    outs = [tmp_path / "pipe.npz", tmp_path / "one.npz"]
    proc = subprocess.run([MPIEXEC, "-n", "2", *TRAIN, "--pipeline", "2", "--micro-batches", "3", "--schedule",
                           "1f1b", "--strategy", "sqrt", "--epochs", "1", "--save", str(outs[0]), "--json", *net],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["pipeline"] == 2 and result["updates"] == 400 and result["schedule"] == "1f1b"
    one = subprocess.run([*TRAIN, "--strategy", "sqrt", "--epochs", "1", "--save", str(outs[1]), "--json", *net],
                         capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr
    assert_same_saved_net(*outs)
    assert result["accuracies"] == pytest.approx(json.loads(one.stdout)["accuracies"], abs=1e-9)


@needs_mpi
@pytest.mark.parametrize("args, message", [
    (["--pipeline", "3"], "--pipeline 3 needs 3 ranks (mpiexec -n 3), got 2"),
    (["--pipeline", "2", "--partition", "2,2"], "partition must give the layers of each of the 2 stages"),
    (["--pipeline", "2", "--strategy", "segments(3)"], "does not fit stage 0"),
    (["--pipeline", "2", "--micro-batches", "11"], "--batch-size 10 is too small for --micro-batches 11"),
    (["--pipeline", "2", "--tensor-parallel", "3"], "--pipeline 2 x --tensor-parallel 3 needs 6 ranks (mpiexec -n 6), "
                                                   "got 2"),
    (["--pipeline", "2", "--data-parallel", "2", "--tensor-parallel"], "--data-parallel 2 x --pipeline 2 with "
                                                                      "--tensor-parallel needs a multiple of 4 ranks"),
    (["--pipeline", "2", "--mpi"], "--mpi is --data-parallel over every rank of the job; it does not combine with "
                                   "--data-parallel, --pipeline or --tensor-parallel"),
])
def test_bad_pipeline_settings_are_one_clear_error_not_a_hang(args, message):
    t0 = time.monotonic()
    proc = subprocess.run([MPIEXEC, "-n", "2", *TRAIN, "--epochs", "1", *args], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert time.monotonic() - t0 < 120


@needs_mpi
def test_ranks_started_with_different_settings_all_refuse(tmp_path):
    code = ("import numpy as np, os; from fastckpt.parallel import PipelineTrainer\n"
            "r = int(os.environ.get('PMI_RANK', 0))\n"
            "try:\n"
            "    PipelineTrainer([784, 30, 20, 10], 2 + r)\n"
            "except ValueError as exc:\n"
            "    print('refused:', exc)\n")
    proc = python_on_ranks(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("the 2 ranks were started with different settings: micro_batches 2 on rank 0, "
                             "3 on rank 1") == 2, proc.stdout


@needs_mpi
@pytest.mark.parametrize("ranks, micro, fused", [(2, 2, False), (3, 1, True)], ids=["micro2", "fused3"])
def test_a_non_finite_loss_is_refused_on_every_rank_and_training_goes_on(ranks, micro, fused):
    """With the optimizer in backward too (NOTE [ The optimizer in backward across stages ]): no stage steps."""
    code = ("import numpy as np; from fastckpt.parallel import PipelineTrainer\n"
            f"np.random.seed(0); t = PipelineTrainer([20, 8, 7, 6, 3], {micro}, schedule='1f1b', strategy='sqrt', "
            f"optimizer='adam', optimizer_in_backward={fused})\n"
            "x = np.random.rand(8, 20); y = np.full((8, 3), 1e300)\n"
            "before = t.gather()\n"
            "try:\n"
            "    t.update_mini_batch(x, y, 0.5)\n"
            "except FloatingPointError as exc:\n"
            "    print('refused', t.places.stage, exc)\n"
            "after = t.gather()\n"
            "assert all((a == b).all() for a, b in zip(before[0] + before[1], after[0] + after[1]))\n"
            "t.update_mini_batch(x, np.zeros((8, 3)), 0.5)\n"
            "print('trained', t.places.stage, 'steps', t.optimizer_state.steps)\n")
    proc = python_on_ranks(code, ranks)
    assert proc.returncode == 0, proc.stderr
    said = [line.split(" ", 2) for line in proc.stdout.splitlines()]
    assert [s[:2] for s in said] == [w for r in range(ranks) for w in (["refused", str(r)], ["trained", str(r)])], said
    assert all("the loss is inf or a gradient is NaN or inf" in s[2] for s in said[::2]), said
    assert all(s[2] == "steps 1" for s in said[1::2]), said  # Adam counted the one step taken, as one process does


@needs_mpi
def test_a_non_finite_update_in_backward_ends_the_job_naming_the_layer():
    """The layers after it have stepped, as in one process, so the ranks cannot go on alike."""
    code = ("import numpy as np; from fastckpt.parallel import PipelineTrainer\n"
            "np.random.seed(0); t = PipelineTrainer([20, 8, 7, 6, 3], 1, strategy='sqrt', optimizer_in_backward=True)\n"
            "t.update_mini_batch(np.random.rand(8, 20), np.full((8, 3), -1e10), 1e300)\n"
            "print('went on')\n")
    proc = python_on_ranks(code)
    assert proc.returncode != 0 and "went on" not in proc.stdout, proc.stdout
    assert "layer 3's update would be NaN or inf with the optimizer in backward" in proc.stderr, proc.stderr


@needs_mpi
def test_a_dying_stage_ends_the_pipeline_within_bounded_time(tmp_path):
    pid_of = ["sh", "-c", 'echo $$ > "$0.${PMI_RANK:-$OMPI_COMM_WORLD_RANK}" && exec "$@"', str(tmp_path / "pid")]
    job = subprocess.Popen([MPIEXEC, "-n", "2", *pid_of, *TRAIN, "--pipeline", "2", "--schedule", "1f1b",
                            "--epochs", "500", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        files = [tmp_path / f"pid.{rank}" for rank in range(2)]
        deadline = time.monotonic() + 120
        while not all(f.exists() and f.read_text().strip() for f in files) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert all(f.exists() for f in files), "the ranks never started"
        ranks = [psutil.Process(int(f.read_text())) for f in files]
        time.sleep(3.0)                                   # let them train and wait on each other
        ranks[0].kill()
        job.wait(timeout=120)                             # raises if the survivor hangs
        assert job.returncode != 0
    finally:
        if job.poll() is None:
            job.kill()


@needs_mpi
@pytest.mark.memory
def test_fit_bounds_each_stage_with_its_micro_batches_in_flight(tmp_path):
    """--max-memory with --pipeline bounds what each rank holds, not one micro-batch's step."""
    sizes, batch, bound = [784] + [256] * 16 + [10], 2048, 30 * MiB
    cases = [dict(sizes=sizes, batch=batch, micro=8, schedule="gpipe", strategy=f"fit({bound})", updates=1,
                  memray=True, out=str(tmp_path / "fit.json"))]
    _job(2, cases, timeout=400)
    for rank, (peak, predicted) in enumerate(json.load(open(cases[0]["out"]))):
        assert predicted["total"] <= bound, (rank, predicted)
        assert peak <= bound + 0.02 * bound + MiB, (rank, peak, predicted)          # the stages' stated accuracy
    small = subprocess.run([MPIEXEC, "-n", "2", *TRAIN, "--pipeline", "2", "--micro-batches", "8", "--sizes",
                            ",".join(map(str, sizes)), "--batch-size", str(batch), "--max-memory", "16MiB"],
                           capture_output=True, text=True, timeout=300)
    assert small.returncode == 2 and "no split of the 17 layers into 2 stages fits 16MiB per rank: the least any " \
        "split needs is " in small.stderr, small.stderr


@needs_mpi
@pytest.mark.parametrize("transport", ["native", "int8"])
def test_a_diverging_pipeline_stops_as_one_process_does_not_as_bad_input(transport):
    """Adam at eta 1e308 makes a stage's output NaN: the message goes as zeros and every stage refuses the
    update (exit 1, the divergence line), where the transport used to refuse the NaN as bad input (exit 2)."""
    proc = subprocess.run([MPIEXEC, "-n", "2", *TRAIN, "--pipeline", "2", "--sizes", "784,32,10", "--epochs", "1",
                           "--optimizer", "adam", "--eta", "1e308", "--transport", transport], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1 and "training stopped at epoch 1/1, update 2/" in proc.stderr, proc.stderr
    assert "refuses non-finite" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@needs_mpi
def test_the_optimizer_in_backward_is_refused_where_gradients_are_summed_first():
    """Several micro-batches, replicas or zb1's put-off weight gradients: refused on every rank, naming why."""
    code = ("from fastckpt.parallel import PipelineTrainer\n"
            "for kw in (dict(micro_batches=2), dict(micro_batches=1, schedule='zb1')):\n"
            "    try:\n"
            "        PipelineTrainer([20, 8, 7, 3], optimizer_in_backward=True, **kw)\n"
            "    except ValueError as exc:\n"
            "        print('refused:', exc)\n")
    proc = python_on_ranks(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("micro_batches=2 (--micro-batches) gradients are summed over replicas") == 2
    assert proc.stdout.count("schedule 'zb1' puts the weight gradients off; give '1f1b' or 'gpipe'") == 2


@needs_mpi
def test_cli_pipeline_with_the_optimizer_in_backward_trains_the_one_process_net(tmp_path):
    """--optimizer-in-backward makes one micro-batch --pipeline's default (the only one it takes); several given
    are refused naming the flags."""
    outs = [tmp_path / "pipe.npz", tmp_path / "one.npz"]
    net = ["--sizes", "784,24,16,10", "--epochs", "1", "--optimizer", "adam", "--eta", "0.002", "--strategy", "sqrt",
           "--optimizer-in-backward", "--save"]
    proc = subprocess.run([MPIEXEC, "-n", "2", *TRAIN, "--pipeline", "2", *net, str(outs[0])], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    one = subprocess.run([*TRAIN, *net, str(outs[1])], capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr
    assert_same_saved_net(outs[0], outs[1])
    bad = subprocess.run([MPIEXEC, "-n", "2", *TRAIN, "--pipeline", "2", "--micro-batches", "2", *net[:-1]],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "micro_batches=2 (--micro-batches)" in bad.stderr, bad.stderr[-2000:]


@needs_mpi
@pytest.mark.parametrize("fused", [False, True], ids=["after", "in-backward"])
def test_an_l2_penalty_of_inf_is_a_non_finite_loss_on_every_rank_and_update_many_takes_one_with_it(fused):
    """The penalty alone overflowing (the update itself finite) refuses the step as one process does; with the
    optimizer in backward, update_many takes exactly one mini-batch (it steps on one gradient)."""
    code = ("import numpy as np; from fastckpt.distributed import Grid, Trainer\n"
            "rng = np.random.default_rng(0); x = rng.random((8, 20)); y = np.eye(3)[rng.integers(0, 3, 8)]\n"
            f"np.random.seed(0); t = Trainer([20, 8, 7, 6, 5, 3], grid=Grid(pipeline=2), strategy='sqrt', "
            f"l2=[1e307, 0, 0, 0, 0], optimizer_in_backward={fused})\n"
            "before = t.gather()\n"
            "try:\n"
            "    t.update_mini_batch(x, y, 1e-3)\n"
            "except FloatingPointError as exc:\n"
            "    print('refused', exc)\n"
            "after = t.gather()\n"
            "assert all((a == b).all() for a, b in zip(before[0] + before[1], after[0] + after[1]))\n"
            "try:\n"
            f"    t.update_many([x, x], [y, y], 1e-3) if {fused} else None\n"
            "except ValueError as exc:\n"
            "    print('refused', exc)\n")
    proc = python_on_ranks(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("the loss is inf or a gradient is NaN or inf; weights left unchanged") == 2, proc.stdout
    assert proc.stdout.count("give update_many one mini-batch and count=1, got 2") == (2 if fused else 0)
