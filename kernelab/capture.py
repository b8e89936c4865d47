"""Capture: run a function under a dispatch-level recorder and return its OpTrace.

Every ATen op that reaches the dispatcher is recorded with the tensors it reads and writes
(storage identity, shape, stride, dtype), whether it is a view, and whether it ran in the
backward pass. Composite ops (``F.linear``, ``logsumexp``, ...) are already decomposed at this
level, so the trace is what a device backend actually executes.

Two ways to run:

* ``fake=True`` (no GPU): tensors become fake tensors (``FakeTensorMode``): nothing is allocated
  and nothing runs. They stay CPU fakes, because a CPU-only PyTorch build aborts when autograd
  meets a CUDA fake tensor; the few ops whose decomposition depends on the device (dropout, SDPA)
  are recorded at the ``torch.nn.functional`` level instead, as the op a CUDA device would run.
* ``fake=False``: the real tensors run (on a GPU, to pair the trace with measured kernels).
"""
from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from .attribution import Attributor, Site

# Ops that only describe tensors: they never reach a device.
_IGNORED_NAMESPACES = ("prim",)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as an op saw it: which storage, which elements, what type."""

    storage: int  # small integer, unique per storage within one trace
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: str
    itemsize: int
    device: str

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def footprint(self) -> int:
        """Bytes of memory the tensor spans once: broadcast (stride-0) dims count once."""
        n = 1
        for size, stride in zip(self.shape, self.stride):
            if size == 0:
                return 0
            if stride != 0:
                n *= size
        return n * self.itemsize

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def is_contiguous(self) -> bool:
        expected = 1
        for size, stride in reversed(list(zip(self.shape, self.stride))):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True

    @property
    def region(self) -> tuple:
        """Identity of the elements (not the values): storage plus the view's geometry."""
        return (self.storage, self.offset, self.shape, self.stride)


@dataclass
class OpRecord:
    """One ATen op call."""

    index: int
    name: str  # e.g. "aten.add.Tensor"
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    mutated: list[TensorInfo]  # inputs the op writes in place (schema "Tensor(a!)")
    is_view: bool  # output aliases an input, nothing is computed
    backward: bool  # ran inside the autograd engine
    args: dict[str, Any] = field(default_factory=dict)  # schema argument name -> value (tensors as TensorInfo)
    module: str | None = None  # nn.Module path that ran it (backward: whose forward it differentiates);
    # "" the target itself, None when nobody tracked modules (a compiled graph's ops)
    source: str = ""  # the user's source line, "file.py:42" (backward: the forward op's line)

    @property
    def packet(self) -> str:
        """"aten.add.Tensor" -> "aten.add"."""
        parts = self.name.split(".")
        return ".".join(parts[:2])

    @property
    def short(self) -> str:
        """"aten.add.Tensor" -> "add"."""
        return self.name.split(".")[1]

    @property
    def written(self) -> list[TensorInfo]:
        return self.outputs + [t for t in self.mutated if t.region not in {o.region for o in self.outputs}]


@dataclass
class OpTrace:
    """All ops of one call, plus what the function received and returned."""

    ops: list[OpRecord]
    inputs: list[TensorInfo]  # argument tensors, module parameters and buffers
    outputs: list[TensorInfo]  # returned tensors, tensors mutated in place, gradients produced
    device: str
    module_types: dict[str, str] = field(default_factory=dict)  # module path -> class name

    def __iter__(self):
        return iter(self.ops)

    def __len__(self) -> int:
        return len(self.ops)


class StorageIds:
    """Gives each storage a small stable integer; keeps the storages alive so ids never recycle.

    Sizes that depend on data (``x[x > 0]`` under fake tensors) are unknown: each such symbol is
    estimated once (see ``estimate``) and used consistently for every tensor that carries it.
    """

    def __init__(self):
        self._ids: dict[int, int] = {}
        self._alive: list[Any] = []
        self.estimates: dict[Any, int] = {}

    def estimate(self, size, value: int) -> None:
        """Give a data-dependent size symbol a value (used before any tensor of that size is read)."""
        if isinstance(size, torch.SymInt):
            for symbol in size.node.expr.free_symbols:
                self.estimates.setdefault(symbol, value)

    def size(self, s) -> int:
        if not isinstance(s, torch.SymInt):
            return int(s)
        expr = s.node.expr
        if s.node.hint is not None:
            return int(s.node.hint)
        for symbol in expr.free_symbols:
            self.estimates.setdefault(symbol, 1)
        return int(expr.subs(self.estimates))

    def info(self, t: torch.Tensor) -> TensorInfo:
        storage = t.untyped_storage()
        key = storage._cdata
        if key not in self._ids:
            self._ids[key] = len(self._ids)
            self._alive.append(storage)
        return TensorInfo(
            storage=self._ids[key],
            shape=tuple(self.size(s) for s in t.shape),
            stride=tuple(self.size(s) for s in t.stride()),
            offset=self.size(t.storage_offset()),
            dtype=str(t.dtype).replace("torch.", ""),
            itemsize=t.element_size(),
            device=str(t.device.type),
        )


