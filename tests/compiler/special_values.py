"""Edge values for checking generated pointwise code against eager PyTorch: the cases, the
inputs and the comparison, shared by the CPU tests (interpreter) and the GPU tests (CUDA eager as
the reference), so both check the same list.

Each case is a one-line function of one tensor. Inputs hold the values where kernels and ATen part
ways: signed zeros, NaN, infinities, float32 extremes, halves (ties of rounding), integers at the
edges of their types and past float32's 2**24, and random values. A case passes when NaN and
infinity positions are equal and finite values agree to the dtype's rounding (integers exactly).
Found this way (2026-12-04) and fixed: ``round`` of 0.49999997, ``div(x, 0.1, rounding_mode="floor")``
(floor of the rounded quotient), ``inf // 3``, ``3 ** int``, ``round``/``floor`` of integers,
``x / -0.0``, ``x ** 0`` of NaN and inf, a NaN clamp bound, int64 meeting float16 (rounded to
float16 first in ATen), uint8 with negative numbers, ``expm1(88)`` under the interpreter.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["FLOAT_CASES", "INT_CASES", "MIXED_CASES", "differs", "edge_values"]

_FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, 3.0, 1e-30, -1e-30, 1e30, -1e30, math.nan,
           math.inf, -math.inf, 88.0, -88.0, 100.0, -100.0, 7.0, 1e-8, 0.49999997, -0.49999997,
           8388609.0, 16777217.0, 0.1, 1.0000001, 65504.0, 65520.0, 2049.0]
_INTS = [0, 1, -1, 2, -2, 3, -3, 7, -7, 100, -100, 2**31 - 1, -2**31, 2**40 + 1, -(2**40 + 3), 12345678901,
         2049, 2**24 + 1, 255, 127, -128]


def edge_values(dtype: torch.dtype, n_random: int = 48, seed: int = 0, device="cpu") -> torch.Tensor:
    """The edge values that ``dtype`` can hold, then ``n_random`` random ones, as a 1-d tensor."""
    gen = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        random = torch.randn(n_random, generator=gen, dtype=torch.float64) * 3
        values = torch.cat([torch.tensor(_FLOATS, dtype=torch.float64), random]).to(dtype)
    elif dtype == torch.bool:
        values = torch.randint(0, 2, (n_random,), generator=gen).bool()
    else:
        info = torch.iinfo(dtype)
        edges = torch.tensor([v for v in _INTS if info.min <= v <= info.max], dtype=torch.int64)
        random = torch.randint(max(info.min, -50), 50, (n_random,), generator=gen)
        values = torch.cat([edges, random]).to(dtype)
    return values.to(device)


#: Relative agreement of finite values, per dtype (a few units in the last place).
_RTOL = {torch.float16: 8e-3, torch.bfloat16: 4e-2, torch.float32: 1e-5, torch.float64: 1e-11}


def differs(got: torch.Tensor, want: torch.Tensor) -> str:
    """'' when ``got`` matches ``want`` (NaN and infinity positions exactly, finite values to the
    dtype's rounding, integers and booleans exactly), else what differs, in one line."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"dtype/shape {got.dtype}{tuple(got.shape)}, eager {want.dtype}{tuple(want.shape)}"
    got, want = got.cpu().reshape(-1), want.cpu().reshape(-1)
    if not want.is_floating_point():
        bad = (got != want).nonzero()
        return f"at {bad[0].item()}: {got[bad[0]].item()}, eager {want[bad[0]].item()}" if len(bad) else ""
    g, w = got.double(), want.double()
    special = w.isnan() | w.isinf() | g.isnan() | g.isinf()
    same_special = (g.isnan() == w.isnan()) & (g.isinf() == w.isinf()) & (~w.isinf() | (g == w))
    bad = (special & ~same_special).nonzero()
    if len(bad):
        i = bad[0].item()
        return f"at {i}: {got[i].item()}, eager {want[i].item()}"
    rtol = _RTOL[want.dtype]
    err = (g - w).abs() / (w.abs() + rtol)
    err[special] = 0
    if err.max() > rtol:
        i = err.argmax().item()
        return f"at {i}: {got[i].item()}, eager {want[i].item()} (relative {err[i].item():.1e})"
    return ""


#: Unary cases over floats: name -> function. Left out, with the reason: gelu(inf) (eager's CPU
#: kernel gives NaN, CUDA's inf), tanh-based ops near cancellation in float16/float64 (eager
#: rounds the tanh first; the interpreter's tanh is float32-accurate), pow(-inf, 0.5) in float16
#: (eager's CPU takes another path for float16 than for float32).
FLOAT_CASES = {
    "abs": torch.abs, "neg": torch.neg, "exp": torch.exp, "exp2": torch.exp2, "expm1": torch.expm1,
    "log": torch.log, "log2": torch.log2, "log1p": torch.log1p, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
    "reciprocal": torch.reciprocal, "sin": torch.sin, "cos": torch.cos, "sigmoid": torch.sigmoid,
    "erf": torch.erf, "floor": torch.floor, "ceil": torch.ceil, "trunc": torch.trunc, "round": torch.round,
    "sign": torch.sign, "relu": torch.relu, "silu": F.silu, "softplus": F.softplus, "elu": F.elu,
    "leaky_relu": F.leaky_relu, "hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid,
    "pow_2": lambda x: x ** 2, "pow_3": lambda x: x ** 3, "pow_0": lambda x: x ** 0, "pow_-1": lambda x: x ** -1,
    "2_pow": lambda x: 2 ** x, "10_pow": lambda x: 10 ** x.clamp(-30, 30),
    "clamp": lambda x: x.clamp(-1, 1), "clamp_nan_bound": lambda x: x.clamp(min=float("nan")),
    "isnan": torch.isnan, "isinf": torch.isinf, "isfinite": torch.isfinite, "nan_to_num": torch.nan_to_num,
    "div_floor": lambda x: torch.div(x, 3, rounding_mode="floor"),
    "div_floor_tenth": lambda x: torch.div(x, 0.1, rounding_mode="floor"),
    "div_trunc": lambda x: torch.div(x, 3, rounding_mode="trunc"), "floordiv": lambda x: x // 2.5,
    "div_zero": lambda x: x / 0.0, "div_neg_zero": lambda x: x / -0.0,
    "floordiv_neg_zero": lambda x: torch.div(x, -0.0, rounding_mode="floor"),
    "maximum_nan": lambda x: torch.maximum(x, x.flip(0)), "minimum_nan": lambda x: torch.minimum(x, x.flip(0)),
    "where": lambda x: torch.where(x > 0, x, -2 * x), "compare": lambda x: (x >= 1.0) | (x == 0),
    "to_int": lambda x: x.clamp(-6e4, 6e4).to(torch.int32), "to_bool": lambda x: x.bool(),
}

#: Unary cases over integers (their own arithmetic: exact).
INT_CASES = {
    "abs": torch.abs, "neg": torch.neg, "sign": torch.sign, "square": lambda x: x * x,
    "div_true": lambda x: x / 3, "div_floor": lambda x: torch.div(x, 3, rounding_mode="floor"),
    "div_trunc": lambda x: torch.div(x, 3, rounding_mode="trunc"), "floordiv_neg": lambda x: x // -7,
    "remainder": lambda x: x % 7, "pow_2": lambda x: x ** 2, "2_pow": lambda x: 2 ** x.clamp(0, 30),
    "3_pow": lambda x: 3 ** x.clamp(0, 19), "floor": torch.floor, "round": torch.round,
    "clamp": lambda x: x.clamp(-5, 5), "to_float": lambda x: x.float(), "to_half": lambda x: x.half(),
    "bitwise": lambda x: (x & 6) | 1, "compare_negative": lambda x: x < -2, "add_negative": lambda x: x + -3,
    "where_negative": lambda x: torch.where(x > 3, x, -2),
}

#: Two-tensor cases: (name, function, dtype of x, dtype of y); y is x's values flipped.
MIXED_CASES = [
    ("int64_plus_half", torch.add, torch.int64, torch.float16),
    ("half_times_int32", torch.mul, torch.float16, torch.int32),
    ("int64_eq_half", torch.eq, torch.int64, torch.float16),
    ("int64_div_trunc_half", lambda x, y: torch.div(x, y, rounding_mode="trunc"), torch.int64, torch.float16),
    ("float_clamp_by_tensor", lambda x, y: torch.clamp(x, min=y), torch.float32, torch.float32),
    ("int_clamp_by_float", lambda x, y: torch.clamp(x, min=y), torch.int32, torch.float32),
    ("float_div_floor_tensor", lambda x, y: torch.div(x, y, rounding_mode="floor"), torch.float32, torch.float32),
    ("half_where_int", lambda x, y: torch.where(x > 0, x, y), torch.float16, torch.int64),
]
