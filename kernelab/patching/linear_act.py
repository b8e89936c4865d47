"""Opt-in ``fused_linear=True``: a projection followed by its activation -> one ``kernelab.ops.linear``
(the GEMM with the bias and the activation in its epilogue: the pre-activation never makes a round trip
through memory in the forward). BERT's intermediate, GPT-2's and ViT's MLPs have this form.

A candidate is a module with an activation child (recognised as in ``mlp.py``: SiLU, GELU, GELU tanh,
ReLU) and a projection child: an exact ``nn.Linear``, or a Conv1D-like leaf (a 2-D ``weight`` [K, N]
and a bias [N] computing ``x @ weight + bias``, as Hugging Face's GPT-2 has them). The swap sets two
instance attributes: the projection's ``forward`` becomes ``linear(x, W, b, activation)`` and the
activation's ``forward`` the identity. The module's own forward is not replaced, so whatever it does
around them (dropout, a norm, a residual) still happens, in its order. The swap is kept only if the
module's output on a probe x equals the unpatched output, with the module's weights and again with
random ones for the projection (dropout draws the same masks: the RNG is reseeded for both calls); a
projection whose output is also read unactivated, or an activation applied to something else, fails
the probe and is refused with the error. Calls the fused kernel cannot take (x in another dtype than
the weight, autocast on) compute ``act(projection(x))`` unfused: the activation's identity stays right.

Opt-in because it is not faster everywhere: on the H200 (``kernelab bench linear``, bf16) forward +
backward at 8192 tokens ran 1.03-1.09x eager's at 4096 -> 11008/14336 and 11008 -> 4096, but lost at
768 -> 3072 (the op's host time; NOTES_ops.md "Stop 16").
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.func import functional_call

from .. import ops
from ..bench.timing import REL_TOL, compare
from . import install, mlp
from .report import Skip, Swap


# --------------------------------------------------------------------------- recognising the pieces
def _is_conv1d_like(module: nn.Module) -> bool:
    """A parameter leaf holding exactly a 2-D ``weight`` and a 1-D ``bias`` of its second size (the
    probe decides whether it computes ``x @ weight + bias``)."""
    params = dict(module.named_parameters(recurse=False))
    weight, bias = params.get("weight"), params.get("bias")
    return (next(module.children(), None) is None and set(params) == {"weight", "bias"}
            and weight.dim() == 2 and bias.dim() == 1 and bias.shape[0] == weight.shape[1])


def _projections(module: nn.Module) -> dict[str, str]:
    """Child name -> its weight's layout: "nk" (nn.Linear: weight [N, K]) or "kn" (Conv1D: [K, N])."""
    out = {}
    for name, child in module.named_children():
        if type(child) is nn.Linear:
            out[name] = "nk"
        elif not isinstance(child, nn.Linear) and _is_conv1d_like(child):
            out[name] = "kn"
    return out


def candidate(module: nn.Module, memo: dict) -> list[tuple[str, str]]:
    """(activation child, activation) pairs of a module that also has a projection child, else []."""
    if not _projections(module):
        return []
    return [(name, act) for name, child in module.named_children() if (act := mlp.activation_of(child, memo))]


# --------------------------------------------------------------------------- the new forwards
def _weight_nk(proj: nn.Module, layout: str) -> torch.Tensor:
    return proj.weight if layout == "nk" else proj.weight.t()


def _make_projection_forward(layout: str, activation: str, original):
    """act(projection(x)) as one ``ops.linear``; unfused where the kernel cannot take the call."""
    act_fn = mlp.ACTIVATIONS[activation]

    def forward(self, x, *args, **kwargs):
        if args or kwargs or not isinstance(x, torch.Tensor) or x.dtype != self.weight.dtype \
                or torch.is_autocast_enabled(x.device.type):
            return act_fn(original(self, x, *args, **kwargs))
        return ops.linear(x, _weight_nk(self, layout), self.bias, activation=activation)

    return install.marked(forward)


def _identity(self, x, *args, **kwargs):
    return x


