"""The benchmark loop: for each (op, shape, pass), check every provider against float64, then time it.

Providers: ``kernelab``, ``eager`` (PyTorch), ``compile`` (``torch.compile`` of the eager code, a
fresh compile per shape and pass) and ``liger`` (Liger-Kernel, where it has the op). A provider
that raises is recorded with its error; one whose output is off is recorded as wrong and still
timed. Every row carries the GPU, versions and date.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
import zlib
from typing import Callable, Iterable

import torch

from . import specs as S
from . import timing

PROVIDERS = ("kernelab", "eager", "compile", "liger")
PASSES = {False: "fwd", True: "fwd+bwd"}


@dataclasses.dataclass
class Case:
    op: str
    shape: tuple[int, int]
    dtype: torch.dtype
    backward: bool

    @property
    def label(self) -> str:
        return f"{self.op} {self.shape[0]}x{self.shape[1]} {PASSES[self.backward]}"


@dataclasses.dataclass
class Row:
    date: str
    gpu: str
    torch: str
    triton: str
    liger: str
    op: str
    shape: str
    m: int
    n: int
    dtype: str
    pass_: str
    provider: str
    status: str
    ms: float | None
    bytes: int
    tbps: float | None
    pct_copy: float | None
    copy_tbps: float
    vs_eager: float | None = None
    vs_compile: float | None = None
    vs_liger: float | None = None
    rel_err: float | None = None
    bytes_model: str = ""
    timer: str = "time_ms"  # timing.time_ms (do_bench, what the caller waits) or kernel_time_ms
    graph_ms: float | None = None  # extra_timers: GPU time without the host (timing.graph_ms)
    host_us: float | None = None   # extra_timers: the host's time per call (timing.host_us)


def environment(device: torch.device) -> dict:
    import triton

    try:
        from importlib.metadata import version

        liger = version("liger-kernel")
    except Exception:  # noqa: BLE001
        liger = "absent"
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"date": date, "gpu": gpu, "torch": torch.__version__, "triton": triton.__version__, "liger": liger}


def cases(ops: Iterable[str], dtype: torch.dtype, backward_modes=(False, True), shapes=None, grid: str = "pow2") -> list[Case]:
    """Every (op, shape, pass): ``shapes``, or the op's shapes in the named grid (``specs.GRIDS``)."""
    all_specs = S.specs()
    out = []
    for op in ops:
        for shape in shapes or S.grid_shapes(all_specs[op], grid):
            for backward in backward_modes:
                out.append(Case(op, tuple(shape), dtype, backward))
    return out


def provider_fns(spec: S.Spec, wanted: Iterable[str]) -> dict[str, Callable]:
    """Name -> callable, the compiled one fresh (torch._dynamo.reset() first)."""
    fns = {}
    for name in wanted:
        if name == "compile":
            torch._dynamo.reset()
            fns[name] = torch.compile(spec.providers["eager"], dynamic=False)
        elif name in spec.providers:
            fns[name] = spec.providers[name]
    return fns


def with_grad(args, grad_of, backward: bool):
    """Fresh copies of a case's floating-point arguments, those in ``grad_of`` requiring grad when
    the case runs the backward (every provider gets its own leaves)."""
    return tuple(a.detach().clone().requires_grad_(backward and i in grad_of) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                 for i, a in enumerate(args))


def _step(fn, grad_of, backward: bool, grad_out):
    """What is timed: the forward, or the forward then torch.autograd.grad."""
    if not backward:
        return fn

    def run(*args):
        out = fn(*args)
        return torch.autograd.grad(out, [args[i] for i in grad_of], grad_out.to(out.dtype))

    return run


def _reference(spec: S.Spec, inputs, case: Case, device: torch.device, gen) -> tuple[list, torch.Tensor]:
    """The float64 outputs (and input gradients, for a backward case) of one case, and the output
    gradient every provider is given. Computed on the GPU; where float64 does not fit there (a
    151936-word vocabulary's log-softmax and its gradient at 4096 rows hold ~20 GB of float64 on an
    80 GB card beside the providers' caches), on the CPU, where the results stay
    (``timing.compare`` brings the providers' outputs to them chunk by chunk)."""
    grad_out = None
    for where in ((device, torch.device("cpu")) if device.type == "cuda" else (device,)):
        try:
            ref_args = with_grad(tuple(a.to(where, torch.float64) if isinstance(a, torch.Tensor) and a.is_floating_point() else
                                       a.to(where) if isinstance(a, torch.Tensor) else a for a in inputs.args),
                                 inputs.grad_of, case.backward)
            ref_out = spec.reference(*ref_args)
            if grad_out is None:  # drawn once: a retry on the CPU gives the providers the same one
                grad_out = (torch.randn(ref_out.shape, device=device, generator=gen, dtype=torch.float32).to(case.dtype)
                            if ref_out.dim() else torch.ones((), device=device, dtype=case.dtype))
            ref = [ref_out]
            if case.backward:
                ref += list(torch.autograd.grad(ref_out, [ref_args[i] for i in inputs.grad_of], grad_out.to(where, torch.float64)))
            return ref, grad_out
        except torch.cuda.OutOfMemoryError:
            ref_args = ref_out = ref = None
            _release_memory()
    raise AssertionError("unreachable: the CPU reference raises rather than running out of GPU memory")


