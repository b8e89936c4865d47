#!/usr/bin/env python
"""Where a cold compile's time goes, kernelab against Inductor, one program at a time.

    python benchmarks/compile_breakdown.py OUT_DIR [--only NAME ...]

Run it in a fresh process with empty caches (TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR and
KERNELAB_CACHE pointing at empty directories): every program is a first compile. For each program
of a few from the compiler suite, kernelab's first call is split by timers wrapped around its
stages: dynamo and aot_autograd's tracing (the rest), kernelab's partition and codegen
(``compile_graph``), Triton's compile (``triton.compile``), Triton's per-signature C launcher
(``CompiledKernel._init_handles``: Triton <= 3.6 builds it with gcc), loading the binary into
torch's precompiled launcher instead (``StaticLauncher.bind``) and the call itself.
Inductor's first call is timed whole. Writes OUT_DIR/compile_breakdown.csv and prints a table.
"""
from __future__ import annotations

import argparse
import csv
import functools
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

import compiler_suite as cs  # noqa: E402

SPENT: dict = defaultdict(float)


def timed(owner, name: str, label: str) -> None:
    """Wrap ``owner.name`` so that its wall time adds up under ``label`` (outermost call only)."""
    original = getattr(owner, name)
    depth = [0]

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if depth[0]:
            return original(*args, **kwargs)
        depth[0] += 1
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            SPENT[label] += time.perf_counter() - t0
            depth[0] -= 1

    setattr(owner, name, wrapper)


def instrument() -> None:
    import triton.compiler.compiler as tcc
    from triton.runtime.jit import JITFunction

    from kernelab import launch
    from kernelab.compiler import backend

    timed(backend, "compile_graph", "kernelab_partition_codegen")
    timed(JITFunction, "_do_compile", "triton_compile")
    timed(tcc.CompiledKernel, "_init_handles", "triton_launcher")
    timed(launch.StaticLauncher, "bind", "static_launcher_load")


CASES = {
    "add_relu": (cs.add_relu, lambda: [torch.randn(1_000_003, device="cuda", dtype=torch.bfloat16)] * 2),
    "softmax": (cs.softmax, lambda: [torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)]),
    "layer_norm": (cs.layer_norm, lambda: [torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16),
                                           torch.randn(1024, device="cuda", dtype=torch.bfloat16),
                                           torch.randn(1024, device="cuda", dtype=torch.bfloat16)]),
    "gelu_tanh_affine": (cs.gelu_tanh_affine, lambda: [torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16),
                                                       torch.randn(1024, device="cuda", dtype=torch.bfloat16),
                                                       torch.randn(1024, device="cuda", dtype=torch.bfloat16)]),
}


def first_call(fn, args) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn(*args)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--only", nargs="*", choices=sorted(CASES), metavar="NAME",
                    help=f"programs to time (default all: {', '.join(CASES)})")
    opts = ap.parse_args()
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (it times first calls of compiled GPU programs)")
    opts.out.mkdir(parents=True, exist_ok=True)
    import kernelab.compiler as klc

    instrument()
    # once-per-process costs (CUDA context, Triton's key of its own install, imports) outside every
    # timing: both compilers compile an unrelated program first
    warm_args = [torch.randn(7, device="cuda")]
    for compiled in (klc.compile(lambda x: x * 2 + 1), torch.compile(lambda x: x * 3 - 1)):
        first_call(compiled, warm_args)
    rows = []
    for name, (fn, make) in CASES.items():
        if opts.only and name not in opts.only:
            continue
        args = make()
        row = {"program": name}
        for mode in ("kernelab", "inductor"):
            torch._dynamo.reset()
            SPENT.clear()
            compiled = klc.compile(fn) if mode == "kernelab" else torch.compile(fn)
            total = first_call(compiled, args)
            warm = first_call(compiled, args)
            row[f"{mode}_first_s"] = total
            row[f"{mode}_warm_s"] = warm
            if mode == "kernelab":
                parts = dict(SPENT)
                for key, value in parts.items():
                    row[key + "_s"] = value
                row["dynamo_aot_and_rest_s"] = total - sum(parts.values())
        rows.append(row)
        print(", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    env = cs.env_row(torch.device("cuda"))
    fields = sorted({k for r in rows for k in r}, key=lambda k: (k != "program", k))
    with open(opts.out / "compile_breakdown.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields + list(env))
        w.writeheader()
        w.writerows({**r, **env} for r in rows)


if __name__ == "__main__":
    main()
