"""Column reductions (sums and means over every dim but the last): bias and norm-weight gradients in
one generated kernel, with the split path (partials + arrival counters) and the one-split path."""
import pytest
import torch
import torch.nn.functional as F

import kernelab.compiler as klc
from kernelab.compiler import fusion, graph

from tests.compiler.conftest import assert_close
from tests.compiler.test_values import _check, randn


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


def linear_gelu(x, w, b):
    return F.gelu(F.linear(x, w, b))


def col_sum_scaled(x, y):
    return (x * y).sum(0) * 2.0


def col_mean_keepdim(x):
    return (x.exp() - 1).mean(dim=(0, 1), keepdim=True)


def col_sum_negative_dims(x):
    return x.sigmoid().sum(dim=(-3, -2))


# interpreted, tiles are 16 rows of up to 16 columns and up to 4 programs: rows <= 16 is one
# split, (300, 17) is 2 column blocks x 2 splits, (7, 3, 33) is 3 column blocks x 2 splits
SHAPES = [(1, 5), (16, 40), (300, 17), (7, 3, 33)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_layer_norm_gradients(shape, dtype):
    n = shape[-1]
    _check(layer_norm, [randn(*shape) + 1, 1 + randn(n, seed=1) * 0.1, randn(n, seed=2)], dtype=dtype)


@pytest.mark.parametrize("rows", [3, 64, 257])
def test_bias_gradient_behind_a_matmul(rows):
    """GELU's backward feeds the matmul and the bias gradient: computed once in the column kernel."""
    _check(linear_gelu, [randn(rows, 24), randn(40, 24, seed=1) * 0.2, randn(40, seed=2)])


@pytest.mark.parametrize("fn, shapes", [
    (col_sum_scaled, [(50, 21), (50, 21)]),
    (col_mean_keepdim, [(5, 9, 33)]),
    (col_sum_negative_dims, [(4, 6, 18)]),
], ids=["sum_scaled", "mean_keepdim", "negative_dims"])
def test_column_reductions_forward_backward(fn, shapes):
    _check(fn, [randn(*s, seed=i) for i, s in enumerate(shapes)])


def test_transposed_input():
    x = randn(40, 70).t()  # (70, 40), rows 40 apart
    _check(lambda t: (t * 3).sum(0), [x])


def test_repeated_calls_reset_the_arrival_counters():
    """The last program of each column block zeroes its counter: a second and third call (split
    path) give the same sums as the first."""
    f = klc.compile(lambda t: t.sum(0))
    x = randn(300, 17)
    first = f(x)
    for _ in range(2):
        torch.testing.assert_close(f(x), first)
    torch.testing.assert_close(first, x.sum(0), rtol=1e-5, atol=1e-5)


def test_layer_norm_backward_plan_has_one_column_kernel():
    x, w, b = (randn(64, 40) + 1).requires_grad_(), randn(40, seed=1).requires_grad_(), randn(40).requires_grad_()
    kernels = klc.plan_kernels(lambda *a: torch.autograd.grad(layer_norm(*a).sum(), a), (x, w, b))
    names = [k.name for k in kernels]
    # forward kernel, .sum() and its seed (ATen), then the backward: a row kernel and a column kernel
    backward = names[names.index("ones_like") + 1:]
    assert len(backward) == 2 and all(n.startswith("kl_fused_") for n in backward), names


@pytest.mark.parametrize("shape, dims, correction, keepdim, dtype", [
    ((300, 5), (0,), 1, False, torch.float32),  # 19 tiles of 16 rows in 4 row splits (interpreter)
    ((6, 50, 3), (0, 1), 0, True, torch.float32),
    ((7, 4), (0,), 2, False, torch.float16),
    ((40, 33), (0,), 1, False, torch.float64),
])
def test_a_variance_over_the_leading_dims_is_a_column_kernel(shape, dims, correction, keepdim, dtype):
    """``var`` over every dim but the last: one column kernel (Welford lanes merged by Chan's
    formula, row splits too), at an offset where sums of squares would lose every digit: within
    2e-5 of float64 (float32 holds values near 1000 to 6e-5, against a spread of 3; eager's CPU
    variance accumulates in float64), float16 as close as eager's, float64 to 1e-12."""
    x = (randn(*shape) * 3 + 1000).to(dtype)
    fn = lambda x: torch.var(x, dims, correction=correction, keepdim=keepdim) * 2
    kernels = klc.plan_kernels(fn, (x,))
    assert [k.name for k in kernels] == ["kl_fused_var_mul"], [k.name for k in kernels]
    got = klc.compile(fn)(x)
    exact = fn(x.double())
    eager_err = (fn(x).double() - exact).abs().max() / exact.abs().max()
    assert got.dtype == dtype and got.shape == exact.shape
    tolerance = {torch.float64: 1e-12, torch.float32: 2e-5, torch.float16: 2e-5}[dtype]
    assert (got.double() - exact).abs().max() / exact.abs().max() <= max(4 * eager_err, tolerance)


def test_a_float64_column_sum_split_across_programs_keeps_float64s_digits():
    """Row splits publish their partial sums in a workspace of the reduction's type: float32
    partials rounded float64 sums to float32's 7 digits (1e-8 off; 1e-16 now)."""
    x = randn(300, 5).double() + 1 / 3
    got = klc.compile(lambda x: x.sum(0))(x)
    assert got.dtype == torch.float64
    assert ((got - x.sum(0)).abs() / x.sum(0).abs()).max() < 1e-13


def test_a_variance_with_no_degrees_of_freedom_is_nan_or_inf_as_eagers():
    """M2 / max(N - correction, 0): 0 / 0 is NaN (one row), M2 / 0 infinite, as ATen's."""
    for x, correction in ((randn(1, 4), 1), (randn(2, 4), 3)):
        torch._dynamo.reset()  # (a second correction would recompile it as a symbolic value: ATen's)
        got = klc.compile(lambda x: torch.var(x, 0, correction=correction))(x)
        want = torch.var(x, 0, correction=correction)
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
        assert got.isnan().any() or got.isinf().any()


@pytest.mark.parametrize("target, dtype, why", [
    (torch.ops.aten.amax.default, torch.float32, "amax over the leading dims is not generated (sums, means and variances are)"),
    (torch.ops.aten.sum.dim_IntList, torch.int64, "an integer sum over the leading dims is not generated"),
])
def test_refusals_give_reasons(target, dtype, why):
    g = torch.fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(8, 4, dtype=dtype)
    node = g.call_function(target, (x, [0]))
    node.meta["val"] = torch.empty(4, dtype=dtype)
    assert fusion.classify(node) == ("eager", why)


def _backward_partition(fn, args):
    """The partition of ``fn``'s backward graph, as planned for the kernelab backend."""
    captured = []

    def backend(gm, example_inputs):
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd

        from kernelab.compiler.backend import decompositions

        def bw(g, _):
            captured.append(graph.partition(g))
            return make_boxed_func(g.forward)
        return aot_autograd(fw_compiler=lambda g, _: make_boxed_func(g.forward), bw_compiler=bw,
                            decompositions=decompositions())(gm, example_inputs)

    torch._dynamo.reset()
    torch.compile(fn, backend=backend)(*args).sum().backward()
    (part,) = captured
    return part


def test_prologue_shared_with_another_kernel_is_copied():
    """Layer norm's backward: x-hat feeds the row kernel (dx) and the weight gradient, so the
    column kernel recomputes it from its own copy; nothing full-size is written between them."""
    x, w, b = (randn(16, 40) + 1).requires_grad_(), randn(40).requires_grad_(), randn(40).requires_grad_()
    part = _backward_partition(layer_norm, (x, w, b))
    kinds = sorted(g.kind for g in part.groups)
    assert kinds == ["column", "reduction"], [(g.kind, g.name) for g in part.groups]
    column = next(g for g in part.groups if g.kind == "column")
    assert all(column.roles[n] == "col" for n in column.outputs)


def ln_linear_gelu(x, g, w, b):
    return F.gelu(F.linear(F.layer_norm(x, (x.shape[-1],), g), w, b))


def test_column_sums_linked_through_a_matmul_get_separate_kernels():
    """The bias gradient's chain (GELU's backward) feeds a matmul whose result feeds the layer
    norm's weight gradient: both are column sums of one shape, yet one kernel for both would be a
    cycle. The backward plans them as two kernels and computes the right values."""
    _check(ln_linear_gelu, [randn(6, 8), 1 + randn(8, seed=1) * 0.1, randn(8, 8, seed=2) * 0.3, randn(8, seed=3)])


def test_dynamic_rows():
    """One compiled graph (dynamic=True) serves every row count; the launch cache picks splits."""
    def fn(x, w):
        return (x * w).sum(0) * 2, F.layer_norm(x, (x.shape[-1],), w)

    f = klc.compile(fn, dynamic=True)
    for rows in (5, 37, 300):
        x, w = randn(rows, 24, seed=rows).requires_grad_(), randn(24, seed=1).requires_grad_()
        outs = f(x, w)
        refs = fn(x, w)
        for o, r in zip(outs, refs):
            assert_close(o, r.detach())
        grads = torch.autograd.grad(outs[0].sum() + outs[1].sum(), (x, w))
        ref_grads = torch.autograd.grad(refs[0].sum() + refs[1].sum(), (x, w))
        for g, r in zip(grads, ref_grads):
            assert_close(g, r)


def test_counters_are_kept_per_stream(monkeypatch):
    """Launches on one stream run in order and can share a counter set; two streams get two."""
    from kernelab.compiler.templates import base

    call = base.Call(kernel=None, grid=(1, 2), tail=[], meta={}, outs=[], device=torch.device("cpu"),
                workspace=8, col_blocks=3)
    work, first = call.scratch()
    assert work.shape == (8,) and work.dtype == torch.float32 and first.tolist() == [0, 0, 0]
    assert call.scratch()[1] is first  # the same stream: the same counters
    monkeypatch.setattr(base, "current_stream", lambda device: 7)
    other = call.scratch()[1]
    assert other is not first and other.tolist() == [0, 0, 0]
    assert sorted(call.counters) == [0, 7]


def two_layer_norms(x1, w1, b1, x2, w2, b2):
    """Each norm's dy is computed from its own output: the two weight gradients share no tensor."""
    return torch.stack([layer_norm(x1, w1, b1).sin().sum(), layer_norm(x2, w2, b2).cos().sum()])


def test_column_sums_that_share_no_input_get_kernels_of_their_own():
    """Two layer norms whose gradients arrive separately: each norm's weight and bias sums share
    dy and one kernel; the two norms do not share one (GPT-2's 25 norms in one kernel ran at 6 GB/s
    on the H200). The values are checked too."""
    args = [randn(32, 24) + 1, 1 + randn(24, seed=1) * 0.1, randn(24, seed=2),
            randn(32, 24, seed=3), 1 + randn(24, seed=4) * 0.1, randn(24, seed=5)]
    leaves = [a.clone().requires_grad_() for a in args]
    columns = [g for g in _backward_partition(two_layer_norms, leaves).groups if g.kind == "column"]
    sums = sorted(sum(1 for n in g.nodes if fusion.is_column_reduction(n)) for g in columns)
    assert sums == [2, 2], [(g.name, [n.name for n in g.nodes]) for g in columns]
    _check(two_layer_norms, args)


def unrelated_sums(a, b, c, d, e, f):
    """``s`` reads six full-size tensors: too many for a private prologue, so its column sum reads
    ``s`` from memory; ``a.sum(0)`` shares no tensor with that sum."""
    s = a * b + c * d + e * f
    return s.sum(0) + a.sum(0) * 3


def test_sums_sharing_only_a_refused_prologue_get_separate_kernels():
    """A column sum whose prologue is refused (too many inputs) reads its one input: it is
    clustered by that alone. Counting the refused chain's tensors as its reads put nine unrelated
    bias and layer-norm gradients of BERT into one kernel (3 ms on the H200)."""
    args = [randn(64, 24, seed=i) for i in range(6)]
    _check(unrelated_sums, args)
    columns = [g for g in klc.explain(unrelated_sums, *args).graphs[0].groups if g.kind == "column"]
    assert len(columns) == 2, [(g.name, g.ops) for g in columns]
