"""GEMM through the BLAS that numpy itself links, callable from jitted kernels.

NOTE [ One BLAS ]
numpy and scipy each bundle an OpenBLAS; Numba's ``np.dot`` goes through
scipy's.  Two OpenBLAS thread pools spinning in one process made alternating
GEMMs ~50x slower on a 2-core machine, so the kernels call numpy's own cblas
``?gemm`` directly.  The symbol is registered with LLVM under a fixed name and
declared as an ``ExternalFunction``, which keeps the kernels cacheable (a
ctypes pointer baked into the code would not be).  Integer arguments are
declared 64-bit: on x86-64 and aarch64 an LP64 (32-bit int) BLAS reads the low
half of the same register or 8-byte stack slot, so one declaration serves both
ILP64 and LP64 builds.

NOTE [ BLAS backends ]
``FASTCKPT_BLAS`` picks the library behind that one entry, once per process, before any kernel
runs: ``openblas`` (the default: numpy's own, always there) or ``mkl`` (Intel's, from its PyPI
wheel: ``pip install "fastckpt[mkl]"``, about 1 GiB unpacked; its ILP64 ``cblas_?gemm_64`` in
``libmkl_rt``).  ``auto`` takes MKL when it is installed and the CPU is Intel's, else OpenBLAS:
on an Intel Xeon (AVX-512) MKL's ``(2048x256) @ (256x256)`` float64 GEMM ran 1.43x faster than
OpenBLAS's; on an AMD EPYC Zen 5 (AVX-512) MKL was 1.6-3.5x slower than OpenBLAS's AVX-512
kernels on every shape of ``benchmarks/blas_backends.py`` (MKL takes generic paths on AMD CPUs).
Whichever it is, it is
the only BLAS the kernels call, so NOTE [ One BLAS ] holds; numpy's own OpenBLAS pool stays idle
unless other code multiplies matrices with numpy.  The two libraries round differently, so the
numbers of one backend are bit-identical across strategies and runs, not across backends.
MKL's OpenMP threads sleep as soon as a GEMM ends (``KMP_BLOCKTIME=0`` unless set), so they do
not spin on cores that the next elementwise kernel or another program needs.

NOTE [ No JIT ]
With ``NUMBA_DISABLE_JIT=1`` the kernels run as plain Python, and an
``ExternalFunction`` called from Python does nothing at all.  So in that
mode ``cblas_dgemm`` and ``cblas_sgemm`` are Python functions that call the
same BLAS symbol through ctypes, with the same arguments: the numbers are
those of the compiled kernels, bit for bit.
"""
import ctypes
import glob
import os

import llvmlite.binding as llvm
import numpy as np
from numba import config, types

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112

_CANDIDATE_SYMBOLS = (
    # (dgemm, sgemm, set_num_threads, get_num_threads, get_corename)
    ("scipy_cblas_dgemm64_", "scipy_cblas_sgemm64_", "scipy_openblas_set_num_threads64_",
     "scipy_openblas_get_num_threads64_", "scipy_openblas_get_corename64_"),
    ("cblas_dgemm64_", "cblas_sgemm64_", "openblas_set_num_threads64_", "openblas_get_num_threads64_",
     "openblas_get_corename64_"),
    ("cblas_dgemm", "cblas_sgemm", "openblas_set_num_threads", "openblas_get_num_threads", "openblas_get_corename"),
)


def _candidate_libraries():
    """Shared libraries that may hold numpy's BLAS, most likely first."""
    numpy_dir = os.path.dirname(np.__file__)
    paths = sorted(glob.glob(os.path.join(numpy_dir, os.pardir, "numpy.libs", "*blas*")))
    paths += sorted(glob.glob(os.path.join(numpy_dir, ".dylibs", "*blas*")))
    try:  # a system or conda numpy: whatever BLAS the process has mapped
        with open("/proc/self/maps") as maps:
            mapped = {line.split()[-1] for line in maps if ".so" in line}
        paths += sorted(p for p in mapped if "blas" in os.path.basename(p) or "mkl_rt" in p)
    except OSError:
        pass
    return paths


class BlasChoiceError(ImportError):
    """``FASTCKPT_BLAS`` names no backend this process can load (NOTE [ BLAS backends ])."""


def _backend():
    """The BLAS the kernels call: ``FASTCKPT_BLAS`` (NOTE [ BLAS backends ]), checked."""
    name = os.environ.get("FASTCKPT_BLAS", "").strip().lower() or "openblas"
    if name not in ("openblas", "mkl", "auto"):
        raise BlasChoiceError(f"FASTCKPT_BLAS={os.environ['FASTCKPT_BLAS']!r}: give openblas, mkl or auto")
    if name == "openblas":
        return name, None
    found = _mkl_library()
    if name == "auto" and not _intel_cpu():
        return "openblas", None
    if found is None and name == "mkl":
        raise BlasChoiceError("FASTCKPT_BLAS='mkl' but no libmkl_rt was found in this environment's lib folder; "
                          'pip install "fastckpt[mkl]" (Intel\'s mkl wheel), or give FASTCKPT_BLAS=openblas')
    return ("mkl", found) if found else ("openblas", None)


