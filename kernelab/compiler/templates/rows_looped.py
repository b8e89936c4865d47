"""The rows template's looped body (``rows.py`` picks it for rows longer than one block): one pass
over the row per reduction step.

Each value of a reduction group gets a *level*: the pass after which it is known. Pass L streams
the row in blocks of RBLOCK, recomputes the pointwise prologue of the reductions whose input is
known at L from the inputs, and accumulates them per lane; after the loop each accumulator is
reduced across lanes, and the per-row epilogue that became computable is emitted. A last pass
stores the full-size outputs. Two reductions share a pass when they can:

* softmax's ``sum(exp(x - amax(x)))`` rides along with the max (online softmax: the running sum
  is rescaled by e^(m - m') whenever the running max grows), so a softmax reads its row twice,
  not three times;
* var takes two steps (the mean, then the squared deviations: exact, no cancellation).
"""
from __future__ import annotations

from .. import fusion
from ..emit import Emitter, correction, emit_node, full_load, local_name, var_name
from ..ops_table import compute_type

__all__ = ["looped_body", "online_pairs", "stores_in_the_last_pass"]


def _levels(group, online: dict) -> dict:
    """Pass after which each value is known: a reduction step streams its input in pass L and is
    known from pass L + 1 (var needs two steps: the mean, then the squared deviations); the sum of
    an online softmax is known with its max."""
    level = {}
    for n in group.nodes:
        base = max((level.get(p, 0) for p in n.all_input_nodes if p in group.roles), default=0)
        if fusion.is_reduction(n):
            base += 2 if fusion.reduction_kind(n) == "var" else 1
        level[n] = level[online[n]] if n in online else base
    return level


_SAME_VALUE = {"aten.alias.default", "prims.broadcast_in_dim.default", "aten.expand.default",
               "aten.view.default", "aten.unsqueeze.default", "aten._unsafe_view.default"}


def _through_views(node, group):
    while fusion.target_name(node) in _SAME_VALUE and node in group.roles:
        node = node.args[0]
    return node


def online_pairs(group) -> dict:
    """sum(exp(x - amax(x))) -> amax: the sum can be kept in the max's pass (online softmax),
    rescaling the running sum whenever the running max grows. One read of the row saved."""
    pairs = {}
    for s in group.nodes:
        if not fusion.is_reduction(s) or fusion.reduction_kind(s) != "sum":
            continue
        e = s.args[0]
        if e not in group.roles or fusion.target_name(e) != "aten.exp.default":
            continue
        d = e.args[0]
        if d not in group.roles or fusion.target_name(d) != "aten.sub.Tensor" or fusion.bound_args(d).get("alpha", 1) != 1:
            continue
        a = _through_views(d.args[1], group)
        if (a in group.roles and fusion.is_reduction(a) and fusion.reduction_kind(a) == "max"
                and a.args[0] is d.args[0] and fusion.value(a).dtype == fusion.value(s).dtype):
            pairs[s] = a
    return pairs


def _closure(group, targets) -> list:
    """Full nodes needed (transitively, through full nodes) to compute ``targets``, in order."""
    need, stack = set(), list(targets)
    while stack:
        n = stack.pop()
        if n in need or group.roles.get(n) != "full" or fusion.is_reduction(n):
            continue
        need.add(n)
        stack.extend(p for p in n.all_input_nodes if p in group.roles)
    return [n for n in group.nodes if n in need]


def _passes(group, online: dict) -> tuple:
    """(levels, reduction steps by pass, the pass storing the full-size outputs (-1: none), every
    pass in order)."""
    level = _levels(group, online)
    steps = {}  # pass -> [(reduction node, step)]
    for n in group.nodes:
        if n in online:
            continue
        if fusion.is_reduction(n):
            start = level[n] - (2 if fusion.reduction_kind(n) == "var" else 1)
            steps.setdefault(start, []).append((n, 0))
            if fusion.reduction_kind(n) == "var":
                steps.setdefault(start + 1, []).append((n, 1))
    full_outs = [n for n in group.outputs if group.roles[n] == "full"]
    last = max([level[n] for n in full_outs], default=-1)
    return level, steps, last, sorted(set(steps) | ({last} if full_outs else set()))


def stores_in_the_last_pass(group) -> bool:
    """No pass reads the row after the full-size outputs are stored: each block of the row is
    loaded before the same block is stored, and never again, so an output may be stored over an
    input of its layout (``GroupRunner.reuse``)."""
    _, _, last, passes = _passes(group, online_pairs(group))
    return not passes or passes[-1] == last


def looped_body(em: Emitter, loads) -> None:
    group = em.group
    online = online_pairs(group)
    em.online = {a: s for s, a in online.items()}  # amax -> the sum that rides along
    level, steps, last, passes = _passes(group, online)
    full_outs = [n for n in group.outputs if group.roles[n] == "full"]
    done = set()
    _emit_ready_rows(em, done, level, -1)
    for p in passes:
        _emit_pass(em, loads, p, steps.get(p, []), full_outs if p == last else [])
        _emit_ready_rows(em, done, level, p)


def _emit_ready_rows(em: Emitter, done: set, level: dict, p: int) -> None:
    """Row values (reductions finished, then their pointwise epilogue) known after pass p."""
    for n in em.group.nodes:
        if n in done or em.group.roles[n] != "row" or level[n] > p + 1:
            continue
        if fusion.is_reduction(n):
            continue  # finalized by its pass
        emit_node(em, n)
        done.add(n)


