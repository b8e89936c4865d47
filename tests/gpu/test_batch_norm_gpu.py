"""Training batch norm generated (``KERNELAB_BN_FORWARD=generated`` with either backward) on a
CUDA GPU: ResNet-like shapes, float32 and bfloat16 (the interpreter's bf16 arithmetic is
unreliable), outputs, gradients and running statistics against eager.

Run on a GPU machine WITHOUT TRITON_INTERPRET: ``python -m pytest tests/gpu -q``."""
import copy

import pytest
import torch

from kernelab.compiler.group_runner import interpreted
from tests.compiler.conftest import assert_close

pytestmark = pytest.mark.skipif(interpreted() or not torch.cuda.is_available(),
                                reason="the generated batch norm on a CUDA GPU")


@pytest.fixture(autouse=True)
def _strict(monkeypatch):
    """A compiler failure raises here instead of falling back to ATen unseen."""
    monkeypatch.setenv("KERNELAB_STRICT", "1")
    monkeypatch.setenv("KERNELAB_BN_FORWARD", "generated")
    torch._dynamo.reset()


def _block(c_in, c):
    return torch.nn.Sequential(torch.nn.Conv2d(c_in, c, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c),
                               torch.nn.ReLU())


@pytest.mark.parametrize("backward", ["aten", "generated"])
@pytest.mark.parametrize("shape", [(32, 64, 56, 56), (32, 512, 7, 7), (8, 64, 112, 112), (3, 16, 5, 5)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_generated_batch_norm_matches_eager_on_cuda(monkeypatch, shape, dtype, backward):
    monkeypatch.setenv("KERNELAB_BN_BACKWARD", backward)
    torch.manual_seed(0)
    n, c, h, w = shape
    net = _block(c, c).to("cuda", dtype)
    x = torch.randn(n, c, h, w, device="cuda", dtype=dtype)
    ref, compiled = copy.deepcopy(net), torch.compile(copy.deepcopy(net), backend="kernelab")
    for _ in range(2):
        outs = []
        for model in (ref, compiled):
            model.zero_grad(set_to_none=True)
            xx = x.clone().requires_grad_()
            y = model(xx)
            y.float().square().mean().backward()
            outs.append((y, xx.grad, [p.grad for p in model.parameters()]))
        (y0, gx0, gp0), (y1, gx1, gp1) = outs
        assert_close(y1, y0, dtype=dtype, what="output")
        assert_close(gx1, gx0, dtype=dtype, what="input gradient")
        for a, b in zip(gp1, gp0):
            assert_close(a, b, dtype=dtype, what="parameter gradient")
    for a, b in zip(compiled.buffers(), ref.buffers()):
        assert_close(a, b, dtype=a.dtype if a.is_floating_point() else torch.float32, what="buffer")
