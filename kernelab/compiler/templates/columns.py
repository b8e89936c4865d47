"""The column-reduction template: sums and means over every dim but the last, in one kernel.

A full shape S = (..., C) is walked as ``rows`` x ``C`` (the leading dims collapsed). Programs form a
grid of column blocks (``CBLOCK`` columns each) by row splits: program (c, s) walks its
``tiles_per_split`` tiles of ``XBLOCK`` rows, recomputes the pointwise prologue on each tile and
adds it into a [XBLOCK, CBLOCK] float32 accumulator, so every input element is read exactly once;
a prologue value an ATen op reads too (GELU's backward before a matmul) is stored from the tile.

With one split the program finishes its columns itself. With several (few columns, many rows: a
bias gradient of (8192, 1024) has 16 column blocks, far fewer than the GPU's SMs), each program
writes its partial column sums to a float32 workspace of ``splits x C`` values, then increments its
column block's counter; the program that arrives last (the counter's old value is splits - 1) adds
the partials in split order, so the result is deterministic, runs the per-column epilogue, stores
the outputs and resets the counter to zero for the next launch. One kernel, no memset: the
counters are zeroed once when the launch is first prepared.

The counter handshake orders memory like a stream-K matmul's: a CTA barrier so that every thread's
partial store precedes the release, an acquire-release atomic, and L1-bypassing loads of the
partials.

A variance (``var`` over the leading dims: a channels-last batch norm's statistics,
``rewrites.batch_norm_statistics_as_columns``) is accumulated the way Welford's algorithm does,
per lane of the tile: each lane keeps the mean, the sum of squared deviations from it (M2) and its
count, and moves its mean by ``(x - mean) / count`` at every tile; lanes, then splits, merge by
Chan's formula (``kl_math.welford_combine``), three workspace values a split (float64 ones for
float64 reductions: ``workspace_dtype``). No sum of squares
is ever subtracted from another, so no digit cancels wherever the values sit (a sparse channel
whose first value is one of its few nonzeros lost 3 digits to a shifted one-pass variance).
"""
from __future__ import annotations

import math

import torch

from .. import fusion
from ..emit import (Emitter, correction, doc_lines, emit_coordinates, loads_of, node_expression, strided_signature,
                    var_name)
from ..ops_table import compute_type
from .base import INT32_MAX, META, Call, Launch, collapse, max_offset, out_spec, pow2, sm_count

__all__ = ["KIND", "CATEGORY", "source", "prepare", "launch", "reads_before_it_stores", "workspace_dtype",
           "workspace_slots"]

KIND = "column"
CATEGORY = "reduction"  # what a predicted kernel of this template counts as (``kernelab count``)


def _is_var(n) -> bool:
    return fusion.reduction_kind(n) == "var"


def workspace_slots(group) -> int:
    """Values a row split leaves in the workspace per column: one per sum or mean, three per
    variance (its mean, M2 and count)."""
    return sum(3 if _is_var(n) else 1 for n in group.nodes if fusion.is_reduction(n))


def workspace_dtype(group) -> torch.dtype:
    """The partials' type: float64 where a reduction accumulates in float64 (float32 partials
    rounded a float64 sum split across programs to float32's 7 digits), else float32."""
    wide = any(_acc_type(n) == "tl.float64" for n in group.nodes if fusion.is_reduction(n))
    return torch.float64 if wide else torch.float32


