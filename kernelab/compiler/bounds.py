"""The range of values a graph node can hold, proved from how the graph computes it.

A gather (``x[..., ih, iw]``) may become a load inside a generated kernel only when its indices
are known to lie within the source's sizes: a kernel has no cheap way to raise on a bad index
(Triton compiles ``tl.device_assert`` out unless debugging), so an out-of-range index would read
another tensor's memory and return a wrong answer silently. Indices that the graph computes from
aranges and constants (interpolation's source pixels: ``trunc(clamp((arange(10) + 0.5) * 0.5 -
0.5, 0))``, the clamps of bicubic's sixteen neighbours) or that an op returns by definition
(a sort's or a top-k's positions) have ranges this module proves; indices that come from the data
(token ids, a user's index tensor) have none, and their gathers stay ATen's, which checks them.

Interval arithmetic over a small set of ops: every result is an inclusive (low, high) pair of
Python floats, or None for "unknown". Float arithmetic is widened by a relative slack so that the
proof holds for float32 rounding too (a bound of 4.25 in exact arithmetic is 4.25 +- a few ulps in
the kernel; truncated, both are 4).
"""
from __future__ import annotations

import math
import operator

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

__all__ = ["bounds", "within", "of_outputs", "assume_for_inputs"]

aten = torch.ops.aten

#: relative widening of a bound computed in floating point (float32's epsilon is 1.2e-7; a chain of
#: a few ops stays well inside 1e-5)
SLACK = 1e-5

_SAME = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.unsqueeze.default,
         aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.expand.default, aten.clone.default,
         aten.alias.default, aten.permute.default, aten.slice.Tensor, aten.select.int,
         aten.t.default, aten.transpose.int, aten.contiguous.default,
         aten.flip.default,  # (a flip reorders the values: the same range; ``torch.flip``'d aranges)
         aten.index_select.default}  # (picks some of its source's values: the flip of ``rewrites.flips_as_gathers``)
_CASTS = {aten._to_copy.default, torch.ops.prims.convert_element_type.default}
_ARANGES = {aten.arange.default, aten.arange.start, aten.arange.start_step}
_ROUNDING = {aten.floor.default: math.floor, aten.ceil.default: math.ceil, aten.trunc.default: math.trunc,
             aten.round.default: round}


def within(node, size) -> bool:
    """Every value of ``node`` (an integer index) lies in [0, size): proved, not sampled. A
    symbolic size proves nothing (comparing with it would add a guard)."""
    found = bounds(node)
    return isinstance(size, int) and found is not None and found[0] >= 0 and found[1] <= size - 1


def bounds(node) -> tuple[float, float] | None:
    """(low, high) of every value ``node`` holds (a number: itself), or None when not proved."""
    if isinstance(node, bool):
        return (float(node), float(node))
    if isinstance(node, (int, float)):
        return (float(node), float(node)) if math.isfinite(node) else None
    if not isinstance(node, fx.Node):
        return None
    if "kl_bounds" not in node.meta:
        node.meta["kl_bounds"] = _representable(node, _bounds(node))
    return node.meta["kl_bounds"]


def _representable(node, found):
    """None where an integer result's proved range leaves its type's: the arithmetic wrapped (or a
    float was cast out of range), and the interval no longer describes the values."""
    val = _value(node)
    if found is None or not isinstance(val, torch.Tensor) or val.is_floating_point() or val.dtype == torch.bool:
        return found
    info = torch.iinfo(val.dtype)
    return found if info.min <= found[0] and found[1] <= info.max else None


def _value(node):
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def _is_float(node) -> bool:
    val = _value(node)
    return isinstance(val, torch.Tensor) and val.is_floating_point()


def _bounds(node: fx.Node) -> tuple[float, float] | None:
    if node.op == "get_attr":
        return _arange_buffer(node)
    if node.op != "call_function":
        return None
    target, args = node.target, node.args
    if target is operator.getitem:
        return _positions(args[0], args[1])
    if target in _SAME:
        return bounds(args[0])
    if target in _ARANGES:
        return _arange(node)
    if target in (aten.full.default, aten.scalar_tensor.default):
        return bounds(args[1] if target is aten.full.default else args[0])
    if target in _CASTS:
        return _cast(node, bounds(args[0]))
    if target in _ROUNDING:
        found = bounds(args[0])
        return None if found is None else (float(_ROUNDING[target](found[0])), float(_ROUNDING[target](found[1])))
    if target in (aten.argmax.default, aten.argmin.default):
        return _positions_along(args[0], args[1] if len(args) > 1 else None)
    if target in (aten.index_put_.default, aten.index_put.default):
        return _put(node)
    return _arithmetic(node)


