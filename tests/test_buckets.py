"""The data-parallel gradient sum in overlapped buckets (MPITrainer(bucket_bytes=...), train --mpi --bucket-bytes):
the buckets themselves, the same weights as the ordered sum, on every rank, and the memory of a rank."""
import itertools
import json
import subprocess
import sys

import numpy as np
import pytest
from test_distributed import MPIEXEC, TRAIN, needs_mpi

import fastckpt
from fastckpt.core.layout import param_layout
from fastckpt.distributed import MPITrainer
from fastckpt.parallel.buckets import bucket_layers


def test_buckets_are_the_fewest_top_layers_holding_the_bytes(rng):
    """Against the definition, checked layer by layer: from the top, each bucket the shortest run of the
    remaining layers reaching ``bucket_bytes``, or all that remain."""
    for _ in range(200):
        sizes = [int(n) for n in rng.integers(1, 60, size=rng.integers(2, 8))]
        itemsize = int(rng.choice([4, 8]))
        bucket = int(rng.integers(1, 30000))
        starts = [w for w, _ in param_layout(sizes, itemsize)[0]] + [param_layout(sizes, itemsize)[1]]
        expected, hi = [], len(sizes) - 1
        while hi > 0:
            lo = next((lo for lo in reversed(range(hi)) if (starts[hi] - starts[lo]) * itemsize >= bucket), 0)
            expected.append((lo, hi))
            hi = lo
        got = bucket_layers(sizes, itemsize, bucket)
        assert got == expected, (sizes, itemsize, bucket)
        assert [layer for lo, hi in got for layer in reversed(range(lo, hi))] == list(reversed(range(len(sizes) - 1)))


def test_bucket_bytes_must_be_a_positive_count():
    net = fastckpt.Network([4, 3, 2])
    for bad in (0, -5, 1.5, True):
        with pytest.raises((ValueError, TypeError), match="bucket_bytes"):
            MPITrainer(net, bucket_bytes=bad)


