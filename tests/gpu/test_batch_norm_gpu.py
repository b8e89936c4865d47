"""Training batch norm generated (``KERNELAB_BN_FORWARD=generated`` with either backward) on a
CUDA GPU: ResNet-like shapes, float32 and bfloat16 (the interpreter's bf16 arithmetic is
unreliable), outputs, gradients and running statistics against eager.

Run on a GPU machine WITHOUT TRITON_INTERPRET: ``python -m pytest tests/gpu -q``."""
import copy

import pytest
import torch

from kernelab.compiler.group_runner import interpreted

pytestmark = pytest.mark.skipif(interpreted() or not torch.cuda.is_available(),
                                reason="the generated batch norm on a CUDA GPU")


@pytest.fixture(autouse=True)
def _strict(monkeypatch):
    """A compiler failure raises here instead of falling back to ATen unseen."""
    monkeypatch.setenv("KERNELAB_STRICT", "1")
    monkeypatch.setenv("KERNELAB_BN_FORWARD", "generated")
    # NCHW activations (statistics as rows); channels-last ones (columns) are test_conv_layout_gpu.py's
    # (cuDNN's TF32 convolutions on NHWC differ from eager's NCHW ones by ~3e-4)
    monkeypatch.setenv("KERNELAB_CONV_LAYOUT", "traced")
    torch._dynamo.reset()


def _block(c_in, c):
    return torch.nn.Sequential(torch.nn.Conv2d(c_in, c, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c),
                               torch.nn.ReLU())


@pytest.mark.parametrize("backward", ["aten", "generated"])
@pytest.mark.parametrize("shape", [(32, 64, 56, 56), (32, 512, 7, 7), (8, 64, 112, 112), (3, 16, 5, 5)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_generated_batch_norm_matches_eager_on_cuda(monkeypatch, shape, dtype, backward):
    """Outputs, gradients and running statistics of two training steps: float32 against eager
    (cuDNN's norm) within a relative norm of 1e-4; bfloat16 against a float64 copy of the model,
    no further from it than twice eager's bfloat16 (a parameter gradient summed over 100k
    bfloat16 products is 3e-2 from eager's and from float64 alike)."""
    monkeypatch.setenv("KERNELAB_BN_BACKWARD", backward)
    torch.manual_seed(0)
    n, c, h, w = shape
    net = _block(c, c).to("cuda", dtype)
    x = torch.randn(n, c, h, w, device="cuda", dtype=dtype)
    ref, compiled = copy.deepcopy(net), torch.compile(copy.deepcopy(net), backend="kernelab")
    exact = copy.deepcopy(net).double() if dtype == torch.bfloat16 else None
    for _ in range(2):
        outs = [_step(model, x) for model in (ref, compiled)] + ([_step(exact, x.double())] if exact else [])
        for i, what in enumerate(["output", "input gradient"] + ["parameter gradient"] * len(outs[0][2])):
            got, want = _flat(outs[1])[i], _flat(outs[0])[i]
            if exact is None:
                _close(got, want, what)
            else:
                truth = _flat(outs[2])[i]
                _no_further(got, want, truth, what)
    for a, b, e in zip(compiled.buffers(), ref.buffers(), (exact or ref).buffers()):
        if exact is None or not a.is_floating_point():
            _close(a, b, "buffer")
        else:
            _no_further(a, b, e, "buffer")


def _step(model, x):
    model.zero_grad(set_to_none=True)
    xx = x.clone().requires_grad_()
    y = model(xx)
    y.float().square().mean().backward()
    return y, xx.grad, [p.grad for p in model.parameters()]


def _flat(out):
    y, gx, gp = out
    return [y, gx, *gp]


#: relative-norm tolerance against eager (cuDNN's batch norm: other reduction orders), float32
REL = 1e-4


def _rel(a, b) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / (b.norm() + 1e-12)).item()


def _close(actual, expected, what: str) -> None:
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, what
    if not expected.is_floating_point():
        assert torch.equal(actual, expected), what
        return
    assert torch.isfinite(actual).all() == torch.isfinite(expected).all(), f"{what}: non-finite values differ"
    err = _rel(actual, expected)
    assert err < REL, f"{what}: relative error {err:.2e}"


def _no_further(got, eager, truth, what: str) -> None:
    """bfloat16: ``got`` no further from the float64 ``truth`` than twice eager's bfloat16 (and
    any error under 1e-2 passes)."""
    assert got.shape == eager.shape and got.dtype == eager.dtype, what
    assert torch.isfinite(got).all(), f"{what}: non-finite values"
    mine, theirs = _rel(got, truth), _rel(eager, truth)
    assert mine <= max(2 * theirs, 1e-2), f"{what}: {mine:.2e} from float64, eager {theirs:.2e}"
