"""What a hostile user tried, and what each now gets: one line naming the input, never a traceback or a hang."""
import io
import json
import pickle
import struct
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from cli_runner import run_cli
from test_data import _write_idx

import fastckpt

FASTCKPT = [sys.executable, "-m", "fastckpt"]


def _run(*args, cwd=None, shell=None):
    if shell is None:
        return run_cli(*args, cwd=cwd)
    return subprocess.run(["sh", "-c", shell], capture_output=True, text=True, timeout=300, cwd=cwd)


def _one_line_error(proc, code=2):
    assert proc.returncode == code, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr and "a bug" not in proc.stderr, proc.stderr
    return proc.stderr


# -- saved files --------------------------------------------------------------------------------
def _saved(tmp_path):
    return fastckpt.Network([5, 4, 3]).save(tmp_path / "n.npz")


def test_a_member_that_is_not_an_array(tmp_path):
    path = _saved(tmp_path)
    with zipfile.ZipFile(path, "a") as z:
        z.writestr("notes.txt", "hello")
    with pytest.raises(ValueError, match=r"n.npz': member 'notes.txt' is not a .npy array"):
        fastckpt.load(path)


def test_metadata_nested_past_python_s_recursion(tmp_path):
    path = _saved(tmp_path)
    with np.load(path) as f:
        arrays = {k: f[k] for k in f.files}
    arrays["meta"] = np.array("[" * 100_000 + "]" * 100_000)
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match=r"n.npz': its metadata is not JSON"):
        fastckpt.load(path)


@pytest.mark.parametrize("field,value", [("flags", 0x1), ("method", 99)], ids=["encrypted", "method"])
def test_members_zipfile_cannot_read(tmp_path, field, value):
    """An encrypted flag or an unknown compression method on a member: the file and its damage named."""
    path = _saved(tmp_path)
    data = bytearray(open(path, "rb").read())
    with zipfile.ZipFile(path) as z:
        info, central = z.getinfo("weights_0.npy"), z.start_dir
    at = data.index(b"PK\x01\x02" , central)                 # the member's central record: the first one
    while data[at + 46:at + 46 + len(info.filename)] != info.filename.encode():
        at = data.index(b"PK\x01\x02", at + 4)
    local, record = {"flags": 6, "method": 8}[field], {"flags": 8, "method": 10}[field]
    data[info.header_offset + local:info.header_offset + local + 2] = struct.pack("<H", value)
    data[at + record:at + record + 2] = struct.pack("<H", value)
    open(path, "wb").write(bytes(data))
    with pytest.raises(ValueError, match=r"n.npz': the archive is damaged \((RuntimeError|NotImplementedError)"):
        fastckpt.load(path)


def test_a_tiny_file_declaring_terabytes_is_refused_before_anything_is_allocated(tmp_path):
    from fastckpt.report.measure import memray_peak
    meta = {"format": "fastckpt-network", "version": 1, "fastckpt_version": "0.3.0", "sizes": [2**21, 2**20],
            "dtype": "float64", "loss": "quadratic", "l2": [0.0], "strategy": "plain", "optimizer_in_backward": False,
            "training": None}
    path = tmp_path / "big.npz"
    with zipfile.ZipFile(path, "w") as z:
        for name, shape in (("weights_0", (2**20, 2**21)), ("biases_0", (2**20, 1))):
            with z.open(name + ".npy", "w") as f:
                np.lib.format.write_array_header_1_0(f, {"descr": "<f8", "fortran_order": False, "shape": shape})
        buf = io.BytesIO()
        np.save(buf, np.array(json.dumps(meta)))
        z.writestr("meta.npy", buf.getvalue())
    assert path.stat().st_size < 2000

    def load():
        with pytest.raises(ValueError, match=r"weights_0 declares shape \(1048576, 2097152\) of float64 "
                           r"\(17592186044416 bytes\), but the member holds 0 data bytes"):
            fastckpt.load(path)
    assert memray_peak(load) < 2**20


