"""The rows template: reductions over the last dim (softmax, norms, a loss's row sums).

``XBLOCK`` rows per program. Persistent (the row fits one block of ``RBLOCK``): each input is
loaded once, every op and reduction computed in registers, each output stored once. Looped (long
rows, ``rows_looped.py``): one pass over the row per reduction step, recomputing the pointwise
prologue from the inputs, then a last pass that stores the full-size outputs. Which of the two a
call takes is this template's launch decision (:func:`launch`): the row's length against
``base.persistent_max``, and the tiling's data.

Owns the kernel's source (:func:`source`), its launch configuration (:func:`launch`) and its
outputs' layouts (:func:`prepare`).
"""
from __future__ import annotations

import math

import torch

from .. import fusion, layout
from ..emit import Emitter, correction, doc_lines, emit_coordinates, emit_node, full_load, loads_of, strided_signature, \
    var_name
from ..ops_table import compute_type
from .base import INT32_MAX, META, PERSISTENT_MAX, Call, Launch, collapse, max_offset, out_spec, persistent_max, pow2
from .rows_looped import looped_body, stores_in_the_last_pass

__all__ = ["KIND", "CATEGORY", "source", "prepare", "launch", "out_row", "reads_before_it_stores"]

KIND = "reduction"
CATEGORY = "reduction"  # what a predicted kernel of this template counts as (``kernelab count``)


# ---------------------------------------------------------------------------------------------
# source


def source(group, rank: int, persistent: bool = True) -> str:
    """The kernel's function: persistent (the row in registers) or looped (passes over the row)."""
    loads = loads_of(group)
    em = Emitter(group, loads)
    src = strided_signature(group, loads, rank, scratch="", inner="r", sizes="rows, n_cols, out_row,",
                            constexprs=("XBLOCK", "RBLOCK", "INT64"))
    for line in doc_lines(group, loads, "once" if persistent else "once per pass over the row"):
        em.emit(line)
    em.emit("if INT64:")
    em.emit("    row = tl.program_id(0).to(tl.int64) * XBLOCK + tl.arange(0, XBLOCK)[:, None]")
    em.emit("else:")
    em.emit("    row = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]")
    em.emit("xmask = row < rows")
    em.emit(f"# coordinates of each row in the collapsed {rank}-d leading dims")
    emit_coordinates(em, "row", "r", rank)
    for t in (f"in{i}" for i in range(len(loads))):
        em.emit(f"{t}_row = " + " + ".join(f"r{d} * {t}_stride{d}" for d in range(rank)))
    # row-role loads: one value per row, read before any pass
    for i, load in enumerate(loads):
        em.names[load.node, load.role] = f"in{i}"
        if load.role == "row":
            em.names.setdefault((load.node, "full"), f"in{i}")  # full-size nodes read it broadcast
            ct = compute_type(fusion.value(load.node).dtype)
            em.emit(f"in{i} = tl.load(in{i}_ptr + in{i}_row, mask=xmask, other=0).to({ct})")
    if persistent:
        _persistent_body(em, loads)
    else:
        looped_body(em, loads)
    if any(group.roles[n] == "row" for n in group.outputs):
        em.emit("# store the per-row outputs")
    for i, n in enumerate(group.outputs):
        if group.roles[n] == "row":
            em.emit(f"tl.store(out{i}_ptr + row, {var_name(n)}.to(out{i}_ptr.dtype.element_ty), mask=xmask)")
    return "\n".join(src + em.lines) + "\n"


def _reduce_expr(em: Emitter, n) -> list[str]:
    """The lines computing one reduction of a persistent row in registers."""
    kind = fusion.reduction_kind(n)
    want = compute_type(fusion.value(n).dtype)
    em._load_role = "full"
    xb = em.block(n.args[0], want, "[XBLOCK, RBLOCK]")
    v = var_name(n)
    if kind in ("sum", "mean"):
        lines = [f"{v} = tl.sum(tl.where(mask, {xb}, 0), axis=1)[:, None]"]
        return lines + ([f"{v} = {v} / n_cols"] if kind == "mean" else [])
    if kind in ("max", "min"):
        fill = 'float("-inf")' if kind == "max" else 'float("inf")'
        return [f"{v} = klm.{kind}_rows(tl.where(mask, {xb}, {fill}))[:, None]"]
    corr = correction(n)
    return [f"{v}_mean = tl.sum(tl.where(mask, {xb}, 0), axis=1)[:, None] / n_cols",
            f"{v}_dev = tl.where(mask, {xb} - {v}_mean, 0)",
            f"{v} = tl.sum({v}_dev * {v}_dev, axis=1)[:, None] / (n_cols - {corr})"]


