"""Kernels against the NumPy twin, over shapes including batch 1 and odd widths."""
import naive
import numpy as np
import pytest
from fastckpt.kernels import (
    all_finite,
    bias_sigmoid,
    dense_backward,
    dense_backward_sgd,
    dense_forward,
    dense_forward_log_softmax,
    label_sums,
    quadratic_delta,
    sgd_step,
    squared_error_delta,
    target_sums,
)

SHAPES = [(1, 1, 1), (1, 784, 40), (3, 7, 5), (17, 33, 1), (100, 40, 30), (64, 257, 129)]
TOL = {np.float64: 1e-13, np.float32: 2e-6}


def _layer(rng, batch, n_in, n_out, dtype):
    a_in = rng.random((batch, n_in)).astype(dtype)
    w = rng.standard_normal((n_out, n_in)).astype(dtype)
    b = rng.standard_normal(n_out).astype(dtype)
    return a_in, w, b


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_dense_forward_matches_numpy(rng, shape, dtype):
    batch, n_in, n_out = shape
    a_in, w, b = _layer(rng, batch, n_in, n_out, dtype)
    out = np.full((batch, n_out), np.nan, dtype=dtype)
    dense_forward(a_in, w, b, out)
    ref = naive.sigmoid(a_in.astype(np.float64) @ w.T.astype(np.float64) + b)
    # float32 GEMM rounding grows with the n_in-term sums; sigmoid' <= 1/4 scales it down
    atol = TOL[dtype] * 1e-3 if dtype == np.float64 else 1e-7 * n_in
    np.testing.assert_allclose(out, ref, rtol=TOL[dtype], atol=atol)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("first_layer", [False, True])
def test_dense_backward_matches_numpy(rng, shape, dtype, first_layer):
    batch, n_in, n_out = shape
    a_in, w, b = _layer(rng, batch, n_in, n_out, dtype)
    dz_out = rng.standard_normal((batch, n_out)).astype(dtype)
    f64 = [v.astype(np.float64) for v in (a_in, w, dz_out)]
    gw, gb = np.empty_like(w), np.empty(n_out, dtype=dtype)
    dz_in = np.empty((0 if first_layer else batch, n_in), dtype=dtype)
    dense_backward(a_in, w, dz_out, 1.0 / batch, np.empty(n_out), gw, gb, dz_in)
    tol = TOL[dtype] * 10 * (1 if dtype == np.float64 else max(1, batch / 8))
    scale = np.abs(f64[2]).max()
    np.testing.assert_allclose(gw, f64[2].T @ f64[0] / batch, rtol=tol, atol=tol * scale)
    np.testing.assert_allclose(gb, f64[2].mean(axis=0), rtol=tol, atol=tol * scale)
    ref_in = (f64[2] @ f64[1]) * f64[0] * (1 - f64[0])
    if not first_layer:
        np.testing.assert_allclose(dz_in, ref_in, rtol=tol, atol=tol * scale * n_out)
    # the fused form: the same delta from the old weights, then w -= step * gradient
    step = 0.3
    w2, b2 = w.copy(), b.copy()
    dz_in2 = np.empty_like(dz_in)
    assert dense_backward_sgd(a_in, w2, b2, dz_out, step, np.empty(n_out), dz_in2)
    np.testing.assert_allclose(w2, f64[1] - step * (f64[2].T @ f64[0]),
                               rtol=tol, atol=tol * scale * batch)
    np.testing.assert_allclose(b2, b - step * f64[2].sum(axis=0), rtol=tol, atol=tol * scale * batch)
    if not first_layer:
        np.testing.assert_array_equal(dz_in2, dz_in)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_deltas_that_would_be_subnormal_are_flushed_to_zero(rng, dtype):
    tiny = np.finfo(dtype).tiny
    a_in = np.full((4, 3), 0.5, dtype=dtype)                 # sigma' = 1/4
    w = np.eye(2, 3, dtype=dtype)
    dz_out = np.array([[8 * tiny, 2 * tiny]] * 4, dtype=dtype)   # -> 2 tiny (kept) and tiny / 2 (flushed)
    dz_in = np.empty((4, 3), dtype=dtype)
    dense_backward(a_in, w, dz_out, 0.25, np.empty(2), np.empty((2, 3), dtype=dtype), np.empty(2, dtype=dtype), dz_in)
    np.testing.assert_array_equal(dz_in, np.array([[2 * tiny, 0, 0]] * 4, dtype=dtype))
    # output delta (a - y) a (1 - a) with y = 0: a^2 is normal for the first, subnormal for the second
    a = np.array([[np.sqrt(4 * tiny), np.sqrt(tiny / 4)]] * 2, dtype=dtype)
    dz = np.empty_like(a)
    quadratic_delta(a, np.zeros_like(a), dz)
    assert dz[0, 0] >= tiny and dz[0, 1] == 0 and dz[1, 1] == 0


