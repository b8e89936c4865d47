"""One data model for every output: Report and Kernel, rendered as a table, JSON or a summary line.

JSON (``Report.to_dict()``, ``kernelab count --json``), schema version 1::

    {"schema_version": 1, "mode": "eager", "target": "add_relu", "measured": false,
     "device": "h200 (predicted)", "totals": {num_kernels, num_memops, bytes_read, bytes_written,
     bytes, transfers, ideal_bytes, ideal_transfers, fusion_headroom, round_trips, time_us},
     "kernels": [{name, category, kind, ops, launches, bytes_read, bytes_written, flops,
                  time_us, gbps, tflops, pct_of_ceiling, measured, confidence, reason,
                  module, modules, source, backward, bytes_over_ideal}],
     "round_trips": [{storage, shape, dtype, writer, readers, bytes}], "notes": [...],
     "module_types": {path: class name},
     "modules": {path, type, kernels: [kernel indices], own: {...}, totals: {kernels, memops,
                 backward, bytes, bytes_over_ideal, round_trips, time_us, pct_of_ceiling,
                 time_below_ceiling_us}, children: [...]}}

The module fields were added to version 1 (nothing removed or changed): ``module`` is the path of
the nn.Module that launched the kernel ("" is the target itself), ``modules`` every module a fused
kernel spans, ``source`` the user's line (``file.py:42``); ``Report.from_dict`` reads both forms.

Every time and rate says whether it was measured or predicted (``measured``); bytes and FLOPs are
always counted from the op trace (compulsory traffic), never read from hardware counters.
"""
from __future__ import annotations

import dataclasses
import functools
import io
import re
import shutil
from dataclasses import dataclass, field

from . import config
from .module_tree import ModuleNode, build_tree, common_module, wasters_line
from .module_tree import render as render_tree

SCHEMA_VERSION = 1


def debug_level() -> int:
    """KERNELAB_DEBUG=1..3: summary / a line per kernel / fusion decisions (the one debug switch)."""
    return config.debug_level()


