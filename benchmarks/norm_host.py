#!/usr/bin/env python
"""Host time of a layer_norm / rms_norm call, measured on the CPU with the GPU launches stubbed.

    python3 benchmarks/norm_host.py [--steps 2000] [--repeats 7] [--profile] [--settings]

What a forward (+ backward) call costs the host before the GPU sees anything: kernelab's Python,
autograd, allocations and its launch path (``kernelab.launch.Launcher`` with its argument
specialization and bound-binary lookup, run for real) with only the driver's launch replaced by a
no-op; against eager PyTorch's F.layer_norm / F.rms_norm on 8x64 CPU tensors (dispatch,
autograd and allocations in C++, plus a CPU kernel of 512 elements). No GPU needed; run it on the
GPU's host too (``CUDA_VISIBLE_DEVICES=`` keeps it off the GPU) to see that host's speed.

The issue's target: kernelab's host time per call must not exceed eager's. Numbers are medians
of ``--repeats`` rounds of ``--steps`` calls, rounds of the providers interleaved, so that a busy
machine slows them alike. ``--settings``: every launch setting of ``norm_tune.py`` too.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


class _Binary:
    """A compiled kernel whose launch does nothing (what ``Launcher`` binds to)."""

    function = packed_metadata = None

    def run(self, *args):
        return None

    def _init_handles(self):
        return None


def stub_launches() -> None:
    """Launch through ``kernelab.launch.Launcher`` as on a GPU, minus the driver call: CPU tensors
    are treated as CUDA device 0, the binary is a no-op."""
    from kernelab import launch
    from kernelab.ops import _common

    _common.use_triton = lambda t: t.dtype in _common.FLOAT_DTYPES
    launch._cuda_index = lambda args: 0
    launch._current_device = lambda: 0
    launch._current_stream = lambda device: 0
    launch._triton_supported = lambda: True
    launch.Launcher._triton = lambda self, grid, args, num_warps, maxnreg, constexprs: _Binary()


def steps(op: str, settings: bool) -> dict:
    """Name -> (forward call, forward+backward call) on 8x64 float32 CPU tensors."""
    import torch
    import torch.nn.functional as F

    import kernelab.ops as K
    from kernelab.ops import norms

    x = torch.randn(8, 64, requires_grad=True)
    w = torch.randn(64, requires_grad=True)
    b = torch.randn(64, requires_grad=True)
    g = torch.randn(8, 64)
    inputs = (x, w, b) if op == "layer_norm" else (x, w)

    def pair(fn):
        def fwd():
            with torch.no_grad():
                return fn(*inputs)

        def fwd_bwd():
            return torch.autograd.grad(fn(*inputs), inputs, g)

        return fwd, fwd_bwd

    def of(module):
        if op == "layer_norm":
            return lambda x, w, b: module.layer_norm(x, (64,), w, b, 1e-5)
        return lambda x, w: module.rms_norm(x, (64,), w, 1e-6)

    out = {"eager": pair(of(F)), "kernelab": pair(of(K))}
    if settings:
        from norm_tune import settings as norm_settings

        for label, config in norm_settings(backward=True).items():
            if config is not None:
                out[f"kernelab~{label}"] = pair(of(norms.configured(config)))
    return out


def measure(calls: dict, n: int, repeats: int) -> dict:
    """Microseconds per call: median over rounds, the rounds of all calls interleaved."""
    for fn in calls.values():
        for _ in range(100):
            fn()
    times = {name: [] for name in calls}
    for _ in range(repeats):
        for name, fn in calls.items():
            start = time.perf_counter()
            for _ in range(n):
                fn()
            times[name].append((time.perf_counter() - start) / n * 1e6)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--ops", nargs="+", default=["layer_norm", "rms_norm"], choices=("layer_norm", "rms_norm"))
    p.add_argument("--profile", action="store_true", help="cProfile kernelab's forward+backward, top functions")
    p.add_argument("--settings", action="store_true", help="also every launch setting of norm_tune.py")
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)  # eager's CPU kernels of 512 elements: no thread pool to wake
    stub_launches()
    for op in args.ops:
        pairs = steps(op, args.settings)
        calls = {f"{name} {kind}": fns[i] for name, fns in pairs.items() for i, kind in enumerate(("fwd", "fwd+bwd"))}
        got = measure(calls, args.steps, args.repeats)
        print(f"{op}: host us per call (median of {args.repeats} x {args.steps}; launches stubbed)")
        for kind in ("fwd", "fwd+bwd"):
            eager = got[f"eager {kind}"]
            for name in pairs:
                us = got[f"{name} {kind}"]
                print(f"  {kind:8s} {name:32s} {us:7.1f} us  {us / eager:5.2f}x eager")
        if args.profile:
            import cProfile
            import pstats

            profiler = cProfile.Profile()
            fwd_bwd = pairs["kernelab"][1]
            profiler.enable()
            for _ in range(args.steps):
                fwd_bwd()
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(18)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
