"""tanh and ReLU hidden layers: the kernels, gradients against the NumPy twin and central differences,
checkpointed steps bit-identical to plain ones, and bad names refused."""
import itertools

import naive
import numpy as np
import pytest
from fastckpt.kernels import (
    IDENTITY,
    RELU,
    SIGMOID,
    TANH,
    bias_identity,
    bias_relu,
    bias_tanh,
    dense_backward,
    dense_backward_sgd,
)

from fastckpt import Network, NetworkWithCheckpointing

LOSSES = ["quadratic", "cross_entropy", "squared_error"]
NAMES = ["sigmoid", "tanh", "relu", "identity"]
CODES = {"sigmoid": SIGMOID, "tanh": TANH, "relu": RELU, "identity": IDENTITY}
STRATEGIES = ["plain", "every_nth(2)", "every_nth(3)", "segments(2)", "sqrt", "revolve(1)", "revolve(2)",
              "budget(5KiB)", "budget(5KiB, once)", "fit(64KiB)"]


# -- the kernels ---------------------------------------------------------------------------------
@pytest.mark.skipif(np.finfo(np.longdouble).eps >= np.finfo(np.float64).eps / 1000,
                    reason="needs a long double with far more precision than float64 (x86-64's 80-bit)")
@pytest.mark.parametrize("dtype, bound", [(np.float64, 4.5e-16), (np.float32, 2.5e-7)])
def test_tanh_accuracy_dense_grid(dtype, bound):
    """Against tanh in long double, over the whole range and near 0, where relative accuracy is kept."""
    z = np.concatenate([np.linspace(-25, 25, 200_001), np.geomspace(1e-30, 1, 20_001)]).astype(dtype)
    z = z[np.abs(z) >= np.finfo(dtype).tiny].reshape(1, -1)
    out = z.copy()
    bias_tanh(out, np.zeros(z.shape[1], dtype))
    exact = np.tanh(z.astype(np.longdouble))
    assert np.max(np.abs(out.astype(np.longdouble) - exact) / np.abs(exact)) < bound  # measured 3.9e-16, 1.9e-7


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_tanh_edges_odd_nan_inf_and_no_subnormals(dtype):
    tiny = np.finfo(dtype).tiny
    z = np.array([[-np.inf, -1e30, -30.0, -1e-3, -0.0, 0.0, 1e-3, 30.0, 1e30, np.inf, np.nan, tiny / 4, 4 * tiny]],
                 dtype=dtype)
    out = z.copy()
    bias_tanh(out, np.zeros(z.shape[1], dtype))
    assert out[0, :4].tolist() == [-1.0, -1.0, -1.0, pytest.approx(np.tanh(-1e-3), rel=1e-6)]
    assert out[0, 4] == out[0, 5] == 0 and out[0, 6] == -out[0, 3]
    assert out[0, 7:10].tolist() == [1.0, 1.0, 1.0] and np.isnan(out[0, 10])
    assert out[0, 11] == 0 and out[0, 12] == pytest.approx(4 * tiny, rel=1e-6)      # subnormal flushed
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((5, 77)) * 4).astype(dtype)
    pos, neg = x.copy(), -x
    bias_tanh(pos, np.zeros(77, dtype))
    bias_tanh(neg, np.zeros(77, dtype))
    np.testing.assert_array_equal(pos, -neg)                                      # exactly odd


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_relu_is_max_with_nan_kept_and_no_subnormals(rng, dtype):
    z = (rng.standard_normal((9, 31)) * 3).astype(dtype)
    b = rng.standard_normal(31).astype(dtype)
    out = z.copy()
    bias_relu(out, b)
    np.testing.assert_array_equal(out, np.maximum(z + b, 0))
    tiny = np.finfo(dtype).tiny
    edges = np.array([[np.nan, np.inf, -np.inf, tiny / 2, tiny, -0.0]], dtype=dtype)
    bias_relu(edges, np.zeros(6, dtype))
    assert np.isnan(edges[0, 0]) and edges[0, 1:].tolist() == [np.inf, 0.0, 0.0, tiny, 0.0]
    with pytest.raises(ValueError, match="bias"):
        bias_relu(np.empty((2, 3), dtype), np.empty(2, dtype))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_identity_adds_the_bias_with_nan_and_inf_kept_and_no_subnormals(rng, dtype):
    z = (rng.standard_normal((9, 31)) * 3).astype(dtype)
    b = rng.standard_normal(31).astype(dtype)
    out = z.copy()
    bias_identity(out, b)
    np.testing.assert_array_equal(out, z + b)
    tiny = np.finfo(dtype).tiny
    edges = np.array([[np.nan, np.inf, -np.inf, tiny / 2, -tiny / 2, tiny, -tiny, -0.0]], dtype=dtype)
    bias_identity(edges, np.zeros(8, dtype))
    assert np.isnan(edges[0, 0]) and edges[0, 1:].tolist() == [np.inf, -np.inf, 0.0, 0.0, tiny, -tiny, 0.0]
    with pytest.raises(ValueError, match="bias"):
        bias_identity(np.empty((2, 3), dtype), np.empty(2, dtype))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 7, 5), (17, 33, 2), (64, 129, 65)], ids=str)
