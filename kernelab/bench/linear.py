"""kernelab.ops.linear and swiglu_linear against cuBLAS, eager PyTorch and torch.compile, on a CUDA GPU (bf16).

    kernelab bench linear [--out DIR] [--budget-s 150] [--max-autotune]
    python3 benchmarks/linear_bench.py OUT_DIR [--budget-s 150] [--max-autotune]   (the same, from a checkout)

1. the ceiling: torch.mm 8192^3 in bf16, TFLOP/s, the faster of a measurement before and one
   after the run (the H200's clocks drift by ~5 % over a run); every figure is also a % of it;
2. checks: every epilogue, forward and backward, swiglu_linear, on odd shapes (M, N, K not
   multiples of the tiles, M = 1..16) against a float32 reference (relative L2 error);
3. the grid, shape by shape (issue 14's model shapes, down projections, squares, decode rows):
   a tune over kernelab's configuration table (gelu + bias epilogue, each config checked first;
   the best one and the tuning time are reported), then every provider checked and timed:
   ours (none, gelu+bias, silu, residual), cuBLAS's plain product (torch.mm), eager
   F.linear + F.gelu, torch.compile (default mode) of that eager function, timed in 3
   interleaved rounds (median; "spread" = the largest (max - min) / median of the shape's rows:
   differences below it are noise);
4. forward+backward of gelu+bias (kernelab.ops.linear vs eager), swiglu_linear vs two cuBLAS
   products + silu * up (eager; Liger's silu_mul when installed).

FLOPs: 2 M N K a product (x3 forward+backward, x2 for the dual GEMM). Decode rows also get GB/s
(weight + x + y bytes). Cases that would start after --budget-s are written as skipped. Writes
OUT_DIR/linear_bench.csv (GPU, torch/triton versions and date in every row); prints a table last.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import math
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import kernelab.ops as K
from kernelab.errors import KernelabError
from kernelab.bench.runner import environment
from kernelab.bench.timing import REL_TOL, compare, time_ms
from kernelab.ops import gemm

LINEAR = sys.modules["kernelab.ops.linear"]
POINTWISE = sys.modules["kernelab.ops.pointwise"]  # the module (kernelab.ops.linear the attribute is the function)

DT = torch.bfloat16
#: (M, K, N): tokens x (hidden -> 4x hidden, gate/up -> intermediate), down projections, squares, decode
GRID = [(8192, 4096, 11008), (8192, 768, 3072), (8192, 4096, 14336), (8192, 5120, 13824), (8192, 11008, 4096),
        (8192, 3072, 768), (8192, 13824, 5120), (4096, 4096, 4096), (8192, 8192, 8192), (1, 8192, 28672),
        (16, 8192, 28672)]
#: the epilogue section: shapes, configurations, activation codes (all with the bias but "none")
EPILOGUE_SHAPES = [(8192, 8192, 8192), (8192, 4096, 11008), (8192, 768, 3072)]
EPILOGUE_CONFIGS = [gemm.GemmConfig(128, 256, 64, 8, 8, 3, flatten=True),
                    gemm.GemmConfig(128, 128, 64, 8, 8, 3, programs_per_sm=2, tma_store=True)]
EPILOGUE_ACTS = {"none": gemm.NONE.value, "bias": gemm.NONE.value, "relu": POINTWISE.RELU.value,
                 "silu": POINTWISE.SILU.value, "gelu erf (libdevice)": POINTWISE.GELU.value,
                 "gelu fast": POINTWISE.GELU_FAST.value, "gelu tanh": POINTWISE.GELU_TANH.value}
#: shapes also timed under Inductor's max-autotune (``--max-autotune``: every grid shape, ~10-40 s of tuning each)
MAX_AUTOTUNE = list(GRID)
FWD_BWD = [(8192, 4096, 11008), (8192, 768, 3072), (8192, 11008, 4096), (8192, 4096, 14336)]
SWIGLU_FWD_BWD = [(8192, 4096, 11008), (8192, 2048, 8192)]
SWIGLU = [(8192, 4096, 11008), (8192, 4096, 14336), (16, 4096, 14336)]
#: odd shapes (few: each new specialization of M, N, K compiles every kernel again)
CHECKS = [(7, 100, 129), (1000, 777, 1200)]
#: ``--smoke``: the whole script on CPU tensors under TRITON_INTERPRET=1, tiny shapes, wall-clock timer
SMOKE = {"GRID": [(40, 48, 72), (3, 64, 40)], "FWD_BWD": [(40, 48, 72)], "SWIGLU": [(40, 48, 72)],
         "EPILOGUE_SHAPES": [(40, 48, 72)],
         "SWIGLU_FWD_BWD": [(40, 48, 72)],
         "CHECKS": [(7, 20, 33)], "CEILING": 64}
DEVICE = "cuda"
CEILING = 8192
#: the epilogues every candidate configuration is timed with
TUNE_EPILOGUES = ("gelu+bias", "none")
EPILOGUES = {  # name -> (gemm.gemm keyword arguments given (bias, residual), the activation name)
    "none": (lambda b, r: {}, "none"),
    "gelu+bias": (lambda b, r: {"bias": b}, "gelu"),
    "silu": (lambda b, r: {}, "silu"),
    "residual": (lambda b, r: {"residual": r}, "none"),
}


def use_shapes(shapes: list) -> None:
    """``--shapes``: these shapes in every section (decode rows forward only), no epilogue study."""
    global GRID, FWD_BWD, SWIGLU, SWIGLU_FWD_BWD, EPILOGUE_SHAPES, MAX_AUTOTUNE
    GRID = SWIGLU = MAX_AUTOTUNE = list(shapes)
    FWD_BWD = SWIGLU_FWD_BWD = [s for s in shapes if s[0] > 16]
    EPILOGUE_SHAPES = []


class Budget:
    def __init__(self, seconds: float):
        self.start, self.seconds = time.time(), seconds

    def left(self) -> float:
        return self.seconds - (time.time() - self.start)


def inputs(m, k, n, seed=0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    x = torch.randn(m, k, device=DEVICE, generator=g).to(DT)
    w = (torch.randn(n, k, device=DEVICE, generator=g) / k**0.5).to(DT)
    b = (torch.randn(n, device=DEVICE, generator=g) * 0.5).to(DT)
    r = torch.randn(m, n, device=DEVICE, generator=g).to(DT)
    return x, w, b, r


def reference(x, w, b, r, epilogue):
    """float32 reference of one epilogue, from the same bf16 inputs."""
    kwargs, act = EPILOGUES[epilogue]
    kw = kwargs(b.float(), r.float())
    y = LINEAR.ACTIVATIONS[act](F.linear(x.float(), w.float(), kw.get("bias")))
    return y + kw["residual"] if "residual" in kw else y


def ours(x, w, b, r, epilogue, config):
    kwargs, act = EPILOGUES[epilogue]
    fn = lambda: gemm.gemm(x, w, act=gemm.code_for(act, DT), config=config, **kwargs(b, r))[0]  # noqa: E731
    return fn


def eager_gelu_bias(x, w, b):
    return F.gelu(F.linear(x, w, b))


def wall_ms(fn, input_sets, warmup_ms=0, rep_ms=0) -> float:
    """``--smoke``'s timer (no GPU: do_bench needs CUDA events): one call, wall clock."""
    start = time.perf_counter()
    fn(*input_sets[0])
    return (time.perf_counter() - start) * 1e3