def _persistent_body(em: Emitter, loads) -> None:
    em.emit("# the whole row fits one block: load each input once, compute in registers")
    em.emit("cols = tl.arange(0, RBLOCK)[None, :]")
    em.emit("rmask = cols < n_cols")
    em.emit("mask = xmask & rmask")
    for i, load in enumerate(loads):
        if load.role == "full":
            full_load(em, i, load)
    for n in em.group.nodes:
        emit_node(em, n)
        if fusion.is_reduction(n):
            em.emit(f"# reduce over the row: {fusion.reduction_kind(n)}")
            for line in _reduce_expr(em, n):
                em.emit(line)
    em.emit("# store the full-size outputs")
    for i, n in enumerate(em.group.outputs):
        if em.group.roles[n] == "full":
            em.emit(f"tl.store(out{i}_ptr + row * out_row + cols, "
                    f"tl.broadcast_to({var_name(n)}, [XBLOCK, RBLOCK]).to(out{i}_ptr.dtype.element_ty), mask=mask)")


def reads_before_it_stores(group) -> bool:
    """Each full-size output is stored in the last pass over its row, after every read of the
    same elements: an output may take the memory of an input read once, as a whole."""
    return stores_in_the_last_pass(group)


# ---------------------------------------------------------------------------------------------
# launch


