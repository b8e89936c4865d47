"""``torch.compile(..., backend="kernelab", mode="reduce-overhead")`` on a CUDA GPU: compiled graphs
recorded into CUDA graphs and replayed (``kernelab/compiler/cudagraphs.py``). Every test checks
values against eager over several steps, so a replay that read stale inputs, a parameter's old
values or a frozen random mask fails.

Run on a GPU machine WITHOUT TRITON_INTERPRET: ``python -m pytest tests/gpu -q``."""
import warnings

import pytest
import torch
import torch.nn.functional as F

import kernelab.compiler as kc
from kernelab.errors import KernelabCudaGraphWarning
from kernelab.compiler.group_runner import interpreted

pytestmark = pytest.mark.skipif(interpreted() or not torch.cuda.is_available(),
                                reason="CUDA graphs need a CUDA GPU")


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.LayerNorm(256),
                               torch.nn.Linear(256, 10)).cuda()


def _steps(model, fn, inputs, lr=0.1):
    """SGD steps: the parameters change in place between steps (a replay must read the new values)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses, grads = [], []
    for x, y in inputs:
        torch.compiler.cudagraph_mark_step_begin()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(fn(x), y)
        loss.backward()
        losses.append(loss.detach().clone())
        grads.append([p.grad.clone() for p in model.parameters()])
        opt.step()
    return losses, grads


def test_training_steps_match_eager_with_new_inputs_and_updated_parameters():
    gen = torch.Generator(device="cuda").manual_seed(1)
    inputs = [(torch.randn(32, 64, device="cuda", generator=gen), torch.randint(0, 10, (32,), device="cuda",
                                                                                generator=gen)) for _ in range(5)]
    ref_model, model = _mlp(), _mlp()
    ref = _steps(ref_model, ref_model, inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelabCudaGraphWarning)  # every graph is recorded
        got = _steps(model, kc.compile(model, mode="reduce-overhead"), inputs)
    for step, (a, b) in enumerate(zip(ref[0], got[0])):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=f"loss of step {step}")
    for step, (ga, gb) in enumerate(zip(ref[1], got[1])):
        for a, b in zip(ga, gb):
            torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-5, msg=f"gradient of step {step}")


def test_debug_output_says_recorded(monkeypatch, capsys):
    monkeypatch.setenv("KERNELAB_DEBUG", "1")
    model = _mlp()
    kc.compile(model, mode="reduce-overhead")(torch.randn(8, 64, device="cuda")).sum().backward()
    err = capsys.readouterr().err
    assert "forward graph: CUDA graph recorded" in err and "backward graph: CUDA graph recorded" in err


def test_dropout_masks_differ_between_replays():
    """The random ops' generator advances at every replay (a frozen mask would repeat)."""
    fn = kc.compile(lambda x: F.dropout(x, 0.5, training=True) * 2.0, mode="reduce-overhead")
    x = torch.ones(4096, device="cuda")
    masks = []
    for _ in range(4):
        torch.compiler.cudagraph_mark_step_begin()
        masks.append((fn(x) != 0).clone())
    for a, b in zip(masks, masks[1:]):
        assert not torch.equal(a, b)
    kept = torch.stack(masks).float().mean().item()
    assert 0.45 < kept < 0.55


def test_inference_replays_follow_their_inputs():
    model = _mlp().eval()
    fn = kc.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        for seed in range(4):
            x = torch.randn(16, 64, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed))
            torch.compiler.cudagraph_mark_step_begin()
            torch.testing.assert_close(fn(x), model(x), rtol=1e-4, atol=1e-5)


def test_a_graph_that_cannot_be_captured_runs_uncaptured_and_says_why():
    """An index_put_ with a boolean mask (``y[x > 0] = 0``) is data-dependent: no CUDA graph, a
    warning, right values."""
    def f(x):
        y = x.clone()
        y[x > 0] = 0
        return y * 2

    fn = kc.compile(f, mode="reduce-overhead")
    x = torch.randn(1000, device="cuda")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            torch.compiler.cudagraph_mark_step_begin()
            torch.testing.assert_close(fn(x), f(x), rtol=1e-5, atol=1e-4)
    said = [str(w.message) for w in caught if issubclass(w.category, KernelabCudaGraphWarning)]
    assert said and all("not used" in s for s in said)


def test_gpt2_tiny_training_steps_match_eager():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).cuda()
    ids = torch.randint(0, 128, (2, 16), device="cuda")
    ref = model(input_ids=ids, labels=ids).loss
    ref.backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    fn = kc.compile(model, mode="reduce-overhead")
    for _ in range(3):  # warm-up, record, replay
        torch.compiler.cudagraph_mark_step_begin()
        model.zero_grad(set_to_none=True)
        loss = fn(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.testing.assert_close(loss, ref, rtol=1e-4, atol=1e-5)
        for n, p in model.named_parameters():
            if n in ref_grads:
                torch.testing.assert_close(p.grad, ref_grads[n], rtol=1e-3, atol=1e-5, msg=n)
