"""Hostile and mistaken data files: each ends in one ValueError (or FileNotFoundError) naming the file.

Never a zlib, gzip, zip, EOF, pickle or memory error, and never a silent wrong answer (issue 11).
"""
import gzip
import os
import re
import zipfile
import zlib

import numpy as np
import pytest

from fastckpt import load_mnist
from fastckpt.report.measure import memray_peak

NAMES = {"x_train": "train-images-idx3-ubyte", "y_train": "train-labels-idx1-ubyte",
         "x_test": "t10k-images-idx3-ubyte", "y_test": "t10k-labels-idx1-ubyte"}


def _idx_bytes(arr, shape=None):
    shape = arr.shape if shape is None else shape
    return bytes([0, 0, 8, len(shape)]) + b"".join(int(d).to_bytes(4, "big") for d in shape) + arr.tobytes()


@pytest.fixture
def folder(tmp_path, rng):
    """A valid IDX folder (gzip) of 4 training and 3 test digits."""
    arrays = {"x_train": rng.integers(0, 256, (4, 28, 28), dtype=np.uint8), "y_train": np.arange(4, dtype=np.uint8),
              "x_test": rng.integers(0, 256, (3, 28, 28), dtype=np.uint8), "y_test": np.arange(3, dtype=np.uint8)}
    for key, arr in arrays.items():
        (tmp_path / (NAMES[key] + ".gz")).write_bytes(gzip.compress(_idx_bytes(arr)))
    load_mnist(tmp_path)                                    # valid as written
    return tmp_path


def _refused(path, match):
    """load_mnist(path) raises a ValueError whose message matches `match` (which should name the file)."""
    with pytest.raises(ValueError, match=match) as info:
        load_mnist(path)
    assert type(info.value) is ValueError


# -- gzip IDX ---------------------------------------------------------------------------------
def test_gzip_bomb_is_refused_after_the_declared_size(folder):
    """2 GiB of zeros in 2 MB behind a header of 4 digits: read 3 KiB past the header, then refused.

    The old loader inflated the whole file before looking at the header (3 GiB: 24 s, 6.1 GiB peak RSS).
    """
    member = gzip.compress(bytes(1 << 24), compresslevel=9)          # 16 MiB of zeros, ~16 KB
    bomb = folder / "train-images-idx3-ubyte.gz"
    with open(bomb, "wb") as f:
        f.write(gzip.compress(_idx_bytes(np.zeros((4, 28, 28), np.uint8))))
        for _ in range(128):                                         # gzip members concatenate
            f.write(member)
    assert os.path.getsize(bomb) < 4 << 20
    peak = memray_peak(lambda: _refused(
        folder, r"train-images-idx3-ubyte.gz holds more than the 3136 data bytes its header says"))
    assert peak < 1 << 20, peak                           # measured 117 KiB; the bomb holds 2 GiB


@pytest.mark.parametrize("compress", [True, False])
def test_a_header_declaring_more_than_the_file_holds_is_refused_unread(folder, compress):
    """4 billion labels declared in a few bytes: refused from the header and the file's size, nothing allocated."""
    lie = _idx_bytes(np.arange(5, dtype=np.uint8), shape=(2**32 - 1,))
    name = "train-labels-idx1-ubyte" + (".gz" if compress else "")
    (folder / "train-labels-idx1-ubyte.gz").unlink()
    (folder / name).write_bytes(gzip.compress(lie) if compress else lie)
    match = (r": its header declares shape \(4294967295,\) \(4294967295 bytes\), more than a \d+-byte gzip file"
             if compress else r" holds 5 data bytes, but its header says shape \(4294967295,\)")
    _refused(folder, re.escape(name) + match)


def test_image_header_with_a_huge_row_count_is_refused_before_reading(folder):
    """The image file's row count must equal the labels file's, checked before its data is read."""
    path = folder / "train-images-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(_idx_bytes(np.zeros(0, np.uint8), shape=(2**32 - 1, 28, 28))))
    _refused(folder, r"train-images-idx3-ubyte.gz holds 4294967295 images but .*train-labels-idx1-ubyte.gz holds 4")


