"""The runner specialized after a graph's first call (``GraphRunner._specialize``): each group's one
bound launch and each recorded view chain written into the runner, under a check of the inputs'
layouts and the launch hooks (else the first runner runs the call) and of each launch's input
alignment (else that group takes ``run_values``).

On a GPU the launches are bound to torch's precompiled launcher. Here every group's first launch is
bound to a launcher that runs the kernel in Triton's interpreter (``_Interpreting``), so that the
specialized lines really compute: values are checked against eager over several steps, and against
the first runner where a check sends the call there.
"""
import copy

import pytest
import torch
import torch.nn as nn

from kernelab import launch
from kernelab.compiler import group_runner, runtime
from tests.compiler.conftest import REL, gradients_off, rel_norm


class _Interpreting:
    """A bound launcher (``launch(grid, stream, args)``) that runs the call's kernel in the
    interpreter with the arguments the specialized line passes: every launch counted."""

    def __init__(self, call):
        self.call, self.launches = call, 0

    def launch(self, grid, stream, args):
        self.launches += 1
        self.call.kernel[self.call.grid](*args, **self.call.meta)


@pytest.fixture
def bound(monkeypatch):
    """Every group's first launch runs as usual, then binds an interpreting launcher; yields the
    launchers made."""
    made = []

    def first_launch(self, call, args, varying):
        call.kernel[call.grid](*args, **call.meta)
        launcher = _Interpreting(call)
        made.append(launcher)
        return group_runner.bound_launch(call, varying, launcher)

    monkeypatch.setattr(group_runner.GroupRunner, "first_launch", first_launch)
    return made


class _EntryLauncher(_Interpreting):
    """Like torch's precompiled launcher (``launch.StaticLauncher``): the binary made every integer
    argument of 1 a constant (as Triton does with an innermost stride of 1) and takes one scratch
    placeholder, so the specialized line calls :meth:`entry` with only the runtime arguments; the
    entry puts the constants back and runs the kernel in the interpreter."""

    runtime_tail = launch.StaticLauncher.runtime_tail
    function, num_warps, shared, arg_types, extra = 7, 4, 0, "runtime types", (None,)

    def __init__(self, call, args):
        super().__init__(call)
        self.n_args = len(args)
        self.keep = tuple(i for i, a in enumerate(args) if not (type(a) is int and a == 1))
        self.entries = 0

    def entry(self, function, gx, gy, gz, warps, shared, arg_types, runtime, stream):
        assert (function, warps, shared, arg_types) == (7, 4, 0, "runtime types")
        assert (gx, gy, gz) == tuple(self.call.grid) + (1,) * (3 - len(self.call.grid))
        assert len(runtime) == len(self.keep) + 1 and runtime[-1] is None
        given = dict(zip(self.keep, runtime))
        self.entries += 1
        self.launch(self.call.grid, stream, tuple(given.get(i, 1) for i in range(self.n_args)))


@pytest.fixture
def bound_entries(monkeypatch):
    """Every group's first launch runs as usual, then binds an :class:`_EntryLauncher`."""
    made = []

    def first_launch(self, call, args, varying):
        call.kernel[call.grid](*args, **call.meta)
        launcher = _EntryLauncher(call, args)
        made.append(launcher)
        return group_runner.bound_launch(call, varying, launcher)

    monkeypatch.setattr(group_runner.GroupRunner, "first_launch", first_launch)
    return made


class _Block(nn.Module):
    """A transformer-ish block: norm, product, GELU, residual, a column sum in the backward."""

    def __init__(self, width=48):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x):
        h = self.down(torch.nn.functional.gelu(self.up(self.norm(x))))
        return (x + h).softmax(-1).sum(dim=1)


def _step(model, x):
    model.zero_grad(set_to_none=True)
    out = model(x)
    out.square().mean().backward()
    return out.detach(), [p.grad.detach().clone() for p in model.parameters()]


