"""Predict the kernels torch.compile (Inductor) generates for an op trace, without a GPU.

A model of Inductor's scheduler, in three steps:

1. *Classify* each op: ``extern`` (a library kernel Inductor calls as is: GEMM, convolution,
   attention, sort), ``scatter`` (writes through indices: always its own kernel), ``reduction``,
   ``pointwise`` (elementwise math, casts, copies, fills, random numbers, gathers), or ``none``.
2. *Inline*: a pointwise value that is neither a function output nor read by an extern or scatter
   is never written to memory; its consumers recompute it. Only *realized* values cost bytes.
3. *Fuse* realized nodes in program order: a node joins an earlier group that produced or shares
   one of its (transitive) inputs when the iteration spaces agree (same numel for pointwise; a
   reduction takes pointwise prologues and epilogues over its input or output shape, and a second
   reduction over the same rows) and when fusing creates no cycle through another kernel.

Each group becomes one Triton kernel named like Inductor's (``triton_poi_fused_add_relu``).
Measured Inductor kernels replace this on a GPU; the model is tested against them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .capture import OpRecord, OpTrace, TensorInfo
from .eager_rules import RULES, Context, KernelSpec, has_bool_index, lower_eager, nothing

EXTERN = {
    "aten.mm", "aten.bmm", "aten.addmm", "aten.baddbmm", "aten.mv", "aten.dot", "aten.addmv",
    "aten.convolution", "aten.convolution_backward", "aten.scaled_dot_product_attention",
    "aten._scaled_dot_product_flash_attention_for_cpu", "aten._scaled_dot_product_flash_attention_for_cpu_backward",
    "aten.sort", "aten.topk", "aten.nonzero", "aten.masked_select", "aten._local_scalar_dense",
}
SCATTER = {
    "aten.scatter", "aten.scatter_", "aten.scatter_add", "aten.scatter_add_", "aten.scatter_reduce",
    "aten.index_put_", "aten._index_put_impl_", "aten.index_add_", "aten.index_add", "aten.embedding_dense_backward",
}
SCAN = {"aten.cumsum", "aten.cumprod", "aten.logcumsumexp"}
REDUCTION = {
    "aten.sum", "aten.mean", "aten.amax", "aten.amin", "aten.max", "aten.min", "aten.argmax", "aten.argmin",
    "aten.prod", "aten.any", "aten.all", "aten.var", "aten.std", "aten.var_mean", "aten.std_mean",
    "aten.linalg_vector_norm", "aten.norm", "aten.logsumexp", "aten._softmax", "aten._log_softmax",
    "aten._softmax_backward_data", "aten._log_softmax_backward_data", "aten.nll_loss_forward",
    "aten.nll_loss_backward", "aten.native_layer_norm", "aten._native_batch_norm_legit",
    "aten._native_batch_norm_legit_functional", "aten.native_batch_norm", "aten.native_group_norm",
}
# Backward ops that reduce along two axes: per-row input grads and per-column weight grads.
TWO_AXIS = {"aten.native_layer_norm_backward", "aten.native_batch_norm_backward"}
# A whole-tensor reduction this large is split by Inductor into partial sums plus a final pass.
SPLIT_REDUCTION_MIN = 1 << 16
SPLIT_REDUCTION_MAX_OUT = 64


def classify(op: OpRecord) -> str:
    p = op.packet
    if p in EXTERN or (p == "aten.index" and has_bool_index(op)):  # data-dependent: a graph break
        return "extern"
    if p in SCATTER:
        return "scatter"
    if p in SCAN:
        return "scan"
    if p in REDUCTION or p in TWO_AXIS:
        return "pointwise" if op.args.get("training", True) is False else "reduction"
    if op.is_view or RULES.get(p) is nothing:
        return "none"
    return "pointwise"


@dataclass
class Node:
    op: OpRecord
    kind: str
    numel: int  # output elements (reduction: outputs kept)
    rnumel: int = 1  # elements reduced into each output
    reads: list[TensorInfo] = field(default_factory=list)  # realized values it reads
    writes: list[TensorInfo] = field(default_factory=list)  # realized values it writes
    inlined: list[str] = field(default_factory=list)  # pointwise ops recomputed inside this node


@dataclass
class Group:
    gid: int
    kind: str  # "pointwise" | "reduction"
    numel: int
    rnumel: int
    nodes: list[Node] = field(default_factory=list)
    deps: set = field(default_factory=set)  # every group/extern id this one depends on, transitively
    written: set = field(default_factory=set)  # storages written

    @property
    def total(self) -> int:
        return self.numel * self.rnumel


def _reduction_shape(op: OpRecord) -> tuple[int, int]:
    src = op.inputs[0] if op.inputs else None
    out = max(op.outputs, key=lambda t: t.numel) if op.outputs else None
    total = src.numel if src else 1
    kept = out.numel if out else 1
    if op.packet in ("aten.native_layer_norm",):
        kept = op.outputs[1].numel if len(op.outputs) > 1 else kept  # rows (mean/rstd)
    if op.packet in ("aten._softmax", "aten._log_softmax", "aten._softmax_backward_data",
                     "aten._log_softmax_backward_data"):
        dim = op.args.get("dim", -1)
        rows = src.shape[dim] if src and src.shape else 1
        kept = total // max(rows, 1)
    if op.packet in ("aten.nll_loss_forward", "aten.nll_loss_backward"):
        kept = 1
        total = op.inputs[0].shape[0] if op.inputs and op.inputs[0].shape else 1
    return max(kept, 1), max(total // max(kept, 1), 1)


class _Values:
    """Which storage version each op reads, and who consumes each version."""

    def __init__(self, trace: OpTrace):
        self.version: dict[int, int] = {}
        self.writer: dict[tuple[int, int], int] = {}  # (storage, version) -> op index
        self.consumers: dict[tuple[int, int], list[int]] = {}
        self.reads: dict[int, list[tuple[int, int]]] = {}
        self.writes: dict[int, list[tuple[int, int]]] = {}
        for op in trace.ops:
            if classify(op) == "none":
                continue
            keys = [(t.storage, self.version.get(t.storage, 0)) for t in op.inputs]
            self.reads[op.index] = keys
            for key in keys:
                self.consumers.setdefault(key, []).append(op.index)
            self.writes[op.index] = []
            for t in op.written:
                v = self.version.get(t.storage, 0) + 1
                self.version[t.storage] = v
                self.writer[(t.storage, v)] = op.index
                self.writes[op.index].append((t.storage, v))


def predict_inductor(trace: OpTrace, ctx: Context | None = None) -> list[KernelSpec]:
    """The kernels Inductor would launch for the traced function, in launch order."""
    ctx = ctx or Context()
    values = _Values(trace)
    ops = {op.index: op for op in trace.ops}
    kinds = {i: classify(op) for i, op in ops.items()}
    final = {(t.storage, values.version.get(t.storage, 0)) for t in trace.outputs}
    realized = _realized(values, kinds, final)
    infos = _tensor_infos(trace)
    kernels: list[KernelSpec] = []
    groups: list[Group] = []
    owner: dict[tuple[int, int], int] = {}  # realized value -> group/extern id producing it
    next_id = [0]

    def new_id() -> int:
        next_id[0] += 1
        return next_id[0]

    for index, op in ops.items():
        kind = kinds[index]
        if kind == "none" or (kind == "pointwise" and not any(w in realized for w in values.writes[index])):
            continue
        sources, inlined = _sources(index, values, realized)
        producers = {owner[s] for s in sources if s in owner}
        if kind in ("extern", "scatter", "scan"):
            eid = new_id()
            specs = _extern_kernels(op, kind, ctx)
            for spec in specs:
                spec.reads = [infos[s] for s in sources if s in infos]
            kernels.append(("extern", eid, specs, producers))
            for w in values.writes[index]:
                owner[w] = eid
            continue
        node = _make_node(op, kind, sources, values, realized, infos)
        node.inlined = [ops[i].short for i in inlined]
        group = _fuse_target(node, producers, groups, sources, owner)
        if group is None:
            group = Group(new_id(), node.kind, node.numel, node.rnumel)
            groups.append(group)
            kernels.append(("group", group.gid, group, producers))
        _add(group, node, producers, groups, kernels)
        for w in values.writes[index]:
            if w in realized:
                owner[w] = group.gid
    return _emit(kernels, groups)


def _realized(values: _Values, kinds: dict, final: set) -> set:
    """Values written to memory: outputs, reduction results, and anything a library kernel reads."""
    realized = set(final)
    for key, writer in values.writer.items():
        if kinds[writer] in ("reduction", "extern", "scatter", "scan"):
            realized.add(key)
        if any(kinds[c] in ("extern", "scatter", "scan") for c in values.consumers.get(key, [])):
            realized.add(key)
    return realized


def _sources(index: int, values: _Values, realized: set) -> tuple[list[tuple[int, int]], list[int]]:
    """Realized values (or function inputs) an op reads, looking through inlined pointwise ops;
    and the inlined ops themselves (their math is recomputed inside the consumer's kernel)."""
    out, inlined, stack, seen = [], [], list(values.reads.get(index, [])), set()
    while stack:
        key = stack.pop()
        if key in seen:
            continue
        seen.add(key)
        writer = values.writer.get(key)
        if writer is None or key in realized:
            out.append(key)
        else:
            inlined.append(writer)
            stack.extend(values.reads.get(writer, []))
    return out, sorted(set(inlined))


def _tensor_infos(trace: OpTrace) -> dict:
    infos, version = {}, {}
    for t in trace.inputs:
        infos[(t.storage, 0)] = t
    for op in trace.ops:
        if classify(op) == "none":
            continue
        for t in op.inputs:
            infos.setdefault((t.storage, version.get(t.storage, 0)), t)
        for t in op.written:
            version[t.storage] = version.get(t.storage, 0) + 1
            infos[(t.storage, version[t.storage])] = t
    return infos


def _make_node(op, kind, sources, values, realized, infos) -> Node:
    if kind == "reduction":
        numel, rnumel = _reduction_shape(op)
    else:
        numel, rnumel = max((t.numel for t in op.written), default=1), 1
    writes = [infos[w] for w in values.writes[op.index] if w in realized and w in infos]
    return Node(op, kind, numel, rnumel, [infos[s] for s in sources if s in infos], writes)


def _compatible(group: Group, node: Node) -> bool:
    if group.kind == "pointwise" and node.kind == "pointwise":
        return group.numel == node.numel
    if group.kind == "pointwise":  # pointwise prologue feeding a reduction
        return group.numel == node.numel * node.rnumel
    if node.kind == "pointwise":  # epilogue over the reduction's input or output shape
        return node.numel in (group.total, group.numel)
    return node.numel == group.numel and node.rnumel == group.rnumel


def _fuse_target(node: Node, producers: set, groups: list[Group], sources, owner) -> Group | None:
    """The most recent group this node may join: it must share memory and create no cycle."""
    storages = {s for s, _ in sources}
    for group in reversed(groups):
        shares = group.gid in producers or storages & group.written or any(
            t.storage in storages for n in group.nodes for t in n.reads)
        if not shares or not _compatible(group, node):
            continue
        others = producers - {group.gid}
        if any(group.gid in _deps_of(p, groups) for p in others):
            continue
        return group
    return None


def _deps_of(gid: int, groups: list[Group]) -> set:
    for g in groups:
        if g.gid == gid:
            return g.deps
    return set()


def _add(group: Group, node: Node, producers: set, groups, kernels) -> None:
    group.nodes.append(node)
    if node.kind == "reduction" and group.kind == "pointwise":
        group.kind, group.numel, group.rnumel = "reduction", node.numel, node.rnumel
    group.written |= {t.storage for t in node.writes}
    for p in producers - {group.gid}:
        group.deps |= {p} | _deps_of(p, groups) | _extern_deps(p, kernels)


def _extern_deps(eid: int, kernels) -> set:
    for entry in kernels:
        if entry[0] == "extern" and entry[1] == eid:
            return set(entry[3])
    return set()


def _extern_kernels(op: OpRecord, kind: str, ctx: Context) -> list[KernelSpec]:
    """Library kernels run as in eager mode; Inductor writes its own scatter and scan kernels."""
    if kind == "extern":
        trace = OpTrace([op], [], [], "cuda")
        return lower_eager(trace, ctx)
    category = "index" if kind == "scatter" else "scan"
    return [KernelSpec(f"triton_{'poi' if kind == 'scatter' else 'per'}_fused_{op.short}", category, [op.short],
                       list(op.inputs), list(op.written))]


def _emit(entries, groups: list[Group]) -> list[KernelSpec]:
    specs: list[KernelSpec] = []
    for entry in entries:
        if entry[0] == "extern":
            specs.extend(entry[2])
            continue
        specs.extend(_group_kernels(entry[2]))
    return specs


def _group_kernels(group: Group) -> list[KernelSpec]:
    names = []
    for n in group.nodes:
        for short in n.inlined + [n.op.short]:
            if short not in names:
                names.append(short)
    reads = [t for n in group.nodes for t in n.reads if t.storage not in group.written]
    writes = [t for n in group.nodes for t in n.writes]
    prefix = "red" if group.kind == "reduction" else "poi"
    spec = KernelSpec(f"triton_{prefix}_fused_{'_'.join(names)}", group.kind, names, reads, writes,
                      flops=float(group.total))
    if group.kind == "reduction" and group.numel <= SPLIT_REDUCTION_MAX_OUT and group.total >= SPLIT_REDUCTION_MIN:
        partial = KernelSpec(spec.name + "_final", "reduction", names, [], [], confidence="low",
                             reason="Inductor splits a large reduction into partial sums plus a final pass")
        return [spec, partial]
    return [spec]
