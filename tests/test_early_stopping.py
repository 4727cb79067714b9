"""Early stopping (NOTE [ Early stopping ]) against a loop run by hand, the validation loss and score against
NumPy and scikit-learn, and ``train --early-stopping`` / ``--save-best``."""
import copy
import json

import naive
import numpy as np
import pytest

import fastckpt
from fastckpt.cli import app as cli
from fastckpt.engine.stopping import EarlyStopping


def _data(rng, n=120, n_in=6, n_out=3, regression=False):
    x = rng.standard_normal((n, n_in))
    if regression:
        return x, x[:, :n_out] * 2 + 0.3 * rng.standard_normal((n, n_out))
    return x, np.eye(n_out)[rng.integers(0, n_out, n)]


def _by_hand(net, x, y, epochs, batch, eta, score, patience, tol, higher):
    """The loop SGD should run: minibatches in order, ``score(net)`` after each epoch, the best weights copied
    when it is beaten, a stop after more than ``patience`` epochs in a row that did not improve by ``tol``,
    and the best weights back at the end.  Returns (scores, epochs run)."""
    best, best_params, wait, scores = -np.inf if higher else np.inf, None, 0, []
    for _ in range(epochs):
        for s in range(0, len(x) - batch + 1, batch):
            net.update_mini_batch(x[s:s + batch], y[s:s + batch], eta)
        value = score(net)
        scores.append(value)
        worse = value < best + tol if higher else value > best - tol
        wait = wait + 1 if worse else 0
        if (value > best) if higher else (value < best):
            best, best_params = value, [a.copy() for a in net.weights + net.biases]
        if wait > patience:
            break
    for a, b in zip(net.weights + net.biases, best_params):
        a[...] = b
    return scores, len(scores)


@pytest.mark.parametrize("loss", ["cross_entropy", "squared_error"])
def test_it_stops_where_a_loop_by_hand_stops_and_restores_the_best_weights(rng, loss):
    regression = loss == "squared_error"
    x, y = _data(rng, regression=regression)
    xv, yv = _data(rng, n=40, regression=regression)
    np.random.seed(3)
    net = fastckpt.Network([6, 8, 3], loss=loss, activation="tanh", init="xavier")
    twin = copy.deepcopy(net)
    stop = EarlyStopping(2, tol=0.01)
    net.SGD((x, y), 60, 10, 0.5, validation=(xv, yv), early_stopping=stop, verbose=False)

    def score(n):
        if regression:
            from sklearn.metrics import r2_score
            return r2_score(yv, n.feedforward(xv))
        return n.evaluate(xv, yv)
    scores, ran = _by_hand(twin, x, y, 60, 10, 0.5, score, 2, 0.01, higher=True)
    key = "val_r2" if regression else "val_accuracy"
    assert stop.monitored == key and ran < 60 and stop.stopped_epoch == ran - 1
    assert net.history[key] == pytest.approx(scores, rel=1e-12, abs=1e-12)
    assert stop.best == max(scores) and stop.best_epoch == int(np.argmax(scores))
    for a, b in zip(net.weights + net.biases, twin.weights + twin.biases):
        np.testing.assert_array_equal(a, b)                       # the best epoch's, restored


def test_without_validation_it_watches_the_training_loss(rng, capsys):
    x, y = _data(rng)
    np.random.seed(4)
    net = fastckpt.Network([6, 5, 3], loss="cross_entropy")
    stop = EarlyStopping(1, tol=0.5, restore_best_weights=False)
    net.SGD((x, y), 30, 20, 0.3, early_stopping=stop)
    losses = net.history["loss"]
    assert stop.monitored == "loss" and len(losses) == 3             # no epoch beat the first by 0.5
    assert stop.best == min(losses) and stop.stopped_epoch == 2
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.endswith("(stopped early: loss did not improve by 0.5 for 2 epochs in a row)"), last


def test_shrink_divides_the_rate_instead_of_stopping(rng):
    x, y = _data(rng)
    net = fastckpt.Network([6, 5, 3], loss="cross_entropy")
    stop = EarlyStopping(1, tol=10.0, shrink=5.0, min_eta=0.01)   # no epoch ever improves by 10
    net.SGD((x, y), 20, 20, 1.0, early_stopping=stop, verbose=False)
    assert net.history["eta"] == pytest.approx([1, 1, 1, 0.2, 0.2, 0.04, 0.04, 0.008, 0.008])
    assert stop.stopped_epoch == 8                                  # 0.008 is below min_eta: stopped


def test_an_int_is_the_patience_and_a_validation_score_needs_validation(rng):
    x, y = _data(rng)
    net = fastckpt.Network([6, 5, 3])
    with pytest.raises(ValueError, match="monitors 'val_score', but the run has no validation set"):
        net.SGD((x, y), 2, 10, 0.1, early_stopping=EarlyStopping(monitor="val_score"), verbose=False)
    with pytest.raises(TypeError, match="early_stopping must be an EarlyStopping, an int"):
        net.SGD((x, y), 2, 10, 0.1, early_stopping="yes", verbose=False)
    with pytest.raises(ValueError, match="n_iter_no_change must be >= 1, got 0"):
        EarlyStopping(0)
    with pytest.raises(ValueError, match="monitor must be one of"):
        EarlyStopping(monitor="accuracy")
    net.SGD((x, y), 2, 10, 0.1, validation=0.25, early_stopping=3, verbose=False)
    assert len(net.history["val_loss"]) == 2


