"""The runner specialized after a graph's first call (``GraphRunner._specialize``) on a CUDA GPU,
where every group's launch is bound to torch's precompiled launcher: zoo models' training steps
(float32, tiny configs) against eager over several steps, every runner specialized, and a second
input layout sent to the first runner.

Run on a GPU machine WITHOUT TRITON_INTERPRET: ``python -m pytest tests/gpu -q``."""
import pytest
import torch

from kernelab.compiler import runtime
from kernelab.compiler.group_runner import interpreted

pytestmark = pytest.mark.skipif(interpreted() or not torch.cuda.is_available(),
                                reason="launches bound to torch's launcher on a CUDA GPU")


@pytest.fixture(autouse=True)
def _strict(monkeypatch):
    monkeypatch.setenv("KERNELAB_STRICT", "1")
    torch._dynamo.reset()


@pytest.mark.parametrize("name", ["gpt2", "bert", "vit", "llama"])
def test_zoo_training_steps_on_the_specialized_runner(built_runners, name):
    from kernelab.zoo import ZOO

    zm = ZOO[name]
    model, inputs = zm.build("tiny", device="cuda")
    want = zm.loss(model, inputs)
    want.backward()
    want_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    compiled = torch.compile(model, backend="kernelab")
    for _ in range(4):
        model.zero_grad(set_to_none=True)
        loss = zm.loss(compiled, inputs)
        loss.backward()
        torch.testing.assert_close(loss, want, rtol=1e-4, atol=1e-5)
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        # relative error per gradient past a slack relative to the largest gradient (gradients
        # zero in exact arithmetic, like attention key biases, are rounding noise in both runs)
        scale = max(float(g.norm()) for g in want_grads.values())
        bad = {n: float((grads[n] - g).norm() / g.norm().clamp_min(1e-30)) for n, g in want_grads.items()
               if float((grads[n] - g).norm()) > 1e-3 * float(g.norm()) + 1e-5 * scale}
        assert not bad, bad
    runners = [r for r in built_runners if r.group_runners]
    assert runners and all(r.fast is not None for r in runners), [r.fast_groups for r in runners]
    assert sum(r.fast_groups for r in runners) >= 0.8 * sum(len(r.group_runners) for r in runners)


def test_another_layout_and_a_misaligned_input(built_runners):
    f = torch.compile(lambda a, b: ((a * b).exp() + 1).sum(0), backend="kernelab")
    a, b = torch.randn(64, 96, device="cuda"), torch.randn(64, 96, device="cuda")
    for _ in range(2):
        torch.testing.assert_close(f(a, b), ((a * b).exp() + 1).sum(0))
    runner = next(r for r in built_runners if r.group_runners)
    assert runner.fast is not None
    other = torch.randn(96, 64, device="cuda").t()
    torch.testing.assert_close(runner([other, b])[0], ((other * b).exp() + 1).sum(0))
    shifted = torch.randn(64 * 96 + 1, device="cuda")[1:].view(64, 96)
    torch.testing.assert_close(runner([shifted, b])[0], ((shifted * b).exp() + 1).sum(0))


def test_running_statistics_stored_in_place_on_the_specialized_runner(built_runners, monkeypatch):
    """A training batch norm's generated forward (``KERNELAB_BN_FORWARD=generated``) stores the
    running statistics into the module's buffers (``GroupRunner.into``): launched from the
    specialized runner with the buffers as outputs. Buffers and gradients as eager's, 4 steps."""
    import copy

    import torch.nn as nn

    monkeypatch.setenv("KERNELAB_BN_FORWARD", "generated")
    # the generated norm is for NCHW activations (channels-last ones keep ATen's norm, and their
    # TF32 convolutions round differently from eager's NCHW ones: buffers 2.5e-4 apart on an H100)
    monkeypatch.setenv("KERNELAB_CONV_LAYOUT", "traced")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.Conv2d(16, 8, 1), nn.BatchNorm2d(8)).cuda()
    twin = copy.deepcopy(model)
    compiled = torch.compile(model, backend="kernelab")
    x = torch.randn(4, 3, 20, 20, device="cuda")
    for _ in range(4):
        for m in (compiled, twin):
            m.zero_grad(set_to_none=True)
            m(x).square().mean().backward()
        for p, q in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
        for b, c in zip(model.buffers(), twin.buffers()):
            torch.testing.assert_close(b, c, rtol=1e-5, atol=1e-6)
    runners = [r for r in built_runners if r.group_runners]
    assert any(g.into for r in runners for g in r.group_runners), "no group stored into a buffer"
    assert all(r.fast is not None for r in runners)
    assert sum(r.fast_groups for r in runners) == sum(len(r.group_runners) for r in runners)
