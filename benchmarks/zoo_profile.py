#!/usr/bin/env python
"""Where a zoo model's step spends its GPU time, per compiler: the top kernels by total CUDA time.

    python benchmarks/zoo_profile.py OUT_DIR gpt2:infer llama:train [--modes inductor,kernelab] [--top 15] [--memory] [--cprofile] [--loss-fn]
        [--threads] [--paths] [--runner-threads] [--loop S]

Modes: eager, inductor, kernelab, and inductor-cg / kernelab-cg (``mode="reduce-overhead"``: CUDA graphs).

For each MODEL:STEP and mode, after two warm-up steps, one step under torch.profiler; kernels are
grouped by name (a generated kernel's name says which ops it fused). Prints per mode: total CUDA
time, kernel count, the step's peak memory, its wall time and the host's share of it (the time to
launch every kernel), and the top kernels (calls, total ms, share); writes OUT_DIR/zoo_profile.txt.
With --memory, one more step runs under torch's allocator history, and the report lists the
allocations live at that step's peak (the step's own, biggest first, with the Python line that made
each): where a compiler's peak goes. With --threads, the step is timed again with the backward on
the calling thread (``torch.autograd.set_multithreading_enabled(False)``): does the hand-over to
autograd's CUDA thread cost the host time? With --paths (kernelab modes), one step's kernel launches
are counted by the way they went, per thread: a specialized runner line or a bound call through
torch's precompiled launcher, ``GroupRunner.run_values`` calls, and Triton's own launch path
(``kernel[grid](...)``, tens of microseconds of Python each). With --loop S, steps run for S more
seconds at the end, unmeasured: for a sampling profiler attached to the process (py-spy).
With --runner-threads, each call of a compiled graph (kernelab's ``GraphRunner``, Inductor's
``CompiledFxGraph``) is timed on whichever thread runs it (wall and that thread's CPU time), with
autograd's multithreading on and off, then profiled there (cProfile enabled on the running thread:
autograd's CUDA thread included, which a profiler started on the calling thread misses): what the
hand-over to autograd's thread costs each compiler's runners, and where.
Needs a CUDA GPU (the device machine).
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def stepper(zm, model, target, inputs, kind, loss_fn: bool):
    """One step as a call: train (grads set to None, loss, backward) or infer (no_grad forward).
    ``loss_fn``: ``target`` is the compiled loss function (what models.py compiles: the model's
    other outputs, such as logits, are not returned), else the compiled model."""
    import time

    def step():
        torch.compiler.cudagraph_mark_step_begin()  # a new step for CUDA graph modes (no-op otherwise)
        if kind == "train":
            model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            loss = target(inputs) if loss_fn else zm.loss(target, inputs)
            step.forward_ms.append((time.perf_counter() - t0) * 1e3)  # the host's share of the step
            loss.backward()  # (returns once the autograd thread has launched the backward)
        else:
            with torch.no_grad():
                target(inputs) if loss_fn else zm.forward(target, inputs)
    step.forward_ms = []
    return step


def _frame_of(frames: list[dict]) -> str:
    """Where an allocation was made: the statement of kernelab's runner that made it, else the
    innermost frame outside torch's own files (the model's line, or Inductor's output code)."""
    import linecache

    for f in frames:  # in kernelab's runner: its statement, which names the group or ATen op
        name = f.get("filename", "")
        if name.startswith("<kernelab runner"):
            return f"runner:{f.get('line')} {linecache.getline(name, f.get('line', 0)).strip()[:90]}"
    for f in frames:
        name = f.get("filename", "")
        if "/torch/" not in name or "_inductor" in name or "torchinductor" in name:
            return f"{Path(name).name}:{f.get('line')} {f.get('name')}"
    return "?"


def _live_at_peak(snapshot: dict, top: int) -> list[str]:
    """Replay the allocator's trace: the allocations live when the step's own bytes peaked."""
    live: dict[int, tuple[int, str]] = {}
    total = peak = 0
    at_peak: dict[int, tuple[int, str]] = {}
    for trace in snapshot["device_traces"]:
        for event in trace:
            if event["action"] == "alloc":
                live[event["addr"]] = (event["size"], _frame_of(event.get("frames", [])))
                total += event["size"]
                if total > peak:
                    peak, at_peak = total, dict(live)
            elif event["action"] == "free_requested" and event["addr"] in live:
                total -= live.pop(event["addr"])[0]
    lines = [f"  step's own allocations at their peak: {peak / 2**30:.2f} GiB in {len(at_peak)} blocks"]
    by_site: dict[str, list[int]] = {}
    for size, site in at_peak.values():
        by_site.setdefault(site, []).append(size)
    for site, sizes in sorted(by_site.items(), key=lambda kv: -sum(kv[1]))[:top]:
        biggest = ", ".join(f"{s / 2**20:.0f}" for s in sorted(sizes, reverse=True)[:6])
        lines.append(f"  {sum(sizes) / 2**30:8.3f} GiB x{len(sizes):<4d} {site[:130]}  [MiB: {biggest}]")
    return lines


