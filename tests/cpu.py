"""Facts about the CPU the tests run on, and the skip of tests that state facts about AVX-512.

A test that asserts something only an AVX-512 CPU shows (zmm code for the host, OpenBLAS's
SkylakeX or CooperLake kernels, which die of SIGILL elsewhere) carries ``@pytest.mark.avx512``;
on a CPU without ``avx512f`` in its flags it is skipped with the reason.  The flags are read once,
by :func:`fastckpt.report.machine.cpu_flags`.  ``tests/test_cpu_facts.py`` fakes them.
"""
from fastckpt.report.machine import cpu_flags


def avx512_skip_reason(flags=None):
    """Why a test marked ``avx512`` cannot run on a CPU with ``flags`` (the host's by default), or None."""
    flags = cpu_flags() if flags is None else frozenset(flags)
    if "avx512f" in flags:
        return None
    kind = "AVX2 only" if "avx2" in flags else "no AVX-512"
    return f"states a fact about AVX-512 code or kernels, and this CPU has {kind} (no avx512f in its flags)"


def skip_avx512_tests(items, flags=None):
    """Mark every collected test that carries ``avx512`` as skipped when the CPU has no AVX-512."""
    import pytest
    reason = avx512_skip_reason(flags)
    if reason is None:
        return
    for item in items:
        if item.get_closest_marker("avx512") is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
