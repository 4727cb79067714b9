"""The skip of AVX-512 facts, on faked CPU flags: an AVX2-only CPU (Zen 3, Haswell) skips them with the reason and
runs the rest; an AVX-512 one (Zen 5, Xeon) runs them all."""
import textwrap

import pytest
from cpu import avx512_skip_reason

from fastckpt.report.machine import parse_cpuinfo

ZEN3 = textwrap.dedent("""\
    processor\t: 0
    vendor_id\t: AuthenticAMD
    cpu family\t: 25
    model\t\t: 1
    model name\t: AMD EPYC
    flags\t\t: fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi1 bmi2 vaes vpclmulqdq

    processor\t: 1
    flags\t\t: fpu avx512f
    """)
ZEN5_FLAGS = "fpu sse2 fma avx avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16"
HASWELL_FLAGS = "fpu sse2 fma avx avx2 bmi1 bmi2"


def test_the_first_processors_fields_are_read():
    fields = parse_cpuinfo(ZEN3)
    assert (fields["cpu family"], fields["model"]) == ("25", "1")
    assert "avx2" in fields["flags"].split() and "avx512f" not in fields["flags"].split()   # not processor 1's


@pytest.mark.parametrize("flags, runs", [(parse_cpuinfo(ZEN3)["flags"], False), (HASWELL_FLAGS, False),
                                         (ZEN5_FLAGS, True), ("fpu sse2", False), ("", False)])
def test_avx512_facts_run_only_with_avx512f(flags, runs):
    reason = avx512_skip_reason(flags.split())
    assert (reason is None) == runs
    if not runs:
        assert "no avx512f" in reason and ("AVX2 only" in reason) == ("avx2" in flags.split())


@pytest.mark.parametrize("flags, outcome", [(HASWELL_FLAGS, {"passed": 1, "skipped": 1}),
                                            (ZEN5_FLAGS, {"passed": 1, "failed": 1})])
def test_a_session_on_faked_flags_skips_or_runs_the_marked_test(pytester, monkeypatch, flags, outcome):
    """A whole pytest session with the suite's hook: the marked test (which fails if it runs) is skipped with the
    reason on AVX2, and runs (so fails here) on AVX-512; the unmarked test runs on both."""
    import cpu
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset(flags.split()))
    pytester.makeini("[pytest]\nmarkers =\n    avx512: AVX-512 facts\n")
    pytester.makeconftest("from cpu import skip_avx512_tests\n\n"
                          "def pytest_collection_modifyitems(config, items):\n    skip_avx512_tests(items)\n")
    pytester.makepyfile("import pytest\n\n"
                        "@pytest.mark.avx512\ndef test_zmm():\n    assert False, 'ran'\n\n"
                        "def test_ymm():\n    assert True\n")
    result = pytester.runpytest_inprocess("-rs")
    result.assert_outcomes(**outcome)
    if "skipped" in outcome:
        result.stdout.fnmatch_lines(["*states a fact about AVX-512*this CPU has AVX2 only*"])
