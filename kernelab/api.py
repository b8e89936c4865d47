"""count / compare: the kernels of a function in one or several modes, measured or predicted."""
from __future__ import annotations

import contextlib
import copy
import difflib
import logging
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Any

import torch

from . import hardware
from .capture import OpTrace, capture
from .eager_rules import MEMOPS, Context, KernelSpec, lower_eager
from .errors import KernelabError, TargetTimeout
from .report import Kernel, Report, debug_level, render_text
from .attribution import align_modules
from .traffic import bytes_over_ideal, ideal_bytes, kernel_bytes, largest_array_bytes, round_trips

MODES = ("eager", "inductor", "kernelab")

def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise KernelabError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")


def gpu_available() -> bool:
    return torch.cuda.is_available()


def lower(trace: OpTrace, mode: str, ctx: Context) -> list[KernelSpec]:
    """Predicted kernels of a trace in a mode."""
    _check_mode(mode)
    if mode == "eager":
        return lower_eager(trace, ctx)
    if mode == "inductor":
        from .inductor_model import predict_inductor

        return predict_inductor(trace, ctx)
    raise KernelabError("mode 'kernelab' is lowered from the compiler's plan (see _trace_and_kernels)")


def _trace_and_kernels(target, args, kwargs, mode: str, ctx: Context, fake: bool) -> tuple[OpTrace, list[KernelSpec]]:
    """The op trace (for traffic totals) and the mode's kernels. kernelab's compiler plans the call
    itself: its kernels and trace share one storage numbering."""
    _check_mode(mode)
    if mode == "kernelab":
        from .compiler import plan_trace

        return plan_trace(target, args, kwargs, ctx)
    trace = capture(target, args, kwargs, fake=fake, device=None if fake else "cuda")
    return trace, lower(trace, mode, ctx)


def _target_name(target) -> str:
    if isinstance(target, torch.nn.Module):
        return type(target).__name__
    return getattr(target, "__name__", type(target).__name__)


def count(target, *args, mode: str = "eager", predict: bool | None = None, profile: str | None = None,
          name: str | None = None, timeout: float | None = None, **kwargs) -> Report:
    """Which kernels ``target(*args, **kwargs)`` launches in ``mode``, and what each moves.

    ``predict=None`` measures on a GPU and predicts without one; ``predict=True`` always predicts
    (from the named device ``profile``: h200, h100, a100). The target may be a function or an
    ``nn.Module`` (its parameters and buffers count as inputs). CPU tensors stand for CUDA tensors;
    meta tensors (``torch.device("meta")``) let a prediction take any size without allocating.
    ``timeout`` (seconds, main thread only) raises :class:`~kernelab.errors.TargetTimeout` when
    counting takes longer, e.g. for a target that never returns. Every kernel carries the
    nn.Module path that launched it and the user's source line; ``report.by_module()`` groups them.
    """
    _check_mode(mode)
    if not callable(target):
        raise KernelabError(f"the target must be a function or an nn.Module, got {type(target).__name__}")
    name = name or _target_name(target)
    if predict is None:
        predict = not gpu_available()
    if not predict and not gpu_available():
        raise KernelabError("measuring needs a CUDA GPU and none is available; use predict=True")
    with deadline(timeout, f"counting {name} in {mode} mode"):
        if predict:
            report = _predict_or_explain(target, args, kwargs, mode, _profile(profile), name)
        else:
            report = _measure(target, args, kwargs, mode, name)
    report.debug(debug_level(), sys.stderr)
    return report


class _Expired(BaseException):
    """Raised by the alarm: a BaseException, so the target's own ``except Exception`` cannot swallow it."""


@contextlib.contextmanager
def deadline(seconds: float | None, what: str):
    """Raise TargetTimeout in this (main) thread when the block runs longer than ``seconds``.

    The alarm interrupts Python code (a loop, a sleep, a lock wait) and repeats every second until
    the block ends, in case the code it interrupts swallows it; whatever it turns into on its way
    out (torch.compile wraps exceptions), the block ends with TargetTimeout. Elsewhere than the main
    thread, or with ``seconds`` None or 0, it does nothing.
    """
    if not seconds or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return
    expired = []
    message = f"{what} did not finish within {seconds:g} s"

    def alarm(signum, frame):
        expired.append(True)
        raise _Expired(message)

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
    try:
        yield
    except BaseException as exc:
        if expired and not isinstance(exc, TargetTimeout):
            raise TargetTimeout(message) from None
        raise
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    if expired:  # the alarm was swallowed and the block still finished: too late all the same
        raise TargetTimeout(message)


