"""Group -> Triton source: one readable kernel per group, built from the op table.

Templates taking arguments in the project's order (pointers, strides, sizes, runtime scalars,
ALL_CAPS constexprs); the column-reduction template is in ``columns.py``:

* pointwise: a flat index over the collapsed iteration space (its rank is what is left after
  merging the dims every operand walks alike); full blocks run without a mask so loads stay 16-byte vectors when the
  size is not a multiple of 16; only the last block is masked.
* reduction: ``XBLOCK`` rows per program. Persistent (the row fits one block of ``RBLOCK``): each
  input is loaded once, every op and reduction computed in registers, each output stored once.
  Looped (long rows): one pass over the row per reduction step, recomputing the pointwise prologue
  from the inputs, then a last pass that stores the full-size outputs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.fx as fx

from . import fusion
from .ops_table import COMPARE, NO_PROMOTION, POINTWISE, compute_type, literal

__all__ = ["Load", "kernel_source", "loads_of"]


@dataclass(frozen=True)
class Load:
    """One external input as a kernel reads it: every element ("full"), one value per row, or
    one value per column."""

    node: object  # fx.Node
    role: str  # "full" | "row" | "col"


def loads_of(group) -> list[Load]:
    """The loads of a group in a stable order (an input read both ways is loaded twice). In a row
    reduction, an input that is the same all along the row (a scalar, or size 1 in the last dim:
    a cross-entropy's per-row max, log-sum, target and scale) is loaded once per row even where
    full-size nodes read it, not once per element and pass."""
    loads = []
    per_value = "col" if group.kind == "column" else "row"
    for j, n in enumerate(group.nodes):
        if fusion.is_cat(n):  # each piece read masked to its range of the cat's dim
            loads += [Load(p, f"piece{j}.{k}") for k, (p, _, _) in enumerate(fusion.cat_pieces(n))]
            continue
        role = "full" if group.roles[n] == "full" or fusion.is_reduction(n) else per_value
        for p in n.all_input_nodes:
            if p in group.inputs:
                load = Load(p, "row" if group.kind == "reduction" and fusion.constant_along_rows(p) else role)
                if load not in loads:
                    loads.append(load)
    return loads


def piece_of(group, load) -> tuple | None:
    """(cat node, its dim, the piece's start and end along it) of a piece load, else None."""
    if not load.role.startswith("piece"):
        return None
    j, k = (int(v) for v in load.role[len("piece"):].split("."))
    cat = group.nodes[j]
    _, start, end = fusion.cat_pieces(cat)[k]
    return cat, fusion.cat_dim(cat), start, end


def arange_of(node, group) -> tuple | None:
    """(start, step) of a static arange constant (``rewrites``' graph buffers) that runs along a row
    reduction's last dim: the kernel computes it from its column index instead of loading it."""
    found = node.meta.get("kl_arange")
    v = fusion.value(node)
    if (found is None or group.kind != "reduction" or v.dim() != 1 or v.dtype.is_floating_point
            or v.shape[0] != group.shape[-1]):
        return None
    return found


@dataclass
class _Emitter:
    group: object
    loads: list
    lines: list = field(default_factory=list)
    names: dict = field(default_factory=dict)  # node or Load -> source name
    online: dict = field(default_factory=dict)  # amax node -> its online sum node (looped only)
    indent: str = "    "

    def emit(self, line: str) -> None:
        self.lines.append(self.indent + line if line else "")

    def operand(self, arg, want: str | None):
        """Source for one argument, cast to the compute type ``want`` where it differs."""
        if not isinstance(arg, fx.Node):
            return literal(arg) if isinstance(arg, (int, float, bool)) else repr(arg)
        if fusion.is_constant(arg):
            return literal(fusion.constant_value(arg))
        name = self._name_of(arg)
        if fusion.is_scalar(arg):
            return name
        have = compute_type(fusion.value(arg).dtype)
        if want and have != want:
            return f"({name} != 0)" if want == "tl.int1" else f"{name}.to({want})"
        return name

    def cat_expression(self, node) -> str:
        """cat(pieces, d): each element from the piece whose range of dim d holds it (every piece
        was loaded masked to its range, so one comparison a piece picks it)."""
        d = fusion.cat_dim(node)
        pieces = fusion.cat_pieces(node)
        j = self.group.nodes.index(node)
        names = [self.names[p, f"piece{j}.{k}"] for k, (p, _, _) in enumerate(pieces)]
        expr = names[-1]
        for name, (_, _, end) in zip(reversed(names[:-1]), reversed(pieces[:-1])):
            expr = f"tl.where(i{d} < {end}, {name}, {expr})"
        return expr

    def _name_of(self, node):
        if node in self.group.roles:
            return self.names[node]
        if node in self.group.scalars:
            return f"s{self.group.scalars.index(node)}"
        return self.names[node, self._load_role]

    _load_role = "full"


def local_name(node) -> str:
    """A node's name inside its kernel's source: positional (``n3``, ``i0``, ``s1``), set by
    :func:`kernel_source`, so that the same group in every repeated layer of a model generates the
    same text and compiles once (the cache is keyed by the source hash)."""
    return node.meta.get("kl_local", node.name)


def _name_locally(group) -> None:
    for prefix, nodes in (("n", group.nodes), ("i", group.inputs), ("s", group.scalars)):
        for i, node in enumerate(nodes):
            node.meta["kl_local"] = f"{prefix}{i}"


def _var(node) -> str:
    return f"v_{local_name(node)}"


def _doc(group, loads, passes: str = "once") -> list[str]:
    lines = [f'"""{group.name}: {len(group.nodes)} ops fused, {group.kind}.', ""]
    for n in group.nodes:
        args = ", ".join(local_name(a) if isinstance(a, fx.Node) else repr(a) for a in n.args)
        lines.append(f"{local_name(n)} = {fusion.target_name(n).split('.')[1]}({args})  [{group.roles[n]}]")
    lines.append("")
    lines.append(f"Traffic: reads {len(loads)} input(s) {passes}, writes {len(group.outputs)} output(s) once;"
                 " nothing in between touches memory.")
    lines.append('"""')
    return lines


# ---------------------------------------------------------------------------------------------
# node expressions


def _op_types(node) -> tuple[str | None, str]:
    """(type each tensor operand is cast to, type of the result)."""
    name = fusion.target_name(node)
    out = compute_type(fusion.value(node).dtype)
    if name in COMPARE:
        vals = [fusion.value(a) if hasattr(a, "meta") else a for a in node.args[:2]]
        probe = [torch.empty((0,) if v.dim() else (), dtype=v.dtype) if isinstance(v, torch.Tensor) else v for v in vals]
        return compute_type(torch.result_type(*probe)), out
    if name in NO_PROMOTION:
        return None, out
    return out, out


def node_expression(em: _Emitter, node) -> str:
    """The Triton expression of one pointwise or view node."""
    name = fusion.target_name(node)
    if fusion.is_cat(node):
        return em.cat_expression(node)
    want, out = _op_types(node)
    if name not in POINTWISE:  # a view kept inside the kernel: the same values
        return em.operand(node.args[0], None)
    args = fusion.bound_args(node)
    bound = {}
    for key, value in args.items():
        if key == "condition":
            bound[key] = em.operand(value, "tl.int1")
        elif key in ("self", "other", "a", "input", "exponent", "min", "max"):
            bound[key] = em.operand(value, want if name != "aten.where.self" else out)
        elif isinstance(value, str):
            bound[key] = repr(value)
        else:
            bound[key] = literal(value) if isinstance(value, (int, float, bool)) else repr(value)
    expr = POINTWISE[name](bound)
    if name in ("prims.convert_element_type.default", "aten._to_copy.default"):
        expr = _convert(expr, fusion.value(node.args[0]).dtype, fusion.value(node).dtype)
    return expr


def _convert(expr: str, src: torch.dtype, dst: torch.dtype) -> str:
    """An explicit cast: round to a narrower float where it is written (x.half().float() rounds)."""
    have, want = compute_type(src), compute_type(dst)
    if dst in (torch.float16, torch.bfloat16) and src != dst:
        narrow = "tl.float16" if dst == torch.float16 else "tl.bfloat16"
        return f"{expr}.to({narrow}).to(tl.float32)"
    if want == "tl.int1" and have != "tl.int1":
        return f"({expr} != 0)"
    return expr if have == want else f"{expr}.to({want})"


# ---------------------------------------------------------------------------------------------
# pointwise template


def pointwise_source(group, rank: int) -> str:
    loads = loads_of(group)
    em = _Emitter(group, loads)
    ins = [f"in{i}" for i in range(len(loads))]
    outs = [f"out{i}" for i in range(len(group.outputs))]
    tensors = ins + outs
    params = [", ".join(f"{t}_ptr" for t in tensors) + ","]
    params.append(", ".join(f"{t}_stride{d}" for t in tensors for d in range(rank)) + ",")
    params.append(", ".join(f"size{d}" for d in range(rank)) + ", numel,")
    if group.scalars:
        params.append(", ".join(f"s{i}" for i in range(len(group.scalars))) + ",")
    params.append("BLOCK: tl.constexpr, INT64: tl.constexpr,")
    src = ["@triton.jit", f"def {group.name}("] + ["    " + p for p in params] + ["):"]
    em.lines = []
    for line in _doc(group, loads):
        em.emit(line)
    em.emit("if INT64:")
    em.emit("    start = tl.program_id(0).to(tl.int64) * BLOCK")
    em.emit("else:")
    em.emit("    start = tl.program_id(0) * BLOCK")
    em.emit("offs = start + tl.arange(0, BLOCK)")
    em.emit(f"# coordinates of each element in the collapsed {rank}-d iteration space")
    _emit_coordinates(em, "offs", "i", rank)
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


def _emit_coordinates(em: _Emitter, linear: str, prefix: str, rank: int) -> None:
    """Split a linear index into per-dim coordinates {prefix}0..{prefix}{rank-1} (last dim fastest)."""
    rest = linear
    for d in range(rank - 1, 0, -1):
        em.emit(f"{prefix}{d} = {rest} % size{d}")
        em.emit(f"q{d} = {rest} // size{d}")
        rest = f"q{d}"
    em.emit(f"{prefix}0 = {rest}")


def _pointwise_body(em: _Emitter, loads, outs, mask) -> None:
    em.indent = "        "
    m = f", mask={mask}, other=0" if mask else ""
    em.emit("# load each input once")
    for i, load in enumerate(loads):
        ct = compute_type(fusion.value(load.node).dtype)
        em.names[load.node, load.role] = f"in{i}"
        if load.role.startswith("piece"):
            within = f"in{i}_in & {mask}" if mask else f"in{i}_in"
            em.emit(f"in{i} = tl.load(in{i}_ptr + in{i}_off, mask={within}, other=0).to({ct})")
            continue
        em.emit(f"in{i} = tl.load(in{i}_ptr + in{i}_off{m}).to({ct})")
    em.emit("# compute")
    for n in em.group.nodes:
        em.names[n] = _var(n)
        em.emit(f"{_var(n)} = {node_expression(em, n)}")
    em.emit("# store each output once")
    sm = f", mask={mask}" if mask else ""
    for i, n in enumerate(em.group.outputs):
        em.emit(f"tl.store(out{i}_ptr + out{i}_off, {_var(n)}.to(out{i}_ptr.dtype.element_ty){sm})")
    em.indent = "    "


# ---------------------------------------------------------------------------------------------
# reduction template


def reduction_source(group, rank: int, persistent: bool) -> str:
    loads = loads_of(group)
    em = _Emitter(group, loads)
    src = strided_signature(group, loads, rank, scratch="", inner="r", sizes="rows, n_cols, out_row,",
                            constexprs=("XBLOCK", "RBLOCK", "INT64"))
    for line in _doc(group, loads, "once" if persistent else "once per pass over the row"):
        em.emit(line)
    em.emit("if INT64:")
    em.emit("    row = tl.program_id(0).to(tl.int64) * XBLOCK + tl.arange(0, XBLOCK)[:, None]")
    em.emit("else:")
    em.emit("    row = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]")
    em.emit("xmask = row < rows")
    em.emit(f"# coordinates of each row in the collapsed {rank}-d leading dims")
    _emit_coordinates(em, "row", "r", rank)
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
        from .loops import looped_body

        looped_body(em, loads)
    if any(group.roles[n] == "row" for n in group.outputs):
        em.emit("# store the per-row outputs")
    for i, n in enumerate(group.outputs):
        if group.roles[n] == "row":
            em.emit(f"tl.store(out{i}_ptr + row, {_var(n)}.to(out{i}_ptr.dtype.element_ty), mask=xmask)")
    return "\n".join(src + em.lines) + "\n"


def strided_signature(group, loads, rank: int, *, scratch: str, inner: str, sizes: str,
                      constexprs: tuple) -> list[str]:
    """The ``@triton.jit`` def line and parameters of a reduction-like template: pointers (inputs,
    outputs, then ``scratch`` pointers), each input's strides over the ``rank`` collapsed outer
    dims and along the reduced or kept inner dim (``_stride_{inner}``), the sizes, runtime
    scalars, constexprs."""
    ins = [f"in{i}" for i in range(len(loads))]
    outs = [f"out{i}" for i in range(len(group.outputs))]
    params = [", ".join(f"{t}_ptr" for t in ins + outs) + "," + (f" {scratch}" if scratch else "")]
    if ins:
        params.append(", ".join(f"{t}_stride{d}" for t in ins for d in range(rank)) + ",")
        params.append(", ".join(f"{t}_stride_{inner}" for t in ins) + ",")
    params.append(", ".join(f"size{d}" for d in range(rank)) + f", {sizes}")
    if group.scalars:
        params.append(", ".join(f"s{i}" for i in range(len(group.scalars))) + ",")
    params.append(" ".join(f"{c}: tl.constexpr," for c in constexprs))
    return ["@triton.jit", f"def {group.name}("] + ["    " + p for p in params] + ["):"]


def _full_load(em: _Emitter, i: int, load) -> None:
    ct = compute_type(fusion.value(load.node).dtype)
    arange = arange_of(load.node, em.group)
    if arange is not None:  # start + step * column: nothing to read
        start, step = (literal(v) for v in arange)
        em.emit(f"in{i} = ({start} + {step} * (tl.zeros([XBLOCK, 1], tl.int32) + cols)).to({ct})")
        return
    em.emit(f"in{i} = tl.load(in{i}_ptr + in{i}_row + cols * in{i}_stride_r, mask=mask, other=0).to({ct})")


def _emit_node(em: _Emitter, n) -> None:
    role = em.group.roles[n]
    em._load_role = "row" if role == "row" and not fusion.is_reduction(n) else "full"
    em.names[n] = _var(n)
    if not fusion.is_reduction(n):
        em.emit(f"{_var(n)} = {node_expression(em, n)}")


def _reduce_expr(em: _Emitter, n) -> list[str]:
    """The lines computing one reduction of a persistent row in registers."""
    kind = fusion.reduction_kind(n)
    want = compute_type(fusion.value(n).dtype)
    em._load_role = "full"
    x = em.operand(n.args[0], want)
    xb = f"tl.broadcast_to({x}, [XBLOCK, RBLOCK])"
    v = _var(n)
    if kind in ("sum", "mean"):
        lines = [f"{v} = tl.sum(tl.where(mask, {xb}, 0), axis=1)[:, None]"]
        return lines + ([f"{v} = {v} / n_cols"] if kind == "mean" else [])
    if kind in ("max", "min"):
        fill = 'float("-inf")' if kind == "max" else 'float("inf")'
        return [f"{v} = klm.{kind}_rows(tl.where(mask, {xb}, {fill}))[:, None]"]
    corr = _correction(n)
    return [f"{v}_mean = tl.sum(tl.where(mask, {xb}, 0), axis=1)[:, None] / n_cols",
            f"{v}_dev = tl.where(mask, {xb} - {v}_mean, 0)",
            f"{v} = tl.sum({v}_dev * {v}_dev, axis=1)[:, None] / (n_cols - {corr})"]


def _correction(n) -> str:
    args = fusion.bound_args(n)
    c = args.get("correction")
    return literal(float(1 if c is None else c))


def _persistent_body(em: _Emitter, loads) -> None:
    em.emit("# the whole row fits one block: load each input once, compute in registers")
    em.emit("cols = tl.arange(0, RBLOCK)[None, :]")
    em.emit("rmask = cols < n_cols")
    em.emit("mask = xmask & rmask")
    for i, load in enumerate(loads):
        if load.role == "full":
            _full_load(em, i, load)
    for n in em.group.nodes:
        _emit_node(em, n)
        if fusion.is_reduction(n):
            em.emit(f"# reduce over the row: {fusion.reduction_kind(n)}")
            for line in _reduce_expr(em, n):
                em.emit(line)
    em.emit("# store the full-size outputs")
    for i, n in enumerate(em.group.outputs):
        if em.group.roles[n] == "full":
            em.emit(f"tl.store(out{i}_ptr + row * out_row + cols, "
                    f"tl.broadcast_to({_var(n)}, [XBLOCK, RBLOCK]).to(out{i}_ptr.dtype.element_ty), mask=mask)")


HEADER = ('"""Generated by kernelab.compiler: do not edit."""\n'
          "import triton\nimport triton.language as tl\n\nfrom kernelab.compiler import kl_math as klm\n\n\n")


def kernel_source(group, rank: int, persistent: bool = True) -> str:
    """The whole module text of one kernel variant."""
    _name_locally(group)
    if group.kind == "pointwise":
        return HEADER + pointwise_source(group, rank)
    if group.kind == "column":
        from .columns import column_source

        return HEADER + column_source(group, rank)
    return HEADER + reduction_source(group, rank, persistent)