def _put(node: fx.Node) -> tuple[float, float] | None:
    """``base[indices] = values`` (not accumulating): every element is the base's or a value.
    An empty base whose every slot is written (one index per slot, a sort's positions over as many
    slots: a permutation) holds only values: MoE routing's inverse permutation."""
    base, indices, values = node.args[:3]
    accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
    found = bounds(values)
    if accumulate or found is None:
        return None
    known = bounds(base)
    if known is not None:
        return (min(known[0], found[0]), max(known[1], found[1]))
    return found if _permutes(base, indices) else None


def _permutes(base, indices) -> bool:
    """Do ``indices`` write every slot of 1-d ``base`` once (the positions a 1-d sort returns)?"""
    if len(indices) != 1 or not isinstance(indices[0], fx.Node):
        return False
    index, base_val = indices[0], _value(base)
    if not (index.target is operator.getitem and index.args[1] == 1 and isinstance(index.args[0], fx.Node)
            and index.args[0].target in (aten.sort.default, aten.sort.stable)):
        return False
    sorted_val = _value(index.args[0].args[0])
    return (isinstance(base_val, torch.Tensor) and isinstance(sorted_val, torch.Tensor) and base_val.dim() == 1
            and sorted_val.dim() == 1 and base_val.shape[0] == sorted_val.shape[0])


def _arithmetic(node: fx.Node) -> tuple[float, float] | None:
    target, args, kwargs = node.target, node.args, node.kwargs
    if target in (aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar):
        a, b = bounds(args[0]), bounds(args[1])
        alpha = kwargs.get("alpha", 1)
        if a is None or b is None or not isinstance(alpha, (int, float)):
            return None
        b = _scale(b, alpha)
        if target in (aten.sub.Tensor, aten.sub.Scalar):
            b = (-b[1], -b[0])
        return _rounded(node, (a[0] + b[0], a[1] + b[1]))
    if target in (aten.mul.Tensor, aten.mul.Scalar):
        a, b = bounds(args[0]), bounds(args[1])
        if a is None or b is None:
            return None
        products = [x * y for x in a for y in b]
        return _rounded(node, (min(products), max(products)))
    if target in (aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default):
        return _clamp(node)
    if target in (aten.minimum.default, aten.maximum.default):
        a, b = bounds(args[0]), bounds(args[1])
        if a is None or b is None:
            return None
        pick = min if target is aten.minimum.default else max
        return (pick(a[0], b[0]), pick(a[1], b[1]))
    if target is aten.where.self:
        return _where(node)
    if target in _COMPARISONS:
        return (0.0, 1.0)
    if target is aten.abs.default:
        a = bounds(args[0])
        if a is None:
            return None
        low = 0.0 if a[0] <= 0.0 <= a[1] else min(abs(a[0]), abs(a[1]))
        return (low, max(abs(a[0]), abs(a[1])))
    if target is aten.neg.default:
        a = bounds(args[0])
        return None if a is None else (-a[1], -a[0])
    if target is aten.log.default:
        a = bounds(args[0])  # monotone; log(0) = -inf proves nothing
        return None if a is None or a[0] <= 0.0 else _rounded(node, (math.log(a[0]), math.log(a[1])))
    if target in (aten.div.Tensor, aten.div.Scalar) and _is_float(node):
        return _quotient(node, bounds(args[0]), bounds(args[1]))
    if target in (aten.div.Tensor_mode, aten.div.Scalar_mode, aten.floor_divide.default):
        return _divided(node)
    if target in (aten.remainder.Scalar, aten.remainder.Tensor) and not _is_float(node):
        n = bounds(args[1])
        return (0.0, n[0] - 1) if n is not None and n[0] == n[1] and n[0] >= 1 else None
    if target in (aten.fmod.Scalar, aten.fmod.Tensor) and not _is_float(node):
        return _fmod(bounds(args[0]), bounds(args[1]))
    return None


