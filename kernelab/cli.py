"""The ``kernelab`` command: count, sweep, tour, ceilings (and bench, from kernelab.bench).

Every error a user can cause -- bad input, a target that raises (``SystemExit`` included) or does not
return within ``--timeout`` -- prints one line ``kernelab: error: ...`` and exits with 2. An
exception from kernelab's own code (see :func:`kernelab.errors.blame`) is never blamed on the
target: it prints ``kernelab: internal error: ... (please report)`` and exits with 70. ``--debug``
adds the traceback to either.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import traceback
import warnings
from pathlib import Path

from .errors import KernelabError
from .module_tree import SORTS

EXIT_USAGE = 2
EXIT_INTERNAL = 70  # sysexits.h EX_SOFTWARE: an internal software error
EXIT_INTERRUPTED = 130
TIMEOUT_MEASURE_S = 600.0  # default --timeout for one count (one mode at one size) on a GPU
TIMEOUT_PREDICT_S = 300.0  # ... and when predicting (capture runs the target's Python code too)
WATCHDOG_GRACE_S = 30.0


class UserError(KernelabError):
    """Raised for anything the user can fix; main() turns it into one line and exit code 2."""


class InternalError(Exception):
    """An exception from kernelab's own code; main() reports it as a bug with exit code 70."""


def _console():
    from rich.console import Console

    return Console(width=max(100, Console().width))


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", action="append", choices=("eager", "inductor", "kernelab"),
                   help="eager, inductor or kernelab (repeat for several; default eager and inductor)")
    p.add_argument("--predict", action="store_true", help="predict even when a GPU is present")
    p.add_argument("--profile", default="h200", help="device profile for predictions: h200, h100, a100")
    p.add_argument("--json", metavar="PATH", help="write the full results as JSON")
    p.add_argument("--timeout", type=_seconds, metavar="SECONDS",
                   help=f"give up when one count (one mode at one size) takes longer: a target that never returns "
                        f"(default {TIMEOUT_MEASURE_S:g} s measuring, {TIMEOUT_PREDICT_S:g} s predicting; 0: no limit)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite, non-negative number of seconds")
    return value


def _version() -> str:
    from importlib import metadata

    from . import __version__

    def installed(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return (f"kernelab {__version__} (torch {installed('torch')}, triton {installed('triton')}, "
            f"python {sys.version.split()[0]})")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kernelab", description="Which GPU kernels a PyTorch function launches, "
                                     "what each moves through memory, and how close it runs to the limit.")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("count", help="the kernels of one function, per mode")
    p.add_argument("target", help="path/to/file.py:function (or an nn.Module class/instance)")
    p.add_argument("--input", action="append", default=[], metavar="SPEC",
                   help="input spec: 1000000, 32x4096:bf16, int64[0,1000):512, 64x64:f32:grad (repeat per argument);"
                        " default: example_inputs() in the target's file")
    p.add_argument("--by", choices=("kernel", "module"), default="kernel",
                   help="kernel: one row per kernel (default); module: a tree of the nn.Modules that launched them")
    p.add_argument("--sort", choices=SORTS, default="time",
                   help="with --by module, order each module's children by time, waste (bytes over ideal, round "
                        "trips) or ceiling (time lost below the ceiling); default time")
    p.add_argument("--html", metavar="PATH", help="write one self-contained HTML report (every mode side by side: "
                   "module tree, timeline, roofline)")
    p.add_argument("--trace", metavar="PATH", help="write a Chrome/Perfetto trace (JSON) of one step per mode")
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


def requested_modes(args) -> tuple[str, ...]:
    return tuple(dict.fromkeys(args.mode or ("eager", "inductor")))


def predict_flag(args):
    return True if args.predict else None


def _predicting(args) -> bool:
    import torch

    return bool(args.predict) or not torch.cuda.is_available()


def count_timeout(args) -> float | None:
    """Seconds allowed for one count; None: no limit."""
    if args.timeout is None:
        return TIMEOUT_PREDICT_S if _predicting(args) else TIMEOUT_MEASURE_S
    return args.timeout or None


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