def test_dense_backward_uses_the_derivative_of_the_layer_below(rng, shape, dtype, name):
    batch, n_in, n_out = shape
    a_in = naive.ACTIVATIONS[name][0](rng.standard_normal((batch, n_in))).astype(dtype)
    w = rng.standard_normal((n_out, n_in)).astype(dtype)
    b = rng.standard_normal(n_out).astype(dtype)
    dz_out = rng.standard_normal((batch, n_out)).astype(dtype)
    dz_in = np.empty((batch, n_in), dtype=dtype)
    gw, gb = np.empty_like(w), np.empty(n_out, dtype=dtype)
    dense_backward(a_in, w, dz_out, 1.0 / batch, np.empty(n_out), gw, gb, dz_in, 0.0, CODES[name])
    a64, w64, d64 = (v.astype(np.float64) for v in (a_in, w, dz_out))
    ref = (d64 @ w64) * naive.ACTIVATIONS[name][1](a64)
    tol = 1e-13 if dtype == np.float64 else 2e-6 * max(1, batch / 8)
    np.testing.assert_allclose(dz_in, ref, rtol=tol, atol=tol * np.abs(d64).max() * n_out)
    dz_sgd = np.empty_like(dz_in)
    assert dense_backward_sgd(a_in, w.copy(), b.copy(), dz_out, 0.1, np.empty(n_out), dz_sgd, 0.0, CODES[name])
    np.testing.assert_array_equal(dz_sgd, dz_in)


def test_a_derivative_the_output_cannot_give_is_refused(rng):
    a_in, w = rng.random((2, 3)), rng.random((4, 3))
    with pytest.raises(ValueError, match="no derivative from its output"):
        dense_backward(a_in, w, rng.random((2, 4)), 0.5, np.empty(4), np.empty((4, 3)), np.empty(4),
                       np.empty((2, 3)), 0.0, 3)


# -- the net: gradients --------------------------------------------------------------------------
def _cases(n):
    rng = np.random.default_rng(11)
    for _ in range(n):
        depth = int(rng.integers(1, 6))
        sizes = [int(s) for s in rng.integers(1, 30, size=depth + 1)]
        hidden = [str(rng.choice(NAMES)) for _ in range(depth - 1)]
        yield sizes, hidden, str(rng.choice(LOSSES)), int(rng.choice([1, 2, 5, 16]))


def _targets(rng, loss, n_out, batch):
    """One-hot rows for a classification loss, real numbers for the squared error."""
    if loss == "squared_error":
        return rng.standard_normal((batch, n_out))
    return np.eye(n_out)[rng.integers(0, n_out, batch)]


@pytest.mark.parametrize("sizes,hidden,loss,batch", list(_cases(36)), ids=str)
def test_backprop_matches_the_numpy_twin(rng, sizes, hidden, loss, batch):
    l2 = [float(v) for v in rng.random(len(sizes) - 1) * 0.1]
    net = Network(sizes, activation=hidden, loss=loss, l2=l2)
    x = rng.standard_normal((batch, sizes[0]))
    y = _targets(rng, loss, sizes[-1], batch)
    got_b, got_w = net.backprop(x, y)
    ref_b, ref_w = naive.backprop_net(list(net.weights), list(net.biases), x, y, hidden, loss, l2)
    for got, ref in zip(got_b + got_w, ref_b + ref_w):
        np.testing.assert_allclose(got, ref, rtol=1e-11, atol=1e-12 * (np.abs(ref).max() + 1e-300))
    np.testing.assert_allclose(net.feedforward(x), naive.forward_net(net.weights, net.biases, x, hidden, loss)[-1],
                               rtol=1e-12, atol=1e-15)
    assert net.last_loss == pytest.approx(naive.loss_net(net.weights, net.biases, x, y, hidden, loss, l2), rel=1e-12)


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("name", NAMES)
def test_central_differences(rng, name, loss):
    np.random.seed(5)
    net = Network([5, 4, 6, 3], activation=name, loss=loss, l2=0.01)
    x = rng.standard_normal((4, 5))
    y = rng.standard_normal((4, 3)) if loss == "squared_error" else np.eye(3)[[0, 2, 1, 2]]
    nabla_b, nabla_w = net.backprop(x, y)
    hidden = net.activation
    eps = 1e-5
    for params, grads in ((net.weights, nabla_w), (net.biases, nabla_b)):
        for p, g in zip(params, grads):
            for idx in np.ndindex(p.shape):
                old = p[idx]
                p[idx] = old + eps
                up = naive.loss_net(net.weights, net.biases, x, y, hidden, loss, net.l2)
                p[idx] = old - eps
                down = naive.loss_net(net.weights, net.biases, x, y, hidden, loss, net.l2)
                p[idx] = old
                assert g[idx] == pytest.approx((up - down) / (2 * eps), rel=1e-6, abs=1e-10), (idx, name)


