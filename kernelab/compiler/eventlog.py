"""What the backend did in this process: the generated kernels that compiled and launched, and
every graph or group that ran as ATen instead, with the reason.

One process-wide record (compiled graphs run on autograd's threads too, so a context variable
would miss the backward): written only off the hot path (a kernel's first launch for a shape, a
fallback), read by tests and by users who want to know what their model really ran.

    kernelab.compiler.reset_events()
    loss = compiled(x); loss.backward()
    ev = kernelab.compiler.events()
    ev.launched        # Counter: kernel name -> shapes it compiled and launched for
    ev.fallbacks       # [(what, name, reason)]: "graph" (the whole graph ran as ATen) or "group"
    ev.reused          # Counter: kernel name -> shapes for which it stored an output over an
                       # input at its last use (``GroupRunner.reuse``)
"""
from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

__all__ = ["Events", "events", "reset_events", "record_launch", "record_fallback", "record_reuse",
           "ACTIVE_PLAN"]

#: The plan recorder of a running ``plan_kernels`` / ``explain`` call (None otherwise), set by
#: plan.py and read by the backend's compiled graphs. A plain slot, not a context variable: on CUDA
#: the backward runs on autograd's device threads. Here, not in backend.py, so that plan.py and
#: backend.py need not import each other.
ACTIVE_PLAN: list = [None]


@dataclass
class Events:
    launched: Counter = field(default_factory=Counter)
    fallbacks: list = field(default_factory=list)
    reused: Counter = field(default_factory=Counter)

    @property
    def kernels_launched(self) -> int:
        return sum(self.launched.values())

    def __str__(self) -> str:
        lines = [f"{self.kernels_launched} generated kernel launch(es) compiled, "
                 f"{len(self.fallbacks)} fallback(s) to ATen"]
        lines += [f"  {what} {name}: {why}" for what, name, why in self.fallbacks]
        return "\n".join(lines)


_EVENTS = Events()
_LOCK = threading.Lock()


def events() -> Events:
    """A copy of this process's record since the last :func:`reset_events`."""
    with _LOCK:
        return Events(Counter(_EVENTS.launched), list(_EVENTS.fallbacks), Counter(_EVENTS.reused))


def reset_events() -> None:
    with _LOCK:
        _EVENTS.launched.clear()
        _EVENTS.fallbacks.clear()
        _EVENTS.reused.clear()


def record_launch(name: str) -> None:
    with _LOCK:
        _EVENTS.launched[name] += 1


def record_fallback(what: str, name: str, reason: str) -> None:
    with _LOCK:
        _EVENTS.fallbacks.append((what, name, reason))


def record_reuse(name: str) -> None:
    with _LOCK:
        _EVENTS.reused[name] += 1
