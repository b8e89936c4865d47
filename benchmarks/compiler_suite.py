#!/usr/bin/env python
"""kernelab's compiler against eager PyTorch and Inductor, in one run, on one GPU.

    python benchmarks/compiler_suite.py OUT_DIR [--budget-s 300] [--dry]

For every program (pointwise chains, broadcasting, casts, hand-written softmax / norms / GELU,
forward+backward, an MLP block training step, a transformer block) at sizes from 1e4 to 1e9
elements and in bf16 / fp32:

* correctness: relative L2 error of each mode against eager PyTorch run in float64 (kernelab must
  be within 2x of eager's own error, or under the dtype's tolerance);
* kernels per call: CUDA kernels (and memcpy/memset) seen by torch.profiler for one warm call;
* time: per call of back-to-back calls (the larger of host and GPU time per call, as in a
  training loop), inputs rotated through more than L2 at small sizes, best of five repeats, the
  modes timed in three interleaved rounds (see time_ms, time_modes);
  ratio = Inductor time / kernelab time (> 1: kernelab faster);
* cold compile: first call minus a warm call, with empty Triton / Inductor / kernelab caches at
  process start (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR, KERNELAB_CACHE set by the caller).

Writes OUT_DIR/compiler_suite.csv (GPU, torch/triton versions and date in every row) row by row,
and prints a short table last. ``--dry`` runs tiny sizes on the CPU (interpreter) to check the
script itself.
"""
from __future__ import annotations

import argparse
import copy
import csv
import datetime
import math
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

MODES = ("eager", "inductor", "kernelab")


# ----------------------------------------------------------------------------- programs
def add_relu(a, b):
    return (a + b).relu()


def chain5(x, y):
    return ((x * 2 + 1).sigmoid() * y).tanh() - x


def bias_gelu(x, b):
    return F.gelu(x + b)


def gelu_tanh_affine(x, w, b):
    return F.gelu(x * w + b, approximate="tanh")


def silu_gate(x, g):
    return F.silu(g) * x


def outer_add(col, row):
    return col + row


def where_leaky(x, y):
    return torch.where(x > 0, x, 0.1 * y)


def cast_roundtrip(x):
    return x.to(torch.bfloat16).float() * 2


def scale_shift_clamp(x, s, t):
    return torch.clamp(x * s + t, -1.0, 1.0)


def softmax(x):
    return torch.softmax(x, dim=-1)


def softmax_manual(x):
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


def log_softmax(x):
    return torch.log_softmax(x, dim=-1)


def masked_scaled_softmax(x, mask):
    return torch.softmax(x * 0.125 + mask, dim=-1)


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


def layer_norm_manual(x, w, b):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) * torch.rsqrt(var + 1e-5) * w + b


def rms_norm(x, w):
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w


def row_var_mean(x):
    return x.var(-1) + x.mean(-1)


def column_sum(x, w):
    return (x * w).sum(0)


def center_scale(x):
    m = x.mean(-1, keepdim=True)
    return (x - m) / (x.std(-1, keepdim=True) + 1e-5)


class MLPBlock(nn.Module):
    def __init__(self, dim=1024, hidden=4096):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


def _transformer():
    from kernelab.programs import TransformerBlock

    return TransformerBlock(512, 8)


def upsample_bilinear(x):
    return F.interpolate(x, scale_factor=2, mode="bilinear")


def upsample_nearest(x):
    return F.interpolate(x, scale_factor=2, mode="nearest")


def R(*shape, scale=1.0, offset=0.0):
    return lambda dtype, device: (torch.randn(*shape, device=device) * scale + offset).to(dtype)


