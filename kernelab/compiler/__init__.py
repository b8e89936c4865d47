"""kernelab's fusion compiler: ``torch.compile(fn, backend="kernelab")``.

FX graph (aot_autograd: functional, decomposed, forward and backward) -> groups of fusible ops
(pointwise chains with broadcasting; a row reduction over the last dim with its pointwise prologue
and epilogue) -> one generated Triton kernel per group; everything else runs as ATen, each with the
reason. Importing this module registers the backend name "kernelab" with dynamo (nothing else).

* :func:`compile` -- ``torch.compile(fn, backend="kernelab", **kw)``
* :func:`explain` -- the plan of one call, printable with rich, ``.to_dict()``
* :func:`plan_kernels` -- the kernels one call launches, predicted from the plan (no GPU needed)
* :func:`plan_trace` -- the same kernels with the call's inputs and outputs, for traffic totals
* :func:`events` / :func:`reset_events` -- kernels this process compiled and launched, and every
  graph or group that ran as ATen instead, with the reason
"""
from __future__ import annotations

__all__ = ["compile", "explain", "plan_kernels", "plan_trace", "kernelab_backend", "register", "BACKEND_NAME",
           "events", "reset_events"]

BACKEND_NAME = "kernelab"


def kernelab_backend(gm, example_inputs, **options):
    """The dynamo backend (what the name "kernelab" resolves to). torch.compile's ``mode`` and
    ``options`` arrive here: ``mode="reduce-overhead"`` replays CUDA graphs (``cudagraphs.py``)."""
    from .backend import kernelab_backend as _backend

    return _backend(gm, example_inputs, **options)


def _reset_backend() -> None:
    """torch._dynamo.reset() calls its backends' ``reset``: recorded CUDA graphs are dropped."""
    from .backend import reset

    reset()


kernelab_backend.reset = _reset_backend


def events():
    """This process's record of generated kernels launched and fallbacks to ATen (see ``eventlog.py``)."""
    from .eventlog import events as _events

    return _events()


def reset_events() -> None:
    from .eventlog import reset_events as _reset

    _reset()


def register() -> None:
    """Make ``backend="kernelab"`` resolve to :func:`kernelab_backend` (idempotent; imports torch._dynamo,
    about a second, which torch.compile imports anyway)."""
    from torch._dynamo.backends import registry

    if BACKEND_NAME not in getattr(registry, "_BACKENDS", {}):
        try:
            registry.register_backend(kernelab_backend, name=BACKEND_NAME)
        except Exception:  # noqa: BLE001 - registered meanwhile (another thread)
            pass


def compile(fn, **kwargs):  # noqa: A001 - mirrors torch.compile
    """``torch.compile(fn, backend="kernelab", **kwargs)``; ``mode="reduce-overhead"``: CUDA graphs."""
    import torch

    from .options import parse

    parse(kwargs.get("mode"), kwargs.get("options"))  # a mode or option kernelab lacks: raised here, not at the call
    register()
    return torch.compile(fn, backend=BACKEND_NAME, **kwargs)


def explain(fn, *args, **kwargs):
    """The plan of ``fn(*args, **kwargs)`` under the kernelab backend (see :class:`plan.Plan`)."""
    from .plan import explain as _explain

    return _explain(fn, *args, **kwargs)


def plan_kernels(target, args=(), kwargs=None, ctx=None):
    """list[KernelSpec]: the kernels the backend launches for ``target(*args, **kwargs)``."""
    from .plan import plan_kernels as _plan_kernels

    return _plan_kernels(target, args, kwargs, ctx)


def plan_trace(target, args=(), kwargs=None, ctx=None):
    """(OpTrace, list[KernelSpec]) with one storage numbering: for kernelab.traffic's totals."""
    from .plan import plan_trace as _plan_trace

    return _plan_trace(target, args, kwargs, ctx)


register()
