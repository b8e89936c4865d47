"""``kernelab bench OP [--shapes MxN ...] [--dtype bf16] [--backward] [--out DIR]``;
``kernelab bench linear [--shapes MxKxN ...] [--out DIR] [--budget-s S] [--max-autotune]`` (the
GEMM grid of ``kernelab.bench.linear``: its own sections, table, CSV and plot, written to
``DIR/linear/``).

Wire into the main CLI with ``add_parser(subparsers)``; ``run(args)`` returns the exit status.
"""

from __future__ import annotations

import argparse
from pathlib import Path

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}


def _shape(text: str) -> tuple[int, ...]:
    """MxN (the row ops) or MxKxN (linear: rows, in features, out features); checked per op later."""
    try:
        dims = tuple(int(v) for v in text.lower().split("x"))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"shape {text!r} is not MxN or MxKxN") from e
    if len(dims) not in (2, 3) or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"shape {text!r} is not MxN or MxKxN of positive sizes")
    return dims


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench",
        help="time kernelab.ops against PyTorch eager, torch.compile and Liger-Kernel (GPU)",
        description="Check (float64 reference, poisoned outputs) and time an op's providers; print a "
        "table, append CSV rows and save a plot under --out.",
    )
    p.add_argument("op", help="op name, comma-separated names, or 'all'")
    p.add_argument("--shapes", nargs="+", type=_shape, metavar="MxN", help="shapes (default: the op's grid)")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--backward", action="store_true", help="also time forward+backward")
    p.add_argument("--providers", nargs="+", default=None, help="subset of kernelab eager compile liger")
    p.add_argument("--out", default="benchmarks/results", help="directory for the CSV and plots")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--budget-s", type=float, default=150.0, help="linear: no section starts after this many seconds")
    p.add_argument("--max-autotune", action="store_true",
                   help="linear: also Inductor's max-autotune on two shapes (minutes of tuning)")
    p.set_defaults(func=run)
    return p


def _check_request(args) -> list[str]:
    """The op names, checked before anything needs a GPU: a typo is reported everywhere."""
    from kernelab.errors import KernelabError

    from . import runner, specs

    known = specs.specs()
    names = list(known) if args.op == "all" else [n.strip() for n in args.op.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise KernelabError(f"unknown op{'s' if len(unknown) > 1 else ''} {', '.join(unknown) or repr(args.op)}; "
                            f"known: {', '.join(known)} (or 'all')")
    bad = [p for p in args.providers or () if p not in runner.PROVIDERS]
    if bad:
        raise KernelabError(f"unknown provider{'s' if len(bad) > 1 else ''} {', '.join(bad)}; "
                            f"known: {', '.join(runner.PROVIDERS)}")
    return names


def _run_linear(args) -> int:
    """``kernelab bench linear``: the options the GEMM grid takes, the others refused."""
    from kernelab.errors import KernelabError

    from . import linear

    if args.backward or args.providers or DTYPES[args.dtype] != "bfloat16":
        raise KernelabError("kernelab bench linear: --backward, --providers and --dtype do not apply (it times every "
                            "provider, forward and forward+backward, in bfloat16)")
    if any(len(s) != 3 for s in args.shapes or ()):
        raise KernelabError("kernelab bench linear: shapes are MxKxN (rows x in features -> out features)")
    # a directory of its own under --out: the run writes linear_bench.csv/.png whole (no appending)
    argv = [str(Path(args.out) / "linear"), "--budget-s", str(args.budget_s)] + (["--max-autotune"] if args.max_autotune else [])
    argv += ["--shapes", *("x".join(map(str, s)) for s in args.shapes)] if args.shapes else []
    return linear.main(argv)


def run(args) -> int:
    """Raises kernelab.errors.KernelabError for what the user can fix (the main command prints
    ``kernelab: error: ...`` and exits with 2)."""
    import torch
    from rich.console import Console

    from kernelab.errors import KernelabError

    from . import report, runner

    if args.op == "linear":
        return _run_linear(args)
    if "linear" in args.op.split(","):
        raise KernelabError("kernelab bench linear runs alone (its grid is MxKxN GEMMs): bench it apart")
    if any(len(s) != 2 for s in args.shapes or ()):
        raise KernelabError("kernelab bench: shapes are MxN (rows x row length) for this op")
    names = _check_request(args)
    if not torch.cuda.is_available():
        raise KernelabError("kernelab bench needs a CUDA GPU and none is available: speed is only measured on real "
                            "hardware (kernelab count --predict predicts without one)")
    console = Console()
    dtype = getattr(torch, DTYPES[args.dtype])
    modes = (False, True) if args.backward else (False,)
    rows = runner.run(runner.cases(names, dtype, modes, args.shapes), tuple(args.providers or runner.PROVIDERS), console=console)
    path = report.append_csv(rows, args.out)
    if not args.no_plot:
        report.plot(rows, args.out)
    report.table(rows, console)
    console.print(f"rows appended to {path}")
    return 0 if all(r.status == "ok" for r in rows if r.provider == "kernelab") else 1


def main(argv=None) -> int:
    import sys

    from kernelab.errors import KernelabError

    parser = argparse.ArgumentParser(prog="kernelab")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except KernelabError as exc:
        print(f"kernelab: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
