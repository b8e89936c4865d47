"""A report as a Chrome trace (``chrome://tracing``, Perfetto's "Open trace file"): ``to_chrome_trace``.

Trace Event Format, JSON object form: ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``.
One process per report (mode), named by metadata events (``ph: "M"``); in it two lanes:

* tid 1, "call (host + GPU)": one complete event (``ph: "X"``) for one whole call of the target;
* tid 2, "GPU kernels": one complete event per kernel, in launch order, back to back from 0.

Times are microseconds (the format's unit). A kernel's ``cat`` is its kernelab category
(pointwise, matmul, ...); its ``args`` carry what the report knows: full name, ops, bytes read and
written, FLOPs, module path(s), source line, backward or not, % of the ceiling that binds it, and
whether its time was measured or predicted. A kernel without a time is left out (``otherData``
counts them). Kernels are laid back to back because a report keeps each kernel's duration, not its
start: gaps between kernels are not in the trace.
"""
from __future__ import annotations

from .report import Report, as_reports, short_kernel_name

CALL_TID = 1
KERNEL_TID = 2


def _metadata(pid: int, report: Report) -> list[dict]:
    how = "measured" if report.measured else "predicted"
    names = [("process_name", None, f"kernelab {report.mode} ({how}): {report.target}"),
             ("thread_name", CALL_TID, "call (host + GPU)"), ("thread_name", KERNEL_TID, "GPU kernels")]
    events = [{"name": name, "ph": "M", "ts": 0, "pid": pid, "tid": tid or 0, "args": {"name": label}}
              for name, tid, label in names]
    events.append({"name": "process_sort_index", "ph": "M", "ts": 0, "pid": pid, "tid": 0,
                   "args": {"sort_index": pid}})
    return events


def _kernel_args(k, index: int, report: Report) -> dict:
    return {
        "index": index, "name": k.name, "category": k.category, "kind": k.kind, "ops": list(k.ops),
        "launches": k.launches, "bytes_read": k.bytes_read, "bytes_written": k.bytes_written, "flops": k.flops,
        "module": k.module or report.target, "modules": list(k.modules), "source": k.source,
        "backward": k.backward, "bytes_over_ideal": k.bytes_over_ideal, "pct_of_ceiling": k.pct_of_ceiling,
        "bound": k.bound, "time": "measured" if k.measured else "predicted", "confidence": k.confidence,
        "reason": k.reason,
    }


def _report_events(pid: int, report: Report) -> tuple[list[dict], int]:
    """The report's events and how many of its kernels have no time (left out)."""
    how = "measured" if report.measured else "predicted"
    events = _metadata(pid, report)
    if report.wall_time_us:
        events.append({"name": f"{report.target} ({report.mode})", "cat": "call", "ph": "X", "ts": 0.0,
                       "dur": report.wall_time_us, "pid": pid, "tid": CALL_TID,
                       "args": {"time": how, "kernels": report.num_kernels, "memops": report.num_memops,
                                "bytes": report.bytes, "ideal_bytes": report.ideal_bytes,
                                "round_trips": len(report.round_trips), "kernel_time_us": report.kernel_time_us}})
    clock, untimed = 0.0, 0
    for i, k in enumerate(report.kernels):
        if k.time_us is None:
            untimed += 1
            continue
        events.append({"name": short_kernel_name(k.name), "cat": k.category, "ph": "X", "ts": clock,
                       "dur": k.time_us, "pid": pid, "tid": KERNEL_TID, "args": _kernel_args(k, i, report)})
        clock += k.time_us
    return events, untimed


def to_chrome_trace(reports) -> dict:
    """A Report (or a list of them, or a Comparison) as a Chrome trace: one process per mode, its
    kernels in launch order with their bytes, FLOPs, module and source in ``args``. Write it with
    ``json.dump``; open it in Perfetto or chrome://tracing."""
    events, other = [], {"reports": []}
    for pid, report in enumerate(as_reports(reports), start=1):
        report_events, untimed = _report_events(pid, report)
        events += report_events
        other["reports"].append({"pid": pid, "mode": report.mode, "target": report.target, "device": report.device,
                                 "measured": report.measured, "kernels_without_time": untimed,
                                 "notes": list(report.notes)})
    from . import __version__

    other["kernelab"] = __version__
    other["layout"] = "kernels back to back in launch order from 0 (a report keeps durations, not start times)"
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}
