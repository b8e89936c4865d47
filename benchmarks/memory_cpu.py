#!/usr/bin/env python
"""Peak memory of training steps on the CPU, per mode, from the CPU allocator's own events (no GPU).

    python3 benchmarks/memory_cpu.py OUT_DIR [--only lm_head,llama,gpt2] [--modes eager,inductor,kernelab,kernelab-noreuse]
                                             [--steps train,infer]

Steps: train (gradients set to None, the loss, backward) and infer (the logits under
``torch.no_grad()``, the model in eval mode). Modes: eager; inductor (``torch.compile``); kernelab (``backend="kernelab"``, its kernels under
Triton's interpreter); kernelab-noreuse (the same with no output stored over an input,
``runtime._plan_reuse`` off: what ``GroupRunner.reuse`` saves). Models: the zoo at its tiny size,
and ``lm_head``: a 2-layer Llama of width 64 with Llama's own loss over a 32000-word vocabulary, 2 x
256 tokens, where the logits (62.5 MiB in float32) dominate, as they do at Llama's real size.

How: every model and mode in a process of its own; the loss function compiled (as ``models.py``
does: the model's other outputs, such as logits, are not the graph's); two warm-up steps, then one
step (gradients set to None, loss, backward) under ``torch.profiler(profile_memory=True)``, whose raw events hold every
allocation and free the CPU allocator reports, in time order; the step's peak is the largest
running sum above the step's start (what the step adds to what was allocated before it: weights,
inputs), ``end`` what it leaves (the gradients). The interpreter's NumPy arrays are not the
allocator's, so they do not count.

What it is: the graphs a GPU would run except where decompositions differ by device (attention is
ATen's flash attention for CPU here), in float32, without cuBLAS / cuDNN workspaces: a relative
comparison of the compilers' memory plans, not a GPU figure (``models.py``'s ``peak_gib`` on the
GPU is the one to report). Writes OUT_DIR/memory_cpu.csv (versions and date in every row) and
prints the table last.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODES = ("eager", "inductor", "kernelab", "kernelab-noreuse")
MODELS = ("lm_head", "bert_head", "gpt2_head", "llama", "gpt2", "bert", "t5", "mixtral", "vit", "convnext", "resnet")
STEPS = ("train", "infer")
FIELDS = ("model", "step", "mode", "status", "peak_mib", "end_mib", "x_inductor", "error", "device", "torch", "triton", "date")


def _lm_head_model():
    """(module, inputs, loss function, forward function): a Llama whose logits dominate the step's memory."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=32000, max_position_embeddings=512, attention_dropout=0.0)
    config._attn_implementation = "sdpa"
    ids = torch.randint(0, 32000, (2, 256), generator=torch.Generator().manual_seed(0))
    return (LlamaForCausalLM(config), {"input_ids": ids, "labels": ids}, lambda m, inputs: m(**inputs).loss,
            lambda m, inputs: m(input_ids=inputs["input_ids"]).logits)


def _bert_head_model(batch: int = 4, seq: int = 128):
    """(module, inputs, loss, forward): the zoo's BERT (masked LM) at width 64 with BERT-base's
    30522-word vocabulary, 4 x 128 tokens: the logits (59.6 MiB in float32) dominate, as at
    BERT-base's size (the H100 measured kernelab's inference peak at 1.22 GiB against Inductor's 0.80)."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                        vocab_size=30522, max_position_embeddings=128, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, pad_token_id=0)
    config._attn_implementation = "sdpa"
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 30522, (batch, seq), generator=gen)
    labels = torch.where(torch.rand(batch, seq, generator=gen) < 0.15, ids, torch.full_like(ids, -100))
    mask = torch.ones_like(ids)
    inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids), "labels": labels}
    return (BertForMaskedLM(config), inputs, lambda m, inp: m(**inp).loss,
            lambda m, inp: m(**{k: v for k, v in inp.items() if k != "labels"}).logits)


def _gpt2_head_model(batch: int = 2, seq: int = 256):
    """(module, inputs, loss, forward): GPT-2 at width 64 with GPT-2's 50257-word vocabulary (odd:
    kernelab's products pad it) and its head tied to the embedding, 2 x 256 tokens: the logits
    (98 MiB in float32) dominate, as at GPT-2 small's size (the H100 measured kernelab's inference
    peak at 1.92 GiB against Inductor's 1.16 in stop 40)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=50257, n_positions=seq, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0)
    config._attn_implementation = "sdpa"
    ids = torch.randint(0, 50257, (batch, seq), generator=torch.Generator().manual_seed(0))
    return (GPT2LMHeadModel(config), {"input_ids": ids, "labels": ids}, lambda m, inp: m(**inp).loss,
            lambda m, inp: m(input_ids=inp["input_ids"]).logits)


