#!/usr/bin/env python
"""Host time of each kernelab op call next to eager PyTorch's: on the CPU with the GPU launches
stubbed, or on a CUDA GPU's host with real launches.

    python3 benchmarks/ops_host.py [--ops layer_norm softmax ...] [--out results/host_cpu_DATE.txt]
                                   [--steps 300] [--repeats 15] [--profile OP]     (no GPU: stubbed)
    python3 benchmarks/ops_host.py OUT_DIR [--budget-s 150]                        (CUDA GPU)

What one forward (no_grad) or forward + ``torch.autograd.grad`` call costs the host (the calling
thread's CPU time, ``time.thread_time``, so that time spent descheduled on a shared machine does
not count), on small inputs (8 rows of 64; 128 classes; a 64 x 64 or 128 x 64 weight), float32.

* **No GPU** (the default without CUDA, or ``--stub``): kernelab runs its Python, autograd,
  allocations and its launch path (``kernelab.launch.Launcher``: specialization key, bound-binary
  lookup, argument list) for real, with only the driver's launch replaced by a no-op and CPU
  tensors taken for CUDA device 0 (:func:`stub_launches`). Eager: the ``torch.nn.functional`` call
  on the same CPU tensors (dispatch, autograd and allocations in C++, plus CPU kernels of a few
  hundred elements). Neither side pays the driver's launch (cuLaunchKernel, a few us each on a
  GPU host), so this compares the Python and C++ work around the launches. Eager's CPU rms_norm is
  a composite of several ops where CUDA's is one kernel: its figure overstates eager's GPU host
  cost. CPU figures are for relative comparisons only.
* **CUDA GPU** (``OUT_DIR`` given): real launches on CUDA tensors of the same shapes; providers
  eager, kernelab, and kernelab with every launch through Triton's ordinary path (launchers that
  never bind: what direct launches save). First a check: kernelab's outputs and gradients with
  direct launches equal those through Triton's path bit for bit, and eager's within a float32
  tolerance. Writes OUT_DIR/ops_host.csv (GPU, versions and date in every row); stops starting
  ops past ``--budget-s`` (and says so); the table last.

The issue's target (12, part 2): kernelab's host time per call must not exceed eager's. Medians of
``--repeats`` rounds of ``--steps`` calls, the rounds of all providers interleaved so that a busy
machine slows them alike; "x eager" is the median of each round's ratio to eager's round beside it.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OPS = ("layer_norm", "rms_norm", "softmax", "cross_entropy", "silu_mul", "bias_gelu", "linear", "linear_cross_entropy")


class _Binary:
    """A compiled kernel whose launch does nothing (what ``Launcher`` binds to)."""

    function = packed_metadata = None

    def run(self, *args):
        return None

    def _init_handles(self):
        return None


def stub_launches() -> None:
    """Launch through ``kernelab.launch.Launcher`` as on a GPU, minus the driver call: CPU tensors
    are treated as CUDA device 0, the binary is a no-op. The cross-entropy ops' check of class
    targets in CPU memory (skipped for CUDA tensors, where it would cost a sync) is skipped too."""
    import importlib

    from kernelab import launch
    from kernelab.ops import _common

    _common.use_triton = lambda t: t.dtype in _common.FLOAT_DTYPES
    launch._cuda_index = lambda args: 0
    launch._current_device = lambda: 0
    launch._stream_function = lambda: lambda device: 0
    launch._triton_supported = lambda: True
    launch.Launcher._triton = lambda self, *args, **kwargs: _Binary()
    for name in ("cross_entropy", "linear_cross_entropy"):  # the modules (the package exports functions)
        importlib.import_module(f"kernelab.ops.{name}").check_targets_on_host = lambda *a: None


def on_triton_path(fn):
    """``fn`` with kernelab's launches through Triton's ordinary path (``launch.triton_path``)."""
    from kernelab import launch

    def call(*args):
        with launch.triton_path():
            return fn(*args)
    return call


def cases(ops, device: str = "cpu") -> dict:
    """op -> (inputs, indices of the inputs that require grad, {provider: fn(*inputs)})."""
    import torch
    import torch.nn.functional as F

    import kernelab.ops as K

    def t(*shape, grad=True):
        return torch.randn(*shape, device=device, requires_grad=grad)

    x, w, b = t(8, 64), t(64), t(64)
    logits, target = t(8, 128), torch.randint(0, 128, (8,), device=device)
    head = t(128, 64)
    table = {
        "layer_norm": ((x, w, b), (0, 1, 2), lambda m: lambda x, w, b: m.layer_norm(x, (64,), w, b, 1e-5)),
        "rms_norm": ((x, w), (0, 1), lambda m: lambda x, w: m.rms_norm(x, (64,), w, 1e-6)),
        "softmax": ((x,), (0,), lambda m: lambda x: m.softmax(x, -1)),
        "cross_entropy": ((logits, target), (0,), lambda m: lambda x, t: m.cross_entropy(x, t)),
        "silu_mul": ((x, t(8, 64)), (0, 1), None),
        "bias_gelu": ((x, b), (0, 1), None),
        "linear": ((x, t(64, 64), b), (0, 1, 2), lambda m: lambda x, w, b: m.linear(x, w, b)),
        "linear_cross_entropy": ((x, head, target), (0, 1), None),
    }
    eager_only = {
        "silu_mul": lambda g, u: F.silu(g) * u,
        "bias_gelu": lambda x, b: F.gelu(x + b),
        "linear_cross_entropy": lambda h, w, t: F.cross_entropy(F.linear(h, w).float(), t),
    }
    kernelab_only = {"silu_mul": K.silu_mul, "bias_gelu": K.bias_gelu, "linear_cross_entropy": K.linear_cross_entropy}
    out = {}
    for op in ops:
        inputs, grad_of, of = table[op]
        fns = {"eager": of(F), "kernelab": of(K)} if of else {"eager": eager_only[op], "kernelab": kernelab_only[op]}
        out[op] = (inputs, grad_of, fns)
    return out


def steps(inputs, grad_of, fn, g=None) -> tuple:
    """(forward under no_grad, forward + autograd.grad of the grad-requiring inputs against the
    output gradient ``g``: random by default)."""
    import torch

    wanted = [inputs[i] for i in grad_of]
    if g is None:
        with torch.no_grad():
            out = fn(*inputs)
            g = torch.randn(out.shape, device=out.device)

    def fwd():
        with torch.no_grad():
            return fn(*inputs)

    def fwd_bwd():
        return torch.autograd.grad(fn(*inputs), wanted, g)

    return fwd, fwd_bwd


def measure(calls: dict, n: int, repeats: int, sync=None) -> dict:
    """name -> per-round (thread CPU us, wall us, issue us) per call: rounds of ``n`` calls, the
    rounds of all calls interleaved; "issue" is the wall time until the last call returned (the
    GPU may still be working), "wall" until the GPU finished too. On a GPU (``sync`` given) the
    GPU is idle before each round and waited for after it, so the wall time also holds the
    autograd engine's device thread, where CUDA backward functions run (the calling thread only
    waits there: its CPU time misses them), and GPU time the host does not cover (small inputs:
    a few us a kernel)."""
    for fn in calls.values():
        for _ in range(min(20, n)):  # warm-up; a smoke run's 2 calls warm up twice
            fn()
    times = {name: [] for name in calls}
    for _ in range(repeats):
        for name, fn in calls.items():
            if sync:
                sync()
            start, wall = time.thread_time(), time.perf_counter()
            for _ in range(n):
                fn()
            cpu, issued = time.thread_time() - start, time.perf_counter() - wall
            if sync:
                sync()
            times[name].append((cpu / n * 1e6, (time.perf_counter() - wall) / n * 1e6, issued / n * 1e6))
    return times


def machine() -> str:
    """One line: CPU model, cores, Python, torch, triton, commit, date."""
    import torch
    import triton

    model = platform.processor() or "?"
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, check=False).stdout.strip() or "?"
    except OSError:
        commit = "?"
    return (f"{model}, {os.cpu_count()} cores, torch threads 1; Python {platform.python_version()}, torch "
            f"{torch.__version__}, triton {triton.__version__}; commit {commit}; {datetime.date.today()}")


def run_op(op: str, fns: dict, inputs, grad_of, n: int, repeats: int, sync=None) -> list[tuple]:
    """Rows (op, pass, provider, thread us, us / eager, wall us, wall / eager): medians over
    rounds, each ratio the median of each round's ratio to eager's round beside it."""
    rows = []
    pairs = {name: steps(inputs, grad_of, fn) for name, fn in fns.items()}
    calls = {(name, kind): pair[i] for name, pair in pairs.items() for i, kind in enumerate(("fwd", "fwd+bwd"))}
    got = measure(calls, n, repeats, sync)
    for kind in ("fwd", "fwd+bwd"):
        eager = got[("eager", kind)]
        for name in pairs:
            mine = got[(name, kind)]
            row = [op, kind, name]
            for i in (0, 1):
                row += [statistics.median(t[i] for t in mine), statistics.median(a[i] / b[i] for a, b in zip(mine, eager))]
            rows.append(tuple(row))
    return rows


def render(rows, n: int, repeats: int, where: str, wall: bool = False) -> str:
    """The table; ``wall`` adds the wall-clock columns (GPU runs: the device thread's work too)."""
    lines = [f"host us per call (thread CPU time{', and wall time' if wall else ''}), {where}; median of {repeats} "
             f"rounds x {n} calls",
             f"{'op':22s} {'pass':8s} {'provider':28s} {'us':>8s} {'x eager':>8s}" + (f" {'wall us':>8s} {'x eager':>8s}" if wall else "")]
    for op, kind, name, us, ratio, wall_us, wall_ratio in rows:
        lines.append(f"{op:22s} {kind:8s} {name:28s} {us:8.1f} {ratio:8.2f}" + (f" {wall_us:8.1f} {wall_ratio:8.2f}" if wall else ""))
    return "\n".join(lines)


def profile(op: str, n: int) -> None:
    """cProfile of kernelab's forward + backward of ``op``, top functions by own time."""
    import cProfile
    import pstats

    inputs, grad_of, fns = cases([op])[op]
    fwd_bwd = steps(inputs, grad_of, fns["kernelab"])[1]
    for _ in range(100):
        fwd_bwd()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(n):
        fwd_bwd()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(22)


# --------------------------------------------------------------------------- on a CUDA GPU
def check(op: str, inputs, grad_of, fns) -> str:
    """"ok", or what differs: kernelab with direct launches against Triton's path (bit for bit),
    and against eager (float32 tolerance)."""
    import torch

    with torch.no_grad():
        out = fns["eager"](*inputs)
        g = torch.randn(out.shape, device=out.device, dtype=out.dtype)

    def outputs(fn):
        with torch.no_grad():
            out = fn(*inputs)
        return [out, *steps(inputs, grad_of, fn, g)[1]()]

    outputs(fns["kernelab"])  # binds
    direct, ordinary, eager = outputs(fns["kernelab"]), outputs(on_triton_path(fns["kernelab"])), outputs(fns["eager"])
    for i, (d, o, e) in enumerate(zip(direct, ordinary, eager)):
        if not torch.equal(d, o):
            return f"output {i}: direct launch != Triton's path"
        if not torch.allclose(d.float(), e.float(), rtol=1e-3, atol=1e-3):
            return f"output {i}: kernelab != eager (max |diff| {(d.float() - e.float()).abs().max().item():.3g})"
    return "ok"


@functools.lru_cache(maxsize=1)
def _floor_function():
    """A layer_norm-shaped autograd.Function that launches nothing: the forward allocates y, the
    backward dx, dw and db (the outputs every implementation must make). What any Python-level
    autograd.Function costs the host a forward+backward, whatever its kernels."""
    import torch

    class Floor(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            ctx.save_for_backward(x, w)
            return torch.empty_like(x)

        @staticmethod
        def backward(ctx, dy):
            x, w = ctx.saved_tensors
            return torch.empty_like(x), torch.empty_like(w), torch.empty_like(w)

    return Floor


def norm_parts(device: str, shape=(8, 64), n: int = 200, repeats: int = 7, sync=None) -> list[str]:
    """Wall us per call of layer_norm's pieces called directly on this thread (no autograd):
    ``_norm_forward`` and ``_norm_backward`` (weight and bias gradients), next to the whole
    forward+backward through autograd, kernelab and eager: what the kernels' host path costs
    apart from the autograd machinery around it."""
    import torch
    import torch.nn.functional as F

    from kernelab.ops import norms

    m, k = shape
    x = torch.randn(m, k, device=device, requires_grad=True)
    w = torch.randn(k, device=device, requires_grad=True)
    b = torch.randn(k, device=device, requires_grad=True)
    dy = torch.randn(m, k, device=device)
    with torch.no_grad():
        y, mean, rstd = norms._norm_forward(x, k, w, b, 1e-5, False)
    floor = _floor_function()
    calls = {
        "kernelab _norm_forward": lambda: norms._norm_forward(x.detach(), k, w.detach(), b.detach(), 1e-5, False),
        "kernelab _norm_backward": lambda: norms._norm_backward(dy, x.detach(), w.detach(), mean, rstd, k, False, True, True),
        "kernelab fwd+bwd (autograd)": lambda: torch.autograd.grad(norms.layer_norm(x, (k,), w, b), (x, w, b), dy),
        "eager fwd+bwd (autograd)": lambda: torch.autograd.grad(F.layer_norm(x, (k,), w, b), (x, w, b), dy),
        "python Function floor fwd+bwd": lambda: torch.autograd.grad(floor.apply(x, w, b), (x, w, b), dy),
        "torch.empty x1": lambda: torch.empty((m, k), device=device),
    }
    got = measure(calls, n, repeats, sync)
    body = _timed_backward_body(calls["kernelab fwd+bwd (autograd)"], n, sync)
    return [f"kernelab _norm_backward inside autograd's backward (its device thread on CUDA), {m}x{k}: {body:8.1f} us"] + [
            f"{name:32s} {m}x{k}: wall {statistics.median(t[1] for t in got[name]):8.1f} us, issue "
            f"{statistics.median(t[2] for t in got[name]):8.1f} us, thread "
            f"{statistics.median(t[0] for t in got[name]):8.1f} us" for name in calls]


def _timed_backward_body(step, n: int, sync=None) -> float:
    """Mean wall us of ``norms._norm_backward`` when ``step`` (a layer_norm forward+backward) runs
    it through autograd: on CUDA on the engine's device thread, where the calling thread's timers
    cannot see it."""
    from kernelab.ops import norms

    inner, spent = norms._norm_backward, []

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - start)

    norms._norm_backward = timed
    try:
        for _ in range(n):
            step()
        if sync:
            sync()
    finally:
        norms._norm_backward = inner
    return statistics.median(spent) * 1e6 if spent else float("nan")


def profiler_table(op: str, shape=None, device: str = "cuda", calls: int = 5, out_dir: Path | None = None) -> str:
    """torch.profiler over ``calls`` forward+backward calls of ``op``, kernelab then eager: the
    CPU-side time by function on every thread (the autograd device thread too), and a Chrome trace
    per provider under ``out_dir``. The norms at ``shape`` (MxN, bf16) where given; otherwise
    (and for every other op) the small float32 inputs of the host table (``cases``)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if shape is not None and op in ("layer_norm", "rms_norm"):
        inputs, grad_of, fns = _norm_case(op, shape, device)
        label = f"{shape[0]}x{shape[1]} bf16"
    else:
        inputs, grad_of, fns = cases([op], device)[op]
        label = "small float32 inputs"
    text = []
    for name in ("kernelab", "eager"):
        step = steps(inputs, grad_of, fns[name])[1]
        for _ in range(10):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=False) as prof:
            wall = time.perf_counter()
            for _ in range(calls):
                step()
            host = (time.perf_counter() - wall) / calls * 1e6
            torch.cuda.synchronize()
        if out_dir is not None:
            prof.export_chrome_trace(str(out_dir / f"trace_{op}_{name}.json"))
        text.append(f"== {op} {label} fwd+bwd, {name}: host {host:.0f} us a call under the profiler")
        text.append(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))
    return "\n".join(text)


def _norm_case(op: str, shape, device: str):
    """(inputs, grad_of, {provider: fn}) of a norm at ``shape`` in bf16, weight (and bias) with grad."""
    import torch
    import torch.nn.functional as F

    import kernelab.ops as K

    m, k = shape
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(k, device=device, dtype=torch.bfloat16, requires_grad=True)
    b = torch.zeros(k, device=device, dtype=torch.bfloat16, requires_grad=True)
    if op == "layer_norm":
        return (x, w, b), (0, 1, 2), {n: (lambda x, w, b, mod=mod: mod.layer_norm(x, (k,), w, b, 1e-5))
                                      for n, mod in (("kernelab", K), ("eager", F))}
    return (x, w), (0, 1), {n: (lambda x, w, mod=mod: mod.rms_norm(x, (k,), w, 1e-6)) for n, mod in (("kernelab", K), ("eager", F))}


def gpu_main(args) -> int:
    import torch
    import triton

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    device = "cpu" if args.smoke else "cuda"
    gpu = "CPU smoke run (TRITON_INTERPRET=1)" if args.smoke else torch.cuda.get_device_name()
    sync = None if args.smoke else torch.cuda.synchronize
    date = datetime.datetime.now().isoformat(timespec="seconds")
    deadline = time.monotonic() + args.budget_s
    rows, skipped, checks = [], [], {}
    for op, (inputs, grad_of, fns) in cases(args.ops, device).items():
        if time.monotonic() > deadline:
            skipped.append(op)
            continue
        fns["kernelab (Triton path)"] = on_triton_path(fns["kernelab"])
        checks[op] = check(op, inputs, grad_of, fns)
        if checks[op] != "ok":
            continue
        rows += run_op(op, fns, inputs, grad_of, args.steps, args.repeats, sync)
    header = "op,pass,provider,host_us,x_eager,wall_us,wall_x_eager,gpu,torch,triton,date\n"
    lines = [f"{op},{kind},{name},{us:.2f},{ratio:.3f},{wall:.2f},{wall_ratio:.3f},{gpu},{torch.__version__},"
             f"{triton.__version__},{date}\n" for op, kind, name, us, ratio, wall, wall_ratio in rows]
    (out_dir / "ops_host.csv").write_text(header + "".join(lines))
    print("checks: " + ", ".join(f"{op} {result}" for op, result in checks.items()))
    if skipped:
        print(f"budget of {args.budget_s:.0f} s spent: skipped {', '.join(skipped)}")
    print(f"machine: {machine()}; {gpu}")
    print(render(rows, args.steps, args.repeats, "real launches on " + gpu, wall=True))
    print("\n".join(norm_parts(device, n=args.steps, repeats=args.repeats, sync=sync)))
    for shape in args.at or ():
        print("\n".join(norm_parts(device, shape, n=min(20, args.steps), repeats=args.repeats, sync=sync)))
    traced = [(op, args.trace_shape) for op in ("layer_norm", "rms_norm") if args.trace_shape] + \
        [(op, None) for op in args.trace_ops or ()]
    if not args.smoke and traced:
        tables = "\n".join(profiler_table(op, shape, out_dir=out_dir) for op, shape in traced)
        (out_dir / "ops_host_profile.txt").write_text(tables + "\n")
        print(tables)
    return 0 if all(result == "ok" for result in checks.values()) else 1


def _rows_by_width(text: str) -> tuple[int, int]:
    """``MxN`` (e.g. 16384x2048) -> (M, N); anything else is argparse's one-line usage error."""
    try:
        m, n = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ROWSxWIDTH such as 16384x2048, got {text!r}") from None
    if m < 1 or n < 1:
        raise argparse.ArgumentTypeError(f"rows and width must be positive, got {text!r}")
    return m, n


def parser(ops=OPS) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir", nargs="?", help="on a CUDA GPU: where ops_host.csv goes")
    p.add_argument("--budget-s", type=float, default=150.0, help="GPU: start no op past this many seconds")
    p.add_argument("--stub", action="store_true", help="stubbed launches on CPU tensors even where CUDA exists")
    p.add_argument("--ops", nargs="+", default=list(ops), choices=OPS)
    p.add_argument("--steps", type=int, help="calls a round (default 300 stubbed, 200 on a GPU)")
    p.add_argument("--repeats", type=int, help="rounds (default 15 stubbed, 7 on a GPU)")
    p.add_argument("--out", type=Path, help="stubbed: also write the table (with the machine) to this file")
    p.add_argument("--profile", choices=OPS, help="stubbed: cProfile kernelab's forward+backward of this op")
    p.add_argument("--at", nargs="+", type=_rows_by_width, help="GPU: also time layer_norm's pieces at these MxN (float32), "
                   "host and GPU time together (e.g. 16384x2048)")
    p.add_argument("--trace-shape", type=_rows_by_width, help="GPU: also profile the norms' forward+backward at this MxN (bf16), "
                   "every thread's CPU time and a Chrome trace each (e.g. 16384x2048)")
    p.add_argument("--trace-ops", nargs="+", choices=OPS, help="GPU: also profile these ops' forward+backward on the small "
                   "inputs of the table, every thread's CPU time and a Chrome trace each")
    p.add_argument("--smoke", action="store_true",
                   help="the GPU flow on CPU tensors under TRITON_INTERPRET=1 (checks the script, measures nothing)")
    return p


def main(args=None) -> int:
    args = args or parser().parse_args()
    import torch

    torch.set_num_threads(1)  # eager's CPU kernels of a few hundred elements: no thread pool to wake
    torch.manual_seed(0)
    if args.smoke:
        args.steps, args.repeats = 2, 1
        return gpu_main(args)
    if torch.cuda.is_available() and not args.stub and args.out_dir:
        args.steps, args.repeats = args.steps or 200, args.repeats or 7
        return gpu_main(args)
    args.steps, args.repeats = args.steps or 300, args.repeats or 15
    stub_launches()
    if args.profile:
        profile(args.profile, args.steps * 5)
        return 0
    rows = []
    for op, (inputs, grad_of, fns) in cases(args.ops).items():
        rows += run_op(op, fns, inputs, grad_of, args.steps, args.repeats)
    text = f"machine: {machine()}\n" + render(rows, args.steps, args.repeats, "launches stubbed (CPU)")
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
