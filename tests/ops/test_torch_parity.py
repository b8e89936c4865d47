"""Behaviour that must be PyTorch's, error for error (issue 12, part 6: holes found by adversarial
inputs): double backward, rms_norm's default eps, a class weight that requires grad, empty inputs,
negative label smoothing, normalized_shape's types, tensors on another device, overflowing
layer_norm statistics. Values are compared with PyTorch, errors by type and message."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import kernelab.ops as K
from tests.ops.conftest import assert_close
from tests.ops.helpers import randn, ref_copy


def outcome(fn):
    """(exception type, message) of ``fn()``, or ("ok", result)."""
    try:
        return "ok", fn()
    except Exception as e:  # noqa: BLE001 - the point is to compare whatever PyTorch raises
        return type(e), str(e)


def assert_same_error(ours, theirs):
    a, b = outcome(ours), outcome(theirs)
    assert b[0] != "ok", "the reference was expected to raise"
    assert a[0] is b[0] and a[1] == b[1], f"kernelab: {a}\ntorch: {b}"


# --------------------------------------------------------------------------- double backward
T6 = torch.tensor([1, -100, 3, 8, 0, 2])
W9 = torch.rand(9, generator=torch.Generator().manual_seed(5)) + 0.5
DOUBLE = {
    "add_relu": (K.add_relu, lambda a, b: torch.relu(a + b), [(6, 9), (9,)]),
    "add_relu_same_shape": (K.add_relu, lambda a, b: torch.relu(a + b), [(6, 9), (6, 9)]),
    "bias_gelu": (K.bias_gelu, lambda a, b: F.gelu(a + b), [(6, 9), (9,)]),
    "silu_mul": (K.silu_mul, lambda a, b: F.silu(a) * b, [(6, 9), (6, 9)]),
    "gelu_tanh_mul": (lambda a, b: K.gelu_mul(a, b, approximate="tanh"),
                      lambda a, b: F.gelu(a, approximate="tanh") * b, [(6, 9), (6, 9)]),
    "softmax": (lambda x: K.softmax(x, 1), lambda x: torch.softmax(x, 1), [(3, 9, 4)]),
    "log_softmax": (lambda x: K.log_softmax(x, -1), lambda x: torch.log_softmax(x, -1), [(5, 33)]),
    "layer_norm": (lambda x, w, b: K.layer_norm(x, (3, 9), w, b), lambda x, w, b: F.layer_norm(x, (3, 9), w, b),
                   [(2, 3, 9), (3, 9), (3, 9)]),
    "rms_norm": (lambda x, w: K.rms_norm(x, (9,), w), lambda x, w: F.rms_norm(x, (9,), w), [(7, 9), (9,)]),
    "cross_entropy": (lambda x: K.cross_entropy(x, T6, W9, label_smoothing=0.1),
                      lambda x: F.cross_entropy(x, T6, W9.to(x.dtype), label_smoothing=0.1), [(6, 9)]),
    "cross_entropy_none": (lambda x: K.cross_entropy(x, T6, reduction="none"),
                           lambda x: F.cross_entropy(x, T6, reduction="none"), [(6, 9)]),
}


class _Recorder(TorchDispatchMode):
    """A dispatch mode (as kernelab.count's recorder): the ops take their registered custom op."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def penalized_grads(fn, inputs, seed=1):
    """Gradients of loss + |d loss / d inputs|^2, the gradient-penalty pattern: the second term
    exists only if the first gradients were built with a graph (create_graph=True)."""
    y = fn(*inputs)
    r = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(y.dtype)
    loss = (y * r).sum()
    first = torch.autograd.grad(loss, inputs, create_graph=True)
    assert all(g.requires_grad for g in first), "a gradient built with create_graph=True has no graph"
    penalty = sum((g.double() ** 2).sum() for g in first)
    return torch.autograd.grad(penalty + loss, inputs)


@pytest.mark.parametrize("path", ["eager", "custom_op"])
@pytest.mark.parametrize("name", DOUBLE)
def test_double_backward_matches_torch(name, path):
    ours, theirs, shapes = DOUBLE[name]
    inputs = [randn(s, torch.float32, seed=i) for i, s in enumerate(shapes)]
    refs = [ref_copy(t) for t in inputs]
    if path == "custom_op":
        with _Recorder():
            got = penalized_grads(ours, inputs)
    else:
        got = penalized_grads(ours, inputs)
    want = penalized_grads(theirs, refs)
    for i, (a, r) in enumerate(zip(got, want)):
        assert_close(a, r, torch.float32, f"{name} d(loss + penalty)/d input {i}")


@pytest.mark.parametrize("name", ["layer_norm", "softmax", "silu_mul"])
def test_double_backward_float16(name):
    ours, theirs, shapes = DOUBLE[name]
    inputs = [randn(s, torch.float16, seed=i) for i, s in enumerate(shapes)]
    got = penalized_grads(ours, inputs)
    want = penalized_grads(theirs, [ref_copy(t) for t in inputs])
    for a, r in zip(got, want):
        assert_close(a, r, torch.float16, f"{name} float16 double backward")


def test_double_backward_first_order_unchanged():
    """Without create_graph the backward runs the Triton kernel (and gives torch's values)."""
    x = randn((4, 300), torch.float32)
    w = randn((300,), torch.float32, seed=1)
    g = torch.autograd.grad(K.layer_norm(x, (300,), w).square().sum(), [x, w])
    xr, wr = ref_copy(x), ref_copy(w)
    gr = torch.autograd.grad(F.layer_norm(xr, (300,), wr).square().sum(), [xr, wr])
    assert not any(t.requires_grad for t in g)
    for a, r in zip(g, gr):
        assert_close(a, r, torch.float32, "first-order gradient")


def test_double_backward_under_compile_raises_like_torch():
    """torch.compile refuses double backward with a clear error, for kernelab's ops as for torch's."""
    def second(fn):
        torch._dynamo.reset()
        x = randn((4, 9), torch.float32)
        y = torch.compile(fn, fullgraph=True, backend="aot_eager")(x)
        (g,) = torch.autograd.grad((y * torch.linspace(0, 1, 9)).sum(), x, create_graph=True)
        return g.square().sum().backward()

    assert_same_error(lambda: second(lambda t: K.softmax(t, -1)), lambda: second(lambda t: torch.softmax(t, -1)))


# --------------------------------------------------------------------------- rms_norm's eps=None
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_rms_norm_default_eps_is_float32s_for_16_bit(dtype):
    """eps=None is the epsilon of the type PyTorch computes in: float32 for float16 (finfo(float16)
    .eps = 9.8e-4 would dominate mean(x^2) = 1e-4 here: -0.342 where torch gives -1.075)."""
    x = randn((2, 64), dtype, scale=0.01, grad=False)
    y = K.rms_norm(x, (64,))
    assert_close(y, F.rms_norm(x.double(), (64,), eps=torch.finfo(torch.float32).eps), dtype, "vs float64")
    assert_close(y, F.rms_norm(x, (64,)).double(), dtype, "vs torch in the same dtype")


# --------------------------------------------------------------------------- cross_entropy's weight
@pytest.mark.parametrize("shape,reduction", [((4, 9), "mean"), ((4, 9), "none"), ((9,), "sum"), ((2, 9, 3), "mean")])
def test_cross_entropy_weight_requiring_grad_raises_like_torch(shape, reduction):
    x = randn(shape, torch.float32)
    t = torch.zeros(shape[:1] + shape[2:] if len(shape) > 1 else (), dtype=torch.long)
    w = (torch.rand(9) + 0.5).requires_grad_()
    for smoothing in (0.0, 0.2):
        kw = dict(weight=w, reduction=reduction, label_smoothing=smoothing)
        assert_same_error(lambda: K.cross_entropy(x, t, **kw), lambda: F.cross_entropy(x, t, **kw))
    with torch.no_grad():  # without grad mode PyTorch computes it
        assert_close(K.cross_entropy(x, t, w, reduction=reduction), F.cross_entropy(x.double(), t, w.double(), reduction=reduction),
                     torch.float32, "no_grad loss")


def test_cross_entropy_weight_gradient_with_probability_targets():
    """Probability targets: PyTorch's formula is differentiable in the weight, and so is ours."""
    x = randn((4, 9), torch.float32)
    p = torch.softmax(torch.randn(4, 9, generator=torch.Generator().manual_seed(2)), -1)
    w = (torch.rand(9, generator=torch.Generator().manual_seed(3)) + 0.5).requires_grad_()
    xr, wr = ref_copy(x), ref_copy(w)
    got = torch.autograd.grad(K.cross_entropy(x, p, w, label_smoothing=0.1), [x, w])
    want = torch.autograd.grad(F.cross_entropy(xr, p.double(), wr, label_smoothing=0.1), [xr, wr])
    for a, r in zip(got, want):
        assert_close(a, r, torch.float32, "soft-target gradient")


# --------------------------------------------------------------------------- empty inputs
CE_EMPTY = [((0, 0, 0), (0, 0)), ((2, 0, 0), (2, 0)), ((0, 0, 5), (0, 5)), ((0, 3, 0), (0, 0)), ((0, 0), (0,)),
            ((0, 5), (0,)), ((2, 0, 3, 0), (2, 3, 0)), ((3, 0), (3,))]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("shape,tshape", CE_EMPTY, ids=str)
def test_cross_entropy_empty_like_torch(shape, tshape, reduction):
    """(0, 0, 0) logits: NaN for "mean" (0 / 0), 0 for "sum", an empty "none"; and the gradient."""
    x = torch.empty(shape, requires_grad=True)
    t = torch.full(tshape, -100, dtype=torch.long)  # ignored: (3, 0) has no valid class index
    y, ref = K.cross_entropy(x, t, reduction=reduction), F.cross_entropy(ref_copy(x), t, reduction=reduction)
    assert_close(y, ref, torch.float32, "loss")
    (dx,) = torch.autograd.grad(y, x, torch.ones_like(y))
    assert dx.shape == x.shape and dx.dtype == x.dtype


def test_cross_entropy_empty_errors_like_torch():
    for shape, t in (((3, 0, 3), torch.zeros(3, 3, dtype=torch.long)), ((3, 0), torch.zeros(3, dtype=torch.long)),
                     ((0,), torch.tensor(0))):
        x = torch.empty(shape)
        assert_same_error(lambda: K.cross_entropy(x, t), lambda: F.cross_entropy(x, t))


EMPTY_OPS = {
    "softmax": (lambda x: K.softmax(x, 1), lambda x: torch.softmax(x, 1)),
    "log_softmax": (lambda x: K.log_softmax(x, -1), lambda x: torch.log_softmax(x, -1)),
    "layer_norm": (lambda x: K.layer_norm(x, (0,)), lambda x: F.layer_norm(x, (0,))),
    "rms_norm": (lambda x: K.rms_norm(x, (0, 0)), lambda x: F.rms_norm(x, (0, 0))),
    "add_relu": (lambda x: K.add_relu(x, x), lambda x: torch.relu(x + x)),
    "silu_mul": (lambda x: K.silu_mul(x, x), lambda x: F.silu(x) * x),
    "bias_gelu": (lambda x: K.bias_gelu(x, torch.zeros(0)), lambda x: F.gelu(x + torch.zeros(0, dtype=x.dtype))),
}


@pytest.mark.parametrize("name", EMPTY_OPS)
def test_empty_000_like_torch(name):
    ours, theirs = EMPTY_OPS[name]
    x = torch.empty((0, 0, 0), requires_grad=True)
    y, ref = ours(x), theirs(ref_copy(x))
    assert_close(y, ref, torch.float32, name)
    (dx,) = torch.autograd.grad(y, x, torch.ones_like(y))
    assert dx.shape == x.shape


# --------------------------------------------------------------------------- label smoothing
@pytest.mark.parametrize("smoothing", [-0.1, -1.5, float("nan")])
@pytest.mark.parametrize("weighted", [False, True])
def test_label_smoothing_not_above_zero_is_none_like_torch(smoothing, weighted):
    """PyTorch refuses only label_smoothing > 1; below 0 (and NaN) it smooths nothing."""
    x = randn((6, 9), torch.float32)
    w = W9 if weighted else None
    for t in (T6, torch.softmax(torch.randn(6, 9, generator=torch.Generator().manual_seed(4)), -1)):
        y = K.cross_entropy(x, t, w, label_smoothing=smoothing)
        xr = ref_copy(x)
        tr = t.double() if t.is_floating_point() else t
        ref = F.cross_entropy(xr, tr, None if w is None else w.double(), label_smoothing=smoothing)
        assert_close(y, ref, torch.float32, "loss")
        assert_close(torch.autograd.grad(y, x)[0], torch.autograd.grad(ref, xr)[0], torch.float32, "dlogits")


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("nothing", ["zero target weights", "every row ignored"])
def test_mean_over_no_weight_like_torch(smoothing, nothing):
    """A mean over rows of total weight 0 is torch's 0 / 0: a NaN loss, with label smoothing too
    (whose part of the sum is not 0: it was +-inf; found by a held-out sweep); gradients as
    torch's (NaN where the target weights are 0, 0 for ignored rows)."""
    x = randn((6, 9), torch.float32)
    w = torch.ones(9)
    t = T6.clone()
    if nothing == "zero target weights":
        w[t[t >= 0]] = 0.0
    else:
        t[:] = -100
    y = K.cross_entropy(x, t, w, label_smoothing=smoothing)
    xr = ref_copy(x)
    ref = F.cross_entropy(xr, t, w.double(), label_smoothing=smoothing)
    assert torch.isnan(ref) and torch.isnan(y), (y, ref)
    assert_close(torch.autograd.grad(y, x)[0], torch.autograd.grad(ref, xr)[0], torch.float32, "dlogits")


@pytest.mark.parametrize("smoothing", [1.5, 2, 1e10])
def test_label_smoothing_above_one_raises_like_torch(smoothing):
    x = torch.randn(4, 9)
    assert_same_error(lambda: K.cross_entropy(x, T6[:4], label_smoothing=smoothing),
                      lambda: F.cross_entropy(x, T6[:4], label_smoothing=smoothing))


# --------------------------------------------------------------------------- normalized_shape
@pytest.mark.parametrize("shape", [17, 17.0, None, "a", (), [], (17.0,), (True,), (torch.tensor(17.0),), torch.tensor([17])],
                         ids=repr)
def test_bad_normalized_shape_raises_like_torch(shape):
    """A bare int is a TypeError in F.layer_norm / F.rms_norm (nn.LayerNorm(17) converts it first)."""
    x = torch.randn(4, 17)
    assert_same_error(lambda: K.layer_norm(x, shape), lambda: F.layer_norm(x, shape))
    assert_same_error(lambda: K.rms_norm(x, shape), lambda: F.rms_norm(x, shape))


@pytest.mark.parametrize("shape", [(17,), [17], torch.Size([17]), (np.int64(17),), (torch.tensor(17),), [torch.tensor([17])]],
                         ids=repr)
def test_integer_like_normalized_shape_like_torch(shape):
    x = randn((4, 17), torch.float32, grad=False)
    assert_close(K.layer_norm(x, shape), F.layer_norm(x.double(), (17,)), torch.float32, "layer_norm")
    assert_close(K.rms_norm(x, shape), F.rms_norm(x.double(), (17,), eps=torch.finfo(torch.float32).eps),
                 torch.float32, "rms_norm")


# --------------------------------------------------------------------------- other devices, dtypes
def test_tensors_on_another_device_raise_like_torch():
    x, t, meta = torch.randn(4, 9), T6[:4], torch.device("meta")
    for kw in (dict(target=t.to(meta)), dict(target=torch.tensor(1, device=meta)),
               dict(target=t, weight=W9.to(meta)), dict(target=torch.rand(4, 9, device=meta))):
        xi = x[0] if kw["target"].dim() == 0 else x
        assert_same_error(lambda: K.cross_entropy(xi, **kw), lambda: F.cross_entropy(xi, **kw))
    w = torch.ones(9, device=meta)
    assert_same_error(lambda: K.layer_norm(x, (9,), w), lambda: F.layer_norm(x, (9,), w))
    assert_same_error(lambda: K.layer_norm(x, (9,), None, w), lambda: F.layer_norm(x, (9,), None, w))
    assert_same_error(lambda: K.rms_norm(x, (9,), w), lambda: F.rms_norm(x, (9,), w))
    assert_same_error(lambda: K.add_relu(x, w), lambda: torch.relu(x + w))
    assert_same_error(lambda: K.silu_mul(x, w), lambda: F.silu(x) * w)


def test_layer_norm_parameter_dtype_like_torch():
    """layer_norm's weight and bias: the input's dtype, or float32 for 16-bit inputs; else PyTorch's error."""
    x = torch.randn(4, 9)
    w64 = torch.ones(9, dtype=torch.float64)
    assert_same_error(lambda: K.layer_norm(x, (9,), w64), lambda: F.layer_norm(x, (9,), w64))
    x16 = randn((4, 9), torch.float16, grad=False)
    w = randn((9,), torch.float32, grad=False, seed=1)
    y = K.layer_norm(x16, (9,), w, w)
    assert y.dtype == F.layer_norm(x16, (9,), w, w).dtype == torch.float16
    assert_close(y, F.layer_norm(x16.double(), (9,), w.double(), w.double()), torch.float16, "mixed dtype")


# --------------------------------------------------------------------------- overflowing statistics
@pytest.mark.parametrize("n", [17, 300])
def test_layer_norm_overflowing_variance_like_torch(n):
    """x * 1e30 in float32: the variance overflows to inf, rstd = 1 / sqrt(inf) = 0 and every output
    is the bias, in PyTorch's arithmetic as in ours. (PyTorch's CPU kernel gives NaN instead at
    widths that are multiples of its vector width, or below it: there it merges an empty partial
    as delta^2 * 0 = inf * 0; that happens whenever |mean| > 1.8e19, also with a finite variance:
    see the next test. It is not copied.)"""
    x = randn((3, n), torch.float32, grad=False) * 1e30
    w, b = randn((n,), torch.float32, grad=False, seed=1), randn((n,), torch.float32, grad=False, seed=2)
    y = K.layer_norm(x, (n,), w, b)
    assert torch.equal(y, F.layer_norm(x, (n,), w, b))
    assert torch.equal(y, b.expand_as(y))


@pytest.mark.parametrize("n", [8, 16, 64])
def test_layer_norm_large_mean_small_variance_is_right(n):
    """A mean of 1e20 with a spread of 1e15: the statistics fit float32 and the result is finite
    (torch's float32 CPU kernel says NaN at these widths, its float64 result is the reference).
    float32 sums around 1e20 resolve the 1e15 spread to ~1e-3: float16's tolerance."""
    x = torch.full((2, n), 1e20) + randn((2, n), torch.float32, grad=False) * 1e15
    assert_close(K.layer_norm(x, (n,)), F.layer_norm(x.double(), (n,)), torch.float16, "large mean")


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dim", [(1,), "a", 1.0, True], ids=repr)
def test_softmax_dim_of_another_type_raises_like_torch(op, dim):
    """A dim that is not an int: torch's TypeError, word for word (a tuple raised an unrelated
    comparison error deep inside; held-out sweep). An integer tensor is an int to both."""
    x = torch.randn(3, 4)
    assert_same_error(lambda: getattr(K, op)(x, dim), lambda: getattr(F, op)(x, dim))
    assert_close(getattr(K, op)(x, torch.tensor(1)), getattr(F, op)(x, 1), torch.float32, "tensor dim")
