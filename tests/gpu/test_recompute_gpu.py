"""Recomputed chains and reductions sharing a kernel (``graph._State._recompute_producers``) on a CUDA
GPU: a causal LM's mean cross-entropy in bfloat16 (the interpreter's bf16 arithmetic is
unreliable), at a vocabulary and token count of a real model, ignored labels included.

Run on a GPU machine WITHOUT TRITON_INTERPRET: ``python -m pytest tests/gpu -q``."""
import pytest
import torch
import torch.nn.functional as F

from kernelab.compiler.group_runner import interpreted

pytestmark = pytest.mark.skipif(interpreted() or not torch.cuda.is_available(),
                                reason="the generated kernels on a CUDA GPU")


@pytest.fixture(autouse=True)
def _strict(monkeypatch):
    monkeypatch.setenv("KERNELAB_STRICT", "1")
    torch._dynamo.reset()


def causal_lm_loss(logits, labels):
    labels = F.pad(labels, (0, 1), value=-100)
    shift = labels[..., 1:].contiguous()
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), shift.view(-1), ignore_index=-100)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_a_causal_lm_loss_and_its_gradient_match_eager(dtype):
    logits = torch.randn(4, 512, 32000, device="cuda", dtype=dtype)
    labels = torch.randint(0, 32000, (4, 512), device="cuda")
    labels[:, :37] = -100
    a, b = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    want = causal_lm_loss(a, labels)
    got = torch.compile(causal_lm_loss, backend="kernelab")(b, labels)
    want.backward()
    got.backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    off = ((b.grad.float() - a.grad.float()).norm() / a.grad.float().norm()).item()
    assert off <= (1e-2 if dtype == torch.bfloat16 else 1e-5), off
