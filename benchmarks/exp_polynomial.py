"""Derive the exp polynomials of ``kernels/activations.py`` (needs ``pip install mpmath``).

Chebyshev interpolants of exp on ``|r| <= ln(2)/2`` (widened by 1e-4 for the reduction's own
rounding), at 60 digits, then rounded to the kernel's dtype.  Prints the coefficients, lowest
degree first, and the interpolation error that the kernel's accuracy tests then check in full.

    python benchmarks/exp_polynomial.py
"""
import mpmath as mp
import numpy as np


def coefficients(degree, dtype):
    mp.mp.dps = 60
    h = mp.log(2) / 2 * mp.mpf("1.0001")
    poly, err = mp.chebyfit(mp.exp, [-h, h], degree + 1, error=True)
    return [dtype(float(c)) for c in reversed(poly)], float(err)


if __name__ == "__main__":
    for degree, dtype in ((11, np.float64), (6, np.float32)):
        coeffs, err = coefficients(degree, dtype)
        print(f"{np.dtype(dtype).name} degree {degree}: error {err:.2e}")
        print("   ", ", ".join(repr(float(c)) for c in coeffs))
