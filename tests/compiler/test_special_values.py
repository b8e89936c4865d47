"""Generated pointwise code against eager PyTorch on edge values (``special_values.py``): signed
zeros, NaN, infinities, ties of rounding, integers at their types' edges, mixed dtypes. CPU, the
interpreter, KERNELAB_STRICT=1; the same cases run on a CUDA GPU in ``tests/gpu``."""
import pytest
import torch

from tests.compiler.special_values import FLOAT_CASES, INT_CASES, MIXED_CASES, differs, edge_values


def _compiled_differs(fn, *inputs) -> str:
    want = fn(*(t.clone() for t in inputs))
    got = torch.compile(fn, backend="kernelab")(*(t.clone() for t in inputs))
    return differs(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64], ids=str)
@pytest.mark.parametrize("name", list(FLOAT_CASES))
def test_float_edge_values(name, dtype):
    assert _compiled_differs(FLOAT_CASES[name], edge_values(dtype)) == ""


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8], ids=str)
@pytest.mark.parametrize("name", list(INT_CASES))
def test_integer_edge_values(name, dtype):
    x = edge_values(dtype)
    try:
        INT_CASES[name](x.clone())
    except RuntimeError as exc:  # what eager refuses (negative powers of integers...) is not compared
        pytest.skip(f"eager refuses it: {exc}")
    assert _compiled_differs(INT_CASES[name], x) == ""


@pytest.mark.parametrize("name, fn, x_dtype, y_dtype", MIXED_CASES, ids=[c[0] for c in MIXED_CASES])
def test_mixed_dtypes(name, fn, x_dtype, y_dtype):
    x = edge_values(x_dtype)
    y = edge_values(y_dtype, seed=1)[: len(x)].flip(0)
    n = min(len(x), len(y))
    assert _compiled_differs(fn, x[:n], y[:n]) == ""


def test_the_fixed_cases_by_value():
    """The values each fix is about, spelled out (the grid above finds them among many)."""
    f = torch.compile(lambda x: torch.round(x), backend="kernelab")
    assert f(torch.tensor([0.49999997, -0.49999997, 2.5, 3.5, -2.5])).tolist() == [0.0, -0.0, 2.0, 4.0, -2.0]
    f = torch.compile(lambda x: torch.div(x, 0.1, rounding_mode="floor"), backend="kernelab")
    assert f(torch.tensor([1.0], dtype=torch.float64)).item() == 9.0  # Python's 1.0 // 0.1 too
    f = torch.compile(lambda x: x // 3, backend="kernelab")
    assert f(torch.tensor([float("inf")])).isnan().all()
    f = torch.compile(lambda x: 3 ** x, backend="kernelab")
    assert f(torch.tensor([30], dtype=torch.int64)).item() == 3 ** 30
    f = torch.compile(lambda x: x / -0.0, backend="kernelab")
    assert f(torch.tensor([1.0])).item() == float("-inf")
    f = torch.compile(lambda x, y: x + y, backend="kernelab")
    assert f(torch.tensor([2049]), torch.tensor([0.0], dtype=torch.float16)).item() == 2048.0


def test_frozen_half_batch_norm_backward():
    """A float16 model's batch norm in eval mode, backward through it, on the CPU: the saved
    statistics' dtype made ATen's backward refuse ("mixed dtype (CPU)")."""
    def frozen(x):
        return torch.nn.functional.batch_norm(x, torch.zeros(3), torch.full((3,), 2.0), training=False)

    x = torch.randn(2, 3, 4, 4, dtype=torch.float16, requires_grad=True)
    want = torch.autograd.grad(frozen(x).float().pow(2).sum(), x)[0]
    got = torch.autograd.grad(torch.compile(frozen, backend="kernelab")(x).float().pow(2).sum(), x)[0]
    torch.testing.assert_close(got, want)
