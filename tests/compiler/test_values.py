"""Values of compiled functions against a float64 eager reference: forward and backward, odd sizes
(1, 7, 199, 4097: 4097 takes the looped reduction path), broadcasting, non-contiguous inputs, 3-D,
NaN and inf rows, empty inputs, float16, dynamic shapes."""
import math

import pytest
import torch
import torch.nn.functional as F

import kernelab.compiler as klc
from kernelab.compiler import runtime
from kernelab.compiler.templates import pointwise

from tests.compiler.conftest import assert_close

SIZES = [1, 7, 199, 4097]


def _g(seed):
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=_g(seed)) * scale


# --------------------------------------------------------------------------- functions


def add_relu(a, b):
    return (a + b).relu()


def sig_tanh_exp(x, y):
    return torch.sigmoid(x) * torch.tanh(y) + torch.exp(-x.abs())


def outer_add(col, row):
    return (col + row).sigmoid() * 2.0


def bias_gelu(x, b):
    return F.gelu(x + b)


def bias_gelu_tanh(x, b):
    return F.gelu(x + b, approximate="tanh")


def silu_gate(x, g):
    return F.silu(g) * x


def where_leaky(x, y):
    return torch.where(x > 0, x, 0.1 * y)


def clamp_max(x, y):
    return torch.clamp(x, -0.5, 0.5) + torch.maximum(x, y) - torch.minimum(x, 2 * y)


def affine_3d(x, w, b):
    return x * w + b


def special(x):
    return torch.expm1(x * 0.1) + torch.log1p(x.abs()) + torch.rsqrt(x.abs() + 1) + torch.sqrt(x.abs())


def powers(x):
    return x ** 2 + x ** 3 * 0.5 + x.abs().pow(0.5) - 1.0 / (x * x + 1.0)


def softmax(x):
    return torch.softmax(x, dim=-1)


def log_softmax(x):
    return torch.log_softmax(x, dim=-1)


def softmax_manual(x):
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


def layer_norm_manual(x, w, b):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + 1e-5) * w + b


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def row_stats(x):
    return x.var(-1) + x.sum(-1) * 0.5 + x.amax(-1) - x.amin(-1)


def centered(x):
    return x - x.mean(-1, keepdim=True)


POINTWISE = {
    "add_relu": (add_relu, lambda n: (randn(n), randn(n, seed=1))),
    "sig_tanh_exp": (sig_tanh_exp, lambda n: (randn(3, n), randn(3, n, seed=1))),
    "outer_add": (outer_add, lambda n: (randn(7, 1), randn(n, seed=1))),
    "bias_gelu": (bias_gelu, lambda n: (randn(5, n, scale=3), randn(n, seed=1))),
    "bias_gelu_tanh": (bias_gelu_tanh, lambda n: (randn(5, n, scale=3), randn(n, seed=1))),
    # x is a transposed (column-major) view
    "silu_gate_transposed": (silu_gate, lambda n: (randn(n, 4).t(), randn(4, n, seed=1))),
    "where_leaky": (where_leaky, lambda n: (randn(3, n), randn(n, seed=1))),
    "clamp_max": (clamp_max, lambda n: (randn(2, n), randn(2, n, seed=1))),
    "affine_3d": (affine_3d, lambda n: (randn(2, 3, n), randn(n, seed=1), randn(3, 1, seed=2))),
    # every 2nd column of a wider matrix: not dense
    "special_strided": (special, lambda n: (randn(3, 2 * n)[:, ::2],)),
    "powers": (powers, lambda n: (randn(4, n),)),
}
REDUCTIONS = {
    "softmax": (softmax, lambda n: (randn(5, n, scale=4),)),
    "log_softmax": (log_softmax, lambda n: (randn(5, n, scale=4),)),
    "softmax_manual": (softmax_manual, lambda n: (randn(2, 3, n, scale=4),)),
    # rows read through a transposed view
    "softmax_transposed": (softmax, lambda n: (randn(n, 6).t(),)),
    "layer_norm": (layer_norm, lambda n: (randn(2, 3, n) + 3, 1 + randn(n, seed=1) * 0.1, randn(n, seed=2))),
    "layer_norm_manual": (layer_norm_manual, lambda n: (randn(6, n) + 3, 1 + randn(n, seed=1) * 0.1,
                                                        randn(n, seed=2))),
    "rms_norm": (rms_norm, lambda n: (randn(6, n), 1 + randn(n, seed=1) * 0.1)),
    "row_stats": (row_stats, lambda n: (randn(4, n),)),
    "centered": (centered, lambda n: (randn(3, n),)),
}


