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


def run(args) -> int:
    import torch
    from rich.console import Console

    from . import report, runner, specs

    console = Console()
    if not torch.cuda.is_available():
        console.print("[red]kernelab bench needs a CUDA GPU: speed is only measured on real hardware.[/red]")
        return 2
    names = list(specs.specs()) if args.op == "all" else args.op.split(",")
    unknown = [n for n in names if n not in specs.specs()]
    if unknown:
        console.print(f"[red]unknown op(s) {unknown}; known: {', '.join(specs.specs())}[/red]")
        return 2
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
    parser = argparse.ArgumentParser(prog="kernelab")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
