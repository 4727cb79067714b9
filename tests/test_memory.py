"""The plan's predicted peak holds: memray's peak over building a net and training it.

The bound is the contract, |measured - predicted| <= 2% + 1 MiB; in practice the
difference is the few KiB of Python objects (views, the op list) a plan creates.
"""
import numpy as np
import pytest

import fastckpt
from fastckpt import NetworkWithCheckpointing
from fastckpt.core.layout import grad_bytes
from fastckpt.report.measure import memray_peak

pytestmark = pytest.mark.memory

NETS = {"deep-narrow": ([784] + [256] * 24 + [10], 512), "shallow-wide": ([784, 2048, 2048, 10], 256)}
STRATEGIES = ["plain", "every_nth(2)", "sqrt", "revolve(3)", "budget", "budget-once"]
MiB = 2**20


@pytest.fixture(scope="module", autouse=True)
def warm_up():
    """Load every kernel and start BLAS's threads before anything is measured."""
    for dtype in (np.float64, np.float32):
        for fused in (False, True):
            net = fastckpt.Network([784, 300, 10], dtype=dtype, optimizer_in_backward=fused)
            x = np.ones((300, 784), dtype=dtype)
            net.update_mini_batch(x, np.ones((300, 10), dtype=dtype), 0.1)


def _strategy(name, sizes, batch, dtype):
    if not name.startswith("budget"):
        return name
    mode = ", once" if name.endswith("once") else ""
    with pytest.raises(fastckpt.InfeasiblePlan) as info:
        fastckpt.plan(sizes, batch, dtype, f"budget(1{mode})")
    return f"budget({int(info.value.minimum_bytes * 1.3)}{mode})"


@pytest.mark.parametrize("fused", [False, True], ids=["sgd-after", "sgd-in-backward"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("net", list(NETS))
@pytest.mark.sweep(
    'deep-narrow-plain-f64-sgd-after',
    'deep-narrow-revolve(3)-f32-sgd-in-backward',
    'deep-narrow-budget-once-f64-sgd-in-backward',
    'shallow-wide-sqrt-f32-sgd-after',
    'shallow-wide-every_nth(2)-f64-sgd-in-backward',
    'shallow-wide-budget-f32-sgd-after',
)
def test_memray_peak_is_the_predicted_peak(net, strategy, dtype, fused):
    sizes, batch = NETS[net]
    strategy = _strategy(strategy, sizes, batch, dtype)
    rng = np.random.default_rng(0)
    x = rng.random((batch, sizes[0])).astype(dtype)
    y = rng.random((batch, sizes[-1])).astype(dtype)
    predicted = fastckpt.plan(sizes, batch, dtype, strategy, optimizer_in_backward=fused).bytes()

    def build_and_train():
        np.random.seed(0)
        model = NetworkWithCheckpointing(sizes, strategy=strategy, dtype=dtype, optimizer_in_backward=fused)
        for _ in range(3):
            model.update_mini_batch(x, y, 0.01)
    measured = memray_peak(build_and_train)
    assert abs(measured - predicted["total"]) <= 0.02 * predicted["total"] + MiB, (measured, predicted)
    # tighter than the contract: what the plan leaves out is small
    assert -64 * 1024 <= measured - predicted["total"] <= 256 * 1024, (measured, predicted)


@pytest.mark.parametrize("batch", [1, 2, 3, 4, 8])
def test_openblas_job_table_is_predicted_where_gemms_go_threaded(batch):
    """[512, 512] straddles both rules of NOTE [ BLAS job table ]: m*n*k = 262144 * batch goes threaded from
    batch 2 on the Haswell kernels, and from batch 3 (forward) or 4 (weight gradient) on SkylakeX's."""
    from fastckpt.kernels import blas_threads
    if blas_threads() < 2:
        pytest.skip("BLAS runs on one thread here")
    x, y = np.ones((batch, 512)), np.ones((batch, 512))
    predicted = fastckpt.plan([512, 512], batch).bytes()
    assert predicted["blas"] in (0, 512 * 1024)

    def build_and_train():
        model = fastckpt.Network([512, 512])
        for _ in range(2):
            model.update_mini_batch(x, y, 0.01)
    assert abs(memray_peak(build_and_train) - predicted["total"]) <= 16 * 1024


@pytest.mark.parametrize("fused", [False, True], ids=["after", "in-backward"])
@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
@pytest.mark.parametrize("strategy", ["plain", "sqrt", "fit"])
@pytest.mark.parametrize("net", list(NETS))
@pytest.mark.sweep(
    'deep-narrow-sqrt-adam-in-backward',
    'shallow-wide-fit-momentum-after',
    'deep-narrow-fit-adam-after',
    'shallow-wide-plain-momentum-in-backward',
)
def test_memray_peak_counts_the_optimizer_state(net, strategy, optimizer, fused):
    """The velocity, or Adam's m and v, are buffers the size of the parameters: the plan's optimizer_state.
    In the backward pass the gradients shrink to the largest layer's."""
    sizes, batch = NETS[net]
    if strategy == "fit":
        whole = fastckpt.plan(sizes, batch, strategy="plain", optimizer=optimizer,
                              optimizer_in_backward=fused).bytes()["total"]
        with pytest.raises(fastckpt.InfeasiblePlan) as info:
            fastckpt.plan(sizes, batch, strategy="fit(1)", optimizer=optimizer, optimizer_in_backward=fused)
        strategy = f"fit({(whole + info.value.minimum_bytes) // 2})"
    rng = np.random.default_rng(0)
    x, y = rng.random((batch, sizes[0])), rng.random((batch, sizes[-1]))
    predicted = fastckpt.plan(sizes, batch, strategy=strategy, optimizer=optimizer,
                              optimizer_in_backward=fused).bytes()
    assert predicted["optimizer_state"] == {"momentum": 1, "adam": 2}[optimizer] * predicted["parameters"]
    if fused:
        assert predicted["gradients"] == max(grad_bytes(sizes, 8))

    def build_and_train():
        np.random.seed(0)
        model = NetworkWithCheckpointing(sizes, strategy=strategy, optimizer=optimizer, activation="relu", init="he",
                                         optimizer_in_backward=fused)
        for _ in range(3):
            model.update_mini_batch(x, y, 0.001)
    build_and_train()                                              # warm-up: the optimizer's kernels
    measured = memray_peak(build_and_train)
    assert abs(measured - predicted["total"]) <= 0.02 * predicted["total"] + MiB, (measured, predicted)
    assert -64 * 1024 <= measured - predicted["total"] <= 256 * 1024, (measured, predicted)


@pytest.mark.parametrize("layers", [10, 100, 300])
@pytest.mark.parametrize("strategy", ["plain", "sqrt"])
def test_what_memray_counts_beside_the_step_is_some_2_kib_a_layer(strategy, layers):
    """What the README says memray measures beside a step's plan: the Python objects of the net and its plan,
    some 2 KiB a layer (never less than nothing: the plan's bytes are all there)."""
    sizes, batch = [50] + [64] * layers + [10], 100
    rng = np.random.default_rng(0)
    x, y = rng.random((batch, 50)), rng.random((batch, 10))
    predicted = fastckpt.plan(sizes, batch, np.float64, strategy).bytes()["total"]

    def build_and_train():
        NetworkWithCheckpointing(sizes, strategy=strategy).update_mini_batch(x, y, 0.01)
    memray_peak(build_and_train)                                 # its kernels' first calls, memray warm too
    measured = memray_peak(build_and_train)
    assert 0 <= measured - predicted <= 16 * 1024 + 2048 * (layers + 1), (measured, predicted)
