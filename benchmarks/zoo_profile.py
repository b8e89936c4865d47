#!/usr/bin/env python
"""Where a zoo model's step spends its GPU time, per compiler: the top kernels by total CUDA time.

    python benchmarks/zoo_profile.py OUT_DIR gpt2:infer llama:train [--modes inductor,kernelab] [--top 15]

For each MODEL:STEP and mode, after two warm-up steps, one step under torch.profiler; kernels are
grouped by name (a generated kernel's name says which ops it fused). Prints per mode: total CUDA
time, kernel count, the step's peak memory, and the top kernels (calls, total ms, share); writes OUT_DIR/zoo_profile.txt.
Needs a CUDA GPU (the device machine).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _step(zm, model, inputs, kind):
    if kind == "train":
        model.zero_grad(set_to_none=True)
        zm.loss(model, inputs).backward()
    else:
        with torch.no_grad():
            zm.forward(model, inputs)


def profile_one(name: str, kind: str, mode: str, top: int) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    import kernelab.compiler  # noqa: F401 - registers backend="kernelab"
    from kernelab.zoo import ZOO

    zm = ZOO[name]
    model, inputs = zm.build("bench", device="cuda", dtype=zm.dtype)
    if kind == "infer":
        model.eval()
    torch._dynamo.reset()
    target = model if mode == "eager" else torch.compile(model, backend="kernelab" if mode == "kernelab" else "inductor")
    for _ in range(2):
        _step(zm, target, inputs, kind)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        _step(zm, target, inputs, kind)
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    total = sum(e.device_time_total for e in events) / 1e3
    calls = sum(e.count for e in events)
    peak = torch.cuda.max_memory_allocated() / 2**30
    lines = [f"== {name} {kind} {mode}: {total:.2f} ms of GPU time in {calls} kernels/memops, peak {peak:.2f} GiB"]
    for e in sorted(events, key=lambda e: -e.device_time_total)[:top]:
        ms = e.device_time_total / 1e3
        lines.append(f"  {ms:8.3f} ms {100 * ms / max(total, 1e-9):5.1f}% x{e.count:<4d} {e.key[:110]}")
    del model, target
    torch.cuda.empty_cache()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("targets", nargs="+", help="MODEL:train|infer")
    parser.add_argument("--modes", default="inductor,kernelab")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("zoo_profile.py: needs a CUDA GPU (run it on the device machine)")
    args.out.mkdir(parents=True, exist_ok=True)
    report = []
    for target in args.targets:
        name, _, kind = target.partition(":")
        for mode in args.modes.split(","):
            try:
                lines = profile_one(name, kind or "train", mode, args.top)
            except Exception as exc:  # noqa: BLE001 - one failure must not end the run
                lines = [f"== {name} {kind} {mode}: failed: {type(exc).__name__}: {exc}"]
            print("\n".join(lines), flush=True)
            report += lines
    (args.out / "zoo_profile.txt").write_text("\n".join(report) + "\n")


if __name__ == "__main__":
    main()