def _build(name: str):
    if name == "lm_head":
        return _lm_head_model()
    if name == "bert_head":
        return _bert_head_model()
    if name == "gpt2_head":
        return _gpt2_head_model()
    from kernelab.zoo import ZOO

    zm = ZOO[name]
    module, inputs = zm.build("tiny")
    return module, inputs, zm.loss, zm.forward


def step_peak(step) -> tuple[float, float]:
    """(peak, end) in bytes of one call of ``step`` above what was allocated before it. Garbage of
    earlier calls is collected first: a reference cycle that the collector happened to break
    inside the step would count its frees (or miss them) there."""
    import gc

    from torch.profiler import ProfilerActivity, profile

    gc.collect()

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    now = peak = 0
    for _, nbytes in events:
        now += nbytes
        peak = max(peak, now)
    return peak, now


def worker(name: str, step_kind: str, mode: str) -> dict:
    import torch

    torch.manual_seed(0)
    if mode == "kernelab-noreuse":
        from kernelab.compiler import runtime

        runtime._plan_reuse = lambda *args, **kwargs: None
    module, inputs, loss, forward = _build(name)
    train = step_kind == "train"
    module.train(train)
    # the loss function compiled, as models.py does; inference: the logits under no_grad
    fn = (lambda inp: loss(module, inp)) if train else (lambda inp: forward(module, inp))
    if mode != "eager":
        fn = torch.compile(fn, backend="inductor" if mode == "inductor" else "kernelab")

    def step():
        if not train:
            with torch.no_grad():
                return fn(inputs)
        module.zero_grad(set_to_none=True)
        fn(inputs).backward()

    for _ in range(2):
        step()
    peak, end = step_peak(step)
    return {"peak_mib": round(peak / 2**20, 3), "end_mib": round(end / 2**20, 3)}


def _versions() -> dict:
    import torch
    import triton

    return {"device": f"cpu ({platform.machine()}, {os.cpu_count()} cores)", "torch": torch.__version__,
            "triton": triton.__version__, "date": datetime.date.today().isoformat()}


def run(name: str, mode: str, timeout: float, step: str = "train") -> dict:
    """One model, step and mode in a fresh process; a row (status ok / error / timeout)."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore")
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(ROOT)
    row = {"model": name, "step": step, "mode": mode}
    try:
        done = subprocess.run([sys.executable, __file__, "--worker", name, step, mode], capture_output=True,
                              text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {**row, "status": "timeout", "error": f"over {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {**row, "status": "error", "error": tail[:200]}
    return {**row, "status": "ok", **json.loads(lines[-1][len("RESULT "):])}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, nargs="?")
    parser.add_argument("--only", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per model and mode")
    parser.add_argument("--steps", default="train", help="comma-separated: train, infer")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(worker(*args.worker)), flush=True)
        return 0
    if args.out is None:
        parser.error("OUT_DIR is required")
    names, modes, steps = args.only.split(","), args.modes.split(","), args.steps.split(",")
    unknown = sorted(set(names) - set(MODELS)) + sorted(set(modes) - set(MODES)) + sorted(set(steps) - set(STEPS))
    if unknown:
        parser.error(f"unknown model, mode or step: {', '.join(unknown)}")
    from rich.progress import Progress

    rows, env = [], _versions()
    with Progress() as progress:
        task = progress.add_task("steps", total=len(names) * len(modes) * len(steps))
        for name in names:
            for step in steps:
                for mode in modes:
                    progress.update(task, description=f"{name} {step} {mode}")
                    rows.append({**run(name, mode, args.timeout, step), **env})
                    progress.advance(task)
    _ratios(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "memory_cpu.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows({k: r.get(k, "") for k in FIELDS} for r in rows)
    print(table(rows))
    return 0


def _ratios(rows) -> None:
    """x_inductor: the step's peak over Inductor's, same model (above 1: more memory)."""
    inductor = {(r["model"], r["step"]): r.get("peak_mib") for r in rows if r["mode"] == "inductor" and r["status"] == "ok"}
    for r in rows:
        base = inductor.get((r["model"], r["step"]))
        if r["status"] == "ok" and base:
            r["x_inductor"] = round(r["peak_mib"] / base, 3)


def table(rows) -> str:
    lines = [f"step peak above its start, CPU allocator events (MiB); torch {rows[0]['torch']}, {rows[0]['date']}",
             f"{'model':10s} {'step':6s} {'mode':18s} {'peak':>9s} {'end':>9s} {'x inductor':>10s}"]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"{r['model']:10s} {r['step']:6s} {r['mode']:18s} {r['status']}: {r.get('error', '')}")
            continue
        lines.append(f"{r['model']:10s} {r['step']:6s} {r['mode']:18s} {r['peak_mib']:9.2f} {r['end_mib']:9.2f} "
                     f"{r.get('x_inductor', ''):>10}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
