#!/usr/bin/env python
"""One training step of two causal LMs, eager vs kernelab.patch vs Liger vs torch.compile, same run.

    PYTHONPATH=. python3 benchmarks/e2e_train.py OUT_DIR [--budget-s 150] [--models llama,qwen2]
                                                 [--providers eager,kernelab,kernelab_mlp,kernelab_lce,liger,compile]
                                                 [--size bench|tiny]

Models (bf16 parameters, built from configs on the GPU, no weights downloaded; same seed, hence
the same weights and tokens, for every provider):

* llama: Llama-3.2-1B-like, cut to 4 layers: hidden 2048, intermediate 8192, 16 heads, 8 KV heads,
  vocab 128256, tied embeddings; batch 2 x 2048 tokens.
* qwen2: Qwen2.5-1.5B-like, cut to 4 layers: hidden 1536, intermediate 8960, 12 heads, 2 KV heads,
  vocab 151936, tied embeddings; batch 2 x 2048 tokens.

One step: grads set to None, ``model(input_ids, labels=input_ids).loss``, ``backward()`` (no
optimizer). Providers, each on a fresh model:

* eager: Hugging Face's modules as they are (SDPA attention);
* kernelab: ``kernelab.patch(model)`` (norms, SwiGLU, the loss; its report is written too);
* kernelab_mlp: ``kernelab.patch(model, fused_mlp=True)``: the same, with each MLP's gate and up
  products and SiLU * up as one dual GEMM (``swiglu_linear``);
* kernelab_lce: ``kernelab.patch(model, fused_lm_head=True)``: the same, with the LM head and the
  loss fused (``linear_cross_entropy``, no logits held: Liger's default does the same);
* liger: ``liger_kernel.transformers.apply_liger_kernel_to_llama / _qwen2(model=model)`` with its
  defaults (RoPE, RMSNorm, SwiGLU, fused linear cross-entropy); Liger patches transformers' modules
  and classes too, which are restored after its rows so that later providers run the originals;
  "not installed" when it cannot be imported;
* compile: ``torch.compile(model)`` (Inductor, default mode), run last (its compile is the longest).

Per provider: the first step (cold: Triton / Inductor compilation included, ``cold_s``) is the
correctness check: loss against eager's (relative) and every parameter's gradient against eager's
(``grad_err`` = max over parameters of ||g - g_eager|| / (||g_eager|| + 1e-5 ||all eager grads||),
``grad_worst`` its parameter); then ``ms`` = median of kernelab.bench.timing.time_ms (do_bench:
warm-up, then ~10 timed steps), ``tokens_per_s`` = tokens / ms, ``peak_gib`` =
torch.cuda.max_memory_allocated over one warm step (weights, tokens, activations, gradients) and
``step_gib`` = that peak minus what was allocated before the step (weights and tokens). A provider
that raises gives a row with status "error" and the message; the run goes on.

Budget: no provider starts after ``--budget-s`` seconds, and torch.compile only starts with 60 s
left (its cold compile takes that long); skipped rows say so. Writes OUT_DIR/e2e_train.csv (GPU,
torch / triton / transformers / Liger versions and the date in every row) and
OUT_DIR/e2e_patch_report.txt, and prints a table last. ``--size tiny`` (2 layers, hidden 64, 2 x
32 tokens, float32) runs on the CPU too (set TRITON_INTERPRET=1): a check of the script itself.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import gc
import importlib
import math
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROVIDERS = ("eager", "kernelab", "kernelab_mlp", "kernelab_lce", "liger", "compile")
#: kernelab providers -> kernelab.patch's options
PATCH_OPTIONS = {"kernelab": {}, "kernelab_mlp": {"fused_mlp": True}, "kernelab_lce": {"fused_lm_head": True}}
FIELDS = ("model", "provider", "status", "error", "ms", "tokens_per_s", "speedup_vs_eager", "speedup_vs_liger",
          "peak_gib", "step_gib", "cold_s", "loss", "loss_rel_err", "grad_err", "grad_worst", "swaps", "tokens",
          "batch", "seq", "dtype", "config", "gpu", "torch", "triton", "transformers", "liger", "date")
COMPILE_MIN_S = 60.0


# ============================================================================= models
def _configs(size: str) -> dict:
    """name -> (transformers config class name, model class name, config kwargs, batch, seq)."""
    if size == "tiny":
        tiny = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)
        return {"llama": ("LlamaConfig", "LlamaForCausalLM", dict(tiny, vocab_size=256), 2, 32),
                "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tiny, vocab_size=384), 2, 32)}
    llama = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=4, num_attention_heads=16,
                 num_key_value_heads=8, vocab_size=128256, max_position_embeddings=4096, rope_theta=500000.0,
                 rms_norm_eps=1e-5, tie_word_embeddings=True)
    qwen2 = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=4, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=151936, max_position_embeddings=4096, rope_theta=1000000.0,
                 rms_norm_eps=1e-6, tie_word_embeddings=True)
    return {"llama": ("LlamaConfig", "LlamaForCausalLM", llama, 2, 2048),
            "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", qwen2, 2, 2048)}


def build(spec, device, dtype):
    """(model in train mode, input ids) -- same weights and tokens on every call."""
    import torch
    import transformers

    config_cls, model_cls, kwargs, batch, seq = spec
    config = getattr(transformers, config_cls)(**kwargs, attention_dropout=0.0, bos_token_id=0, eos_token_id=1,
                                               pad_token_id=None)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = getattr(transformers, model_cls)(config)
    model = model.to(dtype=dtype).train()
    ids = torch.randint(0, kwargs["vocab_size"], (batch, seq), generator=torch.Generator().manual_seed(0))
    return model, ids.to(device)


# ============================================================================= providers
def _liger_apply(name: str):
    """Liger's apply function for this model, or None when Liger is not importable."""
    try:
        lt = importlib.import_module("liger_kernel.transformers")
    except Exception:  # noqa: BLE001 - any import failure means "not installed"
        return None
    return getattr(lt, f"apply_liger_kernel_to_{name}", None)


