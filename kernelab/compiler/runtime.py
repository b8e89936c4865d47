"""Running a partitioned graph: groups launch generated kernels, everything else runs as ATen.

Nothing about sizes is baked into a kernel. At each launch the runtime looks at the actual tensors,
merges the dims every operand walks alike (a contiguous add becomes 1-D whatever its rank), and
picks the variant (rank after merging; persistent or looped rows) and the launch parameters
(block sizes, warps, int32 or int64 offsets) from a cache keyed on the shapes. A new shape is a new
cache entry, never a recompilation guard. Triton specializes what it always does: pointers on
16-byte alignment, integers on divisibility by 16 and on equality to 1 (a unit stride).

Kernels are written to ``$KERNELAB_CACHE/compiler`` (default ``~/.cache/kernelab/compiler``) as
``<name>_<source hash>.py`` and imported from there; Triton caches the binaries by source hash.
"""
from __future__ import annotations

import functools
import hashlib
import math
import importlib.util
import os
import sys
import time
import warnings
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from ..report import debug_level
from . import codegen, fusion, ops_table

__all__ = ["GraphRunner", "kernel_module", "cache_dir"]

INT32_MAX = 2**31 - 1
# Longest row (a power of two) kept in registers by one block. Interpreted: 4096, so that the
# tests' 4097-long rows take the looped path.
PERSISTENT_MAX = {"gpu": 8192, "interpreter": 4096}


