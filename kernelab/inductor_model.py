"""Predict the kernels torch.compile (Inductor) generates for an op trace, without a GPU.

A model of Inductor's scheduler, in four steps:

1. *Classify* each op: ``extern`` (a library kernel Inductor calls as is: GEMM, convolution,
   attention, sort, data-dependent indexing), ``scatter`` (writes through indices: its own kernel),
   ``scan``, ``reduction``, ``pointwise`` (math, casts, copies, fills, random numbers, gathers),
   or ``none`` (views). Inductor's pattern matcher turns ``bmm -> scale -> softmax -> bmm`` into
   one attention call, and the gradient seed of ``loss.backward()`` is an eager fill (a graph break).
2. *Inline*: a pointwise value that is neither a function output nor read by a library kernel is
   never written to memory; its consumers recompute it. Only *realized* values cost bytes.
3. *Split*: a reduction with few outputs and many inputs per output is cut into partial sums and a
   final pass (Inductor's ``num_splits`` heuristic, inner and outer reductions).
4. *Fuse* realized nodes in program order: a node joins an earlier group of its own pass (forward
   or backward graph) that produced or shares one of its inputs when the iteration spaces agree and
   fusing creates no cycle through another kernel.

Each group becomes one Triton kernel named like Inductor's (``triton_poi_fused_add_relu``).
Measured Inductor kernels replace this on a GPU; the model is tested against them (tests/data/).
"""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field

from .attribution import unique
from .capture import OpRecord, OpTrace, TensorInfo
from .report import debug_level
from .eager_rules import (
    RULES, Context, KernelSpec, has_bool_index, lower_eager, nothing, reduce_geometry,
)

EXTERN = {
    "aten.mm", "aten.bmm", "aten.addmm", "aten.baddbmm", "aten.mv", "aten.dot", "aten.addmv",
    "aten.convolution", "aten.convolution_backward", "aten.scaled_dot_product_attention",
    "aten._scaled_dot_product_flash_attention_for_cpu", "aten._scaled_dot_product_flash_attention_for_cpu_backward",
    "aten.sort", "aten.topk", "aten.nonzero", "aten.masked_select", "aten._local_scalar_dense",
}
SCATTER = {
    "aten.scatter", "aten.scatter_", "aten.scatter_add", "aten.scatter_add_", "aten.scatter_reduce",
    "aten.index_put_", "aten._index_put_impl_", "aten.index_put", "aten.index_add_", "aten.index_add",
    "aten.embedding_dense_backward",
}
SCAN = {"aten.cumsum", "aten.cumprod", "aten.logcumsumexp"}
REDUCTION = {
    "aten.sum", "aten.mean", "aten.amax", "aten.amin", "aten.max", "aten.min", "aten.argmax", "aten.argmin",
    "aten.prod", "aten.any", "aten.all", "aten.var", "aten.std", "aten.var_mean", "aten.std_mean",
    "aten.linalg_vector_norm", "aten.norm", "aten.logsumexp", "aten._softmax", "aten._log_softmax",
    "aten._softmax_backward_data", "aten._log_softmax_backward_data", "aten.nll_loss_forward",
    "aten.native_layer_norm", "aten.native_layer_norm_backward", "aten._native_batch_norm_legit",
    "aten._native_batch_norm_legit_functional", "aten.native_batch_norm", "aten.native_group_norm",
    "aten.mse_loss",
}
ROW_OPS = {"aten._softmax", "aten._log_softmax", "aten._softmax_backward_data",
           "aten._log_softmax_backward_data", "aten.native_layer_norm"}
BATCH_NORM = {"aten._native_batch_norm_legit", "aten._native_batch_norm_legit_functional", "aten.native_batch_norm"}
SEED_FACTORIES = {"aten.ones_like", "aten.full_like", "aten.zeros_like"}

# Inductor's split-reduction constants (torch/_inductor/ir.py, Reduction.num_splits).
MIN_ELEMENTS_PER_THREAD, MAX_ELEMENTS_PER_THREAD, THREADS_PER_SM = 32, 512, 2048