@contextlib.contextmanager
def transformers_restored(name: str):
    """Put back what Liger changes at module and class level in ``modeling_<name>`` (it replaces
    the norm class, RoPE, the causal LM's forward), so that later providers run the originals."""
    module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    names = dict(vars(module))
    classes = {c: dict(vars(c)) for c in names.values() if isinstance(c, type) and c.__module__ == module.__name__}
    try:
        yield
    finally:
        for key in [k for k in vars(module) if k not in names]:
            delattr(module, key)
        for key, value in names.items():
            if vars(module).get(key) is not value:
                setattr(module, key, value)
        for cls, saved in classes.items():
            for key in [k for k in vars(cls) if k not in saved]:
                delattr(cls, key)
            for key, value in saved.items():
                if vars(cls).get(key) is not value:
                    setattr(cls, key, value)


def prepare(provider: str, name: str, model, notes: dict):
    """The callable model for ``provider`` (patched, compiled ...); raises if it cannot run."""
    import torch

    import kernelab

    if provider in PATCH_OPTIONS:
        report = kernelab.patch(model, **PATCH_OPTIONS[provider])
        notes["swaps"] = report.summary().removeprefix("kernelab.patch: ")
        notes.setdefault("reports", []).append(f"== {name} / {provider}\n{report}\n")
        return model
    if provider == "liger":
        _liger_apply(name)(model=model)
        return model
    if provider == "compile":
        torch._dynamo.reset()
        return torch.compile(model)
    return model


# ============================================================================= one provider
def _step(model, ids):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss


def _sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _grads(model) -> dict:
    """Eager's gradients, kept in CPU memory (on the GPU they would count in later peaks)."""
    return {n: p.grad.detach().to("cpu", copy=True) for n, p in model.named_parameters() if p.grad is not None}


