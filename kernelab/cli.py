"""The ``kernelab`` command: count, sweep, tour, ceilings (and bench, from kernelab.bench).

Every error a user can cause prints one line ``kernelab: error: ...`` and exits with 2; ``--debug``
adds the traceback.
"""
from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

EXIT_USAGE = 2


class UserError(Exception):
    """Raised for anything the user can fix; main() turns it into one line and exit code 2."""


def _console():
    from rich.console import Console

    return Console(width=max(100, Console().width))


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", action="append", choices=("eager", "inductor", "kernelab"),
                   help="eager, inductor or kernelab (repeat for several; default eager and inductor)")
    p.add_argument("--predict", action="store_true", help="predict even when a GPU is present")
    p.add_argument("--profile", default="h200", help="device profile for predictions: h200, h100, a100")
    p.add_argument("--json", metavar="PATH", help="write the full results as JSON")
    p.add_argument("--debug", action="store_true", help="show tracebacks")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kernelab", description="Which GPU kernels a PyTorch function launches, "
                                     "what each moves through memory, and how close it runs to the limit.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("count", help="the kernels of one function, per mode")
    p.add_argument("target", help="path/to/file.py:function (or an nn.Module class/instance)")
    p.add_argument("--input", action="append", default=[], metavar="SPEC",
                   help="input spec: 1000000, 32x4096:bf16, int64[0,1000):512, 64x64:f32:grad (repeat per argument);"
                        " default: example_inputs() in the target's file")
    _add_common(p)
    p = sub.add_parser("sweep", help="time against size, eager vs compiled, with the crossover size")
    p.add_argument("target")
    p.add_argument("--sizes", default="1e2:1e9", help="LOW:HIGH[:PER_DECADE] or a comma list (default 1e2:1e9)")
    p.add_argument("--input", action="append", default=[], metavar="SPEC",
                   help="input spec with 'n' for the size, e.g. n or 4096xn:bf16; default: sweep_inputs(n) in the file,"
                        " else two float32 vectors of n")
    p.add_argument("--out", default="sweep.png", help="plot file (.png or .svg)")
    _add_common(p)
    p = sub.add_parser("tour", help="the tutorial's (a + b).relu() experiment, end to end")
    p.add_argument("--out", default="kernelab-tour.png", help="where to save the sweep plot")
    p.add_argument("--sizes", default="1e2:1e9")
    _add_common(p)
    p = sub.add_parser("ceilings", help="measure and cache this GPU's copy bandwidth and matmul rates")
    p.add_argument("--refresh", action="store_true", help="measure again even if cached")
    p.add_argument("--debug", action="store_true")
    _add_bench(sub)
    return parser


def _add_bench(sub) -> None:
    try:
        from .bench import cli as bench_cli
    except ImportError:
        return
    bench_cli.add_parser(sub)


# ---------------------------------------------------------------------------------------------


def _modes(args) -> tuple[str, ...]:
    return tuple(dict.fromkeys(args.mode or ("eager", "inductor")))


def _predict_flag(args):
    return True if args.predict else None


def _load(ref: str):
    from .inputs import SpecError, load_target

    try:
        return load_target(ref)
    except SpecError as exc:
        raise UserError(str(exc)) from exc


def _specs(texts: list[str]):
    from .inputs import SpecError, parse_spec

    try:
        return [parse_spec(t) for t in texts]
    except SpecError as exc:
        raise UserError(str(exc)) from exc


def _count_inputs(args, module) -> tuple:
    from .inputs import make_inputs

    if args.input:
        return make_inputs(_specs(args.input))
    if hasattr(module, "example_inputs"):
        inputs = _call_user(module.example_inputs, "example_inputs()")
        return inputs if isinstance(inputs, tuple) else tuple(inputs) if isinstance(inputs, list) else (inputs,)
    raise UserError("no inputs: pass --input SPEC for each argument, or define example_inputs() in the target's file")


