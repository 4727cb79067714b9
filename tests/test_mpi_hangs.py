"""No rank waits forever: mixed parallel modes under one mpiexec, and an error in only one rank's part of a
minibatch, are refused on every rank alike.  Each job runs under ``mpiexec`` with a time limit."""
import sys
import textwrap

import pytest
from test_mpi_faults import LIMIT, MPIEXEC, mpiexec

pytestmark = pytest.mark.skipif(MPIEXEC is None or not __import__("importlib").util.find_spec("mpi4py"),
                                reason="needs mpi4py and mpiexec (pip install mpi4py mpich)")
FASTCKPT = [sys.executable, "-m", "fastckpt", "train", "--epochs", "1"]
MODES = {"mpi": (["--mpi"], "data parallel (--mpi)"), "pipeline": (["--pipeline", "2"], "pipeline (--pipeline)"),
         "tensor": (["--tensor-parallel"], "tensor parallel (--tensor-parallel)")}


@pytest.mark.parametrize("first, second", [("mpi", "pipeline"), ("pipeline", "mpi"), ("mpi", "tensor"),
                                           ("tensor", "mpi"), ("pipeline", "tensor")])
def test_ranks_in_different_modes_are_refused_in_one_line(first, second):
    (flags0, mode0), (flags1, mode1) = MODES[first], MODES[second]
    code, out, err, seconds = mpiexec("-n", "1", *FASTCKPT, *flags0, ":", "-n", "1", *FASTCKPT, *flags1)
    assert code == 2 and seconds < LIMIT, (code, err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("fastckpt train: error: ") and f"mode {mode0} on rank 0, {mode1} on rank 1" in err, err


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
               "x contains NaN or inf"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_nan_only_one_rank_reads_is_refused_on_every_rank(tmp_path, case):
    trainer, make, bad_rank, spoil, message = CASES[case]
    script = textwrap.dedent(SCRIPT.format(trainer=trainer, make=make, bad_rank=bad_rank, spoil=spoil))
    code, out, err, seconds = mpiexec("-n", "2", sys.executable, "-c", script, str(tmp_path / "said"), timeout=LIMIT)
    assert code == 0 and seconds < LIMIT, err
    said = [(tmp_path / f"said.{rank}").read_text().splitlines() for rank in (0, 1)]
    assert message in said[bad_rank][0], said                                    # the rank that found it
    other = said[1 - bad_rank][0]
    assert other.startswith(f"the minibatch refused on rank {bad_rank}: ValueError: ") and message in other, said
    assert said[0][1] == said[1][1] == "trained"                                 # and both went on together