def source(group, rank: int, persistent: bool = True) -> str:
    """The kernel's function (``persistent`` is the rows template's: one variant per rank here)."""
    loads = loads_of(group)
    em = Emitter(group, loads)
    reductions = [n for n in group.nodes if fusion.is_reduction(n)]
    src = strided_signature(group, loads, rank, scratch="work_ptr, count_ptr,", inner="c",
                            sizes="rows, n_cols, tiles_per_split, splits,",
                            constexprs=("XBLOCK", "CBLOCK", "SPLITS", "INT64"))
    for line in doc_lines(group, loads, "once"):
        em.emit(line)
    em.emit("cols = tl.program_id(0) * CBLOCK + tl.arange(0, CBLOCK)[None, :]")
    em.emit("cmask = cols < n_cols")
    em.emit("split = tl.program_id(1)")
    em.emit("if INT64:")
    em.emit("    first_row = split.to(tl.int64) * tiles_per_split * XBLOCK")
    em.emit("else:")
    em.emit("    first_row = split * tiles_per_split * XBLOCK")
    for r in reductions:
        for acc in (("_mean", "_m2", "_n") if _is_var(r) else ("_acc",)):
            em.emit(f"{var_name(r)}{acc} = tl.zeros([XBLOCK, CBLOCK], dtype={_acc_type(r)})")
    em.emit("# walk this split's rows one tile at a time: each input element is read once")
    em.emit("for tile in range(0, tiles_per_split):")
    em.indent = "        "
    em.emit("row = first_row + tile * XBLOCK + tl.arange(0, XBLOCK)[:, None]")
    em.emit("mask = (row < rows) & cmask")
    emit_coordinates(em, "row", "r", rank)
    for i, load in enumerate(loads):
        em.names[load.node, load.role] = f"in{i}"
        if load.role == "full":
            ct = compute_type(fusion.value(load.node).dtype)
            offset = " + ".join(f"r{d} * in{i}_stride{d}" for d in range(rank))
            em.emit(f"in{i} = tl.load(in{i}_ptr + {offset} + cols * in{i}_stride_c, mask=mask, other=0).to({ct})")
    em._load_role = "full"
    for n in group.nodes:
        em.names[n] = var_name(n)
        if group.roles[n] == "full":
            em.emit(f"{var_name(n)} = {node_expression(em, n)}")
        elif fusion.is_reduction(n):
            x = em.block(n.args[0], _acc_type(n), "[XBLOCK, CBLOCK]")
            if _is_var(n):
                _welford_step(em, var_name(n), x, _acc_type(n))
            else:
                em.emit(f"{var_name(n)}_acc += tl.where(mask, {x}, 0)")
    for i, n in enumerate(group.outputs):
        if group.roles[n] == "full":  # a value ATen reads too (a matmul's input): written once, here
            em.emit(f"tl.store(out{i}_ptr + row * n_cols + cols, tl.broadcast_to({var_name(n)}, [XBLOCK, CBLOCK])"
                    f".to(out{i}_ptr.dtype.element_ty), mask=mask)")
    em.indent = "    "
    em.emit("# this split's sum of each column" + (" (a variance: its lanes merged, M2 until the epilogue)"
                                                  if any(_is_var(r) for r in reductions) else ""))
    for r in reductions:
        _merged(em, r, _parts(r) if _is_var(r) else [f"{var_name(r)}_acc"])
    slots = _slots(reductions)
    em.emit("if SPLITS > 1:")
    em.indent = "        "
    em.emit("# publish the partial sums; the last program to arrive at this column block adds them up")
    for r, first in zip(reductions, slots):
        for k, part in enumerate(_parts(r)):
            em.emit(f"tl.store(work_ptr + ({first + k} * splits + split) * n_cols + cols, {part}, mask=cmask)")
    em.emit("tl.debug_barrier()")
    em.emit('arrived = tl.atomic_add(count_ptr + tl.program_id(0), 1, sem="acq_rel")')
    em.emit("if arrived == splits - 1:")
    em.indent = "            "
    em.emit("parts = tl.arange(0, SPLITS)[:, None]")
    em.emit("pmask = (parts < splits) & cmask")
    for r, first in zip(reductions, slots):
        _merged(em, r, [f"tl.load(work_ptr + ({first + k} * splits + parts) * n_cols + cols, mask=pmask, other=0, "
                        f"cache_modifier=\".cg\")" for k in range(len(_parts(r)))])
    _epilogue(em, loads)
    em.emit("tl.atomic_xchg(count_ptr + tl.program_id(0), 0)  # ready for the next launch")
    em.indent = "    "
    em.emit("else:")
    em.indent = "        "
    _epilogue(em, loads)
    em.indent = "    "
    return "\n".join(src + em.lines) + "\n"


def _acc_type(n) -> str:
    return compute_type(fusion.value(n).dtype)


def _parts(r) -> list:
    """What a split publishes of reduction ``r``: its sum, or a variance's mean, M2 and count."""
    v = var_name(r)
    return [f"{v}_mean", f"{v}_m2", f"{v}_n"] if _is_var(r) else [v]


