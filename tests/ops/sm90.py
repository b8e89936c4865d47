"""Compile, for an H100/H200 (sm_90), every kernel configuration kernelab's launchers pick, on a
machine without a GPU: Triton's own ptxas and cuobjdump do the work. Catches what the interpreter
cannot (Triton front-end rules, register spills).

Run as ``python -m tests.ops.sm90`` WITHOUT TRITON_INTERPRET (kernels must be JIT functions);
prints one line per configuration and exits non-zero when one fails to compile.
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
    return {"regs": regs, "stack": stack, "local": local, "dtypes": sorted({v for k, v in sig.items() if v.startswith("*")})}


def workloads():
    """The launches to compile: the benchmark grid's bf16 shapes (with few rows) and odd shapes."""
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
    for n in (7, 4097):
        yield f"fp32 N={n}", lambda n=n: run(torch.float32, n, m=5)
        yield f"fp16 N={n}", lambda n=n: run(torch.float16, n, m=5)


def main() -> int:
    from kernelab.ops import _common

    assert not _common.INTERPRETED, "run without TRITON_INTERPRET"
    _common.use_triton = lambda t: t.dtype in _common.FLOAT_DTYPES
    _common.sm_count = lambda device: 132
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
            try:
                r = compile_sm90(kernel, args, kwargs)
            except Exception as e:  # noqa: BLE001 - report every failure, keep going
                failures += 1
                print(f"FAIL {name}: {type(e).__name__}: {str(e)[:400]}")
                continue
            print(f"ok   {name} regs={r['regs']:3d} spill(stack+local)={r['stack'] + r['local']}")
    print(f"{len(done)} configurations, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
