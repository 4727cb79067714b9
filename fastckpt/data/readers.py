"""Readers for the lab's ``mnist.npz`` and for IDX files, safe against hostile files.

NOTE [ Hostile files ]
Every bad file ends in one ValueError (FileNotFoundError for a missing one)
that names the file and what was wrong, never a zlib, zip, EOF or memory
error.  Nothing is allocated from a size a header declares until that size is
checked against what the file can hold:

- a plain IDX file must be exactly its header plus the bytes it declares;
- deflate inflates at most 1032:1 (a 258-byte match coded in two bits), so a
  gzip IDX file whose header declares more than 1032 times the file's size is
  refused unread; the rest is streamed in chunks and refused as soon as
  it runs past the declared size, or when it ends short;
- an npz member must be stored or deflated (what ``np.savez`` and
  ``np.savez_compressed`` write), within 1032:1 of its compressed size, and its
  npy header must declare exactly the bytes the member holds, before its
  array is allocated.  Object arrays are refused without unpickling.

Both read into the array itself, :data:`READ_CHUNK` bytes at a time: the reader
holds the arrays and a chunk, never a second copy (numpy's own npz reader holds
two buffers of 256 KiB), so that a bound on a whole ``train`` run can count it.

A gzip bomb (3 MB inflating to 3 GiB behind an MNIST-sized header) is refused
after inflating 45 MiB, in a fraction of a second, instead of 24 s and 6.1 GiB.
"""
import contextlib
import gzip
import lzma
import os
import struct
import zipfile
import zlib

import numpy as np

IDX_FILES = {
    "x_train": "train-images-idx3-ubyte", "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte", "y_test": "t10k-labels-idx1-ubyte",
}
_DEFLATE_MAX_RATIO = 1032
READ_CHUNK = 1 << 16      # bytes read at a time (gzip and zip read a chunk into a new bytes object)
_GZIP_MAGIC = b"\x1f\x8b"
_IDX_MAGIC = b"\x00\x00\x08"          # then one byte: the number of dimensions
_READ_ERRORS = (OSError, EOFError, ValueError, TypeError, struct.error, zlib.error, zipfile.BadZipFile,
                lzma.LZMAError, NotImplementedError, RuntimeError)   # RuntimeError: an encrypted zip member


class _Refused(ValueError):
    """A file refused with a message of our own: ``_reading`` raises it as a plain ValueError, unwrapped."""


@contextlib.contextmanager
def _reading(path, what):
    """Turn whatever the file libraries raise into one ValueError naming the file."""
    try:
        yield
    except _Refused as exc:
        raise ValueError(str(exc)).with_traceback(exc.__traceback__) from None
    except _READ_ERRORS as exc:
        raise ValueError(f"cannot read {path} as {what}: {type(exc).__name__}: {exc}") from exc


# -- npz --------------------------------------------------------------------------------------
def read_npz(path):
    with _reading(path, "the lab's mnist.npz"):
        with open(path, "rb") as f:
            head = f.read(4)
        if not head.startswith(b"PK"):
            raise _Refused(not_npz(path, head))
        with np.load(path, allow_pickle=False) as f:
            missing = [k for k in IDX_FILES if k not in f.files]
            if missing:
                raise _Refused(f"{path} has no {', '.join(missing)} (has {', '.join(f.files) or 'nothing'}); "
                               "the lab's mnist.npz holds x_train, y_train, x_test, y_test")
            return {k: _npz_member(f, path, k) for k in IDX_FILES}


def not_npz(path, head):
    """The message for a file that is not a zip: an empty file, a lone IDX file, or something else."""
    if not head:
        return f"{path} is empty"
    if head.startswith(_GZIP_MAGIC):
        with gzip.open(path, "rb") as f:
            head = f.read(4)
    name = os.path.basename(path)
    if head.startswith(_IDX_MAGIC) or any(name.startswith(n) for n in IDX_FILES.values()):
        return (f"{path} is a single IDX file; pass the folder that holds train-images-idx3-ubyte[.gz], "
                "train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz] and t10k-labels-idx1-ubyte[.gz]")
    return (f"{path} is not the lab's mnist.npz (a zip of x_train, y_train, x_test, y_test) nor an IDX "
            f"folder: it starts with {head!r}")


