"""Timing, the copy ceiling, poisoned outputs and correctness: one method for every provider.

* ``time_ms``: ``triton.testing.do_bench`` (CUDA events, warm-up, median of many; it also clears
  L2 between runs) over input sets rotated so that they span more than the L2 cache.
* ``kernel_time_ms``: the summed GPU time of the kernels alone (torch.profiler), for tuning.
* ``graph_ms``: GPU time with the host taken out (calls captured in a CUDA graph and replayed);
  ``host_us``: the host's own time per call. do_bench's figure is about the larger of the two.
* ``copy_tbps``: the device-to-device copy of 4 GiB measured in the same run, bytes read + written.
* ``poison``: fills freed allocator blocks of the outputs' sizes with NaN before a provider runs,
  so an output element it does not write shows as NaN instead of as stale correct data.
* ``compare``: relative L2 error against the float64 reference, NaN where the reference is
  finite counting as failure.
"""

from __future__ import annotations

import itertools
import math

import torch

#: Max relative L2 error against the float64 reference (values rounded to the output dtype
#: already differ by ~2^-8 for bfloat16).
REL_TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}
L2_BYTES = 60 * 2**20


def time_ms(fn, input_sets: list, warmup_ms: int = 10, rep_ms: int = 40) -> float:
    """Median milliseconds of ``fn(*inputs)``, cycling through ``input_sets``."""
    import triton.testing

    cycle = itertools.cycle(input_sets)
    return float(triton.testing.do_bench(lambda: fn(*next(cycle)), warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def kernel_time_ms(fn, input_sets: list) -> float:
    """Milliseconds the GPU spends in the kernels (and copies) of one ``fn(*inputs)``: the sum of
    their durations under torch.profiler, medians of 5 calls on the first input set. Host time
    and launch gaps are left out, so this measures launch settings, not what a caller waits for
    (``bench_ops.py --timer kernels``; the grid's figures use :func:`time_ms`)."""
    from kernelab.measure import measure_kernels

    return sum(k.duration_us for k in measure_kernels(fn, input_sets[0])) / 1e3


def graph_ms(fn, input_sets: list, target_ms: float = 5.0, replays: int = 5) -> float | None:
    """Milliseconds of GPU time of one ``fn(*inputs)`` with the host taken out: enough calls to
    fill ~``target_ms`` (cycling through ``input_sets``) captured in one CUDA graph, replayed
    ``replays`` times, median. None when the calls cannot be captured. What the kernels cost,
    launch gaps included; :func:`time_ms` minus this is what the host adds."""
    import torch

    cycle = itertools.cycle(input_sets)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm: lazy allocations and per-stream buffers outside the capture
                fn(*next(cycle))
            one = torch.cuda.CUDAGraph()
            with torch.cuda.graph(one, stream=stream):
                fn(*next(cycle))
            estimate = _replay_ms(one, stream, 3)
            del one
            calls = max(1, min(500, int(target_ms / max(estimate, 1e-3))))
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                for _ in range(calls):
                    fn(*next(cycle))
            times = sorted(_replay_ms(graph, stream, 1) for _ in range(replays))
            del graph
        return times[len(times) // 2] / calls
    except Exception:  # noqa: BLE001 - a provider that cannot be captured has no graph time
        torch.cuda.synchronize()
        return None
    finally:
        torch.cuda.current_stream().wait_stream(stream)


def _replay_ms(graph, stream, times: int) -> float:
    """Mean milliseconds of ``times`` replays of ``graph`` on ``stream``."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    for _ in range(times):
        graph.replay()
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / times


def host_us(fn, input_sets: list, calls: int = 10) -> float:
    """Microseconds the host spends in one ``fn(*inputs)`` (back-to-back calls, the GPU
    synchronized before and after, not between): Python, dispatch, allocation, launches."""
    import time

    import torch

    torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(calls):
        fn(*input_sets[i % len(input_sets)])
    host = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()
    return host


def sets_needed(bytes_per_set: int, cap: int = 64) -> int:
    """Input sets to rotate through so that one round spans at least twice the L2 cache."""
    return max(1, min(cap, math.ceil(2 * L2_BYTES / max(1, bytes_per_set))))


def copy_tbps(device: torch.device, gib: int = 4) -> float:
    """Device-to-device copy bandwidth in TB/s (bytes read + written), median of do_bench."""
    import triton.testing

    n = gib * 2**30
    src = torch.empty(n, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n / (ms * 1e-3) / 1e12


def poison(sizes_bytes: list[int], device: torch.device, copies: int = 3) -> bool:
    """NaN-fill free allocator blocks of these sizes (the next allocations of those sizes reuse
    them). Returns whether the caching allocator handed a poisoned block back (self-check)."""
    if device.type != "cuda":
        return False
    blocks = [torch.full((max(1, s // 4),), float("nan"), dtype=torch.float32, device=device) for s in sizes_bytes for _ in range(copies)]
    del blocks
    probe = torch.empty(max(1, sizes_bytes[0] // 4), dtype=torch.float32, device=device)
    ok = bool(torch.isnan(probe[: min(1024, probe.numel())]).all())
    del probe
    return ok


#: elements compared at a time: float64 copies of a 151936-word vocabulary's gradient at 4096
#: rows (4.6 GiB each, several at once) ran an H100 out of memory beside the timed case's own
COMPARE_CHUNK = 1 << 26


def compare(out, ref) -> float:
    """Largest relative L2 error over the output tensors (inf when NaN/inf appear where the
    reference is finite, or shapes differ). Compared in chunks of ``COMPARE_CHUNK`` elements, each
    moved to the reference's device (a reference too large for the GPU stays on the CPU)."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    worst = 0.0
    for o, r in zip(outs, refs):
        if o is None or r is None:
            if (o is None) != (r is None):
                return math.inf
            continue
        if o.shape != r.shape:
            return math.inf
        o, r = o.detach().reshape(-1), r.detach().reshape(-1)
        num = den = 0.0
        for start in range(0, o.numel(), COMPARE_CHUNK):
            oc = o[start:start + COMPARE_CHUNK].to(r.device, torch.float64)
            rc = r[start:start + COMPARE_CHUNK].double()
            fin = torch.isfinite(rc)
            if not bool((torch.isfinite(oc) | ~fin).all()):
                return math.inf
            num += float(torch.where(fin, oc - rc, 0.0).square().sum())
            den += float(torch.where(fin, rc, 0.0).square().sum())
        worst = max(worst, math.sqrt(num) / max(math.sqrt(den), 1e-30))
    return worst
