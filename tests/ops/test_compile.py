"""Every op under torch.compile(fullgraph=True) (no graph break), forward and backward, and the
custom ops' registrations (schema, fake implementation, autograd) checked by torch.library.opcheck."""

import pytest
import torch
import torch.nn.functional as F

import kernelab.ops as K
from tests.ops.conftest import assert_close
from tests.ops.helpers import randn, ref_copy

w9 = torch.rand(9) + 0.5
CASES = {
    "add_relu": (lambda a, b: K.add_relu(a, b), lambda a, b: torch.relu(a + b), [(6, 9), (9,)]),
    "add_relu_same_shape": (lambda a, b: K.add_relu(a, b), lambda a, b: torch.relu(a + b), [(6, 9), (6, 9)]),
    "bias_gelu": (lambda a, b: K.bias_gelu(a, b, approximate="tanh"), lambda a, b: F.gelu(a + b, approximate="tanh"), [(6, 9), (9,)]),
    "silu_mul": (K.silu_mul, lambda a, b: F.silu(a) * b, [(6, 9), (6, 9)]),
    "gelu_mul": (K.gelu_mul, lambda a, b: F.gelu(a) * b, [(6, 9), (6, 9)]),
    "softmax": (lambda x: K.softmax(x, 1), lambda x: torch.softmax(x, 1), [(3, 9, 4)]),
    "log_softmax": (lambda x: K.log_softmax(x, -1), lambda x: torch.log_softmax(x, -1), [(5, 20000)]),
    "layer_norm": (lambda x, w, b: K.layer_norm(x, (9,), w, b), lambda x, w, b: F.layer_norm(x, (9,), w, b), [(2, 5, 9), (9,), (9,)]),
    "rms_norm": (lambda x, w: K.rms_norm(x, (9,), w), lambda x, w: F.rms_norm(x, (9,), w), [(7, 9), (9,)]),
    "cross_entropy": (
        lambda x: K.cross_entropy(x, torch.tensor([1, -100, 3, 8, 0, 2]), w9, label_smoothing=0.1),
        lambda x: F.cross_entropy(x, torch.tensor([1, -100, 3, 8, 0, 2]), w9.to(x.dtype), label_smoothing=0.1),
        [(6, 9)],
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_compile_fullgraph(name):
    ours, theirs, shapes = CASES[name]
    torch._dynamo.reset()
    compiled = torch.compile(ours, fullgraph=True, backend="aot_eager")
    inputs = [randn(s, torch.float32, seed=i) for i, s in enumerate(shapes)]
    y = compiled(*inputs)
    refs = [ref_copy(t) for t in inputs]
    ref = theirs(*refs)
    assert_close(y, ref, torch.float32, f"{name} compiled forward")
    g = torch.randn(y.shape, dtype=torch.float64)
    ours_g = torch.autograd.grad(y, inputs, g.float())
    ref_g = torch.autograd.grad(ref, refs, g)
    for a, r in zip(ours_g, ref_g):
        assert_close(a, r, torch.float32, f"{name} compiled backward")


def test_compiled_graph_holds_the_custom_op():
    """The traced graph calls kernelab's custom op (one node), not a decomposition."""
    from torch._dynamo.testing import EagerAndRecordGraphs

    torch._dynamo.reset()
    backend = EagerAndRecordGraphs()
    torch.compile(lambda x: K.softmax(x, -1), fullgraph=True, backend=backend)(torch.randn(4, 8))
    code = backend.graphs[0].code
    assert "kernelab.softmax" in code


OPCHECK = [
    ("softmax", lambda: (torch.ops.kernelab.softmax.default, (randn((3, 10), torch.float32), False))),
    ("norm", lambda: (torch.ops.kernelab.norm.default, (randn((3, 10), torch.float32), 10, randn((10,), torch.float32, seed=1), randn((10,), torch.float32, seed=2), 1e-5, False))),
    ("pointwise", lambda: (torch.ops.kernelab.pointwise.default, (randn((3, 10), torch.float32), randn((10,), torch.float32, seed=1), "silu_mul"))),
    ("pointwise_add", lambda: (torch.ops.kernelab.pointwise.default, (randn((3, 10), torch.float32), randn((3, 10), torch.float32, seed=1), "add_relu"))),
    ("cross_entropy", lambda: (torch.ops.kernelab.cross_entropy.default, (randn((4, 10), torch.float32), torch.tensor([1, 2, -100, 9]), None, -100, 0.0, "mean", False))),
    ("cross_entropy_float32_loss", lambda: (torch.ops.kernelab.cross_entropy.default, (randn((4, 10), torch.float16), torch.tensor([1, 2, -100, 9]), None, -100, 0.0, "none", True))),
]


@pytest.mark.parametrize("name,make", OPCHECK, ids=[n for n, _ in OPCHECK])
def test_opcheck(name, make):
    op, args = make()
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


def test_fake_tensor_mode_sees_one_op():
    """Under FakeTensorMode (what kernelab.count uses) the op runs its fake implementation."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(4, 16, device="cuda" if torch.cuda.is_available() else "cpu")
        y = K.layer_norm(x, (16,))
        z = K.cross_entropy(x, torch.zeros(4, dtype=torch.long))
    assert y.shape == (4, 16) and z.shape == ()
