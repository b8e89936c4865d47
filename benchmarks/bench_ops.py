#!/usr/bin/env python
"""Every kernelab.ops benchmark in one go, on a CUDA GPU: checks first, then timings.

    python benchmarks/bench_ops.py OUT_DIR [--budget-s 370] [--workers 6] [--ops softmax ...] [--grid pow2|model|all]

1. the copy ceiling: a 4 GiB device-to-device copy, bytes read + written (before anything else
   runs on the GPU);
2. compile ahead: worker processes run every provider of the grid once, untimed, filling
   Triton's and Inductor's caches, while this process runs
3. correctness checks the grid does not cover: odd and strided shapes in bfloat16 and float32,
   inputs past 2^31 elements (kernelab only, float64 reference, poisoned outputs);
4. the grid (kernelab.bench.specs): every op, forward and forward+backward, kernelab / eager /
   torch.compile / Liger, each checked against float64 then timed; cases that would start after
   the budget are recorded as skipped. ``--grid model``: the widths and vocabularies of real
   models (``specs.MODEL_ROW_GRID``, ``MODEL_CE_GRID``) instead of the powers of two; ``all``: both.

Writes under OUT_DIR: ops_bench.csv (one row per op/shape/pass/provider, GPU, versions and date in
every row), ops_checks.csv, ops_<op>_<dtype>.png, and prints the table last.

    python benchmarks/bench_ops.py OUT_DIR --tune-s 120 [--timer kernels]

runs only the launch-setting tune (``tune_variants``, kernelab alone, each setting next to the
default in the same run) and writes ops_tune.csv; ``--timer kernels`` times the kernels' GPU time
instead of do_bench. ``python -m kernelab.bench.report ops_bench.csv DIR`` redraws the plots.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ORDER = ["softmax", "layer_norm", "rms_norm", "cross_entropy", "log_softmax", "silu_mul", "gelu_mul", "bias_gelu", "add_relu"]


#: kernelab-only variants of launch settings (op, shape, fwd+bwd?, label, {"module.ATTR": value}),
#: timed like the grid (same checks, same timer) and written as provider "kernelab~<label>".
#: (The norms' launch settings are data, ``norms.NormConfig``: benchmarks/norm_tune.py times them.)
VARIANTS = [
    ("cross_entropy", (8192, 32000), True, "bwd chunk 2048", {"cross_entropy.BWD_BLOCK_C": 2048}),
]


def tune_variants() -> list:
    """``--tune-s``: launch settings around the shapes where the grid missed a target, each group
    preceded by the default ("default", no change) in the same run. Rounds 1-3 (results/
    ops_tune{1,2,3}_h200.csv, do_bench) set the one-pass forward rule (``_common.row_tile``); their
    forward+backward rows swung with the host's speed (the same setting measured 2.7 and 3.9 TB/s).
    Round 4 (``--timer kernels``: GPU time only) took the backward and cross-entropy settings.
    Round 5 (ops_tune5_h200.csv): layer_norm's forward at 16384 columns, where a register cap won
    (now the default, ``norms.LONG_ROW_MAXNREG``). Rounds 6 and 7 (``--timer kernels``,
    ops_tune6_h200.csv / ops_tune7_h200.csv): the team kernels of rows over 16384 columns
    (``kernelab/ops/teams.py``) against the two-pass kernels they replace, and their chunk / warps /
    programs-per-SM settings; round 6 without, round 7 with the next row loaded during the wait.
    Round 8 (``--timer kernels``, ops_tune8_h200.csv): cross-entropy's forward split
    into chunks reduced by separate programs against one looping
    program per row; the target's loads moved ahead of the row's in both. And the erf GELU of 16-bit
    inputs through ``pointwise._phi`` against libdevice's erff. Round 9 (``--timer kernels``,
    ops_tune9_h200.csv): log_softmax's backward by teams; the norm forward's teams with 4096
    columns a member, with and without prefetch; layer_norm at 16384 columns by teams. Round 10
    (``--timer kernels``, ops_tune10_h200.csv): the norm backward by teams at 16384 columns (that
    kernel, and cross-entropy's split forward of round 8, were removed: slower). This list: softmax and
    log_softmax at non-power-of-two widths with rows split into a head and a tail (the default) and
    as one tile; then every team kernel against the two-pass kernels it replaced."""
    out = []

    def group(op, shape, backward, variants):
        out.append((op, shape, backward, "default", {}))
        out.extend((op, shape, backward, label, change) for label, change in variants)

    # softmax rows of non-power-of-two widths as one power-of-two tile, against the default's head
    # and tail (``_common.SPLIT_ROWS``); the norms' are in benchmarks/norm_tune.py ("one tile")
    # (results/ops_tune_split_stop28_h200.csv: the split won 12 of 20 cases, lost the forward at
    # 5120 by 4-11 %, where its head of 4096 runs 8 warps: 32 elements a thread, 4 warps, next)
    one_tile = ("one tile (rows not split)", {"_common.SPLIT_ROWS": False})
    wide = ("split, 32 a thread", {"_common.ROW_PER_THREAD": 32})
    for op in ("softmax", "log_softmax"):
        group(op, (16384, 5120), False, [one_tile, wide])
    for shape in ((16384, 5120), (32768, 2880), (4096, 12288), (8192, 6144), (16384, 2560)):
        for op in ("softmax", "log_softmax"):
            for backward in (False, True):
                group(op, shape, backward, [one_tile])
    two_pass = ("two-pass (no teams)", {"teams.ENABLED": False})
    for shape in ((4096, 65536), (2048, 262144)):
        for op in ("softmax", "log_softmax", "layer_norm", "rms_norm"):
            group(op, shape, False, [two_pass])
        group("softmax", shape, True, [two_pass])
    return out


def variant_sweep(device, copy: float, deadline: float, console, variants=None, timer=None) -> list:
    """Time each variant (default: VARIANTS) with the runner (kernelab only), restoring every
    setting after."""
    import importlib

    import torch

    from kernelab.bench import runner

    env = runner.environment(device)
    rows = []
    for op, shape, backward, label, change in (VARIANTS if variants is None else variants):
        if time.monotonic() > deadline:
            break
        saved = []
        try:
            for path, value in change.items():
                module_name, attr = path.rsplit(".", 1)
                module = importlib.import_module(f"kernelab.ops.{module_name}")
                saved.append((module, attr, getattr(module, attr)))
                setattr(module, attr, value)
            got = runner.run_case(runner.Case(op, shape, torch.bfloat16, backward), ("kernelab",), device, env, copy,
                                  **({"timer": timer} if timer else {}))
            for r in got:
                r.provider = f"kernelab~{label}"
                speed = "-" if r.tbps is None else f"{r.tbps:.2f} TB/s"
                console.print(f"variant {op} {r.shape} {r.pass_} ({label}): {r.status}, {speed}", markup=False)
            rows += got
        finally:
            for module, attr, value in reversed(saved):
                setattr(module, attr, value)
            torch.cuda.empty_cache()
    return rows


def tune_table(rows, console) -> None:
    """Each variant's TB/s next to its group's default (measured just before it)."""
    from rich.table import Table

    table = Table(title="launch-setting tune (kernelab only; ratio = default ms / variant ms)")
    for col in ("op", "shape", "pass", "variant", "status", "TB/s", "x default"):
        table.add_column(col)
    default = {}
    for r in rows:
        key = (r.op, r.shape, r.pass_)
        label = r.provider.split("~", 1)[1]
        if label == "default":
            default[key] = r.ms
        ratio = f"{default[key] / r.ms:.2f}" if r.ms and default.get(key) else "-"
        tbps = f"{r.tbps:.2f}" if r.tbps is not None else "-"
        table.add_row(r.op, r.shape, r.pass_, label, r.status[:20], tbps, ratio)
    console.print(table)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--budget-s", type=float, default=370.0, help="no new case starts after this many seconds")
    p.add_argument("--workers", type=int, default=6, help="compile-ahead worker processes (0: none)")
    p.add_argument("--ops", nargs="+", default=ORDER)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--grid", choices=("pow2", "model", "all"), default="pow2",
                   help="the shapes: powers of two, the widths of real models, or both (kernelab.bench.specs)")
    p.add_argument("--skip-checks", action="store_true")
    p.add_argument("--graph", action="store_true",
                   help="also time each case's GPU work alone (one CUDA graph of many calls: graph_ms) and the host's cost per call (host_us)")
    p.add_argument("--variants-s", type=float, default=0.0, help="seconds for kernelab-only launch-setting variants, run last")
    p.add_argument("--timer", choices=("do_bench", "kernels"), default="do_bench",
                   help="--tune-s only: do_bench (what a caller waits, host included) or the kernels' summed GPU time")
    p.add_argument("--tune-s", type=float, default=0.0,
                   help="run only the launch-setting tune (tune_variants) for this many seconds, write ops_tune.csv")
    args = p.parse_args()
    t0 = time.monotonic()

    import torch
    from rich.console import Console

    from kernelab.bench import checks, report, runner, timing

    console = Console(width=160)
    if not torch.cuda.is_available():
        console.print("[red]no CUDA device[/red]")
        return 2
    device = torch.device("cuda")
    dtype = getattr(torch, args.dtype)
    env = runner.environment(device)
    console.print(f"[bold]{env}[/bold]")
    args.out.mkdir(parents=True, exist_ok=True)

    copy = timing.copy_tbps(device)
    console.print(f"copy ceiling: {copy:.3f} TB/s (4 GiB device-to-device, read + written)  [{time.monotonic() - t0:.0f}s]")
    if args.tune_s > 0:
        timer = timing.kernel_time_ms if args.timer == "kernels" else timing.time_ms
        rows = variant_sweep(device, copy, time.monotonic() + args.tune_s, console, tune_variants(), timer)
        report.append_csv(rows, args.out, name="ops_tune.csv")
        tune_table(rows, console)
        return 0

    workers = []
    for i in range(args.workers):
        cmd = [sys.executable, "-m", "kernelab.bench.prewarm", str(i), str(args.workers), args.dtype, "--grid", args.grid, *args.ops]
        wenv = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), TORCHINDUCTOR_COMPILE_THREADS="2")
        workers.append(subprocess.Popen(cmd, cwd=ROOT, env=wenv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))

    if not args.skip_checks:
        results = []
        for name, fn in (("odd shapes", checks.odd_shapes), ("past 2^31 elements", checks.big_index)):
            try:
                got = fn(device)
            except Exception as e:  # noqa: BLE001 - report, keep benchmarking
                got = [{"check": name, "op": "-", "dtype": "-", "shape": "-", "strided": False, "rel_err": float("nan"), "ok": False, "note": f"{type(e).__name__}: {e}"[:300]}]
            results += got
            bad = [r for r in got if not r["ok"]]
            console.print(f"checks, {name}: {len(got) - len(bad)}/{len(got)} ok  [{time.monotonic() - t0:.0f}s]")
            for r in bad:
                console.print(f"[red]  FAILED {r}[/red]")
        with (args.out / "ops_checks.csv").open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(results[0]) + list(env))
            w.writeheader()
            for r in results:
                w.writerow({**r, **env})
        torch.cuda.empty_cache()

    for proc in workers:  # compile-ahead must be over before anything is timed
        try:
            out, _ = proc.communicate(timeout=max(5.0, t0 + 0.55 * args.budget_s - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            console.print(f"[yellow]compile-ahead worker {proc.pid} stopped at its time limit[/yellow]")
        for line in (out or "").splitlines()[-5:]:
            console.print(f"  worker: {line}")
    console.print(f"compile-ahead done  [{time.monotonic() - t0:.0f}s]")

    cases = runner.cases(args.ops, dtype, grid=args.grid)
    extra = {"graph_ms": timing.graph_ms, "host_us": timing.host_us} if args.graph else None
    rows = runner.run(cases, device=device, copy=copy, deadline=t0 + args.budget_s, console=console, extra_timers=extra)
    report.append_csv(rows, args.out)
    report.plot(rows, args.out)
    if args.variants_s > 0:
        variants = variant_sweep(device, copy, time.monotonic() + args.variants_s, console)
        report.append_csv(variants, args.out, name="ops_variants.csv")
    console.print(f"total {time.monotonic() - t0:.0f}s")
    report.table(rows, console)
    report.wins_table(rows, console)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
