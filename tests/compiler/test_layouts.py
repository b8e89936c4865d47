"""Small programs over inputs in several memory layouts, forward and backward under
backend="kernelab" against eager (CPU, kernels under the interpreter, float32).

Kernels that take a tensor's layout for granted are wrong silently: the row scatter-add kernel
read a transposed gradient as contiguous rows (Swin's relative-position bias gradients 0.9-1.2 off,
2026-12-04). Every program here runs with each input contiguous, transposed in its last two dims,
a strided slice (every other column), at a storage offset, and channels-last (4-d inputs).
"""
import itertools

import pytest
import torch
import torch.nn.functional as F

from tests.compiler.conftest import assert_close

B, T, H, C = 3, 5, 8, 9
_IDS = torch.tensor([0, 4, 4, 7, 13, 2, 14, 9])


def _layouts(shape, seed):
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(*shape, generator=gen)
    out = {"contiguous": base.clone(), "transposed": base.transpose(-1, -2).contiguous().transpose(-1, -2)}
    strided = torch.randn(*shape[:-1], shape[-1] * 2, generator=gen)[..., ::2]
    out["strided"] = strided.copy_(base)
    wide = torch.randn(shape[0] + 2, *shape[1:], generator=gen)
    wide[1:1 + shape[0]] = base
    out["offset"] = wide[1:1 + shape[0]]
    if len(shape) == 4:
        out["channels_last"] = base.contiguous(memory_format=torch.channels_last)
    return out


PROGRAMS = {
    "rows_by_index": (lambda x, w: (x.reshape(-1, H)[_IDS] * w.reshape(-1, H)[:8]).sum(), (B, T, H)),
    "index_put_accumulate": (lambda x, w: torch.zeros(T, H).index_put((_IDS[:4] % T,), (x * w)[0, :4],
                                                                      accumulate=True) * 3, (B, T, H)),
    "embedding": (lambda x, w: F.embedding(_IDS.view(2, 4), x.reshape(-1, H)[:15]) * w[0, :4], (B, T, H)),
    "cat_softmax": (lambda x, w: torch.cat([x, w], -1).softmax(-1) * 2, (B, T, H)),
    "where": (lambda x, w: torch.where(x > 0, x * w, w - x).sum(0), (B, T, H)),
    "cumsum": (lambda x, w: (x.cumsum(1) * w).sum(-1), (B, T, H)),
    "softmax_middle_dim": (lambda x, w: (x.softmax(1) * w).sum(), (B, T, H)),
    "layer_norm": (lambda x, w: F.layer_norm(x * w, (H,)), (B, T, H)),
    "column_sum": (lambda x, w: (x * w).sum((0, 1)), (B, T, H)),
    "max_and_argmax": (lambda x, w: x.max(1).values * w.amax(1) + x.argmax(1), (B, T, H)),
    "cross_entropy": (lambda x, w: F.cross_entropy((x * w).reshape(-1, H), torch.arange(B * T) % H), (B, T, H)),
    "transposed_add": (lambda x, w: (x.transpose(1, 2) + w.transpose(1, 2)).relu().sum(-1), (B, T, H)),
    "conv_batch_norm_relu": (lambda x, w: F.relu(F.batch_norm(F.conv2d(x, w[:4, :3, :3, :3]), None, None,
                                                              training=True)), (2, 3, C, C)),
    "pool_softmax": (lambda x, w: F.adaptive_avg_pool2d(x * w, 1).flatten(1).softmax(-1), (2, 3, C, C)),
}


def _cases():
    for name, (_, shape) in PROGRAMS.items():
        kinds = sorted(_layouts(shape, 0))
        # every layout for x with w contiguous, and each layout for both inputs
        pairs = {(k, "contiguous") for k in kinds} | {(k, k) for k in kinds}
        for pair in sorted(pairs):
            yield pytest.param(name, pair, id=f"{name}-{pair[0]}-{pair[1]}")


def _run(fn, args, compiled: bool):
    args = [a.detach().requires_grad_(True) for a in args]
    out = (torch.compile(fn, backend="kernelab") if compiled else fn)(*args)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)) if out.dim() else torch.tensor(1.0)
    return out.detach(), torch.autograd.grad(out, args, g, allow_unused=True)


@pytest.mark.parametrize("name, pair", list(_cases()))
def test_program_in_layout_matches_eager(name, pair):
    fn, shape = PROGRAMS[name]
    x = _layouts(shape, 1)[pair[0]]
    w = _layouts(shape, 2)[pair[1]]
    torch._dynamo.reset()
    expected, expected_grads = _run(fn, (x, w), compiled=False)
    got, got_grads = _run(fn, (x, w), compiled=True)
    assert_close(got, expected, what=f"{name} {pair}")
    for i, (a, e) in enumerate(zip(got_grads, expected_grads)):
        if e is None:
            assert a is None or not a.any(), f"{name} {pair}: input {i}"
        else:
            assert_close(a, e, what=f"{name} {pair}: gradient of input {i}")


def test_every_layout_is_what_it_says():
    views = _layouts((2, 3, C, C), 0)
    assert views["contiguous"].is_contiguous()
    assert not views["transposed"].is_contiguous() and views["transposed"].stride(-2) == 1
    assert views["strided"].stride(-1) == 2
    assert views["offset"].storage_offset() > 0 and views["offset"].is_contiguous()
    assert views["channels_last"].is_contiguous(memory_format=torch.channels_last)
    assert len(list(itertools.islice(_cases(), 1000))) > 50
