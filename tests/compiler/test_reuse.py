"""Outputs stored over an input at its last use (``GroupRunner.reuse``): a backward's donated saved
activations (the logits under the cross-entropy's gradient) and the graph's own values. Results
against eager wherever memory was taken, and the cases where it must not be: memory another live
tensor shares, the caller's tensors, a second backward over a retained graph, a looped row kernel
that reads the row again after storing."""
import pytest
import torch
import torch.nn.functional as F

import kernelab.compiler as klc
from kernelab.compiler import runtime
from tests.compiler.conftest import assert_close


def _r(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _grads(fn, args, backward_kwargs=None, times=1):
    """fn's output and the gradients of its floating inputs after ``times`` backward calls."""
    leaves = [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]
    out = fn(*leaves)
    for i in range(times):
        out.backward(**(backward_kwargs or {}))
    return out.detach(), [a.grad for a in leaves if a.is_floating_point()]


def _compare(fn, args, **kw):
    want = _grads(fn, args, **kw)
    have = _grads(torch.compile(fn, backend="kernelab"), args, **kw)
    assert_close(have[0], want[0], what="output")
    for a, b in zip(have[1], want[1]):
        assert_close(a, b, what="gradient")


def _lm_loss(x, w, t):
    """An LM head's loss as Hugging Face computes it: bf16/fp32 logits, upcast, cross-entropy."""
    return F.cross_entropy((x @ w).float(), t)


def test_cross_entropy_gradient_stored_over_the_saved_logits():
    """The logits are saved for the backward and read last by the kernel writing their gradient
    (a looped row kernel here: 5000 classes is past the interpreter's one-block rows): that kernel
    stores the gradient over them (Llama's 2 GB of logits at 4x2048 tokens), and it is eager's."""
    args = (_r(8, 16), _r(16, 5000, seed=1), torch.randint(0, 5000, (8,), generator=torch.Generator().manual_seed(2)))
    klc.reset_events()
    _compare(_lm_loss, args)
    reused = klc.events().reused
    assert [k for k in reused if "sum" in k], f"the gradient kernel stored nothing over the logits: {reused}"


def test_memory_another_live_tensor_shares_is_never_taken():
    """RoPE's pattern: the kernel reads x whole and two slices of x (views, alive until the kernel
    ran): the plan may list x, but the storage's use count refuses it at run time."""
    def f(a, b):
        x = a @ b
        rotated = torch.cat([-x[..., 4:], x[..., :4]], dim=-1)
        return x * 0.5 + rotated

    a, b = _r(6, 8), _r(8, 8, seed=1)
    klc.reset_events()
    got = torch.compile(f, backend="kernelab")(a, b)
    assert_close(got, f(a, b), what="output")
    assert not [k for k in klc.events().reused if "cat" in k], klc.events().reused


def test_memory_a_later_view_reads_is_never_taken():
    """amax is saved for the backward as ``alias(amax)``, which the runner makes from amax only
    where it is needed, after the kernel adding amax to a mean read amax for the last time: at
    that kernel nothing else held amax's memory, and the add was stored over the saved maxima
    (every gradient NaN; found by ``test_held_out_programs.py::amax_multi``). The plan now counts
    the uses of every value sharing the memory."""
    def f(x):
        return (x.amax(dim=(0, 2)) + x.sum(dim=(0, 1)).mean()).sin().sum()

    _compare(f, (_r(4, 5, 6),))


def test_the_callers_tensors_are_never_written():
    """A graph input at its last use belongs to the caller: never an output's memory."""
    def f(x):
        return (x * 2).sin()

    x = _r(64, 33)
    before = x.clone()
    klc.reset_events()
    got = torch.compile(f, backend="kernelab")(x)
    assert torch.equal(x, before)
    assert_close(got, f(before), what="output")
    assert not klc.events().reused


def test_intermediates_take_the_memory_of_values_they_outlive():
    """A value the graph computed (a matmul's output) read last by a kernel of its shape: the
    kernel stores over it; the result is eager's."""
    def f(a, b):
        return torch.tanh(a @ b) * 3.0 + 1.0

    a, b = _r(32, 16), _r(16, 24, seed=1)
    klc.reset_events()
    got = torch.compile(f, backend="kernelab")(a, b)
    assert_close(got, f(a, b), what="output")
    assert klc.events().reused, "the matmul's output was not reused: the test checks nothing"


def test_a_retained_graph_backs_twice_with_the_same_gradients():
    """retain_graph=True keeps the saved tensors for a second backward: aot_autograd then donates
    none, and a saved tensor the graph still holds is refused by its use count anyway."""
    args = (_r(8, 16), _r(16, 300, seed=1), torch.randint(0, 300, (8,), generator=torch.Generator().manual_seed(2)))
    _compare(_lm_loss, args, backward_kwargs={"retain_graph": True}, times=2)


def test_saved_tensor_hooks_that_hand_back_the_same_tensor():
    """Identity pack/unpack hooks: the saved logits come back as the tensor saved; the gradient is
    still eager's (the hook's own reference is gone when the backward runs)."""
    args = (_r(8, 16), _r(16, 5000, seed=1), torch.randint(0, 5000, (8,), generator=torch.Generator().manual_seed(2)))
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        _compare(_lm_loss, args)


def test_a_row_kernel_reading_its_row_after_storing_reuses_nothing():
    """y = x - max(x) is stored in the pass after the max; the variance of y needs two more passes
    over the row: storing y over x would feed the last pass y instead of x. 6000 columns loop
    under the interpreter."""
    from kernelab.compiler.templates import rows_looped

    def f(a, b):
        x = a @ b  # the graph's own value: its memory could be taken
        y = x - x.amax(-1, keepdim=True)
        return y, y.var(-1)

    a, b = _r(4, 8), _r(8, 6000, seed=1)
    got = torch.compile(f, backend="kernelab")(a, b)
    want = f(a, b)
    for g, w in zip(got, want):
        assert_close(g, w, what="output")
    from torch.fx.experimental.proxy_tensor import make_fx
    from kernelab.compiler import graph

    part = graph.partition(make_fx(f)(a, b))
    reductions = [g for g in part.groups if g.kind == "reduction"]
    assert reductions and not any(rows_looped.stores_in_the_last_pass(g) for g in reductions), \
        [g.name for g in reductions]


def test_without_donated_buffers_no_saved_tensor_is_taken(monkeypatch):
    """``torch._functorch.config.donated_buffer = False``: the backward gets no donated inputs."""
    from torch._functorch import config as functorch_config

    from kernelab.compiler.backend import _donated_inputs

    seen = []

    def spy(*args, **kwargs):
        seen.append(_donated_inputs())
        return original(*args, **kwargs)

    from kernelab.compiler import backend

    original = backend.compile_graph
    monkeypatch.setattr(backend, "compile_graph", spy)
    args = (_r(8, 16), _r(16, 300, seed=1), torch.randint(0, 300, (8,), generator=torch.Generator().manual_seed(2)))
    _compare(_lm_loss, args)
    assert any(seen), "no graph was given donated inputs: the test checks nothing"
    torch._dynamo.reset()
    seen.clear()
    with functorch_config.patch(donated_buffer=False):  # (monkeypatch would delete the setting after)
        _compare(_lm_loss, args)
    assert seen and not any(seen)


@pytest.mark.parametrize("op, returns_argument", [
    (torch.ops.aten.add_.Tensor, True), (torch.ops.aten.copy_.default, True),
    (torch.ops.aten.lift_fresh.default, True), (torch.ops.aten.add.Tensor, False),
    (torch.ops.aten.view.default, False), (len, True)])
def test_ops_that_may_return_an_argument_own_no_memory(op, returns_argument):
    import torch.fx as fx

    g = fx.Graph()
    node = g.call_function(op, ())
    assert runtime._returns_an_argument(node) is returns_argument
