#!/usr/bin/env python
"""Warps per row reduction in kernelab's generated kernels, measured on one GPU.

    python benchmarks/row_tune.py OUT_DIR

Layer norm, RMS norm and softmax (bfloat16) at a few row lengths, under launch heuristics that
differ in elements per thread (4, 8 or 16 per live value: warps = tile elements / (32 * that)),
and rows of 8192 also looped in 2048-wide chunks instead of held whole, next to Inductor; every
result is checked against eager. Time: triton.testing.do_bench (GPU time); bytes: x read once,
the output written once. Writes OUT_DIR/row_tune.csv (GPU, versions, date per row), prints a table.
"""
from __future__ import annotations

import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton.testing  # noqa: E402

import kernelab.compiler as klc  # noqa: E402
from compiler_suite import env_row  # noqa: E402
from kernelab.compiler import group_runner as runtime  # noqa: E402
from _script import gpu_out_dir  # noqa: E402


def layer_norm(x, w):
    return F.layer_norm(x, (x.shape[-1],), w)


def rms_norm(x, w):
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w


def softmax(x, w):
    return torch.softmax(x * w, -1)


CASES = [(layer_norm, (16384, 8192)), (rms_norm, (16384, 8192)), (softmax, (4096, 8192)),
         (layer_norm, (65536, 1024)), (layer_norm, (32768, 4096))]


def patched(per_thread: int, looped: bool):
    def reduction_launch(self, sizes, strides, rows, n_cols, ins):
        rblock = runtime.pow2(n_cols)
        persistent = rblock <= 8192 and not looped
        if not persistent:
            rblock = 2048
        budget = 2048 if persistent else rblock
        xblock = max(1, min(runtime.pow2(rows), budget // rblock))
        warps = max(1, min(16, xblock * rblock // (32 * per_thread)))
        int64 = rows * n_cols > runtime.INT32_MAX
        return runtime.Launch(len(sizes), persistent, {"XBLOCK": xblock, "RBLOCK": rblock}, warps, int64)
    return reduction_launch


def main():
    out = gpu_out_dir(__doc__)
    torch._dynamo.config.cache_size_limit = 1024
    original = runtime.GroupRunner.reduction_launch
    env = env_row(torch.device("cuda"))
    rows = []
    for fn, shape in CASES:
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(shape[-1], device="cuda", dtype=torch.bfloat16)
        ref = fn(x, w).float()
        nbytes = 2 * x.numel() * 2
        variants = [("inductor", None)] + [(f"per_thread_{p}", (p, False)) for p in (4, 8, 16)]
        if shape[-1] > 4096:
            variants += [(f"looped_per_thread_{p}", (p, True)) for p in (4, 8)]
        for name, cfg in variants:
            torch._dynamo.reset()
            if cfg is None:
                f = torch.compile(fn)
            else:
                runtime.GroupRunner.reduction_launch = patched(*cfg)
                f = klc.compile(fn)
            got = f(x, w).float()
            ok = bool(torch.allclose(got, ref, rtol=3e-2, atol=3e-2))
            us = triton.testing.do_bench(lambda: f(x, w), warmup=10, rep=50) * 1e3
            runtime.GroupRunner.reduction_launch = original
            rows.append({"program": fn.__name__, "shape": "x".join(map(str, shape)), "config": name, "us": us,
                         "tbps": nbytes / us / 1e6, "ok": ok, **env})
    with open(out / "row_tune.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    for r in rows:
        print(f"{r['program']:11} {r['shape']:11} {r['config']:22} {r['us']:8.1f} us {r['tbps']:5.2f} TB/s "
              f"{'ok' if r['ok'] else 'WRONG'}")


if __name__ == "__main__":
    main()
