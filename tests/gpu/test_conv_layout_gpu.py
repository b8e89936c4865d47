"""Channels-last convolutions (``KERNELAB_CONV_LAYOUT``'s default) on a CUDA GPU: a ResNet
bottleneck's training steps against eager NCHW, float32 with cuDNN's TF32 off (with it on, cuDNN's
NHWC and NCHW algorithms round differently: ~3e-4 relative, as eager channels-last against eager
NCHW), and the conversions cuDNN made around NCHW convolutions gone from the step's kernels.

Run on a GPU machine WITHOUT TRITON_INTERPRET: ``python -m pytest tests/gpu -q``."""
import copy

import pytest
import torch
import torch.nn as nn

from kernelab.compiler.group_runner import interpreted
from tests.closeness import rel_norm

pytestmark = pytest.mark.skipif(interpreted() or not torch.cuda.is_available(),
                                reason="channels-last convolutions on a CUDA GPU")


class _Bottleneck(nn.Module):
    def __init__(self, c=64, mid=16):
        super().__init__()
        self.a, self.na = nn.Conv2d(c, mid, 1, bias=False), nn.BatchNorm2d(mid)
        self.b, self.nb = nn.Conv2d(mid, mid, 3, padding=1, bias=False), nn.BatchNorm2d(mid)
        self.c, self.nc = nn.Conv2d(mid, c, 1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        h = torch.relu(self.na(self.a(x)))
        h = torch.relu(self.nb(self.b(h)))
        return torch.relu(self.nc(self.c(h)) + x)


@pytest.fixture(autouse=True)
def _exact_convolutions(monkeypatch):
    monkeypatch.setenv("KERNELAB_STRICT", "1")
    monkeypatch.delenv("KERNELAB_CONV_LAYOUT", raising=False)
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    torch._dynamo.reset()
    yield
    torch.backends.cudnn.allow_tf32 = tf32


def _step(model, x):
    model.zero_grad(set_to_none=True)
    xx = x.clone().requires_grad_()
    y = model(xx)
    y.square().mean().backward()
    return [y.detach(), xx.grad, *[p.grad for p in model.parameters()]]


@pytest.mark.parametrize("shape", [(16, 64, 56, 56), (4, 64, 7, 7)], ids=str)
def test_bottleneck_steps_match_eager(shape):
    torch.manual_seed(0)
    net = _Bottleneck().cuda()
    x = torch.randn(*shape, device="cuda")
    ref, compiled = copy.deepcopy(net), torch.compile(copy.deepcopy(net), backend="kernelab")
    for _ in range(2):
        want, got = _step(ref, x), _step(compiled, x)
        assert got[0].stride() == want[0].stride(), "the output leaves in eager's layout"
        for a, b in zip(got, want):
            assert rel_norm(a, b) < 1e-4, rel_norm(a, b)
    for a, b in zip(compiled.buffers(), ref.buffers()):
        assert rel_norm(a, b) < 1e-4


def _conversions(monkeypatch, layout) -> list:
    """The names of cuDNN's layout-conversion kernels in one compiled training step of a
    ResNet-50 bottleneck (256 -> 64 -> 256 channels), TF32 on (torch's default for cuDNN): with it
    off, cuDNN ran NCHW float32 convolutions without converting (none to compare, H100)."""
    from torch.profiler import ProfilerActivity, profile

    monkeypatch.setenv("KERNELAB_CONV_LAYOUT", layout)
    torch.backends.cudnn.allow_tf32 = True
    torch._dynamo.reset()
    net = torch.compile(_Bottleneck(256, 64).cuda(), backend="kernelab")
    x = torch.randn(16, 256, 56, 56, device="cuda")
    for _ in range(2):
        _step(net, x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        _step(net, x)
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if "nchwToNhwc" in e.name or "nhwcToNchw" in e.name]


def test_fewer_layout_conversions_in_the_step(monkeypatch):
    """cuDNN converts NCHW activations to NHWC and back around each convolution; channels-last,
    what is left converts weights (NCHW parameters), not activations: at most half as many.
    (Its first version ran with TF32 off, and cuDNN converted nothing NCHW: none to compare.)"""
    nchw, nhwc = _conversions(monkeypatch, "traced"), _conversions(monkeypatch, "channels_last")
    assert nchw, "no conversions with NCHW activations: nothing to compare"
    assert len(nhwc) <= len(nchw) // 2, (len(nhwc), len(nchw))
