"""Convolutions in channels-last layout (``compiler/conv_layout.py``, ``KERNELAB_CONV_LAYOUT``):
every batched 2-D convolution's input is asked for channels-last before aot_autograd traces, so
cuDNN gets NHWC activations without converting them per call, and the graph's outputs come back
in eager's layout. Values, gradients and buffers against eager (NCHW); the plan's kernels; the
layouts the caller sees."""
import copy

import pytest
import torch
import torch.nn as nn

import kernelab
import kernelab.compiler as klc
from kernelab.compiler import conv_layout
from tests.compiler.conftest import assert_close


class _Block(nn.Module):
    """conv -> batch norm -> ReLU -> conv -> batch norm, plus a residual: a ResNet basic block."""

    def __init__(self, c=8):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1, bias=False)
        self.a, self.na = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.b, self.nb = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        h = self.stem(x)
        return torch.relu(self.nb(self.b(torch.relu(self.na(self.a(h))))) + h)


@pytest.fixture(autouse=True)
def _channels_last(monkeypatch):
    """The GPU's default on these CPU tensors (the CPU's own default, ``auto``, keeps the traced
    layouts: ``test_the_cpus_default_keeps_the_traced_layout``); a test may set another."""
    monkeypatch.setenv("KERNELAB_CONV_LAYOUT", "channels_last")


def _x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _step(model, x):
    model.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_()
    y = model(x)
    (y * torch.linspace(-1, 1, y.numel()).view(y.shape)).sum().backward()
    return y.detach(), x.grad, [p.grad for p in model.parameters()], [b.clone() for b in model.buffers()]


@pytest.mark.parametrize("layout", ["channels_last", "traced"])
def test_training_steps_match_eager(monkeypatch, layout):
    """Two steps (the running statistics move): output, input and parameter gradients, buffers."""
    monkeypatch.setenv("KERNELAB_CONV_LAYOUT", layout)
    torch._dynamo.reset()
    model, x = _Block(), _x(2, 3, 8, 8)
    ref, got = copy.deepcopy(model), copy.deepcopy(model)
    compiled = torch.compile(got, backend="kernelab")
    for _ in range(2):
        want, have = _step(ref, x), _step(compiled, x)
        assert_close(have[0], want[0], what="output")
        assert_close(have[1], want[1], what="input gradient")
        for a, b in zip(have[2] + have[3], want[2] + want[3]):
            assert_close(a, b, what="parameter gradient or buffer")


def test_the_plan_has_no_layout_conversions_around_the_convolutions(monkeypatch):
    """NCHW, every convolution is predicted with cuDNN's conversions to NHWC and back
    (``library_rules.conv_nchw_fp32_transposes``: 48 input channels or more) as copies beside
    each "convolution (conv)"; channels-last, none: "conv (cuDNN)" on NHWC."""
    model, x = _Block(64), _x(2, 3, 8, 8)

    def names(layout):
        monkeypatch.setenv("KERNELAB_CONV_LAYOUT", layout)
        torch._dynamo.reset()
        return [k.name for k in kernelab.count(lambda m, x: m(x).sum().backward(), model, x, mode="kernelab",
                                               predict=True).kernels]

    nchw, nhwc = names("traced"), names("channels_last")
    assert sum(n == "convolution (copy)" for n in nchw) >= 2, nchw
    assert not any(n.startswith("convolution (") for n in nhwc), nhwc
    assert sum(n == "conv (cuDNN)" for n in nhwc) == 3, nhwc


def test_outputs_keep_eagers_layout():
    """A feature map returned from the graph is contiguous as in eager (the caller may ``view`` it);
    one given channels-last input stays channels-last as in eager."""
    torch._dynamo.reset()
    model = _Block().eval()
    compiled = torch.compile(model, backend="kernelab")
    with torch.no_grad():
        for x in (_x(2, 3, 8, 8), _x(2, 3, 8, 8).contiguous(memory_format=torch.channels_last)):
            want, have = model(x), compiled(x)
            assert have.stride() == want.stride(), (have.stride(), want.stride())
            assert_close(have, want, what="output")
    assert compiled(_x(2, 3, 8, 8)).view(2, -1).shape == (2, 512)


