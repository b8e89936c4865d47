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
"""
from __future__ import annotations

from . import fusion
from .emit import Emitter, doc_lines, emit_coordinates, loads_of, node_expression, strided_signature, var_name
from .ops_table import compute_type

__all__ = ["column_source"]


def column_source(group, rank: int) -> str:
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
        em.emit(f"{var_name(r)}_acc = tl.zeros([XBLOCK, CBLOCK], dtype={_acc_type(r)})")
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
            em.emit(f"{var_name(n)}_acc += tl.where(mask, {x}, 0)")
    for i, n in enumerate(group.outputs):
        if group.roles[n] == "full":  # a value ATen reads too (a matmul's input): written once, here
            em.emit(f"tl.store(out{i}_ptr + row * n_cols + cols, tl.broadcast_to({var_name(n)}, [XBLOCK, CBLOCK])"
                    f".to(out{i}_ptr.dtype.element_ty), mask=mask)")
    em.indent = "    "
    em.emit("# this split's sum of each column")
    for r in reductions:
        em.emit(f"{var_name(r)} = tl.sum({var_name(r)}_acc, axis=0)[None, :]")
    em.emit("if SPLITS > 1:")
    em.indent = "        "
    em.emit("# publish the partial sums; the last program to arrive at this column block adds them up")
    for k, r in enumerate(reductions):
        em.emit(f"tl.store(work_ptr + ({k} * splits + split) * n_cols + cols, {var_name(r)}, mask=cmask)")
    em.emit("tl.debug_barrier()")
    em.emit('arrived = tl.atomic_add(count_ptr + tl.program_id(0), 1, sem="acq_rel")')
    em.emit("if arrived == splits - 1:")
    em.indent = "            "
    em.emit("parts = tl.arange(0, SPLITS)[:, None]")
    em.emit("pmask = (parts < splits) & cmask")
    for k, r in enumerate(reductions):
        em.emit(f"{var_name(r)} = tl.sum(tl.load(work_ptr + ({k} * splits + parts) * n_cols + cols, mask=pmask, "
                f"other=0, cache_modifier=\".cg\"), axis=0)[None, :]")
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
        else:
            em.emit(f"{var_name(n)} = {node_expression(em, n)}")
    em._load_role = "full"
    for i, n in enumerate(group.outputs):
        if group.roles[n] != "col":
            continue
        em.emit(f"tl.store(out{i}_ptr + cols, tl.broadcast_to({var_name(n)}, [1, CBLOCK])"
                f".to(out{i}_ptr.dtype.element_ty), mask=cmask)")
