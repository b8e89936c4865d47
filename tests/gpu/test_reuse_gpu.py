"""Outputs stored over inputs at their last use (``GroupRunner.reuse``) on a CUDA GPU: an LM head's
loss in bf16, whose backward writes the logits' gradient over the saved logits. Gradients against
eager, and the backward's peak memory against the same compile without donated inputs: one
logits-sized buffer less.

Run on a GPU machine WITHOUT TRITON_INTERPRET: ``python -m pytest tests/gpu -q``."""
import pytest
import torch
import torch.nn.functional as F

import kernelab.compiler as klc
from kernelab.compiler.group_runner import interpreted

pytestmark = pytest.mark.skipif(interpreted() or not torch.cuda.is_available(),
                                reason="outputs stored over inputs on a CUDA GPU")


@pytest.fixture(autouse=True)
def _strict(monkeypatch):
    """A compiler failure raises here instead of falling back to ATen unseen."""
    monkeypatch.setenv("KERNELAB_STRICT", "1")
    torch._dynamo.reset()


def _lm_loss(hidden, weight, target):
    return F.cross_entropy((hidden @ weight.t()).float(), target)


def _backward_peak(fn, hidden, weight, target):
    """(gradients, the backward's peak allocation above what was allocated before it, bytes)."""
    h, w = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    loss = fn(h, w, target)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    loss.backward()
    torch.cuda.synchronize()
    return (h.grad, w.grad), torch.cuda.max_memory_allocated() - before


def test_lm_head_loss_gradient_over_the_logits_bf16():
    from torch._functorch import config as functorch_config

    torch.manual_seed(0)
    tokens, hidden, vocab = 4096, 256, 32000
    h = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(vocab, hidden, device="cuda", dtype=torch.bfloat16) * 0.05
    t = torch.randint(0, vocab, (tokens,), device="cuda")
    want, _ = _backward_peak(_lm_loss, h, w, t)
    klc.reset_events()
    compiled = torch.compile(_lm_loss, backend="kernelab")
    _backward_peak(compiled, h, w, t)  # compiles the backward
    got, peak = _backward_peak(compiled, h, w, t)
    events = klc.events()
    assert events.reused, f"no output was stored over an input: {events}"
    for a, b in zip(got, want):  # bf16 products summed in another order: a relative norm
        err = ((a.float() - b.float()).norm() / b.float().norm()).item()
        assert err < 1e-2, f"gradient relative error {err:.2e}"
    torch._dynamo.reset()
    with functorch_config.patch(donated_buffer=False):
        compiled = torch.compile(_lm_loss, backend="kernelab")
        _backward_peak(compiled, h, w, t)
        _, peak_without = _backward_peak(compiled, h, w, t)
    logits = tokens * vocab * 2
    assert peak_without - peak >= 0.9 * logits, (peak, peak_without, logits)
