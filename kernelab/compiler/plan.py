"""Plans: what the backend does with each graph, known before anything runs.

``explain(fn, *args)`` and ``plan_kernels(target, args, kwargs)`` run the function once on the
given tensors (CPU tensors are fine, no GPU needed) with the backend in *plan mode*: dynamo and
aot_autograd run as usual, each group executes as its ATen ops and is recorded as the one kernel
it becomes, and every op outside a group (graph breaks and library calls included) is recorded as
the kernels eager PyTorch launches for it (``kernelab.eager_rules``).
"""
from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils import _pytree as pytree

from ..capture import OpTrace, Prepared, Recorder, StorageIds, function_outputs
from ..eager_rules import Context, KernelSpec, lower_eager
from ..targets import compiles_every_time
from . import fusion
from .eventlog import ACTIVE_PLAN
from .group_runner import SymbolValues, call_node, lookup, run_reference
from .templates import template

__all__ = ["Plan", "GraphPlan", "GroupPlan", "explain", "plan_kernels", "plan_trace"]


def _nbytes(node) -> int:
    val = fusion.value(node)
    if not isinstance(val, torch.Tensor):
        return 0
    n = 1
    for s in val.shape:
        n *= fusion.hint(s)
    return n * val.element_size()


@dataclass
class GroupPlan:
    name: str
    kind: str  # pointwise | reduction | column
    ops: list  # "sub_1 = sub" per node
    inputs: int
    outputs: int
    bytes_before: int  # each op its own eager kernel: every operand read, every result written
    bytes_after: int  # the fused kernel: inputs read once, outputs written once

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class GraphPlan:
    kind: str  # forward | backward | inference
    groups: list  # GroupPlan
    eager: list  # (node, op, reason)
    refusals: list  # (node, reason)
    compile_s: float
    fallback: str | None = None  # why the whole graph runs as ATen, if it does
    jit_s: float = 0.0  # generating and importing the kernels of the first call (Triton compiles lazily)
    padded: list = field(default_factory=list)  # values with padded rows (compiler/layout.py), one line each
    cudagraphs: str = ""  # where CUDA graphs were asked for: "recorded: ..." or "not recorded: <why>"
    #: copies into graph inputs that a kernel stores itself (graph.absorb_copies), one line each
    stored: list = field(default_factory=list)
    #: outputs a kernel may store over an input at its last use (GroupRunner.reuse), one line each
    reused: list = field(default_factory=list)
    #: chains of other kernels' ops a kernel recomputes instead of reading (graph.Partition.recomputed)
    recomputed: list = field(default_factory=list)

    @classmethod
    def build(cls, kind, gm, part, compile_s, fallback) -> "GraphPlan":
        groups = [_group_plan(g) for g in part.groups]
        eager = [(n.name, fusion.target_name(n), part.eager[n]) for n in gm.graph.nodes
                 if n in part.eager and part.eager[n]]
        stored = [f"{copy.name}: {group.name} stores {value.name} into {buf.name}"
                  for copy, (group, value, buf) in part.into.items()]
        recomputed = [f"{group.name} recomputes {', '.join(names)} (read by {reader}) instead of reading it"
                      for group, reader, names in part.recomputed]
        return cls(kind, groups, eager, list(part.refusals), compile_s, fallback, stored=stored,
                   recomputed=recomputed)

    def summary(self) -> str:
        kernels = len(self.groups)
        return (f"kernelab {self.kind} graph: {kernels} generated kernel(s), {len(self.eager)} op(s) left to ATen, "
                f"planned in {self.compile_s * 1e3:.1f} ms" + (f"; on this machine it runs as ATen: {self.fallback}"
                                                        if self.fallback else "")
                + (f"; CUDA graph {self.cudagraphs}" if self.cudagraphs else ""))

    def decisions(self) -> str:
        lines = [self.summary()]
        lines += [f"  group {g.name}: {', '.join(g.ops)}" for g in self.groups]
        lines += [f"  ATen {node} ({op}): {why}" for node, op, why in self.eager]
        lines += [f"  refused {node}: {why}" for node, why in self.refusals]
        lines += [f"  padded {line}" for line in self.padded]
        lines += [f"  in place {line}" for line in self.stored]
        lines += [f"  reuses memory: {line}" for line in self.reused]
        lines += [f"  recomputed: {line}" for line in self.recomputed]
        return "\n".join(lines)

    def note_compile(self, runner) -> None:
        self.jit_s = sum(r.compile_s for r in runner.group_runners)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "groups": [g.to_dict() for g in self.groups],
                "eager": [{"node": n, "op": op, "reason": why} for n, op, why in self.eager],
                "refusals": [{"node": n, "reason": why} for n, why in self.refusals],
                "compile_s": self.compile_s, "jit_s": self.jit_s, "fallback": self.fallback, "padded": list(self.padded),
                "cudagraphs": self.cudagraphs, "stored": list(self.stored),
                "reused": list(self.reused), "recomputed": list(self.recomputed)}