def cache_dir() -> str:
    root = os.environ.get("KERNELAB_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "kernelab")
    return os.path.join(root, "compiler")


_MODULES: dict = {}


def kernel_module(source: str, name: str):
    """Import the generated source from the on-disk cache (written once per source hash)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    if digest in _MODULES:
        return getattr(_MODULES[digest], name)
    path = os.path.join(cache_dir(), f"{name}_{digest}.py")
    if not os.path.exists(path):
        os.makedirs(cache_dir(), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(source)
        os.replace(tmp, path)  # atomic: concurrent compiles never read half a file
    spec = importlib.util.spec_from_file_location(f"kernelab_generated_{digest}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _MODULES[digest] = module
    return getattr(module, name)


@functools.lru_cache(maxsize=1)
def interpreted() -> bool:
    """Triton runs kernels on CPU tensors (TRITON_INTERPRET=1 when triton was imported)."""
    import triton

    @triton.jit
    def _probe():
        pass

    return type(_probe).__name__ == "InterpretedFunction"


# ---------------------------------------------------------------------------------------------
# geometry


def _collapse(shape, stride_lists):
    """Drop size-1 dims and merge neighbours every tensor walks contiguously: (sizes, strides)."""
    dims = [d for d in range(len(shape)) if shape[d] != 1]
    sizes = [shape[d] for d in dims]
    strides = [[s[d] for d in dims] for s in stride_lists]
    i = len(sizes) - 1
    while i > 0:
        if all(st[i - 1] == st[i] * sizes[i] for st in strides):
            sizes[i - 1] *= sizes[i]
            for st in strides:
                st[i - 1] = st[i]
                del st[i]
            del sizes[i]
        i -= 1
    if not sizes:
        return [1], [[0] for _ in stride_lists]
    return sizes, strides


def _max_offset(sizes, strides) -> int:
    return sum((s - 1) * abs(st) for s, st in zip(sizes, strides))


def _pow2(n: int) -> int:
    return 1 << max(0, (max(n, 1) - 1).bit_length())


@dataclass
class _Launch:
    """Everything one launch needs that depends on shapes only (cached per shape key)."""

    rank: int
    persistent: bool
    block: dict
    num_warps: int
    int64: bool


@dataclass
class _Call:
    """One cached launch: the kernel, its grid, the arguments after the pointers, the constexprs
    and warps, and the outputs to allocate (shape, stride, dtype)."""

    kernel: object
    grid: tuple
    tail: list
    meta: dict
    outs: list
    device: object
    launched: bool = False  # compiled and launched once without error


# ---------------------------------------------------------------------------------------------
# one group


@dataclass
class GroupRunner:
    group: object
    interpret: bool
    kernels: dict = field(default_factory=dict)  # (rank, persistent) -> jitted kernel
    loads: list = None  # codegen.Load per kernel input, computed once
    calls: dict = field(default_factory=dict)  # (shapes, strides, devices, dtypes) -> _Call or None
    compile_s: float = 0.0

    def __post_init__(self):
        self.loads = codegen.loads_of(self.group) if self.group is not None else []

    def kernel(self, rank: int, persistent: bool):
        key = (rank, persistent)
        if key not in self.kernels:
            t0 = time.perf_counter()
            source = codegen.kernel_source(self.group, rank, persistent)
            self.kernels[key] = kernel_module(source, self.group.name)
            if debug_level() >= 3:  # 3: the generated source of every kernel variant
                print(source, file=sys.stderr)
            self.compile_s += time.perf_counter() - t0
        return self.kernels[key]

    def run(self, env: dict) -> None:
        """Launch the group's kernel. Everything that depends only on the inputs' shapes, strides
        and devices (variant, block sizes, output layouts, stride arguments) is worked out once
        per such key; a repeated call allocates the outputs and launches."""
        raw = [env[load.node] for load in self.loads]
        key = tuple((t.shape, t.stride(), t.device, t.dtype) for t in raw)
        call = self.calls.get(key, False)
        if call is False:
            call = self.calls[key] = self.prepare_or_refuse(raw)
        if call is None:
            return run_reference(self.group, env)
        outs = [torch.empty_strided(size, stride, dtype=dtype, device=call.device) for size, stride, dtype in call.outs]
        ins = [t if t.device == call.device else t.to(call.device) for t in raw]
        scalars = [env[s] for s in self.group.scalars]
        if call.launched:
            call.kernel[call.grid](*ins, *outs, *call.tail, *scalars, **call.meta)
        else:  # the first launch compiles the kernel: a failure there falls back too
            try:
                call.kernel[call.grid](*ins, *outs, *call.tail, *scalars, **call.meta)
                call.launched = True
            except Exception as exc:
                self.calls[key] = None
                self.refuse(exc)
                return run_reference(self.group, env)
        for n, t in zip(self.group.outputs, outs):
            env[n] = t

    def prepare_or_refuse(self, raw) -> "_Call | None":
        """A launch, or None (ATen runs the group) when generating or compiling the kernel fails:
        said once per group, with the reason; KERNELAB_STRICT=1 raises instead."""
        try:
            return self.prepare(raw)
        except Exception as exc:
            self.refuse(exc)
            return None

    def refuse(self, exc: Exception) -> None:
        from .backend import KernelabFallbackWarning, strict

        if strict():
            raise exc
        warnings.warn(f"kernelab: {self.group.name} runs as ATen ops: its kernel failed to build or launch "
                      f"({type(exc).__name__}: {exc})", KernelabFallbackWarning, stacklevel=3)

    def prepare(self, raw) -> "_Call | None":
        """The launch for inputs like ``raw`` (None: empty tensors, run the ATen reference)."""
        shape = self.shape(raw)
        if any(s == 0 for s in shape):
            return None
        device = _device(raw)
        moved = [_on(t, device) for t in raw]
        if self.group.kind == "pointwise":
            return self.prepare_pointwise(moved, shape, device)
        return self.prepare_reduction(moved, shape, device)

    def shape(self, inputs) -> tuple:
        static = all(isinstance(s, int) for s in self.group.shape)
        if static:
            return tuple(self.group.shape)
        return tuple(torch.broadcast_shapes(*[t.shape for t in inputs]))

    # -- pointwise --------------------------------------------------------------------------
    def prepare_pointwise(self, raw, shape, device) -> "_Call":
        g = self.group
        ins = [t.expand(shape) for t in raw]
        outs = [_alloc(n, shape, device) for n in g.outputs]
        order = _iteration_order(outs[0] if outs else ins[0])
        sizes, strides = _collapse([shape[d] for d in order], [[t.stride(d) for d in order] for t in ins + outs])
        numel = math.prod(sizes)
        launch = self.pointwise_launch(sizes, strides, numel)
        block = launch.block["BLOCK"]
        tail = [s for st in strides for s in st] + list(sizes) + [numel]
        return _Call(self.kernel(launch.rank, True), ((numel + block - 1) // block,), tail,
                     {"BLOCK": block, "INT64": launch.int64, "num_warps": launch.num_warps},
                     [(tuple(o.shape), o.stride(), o.dtype) for o in outs], device)

    def pointwise_launch(self, sizes, strides, numel) -> _Launch:
        # 16 elements per thread keeps enough bytes in flight; interpreted, bigger blocks are faster
        block = min(_pow2(numel), 1 << 16 if self.interpret else 2048)
        warps = max(1, min(8, block // 256))
        int64 = numel > INT32_MAX or any(_max_offset(sizes, st) > INT32_MAX for st in strides)
        return _Launch(len(sizes), True, {"BLOCK": block}, warps, int64)

    # -- reduction --------------------------------------------------------------------------
    def prepare_reduction(self, raw, shape, device) -> "_Call":
        g = self.group
        n_cols = shape[-1]
        rows = math.prod(shape[:-1])
        ins = [_as_rows(t, load, g, shape) for t, load in zip(raw, self.loads)]
        outs = [_alloc_rows(n, g.roles[n], shape, device) for n in g.outputs]
        lead = list(shape[:-1]) or [1]
        contiguous_rows = [math.prod(lead[d + 1:]) for d in range(len(lead))]
        lead_strides = [list(t.stride()[:-1]) or [0] for t in ins] + [contiguous_rows]
        sizes, strides = _collapse(lead, lead_strides)
        strides = strides[:-1]
        launch = self.reduction_launch(sizes, strides, rows, n_cols, ins)
        xblock = launch.block["XBLOCK"]
        tail = [s for st in strides for s in st] + [t.stride(-1) for t in ins] + list(sizes) + [rows, n_cols]
        meta = {"XBLOCK": xblock, "RBLOCK": launch.block["RBLOCK"], "INT64": launch.int64,
                "num_warps": launch.num_warps}
        return _Call(self.kernel(launch.rank, launch.persistent), ((rows + xblock - 1) // xblock,), tail, meta,
                     [(tuple(o.shape), o.stride(), o.dtype) for o in outs], device)

    def reduction_launch(self, sizes, strides, rows, n_cols, ins) -> _Launch:
        rblock = _pow2(n_cols)
        persistent = rblock <= PERSISTENT_MAX["interpreter" if self.interpret else "gpu"]
        if not persistent:
            rblock = 4096 if self.interpret else 2048
        # elements of one [XBLOCK, RBLOCK] tile: on the GPU about 8 per thread per live value
        budget = (1 << 16) if self.interpret else (2048 if persistent else rblock)
        xblock = max(1, min(_pow2(rows), budget // rblock))
        warps = 1 if self.interpret else max(1, min(16, xblock * rblock // 256))
        span = rows * n_cols
        int64 = span > INT32_MAX or any(
            _max_offset(sizes, st) + (n_cols - 1) * abs(t.stride(-1)) > INT32_MAX for st, t in zip(strides, ins))
        return _Launch(len(sizes), persistent, {"XBLOCK": xblock, "RBLOCK": rblock}, warps, int64)


def _device(tensors) -> torch.device:
    """Where the kernel runs: the device of the inputs that are not 0-d CPU scalars."""
    for t in tensors:
        if t.dim() > 0 or t.device.type != "cpu":
            return t.device
    return tensors[0].device


def _on(t: torch.Tensor, device) -> torch.Tensor:
    """A 0-d CPU tensor may meet CUDA tensors in one op: the kernel needs it on the device."""
    return t if t.device == device else t.to(device)


def _iteration_order(t: torch.Tensor) -> list[int]:
    """Dims from outermost to innermost in ``t``'s memory order (stable for ties)."""
    return sorted(range(t.dim()), key=lambda d: (-t.stride(d), -d)) if t.dim() else []


def _alloc(node, shape, device) -> torch.Tensor:
    """A pointwise output in the layout eager would give it (the dense layout its meta value has)."""
    meta = fusion.value(node)
    order = _iteration_order(meta) if meta.dim() == len(shape) else list(range(len(shape)))
    if sorted(order) != list(range(len(shape))) or meta.is_contiguous():
        return torch.empty(shape, dtype=meta.dtype, device=device)
    perm_shape = [shape[d] for d in order]
    t = torch.empty(perm_shape, dtype=meta.dtype, device=device)
    inverse = [order.index(d) for d in range(len(shape))]
    return t.permute(inverse)


def _alloc_rows(node, role: str, shape, device) -> torch.Tensor:
    """A reduction group's output, contiguous: full size, or one value per row."""
    meta = fusion.value(node)
    if role == "full":
        return torch.empty(shape, dtype=meta.dtype, device=device)
    sizes = list(meta.shape) if _static(meta) else _row_shape(meta, shape)
    return torch.empty(sizes, dtype=meta.dtype, device=device)


def _static(meta) -> bool:
    return all(isinstance(s, int) for s in meta.shape)


def _row_shape(meta, shape) -> list[int]:
    """A row value's runtime shape: the leading dims, with the meta value's kept 1s."""
    lead = list(shape[:-1])
    return lead + [1] if meta.dim() == len(shape) else lead


def _as_rows(t: torch.Tensor, load, group, shape) -> torch.Tensor:
    """An input as a view of the full shape S: broadcast (full loads), or one value per row whose
    last-dim stride is 0 (row loads)."""
    if load.role == "full":
        return t.expand(shape)
    users = [n for n in group.nodes if load.node in n.all_input_nodes and group.roles[n] == "row"]
    node_shape = _row_shape(fusion.value(users[0]), shape) if users else list(shape[:-1]) + [1]
    per_row = t.expand(node_shape).reshape(list(shape[:-1]) + [1])
    return per_row.expand(shape)


def run_reference(group, env: dict) -> None:
    """Run a group's nodes as ATen ops (plan mode, empty tensors)."""
    for n in group.nodes:
        env[n] = _call(n, env)


def _call(node: fx.Node, env: dict):
    args = fx.node.map_arg(node.args, lambda a: _lookup(a, env))
    kwargs = fx.node.map_arg(node.kwargs, lambda a: _lookup(a, env))
    return node.target(*args, **kwargs)


def _lookup(node: fx.Node, env: dict):
    """A value. Constants are made only when an ATen op or the output needs them (kernels inline
    them): one fill of the folded value, whatever chain of ops computed it."""
    if node not in env and fusion.is_constant(node):
        meta = fusion.value(node)
        if fusion.target_name(node) in ops_table.CONSTANTS or not _static(meta):
            env[node] = _call(node, env)
        else:
            env[node] = torch.full(tuple(meta.shape), fusion.constant_value(node), dtype=meta.dtype,
                                   device=meta.device)
    return env[node]


# ---------------------------------------------------------------------------------------------
# the whole graph


@dataclass
class GraphRunner:
    """Executes a GraphModule step by step: group launches and ATen calls, in a topological
    order of the groups (a group launches once all its inputs exist)."""

    gm: fx.GraphModule
    part: object  # graph.Partition
    steps: list  # ("group", GroupRunner) | ("node", fx.Node)
    free_after: list  # per step: nodes whose last use it is
    placeholders: list
    output_args: object

    @classmethod
    def build(cls, gm: fx.GraphModule, part, interpret: bool) -> "GraphRunner":
        runners = {id(g): GroupRunner(g, interpret) for g in part.groups}
        steps = _schedule(gm, part, runners)
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        output = next(n for n in gm.graph.nodes if n.op == "output")
        return cls(gm, part, steps, _last_uses(steps, output, part), placeholders, output.args[0])

    def __call__(self, args, hooks=None):
        env = dict(zip(self.placeholders, args))
        for step, dead in zip(self.steps, self.free_after):
            kind, item = step
            if kind == "group":
                if hooks is not None:
                    hooks.group(item.group, env)
                else:
                    item.run(env)
            else:
                env[item] = _call(item, env)
            for n in dead:
                env.pop(n, None)
        return fx.node.map_arg(self.output_args, lambda a: _lookup(a, env))

    @property
    def group_runners(self):
        return [item for kind, item in self.steps if kind == "group"]


def _schedule(gm, part, runners) -> list:
    """Units (a group, or one node outside any group) in an order that respects every edge."""
    unit_of, units = {}, []
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        g = part.group_of.get(n)
        if g is not None:
            if id(g) not in unit_of:
                unit_of[id(g)] = len(units)
                units.append(("group", runners[id(g)]))
            unit_of[n] = unit_of[id(g)]
        elif not fusion.is_constant(n):  # constants: made on demand (see _lookup)
            unit_of[n] = len(units)
            units.append(("node", n))
    deps = [set() for _ in units]
    for n, u in list(unit_of.items()):
        if isinstance(n, fx.Node):
            for p in n.all_input_nodes:
                if p in unit_of and unit_of[p] != u:
                    deps[u].add(unit_of[p])
    order, done = [], set()
    while len(order) < len(units):
        progressed = False
        for i in range(len(units)):
            if i not in done and deps[i] <= done:
                order.append(units[i])
                done.add(i)
                progressed = True
                break
        if not progressed:
            raise RuntimeError("kernelab: the partition has a cycle between groups")
    return order


def _last_uses(steps, output, part) -> list:
    """After which step each intermediate value can be dropped (keeps peak memory like eager)."""
    keep = set(output.all_input_nodes)
    last = {}
    for i, (kind, item) in enumerate(steps):
        members = item.group.nodes if kind == "group" else [item]
        for n in members:
            for p in n.all_input_nodes:
                last[p] = i
    frees = [[] for _ in steps]
    for n, i in last.items():
        if n not in keep and n.op != "placeholder":
            frees[i].append(n)
    return frees
