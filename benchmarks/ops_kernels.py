#!/usr/bin/env python
"""The device kernels one benchmark step launches, per provider, with their GPU times.

    python benchmarks/ops_kernels.py OUT_DIR add_relu:16384x16384:fwd+bwd [softmax:32768x4096:fwd ...] [--host] [--code]

For each case and each provider (kernelab, eager, compile, liger where it has the op): the step the
benchmark times (the forward, or the forward then ``torch.autograd.grad``) is run under
``kernelab.measure.measure_kernels`` (torch.profiler, medians of 5 calls), then timed three ways:
``do_bench`` as the benchmark does, back-to-back calls (wall time per call, one sync at the end),
and the host's own time per call (``--host`` adds cProfile's top functions for kernelab). A step
whose do_bench time is well above its kernels' sum waits on the host or on a synchronization;
``torch.cuda.set_sync_debug_mode`` reports the latter. Prints one table per case and writes
ops_kernels.json under OUT_DIR.
"""

from __future__ import annotations

import argparse
import json
import sys
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def parse_case(text: str):
    """'op:MxN:fwd' or 'op:MxN:fwd+bwd' -> (op, (M, N), backward)."""
    try:
        op, shape, pass_ = text.split(":")
        m, n = (int(v) for v in shape.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"case {text!r}: expected op:MxN:fwd or op:MxN:fwd+bwd") from None
    if pass_ not in ("fwd", "fwd+bwd"):
        raise argparse.ArgumentTypeError(f"case {text!r}: the pass must be fwd or fwd+bwd, not {pass_!r}")
    return op, (m, n), pass_ == "fwd+bwd"


def step_times(step, step_args, calls: int = 20) -> dict:
    """do_bench median, back-to-back wall time per call, host time per call (all in us), and the
    synchronizing calls one step makes (torch.cuda.set_sync_debug_mode)."""
    import time
    import warnings

    import torch
    import triton.testing

    bench = triton.testing.do_bench(lambda: step(*step_args), warmup=10, rep=40, return_mode="median") * 1e3
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        step(*step_args)
    host = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / calls * 1e6
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step(*step_args)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # the mode's own "is a prototype" notice is not a synchronizing call
    syncs = sorted({str(w.message).splitlines()[0][:60] for w in caught
                    if "synchroniz" in str(w.message).lower() and "prototype" not in str(w.message)})
    return {"do_bench us": bench, "back-to-back us/call": wall, "host us/call": host, "syncs": "; ".join(syncs) or "none"}


def host_profile(fn, step, step_args, grad_of, calls: int = 20) -> str:
    """Where a step's host time goes: the forward call and the backward call timed apart
    (back-to-back, one sync at the end), then torch.profiler's CPU-side table (CUDA runtime and
    driver calls included) of ``calls`` steps, by self CPU time."""
    import time

    import torch

    lines = []
    if grad_of:
        torch.cuda.synchronize()
        fwd = bwd = 0.0
        for _ in range(calls):
            t0 = time.perf_counter()
            out = fn(*step_args)
            t1 = time.perf_counter()
            torch.autograd.grad(out, [step_args[i] for i in grad_of], torch.ones_like(out))
            t2 = time.perf_counter()
            fwd, bwd = fwd + (t1 - t0), bwd + (t2 - t1)
        torch.cuda.synchronize()
        lines.append(f"host per step: forward call {fwd / calls * 1e6:.1f} us, backward call {bwd / calls * 1e6:.1f} us")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step(*step_args)
        torch.cuda.synchronize()
    lines.append(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=50))
    return "\n".join(lines)


def write_inductor_code(step, step_args, path: Path) -> None:
    """Inductor's generated source (wrapper and Triton kernels with their launch heuristics) for one
    call of ``step``, compiled afresh."""
    import torch
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    _, sources = run_and_get_code(step, *step_args)
    path.write_text("\n\n# ----- next source\n\n".join(sources))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("cases", nargs="+", type=parse_case)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--host", action="store_true", help="cProfile kernelab's step and print its top functions")
    p.add_argument("--code", action="store_true",
                   help="write the Triton source torch.compile generates for each case to OUT_DIR/<case>_inductor.py")
    args = p.parse_args()

    import torch
    from rich.console import Console
    from rich.table import Table

    from kernelab.bench import runner
    from kernelab.bench import specs as S
    from kernelab.measure import measure_kernels

    console = Console(width=160)
    if not torch.cuda.is_available():
        console.print("[red]no CUDA device[/red]")
        return 2
    unknown = sorted({op for op, _, _ in args.cases} - set(S.specs()))
    if unknown:
        console.print(f"[red]unknown op(s) {unknown}; known: {sorted(S.specs())}[/red]")
        return 2
    device, dtype = torch.device("cuda"), getattr(torch, args.dtype)
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for op, shape, backward in args.cases:
        spec = S.specs()[op]
        case = runner.Case(op, shape, dtype, backward)
        gen = torch.Generator(device).manual_seed(zlib.crc32(case.label.encode()))
        inputs = spec.make(shape, dtype, device, gen)
        grad_out = None
        table = Table(title=f"{case.label} ({args.dtype})")
        for col in ("provider", "kernel", "op", "grid", "us"):
            table.add_column(col)
        for name, fn in runner.provider_fns(spec, runner.PROVIDERS).items():
            step_args = runner.with_grad(inputs.args, inputs.grad_of, backward)
            if grad_out is None:
                ref = fn(*step_args)
                grad_out = torch.randn(ref.shape, device=device, generator=gen).to(ref.dtype) if ref.dim() else torch.ones((), device=device, dtype=dtype)
                del ref
            step = runner._step(fn, inputs.grad_of, backward, grad_out)
            try:
                kernels = measure_kernels(step, step_args)
            except Exception as e:  # noqa: BLE001 - a provider failing is a result
                table.add_row(name, f"error: {type(e).__name__}: {e}"[:90], "", "", "")
                continue
            for k in kernels:
                table.add_row(name, k.name[:70], k.op or "-", str(k.grid or ""), f"{k.duration_us:.1f}")
            total = sum(k.duration_us for k in kernels)
            table.add_row(name, f"[bold]total ({len(kernels)})[/bold]", "", "", f"[bold]{total:.1f}[/bold]")
            times = step_times(step, step_args)
            for label, us in times.items():
                table.add_row(name, label, "", "", f"{us:.1f}" if isinstance(us, float) else str(us))
            if args.code and name == "compile":
                write_inductor_code(step, step_args, args.out / f"{case.label.replace(' ', '_')}_inductor.py")
            if args.host and name in ("kernelab", "liger"):
                console.print(f"--- host profile: {case.label}, {name}", markup=False)
                console.print(host_profile(fn, step, step_args, inputs.grad_of if backward else []), markup=False)
            results.append({"case": case.label, "provider": name, "total_us": total, **times,
                            "kernels": [k.to_json() for k in kernels]})
            torch.cuda.empty_cache()
        console.print(table)
    env = runner.environment(device)
    (args.out / "ops_kernels.json").write_text(json.dumps({"env": env, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