_ACC = {"sum": ("0", "+"), "mean": ("0", "+"), "var": ("0", "+"), "max": ('float("-inf")', "max"),
        "min": ('float("inf")', "min")}


def _emit_pass(em: Emitter, loads, p: int, steps: list, stores: list) -> None:
    group = em.group
    accumulated = [local_name(n) for n, _ in steps] + [local_name(em.online[n]) + " (online)" for n, _ in steps if n in em.online]
    em.emit(f"# pass {p}: stream the row in blocks of RBLOCK"
            + (", accumulating " + ", ".join(accumulated) if steps else "")
            + (", storing the full-size outputs" if stores else ""))
    for n, step in steps:
        fill, _ = _ACC[fusion.reduction_kind(n)]
        em.emit(f"acc_{local_name(n)}_{step} = tl.full([XBLOCK, RBLOCK], {fill}, {compute_type(fusion.value(n).dtype)})")
        if n in em.online:
            em.emit(f"acc_{local_name(em.online[n])}_0 = tl.full([XBLOCK, RBLOCK], 0, {compute_type(fusion.value(n).dtype)})")
    em.emit("for roff in range(0, n_cols, RBLOCK):")
    em.indent = "        "
    em.emit("cols = roff + tl.arange(0, RBLOCK)[None, :]")
    em.emit("rmask = cols < n_cols")
    em.emit("mask = xmask & rmask")
    needed = _closure(group, [n.args[0] for n, _ in steps] + stores)
    used = {p_ for n in needed + [s for s, _ in steps] for p_ in n.all_input_nodes}
    for i, load in enumerate(loads):
        if load.role == "full" and load.node in used:
            full_load(em, i, load)
    for n in needed:
        emit_node(em, n)
    for n, step in steps:
        if n in em.online:
            _accumulate_online(em, n, em.online[n])
        else:
            _accumulate(em, n, step)
    for i, n in enumerate(group.outputs):
        if n in stores:
            em.emit(f"tl.store(out{i}_ptr + row * out_row + cols, "
                    f"tl.broadcast_to({var_name(n)}, [XBLOCK, RBLOCK]).to(out{i}_ptr.dtype.element_ty), mask=mask)")
    em.indent = "    "
    for n, step in steps:
        if n in em.online:
            _finalize_online(em, n, em.online[n])
        else:
            _finalize(em, n, step)


def _accumulate(em: Emitter, n, step: int) -> None:
    kind = fusion.reduction_kind(n)
    want = compute_type(fusion.value(n).dtype)
    em._load_role = "full"
    x = em.block(n.args[0], want, "[XBLOCK, RBLOCK]")
    acc = f"acc_{local_name(n)}_{step}"
    fill, how = _ACC[kind]
    if how == "+":
        term = f"tl.where(mask, {x} - {var_name(n)}_mean, 0)" if kind == "var" and step == 1 else f"tl.where(mask, {x}, 0)"
        em.emit(f"{acc} = {acc} + {term} * {term}" if kind == "var" and step == 1 else f"{acc} = {acc} + {term}")
    else:
        em.emit(f"{acc} = klm.{'maximum' if how == 'max' else 'minimum'}_nan({acc}, tl.where(mask, {x}, {fill}))")


def _accumulate_online(em: Emitter, a, s) -> None:
    """Per lane: m' = max(m, x); sum = sum * e^(m - m') + e^(x - m'). Lanes that saw only -inf
    keep a zero sum (never e^(-inf + inf)); a NaN makes the max NaN, and the sum with it."""
    em._load_role = "full"
    x = em.block(a.args[0], compute_type(fusion.value(a).dtype), "[XBLOCK, RBLOCK]")
    m, acc = f"acc_{local_name(a)}_0", f"acc_{local_name(s)}_0"
    em.emit(f"x_{local_name(a)} = tl.where(mask, {x}, float(\"-inf\"))")
    em.emit(f"m_new = klm.maximum_nan({m}, x_{local_name(a)})")
    em.emit(f"{acc} = {acc} * tl.where({m} == m_new, 1.0, tl.exp({m} - m_new))"
            f" + tl.where(x_{local_name(a)} == float(\"-inf\"), 0.0, tl.exp(x_{local_name(a)} - m_new))")
    em.emit(f"{m} = m_new")


def _finalize_online(em: Emitter, a, s) -> None:
    m, acc = f"acc_{local_name(a)}_0", f"acc_{local_name(s)}_0"
    em.names[a], em.names[s] = var_name(a), var_name(s)
    em.emit(f"{var_name(a)} = klm.max_rows({m})[:, None]")
    em.emit(f"{var_name(s)} = tl.sum(tl.where({m} == {var_name(a)}, {acc}, {acc} * tl.exp({m} - {var_name(a)})), axis=1)[:, None]")


def _finalize(em: Emitter, n, step: int) -> None:
    kind = fusion.reduction_kind(n)
    acc, v = f"acc_{local_name(n)}_{step}", var_name(n)
    em.names[n] = v
    if kind in ("max", "min"):
        em.emit(f"{v} = klm.{kind}_rows({acc})[:, None]")
    elif kind == "sum":
        em.emit(f"{v} = tl.sum({acc}, axis=1)[:, None]")
    elif kind == "mean":
        em.emit(f"{v} = tl.sum({acc}, axis=1)[:, None] / n_cols")
    elif step == 0:
        em.emit(f"{v}_mean = tl.sum({acc}, axis=1)[:, None] / n_cols")
    else:
        em.emit(f"{v} = tl.sum({acc}, axis=1)[:, None] / (n_cols - {correction(n)})")
