"""The ``fastckpt`` command driven as a user would: a subprocess, its output and exit code."""
import subprocess
import sys

import pytest

import fastckpt


def _run(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "fastckpt", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_plan_prints_what_the_library_plans():
    proc = _run("plan", "--sizes", "784,64,64,64,10", "--batch-size", "32", "--strategy", "revolve(1)")
    assert proc.returncode == 0, proc.stderr
    expected = fastckpt.plan([784, 64, 64, 64, 10], 32, strategy="revolve(1)")
    assert proc.stdout.strip() == expected.describe()
    assert f"{expected.bytes()['total']:,d}" in proc.stdout


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
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_analyze_prints_the_planner_numbers_and_writes_pngs(tmp_path):
    proc = _run("analyze", "--depths", "1,4,16", "--width", "32", "--batch-size", "16",
                "--strategies", "plain,sqrt,budget(64KiB, once)", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    rows = fastckpt.memory.depth_table([1, 4, 16], width=32, batch_size=16,
                                       strategies=["plain", "sqrt", "budget(64KiB, once)"])
    lines = {line.split()[0]: line.split()[1:] for line in proc.stdout.splitlines()
             if line.split() and line.split()[0].isdigit()}
    for row in rows:
        cells = lines[str(row["hidden_layers"])]
        assert float(cells[0]) == pytest.approx(row["plain"]["total"] / 2**20, abs=0.006)
        assert float(cells[1]) == pytest.approx(row["sqrt"]["total"] / 2**20, abs=0.006)
    for name in ("memory_vs_depth.png", "budget_tradeoff.png"):
        data = (tmp_path / name).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000


def test_compare_trains_any_strategy_and_refuses_a_budget_that_cannot_fit():
    proc = _run("compare", "--epochs", "1", "--strategies", "sqrt,revolve(1)")
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines() if line[:1].isalpha()}
    assert {"plain", "sqrt", "revolve(1)"} <= rows.keys()
    assert rows["revolve(1)"][1] == rows["plain"][1]                       # same accuracy
    assert float(rows["revolve(1)"][-1]) == pytest.approx(
        fastckpt.plan([784, 40, 30, 10], 10, strategy="revolve(1)").recompute_factor, abs=0.005)
    proc = _run("compare", "--epochs", "1", "--strategies", "budget(1KiB)")
    assert proc.returncode == 2
    assert "needs at least 11232 bytes" in proc.stderr and "Traceback" not in proc.stderr