def prepare(runner, raw, shape, device) -> Call:
    """The launch for the inputs ``raw`` over the iteration ``shape``: rows of its last dim
    (``runner``: the group's ``GroupRunner``: its loads, sizes, padded outputs, kernel variants)."""
    g = runner.group
    n_cols = shape[-1]
    rows = math.prod(shape[:-1])
    ins = [_as_rows(t, load, g, shape, runner.sizes) for t, load in zip(raw, runner.loads)]
    row_stride = out_row(runner, shape)
    outs = [_alloc_rows(n, g.roles[n], shape, META, row_stride, runner.sizes) for n in g.outputs]
    lead = list(shape[:-1]) or [1]
    contiguous_rows = [math.prod(lead[d + 1:]) for d in range(len(lead))]
    lead_strides = [list(t.stride()[:-1]) or [0] for t in ins] + [contiguous_rows]
    sizes, strides = collapse(lead, lead_strides)
    strides = strides[:-1]
    how = launch(runner, sizes, strides, rows, n_cols, ins)
    xblock = how.block["XBLOCK"]
    tail = [s for st in strides for s in st] + [t.stride(-1) for t in ins] + list(sizes) + [rows, n_cols, row_stride]
    meta = {"XBLOCK": xblock, "RBLOCK": how.block["RBLOCK"], "INT64": how.int64,
            "num_warps": how.num_warps}
    return Call(runner.kernel(how.rank, how.persistent), ((rows + xblock - 1) // xblock,), tail, meta,
                [out_spec(o) for o in outs], device, reuse=runner.reuse_for_call(raw, ins, outs))


def out_row(runner, shape) -> int:
    """The row stride of the full-size outputs: the row length, or the padded stride when
    ``layout.plan`` padded one of them (then all, so that one ``out_row`` serves every store)."""
    n_cols = shape[-1]
    padded = [runner.padded[n] for n in runner.group.outputs if n in runner.padded]
    if not padded or any(s == 0 for s in shape):
        return n_cols
    sizes = [fusion.value(n).element_size() for n in runner.group.outputs if runner.group.roles[n] == "full"]
    return max(padded + [layout.padded_cols(n_cols, min(sizes))])


def _has_var(group) -> bool:
    return any(fusion.is_reduction(n) and fusion.reduction_kind(n) == "var" for n in group.nodes)


def launch(runner, sizes, strides, rows, n_cols, ins) -> Launch:
    """Persistent or looped, the row block, rows per program, warps and offset width."""
    rblock = pow2(n_cols)
    rows_tiling = runner.tiling.rows
    persistent = rblock <= (PERSISTENT_MAX["interpreter"] if runner.interpret else persistent_max()) and \
        (runner.interpret or not rows_tiling.looped)
    if persistent and not runner.interpret and rblock > rows_tiling.var_persistent_max and _has_var(runner.group):
        # a variance over a long row keeps the row and its deviations live: the layer norm
        # kernel over rows of 8192 needs 85 registers a thread at 16 warps (one program per
        # SM). Looped (three passes, the re-reads from L2), 16384x8192 bf16 went from 0.174 to
        # 0.151 ms on the H200 (compiler_suite, back-to-back calls; Inductor 0.147); RMS norm
        # (one sum) got slower looped (0.133 -> 0.140 ms) and stays persistent
        persistent = False
    if not persistent:
        rblock = 4096 if runner.interpret else 2048
    # elements of one [XBLOCK, RBLOCK] tile: on the GPU 16 per thread per live value. Measured
    # on the H200 (benchmarks/row_tune.py): against 8 per thread, layer norm over 65536x1024
    # went from 75.8 to 69.3 us and over 32768x4096 from 162 to 133 us; softmax and RMS norm
    # over rows of 8192 did not move (16 warps either way), 4 per thread was slower. Looped
    # rows (longer than 8192) keep 8 per thread: measured at 1.1x Inductor on 1024x32768
    budget = (1 << 16) if runner.interpret else (2048 if persistent else rblock)
    xblock = max(1, min(pow2(rows), budget // rblock))
    per_warp = 32 * (rows_tiling.per_thread if persistent else rows_tiling.looped_per_thread)
    warps = 1 if runner.interpret else max(1, min(16, xblock * rblock // per_warp))
    span = rows * n_cols
    int64 = span > INT32_MAX or any(
        max_offset(sizes, st) + (n_cols - 1) * abs(t.stride(-1)) > INT32_MAX for st, t in zip(strides, ins))
    return Launch(len(sizes), persistent, {"XBLOCK": xblock, "RBLOCK": rblock}, warps, int64)


def _alloc_rows(node, role: str, shape, device, row_stride: int, symbols) -> torch.Tensor:
    """A reduction group's output: full size with rows ``row_stride`` apart, or one value per row
    (its meta shape, symbolic sizes evaluated by ``symbols``, the runner's ``SymbolValues``)."""
    meta = fusion.value(node)
    if role == "full":
        return torch.empty_strided(shape, layout.padded_strides(shape, row_stride), dtype=meta.dtype, device=device)
    return torch.empty(symbols.shape(meta.shape), dtype=meta.dtype, device=device)


def _in_row_order(t: torch.Tensor, lead: list[int]) -> bool:
    """``t`` holds one value per row, its dims the rows' dims in order with 1s anywhere: (N, 1, C)
    for rows (N, C). Such a value is a reshape of the rows, not a broadcast."""
    return t.numel() == math.prod(lead) and [s for s in t.shape if s != 1] == [s for s in lead if s != 1]


def _as_rows(t: torch.Tensor, load, group, shape, symbols) -> torch.Tensor:
    """An input as a view of the full shape S: broadcast (full loads), or one value per row whose
    last-dim stride is 0 (row loads)."""
    if load.role == "full":
        return t.expand(shape)
    lead = list(shape[:-1])
    if _in_row_order(t, lead):
        return t.reshape(lead + [1]).expand(shape)
    if fusion.constant_along_rows(load.node):  # a scalar or size 1 in the last dim
        if t.dim() > len(shape):  # size-1 dims beyond the rows: an (N, C, 1, 1) gate, (N, C, H*W) rows
            t = t.reshape([]) if t.numel() == 1 else t.reshape(list(shape[:-1]) + [1])
        return t.expand(list(shape[:-1]) + [1]).expand(shape)
    users = [n for n in group.nodes if load.node in n.all_input_nodes and group.roles[n] == "row"]
    node_shape = list(symbols.shape(fusion.value(users[0]).shape)) if users else lead + [1]
    per_row = t.expand(node_shape).reshape(lead + [1])
    return per_row.expand(shape)
