"""PyTorch as people write it: snippets from real models (rotary embeddings, SwiGLU, label
smoothing, group norm, an optimizer update, activation zoo, masked attention scores, ...),
forward and backward against eager float64. Also checks kernel counts where fusion is certain."""
import math

import pytest
import torch
import torch.nn.functional as F

import kernelab.compiler as klc
from tests.compiler.conftest import assert_close


def _r(*shape, seed=0, grad=True):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed))).requires_grad_(grad)


def rope(x, pos):
    d = x.shape[-1] // 2
    inv = 1.0 / (10000 ** (torch.arange(0, d, dtype=torch.float32) / d))
    ang = pos[:, None].float() * inv[None, :]
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat([x1 * ang.cos() - x2 * ang.sin(), x1 * ang.sin() + x2 * ang.cos()], -1)


def swiglu(x, w1, w2):
    return F.silu(x @ w1) * (x @ w2)


def adam_like(p, g, m, v):
    m2 = 0.9 * m + 0.1 * g
    v2 = 0.999 * v + 0.001 * g * g
    return p - 1e-3 * (m2 / 0.1) / (torch.sqrt(v2 / 0.001) + 1e-8), m2, v2


def activations(x):
    return (F.softplus(x) + F.mish(x) + F.hardswish(x) + F.leaky_relu(x, 0.2) + F.elu(x) + F.hardtanh(x)
            + F.relu6(x) + F.selu(x))


def masked_scores(q, k):
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    mask = torch.ones(s.shape[-2:], dtype=torch.bool).tril()
    return torch.softmax(s.masked_fill(~mask, float("-inf")), -1)


SNIPPETS = {
    # name: (function, inputs, generated kernels in the forward plan or None)
    "rope": (rope, lambda: (_r(2, 16, 8), torch.arange(16)), None),
    "swiglu": (swiglu, lambda: (_r(8, 16), _r(16, 32, seed=1), _r(16, 32, seed=2)), 1),
    "label_smoothing_ce": (lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1),
                           lambda: (_r(8, 33), torch.randint(0, 33, (8,))), None),
    "group_norm": (lambda x: F.group_norm(x, 4), lambda: (_r(2, 8, 5, 5),), None),
    "l2_normalize": (lambda x: F.normalize(x, dim=-1), lambda: (_r(6, 31),), None),
    "adam_like": (adam_like, lambda: (_r(100, grad=False), _r(100, seed=1, grad=False),
                                      _r(100, seed=2, grad=False), _r(100, seed=3, grad=False).abs()), 1),
    "activations": (activations, lambda: (_r(7, 13),), 1),
    # ~mask is (9, 9), the scores (2, 9, 9): a pointwise group never changes shape, so two kernels
    "masked_scores": (masked_scores, lambda: (_r(2, 9, 8), _r(2, 9, 8, seed=1)), 2),
    "reshape_then_reduce": (lambda x: (x * 2).view(x.shape[0], -1, 4).sum(-1).relu(), lambda: (_r(3, 16),), 2),
    "logsumexp": (lambda x: torch.logsumexp(x, -1), lambda: (_r(5, 40),), 1),
    "standardize": (lambda x: (x - x.mean(-1, keepdim=True)) / x.std(-1, keepdim=True), lambda: (_r(5, 40),), 1),
    "lerp_addcmul": (lambda a, b, c: torch.addcmul(a, b, c, value=0.5) + torch.lerp(a, b, 0.3),
                     lambda: (_r(4, 10), _r(4, 10, seed=1), _r(10, seed=2)), 1),
    "clamp_tensor_bounds": (lambda x, lo, hi: torch.clamp(x, lo, hi),
                            lambda: (_r(4, 10), torch.full((10,), -0.5), torch.full((4, 1), 0.7)), 1),
    "where_scalars": (lambda x: torch.where(x > 0, 1.0, -1.0) * x.abs().sqrt(), lambda: (_r(4, 10),), 1),
    "detach_gate": (lambda x: x * x.detach().sigmoid(), lambda: (_r(4, 10),), 1),
    "rms_norm_functional": (lambda x, w: F.rms_norm(x, (10,), w, 1e-6), lambda: (_r(4, 10), _r(10, seed=1)), 1),
    "int_and_float": (lambda x, i: (x * i + (i // 2)).float().sum(-1) + (i % 3).sum(-1),
                      lambda: (_r(4, 10), torch.randint(-5, 5, (4, 10))), None),
}


def _outs(o):
    return list(o) if isinstance(o, (tuple, list)) else [o]


@pytest.mark.parametrize("name", list(SNIPPETS))
def test_snippet(name):
    fn, make, generated = SNIPPETS[name]
    args = make()
    mine = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    ref_args = [a.detach().double().requires_grad_(a.requires_grad) if a.is_floating_point() else a for a in args]
    got, want = _outs(klc.compile(fn)(*mine)), _outs(fn(*ref_args))
    for g, w in zip(got, want):
        assert_close(g.double(), w.double(), what=f"{name} forward")
    leaves = [a for a in mine if a.requires_grad]
    if leaves:
        seed = torch.randn(got[0].shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
        mine_g = torch.autograd.grad(got[0], leaves, seed.to(got[0].dtype))
        ref_g = torch.autograd.grad(want[0], [a for a in ref_args if a.requires_grad], seed)
        for i, (g, w) in enumerate(zip(mine_g, ref_g)):
            assert_close(g.double(), w, what=f"{name} grad {i}")
    if generated is not None:
        plan = klc.explain(fn, *make())
        assert sum(len(g.groups) for g in plan.graphs[:1]) == generated, plan.graphs[0].decisions()


class _Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g


def _in_place_on_slices(x):
    y = x.clone()
    y[:, :3] += 1
    y[1] *= 2
    return y.relu()


@pytest.mark.parametrize("fn, make", [
    (lambda x: _Square.apply(x.sin()).sum(-1), lambda: _r(4, 9)),
    (_in_place_on_slices, lambda: _r(4, 9, grad=False)),
    (lambda x: x.unflatten(-1, (4, -1)).softmax(-1).flatten(-2), lambda: _r(3, 16)),
    (lambda x: torch.softmax(x.float(), -1).to(x.dtype), lambda: _r(3, 20, grad=False).half()),
])
def test_autograd_functions_in_place_and_reshapes(fn, make):
    x = make()
    mine, ref = x.detach().clone().requires_grad_(x.requires_grad), x.detach().clone().requires_grad_(x.requires_grad)
    got, want = klc.compile(fn)(mine), fn(ref)
    torch.testing.assert_close(got, want)
    if x.requires_grad:
        (g,) = torch.autograd.grad(got.sum(), mine)
        (w,) = torch.autograd.grad(want.sum(), ref)
        torch.testing.assert_close(g, w)


def test_data_dependent_sizes():
    """x[x > 0] traced into the graph (an unbacked size): heuristics take a default size."""
    x = _r(50, grad=False)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        got = klc.compile(lambda t: (t[t > 0] * 2).sum(-1))(x)
    torch.testing.assert_close(got, (x[x > 0] * 2).sum(-1))