TIMER = time_ms


def tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12


# --------------------------------------------------------------------------- sections
def ceiling_tflops() -> float:
    a = torch.randn(CEILING, CEILING, device=DEVICE, dtype=DT)
    ms = TIMER(lambda: torch.mm(a, a), [()], warmup_ms=25, rep_ms=200)
    return tflops(2 * CEILING**3, ms)


def checks(rows: list):
    """Every epilogue forward and backward, and swiglu_linear, on odd shapes (kernelab only)."""
    for m, k, n in CHECKS:
        x, w, b, r = inputs(m, k, n, seed=1)
        for epilogue in EPILOGUES:
            kwargs, act = EPILOGUES[epilogue]
            ref_in = [t.float().requires_grad_() for t in (x, w, b, r)]
            ours_in = [t.clone().requires_grad_() for t in (x, w, b, r)]
            kw = kwargs(True, True)
            y = K.linear(ours_in[0], ours_in[1], ours_in[2] if "bias" in kw else None, act,
                         ours_in[3] if "residual" in kw else None)
            y_ref = reference(*ref_in, epilogue)
            dy = torch.randn_like(y)
            used = [i for i in range(4) if i < 2 or (i == 2 and "bias" in kw) or (i == 3 and "residual" in kw)]
            got = torch.autograd.grad(y, [ours_in[i] for i in used], dy)
            want = torch.autograd.grad(y_ref, [ref_in[i] for i in used], dy.float())
            err = max(compare(y, y_ref), compare(list(got), list(want)))
            rows.append(row("check", (m, k, n), "kernelab", epilogue + " fwd+bwd", rel_err=err,
                            status="ok" if err <= REL_TOL[DT] else "WRONG"))
        wg, wu = w.clone(), inputs(m, k, n, seed=2)[1]
        y = K.swiglu_linear(x, wg, wu)
        err = compare(y, F.silu(F.linear(x.float(), wg.float())) * F.linear(x.float(), wu.float()))
        rows.append(row("check", (m, k, n), "kernelab", "swiglu fwd", rel_err=err,
                        status="ok" if err <= REL_TOL[DT] else "WRONG"))


