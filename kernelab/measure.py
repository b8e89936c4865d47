"""Measure which kernels a function really launches on a GPU, with torch.profiler.

The profiler's CUDA activity (CUPTI) sees every kernel, memcpy and memset the device ran; its CPU
activity sees every aten op and every CUDA runtime/driver call. They are joined the way the
profiler's own chrome trace joins them:

* a device event and the runtime call that launched it (``cudaLaunchKernel``, ``cuLaunchKernelEx``,
  ``cudaMemsetAsync``, ...) share ``args["correlation"]``;
* the launching thread's innermost enclosing CPU op at the launch's timestamp is the op that launched
  it (CUPTI's external correlation is pushed on every op entry, so ``args["External id"]`` names the
  same innermost op; it is the fallback when the runtime call is missing from the trace).

Each timed call runs inside a ``record_function`` range named ``kernelab.call[i]``; a device event
belongs to the call whose range holds its launch. Calls must launch the same kernels in the same
order, otherwise measuring is refused with a reason.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Sequence

__all__ = [
    "DeviceKernel",
    "KERNEL_CATEGORIES",
    "classify_kernel",
    "measure_kernels",
    "ops_from_inductor_name",
    "kernels_from_trace",
]

KERNEL_CATEGORIES = (
    "pointwise", "reduction", "matmul", "conv", "attention", "copy", "fill", "index", "scan",
    "sort", "memset", "memcpy", "other",
)

# Ordered (pattern, category) rules: the first that matches a kernel's demangled name wins, so
# specific functors and libraries come before the generic elementwise templates that wrap them.
# A plain string matches as a case-insensitive substring, a compiled regex with .search().
_RULES: tuple[tuple[str | re.Pattern[str], str], ...] = (
    # --- Inductor's generated Triton kernels: triton_<kind>_fused_<aten ops>_<n>. The category is
    # the loop Inductor generated (its prefix): a gather fused into a pointwise loop stays
    # pointwise. Scans and sorts are their own loops (tl.associative_scan / tl.sort, "spl" = split
    # scan), recognised by the op in the name ---
    # --- kernelab's compiler: kl_fused_<ops>; a reduction kernel always names its reduction ---
    (re.compile(r"^kl_fused_\w*(sum|mean|amax|amin|var)"), "reduction"),
    (re.compile(r"^kl_fused_"), "pointwise"),
    (re.compile(r"^triton_\w*?_fused\w*_(cumsum|cumprod|logcumsumexp|cummax|cummin)"), "scan"),
    (re.compile(r"^triton_\w*?_fused\w*_(sort|topk|argsort)"), "sort"),
    (re.compile(r"^triton_(poi|for)_"), "pointwise"),
    (re.compile(r"^triton_(red|per)_"), "reduction"),
    (re.compile(r"^triton_tem_fused\w*(flex_attention|sdpa)"), "attention"),
    (re.compile(r"^triton_tem_"), "matmul"),            # mm / addmm / bmm / conv templates
    (re.compile(r"^triton_spl_|^triton_\w*scan"), "scan"),
    # --- fused attention (before matmul: fmha_cutlass* names contain "cutlass") ---
    ("flash_fwd", "attention"), ("flash_bwd", "attention"), ("flash::", "attention"),
    ("fmha", "attention"), ("attention", "attention"), ("sdpa", "attention"),
    # --- cub's device-wide scans are scans whoever calls them (top-k runs scan-by-key passes) ---
    ("devicescan", "scan"), ("mbtopk::fill", "fill"),
    # --- sort and top-k (before gather/scan: "gatherTopK", cub's ExclusiveSum inside a sort) ---
    ("topk", "sort"), ("radixsort", "sort"), ("radix_sort", "sort"), ("bitonic", "sort"),
    ("segmented_sort", "sort"), ("sortkeyvalue", "sort"), ("sort_postprocess", "sort"),
    ("fill_index_and_segment", "sort"), ("radixfindkthvalues", "sort"),
    ("computeblockwise", "sort"), ("computedigitcumsum", "sort"),
    # --- scans: cumsum and friends, cub's device scan ---
    ("tensor_kernel_scan", "scan"), ("scan_innermost", "scan"),
    ("scan_outer_dim", "scan"), ("cumsum", "scan"),
    # --- convolution (cuDNN and its layout shuffles) before generic gemm names ---
    ("fprop", "conv"), ("dgrad", "conv"), ("wgrad", "conv"), ("implicit_convolve", "conv"),
    ("conv2d", "conv"), ("convolve", "conv"), ("conv_", "conv"), ("winograd", "conv"),
    ("nchwtonhwc", "copy"), ("nhwctonchw", "copy"),
    # --- batch norm: inference is y = (x - mean) * invstd * w + b, a pure pointwise pass; the
    # training kernels reduce each channel's mean/var (forward) or grad sums (backward) ---
    ("bn_fw_inf", "pointwise"), ("batch_norm_transform_input", "pointwise"),
    ("batch_norm", "reduction"), ("batchnorm", "reduction"), ("bn_fw_tr", "reduction"),
    ("bn_bw", "reduction"),
    # --- cuBLAS(Lt)'s split-K partial-sum kernels belong to the matmul (before "reduce_kernel") ---
    ("splitkreduce", "matmul"), ("cublaslt", "matmul"),
    # --- row-wise reductions that PyTorch writes as dedicated kernels ---
    ("softmax", "reduction"), ("layer_norm", "reduction"), ("layernorm", "reduction"),
    ("rowwisemoments", "reduction"), ("gammabetabackward", "reduction"),
    ("compute_gradients_kernel", "reduction"), ("rms_norm", "reduction"),
    ("nll_loss", "reduction"), ("cross_entropy", "reduction"), ("reduce_kernel", "reduction"),
    ("devicereduce", "reduction"), ("devicesegmentedreduce", "reduction"),
    ("welford", "reduction"), ("norm_kernel", "reduction"),
    # --- matrix multiply: cuBLAS / cuBLASLt / CUTLASS kernels, split-K reductions ---
    ("gemm", "matmul"), ("gemv", "matmul"), ("cutlass", "matmul"), ("cublas", "matmul"),
    ("xmma", "matmul"), ("nvjet", "matmul"), ("sgemm", "matmul"),
    ("hgemm", "matmul"), ("dot_kernel", "matmul"),
    # --- factories that compute their values from the index (before "index") ---
    ("arange", "fill"), ("range_kernel", "fill"), ("linspace", "fill"),
    # --- masked_fill reads x and the mask: pointwise (before "fill_kernel") ---
    ("masked_fill", "pointwise"),
    # --- gather / scatter / indexing / embedding / boolean masking (before "elementwise":
    # index_elementwise_kernel and scatter_gather_elementwise_kernel wrap these) ---
    ("index", "index"), ("gather", "index"), ("scatter", "index"), ("embedding", "index"),
    ("take_kernel", "index"), ("put_kernel", "index"), ("masked_select", "index"),
    ("deviceselect", "index"), ("devicecompact", "index"), ("write_indices", "index"),
    ("uniquebykey", "index"), ("deviceunique", "index"),
    ("krn_partial", "index"), ("compute_grad_weight", "index"), ("sum_and_scatter", "index"),
    ("segment_offsets", "index"), ("compute_num_of_partial_segments", "index"),
    ("nonzero", "index"), ("flag_kernel", "index"),
    # --- concatenation and plain copies (including dtype casts and strided -> contiguous) ---
    ("catarraybatchedcopy", "copy"), ("cat_array", "copy"), ("direct_copy_kernel", "copy"),
    ("copy_kernel", "copy"), ("copy_device_to_device", "copy"), ("transpose", "copy"),
    # --- fills: zeros/ones/full write a constant, reading nothing ---
    ("fillfunctor", "fill"), ("fill_kernel", "fill"),
    # --- everything else PyTorch runs through its TensorIterator elementwise templates ---
    ("elementwise_kernel", "pointwise"), ("elementwise", "pointwise"),
    ("foreach", "pointwise"), ("multi_tensor_apply", "pointwise"),
)

# Device event categories in the profiler's chrome trace, and the kind each one is.
_DEVICE_KINDS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}

_MARKER = "kernelab.call[{}]"
_MARKER_RE = re.compile(r"^kernelab\.call\[(\d+)\]$")


@dataclass(frozen=True)
class DeviceKernel:
    """One device activity of one call, in device order."""

    name: str                     # demangled kernel name, or "Memcpy DtoD (Device -> Device)" ...
    kind: str                     # "kernel" | "memcpy" | "memset"
    category: str                 # one of KERNEL_CATEGORIES
    op: str | None                # innermost op that launched it ("aten::add"), None if unknown
    duration_us: float            # median over the timed calls, at this position
    grid: tuple[int, ...] | None  # launch grid (kernels only)
    block: tuple[int, ...] | None # thread block (kernels only)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "category": self.category, "op": self.op,
                "duration_us": round(self.duration_us, 3),
                "grid": list(self.grid) if self.grid else None,
                "block": list(self.block) if self.block else None}


def classify_kernel(name: str) -> str:
    """Category of a device activity from its (demangled) name; "other" when no rule matches."""
    if name.startswith("Memcpy"):
        return "memcpy"
    if name.startswith("Memset"):
        return "memset"
    lowered = name.lower()
    for pattern, category in _RULES:
        if isinstance(pattern, str):
            if pattern in lowered:
                return category
        elif pattern.search(name):
            return category
    return "other"


# ----------------------------------------------------------------------------- Inductor names

def _aten_op_names() -> frozenset[str]:
    """Every aten operator name without overload ("add", "_softmax", "native_layer_norm", ...)."""
    import torch

    names = torch._C._dispatch_get_all_op_names()
    return frozenset(n.split("::", 1)[1].split(".", 1)[0] for n in names if n.startswith("aten::"))


def ops_from_inductor_name(name: str, known_ops: frozenset[str] | None = None) -> list[str]:
    """The aten ops an Inductor Triton kernel fused, read from its name.

    Inductor names kernels ``triton_<poi|red|per|tem|for>_fused_<op>_<op>..._<n>`` where each op is
    an aten name that may itself contain underscores (``_softmax``, ``native_layer_norm``). The
    tokens are split at ``_`` and regrouped greedily into the longest known aten op names.
    """
    match = re.match(r"^triton_[a-z]+_fused(.*?)(?:_\d+)?$", name)
    if not match:
        return []
    body = match.group(1)[1:]  # drop the "_" after "fused"
    if not body:
        return []
    known = known_ops if known_ops is not None else _aten_op_names()
    tokens = body.split("_")  # a leading "_" of an op name becomes an empty token
    ops, i = [], 0
    while i < len(tokens):
        span = _longest_op(tokens, i, known)
        ops.append("_".join(tokens[i:i + span]))
        i += span
    return [op for op in ops if op]


def _longest_op(tokens: list[str], start: int, known: frozenset[str]) -> int:
    """Number of tokens from `start` forming the longest known op name (1 if none is known)."""
    for end in range(len(tokens), start, -1):
        if "_".join(tokens[start:end]) in known:
            return end - start
    # an unknown op starting with "_" keeps its underscore: "", "foo" -> "_foo"
    return 2 if tokens[start] == "" and start + 1 < len(tokens) else 1


# ----------------------------------------------------------------------------- trace parsing

@dataclass(frozen=True)
class _RawDeviceEvent:
    name: str
    kind: str
    op: str | None
    duration_us: float
    grid: tuple[int, ...] | None
    block: tuple[int, ...] | None


def _is_op_name(name: str) -> bool:
    """An operator (namespace::op), not an autograd wrapper or one of our call markers."""
    if "::" not in name or _MARKER_RE.match(name):
        return False
    return not name.startswith(("autograd::", "torch::autograd", "torch::"))


def _innermost_op(cpu_events: list[dict], tid: Any, ts: float) -> str | None:
    """Innermost op on thread `tid` whose [ts, ts+dur] holds the instant `ts`."""
    best, best_dur = None, float("inf")
    for ev in cpu_events:
        if ev.get("tid") != tid or not _is_op_name(ev["name"]):
            continue
        start, dur = ev["ts"], ev.get("dur", 0)
        if start <= ts <= start + dur and dur <= best_dur:
            best, best_dur = ev["name"], dur
    return best


def _call_ranges(events: list[dict]) -> dict[int, tuple[float, float]]:
    """Call index -> CPU time range of its kernelab.call[i] record_function range."""
    ranges = {}
    for ev in events:
        m = _MARKER_RE.match(ev.get("name", ""))
        if m and ev.get("cat") == "user_annotation" and ev.get("ph") == "X":
            ranges[int(m.group(1))] = (ev["ts"], ev["ts"] + ev.get("dur", 0))
    return ranges


def _triple(value: Any) -> tuple[int, ...] | None:
    return tuple(int(v) for v in value) if isinstance(value, (list, tuple)) else None


def _launch_site(ev: dict, launches: dict, by_external: dict) -> tuple[Any, float] | None:
    """(thread, CPU timestamp) where the device event `ev` was launched."""
    args = ev.get("args", {})
    launch = launches.get(args.get("correlation"))
    if launch is not None:
        return launch["tid"], launch["ts"]
    cpu = by_external.get(args.get("External id"))
    if cpu is not None:
        return cpu["tid"], cpu["ts"]
    return None


def kernels_from_trace(trace: dict, n_calls: int) -> list[list[_RawDeviceEvent]]:
    """Split a chrome trace's device events into the kernels of each timed call, device order."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    cpu_ops = [e for e in events if e.get("cat") in ("cpu_op", "user_annotation")]
    device = sorted((e for e in events if e.get("cat") in _DEVICE_KINDS), key=lambda e: e["ts"])
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    by_external = {e["args"]["External id"]: e for e in cpu_ops if "External id" in e.get("args", {})}
    ranges = _call_ranges(events)
    if sorted(ranges) != list(range(n_calls)):
        raise RuntimeError(f"profiler trace holds call ranges {sorted(ranges)}, expected 0..{n_calls - 1}")
    calls: list[list[_RawDeviceEvent]] = [[] for _ in range(n_calls)]
    for ev in device:
        site = _launch_site(ev, launches, by_external)
        if site is None:
            raise RuntimeError(f"cannot find the launch of device event {ev['name'][:80]!r} in the trace")
        tid, ts = site
        index = next((i for i, (lo, hi) in ranges.items() if lo <= ts <= hi), None)
        if index is None:
            continue  # launched outside the timed calls (e.g. by reset())
        args = ev.get("args", {})
        calls[index].append(_RawDeviceEvent(
            name=ev["name"], kind=_DEVICE_KINDS[ev["cat"]], op=_innermost_op(cpu_ops, tid, ts),
            duration_us=float(ev.get("dur", 0.0)), grid=_triple(args.get("grid")),
            block=_triple(args.get("block"))))
    return calls


