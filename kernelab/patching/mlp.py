"""Gated MLPs -> ``down(kernelab.ops.silu_mul / gelu_mul(gate(x), up(x)))``, recognised by structure
and confirmed on a probe.

A candidate is a module with one activation child: a parameterless leaf whose output on a float32
grid matches SiLU, GELU (erf), GELU (tanh) or ReLU to 1e-5 (so ``nn.SiLU``, HF's ``SiLUActivation``,
``GELUActivation``, ``gelu_pytorch_tanh``, ``NewGELUActivation`` and any look-alike). It is swapped
when it also has exactly three ``nn.Linear`` children, two of them [H -> I] and one [I -> H] (names do
not matter: Llama's gate_proj/up_proj/down_proj, T5's wi_0/wi_1/wo, w1/w3/w2), or two, one [H -> 2I]
whose output's halves are gate and up and one [I -> H] (Phi-3's and GLM-4's gate_up_proj), no
dropout that is on, and its forward on a probe x [2, 3, H] equals ``down(act(gate(x)) * up(x))``
for one of the two ways of naming gate (the first Linear of the pair or the first half of the
fused one, or the other; relative L2 error within the weights' dtype tolerance). The
probe uses the module's own weights; when they cannot tell the formula apart (zero weights, gate
equal to up) it is repeated with random weights of the same shapes. The new forward calls the
children by name, so hooks and wrappers on them keep working; the activation is fused with the
product: one kernel reads gate(x) and up(x) and writes the product (3 passes over [tokens, I]
instead of eager's 4 plus the activation's 2), and its backward is one kernel as well.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call

from .. import ops
from ..bench.timing import REL_TOL, compare
from . import install
from .report import Skip, Swap

#: Activation name -> its PyTorch function (what a child must compute to count as an activation).
ACTIVATIONS = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"),
    "relu": F.relu,
}
ACTIVATION_ATOL = 1e-5  # GELU's erf and tanh forms differ by up to 5e-4: far apart at this tolerance


def _silu_mul(gate, up):
    return ops.silu_mul(gate, up)


def _gelu_mul(gate, up):
    return ops.gelu_mul(gate, up)


def _gelu_tanh_mul(gate, up):
    return ops.gelu_mul(gate, up, approximate="tanh")


#: Activation name -> (label in the report, the fused kernelab op act(gate) * up).
FUSED = {
    "silu": ("silu_mul", _silu_mul),
    "gelu": ("gelu_mul", _gelu_mul),
    "gelu_tanh": ("gelu_mul(approximate='tanh')", _gelu_tanh_mul),
}


# --------------------------------------------------------------------------- recognising the pieces
def activation_of(module: nn.Module, memo: dict) -> str | None:
    """The activation a parameterless leaf module computes, or None (memoised by module id)."""
    if id(module) not in memo:
        memo[id(module)] = _probe_activation(module)
    return memo[id(module)]


def _probe_activation(module) -> str | None:
    if next(module.children(), None) is not None or next(module.parameters(), None) is not None:
        return None
    if next(module.buffers(), None) is not None:
        return None
    z = torch.linspace(-6.0, 6.0, 241)
    try:
        with torch.no_grad():
            y = module(z)
    except Exception:  # noqa: BLE001 - not a function of one tensor: not an activation
        return None
    if not isinstance(y, torch.Tensor) or y.shape != z.shape or y.dtype != z.dtype:
        return None
    for name, fn in ACTIVATIONS.items():
        if float((y - fn(z)).abs().max()) <= ACTIVATION_ATOL:
            return name
    return None


def _linears(module) -> dict[str, nn.Linear]:
    return {name: c for name, c in module.named_children() if isinstance(c, nn.Linear)}


def _raw_projections(module) -> list[str]:
    """Matrices held as the module's own parameters (fused experts: [E, 2I, H] and [E, H, I])."""
    return [name for name, p in module._parameters.items() if p is not None and p.dim() >= 2]


def candidate_activations(module, memo) -> list[tuple[str, str]]:
    """(child name, activation) of a module that looks like an MLP (an activation child and two
    or more projections, as Linear children or as its own matrices), else []."""
    if len(_linears(module)) < 2 and len(_raw_projections(module)) < 2:
        return []
    return [(name, act) for name, child in module.named_children() if (act := activation_of(child, memo))]