def _memory_lines(step, top: int) -> list[str]:
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated() / 2**30
    torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
    try:
        step()
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    return [f"  allocated before the step: {before:.2f} GiB"] + _live_at_peak(snapshot, top)


def _host_and_wall(step, steps: int = 10) -> tuple[list[float], list[float]]:
    """Host times to return from a step (every kernel launched, none waited for) and wall times of
    the step (synchronized), in ms: a host time near the wall time means a host-bound step."""
    import time

    host, wall = [], []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        host.append((t1 - t0) * 1e3)
        wall.append((t2 - t0) * 1e3)
    return host, wall


def _loop(step, seconds: float) -> None:
    """Steps for ``seconds``, unmeasured (a sampling profiler's window)."""
    import time

    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        step()
    torch.cuda.synchronize()


def _single_thread_lines(step) -> list[str]:
    """The step timed with the backward on the calling thread: no hand-over to autograd's thread."""
    with torch.autograd.set_multithreading_enabled(False):
        step()
        host, wall = _host_and_wall(step)
    return [f"  backward on the calling thread (autograd multithreading off): step {statistics.median(wall):.2f} ms, "
            f"host {statistics.median(host):.2f} ms (medians of {len(wall)} steps; step {min(wall):.2f}-{max(wall):.2f})"]


def _graph_call_class(mode: str):
    """(class, method name) of a compiled graph's call: kernelab's runner or Inductor's graph."""
    if mode.startswith("kernelab"):
        from kernelab.compiler.runtime import GraphRunner
        return GraphRunner, "__call__"
    from torch._inductor.output_code import CompiledFxGraph
    return CompiledFxGraph, "__call__"


@contextlib.contextmanager
def graph_calls_by_thread(mode: str, profiler_for=None):
    """Within: every call of a compiled graph (``_graph_call_class``) timed on the thread that runs
    it; yields ``{"main" | "other": [calls, wall s, thread cpu s]}``. ``profiler_for(thread)``
    (optional) returns a ``cProfile.Profile`` to enable around the call on that thread, or None."""
    import threading
    import time

    cls, name = _graph_call_class(mode)
    original, record = getattr(cls, name), {}

    def timed(self, *args, **kwargs):
        who = "main" if threading.current_thread() is threading.main_thread() else "other"
        prof = profiler_for(who) if profiler_for is not None else None
        if prof is not None:
            prof.enable()
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return original(self, *args, **kwargs)
        finally:
            c1, t1 = time.thread_time(), time.perf_counter()
            if prof is not None:
                prof.disable()
            r = record.setdefault(who, [0, 0.0, 0.0])
            r[0], r[1], r[2] = r[0] + 1, r[1] + t1 - t0, r[2] + c1 - c0

    setattr(cls, name, timed)
    try:
        yield record
    finally:
        setattr(cls, name, original)


def _runner_thread_lines(step, mode: str, top: int, steps: int = 10) -> list[str]:
    """Compiled graphs' calls timed (and then cProfiled) on the thread that runs them."""
    import cProfile
    import io
    import pstats

    profiles: dict = {}  # thread ("main" | "other") -> cProfile.Profile, once profiling is on
    profiling = [False]

    def profiler_for(who):
        return profiles.setdefault(who, cProfile.Profile()) if profiling[0] else None

    lines = []
    with graph_calls_by_thread(mode, profiler_for) as record:
        for multithreaded in (True, False):
            with torch.autograd.set_multithreading_enabled(multithreaded):
                step()
                torch.cuda.synchronize()
                record.clear()
                for _ in range(steps):
                    step()
                torch.cuda.synchronize()
            where = "autograd's thread" if multithreaded else "the calling thread"
            parts = ", ".join(f"{who} thread {r[0] / steps:.0f} calls {1e3 * r[1] / steps:.2f} ms wall "
                              f"{1e3 * r[2] / steps:.2f} ms cpu" for who, r in sorted(record.items()))
            lines.append(f"  graph calls a step, backward on {where}: {parts}")
        with torch.autograd.set_multithreading_enabled(True):
            profiling[0] = True
            for _ in range(5):
                step()
            torch.cuda.synchronize()
            profiling[0] = False
    for who, prof in sorted(profiles.items()):
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
        lines.append(f"  cProfile of the graph calls on the {who} thread (5 steps, autograd multithreaded), by own time:")
        lines += ["    " + line for line in text.getvalue().splitlines() if line.strip()][:top + 6]
    return lines


