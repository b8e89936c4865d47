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
from kernelab.compiler.tiling import RowTiling, Tiling  # noqa: E402
from _script import gpu_out_dir  # noqa: E402


def layer_norm(x, w):
    return F.layer_norm(x, (x.shape[-1],), w)


def rms_norm(x, w):
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w


def softmax(x, w):
    return torch.softmax(x * w, -1)


CASES = [(layer_norm, (16384, 8192)), (rms_norm, (16384, 8192)), (softmax, (4096, 8192)),
         (layer_norm, (65536, 1024)), (layer_norm, (32768, 4096))]


def tiling(per_thread: int, looped: bool) -> Tiling:
    """The variant as the compiler's launch data (``kernelab/compiler/tiling.py``): ``per_thread``
    elements a thread, every row walked in chunks if ``looped``; rows of 8192 with a variance kept
    in registers unless looped (the variants compare the two)."""
    return Tiling(rows=RowTiling(per_thread=per_thread, looped_per_thread=per_thread, looped=looped,
                                 var_persistent_max=8192))


def main():
    out = gpu_out_dir(__doc__)
    torch._dynamo.config.cache_size_limit = 1024
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
                f = klc.compile(fn, options={"tiling": tiling(*cfg)})
            got = f(x, w).float()
            ok = bool(torch.allclose(got, ref, rtol=3e-2, atol=3e-2))
            us = triton.testing.do_bench(lambda: f(x, w), warmup=10, rep=50) * 1e3
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
