"""One self-contained HTML file for one or several reports: ``render_html(reports)``, ``Report.to_html()``.

What it shows, top to bottom:

1. a summary per mode (kernels, bytes read and written, the function's fused ideal, round trips,
   GPU time and the time of one call), every time labelled measured or predicted;
2. a timeline of one step, one lane per mode;
3. with several reports, the modes side by side per module (kernels, bytes, time);
4. per mode, the module tree (nested ``<details>``: each module's totals, its kernels with bytes,
   time and % of the ceiling that binds them) and the roofline.

No server and no network: CSS, script and SVG charts are inline; the page works without its script
(which only adds "expand all" and jumps from a chart's mark to its kernel's row). Every string that
comes from the user (module paths and types, kernel names, ops, source lines, notes) is escaped.
"""
from __future__ import annotations

from html import escape

from .html_charts import (bound_text, category_color, category_legend, fmt_pct, fmt_rate, how, kernel_id,
                          roofline_points, roofline_svg, timeline_svg)
from .module_tree import ModuleNode, wasters_line
from .report import Report, as_reports, fmt_bytes, fmt_time, short_kernel_name

CSS = """
:root { --fg: #1d2430; --muted: #667085; --line: #d9dee7; --bg: #fff; --soft: #f5f7fa; --accent: #3056d3; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg);
       background: var(--bg); margin: 0 auto; padding: 16px 24px 48px; max-width: 1240px; }
h1 { font-size: 22px; margin: 4px 0 2px; } h2 { font-size: 18px; margin: 28px 0 8px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
.muted { color: var(--muted); fill: var(--muted); } .small { font-size: 11px; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px; font-weight: 600; }
.badge.predicted { background: #fff3cd; color: #7a5b00; } .badge.measured { background: #d9f2e3; color: #14613a; }
table { border-collapse: collapse; margin: 6px 0; }
th, td { padding: 3px 8px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; }
th { background: var(--soft); font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
code { font: 12px ui-monospace, SFMono-Regular, Menlo, monospace; }
details.mod { margin: 2px 0 2px 14px; border-left: 2px solid var(--line); padding-left: 8px; }
details.mod > summary { cursor: pointer; padding: 2px 0; }
details.mod > summary .path { font-weight: 600; } details.mod > summary .type { color: var(--muted); }
.stats { color: var(--muted); margin-left: 8px; }
table.kernels { font-size: 12.5px; margin-left: 14px; }
table.kernels td:nth-child(2) { max-width: 420px; overflow-wrap: anywhere; }
table.kernels td:nth-child(4), table.kernels td:last-child { max-width: 260px; overflow-wrap: anywhere; }
tr.hl { background: #ffe9a8; outline: 2px solid #f0b400; }
.chip { display: inline-block; margin-right: 10px; font-size: 12px; }
.chip i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; border-radius: 2px; }
svg text { font-size: 12px; fill: var(--fg); } svg text.small { font-size: 10.5px; }
svg text.lane { font-weight: 600; } svg text.muted { fill: var(--muted); }
svg .axis, svg .grid { stroke: #c5ccd8; stroke-width: 1; } svg .grid { stroke-dasharray: 2 3; }
svg .frame { fill: none; stroke: #b8c0cc; } svg .call { fill: #9aa5b8; }
svg .kr { stroke: #fff; stroke-width: 0.3; cursor: pointer; }
svg .kr:hover, svg .pt:hover { stroke: #000; stroke-width: 1.5; }
svg.roofline { max-width: 900px; display: block; }
svg .roof { stroke-width: 2.2; } svg .roof.mem { stroke: #2f6fb1; } svg .roof.math { stroke: #c23b3b; }
svg text.roof-label { font-size: 11px; fill: #444; }
svg .pt { stroke: #fff; stroke-width: 0.8; fill-opacity: 0.85; cursor: pointer; } svg .pt.bwd { stroke: #000; }
.mode { border-top: 3px solid var(--line); margin-top: 28px; }
.note { font-size: 12.5px; color: var(--muted); }
button { font: inherit; font-size: 12px; margin-right: 6px; }
"""