def _profile(name: str | None) -> hardware.DeviceProfile:
    try:
        return hardware.get_profile(name or hardware.DEFAULT_PROFILE)
    except ValueError as exc:
        raise KernelabError(str(exc)) from None


def _eager_view(trace: OpTrace, specs: list[KernelSpec], ctx: Context, mode: str, target, args,
                kwargs) -> tuple[OpTrace, list[KernelSpec]]:
    """The function's eager capture and kernels, which every mode reads the function's own facts
    off: the largest array, the ideal traffic, the modules. kernelab's trace comes from the
    compiler's graphs (decomposed, functionalized), so that mode captures the function once more,
    with fake tensors (nothing runs)."""
    if mode == "kernelab":
        trace = capture(target, args, kwargs, fake=True)
    return trace, specs if mode == "eager" else lower_eager(trace, ctx)


def _traffic_fields(trace: OpTrace, specs: list[KernelSpec], eager: tuple[OpTrace, list[KernelSpec]]) -> dict:
    """Round trips are the mode's own; the largest array and the ideal traffic the function's."""
    eager_trace, eager_specs = eager
    return {"largest_array_bytes": largest_array_bytes(eager_trace, eager_specs),
            "ideal_bytes": ideal_bytes(eager_trace, eager_specs), "round_trips": round_trips(specs),
            "module_types": dict(eager_trace.module_types)}


def _attribute_compiled(specs: list[KernelSpec], mode: str, eager_specs: list[KernelSpec], notes: list[str]) -> None:
    """kernelab's plan names no modules: its kernels take those of the eager kernels they replace."""
    if mode == "kernelab" and specs and not any(s.modules for s in specs):
        align_modules(specs, eager_specs)
        notes.append("modules of kernelab's kernels are those of the eager kernels they replace, aligned in "
                     "launch order (the compiler's plan does not carry module metadata yet)")


def _to_kernel(spec: KernelSpec, **kw) -> Kernel:
    read, written = kernel_bytes(spec)
    return Kernel(spec.name, spec.category, list(spec.ops), read, written, spec.flops,
                  confidence=spec.confidence, reason=spec.reason, modules=list(spec.modules), source=spec.source,
                  backward=spec.backward, **kw)


# ---------------------------------------------------------------------------------------------
# Prediction


def _matmul_dtype(spec: KernelSpec) -> str:
    return spec.reads[0].dtype if spec.reads else "float32"


def predicted_kernel_us(spec: KernelSpec, profile: hardware.DeviceProfile) -> float:
    """Roofline: the larger of moving the bytes and doing the math, never under a launch."""
    read, written = kernel_bytes(spec)
    t = (read + written) / profile.copy_bandwidth
    if spec.category in ("matmul", "attention", "conv"):
        t = max(t, spec.flops / profile.matmul_flops.get(_matmul_dtype(spec), profile.pointwise_flops()))
    return max(t * 1e6, profile.launch_us)


def predicted_wall_us(mode: str, kernel_us: list[float], profile: hardware.DeviceProfile) -> float:
    """A call costs its device time or its host time, whichever is longer."""
    host = profile.compiled_call_us if mode != "eager" else profile.eager_op_us * len(kernel_us)
    return max(sum(kernel_us), host)


def _predict_or_explain(target, args, kwargs, mode, profile, name) -> Report:
    from .capture import DataDependentError

    if mode == "kernelab":
        target = _meta_module_for_meta_args(target, args, kwargs)
    try:
        with _quiet_fake_tensor_log():
            return _predict(target, args, kwargs, mode, profile, name)
    except DataDependentError as exc:
        raise KernelabError(str(exc)) from exc


@contextlib.contextmanager
def _quiet_fake_tensor_log():
    """FakeTensorMode logs a full traceback (ERROR level) for every op whose meta function raises,
    before the error itself propagates: the user gets the error once, not a page of log first."""
    if debug_level() >= 3:
        yield
        return
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    previous = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(previous)