@pytest.mark.parametrize("damage, match", [
    ("truncated", r"cannot read .*t10k-images-idx3-ubyte.gz as an IDX file: EOFError"),
    ("garbage", r"cannot read .*t10k-images-idx3-ubyte.gz as an IDX file: (BadGzipFile|error)"),
    ("flipped", r"cannot read .*t10k-images-idx3-ubyte.gz as an IDX file: (BadGzipFile|error)"),
    ("plain text", r"t10k-images-idx3-ubyte.gz is not gzip data: it starts with b'plai'"),
    ("empty", r"t10k-images-idx3-ubyte.gz is empty"),
    ("empty gzip", r"t10k-images-idx3-ubyte.gz holds no data once decompressed"),
])
def test_damaged_gzip(folder, damage, match):
    path = folder / "t10k-images-idx3-ubyte.gz"
    good = path.read_bytes()
    bad = {"truncated": good[:len(good) // 2],
           "garbage": good[:10] + bytes(range(256)) * 8,
           "flipped": good[:40] + bytes(b ^ 0xFF for b in good[40:80]) + good[80:],
           "plain text": b"plain text, not gzip",
           "empty": b"",
           "empty gzip": gzip.compress(b"")}[damage]
    path.write_bytes(bad)
    _refused(folder, match)


@pytest.mark.parametrize("header, match", [
    (bytes([0, 0, 0x0C, 3]), r"is not an IDX file of unsigned bytes: it starts with b'\\x00\\x00\\x0c\\x03'"),
    (bytes([0, 0, 8, 2]), r"holds a 2-d array, expected shape \(n, 28, 28\)"),
    (bytes([0, 0, 8, 3, 0, 0]), r"is truncated: its header is incomplete"),
    (b"PK\x03\x04", r"is not an IDX file of unsigned bytes"),
])
def test_bad_idx_headers(folder, header, match):
    path = folder / "train-images-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(header))
    _refused(folder, "train-images-idx3-ubyte.gz " + match)


def test_idx_images_of_another_size_and_labels_out_of_range(folder):
    path = folder / "t10k-images-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(_idx_bytes(np.zeros((3, 32, 32), np.uint8))))
    _refused(folder, r"t10k-images-idx3-ubyte.gz holds shape \(3, 32, 32\), expected \(n, 28, 28\)")
    path.write_bytes(gzip.compress(_idx_bytes(np.zeros((3, 28, 28), np.uint8))))
    (folder / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(_idx_bytes(np.array([0, 10, 3], np.uint8))))
    _refused(folder, r"y_test holds labels outside 0..9 \(min 0, max 10\)")


@pytest.mark.parametrize("compress", [True, False])
@pytest.mark.parametrize("extra", [-1, 1])
def test_idx_data_shorter_or_longer_than_declared(folder, compress, extra):
    labels = np.arange(4, dtype=np.uint8)
    data = _idx_bytes(labels)[:extra] if extra < 0 else _idx_bytes(labels) + b"\x00"
    name = "train-labels-idx1-ubyte" + (".gz" if compress else "")
    (folder / "train-labels-idx1-ubyte.gz").unlink()
    (folder / name).write_bytes(gzip.compress(data) if compress else data)
    match = "holds 3 data bytes, but its header says shape" if extra < 0 else \
        ("holds more than the 4 data bytes" if compress else "holds 5 data bytes, but its header says shape")
    _refused(folder, re.escape(name) + " " + match)


@pytest.mark.parametrize("compress", [True, False])
@pytest.mark.parametrize("name", ["train-images-idx3-ubyte", "t10k-labels-idx1-ubyte", "renamed.bin"])
def test_a_single_idx_file_asks_for_its_folder(folder, tmp_path_factory, compress, name):
    data = gzip.decompress((folder / (NAMES["y_test"] + ".gz")).read_bytes())
    path = tmp_path_factory.mktemp("single") / (name + (".gz" if compress else ""))
    path.write_bytes(gzip.compress(data) if compress else data)
    _refused(path, re.escape(str(path)) + r" is a single IDX file; pass the folder that holds "
             r"train-images-idx3-ubyte\[\.gz\], train-labels-idx1-ubyte\[\.gz\]")


# -- npz --------------------------------------------------------------------------------------
@pytest.fixture
def arrays(rng):
    return {"x_train": rng.integers(0, 256, (4, 28, 28), dtype=np.uint8), "y_train": np.arange(4),
            "x_test": rng.integers(0, 256, (3, 28, 28), dtype=np.uint8), "y_test": np.arange(3)}


@pytest.mark.parametrize("cut", [0.5, 0.9, 0.99])
def test_truncated_npz(tmp_path, arrays, cut):
    path = tmp_path / "mnist.npz"
    for save in (np.savez, np.savez_compressed):
        save(path, **arrays)
        data = path.read_bytes()
        path.write_bytes(data[:int(len(data) * cut)])
        _refused(path, r"cannot read .*mnist.npz as the lab's mnist.npz: ")


def test_damaged_npz_member(tmp_path, arrays):
    """Deflated data flipped inside the zip: a zlib or CRC error becomes a ValueError."""
    path = tmp_path / "mnist.npz"
    np.savez_compressed(path, **arrays)
    data = bytearray(path.read_bytes())
    for i in range(200, 400):
        data[i] ^= 0x55
    path.write_bytes(bytes(data))
    _refused(path, r"mnist.npz")


class _Exploit:
    def __reduce__(self):
        return print, ("UNPICKLED",)


def test_npz_with_object_arrays_is_refused_without_unpickling(tmp_path, arrays, capsys):
    arrays["y_train"] = np.array([_Exploit()] * 4, dtype=object)
    np.savez(tmp_path / "mnist.npz", **arrays)
    _refused(tmp_path / "mnist.npz", r"mnist.npz: y_train holds Python objects \(dtype object\)")
    assert "UNPICKLED" not in capsys.readouterr().out


def test_npz_with_wrong_keys(tmp_path, arrays):
    np.savez(tmp_path / "mnist.npz", images=arrays["x_train"], labels=arrays["y_train"])
    _refused(tmp_path / "mnist.npz", r"mnist.npz has no x_train, y_train, x_test, y_test \(has images, labels\)")


def test_npz_member_declaring_a_huge_array_is_refused_before_allocation(tmp_path, arrays):
    header = {"descr": "<f8", "fortran_order": False, "shape": (10**12,)}
    path = tmp_path / "mnist.npz"
    np.savez(path, **{k: v for k, v in arrays.items() if k != "x_train"})
    with zipfile.ZipFile(path, "a") as z, z.open("x_train.npy", "w") as f:
        np.lib.format.write_array_header_1_0(f, header)
        f.write(bytes(80))
    _refused(path, r"mnist.npz: x_train declares shape \(1000000000000,\) of float64 \(8000000000000 bytes\), "
             r"but the member holds 80 data bytes")


def test_npz_member_in_another_zip_method_or_not_npy(tmp_path, arrays):
    path = tmp_path / "mnist.npz"
    np.savez(path, **{k: v for k, v in arrays.items() if k != "x_train"})
    with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_BZIP2) as z:
        z.writestr("x_train.npy", bytes(10**6))
    _refused(path, r"mnist.npz: x_train is compressed with zip method 12")
    np.savez(path, **{k: v for k, v in arrays.items() if k != "x_train"})
    with zipfile.ZipFile(path, "a") as z:
        z.writestr("x_train", b"not an npy member")
    _refused(path, r"cannot read .*mnist.npz as the lab's mnist.npz: ValueError")