def _merged(em: Emitter, r, rows: list) -> None:
    """Reduction ``r``'s value per column from ``rows`` ([rows, columns] expressions: the tile's
    lane accumulators, or the splits' published partials): their sum, or a variance's lanes merged
    by Chan's formula, kept as M2 until the epilogue divides it."""
    v = var_name(r)
    if _is_var(r):
        em.emit(f"{v}_mean, {v}_m2, {v}_n = klm.welford_columns({', '.join(rows)})")
        em.emit(f"{v} = {v}_m2")
    else:
        em.emit(f"{v} = tl.sum({rows[0]}, axis=0)[None, :]")


def _slots(reductions) -> list:
    """Each reduction's first workspace slot (slots of ``splits x C`` values, in reduction order)."""
    first, out = 0, []
    for r in reductions:
        out.append(first)
        first += len(_parts(r))
    return out


def _welford_step(em: Emitter, v: str, x: str, acc: str) -> None:
    """One tile into a variance's lane accumulators (Welford): the count grows where the tile has
    a row, the mean moves by ``delta / count``, M2 gains ``delta * (x - new mean)``. A lane with a
    row in this tile had one in each earlier tile of its split (rows past the end come last), so
    its new count is ``tile + 1``: one reciprocal a tile (in the accumulator's type ``acc``), no
    division an element."""
    em.emit(f"{v}_x = {x}")
    em.emit(f"{v}_d = tl.where(mask, {v}_x - {v}_mean, 0.0)")
    em.emit(f"{v}_w = 1.0 / (tl.zeros([1, 1], {acc}) + (tile + 1))")
    em.emit(f"{v}_mean = {v}_mean + {v}_d * {v}_w")
    em.emit(f"{v}_m2 = {v}_m2 + {v}_d * tl.where(mask, {v}_x - {v}_mean, 0.0)")
    em.emit(f"{v}_n = {v}_n + tl.where(mask, 1.0, 0.0)")


def _epilogue(em: Emitter, loads) -> None:
    """Per-column values: the means, the ops after the reductions, the stores."""
    group = em.group
    for i, load in enumerate(loads):
        if load.role == "col":
            ct = compute_type(fusion.value(load.node).dtype)
            em.emit(f"in{i} = tl.load(in{i}_ptr + cols * in{i}_stride_c, mask=cmask, other=0).to({ct})")
    em._load_role = "col"
    for n in group.nodes:
        if group.roles[n] != "col":
            continue
        if fusion.is_reduction(n):
            if fusion.reduction_kind(n) == "mean":
                em.emit(f"{var_name(n)} = {var_name(n)} / rows")
            elif _is_var(n):  # M2 / (N - correction), the divisor clamped at 0 as ATen's
                em.emit(f"{var_name(n)} = {var_name(n)} / tl.maximum(rows - {correction(n)}, 0.0)")
        else:
            em.emit(f"{var_name(n)} = {node_expression(em, n)}")
    em._load_role = "full"
    for i, n in enumerate(group.outputs):
        if group.roles[n] != "col":
            continue
        em.emit(f"tl.store(out{i}_ptr + cols, tl.broadcast_to({var_name(n)}, [1, CBLOCK])"
                f".to(out{i}_ptr.dtype.element_ty), mask=cmask)")


def reads_before_it_stores(group) -> bool:
    """Never: a program stores the columns of every row it did not read (the last to arrive
    finishes them), so no output may take an input's memory."""
    return False


# ---------------------------------------------------------------------------------------------
# launch


