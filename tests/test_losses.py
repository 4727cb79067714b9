"""The seed's classifier: softmax output, cross-entropy and L2 weight penalties, against a NumPy twin."""
import naive
import numpy as np
import pytest

from fastckpt import Network, NetworkWithCheckpointing
from fastckpt.parallel import DataParallel

NETS = [[12, 9, 4], [7, 5, 6, 3], [20, 16, 12, 8, 10]]


def _onehot(rng, batch, n):
    return np.eye(n)[rng.integers(0, n, size=batch)]


@pytest.mark.parametrize("sizes", NETS, ids=str)
@pytest.mark.parametrize("l2", [0.0, 1e-2, "per layer"])
def test_gradients_match_the_twin(rng, sizes, l2):
    l2 = [1e-2 * 10.0 ** -k for k in range(len(sizes) - 1)] if l2 == "per layer" else l2
    net = Network(sizes, loss="cross_entropy", l2=l2)
    x, y = rng.random((11, sizes[0])), _onehot(rng, 11, sizes[-1])
    nabla_b, nabla_w = net.backprop(x, y)
    ref_b, ref_w = naive.cross_entropy_backprop(net.weights, net.biases, x, y, net.l2)
    for got, want in zip(nabla_b + nabla_w, ref_b + ref_w):
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-14)
    assert net.last_loss == pytest.approx(naive.cross_entropy_loss(net.weights, net.biases, x, y, net.l2), rel=1e-12)


def test_central_differences(rng):
    sizes, l2 = [6, 5, 4], (3e-2, 1e-3)
    net = Network(sizes, loss="cross_entropy", l2=l2)
    x, y = rng.random((7, 6)), _onehot(rng, 7, 4)
    _, nabla_w = net.backprop(x, y)
    eps = 1e-5
    for layer, (i, j) in [(0, (1, 2)), (0, (4, 5)), (1, (0, 0)), (1, (3, 4))]:
        w = [v.copy() for v in net.weights]
        w[layer][i, j] += eps
        up = naive.cross_entropy_loss(w, net.biases, x, y, l2)
        w[layer][i, j] -= 2 * eps
        down = naive.cross_entropy_loss(w, net.biases, x, y, l2)
        assert nabla_w[layer][i, j] == pytest.approx((up - down) / (2 * eps), rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("strategy", ["every_nth(2)", "revolve(1)", "budget(8KiB)"])
def test_checkpointing_is_bit_identical_with_cross_entropy(rng, strategy):
    sizes = [20, 16, 12, 8, 10]
    np.random.seed(2)
    plain = Network(sizes, loss="cross_entropy", l2=1e-3)
    np.random.seed(2)
    ckpt = NetworkWithCheckpointing(sizes, strategy=strategy, loss="cross_entropy", l2=1e-3)
    x, y = rng.random((9, 20)), _onehot(rng, 9, 10)
    for a, b in zip(sum(plain.backprop(x, y), []), sum(ckpt.backprop(x, y), [])):
        np.testing.assert_array_equal(a, b)
    for _ in range(3):
        plain.update_mini_batch(x, y, 0.3)
        ckpt.update_mini_batch(x, y, 0.3)
    for a, b in zip(plain.weights, ckpt.weights):
        np.testing.assert_array_equal(a, b)


def test_optimizer_in_backward_applies_the_penalty_too(rng):
    sizes = [12, 9, 4]
    nets = []
    for fused in (False, True):
        np.random.seed(5)
        nets.append(Network(sizes, loss="cross_entropy", l2=(1e-1, 1e-2), optimizer_in_backward=fused))
    x, y = rng.random((8, 12)), _onehot(rng, 8, 4)
    for _ in range(4):
        for net in nets:
            net.update_mini_batch(x, y, 0.5)
    for a, b in zip(nets[0].weights + nets[0].biases, nets[1].weights + nets[1].biases):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-15)


def test_outputs_are_probabilities_and_threads_agree(rng):
    sizes = [12, 9, 4]
    net = Network(sizes, loss="cross_entropy")
    x = rng.random((5, 12))
    p = net.feedforward(x)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-14)
    np.testing.assert_allclose(p, naive.forward_softmax(net.weights, net.biases, x)[-1], rtol=1e-13)
    np.random.seed(1)
    one = Network(sizes, loss="cross_entropy", l2=1e-2)
    np.random.seed(1)
    many = Network(sizes, loss="cross_entropy", l2=1e-2)
    xs, ys = rng.random((4, 6, 12)), np.stack([_onehot(rng, 6, 4) for _ in range(4)])
    with DataParallel(many, threads=2) as dp:
        dp.update_mini_batches(xs, ys, 0.4)
    one.update_mini_batch(xs.reshape(24, 12), ys.reshape(24, 4), 0.4)
    for a, b in zip(one.weights, many.weights):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-15)


def test_the_seed_classifier_learns_mnist(mnist):
    (x, y), (xt, yt) = mnist
    np.random.seed(0)
    net = Network([784, 30, 10], loss="cross_entropy", l2=(1e-4, 1e-5))
    net.SGD((x, y), 4, 10, 1.0, test_data=(xt, yt), verbose=False)
    assert net.accuracies[-1] >= 0.85                    # 0.856 at epoch 4 with seed 0


def test_bad_loss_and_l2_are_named():
    with pytest.raises(ValueError, match="loss must be 'quadratic' .* got 'hinge'"):
        Network([3, 2], loss="hinge")
    with pytest.raises(ValueError, match="l2 must be finite and >= 0, got -1"):
        Network([3, 2], l2=-1)
    with pytest.raises(ValueError, match=r"one per layer \(2\), got 3 values"):
        Network([3, 4, 2], l2=[0.1, 0.1, 0.1])
    with pytest.raises(TypeError, match="l2 must be a real number, got 'a'"):
        Network([3, 2], l2=["a"])