def _npz_member(npz, path, key):
    """One array of an open npz, its sizes checked before it is allocated, read into it a chunk at a time."""
    info, shape, fortran, dtype, offset = member_header(npz, path, key)
    if dtype.itemsize == 0:
        return npz[key]
    raw = np.empty(info.file_size - offset, dtype=np.uint8)
    with npz.zip.open(info) as f, memoryview(raw) as view:
        f.read(offset)                                                 # the npy header, read before
        _read_into(f, view, f"{path}: {key}", f"it declares shape {shape} of {dtype}")
    return raw.view(dtype).reshape(shape, order="F" if fortran else "C")


def _read_into(f, view, where, declared):
    """Fill the bytes ``view`` from the file ``f``, :data:`READ_CHUNK` at a time; refused, naming ``where`` and
    what was ``declared``, when the file ends first."""
    done = 0
    while done < len(view):
        got = f.readinto(view[done:done + READ_CHUNK])
        if not got:
            raise _Refused(f"{where} holds {done} data bytes, but {declared} ({len(view)} bytes)")
        done += got


def npz_header(npz, path, key):
    """``(shape, dtype)`` of member ``key`` of an open npz (``np.load``), read from its header after checking
    that the member's sizes are possible for the file (NOTE [ Hostile files ]); nothing is allocated from
    what it declares.  ValueError naming the file and the member otherwise."""
    _, shape, _, dtype, _ = member_header(npz, path, key)
    return shape, dtype


def member_header(npz, path, key):
    """``(zip info, shape, fortran order, dtype, data offset)`` of member ``key``, checked (:func:`npz_header`)."""
    member = key if key in npz.zip.namelist() else key + ".npy"
    info = npz.zip.getinfo(member)
    where = f"{path}: {key}"
    if info.compress_type == zipfile.ZIP_STORED:
        plausible = info.file_size == info.compress_size
    elif info.compress_type == zipfile.ZIP_DEFLATED:
        plausible = info.file_size <= _DEFLATE_MAX_RATIO * info.compress_size
    else:
        raise _Refused(f"{where} is compressed with zip method {info.compress_type}; only stored or deflated "
                       "members (np.savez, np.savez_compressed) are read")
    if not plausible or info.compress_size > os.path.getsize(path):
        raise _Refused(f"{where} claims {info.file_size} bytes from {info.compress_size} compressed bytes in a "
                       f"{os.path.getsize(path)}-byte file, which is impossible")
    with npz.zip.open(info) as f:
        version = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
            np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(f)
        offset = f.tell()
    if dtype.hasobject:
        raise _Refused(f"{where} holds Python objects (dtype {dtype}); only numeric arrays are read, "
                       "never unpickled")
    declared = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if offset + declared != info.file_size:
        raise _Refused(f"{where} declares shape {shape} of {dtype} ({declared} bytes), but the member holds "
                       f"{info.file_size - offset} data bytes")
    return info, tuple(shape), fortran, dtype, offset


# -- IDX --------------------------------------------------------------------------------------
def idx_files(folder):
    """The four IDX files of ``folder`` that :func:`read_idx_folder` reads, in order (None where missing)."""
    return [_find_idx(folder, name) for name in IDX_FILES.values()]


