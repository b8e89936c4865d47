"""Every ``KERNELAB_*`` environment setting, read in this one module.

Each is read when its function is called (not at import), so a test or a script may set it just
before the call that reads it. Triton's own ``TRITON_INTERPRET`` is Triton's: see
``compiler/group_runner.interpreted``.

| variable | default | effect |
| --- | --- | --- |
| KERNELAB_DEBUG | 0 | compiler: 1 a line per graph, 2 every group and refusal, 3 the generated sources (runners, their specialized versions, kernels) |
| KERNELAB_STRICT | 0 | 1: where the compiler would fall back to ATen, raise instead |
| KERNELAB_CUDAGRAPHS | 0 | 1: compiled graphs replayed as CUDA graphs, as ``mode="reduce-overhead"`` |
| KERNELAB_DIRECT_LAUNCH | 1 | 0: every launch through ``kernel[grid](...)`` instead of a bound launcher |
| KERNELAB_STATIC_LAUNCH | 1 | 0: bind Triton's own launcher instead of torch's precompiled one |
| KERNELAB_FAST_RUNNER | 1 | 0: compiled graphs keep launching every group through ``run_values`` (no runner specialized after the first call) |
| KERNELAB_DIRECT_CALL | 1 | 0: keep aot_autograd's runtime wrapper around inference graphs needing none |
| KERNELAB_PERSISTENT_MAX | 8192 | longest row a compiled row reduction keeps in registers on a GPU |
| KERNELAB_PAD | 1 | 0: no padded rows around the compiler's matrix products |
| KERNELAB_TEAMS | 1 | 0: long rows of the norms take the two-pass kernels instead of teams |
| KERNELAB_GEMM_TUNE | 0 | 1: ``kernelab.ops`` matmuls tune each new shape on its first call |
| KERNELAB_BN_BACKWARD | auto | compiler: ``generated`` decomposes training batch norm's backward into generated row (NCHW), column and pointwise kernels; ``aten`` keeps ATen's op whole; ``auto``: generated except in graphs on CPU tensors (ResNet-50's training step on an H100, interleaved: 24.19 ms generated, 25.01 ms with ATen's backward, Inductor 24.06; 578 kernels against 678, peak 5.42 GiB against 6.18) |
| KERNELAB_BN_FORWARD | auto | compiler: ``generated`` makes training batch norm's forward, in the partitioned forward graph, a column kernel for the statistics on channels-last activations (a row and a column kernel on NCHW ones) and the transform's pointwise kernel (its backward: KERNELAB_BN_BACKWARD); ``aten`` keeps ATen's op whole; ``auto``: generated except in graphs on CPU tensors (ResNet-50's training step on an H200: 31.4 ms generated, 36.3 ms ATen's; on the CPU ATen's norm accumulates in float64, which a tiny RegNet's gradients need to stay within 1e-4 of eager's) |
| KERNELAB_CONV_LAYOUT | auto | compiler: ``channels_last`` asks each batched 2-D convolution's input for channels-last (``compiler/conv_layout.py``); ``traced`` keeps the layouts the program makes; ``auto``: channels-last except in graphs on CPU tensors (PyTorch's CPU batch norm on channels-last activations is less exact than on NCHW: a tiny MNASNet's gradients 1.8e-2 from float64's against eager NCHW's 6e-5) |
| KERNELAB_CACHE | ~/.cache/kernelab | where measured and generated files are kept |
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["debug_level", "strict", "cudagraphs", "direct_launch", "fast_runner", "static_launch", "direct_call",
           "persistent_max", "pad", "teams", "gemm_tune", "batch_norm_backward", "batch_norm_forward",
           "conv_layout", "cache_root"]


def _flag(name: str, default: str) -> str:
    return os.environ.get(name, default)


def debug_level() -> int:
    """KERNELAB_DEBUG=1..3 (anything else: 0)."""
    try:
        return int(_flag("KERNELAB_DEBUG", "0"))
    except ValueError:
        return 0


def strict() -> bool:
    """KERNELAB_STRICT=1: compiler errors raise instead of falling back to ATen (the tests set it)."""
    return _flag("KERNELAB_STRICT", "0") == "1"


def cudagraphs() -> bool:
    """KERNELAB_CUDAGRAPHS=1: CUDA graphs for compiled graphs where no mode or option says otherwise."""
    return _flag("KERNELAB_CUDAGRAPHS", "0") == "1"


def direct_launch() -> bool:
    """Direct launches (a bound launcher per cached call); KERNELAB_DIRECT_LAUNCH=0 turns them off."""
    return _flag("KERNELAB_DIRECT_LAUNCH", "1") != "0"


def fast_runner() -> bool:
    """A compiled graph's runner specialized after its first call (each group's one bound launch
    written into the runner); KERNELAB_FAST_RUNNER=0 turns it off."""
    return _flag("KERNELAB_FAST_RUNNER", "1") != "0"


def _choice(name: str, value: str, default: str, choices: tuple = ("aten", "generated")) -> str:
    value = value or default  # set but empty: the default
    if value not in choices:
        raise ValueError(f"{name} must be {' or '.join(map(repr, choices))}, not {value!r}")
    return value


def _by_device(name: str, on_cpu: bool, cpu: str, gpu: str) -> str:
    """A setting whose default, "auto", depends on where the graph runs: ``cpu`` for a graph on
    CPU tensors (``on_cpu``), else ``gpu``; an explicit value is taken as set."""
    value = _choice(name, _flag(name, "auto"), "auto", ("auto", *sorted({cpu, gpu})))
    if value == "auto":
        return cpu if on_cpu else gpu
    return value


def batch_norm_backward(on_cpu: bool = False) -> str:
    """KERNELAB_BN_BACKWARD: "generated" (training batch norm's backward decomposed into generated
    kernels), "aten" (the backward op kept whole), or "auto" (the default): "aten" for a graph on
    CPU tensors (``on_cpu``: ATen's CPU norm accumulates in float64), else "generated"."""
    return _by_device("KERNELAB_BN_BACKWARD", on_cpu, cpu="aten", gpu="generated")


def batch_norm_forward(on_cpu: bool = False) -> str:
    """KERNELAB_BN_FORWARD: "generated" (training batch norm's forward decomposed into generated
    kernels), "aten" (kept whole, ATen's kernels updating the running statistics), or "auto" (the
    default): "aten" for a graph on CPU tensors (``on_cpu``), else "generated"."""
    return _by_device("KERNELAB_BN_FORWARD", on_cpu, cpu="aten", gpu="generated")


def conv_layout(on_cpu: bool = False) -> str:
    """KERNELAB_CONV_LAYOUT: "channels_last" (every batched 2-D convolution's input asked for
    channels-last before tracing, ``compiler/conv_layout.py``), "traced" (the layouts as the
    program makes them) or "auto" (the default): "traced" for a graph on CPU tensors (``on_cpu``:
    cuDNN's NHWC kernels are the layout's reason, and ATen's CPU batch norm loses digits on
    channels-last activations), else "channels_last"."""
    return _by_device("KERNELAB_CONV_LAYOUT", on_cpu, cpu="traced", gpu="channels_last")


def static_launch() -> bool:
    """torch's precompiled launcher for Triton binaries; KERNELAB_STATIC_LAUNCH=0 turns it off."""
    return _flag("KERNELAB_STATIC_LAUNCH", "1") != "0"


def direct_call() -> bool:
    """KERNELAB_DIRECT_CALL=0 keeps aot_autograd's runtime wrapper around every inference graph."""
    return _flag("KERNELAB_DIRECT_CALL", "1") != "0"


def persistent_max(default: int) -> int:
    """KERNELAB_PERSISTENT_MAX (a positive integer), else ``default``."""
    value = _flag("KERNELAB_PERSISTENT_MAX", "")
    if not value:
        return default
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"KERNELAB_PERSISTENT_MAX must be a positive integer, got {value!r}")
    return int(value)


def pad() -> bool:
    """Padded rows around the compiler's matrix products; KERNELAB_PAD=0 turns them off."""
    return _flag("KERNELAB_PAD", "1") != "0"


def teams() -> bool:
    """The norms' team kernels for long rows; KERNELAB_TEAMS=0 turns them off."""
    return _flag("KERNELAB_TEAMS", "1") != "0"


def gemm_tune() -> bool:
    """KERNELAB_GEMM_TUNE=1: tune each new matmul shape on its first call."""
    return _flag("KERNELAB_GEMM_TUNE", "") == "1"


def cache_root() -> Path:
    """``$KERNELAB_CACHE``, default ``~/.cache/kernelab``."""
    return Path(_flag("KERNELAB_CACHE", "") or Path.home() / ".cache" / "kernelab")
