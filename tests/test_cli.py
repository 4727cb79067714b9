"""The ``fastckpt`` command driven as a user would: a subprocess, its output, its files and exit code."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from cli_runner import run_cli

import fastckpt
from fastckpt.planner.curves import depth_table
from fastckpt.planner.pays import does_not_pay

MiB = 2**20


def _run(*args, timeout=300):
    return run_cli(*args)


def _is_png(path):
    import matplotlib.image
    image = matplotlib.image.imread(path)
    return image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 300 and image.std() > 0


@pytest.mark.parametrize("command", ["compare", "plan", "analyze", "profile"])
def test_every_subcommand_has_help(command):
    proc = _run(command, "--help")
    assert proc.returncode == 0 and "usage: fastckpt " + command in proc.stdout


def test_compare_json_agrees_with_the_library(tmp_path):
    proc = _run("compare", "--epochs", "2", "--strategies", "sqrt,revolve(1)", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    runs = {r["name"]: r for r in result["runs"]}
    assert list(runs) == ["plain", "sqrt", "revolve(1)"]
    assert result["same_accuracy"] is True
    for name, run in runs.items():
        planned = fastckpt.plan([784, 40, 30, 10], 10, strategy=name)
        assert run["predicted_bytes"] == planned.bytes()["total"]
        assert run["recompute_factor"] == pytest.approx(planned.recompute_factor)
        assert abs(run["memray_peak_bytes"] - run["predicted_bytes"]) <= 0.02 * run["predicted_bytes"] + MiB
        assert run["accuracies"] == runs["plain"]["accuracies"] and len(run["accuracies"]) == 2
        assert run["time_ratio"] == pytest.approx(run["ms_per_update"] / runs["plain"]["ms_per_update"])
    # the library, trained the same way, reaches the same accuracy
    (x, y), (xt, yt) = fastckpt.load_mnist()
    np.random.seed(0)
    net = fastckpt.NetworkWithCheckpointing([784, 40, 30, 10], strategy="revolve(1)")
    net.SGD((x, y), 2, 10, 3.0, test_data=(xt, yt), verbose=False)
    assert net.accuracies == runs["revolve(1)"]["accuracies"]


def test_compare_table_and_report_files(tmp_path):
    proc = _run("compare", "--epochs", "1", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "same accuracy with and without checkpointing: yes" in proc.stdout
    names = [line.split()[0] for line in proc.stdout.splitlines() if line.startswith(("plain ", "every", "sqrt"))]
    assert names == ["plain", "every_nth(2)", "sqrt"]
    assert "\r" not in proc.stderr and "epoch 1/1 test accuracy" in proc.stderr   # not a terminal: plain lines
    for png in ("memory_per_update.png", "cumulative_update_time.png", "memory_vs_depth.png"):
        assert _is_png(tmp_path / png)
    summary = (tmp_path / "summary.md").read_text()
    assert "same accuracy with and without checkpointing: yes" in summary and "memory_per_update.png" in summary


@pytest.mark.parametrize("args,message", [
    (["--strategies", "sqrt,fastest"], "unknown strategy 'fastest'"),
    (["--sizes", "784,30,9"], "--sizes 784,30,9 do not fit the data: it has 784 inputs and 10 classes"),
    (["--data", "/no/such/mnist.npz"], "'/no/such/mnist.npz'"),
    (["--strategies", "budget(1KiB)"], "needs at least 11232 bytes"),
    (["--epochs", "0"], "argument --epochs: must be >= 1, got 0"),
    (["--strategies", "sqrt", "--every", "3"], "give --strategies or --every, not both"),
])
def test_compare_refuses_bad_input_in_one_line(args, message):
    proc = _run("compare", *args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_compare_reads_an_unreadable_file_as_an_error(tmp_path):
    bad = tmp_path / "mnist.npz"
    bad.write_bytes(b"not a zip")
    proc = _run("compare", "--data", str(bad))
    assert proc.returncode == 2 and str(bad) in proc.stderr and "Traceback" not in proc.stderr


def test_interrupted_compare_keeps_the_finished_runs(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "fastckpt", "compare", "--epochs", "40", "--out", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 240
    while not (tmp_path / "summary.md").exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert (tmp_path / "summary.md").exists(), "the first run never finished"
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "interrupted" in err and "finished runs written to" in err and "Traceback" not in err
    assert "plain" in (tmp_path / "summary.md").read_text()
    assert _is_png(tmp_path / "memory_per_update.png")


def test_plan_prints_what_the_library_plans():
    proc = _run("plan", "--sizes", "784,64,64,64,10", "--batch-size", "32", "--strategy", "revolve(1)")
    assert proc.returncode == 0, proc.stderr
    expected = fastckpt.plan([784, 64, 64, 64, 10], 32, strategy="revolve(1)")
    note = does_not_pay([784, 64, 64, 64, 10], 32, np.float64, "revolve(1)")
    assert note is not None and proc.stdout.strip() == expected.describe() + "\nnote: " + note
    proc = _run("plan", "--sizes", "784,64,64,64,10", "--batch-size", "32", "--strategy", "revolve(1)", "--json")
    got = json.loads(proc.stdout)
    assert got["bytes"] == expected.bytes() and got["kept"] == list(expected.kept)
    assert got["forward_counts"] == expected.forward_counts.tolist() and got["does_not_pay"] == note


@pytest.mark.parametrize("args,message", [
    (["--strategy", "fastest"], "unknown strategy 'fastest'"),
    (["--strategy", "revolve(0)"], "slots must be an integer >= 1, got 0"),
    (["--strategy", "budget(1KiB)"], "needs at least"),
    (["--sizes", "784,x,10"], "--sizes must be comma-separated integers, got '784,x,10'"),
    (["--batch-size", "0"], "must be >= 1, got 0"),
])
def test_plan_refuses_bad_arguments_with_a_reason(args, message):
    proc = _run("plan", *args)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_analyze_prints_planned_and_measured_memory_and_writes_pngs(tmp_path):
    proc = _run("analyze", "--depths", "1,4,16", "--measure", "4", "--width", "32", "--batch-size", "16",
                "--strategies", "plain,sqrt,budget(64KiB, once)", "--out", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    rows = depth_table([1, 4, 16], width=32, batch_size=16,
                                       strategies=["plain", "sqrt", "budget(64KiB, once)"])
    for row, mine in zip(got["rows"], rows):
        assert row["plain"]["total"] == mine["plain"]["total"] and row["sqrt"]["total"] == mine["sqrt"]["total"]
        if row["hidden_layers"] == 4:
            for name, measured in row["measured"].items():
                assert abs(measured - mine[name]["total"]) <= 0.02 * mine[name]["total"] + MiB
            assert set(row["measured"]) == {"plain", "sqrt", "budget(64KiB, once)"}
        else:
            assert row["measured"] == {}
    assert got["tradeoff"][-1]["extra_flop_fraction"] == 0.0
    for name in ("memory_vs_depth.png", "budget_tradeoff.png"):
        assert _is_png(tmp_path / name)


def test_analyze_measure_empty_measures_nothing():
    proc = _run("analyze", "--depths", "1,2", "--width", "16", "--batch-size", "8", "--measure", "", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["rows"]
    assert [r["hidden_layers"] for r in rows] == [1, 2] and all(r["measured"] == {} for r in rows)
    measured = _run("analyze", "--depths", "1,2", "--width", "16", "--batch-size", "8", "--measure", "2",
                    "--strategies", "plain", "--json")
    assert [set(r["measured"]) for r in json.loads(measured.stdout)["rows"]] == [set(), {"plain"}]


def test_profile_writes_a_flamegraph_and_says_where(tmp_path):
    proc = _run("profile", "--steps", "3", "--strategy", "sqrt", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    html = tmp_path / "memray-flamegraph.html"
    assert str(html) in proc.stdout and html.stat().st_size > 10_000
    assert "<html" in html.read_text()[:2000].lower()
    png, svg = tmp_path / "memory-peak.png", tmp_path / "memory-peak.svg"
    assert str(png) in proc.stdout and str(svg) in proc.stdout
    assert _is_png(png) and "<svg" in svg.read_text()[:2000] and "<script" not in svg.read_text()
    assert "internet" in proc.stdout and "offline" in proc.stdout


def _profiled(stdout):
    """(measured, planned, step, staging) in bytes, from profile's last line (MiB to 3 decimals)."""
    found = re.search(r"peak ([\d.]+) MiB measured, ([\d.]+) MiB planned: the step ([\d.]+) MiB .* staging rows "
                      r"([\d.]+) MiB", stdout)
    assert found, stdout
    return [round(float(v) * MiB) for v in found.groups()]