SCRIPT = """
(function () {
  function show(id) {
    var row = document.getElementById(id);
    if (!row) return;
    for (var el = row.parentElement; el; el = el.parentElement) if (el.tagName === 'DETAILS') el.open = true;
    document.querySelectorAll('tr.hl').forEach(function (r) { r.classList.remove('hl'); });
    row.classList.add('hl');
    row.scrollIntoView({block: 'center'});
  }
  document.querySelectorAll('[data-k]').forEach(function (mark) {
    mark.addEventListener('click', function () { show(mark.getAttribute('data-k')); });
  });
  document.querySelectorAll('button[data-open]').forEach(function (b) {
    b.addEventListener('click', function () {
      var open = b.getAttribute('data-open') === '1';
      document.querySelectorAll(b.getAttribute('data-scope') + ' details.mod').forEach(function (d) { d.open = open; });
    });
  });
  document.documentElement.setAttribute('data-ready', '1');
})();
"""


def render_html(reports, title: str | None = None) -> str:
    """One self-contained HTML page for ``reports`` (a Report, a list, or a Comparison): summary,
    timeline, modes side by side, and per mode its module tree and roofline."""
    reports = as_reports(reports)
    title = title or f"kernelab — {reports[0].target}"
    parts = [_header(reports, title), _summary(reports), _timeline(reports)]
    if len(reports) > 1:
        parts.append(_side_by_side(reports))
    parts += [_mode_section(r, p) for p, r in enumerate(reports)]
    from . import __version__

    parts.append(f'<p class="note">kernelab {escape(__version__)} · bytes and FLOPs are counted from the op trace '
                 "(compulsory traffic), never read from hardware counters.</p>")
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
            + "\n".join(parts) + f"\n<script>{SCRIPT}</script>\n</body>\n</html>\n")


def _badge(report: Report) -> str:
    return f'<span class="badge {how(report)}">{how(report)}</span>'


def _header(reports: list[Report], title: str) -> str:
    devices = dict.fromkeys(r.device for r in reports)
    lines = [f"<h1>{escape(title)}</h1>",
             f'<p>target <code>{escape(reports[0].target)}</code> · {escape(", ".join(devices))} · '
             + " ".join(f"{escape(r.mode)} {_badge(r)}" for r in reports) + "</p>"]
    if not all(r.measured for r in reports):
        lines.append('<p class="note">Predicted figures come from a device profile: nothing ran, every kernel is '
                     "assumed to reach the roof that binds it (its bandwidth or its matmul rate, never under a "
                     "launch), so predicted points sit on the roofline by construction. Measure on a GPU to see "
                     "where they really fall.</p>")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Summary and modes side by side


def _summary_rows(r: Report) -> list[tuple[str, str]]:
    h = how(r)
    return [
        ("kernels", f"{r.num_kernels}" + (f" + {r.num_memops} memops" if r.num_memops else "")),
        ("bytes read", fmt_bytes(r.bytes_read)), ("bytes written", fmt_bytes(r.bytes_written)),
        ("bytes moved", f"{fmt_bytes(r.bytes)} ({r.transfers:.3g} array transfers)"),
        ("fused ideal (the function's)", f"{fmt_bytes(r.ideal_bytes)} ({r.ideal_transfers:.3g} transfers)"),
        ("over the ideal", f"{r.fusion_headroom:.3g}x"),
        ("round trips", str(len(r.round_trips))),
        ("GPU time (kernels)", _labelled_time(r.kernel_time_us, h, "some kernel has no time")),
        ("one call (host + GPU)", _labelled_time(r.wall_time_us, h, "not timed")),
    ]


def _labelled_time(us: float | None, h: str, missing: str) -> str:
    return f"{fmt_time(us)} {h}" if us is not None else f"- ({missing})"


