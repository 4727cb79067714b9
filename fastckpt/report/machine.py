"""What a timing ran on: the CPU, and the instruction set the kernels and the BLAS were built for.

Timings differ most between CPUs with AVX-512 and those with only AVX2, and an AVX-512 machine
can run as an AVX2 one: ``NUMBA_CPU_NAME``/``NUMBA_CPU_FEATURES`` set the kernels' target and
``OPENBLAS_CORETYPE`` OpenBLAS's kernels.  Every benchmark prints :func:`cpu_summary` so a table
says which of these it measured.
"""
import functools
import os
import platform

from fastckpt.kernels import blas_core


def parse_cpuinfo(text):
    """``{field: value}`` of the first processor in the text of ``/proc/cpuinfo``."""
    fields = {}
    for line in text.splitlines():
        if not line.strip():
            break                                       # the first processor is enough
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


@functools.lru_cache(maxsize=1)
def _cpuinfo():
    try:
        with open("/proc/cpuinfo") as f:
            return parse_cpuinfo(f.read())
    except OSError:
        return {}


def cpu_flags():
    """The host CPU's feature flags (``avx2``, ``avx512f``, ...) as a frozenset, read once; empty where the
    system does not say (no ``/proc/cpuinfo``)."""
    return frozenset(_cpuinfo().get("flags", "").split())


def kernel_target():
    """(cpu name, has AVX-512) of the code Numba compiles: the host's unless the environment overrides it."""
    import llvmlite.binding as llvm
    from numba import config
    name = config.CPU_NAME or llvm.get_host_cpu_name()
    # a name alone keeps the host's features (Numba passes them with the name): NUMBA_CPU_NAME=znver4 on an
    # AVX2 CPU still compiles AVX2 code, and NUMBA_CPU_NAME=haswell on an AVX-512 one AVX-512 code
    features = config.CPU_FEATURES if config.CPU_FEATURES is not None else llvm.get_host_cpu_features().flatten()
    return name, "+avx512f" in features.split(",")


def cpu_facts():
    """A dict: model, family/model numbers, cores, host AVX-512, kernel target and BLAS core type."""
    info = _cpuinfo()
    flags = cpu_flags()
    name, target_avx512 = kernel_target()
    return {
        "model": info.get("model name", platform.processor() or "?"),
        "family": info.get("cpu family", "?"),
        "model_number": info.get("model", "?"),
        "cores": os.cpu_count(),
        "host_avx512": "avx512f" in flags,
        "kernel_cpu": name,
        "kernel_avx512": target_avx512,
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", "auto"),
        "blas": blas_core(),
    }


def cpu_summary():
    """One line naming the CPU and whether the measured code used AVX-512 (really, or emulated AVX2)."""
    f = cpu_facts()
    host = "AVX-512" if f["host_avx512"] else "AVX2, no AVX-512"
    emulated = f["host_avx512"] and not f["kernel_avx512"]
    kind = "emulated AVX2 (no AVX-512 in the kernels)" if emulated else ("AVX-512" if f["kernel_avx512"] else "AVX2")
    return (f"CPU: {f['model']} (family {f['family']}, model {f['model_number']}), {f['cores']} cores, host {host}; "
            f"measured as: {kind}; kernels compiled for {f['kernel_cpu']}; BLAS "
            + ("MKL" if f["blas"] == "mkl" else f"OpenBLAS core {f['blas']} "
                                                f"(OPENBLAS_CORETYPE {f['openblas_coretype']})"))
