"""Training batch norm generated on channels-last activations (the layout ``conv_layout.py`` gives
convolution graphs by default): each norm's statistics are one column kernel over the tensor as
memory holds it, (N * H * W) rows of C columns (``rewrites.batch_norm_statistics_as_columns``),
with the running statistics stored by its per-column epilogue; the backward's per-channel sums
likewise, with the ReLU's backward as their prologue (``rewrites.innermost_kept_sums_as_columns``).
Outputs, gradients and buffers against eager; the plans' kernels; the variance's digits (whole
models: ``test_batch_norm.py::test_models_with_batch_norms_generated``)."""
import copy

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernelab.compiler as klc
from tests.compiler.conftest import assert_close, rel_norm
from tests.compiler.test_batch_norm import _compare, _conv_bn_relu, _r

SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(autouse=True)
def _generated_norms_channels_last(monkeypatch):
    monkeypatch.setenv("KERNELAB_CONV_LAYOUT", "channels_last")
    monkeypatch.setenv("KERNELAB_BN_FORWARD", "generated")
    monkeypatch.setenv("KERNELAB_STRICT", "1")


class _Block(torch.nn.Module):
    """A residual block as ResNet's: conv-bn-relu, conv-bn, a 1x1 conv-bn shortcut, add, ReLU."""

    def __init__(self, c_in, c):
        super().__init__()
        self.body = torch.nn.Sequential(_conv_bn_relu(c_in, c), torch.nn.Conv2d(c, c, 3, padding=1, bias=False),
                                        torch.nn.BatchNorm2d(c))
        self.short = torch.nn.Sequential(torch.nn.Conv2d(c_in, c, 1, bias=False), torch.nn.BatchNorm2d(c))

    def forward(self, x):
        return torch.relu(self.body(x) + self.short(x))


def _conv_bn(c_in, c, k, **norm):
    """A bias-free convolution (a bias before a norm has a gradient of zero in exact arithmetic:
    noise on every side) and a norm."""
    return torch.nn.Sequential(torch.nn.Conv2d(c_in, c, k, bias=False), torch.nn.BatchNorm2d(c, **norm))


CASES = {
    "conv-bn-relu": (lambda: _conv_bn_relu(3, 8), (4, 3, 10, 9)),
    "residual block": (lambda: _Block(3, 6), (2, 3, 7, 7)),
    "batch of one": (lambda: _conv_bn(2, 5, 1), (1, 2, 8, 8)),
    "no affine": (lambda: _conv_bn(3, 4, 3, affine=False), (3, 3, 8, 8)),
    "momentum None": (lambda: _conv_bn(3, 4, 3, momentum=None), (3, 3, 8, 8)),
    "1x1 spatial": (lambda: _conv_bn(3, 4, 1), (8, 3, 1, 1)),
    "many channels": (lambda: _conv_bn_relu(3, 160), (2, 3, 5, 5)),
}


