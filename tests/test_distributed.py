"""MPI data parallelism, driven through mpiexec as a user would; every run has a time limit."""
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

import fastckpt

MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
needs_mpi = pytest.mark.skipif(MPIEXEC is None or not __import__("importlib").util.find_spec("mpi4py"),
                               reason="needs mpi4py and mpiexec (pip install mpi4py mpich)")
TRAIN = [sys.executable, "-m", "fastckpt", "train"]


@needs_mpi
def test_two_ranks_give_the_weights_of_one_process_on_the_concatenated_batches(tmp_path):
    out = tmp_path / "w.npz"
    proc = subprocess.run([MPIEXEC, "-n", "2", *TRAIN, "--mpi", "--sizes", "784,20,10", "--epochs", "2",
                           "--batch-size", "10", "--eta", "1.0", "--save", str(out), "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)                     # rank 0 alone prints
    assert result["ranks"] == 2 and result["updates"] == 2 * 200
    (x, y), _ = fastckpt.load_mnist()
    np.random.seed(0)
    net = fastckpt.NetworkWithCheckpointing([784, 20, 10], strategy="plain")
    for _ in range(2):
        for start in range(0, 4000, 20):                 # rank 0 takes the first 10, rank 1 the next 10
            net.update_mini_batch(x[start:start + 20], y[start:start + 20], 1.0)
    saved = fastckpt.load(out)
    for got, ref in zip(saved.weights + saved.biases, net.weights + net.biases):
        np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-13)


@needs_mpi
def test_several_minibatches_per_rank_share_one_exchange(tmp_path):
    out = tmp_path / "w.npz"
    proc = subprocess.run([MPIEXEC, "-n", "2", *TRAIN, "--mpi", "--parallel-batches", "4", "--sizes", "784,20,10",
                           "--epochs", "1", "--batch-size", "10", "--eta", "1.0", "--save", str(out), "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["updates"] == 100
    (x, y), _ = fastckpt.load_mnist()
    np.random.seed(0)
    net = fastckpt.NetworkWithCheckpointing([784, 20, 10], strategy="plain")
    for start in range(0, 4000, 40):
        net.update_mini_batch(x[start:start + 40], y[start:start + 40], 1.0)
    saved = fastckpt.load(out)
    for got, ref in zip(saved.weights + saved.biases, net.weights + net.biases):
        np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-13)
    bad = subprocess.run([MPIEXEC, "-n", "2", *TRAIN, "--mpi", "--parallel-batches", "3"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "parallel_batches must be a multiple of the 2 replicas, got 3" in bad.stderr


@needs_mpi
@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_an_optimizer_with_state_steps_on_the_mean_gradient_of_every_rank(tmp_path, optimizer):
    """Two ranks, two minibatches each per update: the optimizer's step on the mean of the four batch-mean
    gradients, the state identical on every rank and saved with the net."""
    out = tmp_path / "w.npz"
    proc = subprocess.run([MPIEXEC, "-n", "2", *TRAIN, "--mpi", "--parallel-batches", "4", "--sizes", "784,20,10",
                           "--epochs", "1", "--batch-size", "10", "--eta", "0.01", "--optimizer", optimizer,
                           "--activation", "relu", "--init", "he", "--save", str(out), "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (x, y), _ = fastckpt.load_mnist()
    np.random.seed(0)
    net = fastckpt.Network([784, 20, 10], optimizer=optimizer, activation="relu", init="he")
    for start in range(0, 4000, 40):
        grads = [net.backprop(x[k:k + 10], y[k:k + 10]) for k in range(start, start + 40, 10)]
        mean = net.params.new_buffer()
        w, b = fastckpt.core.layout.layer_views(mean, net.sizes)
        for layer in range(2):
            w[layer][...] = sum(g[1][layer] for g in grads) / 4
            b[layer][...] = sum(g[0][layer] for g in grads).ravel() / 4
        net.optimizer_state.apply(net.params, mean, 0.01)
    saved = fastckpt.load(out)
    assert saved.optimizer_state.steps == net.optimizer_state.steps == 100
    for got, ref in zip(saved.weights + saved.biases + saved.optimizer_state.buffers,
                        net.weights + net.biases + net.optimizer_state.buffers):
        np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-12)      # another order of summation


@needs_mpi
def test_checkpointing_runs_unchanged_on_each_rank(tmp_path):
    paths = []
    for strategy in ("plain", "revolve(1)"):
        paths.append(tmp_path / f"{strategy}.npz")
        proc = subprocess.run([MPIEXEC, "-n", "2", *TRAIN, "--mpi", "--sizes", "784,20,16,10", "--epochs", "1",
                               "--strategy", strategy, "--save", str(paths[-1]), "--json"],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
    plain, ckpt = fastckpt.load(paths[0]), fastckpt.load(paths[1])
    assert str(ckpt.strategy) == "revolve(1)"
    for a, b in zip(plain.weights + plain.biases, ckpt.weights + ckpt.biases):
        np.testing.assert_array_equal(a, b)                     # recompute is bit-identical


@needs_mpi
def test_every_minibatch_is_trained_as_on_threads(tmp_path):
    """20 minibatches on 3 ranks: 7 updates, the last averaging the 2 left, as --threads 3 does."""
    runs = {}
    for name, mode in (("mpi", [MPIEXEC, "-n", "3", *TRAIN, "--mpi"]), ("threads", [*TRAIN, "--threads", "3"])):
        runs[name] = tmp_path / f"{name}.npz"
        proc = subprocess.run([*mode, "--sizes", "784,20,10", "--batch-size", "200", "--epochs", "1", "--json",
                               "--save", str(runs[name])], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout[proc.stdout.index("{"):])["updates"] == 7
    a, b = fastckpt.load(runs["mpi"]), fastckpt.load(runs["threads"])
    for x, y in zip(a.weights + a.biases, b.weights + b.biases):
        np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-13)          # another order of summation


@needs_mpi
def test_a_dying_rank_ends_the_run_within_bounded_time(tmp_path):
    # each rank's shell writes its PID (kept by exec) to pid.<rank>: the ranks are found by PID, not by name
    pid_of = ["sh", "-c", 'echo $$ > "$0.${PMI_RANK:-$OMPI_COMM_WORLD_RANK}" && exec "$@"', str(tmp_path / "pid")]
    job = subprocess.Popen([MPIEXEC, "-n", "2", *pid_of, *TRAIN, "--mpi", "--epochs", "500", "--json"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        files = [tmp_path / f"pid.{rank}" for rank in range(2)]
        deadline = time.monotonic() + 120
        while not all(f.exists() and f.read_text().strip() for f in files) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert all(f.exists() for f in files), "the ranks never started"
        ranks = [psutil.Process(int(f.read_text())) for f in files]
        time.sleep(2.0)                                   # let them train and meet in collectives
        ranks[-1].kill()
        job.wait(timeout=120)                             # raises if the survivor hangs
        assert job.returncode != 0
    finally:
        if job.poll() is None:
            job.kill()


def test_mpi_without_mpi4py_is_a_clear_error():
    code = ("import sys; sys.modules['mpi4py'] = None; from fastckpt.cli import main; "
            "sys.exit(main(['train', '--mpi', '--epochs', '1']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "pip install mpi4py mpich" in proc.stderr and "Traceback" not in proc.stderr


def test_train_on_threads_from_the_command_line():
    proc = subprocess.run([*TRAIN, "--threads", "2", "--parallel-batches", "4", "--epochs", "1", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["threads"] == 2 and result["parallel_batches"] == 4 and result["updates"] == 100


def assert_same_saved_net(path_a, path_b, epochs=1):
    """Two train --save files hold the same settings, epochs and, to 1e-10, the same parameters and optimizer
    state."""
    a, b = fastckpt.load(path_a), fastckpt.load(path_b)
    assert (a.sizes, a.dtype, a.loss, a.l2, str(a.strategy), a.activation, a.optimizer) == \
        (b.sizes, b.dtype, b.loss, b.l2, str(b.strategy), b.activation, b.optimizer)
    assert a.training_state["epochs_done"] == b.training_state["epochs_done"] == epochs
    assert a.optimizer_state.steps == b.optimizer_state.steps
    for x, y in zip(a.weights + a.biases + a.optimizer_state.buffers, b.weights + b.biases + b.optimizer_state.buffers):
        np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-12)


@needs_mpi
@pytest.mark.memory
def test_fit_bounds_what_each_rank_holds():
    """fit(bytes) with --mpi: a rank's step, its gradient sum and the exchange's buffers (memray, every rank)."""
    script = """
import json, numpy as np, fastckpt
from mpi4py import MPI
from fastckpt.distributed import MPITrainer
from fastckpt.report.measure import memray_peak
sizes, batch, bound = [784, 256, 256, 256, 256, 10], 500, 24 * 2**20     # 3.2 MB of it kept for staging rows
rng = np.random.default_rng(MPI.COMM_WORLD.Get_rank())
x, y = rng.random((batch, 784)), rng.random((batch, 10))
np.random.seed(0)
warm = MPITrainer(fastckpt.NetworkWithCheckpointing(sizes, strategy=f"fit({bound})"))
warm.update_mini_batch(x, y, 0.1)
def run():
    np.random.seed(0)
    trainer = MPITrainer(fastckpt.NetworkWithCheckpointing(sizes, strategy=f"fit({bound})"))
    for _ in range(2):
        trainer.update_mini_batch(x, y, 0.1)
rows = MPI.COMM_WORLD.gather([memray_peak(run), warm.predicted_bytes(batch)["total"], bound])
if MPI.COMM_WORLD.Get_rank() == 0:             # one writer: two ranks' lines could interleave
    print(json.dumps(rows))
"""
    proc = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert len(rows) == 2
    for peak, predicted, bound in rows:
        # memray counts Python's objects one by one: the trainer, its plan and the settings' pickles, ~60 KiB
        assert predicted <= bound and peak <= bound + 128 * 1024 and abs(peak - predicted) <= 128 * 1024, rows