def classify(op: OpRecord) -> str:
    p = op.packet
    if p in EXTERN or (p == "aten.index" and has_bool_index(op)):  # data-dependent: a graph break
        return "extern"
    if p in SCATTER:
        return "scatter"
    if p in SCAN:
        return "scan"
    if p in REDUCTION:
        return "pointwise" if op.args.get("training", True) is False else "reduction"
    if op.is_view or RULES.get(p) is nothing:
        return "none"
    return "pointwise"


Key = tuple  # (storage, version) of a value


@dataclass
class Node:
    """A unit of work after expansion: one pointwise/reduction loop, or one library call."""

    op: OpRecord
    kind: str  # pointwise | reduction | extern
    numel: int = 1
    rnumel: int = 1
    inner: bool = True
    reads: list = field(default_factory=list)  # realized keys it reads
    writes: list = field(default_factory=list)  # realized keys it writes
    names: list = field(default_factory=list)  # op names it covers (inlined ones included)
    specs: list = field(default_factory=list)  # extern only: the library kernels
    category: str = ""  # overrides the group's category (scatter kernels are "pointwise")
    alone: bool = False  # never fused (scatters, scans, eager fills)
    covers: list = field(default_factory=list)  # indices of the trace ops it computes (inlined ones too)

    @property
    def total(self) -> int:
        return self.numel * self.rnumel


@dataclass
class Group:
    gid: int
    kind: str
    numel: int
    rnumel: int
    backward: bool
    nodes: list = field(default_factory=list)
    alone: bool = False

    @property
    def total(self) -> int:
        return self.numel * self.rnumel


class _Values:
    """Storage versions: which value each op reads and writes, and who consumes each value."""

    def __init__(self, trace: OpTrace, kinds: dict):
        self.version: dict[int, int] = {}
        self.writer: dict[Key, int] = {}
        self.consumers: dict[Key, list[int]] = {}
        self.reads: dict[int, list[Key]] = {}
        self.writes: dict[int, list[Key]] = {}
        self.info: dict[Key, TensorInfo] = {(t.storage, 0): t for t in trace.inputs}
        for op in trace.ops:
            if kinds[op.index] == "none":
                continue
            keys = [(t.storage, self.version.get(t.storage, 0)) for t in op.inputs]
            for key, t in zip(keys, op.inputs):
                self.info.setdefault(key, t)
                self.consumers.setdefault(key, []).append(op.index)
            self.reads[op.index] = keys
            self.writes[op.index] = []
            for t in op.written:
                key = (t.storage, self.version.get(t.storage, 0) + 1)
                self.version[t.storage] = key[1]
                self.writer[key] = op.index
                self.info[key] = t
                self.writes[op.index].append(key)


# ---------------------------------------------------------------------------------------------
# Pattern rewrites Inductor applies before scheduling


def _attention_patterns(trace: OpTrace, values: _Values, kinds: dict) -> dict[int, list[int]]:
    """bmm -> pointwise scale -> softmax -> bmm becomes one SDPA call (Inductor's fuse_attention).
    Returns {index of the first bmm: indices of the ops it absorbs}."""
    found = {}
    for op in trace.ops:
        if op.packet != "aten._softmax" or not values.reads.get(op.index):
            continue
        chain, key = [], values.reads[op.index][0]
        while values.writer.get(key) is not None and kinds[values.writer[key]] == "pointwise":
            chain.append(values.writer[key])
            key = values.reads[values.writer[key]][0]
        first = values.writer.get(key)
        consumers = [c for w in values.writes[op.index] for c in values.consumers.get(w, [])]
        if first is None or trace.ops[first].packet != "aten.bmm" or len(consumers) != 1:
            continue
        second = consumers[0]
        if trace.ops[second].packet == "aten.bmm" and not trace.ops[second].backward:
            found[first] = chain + [op.index, second]
    return found


def _sdpa_kernels(first: OpRecord, last: OpRecord, ctx: Context) -> list[KernelSpec]:
    q = first.inputs[0]
    sdpa = OpRecord(first.index, "aten.scaled_dot_product_attention.cuda", list(first.inputs), list(last.outputs),
                    [], False, first.backward, {"query": q, "key": first.inputs[1]})
    return lower_eager(OpTrace([sdpa], [], [], "cuda"), ctx)


