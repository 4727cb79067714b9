"""Kernels against the NumPy twin, over shapes including batch 1 and odd widths."""
import numpy as np
import pytest

import naive
from fastckpt.kernels import (all_finite, bias_sigmoid, dense_backward, dense_forward,
                              quadratic_delta, sgd_step)

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
    dense_forward(a_in, w, b, np.empty(n_out), out)
    ref = naive.sigmoid(a_in.astype(np.float64) @ w.T.astype(np.float64) + b)
    # float32 GEMM rounding grows with the n_in-term sums; sigmoid' <= 1/4 scales it down
    atol = TOL[dtype] * 1e-3 if dtype == np.float64 else 1e-7 * n_in
    np.testing.assert_allclose(out, ref, rtol=TOL[dtype], atol=atol)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("first_layer", [False, True])
def test_dense_backward_matches_numpy(rng, shape, dtype, first_layer):
    batch, n_in, n_out = shape
    a_in, w, _ = _layer(rng, batch, n_in, n_out, dtype)
    a_out = rng.random((batch, n_out)).astype(dtype)
    d_out = rng.standard_normal((batch, n_out)).astype(dtype)
    f64 = [v.astype(np.float64) for v in (a_in, w, a_out, d_out)]
    dz = f64[3] * f64[2] * (1 - f64[2])
    gw, gb = np.empty_like(w), np.empty(n_out, dtype=dtype)
    d_in = np.empty((0 if first_layer else batch, n_in), dtype=dtype)
    dense_backward(a_in, a_out, w, d_out, 1.0 / batch, np.empty(n_out), gw, gb, d_in)
    tol = TOL[dtype] * 10 * (1 if dtype == np.float64 else max(1, batch / 8))
    np.testing.assert_allclose(d_out, dz, rtol=tol, atol=tol * 1e-3)
    np.testing.assert_allclose(gw, dz.T @ f64[0] / batch, rtol=tol, atol=tol * np.abs(dz).max())
    np.testing.assert_allclose(gb, dz.mean(axis=0), rtol=tol, atol=tol * np.abs(dz).max())
    if not first_layer:
        np.testing.assert_allclose(d_in, dz @ f64[1], rtol=tol, atol=tol * np.abs(dz).max() * n_out)


def test_sigmoid_edges_nan_inf_and_no_subnormals():
    z = np.array([[-1e300, -800.0, -708.5, -30.0, 0.0, 30.0, 708.5, 800.0, 1e300,
                   np.inf, -np.inf, np.nan]])
    out = z.copy()
    bias_sigmoid(out, np.zeros(z.shape[1]), np.empty(z.shape[1]))
    with np.errstate(over="ignore"):
        ref = naive.sigmoid(z)
    ref[np.abs(ref) < np.finfo(np.float64).tiny] = 0.0        # fastckpt flushes subnormal outputs
    np.testing.assert_allclose(out, ref, rtol=1e-15, atol=0)
    assert np.isnan(out[0, -1])
    f32 = np.array([[-200.0, -88.0, -87.0, 0.0, 87.0, 88.0, 200.0]], dtype=np.float32)
    o32 = f32.copy()
    bias_sigmoid(o32, np.zeros(7, np.float32), np.empty(7))
    assert np.all((o32 == 0) | (np.abs(o32) >= np.finfo(np.float32).tiny))
    np.testing.assert_allclose(o32[0, 2:5], naive.sigmoid(f32[0, 2:5].astype(np.float64)), rtol=1e-6)


def test_sigmoid_accuracy_dense_grid():
    z = np.linspace(-700, 700, 200_001).reshape(1, -1)
    out = z.copy()
    bias_sigmoid(out, np.zeros(z.shape[1]), np.empty(z.shape[1]))
    ref = naive.sigmoid(z)
    assert np.max(np.abs(out - ref) / ref) < 4e-16


def test_quadratic_delta(rng):
    a, y = rng.random((9, 4)), rng.random((9, 4))
    d = np.empty_like(a)
    loss = quadratic_delta(a, y, d)
    np.testing.assert_array_equal(d, a - y)
    assert loss == pytest.approx(0.5 * np.sum((a - y) ** 2) / 9, rel=1e-14)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", [0, 500, 1022])
def test_all_finite_finds_every_position(bad, where):
    x = np.ones(1023)
    assert all_finite(x)
    x[where] = bad
    assert not all_finite(x)
    assert not all_finite(x.astype(np.float32))


def test_sgd_step_applies_or_leaves_untouched(rng):
    p, g = rng.standard_normal(50), rng.standard_normal(50)
    ref = p - 0.5 * g
    assert sgd_step(p, g, 0.5)
    np.testing.assert_array_equal(p, ref)
    g[7] = np.nan
    before = p.copy()
    assert not sgd_step(p, g, 0.5)
    np.testing.assert_array_equal(p, before)
    g[7] = 1e308
    assert not sgd_step(p, g, 1e10)                    # overflow to inf is refused too
    np.testing.assert_array_equal(p, before)


def test_kernels_refuse_shapes_that_do_not_chain(rng):
    a_in, w, b = _layer(rng, 4, 5, 3, np.float64)
    with pytest.raises(ValueError, match="do not chain"):
        dense_forward(a_in, w, b, np.empty(3), np.empty((4, 2)))
    with pytest.raises(ValueError):
        dense_forward(a_in, w, b, np.empty(1), np.empty((4, 3)))   # scratch too short
    with pytest.raises(ValueError, match="do not chain"):
        dense_backward(a_in, np.empty((4, 3)), w, np.empty((4, 2)), 0.25, np.empty(3),
                       np.empty((3, 5)), np.empty(3), np.empty((4, 5)))