def _compiled_block():
    """(compiled block, its input, a step of it): the step runs the compiled block and checks
    its output and gradients against the eager block's."""
    torch.manual_seed(0)
    model = _Block()
    compiled = torch.compile(model, backend="kernelab")
    x = torch.randn(3, 5, 48)
    want_out, want_grads = _step(model, x)

    def checked_step():
        out, grads = _step(compiled, x)
        torch.testing.assert_close(out, want_out, rtol=2e-5, atol=2e-6)
        for g, w in zip(grads, want_grads):
            torch.testing.assert_close(g, w, rtol=2e-5, atol=2e-6)
    return checked_step


def test_training_steps_run_the_specialized_lines_and_match_eager(bound, built_runners):
    checked_step = _compiled_block()
    for step in range(3):
        checked_step()
    runners = [r for r in built_runners if r.group_runners]
    assert runners and all(r.fast is not None for r in runners), "no runner specialized"
    assert sum(r.fast_groups for r in runners) == sum(len(r.group_runners) for r in runners)
    # after the first step every launch went through the specialized lines: the interpreting
    # launchers counted the two later steps' launches (the first step launched them itself)
    assert bound and all(launcher.launches == 2 for launcher in bound)


def test_the_specialized_lines_call_the_launchers_entry_with_runtime_arguments_only(bound_entries, built_runners):
    """Where the launcher is torch's precompiled one, a specialized line calls its C++ entry
    directly with the tensors and the runtime part of the cached tail (``runtime_tail``: the
    binary's constants, such as strides of 1, left out once when the line is written, not filtered
    per launch). Values as eager's over three steps; every later launch through the entry."""
    checked_step = _compiled_block()
    for _ in range(3):
        checked_step()
    runners = [r for r in built_runners if r.group_runners]
    assert runners and all(r.fast is not None for r in runners)
    assert all(".launch(" not in r.fast_source for r in runners), "a line went through launch()"
    assert any(len(launcher.keep) < launcher.n_args for launcher in bound_entries), "no constant left out"
    assert bound_entries and all(launcher.entries == 2 for launcher in bound_entries)


def test_runtime_tail_refuses_a_leading_constant():
    """A binary that made one of the tensors' positions a constant (a None argument) keeps the
    launcher's own ``launch``, which filters per call."""
    class Fake:
        runtime_tail = launch.StaticLauncher.runtime_tail
        keep, extra = (0, 2, 3), ()

    assert Fake().runtime_tail(2, (5, 6)) is None
    assert Fake().runtime_tail(1, (1, 5, 6)) == (5, 6)  # the tail's first, a constant, left out
    Fake.keep = (0, 1, 3)
    assert Fake().runtime_tail(2, (1, 6)) == (6,)
    assert Fake().runtime_tail(2, (1,)) is None  # the binary takes an argument the launch lacks


def test_recorded_view_chains_are_aliases_in_the_specialized_runner(bound, built_runners, monkeypatch):
    """The first call records each chain of views' alias (``views.ViewChain``); the specialized
    runner writes those aliases out, so a later step replays no chain through its ``ViewChain``
    (it did every one: the specialized runner made a second set of chains, which had recorded
    nothing: tiny Llama's step replayed 181 chains a step that way). Values as eager's."""
    from kernelab.compiler import views

    checked_step = _compiled_block()
    for _ in range(2):
        checked_step()
    replayed = []
    real_call = views.ViewChain.__call__
    monkeypatch.setattr(views.ViewChain, "__call__", lambda self, root: replayed.append(self) or real_call(self, root))
    checked_step()
    runners = [r for r in built_runners if r.group_runners]
    assert runners and all(r.fast is not None for r in runners)
    assert sum(len(views.view_chains(r)[0]) for r in runners) > 0, "no chain of views in the block's graphs"
    assert not replayed, [c.steps for c in replayed]