def _reference(fn, args, grad_out=None):
    """Forward (and input gradients) of eager PyTorch in float64."""
    args64 = [a.detach().double().requires_grad_(a.is_floating_point()) for a in args]
    out = fn(*args64)
    if grad_out is None:
        return out, None
    grads = torch.autograd.grad(out, [a for a in args64 if a.requires_grad], grad_out.double())
    return out, grads


def _check(fn, args, *, backward=True, dtype=torch.float32):
    args = [a.to(dtype) if a.is_floating_point() else a for a in args]
    leaves = [a.detach().clone() if a.is_contiguous() else _same_layout(a) for a in args]
    for a in leaves:
        a.requires_grad_(backward and a.is_floating_point())
    out = klc.compile(fn)(*leaves)
    grad_out = randn(*out.shape, seed=9).to(out.dtype) if backward else None
    ref, ref_grads = _reference(fn, args, grad_out)
    assert_close(out.double(), ref.double(), dtype, "forward")
    assert out.dtype == fn(*args).dtype
    if backward:
        grads = torch.autograd.grad(out, [a for a in leaves if a.requires_grad], grad_out)
        for i, (g, r) in enumerate(zip(grads, ref_grads)):
            assert_close(g.double(), r, dtype, f"grad {i}")


def _same_layout(a):
    """A private copy with the same strides (a transposed or sliced view stays one)."""
    base = torch.empty(0, dtype=a.dtype)
    base.set_(a.untyped_storage().clone(), a.storage_offset(), a.shape, a.stride())
    return base


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", list(POINTWISE))
def test_pointwise_forward_backward(name, n):
    fn, make = POINTWISE[name]
    _check(fn, make(n))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_reduction_forward_backward(name, n):
    fn, make = REDUCTIONS[name]
    _check(fn, make(n), backward=name != "row_stats" or n > 1)  # var of 1 value: NaN gradient


@pytest.mark.parametrize("name", ["add_relu", "bias_gelu", "softmax", "layer_norm", "rms_norm"])
def test_float16(name):
    fn, make = {**POINTWISE, **REDUCTIONS}[name]
    _check(fn, make(199), backward=False, dtype=torch.float16)


def test_cast_rounds_where_written():
    """x.half().float() rounds to half precision inside the kernel, exactly as eager does."""
    x = randn(4, 1000, scale=3)
    out = klc.compile(lambda t: t.half().float() * 2 + 1)(x)
    assert torch.equal(out, x.half().float() * 2 + 1)


def test_bool_and_int_ops():
    def fn(x, y, i):
        mask = (x > 0) & (y < 0.5)
        return mask, (i * 2 + 1), torch.where(mask, i, -i) + x
    x, y = randn(3, 77), randn(3, 77, seed=1)
    i = torch.randint(-5, 5, (3, 77), generator=_g(2))
    for got, want in zip(klc.compile(fn)(x, y, i), fn(x, y, i)):
        assert got.dtype == want.dtype
        assert torch.equal(got, want) if not want.is_floating_point() else torch.allclose(got, want)


def test_integer_row_sum_is_exact():
    i = torch.randint(-1000, 1000, (6, 4097), generator=_g(3), dtype=torch.int32)
    out = klc.compile(lambda t: (t * 3).sum(-1))(i)
    assert out.dtype == torch.int64 and torch.equal(out, (i * 3).sum(-1))