#: comparisons and logical ops: booleans, 0 or 1
_COMPARISONS = {aten.lt.Scalar, aten.lt.Tensor, aten.le.Scalar, aten.le.Tensor, aten.gt.Scalar, aten.gt.Tensor,
                aten.ge.Scalar, aten.ge.Tensor, aten.eq.Scalar, aten.eq.Tensor, aten.ne.Scalar, aten.ne.Tensor,
                aten.logical_and.default, aten.logical_or.default, aten.logical_not.default}


def _quotient(node, a, b) -> tuple[float, float] | None:
    """True division by a divisor whose range excludes 0 (the quotient is monotone in each
    operand on either side of it)."""
    if a is None or b is None or b[0] <= 0.0 <= b[1]:
        return None
    quotients = [x / y for x in a for y in b]
    return _rounded(node, (min(quotients), max(quotients)))


def _where(node: fx.Node) -> tuple[float, float] | None:
    """where(cond, a, b): the union of a's and b's ranges, each proved under its side of the
    condition where the condition compares a node with a constant. T5's relative-position buckets
    take ``where(p < max_exact, p, max_exact + log(p / max_exact) * ...)``: the log's argument is
    at least 1 only on the side where the where reads it (unconditionally, log(0) would prove
    nothing)."""
    cond, a, b = node.args[:3]
    sides = _condition_sides(cond)
    found = [None if side is False else _bounds_assuming(branch, side)
             for branch, side in zip((a, b), sides)]
    taken = [f for f, side in zip(found, sides) if side is not False]
    if not taken or any(f is None for f in taken):
        return None
    return (min(f[0] for f in taken), max(f[1] for f in taken))


_ORDERS = {aten.lt.Scalar: "lt", aten.lt.Tensor: "lt", aten.le.Scalar: "le", aten.le.Tensor: "le",
           aten.gt.Scalar: "gt", aten.gt.Tensor: "gt", aten.ge.Scalar: "ge", aten.ge.Tensor: "ge"}
_MIRRORED = {"lt": "gt", "gt": "lt", "le": "ge", "ge": "le"}  # c < x is x > c


def _condition_sides(cond) -> tuple:
    """(what holds where ``cond`` is true, where it is false): each None (nothing known), False
    (that side never happens), or ``(x, (low, high))``: node x's range on that side. Only a
    comparison of a node of proved range with a constant says something."""
    if not (isinstance(cond, fx.Node) and cond.target in _ORDERS and len(cond.args) == 2):
        return (None, None)
    x, c = cond.args
    op = _ORDERS[cond.target]
    if not isinstance(x, fx.Node):
        x, c, op = c, x, _MIRRORED[op]
    known, limit = bounds(x), bounds(c)
    if not isinstance(x, fx.Node) or known is None or limit is None or limit[0] != limit[1]:
        return (None, None)
    c, lo, hi = limit[0], known[0], known[1]
    if _is_float(x):  # floats: the closed bound (a superset of each side)
        below_lt = below_le = above_gt = above_ge = c
    else:  # integers: x < c is x <= ceil(c) - 1, x > c is x >= floor(c) + 1
        below_lt, below_le = math.ceil(c) - 1, math.floor(c)
        above_gt, above_ge = math.floor(c) + 1, math.ceil(c)
    ranges = {"lt": (lo, min(hi, below_lt)), "le": (lo, min(hi, below_le)),
              "gt": (max(lo, above_gt), hi), "ge": (max(lo, above_ge), hi)}
    negation = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt"}
    return tuple(False if r[0] > r[1] else (x, (float(r[0]), float(r[1]))) for r in (ranges[op], ranges[negation[op]]))


def _bounds_assuming(node, side) -> tuple[float, float] | None:
    """``bounds(node)`` where ``side`` = (x, range) holds: x's proof replaced by the range while
    the nodes between x and ``node`` are proved again, then every proof as it was."""
    if side is None or not isinstance(node, fx.Node):
        return bounds(node)
    x, known = side
    if node is x:
        return known
    between = _between(x, node)
    if not between:
        return bounds(node)
    saved = {n: n.meta.pop("kl_bounds", _UNPROVED) for n in (x, *between)}
    x.meta["kl_bounds"] = known
    try:
        return bounds(node)
    finally:
        for n, found in saved.items():
            n.meta.pop("kl_bounds", None)
            if found is not _UNPROVED:
                n.meta["kl_bounds"] = found