def test_train_refuses_bucket_bytes_without_mpi():
    proc = subprocess.run([*TRAIN, "--bucket-bytes", "1MiB", "--epochs", "1"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "--bucket-bytes 1MiB is an option of training over MPI ranks" in proc.stderr


JOB = """
import hashlib, json, sys, numpy as np, fastckpt
from mpi4py import MPI
from fastckpt.distributed import MPITrainer
sizes, rank, ranks = [784, 64, 48, 32, 10], MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
rows = []
for bucket, optimizer, strategy, dtype in json.loads(sys.argv[1]):
    np.random.seed(0)
    net = fastckpt.NetworkWithCheckpointing(sizes, strategy=strategy, optimizer=optimizer, l2=0.01, dtype=dtype)
    trainer = MPITrainer(net, bucket_bytes=bucket)
    rng = np.random.default_rng(rank)
    for u in range(4):      # two minibatches per rank, then an update where only rank 0 has one
        n = 2 if u < 3 else int(rank == 0)
        xs = [rng.random((20, 784)).astype(dtype) for _ in range(n)]
        ys = [rng.random((20, 10)).astype(dtype) for _ in range(n)]
        trainer.update_many(xs, ys, 0.1, count=2 * ranks if u < 3 else 1)
    rows.append(net.params.flat.tolist())
part = np.random.default_rng(rank).standard_normal(100003) * 10.0 ** np.random.default_rng(9).integers(-8, 8, 100003)
ordered, summed = np.zeros_like(part), np.zeros_like(part)
MPI.COMM_WORLD.Reduce(part, ordered, root=0)            # the ordered sum, by hand, against one Allreduce
MPI.COMM_WORLD.Bcast(ordered, root=0)
MPI.COMM_WORLD.Allreduce(part, summed)
rows.append(bool(np.array_equal(ordered, summed)))
everyone = MPI.COMM_WORLD.gather(rows)
if rank == 0:
    print(json.dumps(everyone))
"""


@needs_mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_buckets_give_every_rank_the_same_weights_as_the_ordered_sum(ranks):
    """Buckets of one layer, a few layers and the whole net, with SGD and Adam, plain and checkpointed: every
    rank holds the same bits; with 2 ranks they are the ordered sum's bits (a + b == b + a), with 3 they are
    equal up to rounding (MPI's summation order)."""
    cases = [[bucket, optimizer, strategy, dtype]
             for bucket, (optimizer, strategy, dtype) in itertools.product(
                 [None, 1, 20000, 10**9], [("sgd", "plain", "float64"), ("adam", "sqrt", "float64"),
                                           ("momentum", "revolve(1)", "float32")])]
    proc = subprocess.run([MPIEXEC, "-n", str(ranks), sys.executable, "-c", JOB, json.dumps(cases)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    everyone = json.loads(proc.stdout)
    for rows in everyone[1:]:
        assert rows == everyone[0]                       # every rank the same bits
    # on 2 ranks an Allreduce is the ordered sum bit for bit (so MPITrainer uses one there)
    assert everyone[0][-1] or ranks > 2
    weights = [np.array(w) for w in everyone[0][:-1]]
    for k, case in enumerate(cases):
        ordered = weights[[c[1:] for c in cases].index(case[1:])]          # the same case with bucket None
        dtype = case[3]
        assert np.any(weights[k] != 0)
        if ranks == 2:
            np.testing.assert_array_equal(weights[k], ordered, err_msg=str(case))
        else:
            tol = 1e-12 if dtype == "float64" else 1e-5
            np.testing.assert_allclose(weights[k], ordered, rtol=tol, atol=tol, err_msg=str(case))


@needs_mpi
def test_train_with_buckets_saves_the_net_of_the_ordered_sum(tmp_path):
    """--mpi --bucket-bytes on 2 ranks, 4 minibatches per update and a last update with one: the same file."""
    outs = [tmp_path / "ordered.npz", tmp_path / "buckets.npz"]
    net = ["--mpi", "--sizes", "784,30,20,10", "--epochs", "1", "--batch-size", "30", "--parallel-batches", "4",
           "--optimizer", "adam", "--eta", "0.01", "--strategy", "sqrt", "--json", "--save"]
    for out, extra in zip(outs, ([], ["--bucket-bytes", "8KiB"])):
        proc = subprocess.run([MPIEXEC, "-n", "2", *TRAIN, *net, str(out), *extra], capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = (fastckpt.load(out) for out in outs)
    for x, y in zip(a.weights + a.biases + a.optimizer_state.buffers, b.weights + b.biases + b.optimizer_state.buffers):
        np.testing.assert_array_equal(x, y)


@needs_mpi
@pytest.mark.memory
def test_a_bucketed_rank_holds_what_its_plan_says():
    """memray on every rank: the send and sum buffers and MPI's temporaries of the buckets in flight are the
    three gradient-sized exchange buffers of predicted_bytes, for a net with the optimizer in backward too
    (its step here is the gradients' plan: the ranks' sum comes before any update)."""
    script = """
import json, numpy as np, fastckpt
from mpi4py import MPI
from fastckpt.distributed import MPITrainer
from fastckpt.report.measure import memray_peak
sizes, batch = [784, 256, 256, 256, 256, 10], 500
rng = np.random.default_rng(MPI.COMM_WORLD.Get_rank())
x, y = rng.random((batch, 784)), rng.random((batch, 10))
def run(bucket, fused):
    np.random.seed(0)
    net = fastckpt.NetworkWithCheckpointing(sizes, strategy="sqrt", optimizer_in_backward=fused, optimizer="adam")
    trainer = MPITrainer(net, bucket_bytes=bucket)
    for _ in range(2):
        trainer.update_mini_batch(x, y, 0.1)
    return trainer
rows = []
for bucket, fused in ((2**20, False), (2**30, False), (None, True), (2**20, True)):
    warm = run(bucket, fused)     # a net with the optimizer in backward sums its gradients first here too
    rows.append([memray_peak(lambda: run(bucket, fused)), warm.predicted_bytes(batch)["total"]])
rows = MPI.COMM_WORLD.gather(rows)
if MPI.COMM_WORLD.Get_rank() == 0:
    print(json.dumps(rows))
"""
    proc = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank_rows in json.loads(proc.stdout):
        for peak, predicted in rank_rows:     # memray counts Python's objects one by one: ~60 KiB of them
            assert abs(peak - predicted) <= 128 * 1024, rank_rows


ONE_RANK_WRONG = """
import sys, numpy as np, fastckpt
from mpi4py import MPI
from fastckpt.distributed import Grid, MPITrainer, PipelineTrainer
rank = MPI.COMM_WORLD.Get_rank()
np.random.seed(0)
try:
    if sys.argv[1] == "bucket":
        MPITrainer(fastckpt.Network([784, 30, 10]), bucket_bytes=0 if rank == 0 else 1024)
    else:
        PipelineTrainer([784, 30, 20, 10], 2, grid="x" if rank == 0 else Grid(pipeline=2))
except (ValueError, TypeError) as exc:
    said = MPI.COMM_WORLD.gather(f"rank {rank}: {type(exc).__name__}: {exc}")    # one writer: no interleaving
    if rank == 0:
        print(chr(10).join(said))
"""


@needs_mpi
@pytest.mark.parametrize("kind", ["bucket", "grid"])
def test_a_setting_wrong_on_one_rank_is_refused_on_every_rank(kind):
    """bucket_bytes or grid= wrong on rank 0 alone: every rank raises, none waits for the others."""
    proc = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-c", ONE_RANK_WRONG, kind], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = sorted(proc.stdout.splitlines())
    said = "bucket_bytes must be >= 1, got 0" if kind == "bucket" else "grid must be a fastckpt.distributed.Grid"
    assert len(lines) == 2 and all(said in line for line in lines), lines
    assert "refused on rank 0" in lines[1], lines               # rank 1 names the rank that was wrong


STAGED = """
import json, numpy as np, fastckpt
from mpi4py import MPI
from fastckpt.distributed import MPITrainer
from fastckpt.report.measure import memray_peak
sizes, batch, bound = [784, 256, 256, 256, 256, 10], 500, 24 * 2**20
rng = np.random.default_rng(MPI.COMM_WORLD.Get_rank())
x, labels = rng.random((batch, 784)).astype(np.float32), rng.integers(0, 10, batch)   # both converted
def run():
    np.random.seed(0)
    trainer = MPITrainer(fastckpt.NetworkWithCheckpointing(sizes, strategy=f"fit({bound})"))
    before = trainer.predicted_bytes(batch)["staging"]
    for _ in range(2):
        trainer.update_mini_batch(x, labels, 0.1)
    return trainer, before
warm, before = run()
peak = memray_peak(run)
rows = MPI.COMM_WORLD.gather([peak, warm.predicted_bytes(batch), before])
if MPI.COMM_WORLD.Get_rank() == 0:
    print(json.dumps(rows))
"""


@needs_mpi
@pytest.mark.memory
def test_a_rank_counts_the_rows_its_minibatches_are_converted_into():
    """float32 x and integer labels into a float64 net: each rank's plan counts the staging rows (before the
    first update too), and fit(bytes) keeps memray's peak within the bound."""
    proc = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-c", STAGED], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for peak, predicted, before in json.loads(proc.stdout):
        assert predicted["staging"] == before == 500 * (784 + 10) * 8
        assert peak <= 24 * 2**20 + 128 * 1024 and abs(peak - predicted["total"]) <= 128 * 1024, (peak, predicted)


COUNT = """
import numpy as np, fastckpt
from mpi4py import MPI
from fastckpt.distributed import MPITrainer
rank = MPI.COMM_WORLD.Get_rank()
np.random.seed(0)
trainer = MPITrainer(fastckpt.Network([784, 30, 10]))
x, y = np.random.default_rng(rank).random((10, 784)), np.random.default_rng(rank).random((10, 10))
said = []
for count in (0, 2.5, 1):
    try:
        trainer.update_many([x, x], [y, y], 0.5, count=count)
    except (ValueError, TypeError) as exc:
        said.append(str(exc))
said = MPI.COMM_WORLD.gather(said)
if rank == 0:
    print(chr(10).join(line for rank_said in said for line in rank_said))
"""


@needs_mpi
def test_update_many_refuses_a_bad_count_on_every_rank():
    proc = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-c", COUNT], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 6, lines
    for said in ("count must be >= 1, got 0", "count must be an integer, got 2.5",
                 "count=1 mini-batches in all, but this replica alone has 2"):
        assert sum(said in line for line in lines) == 2, (said, lines)


SENT = """
import json, numpy as np, fastckpt
from mpi4py import MPI
from fastckpt.distributed import MPITrainer
sent = []
for bucket in (None, 10 * 1024, 10**9):
    np.random.seed(0)
    net = fastckpt.Network([784, 64, 10])
    trainer = MPITrainer(net, bucket_bytes=bucket)
    rng = np.random.default_rng(MPI.COMM_WORLD.Get_rank())
    for _ in range(3):
        trainer.update_mini_batch(rng.random((20, 784)), rng.random((20, 10)), 0.1)
    sent.append(trainer.bytes_per_update)
if MPI.COMM_WORLD.Get_rank() == 0:
    print(json.dumps([sent, int(net.params.flat.nbytes)]))
"""


@needs_mpi
def test_bytes_per_update_count_the_buckets_sums():
    """With buckets the gradient's sum over the replicas is sent as without them (it counted 0 there)."""
    proc = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-c", SENT], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sent, nbytes = json.loads(proc.stdout)
    assert sent == [nbytes * 2 * (2 - 1) // 2] * 3, (sent, nbytes)
