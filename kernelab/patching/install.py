"""Setting and restoring instance attributes, exactly: what ``patch`` changes and ``unpatch`` undoes.

A swap is ``setattr(obj, name, value)`` on one instance (a module's ``forward``, a model's
``loss_function``). Whatever the assignment changes in ``obj.__dict__`` (``forward`` itself, or
the ``_loss_function`` slot behind Hugging Face's property setter) is recorded with its previous
value, so restoring puts back the very objects that were there, or removes the keys that were not.
The class, the parameters, buffers and the state_dict are never touched.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

_MISSING = object()
#: Set on every function kernelab installs, so a second patch recognises its own work.
MARK = "__kernelab_patch__"


@dataclass
class Installed:
    """The ``__dict__`` entries one swap changed on ``obj``, with what they held before."""

    obj: object
    saved: dict  # key -> previous value, or _MISSING when the key was absent

    def restore(self) -> None:
        for key, old in self.saved.items():
            if old is _MISSING:
                self.obj.__dict__.pop(key, None)
            else:
                self.obj.__dict__[key] = old


def marked(fn):
    """``fn`` marked as kernelab's (functions only: a bound method forwards attribute reads)."""
    setattr(fn, MARK, True)
    return fn


def is_kernelab(value) -> bool:
    return bool(getattr(value, MARK, False))


def bind(fn, module) -> types.MethodType:
    """``fn(self, ...)`` bound to ``module``: a deep copy of the model rebinds it to the copy."""
    return types.MethodType(fn, module)


def install(obj, name: str, value) -> Installed:
    """``setattr(obj, name, value)``, remembering every ``__dict__`` entry it changed."""
    before = dict(obj.__dict__)
    setattr(obj, name, value)
    after = obj.__dict__
    changed = [k for k in after if k not in before or after[k] is not before[k]]
    changed += [k for k in before if k not in after]
    return Installed(obj, {k: before.get(k, _MISSING) for k in changed})


def instance_override(obj, name: str):
    """The value of ``name`` set on this instance (hiding the class's), or None."""
    return obj.__dict__.get(name)
