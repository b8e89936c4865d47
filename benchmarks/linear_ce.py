#!/usr/bin/env python
"""linear_cross_entropy on a CUDA GPU: kernelab vs eager vs torch.compile vs Liger, bf16, forward+backward.

    PYTHONPATH=. python3 benchmarks/linear_ce.py OUT_DIR [--budget-s 150]

Per shape (tokens N x hidden H x vocab V; weight [V, H], no bias, every 16th target ignored):

1. correctness first: each provider's loss and gradients (d hidden, d weight) against PyTorch in
   float32 on the same bf16 inputs (relative L2 error; tolerance of kernelab.bench.timing.REL_TOL);
2. peak memory of one training-like step (loss, then torch.autograd.grad for hidden and weight):
   torch.cuda.max_memory_allocated minus what was allocated before it (inputs excluded, the
   returned gradients included: every provider returns the same two);
3. time of that step: kernelab.bench.timing.time_ms (triton's do_bench, median).

Providers: kernelab (default: vocabulary chunks, memory within N x H elements as Liger's),
kernelab@tokens (token chunks over the whole vocabulary, CHUNK_BYTES of logits: no recomputed
matmul, more memory), kernelab at Liger's chunk size (token chunks of Liger's rows), eager (F.linear then F.cross_entropy on .float()
logits, as Hugging Face computes the loss), torch.compile of that eager function (a fresh static
compile per shape, compiled by the correctness call) and Liger's LigerFusedLinearCrossEntropyLoss
when it imports ("not installed" otherwise). Cases that would start after --budget-s are skipped
and said so. Writes OUT_DIR/linear_ce.csv (GPU, versions and date in every row); prints the table last.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

#: (N tokens, H hidden, V vocabulary): Llama-3.2-1B, Llama-3-8B, Qwen2-7B, GPT-2 (long sequence)
SHAPES = [(4096, 2048, 128256), (8192, 4096, 128256), (4096, 3584, 151936), (16384, 768, 50257)]
DTYPE = torch.bfloat16
FIELDS = ["date", "gpu", "torch", "triton", "liger", "dtype", "shape", "provider", "chunk_rows", "ms",
          "peak_mib", "loss_rel_err", "dh_rel_err", "dw_rel_err", "status"]
#: Seconds kept in hand for a torch.compile provider (its compile happens in the correctness call).
COMPILE_S = 40


def eager(hidden, weight, target):
    return F.cross_entropy(F.linear(hidden, weight).float(), target)


def liger_loss():
    """Liger's fused linear cross-entropy as a function (hidden, weight, target), or None."""
    try:
        from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss
    except Exception:  # noqa: BLE001 - any import failure means "not installed"
        return None
    module = LigerFusedLinearCrossEntropyLoss()

    def loss(hidden, weight, target):
        out = module(weight, hidden, target)
        return out if isinstance(out, torch.Tensor) else out[0]

    return loss


def providers(n: int, h: int, v: int, liger) -> dict:
    """name -> (fn(hidden, weight, target) -> loss, chunk rows or "")."""
    import kernelab.ops as K
    from kernelab.ops.linear_cross_entropy import chunk_rows_for, chunk_shape_for, liger_chunk_rows

    rows, cols = chunk_shape_for(n, h, v, 2)
    token_rows, liger_rows = chunk_rows_for(n, v, 2), liger_chunk_rows(n, h, v)
    return {
        # default: blocks of N/4 token rows, ``cols`` classes a chunk (memory within N x H elements)
        "kernelab": (lambda a, b, c: K.linear_cross_entropy(a, b, c), f"{rows}x{cols}"),
        # token chunks over the whole vocabulary: CHUNK_BYTES of logits, no recomputed matmul
        "kernelab@tokens": (lambda a, b, c: K.linear_cross_entropy(a, b, c, chunk_rows=token_rows), token_rows),
        "kernelab@liger-chunk": (lambda a, b, c: K.linear_cross_entropy(a, b, c, chunk_rows=liger_rows), liger_rows),
        "eager": (eager, ""),
        "liger": (liger, liger_rows) if liger else None,
        "compile": (torch.compile(eager, dynamic=False), ""),
    }


def make_inputs(n: int, h: int, v: int, device) -> tuple:
    gen = torch.Generator(device=device).manual_seed(0)
    hidden = torch.randn((n, h), generator=gen, device=device, dtype=torch.float32).to(DTYPE).requires_grad_()
    weight = (torch.randn((v, h), generator=gen, device=device, dtype=torch.float32) * h ** -0.5).to(DTYPE)
    target = torch.randint(0, v, (n,), generator=gen, device=device)
    target[::16] = -100
    return hidden, weight.requires_grad_(), target


def step(fn, hidden, weight, target):
    """One training-like call: the loss and its gradients for hidden and weight (nothing accumulates)."""
    loss = fn(hidden, weight, target)
    return (loss, *torch.autograd.grad(loss, (hidden, weight)))


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref).norm() / ref.norm().clamp_min(1e-30))


