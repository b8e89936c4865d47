"""Jitted math helpers the generated kernels call (``klm.tanh(x)``) where ``triton.language`` has
no single instruction. Written from core ``tl`` ops, so they run under Triton's interpreter (which
has no libdevice); on the GPU, tanh, expm1 and log1p call libdevice instead (what Inductor and
eager's CUDA kernels call): the core-op tanh left a 5-op chain with it at 88% of copy bandwidth
against Inductor's 95% (``chain5`` in the compiler suite). ``GPU`` is a constexpr, so the branch
not taken is never compiled (GPU) or run (interpreter). Inputs and results are float32 or float64.
"""
from __future__ import annotations

import os

import triton
import triton.language as tl
from triton.language.extra import libdevice

#: Compiled for a GPU (Triton's interpreter off when this module was imported).
GPU = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") != "1")


@triton.jit
def tanh(x):
    """tanh(x) = sign(x) (1 - e^{-2|x|}) / (1 + e^{-2|x|}); an odd Taylor series below |x| < 0.3,
    where 1 - e^{-2|x|} would cancel (the series' first dropped term is below 2e-8 relative)."""
    if GPU:
        return libdevice.tanh(x)
    a = tl.abs(x)
    t = tl.exp(-2.0 * a)
    big = (1.0 - t) / (1.0 + t)
    x2 = x * x
    small = x * (1.0 + x2 * (-0.3333333333333333 + x2 * (0.13333333333333333 + x2 * (
        -0.05396825396825397 + x2 * 0.021869488536155203))))
    return tl.where(a < 0.3, small, tl.where(x < 0.0, -big, big))


@triton.jit
def expm1(x):
    """e^x - 1 without cancellation near 0 (Kahan: (u - 1) x / log u with u = e^x)."""
    if GPU:
        return libdevice.expm1(x)
    u = tl.exp(x)
    um1 = u - 1.0
    r = tl.where(um1 == 0.0, x, um1 * x / tl.log(u))
    # past |x| = 1 there is no cancellation left to avoid, and (u - 1) x would overflow near x = 88
    r = tl.where(tl.abs(x) > 1.0, um1, r)
    return tl.where(u == float("inf"), u, tl.where(um1 == -1.0, -1.0, r))


@triton.jit
def log1p(x):
    """log(1 + x) without cancellation near 0 (Kahan: log(u) x / (u - 1) with u = 1 + x)."""
    if GPU:
        return libdevice.log1p(x)
    u = 1.0 + x
    return tl.where(u == 1.0, x, tl.where(u == float("inf"), u, tl.log(u) * x / (u - 1.0)))


@triton.jit
def sign(x):
    # torch: (0 < x) - (x < 0), so sign(NaN) = 0 (not NaN) and sign(-0.0) = 0
    return tl.where(x > 0, 1.0, tl.where(x < 0, -1.0, 0.0)).to(x.dtype)


@triton.jit
def isnan(x):
    return x != x


@triton.jit
def round_half_even(x):
    """torch.round: to nearest, ties to even. From the fraction x - floor(x), which is exact in
    binary floating point (floor(x + 0.5) is not: 0.49999997 + 0.5 rounds to 1.0 in float32)."""
    f = tl.floor(x)
    frac = x - f
    odd = (f - 2.0 * tl.floor(f * 0.5)) != 0.0
    up = (frac > 0.5) | ((frac == 0.5) & odd)
    return tl.where(up, f + 1.0, f)


@triton.jit
def int_div_floor(a, b):
    """torch.div(a, b, rounding_mode="floor") of integers (Python's ``//``), whatever ``//`` and
    ``%`` mean in the backend (C's truncation on the GPU; the interpreter may floor): with
    q = a // b and r = a - q * b, a remainder whose sign is not b's means q was truncated
    toward zero, one above the floor. b is a nonzero constant (``fusion`` refuses others)."""
    q = a // b
    r = a - q * b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), q - 1, q)


@triton.jit
def int_div_trunc(a, b):
    """torch.div(a, b, rounding_mode="trunc") of integers (C's ``/``), whatever the backend's
    ``//`` means: a remainder whose sign is not a's means q was floored, one below the
    truncation. b is a nonzero constant."""
    q = a // b
    r = a - q * b
    return tl.where((r != 0) & ((r < 0) != (a < 0)), q + 1, q)


@triton.jit
def div_floor(a, b):
    """torch.div(a, b, rounding_mode="floor") of floats, computed as ATen does (div_floor_floating):
    from the exact remainder fmod(a, b) (Triton's % of floats), not as floor(a / b), which rounds
    first: 1.0 // 0.1 is 9 (1.0 / 0.1 rounds to 10), inf // 3 is NaN, x // 0 is x / 0."""
    q = a / b
    mod = a % b
    div = (a - mod) / b
    div = tl.where((mod != 0.0) & ((b < 0.0) != (mod < 0.0)), div - 1.0, div)
    fl = tl.floor(div)
    fl = tl.where(div - fl > 0.5, fl + 1.0, fl)
    # a zero quotient keeps the sign of a / b (copysign(0, a / b)); 1 / -0.0 is -inf
    negative = (q < 0.0) | ((q == 0.0) & (1.0 / q < 0.0))
    zero = tl.where(negative, -0.0, 0.0)
    return tl.where(b == 0.0, q, tl.where(div != 0.0, fl, zero))


@triton.jit
def trunc(x):
    return tl.where(x < 0, tl.ceil(x), tl.floor(x))


@triton.jit
def maximum_nan(a, b):
    """Elementwise max where a NaN, once seen, stays (torch.amax propagates NaN)."""
    return tl.where((b > a) | (b != b), b, a)


@triton.jit
def minimum_nan(a, b):
    return tl.where((b < a) | (b != b), b, a)


@triton.jit
def max_rows(v):
    """Max along axis 1, NaN if the row holds one (tl.max alone does not promise that)."""
    has_nan = tl.max((v != v).to(tl.int32), axis=1)
    return tl.where(has_nan > 0, float("nan"), tl.max(v, axis=1))


@triton.jit
def min_rows(v):
    has_nan = tl.max((v != v).to(tl.int32), axis=1)
    return tl.where(has_nan > 0, float("nan"), tl.min(v, axis=1))


@triton.jit
def welford_combine(mean_a, m2_a, n_a, mean_b, m2_b, n_b):
    """Chan's merge of two sets' (mean, sum of squared deviations, count): the mean moves by the
    means' difference weighted by the second set's share, and M2 gains that difference squared
    times n_a * n_b / n. Exact in exact arithmetic and free of the cancellation of
    ``sum(x^2) - sum(x)^2 / n``; an empty set (count 0) changes nothing."""
    n = n_a + n_b
    share = tl.where(n == 0, 0.0, n_b / tl.where(n == 0, 1.0, n))
    delta = mean_b - mean_a
    return mean_a + delta * share, m2_a + m2_b + delta * delta * n_a * share, n


@triton.jit
def welford_columns(mean, m2, n):
    """The lanes of [rows, columns] Welford accumulators merged along axis 0 (each column's
    statistics over every lane), as [1, columns]."""
    mean, m2, n = tl.reduce((mean, m2, n), 0, welford_combine)
    return mean[None, :], m2[None, :], n[None, :]