@pytest.mark.parametrize("backward", ["aten", "generated"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_channels_last_norms_match_eager(monkeypatch, case, backward):
    monkeypatch.setenv("KERNELAB_BN_BACKWARD", backward)
    make, shape = CASES[case]
    torch.manual_seed(0)
    _compare(make(), _r(*shape))


def test_float16_norm_as_close_to_float32_as_eagers():
    """A float16 model: the statistics of the float32 cast, the cast recomputed in the column
    kernel. Each gradient at most as far from the float32 model's as eager float16's (+ slack)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(_conv_bn_relu(3, 8), torch.nn.Conv2d(8, 4, 1))
    x = _r(2, 3, 8, 8) + 2

    def grads(model, inp, run=None):
        y = (run or model)(inp)
        (y.float() * torch.linspace(-1, 1, y.numel()).view(y.shape)).sum().backward()
        return {n: p.grad.float() for n, p in model.named_parameters()}

    want = grads(copy.deepcopy(net), x)
    eager = grads(copy.deepcopy(net).half(), x.half())
    torch._dynamo.reset()
    half = copy.deepcopy(net).half()
    have = grads(half, x.half(), torch.compile(half, backend="kernelab"))
    for name in want:
        assert rel_norm(have[name], want[name]) <= rel_norm(eager[name], want[name]) + 2e-3, name


def _plan(net, shape):
    x, g = _r(*shape), _r(*net(_r(*shape)).shape, seed=1)

    def step(x, g):
        net(x).backward(g)

    return klc.explain(step, x, g)


@pytest.mark.parametrize("backward", ["aten", "generated"])
def test_a_norm_is_one_column_kernel_and_its_transform(monkeypatch, backward):
    """Forward: per norm one column kernel (the statistics, the running statistics stored in place)
    and the transform fused with the ReLU; no ATen norm, no row kernel. Backward generated: per
    norm one column kernel (both per-channel sums, the ReLU's backward recomputed in it) and the
    input gradient's kernel; no ATen reduction."""
    monkeypatch.setenv("KERNELAB_BN_BACKWARD", backward)
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = torch.nn.Sequential(_conv_bn_relu(3, 8), _conv_bn_relu(8, 8))
    forward, backward_graph = _plan(net, (2, 3, 8, 8)).graphs
    assert not [op for _, op, _ in forward.eager if "batch_norm" in op or "copy_" in op], forward.eager
    assert len(forward.stored) == 4, forward.stored  # running mean and variance of both norms
    kinds = sorted(g.kind for g in forward.groups if g.name != "kl_fused_copy")  # (the input's layout)
    assert kinds == ["column"] * 2 + ["pointwise"] * 2, [(g.name, g.kind) for g in forward.groups]
    if backward == "generated":
        left = [op for _, op, _ in backward_graph.eager if "sum" in op or "batch_norm" in op]
        assert not left, backward_graph.eager
        columns = [g for g in backward_graph.groups if g.kind == "column"]
        # the second norm's sums read the incoming gradient, the first's the ReLU's backward too
        assert len(columns) == 2, [(g.name, g.kind) for g in backward_graph.groups]
    _compare(net, _r(2, 3, 8, 8))


class _Bottleneck(torch.nn.Module):
    """ResNet's bottleneck with an identity shortcut: 1x1, 3x3, 1x1 convolutions and their norms."""

    def __init__(self, c, mid):
        super().__init__()
        def conv_bn(c_in, c_out, k):
            return [torch.nn.Conv2d(c_in, c_out, k, padding=k // 2, bias=False), torch.nn.BatchNorm2d(c_out)]

        self.body = torch.nn.Sequential(*conv_bn(c, mid, 1), torch.nn.ReLU(), *conv_bn(mid, mid, 3), torch.nn.ReLU(),
                                        *conv_bn(mid, c, 1))

    def forward(self, x):
        return torch.relu(self.body(x) + x)


def _written_only_for_columns(plan) -> list:
    """(writer, column kernel) pairs: a generated kernel writes a full-size tensor that only
    column kernels read before it is overwritten (a copy made for the sums alone)."""
    columns = {g.name for graph in plan.graphs for g in graph.groups if g.kind == "column"}
    kernels = plan.kernels
    full = max(t.numel for k in kernels for t in k.reads)
    pairs = []
    for i, k in enumerate(kernels):
        for t in (t for t in k.reads if k.name in columns and 2 * t.numel >= full):
            writer = next((j for j in range(i - 1, -1, -1) if any(w.storage == t.storage for w in kernels[j].writes)),
                          None)
            if writer is None or not kernels[writer].name.startswith("kl_fused_"):
                continue
            readers = []
            for later in kernels[writer + 1:]:
                readers += [later.name] if any(r.storage == t.storage for r in later.reads) else []
                if any(w.storage == t.storage for w in later.writes):
                    break
            if all(name in columns for name in readers):
                pairs.append((kernels[writer].name, k.name))
    return pairs


def test_a_stages_norm_sums_read_its_stored_gradients(monkeypatch):
    """Three bottlenecks in a row: each block's output gradient is ``where(mask, 0, g + h)`` with
    ``g`` the next block's, so recomputing it for the norm's sums would reach back through every
    block (past four tensors the sums then read a copy written just for them: three such copies
    here before ``rewrites._recomputed_for_columns``). The gradients a convolution's backward
    comes after are stored anyway, and the sums read them."""
    monkeypatch.setenv("KERNELAB_BN_BACKWARD", "generated")
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), *[_Bottleneck(8, 4) for _ in range(3)])
    plan = _plan(net, (2, 3, 6, 6))
    assert not [op for graph in plan.graphs for _, op, _ in graph.eager if "batch_norm" in op or "sum" in op]
    assert _written_only_for_columns(plan) == []
    _compare(net, _r(2, 3, 6, 6))


def test_statistics_keep_their_digits_at_a_large_mean():
    """Values at 1000 +- 1, channels-last: the column kernel's Welford variance keeps the digits
    where E[x^2] - mean^2 in float32 loses them all."""
    torch._dynamo.reset()
    x = (1000 + _r(5, 6, 7, 9)).contiguous(memory_format=torch.channels_last)
    naive = (x.square().mean((0, 2, 3)) - x.mean((0, 2, 3)).square())
    exact = x.double().var((0, 2, 3), unbiased=False)
    assert ((naive.double() - exact).abs() / exact).max() > 1e-2  # the case is hard for sums of squares

    bn64, bn = torch.nn.BatchNorm2d(6).double(), torch.nn.BatchNorm2d(6)
    bn64(x.double())
    torch.compile(bn, backend="kernelab")(x)
    assert ((bn.running_var.double() - bn64.running_var).abs() / bn64.running_var).max() < 1e-5
    assert ((bn.running_mean.double() - bn64.running_mean).abs() / bn64.running_mean).max() < 1e-6


def test_a_sparse_channel_whose_first_value_is_an_outlier_keeps_its_digits():
    """A ReLU-like channel, almost every value 0, whose first value x[0, c, 0, 0] is one of its few
    nonzeros, behind a 1x1 convolution (which makes the activation channels-last: the column
    statistics). Stops 37-38 shifted the one-pass sums by that first value: the output came out
    4.9e-4 off float64 at these 8192 values a channel (1e-3 at 32768), eager's 5e-8. The Welford variance (``columns.py``) is as close as eager."""
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(2, 8, 64, 64, generator=g, dtype=torch.float64) - 3).clamp_min(0)
    x[0, :, 0, 0] = 3.0
    weight = torch.randn(2, 8, 64, 64, generator=g, dtype=torch.float64)
    model = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 1), torch.nn.BatchNorm2d(8)).train()
    with torch.no_grad():
        model[0].weight.copy_(torch.eye(8).view(8, 8, 1, 1))
        model[0].bias.zero_()

    def step(m, dtype, compiled=False):
        xi = x.to(dtype).detach().requires_grad_(True)
        y = (torch.compile(m, backend="kernelab") if compiled else m)(xi)
        (y * weight.to(dtype)).sum().backward()
        return y.detach(), xi.grad, m[1].weight.grad, m[1].running_mean

    exact = step(copy.deepcopy(model).double(), torch.float64)
    got = step(copy.deepcopy(model), torch.float32, compiled=True)
    for name, a, b in zip(("output", "input gradient", "weight gradient", "running mean"), got, exact):
        assert rel_norm(a.double(), b) < 2e-6, name


