"""fastckpt.distributed.Grid: the ranks' roles, given to any trainer as grid=, under mpiexec."""
import json
import subprocess
import sys

import pytest
from test_distributed import MPIEXEC, needs_mpi

from fastckpt.distributed import Grid


@pytest.mark.parametrize("kw,error", [
    (dict(data=0), "data must be >= 1, got 0"), (dict(pipeline=-1), "pipeline must be >= 1, got -1"),
    (dict(tensor=1.5), "tensor must be an integer, got 1.5"), (dict(data=True), "data must be an integer")])
def test_a_bad_grid_is_refused_before_any_mpi(kw, error):
    with pytest.raises((ValueError, TypeError), match=error):
        Grid(**kw)


JOB = """
import json, numpy as np, fastckpt
from mpi4py import MPI
from fastckpt.distributed import Grid, MPITrainer, PipelineTrainer, TensorParallelTrainer
world = MPI.COMM_WORLD
rank, sizes = world.Get_rank(), [784, 24, 20, 16, 10]
rng = np.random.default_rng(5)
x, y = rng.random((24, 784)), rng.random((24, 10))
out = {"coords": [Grid(data=2, pipeline=2).coords(r) for r in range(4)] + [Grid(data=2, tensor=2).coords(3)]
          + [Grid(pipeline=2, tensor=2).coords(r) for r in range(4)]}

def trained(make):
    np.random.seed(0)
    trainer = make()
    for _ in range(2):
        (trainer.update_mini_batch if hasattr(trainer, "update_mini_batch") else trainer.update)(x, y, 0.5)
    return [a.tolist() for a in trainer.gather()[0]] if hasattr(trainer, "gather") else trainer.net.params.flat.tolist()

out["pipeline"] = [trained(lambda: PipelineTrainer(sizes, 2, schedule="zb1", optimizer="adam", **kw))
                   for kw in (dict(data_parallel=2), dict(grid=Grid(data=2, pipeline=2)))]
out["tensor"] = [trained(lambda: TensorParallelTrainer(sizes, strategy="sqrt", **kw))
                 for kw in (dict(data_parallel=2), dict(grid=Grid(data=2, tensor=2)))]
out["stages of shards"] = [trained(lambda: PipelineTrainer(sizes, 2, schedule="zb1", strategy="sqrt", **kw))
                           for kw in (dict(tensor_parallel=2), dict(grid=Grid(pipeline=2, tensor=2)))]
out["data"] = [trained(lambda: MPITrainer(fastckpt.Network(sizes), **kw)) for kw in (dict(), dict(grid=Grid(data=4)))]
errors = []
for make in (lambda: Grid(data=3),
             lambda: PipelineTrainer(sizes, 2, strategy="revolve(1)", grid=Grid(pipeline=2, tensor=2)),
             lambda: PipelineTrainer(sizes, 2, grid=Grid(pipeline=2, tensor=2), tensor_parallel=2),
             lambda: PipelineTrainer(sizes, 2, tensor_parallel=3),
             lambda: TensorParallelTrainer(sizes, grid=Grid(data=1, pipeline=4)),
             lambda: MPITrainer(fastckpt.Network(sizes), grid=Grid(pipeline=4)),
             lambda: PipelineTrainer(sizes, 2, grid=Grid(data=2, pipeline=2), data_parallel=2),
             lambda: MPITrainer(fastckpt.Network(sizes), grid="2x2")):
    try:
        make()
        errors.append(None)
    except (ValueError, TypeError) as exc:
        errors.append(str(exc))
out["errors"] = errors
everyone = world.gather(out)
if rank == 0:
    print(json.dumps(everyone))
"""


@needs_mpi
def test_a_grid_runs_each_trainer_as_its_own_arguments_do():
    """On 4 ranks: Grid(data=2, pipeline=2), Grid(data=2, tensor=2) and Grid(data=4) train bit for bit as the
    0.3 names' data_parallel=2 (or the world) do; the coordinates follow the replicas' numbering; a grid that
    does not fit the job or the trainer is refused, naming what is wrong."""
    proc = subprocess.run([MPIEXEC, "-n", "4", sys.executable, "-c", JOB], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    everyone = json.loads(proc.stdout)
    for out in everyone:
        assert out["coords"] == [[0, 0, 0], [0, 1, 0], [1, 0, 0], [1, 1, 0], [1, 0, 1],
                                 [0, 0, 0], [0, 0, 1], [0, 1, 0], [0, 1, 1]]
        for kind in ("pipeline", "tensor", "stages of shards", "data"):
            assert out[kind][0] == out[kind][1], kind
        assert out["errors"] == [
            "Grid(data=3, pipeline=1, tensor=1) needs data x pipeline x tensor = 3 ranks; this communicator has 4",
            None,                                     # revolve inside stages split over shards: the engine's plan
            "give grid=Grid(data=1, pipeline=2, tensor=2) or comm, data_parallel and tensor_parallel, not both",
            "data=1 x tensor=3 needs a multiple of 3 ranks (3 x pipeline), got 4",
            None,                                     # one trainer: a pipeline grid is as good as any
            "net= trains a whole net on each rank; Grid(data=1, pipeline=4, tensor=1) splits it: give sizes instead",
            "give grid=Grid(data=2, pipeline=2, tensor=1) or comm, data_parallel and tensor_parallel, not both",
            "grid must be a fastckpt.distributed.Grid, got str"]
    assert all(out["data"][0] == everyone[0]["data"][0] for out in everyone)
