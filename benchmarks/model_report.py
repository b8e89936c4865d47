#!/usr/bin/env python
"""A real model's kernelab report, measured on the GPU: one HTML page and one Chrome trace (issue 13 part 2).

    PYTHONPATH=. python3 benchmarks/model_report.py OUT_DIR [--budget-s 150] [--model llama] [--size bench]
                                                         [--modes eager,inductor,kernelab]

Counts one training step (forward, loss, backward) of a zoo model built from its config (default: the
Llama-3.2-1B config cut to 4 layers, 4x2048 tokens, bf16) with ``kernelab.count(..., predict=False)``
in each mode: torch.profiler's kernels, each tied to its module and source line, timed against this
GPU's measured ceilings. Checks each report first (every kernel has a module path of the model; the
HTML parses and holds one row per kernel; the trace's kernel events add up to the report's GPU time),
then writes

* OUT_DIR/model_report_<model>.html   all modes side by side (module tree, timeline, roofline)
* OUT_DIR/model_report_<model>.trace.json   Chrome/Perfetto trace, one process per mode
* OUT_DIR/model_report_<model>.json   the reports (``Report.from_dict`` reads them back)
* OUT_DIR/model_report.csv   one row per mode, GPU, torch, triton and date in every row

and prints a table last. Modes left when ``--budget-s`` is spent are skipped, and say so (compiling a
training step takes Inductor and kernelab most of the time). A screenshot for the README is taken
where Chromium is installed: ``chromium --headless --no-sandbox --window-size=1280,2400
--screenshot=report.png file://$PWD/OUT_DIR/model_report_llama.html``.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _step(model_name: str, size: str, device: str = "cuda"):
    """The training step and its one argument; the model is a global of this module (``model``)."""
    import torch

    from kernelab.zoo import ZOO

    global model
    zm = ZOO[model_name]
    model, inputs = zm.build(size, device=device, dtype=zm.dtype if device == "cuda" else torch.float32)

    def train_step(inputs):
        model.zero_grad(set_to_none=True)  # every call launches what the first one did
        zm.loss(model, inputs).backward()

    return train_step, inputs


class _Rows(HTMLParser):
    """Counts the kernel rows (``<tr id="k...">``) of an HTML report; raises on a malformed page."""

    def __init__(self):
        super().__init__()
        self.rows = 0

    def handle_starttag(self, tag, attrs):
        self.rows += tag == "tr" and (dict(attrs).get("id") or "").startswith("k")


def check(report, known: set[str], trace: dict, pid: int) -> list[str]:
    """What must hold of a measured report before it is published; the failures, as lines."""
    problems = []
    no_module = [k.name for k in report.kernels if not k.modules]
    unknown = sorted({m for k in report.kernels for m in k.modules} - known)
    if not report.kernels:
        problems.append("no kernel measured")
    if no_module:
        problems.append(f"{len(no_module)} kernels without a module, e.g. {no_module[:3]}")
    if unknown:
        problems.append(f"paths that are not modules of the model: {unknown[:5]}")
    lane = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == pid and e["tid"] == 2]
    timed = sum(k.time_us for k in report.kernels if k.time_us is not None)
    if abs(sum(e["dur"] for e in lane) - timed) > 1e-6 * max(timed, 1.0):
        problems.append("trace durations do not add up to the report's GPU time")
    return problems


def count_mode(fn, inputs, mode: str, name: str):
    import kernelab

    t0 = time.perf_counter()
    report = kernelab.count(fn, inputs, mode=mode, predict=False, name=name)
    return report, time.perf_counter() - t0


def _row(report, seconds: float, problems: list[str]) -> dict:
    from kernelab.module_tree import wasters_line

    return {"mode": report.mode, "status": "PASS" if not problems else "FAIL: " + "; ".join(problems),
            "kernels": report.num_kernels, "memops": report.num_memops, "bytes": report.bytes,
            "ideal_bytes": report.ideal_bytes, "round_trips": len(report.round_trips),
            "gpu_time_us": report.kernel_time_us, "call_time_us": report.wall_time_us,
            "top_wasters": wasters_line(report.by_module(), report.target), "seconds": round(seconds, 1)}


def main() -> int:
    import torch

    from kernelab.html_report import render_html
    from kernelab.trace import to_chrome_trace

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="directory for the HTML, trace, JSON and CSV")
    ap.add_argument("--budget-s", type=float, default=150.0, help="skip the modes left after this many seconds")
    ap.add_argument("--model", default="llama", help="a kernelab.zoo model (default llama)")
    ap.add_argument("--size", default="bench", choices=("tiny", "bench"))
    ap.add_argument("--modes", default="eager,inductor,kernelab")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (it measures kernels)")
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    fn, inputs = _step(args.model, args.size)
    known = {""} | {f"model.{n}" if n else "model" for n, _ in model.named_modules()}
    name = f"{args.model}-{args.size} training step"
    reports, rows = [], []
    for mode in args.modes.split(","):
        if time.perf_counter() - start > args.budget_s:
            print(f"budget of {args.budget_s:g} s spent: skipping {mode}")
            rows.append({"mode": mode, "status": "SKIPPED (budget)"})
            continue
        try:
            report, seconds = count_mode(fn, inputs, mode, name)
        except Exception as exc:  # one mode failing must not hide the others
            print(f"{mode}: ERROR {type(exc).__name__}: {exc}")
            rows.append({"mode": mode, "status": f"ERROR {type(exc).__name__}: {str(exc)[:200]}"})
            continue
        problems = check(report, known, to_chrome_trace(report), 1)
        reports.append(report)
        rows.append(_row(report, seconds, problems))
        print(f"{mode}: {report.summary()} ({seconds:.0f} s){'' if not problems else ' FAIL ' + '; '.join(problems)}")
    if reports:
        stem = args.out / f"model_report_{args.model}"
        html = render_html(reports, title=f"kernelab — {name} on {torch.cuda.get_device_name()}")
        parsed = _Rows()
        parsed.feed(html)
        if parsed.rows != sum(len(r.kernels) for r in reports):
            print(f"FAIL: the HTML holds {parsed.rows} kernel rows, the reports {sum(len(r.kernels) for r in reports)}")
            rows.append({"mode": "html", "status": "FAIL: kernel rows"})
        Path(f"{stem}.html").write_text(html, encoding="utf-8")
        Path(f"{stem}.trace.json").write_text(json.dumps(to_chrome_trace(reports)))
        Path(f"{stem}.json").write_text(json.dumps([r.to_dict() for r in reports], indent=1, default=str))
        print(f"wrote {stem}.html, .trace.json, .json")
    _write_csv(args.out / "model_report.csv", rows, name)
    _print_table(rows)
    return 0 if all(r["status"] == "PASS" or r["status"].startswith("SKIPPED") for r in rows) else 1


COLUMNS = ("mode", "status", "kernels", "memops", "bytes", "ideal_bytes", "round_trips", "gpu_time_us",
           "call_time_us", "seconds", "top_wasters")


def _write_csv(path: Path, rows: list[dict], name: str) -> None:
    """One line per mode, the GPU, versions, date and target first on every line."""
    import torch

    from kernelab.bench.runner import environment

    env = {**environment(torch.device("cuda")), "target": name}
    columns = list(env) + list(COLUMNS)
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([columns] + [[{**env, **row}.get(c, "") for c in columns] for row in rows])


def _print_table(rows: list[dict]) -> None:
    print(f"\n{'mode':<10} {'status':<10} {'kernels':>8} {'memops':>7} {'GPU time us':>12} {'call us':>10} {'s':>6}")
    for r in rows:
        gpu, call = r.get("gpu_time_us"), r.get("call_time_us")
        print(f"{r['mode']:<10} {r['status'][:10]:<10} {r.get('kernels', '-'):>8} {r.get('memops', '-'):>7} "
              f"{'-' if gpu is None else f'{gpu:.0f}':>12} {'-' if call is None else f'{call:.0f}':>10} "
              f"{r.get('seconds', '-'):>6}")


if __name__ == "__main__":
    sys.exit(main())
