"""lr_schedule= and --lr-schedule: PyTorch's StepLR and CosineAnnealingLR per epoch, against their recursive
forms, in a training run against a hand-written loop, and across a --resume."""
import json
import math
from fractions import Fraction

import numpy as np
import pytest
from cli_runner import run_cli

import fastckpt
from fastckpt import Network
from fastckpt.core.lr import Constant, Cosine, StepDecay, parse_lr_schedule


def _step_recursive(eta, step_size, gamma, epochs):
    """StepLR as PyTorch steps it: the rate times gamma whenever the epoch is a multiple of step_size."""
    out, rate = [], eta
    for e in range(epochs):
        if e > 0 and e % step_size == 0:
            rate *= gamma
        out.append(rate)
    return out


def _cosine_recursive(eta, period, eta_min, epochs):
    """CosineAnnealingLR's recursive form (torch.optim.lr_scheduler.CosineAnnealingLR.get_lr) up to T."""
    out, rate = [eta], eta
    for e in range(1, epochs):
        rate = eta_min + (rate - eta_min) * (1 + math.cos(math.pi * e / period)) / (
            1 + math.cos(math.pi * (e - 1) / period))
        out.append(rate)
    return out


@pytest.mark.parametrize("step_size, gamma", [(1, 0.5), (3, 0.1), (4, 0.9)])
def test_step_decay_is_steplr(step_size, gamma):
    sched = parse_lr_schedule(f"step({step_size}, {gamma})")
    assert sched == StepDecay(step_size, gamma)
    got = [sched.rate(0.3, e, 12) for e in range(12)]
    np.testing.assert_allclose(got, _step_recursive(0.3, step_size, gamma, 12), rtol=1e-14)


@pytest.mark.parametrize("period, eta_min", [(5, 0.0), (8, 0.01), (3, 0.001)])
def test_cosine_is_cosine_annealing(period, eta_min):
    sched = parse_lr_schedule(f"cosine({period}, {eta_min})")
    got = [sched.rate(0.2, e, 99) for e in range(period)]
    np.testing.assert_allclose(got, _cosine_recursive(0.2, period, eta_min, period), rtol=1e-12, atol=1e-15)
    assert sched.rate(0.2, period, 99) == sched.rate(0.2, period + 7, 99) == eta_min   # then it stays there


def test_cosine_without_a_period_takes_the_runs_epochs():
    sched = parse_lr_schedule("cosine")
    assert sched.rate(1.0, 0, 4) == 1.0 and sched.rate(1.0, 2, 4) == pytest.approx(0.5, abs=1e-15)
    assert str(sched.resolved(4)) == "cosine(4)" and sched.resolved(4).rate(1.0, 2, 99) == sched.rate(1.0, 2, 4)
    assert parse_lr_schedule(None) == Constant() == parse_lr_schedule("constant")
    assert parse_lr_schedule(str(Cosine(6, 0.5))) == Cosine(6, 0.5)


@pytest.mark.parametrize("spec, message", [
    ("linear", "lr_schedule must be constant, step(N[, gamma]) or cosine[(T[, eta_min])], got 'linear'"),
    ("step", "got 'step'"), ("step(1, 2, 3)", "got 'step(1, 2, 3)'"), ("constant(1)", "got 'constant(1)'"),
    ("step(0)", "step(step_size) must be >= 1, got 0"), ("step(2, -1)", "step(gamma) must be finite and >= 0"),
    ("cosine(x)", "lr_schedule 'cosine(x)'"), ("cosine(4, nan)", "cosine(eta_min) must be finite"), (3, "got 3"),
])
def test_bad_schedules_name_themselves(spec, message):
    with pytest.raises(ValueError) as info:
        parse_lr_schedule(spec)
    assert message in str(info.value)


