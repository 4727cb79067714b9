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
from test_data import _write_idx

import fastckpt

FASTCKPT = [sys.executable, "-m", "fastckpt"]


def _run(*args, cwd=None, shell=None):
    cmd = ["sh", "-c", shell] if shell else [*FASTCKPT, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=cwd)


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
    (["train", "--sizes", "784,2000000000,10"], "--sizes 784,2000000000,10: a training step of"),
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