# -- the command line ---------------------------------------------------------------------------
def test_a_closed_standard_output_is_said_once_not_a_bug(tmp_path):
    proc = _run(shell=f"'{sys.executable}' -m fastckpt train --sizes 784,8,10 --epochs 1 --save n.npz >&-",
                cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "fastckpt train: warning: standard output is closed; the results are not shown\n"
    assert fastckpt.load(tmp_path / "n.npz").training_state["epochs_done"] == 1


@pytest.mark.parametrize("args, said", [
    (["train", "--seed", "-1"], "argument --seed: must be an integer from 0 to 2**32 - 1"),
    (["compare", "--seed", "4294967296"], "argument --seed: must be an integer from 0 to 2**32 - 1"),
    (["train", "--sizes", "784,99999999999999999999,10"], "argument --sizes: a layer of 99999999999999999999 "
                                                           "units is more"),
    (["train", "--sizes", "784,2000000000,10"], "--sizes 784,2000000000,10 with --batch-size 10: a training step of"),
    (["plan", "--strategy", "budget(" + "9" * 5000 + ")"], "a number of 5000 digits is too many bytes to count"),
    (["plan", "--strategy", "budget(1024.5)"], "'1024.5' is not a whole number of bytes"),
    (["plan", "--max-memory", "1024.0000000001"], "'1024.0000000001' is not a whole number of bytes"),
])
def test_bad_values_name_their_flag(args, said):
    assert said in _one_line_error(_run(*args))


def test_a_warning_is_one_line_without_python_s_source_or_advice_the_command_cannot_take():
    proc = _run("train", "--sizes", "784,8,10", "--epochs", "1", "--batch-size", "3000")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ("fastckpt train: warning: the last 1000 of 4000 training samples do not fill a mini-batch "
                           "of 3000 and are skipped every epoch, as in the lab\n")


def test_resume_without_save_would_keep_nothing(tmp_path):
    assert _run("train", "--sizes", "784,8,10", "--epochs", "1", "--save", "p.npz", cwd=tmp_path).returncode == 0
    said = _one_line_error(_run("train", "--resume", "p.npz", "--epochs", "2", cwd=tmp_path))
    assert "--resume 'p.npz' without --save would train and keep nothing: add --save FILE" in said


def test_resume_takes_the_minibatches_per_update_from_the_file_and_any_thread_count(tmp_path):
    base = ["train", "--sizes", "784,8,10", "--json", "--parallel-batches", "4"]
    assert _run(*base, "--threads", "2", "--epochs", "2", "--save", "whole.npz", cwd=tmp_path).returncode == 0
    assert _run(*base, "--threads", "2", "--epochs", "1", "--save", "half.npz", cwd=tmp_path).returncode == 0
    for threads in ("1", "3"):                                  # the file's 4 per update, on other thread counts
        proc = _run("train", "--resume", "half.npz", "--epochs", "2", "--threads", threads, "--save",
                    f"on{threads}.npz", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        whole, resumed = fastckpt.load(tmp_path / "whole.npz"), fastckpt.load(tmp_path / f"on{threads}.npz")
        for a, b in zip(whole.weights + whole.biases, resumed.weights + resumed.biases):
            np.testing.assert_array_equal(a, b)


def test_averaging_minibatches_says_what_it_does_to_the_updates():
    proc = _run("train", "--sizes", "784,8,10", "--epochs", "1", "--threads", "2", "--parallel-batches", "4")
    assert proc.returncode == 0, proc.stderr
    assert "note: each update averages 4 mini-batches, so an epoch makes 4 times fewer updates at the same " \
           "--eta 3.0" in proc.stderr
    assert "{" not in proc.stdout.splitlines()[-1] and "threads 2, parallel batches 4" in proc.stdout


def test_resume_knows_an_idx_folder_by_the_four_files_it_reads(tmp_path):
    (x, y), (xt, yt) = fastckpt.load_mnist()
    folder = tmp_path / "idx"
    folder.mkdir()
    for name, arr in (("train-images-idx3-ubyte", x[:400]), ("train-labels-idx1-ubyte", y[:400].argmax(1)),
                      ("t10k-images-idx3-ubyte", xt[:100]), ("t10k-labels-idx1-ubyte", yt[:100].argmax(1))):
        _write_idx(folder / (name + ".gz"), (arr * 255).round().astype(np.uint8).reshape(-1, 28, 28)
                   if arr.ndim == 2 else arr.astype(np.uint8))
    assert _run("train", "--sizes", "784,8,10", "--epochs", "1", "--data", str(folder), "--save", "p.npz",
                cwd=tmp_path).returncode == 0
    (folder / "README.txt").write_text("where these came from")
    proc = _run("train", "--resume", "p.npz", "--epochs", "2", "--save", "p.npz", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr


def test_a_trainer_says_why_it_cannot_be_pickled():
    pytest.importorskip("mpi4py")
    from fastckpt.distributed import MPITrainer, PipelineTrainer, TensorParallelTrainer
    from fastckpt.parallel import DataParallel
    np.random.seed(0)
    trainers = [MPITrainer(fastckpt.Network([6, 4, 2])), PipelineTrainer([6, 4, 2], 2),
                TensorParallelTrainer([6, 4, 2])]
    for trainer in trainers:
        with pytest.raises(TypeError, match=f"a {type(trainer).__name__} holds MPI communicators and cannot be "
                                            "pickled or copied; save the net instead"):
            pickle.dumps(trainer)
    with DataParallel(fastckpt.Network([6, 4, 2])) as dp, pytest.raises(TypeError, match="holds worker threads"):
        pickle.dumps(dp)


# -- the second hostile pass -------------------------------------------------------------------
def test_a_resume_file_pointing_its_data_at_a_device_is_refused_not_read_forever(tmp_path):
    assert _run("train", "--sizes", "784,8,10", "--epochs", "1", "--save", "r.npz", cwd=tmp_path).returncode == 0
    with np.load(tmp_path / "r.npz") as f:
        arrays = {k: f[k] for k in f.files}
    meta = json.loads(str(arrays["meta"]))
    meta["training"]["data"] = "/dev/zero"
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez(tmp_path / "zero.npz", **arrays)
    said = _one_line_error(_run("train", "--resume", "zero.npz", "--save", "zero.npz", "--epochs", "2", cwd=tmp_path))
    assert "--resume 'zero.npz' was trained on --data '/dev/zero', which is not a file or folder now" in said


def test_threads_the_system_cannot_start_under_ulimit_v_end_with_a_line_not_a_hang(tmp_path):
    for threads in ("200", "60"):                   # refused up front (their stacks), or as a thread fails to start
        proc = _run(shell=f"ulimit -v 1500000; exec {sys.executable} -m fastckpt train --sizes 784,16,10 --epochs 1 "
                    f"--threads {threads} --json", cwd=tmp_path)
        assert proc.returncode in (0, 2), proc.stderr
        if proc.returncode == 2:
            assert "threads" in proc.stderr.splitlines()[-1] and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("args,said", [
    (["train", "--force"], "--force lets --save overwrite a file; without --save it would change nothing"),
    (["predict", "n.npz", "--force"], "--force lets --output replace a file; without --output it would change"),
    (["train", "--batch-size", "99999999999999"], "--sizes 784,40,30,10 with --batch-size 99999999999999: a "
                                                  "training step"),
])
def test_flags_that_would_do_nothing_or_blame_another_flag(tmp_path, args, said):
    fastckpt.Network([784, 8, 10]).save(tmp_path / "n.npz")
    assert said in _one_line_error(_run(*args, cwd=tmp_path))


def test_predict_names_the_file_and_the_row_of_a_nan(tmp_path):
    fastckpt.Network([784, 8, 10]).save(tmp_path / "n.npz")
    x = np.zeros((9, 784))
    x[7, 3] = np.nan
    np.save(tmp_path / "x.npy", x)
    said = _one_line_error(_run("predict", "n.npz", "--data", "x.npy", cwd=tmp_path))
    assert ("--data 'x.npy' holds NaN or inf, or a number past float64's range (first at row 7, column 3), which no "
            "net can classify") in said
    wide = np.zeros((3, 784), dtype=np.longdouble)
    wide[2, 5] = np.longdouble("1e400")                   # finite in longdouble, inf as the float64 the net reads
    np.save(tmp_path / "wide.npy", wide)
    said = _one_line_error(_run("predict", "n.npz", "--data", "wide.npy", cwd=tmp_path))
    assert "--data 'wide.npy' holds NaN or inf, or a number past float64's range (first at row 2, column 5)" in said
    np.save(tmp_path / "none.npy", np.zeros((0, 784)))
    said = _one_line_error(_run("predict", "n.npz", "--data", "none.npy", cwd=tmp_path))
    assert "--data 'none.npy': holds no rows (shape (0, 784)); give at least one sample" in said


def test_a_file_made_after_the_command_line_checked_is_never_replaced(tmp_path):
    from fastckpt.cli.resume import Saver
    path = tmp_path / "late.npz"
    save = Saver(str(path), force=False)            # the command line's check passed: no file then
    path.write_bytes(b"MINE")                       # made by another process before this run's first save
    net = fastckpt.Network([4, 3, 2])
    with pytest.raises(ValueError, match="not replaced"):
        save(lambda p, exclusive: net.save(p, exclusive=exclusive))
    assert path.read_bytes() == b"MINE"


@pytest.mark.memory
def test_threads_keep_one_step_each_whatever_batch_sizes_come(tmp_path):
    from fastckpt.parallel import DataParallel
    from fastckpt.report.measure import memray_peak
    rng = np.random.default_rng(0)
    net = fastckpt.NetworkWithCheckpointing([784, 256, 256, 256, 10], strategy="sqrt")
    with DataParallel(net, threads=2) as dp:
        x, y = rng.random((1000, 784)), rng.integers(0, 10, 1000)
        dp.update_mini_batches([x[:500], x[500:]], [y[:500], y[500:]], 0.1)        # warm-up: threads and BLAS

        def sizes():
            for batch in (500, 490, 480, 470, 460):
                dp.update_mini_batches([x[:batch], x[500:500 + batch]], [y[:batch], y[500:500 + batch]], 0.1)
        peak = memray_peak(sizes)
        assert len(dp._engines) == 2                   # one per worker: each new batch size replaces the old step
        # the bound counts one step per worker (and the parameters and gradient sum, held already); engines kept
        # per batch size used to add 45 MiB here
        assert peak <= dp.predicted_bytes(500)["total"], peak


def test_a_worker_frees_its_old_step_before_it_makes_the_next(monkeypatch):
    """A new batch size gives each worker a new engine; the old one must be gone before the new one allocates,
    whatever the threads' timing (it was still referenced then, and two workers replacing theirs at once held
    four steps, 4 MB over the bound under load)."""
    import weakref

    import fastckpt.parallel.threads as threads
    from fastckpt.parallel import DataParallel
    made, alive_at_make = [], []
    real = threads.Engine

    def engine(*args, **kwargs):
        alive_at_make.append(sum(ref() is not None for ref in made))
        new = real(*args, **kwargs)
        made.append(weakref.ref(new))
        return new
    monkeypatch.setattr(threads, "Engine", engine)
    rng = np.random.default_rng(0)
    net = fastckpt.Network([20, 16, 4])
    with DataParallel(net, threads=2, adapt=False) as dp:
        x, y = rng.random((40, 20)), rng.integers(0, 4, 40)
        for batch in (20, 18, 16):
            dp.update_mini_batches([x[:batch], x[20:20 + batch]], [y[:batch], y[20:20 + batch]], 0.1)
    assert len(made) == 6 and max(alive_at_make) <= 1, alive_at_make    # at most the other worker's
