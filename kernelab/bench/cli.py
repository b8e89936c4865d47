"""``kernelab bench OP [--shapes MxN ...] [--dtype bf16] [--backward] [--out DIR]``.

Wire into the main CLI with ``add_parser(subparsers)``; ``run(args)`` returns the exit status.
"""

from __future__ import annotations

import argparse

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}


def _shape(text: str) -> tuple[int, int]:
    try:
        m, n = (int(v) for v in text.lower().split("x"))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"shape {text!r} is not MxN") from e
    return m, n


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


def run(args) -> int:
    """Raises kernelab.errors.KernelabError for what the user can fix (the main command prints
    ``kernelab: error: ...`` and exits with 2)."""
    import torch
    from rich.console import Console

    from kernelab.errors import KernelabError

    from . import report, runner

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