def _meta_module_for_meta_args(target, args, kwargs):
    """With meta inputs (prediction at any size), a module's parameters must be meta too for the
    compiler to trace it: a copy whose tensors are meta, made without copying their data."""
    from torch.utils import _pytree as pytree

    if not isinstance(target, torch.nn.Module):
        return target
    leaves = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    tensors = list(target.parameters()) + list(target.buffers())
    if not leaves or not all(t.is_meta for t in leaves) or all(t.is_meta for t in tensors):
        return target
    memo = {}
    for p in target.parameters():
        memo[id(p)] = torch.nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
    for b in target.buffers():
        memo[id(b)] = torch.empty_like(b, device="meta")
    return copy.deepcopy(target, memo)


def _predict(target, args, kwargs, mode, profile, name) -> Report:
    ctx = Context(profile.arch)
    trace, specs = _trace_and_kernels(target, args, kwargs, mode, ctx, fake=True)
    eager = _eager_view(trace, specs, ctx, mode, target, args, kwargs)
    notes = [f"predicted from the {profile.name} profile; nothing ran"]
    _attribute_compiled(specs, mode, eager[1], notes)
    times = [predicted_kernel_us(s, profile) for s in specs]
    kernels = [_to_kernel(s, time_us=t, ceiling_bytes_per_s=profile.copy_bandwidth, bytes_over_ideal=over,
                          ceiling_flops=profile.matmul_flops.get(_matmul_dtype(s)))
               for s, t, over in zip(specs, times, bytes_over_ideal(trace, specs))]
    return Report(mode, name, False, f"{profile.name} (profile: {profile.source})", kernels,
                  wall_time_us=predicted_wall_us(mode, times, profile), notes=notes,
                  **_traffic_fields(trace, specs, eager))


# ---------------------------------------------------------------------------------------------
# Measurement (GPU)


def _compiled(fn, mode: str):
    if mode == "eager":
        return fn
    if mode == "inductor":
        return torch.compile(fn)
    from .compiler import compile as kernelab_compile

    return kernelab_compile(fn)



def attribute(measured: list, specs: list[KernelSpec], mode: str) -> list[tuple[Any, KernelSpec | None]]:
    """Pair measured kernels with predicted ones (same op in eager, same category compiled), in order,
    so each measured kernel gets the bytes and FLOPs the trace says it moves."""
    if mode == "eager":
        left = [(k.op or "").split("::")[-1] for k in measured]
        right = [s.ops[0] if s.ops else "" for s in specs]
    else:
        left = [k.category for k in measured]
        right = [s.category for s in specs]
    pairs: list = [(k, None) for k in measured]
    matcher = difflib.SequenceMatcher(None, left, right, autojunk=False)
    for tag, a0, a1, b0, b1 in matcher.get_opcodes():
        # equal runs pair up; so do same-length runs that differ only in naming (an op reported
        # by its inner op, e.g. embedding's kernel launched from aten::gather)
        if tag == "equal" or (tag == "replace" and a1 - a0 == b1 - b0):
            for j in range(a1 - a0):
                pairs[a0 + j] = (measured[a0 + j], specs[b0 + j])
    return pairs


def _measured_kernel(dk, spec: KernelSpec | None, ceilings: hardware.Ceilings, over: int = 0) -> Kernel:
    from .measure import ops_from_inductor_name

    category = dk.category if dk.kind == "kernel" else dk.kind
    if spec is None:
        ops = [dk.op.split("::")[-1]] if dk.op else ops_from_inductor_name(dk.name) or ["?"]
        k = Kernel(dk.name, category, ops, confidence="low",
                   reason="not paired with a predicted kernel: bytes not attributed")
    else:
        k = _to_kernel(spec, bytes_over_ideal=over)
        k.name, k.category = dk.name, category
    k.time_us, k.measured = dk.duration_us, True
    k.ceiling_bytes_per_s = ceilings.copy_bandwidth
    k.ceiling_flops = ceilings.matmul_flops.get(_matmul_dtype(spec)) if spec and spec.reads else None
    return k