def tune(x, w, b, r):
    """(best config, its ms, seconds spent, [(config, epilogue, ms or error)]): every candidate
    timed with the gelu+bias epilogue and without one; the best by gelu+bias."""
    start = time.time()
    results = []
    for epilogue in TUNE_EPILOGUES:
        ref = reference(x, w, b, r, epilogue)
        for config in gemm.candidates(x.shape[0], w.shape[0], False, DT, x.device):
            fn = ours(x, w, b, r, epilogue, config)
            try:
                err = compare(fn(), ref)
                ms = TIMER(fn, [()]) if err <= REL_TOL[DT] else f"wrong (rel err {err:.2g})"
            except Exception as e:  # noqa: BLE001 - a config that does not compile or launch: recorded
                ms = f"error: {type(e).__name__}: {str(e)[:120]}"
            results.append((config, epilogue, ms))
    timed = [(c, ms) for c, e, ms in results if isinstance(ms, float) and e == "gelu+bias"]
    best = min(timed, key=lambda t: t[1]) if timed else (None, None)
    return best[0], best[1], time.time() - start, results


def grid_shape(rows: list, shape, ceiling: float, compiled, max_autotune=None):
    m, k, n = shape
    x, w, b, r = inputs(m, k, n)
    flops, bytes_ = 2 * m * n * k, (n * k + m * k + m * n) * 2
    config, _, tune_s, tried = tune(x, w, b, r)
    for cfg, epilogue, ms in tried:
        rows.append(row("tune", shape, "kernelab", epilogue, ms=ms if isinstance(ms, float) else None,
                        config=cfg_str(cfg), status="ok" if isinstance(ms, float) else ms, flops=flops,
                        ceiling=ceiling, bytes_=bytes_))
    if config is None:
        return
    providers = {f"kernelab {e}": (ours(x, w, b, r, e, config), e) for e in EPILOGUES}
    providers["cuBLAS mm"] = (lambda: torch.mm(x, w.t()), "none")
    providers["eager"] = (lambda: eager_gelu_bias(x, w, b), "gelu+bias")
    providers["compile"] = (lambda: compiled(x, w, b), "gelu+bias")
    autotune_s = None
    if max_autotune is not None:  # its first call tunes: timed apart, reported as tune_s
        start = time.time()
        try:
            max_autotune(x, w, b)
            torch.cuda.synchronize()
            providers["compile max-autotune"] = (lambda: max_autotune(x, w, b), "gelu+bias")
        except Exception as e:  # noqa: BLE001 - recorded, the run goes on
            rows.append(row("fwd", shape, "compile max-autotune", "gelu+bias",
                            status=f"error: {type(e).__name__}: {e}"[:200]))
        autotune_s = time.time() - start
    entries = [(name, epilogue, fn, lambda e=epilogue: reference(x, w, b, r, e),
                cfg_str(config) if name.startswith("kernelab") else "",
                tune_s if name.startswith("kernelab") else autotune_s if "max-autotune" in name else None)
               for name, (fn, epilogue) in providers.items()]
    rows.extend(measure_rounds("fwd", shape, entries, flops, ceiling, bytes_))


def epilogue_shape(rows: list, shape, ceiling: float):
    """What each epilogue costs (bias with every activation code, none without): the same
    configurations, so the differences are the epilogue's alone (GELU by the erfc fit 16-bit inputs
    take and by libdevice's erf, tanh, SiLU, ReLU)."""
    m, k, n = shape
    x, w, b, r = inputs(m, k, n)
    flops, bytes_ = 2 * m * n * k, (n * k + m * k + m * n) * 2
    entries = []
    for config in EPILOGUE_CONFIGS:
        for name, act in EPILOGUE_ACTS.items():
            bias = None if name == "none" else b
            fn = lambda act=act, bias=bias, c=config: gemm.gemm(x, w, bias=bias, act=act, config=c)[0]  # noqa: E731
            entries.append(("kernelab", name, fn, None, cfg_str(config), None))
    rows.extend(measure_rounds("epilogue", shape, entries, flops, ceiling, bytes_))