def _call_user(fn, what: str, *a):
    try:
        return fn(*a)
    except Exception as exc:
        raise UserError(f"{what} raised {type(exc).__name__}: {exc}") from exc


def _run_counts(target, inputs, args, name: str):
    """Count in every mode; failures inside the user's function become one-line errors."""
    from .api import KernelabError, compare

    try:
        return compare(target, *inputs, modes=_modes(args), predict=_predict_flag(args), profile=args.profile, name=name)
    except KernelabError as exc:
        raise UserError(str(exc)) from exc
    except Exception as exc:
        raise UserError(f"the target raised {type(exc).__name__}: {exc}") from exc


def cmd_count(args) -> int:
    target, module = _load(args.target)
    inputs = _count_inputs(args, module)
    comparison = _run_counts(target, inputs, args, args.target.rpartition(":")[2])
    _console().print(comparison)
    _write_json(args.json, comparison.to_dict())
    return 0


def _sweep_factory(args, module):
    from .inputs import make_inputs

    if args.input:
        specs = _specs(args.input)
        if not any("n" in s.dims for s in specs):
            raise UserError("sweep inputs need 'n' in at least one spec (e.g. --input n --input n)")
        return lambda n: make_inputs(specs, n)
    if hasattr(module, "sweep_inputs"):
        return lambda n: _call_user(module.sweep_inputs, "sweep_inputs(n)", n)
    specs = _specs(["n", "n"])
    return lambda n: make_inputs(specs, n)


def _run_sweep(target, factory, args, name):
    from .api import KernelabError
    from .sweep import parse_sizes, sweep

    try:
        sizes = parse_sizes(args.sizes)
        return sweep(target, factory, sizes, modes=_modes(args), predict=_predict_flag(args), profile=args.profile,
                     name=name)
    except (KernelabError, UserError) as exc:
        raise UserError(str(exc)) from exc
    except Exception as exc:
        raise UserError(f"the target raised {type(exc).__name__}: {exc}") from exc


def _check_plot_path(path: str) -> None:
    if Path(path).suffix.lower() not in (".png", ".svg"):
        raise UserError(f"--out must end in .png or .svg, got {path!r}")


def cmd_sweep(args) -> int:
    _check_plot_path(args.out)
    target, module = _load(args.target)
    result = _run_sweep(target, _sweep_factory(args, module), args, args.target.rpartition(":")[2])
    console = _console()
    console.print(result.table())
    console.print(f"plot: {result.plot(args.out)}")
    _write_json(args.json, {"schema_version": 1, "rows": result.to_rows()})
    return 0


def cmd_tour(args) -> int:
    from .tour import run_tour

    _check_plot_path(args.out)
    return run_tour(args, _console())


def cmd_ceilings(args) -> int:
    import torch

    from .hardware import cache_path, measure_ceilings

    if not torch.cuda.is_available():
        raise UserError("ceilings are measured on a CUDA GPU and none is available here")
    c = measure_ceilings(refresh=args.refresh)
    console = _console()
    console.print(f"{c.gpu} (torch {c.torch}, {c.date}): copy {c.copy_bandwidth / 1e12:.2f} TB/s (read + write)")
    for dtype, flops in c.matmul_flops.items():
        console.print(f"  matmul {dtype}: {flops / 1e12:.0f} TFLOP/s")
    console.print(f"cached in {cache_path(c.gpu, c.torch)}")
    return 0


def _write_json(path: str | None, payload) -> None:
    if path:
        try:
            Path(path).write_text(json.dumps(payload, indent=2, default=str))
        except OSError as exc:
            raise UserError(f"cannot write {path}: {exc.strerror}") from exc


COMMANDS = {"count": cmd_count, "sweep": cmd_sweep, "tour": cmd_tour, "ceilings": cmd_ceilings}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = COMMANDS.get(args.command)
    if handler is None:  # subcommands registered by other modules (bench) carry their own
        handler = args.func
    try:
        return handler(args)
    except UserError as exc:
        if getattr(args, "debug", False):
            traceback.print_exc()
        print(f"kernelab: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
