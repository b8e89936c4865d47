"""PyTorch as people write it, beyond the suite's programs: RoPE, masked attention scores, SwiGLU,
group norm, a logsumexp loss, cumsum, argmax, boolean masks, integer arithmetic, in-place chains,
empty inputs. Each compiled under KERNELAB_STRICT=1 (a compiler error fails instead of falling
back) and compared with eager, forward and (where differentiable) backward."""
import pytest
import torch
import torch.nn.functional as F

import kernelab.compiler as klc


def _g(seed):
    return torch.Generator().manual_seed(seed)


def r(*shape, seed=0):
    return torch.randn(*shape, generator=_g(seed))


def rope(x, cos, sin):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def attn_scores(q, k, mask):
    return (q @ k.transpose(-1, -2) / 8.0).masked_fill(mask, float("-inf")).softmax(-1)


def swiglu(x, w1, w2):
    return F.silu(x @ w1) * (x @ w2)


def residual_ln(x, res, w, b):
    return F.layer_norm(x + res, (x.shape[-1],), w, b)


def rmsnorm_manual(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def groupnorm(x, w, b):
    return F.group_norm(x, 4, w, b)


def logsumexp_loss(x, t):
    return (torch.logsumexp(x, -1) - x.gather(-1, t[:, None]).squeeze(-1)).mean()


def l2norm(x):
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-6)


def activations(x):
    return F.softplus(x) * torch.tanh(x) + F.elu(x) - F.leaky_relu(x, 0.1)


def var_std(x):
    return x.var(-1, unbiased=True) + x.std(-1) * 0.5


def col_mean_center(x):
    return x - x.mean(0, keepdim=True)


def scalar_broadcast(x, y):
    return (x * 2.5 + y.unsqueeze(0)).exp().log1p()


def double_softmax(x):
    return x.softmax(-1).log_softmax(-1)


DIFFERENTIABLE = [
    (rope, lambda: (r(2, 4, 16, 64), r(16, 64, seed=1), r(16, 64, seed=2))),
    (attn_scores, lambda: (r(2, 4, 16, 32), r(2, 4, 16, 32, seed=1), torch.triu(torch.ones(16, 16, dtype=torch.bool), 1))),
    (swiglu, lambda: (r(16, 32), r(32, 64, seed=1), r(32, 64, seed=2))),
    (residual_ln, lambda: (r(4, 7, 96), r(4, 7, 96, seed=1), r(96, seed=2), r(96, seed=3))),
    (rmsnorm_manual, lambda: (r(5, 130), r(130, seed=1))),
    (groupnorm, lambda: (r(2, 8, 5, 5), r(8, seed=1), r(8, seed=2))),
    (logsumexp_loss, lambda: (r(9, 33), torch.randint(0, 33, (9,), generator=_g(1)))),
    (l2norm, lambda: (r(6, 50),)),
    (activations, lambda: (r(300),)),
    (var_std, lambda: (r(6, 31),)),
    (col_mean_center, lambda: (r(33, 17),)),
    (scalar_broadcast, lambda: (r(3, 20), r(20, seed=1))),
    (double_softmax, lambda: (r(4, 65),)),
]

FORWARD_ONLY = [
    (lambda x: x.cumsum(-1) * torch.sigmoid(x), lambda: (r(4, 40),)),
    (lambda x: x.amax(-1) - x.amin(-1) + x.mean(-1), lambda: (r(5, 77),)),
    (lambda x: x.argmax(-1).float() + x.max(-1).values, lambda: (r(5, 77),)),
    (lambda x: torch.where(torch.isnan(x), torch.zeros_like(x), x).clamp(-1, 1) ** 2,
     lambda: (torch.tensor([1.0, float("nan"), -3.0, 0.5] * 10),)),
    (lambda x, i: x * (i % 3).to(x.dtype) + (i // 2).float(), lambda: (r(10, 3), torch.arange(30).reshape(10, 3))),
    (lambda x: ((x > 0) & (x < 1)).float() * x + (~(x > 0)).float(), lambda: (r(100),)),
    (lambda x, y: x.t() + y, lambda: (r(12, 7), r(7, 12, seed=1))),
    (lambda x, y: x[:, None, :] * y[None, :, :], lambda: (r(5, 9), r(4, 9, seed=1))),
    (lambda x: x.clone().mul_(2).add_(1).relu_(), lambda: (r(50),)),
    (lambda x: (x + 1).relu().sum(-1), lambda: (r(0, 8),)),
    (lambda x: (x * x).sum(), lambda: (r(1000),)),
]


@pytest.mark.parametrize("fn, make", DIFFERENTIABLE, ids=[f.__name__ for f, _ in DIFFERENTIABLE])
def test_forward_and_backward_match_eager(fn, make):
    args = make()
    leaves = [a.clone().requires_grad_(a.is_floating_point()) for a in args]
    ref = fn(*leaves)
    grad_out = torch.randn(ref.shape, generator=_g(9))
    ref_grads = torch.autograd.grad(ref, [a for a in leaves if a.requires_grad], grad_out)
    mine = [a.clone().requires_grad_(a.is_floating_point()) for a in args]
    out = klc.compile(fn)(*mine)
    grads = torch.autograd.grad(out, [a for a in mine if a.requires_grad], grad_out)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("fn, make", FORWARD_ONLY, ids=[f"forward_{i}" for i in range(len(FORWARD_ONLY))])
def test_forward_matches_eager(fn, make):
    args = make()
    ref = fn(*[a.clone() for a in args])
    out = klc.compile(fn)(*[a.clone() for a in args])
    assert out.dtype == ref.dtype and out.shape == ref.shape
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5, equal_nan=True)
