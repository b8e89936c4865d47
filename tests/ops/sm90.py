"""Compile, for an H100/H200 (sm_90), every kernel configuration kernelab's launchers pick, on a
machine without a GPU: Triton's own ptxas and cuobjdump do the work. Catches what the interpreter
cannot (Triton front-end rules, register spills).

Run as ``python -m tests.ops.sm90`` WITHOUT TRITON_INTERPRET (kernels must be JIT functions);
prints one line per configuration and exits non-zero when one fails to compile.

``python -m tests.ops.sm90 --gemm [M,N,K,GROUP,WARPS,STAGES,PER_SM,FLATTEN,TMA_STORE ...]``: the
GEMM configurations (the table and these), bf16 with TMA loads: registers, spills, shared memory,
programs per SM.

``python -m tests.ops.sm90 --norms [WIDTH ...]``: the norm kernels at the model widths of the
benchmark grid (``kernelab.bench.specs.MODEL_ROW_GRID``), bf16, for each launch setting that
``benchmarks/norm_tune.py`` times: registers, spills, shared memory, programs one SM runs at once
(``_common.occupancy``), lanes masked off in the tile, and the backward's grid and partial rows.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.int64: "i64", torch.int32: "i32", torch.uint8: "u8"}
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def record_launches(fn) -> list:
    """Run ``fn`` with every JIT kernel launch recorded instead of executed."""
    seen = []
    original = JITFunction.run

    def record(self, *args, grid, warmup, **kwargs):
        seen.append((self, args, dict(kwargs)))

    JITFunction.run = record
    try:
        fn()
    finally:
        JITFunction.run = original
    return seen


def specialize(kernel: JITFunction, args, kwargs):
    """Triton's launch-time specialization, for ASTSource: aligned pointers, ints of 1, ints % 16."""
    names = list(inspect.signature(kernel.fn).parameters)
    bound = dict(zip(names, args))
    bound.update({k: v for k, v in kwargs.items() if k in names})
    sig, constexprs, attrs = {}, {}, {}
    for i, (name, param) in enumerate(zip(names, kernel.params)):
        v = bound[name]
        if param.is_constexpr or v is None or (isinstance(v, int) and not isinstance(v, bool) and v == 1):
            sig[name], constexprs[(i,)] = "constexpr", v
        elif isinstance(v, torch.Tensor):
            sig[name], attrs[(i,)] = "*" + TYPES[v.dtype], [["tt.divisibility", 16]]
        elif isinstance(v, bool):
            sig[name] = "i1"
        elif isinstance(v, int):
            sig[name] = "i32" if -(2**31) <= v < 2**31 else "i64"
            if v % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "fp32"
    return sig, constexprs, attrs