def count_inputs(args, module) -> tuple:
    """The target's arguments. Predicting, they are meta tensors: shapes and dtypes only, so any
    size costs nothing (``--input 1e11`` allocates no 400 GB)."""
    import torch

    from .inputs import make_inputs

    predicting = _predicting(args)
    if args.input:
        specs = _specs(args.input)
        if any("n" in s.dims for s in specs):
            raise UserError("'n' is the size that sweep varies; count needs fixed sizes, e.g. --input 1000x1000")
        try:
            return make_inputs(specs, device="meta" if predicting else "cpu")
        except KernelabError as exc:
            raise UserError(str(exc)) from exc
    if hasattr(module, "example_inputs"):
        inputs = None
        if predicting:  # as sweep_inputs(n): built on the meta device when it can be
            with contextlib.suppress(Exception), torch.device("meta"):
                inputs = module.example_inputs()
        if inputs is None:
            inputs = _call_user(module.example_inputs, "example_inputs()")
        return _as_args(inputs, "example_inputs()")
    raise UserError("no inputs: pass --input SPEC for each argument, or define example_inputs() in the target's file")


def _as_args(value, what: str) -> tuple:
    """What example_inputs()/sweep_inputs(n) returned, as the target's positional arguments."""
    import torch

    if isinstance(value, torch.Tensor):
        return (value,)
    if isinstance(value, (tuple, list)):
        return tuple(value)
    raise UserError(f"{what} returned a {type(value).__name__} ({_short_repr(value)}); it must return a tensor or a "
                    "tuple of the target's arguments, e.g. return (x, y)")


