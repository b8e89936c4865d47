"""Which ATen ops the compiler fuses, and the Triton expression of each (one entry a line).

An emitter gets the op's arguments bound by name (tensors as the names of kernel values, already
cast to the op's compute type; numbers as Python literals) and returns one expression. Values are
computed in float32 for every floating dtype up to 32 bits (float64 stays float64), integers in
their own type, booleans as ``tl.int1``; rounding to the stored dtype happens once, at the store,
as Inductor does, except for an explicit cast to a narrower float, which rounds where it is written.
"""
from __future__ import annotations

import math

import torch

__all__ = ["POINTWISE", "REDUCTIONS", "VIEWS", "CONSTANTS", "COMPARE", "NARROW_FLOATS", "ROUNDS_ITS_OPERANDS",
           "compute_type", "literal", "tl_type"]

_TL = {
    torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16", torch.float32: "tl.float32",
    torch.float64: "tl.float64", torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.int16: "tl.int16",
    torch.int32: "tl.int32", torch.int64: "tl.int64", torch.bool: "tl.int1",
}
SUPPORTED_DTYPES = frozenset(_TL)
#: Floats held in float32 inside a kernel: rounded to their own type where they are stored.
NARROW_FLOATS = frozenset({torch.float16, torch.bfloat16})


def tl_type(dtype: torch.dtype) -> str:
    return _TL[dtype]


def compute_type(dtype: torch.dtype) -> str:
    """The type a value of ``dtype`` is held in inside a kernel."""
    if dtype in (torch.float16, torch.bfloat16, torch.float32):
        return "tl.float32"
    return _TL[dtype]


