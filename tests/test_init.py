"""init=: the lab's draws unchanged, Glorot-uniform and He-normal against their formulas, reproducible."""
import math

import numpy as np
import pytest

from fastckpt import Network, NetworkWithCheckpointing

SIZES = [400, 300, 200, 10]


def _pairs(sizes):
    return list(zip(sizes[:-1], sizes[1:]))


@pytest.mark.parametrize("init", ["xavier", "glorot"])
def test_xavier_is_glorot_uniform(init):
    np.random.seed(21)
    net = Network(SIZES, init=init)
    for w, b, (n_in, n_out) in zip(net.weights, net.biases, _pairs(SIZES)):
        bound = math.sqrt(6 / (n_in + n_out))
        assert w.shape == (n_out, n_in) and np.all(b == 0)
        assert np.abs(w).max() <= bound and np.abs(w).max() > 0.99 * bound
        if w.size >= 10_000:                        # the moments and the histogram of U(-a, a)
            n = w.size
            assert abs(w.mean()) < 5 * bound / math.sqrt(3 * n)
            assert w.var() == pytest.approx(bound ** 2 / 3, rel=5 * math.sqrt(0.8 / n))
            counts = np.histogram(w, bins=10, range=(-bound, bound))[0]
            assert np.all(np.abs(counts - n / 10) < 5 * math.sqrt(n * 0.1 * 0.9))


@pytest.mark.parametrize("init", ["he", "kaiming"])
def test_he_is_kaiming_normal_on_fan_in(init):
    np.random.seed(22)
    net = Network(SIZES, init=init)
    for w, b, (n_in, n_out) in zip(net.weights, net.biases, _pairs(SIZES)):
        std = math.sqrt(2 / n_in)
        assert w.shape == (n_out, n_in) and np.all(b == 0)
        if w.size >= 10_000:
            n = w.size
            assert abs(w.mean()) < 5 * std / math.sqrt(n)
            assert w.std() == pytest.approx(std, rel=5 / math.sqrt(2 * n))
            within = np.mean(np.abs(w) < std)       # 68.27% of a normal lies within one standard deviation
            assert within == pytest.approx(0.682689, abs=5 * math.sqrt(0.683 * 0.317 / n))
            assert np.abs(w).max() > 3.5 * std      # not truncated (Keras' HeNormal would stop at 2 std)


def test_the_draws_are_numpy_randoms_in_the_documented_order():
    """Weights layer by layer, nothing drawn for the biases: the same numbers as numpy's own calls."""
    sizes = [7, 5, 4, 3]
    for init, draw in (("xavier", lambda i, o: np.random.uniform(-math.sqrt(6 / (i + o)), math.sqrt(6 / (i + o)),
                                                                 (o, i))),
                       ("he", lambda i, o: math.sqrt(2 / i) * np.random.randn(o, i))):
        np.random.seed(5)
        net = Network(sizes, init=init)
        after = np.random.random()
        np.random.seed(5)
        expected = [draw(i, o) for i, o in _pairs(sizes)]
        assert np.random.random() == after                   # the stream moved on by exactly the weights
        for w, ref in zip(net.weights, expected):
            np.testing.assert_array_equal(w, ref)


@pytest.mark.parametrize("init", ["lab", "xavier", "he"])
def test_reproducible_from_the_seed_and_cast_after_drawing(init):
    np.random.seed(9)
    a = NetworkWithCheckpointing([30, 20, 10], strategy="sqrt", init=init)
    np.random.seed(9)
    b = Network([30, 20, 10], init=init)
    np.random.seed(9)
    c = Network([30, 20, 10], init=init, dtype=np.float32)
    np.random.seed(10)
    d = Network([30, 20, 10], init=init)
    for p, q, r in zip(a.weights + a.biases, b.weights + b.biases, c.weights + c.biases):
        np.testing.assert_array_equal(p, q)
        np.testing.assert_array_equal(r, q.astype(np.float32))
    assert not np.array_equal(a.weights[0], d.weights[0])


def test_lab_is_the_default_and_the_labs_randn_order():
    np.random.seed(0)
    default = Network([6, 4, 3])
    np.random.seed(0)
    lab = Network([6, 4, 3], init="lab")
    np.random.seed(0)
    biases = [np.random.randn(o, 1) for o in (4, 3)]
    weights = [np.random.randn(o, i) for i, o in ((6, 4), (4, 3))]
    for p, q, r in zip(default.weights + default.biases, lab.weights + lab.biases, weights + biases):
        np.testing.assert_array_equal(p, q)
        np.testing.assert_array_equal(p, r)


@pytest.mark.parametrize("init", ["normal", "Xavier", "", None, 1])
def test_a_bad_init_is_refused_with_its_name_before_any_draw(init):
    state = np.random.get_state()[1].copy()
    for cls in (Network, NetworkWithCheckpointing):
        with pytest.raises(ValueError) as info:
            cls([4, 3, 2], init=init)
        assert f"init must be 'lab', 'xavier' (or 'glorot') or 'he' (or 'kaiming'), got {init!r}" in str(info.value)
    assert np.array_equal(np.random.get_state()[1], state)


def test_he_relu_net_keeps_its_signal_where_the_lab_draws_saturate(rng):
    """Why the options exist: through 16 layers of 256, He-drawn ReLU layers keep activations of
    order 1, while most of the lab's N(0, 1) sigmoid units saturate (outputs within 1e-3 of 0 or 1)."""
    sizes = [784] + [256] * 16 + [10]
    x = rng.random((64, 784))
    np.random.seed(0)
    lab = NetworkWithCheckpointing(sizes, strategy="plain")
    np.random.seed(0)
    he = NetworkWithCheckpointing(sizes, strategy="plain", init="he", activation="relu")
    last_lab = lab.forward_between_checkpoints(x, 0, 16)[-1]
    assert np.mean((last_lab < 1e-3) | (last_lab > 1 - 1e-3)) > 0.5
    rms = [float(np.sqrt(np.mean(a ** 2))) for a in he.forward_between_checkpoints(x, 0, 16)[1:]]
    assert 0.1 < min(rms) and max(rms) < 30, rms