# --------------------------------------------------------------------------- the probe
def _run(module: nn.Module, x: torch.Tensor, params: dict | None):
    """The module's output on x with the RNG reseeded (dropout draws the same masks each call)."""
    devices = [x.device] if x.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        torch.manual_seed(0)
        if x.device.type == "cuda":
            torch.cuda.manual_seed(0)
        return module(x) if params is None else functional_call(module, params, (x,))


def _random_projection(proj_name: str, proj: nn.Module, k: int) -> dict:
    """Random weight and bias of the projection's shapes (the weight's std 1/sqrt(K))."""
    gen = torch.Generator(device=proj.weight.device).manual_seed(0)
    return {f"{proj_name}.{name}": torch.randn(p.shape, generator=gen, device=p.device, dtype=p.dtype)
            / (k ** 0.5 if name == "weight" else 1.0) for name, p in proj.named_parameters()}


def _probe_error(module, proj_name: str, layout: str, changes: list) -> tuple[float, str]:
    """(largest relative error of the module's output with ``changes`` installed against without,
    over its own and random projection weights; "" or why the probe could not run)."""
    proj = getattr(module, proj_name)
    k = proj.weight.shape[1] if layout == "nk" else proj.weight.shape[0]
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, k, generator=gen).to(device=proj.weight.device, dtype=proj.weight.dtype)
    worst = 0.0
    for params in (None, _random_projection(proj_name, proj, k)):
        try:
            before = _run(module, x, params)
            done = [install.install(*change) for change in changes]
            try:
                after = _run(module, x, params)
            finally:
                for d in reversed(done):
                    d.restore()
        except Exception as exc:  # noqa: BLE001 - a forward that does not take [.., K] alone: not this form
            return float("inf"), f"probe raised {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
        if not isinstance(before, torch.Tensor) or not isinstance(after, torch.Tensor) or before.shape != after.shape:
            return float("inf"), "the module's output is not one tensor"
        worst = max(worst, compare(after, before))
    return worst, ""


def _refusal(module, proj_name: str, act_name: str, shared: set) -> str | None:
    proj, act = getattr(module, proj_name), getattr(module, act_name)
    for name, child in ((proj_name, proj), (act_name, act)):
        if id(child) in shared:
            return f"{name} is used at more than one place in the model (its swap would change the others)"
        if child._forward_hooks or child._forward_pre_hooks:
            return f"{name} has forward hooks (they would see the fused output)"
        if install.instance_override(child, "forward") is not None:
            return f"{name}'s forward already replaced on this instance"
    if proj.weight.device.type == "meta":
        return "parameters on the meta device: the forward cannot be checked"
    return None


def plan(path: str, module: nn.Module, acts: list[tuple[str, str]], shared: set = frozenset()):
    """(Swap, [(target, "forward", value), ...]) fusing the first projection whose output feeds
    the activation alone, or (Skip, None) with the reasons; ``shared``: ids of modules the model
    holds at more than one path (never swapped: the probe sees only this module)."""
    cls = type(module).__name__
    if len(acts) != 1:
        return Skip(path, "mlp", f"fused_linear: {len(acts)} activation children", cls), None
    act_name, activation = acts[0]
    reasons = []
    for proj_name, layout in _projections(module).items():
        reason = _refusal(module, proj_name, act_name, shared)
        if reason is None:
            proj, act = getattr(module, proj_name), getattr(module, act_name)
            changes = [(proj, "forward", install.bind(_make_projection_forward(layout, activation, type(proj).forward), proj)),
                       (act, "forward", install.bind(install.marked(_identity), act))]
            err, reason = _probe_error(module, proj_name, layout, changes)
            tol = REL_TOL.get(proj.weight.dtype, REL_TOL[torch.float32])
            if not reason and err <= tol:
                op = f"linear(activation={activation!r}) ({proj_name} + {act_name})"
                return Swap(path, "mlp", op, cls), changes
            reason = reason or f"output changes when fused (relative error {err:.2g})"
        reasons.append(f"{proj_name}: {reason}")
    return Skip(path, "mlp", "fused_linear: " + "; ".join(reasons), cls), None
