"""Turn one GPU run's output (benchmarks/run_gpu.sh) into CSV rows under benchmarks/results/.

    python benchmarks/record_results.py DIR_WITH_counts_h200.json_AND_tour.json

Every row carries the GPU, torch and triton versions and the date of the run. Prints markdown
tables for the README.
"""
from __future__ import annotations

import csv
import json
import shutil
import sys
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def _write(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def counts(run: Path) -> list[dict]:
    data = json.loads((run / "counts_h200.json").read_text())
    meta = {k: data[k] for k in ("gpu", "torch", "triton", "date")}
    rows = []
    for r in data["rows"]:
        m, p = r.get("measured") or {}, r.get("predicted") or {}
        rows.append({**meta, "program": r["program"], "mode": r["mode"],
                     "measured_kernels": m.get("num_kernels"), "measured_memops": m.get("num_memops"),
                     "predicted_kernels": p.get("num_kernels"), "predicted_memops": p.get("num_memops"),
                     "categories_match": r["match"], "measured_time_us": m.get("time_us"),
                     "error": r.get("error", "")})
    return rows


def sweep(run: Path, meta: dict) -> list[dict]:
    data = json.loads((run / "tour.json").read_text())
    return [{**meta, **row} for row in data["sweep"]]


def main(argv=None) -> int:
    run = Path((argv or sys.argv[1:])[0])
    count_rows = counts(run)
    meta = {k: count_rows[0][k] for k in ("gpu", "torch", "triton", "date")}
    RESULTS.mkdir(exist_ok=True)
    _write(RESULTS / "counts_h200.csv", count_rows)
    if (run / "tour.json").exists():
        _write(RESULTS / "sweep_add_relu_h200.csv", sweep(run, meta))
    for name in ("tour_sweep.png", "ceilings.json"):
        if (run / name).exists():
            shutil.copy(run / name, RESULTS / name.replace("tour_sweep", "sweep_add_relu_h200"))
    matched = sum(r["categories_match"] for r in count_rows)
    print(f"{matched}/{len(count_rows)} program-modes: measured == predicted ({meta['gpu']}, torch {meta['torch']}, "
          f"triton {meta['triton']}, {meta['date']})")
    for r in count_rows:
        if not r["categories_match"]:
            print(f"- {r['program']} ({r['mode']}): measured {r['measured_kernels']}+{r['measured_memops']}, "
                  f"predicted {r['predicted_kernels']}+{r['predicted_memops']} {r['error']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