def fwd_bwd_shape(rows: list, shape, ceiling: float):
    m, k, n = shape
    x, w, b, r = inputs(m, k, n)
    dy = torch.randn(m, n, device=DEVICE, dtype=DT)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    ref_leaves = [t.float().requires_grad_() for t in (x, w, b)]
    ref_out = F.gelu(F.linear(*ref_leaves))
    ref = (ref_out.detach(), *torch.autograd.grad(ref_out, ref_leaves, dy.float()))
    providers = {f"kernelab ({engine} products)": (lambda: K.linear(*leaves, "gelu"), engine) for engine in ENGINES}
    providers["eager"] = (lambda: eager_gelu_bias(*leaves), None)
    providers["cuBLAS 3x mm"] = (lambda: (torch.mm(x, w.t()), torch.mm(dy, w), torch.mm(dy.t(), x)), None)
    for name, (f, engine) in providers.items():
        def step(f=f):
            y = f()
            return (y.detach(), *torch.autograd.grad(y, leaves, dy))

        run = step if engine or name == "eager" else f
        with engines(engine):
            rows.append(measure("fwd+bwd", shape, name, "gelu+bias", run, (lambda: ref) if run is step else None,
                                3 * 2 * m * n * k, ceiling, None))


def swiglu_fwd_bwd_shape(rows: list, shape, ceiling: float, liger_silu_mul):
    """SwiGLU forward + backward (x, w_gate, w_up with gradients): ours by both product engines,
    eager, Liger's silu_mul between two F.linear."""
    m, k, n = shape
    x, wg, _, _ = inputs(m, k, n)
    wu = inputs(m, k, n, seed=3)[1]
    dy = torch.randn(m, n, device=DEVICE, dtype=DT)
    leaves = [t.clone().requires_grad_() for t in (x, wg, wu)]
    refs = [t.float().requires_grad_() for t in (x, wg, wu)]
    ref_out = F.silu(F.linear(refs[0], refs[1])) * F.linear(refs[0], refs[2])
    ref = (ref_out.detach(), *torch.autograd.grad(ref_out, refs, dy.float()))
    providers = {f"kernelab ({engine} products)": (lambda: K.swiglu_linear(*leaves), engine) for engine in ENGINES}
    providers["eager"] = (lambda: F.silu(F.linear(leaves[0], leaves[1])) * F.linear(leaves[0], leaves[2]), None)
    if liger_silu_mul is not None:
        providers["liger"] = (lambda: liger_silu_mul(F.linear(leaves[0], leaves[1]), F.linear(leaves[0], leaves[2])),
                              None)
    for name, (f, engine) in providers.items():
        def step(f=f):
            y = f()
            return (y.detach(), *torch.autograd.grad(y, leaves, dy))

        with engines(engine):
            rows.append(measure("swiglu fwd+bwd", shape, name, "silu*up", step, lambda: ref, 3 * 4 * m * n * k,
                                ceiling, None))


#: the engines of ``gemm.plain`` (the backward's products without an epilogue)
ENGINES = ("cublas", "triton")


@contextlib.contextmanager
def engines(engine):
    """``gemm.PLAIN_PRODUCTS`` set to ``engine`` inside (None: left as it is)."""
    saved = gemm.PLAIN_PRODUCTS
    gemm.PLAIN_PRODUCTS = engine or saved
    try:
        yield
    finally:
        gemm.PLAIN_PRODUCTS = saved


def swiglu_shape(rows: list, shape, ceiling: float, liger_silu_mul):
    m, k, n = shape
    x, wg, _, _ = inputs(m, k, n)
    wu = inputs(m, k, n, seed=3)[1]
    ref = lambda: F.silu(F.linear(x.float(), wg.float())) * F.linear(x.float(), wu.float())  # noqa: E731
    providers = {"kernelab": lambda: K.swiglu_linear(x, wg, wu),
                 "eager": lambda: F.silu(F.linear(x, wg)) * F.linear(x, wu),
                 "cuBLAS 2x mm": lambda: (torch.mm(x, wg.t()), torch.mm(x, wu.t()))[1]}
    if liger_silu_mul is not None:
        providers["liger"] = lambda: liger_silu_mul(F.linear(x, wg), F.linear(x, wu))
    for config in gemm.candidates(m, n, True, DT, x.device):  # the dual GEMM's configurations
        run = lambda c=config: gemm.gemm(x, wg, b2=wu, config=c)[0]  # noqa: E731
        rows.append(measure("tune dual", shape, "kernelab", "silu*up", run, ref, 4 * m * n * k, ceiling, None,
                            config=cfg_str(config)))
    for name, fn in providers.items():
        check = None if name == "cuBLAS 2x mm" else ref
        rows.append(measure("swiglu fwd", shape, name, "silu*up", fn, check, 4 * m * n * k, ceiling,
                            (2 * n * k + m * k + m * n) * 2))


