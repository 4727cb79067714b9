"""--resume in every MPI mode (MPI data parallelism, pipeline and tensor parallelism): N epochs, or N/2
and a resume for the rest, give the same file bit for bit (parameters, optimizer state, accuracies);
a resume in another mode or on other ranks is refused in one line.  Every run has a time limit."""
import subprocess
import sys

import numpy as np
import pytest
from test_distributed import MPIEXEC, TRAIN, needs_mpi

import fastckpt

NET = ["--sizes", "784,32,24,10", "--activation", "relu", "--init", "he", "--optimizer", "adam", "--eta", "0.002",
       "--batch-size", "40", "--loss", "cross_entropy", "--lr-schedule", "step(1, 0.5)", "--json"]
MODES = {"mpi": ["--mpi"], "pipeline": ["--pipeline", "2", "--micro-batches", "2", "--schedule", "1f1b"],
         "tensor": ["--tensor-parallel"],
         "grid": ["--pipeline", "2", "--data-parallel", "2", "--micro-batches", "2", "--schedule", "zb1"],  # 4 ranks
         "tensor_grid": ["--tensor-parallel", "--data-parallel", "2"],                     # on 4 ranks
         "pipeline_tensor": ["--pipeline", "2", "--tensor-parallel", "--micro-batches", "2", "--schedule", "1f1b",
                             "--strategy", "sqrt"],                                         # on 4 ranks
         "grid_3d": ["--data-parallel", "2", "--pipeline", "2", "--tensor-parallel", "2", "--micro-batches", "2",
                     "--schedule", "zb1"]}                                                  # on 8 ranks
RANKS = {"grid": "4", "tensor_grid": "4", "pipeline_tensor": "4", "grid_3d": "8"}


