"""Norm modules -> ``kernelab.ops.layer_norm`` / ``rms_norm``, recognised by what they compute.

A candidate is an ``nn.LayerNorm`` or ``nn.RMSNorm`` (subclasses included), or any module whose class
name says "Norm" or that holds a 1-D ``weight`` and an epsilon (``variance_epsilon``, ``eps`` or
``epsilon``). It is swapped only when a probe confirms one of these formulas over its last dims:

    rms_norm           y = x * rsqrt(mean(x^2) + eps) * w        HF Llama, Mistral, Qwen2, T5; nn.RMSNorm
    rms_norm(1 + w)    y = x * rsqrt(mean(x^2) + eps) * (1 + w)  HF Gemma
    layer_norm         y = (x - mean) * rsqrt(var + eps) * w + b nn.LayerNorm (w and b optional); GPT-2, BERT

The probe: the module's forward on a float32 CPU input [2, 3, *shape] (shifted, so a mean matters;
one row scaled to sqrt(eps), so eps matters) with its parameters replaced by random ones (so
``w`` and ``1 + w`` differ), against the formula in float64; relative L2 error <= 1e-4. A look-alike
with other math, a subclass that permutes its input (timm's LayerNorm2d), batch, instance and group
norms are left alone with the reason.

Output dtype: whatever the original forward returns for (input dtype, weight dtype), recorded per
class by running it on each pair of float dtypes (Llama: float32 for bf16 x and a float32 weight;
Gemma: x's dtype); the kernel's output is cast to it. A call the probe did not cover (other dtypes,
extra arguments, another trailing shape) runs the original forward.
"""

from __future__ import annotations

import math
import numbers
import warnings

import torch
import torch.nn as nn
from torch.func import functional_call

from .. import ops
from ..bench.timing import REL_TOL, compare
from . import install
from .report import Skip, Swap

EPS_ATTRS = ("variance_epsilon", "eps", "epsilon")
RMS, RMS_OFFSET, LAYER = "rms_norm", "rms_norm(x, 1 + weight)", "layer_norm"
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: Norms over something other than the trailing dims of one row: never swapped, whatever a probe says.
NOT_ROW_NORMS = {
    "normalizes over the batch with running statistics, not over a row": (
        nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm),
    "normalizes each channel over its spatial dims, not over a row": (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d),
    "normalizes groups of channels (dim 1), not the trailing dims": (nn.GroupNorm,),
}


# --------------------------------------------------------------------------- recognising a norm
def is_candidate(module: nn.Module) -> bool:
    if isinstance(module, (nn.LayerNorm, nn.RMSNorm)) or "norm" in type(module).__name__.lower():
        return True
    weight = module._parameters.get("weight")
    return weight is not None and weight.dim() == 1 and _eps_attr(module) is not None


def _eps_attr(module) -> str | None:
    """The attribute holding epsilon (nn.RMSNorm's may be None: float32's machine epsilon)."""
    if isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
        return "eps"
    for name in EPS_ATTRS:
        value = getattr(module, name, None)
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return name
    return None


def _normalized_shape(module) -> tuple[int, ...] | None:
    if isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
        return tuple(module.normalized_shape)
    weight = module._parameters.get("weight")
    return tuple(weight.shape) if weight is not None and weight.dim() == 1 else None


def _formulas(module) -> tuple[str, ...]:
    """The formulas a module may compute: its class's, or every one for a look-alike."""
    if isinstance(module, nn.LayerNorm) or module._parameters.get("bias") is not None:
        return (LAYER,)
    if isinstance(module, nn.RMSNorm):
        return (RMS,)
    return (RMS, RMS_OFFSET, LAYER)


def _refusal(module) -> str | None:
    """Why the module's structure rules it out before any probe (None: probe it)."""
    for reason, classes in NOT_ROW_NORMS.items():
        if isinstance(module, classes):
            return reason
    if next(module.children(), None) is not None:
        return "has submodules"
    if next(module.buffers(recurse=False), None) is not None:
        return "has buffers"
    extra = sorted(set(module._parameters) - {"weight", "bias"})
    if extra:
        return f"parameters other than weight and bias: {', '.join(extra)}"
    if _normalized_shape(module) is None:
        return "no 1-D weight: the normalized width is unknown"
    if _eps_attr(module) is None:
        return f"no epsilon attribute ({' / '.join(EPS_ATTRS)})"
    if install.instance_override(module, "forward") is not None:
        return "forward already replaced on this instance" + (" (by kernelab)" if install.is_kernelab(module.forward) else "")
    return None


