"""Record ground truth on a real GPU: which kernels every built-in program launches.

For each program in kernelab.programs, in eager PyTorch and under torch.compile (Inductor, default
backend), measure the device kernels, memcpys and memsets of one call with torch.profiler (after
warm-up, median durations over the timed calls) and write them as JSON:

    python benchmarks/record_truth.py OUT.json [--only add_relu,softmax] [--modes eager,inductor]
        [--set builtin|grids-fit|grids-fresh|zoo]

``--set`` picks the programs: the built-in ones (default; tests/data/kernels_h200.json), the random
library-heuristic grids of ``kernelab.truth_grids`` (``grids-fit``: the sample the eager rules were
written from, tests/data/grids_fit_h200.json; ``grids-fresh``: a second sample drawn with another
seed, without the programs of the first, recorded after the rules were written,
tests/data/grids_fresh_h200.json), or one training step of every zoo model at benchmark size
(``zoo``; tests/data/zoo_h200.json). Kernel names are cut to 240 characters outside the built-in set.

The JSON is rewritten after every program, so a run cut short still leaves what it measured.
Errors (a compile failure, a measurement refused) are recorded per program and mode, one line each.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

MODES = ("eager", "inductor")
SETS = ("builtin", "grids-fit", "grids-fresh", "zoo")
GRID_SEEDS = {"grids-fit": 0, "grids-fresh": 1}
NAME_CHARS = 240


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="path of the JSON file to write")
    p.add_argument("--only", default="", help="comma-separated program names (default: all)")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated: eager,inductor")
    p.add_argument("--set", default="builtin", choices=SETS, dest="program_set")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--budget-s", type=float, default=480.0,
                   help="stop starting new compiles after this many seconds (eager still runs)")
    return p.parse_args(argv)


def configure_inductor() -> None:
    """Compile Triton kernels in parallel worker processes, one per core (at most 16)."""
    import torch._inductor.config as inductor_config

    inductor_config.compile_threads = max(1, min(16, os.cpu_count() or 1))
    try:  # start the compile workers now, while the eager runs keep the main process busy
        from torch._inductor.async_compile import AsyncCompile
        AsyncCompile.warm_pool()
    except Exception:  # an older/newer torch without it only loses the head start
        pass


def error_line(exc: BaseException) -> str:
    """One line naming the exception: the first non-empty line of its message, capped."""
    text = str(exc).strip().splitlines()
    first = next((line for line in text if line.strip()), "")
    return f"{type(exc).__name__}: {first}"[:400]


def measure_mode(program, mode: str, warmup: int, repeat: int) -> list[dict]:
    """Kernels of one call of `program` in `mode`, on a fresh copy of its target and args."""
    import torch

    from kernelab.measure import measure_kernels
    from kernelab.targets import prepare_on_device

    prepared = prepare_on_device(program.make_target(), program.make_args(), "cuda")
    fn = prepared.fn
    if mode == "inductor":
        torch._dynamo.reset()  # no program reuses another's graphs or guards
        fn = torch.compile(fn)
    kernels = measure_kernels(fn, prepared.args, reset=prepared.reset_grads, warmup=warmup,
                              repeat=repeat)
    return [k.to_json() for k in kernels]


def shortened(kernels: list[dict]) -> list[dict]:
    return [{**k, "name": k["name"][:NAME_CHARS]} for k in kernels]


def record_program(program, modes, args, deadline: float) -> dict:
    entry = {"description": program.description, "errors": {}, "wall_s": {}}
    for mode in modes:
        entry[mode] = []
        if mode == "inductor" and time.monotonic() > deadline:
            entry["errors"][mode] = "skipped: the run's time budget was spent before this compile"
            continue
        start = time.monotonic()
        try:
            entry[mode] = measure_mode(program, mode, args.warmup, args.repeat)
            if args.program_set != "builtin":
                entry[mode] = shortened(entry[mode])
        except Exception as exc:  # recorded, and the run goes on with the next program
            entry["errors"][mode] = error_line(exc)
        entry["wall_s"][mode] = round(time.monotonic() - start, 2)
    return entry


def header() -> dict:
    import torch
    import triton

    return {"schema": 1, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": triton.__version__, "cuda": torch.version.cuda,
            "date": datetime.date.today().isoformat(),
            # the defaults that pick eager kernels: TF32 for cuDNN convs, full fp32 for cuBLAS
            "settings": {"cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
                         "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
                         "float32_matmul_precision": torch.get_float32_matmul_precision()},
            "programs": {}}


def write_json(path: str, doc: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


def counts(kernels: list[dict]) -> str:
    """'kernels/memops' for one mode."""
    n_kernels = sum(k["kind"] == "kernel" for k in kernels)
    return f"{n_kernels}/{len(kernels) - n_kernels}"


def progress_line(name: str, entry: dict, modes) -> str:
    parts = [f"{m} {counts(entry[m]) if m not in entry['errors'] else 'ERROR'} "
             f"({entry['wall_s'].get(m, 0):.1f}s)" for m in modes]
    errs = "".join(f"\n    {m}: {e}" for m, e in entry["errors"].items())
    return f"{name}: " + ", ".join(parts) + errs


def summary_table(doc: dict, modes):
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"kernels/memops per call on {doc['gpu']} (torch {doc['torch']})")
    table.add_column("program")
    for mode in modes:
        table.add_column(mode, justify="right")
    table.add_column("errors")
    for name, entry in doc["programs"].items():
        cells = [counts(entry.get(m, [])) if m not in entry["errors"] else "-" for m in modes]
        errs = "; ".join(f"{m}: {e[:60]}" for m, e in entry["errors"].items())
        table.add_row(name, *cells, escape(errs))
    return table


def program_table(program_set: str) -> dict:
    """name -> Program of one set (see the module's docstring)."""
    from kernelab import truth_grids
    from kernelab.programs import all_programs

    if program_set == "builtin":
        return all_programs()
    if program_set == "zoo":
        return truth_grids.zoo_programs()
    programs = truth_grids.grid_programs(GRID_SEEDS[program_set])
    if program_set == "grids-fresh":
        fitted = truth_grids.grid_programs(GRID_SEEDS["grids-fit"])
        programs = {n: p for n, p in programs.items() if n not in fitted}
    return programs


def select_programs(only: str, program_set: str = "builtin"):
    programs = program_table(program_set)
    if not only:
        return list(programs.values())
    names = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in programs]
    if unknown:
        raise SystemExit(f"unknown program(s): {', '.join(unknown)}; known: {', '.join(programs)}")
    return [programs[n] for n in names]


def main(argv=None) -> int:
    import torch
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("record_truth.py needs a CUDA GPU: torch.cuda.is_available() is False")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise SystemExit(f"unknown mode(s) {bad}; choose from {MODES}")
    programs = select_programs(args.only, args.program_set)
    if "inductor" in modes:
        configure_inductor()
    deadline = time.monotonic() + args.budget_s
    doc = header()
    doc["set"] = args.program_set
    console = Console()
    columns = (TextColumn("{task.description:<40}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("recording", total=len(programs))
        for program in programs:
            progress.update(task, description=program.name)
            entry = record_program(program, modes, args, deadline)
            doc["programs"][program.name] = entry
            write_json(args.out, doc)
            progress.console.print(progress_line(program.name, entry, modes), markup=False, highlight=False)
            progress.advance(task)
    console.print(summary_table(doc, modes))
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
