"""Group -> Triton source: one readable kernel per group, built from the op table.

Templates taking arguments in the project's order (pointers, strides, sizes, runtime scalars,
ALL_CAPS constexprs); the column-reduction template is in ``columns.py``, the looped row body in
``loops.py``, and what all of them share (loads, the emitter, node expressions) in ``emit.py``:

* pointwise: a flat index over the collapsed iteration space (its rank is what is left after
  merging the dims every operand walks alike); full blocks run without a mask so loads stay 16-byte vectors when the
  size is not a multiple of 16; only the last block is masked.
* reduction: ``XBLOCK`` rows per program. Persistent (the row fits one block of ``RBLOCK``): each
  input is loaded once, every op and reduction computed in registers, each output stored once.
  Looped (long rows): one pass over the row per reduction step, recomputing the pointwise prologue
  from the inputs, then a last pass that stores the full-size outputs.
"""
from __future__ import annotations

from . import fusion
from .columns import column_source
from .emit import (Emitter, correction, doc_lines, emit_coordinates, emit_node, full_load, gather_of, loads_of,
                   name_locally, node_expression, piece_of, scatter_outputs, strided_signature, var_name)
from .loops import looped_body
from .ops_table import compute_type

__all__ = ["kernel_source", "pointwise_source", "reduction_source", "HEADER"]


# ---------------------------------------------------------------------------------------------
# pointwise template


def pointwise_source(group, rank: int) -> str:
    loads = loads_of(group)
    em = Emitter(group, loads)
    ins = [f"in{i}" for i in range(len(loads))]
    outs = [f"out{i}" for i in range(len(group.outputs))]
    tensors = ins + outs
    params = [", ".join(f"{t}_ptr" for t in tensors) + ","]
    params.append(", ".join(f"{t}_stride{d}" for t in tensors for d in range(rank)) + ",")
    gstrides = [f"in{i}_gstride{t}" for i, load in enumerate(loads) if load.role.startswith("gsrc")
                for t in range(len(gather_of(group, load).indices))]
    if gstrides:  # a gather source's strides along its indexed dims
        params.append(", ".join(gstrides) + ",")
    sstrides = scatter_strides(group)
    if sstrides:  # a scatter buffer's strides along its indexed dims
        params.append(", ".join(sstrides) + ",")
    params.append(", ".join(f"size{d}" for d in range(rank)) + ", numel,")
    if group.scalars:
        params.append(", ".join(f"s{i}" for i in range(len(group.scalars))) + ",")
    params.append("BLOCK: tl.constexpr, INT64: tl.constexpr,")
    src = ["@triton.jit", f"def {group.name}("] + ["    " + p for p in params] + ["):"]
    em.lines = []
    for line in doc_lines(group, loads):
        em.emit(line)
    em.emit("if INT64:")
    em.emit("    start = tl.program_id(0).to(tl.int64) * BLOCK")
    em.emit("else:")
    em.emit("    start = tl.program_id(0) * BLOCK")
    em.emit("offs = start + tl.arange(0, BLOCK)")
    em.emit(f"# coordinates of each element in the collapsed {rank}-d iteration space")
    emit_coordinates(em, "offs", "i", rank)
    pieces = {i: piece_of(group, load) for i, load in enumerate(loads)}
    for i, t in enumerate(tensors):
        piece = pieces.get(i)
        coords = [f"(i{d} - {piece[2]})" if piece and d == piece[1] and piece[2] else f"i{d}" for d in range(rank)]
        em.emit(f"{t}_off = " + " + ".join(f"{c} * {t}_stride{d}" for d, c in enumerate(coords)))
        if piece:
            em.emit(f"{t}_in = (i{piece[1]} >= {piece[2]}) & (i{piece[1]} < {piece[3]})  # the piece's range")
    em.emit("if start + BLOCK <= numel:")
    em.emit("    # a full block: no mask, so loads and stores stay 16-byte vectors")
    _pointwise_body(em, loads, outs, None)
    em.emit("else:")
    em.emit("    # the last, partial block")
    em.emit("    mask = offs < numel")
    _pointwise_body(em, loads, outs, "mask")
    return "\n".join(src + em.lines) + "\n"


def _pointwise_body(em: Emitter, loads, outs, mask) -> None:
    em.indent = "        "
    em.mask = mask
    m = f", mask={mask}, other=0" if mask else ""
    em.emit("# load each input once")
    for i, load in enumerate(loads):
        ct = compute_type(fusion.value(load.node).dtype)
        em.names[load.node, load.role] = f"in{i}"
        if load.role.startswith("gsrc"):  # read where its gather is computed, at the indices
            continue
        if load.role.startswith("piece"):
            within = f"in{i}_in & {mask}" if mask else f"in{i}_in"
            em.emit(f"in{i} = tl.load(in{i}_ptr + in{i}_off, mask={within}, other=0).to({ct})")
            continue
        em.emit(f"in{i} = tl.load(in{i}_ptr + in{i}_off{m}).to({ct})")
    em.emit("# compute")
    for n in em.group.nodes:
        em.names[n] = var_name(n)
        em.emit(f"{var_name(n)} = {node_expression(em, n)}")
    em.emit("# store each output once")
    sm = f", mask={mask}" if mask else ""
    scatters = scatter_outputs(em.group)
    for i, n in enumerate(em.group.outputs):
        if n not in scatters:
            em.emit(f"tl.store(out{i}_ptr + out{i}_off, {var_name(n)}.to(out{i}_ptr.dtype.element_ty){sm})")
    if scatters:
        em.emit("# add each scattered value into its buffer (zeroed by the runner) at its place")
    for n, i in scatters.items():
        em.emit(em.scatter_store(n, i))
    em.indent = "    "


def scatter_strides(group) -> list[str]:
    """The parameters of each scatter buffer's strides along its indexed dims, in output order."""
    chains = {}
    for n, i in scatter_outputs(group).items():
        chains.setdefault(i, len(fusion.scatter_parts(n).indices))
    return [f"out{i}_sstride{t}" for i in sorted(chains) for t in range(chains[i])]


# ---------------------------------------------------------------------------------------------
# reduction template


def reduction_source(group, rank: int, persistent: bool) -> str:
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


HEADER = ('"""Generated by kernelab.compiler: do not edit."""\n'
          "import triton\nimport triton.language as tl\n\nfrom kernelab.compiler import kl_math as klm\n\n\n")


def kernel_source(group, rank: int, persistent: bool = True) -> str:
    """The whole module text of one kernel variant."""
    name_locally(group)
    if group.kind == "pointwise":
        return HEADER + pointwise_source(group, rank)
    if group.kind == "column":
        return HEADER + column_source(group, rank)
    return HEADER + reduction_source(group, rank, persistent)
