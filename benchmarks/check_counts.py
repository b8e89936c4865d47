"""On a GPU: for every built-in program and mode, measured kernels against predicted ones.

    python benchmarks/check_counts.py OUT.json [--modes eager,inductor] [--only a,b]

Prediction runs on fake tensors exactly as on a machine without a GPU; measurement runs the real
program under torch.profiler through ``kernelab.count``. Prints a table (last) of kernel counts,
memop counts and whether the category sequences agree; writes every kernel of both to OUT.json
with the GPU, torch/triton versions and the date.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import traceback

import torch
from rich.console import Console
from rich.progress import track
from rich.table import Table

import kernelab
from kernelab.programs import all_programs


def _summary(report) -> dict:
    return {"num_kernels": report.num_kernels, "num_memops": report.num_memops,
            "categories": report.categories, "kernels": [k.to_dict() for k in report.kernels],
            "transfers": report.transfers, "time_us": report.time_us}


def check(name, program, mode) -> dict:
    row = {"program": name, "mode": mode}
    try:
        target, args = program.make_target(), program.make_args()
        predicted = kernelab.count(target, *args, mode=mode, predict=True)
        row["predicted"] = _summary(predicted)
        measured = kernelab.count(target, *args, mode=mode, predict=False)
        row["measured"] = _summary(measured)
        row["match"] = (predicted.num_kernels, predicted.num_memops, predicted.categories) == (
            measured.num_kernels, measured.num_memops, measured.categories)
    except Exception as exc:  # one program's failure must not hide the others
        row["error"] = f"{type(exc).__name__}: {exc}"
        row["traceback"] = traceback.format_exc(limit=4)
        row["match"] = False
    finally:
        torch._dynamo.reset()
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--modes", default="eager,inductor")
    parser.add_argument("--only", default="")
    args = parser.parse_args(argv)
    programs = all_programs()
    names = [n for n in programs if not args.only or n in args.only.split(",")]
    jobs = [(n, m) for n in names for m in args.modes.split(",")]
    rows = [check(n, programs[n], m) for n, m in track(jobs, description="programs")]
    import triton

    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "date": datetime.date.today().isoformat()}
    with open(args.out, "w") as f:
        json.dump({"schema": 1, **meta, "rows": rows}, f, indent=1, default=str)
    table = Table(title=f"measured vs predicted on {meta['gpu']}, torch {meta['torch']}, {meta['date']}")
    for col in ("program", "mode", "measured k+m", "predicted k+m", "match"):
        table.add_column(col)
    for r in rows:
        fmt = lambda s: f"{s['num_kernels']}+{s['num_memops']}" if s else "-"  # noqa: E731
        table.add_row(r["program"], r["mode"], fmt(r.get("measured")), fmt(r.get("predicted")),
                      "yes" if r["match"] else ("ERROR " + r["error"][:60] if "error" in r else "NO"))
    console = Console(width=140)
    console.print(table)
    matched = sum(r["match"] for r in rows)
    console.print(f"{matched}/{len(rows)} program-modes match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
