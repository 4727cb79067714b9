"""docs/architecture.md's rules hold on the installed package, and the check catches each kind of break."""
import pytest
from layering import sources, violations


@pytest.fixture(scope="module")
def package():
    return sources()


def test_the_package_keeps_the_house_rules(package):
    assert {"fastckpt.kernels.dense", "fastckpt.core.params", "fastckpt.cli.app"} <= set(package)
    assert violations(package) == []


@pytest.mark.parametrize("module,line,expected", [
    ("fastckpt.core.params", "from fastckpt.nets import Network",
     "fastckpt.core.params:1 imports fastckpt.nets: core may not import nets (upward or sideways)"),
    ("fastckpt.report.summary", "from fastckpt.parallel import DataParallel",
     "fastckpt.report.summary:1 imports fastckpt.parallel: report may not import parallel (upward or sideways)"),
    ("fastckpt.kernels.dense", "from fastckpt.core import checks",
     "fastckpt.kernels.dense:1 imports fastckpt.core.checks: kernels may not import core (upward or sideways)"),
    ("fastckpt.data.readers", "from fastckpt.core.checks import check_sizes",
     "fastckpt.data.readers:1 imports fastckpt.core.checks: data imports nothing of fastckpt"),
    ("fastckpt.engine.engine", "from fastckpt.kernels.dense import gemm",
     "fastckpt.engine.engine:1 imports fastckpt.kernels.dense: the kernels' public face is fastckpt.kernels"),
    ("fastckpt.nets.network", "from fastckpt.engine.inference import _helper",
     "fastckpt.nets.network:1 imports fastckpt.engine.inference: private name _helper"),
    ("fastckpt.planner.plan", "import fastckpt",
     "fastckpt.planner.plan:1 imports fastckpt: nothing imports the facade"),
])
def test_each_kind_of_break_is_caught(package, module, line, expected):
    broken = dict(package, **{module: line + "\n" + package[module]})
    found = violations(broken)
    assert expected in found                           # and perhaps the circle an upward import closes
    assert all(v == expected or v.startswith("import circle") and module in v for v in found), found


def test_a_circle_is_caught_even_through_a_local_import(package):
    local = "def later():\n    from fastckpt.planner import plan\n"
    broken = dict(package, **{"fastckpt.planner.costs": package["fastckpt.planner.costs"] + local})
    circles = [v for v in violations(broken) if v.startswith("import circle")]
    assert circles and all("fastckpt.planner.costs" in c for c in circles)


def test_functions_are_short_and_classes_are_not_mixins(package):
    long = "def f():\n" + "    x = 1\n" * 70
    mixed = "class A(B, C):\n    pass\n\n\nclass Refused(ValueError, KeyError):\n    pass\n"
    broken = dict(package, **{"fastckpt.core.losses": package["fastckpt.core.losses"] + long + mixed})
    found = violations(broken)
    assert any(v.startswith("fastckpt.core.losses:") and "f: 71 lines, over 60" in v for v in found)
    assert any("class A: 2 bases, a class of mixins" in v for v in found)
    assert not any("Refused" in v for v in found)                     # an exception of two kinds is one


@pytest.mark.parametrize("module,line,expected", [
    ("fastckpt.parallel.trainer", "from fastckpt.kernels import dense_backward",
     "a layer kernel in parallel (dense_backward): the engine runs every layer"),
    ("fastckpt.parallel.pipeline.stage", "from fastckpt.kernels import gemm, all_finite",
     "a layer kernel in parallel (gemm): the engine runs every layer"),
    ("fastckpt.nets.network", "from fastckpt.kernels import runner",
     "fastckpt.nets.network:1 imports fastckpt.kernels: the run kernel is the engine's alone"),
])
def test_one_engine_runs_every_layer(package, module, line, expected):
    """No module of parallel/ calls a layer kernel, and only the engine makes and calls the run kernel."""
    assert violations(package) == []
    found = violations(dict(package, **{module: line + "\n" + package[module]}))
    assert any(expected in v for v in found), found
