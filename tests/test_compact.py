"""Compact data (load_mnist(compact=True), Images) and chunked inference: the same numbers bit for bit as the
lab's float64 arrays, in a ninth of the memory, and evaluation that adds one chunk's buffers to the peak."""
import gzip
import pickle

import numpy as np
import pytest

import fastckpt
from fastckpt.data.images import Images
from fastckpt.parallel import DataParallel
from fastckpt.planner.run import EVAL_CHUNK, inference_bytes


def _idx(path, arr):
    header = bytes([0, 0, 8, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + arr.tobytes())


@pytest.fixture
def sources(tmp_path, rng):
    """The embedded digits, a lab npz of uint8 images with integer labels, and an IDX folder."""
    x, y = rng.integers(0, 256, (30, 28, 28), dtype=np.uint8), rng.integers(0, 10, 30, dtype=np.uint8)
    np.savez(tmp_path / "m.npz", x_train=x[:20], y_train=y[:20], x_test=x[20:], y_test=y[20:])
    folder = tmp_path / "idx"
    folder.mkdir()
    for name, arr in (("train-images-idx3-ubyte", x[:20]), ("train-labels-idx1-ubyte", y[:20]),
                      ("t10k-images-idx3-ubyte", x[20:]), ("t10k-labels-idx1-ubyte", y[20:])):
        _idx(folder / (name + ".gz"), arr)
    return [None, tmp_path / "m.npz", folder]


def test_compact_data_stands_for_the_lab_s_arrays(sources):
    for source in sources:
        lab, compact = fastckpt.load_mnist(source), fastckpt.load_mnist(source, compact=True)
        for (x, y), (cx, cy) in zip(lab, compact):
            assert isinstance(cx, Images) and cx.raw.dtype == np.uint8 and cy.dtype == np.uint8
            np.testing.assert_array_equal(np.asarray(cx), x)                    # raw / 255.0, bit for bit
            np.testing.assert_array_equal(cy, y.argmax(axis=1))
            assert cx.nbytes + cy.nbytes == len(cy) * 785 and x.nbytes + y.nbytes == len(cy) * (784 * 8 + 80)


def test_images_behave_as_a_read_only_float_array():
    raw = np.arange(12, dtype=np.uint8).reshape(3, 4)
    im = Images(raw)
    assert im.shape == (3, 4) and len(im) == 3 and im.dtype == np.float64
    assert isinstance(im[1:3], Images) and np.shares_memory(im[1:3].raw, im.raw)
    np.testing.assert_array_equal(im[1], raw[1] / 255.0)
    np.testing.assert_array_equal(im[::2], raw[::2] / 255.0)
    np.testing.assert_array_equal(np.asarray(im, dtype=np.float32), (raw / 255.0).astype(np.float32))
    np.testing.assert_array_equal(np.asarray(pickle.loads(pickle.dumps(im))), raw / 255.0)
    with pytest.raises(ValueError, match="read-only"):
        im.raw[0, 0] = 1
    with pytest.raises(ValueError, match="raw must be a 2-D uint8 array, got float64"):
        Images(raw / 255.0)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("strategy", ["plain", "sqrt"])
def test_a_net_trains_evaluates_and_predicts_on_compact_data_bit_for_bit(dtype, strategy):
    lab, compact = fastckpt.load_mnist(), fastckpt.load_mnist(compact=True)
    nets = []
    for (x, y), (xt, yt) in (lab, compact):
        np.random.seed(1)
        net = fastckpt.NetworkWithCheckpointing([784, 20, 20, 10], strategy=strategy, dtype=dtype)
        net.SGD((x[:1000], y[:1000]), 2, 10, 3.0, test_data=(xt, yt), verbose=False)
        nets.append((net, xt))
    (a, xt), (b, cxt) = nets
    assert a.accuracies == b.accuracies
    for p, q in zip(a.weights + a.biases, b.weights + b.biases):
        np.testing.assert_array_equal(p, q)
    np.testing.assert_array_equal(a.predict(xt), b.predict(cxt))
    np.testing.assert_array_equal(a.feedforward(xt), b.feedforward(cxt))


def test_threads_train_on_compact_data_as_on_the_lab_s():
    weights = []
    for (x, y), _ in (fastckpt.load_mnist(), fastckpt.load_mnist(compact=True)):
        np.random.seed(2)
        net = fastckpt.Network([784, 16, 10])
        with DataParallel(net, threads=2) as dp:
            dp.SGD((x[:800], y[:800]), 1, 20, 3.0, verbose=False)
        weights.append(net.weights)
    for p, q in zip(*weights):
        np.testing.assert_array_equal(p, q)


def test_chunked_inference_is_the_one_forward_pass_of_training_bit_for_bit():
    (x, _), _ = fastckpt.load_mnist()
    np.random.seed(3)
    net = fastckpt.Network([784, 30, 20, 10], loss="cross_entropy")
    outs = fastckpt.NetworkWithCheckpointing([784, 30, 20, 10], loss="cross_entropy")
    outs.weights, outs.biases = net.weights, net.biases
    ref = outs.forward_between_checkpoints(x, 0, 3)[-1]                   # fresh arrays per layer, all rows at once
    np.testing.assert_array_equal(net.feedforward(x), ref)
    np.testing.assert_array_equal(net.predict(x), ref.argmax(axis=1))


@pytest.mark.memory
@pytest.mark.parametrize("kind", ["float64", "compact"])
def test_evaluating_10k_images_adds_at_most_one_chunk_s_buffers(kind):
    from fastckpt.report.measure import memray_peak
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (10_000, 784), dtype=np.uint8)           # the Fashion-MNIST test set's shape
    x = Images(raw) if kind == "compact" else raw / 255.0
    y = rng.integers(0, 10, 10_000).astype(np.uint8)
    net = fastckpt.Network([784, 512, 512, 10])
    net.evaluate(x, y)                                                   # warm-up: kernels and BLAS
    peak = memray_peak(lambda: net.evaluate(x, y))
    stated = inference_bytes(net.sizes, len(y), staged=kind == "compact")
    assert stated <= peak <= stated + 16 * 1024, (peak, stated)
    assert stated < 2 * EVAL_CHUNK * 512 * 8 + EVAL_CHUNK * 784 * 8 + 600 * 1024   # one chunk and BLAS, any rows
    predicted = memray_peak(lambda: net.predict(x))
    stated = inference_bytes(net.sizes, len(y), staged=kind == "compact", what="predict")
    assert stated <= predicted <= stated + 16 * 1024, (predicted, stated)