# --------------------------------------------------------------------------- compiling ahead
def warm_items() -> list:
    """(proxy shape, epilogue, config) for every kernel the grid's tune and providers may launch.
    Triton specializes M, N, K only on == 1 and % 16, so a 256-sized proxy compiles the same
    binary as the grid's shape (all multiples of 16; M = 1 kept as 1)."""
    items = {}
    for m, k, n in GRID:
        proxy = (1 if m == 1 else 256, 256, 256)
        for config in gemm.candidates(m, n, False, DT, torch.device(DEVICE)):
            for epilogue in EPILOGUES:
                items[(proxy, epilogue, config)] = None
    return list(items)


def warm(part: int, parts: int) -> None:
    """``--warm-part``: launch this worker's share of ``warm_items`` once (fills Triton's cache)."""
    for i, (shape, epilogue, config) in enumerate(warm_items()):
        if i % parts == part:
            ours(*inputs(*shape), epilogue, config)()
    torch.cuda.synchronize()


def start_warm_workers(out: Path, parts: int) -> list:
    return [subprocess.Popen([sys.executable, "-m", "kernelab.bench.linear", str(out), "--warm-part", str(i),
                              "--warm-parts", str(parts)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for i in range(parts)]


# --------------------------------------------------------------------------- measuring and rows
def measure(section, shape, provider, epilogue, fn, ref, flops, ceiling, bytes_, config="", tune_s=None):
    """Check ``fn`` against ``ref()`` (when given), then time it; errors become the row's status."""
    try:
        err = compare(fn(), ref()) if ref is not None else None
        if err is not None and err > REL_TOL[DT]:
            return row(section, shape, provider, epilogue, rel_err=err, status="WRONG", config=config)
        ms = TIMER(fn, [()])
    except Exception as e:  # noqa: BLE001 - one provider failing must not end the run
        return row(section, shape, provider, epilogue, status=f"error: {type(e).__name__}: {str(e)[:160]}")
    return row(section, shape, provider, epilogue, ms=ms, rel_err=err, config=config, tune_s=tune_s, flops=flops,
               ceiling=ceiling, bytes_=bytes_)


def measure_rounds(section, shape, entries, flops, ceiling, bytes_) -> list:
    """Rows for ``entries`` [(provider, epilogue, fn, ref or None, config, tune_s)]: each checked
    once, then timed in ROUNDS interleaved rounds (every entry once a round): ``ms`` is the median
    of its rounds and ``spread`` (max - min) / median. The H200's clocks drift by several percent
    within a run; rounds put every entry under the same drift, and the spread says how large a
    difference between two entries must be to mean something (METHOD.md: time twice)."""
    out, timed = [], []
    for provider, epilogue, fn, ref, config, tune_s in entries:
        try:
            err = compare(fn(), ref()) if ref is not None else None
        except Exception as e:  # noqa: BLE001 - one provider failing must not end the run
            out.append(row(section, shape, provider, epilogue, status=f"error: {type(e).__name__}: {str(e)[:160]}",
                           config=config))
            continue
        if err is not None and err > REL_TOL[DT]:
            out.append(row(section, shape, provider, epilogue, rel_err=err, status="WRONG", config=config))
            continue
        timed.append((provider, epilogue, fn, err, config, tune_s, []))
    for _ in range(ROUNDS):
        for entry in timed:
            entry[-1].append(TIMER(entry[2], [()]))
    for provider, epilogue, fn, err, config, tune_s, times in timed:
        ms = sorted(times)[len(times) // 2]
        r = row(section, shape, provider, epilogue, ms=ms, rel_err=err, config=config, tune_s=tune_s, flops=flops,
                ceiling=ceiling, bytes_=bytes_)
        r["spread"] = (max(times) - min(times)) / ms
        out.append(r)
    return out


#: timing rounds of ``measure_rounds`` (``--smoke``: 1)
ROUNDS = 3
ENV: dict = {}


def row(section, shape, provider, epilogue, ms=None, rel_err=None, status="ok", config="", tune_s=None, flops=None,
        ceiling=None, bytes_=None):
    m, k, n = shape
    tf = tflops(flops, ms) if ms and flops else None
    return {**ENV, "section": section, "shape": f"{m}x{k}->{n}", "M": m, "K": k, "N": n, "provider": provider,
            "epilogue": epilogue, "ms": ms, "tflops": tf, "pct_ceiling": 100 * tf / ceiling if tf and ceiling else None,
            "gbps": bytes_ / (ms * 1e-3) / 1e9 if ms and bytes_ else None, "rel_err": rel_err, "config": config,
            "tune_s": tune_s, "status": status}


def cfg_str(c) -> str:
    if c is None:
        return ""
    flags = "".join(f" {f}" for f, on in (("p2", c.programs_per_sm == 2), ("flat", c.flatten), ("tmastore", c.tma_store))
                    if on)
    return f"{c.block_m}x{c.block_n}x{c.block_k} g{c.group_m} w{c.num_warps} s{c.num_stages}{flags}"


def skipped(rows, section, shape, why):
    rows.append(row(section, shape, "all", "", status=f"skipped: {why}"))


# --------------------------------------------------------------------------- output
def write_csv(rows: list, out: Path) -> Path:
    path = out / "linear_bench.csv"
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else "" if v is None else v) for k, v in r.items()})
    return path


