#!/usr/bin/env python
"""How well kernelab's CPU predictions match what the H200 launched: the truth grids and the zoo.

    python3 benchmarks/truth_report.py [--misses gemm|conv|sort|reduce|zoo] [--out FILE]

Predicts every program of tests/data/grids_{fit,fresh}_h200.json and zoo_h200.json on fake tensors
(no GPU needed), eager and Inductor where recorded, and prints per file, mode and family the exact
matches (category sequence, memops included) and, for the zoo, the category overlap per model.
``--misses FAMILY`` also prints each mismatching program's recorded and predicted sequences.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FILES = ("grids_fit_h200.json", "grids_fresh_h200.json", "zoo_h200.json")


def main(argv=None) -> int:
    from rich.console import Console
    from rich.table import Table

    from kernelab import truth_grids

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--misses", default="", help="print the mismatches of this family")
    ap.add_argument("--out", type=Path, help="also write the table here")
    args = ap.parse_args(argv)
    programs = {**truth_grids.grid_programs(0), **truth_grids.grid_programs(1), **truth_grids.zoo_programs()}
    console = Console(width=120, record=True)
    table = Table(title="CPU prediction vs H200 truth: exact category sequences (and zoo overlap)")
    for col in ("file", "mode", "family", "exact", "programs", "%", "mean overlap"):
        table.add_column(col)
    for name in FILES:
        truth = json.loads((ROOT / "tests" / "data" / name).read_text())
        for mode in ("eager", "inductor"):
            rows = truth_grids.compare(truth, programs, mode)
            for fam, (exact, total) in sorted(truth_grids.accuracy(rows).items()):
                mean = sum(r["overlap"] for r in rows if fam in (r["family"], "all")) / max(total, 1)
                table.add_row(name, mode, fam, str(exact), str(total), f"{100 * exact / max(total, 1):.0f}", f"{mean:.3f}")
            for r in rows:
                if not r["exact"] and args.misses == r["family"]:
                    console.print(f"{r['program']} ({mode}, overlap {r['overlap']:.3f})\n  recorded  {r['recorded'][:40]}"
                                  f"\n  predicted {r['predicted'][:40]}", markup=False, highlight=False)
    console.print(table)
    if args.out:
        args.out.write_text(console.export_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
