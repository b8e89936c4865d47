#!/usr/bin/env python
"""layer_norm and rms_norm at the widths of real models, on a CUDA GPU: kernelab's launch settings
(``kernelab.ops.norms.NormConfig``) next to eager PyTorch, torch.compile and Liger, in one run.

    python3 benchmarks/norm_tune.py OUT_DIR [--budget-s 150] [--ops layer_norm rms_norm]
                                    [--widths 768 7168 ...] [--passes fwd+bwd fwd] [--workers 8] [--no-compile]
                                    [--settings "fwd one tile" ...]

1. the copy ceiling (4 GiB device-to-device, bytes read + written);
2. compile ahead: worker processes run every provider and setting of the cases once, untimed
   (Triton's and Inductor's on-disk caches), at most half the budget;
3. the cases, forward+backward of every width first (the weak spot), then forward: each provider
   and setting checked against float64 with poisoned outputs, weight and bias requiring grad as in
   nn.LayerNorm / nn.RMSNorm (bf16), then timed three ways on the same rotated input sets:
   ``do_bench`` (what a caller waits for; the grid's method, ``timing.time_ms``), the GPU time with
   the host taken out (calls replayed from a CUDA graph, ``timing.graph_ms``), and the host's own
   time per call (``timing.host_us``). Cases that would start after the budget are recorded as
   skipped (and said so).

TB/s count 2 passes over the [M, N] tensor forward and 5 forward+backward (``specs.bytes_moved``:
read x, write y; read dy and x, write dx); weights and statistics are left out.

Writes OUT_DIR/norm_tune.csv (one row per op / shape / pass / provider, with the GPU, versions and
date in every row; provider ``kernelab~<setting>`` for the settings) and prints a table last: per
shape the TB/s of the default, of the best setting and of each peer (do_bench), kernelab's
speed-up over the best peer, the GPU-only TB/s of the default and the best setting by graph time,
and the host's microseconds per call of kernelab and eager.

``--smoke``: the same flow on the CPU under TRITON_INTERPRET=1 (tiny rows, a stand-in timer, no
compile, graph or Liger): checks that the script and every setting run, measures nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OPS = ("layer_norm", "rms_norm")
PEERS = ("eager", "compile", "liger")


#: ``--settings``: the labels to time (besides "default"); None: all
ONLY = None


def settings(backward: bool) -> dict:
    """kernelab's launch settings timed per case, by label (those ``--settings`` names, or all):
    None is the public function (DEFAULT, through the registered op's eager path: the host time
    users get). Each targets one suspected cause of the slow backward at model widths (see
    benchmarks/NOTES_ops.md, "Model widths")."""
    every = _all_settings(backward)
    return {k: v for k, v in every.items() if ONLY is None or k == "default" or k in ONLY}


def _all_settings(backward: bool) -> dict:
    from kernelab.ops.norms import NormConfig

    if not backward:
        # the forward is one row per program at 2048-16384 columns, BLOCK_N the next power of two:
        # at 5120-6144 a program holds 10-12 KB of x in 16 warps; more rows or fewer warps a program
        # put more bytes in flight per SM
        # (DEFAULT: 32 a thread at 2049-8192 columns since results/norm_tune_fwd_h200.csv, else the rule)
        return {"default": None,
                # rows of non-power-of-two widths as one power-of-two tile (the default before
                # _common.SPLIT_ROWS: a head and a tail)
                "fwd one tile": NormConfig(fwd_split=False),
                "fwd 16 a thread": NormConfig(fwd_per_thread=16),
                "fwd 32 a thread": NormConfig(fwd_per_thread=32),
                "fwd 8 a thread": NormConfig(fwd_per_thread=8),
                "fwd 16384-element tiles": NormConfig(fwd_tile=16384),
                "fwd 16384 tiles, 32 a thread": NormConfig(fwd_tile=16384, fwd_per_thread=32),
                # 12288-16384 columns, where torch.compile led (layer_norm 0.76-0.83x): layer_norm's
                # 64-register cap lifted or raised; rows past 8192 split across a team of programs
                "fwd no register cap": NormConfig(fwd_reg_cap=0),
                "fwd 80 registers": NormConfig(fwd_reg_cap=80),
                "fwd teams past 8192": NormConfig(fwd_one_pass_max=8192),
                # torch.compile's kernel at 12288 is a looped reduction; ours (per-lane statistics,
                # one row a program, x re-read from L2), rows past 8192, by chunk and warps
                "fwd looped past 8192": NormConfig(fwd_one_pass_max=8192, fwd_teams=False),
                "fwd looped 1024 x 4w": NormConfig(fwd_one_pass_max=8192, fwd_teams=False, fwd_loop_chunk=1024,
                                                   fwd_loop_warps=4),
                "fwd looped 2048 x 4w": NormConfig(fwd_one_pass_max=8192, fwd_teams=False, fwd_loop_warps=4),
                "fwd looped 4096 x 8w": NormConfig(fwd_one_pass_max=8192, fwd_teams=False, fwd_loop_chunk=4096),
                "fwd looped 4096 x 16w": NormConfig(fwd_one_pass_max=8192, fwd_teams=False, fwd_loop_chunk=4096,
                                                    fwd_loop_warps=16),
                # (results/norm_tune_split_stop28_h200.csv: the three above lost to the one-pass kernel
                # at 12288-16384; Inductor's looped reductions run one pipeline stage)
                "fwd looped 2048 x 8w, 1 stage": NormConfig(fwd_one_pass_max=8192, fwd_teams=False,
                                                            fwd_loop_stages=1),
                "fwd looped 2048 x 16w, 1 stage": NormConfig(fwd_one_pass_max=8192, fwd_teams=False,
                                                             fwd_loop_warps=16, fwd_loop_stages=1),
                "fwd looped 4096 x 16w, 1 stage": NormConfig(fwd_one_pass_max=8192, fwd_teams=False,
                                                             fwd_loop_chunk=4096, fwd_loop_warps=16, fwd_loop_stages=1)}
    return {
        # DEFAULT: as many programs as the compiled kernel keeps resident, two row blocks in flight
        # per program (3 stages): the best setting at 7 of 8 shapes in results/norm_tune_graph_h200.csv
        "default": None,
        # the first default: 4 programs an SM whatever the kernel's occupancy (2-4 waves at 2560+)
        "4/SM in waves": NormConfig(bwd_programs_per_sm=4, bwd_stages=2, bwd_one_wave=False),
        # the stop-12 default: at most 4 an SM and at most one wave, one row block in flight
        "4/SM 2 stages": NormConfig(bwd_programs_per_sm=4, bwd_stages=2),
        # resident, one row block in flight
        "resident 2 stages": NormConfig(bwd_stages=2),
        # w loaded once per program, not per row (a third less L2 -> SM traffic)
        "resident w held": NormConfig(bwd_hold_w=True),
        # rows of non-power-of-two widths as one power-of-two tile (before _common.SPLIT_ROWS)
        "bwd one tile": NormConfig(bwd_split=False),
        # rows past 8192 in one kernel that re-reads them from L2 (x, dy from DRAM once), instead
        # of a stats kernel and column tiles (x, dy read twice): rows a block, chunk, warps
        # (at most 2 programs an SM by default: each holds an [N] float32 partial row of dw and db)
        "bwd long one kernel": NormConfig(bwd_long_one_kernel=True),
        "bwd long one kernel, 4 per SM": NormConfig(bwd_long_one_kernel=True, bwd_long_per_sm=4),
        "bwd long one kernel, 2 rows": NormConfig(bwd_long_one_kernel=True, bwd_long_rows=2),
        "bwd long one kernel, 4096 x 16w": NormConfig(bwd_long_one_kernel=True, bwd_long_chunk=4096,
                                                      bwd_long_warps=16),
        # "atomic" (dw, db by atomics finished by the last program) measured wrong on the H200 for
        # layer_norm (norm_tune_h200.log): refused on GPUs (norms._refuse_on_gpu), left out here
    }


def spec_with_settings(op: str, backward: bool):
    """The op's benchmark spec with a ``kernelab~<setting>`` provider per non-default setting."""
    from kernelab.bench import specs as S
    from kernelab.ops import norms

    spec = S.specs()[op]
    providers = dict(spec.providers)
    for label, config in settings(backward).items():
        if config is None:
            continue
        ops = norms.configured(config)
        if op == "layer_norm":
            providers[f"kernelab~{label}"] = lambda x, w, b, ops=ops: ops.layer_norm(x, x.shape[-1:], w, b)
        else:
            providers[f"kernelab~{label}"] = lambda x, w, ops=ops: ops.rms_norm(x, x.shape[-1:], w, 1e-6)
    return dataclasses.replace(spec, providers=providers)


