"""``kernelab.patch(model)`` / ``kernelab.unpatch(model)``: a model's norms, gated MLP activations and
loss swapped for kernelab ops, in place, with a report of what was swapped and what was left alone.

    report = kernelab.patch(model)        # a PatchReport; print(report) shows a table
    loss = model(**batch).loss            # norms, SwiGLU/GeGLU and the loss now run kernelab's kernels
    compiled = torch.compile(model)       # works compiled too (the ops are torch custom ops)
    kernelab.unpatch(model)               # the original forwards back, bit for bit

What is swapped is found from the modules themselves, not from a list of class names, and every
swap is confirmed numerically first (details in each rule's module):

* norms (``norms.py``): ``nn.LayerNorm``, ``nn.RMSNorm`` and look-alikes (HF's Llama/Qwen2/Mistral/T5
  RMSNorm, Gemma's ``1 + weight`` RMSNorm, custom LayerNorms) -> ``layer_norm`` / ``rms_norm``;
* gated MLPs (``mlp.py``): three Linear children (or two, gate and up the halves of one: Phi-3's
  and GLM-4's ``gate_up_proj``) and a SiLU/GELU activation computing ``down(act(gate(x)) * up(x))``
  -> the product through ``silu_mul`` / ``gelu_mul``;
* the loss (``loss.py``): HF's ``model.loss_function`` (causal LM or unshifted) -> ``cross_entropy``
  reading the logits in their dtype (no float32 copy);
* opt-in, ``fused_linear=True`` (``linear_act.py``): a projection followed by its activation (BERT's
  intermediate, GPT-2's and ViT's MLPs) -> one ``linear(x, W, b, activation)`` GEMM;
* opt-in, ``fused_lm_head=True`` (``lm_head.py``): a causal LM's head and loss -> ``linear_cross_entropy``
  (the logits never held; ``logits`` is None in the output when labels are given).

How: a swap sets an attribute on the instance (the module's ``forward``, the model's
``loss_function``); the class, the parameters and the state_dict are never touched, so ``unpatch``
restores exactly what was there. The new forwards are bound methods (a deep copy of a patched model
is patched too, on its own weights) that call the original forward for anything the probe did not
cover (other dtypes, extra arguments). Patch before ``torch.compile``; a compiled model
(``OptimizedModule``) is patched through its original module. Patching a patched model again
returns its report (same options) or raises (other options); ``unpatch`` of a model that is not
patched raises. Modules a patched submodule already swapped are left alone with that reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn

from ..errors import KernelabError
from . import install, linear_act, lm_head, loss, mlp, norms
from .report import PatchReport, Skip, Swap

__all__ = ["patch", "unpatch", "PatchReport", "Swap", "Skip"]

#: Where a patched model keeps what patch() changed (an instance attribute, outside the state_dict).
STATE_ATTR = "_kernelab_patch"


@dataclass
class _State:
    options: dict
    report: PatchReport
    installed: list  # install.Installed, in the order they were made


def _root(model) -> nn.Module:
    model = getattr(model, "_orig_mod", model)  # torch.compile's OptimizedModule wraps the model
    if not isinstance(model, nn.Module):
        raise TypeError(f"kernelab.patch: expected a torch.nn.Module, got {type(model).__name__}")
    return model


def _forward_plans(path: str, module: nn.Module, options: dict, caches: dict) -> list:
    """The MLP and norm rules' verdicts on one module: its swap if one rule swaps it (the other's
    refusal is then beside the point), else every refusal."""
    verdicts = []  # (record, [(target, attribute, value), ...] or None)
    acts = mlp.candidate_activations(module, caches["activations"]) if options["mlp"] else []
    if acts:
        record, forward = mlp.plan(path, module, acts, options["fused_mlp"])
        verdicts.append((record, forward and [(module, "forward", forward)]))
    if options["mlp"] and options["fused_linear"] and not any(changes for _, changes in verdicts):
        if acts := linear_act.candidate(module, caches["activations"]):
            verdicts.append(linear_act.plan(path, module, acts, caches["shared"]))
    if options["norms"] and norms.is_candidate(module) and not any(changes for _, changes in verdicts):
        record, forward = norms.plan(path, module, caches["dtypes"])
        verdicts.append((record, forward and [(module, "forward", forward)]))
    swaps = [(record, changes) for record, changes in verdicts if changes]
    return swaps or [(record, None) for record, _ in verdicts]


def _plans(model: nn.Module, options: dict) -> list:
    """(record, [(target, attribute, value), ...] or None) for every candidate, in module order."""
    seen: dict[int, int] = {}
    for _, module in model.named_modules(remove_duplicate=False):
        seen[id(module)] = seen.get(id(module), 0) + 1
    caches = {"activations": {}, "dtypes": {}, "shared": {i for i, n in seen.items() if n > 1}}
    plans = []
    for path, module in model.named_modules():
        plans += _forward_plans(path, module, options, caches)
        if options["loss"] and loss.is_candidate(module):
            plans += _loss_plans(path, module, options)
    return plans


def _loss_plans(path: str, model, options: dict) -> list:
    """The fused head + loss when asked for and the probe agrees, else the loss function alone."""
    plans = []
    if options["fused_lm_head"]:
        record, forward = lm_head.plan(path, model)
        if forward is not None:
            return [(record, [(model, "forward", forward)])]
        plans.append((record, None))
    record, fn = loss.plan(path, model)
    return plans + [(record, None if fn is None else [(model, "loss_function", fn)])]


def patch(model: nn.Module, *, norms: bool = True, mlp: bool = True, loss: bool = True,
          fused_lm_head: bool = False, fused_mlp: bool = False, fused_linear: bool = False) -> PatchReport:
    """Swap ``model``'s norms, gated MLP activations and loss for kernelab ops, in place.

    Each kind can be turned off (``norms=False`` ...). ``fused_lm_head=True`` (with ``loss``) fuses
    a causal LM's head with its loss (``linear_cross_entropy``: no logits held; the output's
    ``logits`` is then None when labels are given; see ``lm_head.py``). ``fused_mlp=True`` (with
    ``mlp``) makes a SiLU-gated MLP's gate and up products one dual GEMM (``swiglu_linear``)
    where they are bias-free nn.Linear; the report says where not and why. ``fused_linear=True``
    (with ``mlp``) runs a projection and the activation after it as one ``linear`` GEMM where a
    probe confirms the module's output is unchanged (BERT, GPT-2, ViT MLPs; ``linear_act.py``). Returns a :class:`PatchReport`: every swap
    (path, kind, op, module class) and every candidate left alone with the reason. Outputs and
    gradients match the unpatched model within the dtype's rounding; ``unpatch(model)`` undoes it.
    """
    model = _root(model)
    options = {"norms": bool(norms), "mlp": bool(mlp), "loss": bool(loss), "fused_lm_head": bool(fused_lm_head),
               "fused_mlp": bool(fused_mlp), "fused_linear": bool(fused_linear)}
    state = model.__dict__.get(STATE_ATTR)
    if state is not None:
        if state.options != options:
            raise KernelabError(f"kernelab.patch: model already patched with {state.options}; call kernelab.unpatch(model) first")
        return state.report
    state = _State(options, PatchReport(), [])
    for record, changes in _plans(model, options):
        if changes is not None:
            record, installed = _install(record, changes)
            state.installed += installed
        (state.report.swapped if isinstance(record, Swap) else state.report.skipped).append(record)
    model.__dict__[STATE_ATTR] = state
    return state.report


def _install(record: Swap, changes: list) -> tuple:
    """(record, the install.Installed made) for one swap's changes, all or none: (Skip, []) when
    one of them cannot be set."""
    done = []
    for target, attribute, value in changes:
        try:
            done.append(install.install(target, attribute, value))
            failed = None if getattr(target, attribute) is value else f"setting {attribute} did not take effect"
        except (AttributeError, TypeError) as exc:  # e.g. a loss_function property without a setter
            failed = f"cannot set {attribute}: {exc}"
        if failed:
            for installed in reversed(done):
                installed.restore()
            return Skip(record.path, record.kind, failed, record.module), []
    return record, done


def unpatch(model: nn.Module) -> PatchReport:
    """Undo ``patch(model)``: every swapped forward and loss function restored exactly as it was.
    Returns the report of the patch that was undone."""
    model = _root(model)
    state = model.__dict__.pop(STATE_ATTR, None)
    if state is None:
        raise KernelabError("kernelab.unpatch: this model is not patched (kernelab.patch was not called on it, or it was undone)")
    for installed in reversed(state.installed):
        installed.restore()
    return state.report