def _release_memory() -> None:
    """Drop what the last case left to the garbage collector and hand cached blocks back."""
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_case(case: Case, wanted: Iterable[str], device: torch.device, env: dict, copy: float, progress=None, task=None,
             timer=timing.time_ms, spec: S.Spec | None = None, extra_timers: dict | None = None) -> list[Row]:
    """Check and time every provider of one (op, shape, pass) (``timer`` is swappable for CPU tests).
    ``spec``: instead of the op's own (e.g. with extra providers); ``extra_timers``: Row field name
    -> timer (``graph_ms``, ``host_us``), run after ``timer`` on the same input sets."""
    spec = spec or S.specs()[case.op]
    nbytes = S.bytes_moved(spec, case.shape, case.dtype, case.backward)
    gen = torch.Generator(device).manual_seed(zlib.crc32(case.label.encode()))
    # float64 reference on fresh inputs (the providers see the same values, rounded to dtype)
    inputs = spec.make(case.shape, case.dtype, device, gen)
    ref, grad_out = _reference(spec, inputs, case, device, gen)
    out_sizes = sorted({r.numel() * case.dtype.itemsize for r in ref if r.numel()}, reverse=True) or [4]
    rows = []
    for name, fn in provider_fns(spec, wanted).items():
        step = _step(fn, inputs.grad_of, case.backward, grad_out)
        row = Row(**env, op=case.op, shape=f"{case.shape[0]}x{case.shape[1]}", m=case.shape[0], n=case.shape[1],
                  dtype=str(case.dtype).replace("torch.", ""), pass_=PASSES[case.backward], provider=name,
                  status="ok", ms=None, bytes=nbytes, tbps=None, pct_copy=None, copy_tbps=copy, bytes_model=spec.note)
        if progress is not None:
            progress.update(task, description=f"{case.label} [{name}]")
        try:
            # correctness: fresh copies of the inputs, outputs poisoned, compared to float64
            timing.poison(out_sizes, device)
            args = with_grad(inputs.args, inputs.grad_of, case.backward)
            out = fn(*args)
            got = [out]
            if case.backward:
                got += list(torch.autograd.grad(out, [args[i] for i in inputs.grad_of], grad_out.to(out.dtype)))
            del args, out
            err = timing.compare(got, ref)
            row.rel_err = err
            if not err <= timing.REL_TOL[case.dtype]:
                row.status = f"wrong (rel err {err:.2e})"
            del got
            # timing: input sets rotated through, spanning more than L2
            per_set = sum(a.numel() * a.element_size() for a in inputs.args if isinstance(a, torch.Tensor))
            sets = [with_grad(spec.make(case.shape, case.dtype, device, gen).args, inputs.grad_of, case.backward)
                    for _ in range(timing.sets_needed(per_set))]
            row.ms = timer(step, sets)
            row.timer = getattr(timer, "__name__", str(timer))
            for field, extra in (extra_timers or {}).items():
                setattr(row, field, extra(step, sets))
            del sets
            if row.ms:  # an untimed run (a compile-ahead worker's timer) reports 0 ms
                row.tbps = nbytes / (row.ms * 1e-3) / 1e12
                row.pct_copy = 100.0 * row.tbps / copy if copy else None
        except Exception as e:  # noqa: BLE001 - a provider failing is a result, not a crash
            row.status = f"error: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
        rows.append(row)
        torch.cuda.empty_cache() if device.type == "cuda" else None
        if progress is not None:
            progress.advance(task)
    _ratios(rows)
    return rows


def _ratios(rows: list[Row]) -> None:
    """Speed-up of each provider over each peer (peer ms / own ms), where both were timed (an
    untimed run, e.g. a compile-ahead worker's, reports 0 ms and gets no ratio)."""
    ms = {r.provider: r.ms for r in rows if r.ms and not r.status.startswith("error")}
    for r in rows:
        if not r.ms:
            continue
        for peer in ("eager", "compile", "liger"):
            if peer in ms and peer != r.provider:
                setattr(r, f"vs_{peer}", ms[peer] / r.ms)


def run(case_list: list[Case], wanted=PROVIDERS, device=None, copy: float | None = None, deadline: float | None = None, console=None,
        extra_timers: dict | None = None) -> list[Row]:
    """Run every case with a progress bar; cases past ``deadline`` (time.monotonic) are skipped.
    ``extra_timers``: Row field -> timer (e.g. ``{"graph_ms": timing.graph_ms}``), run after the main one."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    device = device or torch.device("cuda")
    env = environment(device)
    copy = copy if copy is not None else timing.copy_tbps(device)
    all_specs = S.specs()
    total = sum(len([p for p in wanted if p == "compile" or p in all_specs[c.op].providers]) for c in case_list)
    rows = []
    columns = (TextColumn("{task.description:48s}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("benchmarks", total=total)
        for case in case_list:
            if deadline is not None and time.monotonic() > deadline:
                rows.append(Row(**env, op=case.op, shape=f"{case.shape[0]}x{case.shape[1]}", m=case.shape[0], n=case.shape[1],
                                dtype=str(case.dtype).replace("torch.", ""), pass_=PASSES[case.backward], provider="all",
                                status="skipped (time budget)", ms=None, bytes=0, tbps=None, pct_copy=None, copy_tbps=copy))
                continue
            rows += run_case(case, wanted, device, env, copy, progress, task, extra_timers=extra_timers)
            _release_memory()
            _report_held_memory(case, device, progress.console)
    return rows


def _report_held_memory(case: Case, device: torch.device, console) -> None:
    """A case leaves nothing on the GPU; one that does (a provider's cache, a captured graph) is
    named here, so a later case running out of memory can be traced to the case that filled it."""
    if device.type != "cuda":
        return
    held = torch.cuda.memory_allocated(device)
    if held > 1 << 30:
        console.print(f"[yellow]memory still allocated after {case.label}: {held / 2**30:.2f} GiB[/yellow]")
