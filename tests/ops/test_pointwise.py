"""add_relu, bias_gelu, silu_mul, gelu_mul: values and gradients, broadcasting, dtype promotion."""

import importlib
import math

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import kernelab.ops as K
from tests.ops.conftest import DTYPES, assert_close, grads
from tests.ops.helpers import randn, ref_copy

OPS = {
    "add_relu": (K.add_relu, lambda a, b: torch.relu(a + b)),
    "bias_gelu": (K.bias_gelu, lambda a, b: F.gelu(a + b)),
    "bias_gelu_tanh": (lambda a, b: K.bias_gelu(a, b, approximate="tanh"), lambda a, b: F.gelu(a + b, approximate="tanh")),
    "silu_mul": (K.silu_mul, lambda a, b: F.silu(a) * b),
    "gelu_mul": (K.gelu_mul, lambda a, b: F.gelu(a) * b),
    "gelu_tanh_mul": (lambda a, b: K.gelu_mul(a, b, approximate="tanh"), lambda a, b: F.gelu(a, approximate="tanh") * b),
}
# (a shape, b shape): same shape (flat path), row bias, column broadcast, scalar, leading broadcast
CASES = [((1,), (1,)), ((7,), (7,)), ((9, 199), (9, 199)), ((4097,), (4097,)), ((5, 199), (199,)),
         ((2, 3, 64), (64,)), ((6, 5), (6, 1)), ((6, 5), ()), ((33,), (2, 33)), ((2, 3, 8), (3, 8)), ((0, 4), (4,))]


def check(name, a, b, seed=5):
    ours, theirs = OPS[name]
    y = ours(a, b)
    ar, br = ref_copy(a), ref_copy(b)
    ref = theirs(ar, br)
    assert y.dtype == torch.result_type(a, b)
    assert_close(y, ref, y.dtype, f"{name} forward")
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(y.dtype)
    for what, o, r, t in zip(("da", "db"), grads(y, [a, b], g), grads(ref, [ar, br], g.double()), (a, b)):
        assert (o is None) == (r is None), what
        if o is not None:
            assert_close(o, r, t.dtype, f"{name} {what}")


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shapes", CASES, ids=str)
def test_shapes(name, dtype, shapes):
    check(name, randn(shapes[0], dtype, scale=2.0), randn(shapes[1], dtype, seed=1))


@pytest.mark.parametrize("name", OPS)
def test_noncontiguous_and_promotion(name):
    check(name, randn((4, 50), torch.float32, noncontig=True), randn((4, 50), torch.float32, noncontig=True, seed=2))
    check(name, randn((50, 4), torch.float32).detach().t().requires_grad_(), randn((50,), torch.float32, seed=3))
    check(name, randn((4, 50), torch.float16), randn((50,), torch.float32, seed=4))  # promotes to float32


def test_special_values():
    finite = [float("nan"), 1e30, -1e30, 0.0, -0.0, 3.0, -3.0]
    for name in OPS:
        values = finite
        if name in ("add_relu", "bias_gelu"):
            # +-inf too; for the tanh form PyTorch's gradient at +-inf is NaN (inf * 0), ours the limit
            values = finite + [float("inf"), -float("inf")]
        a = torch.tensor(values, requires_grad=True)
        b = torch.full((len(values),), 0.5, requires_grad=True)
        if name.endswith("_mul"):
            b = torch.tensor([0.5] * len(values), requires_grad=True)
            a = torch.tensor(finite[:1] + [30.0, -30.0, 0.0, -0.0, 3.0, -3.0], requires_grad=True)  # large |x| * b overflow conventions differ
        check(name, a, b)


def test_scalar_operand_and_errors():
    a = randn((3, 5), torch.float32)
    y = K.add_relu(a, 0.5)
    assert_close(y, torch.relu(a.double() + 0.5), torch.float32)
    with pytest.raises(RuntimeError, match="approximate"):
        K.bias_gelu(a, a, approximate="fast")
    with pytest.raises(RuntimeError):
        K.add_relu(torch.randn(3, 4), torch.randn(5))  # shapes do not broadcast
    assert torch.equal(K.add_relu(torch.arange(-2, 3), torch.tensor(1)), torch.relu(torch.arange(-2, 3) + 1))
    for other in (None, "a", [1.0]):  # a TypeError as torch's, not an AttributeError from inside
        with pytest.raises(TypeError, match="second operand must be a Tensor or a number"):
            K.add_relu(a, other)
        with pytest.raises(TypeError):
            torch.relu(a + other)


def test_int64_offsets_path():
    """The 64-bit indexing variant (chosen above 2^31 elements) computes the same values."""
    from kernelab.ops import pointwise as P

    a, b = torch.randn(5, 300), torch.randn(300)
    y = torch.empty(5, 300)
    P._pointwise_fwd_kernel[(1, 5)](a, b, y, a.stride(0), 1, 0, 1, 300, 5, 300, 1,
                                    ACT=P.GELU.value, MUL=False, BLOCK_M=1, BLOCK_N=512, INT64=True)
    assert_close(y, F.gelu(a.double() + b.double()), torch.float32)
    from kernelab.ops import _common

    assert _common.needs_int64(torch.empty(1, 1).expand(2**16, 2**15))  # 2^31 elements through a view
    assert not _common.needs_int64(torch.empty(2**10, 2**10))


_pw = importlib.import_module("kernelab.ops.pointwise")


@triton.jit
def _phi_kernel(z_ptr, out_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    z = tl.load(z_ptr + offs, mask=offs < N)
    tl.store(out_ptr + offs, _pw._phi(z), mask=offs < N)


def test_fast_gelu_cdf_accuracy():
    """``_phi`` (the erfc fit 16-bit GELU uses) against math.erfc over [-12, 12], in float32."""
    z = torch.linspace(-12, 12, 24001, dtype=torch.float32)
    out = torch.empty_like(z)
    _phi_kernel[(triton.cdiv(z.numel(), 1024),)](z, out, z.numel(), BLOCK=1024)
    ref = torch.tensor([0.5 * math.erfc(-v / math.sqrt(2)) for v in z.double().tolist()], dtype=torch.float64)
    assert (out.double() - ref).abs().max() < 3e-7
    gelu, gelu_ref = z.double() * out.double(), z.double() * ref
    tail = (z >= -6) & (gelu_ref.abs() > 0)
    rel = ((gelu - gelu_ref).abs() / gelu_ref.abs())[tail]
    assert rel.max() < 1e-5


def test_fast_gelu_only_for_16_bit():
    pw = _pw
    assert pw._activation("bias_gelu", torch.bfloat16)[0] == pw.GELU_FAST.value
    assert pw._activation("gelu_mul", torch.float16)[0] == pw.GELU_FAST.value
    assert pw._activation("bias_gelu", torch.float32)[0] == pw.GELU.value
    assert pw._activation("bias_gelu_tanh", torch.bfloat16)[0] == pw.GELU_TANH.value
