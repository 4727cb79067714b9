"""The command explains itself: --version, a bare ``fastckpt``, every option's help and default, --max-memory."""
import argparse
import subprocess
import sys

import pytest
from cli_runner import run_cli

import fastckpt
from fastckpt import plan
from fastckpt.cli import options, parser

FASTCKPT = [sys.executable, "-m", "fastckpt"]


def _run(*args):
    return run_cli(*args)


def test_version():
    proc = _run("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"fastckpt {fastckpt.__version__}"


def test_version_matches_the_package_metadata():
    from importlib.metadata import version
    assert version("fastckpt") == fastckpt.__version__


def test_a_bare_fastckpt_lists_every_command_with_one_line():
    proc = _run()
    assert proc.returncode == 0 and proc.stderr == ""
    listed = [line.split()[0] for line in proc.stdout.splitlines() if line.startswith("  ")]
    assert listed == ["compare", "plan", "analyze", "train", "evaluate", "predict", "profile"]
    for line in proc.stdout.splitlines():
        if line.startswith("  "):
            assert len(line.split(None, 1)[1]) > 20, line            # a description, not just a name


def _options():
    top = parser.parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    for name, p in sub.choices.items():
        for action in p._actions:
            if action.option_strings and action.dest != "help":
                yield name, action, p


@pytest.mark.parametrize("name,action,parser", list(_options()),
                         ids=[f"{n}-{a.option_strings[0]}" for n, a, _ in _options()])
def test_every_option_has_a_description_and_its_default(name, action, parser):
    assert action.help and len(action.help) > 10
    shown = options.Help(name)._get_help_string(action) % {"default": action.default}
    assert "default" in shown, (name, action.option_strings, shown)
    if action.default not in (None, False) and not isinstance(action.default, list):
        assert str(action.default) in shown or "default:" in action.help


@pytest.mark.parametrize("command", ["compare", "plan", "analyze", "train", "evaluate", "predict", "profile"])
def test_an_unknown_flag_is_refused_in_the_command_s_name(command):
    proc = _run(command, *(["net.npz"] if command in ("evaluate", "predict") else []), "--no-such-flag=1")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"fastckpt {command}: error: unrecognized arguments: --no-such-flag=1\n", proc.stderr


def test_an_unknown_flag_before_any_command_is_the_top_level_s():
    proc = _run("--no-such-flag")
    assert proc.returncode == 2 and proc.stderr == "fastckpt: error: unrecognized arguments: --no-such-flag\n"


@pytest.mark.parametrize("command", ["plan", "train", "profile"])
def test_every_command_that_takes_a_strategy_defaults_to_plain_and_says_so(command):
    from fastckpt.cli.profile import run_settings
    from fastckpt.cli.train import settle
    args = parser.settled(parser.parser().parse_args([command]))
    strategy = {"train": lambda: settle(args).strategy, "profile": lambda: run_settings(args, None)[0].strategy,
                "plan": lambda: args.strategy}[command]()
    assert str(strategy) == "plain"
    shown = " ".join(_run(command, "--help").stdout.split())
    assert "(default: plain" in shown and "(default: every_nth" not in shown


def test_help_shows_the_defaults():
    out = _run("compare", "--help").stdout
    assert "(default: 784,40,30,10)" in " ".join(out.split()) and "(default: 10)" in out


def test_max_memory_is_fit_and_bounds_the_whole_step():
    proc = _run("plan", "--sizes", "784,256,256,256,256,256,256,10", "--batch-size", "2000", "--max-memory", "24MiB",
                "--json")
    assert proc.returncode == 0, proc.stderr
    import json
    got = json.loads(proc.stdout)
    assert got["strategy"] == "fit(24MiB)" and got["bytes"]["total"] <= 24 * 2**20
    whole = plan([784] + [256] * 6 + [10], 2000, strategy="plain").bytes()["total"]
    assert whole > 24 * 2**20                                             # it had to checkpoint
    both = _run("plan", "--strategy", "sqrt", "--max-memory", "1GiB")
    assert both.returncode == 2 and "give --strategy or --max-memory, not both" in both.stderr
    small = _run("plan", "--max-memory", "10KiB")
    assert small.returncode == 2 and "--max-memory 10KiB: " in small.stderr and "needs at least" in small.stderr
    bad = _run("train", "--max-memory", "lots")
    assert bad.returncode == 2 and "--max-memory: cannot read 'lots' as bytes" in bad.stderr


def test_one_list_separator_everywhere():
    """Commands and scripts read strategy lists alike: commas, with commas inside parentheses kept."""
    from fastckpt.planner.strategies import parse_strategies
    assert [str(s) for s in parse_strategies("every_nth(2),budget(24MiB, once),fit(1GiB)")] == \
        ["every_nth(2)", "budget(24MiB, once)", "fit(1GiB)"]
    proc = subprocess.run([sys.executable, "benchmarks/interleaved.py", "--help"], capture_output=True, text=True,
                          timeout=60, cwd=str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    assert proc.returncode == 0 and "comma-separated" in proc.stdout and ";" not in proc.stdout