def literal(value) -> str:
    """A Python number as Triton source."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return 'float("nan")'
    if value == 0.0 and math.copysign(1.0, value) < 0:
        return 'float("-0.0")'  # Triton folds the literal -0.0 to +0.0 (x / -0.0 gave +inf)
    if math.isinf(value):
        return 'float("inf")' if value > 0 else 'float("-inf")'
    return repr(float(value))


# ---------------------------------------------------------------------------------------------
# Pointwise emitters. ``a`` is the bound-argument dict (schema names -> source strings).


def _alpha(a, key="alpha"):
    alpha = a.get(key)
    return "" if alpha in (None, "1", "1.0") else f" * {alpha}"


def _pow(a):
    """x ** e for the exponents that have an exact short expression; None refuses the op."""
    x, e = a["self"], a["exponent"]
    try:
        ev = float(e.replace('float("', "").replace('")', "")) if not e.startswith("v") else None
    except ValueError:
        ev = None
    # ATen computes the exponents 0.5 and -0.5 as sqrt and rsqrt too (pow(-inf, 0.5) is NaN there)
    # pow(nan, 0) = pow(inf, 0) = 1, where x * 0 + 1 would be NaN
    table = {0.0: f"tl.where({x} != {x}, 1, 1).to({x}.dtype)", 1.0: f"{x}", 2.0: f"({x} * {x})",
             3.0: f"({x} * {x} * {x})",
             4.0: f"(({x} * {x}) * ({x} * {x}))", 0.5: f"tl.sqrt({x})", -0.5: f"tl.rsqrt({x})",
             -1.0: f"(1.0 / {x})", -2.0: f"(1.0 / ({x} * {x}))"}
    return table.get(ev)


def _pow_scalar_base(a):
    base = a["self"]
    if base == "2.0" or base == "2":
        return f"tl.exp2({a['exponent']})"
    return f"tl.exp({a['exponent']} * {literal(math.log(float(base)))})" if float(base) > 0 else None


def _clamp(a):
    x, lo, hi = a["self"], a.get("min"), a.get("max")
    # NaN passes through clamp, as in PyTorch, from x and from a bound: compare, never min/max
    if lo not in (None, "None"):
        x = f"tl.where(({x} < {lo}) | ({lo} != {lo}), {lo}, {x})"
    if hi not in (None, "None"):
        x = f"tl.where(({x} > {hi}) | ({hi} != {hi}), {hi}, {x})"
    return x


#: A literal zero divisor, as ``literal`` writes it, and the infinity of its sign: x / ±0 is
#: x * ±inf for every x (NaN at 0 and NaN alike); Triton drops the sign of a literal -0.0.
_ZERO_DIVISORS = {"0": 'float("inf")', "0.0": 'float("inf")', 'float("-0.0")': 'float("-inf")'}


def _quotient(a) -> str:
    x, y = a["self"], a["other"]
    return f"{x} * {_ZERO_DIVISORS[y]}" if y in _ZERO_DIVISORS else f"{x} / {y}"


def _div_mode(a):
    mode = a.get("rounding_mode")
    q = _quotient(a)
    if mode in (None, "None"):
        return q
    narrow = a.get("kl_narrow")
    if narrow and mode == "'trunc'":  # ATen divides two halves into a half, then truncates that
        q = f"({q}).to({narrow}).to(tl.float32)"
    if a.get("kl_integer"):  # a nonzero constant divisor (fusion refuses others)
        return {"'floor'": f"klm.int_div_floor({a['self']}, {a['other']})",
                "'trunc'": f"klm.int_div_trunc({a['self']}, {a['other']})"}.get(mode)
    if a["other"] in _ZERO_DIVISORS:  # ATen: a / b where b is 0, in both modes
        return {"'floor'": q, "'trunc'": f"klm.trunc({q})"}.get(mode)
    return {"'floor'": f"klm.div_floor({a['self']}, {a['other']})", "'trunc'": f"klm.trunc({q})"}.get(mode)


def _where(a):
    return f"tl.where({a['condition']}, {a['self']}, {a['other']})"


def _cast(a):
    # the value arrives in its compute type; the cast itself is done by codegen (it knows both types)
    return a["self"] if "self" in a else a["a"]


def _minmax(fn):
    def emit(a):
        x, y = a["self"], a["other"]
        cmp = "<" if fn == "min" else ">"
        # NaN wins, as in torch.maximum/minimum
        return f"tl.where(({x} {cmp} {y}) | ({x} != {x}), {x}, {y})"
    return emit


POINTWISE = {
    "aten.add.Tensor": lambda a: f"{a['self']} + {a['other']}{_alpha(a)}",
    "aten.add.Scalar": lambda a: f"{a['self']} + {a['other']}{_alpha(a)}",
    "aten.sub.Tensor": lambda a: f"{a['self']} - {a['other']}{_alpha(a)}",
    "aten.sub.Scalar": lambda a: f"{a['self']} - {a['other']}{_alpha(a)}",
    "aten.rsub.Scalar": lambda a: f"{a['other']} - {a['self']}{_alpha(a)}",
    "aten.mul.Tensor": lambda a: f"{a['self']} * {a['other']}",
    "aten.mul.Scalar": lambda a: f"{a['self']} * {a['other']}",
    "aten.div.Tensor": _quotient,
    "aten.div.Scalar": _quotient,
    "aten.div.Tensor_mode": _div_mode,
    "prims.div.default": _quotient,
    "aten.neg.default": lambda a: f"-{a['self']}",
    "aten.abs.default": lambda a: f"tl.abs({a['self']})",
    "aten.exp.default": lambda a: f"tl.exp({a['self']})",
    "aten.exp2.default": lambda a: f"tl.exp2({a['self']})",
    "aten.expm1.default": lambda a: f"klm.expm1({a['self']})",
    "aten.log.default": lambda a: f"tl.log({a['self']})",
    "aten.log2.default": lambda a: f"tl.log2({a['self']})",
    "aten.log1p.default": lambda a: f"klm.log1p({a['self']})",
    "aten.sqrt.default": lambda a: f"tl.sqrt({a['self']})",
    "aten.rsqrt.default": lambda a: f"tl.rsqrt({a['self']})",
    "aten.reciprocal.default": lambda a: f"1.0 / {a['self']}",
    "aten.sin.default": lambda a: f"tl.sin({a['self']})",
    "aten.cos.default": lambda a: f"tl.cos({a['self']})",
    "aten.tanh.default": lambda a: f"klm.tanh({a['self']})",
    "aten.sigmoid.default": lambda a: f"tl.sigmoid({a['self']})",
    "aten.erf.default": lambda a: f"tl.erf({a['self']})",
    "aten.floor.default": lambda a: f"tl.floor({a['self']})",
    "aten.ceil.default": lambda a: f"tl.ceil({a['self']})",
    "aten.trunc.default": lambda a: f"klm.trunc({a['self']})",
    "aten.round.default": lambda a: f"klm.round_half_even({a['self']})",
    "aten.sign.default": lambda a: f"klm.sign({a['self']})",
    "aten.relu.default": lambda a: f"tl.where({a['self']} < 0, 0, {a['self']})",
    "aten.pow.Tensor_Scalar": _pow,
    "aten.pow.Scalar": _pow_scalar_base,
    "aten.maximum.default": _minmax("max"),
    "aten.minimum.default": _minmax("min"),
    "aten.clamp.default": _clamp,
    "aten.clamp.Tensor": _clamp,
    "aten.clamp_min.default": lambda a: _clamp({"self": a["self"], "min": a["min"]}),
    "aten.clamp_max.default": lambda a: _clamp({"self": a["self"], "max": a["max"]}),
    "aten.where.self": _where,
    "aten.isnan.default": lambda a: f"{a['self']} != {a['self']}",
    "aten.logical_not.default": lambda a: f"{a['self']} == 0",
    "aten.bitwise_not.default": lambda a: f"{a['self']} == 0",  # only fused for bool (see fusion)
    "aten.logical_and.default": lambda a: f"({a['self']} != 0) & ({a['other']} != 0)",
    "aten.logical_or.default": lambda a: f"({a['self']} != 0) | ({a['other']} != 0)",
    "aten.bitwise_and.Tensor": lambda a: f"{a['self']} & {a['other']}",
    "aten.bitwise_or.Tensor": lambda a: f"{a['self']} | {a['other']}",
    # casts and copies: the value is converted between compute types by codegen
    "prims.convert_element_type.default": _cast,
    "aten._to_copy.default": _cast,
    "aten.clone.default": _cast,
    "aten.alias.default": _cast,
    "aten.lift_fresh_copy.default": _cast,
}

COMPARE = {
    "aten.eq.Tensor": "==", "aten.eq.Scalar": "==", "aten.ne.Tensor": "!=", "aten.ne.Scalar": "!=",
    "aten.lt.Tensor": "<", "aten.lt.Scalar": "<", "aten.le.Tensor": "<=", "aten.le.Scalar": "<=",
    "aten.gt.Tensor": ">", "aten.gt.Scalar": ">", "aten.ge.Tensor": ">=", "aten.ge.Scalar": ">=",
}
for _name, _op in COMPARE.items():
    POINTWISE[_name] = (lambda op: lambda a: f"{a['self']} {op} {a['other']}")(_op)

#: Ops whose result jumps where their input crosses a value (comparisons, floor and its kin): a
#: float16/bfloat16 operand computed in the kernel is rounded to its own type first, as eager's
#: stored operand is. Unrounded, a max's backward recomputing ``x * w`` in float32 compared it
#: with the float16 maximum it was taken from, never equal: 0 matches, and 0/0 gradients (NaN).
ROUNDS_ITS_OPERANDS = frozenset(COMPARE) | {"aten.floor.default", "aten.ceil.default", "aten.trunc.default",
                                            "aten.round.default", "aten.sign.default"}

# Ops whose tensor operands keep their own type (no promotion to the result's type).
NO_PROMOTION = {"aten.where.self", "prims.convert_element_type.default", "aten._to_copy.default",
                "aten.clone.default", "aten.alias.default", "aten.lift_fresh_copy.default",
                "aten.isnan.default", "aten.logical_not.default", "aten.logical_and.default",
                "aten.logical_or.default"}

# Reductions over the last dim: op -> (kind, arg name of the dims, keepdim arg or None for prims).
REDUCTIONS = {
    "aten.sum.dim_IntList": ("sum", "dim", "keepdim"),
    "aten.mean.dim": ("mean", "dim", "keepdim"),
    "aten.amax.default": ("max", "dim", "keepdim"),
    "aten.amin.default": ("min", "dim", "keepdim"),
    "aten.var.correction": ("var", "dim", "keepdim"),
    "prims.sum.default": ("sum", "dims", None),
    "prims.var.default": ("var", "dims", None),
}

# Views that only add or drop size-1 dims, or broadcast, are free inside a kernel; other views
# run as ATen (they launch nothing) and make their input a materialized tensor.
VIEWS = {
    "aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.squeeze.dim",
    "aten.squeeze.dims", "aten.squeeze.default", "aten.unsqueeze.default", "aten.expand.default",
    "prims.broadcast_in_dim.default",
}

# Factories of one value, inlined as a literal into the kernels that read them.
CONSTANTS = {"aten.scalar_tensor.default", "aten.full.default"}
