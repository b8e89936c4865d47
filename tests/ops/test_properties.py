"""A few randomized shapes and scales (hypothesis, kept small: the interpreter is slow)."""

import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernelab.ops as K
from tests.ops.conftest import assert_close

shapes = st.tuples(st.integers(1, 9), st.integers(1, 3000))
scales = st.sampled_from([1e-3, 1.0, 30.0])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=shapes, scale=scales, seed=st.integers(0, 2**16))
def test_softmax_and_layer_norm_random(shape, scale, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * scale).float().requires_grad_()
    xr = x.detach().double().requires_grad_()
    for ours, theirs in ((lambda t: K.softmax(t, -1), lambda t: torch.softmax(t, -1)),
                         (lambda t: K.layer_norm(t, t.shape[-1:]), lambda t: F.layer_norm(t, t.shape[-1:]))):
        y, r = ours(x), theirs(xr)
        assert_close(y, r, torch.float32, "forward")
        dy = torch.randn(shape, generator=g, dtype=torch.float64)
        assert_close(torch.autograd.grad(y, x, dy.float())[0], torch.autograd.grad(r, xr, dy)[0], torch.float32, "backward")


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=shapes, seed=st.integers(0, 2**16), smoothing=st.sampled_from([0.0, 0.3]), reduction=st.sampled_from(["mean", "sum", "none"]))
def test_cross_entropy_random(shape, seed, smoothing, reduction):
    g = torch.Generator().manual_seed(seed)
    m, c = shape
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 4).float().requires_grad_()
    t = torch.randint(-1, c, (m,), generator=g)  # -1 plays ignore_index
    xr = x.detach().double().requires_grad_()
    y = K.cross_entropy(x, t, ignore_index=-1, reduction=reduction, label_smoothing=smoothing)
    r = F.cross_entropy(xr, t, ignore_index=-1, reduction=reduction, label_smoothing=smoothing)
    assert_close(y, r, torch.float32, "loss")
    dy = torch.randn(r.shape, generator=g, dtype=torch.float64)
    assert_close(torch.autograd.grad(y, x, dy.float())[0], torch.autograd.grad(r, xr, dy)[0], torch.float32, "dlogits")
