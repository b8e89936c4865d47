#!/usr/bin/env python
"""What cuBLAS does with a product whose rows are not 16-byte aligned (GPT-2's LM head), and
which padding makes it take its aligned kernels: one run, every variant side by side.

    python3 benchmarks/mm_alignment.py OUT_DIR

bf16, tokens x hidden -> vocab, (M, K) @ (K, N) with N = 50257 (odd: rows of 100514 bytes) and
the backward's two products. Variants per product:

* ``plain``: contiguous operands and output, as eager runs it;
* ``out_ld``: output written into rows padded to 16 bytes (``out=`` a padded buffer; N unchanged);
* ``pad_n``: N itself padded (weight copied into a zero-padded (Np, K) buffer first, the copy
  timed with it; the product sliced back), what Inductor's ``pad_mm`` does;
* backward ``dlogits @ W`` (the reduced dim is N) and ``dlogits^T @ h``: with dlogits in padded
  rows (``ld``), or padded with zero columns and W with zero rows (``pad_k``).

Every variant is checked against the plain product first. Prints a table, writes mm_alignment.csv
(GPU, torch, triton, date in every row).
"""
from __future__ import annotations

import csv
import datetime
import sys

import torch

sys.path.insert(0, ".")
from benchmarks._script import gpu_out_dir  # noqa: E402
from kernelab.bench.timing import time_ms  # noqa: E402


def _pad(n: int, per: int = 8) -> int:
    return -(-n // per) * per


def _cases(M, K, N):
    dev, dt = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    h = torch.randn(M, K, device=dev, dtype=dt, generator=g)
    w = torch.randn(N, K, device=dev, dtype=dt, generator=g) * 0.05
    Np = _pad(N)
    out_pad = torch.empty(M, Np, device=dev, dtype=dt)
    dl = torch.randn(M, N, device=dev, dtype=dt, generator=g)
    dl_pad = torch.zeros(M, Np, device=dev, dtype=dt)
    dl_pad[:, :N] = dl
    dl_ld = dl_pad[:, :N]
    w_pad = torch.zeros(Np, K, device=dev, dtype=dt)

    def pad_n():
        w_pad[:N].copy_(w)
        return torch.mm(h, w_pad.t())[:, :N]

    def pad_n_nocopy():
        return torch.mm(h, w_pad.t())[:, :N]

    w_pad[:N].copy_(w)
    fwd = {
        "plain": lambda: torch.mm(h, w.t()),
        "out_ld": lambda: torch.mm(h, w.t(), out=out_pad[:, :N]),
        "pad_n (+ weight copy)": pad_n,
        "pad_n (weight padded already)": pad_n_nocopy,
    }
    dgrad = {  # dlogits @ W -> (M, K)
        "plain": lambda: torch.mm(dl, w),
        "ld": lambda: torch.mm(dl_ld, w),
        "pad_k": lambda: torch.mm(dl_pad, w_pad),
    }
    wgrad = {  # dlogits^T @ h -> (N, K)
        "plain": lambda: torch.mm(dl.t(), h),
        "ld": lambda: torch.mm(dl_ld.t(), h),
        "pad_k (rows of dW padded)": lambda: torch.mm(dl_pad.t(), h)[:N],
    }
    return {"fwd h@W^T": fwd, "dgrad dl@W": dgrad, "wgrad dl^T@h": wgrad}


def main() -> None:
    out = gpu_out_dir(__doc__)
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                triton=__import__("triton").__version__, date=datetime.date.today().isoformat())
    rows = []
    for M, K, N in [(8192, 768, 50257), (4096, 2048, 50257), (8192, 768, 50304)]:
        for product, variants in _cases(M, K, N).items():
            ref = variants["plain"]().float()
            for name, fn in variants.items():
                err = ((fn().float() - ref).norm() / ref.norm()).item()
                ms = time_ms(lambda *_: fn(), [()])
                flops = 2.0 * M * K * N
                rows.append(dict(meta, shape=f"{M}x{K}x{N}", product=product, variant=name, ms=round(ms, 4),
                                 tflops=round(flops / ms / 1e9, 1), rel_err=f"{err:.1e}"))
                print(f"{M}x{K}x{N:<6} {product:<13} {name:<30} {ms:8.3f} ms {flops / ms / 1e9:7.1f} TFLOP/s err {err:.1e}",
                      flush=True)
    with open(out / "mm_alignment.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
