"""kernelab: which GPU kernels a PyTorch function launches, what each moves, how close it runs to the limit.

Public API (imported lazily: ``import kernelab`` does no work):

* :func:`count` -- the kernels of one function in one mode, as a :class:`Report`
* :func:`compare` -- the same function in several modes, side by side
* :func:`sweep` -- time against size for several modes, with the size where fusion starts to pay
* :func:`compile` / :func:`explain` -- ``torch.compile(fn, backend="kernelab")`` and its readable plan
* :mod:`kernelab.ops` -- fused Triton kernels, drop-ins for ``torch.nn.functional``
* :func:`patch` / :func:`unpatch` -- a model's norms, gated MLPs and loss swapped for those kernels, in place
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"
__all__ = ["count", "compare", "sweep", "explain", "compile", "Report", "ops", "patch", "unpatch", "__version__"]

_LAZY = {
    "count": ("kernelab.api", "count"),
    "compare": ("kernelab.api", "compare"),
    "sweep": ("kernelab.sweep", "sweep"),
    "explain": ("kernelab.compiler", "explain"),
    "compile": ("kernelab.compiler", "compile"),
    "Report": ("kernelab.report", "Report"),
    "ops": ("kernelab.ops", None),
    "patch": ("kernelab.patching", "patch"),
    "unpatch": ("kernelab.patching", "unpatch"),
}


def __dir__() -> list[str]:
    """The public API (loaded lazily, so a plain dir() of the module would not list it)."""
    return sorted(set(__all__) | {"__version__", "__doc__", "__name__", "__file__", "__path__"})


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'kernelab' has no attribute {name!r}")
    module_name, attr = _LAZY[name]
    module = importlib.import_module(module_name)
    return module if attr is None else getattr(module, attr)