@pytest.mark.parametrize("spec", ["step(2, 0.5)", "cosine", "cosine(3, 0.01)"])
def test_sgd_takes_each_epochs_rate(rng, spec):
    x, y = rng.random((40, 12)), np.eye(3)[rng.integers(0, 3, 40)]
    np.random.seed(5)
    net = Network([12, 8, 3], optimizer="momentum")
    net.SGD((x, y), 5, 10, 0.5, verbose=False, lr_schedule=spec)
    np.random.seed(5)
    ref = Network([12, 8, 3], optimizer="momentum")
    sched = parse_lr_schedule(spec)
    rates = [sched.rate(0.5, e, 5) for e in range(5)]
    for rate in rates:
        for s in range(0, 40, 10):
            ref.update_mini_batch(x[s:s + 10], y[s:s + 10], rate)
    assert net.history["eta"] == rates
    for a, b in zip(net.weights + net.biases, ref.weights + ref.biases):
        np.testing.assert_array_equal(a, b)


def _train(*args, cwd):
    proc = run_cli("train", "--sizes", "784,20,10", "--json", *args, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_resumed_run_keeps_its_schedule_and_may_change_it(tmp_path):
    _train("--epochs", "4", "--lr-schedule", "cosine", "--save", "whole.npz", cwd=tmp_path)
    _train("--epochs", "2", "--lr-schedule", "cosine(4)", "--save", "half.npz", cwd=tmp_path)
    _train("--resume", "half.npz", "--epochs", "4", "--save", "half.npz", cwd=tmp_path)
    whole, half = fastckpt.load(tmp_path / "whole.npz"), fastckpt.load(tmp_path / "half.npz")
    assert whole.training_state["lr_schedule"] == half.training_state["lr_schedule"] == "cosine(4)"
    for a, b in zip(whole.weights + whole.biases, half.weights + half.biases):
        np.testing.assert_array_equal(a, b)
    _train("--resume", "half.npz", "--epochs", "5", "--lr-schedule", "step(1, 0.5)", "--save", "half.npz",
           cwd=tmp_path)
    assert fastckpt.load(tmp_path / "half.npz").training_state["lr_schedule"] == "step(1, 0.5)"
    bad = run_cli("train", "--lr-schedule", "cosine(0)", cwd=tmp_path)
    assert bad.returncode == 2 and "--lr-schedule" in bad.stderr and "cosine(epochs) must be >= 1, got 0" in bad.stderr


def test_a_resume_past_a_stored_cosine_s_end_says_it_trains_at_eta_min(tmp_path):
    _train("--epochs", "2", "--lr-schedule", "cosine", "--save", "c.npz", cwd=tmp_path)     # stored as cosine(2)
    proc = run_cli("train", "--resume", "c.npz", "--epochs", "4", "--save", "c.npz", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "note: the --resume file's --lr-schedule cosine(2) reached its eta_min 0 at epoch 3, so epochs 3..4 " \
           "train at 0; --lr-schedule 'cosine(4)' anneals over all 4" in proc.stderr, proc.stderr


def _exact_step(eta, gamma, steps):
    """eta * gamma ** steps from the exact product (Python's fractions), rounded once; the closed form and the
    scaled product round two or three times, within 4e-16 of it."""
    try:
        return float(Fraction(eta) * Fraction(gamma) ** steps)
    except OverflowError:
        return math.inf


@pytest.mark.parametrize("spec, eta, epoch", [("step(1, 1e200)", 1e-300, 5), ("step(1, 1e308)", 1e-300, 3),
                                              ("step(2, 10)", 1e300, 19)])
def test_a_schedule_that_overflows_is_refused_before_the_first_epoch(rng, spec, eta, epoch):
    """Every epoch's rate is known before the first: a rate past float64 is refused then, naming the schedule and
    the epoch counted from 1 as the command line's lines count them, with nothing trained (it used to train the
    epochs before it, then raise OverflowError).  The epoch before it has a rate a float holds, and is taken."""
    x, y = rng.random((20, 6)), np.eye(2)[rng.integers(0, 2, 20)]
    net = Network([6, 4, 2])
    before = [w.copy() for w in net.weights + net.biases]
    with pytest.raises(ValueError) as info:
        net.SGD((x, y), epoch, 10, eta, verbose=False, lr_schedule=spec)
    assert str(info.value).startswith(f"lr_schedule {parse_lr_schedule(spec)} from eta {eta!r} gives epoch "
                                      f"{epoch}/{epoch} a learning rate of inf"), info.value
    assert all(np.array_equal(a, b) for a, b in zip(before, net.weights + net.biases))
    sched = parse_lr_schedule(spec)
    sched.check_rates(eta, 0, epoch - 1)                                       # one epoch fewer is taken
    np.testing.assert_allclose([sched.rate(eta, e, epoch) for e in range(epoch - 1)],
                               [_exact_step(eta, sched.gamma, e // sched.step_size) for e in range(epoch - 1)],
                               rtol=4e-16, atol=0)


@pytest.mark.parametrize("eta, step_size, gamma, epochs", [(1e-300, 1, 1e200, 4), (1e-320, 2, 1e160, 5),
                                                           (1e300, 1, 1e-200, 3), (1e300, 1, 1e-160, 4),
                                                           (0.0, 1, 1e200, 4), (0.7, 400, 0.5, 3_000)])
def test_a_step_rate_a_float_holds_never_overflows_on_the_way(eta, step_size, gamma, epochs):
    """gamma ** steps may be past float64 (1e200 ** 2) while eta * gamma ** steps is not (1e100): such a rate used
    to be refused as an overflow (or, below float64, taken as 0)."""
    sched = StepDecay(step_size, gamma)
    sched.check_rates(eta, 0, epochs)
    got = [sched.rate(eta, e, epochs) for e in range(epochs)]
    want = [_exact_step(eta, gamma, e // step_size) for e in range(epochs)]
    np.testing.assert_allclose(got, want, rtol=4e-16, atol=0)
    assert all(math.isfinite(rate) for rate in got)


def test_a_cosine_from_an_eta_near_float64_s_largest_does_not_overflow():
    """(eta - eta_min) * (1 + cos) overflowed for eta above half of float64's largest: epoch 2 of cosine(4) from
    1.5e308 was refused as a rate of inf, though it is 1.28e308."""
    eta, sched = 1.5e308, Cosine(4, 1e307)
    sched.check_rates(eta, 0, 4)
    for e in range(4):
        cos = math.cos(math.pi * e / 4)
        want = float(Fraction(1e307) + (Fraction(eta) - Fraction(1e307)) * (1 + Fraction(cos)) / 2)
        assert sched.rate(eta, e, 4) == pytest.approx(want, rel=4e-16, abs=0)


def test_train_takes_a_schedule_whose_intermediate_power_overflows(tmp_path):
    """--eta 1e-320 with step(2, 1e160): the fifth epoch's rate is about 1 (1e-320 * 1e320), which a float holds;
    the run used to be refused as an overflow before it began."""
    proc = run_cli("train", "--sizes", "784,10", "--epochs", "5", "--eta", "1e-320", "--lr-schedule",
                   "step(2, 1e160)", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    x, y = np.zeros((4, 6)), np.zeros((4, 2))
    net = Network([6, 2])
    net.SGD((x, y), 5, 2, 1e-320, verbose=False, lr_schedule="step(2, 1e160)")
    np.testing.assert_allclose(net.history["eta"], [_exact_step(1e-320, 1e160, e // 2) for e in range(5)],
                               rtol=4e-16, atol=0)


def test_a_resumed_run_checks_its_schedule_from_its_first_epoch(rng):
    x, y = rng.random((20, 6)), np.eye(2)[rng.integers(0, 2, 20)]
    with pytest.raises(ValueError, match=r"gives epoch 6/6 a learning rate of inf"):     # 1e-100 * 1e100 ** 5
        Network([6, 2]).SGD((x, y), 1, 10, 1e-100, verbose=False, lr_schedule="step(1, 1e100)", first_epoch=5)


def test_train_refuses_an_overflowing_lr_schedule_before_it_trains(tmp_path):
    proc = run_cli("train", "--sizes", "784,10", "--epochs", "2", "--eta", "1e300", "--lr-schedule",
                   "step(1, 1e200)", "--save", "n.npz", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == "fastckpt train: error: --lr-schedule step(1, 1e+200) from eta 1e+300 gives epoch 2/2 a " \
                          "learning rate of inf, beyond what a float holds; nothing was trained\n"
    assert not (tmp_path / "n.npz").exists()                                # no epoch was trained and saved
