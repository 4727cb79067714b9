"""The docs run as written: every Python block of docs/ runs, every command line of README and docs/
parses with the real parser, and every strategy they spell parses.

The README's own Python block, its plan output and every link are checked in test_readme.py.
docs/misuse.md is left out of the command check: its commands are wrong on purpose, and
test_cli_contract.py runs each of its rows.
"""
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from fastckpt.cli.parser import parser, settled
from fastckpt.cli.train import check_modes
from fastckpt.planner import parse_strategy

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))]
MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")

# What a block takes from the text around it (a net, data), and how it is run.
SETUP = {
    ("docs/data-parallel.md", 0): dict(before="import numpy as np\nfrom fastckpt import Network, load_mnist\n"
                                              "(x_train, y_train), _ = load_mnist()\n"
                                              "net = Network([784, 40, 30, 10])\n"),
    ("docs/model-parallel.md", 0): dict(ranks=8),          # one trainer over a 2 x 2 x 2 grid
    ("docs/planning.md", 1): dict(argv=["8", "revolve(4)"]),
}


def _blocks(doc, language):
    text = (ROOT / doc).read_text()
    return re.findall(r"^```" + language + r"\n(.*?)^```", text, re.S | re.M)


PYTHON = [(doc, i) for doc in DOCS if doc != "README.md" for i, _ in enumerate(_blocks(doc, "python"))]


def test_the_docs_have_python_blocks_and_each_known_setup_still_matches_one():
    assert len(PYTHON) >= 5, PYTHON
    assert set(SETUP) <= set(PYTHON), set(SETUP) - set(PYTHON)


@pytest.mark.parametrize("doc,index", PYTHON, ids=[f"{d}-{i}" for d, i in PYTHON])
def test_every_python_block_of_the_docs_runs(doc, index, tmp_path):
    setup = SETUP.get((doc, index), {})
    script = tmp_path / "block.py"
    script.write_text(setup.get("before", "") + _blocks(doc, "python")[index])
    command = [sys.executable, str(script), *setup.get("argv", [])]
    if setup.get("ranks"):
        if MPIEXEC is None:
            pytest.skip("mpiexec is not installed")
        command = [MPIEXEC, "-n", str(setup["ranks"]), *command]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr


def _command_lines():
    """Every ``fastckpt <command> ...`` of the docs' code blocks and inline code, as (doc, argv)."""
    found = []
    for doc in DOCS:
        if doc == "docs/misuse.md":
            continue
        text = (ROOT / doc).read_text()
        blocks = re.findall(r"^```[a-z]*\n(.*?)^```", text, re.S | re.M)
        lines = [line for block in blocks for line in block.splitlines()]
        lines += re.findall(r"`([^`\n]*fastckpt [a-z][^`\n]*)`", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M))
        for line in lines:
            line = line.split("#")[0].strip().removeprefix("$ ")
            match = re.search(r"(?:^|&& |mpiexec (?:-f \S+ )?-n \d+ )fastckpt ([a-z].*)$", line)
            if match is None or re.search(r"\[|\.\.\.|…|<|\bBYTES\b|\|", line):
                continue                                      # a synopsis or a placeholder, not a command
            found.append((doc, shlex.split(match.group(1))))
    return found


COMMANDS = _command_lines()


def test_the_docs_have_commands_to_check():
    assert len(COMMANDS) >= 15, COMMANDS
    assert ("README.md", ["compare"]) in COMMANDS


@pytest.mark.parametrize("doc,argv", COMMANDS, ids=[f"{d}: {' '.join(a)}" for d, a in COMMANDS])
def test_every_command_of_the_docs_parses(doc, argv, capsys):
    try:
        args = parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"{doc}: fastckpt {' '.join(argv)}: {capsys.readouterr().err}")
    args = settled(args)
    if argv[0] == "train":
        check_modes(args)                                   # flags that need a mode they lack


def _strategies():
    names = "plain|every_nth|segments|sqrt|revolve|budget|fit"
    spelled = set()
    for doc in DOCS:
        spelled |= set(re.findall(rf"(?<![\w(])((?:{names})\(\d[\w.,* ]*\))", (ROOT / doc).read_text()))
    return sorted(spelled)


STRATEGIES = _strategies()


def test_every_strategy_the_docs_spell_parses():
    assert len(STRATEGIES) >= 10, STRATEGIES
    bad = {}
    for spelling in STRATEGIES:
        try:
            parse_strategy(spelling)
        except ValueError as exc:
            bad[spelling] = str(exc)
    assert not bad, bad


def test_the_strategy_check_catches_a_spelling_the_parser_refuses():
    with pytest.raises(ValueError):
        parse_strategy("revolve(10**9)")


def _aliases():
    """{older long name: documented name} of every option that has two long names (the first is documented)."""
    found = {}
    top = parser()
    for command in top.subcommands.values():
        for action in command._actions:
            names = [n for n in action.option_strings if n.startswith("--")]
            found.update({alias: names[0] for alias in names[1:]})
    return found


def test_the_docs_spell_a_flag_by_its_documented_name_and_an_older_one_only_beside_it():
    aliases = _aliases()
    assert aliases.get("--sgd-in-backward") == "--optimizer-in-backward"
    for doc in DOCS:
        for line in (ROOT / doc).read_text().splitlines():
            for alias, name in aliases.items():
                if re.search(re.escape(alias) + r"(?![\w-])", line):
                    assert name in line and "older name" in line, (doc, line)
    shown = " ".join(subprocess.run([sys.executable, "-m", "fastckpt", "train", "--help"], capture_output=True,
                                    text=True, timeout=60).stdout.split())
    assert "--optimizer-in-backward, --sgd-in-backward" in shown and "its older name" in shown
    assert parser().parse_args(["train", "--sgd-in-backward"]).sgd_in_backward is True


NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5}


def test_the_docs_count_the_plots_compare_out_writes(tmp_path):
    from fastckpt.report.summary import write_report
    result = {"name": "plain", "strategy": "plain", "accuracies": [0.5], "ms_per_update": 1.0,
              "memray_peak_bytes": 2**20, "predicted_bytes": 2**20, "recompute_factor": 1.0,
              "extra_flop_fraction": 0.0, "time_ratio": 1.0, "memory_ratio": 1.0, "rss_bytes": [1, 2],
              "rss_base_bytes": 0, "update_seconds": [0.1, 0.1]}
    setup = {"sizes": [784, 40, 30, 10], "batch_size": 10, "eta": 3.0, "epochs": 1, "dtype": "float64", "seed": 0,
             "data": "x"}
    written = write_report(tmp_path, [result, dict(result, name="sqrt", strategy="sqrt")], setup)
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert len(pngs) == sum(str(p).endswith(".png") for p in written.values()) == 3, pngs
    said = {}
    for doc in ("README.md", "docs/compare.md"):
        text = " ".join((ROOT / doc).read_text().split())
        said[doc] = re.findall(r"`fastckpt compare --out DIR` (?:also )?writes `summary\.md` and (\w+) plots", text)
    assert said == {doc: [next(w for w, n in NUMBERS.items() if n == len(pngs))] for doc in said}, said
