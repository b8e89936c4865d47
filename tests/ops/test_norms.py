"""layer_norm / rms_norm: values and gradients (input, weight, bias) against float64 PyTorch."""

import pytest
import torch
import torch.nn.functional as F

import kernelab.ops as K
from tests.ops.conftest import DTYPES, assert_close, grads
from tests.ops.helpers import randn, ref_copy

# one-pass forward up to 16384 (layer_norm's with a register cap at 16384 on the GPU), one-pass
# backward up to 8192, looped / two-kernel paths beyond
SHAPES = [(1, 1), (5, 7), (9, 199), (3, 4097), (2, 8193), (2, 16384), (2, 16385), (2, 65537), (1, 262144), (2, 3, 40)]


def check(rms, x, w=None, b=None, eps=1e-5, normalized_shape=None, seed=3):
    ns = normalized_shape or x.shape[-1:]
    if rms:
        b = None
    y = K.rms_norm(x, ns, w, eps) if rms else K.layer_norm(x, ns, w, b, eps)
    xr, wr, br = ref_copy(x), ref_copy(w), ref_copy(b)
    ref = F.rms_norm(xr, ns, wr, eps) if rms else F.layer_norm(xr, ns, wr, br, eps)
    assert y.dtype == x.dtype
    assert_close(y, ref, x.dtype, "forward")
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(x.dtype)
    named = [(n, t, r) for n, t, r in (("dx", x, xr), ("dw", w, wr), ("db", b, br)) if t is not None and t.requires_grad]
    ours = grads(y, [t for _, t, _ in named], g)
    theirs = grads(ref, [r for _, _, r in named], g.double())
    for (name, t, _), a, r in zip(named, ours, theirs):
        assert_close(a, r, t.dtype, name)


@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_shapes(rms, dtype, shape):
    n = shape[-1]
    x = randn(shape, dtype, scale=2.0, shift=1.0)
    w = randn((n,), dtype, shift=1.0, seed=1)
    b = randn((n,), dtype, seed=2)
    check(rms, x, w, b)


@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
def test_affine_variants(rms):
    x = randn((6, 300), torch.float32)
    check(rms, x)                                              # no weight, no bias
    check(rms, x, randn((300,), torch.float32, seed=4))        # weight only
    w = randn((300,), torch.float32, seed=4, grad=False)       # weight without grad
    check(rms, x, w, randn((300,), torch.float32, seed=5) if not rms else None)
    w32 = randn((300,), torch.float32, seed=6)                 # float16 input, float32 weight
    check(rms, randn((4, 300), torch.float16), w32)


@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
def test_multi_dim_normalized_shape_and_eps(rms):
    x = randn((3, 4, 5, 6), torch.float32)
    w = randn((5, 6), torch.float32, seed=7)
    b = randn((5, 6), torch.float32, seed=8)
    check(rms, x, w, b if not rms else None, eps=1e-3, normalized_shape=(5, 6))
    if rms:  # eps=None means finfo(dtype).eps
        check(rms, randn((3, 7), torch.float16), eps=None)


@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
@pytest.mark.parametrize("n", [64, 20000])
def test_noncontiguous(rms, n):
    check(rms, randn((3, n), torch.float32, noncontig=True), randn((n,), torch.float32, noncontig=True))
    x = randn((8, n), torch.float32).detach()[1::3].requires_grad_()
    check(rms, x)


@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
@pytest.mark.parametrize("n", [16, 20000])
def test_special_values(rms, n):
    x = randn((5, n), torch.float32, grad=False).clone()
    x[0, 1] = float("nan")
    x[1, 2] = float("inf")
    x[2] = x[2] * 10 + 1e3         # large offset: needs centered (not E[x^2] - E[x]^2) statistics
    x[3] *= 1e15
    x[4] = 7.0                     # constant row: variance 0, rstd = 1/sqrt(eps)
    check(rms, x.requires_grad_(), randn((n,), torch.float32, seed=9))


@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
@pytest.mark.parametrize("n", [199, 20000], ids=["one pass", "long rows"])
def test_a_forward_nobody_differentiates_allocates_only_y(rms, n, monkeypatch):
    """Without autograd (no_grad, or no input requiring grad) the kernels skip the row statistics
    the backward would read: one allocation, y, and the same values (against float64)."""
    from kernelab.ops import _common

    shapes = []
    empty = _common.empty
    monkeypatch.setattr(_common, "empty", lambda shape, *a: shapes.append(tuple(shape)) or empty(shape, *a))
    x = randn((3, n), torch.float32, scale=2.0, shift=1.0)
    w, b = randn((n,), torch.float32, shift=1.0, seed=1), None if rms else randn((n,), torch.float32, seed=2)
    xr, wr, br = ref_copy(x), ref_copy(w), ref_copy(b)
    ref = F.rms_norm(xr, (n,), wr, 1e-5) if rms else F.layer_norm(xr, (n,), wr, br, 1e-5)
    for inputs in ((x, w, b), tuple(t.detach() if t is not None else None for t in (x, w, b))):
        with torch.no_grad() if inputs[0].requires_grad else torch.enable_grad():
            shapes.clear()
            y = K.rms_norm(inputs[0], (n,), inputs[1], 1e-5) if rms else K.layer_norm(inputs[0], (n,), *inputs[1:], 1e-5)
        assert shapes == [(3, n)] and y.grad_fn is None
        assert_close(y, ref, torch.float32, "forward without statistics")


@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
def test_empty(rms):
    x = torch.empty((0, 5), requires_grad=True)
    w = torch.randn(5, requires_grad=True)
    check(rms, x, w)


def test_errors_match_torch():
    x = torch.randn(4, 8)
    for ours, theirs in ((lambda: K.layer_norm(x, (7,)), lambda: F.layer_norm(x, (7,))),
                         (lambda: K.layer_norm(x, (8,), torch.randn(7)), lambda: F.layer_norm(x, (8,), torch.randn(7))),
                         (lambda: K.rms_norm(x, (7,)), lambda: F.rms_norm(x, (7,)))):
        with pytest.raises(RuntimeError) as a:
            ours()
        with pytest.raises(RuntimeError) as b:
            theirs()
        assert str(a.value) == str(b.value)

