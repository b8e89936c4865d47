"""Input specs for the command line, and loading a target from ``path/to/file.py:fn``.

Spec grammar (no ``eval`` of user strings)::

    SPEC   := DIMS [":" DTYPE] [":grad"]          1000000   32x4096:bf16   512x512:f32:grad
            | DTYPE "[" LOW "," HIGH ")" ":" DIMS  int64[0,1000):512   (integers drawn from [LOW, HIGH))
    DIMS   := DIM ("x" DIM)*                      DIM: an integer, 1e6-style, or "n" (the sweep size)
    DTYPE  := f32 | float32 | f16 | fp16 | float16 | bf16 | bfloat16 | f64 | float64
            | i32 | int32 | i64 | int64 | i8 | int8 | u8 | uint8 | bool

Floating inputs are standard normal, integers uniform in the range (default [0, 100)), booleans
fair coin flips; all from a seeded generator, so two runs see the same data.
"""
from __future__ import annotations

import importlib.util
import inspect
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import SpecError

__all__ = ["InputSpec", "SpecError", "parse_spec", "make_inputs", "load_target"]

DTYPES = {
    "f32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "f16": torch.float16, "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "f64": torch.float64, "float64": torch.float64, "double": torch.float64,
    "i32": torch.int32, "int32": torch.int32, "i64": torch.int64, "int64": torch.int64, "long": torch.int64,
    "i8": torch.int8, "int8": torch.int8, "u8": torch.uint8, "uint8": torch.uint8, "bool": torch.bool,
}
_RANGE = re.compile(r"^(?P<dtype>[a-z0-9]+)\[(?P<low>-?\d+),(?P<high>-?\d+)\):(?P<dims>.+)$")


# A tensor's element count and byte size must fit PyTorch's 64-bit sizes.
MAX_NUMEL = 2**63 - 1


@dataclass(frozen=True)
class InputSpec:
    dims: tuple  # ints, or "n" placeholders
    dtype: torch.dtype = torch.float32
    low: int = 0
    high: int = 100
    requires_grad: bool = False

    def shape(self, n: int | None = None) -> tuple[int, ...]:
        if "n" in self.dims and n is None:
            raise SpecError("an input uses 'n' but no size was given (only sweep sets n)")
        return tuple(n if d == "n" else d for d in self.dims)

    def make(self, generator: torch.Generator | None, n: int | None = None, device=None) -> torch.Tensor:
        """The tensor, drawn from ``generator`` on ``device`` (the generator's device); on the meta
        device only its shape and dtype exist, so prediction allocates nothing whatever the size."""
        shape = self.shape(n)
        _check_size(shape, self.dtype)
        device = torch.device(device) if device is not None else torch.device("cpu")
        if device.type == "meta":
            t = torch.empty(shape, dtype=self.dtype, device="meta")
        elif self.dtype == torch.bool:
            t = torch.rand(shape, generator=generator, device=device) < 0.5
        elif self.dtype.is_floating_point:
            t = torch.randn(shape, generator=generator, device=device).to(self.dtype)
        else:
            t = torch.randint(self.low, self.high, shape, generator=generator, dtype=self.dtype, device=device)
        return t.requires_grad_(self.requires_grad)