def test_other_input_layouts_take_the_first_runner(bound, built_runners):
    """A call whose inputs are laid out otherwise than the first call's (here called directly,
    as dynamo would after a recompile) runs the first runner: the values are right either way."""
    torch.manual_seed(0)
    compiled = torch.compile(lambda a, b: (a * b + 1).relu().sum(0), backend="kernelab")
    a, b = torch.randn(6, 40), torch.randn(6, 40)
    torch.testing.assert_close(compiled(a, b), (a * b + 1).relu().sum(0))
    runner = next(iter([r for r in built_runners if r.group_runners]))
    assert runner.fast is not None
    torch.testing.assert_close(runner([a, b])[0], (a * b + 1).relu().sum(0))
    launches = sum(launcher.launches for launcher in bound)
    wide = torch.randn(40, 6).t()  # the same shape, another stride
    got = runner([wide, b])[0]
    torch.testing.assert_close(got, (wide * b + 1).relu().sum(0))
    assert sum(launcher.launches for launcher in bound) == launches  # not the bound launches


def test_a_misaligned_input_takes_run_values(bound, built_runners):
    """A launch whose binary assumed a 16-byte aligned input gets a misaligned one (a view one
    element in): that group runs ``run_values``, which finds the cached call's key unmatched and
    launches the ordinary way; values right."""
    compiled = torch.compile(lambda a: (a * 2).exp(), backend="kernelab")
    a = torch.randn(64)
    torch.testing.assert_close(compiled(a), (a * 2).exp())
    runner = next(iter([r for r in built_runners if r.group_runners]))
    assert runner.fast is not None and "data_ptr() % 16 == 0" in runner.fast_source
    base = torch.randn(65)
    shifted = base[1:]  # same shape and stride, 4 bytes in
    launches = sum(launcher.launches for launcher in bound)
    torch.testing.assert_close(runner([shifted])[0], (shifted * 2).exp())
    assert sum(launcher.launches for launcher in bound) == launches


def test_a_misaligned_buffer_stored_into_takes_run_values(bound, built_runners):
    """An output stored into a graph input is not a fresh allocation: the binary's assumption that
    it is 16-byte aligned is checked as an input's is (specialized line and bound launch alike).
    A buffer one element into its storage takes ``run_values``, which launches the ordinary way.
    (The buffer is only written: one the kernel also reads is checked as an input already.)"""

    def overwrite(x, buf):
        torch.exp(x, out=buf)
        return x * 2

    compiled = torch.compile(overwrite, backend="kernelab")
    x, buf = torch.randn(64), torch.randn(64)
    torch.testing.assert_close(compiled(x, buf), x * 2)
    torch.testing.assert_close(buf, x.exp())
    runner = next(r for r in built_runners if any(g.into for g in r.group_runners))
    assert runner.fast is not None
    stored = {b for g in runner.group_runners for _, b in g.into}
    shifted = torch.randn(65)[1:]  # same shape and stride, 4 bytes in
    args = [shifted if p in stored else x for p in runner.placeholders]
    launches = sum(launcher.launches for launcher in bound)
    runner(args)
    torch.testing.assert_close(shifted, x.exp())
    assert sum(launcher.launches for launcher in bound) == launches  # not the bound launches


def test_a_launch_hook_takes_the_first_runner(bound, built_runners, monkeypatch):
    compiled = torch.compile(lambda a: a.sin() + 1, backend="kernelab")
    a = torch.randn(32)
    compiled(a)
    runner = next(iter([r for r in built_runners if r.group_runners]))
    assert runner.fast is not None
    from triton import knobs

    calls = []
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda *args: calls.append(args))
    launches = sum(launcher.launches for launcher in bound)
    torch.testing.assert_close(runner([a])[0], a.sin() + 1)
    assert sum(launcher.launches for launcher in bound) == launches


