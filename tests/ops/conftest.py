"""Shared fixtures of the kernelab.ops tests: the interpreter, poisoned outputs, tolerances.

The kernels run under Triton's interpreter on CPU tensors (TRITON_INTERPRET=1 must be set before
Triton is imported; scripts/test.sh sets it, and this file sets it when the run did not).
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from kernelab.ops import _common  # noqa: E402

#: (rtol, atol) per dtype, against a float64 reference computed from the same (rounded) inputs.
#: atol is relative to the largest reference magnitude (so gradients of any scale compare alike).
TOLERANCE = {
    torch.float32: (2e-5, 1e-5),
    torch.float16: (4e-3, 2e-3),
    torch.bfloat16: (2e-2, 1.6e-2),
}
#: The interpreter's bfloat16 arithmetic is unreliable: CPU tests cover float32 and float16.
DTYPES = [torch.float32, torch.float16]


def pytest_configure(config):
    # the interpreter evaluates masked-out lanes too (exp(-inf + inf), log(0)): numpy complains
    config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning:triton.runtime.interpreter")


@pytest.fixture(autouse=True)
def _interpreted():
    if not _common.INTERPRETED:
        pytest.fail("kernelab.ops was imported before TRITON_INTERPRET=1 was set: the tests would only see the fallback")


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    """Every kernel output starts as NaN, so an element the kernel forgets to write fails."""

    def empty(shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(_common, "empty", empty)


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str = "") -> None:
    """``out`` matches the float64 ``ref``: same shape, same NaN and inf positions, finite values
    within the dtype's tolerance."""
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    out, ref = out.detach().double(), ref.detach().double()
    nan_out, nan_ref = torch.isnan(out), torch.isnan(ref)
    assert torch.equal(nan_out, nan_ref), f"{what}: NaN at {int((nan_out ^ nan_ref).sum())} wrong positions"
    inf_ref = torch.isinf(ref)
    assert torch.equal(out[inf_ref], ref[inf_ref]), f"{what}: infinities differ"
    fin = ~(nan_ref | inf_ref)
    if fin.any():
        o, r = out[fin], ref[fin]
        rtol, atol = TOLERANCE[dtype]
        scale = max(1.0, float(r.abs().max()))
        err = (o - r).abs()
        bad = err > atol * scale + rtol * r.abs()
        assert not bad.any(), (
            f"{what}: {int(bad.sum())}/{r.numel()} elements off; max abs err {float(err.max()):.3g} "
            f"(tolerance rtol={rtol}, atol={atol}x{scale:.3g})"
        )


def grads(outputs: torch.Tensor, inputs, grad_out: torch.Tensor):
    """torch.autograd.grad of ``outputs`` wrt the inputs that require grad (None where unused)."""
    inputs = [t for t in inputs if t is not None and t.requires_grad]
    return torch.autograd.grad(outputs, inputs, grad_out, allow_unused=True)
