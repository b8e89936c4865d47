"""A report's kernels grouped by the nn.Module that launched them: ``Report.by_module()``.

Each kernel sits at one node: the module that ran its op (eager), or the innermost module holding
every op a fused kernel computes (``Kernel.modules`` lists them all). Backward kernels sit at the
module whose forward they differentiate. A node's totals cover its whole subtree; ``own`` covers
only the kernels placed at it, which is what names the top wasters.

Waste, per kernel and summed per module:

* *bytes over ideal*: what the kernel moves beyond a fully fused version of the function (which
  reads each input once and writes each output once): every intermediate it writes or reads back,
  every input it reads again (``kernelab.traffic.bytes_over_ideal``);
* *round trips*: values its kernels write and a later kernel reads back;
* *time below the ceiling*: its time minus the time it would take at the ceiling that binds it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

SORTS = ("time", "waste", "ceiling")
ROOT = ""  # the path of the counted module (or of the counted function's own code)


def join(parent: str, child: str) -> str:
    return f"{parent}.{child}" if parent and child else parent or child


def common_module(paths) -> str:
    """The innermost module that contains every path: ``h.0.ln_1`` and ``h.0.attn.c_attn`` -> ``h.0``."""
    split = [p.split(".") if p else [] for p in paths]
    if not split:
        return ROOT
    prefix = split[0]
    for parts in split[1:]:
        n = 0
        while n < min(len(prefix), len(parts)) and prefix[n] == parts[n]:
            n += 1
        prefix = prefix[:n]
    return ".".join(prefix)


@dataclass
class Totals:
    kernels: int = 0  # launches of kernels (memsets and memcpys apart)
    memops: int = 0
    backward: int = 0  # of those kernel launches, the backward pass's
    bytes: int = 0
    bytes_over_ideal: int = 0
    round_trips: int = 0  # values written here and read back later
    time_us: float | None = 0.0  # None when some kernel has no time
    time_at_ceiling_us: float = 0.0  # sum of each kernel's time at the ceiling that binds it

    def add_kernel(self, k) -> None:
        if k.kind == "kernel":
            self.kernels += k.launches
            self.backward += k.launches if k.backward else 0
        else:
            self.memops += k.launches
        self.bytes += k.bytes
        self.bytes_over_ideal += k.bytes_over_ideal
        self.time_us = None if self.time_us is None or k.time_us is None else self.time_us + k.time_us
        if k.time_us and k.pct_of_ceiling is not None:
            self.time_at_ceiling_us += k.time_us * k.pct_of_ceiling / 100.0

    def add(self, other: "Totals") -> None:
        for name in ("kernels", "memops", "backward", "bytes", "bytes_over_ideal", "round_trips",
                     "time_at_ceiling_us"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.time_us = None if self.time_us is None or other.time_us is None else self.time_us + other.time_us

    @property
    def pct_of_ceiling(self) -> float | None:
        """Time-weighted share of the ceiling: time at the ceiling over time taken."""
        return 100.0 * self.time_at_ceiling_us / self.time_us if self.time_us else None

    @property
    def time_below_ceiling_us(self) -> float:
        return max((self.time_us or 0.0) - self.time_at_ceiling_us, 0.0)

    def key(self, sort: str) -> tuple:
        """Larger first: by time, by bytes over ideal (then round trips), or by time lost below
        the ceiling."""
        if sort == "time":
            return (self.time_us or 0.0, self.bytes)
        if sort == "waste":
            return (self.bytes_over_ideal, self.round_trips, self.time_below_ceiling_us)
        return (self.time_below_ceiling_us, self.bytes_over_ideal)

    def to_dict(self) -> dict:
        return {"kernels": self.kernels, "memops": self.memops, "backward": self.backward, "bytes": self.bytes,
                "bytes_over_ideal": self.bytes_over_ideal, "round_trips": self.round_trips,
                "time_us": self.time_us, "pct_of_ceiling": self.pct_of_ceiling,
                "time_below_ceiling_us": self.time_below_ceiling_us}


@dataclass
class ModuleNode:
    path: str  # "" is the target itself
    type: str  # the module's class name ("" when unknown: the target is a function)
    kernels: list[int] = field(default_factory=list)  # indices into Report.kernels placed here
    children: list["ModuleNode"] = field(default_factory=list)
    own: Totals = field(default_factory=Totals)
    totals: Totals = field(default_factory=Totals)

    @property
    def name(self) -> str:
        return self.path.rpartition(".")[2]

    def walk(self):
        yield self
        for child in self.children:
            yield from child.walk()

    def find(self, path: str) -> "ModuleNode | None":
        return next((n for n in self.walk() if n.path == path), None)

    def sorted_children(self, sort: str) -> list["ModuleNode"]:
        return sorted(self.children, key=lambda n: n.totals.key(sort), reverse=True)

    def to_dict(self) -> dict:
        return {"path": self.path, "type": self.type, "kernels": self.kernels, "own": self.own.to_dict(),
                "totals": self.totals.to_dict(), "children": [c.to_dict() for c in self.children]}


def build_tree(kernels: list, round_trips: list, module_types: dict[str, str]) -> ModuleNode:
    """The module tree of a report's kernels (children in the order modules first launch)."""
    root = ModuleNode(ROOT, module_types.get(ROOT, ""))
    nodes = {ROOT: root}
    for i, k in enumerate(kernels):
        node = _node(k.module, nodes, module_types)
        node.kernels.append(i)
        node.own.add_kernel(k)
    for trip in round_trips:
        if 0 <= trip.writer < len(kernels):
            nodes[kernels[trip.writer].module].own.round_trips += 1
    _sum_subtrees(root)
    return root


