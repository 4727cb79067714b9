"""The README runs as written: its Use block, its commands' outputs, and every link it makes."""
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_use_block_runs_as_written_and_prints_what_its_comments_say(tmp_path):
    block = re.findall(r"```python\n(.*?)```", README, re.S)[0]
    proc = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    comments = re.findall(r"#.*?: (\[[0-9 ]+\] \d+|0\.\d+)\s*$", block, re.M)
    assert len(comments) == 2, comments
    for comment in comments:
        assert comment in proc.stdout, (comment, proc.stdout)
    assert (tmp_path / "net.npz").exists()


def test_the_train_example_is_what_the_command_prints_but_for_its_times(tmp_path):
    cmd = "fastckpt train --epochs 2"
    shown = README.split(f"$ {cmd}\n", 1)[1].split("```", 1)[0].splitlines()
    proc = subprocess.run([sys.executable, "-m", "fastckpt", *cmd.split()[1:]], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr

    def timeless(line):
        return re.sub(r"\d+\.\d+ (s|ms)\b", "T", line)
    assert [timeless(line) for line in proc.stdout.splitlines()] == [timeless(line) for line in shown]


def _mib(text, before):
    """The MiB figure the README gives just before ``before`` (``the step 68.83 MiB``)."""
    return float(re.search(r"([\d.]+) MiB" + re.escape(before), " ".join(text.split())).group(1))


def test_the_whole_run_figures_are_what_plan_data_predicts_for_fashion_mnist_s_shape():
    """The README's run: [784] + [512]*16 + [10], batch 256, one epoch, on 60,000 + 10,000 images and their
    labels as bytes, BLAS on the 2 threads of its machine."""
    from fastckpt.kernels import blas_core

    from fastckpt.data.images import Images
    from fastckpt.planner import plan
    from fastckpt.planner.run import NOT_AT_ONCE, run_bytes
    if blas_core() == "mkl":
        pytest.skip("the README's figures are OpenBLAS's (MKL keeps buffers no plan counts)")
    images = np.zeros((70_000, 784), np.uint8)
    training = (Images(images[:60_000]), np.zeros(60_000, np.uint8))
    test = (Images(images[60_000:]), np.zeros(10_000, np.uint8))
    parts = run_bytes(plan([784] + [512] * 16 + [10], 256, blas_threads=2), training, test, updates=60_000 // 256,
                      command=True)
    said = " ".join(README.split("### The whole run", 1)[1].split())
    assert f"| plain | {parts['total'] / 2**20:.2f} |" in said
    for before, part in ((" predicted, the data", "total"), (" as bytes", "data"),
                         (" (the plan's total", "step: total"), (", the result lists", "staging"),
                         (", the Python objects", "records"), (" and the evaluation", "python objects"),
                         (" BLAS job table", "step: blas")):
        assert _mib(said, before) == round(abs(parts[part]) / 2**20, 2), (before, part, parts)
    assert _mib(said, ", less the step's") == round(parts["evaluation"] / 2**20, 2)
    assert parts[NOT_AT_ONCE] == -parts["step: blas"] < 0


@pytest.mark.bounds
def test_the_max_memory_example_is_what_the_command_prints():
    cmd = "fastckpt plan --sizes 784,256,256,256,256,256,256,10 --batch-size 2000 --max-memory 24MiB"
    shown = README.split(f"$ {cmd}\n", 1)[1].split("```", 1)[0]
    proc = subprocess.run([sys.executable, "-m", "fastckpt", *cmd.split()[1:]], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    plan_lines = [line for line in proc.stdout.splitlines() if "blas" not in line and "total" not in line]
    for line in plan_lines:                                   # BLAS's buffers depend on the machine's threads
        assert line in shown, line


@pytest.mark.parametrize("doc", ["README.md", *sorted(p.relative_to(ROOT).as_posix()
                                                      for p in (ROOT / "docs").glob("*.md"))])
def test_every_relative_link_points_at_a_file(doc):
    path = ROOT / doc
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
        if not re.match(r"[a-z]+:", target):
            assert (path.parent / target).exists(), (doc, target)
