#!/usr/bin/env python
"""GPU check of issue 13 part 1: every *measured* kernel of a tiny GPT-2 is tied to a module.

    PYTHONPATH=. python3 benchmarks/modules_check.py OUT_DIR [--budget-s 150]

For a training step (eager, Inductor, kernelab) and an inference call (eager) of the zoo's tiny
GPT-2 on CUDA, ``kernelab.count(..., predict=False)`` measures the kernels with torch.profiler and
pairs each with a predicted kernel, which carries the module path and source line captured on the
GPU. Checks, per case: every measured kernel has a module path; every path is one of the model's
``named_modules()`` (or the step function itself); how many kernels got their module from a
predicted kernel they paired with, and how many only from the kernel launched next to them. Then
the measured and predicted module trees are compared: kernels per GPT-2 block and per top-level
module. Prints each case's module tree (module totals only) and a table last; writes
OUT_DIR/modules_check.csv (GPU, torch, triton, date in every row) and OUT_DIR/modules_<case>.json
(the full measured reports). Exit 1 if a check fails. Cases past ``--budget-s`` are skipped, and
say so.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CASES = (("train", "eager"), ("train", "inductor"), ("train", "kernelab"), ("infer", "eager"))


def _target(kind: str, device: str = "cuda"):
    """The step function and its one argument; the model is a global of this module (``model``)."""
    import torch

    from kernelab.zoo import ZOO

    global model
    zm = ZOO["gpt2"]
    model, inputs = zm.build("tiny", device=device, dtype=torch.float32)

    def train_step(inputs):
        model.zero_grad(set_to_none=True)  # every call launches what the first one did
        zm.loss(model, inputs).backward()

    def infer(inputs):
        with torch.no_grad():
            return zm.forward(model, inputs)

    return (train_step if kind == "train" else infer), inputs


def _known_paths() -> set[str]:
    return {""} | {f"model.{name}" if name else "model" for name, _ in model.named_modules()}


def _per_block(report) -> dict[str, int]:
    """Kernel launches per top-level module and per GPT-2 block (``model.transformer.h.N``)."""
    root = report.by_module()
    counts = {}
    for node in root.walk():
        parts = node.path.split(".")
        if node.path.count(".") <= 1 or (len(parts) == 4 and parts[2] == "h"):
            counts[node.path or "(step)"] = node.totals.kernels
    return counts


def check_case(kind: str, mode: str, out: Path, device: str = "cuda") -> dict:
    import kernelab
    from kernelab.module_tree import wasters_line

    fn, inputs = _target(kind, device)
    t0 = time.perf_counter()
    measured = kernelab.count(fn, inputs, mode=mode, predict=device != "cuda", name=f"gpt2-{kind}")
    predicted = kernelab.count(fn, inputs, mode=mode, predict=True, name=f"gpt2-{kind}")
    seconds = time.perf_counter() - t0
    (out / f"modules_{kind}_{mode}.json").write_text(json.dumps(measured.to_dict(), indent=1, default=str))
    known = _known_paths()
    no_module = [k.name for k in measured.kernels if not k.modules]
    unknown = sorted({m for k in measured.kernels for m in k.modules} - known)
    from_neighbour = sum("launched next to it" in k.reason for k in measured.kernels)
    with_source = sum(bool(k.source) for k in measured.kernels)
    m_blocks, p_blocks = _per_block(measured), _per_block(predicted)
    differ = {p: (m_blocks.get(p, 0), p_blocks.get(p, 0)) for p in sorted(set(m_blocks) | set(p_blocks))
              if m_blocks.get(p, 0) != p_blocks.get(p, 0)}
    ok = not no_module and not unknown
    print(f"\n=== gpt2 tiny {kind} {mode}: {'PASS' if ok else 'FAIL'} ({seconds:.1f} s)")
    print(measured.module_tree(sort="time", kernels=False))
    if no_module:
        print(f"  kernels without a module: {no_module[:10]}")
    if unknown:
        print(f"  paths that are not modules of the model: {unknown[:10]}")
    print(f"  measured vs predicted kernels per module, where they differ: {differ or 'none'}")
    return {"case": f"{kind}/{mode}", "status": "PASS" if ok else "FAIL", "kernels": len(measured.kernels),
            "no_module": len(no_module), "unknown_paths": len(unknown), "module_from_neighbour": from_neighbour,
            "with_source": with_source, "predicted_kernels": len(predicted.kernels),
            "blocks_differ": json.dumps(differ), "top_wasters": wasters_line(measured.by_module(), measured.target),
            "seconds": round(seconds, 1)}


def main() -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="directory for modules_check.csv and the JSON reports")
    ap.add_argument("--budget-s", type=float, default=150.0, help="skip the cases left after this many seconds")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (it measures kernels)")
    args.out.mkdir(parents=True, exist_ok=True)
    start, rows = time.perf_counter(), []
    for kind, mode in CASES:
        if time.perf_counter() - start > args.budget_s:
            print(f"budget of {args.budget_s:g} s spent: skipping {kind}/{mode}")
            rows.append({"case": f"{kind}/{mode}", "status": "SKIPPED (budget)"})
            continue
        try:
            rows.append(check_case(kind, mode, args.out))
        except Exception as exc:  # one case failing must not hide the others
            print(f"{kind}/{mode}: ERROR {type(exc).__name__}: {exc}")
            rows.append({"case": f"{kind}/{mode}", "status": f"ERROR {type(exc).__name__}: {str(exc)[:200]}"})
    _write_csv(args.out / "modules_check.csv", rows)
    _print_table(rows)
    return 0 if all(r["status"] in ("PASS", "SKIPPED (budget)") for r in rows) else 1


def _write_csv(path: Path, rows: list[dict]) -> None:
    import torch

    from kernelab.bench.runner import environment

    versions = environment(torch.device("cuda"))
    fields = list(versions) + sorted({k for r in rows for k in r}, key=lambda k: (k != "case", k != "status", k))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow({**versions, **row})


def _print_table(rows: list[dict]) -> None:
    print(f"\n{'case':<16} {'status':<10} {'kernels':>8} {'no module':>9} {'from neighbour':>14} {'with line':>9}")
    for r in rows:
        print(f"{r['case']:<16} {r['status'][:10]:<10} {r.get('kernels', '-'):>8} {r.get('no_module', '-'):>9} "
              f"{r.get('module_from_neighbour', '-'):>14} {r.get('with_source', '-'):>9}")


if __name__ == "__main__":
    sys.exit(main())