def wanted(backward: bool, peers) -> tuple:
    """Providers in timing order: the default, the settings, then the peers."""
    return ("kernelab", *(f"kernelab~{label}" for label in settings(backward) if label != "default"), *peers)


def case_list(ops, widths, passes, dtype, shapes_of):
    """Forward+backward of every width first, then forward; both ops at a width side by side."""
    from kernelab.bench import runner

    out = []
    for pass_ in passes:
        for m, n in shapes_of(widths):
            for op in ops:
                out.append(runner.Case(op, (m, n), dtype, pass_ == "fwd+bwd"))
    return out


def model_shapes(widths):
    from kernelab.bench import specs as S

    return [(m, n) for m, n in S.MODEL_ROW_GRID if not widths or n in widths]


def smoke_shapes(widths):
    return [(5, n) for n in (widths or (768, 2880, 7168, 12288))]


def prewarm(part: int, parts: int, args) -> int:
    """Worker: run every provider of a share of the cases once (fills the compile caches)."""
    import torch

    from kernelab.bench import runner

    device = torch.device("cuda")
    env = runner.environment(device)
    cases = case_list(args.ops, args.widths, args.passes, torch.bfloat16, model_shapes)
    for case in cases[part::parts]:
        spec = spec_with_settings(case.op, case.backward)
        rows = runner.run_case(case, wanted(case.backward, args.peers), device, env, 0.0,
                               timer=lambda step, sets: (step(*sets[0]), 0.0)[1], spec=spec)
        for r in rows:
            if r.status != "ok":
                print(f"prewarm {case.label} {r.provider}: {r.status[:100]}", flush=True)
        torch.cuda.empty_cache()
    return 0