def test_dense_backward_sgd_reports_non_finite_results(rng):
    a_in, w, b = _layer(rng, 4, 3, 2, np.float64)
    dz_out = np.full((4, 2), 1e300)
    assert not dense_backward_sgd(a_in, w, b, dz_out, 1e300, np.empty(2), np.empty((4, 3)))


def test_float32_sigmoid_is_exact_to_3e7_of_the_float32_sum(rng):
    z = (rng.uniform(-90, 90, size=(64, 257))).astype(np.float32)
    b = rng.standard_normal(257).astype(np.float32)
    out = z.copy()
    bias_sigmoid(out, b)
    ref = naive.sigmoid((z + b).astype(np.float64))        # the float32 sum, then exactly
    kept = (z + b) >= -87                                  # below: flushed, as documented
    np.testing.assert_allclose(out[kept], ref[kept], rtol=3e-7, atol=0)
    assert np.all(out[~kept] == 0) and not np.any((out > 0) & (out < np.finfo(np.float32).tiny))
    edges = np.array([[-np.inf, -1e30, -88.0, -87.0, 0.0, 87.0, 1e30, np.inf, np.nan]], dtype=np.float32)
    bias_sigmoid(edges, np.zeros(9, dtype=np.float32))
    assert edges[0, :3].tolist() == [0.0, 0.0, 0.0] and edges[0, 4] == 0.5
    assert edges[0, 5:8].tolist() == [1.0, 1.0, 1.0] and np.isnan(edges[0, 8])
    assert np.finfo(np.float32).tiny <= edges[0, 3] < 2e-38


def test_sigmoid_edges_nan_inf_and_no_subnormals():
    z = np.array([[-1e300, -800.0, -708.5, -30.0, 0.0, 30.0, 708.5, 800.0, 1e300,
                   np.inf, -np.inf, np.nan]])
    out = z.copy()
    bias_sigmoid(out, np.zeros(z.shape[1]))
    with np.errstate(over="ignore"):
        ref = naive.sigmoid(z)
    ref[np.abs(ref) < np.finfo(np.float64).tiny] = 0.0        # fastckpt flushes subnormal outputs
    np.testing.assert_allclose(out, ref, rtol=1e-15, atol=0)
    assert np.isnan(out[0, -1])
    f32 = np.array([[-200.0, -88.0, -87.0, 0.0, 87.0, 88.0, 200.0]], dtype=np.float32)
    o32 = f32.copy()
    bias_sigmoid(o32, np.zeros(7, np.float32))
    assert np.all((o32 == 0) | (np.abs(o32) >= np.finfo(np.float32).tiny))
    np.testing.assert_allclose(o32[0, 2:5], naive.sigmoid(f32[0, 2:5].astype(np.float64)), rtol=1e-6)


@pytest.mark.skipif(np.finfo(np.longdouble).eps >= np.finfo(np.float64).eps / 1000,
                    reason="needs a long double with far more precision than float64 (x86-64's 80-bit)")
@pytest.mark.parametrize("dtype, limit, bound", [(np.float64, 700, 2.5e-16), (np.float32, 80, 1.5e-7)])
def test_sigmoid_accuracy_dense_grid(dtype, limit, bound):
    """Against 1 / (1 + expl(-z)) in long double (error ~1e-19), never against another float64 exp:
    NumPy's own float64 sigmoid is 2.4e-16 off here, and its exp differs between CPUs."""
    z = np.linspace(-limit, limit, 200_001).astype(dtype).reshape(1, -1)
    out = z.copy()
    bias_sigmoid(out, np.zeros(z.shape[1], dtype))
    exact = 1 / (1 + np.exp(-z.astype(np.longdouble)))
    assert np.max(np.abs(out.astype(np.longdouble) - exact) / exact) < bound      # measured: 2.44e-16, 1.40e-7


def test_quadratic_delta(rng):
    a, y = rng.random((9, 4)), rng.random((9, 4))
    d = np.empty_like(a)
    loss = quadratic_delta(a, y, d)
    np.testing.assert_array_equal(d, (a - y) * a * (1 - a))     # the output's pre-activation delta
    assert loss == pytest.approx(0.5 * np.sum((a - y) ** 2) / 9, rel=1e-14)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(1, 1), (9, 4), (33, 7)], ids=str)
def test_squared_error_delta_is_the_error_of_a_linear_output(rng, shape, dtype):
    a, y = (rng.standard_normal(shape) * 5).astype(dtype), (rng.standard_normal(shape) * 5).astype(dtype)
    d = np.empty_like(a)
    loss = squared_error_delta(a, y, d)
    exact = a.astype(np.float64) - y.astype(np.float64)
    np.testing.assert_array_equal(d, exact.astype(dtype))        # computed in float64, rounded once
    assert loss == pytest.approx(0.5 * np.sum(exact ** 2) / shape[0], rel=1e-14)
    tiny = np.finfo(dtype).tiny
    small = np.array([[tiny / 4, 0.5, np.nan]], dtype=dtype)
    d = np.empty_like(small)
    assert np.isnan(squared_error_delta(small, np.zeros_like(small), d))
    assert d[0, :2].tolist() == [0.0, 0.5]                       # a subnormal delta is flushed to 0


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", [0, 500, 1022])
def test_all_finite_finds_every_position(bad, where):
    x = np.ones(1023)
    assert all_finite(x)
    x[where] = bad
    assert not all_finite(x)
    assert not all_finite(x.astype(np.float32))