def test_profile_trains_the_net_its_flags_shape_and_plans_what_memray_measures(tmp_path):
    sizes = [784, 96, 96, 10]
    proc = _run("profile", "--sizes", "784,96,96,10", "--batch-size", "128", "--activation", "relu", "--init", "he",
                "--optimizer", "adam", "--eta", "0.001", "--strategy", "sqrt", "--steps", "3", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    measured, planned, step, staging = _profiled(proc.stdout)
    adam = fastckpt.plan(sizes, 128, strategy="sqrt", optimizer="adam").bytes()["total"]
    rows = 128 * 784 * 8 + 128 * 10 * 8                        # a minibatch of bytes and labels, as float64 rows
    half = 2**20 / 2000                      # the printed MiB's last digit, rounded
    assert abs(step - adam) <= half and abs(staging - rows) <= half and abs(planned - adam - rows) <= half
    assert adam > fastckpt.plan(sizes, 128, strategy="sqrt").bytes()["total"] + 2 * 96 * 784 * 8   # Adam's moments
    assert 0 <= measured - planned <= 100 * 1024, (measured, planned)      # the tens of KiB of Python objects


def test_profile_file_trains_the_saved_net_at_its_batch_and_refuses_a_flag_that_would_change_it(tmp_path):
    trained = _run("train", "--sizes", "784,64,64,10", "--batch-size", "50", "--optimizer", "momentum", "--strategy",
                   "revolve(1)", "--epochs", "1", "--save", str(tmp_path / "n.npz"), "--json")
    assert trained.returncode == 0, trained.stderr
    proc = _run("profile", str(tmp_path / "n.npz"), "--steps", "2", "--out", str(tmp_path / "p"))
    assert proc.returncode == 0, proc.stderr
    assert "(revolve(1)) and 2 training steps at batch 50 on the embedded digits" in proc.stdout
    measured, planned, step, _ = _profiled(proc.stdout)
    expected = fastckpt.plan([784, 64, 64, 10], 50, strategy="revolve(1)", optimizer="momentum").bytes()["total"]
    half = 2**20 / 2000                      # the printed MiB's last digit, rounded
    assert abs(step - expected) <= half and abs(planned - expected - 50 * 794 * 8) <= half
    assert 0 <= measured - planned <= 100 * 1024, (measured, planned)
    refused = _run("profile", str(tmp_path / "n.npz"), "--activation", "relu", "--out", str(tmp_path / "p"))
    assert refused.returncode == 2 and refused.stderr == (
        f"fastckpt profile: error: --activation would change the net FILE {str(tmp_path / 'n.npz')!r} holds; "
        "profile FILE trains it as saved: leave --activation out, or profile a new net with the flags and without "
        "FILE\n")
    large = _run("profile", "--batch-size", "5000", "--out", str(tmp_path / "p"))
    assert large.returncode == 2 and large.stderr == ("fastckpt profile: error: --batch-size 5000 is more than the "
                                                      "4000 training samples of the embedded digits\n")


@pytest.mark.parametrize("flags", [[], ["--sizes", "784,64,64,10", "--optimizer", "adam", "--epochs", "3"]],
                         ids=["defaults", "adam"])
def test_profile_max_memory_profiles_the_step_plan_data_chooses_for_the_bound(tmp_path, flags):
    """profile --max-memory used to end in AttributeError (its run's settings had no validation nor shuffle): it
    profiles the step train plans without --save, which plan --data predicts for the same bound."""
    planned = _run("plan", "--data", "embedded", "--max-memory", "20MiB", *flags, "--json")
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    assert plan["strategy"].startswith("fit(") and plan["whole_run"]["total"] <= 20 * MiB
    proc = _run("profile", "--max-memory", "20MiB", *flags, "--steps", "1", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert f"({plan['strategy']}) and 1 training steps at batch 10" in proc.stdout, proc.stdout
    _, _, step, _ = _profiled(proc.stdout)
    assert abs(step - plan["bytes"]["total"]) <= 2**20 / 2000          # the printed MiB's last digit, rounded
    small = _run("profile", "--max-memory", "1MiB", *flags, "--out", str(tmp_path))
    assert small.returncode == 2 and small.stderr.startswith("fastckpt profile: error: --max-memory 1MiB: loading the "
                                                             "data needs ") and small.stderr.count("\n") == 1


def test_profile_file_takes_the_batch_rate_and_data_its_training_state_records(tmp_path):
    """The README's promise: profile FILE trains at what FILE records; --eta, --batch-size and --data used to be
    taken over it.  The same values are taken; a net.save file, which records none, takes them from the flags."""
    trained = _run("train", "--sizes", "784,16,10", "--batch-size", "50", "--epochs", "1", "--save",
                   str(tmp_path / "n.npz"), "--json")
    assert trained.returncode == 0, trained.stderr
    (x, y), (xt, yt) = fastckpt.load_mnist()
    np.savez(tmp_path / "other.npz", x_train=x, y_train=y.argmax(axis=1), x_test=xt, y_test=yt.argmax(axis=1))
    file = str(tmp_path / "n.npz")
    for flags, said in ((["--eta", "0.5"], f"--eta 0.5 differs from the 3.0 FILE {file!r} records; profile FILE "
                                           "trains it as saved, at its training state's eta: leave --eta out"),
                        (["--batch-size", "20"], f"--batch-size 20 differs from the 50 FILE {file!r} records"),
                        (["--data", str(tmp_path / "other.npz")],
                         f"--data {str(tmp_path / 'other.npz')!r} differs from the data FILE {file!r} was trained on "
                         "(the embedded digits); profile FILE trains it as saved, on its data: leave --data out")):
        refused = _run("profile", file, *flags, "--out", str(tmp_path / "p"))
        assert refused.returncode == 2 and refused.stderr.startswith(f"fastckpt profile: error: {said}"), \
            refused.stderr
        assert refused.stderr.count("\n") == 1
    same = _run("profile", file, "--eta", "3", "--batch-size", "50", "--data", "embedded", "--steps", "1", "--out",
                str(tmp_path / "p"))
    assert same.returncode == 0 and "at batch 50 on the embedded digits" in same.stdout, same.stderr
    np.random.seed(0)
    fastckpt.Network([784, 16, 10]).save(tmp_path / "lab.npz")
    lab = _run("profile", str(tmp_path / "lab.npz"), "--batch-size", "20", "--eta", "0.5", "--data",
               str(tmp_path / "other.npz"), "--steps", "1", "--out", str(tmp_path / "p"))
    assert lab.returncode == 0, lab.stderr
    assert f"at batch 20 on {str(tmp_path / 'other.npz')!r}" in lab.stdout, lab.stdout


def test_compare_runs_the_installed_package_whatever_the_working_directory(tmp_path):
    """A source tree (or anything named fastckpt) in the working directory must not shadow the package."""
    script = os.path.join(os.path.dirname(sys.executable), "fastckpt")
    if not os.path.exists(script):
        pytest.skip("no fastckpt console script beside this Python")
    decoy = tmp_path / "fastckpt"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("raise ImportError('the decoy in the working directory was imported')\n")
    proc = subprocess.run([script, "compare", "--epochs", "1", "--strategies", "sqrt", "--json"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["same_accuracy"] is True


def _spans(values):
    """``0-2 5 7-9``: runs of consecutive integers, as the plan prints them."""
    runs = []
    for v in values:
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return " ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


@pytest.mark.bounds
def test_train_max_memory_says_in_words_what_it_kept_recomputed_and_the_peak_it_predicts():
    from fastckpt.planner.run import run_bytes
    sizes, batch, bound = [784] + [128] * 8 + [10], 1000, 27 * MiB
    args = ["train", "--sizes", ",".join(map(str, sizes)), "--batch-size", str(batch), "--epochs", "1",
            "--max-memory", "27MiB"]
    said = json.loads(_run(*args, "--json").stdout)
    step = fastckpt.plan(sizes, batch, strategy=said["strategy"])
    again = int((step.forward_counts > 1).sum())
    training, test = fastckpt.load_mnist(compact=True)
    whole = run_bytes(step, training, test, updates=len(training[0]) // batch, command=True)["total"]
    assert said["bound"] == {"max_memory": bound, "kept": list(step.kept), "recomputed_layers": again,
                             "extra_flop_fraction": step.extra_flop_fraction, "step_bytes": step.bytes()["total"],
                             "whole_run_bytes": whole}
    assert 0 < again < 9 and whole <= bound < run_bytes(fastckpt.plan(sizes, batch), training, test,
                                                         updates=len(training[0]) // batch)["total"]
    proc = _run(*args)
    assert proc.returncode == 0, proc.stderr
    first, *_, last = proc.stdout.splitlines()
    assert first == (f"--max-memory 27MiB: the step keeps activations {_spans(step.kept)} after the forward pass "
                     f"({len(step.kept) - 1} of 9 besides the input) and recomputes {again} of the 9 layers during "
                     f"backward ({100 * step.extra_flop_fraction:.1f}% more FLOPs than plain); the whole run's "
                     f"predicted peak is {whole / MiB:.2f} MiB, its step's {step.bytes()['total'] / MiB:.2f} MiB")
    assert last.startswith(f"trained {sizes} (--max-memory 27MiB: {again} of 9 layers recomputed) for 1 epoch")


def test_plan_data_prints_parts_that_add_up_to_its_total():
    args = ["plan", "--sizes", "784,512,512,512,10", "--batch-size", "256", "--data", "embedded", "--epochs", "1",
            "--blas-threads", "2"]
    proc = _run(*args)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout.split("the whole run on the embedded digits (1 epoch, as train runs it)", 1)[1]
    rows = [re.match(r"^  (\S.*?)\s+(-?[\d,]+)\s+-?[\d.]+ MiB$", line) for line in text.splitlines()]
    parts = {row.group(1): int(row.group(2).replace(",", "")) for row in rows if row}     # the step's own: indented
    total = parts.pop("total")
    assert set(parts) == {"data", "step", "staging", "records", "python objects", "evaluation",
                          "not held at once"}, parts
    assert sum(parts.values()) == total and parts["not held at once"] < 0
    whole = json.loads(_run(*args, "--json").stdout)["whole_run"]
    assert sum(v for k, v in whole.items() if not k.startswith("step: ") and k != "total") + whole["step: total"] \
        == whole["total"] == total
    assert whole["not held at once"] == -min(whole["step: blas"], whole["evaluation"]) < 0
    training, test = fastckpt.load_mnist(compact=True)
    from fastckpt.planner.run import run_bytes
    step = fastckpt.plan([784, 512, 512, 512, 10], 256, blas_threads=2)
    for save in (False, True):
        got = run_bytes(step, training, test, updates=15, save=save)
        held = [got["step: blas"], got["evaluation"]] + ([got["saving"]] if save else [])   # the largest counts
        assert got["total"] == got["data"] + got["step: total"] - got["step: blas"] + got["staging"] + \
            got["records"] + got["python objects"] + max(held)
        assert got["total"] == sum(v for k, v in got.items() if not k.startswith("step: ") and k != "total") + \
            got["step: total"]


@pytest.mark.bounds
def test_plan_max_batch_says_why_adam_in_backward_fits_a_smaller_batch():
    sizes = [784] + [512] * 16 + [10]
    args = ["plan", "--sizes", ",".join(map(str, sizes)), "--max-memory", "256MiB", "--max-batch", "--epochs", "3",
            "--blas-threads", "2"]
    adam = json.loads(_run(*args, "--optimizer", "adam", "--json").stdout)
    rows = {(r["strategy"], r["optimizer_in_backward"]): r for r in adam["largest"]}
    fewer = [s for s in ("plain", "every_nth(2)", "sqrt") if rows[s, True]["batch"] < rows[s, False]["batch"]]
    assert fewer == ["plain", "every_nth(2)", "sqrt"], rows
    for s in fewer:                                # the cause, from the plans: shared gradients, one layer's held
        kept = fastckpt.plan(sizes, rows[s, False]["batch"], strategy=s, optimizer="adam").bytes()
        fused = fastckpt.plan(sizes, rows[s, True]["batch"], strategy=s, optimizer="adam",
                              optimizer_in_backward=True).bytes()
        assert kept["gradients"] + kept["shared_by_gradients"] == 0
        assert fused["gradients"] == (512 * 784 + 512) * 8 and fused["shared_by_gradients"] == 0
    assert adam["note"] == ("with adam the optimizer in backward still holds one layer's gradient, the largest "
                            f"({(512 * 784 + 512) * 8 / MiB:.2f} MiB), beside the activations, while the kept "
                            "gradients fit wholly in the memory the backward pass frees from the activations "
                            "(shared_by_gradients in fastckpt plan): so plain, every_nth(2), sqrt fit a larger batch "
                            "with the gradients kept; with SGD the optimizer in backward holds no gradient at all")
    assert _run(*args, "--optimizer", "adam").stdout.splitlines()[-1] == "note: " + adam["note"]
    sgd = json.loads(_run(*args, "--json").stdout)
    assert sgd["note"] is None and all(r["batch"] >= rows[r["strategy"], False]["batch"] for r in sgd["largest"])