def _summary(reports: list[Report]) -> str:
    rows = [_summary_rows(r) for r in reports]
    head = "".join(f"<th class=\"num\">{escape(r.mode)} {_badge(r)}</th>" for r in reports)
    body = []
    for j, (label, _) in enumerate(rows[0]):
        cells = "".join(f'<td class="num">{escape(row[j][1])}</td>' for row in rows)
        body.append(f"<tr><th>{escape(label)}</th>{cells}</tr>")
    wasters = "".join(f"<li>{escape(r.mode)}: {escape(wasters_line(r.by_module(), r.target))}</li>" for r in reports)
    return (f"<h2>Summary</h2>\n<table class=\"summary\"><tr><th></th>{head}</tr>\n" + "\n".join(body)
            + f"</table>\n<ul class=\"note\">{wasters}</ul>")


def _timeline(reports: list[Report]) -> str:
    return ("<h2>One step, kernel by kernel</h2>\n"
            '<p class="note">Each lane: one call of the target in that mode. The grey bar is the whole call (host '
            "time included); under it the kernels in launch order, back to back, each as wide as its time "
            "(gaps between kernels are not drawn). Click a kernel to find it in the module tree.</p>\n"
            f"{timeline_svg(reports)}\n<p>{category_legend(reports)}</p>")


def _side_by_side(reports: list[Report]) -> str:
    """Per module (every module any mode has kernels under), each mode's kernels, bytes and time."""
    trees = [r.by_module() for r in reports]
    paths: dict[str, int] = {}
    for tree in trees:
        for node in tree.walk():
            paths.setdefault(node.path, node.path.count(".") + (1 if node.path else 0))
    order = sorted(paths, key=lambda p: p.split(".") if p else [])
    head = "".join(f'<th class="num" colspan="3">{escape(r.mode)} {_badge(r)}</th>' for r in reports)
    sub = "<th class=\"num\">kernels</th><th class=\"num\">bytes</th><th class=\"num\">time</th>" * len(reports)
    rows = []
    for path in order:
        cells = []
        for tree in trees:
            node = tree.find(path)
            t = node.totals if node else None
            cells += [str(t.kernels) if t else "-", fmt_bytes(t.bytes) if t else "-", fmt_time(t.time_us) if t else "-"]
        name = path or reports[0].target
        indent = f'style="padding-left:{8 + 14 * paths[path]}px"'
        rows.append(f"<tr><td {indent}><code>{escape(name)}</code></td>"
                    + "".join(f'<td class="num">{escape(c)}</td>' for c in cells) + "</tr>")
    return ("<h2>Modes side by side, per module</h2>\n"
            '<p class="note">A module\'s figures cover its whole subtree; a fused kernel counts under the innermost '
            "module holding every module it spans, so a mode that fuses across modules moves kernels up the tree."
            f"</p>\n<table class=\"side\"><tr><th rowspan=\"2\">module</th>{head}</tr><tr>{sub}</tr>\n"
            + "\n".join(rows) + "</table>")


# ---------------------------------------------------------------------------------------------
# One mode: module tree and roofline


def _mode_section(report: Report, p: int) -> str:
    scope = f"mode-{p}"
    notes = "".join(f"<li>{escape(n)}</li>" for n in report.notes)
    with_flops, without = roofline_points(report)
    drawn = len(with_flops) + len(without)
    return (f'<section class="mode" id="{scope}">\n<h2>{escape(report.mode)} {_badge(report)}</h2>\n'
            f'<p>{escape(report.summary())}</p>\n<ul class="note">{notes}</ul>\n'
            f'<h3>Modules and their kernels</h3>\n<button data-open="1" data-scope="#{scope}">expand all</button>'
            f'<button data-open="0" data-scope="#{scope}">collapse all</button>\n'
            f"{_module_details(report.by_module(), report, p, depth=0)}\n"
            f"<h3>Roofline</h3>\n<p class=\"note\">Each dot a kernel ({drawn} of {len(report.kernels)} kernels; "
            "one that moves no counted bytes or has no time is not drawn), at its arithmetic intensity and achieved "
            "FLOP/s "
            f"({how(report)}); the roofs are the copy bandwidth and the matmul rate of each dtype its GEMMs use. "
            "Dots with a black rim are backward kernels. Click a dot to find its kernel.</p>\n"
            f"{roofline_svg(report, p)}\n</section>")