# name -> (target, arg makers, sizes: list of shape-dicts, dtypes, backward?)
def programs(dry: bool):
    small, mid, big = ((8, 64), (16, 200), (64, 1000)) if dry else ((64, 256), (4096, 1024), (16384, 8192))
    vec = [1000, 4099] if dry else [10_000, 1_000_003, 100_000_000, 100_000_007, 1_000_000_000]
    bf, f32 = torch.bfloat16, torch.float32
    P = {}

    def add(name, target, makers_of, shapes, dtypes=(bf, f32), backward=False):
        P[name] = (target, makers_of, shapes, dtypes, backward)

    # sweeps over size: the pointwise chain from 1e4 to 1e9 elements, softmax rows short to long
    add("add_relu", add_relu, lambda s: [R(s), R(s)], [(n,) for n in vec], dtypes=(bf,))
    add("add_relu_fp32", add_relu, lambda s: [R(s), R(s)], [(vec[-2],)], dtypes=(f32,))
    add("softmax", softmax, lambda s: [R(*s, scale=3)], [small, mid, (1024, 32768) if not dry else (4, 5000)],
        dtypes=(bf,))
    add("softmax_fp32", softmax, lambda s: [R(*s, scale=3)], [mid], dtypes=(f32,))
    add("layer_norm", layer_norm, lambda s: [R(*s, offset=1), R(s[-1], offset=1), R(s[-1])], [mid, big],
        dtypes=(bf,))
    add("layer_norm_fp32", layer_norm, lambda s: [R(*s, offset=1), R(s[-1], offset=1), R(s[-1])], [mid],
        dtypes=(f32,))
    add("rms_norm", rms_norm, lambda s: [R(*s), R(s[-1], offset=1)], [mid, big], dtypes=(bf,))
    add("chain5", chain5, lambda s: [R(*s), R(*s)], [small, big], dtypes=(bf,))
    add("bias_gelu", bias_gelu, lambda s: [R(*s), R(s[-1])], [mid], dtypes=(bf,))
    add("gelu_tanh_affine", gelu_tanh_affine, lambda s: [R(*s), R(s[-1]), R(s[-1])], [mid], dtypes=(bf,))
    add("silu_gate", silu_gate, lambda s: [R(*s), R(*s)], [mid], dtypes=(bf,))
    add("outer_add", outer_add, lambda s: [R(s[0], 1), R(s[1])], [big], dtypes=(f32,))
    add("where_leaky", where_leaky, lambda s: [R(*s), R(*s)], [mid], dtypes=(bf,))
    add("cast_roundtrip", cast_roundtrip, lambda s: [R(*s)], [mid], dtypes=(f32,))
    add("scale_shift_clamp", scale_shift_clamp, lambda s: [R(*s), R(s[-1]), R(s[-1])], [mid], dtypes=(bf,))
    add("softmax_manual", softmax_manual, lambda s: [R(*s, scale=3)], [mid], dtypes=(bf,))
    add("log_softmax", log_softmax, lambda s: [R(*s, scale=3)], [mid], dtypes=(bf,))
    add("masked_scaled_softmax", masked_scaled_softmax,
        lambda s: [R(8, s[0] // 8 if not dry else 2, s[1], s[1]), R(1, 1, s[1], s[1])],
        [(64, 512)] if not dry else [(16, 16)], dtypes=(bf,))
    add("layer_norm_manual", layer_norm_manual, lambda s: [R(*s, offset=1), R(s[-1], offset=1), R(s[-1])],
        [mid], dtypes=(bf,))
    add("row_var_mean", row_var_mean, lambda s: [R(*s)], [mid], dtypes=(f32,))
    add("center_scale", center_scale, lambda s: [R(*s)], [mid], dtypes=(bf,))
    add("column_sum", column_sum, lambda s: [R(*s), R(s[-1])], [mid, (4096, 64) if dry else (1 << 20, 64)],
        dtypes=(bf,))
    add("softmax_fwd_bwd", softmax, lambda s: [R(*s, scale=3)], [mid], dtypes=(bf,), backward=True)
    add("layer_norm_fwd_bwd", layer_norm, lambda s: [R(*s, offset=1), R(s[-1], offset=1), R(s[-1])], [mid],
        dtypes=(bf,), backward=True)
    add("rms_norm_fwd_bwd", rms_norm, lambda s: [R(*s), R(s[-1], offset=1)], [mid], dtypes=(bf,), backward=True)
    add("bias_gelu_fwd_bwd", bias_gelu, lambda s: [R(*s), R(s[-1])], [mid], dtypes=(bf,), backward=True)
    add("mlp_block_fwd_bwd", "mlp", lambda s: [R(*s)], [(4096, 1024)] if not dry else [(8, 1024)],
        dtypes=(bf,), backward=True)
    # gathers at proved indices (compiler/bounds.py) and their backward's place scatter-adds
    image = [(16, 64, 128, 128)] if not dry else [(2, 3, 5, 6)]
    add("upsample_bilinear", upsample_bilinear, lambda s: [R(*s)], image, dtypes=(bf, f32))
    add("upsample_nearest", upsample_nearest, lambda s: [R(*s)], image, dtypes=(bf,))
    add("upsample_bilinear_fwd_bwd", upsample_bilinear, lambda s: [R(*s)], image, dtypes=(f32,), backward=True)
    add("transformer_block", "transformer", lambda s: [R(*s)], [(4, 512, 512)] if not dry else [(1, 8, 512)],
        dtypes=(bf,))
    return P


def build(target, dtype, device):
    if target == "mlp":
        torch.manual_seed(0)
        return MLPBlock().to(device, dtype)
    if target == "transformer":
        torch.manual_seed(0)
        return _transformer().to(device, dtype)
    return target


# ----------------------------------------------------------------------------- measuring
def make_step(fn, backward: bool, params):
    """The timed callable: forward, or forward + gradients of every float input and parameter."""
    if not backward:
        return lambda *a: fn(*a)

    grad_outs = {}

    def step(*a):
        out = fn(*a)
        leaves = [t for t in a if t.requires_grad] + params
        key = (tuple(out.shape), out.dtype)
        if key not in grad_outs:  # made once (untimed after warm-up), deterministic
            g = torch.Generator(device=out.device).manual_seed(7)
            grad_outs[key] = torch.randn(out.shape, generator=g, device=out.device).to(out.dtype) * 0.01
        return (out,) + torch.autograd.grad(out, leaves, grad_outs[key])
    return step


def as_tuple(out):
    return out if isinstance(out, (tuple, list)) else (out,)


def rel_err(out, ref) -> float:
    worst = 0.0
    for o, r in zip(as_tuple(out), as_tuple(ref)):
        o, r = o.detach().double(), r.detach().double()
        fin = torch.isfinite(r)
        if o.shape != r.shape or not bool(torch.isfinite(o[fin]).all()):
            return math.inf
        worst = max(worst, float((o[fin] - r[fin]).norm() / r[fin].norm().clamp_min(1e-30)))
    return worst


def count_kernels(step, args) -> int:
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step(*args)
            torch.cuda.synchronize()
        return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    except Exception:  # noqa: BLE001 - the count is a column, not the run
        return -1


def time_ms(step, input_sets, target_s: float = 0.03) -> float:
    """Milliseconds per call of back-to-back calls, as a training or inference loop runs them:
    the host queues call i+1 while the GPU runs call i, so a call costs the larger of its host
    time and its GPU time. Input sets rotate through more than the L2 cache. One repeat lasts
    about ``target_s``; the best of five is kept (a shared host's hiccups only ever add time)."""
    sync = torch.cuda.synchronize
    for i in range(3):
        step(*input_sets[i % len(input_sets)])
    sync()
    t0 = time.perf_counter()
    step(*input_sets[0])
    sync()
    n = max(5, min(2000, int(target_s / max(time.perf_counter() - t0, 1e-6))))
    best = math.inf
    for _ in range(5):
        sync()
        t0 = time.perf_counter()
        for i in range(n):
            step(*input_sets[i % len(input_sets)])
        sync()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e3


def run_mode(mode, target, makers, shape, dtype, backward, device, dry):
    module = build(target, dtype, device)
    if mode == "eager":
        fn = module
    elif mode == "inductor":
        fn = torch.compile(module)
    else:
        import kernelab.compiler as klc

        fn = klc.compile(module)
    params = list(module.parameters()) if isinstance(module, nn.Module) else []
    step = make_step(fn, backward, params)
    torch.manual_seed(1)
    args = [m(dtype, device).requires_grad_(backward and dtype.is_floating_point) for m in makers]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as said:  # a group that fell back to ATen says so
        warnings.simplefilter("always")
        out = step(*args)
        sync()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    step(*args)
    sync()
    warm = time.perf_counter() - t0
    row = {"first_call_s": first, "compile_s": max(first - warm, 0.0),
           "note": "; ".join(sorted({str(w.message)[:120] for w in said if "kernelab" in str(w.message)}))}
    if device.type == "cuda":
        nbytes = sum(a.numel() * a.element_size() for a in args)
        sets = [args] + [[m(dtype, device).requires_grad_(backward) for m in makers]
                         for _ in range(max(0, min(8, math.ceil(120e6 / max(nbytes, 1))) - 1))]
        row["kernels"] = count_kernels(step, args)
        outb = sum(o.numel() * o.element_size() for o in as_tuple(out) if isinstance(o, torch.Tensor))
        row["_timer"] = (step, sets, (nbytes + outb) if not backward else None)
    return out, args, module, row


def time_modes(results: dict, rounds: int = 3) -> None:
    """Time every mode of one config in interleaved rounds and keep each mode's best time: at
    sizes where a call costs what its host code costs, a shared host's hiccups move single
    timings by tens of microseconds, and interleaving spreads them over all modes alike. The
    cyclic garbage collector is paused while timing (it pauses every mode alike otherwise)."""
    import gc

    timers = {m: r.pop("_timer") for m, r in results.items() if "_timer" in r}
    best = {m: math.inf for m in timers}
    gc.collect()
    gc.disable()
    try:
        for _ in range(rounds):
            for m, (step, sets, _) in timers.items():
                best[m] = min(best[m], time_ms(step, sets))
    finally:
        gc.enable()
    for m, (_, _, nbytes) in timers.items():
        results[m]["ms"] = best[m]
        results[m]["gbps"] = nbytes / (best[m] * 1e-3) / 1e9 if nbytes else float("nan")


def reference(target, makers, dtype, backward, device):
    """Eager PyTorch in float64 on the same (rounded) inputs."""
    module = build(target, dtype, device)
    module64 = copy.deepcopy(module).double() if isinstance(module, nn.Module) else module
    torch.manual_seed(1)
    args = [m(dtype, device).double().requires_grad_(backward) for m in makers]
    params = list(module64.parameters()) if isinstance(module64, nn.Module) else []
    return make_step(module64, backward, params)(*args)


# ----------------------------------------------------------------------------- main
def env_row(device) -> dict:
    import triton

    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "cpu (interpreter)"
    return {"gpu": gpu, "torch": torch.__version__, "triton": triton.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")}


FIELDS = ["program", "shape", "numel", "dtype", "backward", "mode", "ok", "err_vs_fp64", "eager_err_vs_fp64",
          "kernels", "ms", "gbps", "pct_copy_bw", "speedup_vs_inductor", "compile_s", "compile_vs_inductor",
          "note", "gpu", "torch", "triton", "date"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--budget-s", type=float, default=300)
    ap.add_argument("--dry", action="store_true")
    ap.add_argument("--only", nargs="*")
    opts = ap.parse_args()
    start = time.time()
    opts.out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() and not opts.dry else "cpu")
    # every size compiled static, in both compilers
    for key, value in (("automatic_dynamic_shapes", False), ("cache_size_limit", 256),
                       ("accumulated_cache_size_limit", 4096)):
        if hasattr(torch._dynamo.config, key):
            setattr(torch._dynamo.config, key, value)
    env = env_row(device)
    copy_bw = None
    if device.type == "cuda":
        from kernelab.bench.timing import copy_tbps

        copy_bw = copy_tbps(device, gib=2) * 1e3  # GB/s
        print(f"copy bandwidth {copy_bw:.0f} GB/s (read + write)", flush=True)
    path = opts.out / "compiler_suite.csv"
    rows = []
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        writer.writeheader()
        writer.writerow({**{k: "" for k in FIELDS}, "program": "copy_ceiling", "mode": "copy",
                         "gbps": copy_bw or "", **env})
        for name, (target, makers_of, shapes, dtypes, backward) in programs(opts.dry).items():
            if opts.only and name not in opts.only:
                continue
            for shape in shapes:
                for dtype in dtypes:
                    if time.time() - start > opts.budget_s:
                        print(f"budget spent: skipping {name} {shape} {dtype}", flush=True)
                        continue
                    for row in run_config(name, target, makers_of(shape), shape, dtype, backward, device, opts.dry,
                                          copy_bw):
                        row.update(env)
                        writer.writerow({k: row.get(k, "") for k in FIELDS})
                        rows.append(row)
                    f.flush()
    print_table(rows)
    print(f"wrote {path} in {time.time() - start:.0f} s")


def run_config(name, target, makers, shape, dtype, backward, device, dry, copy_bw):
    numel = math.prod(shape) if isinstance(shape, tuple) else shape
    base = {"program": name, "shape": "x".join(map(str, shape)), "numel": numel,
            "dtype": str(dtype).replace("torch.", ""), "backward": backward}
    try:
        ref = reference(target, makers, dtype, backward, device)
    except Exception as exc:  # noqa: BLE001
        ref, note = None, f"fp64 reference failed: {exc!r}"[:200]
    results = {}
    modes = MODES if not dry else ("eager", "kernelab")
    for mode in modes:
        try:
            out, _, _, row = run_mode(mode, target, makers, shape, dtype, backward, device, dry)
            row["err"] = rel_err(out, ref) if ref is not None else float("nan")
            results[mode] = row
        except Exception as exc:  # noqa: BLE001 - one failing mode must not end the run
            results[mode] = {"note": f"{type(exc).__name__}: {exc}"[:300].replace("\n", " ")}
    time_modes(results)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    rows = []
    eager_err = results.get("eager", {}).get("err", float("nan"))
    ind = results.get("inductor", {})
    tol = {torch.float32: 1e-4, torch.bfloat16: 3e-2}.get(dtype, 1e-2)
    for mode, r in results.items():
        err = r.get("err", float("nan"))
        ok = (err <= max(2 * eager_err, tol)) if not math.isnan(err) else False
        row = {**base, "mode": mode, "ok": ok, "err_vs_fp64": _fmt(err), "eager_err_vs_fp64": _fmt(eager_err),
               "kernels": r.get("kernels", ""), "ms": _fmt(r.get("ms")), "gbps": _fmt(r.get("gbps")),
               "compile_s": _fmt(r.get("compile_s")), "note": r.get("note", "")}
        if copy_bw and r.get("gbps") and not math.isnan(r["gbps"]):
            row["pct_copy_bw"] = _fmt(100 * r["gbps"] / copy_bw)
        if mode != "inductor" and r.get("ms") and ind.get("ms"):
            row["speedup_vs_inductor"] = _fmt(ind["ms"] / r["ms"])
        if mode == "kernelab" and r.get("compile_s") is not None and ind.get("compile_s"):
            row["compile_vs_inductor"] = _fmt(r["compile_s"] / ind["compile_s"])
        rows.append(row)
    return rows


def _fmt(v):
    if v is None or v == "":
        return ""
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4g}"
    return v


def print_table(rows):
    kl = [r for r in rows if r["mode"] == "kernelab"]
    ind = {(r["program"], r["shape"], r["dtype"]): r for r in rows if r["mode"] == "inductor"}
    print(f"\n{'program':24s} {'shape':>14s} {'dtype':>8s} ok  k/ind  kl_ms   x_ind  %bw  cold_kl cold_ind")
    speedups = []
    for r in kl:
        i = ind.get((r["program"], r["shape"], r["dtype"]), {})
        sp = r.get("speedup_vs_inductor", "")
        if sp not in ("", "nan"):
            speedups.append(float(sp))
        print(f"{r['program'][:24]:24s} {r['shape'][:14]:>14s} {r['dtype']:>8s} {'y' if r['ok'] else 'N'}  "
              f"{r.get('kernels', '')!s:>2s}/{i.get('kernels', '')!s:<2s} {r.get('ms', '')!s:>7s} {sp!s:>6s} "
              f"{r.get('pct_copy_bw', '')!s:>5s} {r.get('compile_s', '')!s:>7s} {i.get('compile_s', '')!s:>7s} "
              f"{r.get('note', '')[:60]}")
    if speedups:
        geo = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
        print(f"geomean speed vs Inductor: {geo:.3f}x over {len(speedups)} configs; min {min(speedups):.3f}x")


if __name__ == "__main__":
    main()