# --------------------------------------------------------------------------- the probe
def _reference(formula: str, x, params: dict, eps: float, k: int) -> torch.Tensor:
    """The formula in float64 over the last k dims."""
    dims = tuple(range(-k, 0))
    x = x.double()
    if formula == LAYER:
        x = x - x.mean(dims, keepdim=True)
    y = x * torch.rsqrt(x.square().mean(dims, keepdim=True) + eps)
    w, b = params.get("weight"), params.get("bias")
    if w is not None:
        y = y * (1 + w.double() if formula == RMS_OFFSET else w.double())
    return y if b is None else y + b.double()


def _probe(module, shape, eps) -> tuple[dict, torch.Tensor]:
    """Random float32 CPU parameters (weight near 1) and an input [2, 3, *shape]."""
    gen = torch.Generator().manual_seed(0)
    params = {name: torch.randn(p.shape, generator=gen) * 0.5 + (1.0 if name == "weight" else 0.0)
              for name, p in module._parameters.items() if p is not None}
    x = torch.randn(2, 3, *shape, generator=gen) * 1.5 + 0.7
    if eps > 0:
        x[1, 2] *= math.sqrt(eps)  # mean(x^2) ~ eps: a different epsilon shows
    return params, x


def _matching_formula(module, shape) -> tuple[str | None, str]:
    """(formula the module computes, "") or (None, why none matched)."""
    eps = getattr(module, _eps_attr(module))
    eps = torch.finfo(torch.float32).eps if eps is None else float(eps)
    params, x = _probe(module, shape, eps)
    try:
        with torch.no_grad():
            out = functional_call(module, params, (x,))
    except Exception as exc:  # noqa: BLE001 - any failure means "not this formula"; the reason says which
        return None, f"probe [2, 3, {', '.join(map(str, shape))}] raised {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
    errors = {}
    for formula in _formulas(module):
        errors[formula] = compare(out, _reference(formula, x, params, eps, len(shape))) if isinstance(out, torch.Tensor) else math.inf
        if errors[formula] <= REL_TOL[torch.float32]:
            return formula, ""
    closest = min(errors, key=errors.get)
    return None, f"computes none of {', '.join(errors)} (closest: {closest}, relative error {errors[closest]:.2g})"


def _output_dtypes(module, shape) -> dict:
    """(input dtype, weight dtype or None) -> dtype of the original forward's output."""
    weight_dtypes = FLOAT_DTYPES if module._parameters.get("weight") is not None else (None,)
    table = {}
    for wd in weight_dtypes:
        params = {n: torch.ones(p.shape, dtype=wd) for n, p in module._parameters.items() if p is not None}
        for xd in FLOAT_DTYPES:
            try:
                with torch.no_grad(), warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # PyTorch's notes on mixed dtypes: not the user's concern
                    table[(xd, wd)] = functional_call(module, params, (torch.ones(1, *shape, dtype=xd),)).dtype
            except Exception:  # noqa: BLE001 - a pair the original refuses stays with the original
                pass
    return table


# --------------------------------------------------------------------------- the new forward
def _make_forward(formula: str, shape: tuple, eps_attr: str, out_dtypes: dict, original):
    """forward(self, x) through the kernel; anything the probe did not cover runs ``original``."""
    k = len(shape)

    def forward(self, x, *args, **kwargs):
        weight = getattr(self, "weight", None)
        out_dtype = out_dtypes.get((x.dtype, None if weight is None else weight.dtype))
        if args or kwargs or out_dtype is None or tuple(x.shape[x.dim() - k:]) != shape:
            return original(self, x, *args, **kwargs)
        eps = getattr(self, eps_attr)
        if formula == LAYER:
            y = ops.layer_norm(x, shape, weight, getattr(self, "bias", None), eps)
        elif formula == RMS:
            y = ops.rms_norm(x, shape, weight, eps)
        else:  # Gemma: the stored weight is an offset from 1, applied in float32
            y = ops.rms_norm(x, shape, 1.0 + weight.float(), eps)
        return y if y.dtype == out_dtype else y.to(out_dtype)

    return install.marked(forward)


def plan(path: str, module: nn.Module, dtype_cache: dict):
    """(Swap, new bound forward) or (Skip, None) for one candidate."""
    cls = type(module).__name__
    reason = _refusal(module)
    if reason is None:
        shape = _normalized_shape(module)
        formula, reason = _matching_formula(module, shape)
    if reason:
        return Skip(path, "norm", reason, cls), None
    key = (type(module), formula, tuple(sorted(n for n, p in module._parameters.items() if p is not None)))
    if key not in dtype_cache:
        dtype_cache[key] = _output_dtypes(module, shape)
    forward = _make_forward(formula, shape, _eps_attr(module), dtype_cache[key], type(module).forward)
    return Swap(path, "norm", formula, cls), install.bind(forward, module)