def _cold_cache_reset(prepared):
    """Before every profiled call: clear .grad, and evict the L2 cache by writing a buffer twice
    its size, so per-kernel times are HBM times (not a warm cache). The eviction kernel is
    launched outside the profiled call and is not counted."""
    l2 = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 64 << 20)
    scratch = torch.empty(max(2 * l2, 256 << 20), dtype=torch.int8, device="cuda")

    def reset():
        prepared.reset_grads()
        scratch.zero_()

    return reset


def time_call(fn, reset) -> float:
    """Median wall time of one call in microseconds (CUDA events, after warm-up)."""
    import triton.testing

    def call():
        reset()
        fn()

    return 1000.0 * triton.testing.do_bench(call, warmup=25, rep=100, return_mode="median")


def _measure(target, args, kwargs, mode, name) -> Report:
    from .targets import compiles_every_time

    if kwargs:
        raise KernelabError("measuring takes positional arguments only")
    with compiles_every_time():  # the compiled modes compile the target here, for every call
        return _measure_compiled(target, args, kwargs, mode, name)


def _measure_compiled(target, args, kwargs, mode, name) -> Report:
    from .measure import measure_kernels
    from .targets import prepare_on_device

    gpu = torch.cuda.get_device_name()
    ctx = Context(torch.cuda.get_device_capability())
    trace, specs = _trace_and_kernels(target, args, kwargs, mode, ctx, fake=mode == "kernelab")
    eager = _eager_view(trace, specs, ctx, mode, target, args, kwargs)
    ceilings = hardware.cached_or_copy_only()
    notes = [f"measured on {gpu}, torch {torch.__version__}; ceilings: copy {ceilings.copy_bandwidth / 1e12:.2f} TB/s"]
    _attribute_compiled(specs, mode, eager[1], notes)
    prepared = prepare_on_device(target, tuple(args), "cuda")
    fn = _compiled(prepared.fn, mode)
    measured = measure_kernels(fn, prepared.args, reset=_cold_cache_reset(prepared))
    over = {id(s): o for s, o in zip(specs, bytes_over_ideal(trace, specs))}
    kernels = [_measured_kernel(dk, spec, ceilings, over.get(id(spec), 0))
               for dk, spec in attribute(measured, specs, mode)]
    modules_from_neighbours(kernels)
    wall = time_call(lambda: fn(*prepared.args), prepared.reset_grads)
    return Report(mode, name, True, gpu, kernels, wall_time_us=wall, notes=notes, **_traffic_fields(trace, specs, eager))


def modules_from_neighbours(kernels: list[Kernel]) -> None:
    """A measured kernel no predicted one paired with takes the modules of the kernel launched
    before it (the first ones: after), so that every kernel has a module; its reason says so."""
    known = [i for i, k in enumerate(kernels) if k.modules]
    if not known:
        return
    for i, k in enumerate(kernels):
        if k.modules:
            continue
        before = [j for j in known if j < i]
        neighbour = kernels[before[-1] if before else known[0]]
        k.modules, k.source, k.backward = list(neighbour.modules), neighbour.source, neighbour.backward
        k.reason += "; module taken from the kernel launched next to it"


# ---------------------------------------------------------------------------------------------
# compare


@dataclass
class Comparison:
    reports: dict[str, Report]

    def summary(self) -> str:
        return "; ".join(r.summary() for r in self.reports.values())

    def to_dict(self) -> dict:
        return {mode: r.to_dict() for mode, r in self.reports.items()}

    def __getitem__(self, mode: str) -> Report:
        return self.reports[mode]

    def __rich_console__(self, console, options):
        for report in self.reports.values():
            yield report.table()
        yield self.summary()

    def __str__(self) -> str:
        """Every mode's table and the summary line, as plain text (``print(comparison)``)."""
        return render_text(self)

    def __repr__(self) -> str:
        return f"<Comparison {self.summary()}>"


def compare(target, *args, modes=("eager", "inductor"), predict: bool | None = None, profile: str | None = None,
            timeout: float | None = None, **kwargs) -> Comparison:
    """The same function in several modes, side by side (``timeout`` applies to each mode)."""
    if not modes:
        raise KernelabError("compare needs at least one mode")
    return Comparison({m: count(target, *args, mode=m, predict=predict, profile=profile, timeout=timeout, **kwargs)
                       for m in modes})