_UNPROVED = object()


def _between(x: fx.Node, node: fx.Node) -> set:
    """The nodes on a path from ``x`` to ``node`` (``node`` included, ``x`` not)."""
    above, stack = set(), [node]
    while stack:  # node's ancestors
        n = stack.pop()
        if n in above:
            continue
        above.add(n)
        stack.extend(n.all_input_nodes)
    if x not in above:
        return set()
    between, stack = set(), [x]
    while stack:  # x's descendants among them
        for user in stack.pop().users:
            if user in above and user not in between:
                between.add(user)
                stack.append(user)
    return between


def _fmod(a, n) -> tuple[float, float] | None:
    """C's remainder (the dividend's sign) of integers by a positive constant: ``torch.roll``'s
    indices, ``(arange(L) + shift) % L`` as its decomposition writes it."""
    if a is None or n is None or n[0] != n[1] or n[0] < 1:
        return None
    top = n[0] - 1
    if a[0] >= 0:
        return (0.0, min(a[1], top))
    if a[1] <= 0:
        return (max(a[0], -top), 0.0)
    return (-top, top)


def _divided(node: fx.Node) -> tuple[float, float] | None:
    """Integer division by a positive constant, floored or truncated (both monotone: MoE routing's
    token of each sorted slot, ``sorted_position // top_k``)."""
    mode = node.kwargs.get("rounding_mode", node.args[2] if len(node.args) > 2 else None)
    if node.target is aten.floor_divide.default:
        mode = "floor"
    a, b = bounds(node.args[0]), bounds(node.args[1])
    if _is_float(node) or mode not in ("floor", "trunc") or a is None or b is None or b[0] != b[1] or b[0] <= 0:
        return None
    rnd = math.floor if mode == "floor" else math.trunc
    return (float(rnd(a[0] / b[0])), float(rnd(a[1] / b[0])))


def _scale(b: tuple, alpha) -> tuple:
    lo, hi = b[0] * alpha, b[1] * alpha
    return (min(lo, hi), max(lo, hi))


def _rounded(node, found: tuple) -> tuple:
    """Float results widened by the slack (a few epsilons of a float16 or bfloat16 result where
    that is more: eager rounds every such op); integer results are exact."""
    if not _is_float(node):
        return found
    slack = max(SLACK, 4 * torch.finfo(_value(node).dtype).eps)
    lo, hi = found
    return (lo - slack * max(1.0, abs(lo)), hi + slack * max(1.0, abs(hi)))


def _clamp(node: fx.Node) -> tuple[float, float] | None:
    """clamp(x, L, H) = min(max(x, L), H). An infinite bound on its own side clamps nothing; a NaN
    or an unproved bound proves nothing. Integers clamped on both sides lie in [min(L, H), H]
    whatever they were (a float NaN would stay NaN; torch gives H everywhere when L > H)."""
    args = node.args
    if node.target is aten.clamp_min.default:
        low, high = args[1], None
    elif node.target is aten.clamp_max.default:
        low, high = None, args[1]
    else:
        low = args[1] if len(args) > 1 else node.kwargs.get("min")
        high = args[2] if len(args) > 2 else node.kwargs.get("max")
    low, high = _clamp_bound(low, -math.inf), _clamp_bound(high, math.inf)
    if low is False or high is False:
        return None
    found = bounds(args[0])
    if found is None:
        if _is_float(node) or low is None or high is None:
            return None
        return (min(low[0], high[1]), high[1])
    lo, hi = found
    if low is not None:
        lo, hi = max(lo, low[0]), max(hi, low[1])
    if high is not None:
        lo, hi = min(lo, high[0]), min(hi, high[1])
    return (lo, hi)


