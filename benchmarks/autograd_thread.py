#!/usr/bin/env python
"""Is a compiled model's slower backward on autograd's CUDA thread a matter of the GIL?

    python3 benchmarks/autograd_thread.py MODEL MODE      (MODE: kernelab or inductor; one process each)

A zoo model's training step at benchmark size (the compiled loss function, as ``models.py``):
the Python threads alive after the compile, then each compiled graph's call timed on the thread
that runs it, with autograd's multithreading on and off, under ``sys.setswitchinterval`` at its
default (5 ms) and at 100 s (a thread holding the GIL then keeps it until it releases it itself).
Stop 39 (``results/zoo_profile_t5_runner_threads_stop39_h100.txt``): kernelab's T5 backward took
15.2 ms a step on the calling thread and 21.2 on autograd's (Inductor 14.7 / 16.4), and cProfile
on that thread saw no Python function take the difference. If another thread contends for the
GIL there, the long interval changes the autograd-thread figure and leaves the calling thread's.
Needs a CUDA GPU.
"""
from __future__ import annotations

import statistics
import sys
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[2] not in ("kernelab", "inductor"):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("autograd_thread.py: needs a CUDA GPU (run it on the device machine)", file=sys.stderr)
        return 2
    import zoo_profile as zp

    import kernelab.compiler  # noqa: F401 - registers backend="kernelab"
    from kernelab.zoo import ZOO

    name, mode = sys.argv[1], sys.argv[2]
    if name not in ZOO:
        print(f"autograd_thread.py: unknown model {name!r} (the zoo has {', '.join(sorted(ZOO))})", file=sys.stderr)
        return 2
    zm = ZOO[name]
    model, inputs = zm.build("bench", device="cuda", dtype=zm.dtype)
    target = torch.compile(lambda inp: zm.loss(model, inp), backend=mode)
    step = zp.stepper(zm, model, target, inputs, "train", True)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    print(f"{name} {mode}: threads {[(t.name, t.daemon) for t in threading.enumerate()]}, "
          f"switch interval {sys.getswitchinterval()} s", flush=True)
    with zp.graph_calls_by_thread(mode) as spent:
        for interval in (0.005, 100.0, 0.005, 100.0):
            sys.setswitchinterval(interval)
            for multithreaded in (True, False):
                with torch.autograd.set_multithreading_enabled(multithreaded):
                    step()
                    torch.cuda.synchronize()
                    spent.clear()
                    walls = []
                    for _ in range(10):
                        t0 = time.perf_counter()
                        step()
                        torch.cuda.synchronize()
                        walls.append(time.perf_counter() - t0)
                calls = ", ".join(f"{who} thread {1e3 * r[1] / 10:.2f} ms" for who, r in sorted(spent.items()))
                print(f"{name} {mode} switch interval {interval:g} s, autograd multithreading {multithreaded}: "
                      f"step {1e3 * statistics.median(walls):.2f} ms; graph calls a step: {calls}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
