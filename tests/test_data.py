"""MNIST loaders: embedded digits, the lab's npz, IDX folders, and clear errors."""
import gzip

import numpy as np
import pytest

from fastckpt import load_mnist


def test_embedded_mnist_is_the_labs_format(mnist):
    (x_train, y_train), (x_test, y_test) = mnist
    assert x_train.shape == (4000, 784) and x_test.shape == (1000, 784)
    assert y_train.shape == (4000, 10) and y_test.shape == (1000, 10)
    assert x_train.dtype == np.float64 and 0 <= x_train.min() and x_train.max() <= 1
    np.testing.assert_array_equal(y_train.sum(axis=1), 1)
    counts = np.bincount(np.concatenate([y_train, y_test]).argmax(axis=1))
    np.testing.assert_array_equal(counts, 500)            # 500 digits of each class
    test_counts = np.bincount(y_test.argmax(axis=1), minlength=10)
    assert test_counts.min() > 60                          # shuffled before the split
    (x2, _), _ = load_mnist()
    np.testing.assert_array_equal(x2, x_train)             # fixed seed


def _fake(rng, n):
    return rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8), rng.integers(0, 10, size=n, dtype=np.uint8)


def _write_idx(path, arr, compress=True):
    header = bytes([0, 0, 8, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    opener = gzip.open if compress else open
    with opener(path, "wb") as f:
        f.write(header + arr.tobytes())


@pytest.mark.parametrize("compress", [True, False])
def test_idx_folder(tmp_path, rng, compress):
    (xtr, ytr), (xte, yte) = _fake(rng, 12), _fake(rng, 5)
    ext = ".gz" if compress else ""
    for name, arr in (("train-images-idx3-ubyte", xtr), ("train-labels-idx1-ubyte", ytr),
                      ("t10k-images-idx3-ubyte", xte), ("t10k-labels-idx1-ubyte", yte)):
        _write_idx(tmp_path / (name + ext), arr, compress)
    (x_train, y_train), (x_test, y_test) = load_mnist(tmp_path)
    np.testing.assert_array_equal(x_train, xtr.reshape(12, 784) / 255.0)
    np.testing.assert_array_equal(y_train.argmax(axis=1), ytr)
    np.testing.assert_array_equal(x_test, xte.reshape(5, 784) / 255.0)
    np.testing.assert_array_equal(y_test.argmax(axis=1), yte)


def test_lab_npz(tmp_path, rng):
    (xtr, ytr), (xte, yte) = _fake(rng, 7), _fake(rng, 3)
    np.savez(tmp_path / "mnist.npz", x_train=xtr, y_train=ytr, x_test=xte, y_test=yte)
    (x_train, y_train), (x_test, y_test) = load_mnist(tmp_path / "mnist.npz")
    np.testing.assert_array_equal(x_train, xtr.reshape(-1, 784) / 255.0)
    np.testing.assert_array_equal(y_test.argmax(axis=1), yte)


def test_errors_name_the_file(tmp_path, rng):
    with pytest.raises(FileNotFoundError, match="nowhere.npz"):
        load_mnist(tmp_path / "nowhere.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip file")
    with pytest.raises(ValueError, match="junk.npz"):
        load_mnist(tmp_path / "junk.npz")
    np.savez(tmp_path / "partial.npz", x_train=np.zeros((1, 28, 28)))
    with pytest.raises(ValueError, match=r"partial.npz has no y_train, x_test, y_test"):
        load_mnist(tmp_path / "partial.npz")
    with pytest.raises(FileNotFoundError, match="has no train-images-idx3-ubyte, train-labels-idx1-ubyte, "
                                                "t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte"):
        load_mnist(tmp_path)
    (xtr, ytr) = _fake(rng, 4)
    for name, arr in (("train-images-idx3-ubyte", xtr), ("train-labels-idx1-ubyte", ytr),
                      ("t10k-images-idx3-ubyte", xtr), ("t10k-labels-idx1-ubyte", ytr[:3])):
        _write_idx(tmp_path / (name + ".gz"), arr)
    with pytest.raises(ValueError, match="t10k-images-idx3-ubyte.gz holds 4 images but .*t10k-labels-idx1-ubyte.gz "
                                         "holds 3 labels"):
        load_mnist(tmp_path)
    with gzip.open(tmp_path / "t10k-labels-idx1-ubyte.gz", "wb") as f:
        f.write(bytes([0, 0, 8, 1]) + (9).to_bytes(4, "big") + b"\x01\x02")
    with pytest.raises(ValueError, match=r"t10k-labels-idx1-ubyte.gz holds 2 data bytes"):
        load_mnist(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").write_bytes(b"plain text, not gzip")
    with pytest.raises(ValueError, match="t10k-labels-idx1-ubyte.gz is not gzip data"):
        load_mnist(tmp_path)


def _npz(path, **parts):
    np.savez(path, **parts)
    return load_mnist(path)


def test_float_images_in_unit_range_are_kept_as_they_are(tmp_path, rng):
    """Not divided by 255 a second time (issue 11)."""
    x = rng.random((6, 28, 28))
    for dtype in (np.float64, np.float32, np.float16):
        (x_train, _), (x_test, _) = _npz(tmp_path / "f.npz", x_train=x.astype(dtype), y_train=np.arange(6),
                                          x_test=x.astype(dtype).reshape(6, 784), y_test=np.arange(6))
        assert x_train.dtype == np.float64
        np.testing.assert_array_equal(x_train, x.astype(dtype).reshape(6, 784))
        np.testing.assert_array_equal(x_test, x_train)                  # (n, 784) is read like (n, 28, 28)


def test_labels_whole_floats_and_one_hot_are_accepted(tmp_path, rng):
    x, labels = _fake(rng, 10)
    one_hot = np.eye(10)[labels]
    for y in (labels.astype(np.int64), labels.astype(np.float32), one_hot, one_hot.astype(np.uint8)):
        (_, y_train), _ = _npz(tmp_path / "y.npz", x_train=x, y_train=y, x_test=x, y_test=labels)
        np.testing.assert_array_equal(y_train, one_hot)