def prepare(runner, raw, shape, device) -> Call:
    """The launch for the inputs ``raw`` over the iteration ``shape``: one value per column of its
    last dim, the leading dims walked as rows (``runner``: the group's ``GroupRunner``)."""
    g = runner.group
    n_cols, rows = shape[-1], math.prod(shape[:-1])
    # (a sum of values computed from constants alone, a zero gradient's column sum, loads no
    # full-size tensor: its rows are walked by index, every stride 0)
    ins = [t.expand(shape) if load.role == "full" else _as_cols(t, n_cols) for t, load in zip(raw, runner.loads)]
    outs = [_alloc_cols(n, n_cols, META) if g.roles[n] == "col" else torch.empty(shape, dtype=fusion.value(n).dtype,
                                                                                 device=META)
            for n in g.outputs]
    lead = list(shape[:-1])
    lead_strides = [list(t.stride()[:-1]) if load.role == "full" else [0] * len(lead)
                    for t, load in zip(ins, runner.loads)]
    sizes, strides = collapse(lead, lead_strides)
    how = launch(runner, rows, n_cols, device)
    xblock, cblock, splits, tiles = (how.block[k] for k in ("XBLOCK", "CBLOCK", "splits", "tiles"))
    int64 = any(max_offset(sizes, st) + (n_cols - 1) * abs(t.stride(-1)) > INT32_MAX
                for st, t in zip(strides, ins)) or rows * n_cols > INT32_MAX
    tail = [s for st in strides for s in st] + [t.stride(-1) for t in ins] + list(sizes) + [rows, n_cols, tiles,
                                                                                        splits]
    meta = {"XBLOCK": xblock, "CBLOCK": cblock, "SPLITS": pow2(splits), "INT64": int64,
            "num_warps": how.num_warps}
    col_blocks = (n_cols + cblock - 1) // cblock
    call = Call(runner.kernel(len(sizes), True), (col_blocks, splits), tail, meta,
                [out_spec(o) for o in outs], device)
    call.workspace = workspace_slots(g) * splits * n_cols if splits > 1 else 0
    call.workspace_dtype = workspace_dtype(g)
    call.col_blocks = col_blocks
    call.transient = runner.transient_scratch
    return call


def launch(runner, rows, n_cols, device) -> Launch:
    """Column blocks of 32 columns and as many row splits as it takes to give every SM two
    programs, each walking at least two tiles. Measured on the H200 (benchmarks/column_tune.py,
    36 combinations of column block, tile, warps and tiles per split over four shapes of
    ``(x * y).sum(0)``): the best overall is 256-row tiles on 4 warps, 64 elements per thread
    (1.11x each shape's best). A real prologue then spills registers (the MLP's GELU-backward
    bias-gradient kernel went from 49 to 97 us, the layer-norm weight gradients from 24 to 47),
    so only light groups (one sum of at most two ops) take it; the others take 64-row tiles on
    8 warps, 8 elements per thread, the best of those holding at most 16 per thread."""
    light = sum(1 for n in runner.group.nodes if runner.group.roles[n] == "full") <= 2 and \
        sum(1 for n in runner.group.nodes if fusion.is_reduction(n)) == 1
    t = runner.tiling.columns
    cblock = min(pow2(n_cols), 16 if runner.interpret else t.cblock)
    elems = 256 if runner.interpret else (t.light_elems if light else t.heavy_elems)
    xblock = min(pow2(rows), max(1, elems // cblock))
    col_blocks = (n_cols + cblock - 1) // cblock
    tiles = (rows + xblock - 1) // xblock
    programs = 4 if runner.interpret else t.programs_per_sm * sm_count(device)
    splits = max(1, min((programs + col_blocks - 1) // col_blocks, tiles // (1 if runner.interpret else t.min_tiles)))
    per_split = (tiles + splits - 1) // splits
    splits = (tiles + per_split - 1) // per_split
    warps = 1 if runner.interpret else (t.light_warps if light else t.heavy_warps)
    return Launch(0, True, {"XBLOCK": xblock, "CBLOCK": cblock, "splits": splits, "tiles": per_split},
                  warps, False)


def _as_cols(t: torch.Tensor, n_cols: int) -> torch.Tensor:
    """A per-column input (shape (C,), (1, .., C) or one value) as a 1-d view of C values."""
    return t.reshape(-1).expand(n_cols) if t.numel() in (1, n_cols) else t.reshape(n_cols)


def _alloc_cols(node, n_cols, device) -> torch.Tensor:
    """A column group's output: one value per column, contiguous, in the node's own shape."""
    meta = fusion.value(node)
    sizes = list(meta.shape) if fusion.static_shape(meta) else [1] * (meta.dim() - 1) + [n_cols]
    return torch.empty(sizes, dtype=meta.dtype, device=device)