def _group_plan(group) -> GroupPlan:
    before = 0
    for n in group.nodes:
        if fusion.short_name(n) is None:
            continue  # views and aliases launch nothing eagerly either
        reads = {p for p in n.all_input_nodes if isinstance(fusion.value(p), torch.Tensor) and not fusion.is_constant(p)}
        before += sum(_nbytes(p) for p in reads) + _nbytes(n)
    after = sum(_nbytes(p) for p in group.inputs) + sum(_nbytes(n) for n in group.outputs)
    ops = [f"{n.name} = {fusion.short_name(n)}" for n in group.nodes if fusion.short_name(n)]  # views: no work
    return GroupPlan(group.name, group.kind, ops, len(group.inputs), len(group.outputs), before, after)


@dataclass
class Plan:
    """The plan of one call: every graph compiled, and the kernels launched in order."""

    graphs: list
    kernels: list  # KernelSpec
    notes: list = field(default_factory=list)

    @property
    def generated(self) -> int:
        return sum(1 for k in self.kernels if k.name.startswith("kl_fused_"))

    def to_dict(self) -> dict:
        return {"graphs": [g.to_dict() for g in self.graphs],
                "kernels": [{"name": k.name, "category": k.category, "ops": list(k.ops), "reason": k.reason,
                             "bytes_read": sum(t.footprint for t in k.reads),
                             "bytes_written": sum(t.footprint for t in k.writes)} for k in self.kernels],
                "notes": list(self.notes)}

    def __str__(self) -> str:
        return "\n".join([*(g.decisions() for g in self.graphs), *self.notes, f"{len(self.kernels)} kernels per call"])

    def __rich_console__(self, console, options):
        from rich.table import Table

        for g in self.graphs:
            if not g.groups and not g.eager:
                continue  # a graph of views only (out.detach()): nothing to show
            table = Table(title=g.summary(), title_justify="left")
            for col in ("kernel", "kind", "ops", "bytes unfused -> fused", "why"):
                table.add_column(col)
            for gp in g.groups:
                table.add_row(gp.name, gp.kind, ", ".join(o.split(" = ")[1] for o in gp.ops),
                              f"{_mb(gp.bytes_before)} -> {_mb(gp.bytes_after)}", "")
            for node, op, why in g.eager:
                table.add_row(f"[dim]{op}[/dim]", "ATen", node, "", f"[dim]{why}[/dim]")
            yield table
            for node, why in g.refusals:
                yield f"  [yellow]refused[/yellow] {node}: {why}"
        for note in self.notes:
            yield f"[dim]{note}[/dim]"
        yield f"{len(self.kernels)} kernels per call ({self.generated} generated by kernelab)"


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB"


# ---------------------------------------------------------------------------------------------
# plan mode


class _PlanRecorder(Recorder):
    """Records eager ATen ops as their eager kernels, and each group as its one fused kernel.

    An infra mode, so dynamo still compiles while it is active; it ignores the fake tensors of
    tracing and everything the plan-mode groups run to produce their values."""

    @classmethod
    def is_infra_mode(cls) -> bool:
        return True

    def __init__(self, ctx: Context):
        super().__init__(StorageIds())
        self.ctx = ctx
        self.kernels: list[KernelSpec] = []
        self.graphs: list[GraphPlan] = []
        self.notes: list[str] = []  # decisions about a whole graph (the convolutions' layout)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves = pytree.tree_leaves((args, kwargs))
        if self.suppress or any(self._traced(t) for t in leaves):
            return func(*args, **kwargs)
        first = len(self.ops)
        out = super().__torch_dispatch__(func, types, args, kwargs)
        for op in self.ops[first:]:
            self.kernels.extend(lower_eager(OpTrace([op], [], [], "cuda"), self.ctx))
        return out

    #: the fake mode a prediction at meta sizes runs in (``_meta_as_fake_cpu``): its tensors are
    #: the call's own, recorded; any other fake tensor is dynamo's or aot_autograd's tracing
    runtime_fake: FakeTensorMode | None = None

    def _traced(self, t) -> bool:
        if not isinstance(t, torch.Tensor) or type(t) in (torch.Tensor, torch.nn.Parameter):
            return False
        return not (isinstance(t, FakeTensor) and t.fake_mode is self.runtime_fake is not None)

    def hooks(self, graph_plan: GraphPlan) -> "_Hooks":
        if graph_plan not in self.graphs:
            self.graphs.append(graph_plan)
        return _Hooks(self)