def _bind_arguments(func, args, kwargs) -> dict[str, Any]:
    bound = {}
    schema_args = func._schema.arguments
    for arg, value in zip(schema_args, args):
        bound[arg.name] = value
    bound.update(kwargs)
    return bound


def _mutated_inputs(func, bound: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors bound to schema arguments marked as written (``Tensor(a!)``)."""
    out = []
    for schema_arg in func._schema.arguments:
        if schema_arg.alias_info is not None and schema_arg.alias_info.is_write:
            value = bound.get(schema_arg.name)
            out.extend(v for v in pytree.tree_leaves(value) if isinstance(v, torch.Tensor))
    return out


def _is_view(func) -> bool:
    if getattr(func, "is_view", False):
        return True
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


_CUBLAS_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "_addmm_activation"})


class Recorder(TorchDispatchMode):
    """Records every op; ops inside a device-specific functional call are folded into that call."""

    def __init__(self, ids: StorageIds, attributor: Attributor | None = None):
        super().__init__()
        self.ids = ids
        self.ops: list[OpRecord] = []
        self.suppress = 0
        self.attributor = attributor  # module and source line of each op (None: not tracked)

    def tensor_infos(self, tree) -> list[TensorInfo]:
        return [self.ids.info(t) for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.suppress or func.namespace in _IGNORED_NAMESPACES:
            return out
        self.estimate_data_dependent(args, out)
        self.record(func, args, kwargs, out)
        return out

    def estimate_data_dependent(self, args, out) -> None:
        """A size only the data decides (a boolean mask's count) is taken as half its bound."""
        bound = max((t.numel() for t in pytree.tree_leaves(args) if isinstance(t, torch.Tensor)
                     and not isinstance(t.numel(), torch.SymInt)), default=1)
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                for size in t.shape:
                    self.ids.estimate(size, max(bound // 2, 1))

    def info_tree(self, tree):
        return pytree.tree_map(lambda v: self.ids.info(v) if isinstance(v, torch.Tensor) else v, tree)

    def record(self, func, args, kwargs, out) -> None:
        """One ATen op: its tensors, the inputs it writes in place, its schema arguments."""
        bound = _bind_arguments(func, args, kwargs)
        mutated = _mutated_inputs(func, bound)
        written = {self.ids.info(m).region for m in mutated}
        by_name = self.info_tree(bound)
        if func.name().split("::")[-1].split(".")[0] in _CUBLAS_OPS:
            # cuBLAS picks its kernels by precision too: record the TF32 switch the call ran under
            by_name["allow_tf32"] = torch.backends.cuda.matmul.allow_tf32
        self.append(_op_name(func), by_name, (args, kwargs), out,
                    mutated=[self.ids.info(m) for m in mutated], written=written, is_view=_is_view(func))

    def append(self, name, args_by_name, inputs, out, mutated=(), written=frozenset(), is_view=False) -> None:
        site = self.attributor.site() if self.attributor is not None else Site(None)
        self.ops.append(OpRecord(
            index=len(self.ops), name=name, inputs=self.tensor_infos(inputs),
            outputs=_without(self.tensor_infos(out), written), mutated=list(mutated), is_view=is_view,
            backward=torch._C._current_autograd_node() is not None, args=args_by_name,
            module=site.module, source=site.source))


def _without(infos: list[TensorInfo], regions: set) -> list[TensorInfo]:
    """In-place ops return the tensor they mutate: that is a write already counted as mutated."""
    return [i for i in infos if i.region not in regions]


def _op_name(func) -> str:
    return f"{func.namespace}.{func._schema.name.split('::')[1]}.{func._overloadname}"


# Functional calls whose CPU decomposition differs from what a CUDA device runs. Each maps to the
# single ATen op the CUDA path launches; the CPU ops run underneath are not recorded.
def _dropout_applies(args, kwargs) -> bool:
    p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
    training = kwargs.get("training", args[2] if len(args) > 2 else True)
    return bool(training) and 0.0 < float(p) < 1.0


_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_DEVICE_SPECIFIC = {
    # function: (op recorded, positional argument names, does the device-specific path apply?)
    F.scaled_dot_product_attention: ("aten.scaled_dot_product_attention.cuda", _SDPA_ARGS, lambda a, k: True),
    F.dropout: ("aten.native_dropout.default", ("input", "p", "training", "inplace"), _dropout_applies),
}


def _float32_grouped_mm(args, kwargs) -> bool:
    a = args[0] if args else kwargs.get("mat_a", kwargs.get("input"))
    return isinstance(a, torch.Tensor) and a.dtype == torch.float32


def _via_bfloat16(func, args, kwargs):
    """``func`` on bfloat16 copies of its float32 tensors, the result back in float32. torch's fake
    (meta) kernel of ``_grouped_mm`` takes 16-bit matrices only, while its CPU kernel takes float32
    (Hugging Face's MoE experts call it so in float32 models): the output's shape is dtype-free."""
    def cast(t, dtype):
        return t.to(dtype) if isinstance(t, torch.Tensor) and t.dtype == torch.float32 else t

    out = func(*pytree.tree_map(lambda t: cast(t, torch.bfloat16), args), **kwargs)
    return pytree.tree_map(lambda t: t.to(torch.float32) if isinstance(t, torch.Tensor) else t, out)


#: Calls whose fake kernel refuses what the real one accepts: run on a stand-in (fake capture
#: only), recorded as the one op. The backward of the stand-in is recorded as it runs (a float32
#: grouped GEMM's backward: its two products in bfloat16 with casts around them).
_FAKE_STAND_INS = {
    torch._grouped_mm: ("aten._grouped_mm.default", ("mat_a", "mat_b", "offs", "bias", "out_dtype"),
                        _float32_grouped_mm, _via_bfloat16),
}


class _DeviceSpecificCalls(TorchFunctionMode):
    """Folds the calls in _DEVICE_SPECIFIC into one recorded op (fake capture only), and runs the
    calls in _FAKE_STAND_INS on their stand-in."""

    def __init__(self, recorder: Recorder):
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        entry = _DEVICE_SPECIFIC.get(func) or _FAKE_STAND_INS.get(func)
        if entry is None or self.recorder.suppress or not entry[2](args, kwargs):
            return func(*args, **kwargs)
        name, arg_names, _ = entry[:3]
        self.recorder.suppress += 1
        try:
            out = entry[3](func, args, kwargs) if len(entry) > 3 else func(*args, **kwargs)
        finally:
            self.recorder.suppress -= 1
        bound = {**dict(zip(arg_names, args)), **kwargs}
        self.recorder.append(name, self.recorder.info_tree(bound), (args, kwargs), out)
        return out


# ---------------------------------------------------------------------------------------------
# Preparing the target: fake tensors for prediction, real ones for measurement.


@dataclass
class Prepared:
    call: Callable[[], Any]
    input_tensors: list[torch.Tensor]  # args, parameters and buffers as the function sees them
    grad_leaves: list[torch.Tensor]  # tensors whose .grad the function may fill
    root: torch.nn.Module | None = None  # the module called (module paths are relative to it)


def _to_fake(t, mode):
    """A fake CPU tensor for a real or meta tensor (meta inputs let sweeps predict 1e9 elements
    without allocating them)."""
    if not isinstance(t, torch.Tensor):
        return t
    if t.is_meta:
        with mode:
            fake = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")
        return fake.requires_grad_(t.requires_grad)
    return mode.from_tensor(t)


def _fake_target(target, args, kwargs, mode):
    convert = lambda t: _to_fake(t, mode)  # noqa: E731
    # a module among the arguments (a training step's model) runs as a copy on fakes: its backward
    # would otherwise leave fake gradients in the caller's real parameters
    fargs = pytree.tree_map(lambda a: _fake_module(a, convert) if isinstance(a, torch.nn.Module) else convert(a),
                            (args, kwargs))
    if isinstance(target, torch.nn.Module):
        state = {name: convert(t) for name, t in _module_state(target).items()}
        fn = lambda *a, **k: torch.func.functional_call(target, state, a, k)  # noqa: E731
        extra = list(state.values())
    else:
        fn, extra = target, []
    return fn, fargs, extra


def _fake_module(module: torch.nn.Module, convert) -> torch.nn.Module:
    """A copy of ``module`` whose parameters and buffers are fakes: its structure is copied, no
    tensor's data (each tensor's copy is its fake, through deepcopy's memo)."""
    memo = {id(t): convert(t) for t in _module_state(module).values()}
    return copy.deepcopy(module, memo)


def _module_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    state = dict(module.named_parameters())
    state.update(dict(module.named_buffers()))
    return state


def prepare(target, args, kwargs, *, fake_mode=None, device=None) -> Prepared:
    """Bind target and inputs: as fakes inside ``fake_mode``, or copied to ``device``."""
    if not callable(target):
        raise ValueError(f"the target must be a function or an nn.Module, got {type(target).__name__}")
    if fake_mode is not None:
        fn, (fargs, fkwargs), extra = _fake_target(target, args, kwargs, fake_mode)
        root = target if isinstance(target, torch.nn.Module) else None
    else:
        from .targets import prepare_on_device

        moved = prepare_on_device(target, tuple(args), device)
        fn, fargs, fkwargs, root = moved.fn, moved.args, kwargs, moved.module
        extra = list(_module_state(moved.module).values()) if moved.module is not None else []
    tensors = [t for t in pytree.tree_leaves((fargs, fkwargs)) if isinstance(t, torch.Tensor)] + extra
    leaves = [t for t in tensors if t.requires_grad and t.is_leaf]
    return Prepared(lambda: fn(*fargs, **fkwargs), tensors, leaves, root)


def reset_grads(prepared: Prepared) -> None:
    """Clear .grad so every call starts like the first one (no accumulate-add on repeat calls)."""
    for t in prepared.grad_leaves:
        t.grad = None


def capture(target, args=(), kwargs=None, *, fake: bool = True, device=None) -> OpTrace:
    """Run ``target(*args, **kwargs)`` once under the recorder and return the trace.

    With ``fake=True`` nothing runs; CPU tensors among the inputs (and a module's parameters)
    stand for CUDA tensors of the same shape, dtype and strides. Every op carries the module
    path that ran it and the user's source line (see ``kernelab.attribution``).
    """
    kwargs = kwargs or {}
    ids = StorageIds()
    recorder = Recorder(ids)
    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode

        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        # a ShapeEnv lets data-dependent sizes (boolean masks, nonzero) become symbols
        fake_mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv(), static_shapes=True)
        with fake_mode:
            prepared = prepare(target, args, kwargs, fake_mode=fake_mode)
    else:
        prepared = prepare(target, args, kwargs, device=device)
    recorder.attributor = Attributor(prepared.root)
    # the attributor: module hooks, and a function mode that tags the autograd nodes of each torch call
    modes = [fake_mode, recorder.attributor, _DeviceSpecificCalls(recorder), recorder] if fake else \
        [recorder.attributor, recorder]
    inputs = [ids.info(t) for t in prepared.input_tensors]
    with contextlib.ExitStack() as stack:
        for m in modes:
            stack.enter_context(m)
        result = _call(prepared, fake)
    outputs = function_outputs(result, recorder, prepared, ids)
    trace_device = "cuda" if fake else str(device or "cpu")
    return OpTrace(recorder.ops, inputs, outputs, trace_device, dict(recorder.attributor.types))


class DataDependentError(RuntimeError):
    """The function branches on tensor values: which kernels run depends on data nobody has."""


def _call(prepared: Prepared, fake: bool):
    if not fake:
        return prepared.call()
    from torch._subclasses.fake_tensor import DataDependentOutputException
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    try:
        return prepared.call()
    except (GuardOnDataDependentSymNode, DataDependentOutputException) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataDependentError(
            f"the function's control flow depends on tensor values ({first}); without a GPU nothing runs, "
            "so its kernels cannot be predicted: measure it on a GPU, or branch on shapes instead") from exc


def function_outputs(result, recorder, prepared, ids) -> list[TensorInfo]:
    """Returned tensors, inputs written in place, and gradients left in .grad."""
    outs = [ids.info(t) for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]
    input_storages = {ids.info(t).storage for t in prepared.input_tensors}
    for op in recorder.ops:
        outs.extend(m for m in op.mutated if m.storage in input_storages)
    outs.extend(ids.info(t.grad) for t in prepared.grad_leaves if t.grad is not None)
    unique = {}
    for t in outs:
        unique.setdefault(t.region, t)
    return list(unique.values())