def start_workers(args) -> list:
    passthrough = ["--ops", *args.ops, "--passes", *args.passes, "--peers", *args.peers]
    if args.settings:
        passthrough += ["--settings", *args.settings]
    if args.widths:
        passthrough += ["--widths", *map(str, args.widths)]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TORCHINDUCTOR_COMPILE_THREADS="2")
    return [subprocess.Popen([sys.executable, __file__, "-", "--prewarm", str(i), str(args.workers), *passthrough],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for i in range(args.workers)]


def wait_workers(workers, deadline: float, console) -> None:
    for proc in workers:
        try:
            out, _ = proc.communicate(timeout=max(5.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            console.print(f"[yellow]compile-ahead worker {proc.pid} stopped at its time limit[/yellow]")
        for line in (out or "").splitlines()[-3:]:
            console.print(f"  worker: {line}", markup=False)


def run_cases(cases, args, device, copy: float, deadline: float, console, timer, extra_timers) -> list:
    import torch

    from kernelab.bench import runner

    env = runner.environment(device)
    rows = []
    for i, case in enumerate(cases):
        if time.monotonic() > deadline:
            skipped = cases[i:]
            console.print(f"[yellow]time budget spent: {len(skipped)} of {len(cases)} cases skipped "
                          f"(first: {skipped[0].label})[/yellow]")
            for c in skipped:
                rows.append(runner.Row(**env, op=c.op, shape=f"{c.shape[0]}x{c.shape[1]}", m=c.shape[0], n=c.shape[1],
                                       dtype=str(c.dtype).replace("torch.", ""), pass_=runner.PASSES[c.backward],
                                       provider="all", status="skipped (time budget)", ms=None, bytes=0, tbps=None,
                                       pct_copy=None, copy_tbps=copy))
            break
        spec = spec_with_settings(case.op, case.backward)
        got = runner.run_case(case, wanted(case.backward, args.peers), device, env, copy, timer=timer, spec=spec,
                              extra_timers=extra_timers)
        for r in got:
            if r.status != "ok":
                console.print(f"[yellow]{case.label} {r.provider}: {r.status}[/yellow]")
        best = max((r for r in got if r.tbps and r.status == "ok"), key=lambda r: r.tbps, default=None)
        console.print(f"{case.label}: best {best.provider if best else '-'} "
                      f"{best.tbps if best else 0:.2f} TB/s  [{time.monotonic() - T0:.0f}s]", markup=False)
        rows += got
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def tbps(row) -> str:
    if row is None:
        return "-"
    if row.tbps is None:
        return "fails" if row.status.startswith("error") else "skip"
    return f"{row.tbps:.2f}" + ("" if row.status == "ok" else "(!)")


def graph_tbps(row) -> float | None:
    return row.bytes / (row.graph_ms * 1e-3) / 1e12 if row is not None and row.graph_ms else None


def summary(rows, liger_installed: bool, console) -> None:
    """One line per (op, shape, pass): the default, the best setting and each peer by do_bench;
    the GPU-only figures by graph time; the host's time per call."""
    from rich.table import Table

    table = Table(title="norm_tune: TB/s (5-pass fwd+bwd, 2-pass fwd model); x peer = best peer ms / kernelab ms")
    for col in ("op", "M x N", "pass", "default", "best setting", "TB/s", "eager", "compile", "liger",
                "x peer (default)", "x peer (best)", "GPU-only: default", "best setting", "host us: kernelab", "eager"):
        table.add_column(col, justify="left" if col in ("op", "pass", "best setting") else "right")
    groups: dict = {}
    for r in rows:
        if r.provider != "all":
            groups.setdefault((r.op, r.shape, r.pass_), {})[r.provider] = r
    for (op, shape, pass_), by in groups.items():
        ok = {p: r for p, r in by.items() if r.status == "ok" and r.ms}
        ours = {p: r for p, r in ok.items() if p.startswith("kernelab")}
        best = min(ours.values(), key=lambda r: r.ms, default=None)
        peer = min((r for p, r in ok.items() if p in PEERS), key=lambda r: r.ms, default=None)
        gpu_best = max(ours.values(), key=lambda r: graph_tbps(r) or 0.0, default=None)
        default = by.get("kernelab")

        def ratio(r):
            return f"{peer.ms / r.ms:.2f}" if r is not None and peer is not None and r.ms else "-"

        def gpu(r):
            v = graph_tbps(r)
            return "-" if v is None else f"{v:.2f}"

        def host(r):
            return "-" if r is None or r.host_us is None else f"{r.host_us:.0f}"

        liger = tbps(by.get("liger")) if liger_installed else "not installed"
        label = best.provider.split("~", 1)[1] if best is not None and "~" in best.provider else "default"
        gpu_label = gpu_best.provider.split("~", 1)[1] if gpu_best is not None and "~" in gpu_best.provider else "default"
        table.add_row(op, shape, pass_, tbps(default), label, tbps(best), tbps(by.get("eager")), tbps(by.get("compile")),
                      liger, ratio(default if default in ok.values() else None), ratio(best), gpu(default),
                      f"{gpu_label} {gpu(gpu_best)}", host(default), host(by.get("eager")))
    console.print(table)


def smoke_timer(step, sets):
    step(*sets[0])
    return 1.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--budget-s", type=float, default=150.0, help="no new case starts after this many seconds")
    p.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    p.add_argument("--widths", nargs="+", type=int, default=None, help="only these widths of the model grid")
    p.add_argument("--passes", nargs="+", default=["fwd+bwd", "fwd"], choices=("fwd+bwd", "fwd"))
    p.add_argument("--peers", nargs="*", default=list(PEERS), choices=PEERS)
    p.add_argument("--settings", nargs="+", default=None, metavar="LABEL",
                   help="time only these settings (labels of settings()) besides the default")
    p.add_argument("--no-compile", action="store_true", help="leave torch.compile out (its compiles take most of a short budget)")
    p.add_argument("--workers", type=int, default=8, help="compile-ahead worker processes (0: none)")
    p.add_argument("--no-graph", action="store_true", help="skip the CUDA-graph (GPU-only) timing")
    p.add_argument("--smoke", action="store_true", help="CPU, interpreter, tiny rows, no timing: does it run")
    p.add_argument("--prewarm", nargs=2, type=int, metavar=("PART", "PARTS"), help=argparse.SUPPRESS)
    args = p.parse_args()
    global ONLY
    if args.settings:
        labels = set(_all_settings(False)) | set(_all_settings(True))
        if unknown := [x for x in args.settings if x not in labels]:
            p.error(f"unknown settings {unknown}; known: {sorted(labels)}")
        ONLY = set(args.settings)
    if args.no_compile:
        args.peers = [x for x in args.peers if x != "compile"]
    if args.prewarm:
        return prewarm(*args.prewarm, args)
    if args.smoke:  # before Triton is imported
        os.environ["TRITON_INTERPRET"] = "1"

    import torch
    from rich.console import Console

    from kernelab.bench import report, runner, timing

    console = Console(width=220)
    if args.smoke:
        device, copy = torch.device("cpu"), 0.0
        args.peers = [x for x in args.peers if x == "eager"]
        timer, extra, shapes_of, dtype = smoke_timer, {}, smoke_shapes, torch.float32
    else:
        if not torch.cuda.is_available():
            console.print("[red]no CUDA device (use --smoke on a CPU)[/red]")
            return 2
        device, dtype, shapes_of, timer = torch.device("cuda"), torch.bfloat16, model_shapes, timing.time_ms
        extra = {"host_us": timing.host_us}
        if not args.no_graph:
            extra = {"graph_ms": timing.graph_ms, **extra}
    env = runner.environment(device)
    console.print(f"[bold]{env}[/bold]", markup=False)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.smoke:
        copy = timing.copy_tbps(device)
        console.print(f"copy ceiling: {copy:.3f} TB/s  [{time.monotonic() - T0:.0f}s]")
        if args.workers > 0:
            wait_workers(start_workers(args), T0 + 0.5 * args.budget_s, console)
            console.print(f"compile-ahead done  [{time.monotonic() - T0:.0f}s]")
    cases = case_list(args.ops, args.widths, args.passes, dtype, shapes_of)
    rows = run_cases(cases, args, device, copy, T0 + args.budget_s, console, timer, extra)
    path = report.append_csv(rows, args.out, name="norm_tune.csv")
    console.print(f"wrote {path}  total {time.monotonic() - T0:.0f}s")
    summary(rows, env["liger"] != "absent", console)
    return 0


T0 = time.monotonic()

if __name__ == "__main__":
    raise SystemExit(main())