def _module_stats(node: ModuleNode) -> str:
    t = node.totals
    parts = [f"{t.kernels} kernel{'s' if t.kernels != 1 else ''}" + (f" ({t.backward} backward)" if t.backward else "")]
    if t.memops:
        parts.append(f"{t.memops} memops")
    parts += [fmt_bytes(t.bytes), fmt_time(t.time_us)]
    if t.bytes_over_ideal or t.round_trips:
        parts.append(f"{fmt_bytes(t.bytes_over_ideal)} over ideal, {t.round_trips} round trips")
    if t.pct_of_ceiling is not None:
        parts.append(f"{fmt_pct(t.pct_of_ceiling)} of ceiling (time-weighted)")
    return " · ".join(parts)


def _module_details(node: ModuleNode, report: Report, p: int, depth: int) -> str:
    """A module as ``<details>``: its totals in the summary line; inside, the kernels placed at it
    and its children, largest time first. The two top levels start open."""
    name = node.path or report.target
    kind = f' <span class="type">({escape(node.type)})</span>' if node.type else ""
    inner = [_kernel_table(node, report, p)] if node.kernels else []
    inner += [_module_details(child, report, p, depth + 1) for child in node.sorted_children("time")]
    return (f'<details class="mod"{" open" if depth < 2 else ""} data-path="{escape(node.path)}">'
            f'<summary><span class="path">{escape(name)}</span>{kind}'
            f'<span class="stats">{escape(_module_stats(node))}</span></summary>\n' + "\n".join(inner) + "</details>")


def _kernel_table(node: ModuleNode, report: Report, p: int) -> str:
    h = how(report)
    rows = []
    for i in node.kernels:
        k = report.kernels[i]
        spans = ", ".join(m or report.target for m in k.modules) if len(k.modules) > 1 else ""
        name = short_kernel_name(k.name) + (" (backward)" if k.backward else "")
        name += "" if k.confidence == "high" else " (?)"
        cells = [
            f'<td class="num">{i}</td>',
            f'<td title="{escape(k.name)}"><i style="color:{category_color(k.category)}">■</i> '
            f'<code>{escape(name)}</code>'
            + (f'<br><span class="small muted">spans {escape(spans)}</span>' if spans else "") + "</td>",
            f"<td>{escape(k.category)}</td>", f"<td><code>{escape(', '.join(k.ops))}</code></td>",
            f'<td class="num">{fmt_bytes(k.bytes_read)}</td>', f'<td class="num">{fmt_bytes(k.bytes_written)}</td>',
            f'<td class="num">{escape(fmt_time(k.time_us))}</td>',
            f'<td class="num">{escape(_rates(k))}</td>', f"<td>{escape(bound_text(k))}</td>",
            f'<td class="small" title="{escape(k.source)}">{escape(_basename(k.source))}'
            + (f'<br><span class="muted">{escape(k.reason)}</span>' if k.reason else "") + "</td>",
        ]
        rows.append(f'<tr id="{kernel_id(p, i)}">' + "".join(cells) + "</tr>")
    head = ("<tr><th class=\"num\">#</th><th>kernel</th><th>category</th><th>ops</th><th class=\"num\">read</th>"
            f"<th class=\"num\">written</th><th class=\"num\">time ({h})</th><th class=\"num\">achieved</th>"
            "<th>% of ceiling (which)</th><th>source</th></tr>")
    return f'<table class="kernels">{head}\n' + "\n".join(rows) + "</table>"


def _basename(source: str) -> str:
    """``/long/path/to/model.py:42`` -> ``model.py:42`` (the full path is the cell's tooltip)."""
    return source.replace("\\", "/").rpartition("/")[2]


def _rates(k) -> str:
    if not k.time_us:
        return "-"
    text = fmt_rate(k.bytes / (k.time_us * 1e-6), "B/s")
    return text + (f", {fmt_rate(k.flops / (k.time_us * 1e-6), 'FLOP/s')}" if k.flops else "")
