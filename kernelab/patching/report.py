"""What ``kernelab.patch`` did: every module swapped (path, kind, op) and every candidate left alone
(path, kind, reason), as a dataclass with a readable ``str`` and a rich table.

Repeated layers are folded in the printed table: ``model.layers.*.input_layernorm (x32)`` stands for
the 32 paths that differ only in their layer index; ``swapped`` and ``skipped`` keep every path.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

KINDS = ("norm", "mlp", "loss")


@dataclass(frozen=True)
class Swap:
    """One module (or the loss function of one model) now running a kernelab op."""

    path: str  # dotted module path from the patched model ("" for the model itself)
    kind: str  # "norm" | "mlp" | "loss"
    op: str  # the kernelab op and its variant, e.g. "rms_norm(x, 1 + weight)"
    module: str  # the module's class name


@dataclass(frozen=True)
class Skip:
    """A candidate that was left alone, and why."""

    path: str
    kind: str
    reason: str
    module: str


@dataclass
class PatchReport:
    """The swaps made by one ``kernelab.patch(model)`` call and the candidates it left alone."""

    swapped: list[Swap] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """Swaps per kind, e.g. ``{"norm": 9, "mlp": 4, "loss": 1}`` (kinds with none are 0)."""
        found = Counter(s.kind for s in self.swapped)
        return {k: found[k] for k in KINDS}

    def paths(self, kind: str | None = None) -> list[str]:
        """The swapped paths (of one kind, or all)."""
        return [s.path for s in self.swapped if kind is None or s.kind == kind]

    def summary(self) -> str:
        counts = ", ".join(f"{n} {k}" for k, n in self.counts().items() if n)
        return f"kernelab.patch: {len(self.swapped)} swapped ({counts or 'none'}), {len(self.skipped)} left alone"

    def rows(self) -> list[tuple[str, str, str, str, str]]:
        """(status, kind, op or reason, module class, folded path) per group of repeated layers."""
        groups: dict[tuple, list[str]] = {}
        for s in self.swapped:
            groups.setdefault(("swapped", s.kind, s.op, s.module, _fold(s.path)), []).append(s.path)
        for s in self.skipped:
            groups.setdefault(("left alone", s.kind, s.reason, s.module, _fold(s.path)), []).append(s.path)
        out = []
        for (status, kind, what, module, folded), paths in groups.items():
            where = paths[0] if len(paths) == 1 else f"{folded} (x{len(paths)})"
            out.append((status, kind, what, module, where or "(model)"))
        return out

    def __str__(self) -> str:
        header = ("status", "kind", "op / reason", "module", "path")
        rows = [header, *self.rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = [self.summary()]
        for r in rows:
            lines.append("  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4])
        return "\n".join(lines)

    def __rich__(self):
        from rich.table import Table

        table = Table(title=self.summary(), title_justify="left")
        for name in ("status", "kind", "op / reason", "module", "path"):
            table.add_column(name, overflow="fold")
        for r in self.rows():
            table.add_row(*r, style=None if r[0] == "swapped" else "yellow")
        return table


def _fold(path: str) -> str:
    """``model.layers.7.mlp`` -> ``model.layers.*.mlp``: repeated layers share one table row."""
    return re.sub(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.|$)", "*", path)
