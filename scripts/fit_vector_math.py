#!/usr/bin/env python3
"""Fits the polynomial coefficients of src/kernels/cpu/vector_math.h.

Each approximation is fitted for the smallest maximum (relative, or weighted)
error over its interval with Lawson's algorithm: weighted least squares on
Chebyshev nodes, each round multiplying the weights by the errors, which
converges towards the minimax polynomial. The references are Python's double
precision math functions, far more accurate than the f32 results need.

Run it with numpy installed; it prints each polynomial (lowest degree first)
and the error of the fit itself. The error of the f32 code is measured by
tests/kernels/vector_math_test.cc, not here.
"""
import math

import numpy as np


def chebyshev_nodes(lo, hi, count):
    k = np.arange(count)
    return (lo + hi) / 2 + (hi - lo) / 2 * np.cos(np.pi * (k + 0.5) / count)


def fit(x, target, degree, weight=None, rounds=200):
    """Coefficients c (lowest first) minimising max |sum c_k x^k - target| * weight."""
    weight = np.ones_like(x) if weight is None else weight
    basis = np.stack([x**k for k in range(degree + 1)], axis=1)
    lawson = np.full_like(x, 1 / len(x))
    for _ in range(rounds):
        row = np.sqrt(lawson) * weight
        coefficients, *_ = np.linalg.lstsq(basis * row[:, None], target * row, rcond=None)
        error = np.abs(basis @ coefficients - target) * weight
        lawson = lawson * error
        lawson /= lawson.sum()
    return coefficients, error.max()


def show(name, coefficients, error, what, digits=9):
    print(f"{name}: max {what} error of the fit {error:.2e}")
    for c in coefficients:
        print(f"  {c:.{digits}e}")


vectorize = np.vectorize

# exp and expm1: e^r - 1 = r + r^2 P(r) on [-ln2/2, ln2/2]; relative to e^r - 1.
r = chebyshev_nodes(-math.log(2) / 2, math.log(2) / 2, 4000)
expm1 = vectorize(math.expm1)(r)
c, e = fit(r, (expm1 - r) / r**2, 5, weight=r**2 / np.abs(expm1))
show("expm1 P(r), degree 5", c, e, "relative")

# log and log1p: log1p(f) = f - f^2/2 + f^3 P(f) on [-0.25, 0.5] (the mantissa
# reduced to [0.75, 1.5)); relative to log1p(f).
f = chebyshev_nodes(-0.25, 0.5, 4000)
log1p = vectorize(math.log1p)(f)
c, e = fit(f, (log1p - f + f * f / 2) / f**3, 8, weight=np.abs(f**3 / log1p))
show("log1p P(f), degree 8", c, e, "relative")

# erf, small |u|: erf(u) = u E(u^2) for |u| < 0.935 (erf switches to L at
# 0.921875, Gelu at x / sqrt(2) = 0.919); relative.
v = chebyshev_nodes(0, 0.935**2, 4000)
u = np.sqrt(v)
c, e = fit(v, vectorize(math.erf)(u) / u, 6, weight=u / vectorize(math.erf)(u))
show("erf E(v), degree 6", c, e, "relative")

# erf, large |u|: erfc(u) = exp(L(u)) on [0.9, 3.925] (above 3.925 erf rounds
# to 1 in f32). Weighted by erfc/erf: the error that reaches erf.
u = chebyshev_nodes(0.9, 3.925, 6000)
erfc = vectorize(math.erfc)(u)
c, e = fit(u, np.log(erfc), 7, weight=erfc / vectorize(math.erf)(u))
show("log erfc L(u), degree 7", c, e, "weighted (relative to erf)")

# Gelu's tail, evaluated in double: Phi(-t) = exp(-t^2/2) G(t) for t in
# [0.6, 14.5], G a polynomial in s = 1 / (t + 1.5); relative.
t = chebyshev_nodes(0.6, 14.5, 8000)
g = vectorize(lambda t: 0.5 * math.erfc(t / math.sqrt(2)) * math.exp(t * t / 2))(t)
c, e = fit(1 / (t + 1.5), g, 11, weight=1 / g, rounds=300)
show("Gelu tail G(s), degree 11", c, e, "relative", digits=16)
