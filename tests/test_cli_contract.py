"""The command's contract (issue 11): every failure is one line and an exit code, never a traceback;
files are checked before training; signals end compare's child; a closed stdout ends quietly.

docs/misuse.md lists the cases; each row there has a test here.
"""
import gzip
import os
import re
import resource
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
from cli_runner import run_cli

import fastckpt
from fastckpt.cli import app as cli
from fastckpt.cli import commands
from fastckpt.report.compare import RunFailed, child_main

FASTCKPT = [sys.executable, "-m", "fastckpt"]
NEVER_ENDS = ["--epochs", "10000"]        # a check that ran after training would hit the subprocess timeout


def _run(*args, timeout=120, **kw):
    if not kw:                                    # exit codes and lines are main()'s: run it here
        return run_cli(*args)
    return subprocess.run([*FASTCKPT, *args], capture_output=True, text=True, timeout=timeout, **kw)


def _one_line(proc, code, *fragments):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code, proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"fastckpt {proc.args[3]}: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def mnist():
    (x, y), (xt, yt) = fastckpt.load_mnist()
    return x, y.argmax(1), xt, yt.argmax(1)


@pytest.fixture
def bad_data(tmp_path, mnist):
    """A truncated npz, labels of the wrong kind, and an IDX folder with a corrupt gzip."""
    x, y, xt, yt = mnist
    good = tmp_path / "good.npz"
    np.savez(good, x_train=x, y_train=y, x_test=xt, y_test=yt)
    (tmp_path / "truncated.npz").write_bytes(good.read_bytes()[:good.stat().st_size // 2])
    np.savez(tmp_path / "labels.npz", x_train=x, y_train=y.astype(str), x_test=xt, y_test=yt.astype(str))
    idx = tmp_path / "idx"
    idx.mkdir()

    def images(a):
        header = b"\0\0\x08\x03" + np.array([len(a), 28, 28], ">u4").tobytes()
        return header + (a * 255).round().astype(np.uint8).tobytes()

    def labels(a):
        return b"\0\0\x08\x01" + np.array([len(a)], ">u4").tobytes() + a.astype(np.uint8).tobytes()
    for name, raw in [("train-images-idx3-ubyte", images(x)), ("train-labels-idx1-ubyte", labels(y)),
                      ("t10k-images-idx3-ubyte", images(xt)), ("t10k-labels-idx1-ubyte", labels(yt))]:
        packed = gzip.compress(raw)
        if name.startswith("train-images"):
            packed = packed[:30] + b"\xff" * 50 + packed[80:]          # damaged deflate stream
        (idx / f"{name}.gz").write_bytes(packed)
    return {"truncated npz": tmp_path / "truncated.npz", "wrong label kind": tmp_path / "labels.npz",
            "corrupt gzip": idx}


# -- bad input: exit 2 ------------------------------------------------------------------------
@pytest.mark.parametrize("args,fragment", [
    (["plan", "--strategy", "budget(" + "9" * 400 + "GiB)"], "is too many bytes to count"),
    (["train", "--eta", "1e-400"], "argument --eta: is too small for a float64 (it would be 0), got '1e-400'"),
    (["train", "--eta", "nan"], "argument --eta: must be finite and >= 0, got 'nan'"),
    (["train", "--l2", "inf"], "argument --l2: must be finite and >= 0, got 'inf'"),
    (["compare", "--eta", "nan"], "argument --eta: must be finite and >= 0, got 'nan'"),
    (["compare", "--eta", "-1"], "argument --eta: must be finite and >= 0, got '-1'"),
    # --max-memory bounds one process's whole run; the workers' steps were bounded each, and memray's peak of
    # --threads 2 under 14MiB was 29.7 MiB, silently
    (["train", "--max-memory", "14MiB", "--threads", "2"], "--max-memory bounds the whole run of one process "
     "training one step at a time; with --threads 2 several steps' buffers"),
    (["train", "--max-memory", "14MiB", "--parallel-batches", "4"], "with --parallel-batches 4 several"),
    (["compare", "--strategies", ""], "argument --strategies: names no strategy, got ''"),
    (["train", "--threads", "2", "--parallel-batches", "100000"], "--parallel-batches 100000 is more than the "
     "400 mini-batches of 10 in an epoch of 4000 samples: give at most 400"),
    (["compare", "--strategies", " , "], "argument --strategies: names no strategy, got ' , '"),
])
def test_bad_arguments_get_one_line_and_exit_2(args, fragment):
    _one_line(_run(*args), 2, fragment)


@pytest.mark.parametrize("command", ["train", "compare"])
@pytest.mark.parametrize("case,fragment", [("truncated npz", "truncated.npz"), ("wrong label kind", "labels"),
                                           ("corrupt gzip", "train-images-idx3-ubyte.gz")])
@pytest.mark.sweep(first=3)
def test_damaged_data_gets_one_line_and_exit_2(bad_data, command, case, fragment):
    _one_line(_run(command, "--data", str(bad_data[case]), *NEVER_ENDS), 2, fragment)


@pytest.mark.parametrize("args,flag", [(["train", "--resume"], "--resume"), (["predict"], "FILE"),
                                       (["evaluate"], "FILE")])
def test_a_damaged_net_file_is_named_by_its_flag(tmp_path, args, flag):
    damaged = tmp_path / "net.npz"
    damaged.write_bytes(b"PK\x03\x04 not a zip archive after all")
    _one_line(_run(*args, str(damaged), *(NEVER_ENDS if args[0] == "train" else [])), 2,
              f"{flag} {str(damaged)!r}: not a saved net: an .npz file is a zip archive, and this is not one")


def test_missing_data_is_refused_before_anything(tmp_path):
    missing = tmp_path / "mnist.npz"
    _one_line(_run("train", "--data", str(missing), *NEVER_ENDS), 2, f"--data {str(missing)!r}: no such file")


@pytest.mark.parametrize("command,long", [("compare", NEVER_ENDS), ("analyze", []),
                                          ("profile", ["--steps", "100000000"])])
@pytest.mark.sweep(first=1)
def test_an_out_that_cannot_be_a_folder_is_refused_before_anything(tmp_path, command, long):
    in_the_way = tmp_path / "file"
    in_the_way.write_text("x")
    _one_line(_run(command, "--out", str(in_the_way), *long), 2, "exists and is not a folder")
    _one_line(_run(command, "--out", str(in_the_way / "sub"), *long), 2, "cannot create the folder")
    assert in_the_way.read_text() == "x"


def test_save_is_checked_before_training(tmp_path):
    _one_line(_run("train", "--save", str(tmp_path / "no" / "w.npz"), *NEVER_ENDS), 2, "no such folder")
    _one_line(_run("train", "--save", str(tmp_path), *NEVER_ENDS), 2, "is a folder")
    existing = tmp_path / "w.npz"
    existing.write_bytes(b"mine")
    _one_line(_run("train", "--save", str(existing), *NEVER_ENDS), 2, "exists; pass --force to overwrite it")
    # np.savez's rule: "w" means w.npz, which exists
    _one_line(_run("train", "--save", str(tmp_path / "w"), *NEVER_ENDS), 2, "exists; pass --force")
    assert existing.read_bytes() == b"mine"


def test_save_with_force_replaces_the_file_with_the_trained_net(tmp_path):
    target = tmp_path / "w.npz"
    target.write_bytes(b"old")
    proc = _run("train", "--sizes", "784,12,10", "--epochs", "1", "--save", str(target), "--force", "--json")
    assert proc.returncode == 0, proc.stderr
    (x, y), _ = fastckpt.load_mnist()
    np.random.seed(0)
    net = fastckpt.Network([784, 12, 10])
    net.SGD((x, y), 1, 10, 3.0, verbose=False)
    saved = fastckpt.load(target)
    assert saved.sizes == [784, 12, 10] and saved.training_state["epochs_done"] == 1
    for got, ref in zip(saved.weights + saved.biases, net.weights + net.biases):
        np.testing.assert_array_equal(got, ref)
    assert sorted(os.listdir(tmp_path)) == ["w.npz"]                  # no temporary file left


def test_save_is_all_or_nothing(tmp_path, monkeypatch):
    target = tmp_path / "w.npz"
    target.write_bytes(b"old")

    def dies_half_way(f, *arrays, **named):
        f.write(b"PK half a zip")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(np, "savez", dies_half_way)
    with pytest.raises(OSError, match="No space left"):
        fastckpt.Network([3, 2]).save(target)
    assert target.read_bytes() == b"old" and sorted(os.listdir(tmp_path)) == ["w.npz"]


# -- training failures: exit 1 ----------------------------------------------------------------
def test_divergence_gets_one_line_and_exit_1():
    proc = _run("train", "--loss", "cross_entropy", "--eta", "1e308", "--epochs", "1", "--json")
    _one_line(proc, 1, "training stopped at epoch 1/1, update 2/400:", "non-finite", "try a smaller --eta")


def _at_most_8_gib():
    resource.setrlimit(resource.RLIMIT_AS, (8 * 2**30, 8 * 2**30))


@pytest.mark.parametrize("command,mode", [("train", "plain"), ("compare", "every_nth(2)")])
def test_a_net_no_process_here_could_hold_is_refused_before_it_allocates(command, mode):
    """A 118 GiB weight matrix under an 8 GiB address-space limit: refused up front, naming --sizes and the need."""
    proc = _run(command, "--sizes", "784,20000000,10", "--epochs", "1", preexec_fn=_at_most_8_gib)
    line = _one_line(proc, 2, "error: --sizes 784,20000000,10 with --batch-size 10: a training step of "
                     f"784,20000000,10 at batch 10 ({mode}) needs 238.57 GiB, more than half the ")
    assert re.search(r"the \d\.\d\d GiB this process can still allocate$", line), line


def test_out_of_memory_gets_one_line_and_exit_1(monkeypatch, capsys):
    """An allocation that fails anyway (the machine filled meanwhile) is one line, exit 1, with what to try."""
    import fastckpt.cli.train as train_command

    def no_memory(*args, **kw):
        raise MemoryError("Unable to allocate 118. GiB for an array with shape (20000000, 784)")
    monkeypatch.setattr(train_command, "NetworkWithCheckpointing", no_memory)
    assert cli.main(["train", "--epochs", "1"]) == 1
    assert capsys.readouterr().err == ("fastckpt train: error: out of memory: Unable to allocate 118. GiB for an "
                                       "array with shape (20000000, 784); try a smaller --batch-size or --sizes\n")


def test_compares_child_out_of_memory_reaches_the_parent_as_one_line(monkeypatch, capsys):
    import json

    import fastckpt.report.compare as compare

    def no_memory(spec):
        raise MemoryError("Unable to allocate 118. GiB")
    monkeypatch.setattr(compare, "run_one", no_memory)
    assert child_main("", "{}") == 1
    said = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert said == {"error": "Unable to allocate 118. GiB", "kinds": ["BaseException", "Exception", "MemoryError",
                                                                    "object"]}
    assert cli._failure(RunFailed("plain", said["error"], said["kinds"])) == (
        1, "the plain run: out of memory: Unable to allocate 118. GiB; try a smaller --batch-size or --sizes")


def test_a_bug_is_one_line_that_says_so(monkeypatch, capsys):
    def broken(args):
        raise KeyError("oops")
    monkeypatch.setattr(commands, "show_plan", broken)
    monkeypatch.delenv("FASTCKPT_DEBUG", raising=False)
    assert cli.main(["plan"]) == 1
    err = capsys.readouterr().err
    assert err == f"fastckpt plan: error: KeyError: 'oops' {cli.BUG}\n"
    monkeypatch.setenv("FASTCKPT_DEBUG", "1")
    with pytest.raises(KeyError):
        cli.main(["plan"])


def test_a_failing_child_sends_its_reason_not_its_traceback(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("FASTCKPT_DEBUG", raising=False)
    assert child_main("", '{"data": "%s"}' % (tmp_path / "missing.npz")) == 1
    out, err = capsys.readouterr()
    assert err == "" and '"kinds": [' in out and "FileNotFoundError" in out and "missing.npz" in out
    code, reason = cli._failure(RunFailed("sqrt", "KeyError: 'x'", ["KeyError", "LookupError", "Exception"]))
    assert code == 1 and reason == f"the sqrt run: KeyError: 'x' {cli.BUG}"
    assert cli._failure(RunFailed("sqrt", "ended by SIGKILL")) == (1, "the sqrt run: ended by SIGKILL")


# -- a closed stdout --------------------------------------------------------------------------
@pytest.mark.parametrize("args", [["plan"], ["plan", "--json"]])
def test_a_reader_that_leaves_early_gets_no_broken_pipe(args):
    read, write = os.pipe()
    proc = subprocess.Popen([*FASTCKPT, *args], stdout=write, stderr=subprocess.PIPE, text=True)
    os.close(write)
    os.close(read)                                                  # the reader is gone before the first line
    _, err = proc.communicate(timeout=60)
    assert err == "" and proc.returncode == 141


# -- signals ----------------------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_compare_ends_its_child_and_keeps_the_finished_runs(tmp_path, sig):
    proc = subprocess.Popen([*FASTCKPT, "compare", "--sizes", "784,16,10", "--epochs", "20", "--out", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        children = []
        while not children and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
            if (tmp_path / "summary.md").exists():                     # the plain run is done: its
                children = psutil.Process(proc.pid).children(recursive=True)   # successor runs now
        assert children, "the second run never started"
        time.sleep(0.5)
        os.kill(proc.pid, sig)                                         # the parent only, as kill(1) does
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + sig
    what = {signal.SIGTERM: "terminated (SIGTERM)", signal.SIGHUP: "hung up (SIGHUP)"}[sig]
    assert err.strip().splitlines()[-1] == f"fastckpt compare: {what}; finished runs written to {tmp_path}: plain"
    assert "Traceback" not in err
    assert "plain" in (tmp_path / "summary.md").read_text()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(c) for c in children):
        time.sleep(0.1)
    assert not any(_alive(c) for c in children), "a training child outlived compare"


def _alive(process):
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _loading(pid, library):
    """Whether process ``pid`` has mapped ``library`` (it is importing what fastckpt imports first)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return library in f.read()
    except OSError:
        return False


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="finds the loading libraries in /proc/PID/maps")
@pytest.mark.parametrize("library", ["_multiarray_umath", "libllvmlite"])
@pytest.mark.parametrize("entry", ["-m", "script"])
def test_sigint_while_the_command_loads_is_its_one_line_and_130(library, entry):
    """NumPy, Numba and the kernels load for about a second before main() runs: a Ctrl-C there used to print a
    KeyboardInterrupt traceback of 20 to 50 lines."""
    script = os.path.join(os.path.dirname(sys.executable), "fastckpt")
    command = [*FASTCKPT, "train"] if entry == "-m" else [script, "train"]
    if entry == "script" and not os.path.exists(script):
        pytest.skip("the fastckpt script is not installed beside this Python")
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not _loading(proc.pid, library) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    assert proc.poll() is None, "the command ended before it loaded " + library
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert (proc.returncode, err, out) == (130, "fastckpt: interrupted (SIGINT)\n", "")


def test_importing_fastckpt_as_a_library_leaves_sigint_to_python():
    code = "import signal, fastckpt; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout == "True\n", proc.stderr
    import signal as python_signal
    assert python_signal.getsignal(python_signal.SIGINT) is python_signal.default_int_handler   # and under pytest