def _clamp_bound(arg, no_clamp: float):
    """A clamp's bound as a range; None: no clamp on that side (absent, or the infinity that
    clamps nothing); False: nothing can be proved (NaN, the other infinity, unproved)."""
    if arg is None or (isinstance(arg, float) and arg == no_clamp):
        return None
    if isinstance(arg, float) and not math.isfinite(arg):
        return False
    found = bounds(arg)
    return False if found is None else found


def _cast(node: fx.Node, found) -> tuple[float, float] | None:
    """A float cast to an integer type truncates toward zero (monotone); to a float it keeps the
    value (up to rounding, covered by the slack); to bool it is 0 or 1."""
    val = _value(node)
    if found is None or not isinstance(val, torch.Tensor):
        return None
    if val.dtype == torch.bool:
        return (0.0, 1.0)
    if val.is_floating_point():
        return _rounded(node, found)
    return (float(math.trunc(found[0])), float(math.trunc(found[1])))


def _arange(node: fx.Node) -> tuple[float, float] | None:
    val = _value(node)
    if not isinstance(val, torch.Tensor) or val.dim() != 1 or not isinstance(val.shape[0], int) or val.shape[0] == 0:
        return None
    args = [a for a in node.args]
    if node.target is aten.arange.default:
        start, step = 0, 1
    else:
        start, step = args[0], (args[2] if len(args) > 2 else node.kwargs.get("step", 1))
    if not all(isinstance(v, (int, float)) for v in (start, step)):
        return None
    last = start + step * (val.shape[0] - 1)
    return _rounded(node, (float(min(start, last)), float(max(start, last))))


def _arange_buffer(node: fx.Node) -> tuple[float, float] | None:
    """An arange made a constant buffer of the graph (``rewrites.aranges_as_constants``)."""
    found, val = node.meta.get("kl_arange"), _value(node)
    if found is None or not isinstance(val, torch.Tensor) or val.dim() != 1 or val.shape[0] == 0:
        return None
    start, step = found
    last = start + step * (int(val.shape[0]) - 1)
    return (float(min(start, last)), float(max(start, last)))


#: ops whose second output holds positions along a dim of their input: (dim argument position, default)
_POSITIONS = {aten.sort.default: (1, -1), aten.sort.stable: (None, -1), aten.topk.default: (2, -1),
              aten.max.dim: (1, None), aten.min.dim: (1, None), aten.kthvalue.default: (2, -1),
              aten.mode.default: (1, -1), aten.cummax.default: (1, None), aten.cummin.default: (1, None)}


def _positions(producer, k) -> tuple[float, float] | None:
    """The indices output of a sort, top-k, max(dim)...: positions along the dim it works on."""
    if k != 1 or not isinstance(producer, fx.Node) or producer.target not in _POSITIONS:
        return None
    where, default = _POSITIONS[producer.target]
    given = where is not None and len(producer.args) > where
    dim = producer.kwargs.get("dim", producer.args[where] if given else default)
    return _positions_along(producer.args[0], dim)


def _positions_along(source, dim) -> tuple[float, float] | None:
    val = _value(source)
    if not isinstance(val, torch.Tensor):
        return None
    size = val.numel() if dim is None else (val.shape[dim % val.dim()] if val.dim() else 1)
    if not isinstance(size, int) or size == 0:
        return None
    return (0.0, float(size - 1))


def of_outputs(gm: fx.GraphModule) -> dict:
    """Proved bounds of a forward graph's outputs, by node name: the values it saves for the
    backward graph, whose inputs aot_autograd names alike. (Segformer's backward recomputes its
    interpolations' gathers from the saved indices; without the forward's proof they stayed ATen's.)"""
    out = {}
    for node in gm.graph.find_nodes(op="output"):
        for arg in pytree.tree_leaves(node.args[0]):
            found = bounds(arg) if isinstance(arg, fx.Node) else None
            if found is not None:
                out[arg.name] = found
    for node in gm.graph.nodes:  # the rewrites change the graph next: proofs are made again after
        node.meta.pop("kl_bounds", None)
    return out


def assume_for_inputs(gm: fx.GraphModule, known: dict) -> None:
    """The backward graph's inputs that are saved forward values take the bounds proved there."""
    for node in gm.graph.nodes:
        if node.op == "placeholder" and node.name in known:
            node.meta["kl_bounds"] = known[node.name]