@pytest.mark.parametrize("n", [7, 4097])
def test_nan_and_inf_rows(n):
    x = randn(4, n)
    x[0, n // 2] = float("nan")
    x[1, 0] = float("inf")
    x[2, :] = float("-inf")
    x[3, : n // 2] = float("-inf")  # a causal-mask row: a lane sees only -inf before finite values
    got = klc.compile(lambda t: (torch.softmax(t, -1), t.amax(-1), t.amin(-1)))(x)
    want = (torch.softmax(x, -1), x.amax(-1), x.amin(-1))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, equal_nan=True)


def test_empty_inputs():
    x = torch.empty(0, 16)
    got = klc.compile(lambda t: (t.relu() + 1, torch.softmax(t, -1)))(x)
    assert got[0].shape == (0, 16) and got[1].shape == (0, 16)


def test_dynamic_shapes_reuse_one_graph():
    """One graph compiled with symbolic sizes serves every size; launches pick their own blocks."""
    calls = []
    fn = klc.compile(lambda x, w: F.layer_norm(x, (x.shape[-1],), w, None) * 2, dynamic=True)
    for rows, n in [(3, 64), (5, 300), (2, 4100)]:
        x, w = randn(rows, n), 1 + randn(n, seed=1) * 0.1
        assert_close(fn(x, w), F.layer_norm(x, (n,), w, None) * 2)
        calls.append(n)
    assert calls == [64, 300, 4100]


def test_module_training_step():
    """An MLP block: linear -> gelu -> linear -> residual -> layer norm, loss.backward()."""
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(48, 96), torch.nn.GELU(), torch.nn.Linear(96, 48))
    norm = torch.nn.LayerNorm(48)

    def step(x):
        return norm(x + block(x)).pow(2).mean()

    x = randn(10, 48)
    loss = klc.compile(step)(x)
    loss.backward()
    got = [p.grad.clone() for p in list(block.parameters()) + list(norm.parameters())]
    for p in list(block.parameters()) + list(norm.parameters()):
        p.grad = None
    ref = step(x)
    ref.backward()
    assert_close(loss, ref)
    for g, p in zip(got, list(block.parameters()) + list(norm.parameters())):
        assert_close(g, p.grad)


def test_kernels_launched(monkeypatch):
    """softmax + a pointwise epilogue is one generated kernel, and it really runs (not the reference)."""
    launched = []
    real = runtime.GroupRunner.run_values

    def spy(self, raw, scalars):
        launched.append(self.group.name)
        return real(self, raw, scalars)

    monkeypatch.setattr(runtime.GroupRunner, "run_values", spy)
    monkeypatch.setattr(runtime, "run_reference", lambda *a: pytest.fail("reference path used"))
    x = randn(8, 100)
    out = klc.compile(lambda t: torch.softmax(t, -1) * 3 + 1)(x)
    assert_close(out, torch.softmax(x, -1) * 3 + 1)
    assert launched == ["kl_fused_amax_sub_exp_sum_div_mul_etc"] or (len(launched) == 1 and
                                                                     launched[0].startswith("kl_fused_amax"))


def test_large_offsets_pick_int64():
    """A launch whose offsets pass 2**31 takes the int64 path (checked on the launch parameters:
    the tensor itself would not fit a test machine)."""
    runner = runtime.GroupRunner(group=None, interpret=False)
    small = pointwise.launch(runner, [1000], [[1], [1]], 1000)
    big = pointwise.launch(runner, [3, 2**30], [[2**30, 1], [2**30, 1]], 3 * 2**30)
    assert not small.int64 and big.int64
    assert math.log2(small.block["BLOCK"]).is_integer()


@pytest.mark.parametrize("n", [1, 50, 4097])
def test_one_dimensional_rows(n):
    """A 1-D tensor is one row: its reductions are 0-d values broadcast back over the row."""
    x = randn(n, scale=2)
    fn = lambda t: t / t.abs().sum(-1) + torch.softmax(t, -1) - t.mean()  # noqa: E731
    assert_close(klc.compile(fn)(x), fn(x))
