"""CUDA graphs asked of the backend (``kernelab/compiler/cudagraphs.py``), what can be checked
without a GPU: the modes and options it takes, clear errors for the rest, and graphs that cannot
be recorded (CPU tensors) running as before, with the reason in a warning and in the plan.
The recording and replaying themselves: ``tests/gpu/test_cudagraphs_gpu.py``."""
import warnings

import pytest
import torch

import kernelab.compiler as kc
from kernelab.compiler.options import parse
from kernelab.errors import KernelabCudaGraphWarning, KernelabError


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("mode, options, env, want", [
    (None, None, "0", False),
    ("default", None, "0", False),
    ("reduce-overhead", None, "0", True),
    ("max-autotune-no-cudagraphs", None, "0", False),
    (None, {"cudagraphs": True}, "0", True),
    ("reduce-overhead", {"cudagraphs": False}, "0", False),  # the explicit option wins
    (None, None, "1", True),  # KERNELAB_CUDAGRAPHS=1
])
def test_cudagraphs_requested(monkeypatch, mode, options, env, want):
    monkeypatch.setenv("KERNELAB_CUDAGRAPHS", env)
    assert parse(mode, options).cudagraphs is want


@pytest.mark.parametrize("kwargs, says", [
    ({"mode": "max-autotune"}, "has no mode 'max-autotune'"),
    ({"mode": "fast"}, "has no mode 'fast'"),
    ({"options": {"cudagraph": True}}, "has no option 'cudagraph'"),
    ({"options": {"cudagraphs": "yes"}}, "must be True or False"),
])
def test_unknown_mode_or_option_is_one_clear_error_at_compile(kwargs, says):
    with pytest.raises(KernelabError, match=says):
        kc.compile(lambda x: x + 1, **kwargs)


def test_unknown_mode_through_torch_compile_raises_at_the_first_call():
    fn = torch.compile(lambda x: x + 1, backend="kernelab", mode="max-autotune")
    with pytest.raises(Exception, match="has no mode 'max-autotune'"):
        fn(torch.randn(3))


def test_cpu_graphs_run_unrecorded_with_the_reason(monkeypatch):
    monkeypatch.setenv("KERNELAB_STRICT", "1")
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16))
    x = torch.randn(4, 8)
    fn = kc.compile(model, mode="reduce-overhead")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = fn(x)
        y.square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ref = model(x)
    ref.square().sum().backward()
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-4)
    said = [str(w.message) for w in caught if issubclass(w.category, KernelabCudaGraphWarning)]
    assert len(said) == 2, said  # the forward graph and its backward
    assert "not used for this forward graph" in said[0]
    assert "its forward graph was not recorded" in said[1]


def test_debug_output_names_the_reason(monkeypatch, capsys):
    monkeypatch.setenv("KERNELAB_DEBUG", "1")
    fn = kc.compile(lambda x: (x * 2).relu(), mode="reduce-overhead")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", KernelabCudaGraphWarning)
        torch.testing.assert_close(fn(torch.ones(8)), torch.full((8,), 2.0))
    err = capsys.readouterr().err
    assert "CUDA graph not recorded: " in err and ("no CUDA device" in err or "not all on one CUDA device" in err)


def test_without_the_mode_nothing_is_said_of_cuda_graphs(monkeypatch, capsys):
    monkeypatch.setenv("KERNELAB_DEBUG", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelabCudaGraphWarning)
        kc.compile(lambda x: (x * 2).relu())(torch.ones(8))
    assert "CUDA graph" not in capsys.readouterr().err


def test_for_cuda_graphs_keeps_no_column_counters_between_calls():
    """Under CUDA graphs a runner keeps no device memory between calls (the trees' pool must hold
    only what the graph returns): a column sum's arrival counters are allocated per call."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from kernelab.compiler.backend import compile_graph

    def f(x, y):
        return ((x * y).sum(0),)

    x, y = torch.randn(300, 40), torch.randn(300, 40)
    call = compile_graph(make_fx(f)(x, y), [x, y], "inference")
    call.runner.for_cuda_graphs()
    for _ in range(2):
        torch.testing.assert_close(call([x, y])[0], f(x, y)[0], rtol=1e-5, atol=1e-4)
    calls = [c for gr in call.runner.group_runners for c in gr.calls.values() if c is not None]
    assert any(c.col_blocks for c in calls), "no column reduction ran: the test checks nothing"
    assert all(c.transient and not c.counters for c in calls if c.col_blocks)


def test_for_cuda_graphs_stores_no_output_over_an_input():
    """A recorded graph's inputs are the trees' static buffers: no kernel may take their memory,
    nor that of the graph's own values (the recording's addresses are replayed as they are)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from kernelab.compiler.backend import compile_graph

    def f(a, b):
        return (torch.tanh(a @ b) * 3.0,)

    a, b = torch.randn(32, 16), torch.randn(16, 24)
    call = compile_graph(make_fx(f)(a, b), [a, b], "inference")
    assert any(r.reuse for r in call.runner.group_runners), "nothing to reuse: the test checks nothing"
    call.runner.for_cuda_graphs()
    assert not any(r.reuse for r in call.runner.group_runners)
    torch.testing.assert_close(call([a, b])[0], f(a, b)[0], rtol=1e-5, atol=1e-5)
    calls = [c for gr in call.runner.group_runners for c in gr.calls.values() if c is not None]
    assert calls and not any(c.reuse for c in calls)


def test_a_zoo_model_asked_for_cuda_graphs_on_cpu_trains_as_without():
    """Tiny GPT-2 under mode="reduce-overhead" on the CPU: every graph says why it is not recorded,
    and the step's loss and gradients are eager's, as without the mode."""
    pytest.importorskip("transformers")
    from kernelab.zoo import ZOO
    from tests.compiler.conftest import REL, gradients_off, rel_norm

    zm = ZOO["gpt2"]
    model, inputs = zm.build("tiny")
    ref_loss = zm.loss(model, inputs)
    ref_loss.backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = zm.loss(kc.compile(model, mode="reduce-overhead"), inputs)
        loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert rel_norm(loss.detach(), ref_loss.detach()) < REL
    assert grads.keys() == ref.keys() and not gradients_off(grads, ref)
    said = [str(w.message) for w in caught if issubclass(w.category, KernelabCudaGraphWarning)]
    assert any("forward graph" in s for s in said) and any("backward graph" in s for s in said), said