def test_only_batched_2d_convolutions_are_asked():
    """An unbatched (C, H, W) input and a 1-D convolution are left alone (no request in the graph),
    and each compiles to eager's values."""
    seen = []

    def backend(gm, example_inputs):
        seen.append(sum(n.target == "contiguous" for n in conv_layout.channels_last_convolutions(gm)
                        if n.kwargs.get("memory_format") is torch.channels_last))
        return gm.forward

    conv2, conv1 = nn.Conv2d(3, 4, 3), nn.Conv1d(3, 4, 3)
    cases = [(conv2, _x(3, 8, 8)), (conv1, _x(2, 3, 8)), (conv2, _x(2, 3, 8, 8))]
    for conv, x in cases:
        torch._dynamo.reset()
        assert_close(torch.compile(lambda x: conv(x), backend=backend)(x), conv(x), what="output")
    assert seen == [0, 0, 1]
    for conv, x in cases:
        torch._dynamo.reset()
        assert_close(torch.compile(lambda x: conv(x), backend="kernelab")(x), conv(x), what="output")


def test_a_bad_conv_layout_setting_stops_the_compile(monkeypatch):
    monkeypatch.delenv("KERNELAB_STRICT", raising=False)
    monkeypatch.setenv("KERNELAB_CONV_LAYOUT", "nhwc")
    torch._dynamo.reset()
    with pytest.raises(Exception, match="KERNELAB_CONV_LAYOUT must be 'auto' or 'channels_last' or 'traced', not 'nhwc'"):
        torch.compile(lambda x: (x + 1).relu(), backend="kernelab")(torch.randn(4))


def test_a_graph_that_needs_nchw_is_traced_as_written(monkeypatch, capsys):
    """``x.view(n, -1)`` of a convolution's output (LeNet's head) cannot view a channels-last
    activation: the trace raises, and the graph is traced again without the requests (strict
    mode too: it is not a fallback), values as eager's."""
    monkeypatch.setenv("KERNELAB_STRICT", "1")
    monkeypatch.setenv("KERNELAB_DEBUG", "1")
    conv, fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8 * 64, 10)

    def lenet(x):
        y = torch.relu(conv(x))
        return fc(y.view(y.size(0), -1))

    torch._dynamo.reset()
    x = _x(2, 3, 8, 8)
    klc.reset_events()
    assert_close(torch.compile(lenet, backend="kernelab")(x), lenet(x), what="output")
    assert "convolutions kept in the traced layout" in capsys.readouterr().err
    assert klc.events().fallbacks == []
    torch._dynamo.reset()
    notes = klc.explain(lenet, x).notes
    assert any(n.startswith("convolutions kept in the traced layout (ValueError: Cannot view") for n in notes), notes


def test_explain_says_which_convolutions_were_asked():
    torch._dynamo.reset()
    notes = klc.explain(_Block().eval(), _x(2, 3, 8, 8)).notes
    assert "3 convolution input(s) asked for channels-last" in " ".join(notes), notes


def test_a_graph_reading_strides_gets_no_request():
    """``as_strided`` reads the strides dynamo traced with: the layout would change its values."""
    conv = nn.Conv2d(3, 4, 3)
    seen = []

    def backend(gm, example_inputs):
        seen.append(len(conv_layout.channels_last_convolutions(gm)))
        return gm.forward

    torch._dynamo.reset()
    x = _x(2, 3, 8, 8)
    f = lambda x: conv(x).as_strided((2, 4, 3, 3), (144, 36, 6, 1))  # noqa: E731
    assert_close(torch.compile(f, backend=backend)(x), f(x), what="output")
    assert seen == [0]
    torch._dynamo.reset()
    assert_close(torch.compile(f, backend="kernelab")(x), f(x), what="output")


def test_the_cpus_default_keeps_the_traced_layout(monkeypatch):
    """``auto`` (the default): a graph on CPU tensors keeps the program's layouts (ATen's CPU batch
    norm on channels-last activations loses digits: a tiny MNASNet's gradients 1.8e-2 from
    float64's, eager NCHW's 6e-5), while a plan recorded for the GPU (``kernelab.count``,
    ``explain``: CPU tensors standing for CUDA ones) asks for channels-last as the GPU's compile does."""
    monkeypatch.delenv("KERNELAB_CONV_LAYOUT")
    seen = []
    real = conv_layout.channels_last_convolutions
    monkeypatch.setattr(conv_layout, "channels_last_convolutions", lambda gm: seen.append(gm) or real(gm))
    model, x = _Block().eval(), _x(2, 3, 8, 8)
    torch._dynamo.reset()
    with torch.no_grad():
        assert_close(torch.compile(model, backend="kernelab")(x), model(x), what="output")
    assert seen == [], "a CPU graph was asked for channels-last"
    torch._dynamo.reset()
    notes = klc.explain(model, x).notes
    assert "3 convolution input(s) asked for channels-last" in " ".join(notes), notes
    assert len(seen) == 1
