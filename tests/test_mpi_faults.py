"""No MPI rank waits forever: every fault on one rank ends the whole job, with a message naming the rank.

Each job runs under ``mpiexec`` with a time limit; ranks are found by the PID
each one writes at start, never by name.
"""
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
pytestmark = pytest.mark.skipif(MPIEXEC is None or not __import__("importlib").util.find_spec("mpi4py"),
                                reason="needs mpi4py and mpiexec (pip install mpi4py mpich)")
TRAIN = [sys.executable, "-m", "fastckpt", "train", "--mpi"]
LIMIT = 120                        # seconds before a job counts as hung


def mpiexec(*parts, timeout=LIMIT):
    """Run ``mpiexec parts...``; (returncode, stdout, stderr, seconds)."""
    t0 = time.monotonic()
    proc = subprocess.run([MPIEXEC, *parts], capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0


def writing_pid(prefix, cmd):
    """``cmd`` started by a shell that first writes its PID to ``<prefix>.<rank>``; exec keeps the PID."""
    return ["sh", "-c", 'echo $$ > "$0.${PMI_RANK:-$OMPI_COMM_WORLD_RANK}" && exec "$@"', str(prefix), *cmd]


def wait_for(condition, seconds, what):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {seconds} s"
        time.sleep(0.1)


def gone(pid):
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("other, message", [
    (["--batch-size", "20"], "batch_size 10 on rank 0, 20 on rank 1"),
    (["--eta", "0.5"], "eta 3.0 on rank 0, 0.5 on rank 1"),
    (["--epochs", "2"], "epochs 1 on rank 0, 2 on rank 1"),
    (["--seed", "1"], "np.random state (seed every rank alike) sha256 "),
    (["--strategy", "sqrt"], "strategy plain on rank 0, sqrt on rank 1"),
    (["--loss", "cross_entropy"], "loss quadratic on rank 0, cross_entropy on rank 1"),
    (["--sizes", "784,40,10"], "sizes [784, 40, 30, 10] on rank 0, [784, 40, 10] on rank 1"),
], ids=["batch", "eta", "epochs", "seed", "strategy", "loss", "sizes"])
@pytest.mark.sweep(first=2)
def test_ranks_started_with_different_settings_are_refused_by_rank_0(other, message):
    base = [*TRAIN, "--epochs", "1"]
    code, out, err, seconds = mpiexec("-n", "1", *base, ":", "-n", "1", *base, *other)
    assert code == 2, err
    assert len(err.splitlines()) == 1, err                                   # from rank 0 alone
    assert err.startswith("fastckpt train: error: the 2 ranks were started with different settings: ")
    assert message in err and "epoch 1/" not in out and seconds < LIMIT


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("bad, message", [
    (["--data", "/nonexistent/mnist.npz"], "fastckpt train: error: --data '/nonexistent/mnist.npz': no such file"),
    (["--sizes", "100,10"], "fastckpt train: error: --sizes 100,10 do not fit the data"),          # past the guard
    (["--batch-size", "x"], "fastckpt train: error: argument --batch-size: must be an integer, got 'x'"),
], ids=["data", "sizes", "argument"])
@pytest.mark.sweep(first=2)
def test_a_rank_that_fails_before_training_ends_the_job_with_one_line(rank, bad, message):
    good, bad = [*TRAIN, "--epochs", "50"], [*TRAIN, "--epochs", "50", *bad]
    code, out, err, seconds = mpiexec("-n", "1", *(bad if rank == 0 else good), ":",
                                      "-n", "1", *(good if rank == 0 else bad))
    assert code == 2 and seconds < LIMIT, (code, err)
    ours = [line for line in err.splitlines() if line.startswith("fastckpt")]
    assert len(ours) == 1 and ours[0].startswith(message), err                 # one line of ours
    assert ours[0].endswith(f"(rank {rank} of 2; ending the job)")
    assert "epoch 1/" not in out and "Traceback" not in err


def test_a_rank_started_without_mpi_beside_mpi_ranks_ends_the_job():
    code, out, err, seconds = mpiexec("-n", "1", *TRAIN, "--epochs", "50", ":",
                                      "-n", "1", sys.executable, "-m", "fastckpt", "train", "--epochs", "50")
    assert code == 2 and seconds < LIMIT, (code, err)
    assert "train runs as one of 2 processes started by mpiexec, but without --mpi" in err
    assert "(rank 1 of 2; ending the job)" in err and "epoch 1/" not in out


def test_sigint_to_one_rank_during_training_ends_the_job(tmp_path):
    out = tmp_path / "out"
    with open(out, "w") as stdout:
        job = subprocess.Popen([MPIEXEC, "-n", "2", *writing_pid(tmp_path / "pid", [*TRAIN, "--epochs", "500"])],
                               stdout=stdout, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: "epoch 1/" in out.read_text(), LIMIT, "rank 0 finished an epoch")
        pids = [int((tmp_path / f"pid.{r}").read_text()) for r in range(2)]
        t0 = time.monotonic()
        os.kill(pids[1], signal.SIGINT)
        _, err = job.communicate(timeout=LIMIT)
        seconds = time.monotonic() - t0
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 130, err
    assert "fastckpt: rank 1 of 2 failed: interrupted (KeyboardInterrupt); ending the job" in err
    assert seconds < 30
    wait_for(lambda: all(gone(pid) for pid in pids), 30, "both ranks ended")


def test_an_error_on_one_rank_during_training_ends_the_job():
    # rank 1 alone fails in its third update (as a bad disk or a bug would): the data passed every check
    script = textwrap.dedent("""
        import numpy as np, fastckpt
        from mpi4py import MPI
        from fastckpt.distributed import MPITrainer
        from fastckpt.engine import Engine
        (x, y), _ = fastckpt.load_mnist()
        if MPI.COMM_WORLD.Get_rank() == 1:
            real, calls = Engine.gradients, []
            def failing(self, *args, **kwargs):
                calls.append(1)
                if len(calls) == 3:
                    raise ValueError("a sample of rank 1 could not be read")
                return real(self, *args, **kwargs)
            Engine.gradients = failing
        np.random.seed(0)
        MPITrainer(fastckpt.Network([784, 20, 10])).SGD((x, y), 1, 10, 1.0)
        print("trained")
    """)
    code, out, err, seconds = mpiexec("-n", "2", sys.executable, "-c", script)
    assert code == 2 and seconds < LIMIT, err
    assert "fastckpt: rank 1 of 2 failed: ValueError: a sample of rank 1 could not be read" in err
    assert "trained" not in out and "rank 0 of 2 failed" not in err


def test_a_refused_update_stops_every_rank_together_and_rank_0_reports_it():
    # the L2 step eta * l2 * W overflows float64 at the first update, on every rank at once
    code, out, err, seconds = mpiexec("-n", "2", *TRAIN, "--epochs", "1", "--l2", "1e303", "--eta", "1e10")
    assert code == 1 and seconds < LIMIT, err
    assert err.count("training stopped at epoch 1/1, update 1/") == 1
    assert "update would make a parameter NaN or inf" in err
    assert "rank 1" not in err and "Abort(" not in err                   # no abort: the ranks agreed


def test_settings_are_checked_from_python_too(tmp_path):
    script = textwrap.dedent("""
        import sys
        import fastckpt
        from mpi4py import MPI
        from fastckpt.distributed import MPITrainer
        (x, y), _ = fastckpt.load_mnist()
        import numpy as np
        np.random.seed(0)                                           # same weights on both ranks
        trainer = MPITrainer(fastckpt.Network([784, 20, 10]))
        rank = MPI.COMM_WORLD.Get_rank()
        try:
            trainer.SGD((x, y), 1, 10 + rank, 1.0, verbose=False)
        except ValueError as exc:                                   # a file per rank: forwarded stdout interleaves
            with open(f"{sys.argv[1]}.{rank}", "w") as f:
                f.write(str(exc))
    """)
    code, out, err, seconds = mpiexec("-n", "2", sys.executable, "-c", script, str(tmp_path / "said"))
    assert code == 0, err
    said = [(tmp_path / f"said.{rank}").read_text() for rank in (0, 1)]       # every rank raises, and may go on
    for text in said:
        assert text.startswith("the 2 ranks were started with different settings: "
                               "batch size 10 on rank 0, 11 on rank 1"), said


def test_sigint_to_one_rank_while_it_loads_ends_the_job(tmp_path):
    """Before the rank reaches MPI (NumPy is loading): the others would wait for it in their first collective."""
    job = subprocess.Popen([MPIEXEC, "-n", "2", *writing_pid(tmp_path / "pid", [*TRAIN, "--epochs", "500"])],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (tmp_path / "pid.1").exists() and (tmp_path / "pid.1").read_text().strip(), LIMIT,
                 "rank 1 started")
        pid = int((tmp_path / "pid.1").read_text())
        wait_for(lambda: "_multiarray_umath" in open(f"/proc/{pid}/maps").read(), LIMIT, "rank 1 loads NumPy")
        t0 = time.monotonic()
        os.kill(pid, signal.SIGINT)
        out, err = job.communicate(timeout=LIMIT)
        seconds = time.monotonic() - t0
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 130 and seconds < 30, (job.returncode, err)
    ours = [line for line in err.splitlines() if line.startswith("fastckpt")]
    assert ours == ["fastckpt: interrupted (SIGINT) (rank 1 of 2; ending the job)"], err
    assert "Traceback" not in err and "Epoch" not in out
