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
    # a float16 value becomes an integer or a boolean as its float16 rounding (1024.75 -> 1025;
    # 1e-8 -> 0), not as the float32 it was computed in
    a, b = torch.tensor([1024.0], dtype=torch.float16), torch.tensor([0.75], dtype=torch.float16)
    f = torch.compile(lambda a, b: (a + b).to(torch.int32), backend="kernelab")
    assert f(a, b).item() == 1025 == (a + b).to(torch.int32).item()
    f = torch.compile(lambda a: (a * a).bool(), backend="kernelab")
    assert not f(torch.tensor([1e-4], dtype=torch.float16)).item()


def test_frozen_half_batch_norm_backward():
    """A float16 model's batch norm in eval mode, backward through it, on the CPU: the saved
    statistics' dtype made ATen's backward refuse ("mixed dtype (CPU)")."""
    def frozen(x):
        return torch.nn.functional.batch_norm(x, torch.zeros(3), torch.full((3,), 2.0), training=False)

    x = torch.randn(2, 3, 4, 4, dtype=torch.float16, requires_grad=True)
    want = torch.autograd.grad(frozen(x).float().pow(2).sum(), x)[0]
    got = torch.autograd.grad(torch.compile(frozen, backend="kernelab")(x).float().pow(2).sum(), x)[0]
    torch.testing.assert_close(got, want)


def test_a_nan_number_bound_of_clamp_follows_each_devices_eager():
    """CUDA eager ignores a clamp's NaN number bound (its device max returns the number of a
    pair); the CPU's returns NaN. The rewrite turns it into the infinity that bounds nothing, on
    CUDA graphs only (traced here on fake CUDA tensors: no GPU needed); the CPU's graph keeps it."""
    import math

    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from kernelab.compiler import rewrites

    def bounds(device):
        def fn(x):
            return x.clamp(min=float("nan")) + x.clamp(max=float("nan")) + x.clamp(float("nan"), 1.0)
        with FakeTensorMode():
            gm = make_fx(fn)(torch.empty(4, device=device))
        rewrites.cuda_clamps_without_nan_bounds(gm)
        return [b for n in gm.graph.nodes if "clamp" in str(n.target)
                for b in list(n.args[1:]) + list(n.kwargs.values()) if b is not None]

    assert bounds("cuda") == [-math.inf, math.inf, -math.inf, 1.0]
    assert [math.isnan(b) for b in bounds("cpu")] == [True, True, True, False]
    f = torch.compile(lambda x: x.clamp(min=float("nan")), backend="kernelab")
    assert f(torch.tensor([0.0, 1.0])).isnan().all()  # as the CPU's eager