class _Hooks:
    def __init__(self, recorder: _PlanRecorder):
        self.rec = recorder

    def group(self, group, env: dict) -> None:
        self.rec.suppress += 1
        try:
            run_reference(group, env)
        finally:
            self.rec.suppress -= 1
        if _empty(group, env):
            return  # the runner computes an empty group with its ATen ops: no kernel launches
        for n in group.outputs:
            if fusion.is_scatter(n):  # the runner zeroes the buffer first: recorded as eager's fill
                torch.zeros_like(env[n])
        info = self.rec.ids.info
        reads = [info(env[p]) for p in group.inputs]
        writes = [info(env[n]) for n in group.outputs]
        numel = max((w.numel for w in writes), default=0)
        ops = [s for s in (fusion.short_name(n) for n in group.nodes) if s]
        category = template(group.kind).CATEGORY
        self.rec.kernels.append(KernelSpec(group.name, category, ops, reads, writes,
                                           flops=float(numel * len(ops))))

    def copy_into(self, buf, value) -> None:
        """A copy into a graph input that the value's kernel stores itself (``graph.absorb_copies``):
        done out of sight, no kernel of its own."""
        self.rec.suppress += 1
        try:
            buf.copy_(value)
        finally:
            self.rec.suppress -= 1

    def generated_op(self, node, env: dict, kernel_for) -> object:
        """An ATen node the runner hands to a fixed kernel of ours (``scatter.py``) when
        ``kernel_for`` its arguments names one: computed with ATen out of sight and recorded as that
        one kernel."""
        args = fx.node.map_arg(node.args, lambda a: lookup(a, env))
        name = kernel_for(*args[:3])
        if name is None:
            return call_node(node, env)
        self.rec.suppress += 1
        try:
            out = call_node(node, env)
        finally:
            self.rec.suppress -= 1
        info = self.rec.ids.info
        base, indices, values = args[:3]
        reads = [info(values)] + [info(i) for i in indices if i is not None] + [info(base)]
        self.rec.kernels.append(KernelSpec(name, "pointwise", ["index_put"], reads, [info(out)],
                                           flops=float(values.numel())))
        return out


def _empty(group, env: dict) -> bool:
    """Is the group's iteration shape empty (what ``group_runner.GroupRunner.prepare`` refuses)?"""
    shape = group.shape
    if not all(isinstance(s, int) for s in shape):  # symbolic: evaluated as the runner does
        sizes = SymbolValues.bind(group.inputs, [env[p] for p in group.inputs], group.scalars,
                                  [env[s] for s in group.scalars], group.name)
        shape = sizes.shape(shape)
    return any(s == 0 for s in shape)


def _copy_tensor(t):
    """A private copy with the same geometry (a strided view stays a strided view)."""
    if not isinstance(t, torch.Tensor) or t.is_meta:
        return t
    with torch.no_grad():
        storage = t.untyped_storage()
        base = torch.empty(0, dtype=t.dtype, device=t.device)
        base.set_(storage.clone(), t.storage_offset(), t.shape, t.stride())
    return base.requires_grad_(t.requires_grad)


