"""Every kernel variant the value tests' kinds of function generate must also pass Triton's real
front-end (TTIR, sm_90 target), not only the interpreter: the GPU compiles them that way."""
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import kernelab.compiler as klc
from kernelab.compiler import runtime

_TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
          torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
          torch.bool: "i1"}


def _signature(kernel, args, meta):
    names = kernel.arg_names
    sig, constexprs = {}, {}
    for name, value in zip(names, args):
        if isinstance(value, torch.Tensor):
            sig[name] = "*" + _TYPES[value.dtype]
        elif isinstance(value, float):
            sig[name] = "fp32"
        else:
            sig[name] = "i64" if abs(int(value)) >= 2**31 else "i32"
    for name in names[len(args):]:
        sig[name] = "constexpr"
        constexprs[name] = meta[name]
    return sig, constexprs


def _collect(monkeypatch, jobs):
    real = runtime.GroupRunner.run_values

    def spy(self, raw, scalars):
        outs = real(self, raw, scalars)
        for call in self.calls.values():
            if call is None:
                continue
            args = list(raw) + list(outs) + list(call.scratch()) + list(call.tail) + list(scalars)
            sig, constexprs = _signature(call.kernel, args, call.meta)
            job = {"path": inspect.getsourcefile(call.kernel.fn), "name": call.kernel.fn.__name__,
                   "signature": sig, "constexprs": constexprs}
            if job not in jobs:
                jobs.append(job)
        return outs

    monkeypatch.setattr(runtime.GroupRunner, "run_values", spy)


def _programs():
    x, y = torch.randn(6, 300), torch.randn(300)
    i = torch.randint(-5, 5, (6, 300), dtype=torch.int32)
    long = torch.randn(3, 4100)
    return [
        (lambda a, b: (a + b).relu() * torch.sigmoid(b) - torch.tanh(a), (x, y)),
        (lambda a: torch.expm1(a) + torch.log1p(a.abs()) + a.abs().pow(0.5) + a ** 3, (x,)),
        (lambda a, b: torch.where(a > 0, a, 0.1 * b).clamp(-1, 1).half(), (x, y)),
        (lambda a, k: ((a > 0) & (k < 2), k * 2 + 1, (k * 3).sum(-1)), (x, i)),
        (lambda a: (torch.softmax(a, -1), torch.log_softmax(a, -1)), (x,)),
        (lambda a: (torch.softmax(a, -1), a.var(-1), a.amax(-1), a.amin(-1), a.mean(-1)), (long,)),
        (lambda a, w: F.layer_norm(a, (a.shape[-1],), w, None), (long, torch.randn(4100))),
        (lambda a, w: a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-6) * w, (x, y)),
        (lambda a: torch.softmax(a.t(), -1), (torch.randn(300, 6),)),
        (lambda a: torch.softmax(a.to(torch.bfloat16), -1), (x,)),
        (lambda a, b: ((a * b).sum(0) * 2, a.exp().mean(0)), (torch.randn(300, 40), torch.randn(40))),
        (lambda a: (a.sigmoid() * 3).sum(0).half(), (torch.randn(7, 3, 33),)),
        # column variances (Welford lanes, Chan's merges, row splits), float32 and float64
        (lambda a: (torch.var(a, 0) * 2, a.sum(0)), (torch.randn(300, 40),)),
        (lambda a: torch.var(a.double(), (0, 1), correction=0), (torch.randn(5, 60, 9),)),
        # gathers: indices computed in the kernel (bilinear), loaded with trailing dims (a clamped arange)
        (lambda a: F.interpolate(a, scale_factor=2, mode="bilinear"), (torch.randn(2, 3, 5, 6),)),
        (lambda a: a[:, torch.arange(-1, 4).clamp(0, 2)] + 1, (torch.randn(2, 3, 5, 6),)),
    ]


def _scatter_jobs() -> list:
    """The compiler's fixed scatter-add kernels (``scatter.py``), which no group runner launches."""
    i32 = "i32"
    rows = {"base_ptr": "*fp32", "idx_ptr": "*i64", "src_ptr": "*fp32", "n_idx": i32, "n_rows": i32, "width": i32,
            "src_stride": i32, "src_col_stride": i32, "ROWS": "constexpr", "BLOCK": "constexpr"}
    places = {"base_ptr": "*fp32", "src_ptr": "*fp32", "i0_ptr": "*i64", "i1_ptr": "*i64", "i2_ptr": "*i64",
              "numel": i32, "places": i32, "inner": i32, "outer_stride": i32, "stride0": i32, "stride1": i32,
              "stride2": i32, "K": "constexpr", "BLOCK": "constexpr"}
    jobs = [{"factory": "kernelab.compiler.scatter:_kernel", "name": "kl_scatter_add_rows", "signature": rows,
             "constexprs": {"ROWS": 4, "BLOCK": 1024}}]
    jobs += [{"factory": "kernelab.compiler.scatter:_places_kernel", "name": "kl_scatter_add", "signature": places,
              "constexprs": {"K": k, "BLOCK": 1024}} for k in (1, 2, 3)]
    return jobs


def test_generated_kernels_lower_to_ttir(monkeypatch, tmp_path):
    jobs = []
    _collect(monkeypatch, jobs)
    for fn, args in _programs():
        torch._dynamo.reset()
        klc.compile(fn)(*args)
    assert len(jobs) >= 10
    jobs += _scatter_jobs()
    # every variant also with 64-bit offsets (what inputs over 2**31 elements take)
    jobs += [{**job, "constexprs": {**job["constexprs"], "INT64": True}} for job in jobs
             if job["constexprs"].get("INT64") is False]
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps(jobs))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("ttir_lower.py")
    res = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True, env=env,
                         timeout=600)
    lines = [line for line in res.stdout.splitlines() if line.startswith(("ok", "FAIL"))]
    assert len(lines) == len(jobs), res.stderr[-3000:]
    failures = [line for line in lines if line.startswith("FAIL")]
    assert not failures, "\n".join(failures)
    print(f"{len(lines)} kernel variants lowered to TTIR")