def test_without_bound_launches_or_switched_off_nothing_is_specialized(bound, built_runners, monkeypatch):
    monkeypatch.setenv("KERNELAB_FAST_RUNNER", "0")
    compiled = torch.compile(lambda a: a.cos() * 3, backend="kernelab")
    a = torch.randn(16)
    for _ in range(2):
        torch.testing.assert_close(compiled(a), a.cos() * 3)
    assert next(iter([r for r in built_runners if r.group_runners])).fast is None


def test_the_interpreter_binds_nothing_so_nothing_is_specialized(built_runners):
    compiled = torch.compile(lambda a: a.cos() * 3, backend="kernelab")
    a = torch.randn(16)
    for _ in range(2):
        torch.testing.assert_close(compiled(a), a.cos() * 3)
    assert next(iter([r for r in built_runners if r.group_runners])).fast is None


def test_symbolic_shapes_are_not_specialized(bound, built_runners):
    compiled = torch.compile(lambda a: (a * 2).relu(), backend="kernelab", dynamic=True)
    for n in (8, 12, 8):
        a = torch.randn(n)
        torch.testing.assert_close(compiled(a), (a * 2).relu())
    assert all(r.fast is None for r in [r for r in built_runners if r.group_runners])


def test_padded_rows_around_products_through_the_specialized_lines(bound, built_runners):
    """A kernel output with long unaligned rows that a product reads is allocated padded and
    viewed to its columns (``narrow``): the specialized line does the same."""
    torch.manual_seed(0)
    f = torch.compile(lambda x, w, v: ((x @ w).relu() * 2) @ v, backend="kernelab")
    x, w, v = torch.randn(8, 32), torch.randn(32, 1031), torch.randn(1031, 16)
    for _ in range(3):
        torch.testing.assert_close(f(x, w, v), ((x @ w).relu() * 2) @ v, rtol=1e-4, atol=1e-4)
    runner = next(r for r in built_runners if r.group_runners)
    assert runner.fast is not None and "[..., :1031]" in runner.fast_source


@pytest.mark.parametrize("bn_forward", ["aten", "generated"])
def test_running_statistics_stored_into_the_buffers_through_the_specialized_lines(bound, built_runners, monkeypatch,
                                                                                 bn_forward):
    """Groups storing into graph inputs (a training batch norm's running statistics, updated in
    place: ``GroupRunner.into``) launch from the specialized runner with the buffers as their
    outputs (they took ``run_values`` there: 17 of tiny ResNet's 55 forward groups with the
    generated norm). Buffers and gradients as eager's after each of three steps."""
    monkeypatch.setenv("KERNELAB_BN_FORWARD", bn_forward)
    monkeypatch.setenv("KERNELAB_CONV_LAYOUT", "traced")  # the generated norm is for NCHW activations
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 1),
                          nn.BatchNorm2d(4))
    twin = copy.deepcopy(model)
    compiled = torch.compile(model, backend="kernelab")
    x = torch.randn(2, 3, 6, 6)
    for _ in range(3):
        _, grads = _step(compiled, x)
        _, want_grads = _step(twin, x)
        for g, w in zip(grads, want_grads):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
        for (name, b), w in zip(model.named_buffers(), twin.buffers()):
            torch.testing.assert_close(b, w, rtol=1e-5, atol=1e-6, msg=name)
    stores = [r for runner in built_runners for r in runner.group_runners if r.into]
    assert bool(stores) == (bn_forward == "generated")  # ATen's norm updates its buffers itself
    runners = [r for r in built_runners if r.group_runners]
    assert all(r.fast is not None for r in runners)
    assert sum(r.fast_groups for r in runners) == sum(len(r.group_runners) for r in runners)


