"""Inline SVG charts of reports, for the HTML report: a timeline of one step and a roofline.

Hand-written SVG (no plotting library, no script): every string that comes from the user or the
report is escaped; every mark carries a ``<title>`` (the browser's tooltip) and a ``data-k``
attribute naming the kernel row of the HTML report it stands for.

* **Timeline**: one lane per mode, its kernels in launch order, each as wide as its time, drawn back
  to back (what the GPU would do with no gap between launches); above each lane a bar for one whole
  call (host time included), so a compiled call's host floor shows next to a few µs of kernels.
* **Roofline**: x = arithmetic intensity (FLOP per byte moved), y = achieved FLOP/s, both on log
  scales; the copy-bandwidth roof (y = bandwidth x intensity) and one flat roof per matmul rate the
  report's kernels are held to (one per dtype). Kernels that do no counted arithmetic (copies, fills,
  gathers: intensity 0, which a log scale cannot show) sit in a strip below, at their share of the
  copy bandwidth.
"""
from __future__ import annotations

import math
from html import escape

from .report import Kernel, Report, fmt_bytes, fmt_time, short_kernel_name

CATEGORY_COLORS = {
    "pointwise": "#4e79a7", "reduction": "#f28e2b", "matmul": "#e15759", "conv": "#b07aa1",
    "attention": "#9c3d7a", "copy": "#76b7b2", "fill": "#bab0ac", "index": "#59a14f", "scan": "#edc948",
    "sort": "#ff9da7", "memset": "#9d9d9d", "memcpy": "#7f7f7f", "other": "#8c6d31",
}
LABEL_W = 120  # left margin of the timeline: the lanes' names
LANE_H = 34


def category_color(category: str) -> str:
    """A fixed color per kernel category (an unknown one gets a stable color of its own)."""
    if category in CATEGORY_COLORS:
        return CATEGORY_COLORS[category]
    hue = sum(map(ord, category)) * 37 % 360
    return f"hsl({hue},45%,50%)"


def kernel_id(mode_index: int, kernel_index: int) -> str:
    """The HTML id of a kernel's row, shared by its marks in the charts."""
    return f"k{mode_index}-{kernel_index}"


def how(report: Report) -> str:
    return "measured" if report.measured else "predicted"


def fmt_rate(value: float, unit: str) -> str:
    """1.23e12 -> '1.23 T' + unit."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def bound_text(k: Kernel) -> str:
    """'43% of copy bandwidth' or '12% of matmul rate' (the ceiling that binds), or '-'."""
    pct = k.pct_of_ceiling
    if pct is None:
        return "-"
    ceiling = "matmul rate" if k.bound == "compute" else "copy bandwidth"
    return f"{fmt_pct(pct)} of {ceiling}"


def fmt_pct(pct: float) -> str:
    return "<1%" if 0 < pct < 1 else f"{pct:.0f}%"


def kernel_tooltip(k: Kernel, i: int, report: Report) -> str:
    """The lines of a kernel's tooltip (not yet escaped)."""
    lines = [f"#{i} {short_kernel_name(k.name)}" + (" (backward)" if k.backward else ""),
             f"{k.category} [{', '.join(k.ops)}] in {k.module or report.target}",
             f"{fmt_bytes(k.bytes_read)} read, {fmt_bytes(k.bytes_written)} written, {k.flops:.3g} FLOP",
             f"{fmt_time(k.time_us)} {how(report)}; {bound_text(k)}"]
    if k.source:
        lines.append(k.source)
    return "\n".join(lines)


def _title(text: str) -> str:
    return f"<title>{escape(text)}</title>"


def _text(x: float, y: float, text: str, cls: str = "", anchor: str = "start") -> str:
    klass = f' class="{cls}"' if cls else ""
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{klass}>{escape(text)}</text>'


def nice_ticks(span: float, count: int = 6) -> list[float]:
    """Round tick values from 0 to ``span``: steps of 1, 2 or 5 times a power of ten."""
    if span <= 0:
        return [0.0]
    raw = span / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [i * step for i in range(int(span / step) + 1)]


# ---------------------------------------------------------------------------------------------
# Timeline of one step


def kernel_starts(report: Report) -> list[float | None]:
    """Each kernel's start (µs) with the kernels back to back in launch order; None for a kernel
    without a time (it is not drawn, and the next one starts where the last timed one ended)."""
    starts, clock = [], 0.0
    for k in report.kernels:
        starts.append(clock if k.time_us is not None else None)
        clock += k.time_us or 0.0
    return starts