@pytest.mark.parametrize("key, value, match", [
    ("x_train", np.full((4, 28, 28), 0.5, np.float32) * 2.5, r"x_train holds floats from 1.25 to 1.25; float images "
                                                              r"must already be in \[0, 1\]"),
    ("x_train", np.full((4, 28, 28), 255.0), r"x_train holds floats from 255.0 to 255.0"),
    ("x_train", np.full((4, 28, 28), -0.1), r"x_train holds floats from -0.1"),
    ("x_train", np.full((4, 28, 28), np.nan), r"x_train holds NaN or inf"),
    ("x_train", np.full((4, 784), np.inf), r"x_train holds NaN or inf"),
    ("x_train", np.ones((4, 28, 28), np.int64), r"x_train has dtype int64; images must be uint8"),
    ("x_train", np.ones((4, 28, 28), bool), r"x_train has dtype bool"),
    ("x_train", np.ones((4, 28, 28), complex), r"x_train has dtype complex128"),
    ("x_train", np.full((4, 28, 28), "a"), r"x_train has dtype <U1"),
    ("x_train", np.zeros((4, 28, 27), np.uint8), r"x_train has shape \(4, 28, 27\), expected \(n, 28, 28\)"),
    ("x_train", np.zeros((0, 28, 28), np.uint8), r"x_train holds no images"),
    ("y_train", np.array([0, 1.5, 2, 3]), r"y_train holds a label that is not a whole number: 1.5 at index 1"),
    ("y_train", np.array([0, np.nan, 2, 3]), r"y_train holds a label that is not a whole number: nan"),
    ("y_train", np.array([0, 1, 2, -1]), r"y_train holds labels outside 0..9 \(min -1, max 2\)"),
    ("y_train", np.array([0, 1, 2, 2**63], np.uint64), r"y_train holds labels outside 0..9"),
    ("y_train", np.array([0, 1, 2, 3], bool), r"y_train has shape \(4,\) and dtype bool"),
    ("y_train", np.array(["0", "1", "2", "3"]), r"y_train has dtype <U1; labels must be integers"),
    ("y_train", np.full((4, 10), 0.1), r"y_train has shape \(4, 10\) but row 0 is not one-hot"),
    ("y_train", np.zeros((4, 3)), r"y_train has shape \(4, 3\) and dtype float64"),
    ("y_train", np.arange(5), r"x_train has 4 images but y_train has 5 labels"),
])
def test_wrong_kinds_of_images_and_labels(tmp_path, arrays, key, value, match):
    arrays[key] = value
    np.savez(tmp_path / "mnist.npz", **arrays)
    _refused(tmp_path / "mnist.npz", r"mnist.npz: " + match)


