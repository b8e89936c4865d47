"""What each benchmark runs: inputs, providers, the float64 reference, and the bytes it counts.

Bytes are the compulsory traffic, counted as ``../shared/BASELINES.md`` counts them, so TB/s here
and there compare: a "pass" is one read or one write of the [M, N] tensor (elements x bytes).

    softmax, log_softmax, layer_norm, rms_norm   fwd 2 passes (x read, y written)
                                                 fwd+bwd 5 (fwd 2, then dy and y/x read, dx written)
    cross_entropy                                fwd 1 pass (logits read); fwd+bwd 3 (+ read, dx written)
    add_relu (a, b same shape)                   fwd 3 (a, b read, y written); fwd+bwd 6 (+ dy, y read, grad written)
    bias_gelu (x [M, N], bias [N])               fwd 2; fwd+bwd 5 (+ dy, x read, dx written)
    silu_mul, gelu_mul (gate, up)                fwd 3; fwd+bwd 8 (+ dy, gate, up read, dgate, dup written)

Weights, biases, per-row statistics and targets are left out (under 0.1 % at the grid's shapes).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import torch.nn.functional as F

import kernelab.ops as K

ROW_GRID = [(524288, 256), (131072, 1024), (32768, 4096), (16384, 16384), (4096, 65536), (4096, 131072), (2048, 262144), (16, 4096)]
CE_GRID = [(32768, 4096), (8192, 32000), (4096, 65536), (4096, 128256), (2048, 262144), (16, 32000)]
POINTWISE_GRID = [(16384, 16384), (16, 4096)]
#: The widths of the models people train (hidden sizes: BERT/GPT-2 768, 1024; Llama 2048-8192;
#: Qwen2 2560 and 3584-class, gpt-oss 2880, Mixtral/Llama 4096-5120, DeepSeek 7168, 12288 and
#: 16384 for the largest), rows = tokens of a step, sized so that each shape moves 100-500 MB.
MODEL_ROW_GRID = [(65536, 768), (32768, 1024), (16384, 2048), (16384, 2560), (32768, 2880), (16384, 3072),
                  (16384, 4096), (16384, 5120), (8192, 6144), (8192, 7168), (8192, 8192), (4096, 12288),
                  (4096, 16384)]
#: Vocabularies: Llama 2 32000, GPT-2 50257, Llama 3 128256, Qwen2 151936, Gemma 3 262144.
MODEL_CE_GRID = [(8192, 32000), (8192, 50257), (4096, 128256), (4096, 151936), (2048, 262144)]
#: Grids by name: ``pow2`` is each spec's own (powers of two), ``model`` the widths above (pointwise
#: ops keep theirs), ``all`` both.
GRIDS = ("pow2", "model", "all")


@dataclasses.dataclass
class Inputs:
    args: tuple                 # positional arguments of every provider
    grad_of: tuple[int, ...]    # indices of args the fwd+bwd pass differentiates


@dataclasses.dataclass
class Spec:
    name: str
    shapes: list[tuple[int, int]]
    make: Callable[[tuple[int, int], torch.dtype, torch.device, torch.Generator], Inputs]
    providers: dict[str, Callable]          # kernelab / eager / liger (compile is built from eager)
    reference: Callable                      # float64 (args already upcast) -> output
    passes: tuple[int, int]                  # (fwd, fwd+bwd) passes over the [M, N] tensor
    note: str
    model_shapes: list[tuple[int, int]] | None = None  # the "model" grid (None: ``shapes``)


def _randn(shape, dtype, device, gen, scale=1.0, shift=0.0):
    return (torch.randn(shape, device=device, dtype=torch.float32, generator=gen) * scale + shift).to(dtype)


def _liger(fn_name: str):
    """A Liger-Kernel provider, or None when Liger is not installed."""
    try:
        import liger_kernel.ops as lk
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return None
    return getattr(lk, fn_name, None)


def _row_inputs(weights: int):
    def make(shape, dtype, device, gen):
        m, n = shape
        x = _randn((m, n), dtype, device, gen, scale=2.0)
        extra = [_randn((n,), dtype, device, gen, shift=1.0 if i == 0 else 0.0) for i in range(weights)]
        return Inputs((x, *extra), tuple(range(1 + weights)))

    return make


def _ce_inputs(shape, dtype, device, gen):
    m, c = shape
    x = _randn((m, c), dtype, device, gen, scale=2.0)
    t = torch.randint(0, c, (m,), device=device, generator=gen)
    return Inputs((x, t), (0,))


def _pair_inputs(bias: bool):
    def make(shape, dtype, device, gen):
        m, n = shape
        a = _randn((m, n), dtype, device, gen, scale=2.0)
        b = _randn((n,) if bias else (m, n), dtype, device, gen)
        return Inputs((a, b), (0, 1))

    return make


def _specs() -> dict[str, Spec]:
    liger_softmax = _liger("LigerSoftmaxFunction")
    liger_ln = _liger("LigerLayerNormFunction")
    liger_rms = _liger("LigerRMSNormFunction")
    liger_ce = _liger("LigerCrossEntropyFunction")
    liger_silu = _liger("LigerSiLUMulFunction")
    liger_geglu = _liger("LigerGELUMulFunction")

    def opt(name, fn):
        return {name: fn} if fn is not None else {}

    row_note = "fwd: read x + write y = 2 passes; fwd+bwd: + read dy, read y (or x), write dx = 5 passes"
    return {
        "softmax": Spec(
            "softmax", ROW_GRID, _row_inputs(0),
            {"kernelab": lambda x: K.softmax(x, -1), "eager": lambda x: torch.softmax(x, -1),
             **opt("liger", liger_softmax and (lambda x: liger_softmax.apply(x)))},
            lambda x: torch.softmax(x, -1), (2, 5), row_note, MODEL_ROW_GRID,
        ),
        "log_softmax": Spec(
            "log_softmax", ROW_GRID, _row_inputs(0),
            {"kernelab": lambda x: K.log_softmax(x, -1), "eager": lambda x: torch.log_softmax(x, -1)},
            lambda x: torch.log_softmax(x, -1), (2, 5), row_note, MODEL_ROW_GRID,
        ),
        "layer_norm": Spec(
            "layer_norm", ROW_GRID, _row_inputs(2),
            {"kernelab": lambda x, w, b: K.layer_norm(x, x.shape[-1:], w, b),
             "eager": lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b),
             **opt("liger", liger_ln and (lambda x, w, b: liger_ln.apply(x, w, b, 1e-5)))},
            lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b), (2, 5), row_note + " (+ dw, db)", MODEL_ROW_GRID,
        ),
        "rms_norm": Spec(
            "rms_norm", ROW_GRID, _row_inputs(1),
            {"kernelab": lambda x, w: K.rms_norm(x, x.shape[-1:], w, 1e-6),
             "eager": lambda x, w: F.rms_norm(x, x.shape[-1:], w, 1e-6),
             **opt("liger", liger_rms and (lambda x, w: liger_rms.apply(x, w, 1e-6, 0.0, "llama", False)))},
            lambda x, w: F.rms_norm(x, x.shape[-1:], w, 1e-6), (2, 5), row_note + " (+ dw)", MODEL_ROW_GRID,
        ),
        "cross_entropy": Spec(
            "cross_entropy", CE_GRID, _ce_inputs,
            {"kernelab": lambda x, t: K.cross_entropy(x, t),
             # as in BASELINES.md: the eager and compiled references upcast bf16 logits to float32
             "eager": lambda x, t: F.cross_entropy(x.float(), t),
             **opt("liger", liger_ce and (lambda x, t: liger_ce.apply(x, t, None)[0]))},
            lambda x, t: F.cross_entropy(x, t), (1, 3),
            "fwd: read logits = 1 pass; fwd+bwd: + read logits, write dlogits = 3 passes (eager/compile upcast to float32)",
            MODEL_CE_GRID,
        ),
        "add_relu": Spec(
            "add_relu", POINTWISE_GRID, _pair_inputs(bias=False),
            {"kernelab": K.add_relu, "eager": lambda a, b: torch.relu(a + b)},
            lambda a, b: torch.relu(a + b), (3, 6),
            "fwd: read a, b + write y = 3 passes; fwd+bwd: + read dy, y + write grad = 6",
        ),
        "bias_gelu": Spec(
            "bias_gelu", POINTWISE_GRID, _pair_inputs(bias=True),
            {"kernelab": K.bias_gelu, "eager": lambda x, b: F.gelu(x + b)},
            lambda x, b: F.gelu(x + b), (2, 5),
            "fwd: read x + write y = 2 passes (bias [N] ignored); fwd+bwd: + read dy, x + write dx = 5",
        ),
        "silu_mul": Spec(
            "silu_mul", POINTWISE_GRID, _pair_inputs(bias=False),
            {"kernelab": K.silu_mul, "eager": lambda g, u: F.silu(g) * u,
             **opt("liger", liger_silu and (lambda g, u: liger_silu.apply(g, u)))},
            lambda g, u: F.silu(g) * u, (3, 8),
            "fwd: read gate, up + write y = 3 passes; fwd+bwd: + read dy, gate, up + write dgate, dup = 8",
        ),
        "gelu_mul": Spec(
            "gelu_mul", POINTWISE_GRID, _pair_inputs(bias=False),
            {"kernelab": lambda g, u: K.gelu_mul(g, u, approximate="tanh"),
             "eager": lambda g, u: F.gelu(g, approximate="tanh") * u,
             **opt("liger", liger_geglu and (lambda g, u: liger_geglu.apply(g, u)))},
            lambda g, u: F.gelu(g, approximate="tanh") * u, (3, 8),
            "tanh GELU (Liger's form); fwd: read gate, up + write y = 3 passes; fwd+bwd: + 5 = 8",
        ),
    }


def specs() -> dict[str, Spec]:
    """All benchmark specs, by op name (built on call: imports Liger only then)."""
    return _specs()


def grid_shapes(spec: Spec, grid: str = "pow2") -> list[tuple[int, int]]:
    """The shapes of ``spec`` in the named grid (see GRIDS)."""
    if grid not in GRIDS:
        raise ValueError(f"unknown grid {grid!r}; known: {', '.join(GRIDS)}")
    model = spec.model_shapes or spec.shapes
    if grid == "pow2":
        return list(spec.shapes)
    if grid == "model":
        return list(model)
    return list(dict.fromkeys([*model, *spec.shapes]))


def bytes_moved(spec: Spec, shape: tuple[int, int], dtype: torch.dtype, backward: bool) -> int:
    m, n = shape
    return spec.passes[1 if backward else 0] * m * n * torch.tensor([], dtype=dtype).element_size()
