"""The staging kernels against the numpy one-liners they replace (kernels/staging.py)."""
import numpy as np
import pytest
from fastckpt.kernels import label_range, one_hot, scale_into

from fastckpt.core.checks import as_targets, one_hot_into
from fastckpt.data.images import Images
from fastckpt.engine.batches import Staging


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scale_into_rounds_as_numpy_divides(rng, dtype):
    raw = rng.integers(0, 256, size=(37, 29), dtype=np.uint8)
    for divisor in (255.0, 3.0, 0.1, 1e-300):
        expected = np.empty(raw.shape, dtype=dtype)
        with np.errstate(over="ignore"):
            np.divide(raw, divisor, out=expected, casting="unsafe")
        np.testing.assert_array_equal(scale_into(raw, divisor, np.empty(raw.shape, dtype=dtype)), expected)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.int64, np.uint64])
def test_label_range_and_one_hot_match_numpy(rng, dtype):
    labels = rng.integers(0, 10, size=53).astype(dtype)
    assert label_range(labels) == (labels.min(), labels.max())
    np.testing.assert_array_equal(one_hot(labels, np.full((53, 10), 7.0)), np.eye(10)[labels])
    assert label_range(np.array([-3, 5, -9, 2], dtype=np.int64)) == (-9, 5)


def test_labels_of_any_byte_order_are_checked_and_one_hot():
    labels = np.array([3, 1, 9, 0], dtype=">i4")
    np.testing.assert_array_equal(one_hot_into(as_targets(labels, 10, "y"), np.empty((4, 10))),
                                  np.eye(10)[[3, 1, 9, 0]])
    with pytest.raises(ValueError, match=r"y holds labels from 1 to 10, but the net has 10 outputs"):
        as_targets(np.array([1, 10], dtype="<u2"), 10, "y")


def test_a_minibatch_of_images_stages_as_the_lab_floats(rng):
    raw = rng.integers(0, 256, size=(20, 12), dtype=np.uint8)
    images = Images(raw)
    for dtype in (np.float32, np.float64):
        x, _ = Staging(20, dtype).minibatch(images[5:15], np.arange(10) % 3, 12, 3)
        np.testing.assert_array_equal(x, (raw[5:15] / 255.0).astype(dtype))


@pytest.mark.parametrize("fused", [False, True])
def test_rows_that_alias_the_weights_train_as_their_copy(fused):
    """A mini-batch that is a view of the net's own weights: with the optimizer in backward the layers above step
    before layer 0 reads x, so x is copied first; trained as on a copy of its values either way."""
    import fastckpt
    nets = []
    for alias in (True, False):
        np.random.seed(0)
        net = fastckpt.Network([8, 8, 8, 8], optimizer_in_backward=fused)
        x = net.weights[1][:5] if alias else net.weights[1][:5].copy()
        net.update_mini_batch(x, np.full((5, 8), 0.5), 0.5)
        nets.append(net)
    for a, b in zip(nets[0].weights + nets[0].biases, nets[1].weights + nets[1].biases):
        np.testing.assert_array_equal(a, b)


def test_big_endian_rows_train_as_native_ones_in_sgd():
    import fastckpt
    rng = np.random.default_rng(0)
    x, y = rng.random((40, 8)), np.eye(3)[rng.integers(0, 3, 40)]
    nets = []
    for order in (">f8", "<f8"):
        np.random.seed(0)
        net = fastckpt.Network([8, 5, 3])
        net.SGD((x.astype(order), y.astype(order)), 2, 10, 0.5, verbose=False, shuffle=0)
        nets.append(net)
    for a, b in zip(nets[0].weights + nets[0].biases, nets[1].weights + nets[1].biases):
        np.testing.assert_array_equal(a, b)