def read_idx_folder(folder):
    """The four IDX files, labels first so the image files' row counts are checked before they are read."""
    paths = {k: _find_idx(folder, name) for k, name in IDX_FILES.items()}
    missing = [IDX_FILES[k] for k, p in paths.items() if p is None]
    if missing:
        raise FileNotFoundError(f"{folder} has no {', '.join(missing)} (.gz or not); an IDX folder needs "
                                f"all four MNIST files: {', '.join(IDX_FILES.values())}")
    parts = {}
    for split in ("train", "test"):
        labels_path = paths[f"y_{split}"]
        parts[f"y_{split}"] = labels = _read_idx(labels_path, ())
        parts[f"x_{split}"] = _read_idx(paths[f"x_{split}"], (28, 28), rows=(labels.shape[0], labels_path))
    return parts


def _find_idx(folder, name):
    """The path of IDX file `name` in `folder` (``.gz`` or not, ``-idx`` or ``.idx``), or None."""
    for candidate in (name + ".gz", name, name.replace("-idx", ".idx") + ".gz", name.replace("-idx", ".idx")):
        full = os.path.join(folder, candidate)
        if os.path.isfile(full):
            return full
    return None


def _read_idx(path, tail, rows=None):
    """An IDX file of unsigned bytes (gzip or not) of shape (n, *tail), refused before reading if its header lies."""
    with _reading(path, "an IDX file"), open(path, "rb") as raw:
        size = os.fstat(raw.fileno()).st_size
        if size == 0:
            raise _Refused(f"{path} is empty")
        compressed = raw.read(2) == _GZIP_MAGIC
        raw.seek(0)
        if path.endswith(".gz") and not compressed:
            raise _Refused(f"{path} is not gzip data: it starts with {raw.read(4)!r}")
        with (gzip.GzipFile(fileobj=raw, mode="rb") if compressed else contextlib.nullcontext(raw)) as f:
            shape, header = _idx_header(f, path, tail)
            if rows is not None and shape[0] != rows[0]:
                raise _Refused(f"{path} holds {shape[0]} images but {rows[1]} holds {rows[0]} labels")
            declared = int(np.prod(shape, dtype=object))
            if compressed and declared > _DEFLATE_MAX_RATIO * size:
                raise _Refused(f"{path}: its header declares shape {shape} ({declared} bytes), more than a "
                               f"{size}-byte gzip file can hold (deflate inflates at most "
                               f"{_DEFLATE_MAX_RATIO}:1)")
            if not compressed and size - header != declared:
                raise _Refused(f"{path} holds {size - header} data bytes, but its header says shape {shape} "
                               f"({declared} bytes)")
            data = bytearray(declared)                    # filled in place: no copy, no growth
            with memoryview(data) as view:
                _read_into(f, view, path, f"its header says shape {shape}")
            if f.read(1):
                raise _Refused(f"{path} holds more than the {declared} data bytes its header says "
                               f"(shape {shape})")
    return np.frombuffer(data, dtype=np.uint8).reshape(shape)


def _idx_header(f, path, tail):
    """(shape, header length) of an IDX file of unsigned bytes, which must have shape (n, *tail)."""
    magic = f.read(4)
    if not magic:
        raise _Refused(f"{path} holds no data once decompressed")
    if len(magic) < 4 or not magic.startswith(_IDX_MAGIC):
        raise _Refused(f"{path} is not an IDX file of unsigned bytes: it starts with {magic!r}, "
                       f"not {_IDX_MAGIC!r} and a dimension count")
    ndim = magic[3]
    if ndim != 1 + len(tail):
        raise _Refused(f"{path} holds a {ndim}-d array, expected shape (n{''.join(f', {d}' for d in tail)})")
    dims = f.read(4 * ndim)
    if len(dims) < 4 * ndim:
        raise _Refused(f"{path} is truncated: its header is incomplete")
    shape = tuple(int.from_bytes(dims[4 * i:4 * i + 4], "big") for i in range(ndim))
    if shape[1:] != tail:
        raise _Refused(f"{path} holds shape {shape}, expected (n{''.join(f', {d}' for d in tail)})")
    return shape, 4 + 4 * ndim