def timeline_svg(reports: list[Report], width: int = 1100) -> str:
    """One lane per report: a bar for one whole call, and under it the kernels in launch order."""
    span = max((max(r.kernel_time_us or sum(k.time_us or 0.0 for k in r.kernels), r.wall_time_us or 0.0)
                for r in reports), default=0.0) or 1.0
    plot_w = width - LABEL_W - 20
    scale = plot_w / span
    height = 20 + len(reports) * (LANE_H + 26) + 30
    out = [f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
           f'width="100%" role="img" aria-label="timeline of one step">']
    y = 20
    for p, report in enumerate(reports):
        out.append(_text(4, y + 20, report.mode, "lane"))
        out.append(_text(4, y + 34, how(report), "muted small"))
        if report.wall_time_us:
            call = _title(f"one call: {fmt_time(report.wall_time_us)} {how(report)}, host time included")
            out.append(f'<rect class="call" x="{LABEL_W}" y="{y}" width="{report.wall_time_us * scale:.2f}" '
                       f'height="6">{call}</rect>')
        for i, (k, start) in enumerate(zip(report.kernels, kernel_starts(report))):
            if start is None:
                continue
            out.append(f'<rect class="kr" data-k="{kernel_id(p, i)}" x="{LABEL_W + start * scale:.2f}" y="{y + 10}" '
                       f'width="{max(k.time_us * scale, 0.6):.2f}" height="{LANE_H - 10}" '
                       f'fill="{category_color(k.category)}">{_title(kernel_tooltip(k, i, report))}</rect>')
        y += LANE_H + 26
    out.append(f'<line class="axis" x1="{LABEL_W}" y1="{y}" x2="{LABEL_W + plot_w}" y2="{y}"/>')
    for t in nice_ticks(span):
        x = LABEL_W + t * scale
        out.append(f'<line class="axis" x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}"/>')
        out.append(_text(x, y + 16, fmt_time(t), "small", "middle"))
    out.append("</svg>")
    return "\n".join(out)


def category_legend(reports: list[Report]) -> str:
    """HTML chips for the categories the reports' kernels fall in."""
    seen = dict.fromkeys(k.category for r in reports for k in r.kernels)
    return " ".join(f'<span class="chip"><i style="background:{category_color(c)}"></i>{escape(c)}</span>'
                    for c in seen)


# ---------------------------------------------------------------------------------------------
# Roofline


def copy_ceiling(report: Report) -> float | None:
    """The copy bandwidth the report's kernels are measured against (the most common one)."""
    values = [k.ceiling_bytes_per_s for k in report.kernels if k.ceiling_bytes_per_s]
    return max(set(values), key=values.count) if values else None


def matmul_ceilings(report: Report) -> list[float]:
    return sorted({k.ceiling_flops for k in report.kernels if k.ceiling_flops})


def _dtype_of_rate(rate: float) -> str:
    """The dtype a named device profile gives this matmul rate ('' when none does)."""
    from .hardware import PROFILES

    return next((dtype for p in PROFILES.values() for dtype, r in p.matmul_flops.items() if r == rate), "")


class _LogAxis:
    """Maps [lo, hi] (whole decades) onto [a, b] pixels on a log scale."""

    def __init__(self, values: list[float], a: float, b: float):
        self.lo = math.floor(math.log10(min(values)))
        self.hi = max(math.ceil(math.log10(max(values))), self.lo + 1)
        self.a, self.b = a, b

    def __call__(self, v: float) -> float:
        return self.a + (math.log10(v) - self.lo) / (self.hi - self.lo) * (self.b - self.a)

    def decades(self) -> list[float]:
        return [10.0 ** e for e in range(self.lo, self.hi + 1)]


def roofline_points(report: Report) -> tuple[list[int], list[int]]:
    """Indices of the kernels drawn: (with FLOPs, on the roofline; without, in the strip below).
    A kernel needs bytes and a time to be drawn."""
    drawn = [i for i, k in enumerate(report.kernels) if k.bytes > 0 and k.time_us]
    return [i for i in drawn if report.kernels[i].flops > 0], [i for i in drawn if report.kernels[i].flops <= 0]


def roofline_svg(report: Report, mode_index: int, width: int = 760) -> str:
    """The roofline of one report, and under it the strip of kernels without FLOPs."""
    with_flops, without = roofline_points(report)
    bandwidth, peaks = copy_ceiling(report), matmul_ceilings(report)
    left, top, plot_w, plot_h = 70, 14, width - 90, 300
    strip_top = top + plot_h + 56
    height = strip_top + 80
    out = [f'<svg class="roofline" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
           f'width="100%" role="img" aria-label="roofline of {escape(report.mode)}">']
    ks = report.kernels
    intensity = {i: ks[i].flops / ks[i].bytes for i in with_flops}
    achieved = {i: ks[i].flops / (ks[i].time_us * 1e-6) for i in with_flops}
    ridges = [peak / bandwidth for peak in peaks] if bandwidth else []
    x = _LogAxis(list(intensity.values()) + ridges or [0.01, 1000.0], left, left + plot_w)
    y_values = list(achieved.values()) + peaks
    if bandwidth:
        y_values.append(bandwidth * 10.0 ** x.lo)
    y = _LogAxis(y_values or [1e9, 1e15], top + plot_h, top)
    out += _log_grid(x, y, left, top, plot_w, plot_h)
    out += _roofs(x, y, bandwidth, peaks)
    for i in with_flops:
        out.append(_point(x(intensity[i]), y(achieved[i]), ks[i], i, mode_index, report))
    if not with_flops:
        out.append(_text(left + plot_w / 2, top + plot_h / 2, "no kernel with counted FLOPs", "muted", "middle"))
    out += _flat_strip(report, without, bandwidth, mode_index, left, strip_top, plot_w)
    out.append("</svg>")
    return "\n".join(out)