def _short_repr(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def _call_user(fn, what: str, *a):
    try:
        return fn(*a)
    except (Exception, SystemExit) as exc:
        raise UserError(f"{what} raised {_describe(exc)}") from exc


def _describe(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"SystemExit({exc.code!r}) (sys.exit() inside the code being counted)"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _blamed(exc: BaseException) -> Exception:
    """The error to report for an exception raised while counting: the target's, or kernelab's."""
    from .errors import TargetTimeout, root_cause, where

    if isinstance(exc, TargetTimeout):
        return UserError(f"{exc}; if it needs longer, raise --timeout (0: no limit)")
    if isinstance(exc, KernelabError):
        return UserError(str(exc))
    owner, location = where(exc)
    if owner == "kernelab":
        return InternalError(f"{_describe(root_cause(exc))} (at {location})")
    return UserError(f"the target raised {_describe(root_cause(exc))}")


@contextlib.contextmanager
def _counting(args, calls: int):
    """Around the counts of a command: exceptions blamed on their owner, and a watchdog that ends
    the process when the target is stuck where the per-count alarm cannot interrupt it (inside a
    C call that never returns)."""
    timeout = count_timeout(args)
    watchdog = None
    if timeout:
        limit = timeout * max(calls, 1) + WATCHDOG_GRACE_S
        watchdog = threading.Timer(limit, _give_up, (limit,))
        watchdog.daemon = True
        watchdog.start()
    try:
        yield timeout
    except (Exception, SystemExit) as exc:
        raise _blamed(exc) from exc
    finally:
        if watchdog is not None:
            watchdog.cancel()


def _give_up(limit: float) -> None:
    print(f"kernelab: error: counting did not finish within {limit:g} s and the target could not be interrupted "
          "(stuck outside Python); giving up (see --timeout)", file=sys.stderr, flush=True)
    os._exit(EXIT_USAGE)


def run_counts(target, inputs, args, name: str):
    """Count in every mode; failures inside the user's function become one-line errors."""
    from .api import compare

    modes = requested_modes(args)
    with _counting(args, len(modes)) as timeout:
        return compare(target, *inputs, modes=modes, predict=predict_flag(args), profile=args.profile, name=name,
                       timeout=timeout)


def cmd_count(args) -> int:
    for path, option in ((args.json, "--json"), (args.html, "--html"), (args.trace, "--trace")):
        _check_writable(path, option)
    target, module = _load(args.target)
    inputs = count_inputs(args, module)
    comparison = run_counts(target, inputs, args, args.target.rpartition(":")[2])
    console = _console()
    if args.by == "module":
        for report in comparison.reports.values():
            console.print(report.module_tree(sort=args.sort))
    else:
        console.print(comparison)
    write_json(args.json, comparison.to_dict())
    _write_views(args, comparison)
    return 0


def _write_views(args, comparison) -> None:
    """--html and --trace: every mode counted, in one file each."""
    if args.html:
        from .html_report import render_html

        _write_text(args.html, render_html(comparison, title=f"kernelab count {args.target}"))
    if args.trace:
        from .trace import to_chrome_trace

        write_json(args.trace, to_chrome_trace(comparison))


def _sweep_factory(args, module):
    from .inputs import make_inputs

    if args.input:
        specs = _specs(args.input)
        if not any("n" in s.dims for s in specs):
            raise UserError("sweep inputs need 'n' in at least one spec (e.g. --input n --input n)")
        return lambda n: make_inputs(specs, n)
    if hasattr(module, "sweep_inputs"):
        return lambda n: _as_args(_call_user(module.sweep_inputs, "sweep_inputs(n)", n), "sweep_inputs(n)")
    specs = _specs(["n", "n"])
    return lambda n: make_inputs(specs, n)


def run_sweep(target, factory, args, name):
    from .sweep import parse_sizes, sweep

    try:
        sizes = parse_sizes(args.sizes)
    except KernelabError as exc:
        raise UserError(str(exc)) from exc
    modes = requested_modes(args)
    with _counting(args, len(sizes) * len(modes)) as timeout:
        return sweep(target, factory, sizes, modes=modes, predict=predict_flag(args), profile=args.profile,
                     name=name, timeout=timeout)


def _check_plot_path(path: str) -> None:
    if Path(path).suffix.lower() not in (".png", ".svg"):
        raise UserError(f"--out must end in .png or .svg, got {path!r}")
    _check_writable(path, "--out")


def _check_writable(path: str | None, option: str) -> None:
    """Refuse an output path that cannot be written before any work is done (and leave no file)."""
    if not path:
        return
    target = Path(path)
    if target.is_dir():
        raise UserError(f"cannot write {option} {path}: it is a directory")
    existed = target.exists()
    try:
        with open(target, "ab"):
            pass
    except OSError as exc:
        raise UserError(f"cannot write {option} {path}: {exc.strerror or exc}") from exc
    if not existed:
        target.unlink(missing_ok=True)


def save_plot(result, path: str) -> str:
    try:
        return result.plot(path)
    except OSError as exc:
        raise UserError(f"cannot write the plot {path}: {exc.strerror or exc}") from exc


def cmd_sweep(args) -> int:
    _check_plot_path(args.out)
    _check_writable(args.json, "--json")
    target, module = _load(args.target)
    result = run_sweep(target, _sweep_factory(args, module), args, args.target.rpartition(":")[2])
    console = _console()
    console.print(result.table())
    console.print(f"plot: {save_plot(result, args.out)}")
    write_json(args.json, {"schema_version": 1, "rows": result.to_rows()})
    return 0


def cmd_tour(args) -> int:
    from .tour import run_tour

    _check_plot_path(args.out)
    _check_writable(args.json, "--json")
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


def write_json(path: str | None, payload) -> None:
    if path:
        _write_text(path, json.dumps(payload, indent=2, default=str))


def _write_text(path: str, text: str) -> None:
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror}") from exc


COMMANDS = {"count": cmd_count, "sweep": cmd_sweep, "tour": cmd_tour, "ceilings": cmd_ceilings}


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"kernelab: warning: {message}", file=file or sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = COMMANDS.get(args.command)
    if handler is None:  # subcommands registered by other modules (bench) carry their own
        handler = args.func
    debug = getattr(args, "debug", False)
    with warnings.catch_warnings():
        if not debug:
            warnings.showwarning = _show_warning
        try:
            return handler(args)
        except KernelabError as exc:
            if debug:
                traceback.print_exc()
            print(f"kernelab: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except KeyboardInterrupt:
            print("kernelab: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        except Exception as exc:  # never a traceback for a bug of ours without --debug: one line to report
            error = exc if isinstance(exc, InternalError) else _blamed(exc)
            if isinstance(error, UserError):
                if debug:
                    traceback.print_exc()
                print(f"kernelab: error: {error}", file=sys.stderr)
                return EXIT_USAGE
            if debug:
                traceback.print_exc()
            print(f"kernelab: internal error: {error} (please report{'' if debug else '; --debug shows the traceback'})",
                  file=sys.stderr)
            return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