def _is_backward_seed(op: OpRecord, values: _Values, ops) -> bool:
    """The ones_like that starts loss.backward(): created in eager mode, between the two graphs."""
    if op.backward or op.packet not in SEED_FACTORIES:
        return False
    users = [c for w in values.writes[op.index] for c in values.consumers.get(w, [])]
    return bool(users) and all(ops[c].backward for c in users)


# ---------------------------------------------------------------------------------------------
# Realized values and node expansion


def _realized(values: _Values, kinds: dict, final: set) -> set:
    realized = set(final)
    for key, writer in values.writer.items():
        if kinds[writer] != "pointwise":
            realized.add(key)
        if any(kinds[c] not in ("pointwise", "reduction") for c in values.consumers.get(key, [])):
            realized.add(key)
    return realized


def _sources(index: int, values: _Values, realized: set) -> tuple[list[Key], list[int]]:
    """Realized values an op reads, looking through inlined pointwise producers (returned too)."""
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


def _reduction_shape(op: OpRecord) -> tuple[int, int, bool]:
    """(outputs, values per output, reduced dims innermost) of a reduction op."""
    src = op.inputs[0] if op.inputs else None
    if src is None or not src.shape:
        return 1, max(src.numel if src else 1, 1), True
    if op.packet in ROW_OPS:
        rows = src.shape[-1]
        return max(src.numel // rows, 1), rows, True
    if op.packet in ("aten.nll_loss_forward", "aten.mse_loss"):
        return 1, src.shape[0] if op.packet == "aten.nll_loss_forward" else src.numel, True
    outputs, per_output, inner = reduce_geometry(op)
    return outputs, per_output, inner


def _divisor_near(n: int, target: int) -> int:
    best, d = 1, 1
    while d * d <= n:
        if n % d == 0:
            for c in (d, n // d):
                if abs(c - target) < abs(best - target):
                    best = c
        d += 1
    return best


def _split_size(rnumel: int, numel: int, target: int, tolerance: int, sms: int) -> int:
    """Values each thread reduces in a split: 32 for a small reduction, a divisor of ``rnumel``
    near ``target`` when one is close (even splits), 512 (or a divisor near it) for a huge one."""
    elements = rnumel * numel
    if elements < MIN_ELEMENTS_PER_THREAD * sms * THREADS_PER_SM:
        return MIN_ELEMENTS_PER_THREAD
    if elements < MAX_ELEMENTS_PER_THREAD * sms * THREADS_PER_SM:
        closest = _divisor_near(rnumel, target)
        return max(closest, MIN_ELEMENTS_PER_THREAD) if abs(closest - target) < tolerance else target
    closest = _divisor_near(rnumel, MAX_ELEMENTS_PER_THREAD)
    return closest if abs(closest - MAX_ELEMENTS_PER_THREAD) < 50 else MAX_ELEMENTS_PER_THREAD


def num_splits(numel: int, rnumel: int, inner: bool, sms: int) -> int:
    """Inductor's split-reduction count (1 = no split) for ``numel`` outputs of ``rnumel`` values:
    a reduction with too few outputs to fill the GPU is cut into partial sums plus a final pass."""
    threads = 32 * 8
    if numel != 1 and (rnumel <= MIN_ELEMENTS_PER_THREAD or numel >= sms * 2 * 32):
        return 1
    if inner or numel == 1:
        if numel >= 2 * sms or rnumel <= 8192:
            return 1
        blocks_per_output = -(-(sms * THREADS_PER_SM // (2 * threads)) // numel)
        size = _split_size(rnumel, numel, -(-rnumel // (threads * blocks_per_output)), 30, sms)
        return -(-rnumel // (size * threads))
    values_per_thread = 4
    target_blocks = -(-(sms * THREADS_PER_SM // threads) // -(-numel // 128))
    size = _split_size(rnumel, numel, -(-rnumel // (values_per_thread * target_blocks)), 20, sms)
    return -(-rnumel // (values_per_thread * size))


class _Builder:
    """Turns the trace into nodes, then groups them."""

    def __init__(self, trace: OpTrace, ctx: Context):
        self.trace, self.ctx = trace, ctx
        self.ops = trace.ops
        self.kinds = {op.index: classify(op) for op in trace.ops}
        self.values = _Values(trace, self.kinds)
        self.attention = _attention_patterns(trace, self.values, self.kinds)
        for absorbed in self.attention.values():
            for i in absorbed:
                self.kinds[i] = "absorbed"
        for op in trace.ops:
            if self.kinds[op.index] == "pointwise" and _is_backward_seed(op, self.values, self.ops):
                self.kinds[op.index] = "seed"
        self.final = {(t.storage, self.values.version.get(t.storage, 0)) for t in trace.outputs}
        self.realized = _realized(self.values, self.kinds, self.final)
        self.synthetic = 0

    def new_key(self, like: TensorInfo, numel: int) -> Key:
        """A value Inductor creates that the program never named (partial sums of a split)."""
        self.synthetic -= 1
        info = dataclasses.replace(like, storage=self.synthetic, shape=(numel,), stride=(1,), offset=0)
        key = (self.synthetic, 1)
        self.values.info[key] = info
        self.realized.add(key)
        return key

    def nodes(self) -> list[Node]:
        out = []
        for op in self.ops:
            kind = self.kinds[op.index]
            if kind in ("none", "absorbed"):
                continue
            writes = [w for w in self.values.writes[op.index] if w in self.realized]
            if kind == "pointwise" and not writes:
                continue  # inlined into its consumers
            reads, inlined = _sources(op.index, self.values, self.realized)
            names = [self.ops[i].short for i in inlined] + [op.short]
            covers = sorted(set(inlined + [op.index] + self.attention.get(op.index, [])))
            for node in self.expand(op, kind, reads, writes, names):
                node.covers = covers
                out.append(node)
        return out

    def expand(self, op, kind, reads, writes, names) -> list[Node]:
        if op.index in self.attention:
            last = self.ops[self.attention[op.index][-1]]
            writes = [w for w in self.values.writes[last.index] if w in self.realized]
            return [Node(op, "extern", reads=reads, writes=writes, names=["sdpa"], specs=_sdpa_kernels(op, last, self.ctx))]
        if kind in ("extern", "seed"):
            specs = lower_eager(OpTrace([op], [], [], "cuda"), self.ctx)
            return [Node(op, "extern", reads=reads, writes=writes, names=names, specs=specs)]
        numel = max((self.values.info[w].numel for w in writes), default=1)
        if kind == "scatter":
            return self.scatter(op, reads, writes, names, numel)
        if kind == "scan":
            return self.scan(op, reads, writes, names, numel)
        if kind == "pointwise":
            return [Node(op, "pointwise", numel, reads=reads, writes=writes, names=names)]
        return self.reduction(op, reads, writes, names)

    def scatter(self, op, reads, writes, names, numel) -> list[Node]:
        """Out-of-place scatters first fill their output; the scatter itself stands alone."""
        scatter = Node(op, "pointwise", numel, reads=reads, writes=writes, names=names, alone=True)
        if op.packet.endswith("_"):
            return [scatter]
        fill = Node(op, "pointwise", numel, writes=list(writes), names=["new_zeros"], alone=True)
        return [fill, scatter]

    def scan(self, op, reads, writes, names, numel) -> list[Node]:
        """A scan over a whole long 1-D tensor is split: an eager zero-filled workspace, then the scan."""
        src = op.inputs[0]
        scan = Node(op, "scan", numel, reads=reads, writes=writes, names=names, category="scan", alone=True)
        if src.numel == max(src.shape or (1,)) and src.numel > 8192:
            fill = Node(op, "extern", names=["zeros"], specs=[KernelSpec("fill (scan workspace)", "fill", ["zeros"])])
            return [fill, scan]
        return [scan]

    def reduction(self, op, reads, writes, names) -> list[Node]:
        if op.packet == "aten.native_layer_norm_backward":
            return self.layer_norm_backward(op, reads, writes, names)
        if op.packet in BATCH_NORM:
            return self.batch_norm(op, reads, writes, names)
        numel, rnumel, inner = _reduction_shape(op)
        return self.split(Node(op, "reduction", numel, rnumel, inner, reads, writes, names))

    def split(self, node: Node) -> list[Node]:
        splits = num_splits(node.numel, node.rnumel, node.inner, self.ctx.sms)
        if splits <= 1:
            return [node]
        like = self.values.info[node.writes[0]] if node.writes else node.op.inputs[0]
        partial_key = self.new_key(like, node.numel * splits)
        partial = dataclasses.replace(node, numel=node.numel * splits, rnumel=-(-node.rnumel // splits),
                                      writes=[partial_key])
        final = dataclasses.replace(node, rnumel=splits, reads=[partial_key], names=list(node.names))
        return [partial, final]

    def layer_norm_backward(self, op, reads, writes, names) -> list[Node]:
        """Column sums for the weight and bias grads (outer reductions), row sums for the input grad."""
        x = op.inputs[1] if len(op.inputs) > 1 else op.inputs[0]
        cols = x.shape[-1] if x.shape else 1
        rows = max(x.numel // cols, 1)
        by_role = dict(zip(("input", "weight", "bias"), self.values.writes[op.index]))
        nodes = []
        for role in ("weight", "bias"):
            if by_role.get(role) in self.realized:
                nodes += self.split(Node(op, "reduction", cols, rows, False, reads, [by_role[role]], names))
        if by_role.get("input") in self.realized:
            nodes.append(Node(op, "reduction", rows, cols, True, reads, [by_role["input"]], names))
        return nodes

    def batch_norm(self, op, reads, writes, names) -> list[Node]:
        """Per-channel statistics (an outer reduction, running stats as its epilogue), then normalize."""
        x = op.inputs[0]
        channels = x.shape[1] if len(x.shape) > 1 else 1
        out_key = self.values.writes[op.index][0] if self.values.writes[op.index] else None
        stats = [w for w in writes if w != out_key]
        nodes = self.split(Node(op, "reduction", channels, x.numel // channels, False, reads, stats, names))
        if out_key in self.realized:
            stat_keys = [k for n in nodes for k in n.writes]
            nodes.append(Node(op, "pointwise", x.numel, reads=reads + stat_keys, writes=[out_key], names=names))
        return nodes


# ---------------------------------------------------------------------------------------------
# Fusion


def _compatible(group: Group, node: Node) -> bool:
    if group.alone or node.alone or group.backward != node.op.backward:
        return False
    if group.kind == "pointwise" and node.kind == "pointwise":
        return group.numel == node.numel
    if group.kind == "pointwise":  # pointwise prologue feeding a reduction
        return group.numel == node.total
    if node.kind == "pointwise":  # epilogue over the reduction's input or output shape
        return node.numel in (group.total, group.numel)
    return node.numel == group.numel and node.rnumel == group.rnumel


class _Scheduler:
    def __init__(self):
        self.groups: list[Group] = []
        self.entries: list = []  # Group or (extern node), in launch order
        self.owner: dict[Key, int] = {}  # value -> group/extern id
        self.deps: dict[int, set] = {}  # id -> ids it depends on, transitively
        self.next_id = 0

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def producers(self, node: Node) -> set:
        return {self.owner[k] for k in node.reads if k in self.owner}

    def depends(self, producers: set) -> set:
        out = set(producers)
        for p in producers:
            out |= self.deps.get(p, set())
        return out

    def place(self, node: Node) -> None:
        producers = self.producers(node)
        if node.kind == "extern":
            eid = self.new_id()
            self.deps[eid] = self.depends(producers)
            self.entries.append(node)
            self.own(node, eid)
            self.log(f"{node.op.short}: library call, not fused ({', '.join(s.name for s in node.specs)})")
            return
        group = self.target(node, producers)
        self.log(f"{'+'.join(node.names)} ({node.kind} {node.numel}x{node.rnumel}): "
                 + (f"joins group {group.gid}" if group else "new kernel: " + self.why_alone(node)))
        if group is None:
            group = Group(self.new_id(), node.kind, node.numel, node.rnumel, node.op.backward, alone=node.alone)
            self.groups.append(group)
            self.entries.append(group)
            self.deps[group.gid] = set()
        group.nodes.append(node)
        if node.kind == "reduction" and group.kind == "pointwise":
            group.kind, group.numel, group.rnumel = "reduction", node.numel, node.rnumel
        self.deps[group.gid] |= self.depends(producers - {group.gid})
        self.own(node, group.gid)

    def log(self, line: str) -> None:
        if debug_level() >= 3:
            print(f"[kernelab] fusion: {line}", file=sys.stderr)

    def why_alone(self, node: Node) -> str:
        if node.alone:
            return "writes through indices or scans: Inductor gives it its own kernel"
        return "no earlier kernel of this pass shares its memory with the same iteration space"

    def own(self, node: Node, gid: int) -> None:
        for key in node.writes:
            self.owner[key] = gid

    def target(self, node: Node, producers: set) -> Group | None:
        """The latest group the node may join: shared memory, same iteration space, no cycle."""
        storages = {s for s, _ in node.reads}
        for group in reversed(self.groups):
            shares = group.gid in producers or any(
                s in storages for n in group.nodes for s, _ in n.reads + n.writes)
            if not shares or not _compatible(group, node):
                continue
            if any(group.gid in self.depends({p}) for p in producers - {group.gid}):
                continue
            return group
        return None


def _attribute(spec: KernelSpec, nodes: list, ops: list) -> KernelSpec:
    """The modules of every op the kernel computes, in program order (a fused kernel may span
    several), and the first op's source line."""
    covered = [ops[i] for i in sorted({i for n in nodes for i in n.covers})]
    spec.modules = unique(op.module for op in covered if op.module is not None)
    spec.source = next((op.source for op in covered if op.source), "")
    spec.backward = any(op.backward for op in covered)
    return spec


def _group_kernel(group: Group, info: dict, needed: set) -> KernelSpec:
    """One Triton kernel: reads what comes from outside the group, writes what is needed outside
    it (values consumed only inside the kernel, like softmax's row max, stay in registers)."""
    names = []
    for node in group.nodes:
        for name in node.names:
            if name not in names:
                names.append(name)
    written = {k for n in group.nodes for k in n.writes}
    reads = [info[k] for n in group.nodes for k in n.reads if k not in written and k in info]
    writes = [info[k] for k in written if k in info and k[0] >= 0 and k in needed]
    category = group.nodes[0].category or group.kind
    prefix = {"reduction": "red", "scan": "scan"}.get(category, "poi")
    return KernelSpec(f"triton_{prefix}_fused_{'_'.join(names)}", category, names, reads, writes,
                      flops=float(group.total))


def _mutation_only(group: Group, trace: OpTrace) -> bool:
    """Groups that only update an input in place run after the rest of their graph."""
    inputs = {t.storage for t in trace.inputs}
    keys = [k for n in group.nodes for k in n.writes]
    return bool(keys) and all(k[0] in inputs for k in keys) and group.kind == "pointwise"


def predict_inductor(trace: OpTrace, ctx: Context | None = None) -> list[KernelSpec]:
    """The kernels Inductor would launch for the traced function, in launch order."""
    builder = _Builder(trace, ctx or Context())
    scheduler = _Scheduler()
    for node in builder.nodes():
        scheduler.place(node)
    ordered = [e for e in scheduler.entries if not (isinstance(e, Group) and _mutation_only(e, trace))]
    late = [e for e in scheduler.entries if isinstance(e, Group) and _mutation_only(e, trace)]
    needed = _needed_outside(scheduler.entries, builder.final)
    specs: list[KernelSpec] = []
    for entry in _phase_order(ordered, late):
        if isinstance(entry, Group):
            specs.append(_attribute(_group_kernel(entry, builder.values.info, needed), entry.nodes, trace.ops))
        else:
            for spec in entry.specs:
                spec.reads = spec.reads or [builder.values.info[k] for k in entry.reads if k in builder.values.info]
                _attribute(spec, [entry], trace.ops)
            specs.extend(entry.specs)
    return specs


def _needed_outside(entries: list, final: set) -> set:
    """Values some other kernel reads, or the function returns."""
    needed = set(final)
    for entry in entries:
        nodes = entry.nodes if isinstance(entry, Group) else [entry]
        inside = {k for n in nodes for k in n.writes}
        needed |= {k for n in nodes for k in n.reads if k not in inside}
    return needed


def _phase_order(ordered: list, late: list) -> list:
    """Put each late (mutation-only) group at the end of its own pass."""
    def backward(entry) -> bool:
        return entry.backward if isinstance(entry, Group) else entry.op.backward

    forward = [e for e in ordered if not backward(e)] + [e for e in late if not backward(e)]
    return forward + [e for e in ordered if backward(e)] + [e for e in late if backward(e)]
