"""Gathers generated inside pointwise kernels (``kernelab/compiler/bounds.py``, ``emit.gather_expression``)
on a CUDA GPU: bfloat16 (the interpreter's bf16 arithmetic is unreliable), and sources large enough
that the kernel's offsets need 64 bits (an index times a stride past 2**31).

Run on a GPU machine WITHOUT TRITON_INTERPRET: ``python -m pytest tests/gpu -q``."""
import pytest
import torch
import torch.nn.functional as F

import kernelab.compiler as klc
from kernelab.compiler.group_runner import interpreted

pytestmark = pytest.mark.skipif(interpreted() or not torch.cuda.is_available(),
                                reason="the generated gathers on a CUDA GPU")


@pytest.fixture(autouse=True)
def _strict(monkeypatch):
    """A compiler failure raises here instead of falling back to ATen unseen."""
    monkeypatch.setenv("KERNELAB_STRICT", "1")
    torch._dynamo.reset()


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_interpolation_forward_and_backward_match_eager(mode, dtype):
    x = torch.randn(4, 32, 56, 56, device="cuda", dtype=dtype)
    kwargs = {"align_corners": False} if mode != "nearest" else {}

    def fn(x):
        return F.interpolate(x, scale_factor=2, mode=mode, **kwargs)

    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    exact = x.double().requires_grad_()
    want, got, best = fn(a), torch.compile(fn, backend="kernelab")(b), fn(exact)
    dy = torch.randn_like(want)
    for y, grad in ((want, dy), (got, dy), (best, dy.double())):
        y.backward(grad)
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    # the gradient against float64's, and no further from it than eager's: eager's half-precision
    # backward accumulates its atomic adds in the tensor's own type (bicubic bf16: 6 ulps off),
    # the generated scatter in float32
    err_got = (b.grad.double() - exact.grad).abs().max().item()
    err_eager = (a.grad.double() - exact.grad).abs().max().item()
    scale = exact.grad.abs().max().item()
    assert err_got <= max(err_eager, tol * scale), (err_got, err_eager, scale)
    torch._dynamo.reset()
    plan = klc.explain(fn, x)
    # (by op, not by kernel name: a long name ends in "_etc" and may hide the gather)
    assert any(op.endswith("= index") for gp in plan.graphs for g in gp.groups for op in g.ops)


def test_a_gather_past_two_to_the_31_elements():
    """A source of 2**31 + 2**20 bf16 elements (4 GiB) indexed near its end: 64-bit offsets."""
    rows = 2**21 + 2**10
    x = torch.randn(rows, 1024, device="cuda", dtype=torch.bfloat16)

    def fn(x):
        last = torch.arange(rows - 3, rows, device=x.device).clamp(0, rows - 1)
        return x[last] * 2

    torch.testing.assert_close(torch.compile(fn, backend="kernelab")(x), fn(x))
