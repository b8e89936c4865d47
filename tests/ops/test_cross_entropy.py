"""cross_entropy: every reduction, ignore_index, label smoothing, class weights, K-dim and soft targets."""

import pytest
import torch
import torch.nn.functional as F

import kernelab.ops as K
from tests.ops.conftest import DTYPES, assert_close, grads
from tests.ops.helpers import randn, ref_copy


def targets(shape, c, seed=0, ignore_every=3, ignore_index=-100):
    t = torch.randint(0, c, shape, generator=torch.Generator().manual_seed(seed))
    t.view(-1)[::ignore_every] = ignore_index
    return t


def check(x, t, seed=6, **kw):
    y = K.cross_entropy(x, t, **kw)
    xr = ref_copy(x)
    kw_ref = dict(kw)
    if kw.get("weight") is not None:
        kw_ref["weight"] = kw["weight"].double()
    ref = F.cross_entropy(xr, t.double() if t.is_floating_point() else t, **kw_ref)
    assert y.dtype == x.dtype
    assert_close(y, ref, x.dtype, "loss")
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(y.dtype)
    (dx,) = grads(y, [x], g)
    (dref,) = grads(ref, [xr], g.double())
    assert_close(dx, dref, x.dtype, "dlogits")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (7, 5), (9, 199), (3, 4097), (2, 32000), (1, 131073)], ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_shapes_reductions(dtype, shape, reduction):
    x = randn(shape, dtype, scale=3.0)
    check(x, targets(shape[:1], shape[1]), reduction=reduction)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1, 1.0])
@pytest.mark.parametrize("weighted", [False, True])
def test_weights_smoothing_ignore(reduction, smoothing, weighted):
    c = 37
    x = randn((11, c), torch.float32, scale=2.0)
    w = (torch.rand(c, generator=torch.Generator().manual_seed(3)) + 0.5) if weighted else None
    check(x, targets((11,), c, ignore_index=5), weight=w, ignore_index=5, reduction=reduction, label_smoothing=smoothing)


def test_kdim_1d_uint8_and_noncontiguous():
    x = randn((3, 6, 4, 5), torch.float32)  # (N, C, d1, d2): classes on dim 1
    check(x, targets((3, 4, 5), 6), reduction="none")
    check(x, targets((3, 4, 5), 6), reduction="mean", label_smoothing=0.2)
    check(randn((9,), torch.float32), torch.tensor(4))  # (C,) with a 0-d target
    check(randn((5, 9), torch.float32), torch.tensor([1, 2, 3, 4, 0], dtype=torch.uint8))
    check(randn((5, 300), torch.float32, noncontig=True), targets((10,), 300)[::2])
    check(randn((300, 5), torch.float32).detach().t().requires_grad_(), targets((5,), 300))


def test_soft_targets():
    x = randn((4, 9), torch.float32)
    p = torch.softmax(torch.randn(4, 9, generator=torch.Generator().manual_seed(1)), -1)
    for reduction in ("mean", "sum", "none"):
        check(x, p, reduction=reduction, label_smoothing=0.1, weight=torch.rand(9) + 0.5)


def test_special_values_and_all_ignored():
    x = randn((6, 50), torch.float32, grad=False).clone()
    x[0, 3] = float("-inf")
    x[1, 4] = float("nan")
    x[2] *= 1e4
    x[3] = float("-inf")       # all -inf but ignored: contributes 0
    t = torch.tensor([1, 2, 3, -100, 7, 8])
    check(x.requires_grad_(), t, reduction="none")
    x2 = randn((6, 50), torch.float32)
    x2.data[2] *= 1e4
    check(x2, t, reduction="mean")
    check(randn((4, 50), torch.float32), torch.full((4,), -100), reduction="mean")  # 0/0 = NaN, as in PyTorch
    check(torch.empty((0, 50), requires_grad=True), torch.empty((0,), dtype=torch.long), reduction="mean")


def test_out_of_range_target_raises_like_torch_on_the_host():
    x, t = torch.randn(3, 5), torch.tensor([0, 9, 1])
    with pytest.raises(IndexError, match="Target 9 is out of bounds"):
        K.cross_entropy(x, t)
    with pytest.raises(IndexError, match="Target 9 is out of bounds"):
        torch.nn.functional.cross_entropy(x, t)
    K.cross_entropy(x, torch.tensor([0, -100, 1]))  # ignore_index is not out of range


def test_out_of_range_target_is_nan_in_the_kernel(monkeypatch):
    """Where nothing checks (GPU targets), the kernel marks the row NaN instead of reading out of
    bounds; the other rows are right."""
    import importlib

    ce = importlib.import_module("kernelab.ops.cross_entropy")  # the package exports a function of that name
    monkeypatch.setattr(ce, "check_targets_on_host", lambda *a: None)
    y = K.cross_entropy(torch.randn(3, 5), torch.tensor([0, 9, 1]), reduction="none")
    assert torch.isnan(y[1]) and not torch.isnan(y[0]) and not torch.isnan(y[2])


def test_errors_match_torch():
    x, t = torch.randn(4, 8), torch.zeros(4, dtype=torch.long)
    cases = [
        dict(target=t, reduction="avg"),
        dict(target=t.int()),
        dict(target=torch.zeros(3, dtype=torch.long)),
        dict(target=t, label_smoothing=1.5),
        dict(target=t, weight=torch.ones(7)),
    ]
    for kw in cases:
        with pytest.raises(Exception) as a:
            K.cross_entropy(x, **kw)
        with pytest.raises(Exception) as b:
            F.cross_entropy(x, **kw)
        assert type(a.value) is type(b.value), kw
        assert str(a.value) == str(b.value), kw



@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("soft", [False, True], ids=["classes", "probabilities"])
def test_float32_loss_of_half_logits_is_not_rounded(reduction, soft):
    """``loss_dtype=torch.float32``: the loss of float16 logits as ``F.cross_entropy(x.float(), ...)``
    gives it (the kernel's float32 accumulation, not rounded to float16), the gradient in float16;
    any other loss_dtype is refused with one line."""
    x = randn((9, 4097), torch.float16, scale=3.0).requires_grad_()
    t = torch.softmax(randn((9, 4097), torch.float32, seed=4), -1) if soft else targets((9,), 4097)
    y = K.cross_entropy(x, t, reduction=reduction, loss_dtype=torch.float32)
    ref = F.cross_entropy(x.detach().float().requires_grad_(), t, reduction=reduction)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, ref.detach(), rtol=1e-5, atol=1e-6)
    g = torch.ones_like(y)
    (dx,) = torch.autograd.grad(y, x, g)
    assert dx.dtype == torch.float16
    (dref,) = torch.autograd.grad(F.cross_entropy(x.float(), t, reduction=reduction), x, g)
    torch.testing.assert_close(dx.float(), dref.float(), rtol=2e-3, atol=1e-4)
    with pytest.raises(Exception, match="loss_dtype must be None"):
        K.cross_entropy(x, t, loss_dtype=torch.float64)