def _node(path: str, nodes: dict, module_types: dict) -> ModuleNode:
    if path in nodes:
        return nodes[path]
    parent = _node(path.rpartition(".")[0], nodes, module_types)
    node = ModuleNode(path, module_types.get(path, ""))
    parent.children.append(node)
    nodes[path] = node
    return node


def _sum_subtrees(node: ModuleNode) -> Totals:
    node.totals = Totals()
    node.totals.add(node.own)
    for child in node.children:
        node.totals.add(_sum_subtrees(child))
    return node.totals


def top_wasters(root: ModuleNode, n: int = 3) -> list[ModuleNode]:
    """The modules whose own kernels move the most bytes over ideal (ties: round trips)."""
    wasteful = [m for m in root.walk() if m.own.bytes_over_ideal > 0 or m.own.round_trips > 0]
    return sorted(wasteful, key=lambda m: m.own.key("waste"), reverse=True)[:n]


# ---------------------------------------------------------------------------------------------
# Rendering (rich is imported on use)


def render(report, sort: str = "time", kernels: bool = True):
    """A rich Tree: each module with its totals, its children sorted by ``sort`` (time, waste or
    ceiling), and under each module the kernels placed there, in launch order."""
    from rich.tree import Tree

    if sort not in SORTS:
        raise ValueError(f"unknown sort {sort!r}; choose from {', '.join(SORTS)}")
    root = report.by_module()
    how = "measured" if report.measured else "predicted"
    title = f"{report.target} — {report.mode} — {report.device} ({how}) — by module, sorted by {sort}"
    tree = Tree(title)

    def grow(branch, node: ModuleNode) -> None:
        sub = branch.add(_node_label(node, report.target))
        if kernels:
            for i in node.kernels:
                sub.add(_kernel_label(i, report.kernels[i], report.target))
        for child in node.sorted_children(sort):
            grow(sub, child)

    grow(tree, root)
    return tree


def _node_label(node: ModuleNode, target: str) -> str:
    from rich.markup import escape

    from .report import fmt_bytes, fmt_time

    t = node.totals
    name = escape(node.path or target) + (f" ({escape(node.type)})" if node.type else "")
    parts = [f"{t.kernels} kernel{'s' if t.kernels != 1 else ''}"]
    if t.backward:
        parts[0] += f" ({t.backward} backward)"
    if t.memops:
        parts.append(f"{t.memops} memop{'s' if t.memops != 1 else ''}")
    parts.append(fmt_bytes(t.bytes))
    parts.append(fmt_time(t.time_us))
    if t.bytes_over_ideal or t.round_trips:
        parts.append(f"{fmt_bytes(t.bytes_over_ideal)} over ideal, {t.round_trips} round "
                     f"trip{'s' if t.round_trips != 1 else ''}")
    if t.pct_of_ceiling is not None:
        parts.append(f"{_pct(t.pct_of_ceiling)} of ceiling")
    return f"[bold]{name}[/bold]  " + " · ".join(parts)


def _kernel_label(i: int, k, target: str) -> str:
    from rich.markup import escape

    from .report import fmt_bytes, fmt_time, short_kernel_name

    text = f"#{i} {escape(short_kernel_name(k.name))} [{escape(', '.join(k.ops))}]"
    if k.backward:
        text += " backward"
    text += f"  {fmt_bytes(k.bytes)} {fmt_time(k.time_us)}"
    if k.bytes_over_ideal:
        text += f", {fmt_bytes(k.bytes_over_ideal)} over ideal"
    if len(k.modules) > 1:
        text += f"  spans {escape(', '.join(m or target for m in k.modules))}"
    if k.source:
        text += f"  [dim]{escape(_basename(k.source))}[/dim]"
    return text


def _pct(pct: float) -> str:
    return "<1%" if 0 < pct < 1 else f"{pct:.0f}%"


def _basename(source: str) -> str:
    return source.replace("\\", "/").rpartition("/")[2]


def wasters_line(root: ModuleNode, target: str, n: int = 3) -> str:
    """``top wasters: h.0.attn (1.2 MB over ideal, 3 round trips), ...`` (or that there are none)."""
    from .report import fmt_bytes

    top = top_wasters(root, n)
    if not top:
        return "no bytes over ideal: nothing left to fuse"
    return "top wasters: " + ", ".join(
        f"{m.path or target} ({fmt_bytes(m.own.bytes_over_ideal)} over ideal, {m.own.round_trips} round "
        f"trip{'s' if m.own.round_trips != 1 else ''})" for m in top)