def _dim(token: str, spec: str) -> int | str:
    token = token.strip()
    if token == "n":
        return "n"
    try:
        value = float(token) if re.fullmatch(r"\d+(\.\d+)?e\d+", token) else int(token)
    except ValueError:
        raise SpecError(f"bad dimension {token!r} in input spec {spec!r}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise SpecError(f"dimension {token!r} in input spec {spec!r} is too large")
    if value != int(value) or value < 0:
        raise SpecError(f"dimension {token!r} in input spec {spec!r} is not a non-negative integer")
    if int(value) > MAX_NUMEL:
        raise SpecError(f"dimension {token!r} in input spec {spec!r} is too large (at most 2^63 - 1)")
    return int(value)


def _check_size(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    numel = math.prod(shape)
    itemsize = torch.empty((), dtype=dtype, device="meta").element_size()
    if numel * itemsize > MAX_NUMEL:
        dims = "x".join(map(str, shape))
        raise SpecError(f"input {dims} of {str(dtype).removeprefix('torch.')} would be {numel * itemsize:.3g} bytes: "
                        "more than a 64-bit size can address")


def _dtype(name: str, spec: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise SpecError(f"unknown dtype {name!r} in input spec {spec!r}; known: {', '.join(sorted(DTYPES))}") from None


def parse_spec(spec: str) -> InputSpec:
    """Parse one ``--input`` spec (see the module docstring for the grammar)."""
    text = spec.strip().lower()
    if not text:
        raise SpecError("empty input spec")
    ranged = _RANGE.match(text)
    if ranged:
        dtype = _dtype(ranged["dtype"], spec)
        if dtype.is_floating_point or dtype == torch.bool:
            raise SpecError(f"a [low,high) range needs an integer dtype, got {ranged['dtype']!r} in {spec!r}")
        low, high = int(ranged["low"]), int(ranged["high"])
        if high <= low:
            raise SpecError(f"empty range [{low},{high}) in input spec {spec!r}")
        dims = tuple(_dim(d, spec) for d in ranged["dims"].split("x"))
        return InputSpec(dims, dtype, low, high)
    parts = text.split(":")
    grad = parts[-1] == "grad"
    if grad:
        parts = parts[:-1]
    if not parts or len(parts) > 2:
        raise SpecError(f"bad input spec {spec!r}: expected DIMS[:DTYPE][:grad] or DTYPE[low,high):DIMS")
    dims = tuple(_dim(d, spec) for d in parts[0].split("x"))
    dtype = _dtype(parts[1], spec) if len(parts) == 2 else torch.float32
    if grad and not dtype.is_floating_point:
        raise SpecError(f"':grad' needs a floating dtype in input spec {spec!r}")
    return InputSpec(dims, dtype, requires_grad=grad)


def make_inputs(specs: list[InputSpec], n: int | None = None, seed: int = 0, device=None) -> tuple[torch.Tensor, ...]:
    """One tensor per spec: seeded random values, or shapes only on the meta device.

    ``device=None`` builds on the current default device (``with torch.device("meta"):`` is how
    sweep predicts at any size); values are drawn on that device, so nothing is built twice.
    """
    device = torch.device(device) if device is not None else torch.get_default_device()
    generator = None if device.type == "meta" else torch.Generator(device=device).manual_seed(seed)
    return tuple(s.make(generator, n, device=device) for s in specs)


# ---------------------------------------------------------------------------------------------
# Targets


def load_target(ref: str):
    """``path/to/file.py:name`` -> (the object, the loaded module)."""
    path_text, sep, attr = ref.rpartition(":")
    if not sep or not path_text or not attr:
        raise SpecError(f"target {ref!r} should look like path/to/file.py:function")
    path = Path(path_text)
    if not path.is_file():
        raise SpecError(f"no such file: {path}")
    module_name = f"kernelab_target_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise SpecError(f"cannot import {path} as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise SpecError(f"importing {path} raised {type(exc).__name__}: {exc}") from exc
    if not hasattr(module, attr):
        raise SpecError(f"{path} has no function or module named {attr!r}")
    target = getattr(module, attr)
    if isinstance(target, type) and issubclass(target, torch.nn.Module):
        target = _instantiate(target, attr, path)
    if not callable(target):
        raise SpecError(f"{ref} is a {type(target).__name__}, not a function or nn.Module")
    return target, module


def _instantiate(cls: type, attr: str, path: Path):
    """An nn.Module class named as a target is built with no arguments."""
    try:
        inspect.signature(cls).bind()
    except TypeError:
        raise SpecError(f"{attr} is an nn.Module class whose __init__ needs arguments ({_signature(cls)}); point "
                        f"the target at an instance or a function that builds one, e.g. model = {attr}(...) in "
                        f"{path.name} and {path.name}:model") from None
    except ValueError:
        pass  # no signature to check: try it
    try:
        return cls()
    except Exception as exc:
        raise SpecError(f"building {attr}() raised {type(exc).__name__}: {exc}") from exc


def _signature(cls: type) -> str:
    try:
        return f"{cls.__name__}{inspect.signature(cls)}"
    except (TypeError, ValueError):
        return cls.__name__