def _launch_path_lines(step) -> list[str]:
    """One step's kernel launches counted by path and thread (kernelab's runners only)."""
    import collections
    import threading

    from triton.runtime.jit import JITFunction

    from kernelab import launch
    from kernelab.compiler import group_runner

    counts: collections.Counter = collections.Counter()
    main = threading.main_thread().ident

    def counted(cls, name: str, label: str):
        original = getattr(cls, name)

        def wrapper(*args, **kwargs):
            thread = "main" if threading.get_ident() == main else "autograd"
            counts[(label, thread)] += 1
            return original(*args, **kwargs)
        setattr(cls, name, wrapper)
        return original

    wrapped = [(launch.StaticLauncher, "launch", "torch's precompiled launcher (runner lines, bound calls)"),
               (group_runner.GroupRunner, "run_values", "GroupRunner.run_values (the unspecialized path)"),
               (JITFunction, "run", "Triton's launch path (kernel[grid])")]
    originals = [counted(cls, name, label) for cls, name, label in wrapped]
    try:
        step()
        torch.cuda.synchronize()
    finally:
        for (cls, name, _), original in zip(wrapped, originals):
            setattr(cls, name, original)
    lines = ["  launches of one step by path (thread):"]
    for (label, thread), n in sorted(counts.items()):
        lines.append(f"    {n:6d}  {label} ({thread})")
    return lines


def _area(filename: str, function: str) -> str:
    """Which part of the stack a profiled function belongs to (for the host-time breakdown)."""
    if filename.startswith("<kernelab runner"):
        return "kernelab: generated runner"
    if "/kernelab/" in filename:
        return "kernelab: " + Path(filename).stem
    if "_launch_kernel" in function or "launch" in function and filename == "~":
        return "Triton/torch kernel launcher (C)"
    if "torchinductor" in filename or "_inductor" in filename:
        return "Inductor runtime"
    if "_functorch" in filename or "autograd" in filename or "run_backward" in function:
        return "autograd / aot_autograd wrappers"
    if "_dynamo" in filename or "guards" in function:
        return "dynamo (guards, frame)"
    if "/triton/" in filename:
        return "Triton (Python)"
    if filename == "~":
        return "C builtins (ATen ops, allocator, ...)"
    if "/torch/" in filename:
        return "torch (Python)"
    return "model and benchmark code"


def _host_profile(step, top: int, out: Path | None = None, steps: int = 5) -> list[str]:
    """cProfile of ``steps`` steps' host side: the time per step by area of the stack, then the
    Python functions that took the most time of their own. Saves the raw profile under ``out``.
    cProfile sees the calling thread only, so the backward runs on it too
    (``torch.autograd.set_multithreading_enabled(False)``: no hand-over to autograd's CUDA thread,
    whose cost the profile then misses); one step so run first, unprofiled."""
    import cProfile
    import io
    import pstats

    with torch.autograd.set_multithreading_enabled(False):
        step()
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(steps):
            step()
        prof.disable()
        torch.cuda.synchronize()
    stats = pstats.Stats(prof)
    if out is not None:
        stats.dump_stats(str(out))
    areas: dict[str, float] = {}
    for (filename, _, function), (_, _, tottime, _, _) in stats.stats.items():
        area = _area(filename, function)
        areas[area] = areas.get(area, 0.0) + tottime
    total = sum(areas.values())
    lines = [f"  host profile (cProfile, {steps} steps, forward and backward on this thread; its own overhead included): "
             f"{1e3 * total / steps:.2f} ms a step"]
    for area, seconds in sorted(areas.items(), key=lambda kv: -kv[1]):
        lines.append(f"    {1e3 * seconds / steps:7.2f} ms {100 * seconds / max(total, 1e-12):5.1f}%  {area}")
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    return lines + ["  by own time:"] + [
        "  " + line for line in text.getvalue().splitlines() if line.strip()][:top + 8]


