"""What every kernel template shares: the loads of a group, the emitter that names values and
writes lines, the Triton expression of each pointwise node, the signature of strided templates,
and the helpers both row-reduction bodies use (persistent in ``templates/rows.py``, looped in
``templates/rows_looped.py``). The templates (``templates/``: ``pointwise.py``, ``rows.py`` with
``rows_looped.py``, ``columns.py``) import from here and not from each other (the rows template's
looped body aside).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.fx as fx

from . import fusion
from .ops_table import COMPARE, NARROW_FLOATS, NO_PROMOTION, POINTWISE, ROUNDS_ITS_OPERANDS, compute_type, literal, tl_type

__all__ = ["Load", "loads_of", "piece_of", "gather_of", "arange_of", "Emitter", "local_name", "name_locally",
           "var_name", "doc_lines", "node_expression", "emit_coordinates", "strided_signature", "full_load",
           "emit_node", "correction"]


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
        if fusion.is_cat(n):  # each piece read masked to its range of the cat's dim (a fill: no read)
            loads += [Load(p, f"piece{j}.{k}") for k, (p, _, _) in enumerate(fusion.cat_pieces(n))
                      if not fusion.is_constant(p)]
            continue
        if fusion.is_gather(n):  # the source read at the indices; indices from memory right-aligned
            parts = fusion.gather_parts(n)
            loads.append(Load(parts.source, f"gsrc{j}"))
            loads += [Load(i, f"gidx{j}.{t}") for t, i in enumerate(parts.indices) if i in group.inputs]
            continue
        if fusion.is_scatter(n):  # values read in place; indices from memory right-aligned; no base
            values = n.args[2]
            if values in group.inputs and Load(values, "full") not in loads:
                loads.append(Load(values, "full"))
            loads += [Load(i, f"sidx{j}.{t}") for t, i in enumerate(fusion.scatter_parts(n).indices)
                      if i in group.inputs]
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


def gather_of(group, load):
    """The ``fusion.GatherParts`` of the gather a source ("gsrc") or index ("gidx") load feeds, or of
    the scatter an index load ("sidx") feeds, else None."""
    for prefix in ("gsrc", "gidx", "sidx"):
        if load.role.startswith(prefix):
            node = group.nodes[int(load.role[len(prefix):].split(".")[0])]
            return fusion.scatter_parts(node) if prefix == "sidx" else fusion.gather_parts(node)
    return None


def scatter_outputs(group) -> dict:
    """Each scatter node of ``group`` -> the index in ``group.outputs`` of the buffer it adds into
    (the last scatter of its chain into one zero fill)."""
    out = {}
    for n in group.nodes:
        if fusion.is_scatter(n):
            end = n
            while end not in group.outputs:
                end = next(u for u in end.users if fusion.is_scatter(u) and u.args[0] is end)
            out[n] = group.outputs.index(end)
    return out


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
class Emitter:
    group: object
    loads: list
    lines: list = field(default_factory=list)
    names: dict = field(default_factory=dict)  # node or Load -> source name
    online: dict = field(default_factory=dict)  # amax node -> its online sum node (looped only)
    indent: str = "    "
    mask: str | None = None  # the pointwise body's mask (None in a full block): a gather's load takes it

    def emit(self, line: str) -> None:
        self.lines.append(self.indent + line if line else "")

    def operand(self, arg, want: str | None, common: torch.dtype | None = None):
        """Source for one argument, cast to the compute type ``want`` where it differs. ``common``:
        the op's common dtype (type promotion); a tensor of another dtype is converted to it
        first, as ATen does, so an int64 of 2**40 or 2049 meets a float16 as inf or 2048."""
        if not isinstance(arg, fx.Node):
            return literal(arg) if isinstance(arg, (int, float, bool)) else repr(arg)
        if fusion.is_constant(arg):
            return literal(fusion.constant_value(arg))
        name = self._name_of(arg)
        if fusion.is_scalar(arg):
            return name
        dtype = fusion.value(arg).dtype
        have = compute_type(dtype)
        if common in NARROW_FLOATS and dtype != common:
            # via float32, as c10::Half(int64) converts: through float
            return f"{name}.to(tl.float32).to({tl_type(common)}).to(tl.float32)"
        if want and have != want:
            return f"({name} != 0)" if want == "tl.int1" else f"{name}.to({want})"
        return name

    def block(self, arg, want: str, shape: str) -> str:
        """``arg`` as a block of ``shape`` (a reduction's input): a tensor is broadcast; an inlined
        constant is a Python number there, which has no shape, so it is filled (a sum of ones:
        wav2vec2's output lengths from an all-ones mask)."""
        if not isinstance(arg, fx.Node) or fusion.is_constant(arg):
            return f"tl.full({shape}, {self.operand(arg, want)}, {want})"
        return f"tl.broadcast_to({self.operand(arg, want)}, {shape})"

    def cat_expression(self, node) -> str:
        """cat(pieces, d): each element from the piece whose range of dim d holds it (every piece
        was loaded masked to its range, so one comparison a piece picks it)."""
        d = fusion.cat_dim(node)
        pieces = fusion.cat_pieces(node)
        j = self.group.nodes.index(node)
        # a fill (a constant pad's value: ``rewrites.pads_as_cats``) is its literal, read from nowhere
        want = compute_type(fusion.value(node).dtype)
        names = [self.operand(p, want) if fusion.is_constant(p) else self.names[p, f"piece{j}.{k}"]
                 for k, (p, _, _) in enumerate(pieces)]
        expr = names[-1]
        for name, (_, _, end) in zip(reversed(names[:-1]), reversed(pieces[:-1])):
            expr = f"tl.where(i{d} < {end}, {name}, {expr})"
        return expr

    def gather_expression(self, node) -> str:
        """source[..., i, j, ...]: one load at the element's place in the source's kept dims
        (``in{k}_off``, from the view the runner passes) plus index x stride along each indexed
        dim. The indices are proved in range when compiling (``bounds``); lanes outside the last
        block are masked."""
        j = self.group.nodes.index(node)
        parts = fusion.gather_parts(node)
        k = self.loads.index(Load(parts.source, f"gsrc{j}"))
        terms = []
        for t, index in enumerate(parts.indices):
            terms.append(f"{self._index_name(index, f'gidx{j}.{t}')}.to(tl.int64) * in{k}_gstride{t}")
        mask = f", mask={self.mask}, other=0" if self.mask else ""
        return (f"tl.load(in{k}_ptr + in{k}_off + {' + '.join(terms)}{mask})"
                f".to({compute_type(fusion.value(node).dtype)})")

    def scatter_store(self, node, out: int) -> str:
        """``buffer[..., i, j, ...] += value`` as one atomic add per element: the place of the
        element's kept dims (``out{out}_off``, from the view the runner passes: stride 0 along the
        indices' dims) plus index x stride along each indexed dim (``out{out}_sstride{t}``). The
        indices are proved in range when compiling (``bounds``); lanes outside the last block are
        masked. Additions meet in any order (deterministic algorithms refuse the scatter)."""
        j = self.group.nodes.index(node)
        terms = []
        for t, index in enumerate(fusion.scatter_parts(node).indices):
            terms.append(f"{self._index_name(index, f'sidx{j}.{t}')}.to(tl.int64) * out{out}_sstride{t}")
        mask = f", mask={self.mask}" if self.mask else ""
        return (f"tl.atomic_add(out{out}_ptr + out{out}_off + {' + '.join(terms)}, {var_name(node)}{mask}, "
                f'sem="relaxed")')

    def _index_name(self, index, role: str) -> str:
        """A gather's or scatter's index: a literal where it is one value everywhere (a full of an
        integer, inlined: no load; BERT-like models' ``token_type_ids = zeros`` in the embedding's
        backward scatter raised a KeyError here), the group's value, or its load."""
        if fusion.is_constant(index):
            return f"tl.full([1], {literal(fusion.constant_value(index))}, tl.int64)"
        return self.names[index] if index in self.group.roles else self.names[index, role]

    def _name_of(self, node):
        if node in self.group.roles:
            return self.names[node]
        if node in self.group.scalars:
            return f"s{self.group.scalars.index(node)}"
        return self.names[node, self._load_role]

    _load_role = "full"


def local_name(node) -> str:
    """A node's name inside its kernel's source: positional (``n3``, ``i0``, ``s1``), set by
    ``templates.kernel_source`` (:func:`name_locally`), so that the same group in every repeated layer of a model generates the
    same text and compiles once (the cache is keyed by the source hash)."""
    return node.meta.get("kl_local", node.name)


def name_locally(group) -> None:
    for prefix, nodes in (("n", group.nodes), ("i", group.inputs), ("s", group.scalars)):
        for i, node in enumerate(nodes):
            node.meta["kl_local"] = f"{prefix}{i}"


def var_name(node) -> str:
    return f"v_{local_name(node)}"


def _shown(arg) -> str:
    """An argument in a kernel's docstring: nodes by their local names (a gather's list of indices
    too), so that repeated layers generate the same text."""
    if isinstance(arg, fx.Node):
        return local_name(arg)
    if isinstance(arg, (list, tuple)):
        return "[" + ", ".join(_shown(a) for a in arg) + "]"
    return repr(arg)


def doc_lines(group, loads, passes: str = "once") -> list[str]:
    lines = [f'"""{group.name}: {len(group.nodes)} ops fused, {group.kind}.', ""]
    for n in group.nodes:
        args = ", ".join(_shown(a) for a in n.args)
        lines.append(f"{local_name(n)} = {fusion.target_name(n).split('.')[1]}({args})  [{group.roles[n]}]")
    lines.append("")
    lines.append(f"Traffic: reads {len(loads)} input(s) {passes}, writes {len(group.outputs)} output(s) once;"
                 " nothing in between touches memory.")
    lines.append('"""')
    return lines


# ---------------------------------------------------------------------------------------------
# node expressions


def _op_types(node) -> tuple[str | None, str, torch.dtype | None]:
    """(type each tensor operand is cast to, type of the result, the operands' common dtype)."""
    name = fusion.target_name(node)
    dtype = fusion.value(node).dtype
    out = compute_type(dtype)
    if name in COMPARE:
        vals = [fusion.value(a) if hasattr(a, "meta") else a for a in node.args[:2]]
        probe = [torch.empty((0,) if v.dim() else (), dtype=v.dtype) if isinstance(v, torch.Tensor) else v for v in vals]
        common = torch.result_type(*probe)
        return compute_type(common), out, common
    if name == "aten.where.self":
        return out, out, dtype
    if name in NO_PROMOTION:
        return None, out, None
    # an op whose result is a float computed from integers (true division) converts them straight
    # to the result's type, as ATen does; otherwise the result's dtype is the common dtype
    return out, out, dtype


def node_expression(em: Emitter, node) -> str:
    """The Triton expression of one pointwise or view node."""
    name = fusion.target_name(node)
    if fusion.is_cat(node):
        return em.cat_expression(node)
    if fusion.is_gather(node):
        return em.gather_expression(node)
    if fusion.is_scatter(node):  # the value added into the buffer (scatter_store)
        return em.operand(node.args[2], compute_type(fusion.value(node).dtype))
    want, out, common = _op_types(node)
    if name not in POINTWISE:  # a view kept inside the kernel: the same values
        return em.operand(node.args[0], None)
    args = fusion.bound_args(node)
    bound = {}
    for key, value in args.items():
        if key == "condition":
            bound[key] = em.operand(value, "tl.int1")
        elif key in ("self", "other", "a", "input", "exponent", "min", "max"):
            bound[key] = em.operand(value, want, common)
            if name in ROUNDS_ITS_OPERANDS and _computed_narrow(em, value) and common in NARROW_FLOATS:
                bound[key] = f"{bound[key]}.to({tl_type(common)}).to(tl.float32)"
        elif isinstance(value, str):
            bound[key] = repr(value)
        else:
            bound[key] = literal(value) if isinstance(value, (int, float, bool)) else repr(value)
    if name == "aten.div.Tensor_mode" and fusion.value(node).dtype in NARROW_FLOATS:
        bound["kl_narrow"] = tl_type(fusion.value(node).dtype)
    if name == "aten.div.Tensor_mode" and not fusion.value(node).is_floating_point():
        bound["kl_integer"] = True  # by a nonzero constant: fusion.integer_divisor
    expr = POINTWISE[name](bound)
    if name in ("prims.convert_element_type.default", "aten._to_copy.default"):
        expr = _convert(expr, fusion.value(node.args[0]).dtype, fusion.value(node).dtype)
    return expr


def _computed_narrow(em: Emitter, arg) -> bool:
    """A float16/bfloat16 tensor operand computed in this kernel: held there in float32, unrounded,
    so a comparison or a rounding op rounds it to its type first, as eager's stored value is. One
    loaded from memory is already of its type (rounding it again is a no-op costing two converts
    an element: a bfloat16 ReLU backward's ``le`` in every model's step)."""
    return isinstance(arg, fx.Node) and arg in em.group.roles and not fusion.is_constant(arg) and \
        isinstance(fusion.value(arg), torch.Tensor) and fusion.value(arg).dtype in NARROW_FLOATS


def _convert(expr: str, src: torch.dtype, dst: torch.dtype) -> str:
    """An explicit cast: round to a narrower float where it is written (x.half().float() rounds).
    A float16/bfloat16 value computed in float32 is rounded to its own type before it becomes an
    integer or a boolean, as eager's stored value is: bfloat16's clamp(x, -6e4, 6e4) holds 59904
    (60000 rounded), so its int32 is 59904, not 60000; a float16 of 1e-8 is 0, so False."""
    have, want = compute_type(src), compute_type(dst)
    if dst in NARROW_FLOATS and src != dst:
        return f"{expr}.to({tl_type(dst)}).to(tl.float32)"
    if src in NARROW_FLOATS and not dst.is_floating_point:
        expr = f"{expr}.to({tl_type(src)}).to(tl.float32)"
    if want == "tl.int1" and have != "tl.int1":
        return f"({expr} != 0)"
    return expr if have == want else f"{expr}.to({want})"


# ---------------------------------------------------------------------------------------------
# pointwise template


def emit_coordinates(em: Emitter, linear: str, prefix: str, rank: int) -> None:
    """Split a linear index into per-dim coordinates {prefix}0..{prefix}{rank-1} (last dim fastest)."""
    rest = linear
    for d in range(rank - 1, 0, -1):
        em.emit(f"{prefix}{d} = {rest} % size{d}")
        em.emit(f"q{d} = {rest} // size{d}")
        rest = f"q{d}"
    em.emit(f"{prefix}0 = {rest}")


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


def full_load(em: Emitter, i: int, load) -> None:
    ct = compute_type(fusion.value(load.node).dtype)
    arange = arange_of(load.node, em.group)
    if arange is not None:  # start + step * column: nothing to read
        start, step = (literal(v) for v in arange)
        em.emit(f"in{i} = ({start} + {step} * (tl.zeros([XBLOCK, 1], tl.int32) + cols)).to({ct})")
        return
    em.emit(f"in{i} = tl.load(in{i}_ptr + in{i}_row + cols * in{i}_stride_r, mask=mask, other=0).to({ct})")


def emit_node(em: Emitter, n) -> None:
    role = em.group.roles[n]
    em._load_role = "row" if role == "row" and not fusion.is_reduction(n) else "full"
    em.names[n] = var_name(n)
    if not fusion.is_reduction(n):
        em.emit(f"{var_name(n)} = {node_expression(em, n)}")


def correction(n) -> str:
    args = fusion.bound_args(n)
    c = args.get("correction")
    return literal(float(1 if c is None else c))
