"""What ``torch.compile``'s ``mode`` and ``options`` ask of the kernelab backend, parsed in one place.

* ``mode``: "default" (or none), "reduce-overhead" (CUDA graphs: ``cudagraphs.py``),
  "max-autotune-no-cudagraphs" (the same as default: kernelab times no kernels at compile time).
  "max-autotune" and anything else raise.
* ``options``: ``{"cudagraphs": bool}`` (overrides the mode and KERNELAB_CUDAGRAPHS) and
  ``{"tiling": tiling.Tiling(...)}`` (the reductions' launch heuristics, for tuning scripts).
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import config
from ..errors import KernelabError
from .tiling import DEFAULT, Tiling

__all__ = ["Options", "parse", "MODES", "OPTION_NAMES"]

#: torch.compile's modes, and whether each asks for CUDA graphs. "max-autotune" (Inductor's kernel
#: search plus CUDA graphs) is refused: kernelab does not search kernels by timing at compile time.
MODES = {None: False, "default": False, "reduce-overhead": True, "max-autotune-no-cudagraphs": False}
OPTION_NAMES = ("cudagraphs", "tiling")


@dataclass(frozen=True)
class Options:
    cudagraphs: bool = False
    tiling: Tiling = DEFAULT


def parse(mode: str | None = None, options: dict | None = None) -> Options:
    """The backend's options; a mode or option kernelab does not have raises a KernelabError."""
    if mode not in MODES:
        raise KernelabError(f"backend='kernelab' has no mode {mode!r}: use 'default' or 'reduce-overhead' "
                            f"(CUDA graphs)")
    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTION_NAMES))
    if unknown:
        raise KernelabError(f"backend='kernelab' has no option {', '.join(map(repr, unknown))}: its options "
                            f"are {', '.join(map(repr, OPTION_NAMES))}")
    graphs = options.get("cudagraphs", MODES[mode] or config.cudagraphs())
    if not isinstance(graphs, bool):
        raise KernelabError(f"backend='kernelab': options['cudagraphs'] must be True or False, not {graphs!r}")
    tiling = options.get("tiling", DEFAULT)
    if not isinstance(tiling, Tiling):
        raise KernelabError(f"backend='kernelab': options['tiling'] must be a kernelab.compiler.tiling.Tiling, "
                            f"not {type(tiling).__name__}")
    return Options(graphs, tiling)
