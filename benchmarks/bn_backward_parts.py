#!/usr/bin/env python
"""Batch norm's training backward on channels-last activations: ATen's kernels against the
compiler's generated ones, at ResNet-50's shapes, kernel by kernel, with the launch settings the
generated kernels could take.

    python3 benchmarks/bn_backward_parts.py OUT [--budget-s 300] [--steps 5]
    TRITON_INTERPRET=1 python3 benchmarks/bn_backward_parts.py OUT --smoke      (CPU: tiny shapes, values only)

Each case is one of ResNet-50's norm shapes (batch 32, fp32, channels-last) in a pattern ResNet
has: ``relu(bn(x))`` (a 3x3's or 1x1's norm inside a bottleneck) or ``relu(bn(x) + r)`` (the
bottleneck's last norm and its residual). Providers: eager, Inductor, kernelab with ATen's
backward (the default), kernelab with the generated backward (``KERNELAB_BN_BACKWARD=generated``)
under the default launch settings and under variants of the pointwise kernels' block / elements a
thread and the column kernels' column block / tile / warps (``kernelab/compiler/tiling.py``).

Timed by torch's profiler: the GPU time of every kernel of ``--steps`` training steps (forward +
backward), and of as many forwards alone; "bwd_us" is the difference (the backward's kernels,
the ReLU's backward included). "bwd_bytes" counts what the backward must move at least: reading
the output's gradient, the norm's input and the ReLU's mask (1 byte) and writing the input's
gradient (and the residual's: the same gradient, counted once more where the pattern has one).
Every provider's gradients are compared with eager's first (the largest relative norm over
the input's, the residual's and the norm's parameters' gradients, "grad_err"). The ReLU's kink
decides most of it: a pre-activation within float32 rounding of 0 on one side in eager and on
the other in a compiled forward moves that element's gradient by the whole incoming gradient
(three such elements of 6.4M put 1e-3 on the input's gradient; measured on an H100: 1.0e-3 for
every kernelab provider at 32x64x56x56 whichever backward ran, 2e-7 at the other shapes).
Writes OUT/bn_backward_parts.csv (GPU, versions, date in every row) and prints, per case, each
provider's backward time and the best generated setting last.
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from kernelab.compiler.tiling import ColumnTiling, PointwiseTiling, Tiling  # noqa: E402

#: ResNet-50's norm shapes at batch 32 (channels, side), the stem's and every stage's
#: (largest share of the step's norm traffic first: a call's budget may stop before the last)
SHAPES = [(256, 56), (64, 56), (512, 28), (1024, 14), (128, 28), (256, 14), (2048, 7), (64, 112), (512, 7)]
SMOKE_SHAPES = [(16, 8), (32, 4)]
PATTERNS = ("relu", "residual")

#: the generated backward's launch settings: name -> Tiling (the default first)
VARIANTS = {
    "gen": Tiling(),
    "gen_pw1024x4": Tiling(pointwise=PointwiseTiling(1024, 4)),
    "gen_pw4096x16": Tiling(pointwise=PointwiseTiling(4096, 16)),
    "gen_pw1024x8": Tiling(pointwise=PointwiseTiling(1024, 8)),
    "gen_col64_e4096_w8": Tiling(columns=ColumnTiling(cblock=64, heavy_elems=4096)),
    "gen_col64_e2048_w4": Tiling(columns=ColumnTiling(cblock=64, heavy_warps=4)),
    "gen_col32_e4096_w8": Tiling(columns=ColumnTiling(heavy_elems=4096)),
    "gen_col16_e1024_w4": Tiling(columns=ColumnTiling(cblock=16, heavy_elems=1024, heavy_warps=4)),
    "gen_col128_e8192_w8": Tiling(columns=ColumnTiling(cblock=128, heavy_elems=8192)),
    "gen_col32_p4": Tiling(columns=ColumnTiling(programs_per_sm=4)),
}


class Block(nn.Module):
    def __init__(self, channels: int, residual: bool):
        super().__init__()
        self.bn = nn.BatchNorm2d(channels)
        self.residual = residual

    def forward(self, x, r):
        y = self.bn(x)
        return torch.relu(y + r if self.residual else y)


def _inputs(channels, side, batch, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    def make():
        t = torch.randn(batch, channels, side, side, generator=g).to(device)
        return t.to(memory_format=torch.channels_last)
    x, r, dy = make().requires_grad_(), make().requires_grad_(), make()
    return x, r, dy


def _provider(name: str, block: Block):
    """(callable, environment for its compile) of a provider."""
    torch._dynamo.reset()
    if name == "eager":
        return block, {}
    if name == "inductor":
        return torch.compile(block), {}
    if name == "kernelab":
        return torch.compile(block, backend="kernelab"), {"KERNELAB_BN_BACKWARD": "aten"}
    return torch.compile(block, backend="kernelab", options={"tiling": VARIANTS[name]}), \
        {"KERNELAB_BN_BACKWARD": "generated"}


def _step(fn, x, r, dy):
    x.grad = r.grad = None
    for p in fn.parameters() if isinstance(fn, nn.Module) else ():
        p.grad = None
    out = fn(x, r)
    out.backward(dy)
    return out


def _grads(fn, block, x, r, dy, env):
    held = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        block.bn.reset_running_stats()
        _step(fn, x, r, dy)  # the compile happens here, under env
    finally:
        for k, v in held.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    grads = [t.grad for t in (x, r)] + [p.grad for p in block.parameters()]
    return [g.detach().clone() for g in grads if g is not None]


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def _gpu_us(work, steps: int) -> tuple[float, int, dict]:
    """GPU microseconds a call of ``work`` (kernels' device time under the profiler), kernels a
    call, and microseconds a call by kernel name."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            work()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name = {e.key: e.device_time_total / steps for e in events}
    return sum(by_name.values()), sum(e.count for e in events) // steps, by_name


def _bwd_bytes(channels, side, batch, pattern) -> int:
    n = batch * channels * side * side
    # read dy, x and the ReLU's mask (1 byte); write dx (and dr, the residual's gradient)
    return n * (4 + 4 + 1 + 4 + (4 if pattern == "residual" else 0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--budget-s", type=float, default=300.0, help="start no case past this many seconds")
    ap.add_argument("--steps", type=int, default=5, help="steps profiled a provider")
    ap.add_argument("--smoke", action="store_true", help="CPU, interpreter: tiny shapes, gradients only")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    args = ap.parse_args()
    if args.smoke:
        if os.environ.get("TRITON_INTERPRET") != "1":
            ap.error("--smoke runs the kernels interpreted: set TRITON_INTERPRET=1 before Python starts")
        os.environ["KERNELAB_BN_FORWARD"] = "generated"  # on CPU tensors the default keeps ATen's
    elif not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (it times kernels); --smoke checks values on the CPU")
    args.out.mkdir(parents=True, exist_ok=True)
    import kernelab.compiler  # noqa: F401 - registers backend="kernelab"
    from compiler_suite import env_row

    device = torch.device("cpu" if args.smoke else "cuda")
    batch, shapes = (2, SMOKE_SHAPES) if args.smoke else (32, SHAPES)
    providers = ["eager", "inductor", "kernelab"] + list(args.variants)
    if args.smoke:
        providers.remove("inductor")
    torch._dynamo.config.cache_size_limit = 4096
    env, rows, start = env_row(device), [], time.time()
    for channels, side in shapes:
        for pattern in PATTERNS:
            if time.time() - start > args.budget_s:
                print(f"budget of {args.budget_s:.0f} s spent: stopped before {channels}x{side}x{side} {pattern}")
                break
            rows += _case(channels, side, batch, pattern, providers, device, args.steps, env)
    path = args.out / "bn_backward_parts.csv"
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    _summary(rows, args.smoke)
    print(f"wrote {path}")


def _case(channels, side, batch, pattern, providers, device, steps, env) -> list[dict]:
    block = Block(channels, pattern == "residual").to(device)
    x, r, dy = _inputs(channels, side, batch, device)
    ref = None
    rows = []
    for name in providers:
        fn, compile_env = _provider(name, block)
        grads = _grads(fn, block, x, r, dy, compile_env)
        ref = ref if ref is not None else grads
        err = max(_rel(g, e) for g, e in zip(grads, ref))
        row = {"shape": f"{batch}x{channels}x{side}x{side}", "pattern": pattern, "provider": name,
               "grad_err": f"{err:.2e}"}
        if device.type == "cuda":
            for _ in range(2):
                _step(fn, x, r, dy)
            step_us, step_kernels, by_name = _gpu_us(lambda: _step(fn, x, r, dy), steps)
            fwd_us, fwd_kernels, _ = _gpu_us(lambda: fn(x, r), steps)  # the training forward, its graph dropped
            bwd_us = step_us - fwd_us
            nbytes = _bwd_bytes(channels, side, batch, pattern)
            top = sorted(by_name.items(), key=lambda kv: -kv[1])[:4]
            row.update({"step_us": f"{step_us:.1f}", "fwd_us": f"{fwd_us:.1f}", "bwd_us": f"{bwd_us:.1f}",
                        "bwd_kernels": step_kernels - fwd_kernels, "bwd_tbps": f"{nbytes / bwd_us / 1e6:.2f}",
                        "top_kernels": "; ".join(f"{k[:60]} {v:.1f}" for k, v in top)})
        rows.append({**row, **env})
        print(" ".join(f"{k}={v}" for k, v in row.items() if k != "top_kernels"), flush=True)
    return rows


def _summary(rows, smoke: bool) -> None:
    print()
    if smoke:
        worst = max(float(r["grad_err"]) for r in rows)
        print(f"{len(rows)} rows; largest gradient difference from eager {worst:.1e}")
        return
    print(f"{'shape':18} {'pattern':9} {'eager':>7} {'inductor':>8} {'kl_aten':>7} {'kl_gen':>7} best generated")
    cases = dict.fromkeys((r["shape"], r["pattern"]) for r in rows)
    for shape, pattern in cases:
        mine = {r["provider"]: r for r in rows if (r["shape"], r["pattern"]) == (shape, pattern)}
        gens = [r for name, r in mine.items() if name.startswith("gen")]
        best = min(gens, key=lambda r: float(r["bwd_us"]))
        cell = lambda name: f"{float(mine[name]['bwd_us']):7.1f}" if name in mine else "      -"  # noqa: E731
        print(f"{shape:18} {pattern:9} {cell('eager')} {cell('inductor'):>8} {cell('kernelab')} {cell('gen')} "
              f"{best['provider']} {float(best['bwd_us']):.1f} us ({best['bwd_tbps']} TB/s)")


if __name__ == "__main__":
    main()
