"""SGD's shuffle= (a new order every epoch, from a seed) and validation= (a held-out fraction or a data set),
with the mean training loss and the validation accuracy per epoch."""
import copy

import naive
import numpy as np
import pytest

from fastckpt import Network, NetworkWithCheckpointing


def _data(rng, n=60, n_in=5, n_out=3):
    return rng.standard_normal((n, n_in)), np.eye(n_out)[rng.integers(0, n_out, n)]


def _by_hand(net, x, y, orders, batch, eta):
    """The updates SGD should make: mini-batches of each epoch's order, in turn; the mean loss per epoch."""
    losses = []
    for order in orders:
        seen = []
        for s in range(0, len(order) - batch + 1, batch):
            rows = order[s:s + batch]
            net.update_mini_batch(x[rows], y[rows], eta)
            seen.append(net.last_loss)
        losses.append(np.mean(seen))
    return losses


def test_an_integer_seed_orders_each_epoch_from_the_seed_and_the_epoch(rng, capsys):
    x, y = _data(rng)
    np.random.seed(1)
    net = NetworkWithCheckpointing([5, 4, 3], strategy="sqrt", optimizer="adam", activation="relu")
    twin = copy.deepcopy(net)
    state = np.random.get_state()[1].copy()
    net.SGD((x, y), epochs=3, mini_batch_size=10, eta=0.01, shuffle=7)
    assert np.array_equal(np.random.get_state()[1], state)          # the global stream is not touched
    orders = [np.random.default_rng([7, epoch]).permutation(60) for epoch in range(3)]
    assert not np.array_equal(orders[0], orders[1])
    losses = _by_hand(twin, x, y, orders, 10, 0.01)
    for a, b in zip(net.weights + net.biases, twin.weights + twin.biases):
        np.testing.assert_array_equal(a, b)
    assert net.history["loss"] == pytest.approx(losses, rel=1e-15)
    # a run resumed at epoch 2 shuffles epoch 2 as the unbroken run did
    resumed = copy.deepcopy(twin)
    _by_hand(twin, x, y, [np.random.default_rng([7, 3]).permutation(60)], 10, 0.01)
    resumed.SGD((x, y), epochs=1, mini_batch_size=10, eta=0.01, shuffle=7, first_epoch=3)
    for a, b in zip(resumed.weights + resumed.biases, twin.weights + twin.biases):
        np.testing.assert_array_equal(a, b)


def test_true_draws_the_orders_from_the_global_seed(rng, capsys):
    x, y = _data(rng, n=40)
    np.random.seed(2)
    net = Network([5, 4, 3])
    twin = copy.deepcopy(net)
    np.random.seed(9)
    net.SGD((x, y), epochs=2, mini_batch_size=8, eta=0.5, shuffle=True)
    np.random.seed(9)
    orders = [np.random.permutation(40) for _ in range(2)]
    _by_hand(twin, x, y, orders, 8, 0.5)
    for a, b in zip(net.weights + net.biases, twin.weights + twin.biases):
        np.testing.assert_array_equal(a, b)


def test_the_default_keeps_the_labs_order_and_its_printed_line(rng, capsys):
    x, y = _data(rng, n=30)
    np.random.seed(3)
    net = Network([5, 4, 3])
    twin = copy.deepcopy(net)
    net.SGD((x, y), epochs=2, mini_batch_size=10, eta=0.5, test_data=(x, y))
    _by_hand(twin, x, y, [np.arange(30)] * 2, 10, 0.5)
    for a, b in zip(net.weights + net.biases, twin.weights + twin.biases):
        np.testing.assert_array_equal(a, b)
    out = capsys.readouterr().out.splitlines()
    assert out == [f"Epoch: {j}, Accuracy: {acc}" for j, acc in enumerate(net.accuracies)]
    assert net.history["accuracy"] == net.accuracies and len(net.history["loss"]) == 2
    assert net.history["val_accuracy"] == []


