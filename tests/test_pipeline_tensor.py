"""Pipelines of tensor-parallel stages (NOTE [ Tensor-parallel stages ]): 1 x 2 x 2 on 4 ranks and 2 x 2 x 2 on 8.

Against one process on the same minibatches, in every schedule, with and without checkpointing, with SGD
and Adam; zb1 against 1f1b bit for bit; each rank's memray peak against its plan; what is refused.
Every run has a time limit.
"""
import json

import numpy as np
import pytest
from test_distributed import needs_mpi
from test_pipeline_mpi import DEEP, _job, _one_process

import fastckpt

SIZES = [784] + [256] * 8 + [10]
CASES = [dict(sizes=DEEP, schedule="gpipe", micro=3, batch=24, strategy="plain"),
         dict(sizes=DEEP, schedule="gpipe", micro=4, batch=23, strategy="sqrt", partition=[4, 3]),
         dict(sizes=DEEP, schedule="1f1b", micro=3, batch=24, strategy="every_nth(2)", loss="cross_entropy",
              l2=[0.1, 0, 0, 0.2, 0, 0, 0.3]),
         dict(sizes=DEEP, schedule="1f1b", micro=5, batch=25, strategy="plain", partition=[3, 4], optimizer="adam",
              eta=0.01),
         dict(sizes=DEEP, schedule="zb1", micro=4, batch=24, strategy="segments(2)", optimizer="adam", eta=0.01,
              loss="cross_entropy", l2=0.01, partition=[4, 3]),
         dict(sizes=[784, 40, 30, 10], schedule="zb1", micro=2, batch=20, strategy="plain", activation="relu",
              init="he")]


@needs_mpi
@pytest.mark.parametrize("data", [1, 2], ids=["1x2x2", "2x2x2"])
def test_tensor_parallel_stages_equal_one_process(data, tmp_path):
    """Odd and even layer counts per stage (first layer row- or column-split), every schedule, with and without
    checkpointing inside, SGD and Adam: the weights of one process to 1e-10, the same initial draw."""
    cases = [dict(case, tensor_parallel=2, data_parallel=data, out=str(tmp_path / f"{k}.npz"))
             for k, case in enumerate(CASES)]
    _job(4 * data, cases, timeout=600)
    (x, y), _ = fastckpt.load_mnist()
    for case in cases:
        before, net = _one_process(case, x, y)
        saved = np.load(case["out"])
        n = 2 * (len(case["sizes"]) - 1)
        for k, ref in enumerate(before):
            np.testing.assert_array_equal(saved[f"arr_{n + k}"], ref)
        for k, ref in enumerate(net.weights + net.biases):
            np.testing.assert_allclose(saved[f"arr_{k}"], ref, rtol=1e-10, atol=1e-13, err_msg=str(case))
        assert float(saved["loss"]) == pytest.approx(net.last_loss, rel=1e-10)
        assert bool(saved["replicas_agree"])


@needs_mpi
def test_tensor_parallel_zb1_trains_bit_for_bit_as_1f1b(tmp_path):
    base = dict(sizes=DEEP, micro=4, batch=24, strategy="sqrt", loss="cross_entropy", l2=0.01, optimizer="adam",
                eta=0.01, tensor_parallel=2)
    cases = [dict(base, schedule=kind, out=str(tmp_path / f"{kind}.npz")) for kind in ("1f1b", "zb1")]
    _job(4, cases)
    ones, zb1 = (np.load(case["out"]) for case in cases)
    for key in ones.files:
        if key != "bubble":
            np.testing.assert_array_equal(zb1[key], ones[key], err_msg=key)


@needs_mpi
@pytest.mark.memory
@pytest.mark.parametrize("data", [1, 2], ids=["1x2x2", "2x2x2"])
def test_each_shards_memray_peak_is_its_plan(data, tmp_path):
    """Each rank's peak is its plan to 128 KiB (the Python objects a trainer makes: ~40 KB); checkpointing
    inside the stages lowers both by the same bytes where more than one micro-batch is in flight."""
    base = dict(sizes=SIZES, batch=512, micro=4, memray=True, tensor_parallel=2, data_parallel=data, updates=2)
    runs = [("1f1b", "plain", "sgd"), ("1f1b", "sqrt", "sgd"), ("zb1", "plain", "adam"), ("gpipe", "every_nth(2)",
                                                                                       "sgd")]
    cases = [dict(base, schedule=s, strategy=st, optimizer=opt, eta=0.01, out=str(tmp_path / f"{s}-{st}-{opt}.json"))
             for s, st, opt in runs]
    _job(4 * data, cases, timeout=600)
    found = {}
    for case in cases:
        rows = json.load(open(case["out"]))
        assert len(rows) == 4 * data
        for rank, (peak, predicted) in enumerate(rows):
            assert abs(peak - predicted["total"]) <= 128 * 1024, (case["out"], rank, peak, predicted)
            assert (predicted["deferred_weights"] > 0) == (case["schedule"] == "zb1")
            assert (predicted["optimizer_state"] == 2 * predicted["parameters"]) == (case["optimizer"] == "adam")
        found[case["schedule"], case["strategy"]] = rows
    for rank, ((plain, p_plan), (sqrt, s_plan)) in enumerate(zip(found["1f1b", "plain"], found["1f1b", "sqrt"])):
        saved = p_plan["total"] - s_plan["total"]          # stage 0 holds 2 micro-batches, the last stage 1:
        assert (saved > 0) == (rank % 4 < 2), (rank, saved)  # its dropped states cost what their buffer does
        assert abs((plain - sqrt) - saved) <= 128 * 1024, (rank, plain, sqrt, saved)