@pytest.mark.parametrize("loss", ["quadratic", "cross_entropy", "squared_error"])
def test_the_validation_loss_and_score_are_numpys_and_scikit_learns(rng, loss):
    from sklearn.metrics import accuracy_score, r2_score
    regression = loss == "squared_error"
    x, y = _data(rng, n=2500, regression=regression)             # more than an evaluation chunk
    y[:, 1] = 0.0 if regression else y[:, 1]                      # a constant output: R² 1 or 0, as sklearn's
    net = fastckpt.Network([6, 7, 3], loss=loss, activation="relu", l2=0.01)
    val_loss, score = net.held_out_scores(x, y)
    out = naive.forward_net(list(net.weights), list(net.biases), x, net.activation, loss)[-1]
    assert val_loss == pytest.approx(naive.loss_net(list(net.weights), list(net.biases), x, y, net.activation,
                                                    loss, net.l2), rel=1e-11)
    if regression:
        assert score == pytest.approx(r2_score(y, out, force_finite=True), rel=1e-12)
    else:
        assert score == accuracy_score(y.argmax(axis=1), out.argmax(axis=1)) == net.evaluate(x, y)


def test_the_epoch_loss_is_over_samples_when_the_last_minibatch_is_smaller(rng):
    x, y = _data(rng, n=25)
    net = fastckpt.Network([6, 5, 3], loss="cross_entropy")
    twin = copy.deepcopy(net)
    net.SGD((x, y), 1, 10, 0.1, drop_last=False, verbose=False)
    losses = []
    for s in (0, 10, 20):
        twin.update_mini_batch(x[s:s + 10], y[s:s + 10], 0.1)
        losses.append(twin.last_loss * len(x[s:s + 10]))
    assert net.history["loss"] == [pytest.approx(sum(losses) / 25, rel=1e-14)]


def test_max_memory_counts_the_best_weights(rng):
    from fastckpt.planner.run import run_bytes
    x, y = _data(rng, n=400)
    net = fastckpt.Network([6, 300, 300, 3])
    plan = net.plan(10)
    base = run_bytes(plan, (x[:300], y[:300]), validation=(x[300:], y[300:].argmax(axis=1)), updates=30)
    kept = run_bytes(plan, (x[:300], y[:300]), validation=(x[300:], y[300:].argmax(axis=1)), updates=30, best=True)
    assert kept["best weights"] == plan.bytes()["parameters"] == kept["total"] - base["total"]
    bound = (base["total"] + kept["total"]) // 2
    net.SGD((x, y), 1, 10, 0.1, validation=0.25, max_memory=bound, verbose=False)
    with pytest.raises(ValueError, match=r"best weights 7\d\d\.\d\d KiB"):
        net.SGD((x, y), 1, 10, 0.1, validation=0.25, max_memory=bound, early_stopping=2, verbose=False)


def _train(tmp_path, *flags, eta="0.5"):
    return cli.main(["train", "--sizes", "784,16,10", "--batch-size", "50", "--epochs", "6", "--eta", eta,
                     "--validation", "0.2", "--json", *flags])


def test_train_early_stopping_and_save_best_keep_the_best_epoch(tmp_path, capsys):
    best = tmp_path / "best.npz"
    assert _train(tmp_path, "--early-stopping", "1", "--tol", "0.05", "--save-best", str(best),
                  "--loss", "squared_error", "--activation", "identity", "--init", "xavier", eta="0.02") == 0
    said = json.loads(capsys.readouterr().out)
    scores = said["validation_r2"]
    assert said["loss"] == "squared_error" and len(scores) == said["stopped_after_epoch"] < 6
    assert said["best_epoch"] == int(np.argmax(scores)) + 1 and said["best_val_r2"] == max(scores)
    saved = fastckpt.load(best)
    assert saved.training_state["epochs_done"] == said["best_epoch"]
    (x, labels), _ = fastckpt.load_mnist()
    split = int(len(x) * 0.8)
    assert saved.held_out_scores(x[split:], labels[split:])[1] == pytest.approx(max(scores), rel=1e-12)


def test_train_refuses_lone_or_clashing_best_flags(tmp_path, capsys):
    assert _train(tmp_path, "--tol", "0.1") == 2
    assert "--tol 0.1 is the least improvement --early-stopping or --save-best counts" in capsys.readouterr().err
    same = str(tmp_path / "n.npz")
    assert _train(tmp_path, "--save", same, "--save-best", same) == 2
    assert "is the --save file" in capsys.readouterr().err
    assert cli.main(["train", "--early-stopping", "2", "--threads", "2"]) == 2
    assert "--early-stopping 2 trains one process's net" in capsys.readouterr().err


def test_a_run_with_early_stopping_is_not_resumed(tmp_path, capsys):
    """Its count of epochs without improvement, best score and best weights are not in the --save file: a
    resumed run trained on past the epoch the unbroken one stopped at, in silence; it is refused, as is
    --early-stopping given to the resume of a run trained without it."""
    part, plain = str(tmp_path / "part.npz"), str(tmp_path / "plain.npz")
    assert cli.main(["train", "--sizes", "784,16,10", "--batch-size", "50", "--epochs", "2", "--validation", "0.2",
                     "--early-stopping", "3", "--save", part]) == 0
    assert fastckpt.load(part).training_state["early_stopping"] == 3
    capsys.readouterr()
    assert cli.main(["train", "--resume", part, "--epochs", "4", "--save", part]) == 2
    said = capsys.readouterr().err
    assert "was trained with --early-stopping 3: its count of epochs without improvement" in said, said
    assert cli.main(["train", "--sizes", "784,16,10", "--batch-size", "50", "--epochs", "1", "--validation", "0.2",
                     "--save", plain]) == 0
    capsys.readouterr()
    assert cli.main(["train", "--resume", plain, "--epochs", "2", "--save", plain, "--early-stopping", "2"]) == 2
    assert "with --early-stopping 2: its count" in capsys.readouterr().err
    assert cli.main(["train", "--resume", plain, "--epochs", "2", "--save", plain]) == 0
