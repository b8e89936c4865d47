"""Per-shape tuning of the GEMM kernel's launch configuration, remembered in memory and on disk.

Off by default (``TUNE``; ``KERNELAB_GEMM_TUNE=1`` turns it on): then the first call of a shape
times every candidate configuration of its class (``gemm.candidates``) on the call's own operands
and keeps the fastest. The choice is written to
``$KERNELAB_CACHE/gemm-tune-<GPU>-triton-<version>.json``, so a later process pays nothing for
that shape: not even the other candidates' compiles. A key is everything that changes which
configuration wins: M, N, K, dtype, the epilogue, the operands' layouts. An entry naming a
configuration that is not a candidate any more (an edited table) is tuned again; an unreadable
file is ignored with a warning and rewritten.

The tuner knows nothing of the kernel: ``choose`` gets the candidates and a function that runs
one of them, so this module imports nothing from ``gemm`` (no cycle).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import warnings
from pathlib import Path

import torch
import triton

from .. import config
from ..hardware import cache_root, slug

#: Tune shapes on their first call (default: the first candidate of the shape's class).
TUNE = config.gemm_tune()

_CHOSEN: dict = {}   # (device, key) -> the chosen config (host time per call: one lookup)
_FILES: dict = {}    # file -> its entries, read once per process


def tuning_file(device: torch.device) -> Path:
    """The disk cache of ``device``'s choices (one file per GPU model and Triton version)."""
    path = _PATHS.get(device)
    if path is None:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
        path = _PATHS[device] = cache_root() / f"gemm-tune-{slug(name)}-triton-{triton.__version__}.json"
    return path


_PATHS: dict = {}


def time_ms(run) -> float:
    """Milliseconds of one ``run()`` (median of a short do_bench on CUDA; wall clock elsewhere)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return float(triton.testing.do_bench(run, warmup=5, rep=20))
    start = time.perf_counter()
    run()
    return (time.perf_counter() - start) * 1e3


def choose(key: tuple, candidates: list, run, device: torch.device, timer=None):
    """The fastest of ``candidates`` for ``key`` (remembered, or timed now with ``run(config)``)."""
    chosen = _CHOSEN.get((device, key))
    if chosen is not None:
        return chosen
    path = tuning_file(device)
    text_key = json.dumps([str(part) for part in key])
    known = _entries(path).get(text_key)
    for config in candidates:
        if known is not None and dataclasses.asdict(config) == known:
            _CHOSEN[(device, key)] = config
            return config
    timer = timer or time_ms
    times = []
    for config in candidates:
        try:
            run(config)  # compiles, and a config that cannot launch fails here, not inside the timer
        except Exception as e:  # noqa: BLE001 - one candidate that does not compile is skipped, said once
            warnings.warn(f"kernelab: GEMM configuration {config} skipped while tuning: {type(e).__name__}: "
                          f"{str(e).splitlines()[0][:160] if str(e) else ''}", stacklevel=3)
            times.append(float("inf"))
            continue
        times.append(timer(lambda c=config: run(c)))
    if min(times) == float("inf"):
        return candidates[0]  # none launched: the default, whose own error the caller then sees
    best = candidates[min(range(len(candidates)), key=times.__getitem__)]
    _entries(path)[text_key] = dataclasses.asdict(best)
    _write(path)
    _CHOSEN[(device, key)] = best
    return best


def _entries(path: Path) -> dict:
    entries = _FILES.get(path)
    if entries is None:
        entries = _FILES[path] = _read(path)
    return entries


def _read(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        entries = json.loads(path.read_text())
        if not isinstance(entries, dict) or not all(isinstance(v, dict) for v in entries.values()):
            raise ValueError("not a mapping of keys to configurations")
        return entries
    except (OSError, ValueError) as e:
        warnings.warn(f"kernelab: ignoring the GEMM tuning cache {path} ({e}); shapes are tuned again", stacklevel=3)
        return {}


def _write(path: Path) -> None:
    """Atomically (a concurrent process reads the old file or the new one, never half of one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(_FILES[path], indent=0, sort_keys=True))
    os.replace(tmp, path)


def forget() -> None:
    """Drop what this process read or tuned (tests; a changed ``$KERNELAB_CACHE``)."""
    _FILES.clear()
    _CHOSEN.clear()
    _PATHS.clear()
