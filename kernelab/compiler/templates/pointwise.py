"""The pointwise template: every element of the group's iteration shape computed once.

A flat index over the collapsed iteration space (its rank is what is left after merging the dims
every operand walks alike); full blocks run without a mask so loads stay 16-byte vectors when the
size is not a multiple of 16; only the last block is masked. The same template gathers (a source
read at computed indices), places a cat's pieces, and adds scattered values into zeroed buffers:
those kernels keep every dim, because coordinates along given dims matter.

Owns the kernel's source (:func:`source`), its launch configuration (:func:`launch`) and its
outputs' layouts (:func:`prepare`).
"""
from __future__ import annotations

import math

import torch

from .. import emit, fusion, layout
from ..emit import (Emitter, doc_lines, emit_coordinates, gather_of, loads_of, node_expression, piece_of,
                    scatter_outputs, var_name)
from ..ops_table import compute_type
from .base import INT32_MAX, META, Call, Launch, collapse, max_offset, out_spec, pow2

__all__ = ["KIND", "CATEGORY", "source", "prepare", "launch", "reads_before_it_stores"]

KIND = "pointwise"
CATEGORY = "pointwise"  # what a predicted kernel of this template counts as (``kernelab count``)


# ---------------------------------------------------------------------------------------------
# source


def source(group, rank: int, persistent: bool = True) -> str:
    """The kernel's function (``persistent`` is the rows template's; a pointwise kernel has one
    variant per rank)."""
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
    sstrides = _scatter_stride_params(group)
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



def _scatter_stride_params(group) -> list[str]:
    """The parameters of each scatter buffer's strides along its indexed dims, in output order."""
    chains = {}
    for n, i in scatter_outputs(group).items():
        chains.setdefault(i, len(fusion.scatter_parts(n).indices))
    return [f"out{i}_sstride{t}" for i in sorted(chains) for t in range(chains[i])]



def reads_before_it_stores(group) -> bool:
    """Each element of every input is loaded at the element the kernel stores: an output may take
    the memory of an input read once, as a whole (``GroupRunner.reusable``)."""
    return True


# ---------------------------------------------------------------------------------------------
# launch