def test_one_name_or_one_per_hidden_layer():
    assert Network([4, 3, 3, 2], activation="relu").activation == ("relu", "relu")
    assert Network([4, 3, 3, 2], activation=("tanh", "relu")).activation == ("tanh", "relu")
    assert Network([4, 2]).activation == () and Network([4, 3, 2]).activation == ("sigmoid",)
    np.random.seed(2)
    lab = Network([6, 5, 4])
    np.random.seed(2)
    same = Network([6, 5, 4], activation="sigmoid")
    x = np.linspace(0, 1, 12).reshape(2, 6)
    np.testing.assert_array_equal(lab.feedforward(x), same.feedforward(x))


@pytest.mark.parametrize("activation, message", [
    ("softplus", "activation must be 'sigmoid', 'tanh', 'relu' or 'identity' (one name, or one per hidden "
                 "layer), got 'softplus'"),
    (["relu"], "activation must be one name or a list of one per hidden layer (2), got 1: ['relu']"),
    (["relu", "gelu"], "got 'gelu'"),
    ([None, "relu"], "got None"),
])
def test_a_bad_activation_is_refused_with_its_name(activation, message):
    for cls in (Network, NetworkWithCheckpointing):
        with pytest.raises(ValueError) as info:
            cls([4, 3, 3, 2], activation=activation)
        assert message in str(info.value)
    with pytest.raises(TypeError, match="activation must be a name"):
        Network([4, 3, 2], activation=3)


# -- checkpointing: bit-identical to plain -------------------------------------------------------
@pytest.mark.parametrize("fused", [False, True], ids=["sgd-after", "sgd-in-backward"])
@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("activation", ["tanh", "relu", ["relu", "tanh", "sigmoid", "identity", "tanh", "relu"]],
                         ids=str)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_every_strategy_is_bit_identical_to_plain(rng, activation, loss, fused, dtype):
    sizes = [9, 8, 7, 6, 8, 5, 7, 4]
    x = rng.standard_normal((6, sizes[0]))
    y = _targets(rng, loss, sizes[-1], 6)
    eta = 1e-3 if loss == "squared_error" else 0.3          # a linear output of N(0, 1) weights: large errors
    kwargs = {"activation": activation, "loss": loss, "optimizer_in_backward": fused, "dtype": dtype, "l2": 1e-3}
    np.random.seed(8)
    plain = Network(sizes, **kwargs)
    ref = plain.backprop(x, y)
    for _ in range(3):
        plain.update_mini_batch(x, y, eta)
    for strategy in STRATEGIES:
        np.random.seed(8)
        net = NetworkWithCheckpointing(sizes, strategy=strategy, **kwargs)
        got = net.backprop(x, y)
        for a, b in zip(itertools.chain(*ref), itertools.chain(*got)):
            np.testing.assert_array_equal(a, b, err_msg=strategy)
        for _ in range(3):
            net.update_mini_batch(x, y, eta)
        for a, b in zip(plain.weights + plain.biases, net.weights + net.biases):
            np.testing.assert_array_equal(a, b, err_msg=strategy)
        if strategy in ("every_nth(2)", "sqrt", "revolve(1)"):
            assert max(net.engine(6).forward_counts) >= 2                           # really recomputed
        acts = net.forward_between_checkpoints(x, 0, len(sizes) - 1)
        np.testing.assert_array_equal(acts[-1], net.feedforward(x))


def test_relu_and_tanh_nets_train_through_data_parallel_threads(rng):
    from fastckpt.parallel import DataParallel
    x = rng.standard_normal((8, 6))
    y = np.eye(3)[rng.integers(0, 3, 8)]
    np.random.seed(3)
    one = Network([6, 5, 4, 3], activation=["relu", "tanh"])
    np.random.seed(3)
    two = Network([6, 5, 4, 3], activation=["relu", "tanh"])
    one.update_mini_batch(x, y, 0.5)
    with DataParallel(two, threads=2) as parallel:
        parallel.update_mini_batches([x[:4], x[4:]], [y[:4], y[4:]], 0.5)
    for a, b in zip(one.weights + one.biases, two.weights + two.biases):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