def test_sums_over_all_but_the_channels_are_column_kernels():
    """Outside batch norm: ``(a * b).sum((0, 2, 3))`` and a mean with ``keepdim`` of
    channels-last tensors (a conv bias's gradient is such a sum): column reductions, both in one
    kernel (they walk the same rows)."""
    torch._dynamo.reset()
    a = _r(2, 5, 6, 7).contiguous(memory_format=torch.channels_last)
    b = _r(2, 5, 6, 7, seed=1).contiguous(memory_format=torch.channels_last)

    def f(a, b):
        return (a * b).sum((0, 2, 3)), torch.relu(a).mean((0, 2, 3), keepdim=True)

    got = torch.compile(f, backend="kernelab")(a, b)
    for x, y in zip(got, f(a, b)):
        assert_close(x, y, what="per-channel sum")
    groups = klc.explain(f, a, b).graphs[0].groups
    assert [g.kind for g in groups] == ["column"], [(g.name, g.kind) for g in groups]


def _innermost(shape, kept, seed):
    """A tensor of ``shape`` whose dim ``kept`` is the innermost in memory (a channels-last-like
    layout of any rank), the other dims in order."""
    order = [d for d in range(len(shape)) if d != kept] + [kept]
    dense = torch.randn([shape[d] for d in order], generator=torch.Generator().manual_seed(seed))
    return dense.permute([order.index(d) for d in range(len(shape))])


@SETTINGS
@given(shape=st.lists(st.integers(1, 5), min_size=3, max_size=5), data=st.data(),
       keepdim=st.booleans(), mean=st.booleans(), chain=st.booleans())
