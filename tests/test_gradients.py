"""Network gradients against the NumPy twin and central differences."""
import naive
import numpy as np
import pytest

from fastckpt import Network


def _random_cases(n):
    rng = np.random.default_rng(7)
    for _ in range(n):
        depth = int(rng.integers(1, 7))
        sizes = [int(s) for s in rng.integers(1, 40, size=depth + 1)]
        yield sizes, int(rng.choice([1, 2, 3, 8, 17, 64]))


@pytest.mark.parametrize("sizes,batch", list(_random_cases(40)), ids=str)
def test_backprop_matches_numpy_twin(rng, sizes, batch):
    net = Network(sizes)
    x, y = rng.random((batch, sizes[0])), rng.random((batch, sizes[-1]))
    nabla_b, nabla_w = net.backprop(x, y)
    ref_b, ref_w = naive.backprop(net.weights, net.biases, x, y)
    for got, ref in zip(nabla_b + nabla_w, ref_b + ref_w):
        assert got.shape == ref.shape
        scale = np.abs(ref).max() + 1e-300
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12 * scale)


def test_backprop_accepts_the_labs_column_batches(rng):
    net = Network([6, 5, 3])
    x, y = rng.random((4, 6)), rng.random((4, 3))
    flat = net.backprop(x, y)
    lab = net.backprop(x[:, :, None], y[:, :, None])
    for a, b in zip(flat[0] + flat[1], lab[0] + lab[1]):
        np.testing.assert_array_equal(a, b)


def test_central_differences(rng):
    net = Network([5, 4, 3, 2])
    x, y = rng.random((3, 5)), rng.random((3, 2))
    nabla_b, nabla_w = net.backprop(x, y)
    eps = 1e-5
    for params, grads in ((net.weights, nabla_w), (net.biases, nabla_b)):
        for p, g in zip(params, grads):
            for idx in np.ndindex(p.shape):
                old = p[idx]
                p[idx] = old + eps
                up = naive.loss(net.weights, net.biases, x, y)
                p[idx] = old - eps
                down = naive.loss(net.weights, net.biases, x, y)
                p[idx] = old
                assert g[idx] == pytest.approx((up - down) / (2 * eps), rel=1e-6, abs=1e-10)


def test_float32_gradients_close_to_float64(rng):
    np.random.seed(3)
    n64 = Network([20, 16, 8, 4])
    np.random.seed(3)
    n32 = Network([20, 16, 8, 4], dtype=np.float32)
    x, y = rng.random((32, 20)), rng.random((32, 4))
    g64, g32 = n64.backprop(x, y), n32.backprop(x, y)
    for a, b in zip(g64[0] + g64[1], g32[0] + g32[1]):
        assert b.dtype == np.float32
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6 * np.abs(a).max())


def test_feedforward_layouts_agree_with_twin(rng):
    net = Network([7, 5, 3])
    x = rng.random((4, 7))
    ref = naive.forward(net.weights, net.biases, x)[-1]
    np.testing.assert_allclose(net.feedforward(x), ref, rtol=1e-14)
    np.testing.assert_allclose(net.feedforward(x[:, :, None]), ref[:, :, None], rtol=1e-14)
    np.testing.assert_allclose(net.feedforward(x[1].reshape(7, 1)), ref[1].reshape(3, 1), rtol=1e-14)
    np.testing.assert_allclose(net.feedforward(x[1]), ref[1], rtol=1e-14)


def test_update_mini_batch_is_sgd_on_the_mean_gradient(rng):
    net = Network([6, 5, 3])
    x, y = rng.random((8, 6)), rng.random((8, 3))
    ref_b, ref_w = naive.backprop(net.weights, net.biases, x, y)
    new_w = [w - 0.7 * g for w, g in zip(net.weights, ref_w)]
    new_b = [b - 0.7 * g for b, g in zip(net.biases, ref_b)]
    net.update_mini_batch(x, y, 0.7)
    for got, ref in zip(net.weights + net.biases, new_w + new_b):
        np.testing.assert_allclose(got, ref, rtol=1e-13, atol=1e-15)


def test_assigned_weights_are_used(rng):
    """The lab's own update style rebinds the lists; fastckpt must train from the new values."""
    net = Network([4, 3, 2])
    x, y = rng.random((5, 4)), rng.random((5, 2))
    net.weights = [w * 0.5 for w in net.weights]
    net.biases[1] = np.zeros((2, 1))
    nabla_b, nabla_w = net.backprop(x, y)
    ref_b, ref_w = naive.backprop(net.weights, net.biases, x, y)
    for got, ref in zip(nabla_b + nabla_w, ref_b + ref_w):
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-15)
    assert np.all(net.biases[1] == 0)