#: the forward providers of the plot, in bar order (CSV provider -> legend)
PLOTTED = {"cuBLAS mm": "cuBLAS plain product", "eager": "eager gelu(F.linear)", "compile": "torch.compile",
           "compile max-autotune": "torch.compile max-autotune", "kernelab none": "kernelab, no epilogue",
           "kernelab gelu+bias": "kernelab gelu+bias"}


def plot(rows: list, path: Path) -> Path:
    """Grouped bars, TFLOP/s of the forward per grid shape (decode rows left out: memory-bound,
    another scale), one bar per provider of ``PLOTTED``; GPU and date in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fwd = [r for r in rows if r["section"] == "fwd" and r.get("tflops") and int(r["M"]) > 16]
    shapes = list(dict.fromkeys(r["shape"] for r in fwd))
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(shapes)), 4.5))
    width = 0.8 / len(PLOTTED)
    for i, (provider, label) in enumerate(PLOTTED.items()):
        by = {r["shape"]: float(r["tflops"]) for r in fwd if r["provider"] == provider}
        xs = [j + i * width for j, s in enumerate(shapes) if s in by]
        ax.bar(xs, [by[s] for s in shapes if s in by], width, label=label)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(shapes))], shapes, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("TFLOP/s (forward)")
    first = rows[0] if rows else {}
    ax.set_title(f"kernelab.ops.linear vs cuBLAS and Inductor: {first.get('gpu', '')} {first.get('dtype', '')} "
                 f"torch {first.get('torch', '')} triton {first.get('triton', '')} {str(first.get('date', ''))[:10]}",
                 fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def read_csv(path: Path) -> list:
    """Rows of a CSV this script wrote (numbers as floats, empty cells as None)."""
    def value(v):
        if v == "":
            return None
        try:
            return float(v)
        except ValueError:
            return v

    with path.open() as f:
        return [{k: (value(v) if k not in ("shape", "config", "status", "provider") else v) for k, v in r.items()}
                for r in csv.DictReader(f)]


def tune_summary(rows: list) -> None:
    """Per configuration and epilogue: geomean over the shapes it ran of its time against the best
    configuration's of that shape (1.00 = best everywhere), and the shapes where it was best."""
    tuned = [r for r in rows if r["section"] == "tune" and r["ms"]]
    best = {}
    for r in tuned:
        key = (r["shape"], r["epilogue"])
        best[key] = min(best.get(key, r["ms"]), r["ms"])
    print("\nconfigurations (tune): geomean of best/this over shapes, shapes won")
    for epilogue in TUNE_EPILOGUES:
        for config in dict.fromkeys(r["config"] for r in tuned if r["epilogue"] == epilogue):
            mine = [r for r in tuned if r["epilogue"] == epilogue and r["config"] == config]
            score = math.exp(sum(math.log(best[(r["shape"], epilogue)] / r["ms"]) for r in mine) / len(mine))
            wins = sum(r["ms"] == best[(r["shape"], epilogue)] for r in mine)
            print(f"  {epilogue:10s} {config:40s} {score:.3f}  {wins}/{len(mine)}")


