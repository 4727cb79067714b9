"""When checkpointing pays (fastckpt.planner.pays) against a scan of every batch, and the one line that says so."""

import numpy as np
import pytest
from cli_runner import run_cli

import fastckpt
from fastckpt.planner.pays import does_not_pay, pays_from, saving

NETS = [[784, 40, 30, 10], [20, 50, 50, 50, 50, 3], [784] + [64] * 6 + [10]]


def _scan(sizes, strategy, fused, upto):
    """The first batch in 1..upto whose plan holds fewer bytes than plain's, by planning every batch."""
    for b in range(1, upto + 1):
        mine = fastckpt.plan(sizes, b, strategy=strategy, optimizer_in_backward=fused).bytes()["total"]
        if mine < fastckpt.plan(sizes, b, optimizer_in_backward=fused).bytes()["total"]:
            return b
    return None


@pytest.mark.parametrize("sizes", NETS, ids=lambda s: f"{len(s)}layers")
@pytest.mark.parametrize("strategy", ["sqrt", "every_nth(2)", "segments(2)"])
@pytest.mark.parametrize("fused", [False, True])
def test_the_batch_it_pays_from_is_the_first_a_scan_finds(sizes, strategy, fused):
    found = pays_from(sizes, np.float64, strategy, optimizer_in_backward=fused, largest=600)
    assert found == _scan(sizes, strategy, fused, 600)
    if found is not None:                                  # and it keeps paying at every larger batch scanned
        assert all(saving(sizes, b, np.float64, strategy, optimizer_in_backward=fused)[0] > 0
                   for b in range(found, min(found + 40, 600)))


def test_a_strategy_that_never_recomputes_or_chooses_by_bytes_is_not_judged():
    sizes = [784, 40, 30, 10]
    for strategy in ("plain", "fit(1MiB)", "budget(1MiB)", "every_nth(1)"):
        assert does_not_pay(sizes, 10, np.float64, strategy) is None, strategy
    assert does_not_pay(sizes, 500, np.float64, "sqrt") is None          # it saves there


def test_the_line_names_the_cost_and_the_batches_from_which_it_pays():
    sizes = [784, 40, 30, 10]
    start, fused = _scan(sizes, "sqrt", False, 600), _scan(sizes, "sqrt", True, 600)
    extra = fastckpt.plan(sizes, 10, strategy="sqrt").extra_flop_fraction
    assert does_not_pay(sizes, 10, np.float64, "sqrt") == (
        "sqrt saves no memory over plain for [784, 40, 30, 10] at batch 10 (the activations fit in the gradient "
        f"buffers) and runs {100 * extra:.0f}% more FLOPs; it saves from batch {start}, or from batch {fused} with "
        "the optimizer in backward (--optimizer-in-backward)")
    assert fused == 1 and start > 100


def test_plan_train_and_compare_say_it_in_one_line(tmp_path):
    shown = run_cli("plan", "--strategy", "sqrt")
    assert shown.stdout.splitlines()[-1].startswith("note: sqrt saves no memory over plain"), shown.stdout
    quiet = run_cli("plan", "--strategy", "sqrt", "--batch-size", "1000")
    assert "note:" not in quiet.stdout
    trained = run_cli("train", "--strategy", "sqrt", "--epochs", "1", cwd=tmp_path)
    assert trained.stderr.startswith("fastckpt train: note: sqrt saves no memory over plain"), trained.stderr


@pytest.mark.parametrize("strategy", ["plain", "every_nth(2)", "sqrt", "revolve(2)"])
@pytest.mark.parametrize("fused", [False, True])
def test_the_largest_step_batch_is_the_one_a_scan_finds(strategy, fused):
    from fastckpt.planner import plan
    from fastckpt.planner.curves import largest_step_batch
    sizes, bound = [30, 24, 24, 24, 24, 24, 6], 160 * 1024
    fits = [b for b in range(1, 1500)
            if plan(sizes, b, np.float64, strategy, optimizer_in_backward=fused).bytes()["total"] <= bound]
    batch, p = largest_step_batch(sizes, bound, np.float64, strategy, optimizer_in_backward=fused)
    assert fits == list(range(1, batch + 1)) and p.batch_size == batch and p.bytes()["total"] <= bound
    assert largest_step_batch(sizes, 1024, np.float64, strategy, optimizer_in_backward=fused) is None


def test_analyze_max_memory_gives_the_largest_batch_per_depth_and_strategy(capsys):
    import json

    from fastckpt.cli import app as cli
    from fastckpt.planner.curves import largest_step_batch
    assert cli.main(["analyze", "--depths", "2,8", "--measure", "1", "--strategies", "plain,sqrt",
                     "--max-memory", "64MiB", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    for row in rows:
        for name in ("plain", "sqrt"):
            assert row["largest_batch"][name] == largest_step_batch(row["sizes"], 64 * 2**20, np.float64, name)[0]
    assert rows[1]["largest_batch"]["sqrt"] > rows[1]["largest_batch"]["plain"]      # checkpointing pays here