def _run_plan(target, args, kwargs, ctx) -> _PlanRecorder:
    from . import register

    register()
    # everything the call can write is a private copy: the target if it is a module, tensors and
    # modules among the arguments (a training step passed its model: its backward would otherwise
    # accumulate gradients into the caller's parameters)
    memo: dict = {}
    if isinstance(target, torch.nn.Module):
        target = copy.deepcopy(target, memo)
    args, kwargs = pytree.tree_map(lambda a: copy.deepcopy(a, memo) if isinstance(a, torch.nn.Module) else _copy_tensor(a),
                                   (tuple(args), dict(kwargs or {})))
    fake_mode = _meta_as_fake_cpu(target, args, kwargs)
    if fake_mode is not None:
        args, kwargs = pytree.tree_map(lambda a: _fake(fake_mode, a), (args, kwargs))
    recorder = _PlanRecorder(ctx or Context())
    recorder.runtime_fake = fake_mode
    tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    if isinstance(target, torch.nn.Module):
        tensors += list(target.parameters()) + list(target.buffers())
    recorder.inputs = [recorder.ids.info(t) for t in tensors]
    compiled = torch.compile(target, backend="kernelab")
    ACTIVE_PLAN[0] = recorder
    try:
        with fake_mode or contextlib.nullcontext(), recorder, compiles_every_time():
            result = compiled(*args, **kwargs)
    finally:
        ACTIVE_PLAN[0] = None
    prepared = Prepared(lambda: None, tensors, [t for t in tensors if t.requires_grad and t.is_leaf])
    recorder.outputs = function_outputs(result, recorder, prepared, recorder.ids)
    return recorder


def _meta_as_fake_cpu(target, args, kwargs) -> FakeTensorMode | None:
    """Where every tensor of the call is on the meta device (a prediction at any size), a fake
    mode in which the call runs on fake CPU tensors instead: the module copies' parameters and
    buffers are swapped in place (tied weights stay tied), the arguments by the caller. On meta
    tensors the traced graphs were not the ones a GPU runs: attention took SDPA's math path
    (matmuls and a softmax, where CPU and CUDA tensors take a fused kernel: BERT predicted 47
    kernels on meta, 31 on the CPU), and a tensor a model makes inside the call (transformers' KV
    cache: ``torch.tensor([])``) was a real meta tensor that dynamo's fake tensors refused (every
    decoder's inference crashed). Fake CPU tensors allocate nothing either."""
    modules = [m for m in pytree.tree_leaves((target, args, kwargs)) if isinstance(m, torch.nn.Module)]
    tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    for m in modules:
        tensors += list(m.parameters()) + list(m.buffers())
    if not tensors or not all(t.is_meta for t in tensors):
        return None
    mode = FakeTensorMode(allow_non_fake_inputs=True)  # constants the graphs hold are CPU tensors
    swapped: dict = {}
    for m in modules:
        for sub in m.modules():
            for name, p in sub._parameters.items():
                if p is not None:
                    if id(p) not in swapped:
                        swapped[id(p)] = torch.nn.Parameter(_fake(mode, p.detach()), requires_grad=p.requires_grad)
                    sub._parameters[name] = swapped[id(p)]
            for name, b in sub._buffers.items():
                if b is not None:
                    swapped.setdefault(id(b), _fake(mode, b))
                    sub._buffers[name] = swapped[id(b)]
    return mode


def _fake(mode: FakeTensorMode, t):
    """A meta tensor as a fake CPU tensor of the same geometry (gradient flag kept)."""
    if not isinstance(t, torch.Tensor) or not t.is_meta:
        return t
    fake = mode.fake_tensor_converter.from_meta_and_device(mode, t.detach(), torch.device("cpu"))
    return fake.requires_grad_(t.requires_grad) if t.is_leaf else fake


def plan_trace(target, args=(), kwargs=None, ctx: Context | None = None) -> tuple[OpTrace, list[KernelSpec]]:
    """(trace, kernels) of one call under the backend: the trace's inputs and outputs (arguments,
    parameters, returned tensors, gradients, inputs written in place) and the kernels' reads and
    writes share one storage numbering, so kernelab.traffic (ideal bytes, round trips) applies."""
    rec = _run_plan(target, args, kwargs, ctx)
    return OpTrace(rec.ops, rec.inputs, rec.outputs, "cuda"), rec.kernels


def plan_kernels(target, args=(), kwargs=None, ctx: Context | None = None) -> list[KernelSpec]:
    """The kernels ``torch.compile(target, backend="kernelab")`` launches for one call, in order,
    predicted from its plan without running any kernel (CPU tensors stand for CUDA tensors)."""
    return _run_plan(target, args, kwargs, ctx).kernels


def explain(fn, *args, **kwargs) -> Plan:
    """The plan of ``fn(*args, **kwargs)``: groups, their ops, the kernel each becomes, bytes before
    and after, and every op left to ATen or fusion refused, with the reason. Printable with rich."""
    rec = _run_plan(fn, args, kwargs, None)
    return Plan(rec.graphs, rec.kernels, notes=["predicted from the plan: no kernel ran", *rec.notes])