def _log_grid(x: _LogAxis, y: _LogAxis, left, top, plot_w, plot_h) -> list[str]:
    out = [f'<rect class="frame" x="{left}" y="{top}" width="{plot_w}" height="{plot_h}"/>']
    for v in x.decades():
        out.append(f'<line class="grid" x1="{x(v):.1f}" y1="{top}" x2="{x(v):.1f}" y2="{top + plot_h}"/>')
        out.append(_text(x(v), top + plot_h + 14, f"{v:g}", "small", "middle"))
    for v in y.decades():
        out.append(f'<line class="grid" x1="{left}" y1="{y(v):.1f}" x2="{left + plot_w}" y2="{y(v):.1f}"/>')
        out.append(_text(left - 4, y(v) + 4, fmt_rate(v, "FLOP/s"), "small", "end"))
    out.append(_text(left + plot_w / 2, top + plot_h + 30, "arithmetic intensity (FLOP per byte moved)", "", "middle"))
    return out


def _roofs(x: _LogAxis, y: _LogAxis, bandwidth: float | None, peaks: list[float]) -> list[str]:
    """The copy-bandwidth roof (a slope) and one flat matmul roof per rate, clipped to the plot."""
    out = []
    x_lo, x_hi = 10.0 ** x.lo, 10.0 ** x.hi
    y_hi = 10.0 ** y.hi
    if bandwidth:
        x_end = min(x_hi, y_hi / bandwidth)
        label = f"copy {fmt_rate(bandwidth, 'B/s')}"
        out.append(f'<line class="roof mem" x1="{x(x_lo):.1f}" y1="{y(bandwidth * x_lo):.1f}" x2="{x(x_end):.1f}" '
                   f'y2="{y(bandwidth * x_end):.1f}">{_title(label)}</line>')
        out.append(_text(x(x_lo) + 6, y(bandwidth * x_lo) - 6, label, "roof-label"))
    for peak in peaks:
        start = max(x_lo, peak / bandwidth) if bandwidth else x_lo
        dtype = _dtype_of_rate(peak)
        label = f"matmul {fmt_rate(peak, 'FLOP/s')}" + (f" ({dtype})" if dtype else "")
        out.append(f'<line class="roof math" x1="{x(start):.1f}" y1="{y(peak):.1f}" x2="{x(x_hi):.1f}" '
                   f'y2="{y(peak):.1f}">{_title(label)}</line>')
        out.append(_text(x(x_hi) - 4, y(peak) + 14, label, "roof-label", "end"))  # under its roof
    return out


def _point(px: float, py: float, k: Kernel, i: int, mode_index: int, report: Report) -> str:
    cls = "pt bwd" if k.backward else "pt"
    return (f'<circle class="{cls}" data-k="{kernel_id(mode_index, i)}" cx="{px:.1f}" cy="{py:.1f}" r="4.5" '
            f'fill="{category_color(k.category)}">{_title(kernel_tooltip(k, i, report))}</circle>')


def _flat_strip(report: Report, indices: list[int], bandwidth: float | None, mode_index: int, left: float,
                top: float, plot_w: float) -> list[str]:
    """Kernels with no counted FLOPs, at their achieved bandwidth as a share of the copy ceiling
    (or in GB/s when the report has no ceiling), spread over five rows so that they overlap less."""
    ks = report.kernels
    rates = {i: ks[i].bytes / (ks[i].time_us * 1e-6) for i in indices}
    if bandwidth:
        values = {i: 100.0 * r / bandwidth for i, r in rates.items()}
        label, unit = "kernels without FLOPs: achieved bandwidth, % of the copy ceiling", "%"
    else:
        values = {i: r / 1e9 for i, r in rates.items()}
        label, unit = "kernels without FLOPs: achieved bandwidth, GB/s", " GB/s"
    hi = max([100.0 if bandwidth else 1.0] + list(values.values()))
    out = [_text(left, top - 8, label, "small"),
           f'<rect class="frame" x="{left}" y="{top}" width="{plot_w}" height="50"/>']
    for t in nice_ticks(hi, 5):
        px = left + t / hi * plot_w
        out.append(f'<line class="grid" x1="{px:.1f}" y1="{top}" x2="{px:.1f}" y2="{top + 50}"/>')
        out.append(_text(px, top + 64, f"{t:g}{unit}", "small", "middle"))
    for row, i in enumerate(indices):
        px = left + values[i] / hi * plot_w
        out.append(_point(px, top + 7 + (row % 5) * 9, ks[i], i, mode_index, report))
    if not indices:
        out.append(_text(left + plot_w / 2, top + 30, "none", "muted", "middle"))
    return out