def _intel_cpu():
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("vendor_id") and "GenuineIntel" in line for line in f)
    except OSError:
        return False


def _mkl_library():
    """The path of MKL's runtime library (``libmkl_rt``) in this environment, or None."""
    import sys
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix)):
        for path in sorted(glob.glob(os.path.join(prefix, "lib", "libmkl_rt.so*")), reverse=True):
            return path
    return None


def _load_mkl(path):
    os.environ.setdefault("KMP_BLOCKTIME", "0")        # NOTE [ BLAS backends ]: no spinning between GEMMs
    lib = ctypes.CDLL(path)
    return path, "cblas_dgemm_64", [lib.cblas_dgemm_64, lib.cblas_sgemm_64, lib.MKL_Set_Num_Threads,
                                    lib.MKL_Get_Max_Threads, None]


def _load():
    for path in _candidate_libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for names in _CANDIDATE_SYMBOLS:
            if all(hasattr(lib, n) for n in names[:2]):
                funcs = [getattr(lib, n, None) for n in names]
                return path, names[0], funcs
    raise ImportError(
        "fastckpt could not find numpy's BLAS (cblas_dgemm) in any of "
        f"{_candidate_libraries()!r}; install numpy from its wheels (pip install numpy)"
    )


BACKEND, _MKL = _backend()
LIBRARY, SYMBOL, (_dgemm, _sgemm, _set_threads, _get_threads, _get_core) = \
    _load_mkl(_MKL) if BACKEND == "mkl" else _load()
for _name, _func in (("fastckpt_cblas_dgemm", _dgemm), ("fastckpt_cblas_sgemm", _sgemm)):
    llvm.add_symbol(_name, ctypes.cast(_func, ctypes.c_void_p).value)

_I, _P = types.int64, types.intp
cblas_dgemm = types.ExternalFunction("fastckpt_cblas_dgemm", types.void(
    types.int32, types.int32, types.int32, _I, _I, _I,
    types.float64, _P, _I, _P, _I, types.float64, _P, _I))
cblas_sgemm = types.ExternalFunction("fastckpt_cblas_sgemm", types.void(
    types.int32, types.int32, types.int32, _I, _I, _I,
    types.float32, _P, _I, _P, _I, types.float32, _P, _I))



def _python_gemm(func, real):
    """A Python callable with ``cblas_?gemm``'s arguments that calls ``func`` through ctypes."""
    func.restype = None
    func.argtypes = [ctypes.c_int32] * 3 + [ctypes.c_int64] * 3 + [real, ctypes.c_void_p, ctypes.c_int64,
                                                                     ctypes.c_void_p, ctypes.c_int64, real,
                                                                     ctypes.c_void_p, ctypes.c_int64]

    def gemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        func(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
    return gemm


if config.DISABLE_JIT:                                 # NOTE [ No JIT ]
    cblas_dgemm = _python_gemm(_dgemm, ctypes.c_double)
    cblas_sgemm = _python_gemm(_sgemm, ctypes.c_float)

_THREADS_INT = ctypes.c_int32 if BACKEND == "mkl" else ctypes.c_int64       # MKL_Set_Num_Threads(int)
if _set_threads is not None:
    _set_threads.argtypes, _set_threads.restype = [_THREADS_INT], None
if _get_threads is not None:
    _get_threads.argtypes, _get_threads.restype = [], _THREADS_INT
if _get_core is not None:
    _get_core.argtypes, _get_core.restype = [], ctypes.c_char_p


_CEILING = []                  # the threads asked for (set_blas_threads), once known; the library may run fewer


def blas_threads():
    """The number of threads numpy's BLAS may use: what :func:`set_blas_threads` set, else what the library
    started with (0 if it cannot say).  Plans count BLAS buffers for this many; the library may run fewer
    for a while (:func:`run_blas_threads`), never more."""
    if not _CEILING:
        _CEILING.append(int(_get_threads()) if _get_threads is not None else 0)
    return _CEILING[0]


def blas_threads_running():
    """The number of threads numpy's BLAS runs now (0 if it cannot say)."""
    return int(_get_threads()) if _get_threads is not None else 0


def run_blas_threads(n):
    """Run BLAS on ``n`` threads for now, at most :func:`blas_threads`; returns the number set."""
    n = max(1, min(int(n), blas_threads()))
    if _set_threads is not None and n != blas_threads_running():
        _set_threads(n)
    return n


def blas_core():
    """The kernels OpenBLAS chose for this CPU (``"Haswell"``, ``"SkylakeX"``, ...; ``OPENBLAS_CORETYPE``
    overrides it), ``"mkl"`` when the kernels call MKL, or ``"unknown"`` when the library cannot say."""
    if BACKEND == "mkl":
        return "mkl"
    name = _get_core() if _get_core is not None else None
    return name.decode(errors="replace").strip() if name else "unknown"


def set_blas_threads(n):
    """Set the number of threads numpy's BLAS may use, and runs now."""
    if _set_threads is None:
        raise RuntimeError(f"{LIBRARY} has no way to set its threads")
    _CEILING[:] = [int(n)]
    _set_threads(int(n))