@pytest.mark.parametrize("name", ["gpt2", "vit", "bert", "llama", "t5"])
def test_zoo_training_steps_through_the_specialized_lines(bound, built_runners, name):
    from kernelab.zoo import ZOO

    zm = ZOO[name]
    model, inputs = zm.build("tiny")
    want = zm.loss(model, inputs)
    want.backward()
    want_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    compiled = torch.compile(model, backend="kernelab")
    for _ in range(3):
        model.zero_grad(set_to_none=True)
        loss = zm.loss(compiled, inputs)
        loss.backward()
        assert rel_norm(loss, want) < REL
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        assert grads.keys() == want_grads.keys()
        bad = gradients_off(grads, want_grads)  # key biases' zero gradients: absolute slack
        assert not bad, bad
    assert any(r.fast_groups for r in built_runners) and bound and all(launcher.launches >= 1 for launcher in bound)


def test_debug_level_3_prints_the_specialized_runner(bound, built_runners, monkeypatch, capsys):
    monkeypatch.setenv("KERNELAB_DEBUG", "3")
    f = torch.compile(lambda a: (a + 1).relu(), backend="kernelab")
    a = torch.randn(24)
    torch.testing.assert_close(f(a), (a + 1).relu())
    err = capsys.readouterr().err
    assert "the runner specialized after its first call (1 of 1 groups launched directly)" in err and ".launch(" in err


def test_a_chain_a_rewrite_left_unread_is_no_kernel_and_the_runner_specializes(bound, built_runners):
    """``gelu(x @ x.t()).softmax(-1).sum()`` (``benchmarks/models.py``'s prewarm step): the rewrites
    left a copy of the GELU, moved into the full sum's row space, that nothing read once the sum
    was taken onto another view. It was placed as a group of no outputs, a kernel writing nothing,
    and its specialized line began with ``= ``: a SyntaxError at every GPU's second call (each zoo
    worker's prewarm on the H100, stop 40). Now no group lacks outputs, the runner specializes,
    and three steps equal eager's."""
    fn = lambda x: torch.nn.functional.gelu(x @ x.t()).softmax(-1).sum()  # noqa: E731
    compiled = torch.compile(fn, backend="kernelab")
    x = torch.randn(64, 48, generator=torch.Generator().manual_seed(0), requires_grad=True)
    want = fn(x)
    want_grad, = torch.autograd.grad(want, x)
    for _ in range(3):
        got = compiled(x)
        got_grad, = torch.autograd.grad(got, x)
        torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-6)
        torch.testing.assert_close(got_grad, want_grad, rtol=2e-5, atol=2e-6)
    runners = [r for r in built_runners if r.group_runners]
    assert runners and all(r.fast is not None for r in runners)
    assert all(g.group.outputs for r in runners for g in r.group_runners), "a group of no outputs"


def test_a_runner_that_cannot_be_specialized_keeps_its_first_runner(bound, built_runners, monkeypatch):
    """Writing the specialized runner is kernelab's code, not the caller's: where it fails the
    graph keeps running its first runner with one warning (values as eager's); under
    KERNELAB_STRICT=1 it raises."""
    real = runtime._straight_line

    def broken(runner, fast=None):
        if fast:
            raise SyntaxError("a line written wrong")
        return real(runner, fast)

    monkeypatch.setattr(runtime, "_straight_line", broken)
    fn = lambda a, b: (a * b + 1).relu().sum(0)  # noqa: E731
    a, b = torch.randn(6, 40), torch.randn(6, 40)
    monkeypatch.setenv("KERNELAB_STRICT", "0")
    compiled = torch.compile(fn, backend="kernelab")
    with pytest.warns(UserWarning, match="could not be specialized"):
        torch.testing.assert_close(compiled(a, b), fn(a, b))
    torch.testing.assert_close(compiled(a, b), fn(a, b))
    assert all(r.fast is None for r in built_runners)
    torch._dynamo.reset()
    monkeypatch.setenv("KERNELAB_STRICT", "1")
    with pytest.raises(SyntaxError, match="a line written wrong"):
        torch.compile(lambda a, b: (a - b).abs().sum(0), backend="kernelab")(a, b)
