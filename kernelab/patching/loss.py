"""A Hugging Face model's loss -> ``kernelab.ops.cross_entropy``, with the same semantics.

Transformers (>= 4.46, 5.x included) computes a model's loss through ``self.loss_function(logits,
labels, vocab_size, num_items_in_batch=None, ignore_index=-100, shift_labels=None, **kwargs)``.
A model is a candidate when it has that attribute and its ``forward`` takes ``labels``; it is
swapped when the forward reads ``self.loss_function`` (its code names it; BERT's masked LM and T5
compute their loss inline and are reported as such).
The model's own loss function is probed on CPU (logits [2, 5, 11], labels with ignored positions,
with and without ``num_items_in_batch``) against two formulas:

    causal  labels shifted left by one (position t predicts token t + 1), the last position ignored
    token   no shift (masked LM, token classification over the vocabulary)

and replaced (``model.loss_function = ...``, an instance attribute) only when one matches.

The replacement reads the logits in their own dtype: no float32 copy of [tokens, vocab] is made
(HF's ``logits.float()`` writes one and its backward another); the kernel accumulates in float32.
Reduction: the mean over labels that are not ``ignore_index`` in one kernel launch pair (gradient
exact: scaled by 1 / count in float32 inside the kernel); with ``num_items_in_batch`` the sum divided
by it. The loss comes out of the kernel in float32 (``loss_dtype=torch.float32``: the float32
accumulation, not rounded to the logits' dtype), as HF's float32 loss; the gradient reaching the
kernel, 1 / num_items with ``num_items_in_batch``, stays float32 too. (Until 2026-12-03 the value was
rounded to the logits' dtype first: for bf16 logits 8 significant bits, GPT-2's 4.8595 read 4.875.)

The LM head and the loss fused (``linear_cross_entropy``: the logits never held) replace the
model's forward instead: ``lm_head.py``, ``patch(model, fused_lm_head=True)``.
"""

from __future__ import annotations

import inspect
import math

import torch
import torch.nn.functional as F

from .. import ops
from ..bench.timing import REL_TOL, compare
from . import install
from .report import Skip, Swap

CAUSAL, TOKEN = "causal", "token"
_VOCAB = 11


# --------------------------------------------------------------------------- the replacements
def _token_loss(logits, labels, vocab_size, num_items_in_batch, ignore_index):
    """Cross-entropy of [.., vocab] logits against same-position labels, HF's reductions."""
    logits = logits.reshape(-1, vocab_size)
    labels = labels.reshape(-1).to(logits.device)
    if num_items_in_batch is None:
        return ops.cross_entropy(logits, labels, ignore_index=ignore_index, reduction="mean", loss_dtype=torch.float32)
    total = ops.cross_entropy(logits, labels, ignore_index=ignore_index, reduction="sum", loss_dtype=torch.float32)
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


def token_loss(logits, labels, vocab_size: int, num_items_in_batch=None, ignore_index: int = -100, **kwargs):
    """HF's ``ForMaskedLMLoss`` through kernelab's cross-entropy (no float32 copy of the logits)."""
    return _token_loss(logits, labels, vocab_size, num_items_in_batch, ignore_index)


def causal_lm_loss(logits, labels, vocab_size: int, num_items_in_batch=None, ignore_index: int = -100,
                   shift_labels=None, **kwargs):
    """HF's ``ForCausalLMLoss`` through kernelab's cross-entropy: position t predicts label t + 1."""
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    return _token_loss(logits, shift_labels, vocab_size, num_items_in_batch, ignore_index)


REPLACEMENTS = {CAUSAL: install.marked(causal_lm_loss), TOKEN: install.marked(token_loss)}
LABELS = {CAUSAL: "cross_entropy (causal LM: labels shifted)", TOKEN: "cross_entropy (labels not shifted)"}


# --------------------------------------------------------------------------- recognising the loss
def is_candidate(module) -> bool:
    """An HF model whose forward takes ``labels`` (a base model without a head is not one)."""
    if not hasattr(type(module), "loss_function"):
        return False
    try:
        return "labels" in inspect.signature(type(module).forward).parameters
    except (TypeError, ValueError):
        return False


def reads_loss_function(module) -> bool:
    forward = inspect.unwrap(type(module).forward)
    code = getattr(forward, "__code__", None)
    return code is not None and "loss_function" in code.co_names


def _reference(formula: str, logits, labels, num_items):
    if formula == CAUSAL:
        logits, labels = logits[:, :-1], labels[:, 1:]
    reduction = "mean" if num_items is None else "sum"
    loss = F.cross_entropy(logits.reshape(-1, _VOCAB), labels.reshape(-1), ignore_index=-100, reduction=reduction)
    return loss if num_items is None else loss / num_items


def _matching_formula(loss_function) -> tuple[str | None, str]:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, _VOCAB, generator=gen)
    labels = torch.randint(0, _VOCAB, (2, 5), generator=gen)
    labels[0, 2] = labels[1, 4] = -100
    num_items = torch.tensor(7)
    try:
        with torch.no_grad():
            outs = [loss_function(logits=logits, labels=labels, vocab_size=_VOCAB, num_items_in_batch=n)
                    for n in (None, num_items)]
    except TypeError as exc:  # another signature: a classification or CTC loss, not a token loss
        name = getattr(loss_function, "__name__", type(loss_function).__name__)
        return None, (f"loss_function {name} is not a token cross-entropy: it does not take (logits, labels, "
                      f"vocab_size) ({str(exc).splitlines()[0][:80]})")
    except Exception as exc:  # noqa: BLE001 - it raised on the probe's inputs: leave it
        return None, f"probe raised {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
    errors = {}
    for formula in (CAUSAL, TOKEN):
        refs = [_reference(formula, logits, labels, n) for n in (None, num_items)]
        errors[formula] = max(compare(o, r) if isinstance(o, torch.Tensor) else math.inf for o, r in zip(outs, refs))
        if errors[formula] <= REL_TOL[torch.float32]:
            return formula, ""
    return None, f"loss_function is neither causal nor token cross-entropy (relative errors {errors})"


def plan(path: str, model):
    """(Swap, the new loss function) or (Skip, None) for a model with a ``loss_function``."""
    cls = type(model).__name__
    if not reads_loss_function(model):
        return Skip(path, "loss", "forward does not call self.loss_function (loss computed inline)", cls), None
    current = model.loss_function
    if install.is_kernelab(current):
        return Skip(path, "loss", "loss_function already replaced by kernelab", cls), None
    formula, reason = _matching_formula(current)
    if reason:
        return Skip(path, "loss", reason, cls), None
    return Swap(path, "loss", LABELS[formula], cls), REPLACEMENTS[formula]