@dataclass
class Kernel:
    name: str
    category: str
    ops: list[str]
    bytes_read: int = 0
    bytes_written: int = 0
    flops: float = 0.0
    launches: int = 1
    time_us: float | None = None
    measured: bool = False
    ceiling_bytes_per_s: float | None = None
    ceiling_flops: float | None = None
    confidence: str = "high"
    reason: str = ""
    modules: list[str] = field(default_factory=list)  # nn.Module paths of its ops ("" the target)
    source: str = ""  # the user's source line of its (first) op, "file.py:42"
    backward: bool = False  # differentiates the forward of ``module``
    bytes_over_ideal: int = 0  # bytes a fully fused version of the function would not move

    @property
    def module(self) -> str:
        """The module it belongs to: the innermost one holding every module it spans."""
        return common_module(self.modules)

    @property
    def kind(self) -> str:
        return self.category if self.category in ("memset", "memcpy") else "kernel"

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    @property
    def gbps(self) -> float | None:
        if not self.time_us:
            return None
        return self.bytes / (self.time_us * 1e-6) / 1e9

    @property
    def tflops(self) -> float | None:
        if not self.time_us:
            return None
        return self.flops / (self.time_us * 1e-6) / 1e12

    def _shares(self) -> dict[str, float]:
        """Utilization of each ceiling this kernel has: {"memory": bytes/s over the copy
        bandwidth, "compute": FLOP/s over the matmul rate}."""
        if not self.time_us:
            return {}
        shares = {}
        if self.ceiling_bytes_per_s:
            shares["memory"] = self.bytes / (self.time_us * 1e-6) / self.ceiling_bytes_per_s
        if self.ceiling_flops and self.flops:
            shares["compute"] = self.flops / (self.time_us * 1e-6) / self.ceiling_flops
        return shares

    @property
    def bound(self) -> str | None:
        """Which ceiling ``pct_of_ceiling`` is a share of: "memory" (copy bandwidth) or "compute"
        (the matmul rate), whichever the kernel is closer to."""
        shares = self._shares()
        return max(shares, key=shares.get) if shares else None

    @property
    def pct_of_ceiling(self) -> float | None:
        """The larger of bandwidth and compute utilization: how close to the limit that binds
        (``bound`` says which)."""
        shares = self._shares()
        return 100.0 * max(shares.values()) if shares else None

    def line(self) -> str:
        """The per-kernel line of KERNELAB_DEBUG=2 (same fields as a table row)."""
        how = "measured" if self.measured else "predicted"
        return (f"{self.category:<10} {fmt_bytes(self.bytes_read):>9} read {fmt_bytes(self.bytes_written):>9} written "
                f"{fmt_time(self.time_us):>9} {how}  {self.name} [{','.join(self.ops)}]"
                + (f"  @ {self.module or '(target)'}" if self.modules else "")
                + (f" {self.source}" if self.source else "")
                + (f"  ({self.reason})" if self.reason else ""))

    def to_dict(self) -> dict:
        return {
            "name": self.name, "category": self.category, "kind": self.kind, "ops": self.ops,
            "launches": self.launches, "bytes_read": self.bytes_read, "bytes_written": self.bytes_written,
            "flops": self.flops, "time_us": self.time_us, "gbps": self.gbps, "tflops": self.tflops,
            "pct_of_ceiling": self.pct_of_ceiling, "bound": self.bound, "measured": self.measured,
            "confidence": self.confidence, "reason": self.reason, "module": self.module,
            "modules": self.modules, "source": self.source, "backward": self.backward,
            "bytes_over_ideal": self.bytes_over_ideal,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Kernel":
        """A kernel from ``to_dict()`` (computed fields are recomputed, not read)."""
        names = {f.name for f in dataclasses.fields(cls)}
        k = cls(**{key: value for key, value in d.items() if key in names})
        if not k.modules and d.get("module") is not None:
            k.modules = [d["module"]]
        if d.get("time_us") and d.get("pct_of_ceiling") is not None:  # the ceiling it was a share of
            k.ceiling_bytes_per_s, k.ceiling_flops = _ceiling_from(d)
        return k


@dataclass
class Report:
    mode: str
    target: str
    measured: bool
    device: str
    kernels: list[Kernel]
    largest_array_bytes: int
    ideal_bytes: int
    round_trips: list = field(default_factory=list)  # traffic.RoundTrip
    wall_time_us: float | None = None  # one whole call, host overhead included
    notes: list[str] = field(default_factory=list)
    module_types: dict[str, str] = field(default_factory=dict)  # module path -> class name

    # -- totals --------------------------------------------------------------------------
    @property
    def num_kernels(self) -> int:
        return sum(k.launches for k in self.kernels if k.kind == "kernel")

    @property
    def num_memops(self) -> int:
        return sum(k.launches for k in self.kernels if k.kind != "kernel")

    @property
    def bytes_read(self) -> int:
        return sum(k.bytes_read for k in self.kernels)

    @property
    def bytes_written(self) -> int:
        return sum(k.bytes_written for k in self.kernels)

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    @property
    def transfers(self) -> float:
        """Bytes moved over the size of the largest input or output array."""
        return self.bytes / self.largest_array_bytes if self.largest_array_bytes else 0.0

    @property
    def ideal_transfers(self) -> float:
        return self.ideal_bytes / self.largest_array_bytes if self.largest_array_bytes else 0.0

    @property
    def fusion_headroom(self) -> float:
        """How many times more bytes than a fully fused version would move (1.0 = none left)."""
        return self.bytes / self.ideal_bytes if self.ideal_bytes else 1.0

    @property
    def kernel_time_us(self) -> float | None:
        times = [k.time_us for k in self.kernels]
        return None if any(t is None for t in times) else sum(times)

    @property
    def time_us(self) -> float | None:
        return self.wall_time_us if self.wall_time_us is not None else self.kernel_time_us

    @property
    def categories(self) -> list[str]:
        return [k.category for k in self.kernels]

    # -- modules -------------------------------------------------------------------------
    def by_module(self) -> ModuleNode:
        """The kernels grouped by the nn.Module that launched them: a tree of ModuleNode (path,
        type, kernels placed there, own and subtree totals: kernels, bytes, time, round trips,
        bytes over ideal, % of ceiling). See kernelab.module_tree."""
        return build_tree(self.kernels, self.round_trips, self.module_types)

    def module_tree(self, sort: str = "time", kernels: bool = True):
        """The module tree as a rich Tree (``print(r.module_tree())`` gives plain text), children
        sorted by ``sort``: "time", "waste" (bytes over ideal, round trips) or "ceiling" (time lost
        below the ceiling); the top wasters are named in the last line."""
        tree = render_tree(self, sort, kernels)
        return _text_group_class()(tree, self.summary() + "; " + wasters_line(self.by_module(), self.target))

    # -- rendering -----------------------------------------------------------------------
    def summary(self) -> str:
        """One line a person can repeat to a colleague."""
        trips = len(self.round_trips)
        parts = [f"{self.num_kernels} kernel{'s' if self.num_kernels != 1 else ''}"]
        if self.num_memops:
            parts.append(f"{self.num_memops} memop{'s' if self.num_memops != 1 else ''}")
        parts.append(f"{self.transfers:.3g} array transfers")
        parts.append(f"{trips} round trip{'s' if trips != 1 else ''}")
        line = f"{self.mode}: " + ", ".join(parts)
        if self.time_us is not None:
            line += f", {fmt_time(self.time_us)} {'measured' if self.measured else 'predicted'}"
        return line

    def to_dict(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION, "mode": self.mode, "target": self.target,
            "measured": self.measured, "device": self.device,
            "totals": {
                "num_kernels": self.num_kernels, "num_memops": self.num_memops,
                "bytes_read": self.bytes_read, "bytes_written": self.bytes_written, "bytes": self.bytes,
                "largest_array_bytes": self.largest_array_bytes, "transfers": self.transfers,
                "ideal_bytes": self.ideal_bytes, "ideal_transfers": self.ideal_transfers,
                "fusion_headroom": self.fusion_headroom, "round_trips": len(self.round_trips),
                "kernel_time_us": self.kernel_time_us, "wall_time_us": self.wall_time_us,
            },
            "kernels": [k.to_dict() for k in self.kernels],
            "round_trips": [t.to_dict() for t in self.round_trips],
            "notes": self.notes,
            "module_types": self.module_types,
            "modules": self.by_module().to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Report":
        """A report from ``to_dict()`` (or ``kernelab count --json``): render it again, regroup it."""
        from .traffic import RoundTrip

        totals = d["totals"]
        return cls(d["mode"], d["target"], d["measured"], d["device"], [Kernel.from_dict(k) for k in d["kernels"]],
                   totals["largest_array_bytes"], totals["ideal_bytes"],
                   [RoundTrip.from_dict(t) for t in d.get("round_trips", [])], totals.get("wall_time_us"),
                   list(d.get("notes", [])), dict(d.get("module_types", {})))

    def to_html(self, title: str | None = None) -> str:
        """This report as one self-contained HTML page (see kernelab.html_report.render_html)."""
        from .html_report import render_html

        return render_html(self, title=title)

    def to_trace(self) -> dict:
        """This report as a Chrome/Perfetto trace, a dict to ``json.dump`` (see kernelab.trace)."""
        from .trace import to_chrome_trace

        return to_chrome_trace(self)

    def table(self):
        """A rich Table, one row per kernel; ``print(r.table())`` and ``str()`` give plain text.

        Kernel names and ops are never cut: a long name folds onto the next line. "% ceiling" is a
        share of the ceiling that binds: "mem" (copy bandwidth) or "math" (matmul rate).
        """
        how = "measured" if self.measured else "predicted"
        title = f"{self.target} — {self.mode} — {self.device} ({how})"
        table = _text_table_class()(title=title, title_justify="left", caption_justify="left", pad_edge=False,
                                    min_width=min(len(title), 100))
        numeric = ("#", "read", "written", "time", "GB/s", "% ceiling")
        for column in ("#", "kernel", "category", "ops", "read", "written", "time", "GB/s", "% ceiling"):
            wide = column in ("kernel", "ops")  # these fold onto a next line; the others never shrink
            table.add_column(column, justify="right" if column in numeric else "left", no_wrap=not wide,
                             overflow="fold")
        for i, k in enumerate(self.kernels):
            name = short_kernel_name(k.name) + ("" if k.confidence == "high" else " [dim](?)[/dim]")
            table.add_row(str(i), name, k.category, ", ".join(k.ops), fmt_bytes(k.bytes_read),
                          fmt_bytes(k.bytes_written), fmt_time(k.time_us), _fmt_num(k.gbps), _fmt_pct(k))
        table.caption = self.summary() + f"; fused ideal {self.ideal_transfers:.3g} transfers" + self._time_split()
        return table

    def _time_split(self) -> str:
        """Host and GPU time apart: a call costs the longer of the two, so a few-µs kernel under a
        compiled wrapper's ~20 µs is host time, not GPU time."""
        gpu, call = self.kernel_time_us, self.wall_time_us
        if gpu is None or call is None or call <= 0:
            return ""
        how = "measured" if self.measured else "predicted"
        text = f"; GPU busy {fmt_time(gpu)} of a {fmt_time(call)} call ({how})"
        if gpu < 0.5 * call:
            text += ": the rest is host time (launches, Python, guards)"
        return text

    def debug(self, level: int, stream) -> None:
        """KERNELAB_DEBUG: 1 the summary line, 2 also a line per kernel."""
        if level >= 1:
            print(f"[kernelab] {self.target}: {self.summary()}", file=stream)
        if level >= 2:
            for i, k in enumerate(self.kernels):
                print(f"[kernelab]   #{i:<3} {k.line()}", file=stream)

    def __rich__(self):
        return self.table()

    def __str__(self) -> str:
        """The table as plain text (``print(report)``)."""
        return render_text(self.table())

    def __repr__(self) -> str:
        return f"<Report {self.summary()}>"


def as_reports(reports) -> list[Report]:
    """A Report, a list of them, or a Comparison (its reports in mode order), as a list."""
    if isinstance(reports, Report):
        return [reports]
    if hasattr(reports, "reports"):
        return list(reports.reports.values())
    reports = list(reports)
    if not reports or not all(isinstance(r, Report) for r in reports):
        raise TypeError("expected a Report, a list of Reports or a Comparison")
    return reports


def render_text(renderable, width: int | None = None) -> str:
    """Anything rich can print, as plain text at least 100 columns wide (the terminal's width
    when wider): what ``print()`` and ``str()`` show for tables."""
    from rich.console import Console

    width = width or max(100, shutil.get_terminal_size((100, 24)).columns)
    buffer = io.StringIO()
    Console(file=buffer, width=width, color_system=None, force_terminal=False, highlight=False,
            emoji=False).print(renderable)
    return buffer.getvalue().rstrip("\n")


@functools.lru_cache(maxsize=None)
def _text_group_class():
    """rich's Group with a plain-text ``str()``."""
    from rich.console import Group

    class TextGroup(Group):
        def __str__(self) -> str:
            return render_text(self)

    return TextGroup


def _ceiling_from(d: dict) -> tuple[float | None, float | None]:
    """The ceiling a serialized kernel's ``pct_of_ceiling`` was a share of, so that the share,
    and the module totals built on it, survive a JSON round trip."""
    rate = {"compute": d.get("flops", 0.0), "memory": d.get("bytes_read", 0) + d.get("bytes_written", 0)}
    bound = d.get("bound") or "memory"
    achieved = rate[bound] / (d["time_us"] * 1e-6)
    ceiling = achieved / (d["pct_of_ceiling"] / 100.0) if d["pct_of_ceiling"] else None
    return (ceiling, None) if bound == "memory" else (None, ceiling)


@functools.lru_cache(maxsize=None)
def _text_table_class():
    """rich's Table with a plain-text ``str()`` (made on first use: rich is imported lazily)."""
    from rich.table import Table

    class TextTable(Table):
        def __str__(self) -> str:
            return render_text(self)

        def __repr__(self) -> str:
            return f"<table {self.title!r}: {self.row_count} rows>"

    return TextTable


def short_kernel_name(name: str, limit: int | None = None) -> str:
    """A demangled CUDA kernel name made readable: no return type, arguments or namespaces, and
    of the template arguments only the functor that says what the kernel computes."""
    text = name[5:] if name.startswith("void ") else name
    text = text.replace("(anonymous namespace)::", "")
    depth, cut = 0, len(text)
    for i, ch in enumerate(text):
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0 and i > 0:
            cut = i
            break
    text = text[:cut]
    base, _, args = text.partition("<")
    base = base.split("::")[-1]
    functor = re.search(r"(\w*(?:Functor|Op|Ops|_kernel|_impl)\w*)", args)
    label = f"{base}<{functor.group(1)}>" if functor else base
    label = (label or name).strip()
    return _clip(label, limit) if limit else label


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"


def fmt_time(us: float | None) -> str:
    if us is None:
        return "-"
    return f"{us / 1000:.3g} ms" if us >= 1000 else f"{us:.3g} µs"




def _fmt_num(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _fmt_pct(k: Kernel) -> str:
    pct = k.pct_of_ceiling
    if pct is None:
        return "-"
    return f"{_fmt_num(pct)} {'math' if k.bound == 'compute' else 'mem'}"


def _clip(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"
