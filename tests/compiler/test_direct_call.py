"""Inference graphs skip aot_autograd's runtime wrapper only where that wrapper has no work
(``backend._wrapper_has_no_work``); everywhere else it stays, and the results match eager."""
import pytest
import torch

from kernelab.compiler.backend import kernelab_backend

def compiled(fn):
    """(compiled fn, list of what the backend returned per graph)."""
    returned = []

    def backend(gm, example_inputs):
        out = kernelab_backend(gm, example_inputs)
        returned.append(out)
        return out

    torch._dynamo.reset()
    return torch.compile(fn, backend=backend), returned


def is_direct(fn) -> bool:
    return bool(getattr(fn, "direct", False))


def test_plain_inference_graph_is_called_directly():
    f, graphs = compiled(lambda a, b: (a + b).relu() * 2)
    a, b = torch.randn(37), torch.randn(37)
    out = f(a, b)
    torch.testing.assert_close(out, (a + b).relu() * 2)
    assert [is_direct(g) for g in graphs] == [True]
    assert torch.is_grad_enabled() and not out.requires_grad


def test_grad_mode_is_off_inside_and_restored_after(monkeypatch):
    from kernelab.compiler import runtime

    seen = []
    original = runtime.GraphRunner.__call__

    def spy(self, args, hooks=None):
        seen.append(torch.is_grad_enabled())
        return original(self, args, hooks)

    monkeypatch.setattr(runtime.GraphRunner, "__call__", spy)
    f, graphs = compiled(lambda x: x * 3)
    x = torch.randn(8)
    torch.testing.assert_close(f(x), x * 3)
    assert is_direct(graphs[0]) and torch.is_grad_enabled()
    with torch.no_grad():
        torch.testing.assert_close(f(x), x * 3)
    assert torch.is_grad_enabled()
    assert seen == [False, False]


def test_input_mutation_keeps_the_wrapper_and_mutates():
    def g(a):
        a.add_(1)
        return a * 2

    f, graphs = compiled(g)
    a = torch.zeros(5)
    out = f(a)
    assert torch.equal(a, torch.ones(5)) and torch.equal(out, torch.full((5,), 2.0))
    assert not any(is_direct(x) for x in graphs)


def test_output_aliasing_an_input_keeps_the_wrapper():
    f, graphs = compiled(lambda a: (a.view(-1), a * 2))
    a = torch.randn(3, 4)
    view, doubled = f(a)
    assert view._base is a or view.data_ptr() == a.data_ptr()
    torch.testing.assert_close(doubled, a * 2)
    assert not any(is_direct(x) for x in graphs)


def test_training_graph_keeps_autograd():
    f, graphs = compiled(lambda a: (a * a).sum(-1))
    a = torch.randn(4, 6, requires_grad=True)
    f(a).sum().backward()
    torch.testing.assert_close(a.grad, 2 * a.detach())
    assert not any(is_direct(x) for x in graphs)


def test_module_under_no_grad_is_direct():
    lin = torch.nn.Linear(8, 8)
    f, graphs = compiled(lambda x: torch.relu(lin(x)))
    x = torch.randn(2, 8)
    with torch.no_grad():
        out = f(x)
    torch.testing.assert_close(out, torch.relu(lin(x)).detach())
    assert [is_direct(g) for g in graphs] == [True]


def test_switch_off_keeps_the_wrapper(monkeypatch):
    monkeypatch.setenv("KERNELAB_DIRECT_CALL", "0")
    f, graphs = compiled(lambda a: a.exp() + 1)
    a = torch.randn(9)
    torch.testing.assert_close(f(a), a.exp() + 1)
    assert not any(is_direct(x) for x in graphs)


def test_autocast_keeps_the_wrapper():
    f, graphs = compiled(lambda a, b: (a @ b).relu())
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = f(a, b)
        ref = (a @ b).relu()
    # the interpreter truncates float32 to bfloat16 where a GPU rounds: a bf16 ulp of slack
    torch.testing.assert_close(out.float(), ref.float(), rtol=5e-2, atol=5e-2)
    assert not any(is_direct(x) for x in graphs)


def test_same_tensor_twice_is_correct():
    f, graphs = compiled(lambda a, b: a * b + 1)
    a = torch.randn(10)
    torch.testing.assert_close(f(a, a), a * a + 1)