def compile_sm90(kernel, args, kwargs) -> dict:
    sig, constexprs, attrs = specialize(kernel, args, kwargs)
    options = {"num_warps": kwargs.get("num_warps", 4), "num_stages": kwargs.get("num_stages", 3)}
    if kwargs.get("maxnreg"):
        options["maxnreg"] = kwargs["maxnreg"]
    compiled = triton.compile(ASTSource(kernel, sig, constexprs, attrs), target=GPUTarget("cuda", 90, 32), options=options)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([CUOBJDUMP, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", usage)
    regs, stack, _, local = (int(g) for g in found.groups())
    return {"regs": regs, "stack": stack, "local": local, "shared": compiled.metadata.shared,
            "dtypes": sorted({v for k, v in sig.items() if v.startswith("*")})}


def try_compile(kernel, args, kwargs, label: str) -> dict | None:
    """``compile_sm90``'s result, or None after printing one FAIL line (every failure is
    reported and the table goes on)."""
    try:
        return compile_sm90(kernel, args, kwargs)
    except Exception as e:  # noqa: BLE001 - report every failure, keep going
        print(f"FAIL {label}: {type(e).__name__}: {str(e)[:400]}", flush=True)
        return None


def norm_settings(backward: bool) -> dict:
    """The norms' launch settings that ``benchmarks/norm_tune.py`` times (one list, kept there)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    from norm_tune import settings

    return settings(backward)


def run_norm_settings(n: int, m: int = 64) -> None:
    """layer_norm and rms_norm forward and backward (bf16, weight and bias with grad) under every
    launch setting ``benchmarks/norm_tune.py`` times."""
    import kernelab.ops as K
    from kernelab.ops import norms

    for backward in (False, True):
        for config in norm_settings(backward).values():
            ops = norms.configured(config) if config is not None else K
            x = torch.randn(m, n, dtype=torch.bfloat16, requires_grad=backward)
            w = torch.randn(n, dtype=torch.bfloat16, requires_grad=backward)
            b = torch.randn(n, dtype=torch.bfloat16, requires_grad=backward)
            for y, inputs in ((ops.layer_norm(x, (n,), w, b), (x, w, b)), (ops.rms_norm(x, (n,), w, 1e-6), (x, w))):
                if backward:
                    torch.autograd.grad(y, inputs, torch.ones_like(y))


def workloads():
    """The launches to compile: the benchmark grid's bf16 shapes (with few rows), the model widths
    under every launch setting of the norms, and odd shapes."""
    import kernelab.ops as K

    def run(dtype, n, m=64):
        x = torch.randn(m, n, dtype=dtype, requires_grad=True)
        w = torch.randn(n, dtype=dtype, requires_grad=True)
        b = torch.randn(n, dtype=dtype, requires_grad=True)
        outs = [K.softmax(x, -1), K.log_softmax(x, -1), K.layer_norm(x, (n,), w, b), K.rms_norm(x, (n,), w),
                K.add_relu(x, b), K.bias_gelu(x, b), K.silu_mul(x, x), K.gelu_mul(x, x, approximate="tanh"),
                K.cross_entropy(x, torch.randint(0, n, (m,)), label_smoothing=0.1)]
        for out in outs:
            torch.autograd.grad(out, [t for t in (x, w, b)], torch.ones_like(out), allow_unused=True)

    for n in (256, 1024, 4096, 16384, 65536, 262144, 32000):
        yield f"bf16 N={n}", lambda n=n: run(torch.bfloat16, n)
    for n in (2880, 7168, 12288):  # model widths: every launch setting of the norms' tuning run
        yield f"bf16 N={n}", lambda n=n: run_norm_settings(n)
    for n in (7, 4097):
        yield f"fp32 N={n}", lambda n=n: run(torch.float32, n, m=5)
        yield f"fp16 N={n}", lambda n=n: run(torch.float16, n, m=5)


def norm_table(widths=None) -> int:
    """One line per (width, op, setting, kernel): what ptxas made of the norm kernels at the model
    widths, and what that means on an H200 (132 SMs): resident programs per SM, the backward's
    programs and its [programs, N] float32 partial rows against the bytes of x, dy and dx."""
    import kernelab.ops as K
    from kernelab.bench import specs
    from kernelab.ops import _common, norms

    rows_of = {n: m for m, n in specs.MODEL_ROW_GRID}
    widths = widths or list(rows_of)
    failures = 0
    for n in widths:
        m = rows_of.get(n, 8192)
        for rms in (False, True):
            for label, config in norm_settings(backward=True).items():
                ops = norms.configured(config) if config is not None else K
                x = torch.randn(64, n, dtype=torch.bfloat16, requires_grad=True)
                w = torch.randn(n, dtype=torch.bfloat16, requires_grad=True)
                b = torch.randn(n, dtype=torch.bfloat16, requires_grad=True)

                def step():
                    y = ops.rms_norm(x, (n,), w, 1e-6) if rms else ops.layer_norm(x, (n,), w, b, 1e-5)
                    torch.autograd.grad(y, [x, w] if rms else [x, w, b], torch.ones_like(y))

                for kernel, args, kwargs in record_launches(step):
                    if kwargs.get("warmup"):
                        continue
                    name = kernel.fn.__name__
                    warps = kwargs.get("num_warps", 4)
                    r = try_compile(kernel, args, kwargs, f"N={n} {'rms' if rms else 'ln'} {label}: {name}")
                    if r is None:
                        failures += 1
                        continue
                    per_sm = _common.occupancy(r["regs"], r["shared"], warps)
                    block_n = kwargs.get("BLOCK_N", 0) + kwargs.get("TAIL", 0)  # a split row's head and tail
                    idle = 100 * (1 - n / block_n) if block_n and block_n >= n else 0
                    extra = ""
                    if name == "_norm_bwd_kernel":
                        cfg = config or norms.DEFAULT
                        tile = norms._bwd_tile(m, n, rms, cfg)
                        per = cfg.bwd_programs_per_sm
                        per = per_sm if per is None else min(per, per_sm) if cfg.bwd_one_wave else per
                        programs, _ = norms._bwd_rows(m, tile.block_m, per * 132 // tile.col_blocks)
                        waves = -(-programs * tile.col_blocks // (per_sm * 132))
                        parts = (2 - rms) * programs * n * 4 * (0 if (config and config.bwd_atomic) else 2)
                        extra = (f" M={m}: programs={programs}x{tile.col_blocks} waves={waves}"
                                 f" partials(w+r)={100 * parts / (3 * m * n * 2):.1f}% of x,dy,dx")
                    print(f"N={n:5d} {'rms' if rms else 'ln ':3s} {label[:26]:26s} {name:24s} warps={warps:2d}"
                          f" BLOCK_N={block_n:5d} idle={idle:4.1f}% regs={r['regs']:3d}"
                          f" spill={r['stack'] + r['local']:3d} smem={r['shared']:6d} per_sm={per_sm:2d}{extra}", flush=True)
    return 1 if failures else 0


def gemm_table(configs=None) -> int:
    """One line per GEMM configuration (``gemm.CONFIGS`` and ``configs``): what ptxas made of the
    kernel for bf16 TMA loads with a gelu + bias epilogue (and the dual GEMM for dual classes),
    and the programs one SM can hold (what ``GemmConfig.programs_per_sm`` may ask for)."""
    from kernelab.ops import _common, gemm

    gemm.tma_supported = lambda device: True
    failures = 0
    todo = [(kind, c) for kind, cs in gemm.CONFIGS.items() for c in cs] + [("extra", c) for c in configs or ()]
    for kind, config in todo:
        dual = kind.startswith("dual")
        m, n, k = 256, 256, 256
        a, b = torch.randn(m, k, dtype=torch.bfloat16), torch.randn(n, k, dtype=torch.bfloat16)
        bias = torch.randn(n, dtype=torch.bfloat16)
        if dual:
            work = lambda: gemm.gemm(a, b, b2=b.clone(), config=config)  # noqa: E731
        else:
            work = lambda: gemm.gemm(a, b, bias=bias, act=gemm.code_for("gelu", a.dtype), config=config)  # noqa: E731
        for kernel, args, kwargs in record_launches(work):
            r = try_compile(kernel, args, kwargs, f"{kind:12s} {config}")
            if r is None:
                failures += 1
                continue
            per_sm = _common.occupancy(r["regs"], r["shared"], config.num_warps)
            print(f"{kind:12s} {config.block_m}x{config.block_n}x{config.block_k} w{config.num_warps} s{config.num_stages}"
                  f" p{config.programs_per_sm} flat={int(config.flatten)} tmastore={int(config.tma_store)}"
                  f" regs={r['regs']:3d} spill={r['stack'] + r['local']:4d} smem={r['shared']:6d} per_sm={per_sm}",
                  flush=True)
    return 1 if failures else 0


def main() -> int:
    from kernelab.ops import _common

    assert not _common.INTERPRETED, "run without TRITON_INTERPRET"
    _common.use_triton = lambda t: t.dtype in _common.FLOAT_DTYPES
    _common.sm_count = lambda device: 132
    if sys.argv[1:2] == ["--norms"]:
        return norm_table([int(a) for a in sys.argv[2:]] or None)
    if sys.argv[1:2] == ["--gemm"]:
        from kernelab.ops import gemm

        return gemm_table([gemm.GemmConfig(*(int(v) for v in spec.split(","))) for spec in sys.argv[2:]])
    done, failures = set(), 0
    for label, work in workloads():
        for kernel, args, kwargs in record_launches(work):
            sig, constexprs, attrs = specialize(kernel, args, kwargs)
            key = (kernel.fn.__name__, tuple(sorted(sig.items())), tuple(sorted(constexprs.items())), tuple(sorted(attrs)),
                   kwargs.get("num_warps"), kwargs.get("maxnreg"))
            if key in done:
                continue
            done.add(key)
            cap = f" maxnreg={kwargs['maxnreg']}" if kwargs.get("maxnreg") else ""
            name = f"{label:12s} {kernel.fn.__name__:30s} warps={kwargs.get('num_warps', 4):2d}{cap}"
            r = try_compile(kernel, args, kwargs, name)
            if r is None:
                failures += 1
                continue
            print(f"ok   {name} regs={r['regs']:3d} spill(stack+local)={r['stack'] + r['local']}")
    print(f"{len(done)} configurations, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
