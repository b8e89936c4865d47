#!/usr/bin/env python
"""Where the host's time goes in a call, on a CUDA GPU: per provider or compiler, the time per call
when calls run back to back, the host's time to issue one call, and the host events that took the
most time of their own (torch.profiler's CPU activity: ATen ops, CUDA runtime and driver calls such
as cudaLaunchKernel, cudaMalloc or a synchronization, on every thread, the autograd thread that
runs a CUDA backward included).

    python benchmarks/host_events.py OUT_DIR layer_norm:16384x2560:fwd+bwd vit:infer vit:train \
        [--providers kernelab,eager,liger] [--modes inductor,kernelab] [--top 14] [--loss-fn]

Targets: ``OP:ROWSxWIDTH:fwd|fwd+bwd`` (a ``kernelab.bench`` op case, bf16, with its providers),
``MODEL:train|infer`` (a zoo model at bench size, compiled by each mode: eager, inductor, kernelab,
kernelab-nofast (the runners not specialized: ``KERNELAB_FAST_RUNNER=0``), kernelab-bnaten,
kernelab-bngen, kernelab-bnall (training batch norm: ATen's forward, the generated forward, both
generated: ``KERNELAB_BN_FORWARD``, ``KERNELAB_BN_BACKWARD``), kernelab-nchw and
kernelab-nchw-bnall (convolutions in the layouts the program makes, ``KERNELAB_CONV_LAYOUT=traced``,
with ATen's or the generated batch norm); an inference call's
output layout is printed), or ``mm:MxKxN`` (one bf16 product called the ways a runner may call it). Per target and provider:

* ``back-to-back``: CUDA-event time per call over 10 calls issued without waiting (what a training
  loop sees: the larger of the GPU's and the host's time per call), median of ``--rounds`` rounds in
  which the providers take turns (a shared host's drift slows them alike), and the median of the
  first provider's time over this one's, round by round;
* ``host``: the host's time to return from one call started on an idle GPU (median of 10); a call
  whose host time exceeds its GPU time is host-bound;
* the top host events by self time in one profiled call, per thread, with their counts.

Writes OUT_DIR/host_events.txt. Needs a CUDA GPU (the device machine).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _op_calls(target: str, providers: list[str]) -> dict:
    """provider -> a no-argument call of one op case (inputs made once; grads by autograd.grad)."""
    from kernelab.bench import runner, specs

    op, shape, pass_ = target.split(":")
    rows, width = (int(v) for v in shape.split("x"))
    spec = specs.specs()[op]
    backward = pass_ == "fwd+bwd"
    gen = torch.Generator("cuda").manual_seed(0)
    inputs = spec.make((rows, width), torch.bfloat16, torch.device("cuda"), gen)
    calls = {}
    for name, fn in runner.provider_fns(spec, providers).items():
        args = runner.with_grad(inputs.args, inputs.grad_of, backward)
        out = fn(*args)
        grad_out = torch.randn_like(out) if backward else None
        wrt = [args[i] for i in inputs.grad_of]
        calls[name] = (lambda fn=fn, args=args, wrt=wrt, g=grad_out: torch.autograd.grad(fn(*args), wrt, g)) \
            if backward else (lambda fn=fn, args=args: fn(*args))
    return calls


def _mm_calls(target: str) -> dict:
    """How a runner may call one bf16 product (m, k) @ (k, n), each a no-argument call: ATen's op
    overload entry (kernelab's runner), ``torch.mm``, ``torch.mm(out=)`` (Inductor's
    ``extern_kernels.mm``), each also with the second operand a transposed weight (nn.Linear's)."""
    m, k, n = (int(v) for v in target.split(":")[1].split("x"))
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    bt = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    op = torch.ops.aten.mm.default._op
    return {"aten op entry": lambda: op(a, b), "aten op entry, b transposed": lambda: op(a, bt),
            "torch.mm": lambda: torch.mm(a, b), "torch.mm(out=)": lambda: torch.mm(a, b, out=out),
            "torch.mm(out=), b transposed": lambda: torch.mm(a, bt, out=out)}


def _model_calls(target: str, modes: list[str], loss_fn: bool) -> dict:
    """mode -> a no-argument training step or inference call of a zoo model (compiled per mode)."""
    import kernelab.compiler  # noqa: F401 - registers backend="kernelab"
    from kernelab.zoo import ZOO

    name, _, kind = target.partition(":")
    zm = ZOO[name]
    model, inputs = zm.build("bench", device="cuda", dtype=zm.dtype)
    model.train(kind == "train")
    calls = {}
    for mode in modes:
        torch._dynamo.reset()
        fn = (lambda inp: zm.loss(model, inp) if kind == "train" else zm.forward(model, inp)) if loss_fn else model
        compiled = fn if mode == "eager" else torch.compile(fn, backend=_backend(mode))

        def call(compiled=compiled):
            if kind == "train":
                model.zero_grad(set_to_none=True)
                (compiled(inputs) if loss_fn else zm.loss(compiled, inputs)).backward()
            else:
                with torch.no_grad():
                    return compiled(inputs) if loss_fn else zm.forward(compiled, inputs)
        calls[mode] = _first_call_with(VARIANTS[mode], call) if mode in VARIANTS else call
    return calls


#: kernelab's variants: the settings their first call (which compiles, and specializes the
#: runners of the graphs it runs) runs under
VARIANTS = {"kernelab-nofast": {"KERNELAB_FAST_RUNNER": "0"},
            "kernelab-bnaten": {"KERNELAB_BN_FORWARD": "aten", "KERNELAB_BN_BACKWARD": "aten"},
            "kernelab-bngen": {"KERNELAB_BN_FORWARD": "generated", "KERNELAB_BN_BACKWARD": "aten"},
            "kernelab-bnall": {"KERNELAB_BN_FORWARD": "generated", "KERNELAB_BN_BACKWARD": "generated"},
            "kernelab-nchw": {"KERNELAB_CONV_LAYOUT": "traced"},
            "kernelab-nchw-bnall": {"KERNELAB_CONV_LAYOUT": "traced", "KERNELAB_BN_FORWARD": "generated",
                                    "KERNELAB_BN_BACKWARD": "generated"}}


def _backend(mode: str):
    """torch.compile's backend for ``mode``; a kernelab variant gets a backend object of its own,
    so that dynamo compiles it apart from kernelab's (its cache tells backends apart by identity)."""
    from kernelab.compiler.backend import kernelab_backend

    if mode in VARIANTS:
        return lambda gm, example_inputs: kernelab_backend(gm, example_inputs)
    return "inductor" if mode == "inductor" else "kernelab"


def _first_call_with(settings: dict, call):
    """``call`` whose first run has the environment ``settings``: kernelab compiled that way."""
    import os

    first = [True]

    def wrapped():
        if not first[0]:
            return call()
        os.environ.update(settings)
        try:
            return call()
        finally:
            for name in settings:
                del os.environ[name]
            first[0] = False
    return wrapped


def _back_to_back_ms(call, n: int = 30) -> float:
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        call()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


def _host_ms(call, n: int = 10) -> list[float]:
    out = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        out.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return out


def _events(call, top: int) -> list[str]:
    """The top host events of one call by self CPU time, per thread."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    # two calls profiled, the second counted: the profiler's start-up lands on each thread's first
    # event (~2.5 ms on the H100's host), which would be charged to that op
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        call()
        torch.cuda.synchronize()
        with torch.profiler.record_function("## measured call ##"):
            call()
            torch.cuda.synchronize()
    events = list(prof.events())
    start = min(e.time_range.start for e in events if e.name == "## measured call ##")
    per_thread: dict[int, dict[str, list[float]]] = {}
    for e in events:
        if e.device_type != torch.autograd.DeviceType.CPU or e.time_range.start < start or e.name.startswith("## measured"):
            continue
        slot = per_thread.setdefault(e.thread, {}).setdefault(e.name, [0.0, 0])
        slot[0] += e.self_cpu_time_total
        slot[1] += 1
    lines = []
    for thread, names in sorted(per_thread.items(), key=lambda kv: -sum(v[0] for v in kv[1].values())):
        total = sum(v[0] for v in names.values()) / 1e3
        lines.append(f"    thread {thread}: {total:.3f} ms of host events' self time")
        for name, (us, count) in sorted(names.items(), key=lambda kv: -kv[1][0])[:top]:
            lines.append(f"      {us / 1e3:8.3f} ms x{count:<5d} {name[:100]}")
    return lines


def _paired_rounds(calls: dict, rounds: int) -> dict:
    """name -> back-to-back ms a call in each of ``rounds`` rounds, the providers interleaved round
    by round: a host whose speed drifts (a shared machine) slows them alike, where one provider
    timed after another would carry the drift into their ratio."""
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            times[name].append(_back_to_back_ms(call, n=10))
    return times


def _measure(target: str, calls: dict, rounds: int, top: int, no_events: bool) -> list[str]:
    """Warm every provider, time them in interleaved rounds, then each one's host time and events."""
    lines, ok, printed = [], {}, 0
    for name, call in calls.items():
        try:
            for _ in range(3):
                got = call()
            if isinstance(got, torch.Tensor):  # an inference call's output: the layout the caller gets
                lines.append(f"   {target} {name}: output {tuple(got.shape)} strides {got.stride()}")
            del got
            ok[name] = call
        except Exception as exc:  # noqa: BLE001 - one provider failing is a result
            lines.append(f"== {target} {name}: failed: {type(exc).__name__}: {exc}")
    times = _paired_rounds(ok, rounds)
    first = next(iter(ok), None)
    for name, call in ok.items():
        b2b = statistics.median(times[name])
        ratio = statistics.median(a / b for a, b in zip(times[first], times[name]))
        host = _host_ms(call)
        lines.append(f"== {target} {name}: back-to-back {b2b:.3f} ms a call (median of {rounds} interleaved rounds, "
                     f"{min(times[name]):.3f}-{max(times[name]):.3f}; {first} / this, per round: {ratio:.2f}x); "
                     f"host {statistics.median(host):.3f} ms (min {min(host):.3f}, max {max(host):.3f})")
        if not no_events:
            try:
                lines += _events(call, top)
            except Exception as exc:  # noqa: BLE001 - the timings above stand without the profile
                lines.append(f"    no host events: {type(exc).__name__}: {exc}")
        printed = _print_new(lines, printed)
    _print_new(lines, printed)
    return lines


def _print_new(lines: list, printed: int) -> int:
    print("\n".join(lines[printed:]), flush=True)
    return len(lines)


def _target_error(target: str, modes: list) -> str:
    """Why ``target`` (or the modes) cannot be measured, or "" where they can."""
    from kernelab.bench import specs
    from kernelab.zoo import ZOO

    parts = target.split(":")
    if parts[0] == "mm":
        ok = len(parts) == 2 and len(parts[1].split("x")) == 3 and all(v.isdigit() for v in parts[1].split("x"))
        return "" if ok else f"{target!r}: a product is mm:MxKxN"
    if len(parts) == 3:
        shape = parts[1].split("x")
        if parts[0] not in specs.specs() or parts[2] not in ("fwd", "fwd+bwd") or len(shape) != 2 or \
                not all(v.isdigit() for v in shape):
            return f"{target!r}: an op case is OP:ROWSxWIDTH:fwd|fwd+bwd with OP one of {', '.join(sorted(specs.specs()))}"
        return ""
    if len(parts) != 2 or parts[0] not in ZOO or parts[1] not in ("train", "infer"):
        return f"{target!r}: a model is MODEL:train|infer with MODEL one of {', '.join(sorted(ZOO))}"
    known = ("eager", "inductor", "kernelab", *VARIANTS)
    unknown = [m for m in modes if m not in known]
    return f"unknown mode {unknown[0]!r} ({', '.join(known)})" if unknown else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("targets", nargs="+")
    ap.add_argument("--providers", default="kernelab,eager,liger")
    ap.add_argument("--modes", default="inductor,kernelab")
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds of 10 back-to-back calls per provider")
    ap.add_argument("--no-events", action="store_true", help="timings only, no profiled call")
    ap.add_argument("--loss-fn", action="store_true", help="compile the loss function (as models.py does), not the model")
    args = ap.parse_args()
    bad = [t for t in args.targets if _target_error(t, args.modes.split(","))]
    if bad:
        ap.error(_target_error(bad[0], args.modes.split(",")))
    if args.rounds < 1 or args.top < 1:
        ap.error("--rounds and --top must be at least 1")
    if not torch.cuda.is_available():
        sys.exit("host_events.py: needs a CUDA GPU (run it on the device machine)")
    args.out.mkdir(parents=True, exist_ok=True)
    report = [f"# host_events.py {' '.join(sys.argv[1:])}; {torch.cuda.get_device_name()}, torch {torch.__version__}, "
              f"{time.strftime('%Y-%m-%d')}"]
    for target in args.targets:
        try:
            if target.startswith("mm:"):
                calls = _mm_calls(target)
            elif target.count(":") == 2:
                calls = _op_calls(target, args.providers.split(","))
            else:
                calls = _model_calls(target, args.modes.split(","), args.loss_fn)
        except Exception as exc:  # noqa: BLE001 - report and go on with the next target
            report.append(f"== {target}: failed to build: {type(exc).__name__}: {exc}")
            continue
        report += _measure(target, calls, args.rounds, args.top, args.no_events)
        del calls
        torch.cuda.empty_cache()
    (args.out / "host_events.txt").write_text("\n".join(report) + "\n")


if __name__ == "__main__":
    main()