def test_sums_over_every_dim_but_the_innermost_match_eager(shape, data, keepdim, mean, chain):
    """``innermost_kept_sums_as_columns`` on random ranks, kept dims and layouts: a sum or mean
    over every dim but one of a tensor whose kept dim is innermost, plain or through a pointwise
    chain of two such tensors and a broadcast one; values, shape and dtype as eager's."""
    kept = data.draw(st.integers(0, len(shape) - 1), "kept dim")
    a, b = _innermost(shape, kept, 1), _innermost(shape, kept, 2)
    scale = torch.randn([s if d == kept else 1 for d, s in enumerate(shape)], generator=torch.Generator().manual_seed(3))
    dims = [d for d in range(len(shape)) if d != kept]

    def fn(a, b, scale):
        x = torch.relu(a * scale - b) if chain else a
        return x.mean(dims, keepdim=keepdim) if mean else x.sum(dims, keepdim=keepdim)

    torch._dynamo.reset()
    got, want = torch.compile(fn, backend="kernelab")(a, b, scale), fn(a, b, scale)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert_close(got, want, what="per-channel reduction")


@SETTINGS
@given(n=st.integers(1, 4), c=st.integers(1, 6), h=st.integers(1, 5), w=st.integers(1, 5),
       offset=st.sampled_from([0.0, 100.0]), layout=st.sampled_from(["channels_last", "contiguous", "transposed"]))
def test_a_norm_on_any_layout_matches_eager(n, c, h, w, offset, layout):
    """A training batch norm's forward (generated) on a random shape in either layout and one no
    rewrite reads as rows or columns (H and W transposed): output and running statistics no
    further from float64's than eager's are (twice, plus float32's resolution at the input's
    scale: eager on the CPU accumulates in float64, the generated kernels in float32)."""
    x = torch.randn(n, c, h, w, generator=torch.Generator().manual_seed(c)) + offset
    x = {"channels_last": x.contiguous(memory_format=torch.channels_last), "contiguous": x,
         "transposed": x.transpose(2, 3).contiguous().transpose(2, 3)}[layout]
    if n * h * w == 1:
        return  # (a norm of one value per channel raises in eager and compiled alike)
    bn, ref, exact = torch.nn.BatchNorm2d(c), torch.nn.BatchNorm2d(c), torch.nn.BatchNorm2d(c).double()
    torch._dynamo.reset()
    with torch.no_grad():
        got, want, truth = torch.compile(bn, backend="kernelab")(x), ref(x), exact(x.double())
    assert got.shape == want.shape  # (strides: equal where a dim has more than one element)
    assert [st for st, size in zip(got.stride(), got.shape) if size > 1] == \
        [st for st, size in zip(want.stride(), want.shape) if size > 1]
    # float32 holds a value at 100 to 2^-24 * 100 ~ 6e-6: the mean, and x - mean, carry that much,
    # over each channel's standard deviation once normalized
    std = (x.double().var((0, 2, 3), unbiased=False) + bn.eps).sqrt().min().item()
    resolution = 4 * 2 ** -24 * x.abs().max().item() / std
    for what, a, e, t in [("output", got, want, truth), ("running mean", bn.running_mean, ref.running_mean,
                                                          exact.running_mean),
                          ("running variance", bn.running_var, ref.running_var, exact.running_var)]:
        error, eager_error = (a.double() - t).abs().max().item(), (e.double() - t).abs().max().item()
        assert error <= 2 * eager_error + 1e-6 * max(1.0, t.abs().max().item()) + resolution, \
            (what, error, eager_error)


def test_an_operand_of_two_sums_keeping_different_dims():
    """One tensor read by two per-dim sums whose kept dims differ (each innermost in its own
    chain): the permuted operands were shared by node alone, so the second sum read the first's
    permutation of ``w`` (46.7 off, silently: square shapes let it through). Both as eager's."""
    base = _r(16, 16, 16)
    w = _r(16, 16, 16, seed=1)

    def f(base, w):
        p, q = base.permute(0, 2, 1), base.permute(2, 0, 1)  # dim 1 innermost; dim 0 innermost
        return (p * w).sum((0, 2)), (q * w).sum((1, 2))

    torch._dynamo.reset()
    for got, want in zip(torch.compile(f, backend="kernelab")(base, w), f(base, w)):
        assert_close(got, want, what="per-dim sum")
