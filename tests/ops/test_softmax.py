"""softmax / log_softmax: values and gradients against float64 PyTorch, under the interpreter."""

import pytest
import torch

import kernelab.ops as K
from tests.ops.conftest import DTYPES, assert_close, grads
from tests.ops.helpers import randn, ref_copy

OPS = {"softmax": (K.softmax, torch.softmax), "log_softmax": (K.log_softmax, torch.log_softmax)}
# odd lengths, both sides of the one-pass limit (16384), and long rows of the looped kernel
SHAPES = [(1, 1), (7, 1), (1, 7), (9, 199), (3, 4097), (2, 16384), (2, 16385), (3, 65537), (1, 262144), (2, 3, 45)]


def check(name, x, dim=-1, dtype=None, seed=1):
    ours, theirs = OPS[name]
    y = ours(x, dim, dtype=dtype)
    xr = ref_copy(x)
    ref = theirs(xr, dim)
    out_dtype = dtype or x.dtype
    assert y.dtype == out_dtype
    assert_close(y, ref, out_dtype, f"{name} forward")
    if x.requires_grad:
        g = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(out_dtype)
        (dx,) = grads(y, [x], g)
        (dref,) = grads(ref, [xr], g.double())
        assert_close(dx, dref, x.dtype, f"{name} backward")


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_shapes(name, dtype, shape):
    check(name, randn(shape, dtype, scale=3.0))


@pytest.mark.parametrize("name", OPS)
def test_other_dims_and_3d(name):
    x = randn((4, 5, 6), torch.float32)
    for dim in (0, 1, 2, -2):
        check(name, x, dim)


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("n", [33, 20000])
def test_noncontiguous(name, n):
    check(name, randn((3, n), torch.float32, noncontig=True))
    x = randn((n, 3), torch.float32).detach().t().requires_grad_()  # transposed: column stride 3
    check(name, x)
    x = randn((6, n), torch.float32).detach()[::2].requires_grad_()  # row stride 2n
    check(name, x)


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("n", [8, 20000])
def test_special_values(name, n):
    x = randn((6, n), torch.float32, grad=False).clone()
    x[0, 3] = float("-inf")        # one -inf: exp -> 0
    x[1] = float("-inf")           # all -inf: NaN row in PyTorch
    x[2, 1] = float("nan")         # NaN poisons its row
    x[3, 2] = float("inf")         # +inf: NaN row in PyTorch
    x[4] *= 1e4                    # large values: must not overflow
    x[5] = 3e38                    # near float32 max
    check(name, x.requires_grad_())
    h = randn((2, n), torch.float16, grad=False) * 3000  # large for float16
    check(name, h.requires_grad_())


@pytest.mark.parametrize("name", OPS)
def test_empty_and_scalar(name):
    for shape in [(0, 5), (3, 0), (0,)]:
        x = torch.empty(shape, requires_grad=True)
        check(name, x)
    check(name, torch.tensor(2.5, requires_grad=True), dim=0)


@pytest.mark.parametrize("name", OPS)
def test_dtype_argument_and_errors(name):
    check(name, randn((3, 10), torch.float16), dtype=torch.float32)
    ours, theirs = OPS[name]
    with pytest.raises(IndexError):
        ours(torch.randn(2, 3), 2)
    with pytest.raises(Exception) as ours_err:
        ours(torch.arange(4), -1)
    with pytest.raises(Exception) as theirs_err:
        theirs(torch.arange(4), -1)
    assert type(ours_err.value) is type(theirs_err.value)
    x = torch.randn(2, 3)
    with pytest.warns(UserWarning, match="Implicit dimension"):
        y = ours(x)  # legacy dim=None picks dim 1 for 2-D input, with a warning
    assert_close(y, theirs(x.double(), 1), torch.float32)


def test_float64_runs_reference():
    x = torch.randn(3, 5, dtype=torch.float64)
    assert torch.equal(K.softmax(x, -1), torch.softmax(x, -1))


# model widths that are not powers of two: one-pass rows held as a head and a masked tail
# (``_common.row_tile``), with the split on and off; special values in the tail
@pytest.mark.parametrize("split", [True, False], ids=["split", "one tile"])
@pytest.mark.parametrize("name", OPS)
def test_split_rows_at_model_widths(name, split, monkeypatch):
    from kernelab.ops import _common

    monkeypatch.setattr(_common, "SPLIT_ROWS", split)
    for n in (1536, 2880, 5120, 6144, 12288):
        check(name, randn((3, n), torch.float32, scale=3.0))
    check(name, randn((2, 2880), torch.float16, scale=3.0))
    x = randn((3, 5120), torch.float32, grad=False).clone()
    x[0, 5000] = float("-inf")     # in the tail
    x[1, 4096:] = float("-inf")    # the whole tail
    x[2, 4200] = float("nan")
    check(name, x)


def test_row_tile_splits_only_where_it_idles_fewer_lanes():
    from kernelab.ops import _common

    def split(n):
        t = _common.row_tile(1024, n, split=True)
        return t.block_n, t.tail

    assert split(5120) == (4096, 1024) and split(12288) == (8192, 4096) and split(2880) == (2048, 1024)
    assert split(6144) == (4096, 2048) and split(4097) == (4096, 1)
    assert split(7168) == (8192, 0) and split(4096) == (4096, 0) and split(768) == (1024, 0)  # no gain; short rows
    assert _common.row_tile(1024, 5120, split=False).tail == 0
    assert _common.row_tile(1024, 5120, split=True).warps == _common.row_tile(1024, 4096).warps  # the head's