@pytest.mark.parametrize("content, match", [
    (b"", r"is empty"),
    (b"hello", r"is not the lab's mnist.npz \(a zip of x_train, y_train, x_test, y_test\) nor an IDX folder: "
               r"it starts with b'hell'"),
    (gzip.compress(b"\x80\x04pickle", mtime=0), r"is not the lab's mnist.npz .* it starts with b'\\x80\\x04pi'"),
    (gzip.compress(b"", mtime=0), r"is not the lab's mnist.npz"),
])
def test_files_that_are_not_npz(tmp_path, content, match):
    path = tmp_path / "mnist.npz"
    path.write_bytes(content)
    _refused(path, "mnist.npz " + match)


def test_an_npy_file_is_not_an_npz(tmp_path, arrays):
    np.save(tmp_path / "x.npy", arrays["x_train"])
    _refused(tmp_path / "x.npy", r"x.npy is not the lab's mnist.npz")


def test_zlib_error_is_wrapped(tmp_path):
    """A .gz whose deflate stream is invalid from its first byte."""
    path = tmp_path / "mnist.npz"
    path.write_bytes(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + b"\xff" * 64)
    with pytest.raises(ValueError, match="mnist.npz") as info:
        load_mnist(path)
    assert isinstance(info.value.__cause__, (zlib.error, OSError, EOFError))
