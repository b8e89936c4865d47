"""The edge-value cases of ``tests/compiler/special_values.py`` on a CUDA GPU, against CUDA eager
(compiled kernels, libdevice math, the GPU's own rounding of literals and conversions).

Run on a GPU machine WITHOUT TRITON_INTERPRET: ``python -m pytest tests/gpu -q``."""
import pytest
import torch

from kernelab.compiler.group_runner import interpreted
from tests.compiler.special_values import FLOAT_CASES, INT_CASES, MIXED_CASES, differs, edge_values

pytestmark = pytest.mark.skipif(interpreted() or not torch.cuda.is_available(),
                                reason="compiled kernels against CUDA eager need a CUDA GPU")


@pytest.fixture(autouse=True)
def _strict(monkeypatch):
    monkeypatch.setenv("KERNELAB_STRICT", "1")
    torch._dynamo.reset()


def _compiled_differs(fn, *inputs) -> str:
    want = fn(*(t.clone() for t in inputs))
    got = torch.compile(fn, backend="kernelab")(*(t.clone() for t in inputs))
    return differs(got, want)


#: (case, dtype) where CUDA eager itself is off by more than the comparison allows, so the
#: compiled values are held to the CPU's eager instead: in float64 CUDA's hardswish and hardsigmoid
#: multiply by float32's 1/6 (``1.0f / 6.0f``: 3e-8 relative off, measured on the H200, torch 2.11).
CUDA_EAGER_LOSES_PRECISION = {("hardswish", torch.float64), ("hardsigmoid", torch.float64)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("name", list(FLOAT_CASES))
def test_float_edge_values_on_cuda(name, dtype):
    fn, x = FLOAT_CASES[name], edge_values(dtype, device="cuda")
    if (name, dtype) in CUDA_EAGER_LOSES_PRECISION:
        assert differs(fn(x.clone()).cpu(), fn(x.cpu())) != "", "CUDA eager became exact: drop the exception"
        assert differs(torch.compile(fn, backend="kernelab")(x.clone()).cpu(), fn(x.cpu())) == ""
        return
    assert _compiled_differs(fn, x) == ""


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8], ids=str)
@pytest.mark.parametrize("name", list(INT_CASES))
def test_integer_edge_values_on_cuda(name, dtype):
    x = edge_values(dtype, device="cuda")
    try:
        INT_CASES[name](x.clone())
    except RuntimeError as exc:
        pytest.skip(f"eager refuses it: {exc}")
    assert _compiled_differs(INT_CASES[name], x) == ""


@pytest.mark.parametrize("name, fn, x_dtype, y_dtype", MIXED_CASES, ids=[c[0] for c in MIXED_CASES])
def test_mixed_dtypes_on_cuda(name, fn, x_dtype, y_dtype):
    x, y = edge_values(x_dtype, device="cuda"), edge_values(y_dtype, seed=1, device="cuda")
    n = min(len(x), len(y))
    assert _compiled_differs(fn, x[:n], y[:n].flip(0)) == ""