class Halves(NamedTuple):
    """gate and up as the two halves of one [H -> 2I] Linear's output (``gate_up(x).chunk(2, -1)``):
    gate the first half where ``gate_first``, else the second."""

    gate_up: str
    gate_first: bool

    def children(self) -> list[str]:
        return [self.gate_up]

    def label(self) -> str:
        return f"gate_up={self.gate_up}, gate={'first' if self.gate_first else 'second'} half"


class Pair(NamedTuple):
    """gate and up as two [H -> I] Linears."""

    gate: str
    up: str

    def children(self) -> list[str]:
        return [self.gate, self.up]

    def label(self) -> str:
        return f"gate={self.gate}, up={self.up}"


def _gate_and_up(module, order, x, call=None):
    """(gate(x), up(x)) of ``order`` (a Pair or Halves), children called through ``call(name, x)``."""
    call = call or (lambda name, v: getattr(module, name)(v))
    if isinstance(order, Halves):
        first, second = call(order.gate_up, x).chunk(2, dim=-1)
        return (first, second) if order.gate_first else (second, first)
    return call(order.gate, x), call(order.up, x)


def _gated_linears(module) -> tuple[list, str, str]:
    """(the two ways to name gate, as Pairs or Halves; the [I -> H] projection's name; "") or
    ([], "", why the module is not a gated MLP of Linears)."""
    linears = _linears(module)
    if not linears:
        return [], "", f"projections are raw parameters ({', '.join(_raw_projections(module))}), not nn.Linear children"
    if len(linears) == 2:
        for down, d in linears.items():
            (gate_up, f), = [(n, c) for n, c in linears.items() if n != down]
            if (f.in_features, f.out_features) == (d.out_features, 2 * d.in_features):
                return [Halves(gate_up, True), Halves(gate_up, False)], down, ""
        return [], "", ("not a gated MLP: 2 nn.Linear children, neither [H -> 2I] with an [I -> H] "
                        "(needs gate and up, or one gate_up, and down)")
    if len(linears) != 3:
        return [], "", f"not a gated MLP: {len(linears)} nn.Linear children (needs gate, up and down)"
    for down, d in linears.items():
        a, b = [n for n in linears if n != down]
        la, lb = linears[a], linears[b]
        if (la.in_features, la.out_features) == (lb.in_features, lb.out_features) == (d.out_features, d.in_features):
            return [Pair(a, b), Pair(b, a)], down, ""
    return [], "", "not a gated MLP: no pair of [H -> I] projections with an [I -> H] one"


def _refusal(module, acts) -> str | None:
    if len(acts) != 1:
        return f"{len(acts)} activation children"
    for name, child in module.named_children():
        if isinstance(child, nn.Dropout) and child.p > 0:
            return f"dropout {name} (p={child.p}) would be dropped"
    if acts[0][1] not in FUSED:
        return f"gated {acts[0][1]}: no fused kernel (silu_mul, gelu_mul)"
    if install.instance_override(module, "forward") is not None:
        return "forward already replaced on this instance" + (" (by kernelab)" if install.is_kernelab(module.forward) else "")
    return None


# --------------------------------------------------------------------------- the probe
def _random_weights(module, names) -> dict:
    """Random parameters of the same shapes, dtype and device (std 1/sqrt(fan-in))."""
    out = {}
    for name in names:
        for pname, p in getattr(module, name).named_parameters():
            fan_in = p.shape[-1] if p.dim() > 1 else 1
            gen = torch.Generator(device=p.device).manual_seed(len(out))
            out[f"{name}.{pname}"] = torch.randn(p.shape, generator=gen, device=p.device, dtype=p.dtype) / math.sqrt(fan_in)
    return out


def _call(module, name: str, params: dict | None, x):
    """Child ``name`` of ``module`` on x, with ``params`` (keys "child.param") swapped in if given."""
    child = getattr(module, name)
    if params is None:
        return child(x)
    return functional_call(child, {k[len(name) + 1:]: v for k, v in params.items() if k.startswith(name + ".")}, (x,))


def _errors(module, orders, down, act, params) -> list[float]:
    """Relative error of the module's forward against down(act(gate(x)) * up(x)), per order."""
    weight = getattr(module, down).weight
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, weight.shape[0], generator=gen).to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        out = module(x) if params is None else functional_call(module, params, (x,))
        if not isinstance(out, torch.Tensor):
            return [math.inf] * len(orders)
        call = lambda name, v: _call(module, name, params, v)  # noqa: E731
        refs = [_call(module, down, params, ACTIVATIONS[act](gate) * up)
                for gate, up in (_gate_and_up(module, order, x, call) for order in orders)]
    return [compare(out, ref) for ref in refs]


