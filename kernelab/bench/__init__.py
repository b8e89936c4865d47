"""The benchmark harness shared by every kernelab benchmark.

Providers (kernelab, PyTorch eager, torch.compile, Liger-Kernel), one timing method
(``triton.testing.do_bench`` median over rotated input sets), bytes counted per op as in
``BASELINES.md``, the copy ceiling measured in the same run, float64 correctness checks with
poisoned outputs, and one output contract (CSV rows with GPU, versions and date; a table; plots).
The CLI entry is :mod:`kernelab.bench.cli`.
"""

__all__ = ["specs", "timing", "runner", "report", "checks", "cli"]
