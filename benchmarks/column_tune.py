#!/usr/bin/env python
"""Launch parameters of kernelab's column-reduction kernel, measured on one GPU.

    python benchmarks/column_tune.py OUT_DIR

For a few (rows, columns) shapes of ``(x * y).sum(0)`` in bfloat16 (y one value per column), this
times the generated kernel (triton.testing.do_bench, GPU time) under every combination of column
block, row tile, warps and minimum tiles per split, next to Inductor's two-kernel split reduction,
and checks every result against torch. Bytes moved: x read once (the per-column y and the outputs
are negligible). Writes OUT_DIR/column_tune.csv and prints the best configuration per shape and
the one that is best overall (geometric mean of time relative to each shape's best).

``COLUMN_TUNE_SHAPES=8192x768,8192x3072`` times other shapes, ``COLUMN_TUNE_CBLOCKS=32,256``
other column blocks. ``COLUMN_TUNE_TIMER=cudagraph`` times
each variant replayed from a CUDA graph (``triton.testing.do_bench_cudagraph``): the GPU's time
alone, where do_bench's back-to-back calls of a ~10 us kernel measure the host's call cost instead. ``COLUMN_TUNE_GRID=programs`` tunes the programs per SM instead (2, 4, 8; the default grid keeps 2)
over a smaller grid of the other axes, written to OUT_DIR/column_tune_programs.csv.
"""
from __future__ import annotations

import csv
import itertools
import math
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton.testing  # noqa: E402

import kernelab.compiler as klc  # noqa: E402
from kernelab.compiler.tiling import ColumnTiling, Tiling  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from compiler_suite import env_row  # noqa: E402
from _script import gpu_out_dir  # noqa: E402

#: ``COLUMN_TUNE_SHAPES=8192x768,8192x3072`` replaces them (a model's bias gradients, say)
SHAPES = [tuple(int(v) for v in s.split("x")) for s in os.environ["COLUMN_TUNE_SHAPES"].split(",")] \
    if os.environ.get("COLUMN_TUNE_SHAPES") else [(4096, 1024), (16384, 4096), (1 << 20, 64), (2048, 16384)]
GRID = os.environ.get("COLUMN_TUNE_GRID", "default")
TIMER = os.environ.get("COLUMN_TUNE_TIMER", "events")
CBLOCKS, XBLOCK_ELEMS, WARPS, MIN_TILES = (32, 64, 128), (2048, 4096, 8192), (4, 8), (2, 8)
PER_SM = (2,)
if GRID not in ("default", "programs"):
    sys.exit(f"column_tune.py: COLUMN_TUNE_GRID must be 'default' or 'programs', got {GRID!r}")
if TIMER not in ("events", "cudagraph"):
    sys.exit(f"column_tune.py: COLUMN_TUNE_TIMER must be 'events' or 'cudagraph', got {TIMER!r}")
if GRID == "programs":
    CBLOCKS, XBLOCK_ELEMS, WARPS, MIN_TILES, PER_SM = (32, 64), (4096, 8192), (4, 8), (2,), (2, 4, 8)
#: ``COLUMN_TUNE_CBLOCKS=32,64,128,256`` replaces the column blocks (wide sums: a vocabulary's bias)
if os.environ.get("COLUMN_TUNE_CBLOCKS"):
    try:
        CBLOCKS = tuple(int(v) for v in os.environ["COLUMN_TUNE_CBLOCKS"].split(","))
    except ValueError:
        sys.exit(f"column_tune.py: COLUMN_TUNE_CBLOCKS must be comma-separated integers, got "
                 f"{os.environ['COLUMN_TUNE_CBLOCKS']!r}")


def bench_us(f) -> float:
    """Microseconds per call of ``f`` (see TIMER)."""
    if TIMER == "cudagraph":
        return triton.testing.do_bench_cudagraph(f, rep=50) * 1e3
    return triton.testing.do_bench(f, warmup=10, rep=50) * 1e3


def fn(x, y):
    return (x * y).sum(0)


def tiling(cblock, elems, warps, min_tiles, per_sm=2) -> Tiling:
    """The grid point as the compiler's launch data (``kernelab/compiler/tiling.py``)."""
    return Tiling(columns=ColumnTiling.uniform(cblock, elems, warps, min_tiles, per_sm))


def main():
    out = gpu_out_dir(__doc__)
    torch._dynamo.config.cache_size_limit = 1024
    rows = []
    for shape in SHAPES:
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        y = torch.randn(shape[-1], device="cuda", dtype=torch.bfloat16)
        ref = (x.float() * y.float()).sum(0)
        nbytes = x.numel() * 2
        torch._dynamo.reset()
        ind = torch.compile(fn)
        ind(x, y)
        ind_us = bench_us(lambda: ind(x, y))
        rows.append({"shape": "x".join(map(str, shape)), "config": "inductor", "us": ind_us,
                     "tbps": nbytes / ind_us / 1e6, "ok": True})
        # ATen's column sum of x alone (what a bias gradient left to ATen runs: one kernel)
        aten_us = bench_us(lambda: x.sum(0))
        rows.append({"shape": "x".join(map(str, shape)), "config": "aten_sum", "us": aten_us,
                     "tbps": nbytes / aten_us / 1e6, "ok": True})
        for cb, el, w, mt, ps in itertools.product(CBLOCKS, XBLOCK_ELEMS, WARPS, MIN_TILES, PER_SM):
            torch._dynamo.reset()
            f = klc.compile(fn, options={"tiling": tiling(cb, el, w, mt, ps)})
            got = f(x, y)
            ok = bool(torch.allclose(got.float(), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item()))
            us = bench_us(lambda: f(x, y))
            rows.append({"shape": "x".join(map(str, shape)), "config": f"c{cb}_e{el}_w{w}_t{mt}" + (f"_p{ps}" if len(PER_SM) > 1 else ""), "us": us,
                         "tbps": nbytes / us / 1e6, "ok": ok})
    env = env_row(torch.device("cuda"))
    name = ("column_tune" + ("" if GRID == "default" else f"_{GRID}") + ("_cudagraph" if TIMER == "cudagraph" else "")
            + ".csv")
    with open(out / name, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]) + list(env))
        w.writeheader()
        w.writerows({**r, **env} for r in rows)
    peers = ("inductor", "aten_sum")
    configs = sorted({r["config"] for r in rows if r["config"] not in peers})
    best = {}
    for r in rows:
        if r["config"] not in peers:
            best[r["shape"]] = min(best.get(r["shape"], math.inf), r["us"])
    print(f"{'shape':14} {'inductor_us':>11} {'aten_sum_us':>11} {'best_us':>8} {'TB/s':>6}  best config")
    for shape in dict.fromkeys(r["shape"] for r in rows):
        mine = [r for r in rows if r["shape"] == shape and r["config"] not in peers]
        top = min(mine, key=lambda r: r["us"])
        ind = next(r for r in rows if r["shape"] == shape and r["config"] == "inductor")
        aten = next(r for r in rows if r["shape"] == shape and r["config"] == "aten_sum")
        print(f"{shape:14} {ind['us']:11.1f} {aten['us']:11.1f} {top['us']:8.1f} {top['tbps']:6.2f}  {top['config']}")
    score = {c: math.exp(sum(math.log(r["us"] / best[r["shape"]]) for r in rows if r["config"] == c) / len(SHAPES))
             for c in configs}
    for c in sorted(configs, key=score.get)[:5]:
        print(f"overall {c}: {score[c]:.3f}x the per-shape best (geomean)")
    print("all correct:", all(r["ok"] for r in rows))


if __name__ == "__main__":
    main()