def reference(hidden, weight, target) -> tuple:
    """Loss and gradients in float32 from the same bf16 values."""
    h, w = hidden.detach().float().requires_grad_(), weight.detach().float().requires_grad_()
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        out = step(lambda a, b, c: F.cross_entropy(F.linear(a, b), c), h, w, target)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    return tuple(t.detach() for t in out)


def check(fn, inputs, ref) -> tuple[list[float], str]:
    from kernelab.bench.timing import REL_TOL

    out = step(fn, *inputs)
    errs = [rel_err(o.detach(), r) for o, r in zip(out, ref)]
    del out
    bad = [e for e in errs if not e <= REL_TOL[DTYPE]]  # NaN counts as bad
    return errs, "ok" if not bad else f"WRONG (rel err > {REL_TOL[DTYPE]})"


def peak_mib(fn, inputs) -> float:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = step(fn, *inputs)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak / 2**20


def run_case(shape, liger, env: dict, deadline: float, rows: list) -> None:
    from kernelab.bench.timing import time_ms

    n, h, v = shape
    device = torch.device("cuda")
    inputs = make_inputs(n, h, v, device)
    ref = reference(*inputs)
    for name, entry in providers(n, h, v, liger).items():
        row = dict(env, dtype="bf16", shape=f"{n}x{h}x{v}", provider=name, chunk_rows="", ms="", peak_mib="",
                   loss_rel_err="", dh_rel_err="", dw_rel_err="")
        rows.append(row)
        if entry is None:
            row["status"] = "not installed"
            continue
        fn, row["chunk_rows"] = entry
        left = deadline - time.monotonic()
        if left <= 0 or (name == "compile" and left < COMPILE_S):
            row["status"] = f"skipped: budget ({max(0.0, left):.0f} s left)"
            continue
        try:
            errs, row["status"] = check(fn, inputs, ref)
            row.update(loss_rel_err=errs[0], dh_rel_err=errs[1], dw_rel_err=errs[2])
            row["peak_mib"] = peak_mib(fn, inputs)
            row["ms"] = time_ms(lambda a, b, c: step(fn, a, b, c), [inputs], warmup_ms=25, rep_ms=150)
        except Exception as e:  # noqa: BLE001 - one provider's failure (OOM, compile) must not stop the rest
            row["status"] = f"error: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
        torch.cuda.empty_cache()
        print(f"  {row['shape']:>20s} {name:22s} {_fmt(row['ms'])} ms  {_fmt(row['peak_mib'])} MiB  {row['status']}",
              flush=True)
    del inputs, ref
    torch.cuda.empty_cache()


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def write_csv(rows: list, out_dir: Path) -> Path:
    path = out_dir / "linear_ce.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: _fmt(r.get(k, "")) for k in FIELDS})
    return path


def print_table(rows: list) -> None:
    """One line per shape and provider; x ms / x MiB: kernelab's ratio to that provider (<1: kernelab better)."""
    by_shape: dict = {}
    for r in rows:
        by_shape.setdefault(r["shape"], {})[r["provider"]] = r
    head = f"{'N x H x V':>20s} {'provider':22s} {'rows':>6s} {'ms':>8s} {'peak MiB':>9s} {'kl/ms':>6s} {'kl/MiB':>6s} " \
           f"{'loss err':>9s} {'dW err':>9s}  status"
    print("\nlinear_cross_entropy, bf16, forward+backward (loss + d hidden + d weight); kl/x = kernelab / provider")
    print(head)
    for shape, by in by_shape.items():
        k = by.get("kernelab", {})
        for name, r in by.items():
            ratio_ms = _ratio(k.get("ms"), r.get("ms"))
            ratio_mem = _ratio(k.get("peak_mib"), r.get("peak_mib"))
            print(f"{shape:>20s} {name:22s} {_fmt(r['chunk_rows']):>6s} {_fmt(r['ms']):>8s} {_fmt(r['peak_mib']):>9s} "
                  f"{ratio_ms:>6s} {ratio_mem:>6s} {_fmt(r['loss_rel_err']):>9s} {_fmt(r['dw_rel_err']):>9s}  {r['status']}")


def _ratio(a, b) -> str:
    return f"{a / b:.2f}" if isinstance(a, float) and isinstance(b, float) and b > 0 else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="directory for linear_ce.csv")
    ap.add_argument("--budget-s", type=float, default=150.0, help="cases that would start later are skipped")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (it times kernels)")
    args.out.mkdir(parents=True, exist_ok=True)
    from kernelab.bench.runner import environment

    deadline = time.monotonic() + args.budget_s
    env = environment(torch.device("cuda"))
    liger = liger_loss()
    print(f"{env['gpu']}  torch {env['torch']}  triton {env['triton']}  liger {env['liger']}  {env['date']}", flush=True)
    rows: list = []
    for shape in SHAPES:
        run_case(shape, liger, env, deadline, rows)
    path = write_csv(rows, args.out)
    skipped = sum(r["status"].startswith("skipped") for r in rows)
    print_table(rows)
    if skipped:
        print(f"{skipped} cases skipped: the {args.budget_s:.0f} s budget ran out")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