def _merge_calls(calls: list[list[_RawDeviceEvent]]) -> list[DeviceKernel]:
    """One call's kernels with the median duration per position; calls must agree exactly."""
    first = [(e.name, e.kind) for e in calls[0]]
    for i, call in enumerate(calls[1:], start=1):
        other = [(e.name, e.kind) for e in call]
        if other != first:
            pos = next((p for p, (a, b) in enumerate(zip(first, other)) if a != b), min(len(first), len(other)))
            raise RuntimeError(
                f"calls launch different kernels: call 0 has {len(first)}, call {i} has {len(other)}; "
                f"first difference at position {pos}: "
                f"{first[pos][0][:60] if pos < len(first) else None!r} vs "
                f"{other[pos][0][:60] if pos < len(other) else None!r}")
    return [DeviceKernel(name=e.name, kind=e.kind, category=classify_kernel(e.name), op=e.op,
                         duration_us=statistics.median(c[p].duration_us for c in calls),
                         grid=e.grid, block=e.block)
            for p, e in enumerate(calls[0])]


# ----------------------------------------------------------------------------- measuring

def _profile_calls(fn: Callable, args: Sequence, reset: Callable[[], None], repeat: int) -> dict:
    """Run `repeat` marked calls under the profiler and return its chrome trace as a dict."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with tempfile.TemporaryDirectory(prefix="kernelab_") as tmp:
        path = os.path.join(tmp, "trace.json")
        with profile(activities=activities) as prof:  # stopped by __exit__, even if fn raises
            for i in range(repeat):
                reset()
                with record_function(_MARKER.format(i)):
                    fn(*args)
                    torch.cuda.synchronize()  # every kernel of call i finishes inside its range
        prof.export_chrome_trace(path)
        with open(path) as f:
            return json.load(f)


def measure_kernels(fn: Callable, args: Sequence, *, reset: Callable[[], None] = lambda: None,
                    warmup: int = 3, repeat: int = 5) -> list[DeviceKernel]:
    """The device kernels, memcpys and memsets that one call of ``fn(*args)`` launches.

    ``reset()`` runs before every call (e.g. ``PreparedTarget.reset_grads``), warm-up included,
    so every call starts from the same state. Durations are medians over ``repeat`` calls.
    """
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("measure_kernels needs a CUDA device; none is available")
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    for _ in range(warmup):  # compile, autotune, cuBLAS/cuDNN plan selection, allocator growth
        reset()
        fn(*args)
    torch.cuda.synchronize()
    trace = _profile_calls(fn, args, reset, repeat)
    return _merge_calls(kernels_from_trace(trace, repeat))
