#!/usr/bin/env python
"""Where one forward+backward of ``kernelab.ops.linear`` spends its time, next to eager's: GPU time per
kernel (torch.profiler) and the host's time per step, at chosen shapes.

    python3 benchmarks/linear_profile.py OUT_DIR [--shapes 8192x768x3072 ...] [--steps 20] [--cprofile]

Per shape and provider (kernelab with cuBLAS backward products, eager ``gelu(F.linear(x, w, b))``):
the step's wall time (CUDA-synchronized, median of 5 rounds of ``--steps`` steps), the host's time to
issue one step without waiting (``time.perf_counter`` around the calls, no synchronize: when it is
above the GPU time, the GPU waits for the host), and the GPU time of each kernel per step;
``--cprofile``: also the Python functions of kernelab's step by their own time (cProfile, where the
host time goes). Writes OUT_DIR/linear_profile.txt. Needs a CUDA GPU.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _providers():
    import kernelab.ops as ops

    return {"kernelab": lambda x, w, b: ops.linear(x, w, b, activation="gelu"),
            "eager": lambda x, w, b: F.gelu(F.linear(x, w, b))}


def _step(fn, x, w, b, dy):
    y = fn(x, w, b)
    torch.autograd.backward(y, dy)


def _timings(fn, args, steps: int) -> tuple[float, float]:
    """(wall ms per step, synchronized; host ms per step, not waiting), medians of 5 rounds."""
    wall, host = [], []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            _step(fn, *args)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        host.append((t1 - t0) * 1e3 / steps)
        wall.append((t2 - t0) * 1e3 / steps)
    return statistics.median(wall), statistics.median(host)


def _kernels(fn, args, steps: int) -> list[tuple[str, int, float]]:
    """(kernel name, calls per step, GPU us per step), largest first."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            _step(fn, *args)
        torch.cuda.synchronize()
    rows = [(e.key, e.count // steps, e.device_time_total / steps) for e in prof.key_averages()
            if e.device_time_total > 0]
    return sorted(rows, key=lambda r: -r[2])


def _python_profile(fn, args, steps: int) -> list[str]:
    """The 25 functions with the most own time over ``steps`` steps (cProfile), per step."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        _step(fn, *args)
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
    return [f"    cProfile over {steps} steps:"] + ["    " + line for line in text.getvalue().splitlines() if line.strip()]


def profile_shape(m: int, k: int, n: int, steps: int, cprofile: bool = False) -> list[str]:
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, k, device="cuda", generator=g, dtype=torch.bfloat16).requires_grad_()
    w = (torch.randn(n, k, device="cuda", generator=g) / k**0.5).to(torch.bfloat16).requires_grad_()
    b = torch.randn(n, device="cuda", generator=g, dtype=torch.bfloat16).requires_grad_()
    dy = torch.randn(m, n, device="cuda", generator=g, dtype=torch.bfloat16)
    lines = [f"== {m}x{k}->{n} bf16, gelu + bias, forward+backward"]
    for name, fn in _providers().items():
        for _ in range(3):
            _step(fn, x, w, b, dy)
        wall, host = _timings(fn, (x, w, b, dy), steps)
        kernels = _kernels(fn, (x, w, b, dy), steps)
        gpu = sum(r[2] for r in kernels)
        lines.append(f"{name}: wall {wall * 1e3:.0f} us/step, host {host * 1e3:.0f} us/step, "
                     f"GPU {gpu:.0f} us/step in {sum(r[1] for r in kernels)} kernels")
        lines += [f"    {us:8.1f} us  x{calls}  {key[:110]}" for key, calls, us in kernels]
        if cprofile and name == "kernelab":
            lines += _python_profile(fn, (x, w, b, dy), steps)
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--shapes", nargs="+", default=["8192x768x3072", "8192x4096x11008"], metavar="MxKxN")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--cprofile", action="store_true", help="also cProfile kernelab's step (host time by function)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("linear_profile.py needs a CUDA GPU", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    lines = []
    for shape in args.shapes:
        lines += profile_shape(*(int(v) for v in shape.lower().split("x")), args.steps, args.cprofile)
    (args.out / "linear_profile.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