def profile_one(name: str, kind: str, mode: str, top: int, memory: bool = False, cprofile: bool = False,
                out: Path | None = None, loss_fn: bool = False, threads: bool = False, paths: bool = False,
                loop_s: float = 0.0, runner_threads: bool = False) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    import kernelab.compiler  # noqa: F401 - registers backend="kernelab"
    from kernelab.zoo import ZOO

    zm = ZOO[name]
    model, inputs = zm.build("bench", device="cuda", dtype=zm.dtype)
    if kind == "infer":
        model.eval()
    torch._dynamo.reset()
    fn = (lambda inp: zm.loss(model, inp) if kind == "train" else zm.forward(model, inp)) if loss_fn else model
    target = fn if mode == "eager" else torch.compile(
        fn, backend="kernelab" if mode.startswith("kernelab") else "inductor",
        **({"mode": "reduce-overhead"} if mode.endswith("-cg") else {}))  # -cg: CUDA graphs
    step = stepper(zm, model, target, inputs, kind, loss_fn)
    for _ in range(2):
        step()
    step.forward_ms.clear()
    host, wall = _host_and_wall(step)
    host_ms, wall_ms = statistics.median(host), statistics.median(wall)
    forward_ms = statistics.median(step.forward_ms) if step.forward_ms else None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    total = sum(e.device_time_total for e in events) / 1e3
    calls = sum(e.count for e in events)
    peak = torch.cuda.max_memory_allocated() / 2**30
    lines = [f"== {name} {kind} {mode}: {total:.2f} ms of GPU time in {calls} kernels/memops, peak {peak:.2f} GiB; "
             f"step {wall_ms:.2f} ms, of which the host took {host_ms:.2f} ms to launch everything "
             f"(medians of {len(wall)} steps; step {min(wall):.2f}-{max(wall):.2f}, host {min(host):.2f}-{max(host):.2f})"
             + (f"; host forward {forward_ms:.2f} ms, backward and the rest {host_ms - forward_ms:.2f}" if forward_ms else "")]
    for e in sorted(events, key=lambda e: -e.device_time_total)[:top]:
        ms = e.device_time_total / 1e3
        lines.append(f"  {ms:8.3f} ms {100 * ms / max(total, 1e-9):5.1f}% x{e.count:<4d} {e.key[:110]}")
    if memory:
        lines += _memory_lines(step, top)
    if threads:
        lines += _single_thread_lines(step)
    if paths and mode.startswith("kernelab"):
        lines += _launch_path_lines(step)
    if runner_threads and mode != "eager":
        lines += _runner_thread_lines(step, mode, top)
    if cprofile:
        lines += _host_profile(step, top,
                               out / f"host_{name}_{kind}_{mode}.pstats" if out is not None else None)
    _loop(step, loop_s)
    del model, target
    torch.cuda.empty_cache()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("targets", nargs="+", help="MODEL:train|infer")
    parser.add_argument("--modes", default="inductor,kernelab")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--memory", action="store_true", help="list the allocations live at the step's peak")
    parser.add_argument("--cprofile", action="store_true",
                        help="the host's Python functions by own time (forward and backward on one thread), 5 steps")
    parser.add_argument("--loss-fn", action="store_true",
                        help="compile the loss function as models.py does (logits not returned), not the model")
    parser.add_argument("--threads", action="store_true",
                        help="time the step again with the backward on the calling thread")
    parser.add_argument("--paths", action="store_true", help="count one step's launches by path and thread")
    parser.add_argument("--runner-threads", action="store_true",
                        help="time and cProfile the compiled graphs' calls on the thread that runs them")
    parser.add_argument("--loop", type=float, default=0.0, metavar="S",
                        help="run steps for S more seconds at the end, unmeasured (for py-spy)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("zoo_profile.py: needs a CUDA GPU (run it on the device machine)")
    args.out.mkdir(parents=True, exist_ok=True)
    report = []
    for target in args.targets:
        name, _, kind = target.partition(":")
        for mode in args.modes.split(","):
            try:
                lines = profile_one(name, kind or "train", mode, args.top, args.memory, args.cprofile, args.out,
                                    args.loss_fn, args.threads, args.paths, args.loop, args.runner_threads)
            except Exception as exc:  # noqa: BLE001 - one failure must not end the run
                lines = [f"== {name} {kind} {mode}: failed: {type(exc).__name__}: {exc}"]
            print("\n".join(lines), flush=True)
            report += lines
    (args.out / "zoo_profile.txt").write_text("\n".join(report) + "\n")


if __name__ == "__main__":
    main()