def _train(mode, *args):
    ranks = RANKS.get(mode, "2")
    proc = subprocess.run([MPIEXEC, "-n", ranks, *TRAIN, *NET, *MODES[mode], *args], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@needs_mpi
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.sweep('mpi')
def test_a_resumed_run_is_the_unbroken_run_bit_for_bit(mode, tmp_path):
    whole, part = tmp_path / "whole.npz", tmp_path / "part.npz"
    _train(mode, "--epochs", "2", "--save", str(whole))
    _train(mode, "--epochs", "1", "--save", str(part))
    _train(mode, "--epochs", "2", "--resume", str(part), "--save", str(part))
    a, b = fastckpt.load(whole), fastckpt.load(part)
    for key in ("epochs_done", "updates_done", "accuracies", "mode"):
        assert a.training_state[key] == b.training_state[key], key
    assert a.training_state["mode"].startswith("with --")
    assert a.optimizer_state.steps == b.optimizer_state.steps == a.training_state["updates_done"]
    for x, y in zip(a.weights + a.biases + a.optimizer_state.buffers,
                    b.weights + b.biases + b.optimizer_state.buffers):
        np.testing.assert_array_equal(x, y)


@needs_mpi
def test_a_pipeline_resume_takes_the_files_micro_batches_schedule_and_transport(tmp_path):
    """--pipeline 2 alone goes on with the file's --micro-batches, --schedule and --transport, as every other
    setting does, bit for bit; one given otherwise is refused."""
    whole, part = tmp_path / "whole.npz", tmp_path / "part.npz"
    shape = ["--pipeline", "2", "--micro-batches", "3", "--schedule", "zb1", "--transport", "bfloat16"]
    for out, epochs in ((whole, "2"), (part, "1")):
        proc = subprocess.run([MPIEXEC, "-n", "2", *TRAIN, *NET, *shape, "--epochs", epochs, "--save", str(out)],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    proc = subprocess.run([MPIEXEC, "-n", "2", *TRAIN, *NET, "--pipeline", "2", "--epochs", "2", "--resume", str(part),
                           "--save", str(part)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = fastckpt.load(whole), fastckpt.load(part)
    assert a.training_state["mode"] == b.training_state["mode"]
    for x, y in zip(a.weights + a.biases + a.optimizer_state.buffers, b.weights + b.biases + b.optimizer_state.buffers):
        np.testing.assert_array_equal(x, y)
    proc = subprocess.run([MPIEXEC, "-n", "2", *TRAIN, *NET, "--pipeline", "2", "--schedule", "1f1b", "--epochs", "3",
                           "--resume", str(part), "--save", str(part)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "--schedule zb1 --transport bfloat16, and this run would go on with " \
        "--data-parallel 1 --pipeline 2 --tensor-parallel 1 --micro-batches 3 --schedule 1f1b --transport bfloat16" \
        in proc.stderr, proc.stderr


@needs_mpi
def test_a_resume_in_another_mode_is_refused_in_one_line(tmp_path):
    part = tmp_path / "part.npz"
    _train("mpi", "--epochs", "1", "--save", str(part))
    for other in ("tensor", "pipeline"):
        proc = subprocess.run([MPIEXEC, "-n", "2", *TRAIN, *NET, *MODES[other], "--epochs", "2", "--resume",
                               str(part), "--save", str(part)], capture_output=True, text=True, timeout=300)
        # every rank says it (their lines may interleave), none with a traceback
        assert proc.returncode == 2 and "Traceback" not in proc.stderr and \
            "was trained with --data-parallel 2 --pipeline 1 --tensor-parallel 1 --micro-batches 1, and this run " \
            "would go on with --" in proc.stderr, proc.stderr
    proc = subprocess.run([*TRAIN, *NET, "--epochs", "2", "--resume", str(part), "--save", str(part)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "this run would go on on one process" in proc.stderr, proc.stderr


LOAD_NET = r"""
import sys, numpy as np, fastckpt
from mpi4py import MPI
from fastckpt.parallel import PipelineTrainer, TensorParallelTrainer
rank = MPI.COMM_WORLD.Get_rank()
np.random.seed(0)
trainer = {"pipeline": lambda: PipelineTrainer([784, 16, 12, 10], 2, optimizer="adam"),
           "tensor": lambda: TensorParallelTrainer([784, 16, 12, 10], optimizer="adam")}[sys.argv[1]]()
np.random.seed(rank if sys.argv[2] == "differ" else 7)
net = None if sys.argv[2] == "none" else fastckpt.Network([784, 16, 12, 10], optimizer="adam")
try:
    trainer.load_net(net)
    weights, _ = trainer.gather()
    said = f"loaded {all(np.array_equal(w, v) for w, v in zip(weights, net.weights))}"
except (TypeError, ValueError) as exc:
    said = f"{type(exc).__name__}: {exc}"
lines = MPI.COMM_WORLD.gather(said)          # one writer: two ranks' lines could interleave
if rank == 0:
    print("\n".join(lines))
"""


@needs_mpi
@pytest.mark.parametrize("mode", ["pipeline", "tensor"])
def test_load_net_is_agreed_by_every_rank(mode):
    """Every rank must give load_net the same net: a different one (or None) on any rank is an error on every
    rank, never a net mixed from two."""
    said = {}
    for case in ("same", "differ", "none"):
        proc = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-c", LOAD_NET, mode, case], capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        said[case] = sorted(proc.stdout.splitlines())
    assert said["same"] == ["loaded True"] * 2
    assert len(said["differ"]) == 2 and all("ValueError: load_net refused on" in line or "differ" in line
                                            for line in said["differ"]), said
    assert len(said["none"]) == 2 and all(line.startswith("TypeError: load_net: net must be a fastckpt Network")
                                          for line in said["none"]), said


@pytest.mark.parametrize("recorded, now", [
    ("with --mpi on 2 ranks", "with --data-parallel 2 --pipeline 1 --tensor-parallel 1 --micro-batches 1"),
    ("with --mpi on 1 rank", "with --data-parallel 1 --pipeline 1 --tensor-parallel 1 --micro-batches 1"),
    ("with --tensor-parallel on 4 ranks", "with --data-parallel 1 --pipeline 1 --tensor-parallel 4 --micro-batches 1"),
    ("with --pipeline 2 --micro-batches 4 --schedule zb1 --transport int8 --partition 2,1",
     "with --data-parallel 1 --pipeline 2 --tensor-parallel 1 --micro-batches 4 --schedule zb1 --transport int8 "
     "--partition 2,1"),
    ("with --pipeline 2 --tensor-parallel 2 --micro-batches 4 --schedule gpipe --transport native",
     "with --data-parallel 1 --pipeline 2 --tensor-parallel 2 --micro-batches 4 --schedule gpipe --transport native"),
    ("on one process", "on one process"),
])
def test_a_file_of_0_3_goes_on_in_the_grid_that_trains_as_it_did(recorded, now):
    """0.3's --mpi is --data-parallel over the ranks (each its own mini-batch, then as now); its pipelines and
    tensor splits of one replica are the same grids today."""
    from fastckpt.cli.resume import file_mode
    assert file_mode(recorded, "old.npz") == now


@pytest.mark.parametrize("recorded", ["with --pipeline 2 --data-parallel 2 --micro-batches 4 --schedule gpipe "
                                      "--transport native", "with --tensor-parallel --data-parallel 2 on 4 ranks"])
def test_a_file_of_0_3_whose_replicas_split_each_mini_batch_is_refused_naming_the_version(recorded):
    from fastckpt.cli.resume import file_mode
    with pytest.raises(ValueError, match=r"^--resume 'old.npz' was trained by fastckpt 0\.3 .*whose replicas split "
                                         r"each mini-batch; today each replica takes a mini-batch of its own"):
        file_mode(recorded, "old.npz")
