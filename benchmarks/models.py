#!/usr/bin/env python
"""The model zoo (kernelab.zoo) under eager, Inductor and kernelab, in one run, on one GPU.

    python benchmarks/models.py OUT_DIR [--size bench|tiny] [--budget-s 540] [--only gpt2,vit]
                                        [--modes eager,inductor,kernelab] [--steps train,infer]

For every zoo model, every mode (eager; inductor = ``torch.compile(fn)``; kernelab =
``torch.compile(fn, backend="kernelab")``; on request inductor-cg and kernelab-cg, the same with
``mode="reduce-overhead"``: CUDA graphs, each step begun with ``torch.compiler.cudagraph_mark_step_begin()``;
their ``kernels`` column counts what the profiler sees of a replay) and every step kind (train: set grads to None, forward,
loss, backward; infer: ``torch.no_grad()`` forward of the model in eval mode), one row with:

* ``cold_s``: the first step, compile included, from empty disk caches (TORCHINDUCTOR_CACHE_DIR,
  TRITON_CACHE_DIR and KERNELAB_CACHE point at a fresh temporary directory for every mode and
  step kind; ``torch._dynamo.reset()`` before it). One process per model and mode: a CUDA error in
  one mode cannot poison the next, and no mode runs in a process another compiler has filled (in
  one process for all three modes, the mode compiled second ran its host-bound steps slower: GPT-2's
  training step under kernelab took 21.4 ms in its own process and 27.9 ms compiled after Inductor,
  same run, ``results/models_h200_run9*.csv``; ``--one-process`` keeps that way, for comparison).
  A compiled mode's process runs eager's first step before its own, as the reference of the
  agreement columns. Before a compiled mode's first step its compiler is imported and
  started on a trivial function (``startup_s``), so neither compiler pays the process's one-time
  start-up inside ``cold_s``. The infer step is compiled after the train step, so in-memory
  kernel caches of either compiler may already hold kernels the two graphs share.
* ``graphs``: graphs dynamo compiled for the step (more than 1: graph breaks).
* ``ms``: time per step, median of CUDA-event timings of back-to-back steps after warm-up
  (host clock on the CPU); ``kernels``: CUDA kernels + memcpy + memset one step launches
  (torch.profiler); ``peak_gib``: ``torch.cuda.max_memory_allocated`` over one warm step
  (weights, inputs, activations, gradients; nothing else is held); for a -cg mode over its first
  steps, warm-up and recording included (a replay allocates nothing: its activations stay in the
  CUDA graph's pool, allocated then).
* agreement with eager's first step, same weights and inputs: ``loss_err`` (relative),
  ``grad_err`` = max over parameters of ||g - g_eager|| / (||g_eager|| + 1e-5 ||all eager grads||)
  (the floor keeps gradients that are zero in exact arithmetic, such as attention key biases,
  from reading as 100% error), ``grad_worst`` its parameter; ``out_err`` for infer (logits).
* a mode that raises gives a row with ``status=error`` and the message (traceback in the log);
  the run goes on. A compiled mode whose prewarm step raises keeps ``status=ok`` for the model's
  own steps, with the prewarm's error in every row (and below the table).
  ``speedup_vs_inductor`` = inductor ms / this mode's ms (> 1: faster).

dtype: each model's usual one on a GPU (bf16 for the language models, ViT, ConvNeXt; fp32 for
ResNet, TF32 left at PyTorch's defaults); float32 on the CPU. ``--size tiny`` on a CPU (set
TRITON_INTERPRET=1) checks the script itself in minutes.

Writes OUT_DIR/models.csv (GPU name, torch / triton / transformers / timm / torchvision versions and
the date in every row), OUT_DIR/models.png (speed vs Inductor per model), OUT_DIR/models.log (the
workers' stderr), and prints a short table last. ``--budget-s``: no model is started after that
many seconds, and one still running then is stopped (its missing rows say ``timeout``); keep it
under the device tool's 600 s per call.

On the H200 (device tool): transformers, timm and torchvision are in the machine's image (KINDS.md
lists them), so nothing needs carrying. Should a later image lack them, `bash
benchmarks/zoo_wheels.sh` downloads them here into `.whl/` (git-ignored) for the call's `carry`.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import gc
import json
import math
import os
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODES = ("eager", "inductor", "kernelab", "inductor-cg", "kernelab-cg")
DEFAULT_MODES = MODES[:3]
#: the CUDA-graph modes: ``mode="reduce-overhead"`` of each compiler (Inductor's CUDA graph trees;
#: kernelab's replay on the same trees, kernelab/compiler/cudagraphs.py)
CUDA_GRAPH_MODES = ("inductor-cg", "kernelab-cg")
STEPS = ("train", "infer")
FIELDS = ("model", "size", "step", "mode", "status", "error", "ms", "speedup_vs_inductor", "speedup_vs_eager",
          "cold_s", "startup_s", "graphs", "kernels", "peak_gib", "loss", "loss_err", "grad_err", "grad_worst",
          "out_err", "timed_steps", "dtype", "params_m", "config", "device", "torch", "triton", "transformers",
          "timm", "torchvision", "date")


# ============================================================================= worker: one model
def _env(device) -> dict:
    import torch

    env = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "torch": torch.__version__, "date": datetime.date.today().isoformat()}
    for name in ("triton", "transformers", "timm", "torchvision"):
        try:
            env[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001 - a missing package is a blank column
            env[name] = ""
    return env


def _fresh_caches(tmp: Path, tag: str) -> None:
    """Point every compile cache at a new empty directory (read when the next compile runs)."""
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "KERNELAB_CACHE"):
        path = tmp / f"{tag}-{var.split('_')[0].lower()}"
        path.mkdir(parents=True)
        os.environ[var] = str(path)


def _sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_steps(call, device, n: int) -> list[float]:
    """Milliseconds of each of ``n`` back-to-back steps (CUDA events; host clock on the CPU)."""
    import torch

    if device.type != "cuda":
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            call()
            out.append((time.perf_counter() - t0) * 1e3)
        return out
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for start, end in events:
        start.record()
        call()
        end.record()
    torch.cuda.synchronize(device)
    return [start.elapsed_time(end) for start, end in events]


def _count_kernels(call, device) -> int | None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    if device.type != "cuda":
        return None
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize(device)
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def _norms(a, b=None, chunk: int = 1 << 26) -> tuple[float, float]:
    """(||a - b||, ||b||) accumulated in float64 a chunk at a time (logits of a 128k vocabulary
    are 1e9 values: a float64 copy of the whole would take 8 GB); ``b=None`` gives (||a||, 0)."""
    a = a.detach().reshape(-1)
    b = None if b is None else b.detach().reshape(-1)
    diff = ref = 0.0
    for i in range(0, a.numel(), chunk):
        x = a[i:i + chunk].double()
        if b is not None:
            y = b[i:i + chunk].to(x.device).double()
            ref += float(y.square().sum())
            x = x - y
        diff += float(x.square().sum())
    return math.sqrt(diff), math.sqrt(ref)


def _rel(a, b) -> float:
    """||a - b|| / ||b||; inf for a shape mismatch or a non-finite value in ``a``."""
    import torch

    if a.shape != b.shape or not bool(torch.isfinite(a).all()):
        return math.inf
    diff, ref = _norms(a, b)
    return diff / max(ref, 1e-30)


def _grad_err(params, ref_grads) -> tuple[float, str]:
    """Largest relative gradient error over parameters (see the module docstring) and its name."""
    import torch

    total = math.sqrt(sum(_norms(r)[0] ** 2 for r in ref_grads.values() if r is not None))
    worst, name = 0.0, ""
    for n, p in params:
        r = ref_grads.get(n)
        if (p.grad is None) != (r is None):
            return math.inf, n
        if r is None:
            continue
        if p.grad.shape != r.shape or not bool(torch.isfinite(p.grad).all()):
            return math.inf, n
        diff, ref = _norms(p.grad, r)
        err = diff / (ref + 1e-5 * total + 1e-30)
        if err > worst:
            worst, name = err, n
    return worst, name


def _prewarm(mode, device, tmp) -> float:
    """Seconds to import and start ``mode``'s compiler on a trivial training step (own empty caches),
    so that the model's cold step measures compiling the model, not the process's first compile."""
    import torch

    _fresh_caches(tmp, f"{mode}-prewarm")
    torch._dynamo.reset()
    x = torch.randn(64, 48, device=device, requires_grad=True)
    fn = _compile(lambda x: torch.nn.functional.gelu(x @ x.t()).softmax(-1).sum(), mode)
    t0 = time.perf_counter()
    fn(x).backward()
    _sync(device)
    return time.perf_counter() - t0


def _backend(mode: str) -> str:
    return "kernelab" if mode.startswith("kernelab") else "inductor"


def _compile(fn, mode: str):
    import torch

    return torch.compile(fn, backend=_backend(mode), **({"mode": "reduce-overhead"} if mode in CUDA_GRAPH_MODES else {}))


def _run_one(zm, model, inputs, mode, step, device, tmp, ref, buffers0, timed: bool = True) -> dict:
    import torch

    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    with torch.no_grad():  # batch-norm statistics as built: every mode sees the same model
        for n, b in model.named_buffers():
            b.copy_(buffers0[n])
    _fresh_caches(tmp, f"{mode}-{step}")
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    train = step == "train"
    model.train(train)
    fn = (lambda inp: zm.loss(model, inp)) if train else (lambda inp: zm.forward(model, inp))
    if mode != "eager":
        fn = _compile(fn, mode)
    new_step = torch.compiler.cudagraph_mark_step_begin if mode in CUDA_GRAPH_MODES else (lambda: None)

    def call():
        new_step()  # a replayed graph's outputs of the previous step may be overwritten from here
        if train:
            for _, p in params:
                p.grad = None
            loss = fn(inputs)
            loss.backward()
            return loss
        with torch.no_grad():
            return fn(inputs)

    row = {}
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)  # a CUDA-graph mode's peak is its recording's (below)
    t0 = time.perf_counter()
    out = call()
    _sync(device)
    row["cold_s"] = time.perf_counter() - t0
    row["graphs"] = counters["stats"]["unique_graphs"] if mode != "eager" else None  # > 1: graph breaks
    if train:
        row["loss"] = float(out.detach())
        if mode == "eager":
            ref["loss"] = row["loss"]
            ref["grads"] = {n: None if p.grad is None else p.grad.detach().to("cpu", copy=True) for n, p in params}
        elif "grads" in ref:
            row["loss_err"] = abs(row["loss"] - ref["loss"]) / max(abs(ref["loss"]), 1e-30)
            row["grad_err"], row["grad_worst"] = _grad_err(params, ref["grads"])
    else:
        if mode == "eager":
            ref["out"] = out.detach().to("cpu", copy=True)
        elif "out" in ref:
            row["out_err"] = _rel(out, ref["out"])
    del out
    if not timed:  # eager's first step as the reference of a compiled mode's own process
        return row
    warm = _time_steps(call, device, 2 if device.type == "cuda" else 1)
    target_s = 1.0 if device.type == "cuda" else 0.3
    n = int(min(100, max(5 if device.type == "cuda" else 3, target_s * 1e3 / max(min(warm), 1e-3))))
    row["ms"] = statistics.median(_time_steps(call, device, n))
    row["timed_steps"] = n
    row["kernels"] = _count_kernels(call, device)
    if device.type == "cuda" and mode in CUDA_GRAPH_MODES:
        # a replay allocates nothing: its activations live in the graph's pool, allocated while the
        # first steps ran and recorded; the peak since before the first step counts them
        row["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    elif device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        call()
        torch.cuda.synchronize(device)
        row["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    for _, p in params:
        p.grad = None
    return row


def worker(name: str, size: str, modes, steps) -> None:
    """Build one model and print one ``ROW {json}`` line per (mode, step) on stdout."""
    import torch

    from kernelab.zoo import ZOO

    if any(m.startswith("kernelab") for m in modes):
        import kernelab.compiler

        kernelab.compiler.register()
    emit = lambda kind, obj: print(kind, json.dumps(obj), flush=True)  # noqa: E731
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":  # a CPU run checks the script; on a shared host, more threads only contend
        torch.set_num_threads(1)
    zm = ZOO[name]
    dtype = zm.dtype if device.type == "cuda" else torch.float32
    base = {"model": name, "size": size, "dtype": str(dtype).replace("torch.", ""),
            "config": zm.summary[size], **_env(device)}
    try:
        model, inputs = zm.build(size, device=device, dtype=dtype)
    except Exception as exc:  # noqa: BLE001 - a model that does not build is a row per mode
        traceback.print_exc()
        for mode in modes:
            for step in steps:
                emit("ROW", {**base, "mode": mode, "step": step, "status": "error", "error": f"build: {_msg(exc)}"})
        return
    base["params_m"] = sum(p.numel() for p in model.parameters()) / 1e6
    config = getattr(model, "config", None)  # what this transformers version chose, for the record
    for attr, label in (("_attn_implementation", "attn"), ("_experts_implementation", "experts")):
        if getattr(config, attr, None) and (attr != "_experts_implementation" or "experts" in zm.summary[size]):
            base["config"] += f"; {label}={getattr(config, attr)}"
    buffers0 = {n: b.detach().clone() for n, b in model.named_buffers()}
    refs = {s: {} for s in steps}
    with tempfile.TemporaryDirectory(prefix=f"kl-models-{name}-") as tmp:
        if "eager" not in modes:  # a process of its own for a compiled mode: eager's first step as reference
            for step in steps:
                _run_one(zm, model, inputs, "eager", step, device, Path(tmp), refs[step], buffers0, timed=False)
                for _, p in model.named_parameters():
                    p.grad = None
        for mode in modes:
            startup, prewarm_error = None, ""
            if mode != "eager":
                try:
                    startup = _prewarm(mode, device, Path(tmp))
                except Exception as exc:  # noqa: BLE001 - a crash of the compiler all the same: in every row
                    print(f"--- {name} {mode} prewarm", file=sys.stderr)
                    traceback.print_exc()
                    prewarm_error = f"prewarm step failed: {_msg(exc)}"
            for step in steps:
                emit("START", {"model": name, "mode": mode, "step": step})
                row = {**base, "mode": mode, "step": step, "status": "ok", "error": prewarm_error, "startup_s": startup}
                try:
                    row.update(_run_one(zm, model, inputs, mode, step, device, Path(tmp), refs[step], buffers0))
                except Exception as exc:  # noqa: BLE001 - one mode's crash is a row, not the end of the run
                    print(f"--- {name} {mode} {step}", file=sys.stderr)
                    traceback.print_exc()
                    row.update(status="error", error=_msg(exc))
                for _, p in model.named_parameters():
                    p.grad = None
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                emit("ROW", row)


def _msg(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".split("Set TORCHDYNAMO_VERBOSE")[0]
    return " ".join(text.split())[:300]


# ============================================================================= driver
def _reader(stream, q):
    for line in stream:
        q.put(line)
    q.put(None)


def run_model(args, name, deadline, log, on_line) -> list[dict]:
    """The worker processes for ``name`` (one per mode: see the module's doc); rows they printed,
    plus ``timeout``/``error`` rows for the (mode, step) pairs never reported."""
    if args.one_process:
        return _run_worker(args, name, args.modes, deadline, log, on_line)
    rows = []
    for mode in args.modes:
        if time.time() >= deadline - 5:
            break
        rows += _run_worker(args, name, [mode], deadline, log, on_line)
    done = {(r["mode"], r["step"]) for r in rows}
    for mode in args.modes:
        for step in args.steps:
            if (mode, step) not in done:
                rows.append({"model": name, "size": args.size, "mode": mode, "step": step, "status": "timeout",
                             "error": f"not started: --budget-s {args.budget_s:g} reached"})
                on_line("ROW", rows[-1])
    return rows


def _run_worker(args, name, modes, deadline, log, on_line) -> list[dict]:
    """One worker process for ``name`` and ``modes``; rows it printed, plus ``timeout``/``error``
    rows for the (mode, step) pairs it never reported."""
    cmd = [sys.executable, str(Path(__file__).resolve()), str(args.out), "--worker", name, "--size", args.size,
           "--modes", ",".join(modes), "--steps", ",".join(args.steps)]
    log.write(f"\n===== {name}: {' '.join(cmd)}\n")
    log.flush()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    q: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(proc.stdout, q), daemon=True).start()
    rows, why = [], None
    while True:
        try:
            line = q.get(timeout=max(0.1, min(5.0, deadline - time.time())))
        except queue.Empty:
            if time.time() >= deadline:
                os.killpg(proc.pid, signal.SIGKILL)  # the worker's own session: it and its compile workers
                why = ("timeout", f"stopped: --budget-s {args.budget_s:g} reached")
                break
            continue
        if line is None:
            break
        kind, _, payload = line.partition(" ")
        if kind in ("ROW", "START"):
            obj = json.loads(payload)
            if kind == "ROW":
                rows.append(obj)
            on_line(kind, obj)
        else:
            log.write(line)
    rc = proc.wait()
    if why is None and rc != 0:
        why = ("error", f"worker exited with status {rc} (see models.log)")
    done = {(r["mode"], r["step"]) for r in rows}
    for mode in modes:
        for step in args.steps:
            if (mode, step) not in done:
                rows.append({"model": name, "size": args.size, "mode": mode, "step": step,
                             "status": why[0] if why else "error", "error": why[1] if why else "no row reported"})
                on_line("ROW", rows[-1])
    return rows


def add_ratios(rows) -> None:
    ms = {(r["model"], r["step"], r["mode"]): r.get("ms") for r in rows if r.get("status") == "ok"}
    for r in rows:
        mine = ms.get((r["model"], r["step"], r["mode"]))
        for ref, col in (("inductor", "speedup_vs_inductor"), ("eager", "speedup_vs_eager")):
            other = ms.get((r["model"], r["step"], ref))
            r[col] = other / mine if mine and other else None


def write_csv(path: Path, rows, env: dict) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: _cell({**env, **r}.get(k)) for k in FIELDS})


def _cell(v):
    if isinstance(v, float):
        return f"{v:.6g}"
    return "" if v is None else v


def plot(path: Path, rows, env: dict, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    others = [m for m in args.modes if m != "inductor"]
    fig, axes = plt.subplots(1, len(args.steps), figsize=(6 * len(args.steps), 4.2), squeeze=False)
    width = 0.8 / max(1, len(others))
    for ax, step in zip(axes[0], args.steps):
        for i, mode in enumerate(others):
            for j, model in enumerate(models):
                r = next((r for r in rows if (r["model"], r["step"], r["mode"]) == (model, step, mode)), None)
                x = j + (i - (len(others) - 1) / 2) * width
                v = r.get("speedup_vs_inductor") if r else None
                if v:
                    ax.bar(x, v, width, color=f"C{i}", label=mode if j == 0 else None)
                    ax.text(x, v, f"{v:.2f}", ha="center", va="bottom", fontsize=7)
                else:  # why no bar: this mode failed or ran out of time, or Inductor did
                    why = r.get("status", "n/a") if r and r.get("status") != "ok" else "no inductor"
                    ax.text(x, 0.02, why, ha="center", va="bottom", fontsize=7, rotation=90, color=f"C{i}")
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set_xticks(range(len(models)), models, rotation=30)
        ax.set_xlim(-0.6, len(models) - 0.4)
        ax.set_title(f"{step}: Inductor time / mode time (> 1 faster)")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(f"kernelab zoo ({args.size}) on {env.get('device', '?')}, torch {env.get('torch', '?')}, "
                 f"triton {env.get('triton', '?')}, {env.get('date', '')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def print_table(rows, args) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    by_key = {(r["model"], r["step"], r["mode"]): r for r in rows}

    def cell(model, step, mode, key, spec):
        r = by_key.get((model, step, mode))
        if r is None or mode not in args.modes:
            return "-"
        if r.get("status") != "ok":
            return {"error": "ERR", "timeout": "T/O"}.get(r.get("status"), "?")
        v = r.get(key)
        return "-" if v is None else format(v, spec)

    def per_mode(model, step, key, spec, modes=MODES):
        return "/".join(cell(model, step, m, key, spec) for m in modes if m in args.modes)

    table = Table(box=box.SIMPLE, title=f"models ({args.size}): ms per step; x ind = Inductor ms / mode's ms "
                                        "(kernelab, inductor-cg, kernelab-cg); e/i/k = eager/inductor/kernelab, then the -cg modes")
    for col in ("model", "step", *[f"{m} ms" for m in args.modes], "x ind", "kernels e/i/k", "graphs i/k",
                "cold s i/k", "peak GiB i/k", "loss err k", "grad/out err i/k"):
        table.add_column(col, justify="left" if col in ("model", "step") else "right")
    compiled = ("inductor", "kernelab", *CUDA_GRAPH_MODES)
    for model in dict.fromkeys(r["model"] for r in rows):
        for step in args.steps:
            err = "grad_err" if step == "train" else "out_err"
            table.add_row(model, step, *[cell(model, step, m, "ms", ".2f") for m in args.modes],
                          per_mode(model, step, "speedup_vs_inductor", ".2f", ("kernelab", *CUDA_GRAPH_MODES)),
                          per_mode(model, step, "kernels", "d"), per_mode(model, step, "graphs", "d", compiled),
                          per_mode(model, step, "cold_s", ".1f", compiled),
                          per_mode(model, step, "peak_gib", ".2f", compiled),
                          cell(model, step, "kernelab", "loss_err", ".1e"),
                          per_mode(model, step, err, ".1e", compiled))
    console = Console(width=200)
    console.print(table)
    for r in rows:
        if r.get("status") != "ok" or r.get("error"):
            console.print(f"[{r['status']}] {r['model']} {r['mode']} {r['step']}: {r.get('error', '')[:180]}",
                          markup=False, highlight=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="output directory (the device tool's $OUT)")
    ap.add_argument("--size", choices=("bench", "tiny"), default="bench")
    ap.add_argument("--budget-s", type=float, default=540.0, help="start no model after this; stop a running one")
    ap.add_argument("--only", default="", help="comma-separated zoo names")
    ap.add_argument("--modes", default=",".join(DEFAULT_MODES),
                    help=f"comma-separated, of {', '.join(MODES)} (-cg: mode='reduce-overhead', CUDA graphs)")
    ap.add_argument("--steps", default=",".join(STEPS))
    ap.add_argument("--one-process", action="store_true",
                    help="all modes of a model in one process, one after another (the old way: see above)")
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.modes = [m for m in args.modes.split(",") if m]
    args.steps = [s for s in args.steps.split(",") if s]
    bad = [m for m in args.modes if m not in MODES] + [s for s in args.steps if s not in STEPS]
    if bad:
        ap.error(f"unknown mode/step: {bad}")
    if args.worker:
        return worker(args.worker, args.size, args.modes, args.steps)

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from kernelab.zoo import ZOO

    names = [n for n in (args.only.split(",") if args.only else ZOO) if n]
    unknown = [n for n in names if n not in ZOO]
    if unknown:
        ap.error(f"not in the zoo: {unknown} (have {', '.join(ZOO)})")
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + args.budget_s
    rows, skipped = [], []
    with open(args.out / "models.log", "w") as log, Progress(
            TextColumn("{task.description:<34}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as prog:
        task = prog.add_task("models", total=len(names) * len(args.modes) * len(args.steps))

        def on_line(kind, obj):
            if kind == "START":
                prog.update(task, description=f"{obj['model']} {obj['mode']} {obj['step']}")
                return
            prog.advance(task)
            prog.console.print(f"{obj['model']:9s} {obj['mode']:9s} {obj['step']:5s} {obj['status']:7s} "
                               + (f"{obj.get('ms', 0):9.2f} ms  cold {obj.get('cold_s', 0):6.1f} s"
                                  if obj["status"] == "ok" else obj.get("error", "")[:120]),
                               markup=False, highlight=False)
            add_ratios(rows + [obj])
            write_csv(args.out / "models.csv", rows + [obj], {})  # row by row: a killed run keeps its rows

        for name in names:
            if time.time() >= deadline - 5:
                skipped.append(name)
                prog.advance(task, len(args.modes) * len(args.steps))
                continue
            rows += run_model(args, name, deadline, log, on_line)
    env = next(({k: r[k] for k in ("device", "torch", "triton", "transformers", "timm", "torchvision", "date")}
                for r in rows if "device" in r), {})
    add_ratios(rows)
    write_csv(args.out / "models.csv", rows, env)
    try:
        plot(args.out / "models.png", rows, env, args)
    except Exception as exc:  # noqa: BLE001 - the CSV is the result; the plot is a view of it
        print(f"plot failed: {_msg(exc)}")
    print(f"{env.get('device', '?')}, torch {env.get('torch', '?')}, triton {env.get('triton', '?')}, "
          f"transformers {env.get('transformers', '?')}, timm {env.get('timm', '?')}, {env.get('date', '')}")
    print_table(rows, args)
    if skipped:
        print(f"not started (--budget-s {args.budget_s:g} used up): {', '.join(skipped)}")
    print(f"wrote {args.out / 'models.csv'}, {args.out / 'models.png'}, {args.out / 'models.log'}")


if __name__ == "__main__":
    main()