ALL = np.array([[0, 50]], dtype=np.int64)


def test_sgd_step_applies_or_leaves_untouched(rng):
    p, g = rng.standard_normal(50), rng.standard_normal(50)
    ref = p - 0.5 * g
    assert sgd_step(p, g, 0.5, ALL)
    np.testing.assert_array_equal(p, ref)
    g[7] = np.nan
    before = p.copy()
    assert not sgd_step(p, g, 0.5, ALL)
    np.testing.assert_array_equal(p, before)
    g[7] = 1e308
    assert not sgd_step(p, g, 1e10, ALL)               # overflow to inf is refused too
    np.testing.assert_array_equal(p, before)


def test_sgd_step_touches_only_its_blocks(rng):
    p, g = rng.standard_normal(20), rng.standard_normal(20)
    g[5:8] = np.nan                                     # padding between blocks may hold anything
    before = p.copy()
    assert sgd_step(p, g, 0.5, np.array([[0, 5], [8, 20]], dtype=np.int64))
    np.testing.assert_array_equal(p[5:8], before[5:8])
    np.testing.assert_array_equal(p[:5], before[:5] - 0.5 * g[:5])
    np.testing.assert_array_equal(p[8:], before[8:] - 0.5 * g[8:])


def test_kernels_refuse_shapes_that_do_not_chain(rng):
    a_in, w, b = _layer(rng, 4, 5, 3, np.float64)
    with pytest.raises(ValueError, match="do not chain"):
        dense_forward(a_in, w, b, np.empty((4, 2)))
    with pytest.raises(ValueError):
        dense_forward_log_softmax(a_in, w, b, np.empty(1), np.empty((4, 3)))   # scratch too short
    with pytest.raises(ValueError, match="bias"):
        bias_sigmoid(np.empty((4, 3)), np.empty(2))
    with pytest.raises(ValueError, match="do not chain"):
        dense_backward(a_in, w, np.empty((4, 2)), 0.25, np.empty(3),
                       np.empty((3, 5)), np.empty(3), np.empty((4, 5)))
    with pytest.raises(ValueError, match="gradient shapes"):
        dense_backward(a_in, w, np.empty((4, 3)), 0.25, np.empty(3),
                       np.empty((3, 4)), np.empty(3), np.empty((4, 5)))
    with pytest.raises(ValueError, match="do not chain"):
        dense_backward_sgd(a_in, w, b, np.empty((4, 3)), 0.1, np.empty(3), np.empty((3, 5)))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_label_sums_add_the_loss_and_the_hits_of_each_row(rng, dtype):
    from fastckpt.kernels import IDENTITY, LOG_SOFTMAX, SIGMOID
    p = rng.dirichlet(np.ones(4), 13).astype(dtype)
    p[0, 2] = 0.0                                                 # log 0: counted as log of the smallest normal
    p[1] = [0.1, 0.4, 0.4, 0.1]                                   # a tie: the first arg-max, as NumPy's
    labels = rng.integers(0, 4, 13)
    labels[:2] = [2, 2]
    hits = np.count_nonzero(p.argmax(axis=1) == labels)
    sums = np.zeros(2)
    label_sums(p, labels, LOG_SOFTMAX, sums)
    picked = np.maximum(p[np.arange(13), labels].astype(np.float64), np.finfo(np.float64).tiny)
    assert sums[0] == pytest.approx(-np.sum(np.log(picked)), rel=1e-13) and sums[1] == hits
    for code in (SIGMOID, IDENTITY):
        sums = np.array([1.0, 2.0])                               # added to, not overwritten
        label_sums(p, labels, code, sums)
        error = p.astype(np.float64) - np.eye(4)[labels]
        assert sums[0] == pytest.approx(1.0 + 0.5 * np.sum(error ** 2), rel=1e-13) and sums[1] == 2.0 + hits


def test_target_sums_are_r2s_two_sums_per_output(rng):
    out, y = rng.standard_normal((11, 3)), rng.standard_normal((11, 3))
    mean = y.mean(axis=0)
    sums = np.zeros((2, 3))
    target_sums(out[:5], y[:5], mean, sums)
    target_sums(out[5:], y[5:], mean, sums)                       # chunk by chunk
    np.testing.assert_allclose(sums[0], ((out - y) ** 2).sum(axis=0), rtol=1e-14)
    np.testing.assert_allclose(sums[1], ((y - mean) ** 2).sum(axis=0), rtol=1e-14)
