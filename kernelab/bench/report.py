"""Benchmark output: CSV rows appended (GPU, versions, date in every row), a table, a plot per op."""

from __future__ import annotations

import csv
import dataclasses
import os
from pathlib import Path

from .runner import Row

CSV_NAME = "ops_bench.csv"


def append_csv(rows: list[Row], out_dir: str | os.PathLike, name: str = CSV_NAME) -> Path:
    path = Path(out_dir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    fields = [f.name.rstrip("_") for f in dataclasses.fields(Row)]
    new = not path.exists()
    with path.open("a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(fields)
        for r in rows:
            w.writerow([_fmt(getattr(r, f.name)) for f in dataclasses.fields(Row)])
    return path


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.6g}"
    return "" if v is None else v


def _cell(r: Row | None) -> str:
    if r is None:
        return "-"
    if r.tbps is None:
        return "fails" if r.status.startswith("error") else "skip"
    mark = "" if r.status == "ok" else " (!)"
    return f"{r.tbps:.2f}{mark}" if r.tbps >= 0.1 else f"{r.tbps:.3f}{mark}"


def table(rows: list[Row], console=None, title: str = "TB/s (bytes as in BASELINES.md); x = kernelab speed-up over the peer"):
    """One line per (op, shape, pass): each provider's TB/s, kernelab's ratios and % of copy."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    t = Table(title=title, show_lines=False)
    for col in ("op", "M x N", "pass", "kernelab", "eager", "compile", "liger", "x eager", "x compile", "x liger", "% copy"):
        t.add_column(col, justify="right" if col not in ("op", "pass") else "left")
    groups: dict[tuple, dict[str, Row]] = {}
    for r in rows:
        groups.setdefault((r.op, r.shape, r.pass_), {})[r.provider] = r
    for (op, shape, pass_), by in groups.items():
        k = by.get("kernelab")

        def ratio(peer):
            v = getattr(k, f"vs_{peer}", None) if k else None
            return "-" if v is None else f"{v:.2f}"

        t.add_row(op, shape, pass_, _cell(k), _cell(by.get("eager")), _cell(by.get("compile")), _cell(by.get("liger")),
                  ratio("eager"), ratio("compile"), ratio("liger"), "-" if not k or k.pct_copy is None else f"{k.pct_copy:.0f}")
    console.print(t)
    bad = [r for r in rows if r.status not in ("ok",) and not r.status.startswith("skipped")]
    for r in bad:
        console.print(f"[yellow]{r.op} {r.shape} {r.pass_} {r.provider}: {r.status}[/yellow]")
    return t


def best_peer_ratios(rows: list[Row], field: str = "ms") -> dict[tuple, float]:
    """(op, shape, pass) -> kernelab's speed-up over the fastest peer (eager, compile, Liger) by
    ``field`` ("ms": do_bench, host included; "graph_ms": GPU time alone), where both were timed."""
    groups: dict[tuple, dict[str, float]] = {}
    for r in rows:
        value = getattr(r, field, None)
        if value and r.status == "ok":
            groups.setdefault((r.op, r.shape, r.pass_), {})[r.provider] = value
    out = {}
    for key, by in groups.items():
        peers = [v for p, v in by.items() if p in ("eager", "compile", "liger")]
        if "kernelab" in by and peers:
            out[key] = min(peers) / by["kernelab"]
    return out


def wins_table(rows: list[Row], console=None):
    """Per (op, pass): shapes where kernelab is >= the fastest peer, by do_bench and by GPU time
    alone (graph_ms, where timed), with the worst and the geometric-mean ratio."""
    import math

    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    t = Table(title="kernelab vs the fastest of eager / torch.compile / Liger (x = its time / kernelab's)")
    for col in ("op", "pass", "timer", "wins", "min x", "geomean x"):
        t.add_column(col)
    for field, label in (("ms", "do_bench"), ("graph_ms", "GPU only")):
        by_group: dict[tuple, list[float]] = {}
        for (op, _, pass_), x in best_peer_ratios(rows, field).items():
            by_group.setdefault((op, pass_), []).append(x)
        for (op, pass_), xs in sorted(by_group.items()):
            geo = math.exp(sum(map(math.log, xs)) / len(xs))
            t.add_row(op, pass_, label, f"{sum(x >= 1.0 for x in xs)}/{len(xs)}", f"{min(xs):.2f}", f"{geo:.2f}")
    console.print(t)
    return t


def markdown_table(rows: list[Row]) -> str:
    """The README's grid table: per op, kernelab's TB/s by GPU time alone (graph_ms; do_bench's
    where no graph was timed) and its speed-up over the fastest peer by GPU time and by do_bench,
    forward and forward+backward, with how many shapes are >= 1.0x."""
    def span(xs: list[float]) -> str:
        return f"{min(xs):.2f}-{max(xs):.2f}" if xs else "-"

    def wins(ratios: dict, op: str, pass_: str) -> str:
        xs = [x for (o, _, p), x in ratios.items() if o == op and p == pass_]
        return f"{span(xs)} ({sum(x >= 1.0 for x in xs)}/{len(xs)})" if xs else "-"

    gpu, issued = best_peer_ratios(rows, "graph_ms"), best_peer_ratios(rows, "ms")
    lines = ["| op | fwd TB/s (GPU only) | fwd x best: GPU only / do_bench | fwd+bwd TB/s (GPU only) "
             "| fwd+bwd x best: GPU only / do_bench |", "| --- | --- | --- | --- | --- |"]
    for op in sorted({r.op for r in rows if r.provider == "kernelab"}):
        cells = [op]
        for pass_ in ("fwd", "fwd+bwd"):
            mine = [r for r in rows if r.op == op and r.pass_ == pass_ and r.provider == "kernelab" and r.status == "ok"]
            tbps = [r.bytes / (r.graph_ms * 1e-3) / 1e12 if r.graph_ms else r.tbps for r in mine]
            cells += [span([t for t in tbps if t]), f"{wins(gpu, op, pass_)} / {wins(issued, op, pass_)}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[Row], out_dir: str | os.PathLike) -> list[Path]:
    """One PNG per op: TB/s against row length, a panel per pass, the copy ceiling dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    by_op: dict[str, list[Row]] = {}
    for r in rows:
        if r.provider != "all":
            by_op.setdefault(r.op, []).append(r)
    for op, op_rows in by_op.items():
        passes = sorted({r.pass_ for r in op_rows}, key=lambda p: p != "fwd")
        fig, axes = plt.subplots(1, len(passes), figsize=(6.5 * len(passes), 4.2), squeeze=False)
        shapes = sorted({(r.m, r.n) for r in op_rows}, key=lambda s: (s[0] * s[1] < 2**20, s[1]))
        labels = [f"{m}x{n}" for m, n in shapes]
        for ax, pass_ in zip(axes[0], passes):
            for provider in ("kernelab", "eager", "compile", "liger"):
                pts = {(r.m, r.n): r.tbps for r in op_rows if r.pass_ == pass_ and r.provider == provider}
                if not any(v is not None for v in pts.values()):
                    continue
                ys = [pts.get(s) for s in shapes]
                ax.plot(range(len(shapes)), [y if y is not None else float("nan") for y in ys], marker="o", label=provider)
            copy = op_rows[0].copy_tbps
            if copy:
                ax.axhline(copy, linestyle="--", color="gray", label=f"copy {copy:.2f} TB/s")
            ax.set_xticks(range(len(shapes)), labels, rotation=35, ha="right", fontsize=8)
            ax.set_ylabel("TB/s")
            ax.set_title(f"{op} {pass_} ({op_rows[0].dtype}, {op_rows[0].gpu})", fontsize=9)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = Path(out_dir) / f"ops_{op}_{op_rows[0].dtype}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def load_csv(path: str | os.PathLike) -> list[Row]:
    """Rows written by :func:`append_csv`, typed back (for redrawing plots and tables)."""
    fields = {f.name.rstrip("_"): f for f in dataclasses.fields(Row)}
    rows = []
    with Path(path).open(newline="") as f:
        for raw in csv.DictReader(f):
            values = {}
            for name, field in fields.items():
                text = raw.get(name, "")
                kind = str(field.type)
                if text == "" and "None" in kind:
                    value = None
                elif kind.startswith("float"):
                    value = float(text)
                elif kind.startswith("int"):
                    value = int(text)
                else:
                    value = text
                values[field.name] = value
            rows.append(Row(**values))
    return rows


def main(argv: list[str] | None = None) -> int:
    """``python -m kernelab.bench.report OPS_BENCH_CSV OUT_DIR [--markdown]``: redraw the plots and
    print the table (and the README's markdown table)."""
    import argparse

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("csv", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--markdown", action="store_true", help="also print the README's markdown table")
    args = p.parse_args(argv)
    if not args.csv.is_file():
        p.error(f"{args.csv}: no such file")
    try:
        rows = load_csv(args.csv)
    except (TypeError, ValueError) as exc:
        p.error(f"{args.csv}: not an ops_bench.csv written by kernelab.bench ({exc})")
    for path in plot(rows, args.out):
        print(path)
    table(rows)
    if args.markdown:
        print(markdown_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
