"""The host path shared by the ops (``kernelab/ops/_common.py``): allocation through Inductor's C++
entry point, rows passed without views, the autograd node skipped when nothing needs a gradient,
launch settings prepared once. Values are the ops' own tests' business; these check the plumbing
that makes them cheap, against what torch itself would give."""

import pytest
import torch
import torch.nn.functional as F

import kernelab.ops as K
from kernelab.ops import _common
from kernelab.ops._common import empty as real_empty  # the autouse fixture poisons _common.empty

SHAPES = [(), (0,), (7,), (3, 0, 5), (1, 1, 4097), torch.Size([2, 3, 768]), [4, 5]]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32])
def test_empty_is_torch_empty(shape, dtype):
    got, ref = real_empty(shape, dtype, torch.device("cpu")), torch.empty(shape, dtype=dtype)
    assert (got.shape, got.stride(), got.dtype, got.device) == (ref.shape, ref.stride(), ref.dtype, ref.device)
    assert got.is_contiguous() and not got.requires_grad


def test_row_view_passes_contiguous_tensors_as_they_are():
    x = torch.randn(3, 5, 64)
    assert _common.row_view(x, 64) == (x, 64)
    strided = torch.randn(15, 80)[:, :64]
    rows, stride = _common.row_view(strided, 64)
    assert stride == 80 and torch.equal(rows, strided)
    transposed = torch.randn(64, 15).t()  # unit column stride only after a copy
    rows, stride = _common.row_view(transposed, 64)
    assert rows.stride() == (64, 1) and stride == 64 and torch.equal(rows, transposed)


def test_traced_sees_subclasses_only():
    x = torch.randn(4)
    assert not _common.traced(x, torch.nn.Parameter(x), None, 3, 1.5, "mean", [1, 2], True)

    class Sub(torch.Tensor):
        pass

    assert _common.traced(x, x.as_subclass(Sub))


@pytest.mark.parametrize("op", ["softmax", "layer_norm", "silu_mul", "cross_entropy", "linear"])
def test_no_autograd_node_without_grad(op):
    """Nothing requires grad, or grad mode is off: the forward alone runs (no grad_fn), with the
    same values as with the autograd node."""
    x, w, b = torch.randn(7, 64), torch.randn(64), torch.randn(64)
    target = torch.randint(0, 64, (7,))
    calls = {
        "softmax": lambda x: K.softmax(x, -1),
        "layer_norm": lambda x: K.layer_norm(x, (64,), w, b),
        "silu_mul": lambda x: K.silu_mul(x, x.flip(0)),
        "cross_entropy": lambda x: K.cross_entropy(x, target),
        "linear": lambda x: K.linear(x, w.expand(32, 64).contiguous(), b[:32], activation="gelu"),
    }
    fn = calls[op]
    plain = fn(x)
    assert plain.grad_fn is None
    with torch.no_grad():
        assert fn(x.clone().requires_grad_(True)).grad_fn is None
    with_node = fn(x.clone().requires_grad_(True))
    assert with_node.grad_fn is not None
    torch.testing.assert_close(plain, with_node.detach(), rtol=0, atol=0)


def test_prepared_launch_settings_follow_the_tuning_switches(monkeypatch):
    """Launch settings cached per shape still follow the module switches a tuning run sets
    (cross_entropy.BWD_BLOCK_C here): the switch is part of the cache key."""
    import importlib

    ce = importlib.import_module("kernelab.ops.cross_entropy")
    x = torch.randn(5, 300, requires_grad=True)
    target = torch.randint(0, 300, (5,))
    (ref,) = torch.autograd.grad(F.cross_entropy(x, target), x)
    for block, expected in ((4096, 512), (128, 128)):
        monkeypatch.setattr(ce, "BWD_BLOCK_C", block)
        (got,) = torch.autograd.grad(K.cross_entropy(x, target), x)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
        col_blocks, launch = ce._bwd_launch(300, False, False, True, block)
        assert launch.keywords["BLOCK_C"] == expected and col_blocks == -(-300 // expected)
