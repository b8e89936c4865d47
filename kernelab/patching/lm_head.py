"""Opt-in (``patch(model, fused_lm_head=True)``): a causal LM's head and loss fused through
``kernelab.ops.linear_cross_entropy``, so the [tokens, vocab] logits are never held.

The model's forward is replaced (an instance attribute) by one that, when ``labels`` are given,
runs the base model (``model.base_model``), then ``linear_cross_entropy(hidden, lm_head.weight,
labels shifted left, bias=lm_head.bias)``: the mean over labels that are not -100, or the sum
divided by ``num_items_in_batch``. It returns the model's output class with ``logits=None`` (as
Liger's fused path does in training); without labels, or with arguments it does not handle
(positional extras, ``shift_labels``, ``logits_to_keep``, ``return_dict=False``), the original
forward runs. Memory: eager holds the bf16 logits, their float32 copy and the gradients of both
([tokens, vocab] each); the fused path holds one chunk of logits.

A candidate is a model whose forward takes ``labels`` and calls ``self.loss_function``, with an
``nn.Linear`` output embedding and a base model. It is swapped only when a probe agrees: the
original forward and the new one on the same 8 tokens (model in eval mode for the probe, on its
own device and dtype) give the same loss within the dtype's tolerance, once at the model's weights
and once with the head's weight scaled by 64 (large logits). A model whose forward does more
(Gemma-2's logit soft-capping, Cohere's logit scale, Granite's logit scaling, Mixtral's router
loss) fails the probe and keeps its forward (its loss function is then swapped as without this
option). The soft-capping is why the second run exists: at a freshly built model's small logits
it changed the loss by less than the tolerance, and the head was swapped (found 2026-12-05).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import ops
from ..bench.timing import REL_TOL
from . import install, loss
from .report import Skip, Swap

OP_LABEL = "linear_cross_entropy (LM head + causal loss; logits not returned)"
IGNORE_INDEX = -100


def _falls_back(args, labels, kwargs) -> bool:
    return (bool(args) or labels is None or kwargs.get("return_dict") is False
            or kwargs.get("shift_labels") is not None or kwargs.get("logits_to_keep", 0) != 0)


def _make_forward(original):
    def forward(self, input_ids=None, *args, labels=None, **kwargs):
        if _falls_back(args, labels, kwargs):
            return original(self, input_ids, *args, labels=labels, **kwargs)
        num_items = kwargs.pop("num_items_in_batch", None)
        kwargs.pop("logits_to_keep", None)
        out = self.base_model(input_ids=input_ids, **kwargs)
        hidden = out.last_hidden_state
        head = self.get_output_embeddings()
        # position t predicts label t + 1: labels shifted left, the last position ignored
        target = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:].to(hidden.device)
        reduction = "mean" if num_items is None else "sum"
        value = ops.linear_cross_entropy(hidden, head.weight, target, bias=head.bias,
                                         ignore_index=IGNORE_INDEX, reduction=reduction)
        if num_items is not None:
            value = value / (num_items.to(value.device) if torch.is_tensor(num_items) else num_items)
        return _output_class(self)(loss=value, logits=None, past_key_values=getattr(out, "past_key_values", None),
                                   hidden_states=getattr(out, "hidden_states", None),
                                   attentions=getattr(out, "attentions", None))

    return install.marked(forward)


def _output_class(model):
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return CausalLMOutputWithPast


def _refusal(model) -> str | None:
    if not loss.reads_loss_function(model):
        return "forward does not call self.loss_function"
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, nn.Linear):
        return "no nn.Linear output embedding"
    if getattr(model, "base_model", model) is model:
        return "no base model to run before the head"
    if install.instance_override(model, "forward") is not None:
        return "forward already replaced on this instance" + (" (by kernelab)" if install.is_kernelab(model.forward) else "")
    return None


#: The probe's second run multiplies the head's weight by this (a power of two: undone exactly).
#: At a random model's small logits a soft-capping ``c * tanh(z / c)`` (Gemma-2) is the identity
#: to ~1e-4 and passed a probe at the weights as they were; at 64x the logits it is not.
PROBE_LOGIT_SCALE = 64.0


def _probe_error(model, forward) -> float:
    """Largest relative difference of the two forwards' losses on 8 tokens (eval mode, no grad):
    at the model's weights, and with the head's weight scaled by PROBE_LOGIT_SCALE (large logits,
    where what else the original forward does to them shows)."""
    head = model.get_output_embeddings()
    ids = torch.randint(0, head.out_features, (1, 8), generator=torch.Generator().manual_seed(0)).to(head.weight.device)
    labels = ids.clone()
    labels[0, 3] = IGNORE_INDEX
    was_training = model.training
    errors = []
    # the scaled run only where no weight overflows (x 64 then / 64 is exact short of that)
    fits = float(head.weight.detach().abs().max()) * PROBE_LOGIT_SCALE < torch.finfo(head.weight.dtype).max
    try:
        model.eval()
        with torch.no_grad():
            for scale in (1.0, PROBE_LOGIT_SCALE) if fits else (1.0,):
                head.weight.mul_(scale)
                try:
                    ref = type(model).forward(model, input_ids=ids, labels=labels).loss
                    ours = forward(model, input_ids=ids, labels=labels).loss
                finally:
                    head.weight.div_(scale)
                if not bool(torch.isfinite(ours)):
                    return math.inf
                errors.append(float((ours.float() - ref.float()).abs() / ref.float().abs().clamp_min(1e-30)))
    finally:
        model.train(was_training)
    return max(errors)


def plan(path: str, model):
    """(Swap, new bound forward) or (Skip, None)."""
    cls = type(model).__name__
    reason = _refusal(model)
    if reason is None:
        forward = _make_forward(type(model).forward)
        tol = REL_TOL.get(model.get_output_embeddings().weight.dtype, REL_TOL[torch.float32])
        try:
            err = _probe_error(model, forward)
            reason = None if err <= tol else f"fused loss differs from the model's on a probe (relative {err:.2g})"
        except Exception as exc:  # noqa: BLE001 - a model this forward does not fit keeps its own
            reason = f"probe raised {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
    if reason:
        return Skip(path, "loss", f"fused LM head: {reason}", cls), None
    return Swap(path, "loss", OP_LABEL, cls), install.bind(forward, model)