def _matching_order(module, orders, down, act) -> tuple[Pair | Halves | None, str]:
    """The naming of gate and up (a Pair or Halves) the forward computes, or None and why."""
    weight = getattr(module, down).weight
    if weight.device.type == "meta":
        return None, "parameters on the meta device: the forward cannot be checked"
    tol = REL_TOL.get(weight.dtype, REL_TOL[torch.float32])
    try:
        errors = _errors(module, orders, down, act, None)
        if all(e <= tol for e in errors):  # the weights cannot tell: ask again with random ones
            errors = _errors(module, orders, down, act, _random_weights(module, [*orders[0].children(), down]))
    except Exception as exc:  # noqa: BLE001 - a forward that does not take [.., H] alone is not this formula
        return None, f"probe raised {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
    for order, err in zip(orders, errors):
        if err <= tol:
            return order, ""
    return None, f"forward is not down(act(gate(x)) * up(x)) (relative error {min(errors):.2g})"


# --------------------------------------------------------------------------- the new forward
def _make_forward(order, down: str, act_mul, original):
    def forward(self, x, *args, **kwargs):
        if args or kwargs:
            return original(self, x, *args, **kwargs)
        return getattr(self, down)(act_mul(*_gate_and_up(self, order, x)))

    return install.marked(forward)


def _dual_gemm_refusal(module, order, act) -> str | None:
    """Why gate and up cannot be one ``swiglu_linear`` (None when they can): it computes SiLU
    only, from two bias-free plain nn.Linear weights of one dtype."""
    if isinstance(order, Halves):
        return "fused_mlp: gate and up are one nn.Linear already (one GEMM; the activation kernel reads its halves)"
    gate, up = (getattr(module, name) for name in order)
    if act != "silu":
        return f"fused_mlp: gated {act} (the dual GEMM computes SiLU only)"
    if type(gate) is not nn.Linear or type(up) is not nn.Linear:
        return "fused_mlp: gate or up is a subclass of nn.Linear (its forward may differ)"
    if gate.bias is not None or up.bias is not None:
        return "fused_mlp: gate or up has a bias"
    if gate.weight.dtype != up.weight.dtype:
        return "fused_mlp: gate and up weights differ in dtype"
    return None


def _hooked(*modules) -> bool:
    return any(m._forward_hooks or m._forward_pre_hooks for m in modules)


def _make_dual_forward(gate: str, up: str, down: str, act_mul, original):
    """down(swiglu_linear(x, gate.weight, up.weight)): both products and SiLU * up in one kernel,
    where nothing else would see gate(x) or up(x): no hooks on them, no autocast (which would cast
    inside F.linear), x in the weights' dtype; else the forward of ``_make_forward``."""
    def forward(self, x, *args, **kwargs):
        if args or kwargs:
            return original(self, x, *args, **kwargs)
        g, u = getattr(self, gate), getattr(self, up)
        if x.dtype != g.weight.dtype or _hooked(g, u) or torch.is_autocast_enabled(x.device.type):
            return getattr(self, down)(act_mul(g(x), u(x)))
        return getattr(self, down)(ops.swiglu_linear(x, g.weight, u.weight))

    return install.marked(forward)


def plan(path: str, module: nn.Module, acts: list[tuple[str, str]], dual_gemm: bool = False):
    """(Swap, new bound forward) or (Skip, None) for a module with activation children ``acts``;
    ``dual_gemm``: gate and up as one ``swiglu_linear`` where they can be (else the activation
    kernel alone, the refusal in the record's op)."""
    cls = type(module).__name__
    orders, down, reason = _gated_linears(module)
    reason = reason or _refusal(module, acts)
    if not reason:
        act = acts[0][1]
        order, reason = _matching_order(module, orders, down, act)
    if reason:
        return Skip(path, "mlp", reason, cls), None
    label, act_mul = FUSED[act]
    names = f"({order.label()}, down={down})"
    if dual_gemm:
        refusal = _dual_gemm_refusal(module, order, act)
        if refusal is None:
            forward = _make_dual_forward(order[0], order[1], down, act_mul, type(module).forward)
            return Swap(path, "mlp", f"swiglu_linear {names}", cls), install.bind(forward, module)
        label = f"{label} [{refusal}]"
    forward = _make_forward(order, down, act_mul, type(module).forward)
    return Swap(path, "mlp", f"{label} {names}", cls), install.bind(forward, module)