def test_a_validation_fraction_holds_out_the_last_samples(rng, capsys):
    x, y = _data(rng, n=50)
    np.random.seed(4)
    net = Network([5, 6, 3], activation="tanh", init="xavier")
    twin = copy.deepcopy(net)
    net.SGD((x, y), epochs=3, mini_batch_size=8, eta=0.3, validation=0.2, shuffle=5)
    orders = [np.random.default_rng([5, epoch]).permutation(40) for epoch in range(3)]    # 40 train, 10 held out
    val, val_loss = [], []
    losses = []
    for order in orders:
        losses += _by_hand(twin, x[:40], y[:40], [order], 8, 0.3)
        val.append(twin.evaluate(x[40:], y[40:]))
        out = naive.forward_net(twin.weights, twin.biases, x[40:], twin.activation)[-1]
        val_loss.append(0.5 * np.sum((out - y[40:]) ** 2) / 10)                # the lab's quadratic cost
    for a, b in zip(net.weights + net.biases, twin.weights + twin.biases):
        np.testing.assert_array_equal(a, b)
    assert net.history["val_accuracy"] == val and net.history["loss"] == pytest.approx(losses, rel=1e-15)
    assert net.history["val_loss"] == pytest.approx(val_loss, rel=1e-12)
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"Epoch: {j}, training loss: {loss:.6g}, validation loss: {vl:.6g}, validation accuracy: "
                     f"{acc:.4g}" for j, (loss, vl, acc) in enumerate(zip(net.history["loss"], val_loss, val))]


def test_a_validation_set_is_used_as_given(rng, capsys):
    x, y = _data(rng, n=40)
    xv, yv = _data(rng, n=15)
    net = Network([5, 4, 3], loss="cross_entropy")
    net.SGD((x, y), epochs=2, mini_batch_size=10, eta=0.1, test_data=(x, y), validation=(xv, yv.argmax(axis=1)))
    assert net.history["val_accuracy"][-1] == net.evaluate(xv, yv)
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith(f"Epoch: 1, Accuracy: {net.accuracies[-1]}, training loss: ")
    val = net.history["val_accuracy"][-1]
    assert last.endswith(f", validation accuracy: {val:.4g}") and f"{val:.4g}" != repr(val)     # k/15, rounded


@pytest.mark.parametrize("kwargs, message", [
    ({"validation": 1.5}, "validation must be a fraction in (0, 1) or a pair (x, y), got 1.5"),
    ({"validation": 0}, "validation must be a fraction in (0, 1) or a pair (x, y), got 0"),
    ({"validation": True}, "got True"),
    ({"validation": "0.2"}, "got '0.2'"),
    ({"validation": 1e-17}, "validation=1e-17 of 40 training samples leaves 40 to train on and 0 to validate on"),
    ({"validation": 0.99}, "validation=0.99 of 40 training samples leaves 0 to train on and 40 to validate on"),
    ({"validation": (np.zeros((3, 4)), np.zeros(3, int))}, "validation[0] has shape (3, 4)"),
    ({"validation": (np.zeros((3, 5)), np.array([0, 1, 7]))}, "validation[1] holds labels from 0 to 7"),
    ({"shuffle": "yes"}, "shuffle must be False, True or an integer seed >= 0, got 'yes'"),
    ({"shuffle": -1}, "got -1"),
    ({"shuffle": 1.5}, "got 1.5"),
])
def test_bad_settings_are_refused_before_any_training(rng, kwargs, message):
    x, y = _data(rng, n=40)
    net = Network([5, 4, 3])
    before = [np.array(w) for w in net.weights]
    with pytest.raises(ValueError) as info:
        net.SGD((x, y), epochs=1, mini_batch_size=10, eta=0.1, **kwargs)
    assert message in str(info.value)
    for a, b in zip(before, net.weights):
        np.testing.assert_array_equal(a, b)