def grad_error(model, ref: dict) -> tuple[float, str]:
    """Largest relative gradient error against eager's (see the module docstring) and its parameter."""
    import torch

    total = math.sqrt(sum(float(g.float().square().sum()) for g in ref.values()))
    worst, where = 0.0, ""
    for name, p in model.named_parameters():
        name = name.removeprefix("_orig_mod.")
        if name not in ref:
            continue
        if p.grad is None or p.grad.shape != ref[name].shape or not bool(torch.isfinite(p.grad).all()):
            return math.inf, name
        r = ref[name].to(p.grad.device).float()
        err = float((p.grad.float() - r).norm()) / (float(r.norm()) + 1e-5 * total + 1e-30)
        if err > worst:
            worst, where = err, name
    return worst, where


def _peak(run, model, device) -> tuple[float | None, float | None]:
    """(peak GiB over one step, peak minus what was allocated before it: weights and tokens, the
    previous step's gradients freed first)."""
    import torch

    if device.type != "cuda":
        return None, None
    model.zero_grad(set_to_none=True)
    _sync(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    run()
    _sync(device)
    peak = torch.cuda.max_memory_allocated(device)
    return peak / 2**30, (peak - before) / 2**30


def _time_ms(run, device, steps: int) -> float:
    """Median ms of a step: do_bench on the GPU, the host clock on the CPU."""
    import statistics

    if device.type == "cuda":
        from kernelab.bench.timing import time_ms

        return time_ms(run, [()], warmup_ms=100, rep_ms=steps * 100)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def run_provider(provider, name, spec, device, dtype, ref: dict, notes: dict, steps: int) -> dict:
    """One row: check (cold step against eager), then time and memory."""
    model, ids = build(spec, device, dtype)
    row = {"tokens": ids.numel()}
    try:
        callable_model = prepare(provider, name, model, notes)
        _sync(device)
        t0 = time.perf_counter()
        loss = _step(callable_model, ids)
        _sync(device)
        row["cold_s"] = time.perf_counter() - t0
        row["loss"] = float(loss.detach())
        if provider == "eager":
            ref["loss"], ref["grads"] = float(loss), _grads(model)
        elif "loss" in ref:
            row["loss_rel_err"] = abs(float(loss) - ref["loss"]) / abs(ref["loss"])
            row["grad_err"], row["grad_worst"] = grad_error(callable_model, ref["grads"])
        run = lambda: _step(callable_model, ids)  # noqa: E731
        row["ms"] = _time_ms(run, device, steps)
        row["tokens_per_s"] = ids.numel() / (row["ms"] / 1e3)
        row["peak_gib"], row["step_gib"] = _peak(run, callable_model, device)
        row["status"] = "ok"
        if provider.startswith("kernelab"):
            row["swaps"] = notes.get("swaps", "")
    finally:
        del model
        gc.collect()
        if device.type == "cuda":
            import torch

            torch.cuda.empty_cache()
    return row


# ============================================================================= the run
def environment(device) -> dict:
    from kernelab.bench.runner import environment as bench_environment

    env = bench_environment(device)
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError:
        env["transformers"] = "absent"
    return env


def plan(models, providers) -> list[tuple[str, str]]:
    """(model, provider) in run order: eager first (the reference), compile last."""
    order = [p for p in PROVIDERS if p in providers and p != "compile"]
    pairs = [(m, p) for m in models for p in order]
    return pairs + [(m, "compile") for m in models if "compile" in providers]


def run_all(args, device, dtype, env) -> tuple[list[dict], dict]:
    import torch

    specs = _configs(args.size)
    refs = {m: {} for m in args.models}
    notes: dict = {}
    rows = []
    t_start = time.monotonic()
    for name, provider in plan(args.models, args.providers):
        spec = specs[name]
        row = {"model": name, "provider": provider, "batch": spec[3], "seq": spec[4], "dtype": str(dtype).removeprefix("torch."),
               "config": " ".join(f"{k}={v}" for k, v in spec[2].items() if k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size")),
               **env}
        left = args.budget_s - (time.monotonic() - t_start)
        if left <= 0 or (provider == "compile" and left < COMPILE_MIN_S):
            row.update(status="skipped", error=f"budget: {max(left, 0):.0f} s left of {args.budget_s:.0f}")
        elif provider == "liger" and _liger_apply(name) is None:
            row.update(status="not installed", error="liger_kernel.transformers is not importable")
        else:
            print(f"[{time.monotonic() - t_start:6.1f} s] {name} / {provider}", file=sys.stderr, flush=True)
            try:
                with transformers_restored(name) if provider == "liger" else contextlib.nullcontext():
                    row.update(run_provider(provider, name, spec, device, dtype, refs[name], notes, args.steps))
            except Exception as exc:  # noqa: BLE001 - one provider's failure is a row, not the end of the run
                traceback.print_exc()
                row.update(status="error", error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
            finally:
                torch._dynamo.reset()
        rows.append(row)
    return rows, notes


def add_ratios(rows) -> None:
    by = {(r["model"], r["provider"]): r for r in rows}
    for r in rows:
        for peer, key in (("eager", "speedup_vs_eager"), ("liger", "speedup_vs_liger")):
            other = by.get((r["model"], peer), {})
            if r.get("ms") and other.get("ms"):
                r[key] = other["ms"] / r["ms"]


def write_csv(path: Path, rows) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


def _fmt(v, spec):
    return "-".rjust(int(spec.split(".")[0])) if v is None else format(v, spec)


def print_table(rows) -> None:
    print(f"\n{'model':7} {'provider':12} {'status':13} {'ms/step':>9} {'tok/s':>9} {'x eager':>8} {'x liger':>8} "
          f"{'peak GiB':>9} {'step GiB':>9} {'cold s':>7} {'loss err':>9} {'grad err':>9}")
    for r in rows:
        print(f"{r['model']:7} {r['provider']:12} {r.get('status', ''):13} {_fmt(r.get('ms'), '9.2f')} "
              f"{_fmt(r.get('tokens_per_s'), '9.0f')} {_fmt(r.get('speedup_vs_eager'), '8.2f')} "
              f"{_fmt(r.get('speedup_vs_liger'), '8.2f')} {_fmt(r.get('peak_gib'), '9.2f')} "
              f"{_fmt(r.get('step_gib'), '9.2f')} {_fmt(r.get('cold_s'), '7.1f')} "
              f"{_fmt(r.get('loss_rel_err'), '9.1e')} {_fmt(r.get('grad_err'), '9.1e')}")
        if r.get("status") not in ("ok", None) and r.get("error"):
            print(f"        {r['error']}")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="directory for e2e_train.csv and e2e_patch_report.txt")
    ap.add_argument("--budget-s", type=float, default=150.0, help="no provider starts after this many seconds")
    ap.add_argument("--models", default="llama,qwen2", type=lambda s: [m for m in s.split(",") if m])
    ap.add_argument("--providers", default=",".join(PROVIDERS), type=lambda s: [p for p in s.split(",") if p])
    ap.add_argument("--size", choices=("bench", "tiny"), default="bench")
    ap.add_argument("--steps", type=int, default=10, help="about this many timed steps per provider")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.models) - {"llama", "qwen2"}) + sorted(set(args.providers) - set(PROVIDERS))
    if unknown:
        ap.error(f"unknown model or provider: {', '.join(unknown)}")
    return ap, args


def main(argv=None) -> int:
    import torch

    ap, args = parse_args(argv)
    if not torch.cuda.is_available() and args.size != "tiny":
        ap.error("needs a CUDA GPU (--size tiny runs on the CPU)")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if args.size == "bench" else torch.float32
    args.out.mkdir(parents=True, exist_ok=True)
    env = environment(device)
    rows, notes = run_all(args, device, dtype, env)
    add_ratios(rows)
    write_csv(args.out / "e2e_train.csv", rows)
    (args.out / "e2e_patch_report.txt").write_text("".join(notes.get("reports", [])))
    print("".join(notes.get("reports", [])))
    print(f"{env['gpu']}, torch {env['torch']}, triton {env['triton']}, transformers {env['transformers']}, "
          f"Liger {env['liger']}, {env['date']}; {str(dtype).removeprefix('torch.')} parameters, one forward + "
          f"backward, no optimizer")
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