def prepare(runner, raw, shape, device) -> Call:
    """The launch for the inputs ``raw`` over the iteration ``shape`` (``runner``: the group's
    ``GroupRunner``: its loads, padded outputs, kernel variants and reuse pairs)."""
    g = runner.group
    pieces = [load.role.startswith(("piece", "gsrc", "gidx", "sidx")) for load in runner.loads]
    ins = [_placed(t, load, g, shape) for t, load in zip(raw, runner.loads)]
    scatters = {i: n for n, i in emit.scatter_outputs(g).items()}  # output index -> a scatter into it
    # layouts only, no memory: a scatter's buffer in its own shape, the others in the group's
    outs = [torch.empty(fusion.value(n).shape, dtype=fusion.value(n).dtype, device=META) if i in scatters
            else _alloc(n, shape, META, runner.padded.get(n)) for i, n in enumerate(g.outputs)]
    walked = [_scatter_view(o, scatters[i]) if i in scatters else o for i, o in enumerate(outs)]
    if any(pieces) or scatters:  # coordinates of given dims matter (a cat's, a gather's, a scatter's)
        sizes, strides = list(shape), [list(t.stride()) for t in ins + walked]
    else:
        order = layout.memory_order(outs[0] if outs else ins[0])
        sizes, strides = collapse([shape[d] for d in order], [[t.stride(d) for d in order] for t in ins + outs])
    numel = math.prod(sizes)
    # gather sources and scatter buffers: an index may reach any of their elements
    reached = [t for t, load in zip(raw, runner.loads) if load.role.startswith("gsrc")] + \
        [outs[i] for i in sorted(scatters)]
    how = launch(runner, sizes, strides + [list(t.stride()) for t in reached], numel, [list(t.shape) for t in reached])
    block = how.block["BLOCK"]
    tail = [s for st in strides for s in st] + _gather_strides(raw, runner.loads, g) + \
        _scatter_strides(outs, scatters) + list(sizes) + [numel]
    return Call(runner.kernel(how.rank, True), ((numel + block - 1) // block,), tail,
                {"BLOCK": block, "INT64": how.int64, "num_warps": how.num_warps},
                [out_spec(o) for o in outs], device, zeroed=tuple(sorted(scatters)),
                reuse=runner.reuse_for_call(raw, ins, outs))


def launch(runner, sizes, strides, numel, source_sizes=()) -> Launch:
    """``source_sizes``: the sizes of gathers' sources, whose strides end ``strides``: an index
    may reach any of their elements."""
    # 8 elements a thread of 2048-element blocks (``tiling.PointwiseTiling``); interpreted,
    # bigger blocks are faster
    t = runner.tiling.pointwise
    block = min(pow2(numel), 1 << 16 if runner.interpret else pow2(t.block))
    warps = max(1, min(8, block // (32 * t.per_thread)))
    sizes_of = [sizes] * (len(strides) - len(source_sizes)) + list(source_sizes)
    int64 = numel > INT32_MAX or any(max_offset(sz, st) > INT32_MAX for sz, st in zip(sizes_of, strides))
    return Launch(len(sizes), True, {"BLOCK": block}, warps, int64)


def _placed(t: torch.Tensor, load, group, shape) -> torch.Tensor:
    """An input as the pointwise kernel walks it over ``shape``: broadcast (expanded); a cat's
    piece with its own strides; a gather's source as a view of ``shape`` that walks the source's
    kept dims and stays put along the indices' dims (the kernel adds index x stride for those); an
    index tensor right-aligned against the dims before the kept trailing ones."""
    if load.role.startswith("piece"):
        return t
    parts = emit.gather_of(group, load)
    if parts is None:
        return t.expand(shape)
    if load.role.startswith("gsrc"):
        # the gather's own result shape first, then broadcast like any operand (a position
        # embedding's (S, D) gathered into a (B, S, D) kernel: GPT-2's wte(ids) + wpe(positions))
        strides = (list(t.stride()[:parts.first]) + [0] * parts.broadcast
                   + list(t.stride()[parts.first + len(parts.indices):]))
        return t.as_strided(parts.shape, strides, t.storage_offset()).expand(shape)
    return t[(...,) + (None,) * parts.trail].expand(shape)


def _gather_strides(raw, loads, group) -> list[int]:
    """Per gather source, in load order, its strides along the indexed dims (the kernel's
    ``in{i}_gstride{t}``)."""
    out = []
    for t, load in zip(raw, loads):
        if load.role.startswith("gsrc"):
            parts = emit.gather_of(group, load)
            out += [t.stride(parts.first + k) for k in range(len(parts.indices))]
    return out


def _scatter_view(buf: torch.Tensor, scatter) -> torch.Tensor:
    """A scatter's buffer as the pointwise kernel walks it over the values' shape: along the
    buffer's kept dims, put along the indices' broadcast dims (the kernel adds index x stride)."""
    parts = fusion.scatter_parts(scatter)
    strides = (list(buf.stride()[:parts.first]) + [0] * parts.broadcast
               + list(buf.stride()[parts.first + len(parts.indices):]))
    return buf.as_strided(parts.shape, strides)


def _scatter_strides(outs, scatters: dict) -> list[int]:
    """Per scatter buffer, in output order, its strides along the indexed dims (the kernel's
    ``out{i}_sstride{t}``)."""
    out = []
    for i in sorted(scatters):
        parts = fusion.scatter_parts(scatters[i])
        out += [outs[i].stride(parts.first + t) for t in range(len(parts.indices))]
    return out


def _alloc(node, shape, device, row_stride: int | None = None) -> torch.Tensor:
    """A pointwise output in the layout eager would give it (the dense layout its meta value has),
    or row-major with rows ``row_stride`` apart (``layout.py``)."""
    meta = fusion.value(node)
    if row_stride is not None and list(shape) == list(meta.shape):
        return torch.empty_strided(shape, layout.padded_strides(shape, row_stride), dtype=meta.dtype, device=device)
    order = layout.memory_order(meta) if meta.dim() == len(shape) else list(range(len(shape)))
    if sorted(order) != list(range(len(shape))) or meta.is_contiguous():
        return torch.empty(shape, dtype=meta.dtype, device=device)
    perm_shape = [shape[d] for d in order]
    t = torch.empty(perm_shape, dtype=meta.dtype, device=device)
    inverse = [order.index(d) for d in range(len(shape))]
    return t.permute(inverse)