def table(rows: list, ceiling: float, liger: bool) -> None:
    def tf(by, name):
        r = by.get(name)
        if r is None:
            return "-"
        if not r["tflops"]:
            return r["status"].split(":")[0]
        return f"{r['tflops']:.0f}" if r["tflops"] >= 10 else f"{r['tflops']:.2f}"

    print(f"\nTFLOP/s, {str(DT)[6:]}; ceiling (torch.mm 8192^3) = {ceiling:.0f}; liger: {'installed' if liger else 'not installed'}")
    cols = {"cuBLAS mm": "cuBLAS mm", "eager": "eager gelu+b", "compile": "compile gelu+b",
            "compile max-autotune": "max-autotune", "kernelab none": "ours none",
            "kernelab gelu+bias": "ours gelu+b", "kernelab silu": "ours silu", "kernelab residual": "ours resid"}
    print(f"{'shape MxK->N':22s}" + "".join(f"{c:>15s}" for c in cols.values()) + "  gelu/mm  gelu/compile  gelu/max-at  %ceil  spread  best config (tune s)")
    for shape in dict.fromkeys(r["shape"] for r in rows if r["section"] == "fwd"):
        by = {r["provider"]: r for r in rows if r["section"] == "fwd" and r["shape"] == shape}
        ours_r, mm, comp, tuned = (by.get(p) for p in ("kernelab gelu+bias", "cuBLAS mm", "compile", "compile max-autotune"))
        ratio = lambda p: f"{p['ms'] / ours_r['ms']:.2f}" if ours_r and p and ours_r["ms"] and p["ms"] else "-"  # noqa: E731
        pct = f"{ours_r['pct_ceiling']:.0f}" if ours_r and ours_r["pct_ceiling"] else "-"
        extra = f"{ours_r['config']} ({ours_r['tune_s']:.1f})" if ours_r and ours_r["tune_s"] else ""
        spreads = [r["spread"] for r in by.values() if r.get("spread") is not None]
        spread = f"{100 * max(spreads):.0f}%" if spreads else "-"
        print(f"{shape:22s}" + "".join(f"{tf(by, c):>15s}" for c in cols) + f"  {ratio(mm):>7s}  {ratio(comp):>12s}  {ratio(tuned):>11s}  {pct:>5s}  {spread:>6s}  {extra}")
    tune_summary(rows)
    for section in ("epilogue", "tune dual", "fwd+bwd", "swiglu fwd", "swiglu fwd+bwd"):
        for shape in dict.fromkeys(r["shape"] for r in rows if r["section"] == section):
            by = {r["provider"]: r for r in rows if r["section"] == section and r["shape"] == shape}
            if section == "tune dual":
                cells = "  ".join(f"{r['config']}={r['tflops']:.0f}" if r["tflops"] else r["status"][:40]
                                  for r in rows if r["section"] == section and r["shape"] == shape)
                print(f"{section:14s} {shape:22s} {cells}")
                continue
            if section == "epilogue":
                for config in dict.fromkeys(r["config"] for r in rows if r["section"] == section):
                    mine = [r for r in rows if r["section"] == section and r["shape"] == shape and r["config"] == config]
                    cells = "  ".join(f"{r['epilogue']}={r['tflops']:.0f}" if r["tflops"] else r["status"] for r in mine)
                    print(f"{section:14s} {shape:22s} {config}: {cells}")
                continue
            cells = "  ".join(f"{p}={tf(by, p)}" for p in by)
            print(f"{section:14s} {shape:22s} {cells}" + ("" if liger or section != "swiglu fwd" else "  liger=not installed"))
    for r in rows:
        if r["status"] != "ok":
            print(f"  {r['section']} {r['shape']} {r['provider']} {r['epilogue']} {r['config']}: {r['status']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--smoke", action="store_true", help="CPU under TRITON_INTERPRET=1, tiny shapes: checks the script runs")
    ap.add_argument("--max-autotune", action="store_true",
                    help="also torch.compile(mode='max-autotune-no-cudagraphs') on every grid shape (minutes of tuning)")
    ap.add_argument("--workers", type=int, default=8, help="processes compiling the grid's kernels ahead (0: none)")
    ap.add_argument("--shapes", nargs="+", default=None, metavar="MxKxN",
                    help="time these shapes instead of the grids (forward, forward+backward, SwiGLU)")
    ap.add_argument("--plot-from", type=Path, default=None, metavar="CSV",
                    help="no run: draw OUT (a .png path) from a CSV this script wrote")
    ap.add_argument("--warm-part", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--warm-parts", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.warm_part is not None:
        warm(args.warm_part, args.warm_parts)
        return 0
    if args.plot_from is not None:
        print(f"wrote {plot(read_csv(args.plot_from), args.out)}")
        return 0
    if args.smoke:
        global ROUNDS, DEVICE, TIMER, GRID, FWD_BWD, SWIGLU, SWIGLU_FWD_BWD, EPILOGUE_SHAPES, CHECKS, CEILING, DT
        DEVICE, TIMER, DT, ROUNDS = "cpu", wall_ms, torch.float16, 1  # the interpreter's bf16 is unreliable
        GRID, FWD_BWD, SWIGLU, SWIGLU_FWD_BWD, EPILOGUE_SHAPES, CHECKS, CEILING = (
            SMOKE[k] for k in ("GRID", "FWD_BWD", "SWIGLU", "SWIGLU_FWD_BWD", "EPILOGUE_SHAPES", "CHECKS", "CEILING"))
    elif not torch.cuda.is_available():
        raise KernelabError("kernelab bench linear needs a CUDA GPU and none is available: speed is only measured "
                            "on real hardware")
    if args.shapes:
        try:
            shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes]
        except ValueError:
            shapes = []
        if not shapes or any(len(s) != 3 or min(s) < 1 for s in shapes):
            raise KernelabError(f"--shapes takes MxKxN of positive sizes, got {' '.join(args.shapes)}")
        use_shapes(shapes)
    args.out.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget_s)
    ENV.update(environment(torch.device(DEVICE)))
    try:
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction

        liger_silu_mul = LigerSiLUMulFunction.apply
    except Exception:  # noqa: BLE001 - Liger is optional
        liger_silu_mul = None
    rows: list = []
    ceiling = ceiling_tflops()
    workers = [] if args.smoke else start_warm_workers(args.out, args.workers)
    print(f"ceiling {ceiling:.0f} TFLOP/s; checks (while {len(workers)} workers compile the grid's kernels) ...", flush=True)
    # (the dtype of --smoke is float16: rows say so through ENV)
    ENV["dtype"] = str(DT)[6:]
    checks(rows)
    for worker in workers:  # nothing is timed while they run
        failed = worker.wait() != 0
        if failed:
            print(f"warm worker failed (the grid compiles what it lacks): {worker.stderr.read().decode()[-300:]}")
    print(f"checks and compiling ahead: {time.time() - budget.start:.0f} s", flush=True)
    torch._dynamo.config.recompile_limit = 64  # one compile per grid shape (the default 8 fell back to eager)
    # dynamic=False: one specialization per shape (automatic dynamic shapes would compile the
    # grid's later shapes with symbolic sizes after the second one)
    compiled = eager_gelu_bias if args.smoke else torch.compile(eager_gelu_bias, dynamic=False)
    tuned = None if args.smoke or not args.max_autotune else torch.compile(
        eager_gelu_bias, mode="max-autotune-no-cudagraphs", dynamic=False)
    work = ([("fwd", s, lambda s=s: grid_shape(rows, s, ceiling, compiled, tuned if s in MAX_AUTOTUNE else None))
             for s in GRID]
            + [("fwd+bwd", s, lambda s=s: fwd_bwd_shape(rows, s, ceiling)) for s in FWD_BWD]
            + [("epilogue", s, lambda s=s: epilogue_shape(rows, s, ceiling)) for s in EPILOGUE_SHAPES]
            + [("swiglu fwd", s, lambda s=s: swiglu_shape(rows, s, ceiling, liger_silu_mul)) for s in SWIGLU]
            + [("swiglu fwd+bwd", s, lambda s=s: swiglu_fwd_bwd_shape(rows, s, ceiling, liger_silu_mul))
               for s in SWIGLU_FWD_BWD])
    for section, shape, run in work:
        if budget.left() <= 0:
            skipped(rows, section, shape, f"--budget-s {args.budget_s:.0f} exceeded")
            continue
        t = time.time()
        run()
        print(f"{section} {shape}: {time.time() - t:.1f} s ({budget.left():.0f} s left)", flush=True)
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    if not args.smoke:  # clocks drift over a run: the ceiling is the faster of two measurements
        ceiling = max(ceiling, ceiling_tflops())
        for r in rows:
            r["pct_ceiling"] = 100 * r["tflops"] / ceiling if r.get("tflops") else None
    path = write_csv(rows, args.out)
    plot(rows, args.out / "linear_bench.png")
    table(rows, ceiling, liger_silu_mul is not None)
    print(f"\nwrote {path}; {sum(r['status'].startswith('skipped') for r in rows)} cases skipped (budget)")
    return 1 if any(r["status"] == "WRONG" for r in rows) else 0


def script_main() -> int:
    """``python -m kernelab.bench.linear`` / ``benchmarks/linear_bench.py``: errors a user can fix
    as one line and exit status 2, as the ``kernelab`` command prints them."""
    try:
        return main()
    except KernelabError as exc:
        print(f"linear_bench: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(script_main())
