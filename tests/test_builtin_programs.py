"""Every built-in program builds and runs on the CPU with finite, correct values."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils import _pytree as pytree

from kernelab import programs as programs_module
from kernelab.programs import all_programs, get_program
from kernelab.targets import prepare_on_device

PROGRAMS = all_programs()
NAMES = sorted(PROGRAMS)

# atol/rtol per result dtype, against a float64 reference
TOL = {torch.float32: (1e-5, 1e-4), torch.bfloat16: (2e-2, 2e-2), torch.float16: (1e-3, 1e-3)}


def run_on_cpu(name):
    program = PROGRAMS[name]
    prepared = prepare_on_device(program.make_target(), program.make_args(), "cpu")
    prepared.reset_grads()
    return prepared, prepared()


def float_leaves(tree):
    return [x for x in pytree.tree_leaves(tree) if isinstance(x, torch.Tensor) and x.is_floating_point()]


def assert_close_ref(actual, expected):
    atol, rtol = TOL[actual.dtype]
    torch.testing.assert_close(actual.double(), expected.double(), atol=atol, rtol=rtol)


def test_catalogue_is_large_and_named():
    assert len(PROGRAMS) >= 34
    assert "add_relu" in PROGRAMS
    for name, program in PROGRAMS.items():
        assert name == program.name and name.isidentifier() and name == name.lower()
        assert program.description and "\n" not in program.description


def test_programs_attribute_is_lazy_and_complete():
    assert set(programs_module.PROGRAMS) == set(PROGRAMS)
    with pytest.raises(ValueError, match="no built-in program named 'nope'"):
        get_program("nope")


@pytest.mark.parametrize("name", NAMES)
def test_program_runs_with_finite_values(name):
    prepared, out = run_on_cpu(name)
    outs = float_leaves(out)
    if name in ("layer_norm_backward", "cross_entropy_backward", "embedding_backward", "mlp_backward"):
        grads = [leaf.grad for leaf in prepared.leaves_requiring_grad]
        assert grads and all(g is not None and torch.isfinite(g).all() for g in grads), name
        assert any(g.abs().sum() > 0 for g in grads)
    assert outs, f"{name} returned no floating-point tensor"
    for x in outs:
        finite = x[~torch.isinf(x)] if name == "masked_fill_causal" else x
        assert torch.isfinite(finite).all(), name


@pytest.mark.parametrize("name", NAMES)
def test_args_are_deterministic_and_nonzero(name):
    program = PROGRAMS[name]
    first, second = program.make_args(), program.make_args()
    for a, b in zip(pytree.tree_leaves(first), pytree.tree_leaves(second)):
        assert torch.equal(a, b)
        if a.is_floating_point():
            assert a.abs().sum() > 0 and a.std() > 0, f"{name}: argument is constant"


def test_add_relu_matches_clamp():
    a, b = PROGRAMS["add_relu"].make_args()
    assert a.shape == (1_000_000,) and a.dtype == torch.float32
    _, out = run_on_cpu("add_relu")
    torch.testing.assert_close(out, torch.clamp(a + b, min=0), atol=0, rtol=0)


def test_softmax_matches_exp_over_sum():
    (x,) = PROGRAMS["softmax"].make_args()
    _, out = run_on_cpu("softmax")
    x64 = x.double()
    e = torch.exp(x64 - x64.amax(dim=-1, keepdim=True))
    assert_close_ref(out, e / e.sum(dim=-1, keepdim=True))


def test_gelu_affine_matches_erf_formula():
    x, w, b = PROGRAMS["gelu_affine"].make_args()
    _, out = run_on_cpu("gelu_affine")
    y = x.double() * w.double() + b.double()
    assert_close_ref(out, 0.5 * y * (1 + torch.erf(y / math.sqrt(2))))


def test_rms_norm_manual_matches_reference():
    x, w = PROGRAMS["rms_norm_manual"].make_args()
    _, out = run_on_cpu("rms_norm_manual")
    x64 = x.double()
    ref = x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    assert_close_ref(out, ref)


def test_sdpa_fp32_matches_manual_attention():
    q, k, v = PROGRAMS["sdpa_fp32"].make_args()
    _, out = run_on_cpu("sdpa_fp32")
    q64, k64, v64 = q.double(), k.double(), v.double()
    p = torch.softmax(q64 @ k64.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    assert_close_ref(out, p @ v64)


def test_cross_entropy_backward_grad_is_softmax_minus_onehot():
    logits, target = PROGRAMS["cross_entropy_backward"].make_args()
    prepared, loss = run_on_cpu("cross_entropy_backward")
    l64 = logits.detach().double()
    ref_loss = (torch.logsumexp(l64, -1) - l64.gather(1, target[:, None])[:, 0]).mean()
    assert_close_ref(loss, ref_loss)
    onehot = F.one_hot(target, l64.shape[1]).double()
    ref_grad = (torch.softmax(l64, -1) - onehot) / l64.shape[0]
    assert_close_ref(prepared.args[0].grad, ref_grad)


def test_strided_and_transposed_inputs_stay_non_contiguous():
    (x,) = PROGRAMS["strided_scale"].make_args()
    xt, _ = PROGRAMS["transposed_add"].make_args()
    assert not x.is_contiguous() and x.stride() == (1024, 2)
    assert not xt.is_contiguous() and xt.stride() == (1, 4096)
    prepared, out = run_on_cpu("strided_scale")
    assert prepared.args[0].stride() == (1024, 2)
    assert_close_ref(out, x.double() * 2 + 1)


def test_mlp_backward_gives_every_parameter_a_grad():
    prepared, loss = run_on_cpu("mlp_backward")
    params = list(prepared.module.parameters())
    assert len(params) == 4 and all(p.grad is not None for p in params)
    assert loss.ndim == 0 and loss > 0


def test_transformer_block_is_bf16_and_residual():
    prepared, out = run_on_cpu("transformer_block_bf16")
    (x,) = prepared.args
    assert out.dtype == torch.bfloat16 and out.shape == x.shape
    assert all(p.dtype == torch.bfloat16 for p in prepared.module.parameters())


def test_conv_bn_relu_modes():
    assert not PROGRAMS["conv_bn_relu_eval"].make_target().training
    assert PROGRAMS["conv_bn_relu_train"].make_target().training
    _, out = run_on_cpu("conv_bn_relu_eval")
    assert (out >= 0).all() and (out > 0).any()
