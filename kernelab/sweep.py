"""sweep: time against input size for several modes, and the size where fusion starts to pay.

On a GPU every point is measured (one ``count`` per size and mode: kernels from the profiler,
wall time of a whole call from CUDA events). Without one, every point is predicted from the device
profile, and the inputs are built on the meta device, so 1e9 elements cost nothing.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from .api import KernelabError, count, gpu_available
from .report import Report, fmt_time


def parse_sizes(text: str) -> list[int]:
    """``1e2:1e9`` -> one size per decade; ``1e2:1e9:2`` -> two per decade; ``100,1000`` -> a list."""
    try:
        if ":" in text:
            parts = text.split(":")
            low, high = float(parts[0]), float(parts[1])
            per_decade = int(parts[2]) if len(parts) > 2 else 1
            if low <= 0 or high < low or per_decade < 1 or len(parts) > 3:
                raise ValueError
            steps = round(math.log10(high / low) * per_decade)
            return sorted({int(round(low * 10 ** (i / per_decade))) for i in range(steps + 1)})
        sizes = [int(float(s)) for s in text.split(",")]
    except ValueError:
        raise KernelabError(f"bad sizes {text!r}: use LOW:HIGH[:PER_DECADE] (e.g. 1e2:1e9) or a comma list") from None
    if any(s <= 0 for s in sizes):
        raise KernelabError(f"sizes must be positive, got {text!r}")
    return sorted(set(sizes))


@dataclass
class SweepPoint:
    size: int
    mode: str
    report: Report

    @property
    def time_us(self) -> float | None:
        return self.report.time_us


@dataclass
class SweepResult:
    target: str
    sizes: list[int]
    modes: tuple[str, ...]
    measured: bool
    device: str
    points: list[SweepPoint] = field(default_factory=list)

    def time(self, mode: str, size: int) -> float | None:
        for p in self.points:
            if p.mode == mode and p.size == size:
                return p.time_us
        return None

    def crossover(self, fused: str, baseline: str = "eager") -> int | None:
        """Smallest size from which ``fused`` is faster than ``baseline`` at every larger size."""
        result = None
        for size in reversed(self.sizes):
            a, b = self.time(fused, size), self.time(baseline, size)
            if a is None or b is None or a >= b:
                break
            result = size
        return result

    def crossover_line(self) -> str:
        lines = []
        for mode in self.modes:
            if mode == "eager" or "eager" not in self.modes:
                continue
            size = self.crossover(mode)
            how = "measured" if self.measured else "predicted"
            if size is None:
                lines.append(f"{mode} is not faster than eager at the largest size ({how})")
            else:
                lines.append(f"{mode} beats eager from n = {size:.0e} on ({how})")
        return "; ".join(lines)

    def table(self):
        from rich.table import Table

        how = "measured" if self.measured else "predicted"
        table = Table(title=f"sweep of {self.target} on {self.device} ({how})", title_justify="left")
        table.add_column("n", justify="right")
        for mode in self.modes:
            table.add_column(f"{mode} time", justify="right")
            table.add_column("kernels", justify="right")
            table.add_column("transfers", justify="right")
        for size in self.sizes:
            row = [f"{size:.0e}"]
            for mode in self.modes:
                p = next((p for p in self.points if p.mode == mode and p.size == size), None)
                row += ["-", "-", "-"] if p is None else [
                    fmt_time(p.time_us), str(p.report.num_kernels), f"{p.report.transfers:.3g}"]
            table.add_row(*row)
        table.caption = self.crossover_line()
        return table

    def _crossovers(self) -> dict[int, list[str]]:
        """Crossover size -> the compiled modes that start to pay there."""
        by_size: dict[int, list[str]] = {}
        for mode in self.modes:
            size = self.crossover(mode) if mode != "eager" else None
            if size:
                by_size.setdefault(size, []).append(mode)
        return by_size

    def to_rows(self) -> list[dict]:
        return [{"target": self.target, "n": p.size, "mode": p.mode, "time_us": p.time_us,
                 "kernels": p.report.num_kernels, "memops": p.report.num_memops,
                 "transfers": p.report.transfers, "measured": self.measured, "device": self.device}
                for p in self.points]

    def plot(self, path: str) -> str:
        """Time against size, one line per mode, log-log; PNG or SVG by the file's extension."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for i, mode in enumerate(self.modes):
            pts = [(p.size, p.time_us) for p in self.points if p.mode == mode and p.time_us]
            if pts:  # lines that coincide (two compiled modes) stay visible: the later, thinner and dashed, on top
                style = _LINE_STYLES[i % len(_LINE_STYLES)]
                ax.plot(*zip(*pts), label=mode, zorder=2 + i, **style)
        ax.set_xscale("log")
        ax.set_yscale("log")
        for size, modes in self._crossovers().items():  # one line and one label per size
            ax.axvline(size, linestyle=":", color="gray")
            ax.text(size, 0.5, f" {' and '.join(modes)} {'pay' if len(modes) > 1 else 'pays'} from n = {size:.0e}",
                    rotation=90, va="center", ha="right", fontsize=8, color="dimgray", transform=ax.get_xaxis_transform(),
                    bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1.5}, zorder=10)
        ax.set_xlabel("n (elements)")
        ax.set_ylabel("time per call (µs)")
        ax.set_title(f"{self.target}: {'measured' if self.measured else 'predicted'} on {self.device}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        return path


# One style per mode, in order: the later lines are thinner, dashed and with hollow markers, so a
# line drawn exactly over another (Inductor and kernelab often predict the same time) still shows.
_LINE_STYLES = (
    {"marker": "o", "linewidth": 3.0, "markersize": 7, "linestyle": "-"},
    {"marker": "s", "linewidth": 2.2, "markersize": 8, "linestyle": "-", "markerfacecolor": "none"},
    {"marker": "^", "linewidth": 1.4, "markersize": 5, "linestyle": "--"},
    {"marker": "x", "linewidth": 1.0, "markersize": 6, "linestyle": ":"},
)


def sweep(target, make_args: Callable[[int], tuple], sizes, modes=("eager", "inductor"), predict: bool | None = None,
          profile: str | None = None, progress: bool = True, name: str | None = None,
          timeout: float | None = None) -> SweepResult:
    """Run ``count`` at every size in every mode; ``make_args(n)`` builds the inputs of size n.
    ``timeout`` (seconds) applies to each count, as in :func:`kernelab.count`."""
    if predict is None:
        predict = not gpu_available()
    sizes = sorted(set(int(s) for s in sizes))
    if not sizes:
        raise KernelabError("sweep needs at least one size")
    name = name or getattr(target, "__name__", type(target).__name__)
    device = (profile or "h200") + " profile" if predict else torch.cuda.get_device_name()
    result = SweepResult(name, sizes, tuple(modes), not predict, device)
    with _progress(progress, len(sizes) * len(modes)) as advance:
        for size in sizes:
            args = _args_for(make_args, size, predict)
            for mode in modes:
                report = count(target, *args, mode=mode, predict=predict, profile=profile, name=name, timeout=timeout)
                result.points.append(SweepPoint(size, mode, report))
                advance(f"{mode} n={size:.0e}")
            del args
    return result


def _args_for(make_args, size: int, predict: bool) -> tuple:
    """Inputs of one size: on the meta device when predicting (nothing is allocated), on the GPU
    when measuring (a 1e9-element input is not built on the host first)."""
    with torch.device("meta" if predict else "cuda"):
        args = make_args(size)
    return tuple(args) if isinstance(args, (tuple, list)) else (args,)


@contextlib.contextmanager
def _progress(enabled: bool, total: int):
    if not enabled:
        yield lambda label: None
        return
    from rich.progress import Progress

    with Progress(transient=True) as bar:
        task = bar.add_task("sweep", total=total)

        def advance(label: str):
            bar.update(task, advance=1, description=label)

        yield advance
