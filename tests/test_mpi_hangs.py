"""No rank waits forever: mixed parallel modes under one mpiexec, and an error in only one rank's part of a
minibatch, are refused on every rank alike.  Each job runs under ``mpiexec`` with a time limit."""
import os
import subprocess
import sys
import textwrap

import pytest
from test_mpi_faults import LIMIT, MPIEXEC, mpiexec

pytestmark = pytest.mark.skipif(MPIEXEC is None or not __import__("importlib").util.find_spec("mpi4py"),
                                reason="needs mpi4py and mpiexec (pip install mpi4py mpich)")
FASTCKPT = [sys.executable, "-m", "fastckpt", "train", "--epochs", "1"]
MODES = {"mpi": (["--mpi"], "Grid(data=2, pipeline=1, tensor=1)"),
         "pipeline": (["--pipeline", "2"], "Grid(data=1, pipeline=2, tensor=1)"),
         "tensor": (["--tensor-parallel"], "Grid(data=1, pipeline=1, tensor=2)")}


@pytest.mark.parametrize("first, second", [("mpi", "pipeline"), ("pipeline", "mpi"), ("mpi", "tensor"),
                                           ("tensor", "mpi"), ("pipeline", "tensor")])
@pytest.mark.sweep(first=2)
def test_ranks_in_different_modes_are_refused_in_one_line(first, second):
    (flags0, mode0), (flags1, mode1) = MODES[first], MODES[second]
    code, out, err, seconds = mpiexec("-n", "1", *FASTCKPT, *flags0, ":", "-n", "1", *FASTCKPT, *flags1)
    assert code == 2 and seconds < LIMIT, (code, err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("fastckpt train: error: ") and f"grid {mode0} on rank 0, {mode1} on rank 1" in err, err


SCRIPT = """
import sys, numpy as np, fastckpt
from mpi4py import MPI
from fastckpt.distributed import {trainer}
rank = MPI.COMM_WORLD.Get_rank()
np.random.seed(0)
trainer = {make}
(x, y), _ = fastckpt.load_mnist()
x, y = clean = x[:40].copy(), y[:40].copy()
x, y = x.copy(), y.copy()
if rank == {bad_rank}:
    {spoil}
said = []
for attempt in range(2):                       # refused on every rank, and every rank can go on
    try:
        trainer.update_mini_batch(x, y, 0.5)
        said.append("trained")
    except ValueError as exc:
        said.append(str(exc))
    x, y = clean
with open(f"{{sys.argv[1]}}.{{rank}}", "w") as f:
    f.write("\\n".join(said))
"""

CASES = {   # (trainer, constructor, rank whose data is spoiled, how, what that rank says)
    "pipeline-x": ("PipelineTrainer", "PipelineTrainer([784, 30, 20, 10], 2)", 0, "x[3, 5] = np.nan", "x holds NaN"),
    "pipeline-y": ("PipelineTrainer", "PipelineTrainer([784, 30, 20, 10], 2)", 1, "y[3, 5] = np.inf",
                   "y holds NaN or inf"),
    "tensor": ("TensorParallelTrainer", "TensorParallelTrainer([784, 30, 20, 10])", 1, "x[0, 0] = np.nan",
               "x holds NaN or inf"),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.sweep(first=2)
def test_a_nan_only_one_rank_reads_is_refused_on_every_rank(tmp_path, case):
    trainer, make, bad_rank, spoil, message = CASES[case]
    script = textwrap.dedent(SCRIPT.format(trainer=trainer, make=make, bad_rank=bad_rank, spoil=spoil))
    code, out, err, seconds = mpiexec("-n", "2", sys.executable, "-c", script, str(tmp_path / "said"), timeout=LIMIT)
    assert code == 0 and seconds < LIMIT, err
    said = [(tmp_path / f"said.{rank}").read_text().splitlines() for rank in (0, 1)]
    assert message in said[bad_rank][0], said                                    # the rank that found it
    other = said[1 - bad_rank][0]
    assert other.startswith(f"the mini-batch refused on rank {bad_rank}: ValueError: ") and message in other, said
    assert said[0][1] == said[1][1] == "trained"                                 # and both went on together


SAVE_FAILS = """
import sys
from fastckpt.cli.guard import RankGuard
from fastckpt.cli.resume import Saver
guard = RankGuard()
save = Saver(sys.argv[1], force=False, guard=guard)

def write(path, exclusive):                     # rank 0's save fails, as a full disk or a file made meanwhile would
    raise OSError(28, "No space left on device")
try:
    save(write)
    said = "saved"
except ValueError as exc:
    said = str(exc)
guard.finish()
with open(f"{sys.argv[1]}.{guard.rank}", "w") as f:
    f.write(said)
"""


def test_a_save_that_fails_on_rank_0_is_raised_on_every_rank(tmp_path):
    code, out, err, seconds = mpiexec("-n", "2", sys.executable, "-c", SAVE_FAILS, str(tmp_path / "w.npz"))
    assert code == 0 and seconds < LIMIT, err
    said = [(tmp_path / f"w.npz.{rank}").read_text() for rank in (0, 1)]
    assert said[0] == said[1] == "[Errno 28] No space left on device", said


@pytest.mark.parametrize("other", [["plan"], ["--version"], ["train", "--mpi", "--help"], ["compare"]])
@pytest.mark.sweep(first=2)
def test_a_command_that_is_not_a_training_rank_ends_the_job_instead_of_leaving_it_waiting(other):
    code, out, err, seconds = mpiexec("-n", "1", *FASTCKPT, "--mpi", ":", "-n", "1", sys.executable, "-m",
                                      "fastckpt", *other)
    assert code == 2 and seconds < LIMIT, (code, err)
    assert "was started by mpiexec as one of 2 processes: only train --mpi, --pipeline P or --tensor-parallel " \
        "runs as a rank" in err, err


@pytest.mark.parametrize("mode", ["mpi", "pipeline", "tensor"])
def test_save_given_on_one_rank_only_is_refused_on_every_rank(tmp_path, mode):
    flags = MODES[mode][0]
    code, out, err, seconds = mpiexec("-n", "1", *FASTCKPT, *flags, "--sizes", "784,16,10", "--save",
                                      str(tmp_path / "p.npz"), ":", "-n", "1", *FASTCKPT, *flags, "--sizes",
                                      "784,16,10")
    assert code == 2 and seconds < LIMIT, (code, err)
    assert "the command lines refused" in err or "--save given on rank 0, not given on rank 1" in err, err
    assert not (tmp_path / "p.npz").exists()


MISMATCHED_ETA = """
import sys, numpy as np, fastckpt
from mpi4py import MPI
from fastckpt.distributed import MPITrainer
rank = MPI.COMM_WORLD.Get_rank()
np.random.seed(0)
trainer = MPITrainer(fastckpt.Network([20, 8, 4]))
x, y = np.random.default_rng(0).random((10, 20)), np.eye(4)[np.arange(10) % 4]
try:
    trainer.update_mini_batch(x, y, 0.1 if rank == 0 else 5.0)
    said = "trained"
except ValueError as exc:
    said = str(exc)
trainer.update_mini_batch(x, y, 0.1)                          # and both go on together
with open(f"{sys.argv[1]}.{rank}", "w") as f:
    f.write(said + "\\n" + str(float(np.sum(trainer.net.weights[0]))))
"""


def test_mpi_trainer_ranks_given_different_etas_refuse_the_update_together(tmp_path):
    code, out, err, seconds = mpiexec("-n", "2", sys.executable, "-c", MISMATCHED_ETA, str(tmp_path / "said"))
    assert code == 0 and seconds < LIMIT, err
    said = [(tmp_path / f"said.{rank}").read_text().splitlines() for rank in (0, 1)]
    assert said[0][0] == said[1][0] and "eta 0.1, 2 mini-batches in all on rank 0, eta 5.0" in said[0][0], said
    assert said[0][1] == said[1][1]                                              # the same weights after


USER_SCRIPT_RAISES = """
import os, sys, numpy as np, fastckpt
from mpi4py import MPI
from fastckpt.distributed import {trainer}
{switch}
rank = MPI.COMM_WORLD.Get_rank()
np.random.seed(0)
trainer = {make}
x, y = np.random.default_rng(0).random((10, 20)), np.eye(4)[np.arange(10) % 4]
trainer.{update}(x, y, 0.1)
with open(f"{{sys.argv[1]}}.{{rank}}", "w") as f:
    f.write(str(sys.excepthook is sys.__excepthook__))
if rank == 1 and {raises}:
    raise ValueError("the minibatch only rank 1 reads is bad")
trainer.{update}(x, y, 0.1)                    # rank 0 waits here for a rank that will never come
"""
USER_TRAINERS = {"mpi": ("MPITrainer", "MPITrainer(fastckpt.Network([20, 8, 4]))", "update_mini_batch"),
                 "pipeline": ("PipelineTrainer", "PipelineTrainer([20, 8, 6, 4], 2)", "update_mini_batch"),
                 "tensor": ("TensorParallelTrainer", "TensorParallelTrainer([20, 8, 6, 4])", "update_mini_batch")}


@pytest.mark.parametrize("mode", list(USER_TRAINERS))
@pytest.mark.sweep(first=1)
def test_a_user_script_raising_on_one_rank_ends_the_job_with_its_traceback(tmp_path, mode):
    trainer, make, update = USER_TRAINERS[mode]
    script = USER_SCRIPT_RAISES.format(trainer=trainer, make=make, update=update, switch="", raises=True)
    code, out, err, seconds = mpiexec("-n", "2", sys.executable, "-c", script, str(tmp_path / "hooked"))
    assert code == 2 and seconds < LIMIT, (code, err)
    assert "Traceback" in err and "ValueError: the minibatch only rank 1 reads is bad" in err, err
    assert "fastckpt: rank 1 of 2 failed: ValueError: the minibatch only rank 1 reads is bad; ending the job" in err
    assert [(tmp_path / f"hooked.{rank}").read_text() for rank in (0, 1)] == ["False", "False"]


@pytest.mark.parametrize("switch", ["fastckpt.distributed.abort_on_uncaught(False)", "environment"])
@pytest.mark.sweep('environment')
def test_the_abort_on_an_uncaught_exception_can_be_turned_off(tmp_path, switch):
    """Off, every rank raising leaves as Python does (exit 1, no abort line); on, the same job aborts (exit 2)."""
    trainer, make, update = USER_TRAINERS["mpi"]
    env = dict(os.environ, FASTCKPT_ABORT_ON_UNCAUGHT="0") if switch == "environment" else None
    script = USER_SCRIPT_RAISES.format(trainer=trainer, make=make, update=update, raises=True,
                                       switch="" if switch == "environment" else switch).replace("rank == 1 and ", "")
    proc = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-c", script, str(tmp_path / "off")],
                          capture_output=True, text=True, timeout=LIMIT, env=env)
    # both ranks' tracebacks (their lines may interleave: count the message, not the line)
    assert proc.returncode == 1 and proc.stderr.count("the minibatch only rank 1 reads is bad") == 2, proc.stderr
    assert "ending the job" not in proc.stderr, proc.stderr
    on = USER_SCRIPT_RAISES.format(trainer=trainer, make=make, update=update, raises=True, switch="")
    code, out, err, seconds = mpiexec("-n", "2", sys.executable, "-c", on.replace("rank == 1 and ", ""),
                                      str(tmp_path / "on"))
    assert code == 2 and "ending the job" in err, (code, err)


OVERFLOW = """
import sys, numpy as np, fastckpt
from mpi4py import MPI
from fastckpt.distributed import PipelineTrainer, TensorParallelTrainer
rank = MPI.COMM_WORLD.Get_rank()
np.random.seed(0)
net = fastckpt.Network([6, 5, 4, 3], activation="relu", loss="cross_entropy")
net.weights = [np.ones((5, 6)), np.ones((4, 5)), np.ones((3, 4))]     # 6 x 1e308 is inf: the softmax of inf is NaN
trainer = {make}
trainer.load_net(net)
x = np.vstack([np.zeros(6), np.ones(6), np.full(6, 1e308)])
said = []
for rows in (x, x[:2]):                        # refused on every rank, and every rank goes on
    try:
        said.append(str(trainer.evaluate(rows, np.zeros(len(rows), int))))
    except ValueError as exc:
        said.append(str(exc))
with open(f"{{sys.argv[1]}}.{{rank}}", "w") as f:
    f.write("\\n".join(said))
"""


@pytest.mark.parametrize("make", ["PipelineTrainer([6, 5, 4, 3], 2, activation='relu', loss='cross_entropy')",
                                  "TensorParallelTrainer([6, 5, 4, 3], activation='relu', loss='cross_entropy')"])
def test_an_output_that_overflows_inside_a_split_net_is_refused_on_every_rank(tmp_path, make):
    """The last stage alone sees the pipeline's output: it runs every chunk, then every rank raises what it found
    (an accuracy that counted NaN as class 0 used to come back)."""
    script = textwrap.dedent(OVERFLOW.format(make=make))
    code, out, err, seconds = mpiexec("-n", "2", sys.executable, "-c", script, str(tmp_path / "said"), timeout=LIMIT)
    assert code == 0 and seconds < LIMIT, err
    said = [(tmp_path / f"said.{rank}").read_text().splitlines() for rank in (0, 1)]
    assert said[0] == said[1], said
    assert said[0][0] == "x_test_data row 2 makes the net's output nan: a value overflowed float64 inside the net " \
                         "(the input is finite, but too large for these weights), so it has no prediction"
    assert 0 <= float(said[0][1]) <= 1, said                   # the finite rows alone: an accuracy


LONE_GRID = """
import numpy as np, fastckpt
from mpi4py import MPI
from fastckpt.distributed import Grid, MPITrainer, PipelineTrainer
rank = MPI.COMM_WORLD.Get_rank()
np.random.seed(0)
if rank == MPI.COMM_WORLD.Get_size() - 1:
    grid = Grid(data=3)                          # this rank alone: refused where it is made, and not caught
else:
    grid = {grid}
    trainer = {make}
    trainer.update_mini_batch(np.zeros((8, 784)), np.zeros((8, 10)), 0.1)
"""


@pytest.mark.parametrize("ranks, grid, make", [
    (4, "Grid(data=2, pipeline=2)", "PipelineTrainer([784, 20, 10], 2, grid=grid)"),
    (2, "Grid(data=2)", "MPITrainer(fastckpt.Network([784, 20, 10]), grid=grid)")])
def test_a_grid_refused_on_one_rank_before_any_trainer_ends_the_job(ranks, grid, make):
    """The other ranks used to wait in their trainer's first collective forever (still there after 90 s): the hook
    that ends the job on an uncaught exception is armed by whatever of fastckpt touches MPI first."""
    script = textwrap.dedent(LONE_GRID.format(grid=grid, make=make))
    code, out, err, seconds = mpiexec("-n", str(ranks), sys.executable, "-c", script, timeout=LIMIT)
    assert code == 2 and seconds < LIMIT, (code, err)
    assert f"fastckpt: rank {ranks - 1} of {ranks} failed: ValueError: Grid(data=3, pipeline=1, tensor=1) needs data " \
           f"x pipeline x tensor = 3 ranks; this communicator has {ranks}; ending the job" in err, err


DIFFERENT = """
import sys, numpy as np, fastckpt
from mpi4py import MPI
from fastckpt.distributed import Grid, Trainer
rank = MPI.COMM_WORLD.Get_rank()
np.random.seed(0)
trainer = Trainer([784, 30, 20, 10], grid=Grid({grid}){options})
(x, y), (tx, ty) = fastckpt.load_mnist()
said = []
for what in ("update", "evaluate", "update again"):
    try:
        if what == "evaluate":             # another number of test rows on rank 1
            said.append(str(trainer.evaluate(tx[:100 + 7 * rank], ty[:100 + 7 * rank])))
        else:                              # the same rows on every rank the second time
            at = 40 * rank if what == "update" else 0
            trainer.update_mini_batch(x[at:at + 40], y[at:at + 40], 0.5)
            said.append("trained")
    except ValueError as exc:
        said.append(str(exc))
with open(f"{{sys.argv[1]}}.{{rank}}", "w") as f:
    f.write("\\n".join(said))
"""


@pytest.mark.parametrize("grid, options", [("tensor=2", ""), ("pipeline=2", ", micro_batches=2"),
                                           ("tensor=2", ", optimizer_in_backward=True")],
                         ids=["tensor", "pipeline", "tensor-in-backward"])
@pytest.mark.sweep(first=2)
def test_shards_given_different_mini_batches_or_test_rows_refuse_on_every_rank(tmp_path, grid, options):
    """Every rank of a replica is given the whole mini-batch (tensor shards read all of it, a pipeline's first
    stage x and its last y): different ones are refused on each, never trained on (a pipeline trained on one
    rank's x with another's y).  Every rank runs
    evaluate on the same test rows: another number of rows on one rank is refused on every rank (it used to
    hang, or count another rank's rows)."""
    script = textwrap.dedent(DIFFERENT.format(grid=grid, options=options))
    code, out, err, seconds = mpiexec("-n", "2", sys.executable, "-c", script, str(tmp_path / "said"), timeout=LIMIT)
    assert code == 0 and seconds < LIMIT, err
    said = [(tmp_path / f"said.{rank}").read_text().splitlines() for rank in (0, 1)]
    assert all("the 2 ranks of replica 0 were given different mini-batches" in s[0] for s in said), said
    assert all(s[1].startswith("the 2 ranks were given different test data") for s in said), said
    assert all("100 rows" in s[1] and "107 rows" in s[1] for s in said), said
    assert said[0][2] == said[1][2] == "trained", said
