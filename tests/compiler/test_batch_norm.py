"""Training batch norm generated (``KERNELAB_BN_FORWARD=generated``, the default on CUDA), its statistics
as a row and a column kernel (``rewrites.batch_norm_statistics_as_rows_then_columns``), and
copies into graph inputs stored by the kernels that compute them (``graph.absorb_copies``):
outputs, gradients, running statistics and ``num_batches_tracked`` against eager. Convolutions keep
the layouts the program makes here (``KERNELAB_CONV_LAYOUT=traced``): NCHW activations, whose
statistics are rows; channels-last ones, whose statistics are columns, are
``tests/compiler/test_batch_norm_channels_last.py``'s."""
import copy

import pytest
import torch

import kernelab.compiler as klc
from tests.compiler.conftest import assert_close


@pytest.fixture(autouse=True)
def _nchw_convolutions(monkeypatch):
    monkeypatch.setenv("KERNELAB_CONV_LAYOUT", "traced")


def _r(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _steps(model, x, n=2):
    """``n`` training steps' outputs, input gradients, parameter gradients and final buffers."""
    out = []
    for _ in range(n):
        model.zero_grad(set_to_none=True)
        xx = x.detach().clone().requires_grad_()
        y = model(xx)
        (y.float() * torch.linspace(-1, 1, y.numel()).view(y.shape)).sum().backward()
        out.append((y.detach(), xx.grad, [p.grad for p in model.parameters()]))
    return out, [b.clone() for b in model.buffers()]


def _compare(model, x, dtype=torch.float32):
    torch._dynamo.reset()
    ref, got = copy.deepcopy(model), copy.deepcopy(model)
    want, want_buffers = _steps(ref, x)
    have, have_buffers = _steps(torch.compile(got, backend="kernelab"), x)
    kw = {"dtype": dtype}
    for (y, gx, gp), (y0, gx0, gp0) in zip(have, want):
        assert_close(y, y0, what="output", **kw)
        assert_close(gx, gx0, what="input gradient", **kw)
        for a, b in zip(gp, gp0):
            assert_close(a, b, what="parameter gradient", **kw)
    for a, b in zip(have_buffers, want_buffers):
        if a.is_floating_point():
            assert_close(a, b, what="running statistic", **kw)
        else:
            assert torch.equal(a, b), (a, b)  # num_batches_tracked


def _conv_bn_relu(c_in, c):
    return torch.nn.Sequential(torch.nn.Conv2d(c_in, c, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c),
                               torch.nn.ReLU())


CASES = {
    "conv-bn-relu": (lambda: _conv_bn_relu(3, 8), (4, 3, 10, 9)),
    "batch of one": (lambda: torch.nn.BatchNorm2d(3), (1, 3, 5, 5)),
    "1d over (N, C, L)": (lambda: torch.nn.BatchNorm1d(5), (6, 5, 33)),
    "3d": (lambda: torch.nn.BatchNorm3d(4), (2, 4, 3, 5, 6)),
    "no affine": (lambda: torch.nn.BatchNorm2d(4, affine=False), (3, 4, 6, 6)),
    "1x1 spatial": (lambda: torch.nn.BatchNorm2d(4), (8, 4, 1, 1)),
    "1d over (N, C)": (lambda: torch.nn.BatchNorm1d(7), (9, 7)),
    # (found by the random programs on an H100: the backward's sum beside the variance came before
    # it, and the restated sum, put before the variance, after the sum's readers)
    "(N, C, 1) without running statistics": (lambda: torch.nn.BatchNorm1d(5, track_running_stats=False), (2, 5, 1)),
    "1x1 spatial without running statistics": (
        lambda: torch.nn.BatchNorm2d(4, affine=False, track_running_stats=False), (8, 4, 1, 1)),
}


@pytest.mark.parametrize("backward", ["aten", "generated"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_generated_batch_norm_forward_matches_eager(monkeypatch, case, backward):
    monkeypatch.setenv("KERNELAB_BN_FORWARD", "generated")
    monkeypatch.setenv("KERNELAB_BN_BACKWARD", backward)
    make, shape = CASES[case]
    torch.manual_seed(0)
    _compare(make(), _r(*shape))


@pytest.mark.parametrize("layout", ["channels_last", "float16", "momentum None", "no running stats"])
def test_generated_batch_norm_forward_other_settings(monkeypatch, layout):
    """Layouts and settings where the statistics rewrite or the in-place stores do not apply as
    planned (a channels-last tensor's statistics are columns, not rows; float16 statistics
    are computed from a float32 copy; a cumulative average reads ``num_batches_tracked`` in the
    graph): still as eager."""
    monkeypatch.setenv("KERNELAB_BN_FORWARD", "generated")
    torch.manual_seed(0)
    x = _r(3, 4, 6, 6)
    bn = torch.nn.BatchNorm2d(4, momentum=None if layout == "momentum None" else 0.1,
                              track_running_stats=layout != "no running stats")
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    if layout == "float16":
        bn, x = bn.half(), x.half()
    _compare(bn, x, dtype=x.dtype)


@pytest.mark.parametrize("backward", ["aten", "generated"])
def test_generated_batch_norm_forward_is_three_kernels_a_norm(monkeypatch, backward):
    """One norm's forward: the statistics' row kernel, the column kernel that finishes them and
    updates the running statistics in place, and the transform with the ReLU; no ATen batch norm,
    no copies of the running statistics, one ``_foreach_add_`` for both norms' counters. ATen's
    backward takes the new running statistics: the graph returns them as copies of the updated
    buffers, one ``_foreach_mul`` for all (``graph._returned_copies``)."""
    monkeypatch.setenv("KERNELAB_BN_FORWARD", "generated")
    monkeypatch.setenv("KERNELAB_BN_BACKWARD", backward)
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = torch.nn.Sequential(_conv_bn_relu(3, 8), _conv_bn_relu(8, 8))
    x, g = _r(2, 3, 8, 8), _r(2, 8, 8, 8, seed=1)

    def step(x, g):
        net(x).backward(g)

    plan = klc.explain(step, x, g)
    forward = plan.graphs[0]
    ops = [op for _, op, _ in forward.eager]
    assert not [op for op in ops if "batch_norm" in op or "copy_" in op], ops
    assert ops.count("aten._foreach_add_.Scalar") == 1, ops
    assert ops.count("aten._foreach_mul.Scalar") == (1 if backward == "aten" else 0), ops
    assert len(forward.stored) == 4, forward.stored  # running mean and variance of both norms
    kinds = [g.kind for g in forward.groups]
    assert sorted(kinds) == ["column"] * 2 + ["pointwise"] * 2 + ["reduction"] * 2, \
        [(group.name, group.kind) for group in forward.groups]


def test_statistics_keep_their_digits_at_a_large_mean(monkeypatch):
    """Values at 1000 +- 1: the variance from sums of squares in float32 (E[x^2] - mean^2) loses
    every digit; the rows' two-pass variances combined around a sample mean keep them. Running
    statistics against a float64 reference, as close as eager float32's."""
    monkeypatch.setenv("KERNELAB_BN_FORWARD", "generated")
    torch._dynamo.reset()
    x = 1000 + _r(5, 6, 7, 9)
    naive = (x.square().mean((0, 2, 3)) - x.mean((0, 2, 3)).square())
    exact = x.double().var((0, 2, 3), unbiased=False)
    assert ((naive.double() - exact).abs() / exact).max() > 1e-2  # the case is hard for sums of squares

    bn64, bn = torch.nn.BatchNorm2d(6).double(), torch.nn.BatchNorm2d(6)
    bn64(x.double())
    compiled = torch.compile(bn, backend="kernelab")
    compiled(x)
    assert ((bn.running_var.double() - bn64.running_var).abs() / bn64.running_var).max() < 1e-5
    assert ((bn.running_mean.double() - bn64.running_mean).abs() / bn64.running_mean).max() < 1e-6


def test_counters_of_several_norms_are_one_foreach_add(monkeypatch):
    """Default settings on the CPU (ATen's batch norm): the norms' ``num_batches_tracked += 1`` are one
    ``_foreach_add_`` (one launch on CUDA instead of one per norm), and count as eager's."""
    monkeypatch.delenv("KERNELAB_BN_FORWARD", raising=False)
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = torch.nn.Sequential(_conv_bn_relu(3, 4), _conv_bn_relu(4, 4), _conv_bn_relu(4, 4))
    x = _r(2, 3, 6, 6)
    plan = klc.explain(lambda x: net(x).sum().backward(), x)
    ops = [op for _, op, _ in plan.graphs[0].eager]
    assert ops.count("aten._foreach_add_.Scalar") == 1 and "aten.add_.Tensor" not in ops, ops
    _compare(net, x)


def _decay(x, buf):
    buf.mul_(0.9).add_(x)
    return x * 2


def _read_then_update(x, buf):
    y = buf.sin() + x
    buf.add_(1)
    return y


def _update_then_read(x, buf):
    buf.add_(x)
    return buf * 3


@pytest.mark.parametrize("fn", [_decay, _read_then_update, _update_then_read])
@pytest.mark.parametrize("transposed", [False, True])
def test_a_kernel_stores_into_a_mutated_input(fn, transposed):
    """``copy_`` of a value into an input that needs no gradient (``keep_inference_input_mutations``):
    the kernel computing the value stores it into the input (its layout permitting; a transposed
    buffer gets a copy after), the input's old values read where they are replaced."""
    torch._dynamo.reset()
    x = _r(6, 4, seed=1)
    buf = _r(4, 6, seed=2).t() if transposed else _r(6, 4, seed=2)
    want_buf = buf.clone()
    want = fn(x, want_buf)
    got_buf = buf.clone()
    if transposed:
        got_buf = buf.t().clone().t()
    got = torch.compile(fn, backend="kernelab")(x, got_buf)
    assert_close(got, want, what="output")
    assert_close(got_buf, want_buf, what="mutated input")
    plan = klc.explain(fn, x, buf.clone())
    assert not [op for gp in plan.graphs for _, op, _ in gp.eager if "copy_" in op], plan
    assert [line for gp in plan.graphs for line in gp.stored], plan


def test_generated_batch_norm_forward_without_gradients(monkeypatch):
    """A norm in training mode under ``no_grad`` (an inference graph that still updates the
    running statistics): output and buffers as eager's."""
    monkeypatch.setenv("KERNELAB_BN_FORWARD", "generated")
    torch._dynamo.reset()
    torch.manual_seed(0)
    net, x = _conv_bn_relu(3, 5), _r(2, 3, 7, 7)
    ref = copy.deepcopy(net)
    compiled = torch.compile(net, backend="kernelab")
    with torch.no_grad():
        for _ in range(2):
            assert_close(compiled(x), ref(x), what="output")
    for a, b in zip(net.buffers(), ref.buffers()):
        assert_close(a, b, what="buffer")


@pytest.mark.parametrize("layout", ["traced", "channels_last"])
@pytest.mark.parametrize("name", ["resnet", "efficientnet_b0"])
def test_models_with_batch_norms_generated(monkeypatch, name, layout):
    """A training step of the zoo's ResNet and timm's EfficientNet-B0 (squeeze-excite, SiLU) with
    the norms' forward and backward generated, on NCHW activations (statistics as rows) and
    channels-last ones (as columns, ``test_batch_norm_channels_last.py``): loss, every parameter's
    gradient and every running statistic against eager, nothing fallen back."""
    from tests.compiler.conftest import REL, gradients_off, rel_norm
    from tests.compiler.test_more_models import MODELS, _inputs, _loss

    monkeypatch.setenv("KERNELAB_CONV_LAYOUT", layout)
    monkeypatch.setenv("KERNELAB_BN_FORWARD", "generated")
    monkeypatch.setenv("KERNELAB_BN_BACKWARD", "generated")
    monkeypatch.setenv("KERNELAB_STRICT", "1")
    torch._dynamo.reset()
    torch.manual_seed(0)
    if name == "resnet":
        from kernelab.zoo import ZOO

        zm = ZOO["resnet"]
        model, inputs = zm.build("tiny")

        def loss_of(m):
            return zm.loss(m, inputs)
    else:
        make, kind = MODELS[name]
        model, inputs = make().train(), _inputs(kind)

        def loss_of(m):
            return _loss(m, inputs, kind)
    ref_model = copy.deepcopy(model)
    ref_loss = loss_of(ref_model)
    ref_loss.backward()
    klc.reset_events()
    loss = loss_of(torch.compile(model, backend="kernelab"))
    loss.backward()
    events = klc.events()
    assert events.fallbacks == [] and events.kernels_launched > 0, str(events)
    assert rel_norm(loss.detach(), ref_loss.detach()) < REL
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    ref = {n: p.grad for n, p in ref_model.named_parameters() if p.grad is not None}
    assert not gradients_off(grads, ref), gradients_off(grads, ref)
    for (n, a), (_, b) in zip(model.named_buffers(), ref_model.named_buffers()):
        if a.is_floating_point():  # (a mean that is 0 in exact arithmetic, after a norm and a
            # bias-free conv, is noise on both sides: absolute slack)
            assert torch.allclose(a, b, rtol=REL, atol=1e-6), (n, (a - b).abs().max())
        else:
            assert torch.equal(a, b), n


class _Ema(torch.nn.Module):
    """A buffer updated in the forward whose new value the output uses (returned through a clone)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("ema", torch.ones(3))

    def forward(self, x):
        self.ema.mul_(0.5).add_(0.5 * x.detach().mean(0))
        return x * self.ema.clone()


@pytest.mark.parametrize("forward", ["aten", "generated"])
@pytest.mark.parametrize("model", ["conv-bn-relu", "linear-bn1d", "ema"])
def test_a_model_called_twice_before_one_backward(monkeypatch, forward, model):
    """Siamese or contrastive encoders, a GAN's discriminator on real then fake data: the same
    norm twice, then one backward. The running statistics the backward's ATen norm takes were
    saved as the buffer itself, which the second call updated in place ("modified by an inplace
    operation"); a buffer's new value stored in place by its kernel likewise (found by a held-out
    sweep). Gradients and buffers against eager."""
    monkeypatch.setenv("KERNELAB_BN_FORWARD", forward)
    torch._dynamo.reset()
    torch.manual_seed(0)
    if model == "conv-bn-relu":
        net, shape = torch.nn.Sequential(_conv_bn_relu(3, 4), torch.nn.Conv2d(4, 2, 1)), (2, 3, 6, 6)
    elif model == "linear-bn1d":
        net = torch.nn.Sequential(torch.nn.Linear(5, 4, bias=False), torch.nn.BatchNorm1d(4), torch.nn.Tanh(),
                                  torch.nn.Linear(4, 3))
        shape = (6, 5)
    else:
        net, shape = _Ema(), (4, 3)
    ref, mine = copy.deepcopy(net), copy.deepcopy(net)
    compiled = torch.compile(mine, backend="kernelab")
    xa, xb = _r(*shape, seed=1), _r(*shape, seed=2) + 1
    results = []
    for f, module in ((compiled, mine), (ref, ref)):
        a, b = xa.clone().requires_grad_(), xb.clone().requires_grad_()
        ya, yb = f(a), f(b)
        w = _r(*ya.shape, seed=3)
        ((ya * w).sum() + (yb * w * w).sum()).backward()
        results.append([a.grad, b.grad] + [p.grad for p in module.parameters()] + list(module.buffers()))
    for got, want in zip(*results):
        assert_close(got, want, what="gradient or buffer")


@pytest.mark.parametrize("backward", ["aten", "generated"])
def test_generated_forward_keeps_atens_backward_formula(monkeypatch, backward):
    """The forward is decomposed in the partitioned forward graph (``rewrites.batch_norm_forwards_
    decomposed``), not before aot_autograd: the backward graph still calls ATen's
    ``native_batch_norm_backward`` (its fused formula, fed the saved mean and 1 / std the
    generated kernels computed), unless KERNELAB_BN_BACKWARD=generated decomposes that too.
    Decomposed before aot_autograd (stop 30), the backward was autograd's derivative of the
    decomposition whatever KERNELAB_BN_BACKWARD said."""
    monkeypatch.setenv("KERNELAB_BN_FORWARD", "generated")
    monkeypatch.setenv("KERNELAB_BN_BACKWARD", backward)
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = _conv_bn_relu(3, 8)
    x, g = _r(2, 3, 8, 8), _r(2, 8, 8, 8, seed=1)

    def step(x, g):
        net(x).backward(g)

    forward, backward_graph = klc.explain(step, x, g).graphs
    assert not [op for _, op, _ in forward.eager if "batch_norm" in op], forward.eager
    kept = [op for _, op, _ in backward_graph.eager if op == "aten.native_batch_norm_backward.default"]
    assert len(kept) == (1 if backward == "aten" else 0), backward_graph.eager
    _compare(net, x)  # and the values: as eager's


# (Removed 2026-12-05, stop 31: a strict xfail asking RegNet-Y-400MF's gradients under the generated
# forward to stay within 10x of eager's distance to float64 at batch 2 x 112 px. That distance is
# decided by ReLU kinks, not by the norm's formula: a single pre-activation within float32 rounding
# of 0 flips between runs and moves the worst gradient by ~3e-3. Measured on the CPU with input
# seeds 0-3, kernelab with ATen's forward: 9.4e-5, 1.8e-2, 1.7e-2, 8.3e-3 from float64; with the
# generated forward 2.2e-2, 2.3e-2, 1.7e-2, 1.3e-2; eager itself 4.9e-5, 1.8e-2, 1.6e-4, 5.3e-5
# (ATen's CPU norm accumulates its statistics in float64); eager with the norm written as float32
# torch ops 1.4e-4, and with that variance perturbed by 1.6e-7 (the generated statistics' measured
# error, ATen's 8e-8) 3.3e-3 or 2.4e-4 depending on the draw. Comparisons against eager on the same
# inputs (test_models_with_batch_norms_generated, the model zoo) are what these tests check.)


def test_atens_backward_gets_a_strided_weight_dense(monkeypatch):
    """PyTorch's CPU ``native_batch_norm_backward`` reads a weight handed as a strided view (every
    other element of a larger tensor) as if it were dense: the input's gradient takes the elements
    between (NaN here, where they are NaN; garbage in eager). Kept whole (the CPU's default), it
    is handed a dense copy (``rewrites.batch_norm_backward_weights_contiguous``): the gradients of
    eager on a dense weight. Found by the random programs of strided inputs."""
    from tests.compiler.random_programs import strided_copy

    monkeypatch.setenv("KERNELAB_BN_BACKWARD", "aten")
    w = strided_copy(_r(8), (2,)).requires_grad_()  # NaN between its elements
    z, dy = _r(3, 5, 1, seed=1).requires_grad_(), _r(3, 5, 1, seed=2)

    def f(z, w):
        return torch.nn.functional.batch_norm(z, None, None, w[:5], None, training=True)

    dense = w.detach().contiguous().requires_grad_()
    want = torch.autograd.grad(f(z, dense), (z, dense), dy)
    got = torch.autograd.grad(torch.compile(f, backend="kernelab")(z, w), (z, w), dy)
    assert_close(got[0], want[0], what="input gradient")
    assert_close(got[1], want[1], what="weight gradient")
