"""kernelab.patch / unpatch on real models built from configs and on user modules (fp32, Triton's
interpreter on the CPU): the patched model's loss and every gradient equal the unpatched model's,
the report lists the expected swaps and refusals with reasons, the kernels really run (eager and
compiled), unpatch restores the original forwards bit for bit, and calls the probe did not cover
run the original forward."""

from __future__ import annotations

import copy
import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported: the kernels run on CPU tensors

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import kernelab  # noqa: E402
from kernelab.errors import KernelabError  # noqa: E402
from kernelab.patching import lm_head as patch_lm_head  # noqa: E402
from kernelab.patching import loss as patch_loss  # noqa: E402
from kernelab.zoo import ZOO  # noqa: E402

transformers = pytest.importorskip("transformers")
# the interpreter evaluates masked-out lanes too (exp overflows there): numpy's note is not ours
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")

LOSS_RTOL = 1e-5
GRAD_RTOL = 1e-4


# ============================================================================= models
def _hf_lm(model_cls, config, vocab=128, batch=2, seq=16):
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = model_cls(config).train()
    ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(1))
    return model, {"input_ids": ids, "labels": ids.clone()}


def _qwen2():
    cfg = transformers.Qwen2Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    return _hf_lm(transformers.Qwen2ForCausalLM, cfg)


def _gemma():
    cfg = transformers.GemmaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16, vocab_size=128, max_position_embeddings=64,
                                   hidden_activation="gelu_pytorch_tanh")
    return _hf_lm(transformers.GemmaForCausalLM, cfg)


def _t5_gated():
    cfg = transformers.T5Config(d_model=64, d_kv=16, d_ff=96, num_layers=2, num_decoder_layers=2, num_heads=4,
                                vocab_size=128, relative_attention_num_buckets=8, dropout_rate=0.0,
                                feed_forward_proj="gated-gelu", decoder_start_token_id=0, pad_token_id=0)
    model, inputs = _hf_lm(transformers.T5ForConditionalGeneration, cfg)
    inputs["labels"] = inputs["labels"][:, :8].contiguous()
    return model, inputs


def _zoo(name):
    return lambda: ZOO[name].build("tiny")


def _qwen3():
    """Qwen3: RMSNorms over each head's queries and keys (q_norm, k_norm) besides the layers' own."""
    cfg = transformers.Qwen3Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16, vocab_size=128, max_position_embeddings=64)
    return _hf_lm(transformers.Qwen3ForCausalLM, cfg)


def _phi3():
    """Phi-3: gate and up as the two halves of one Linear (gate_up_proj), as in GLM-4."""
    cfg = transformers.Phi3Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, vocab_size=128, max_position_embeddings=64, pad_token_id=0,
                                  eos_token_id=1, bos_token_id=1)
    return _hf_lm(transformers.Phi3ForCausalLM, cfg)


BUILDERS = {name: _zoo(name) for name in ("gpt2", "llama", "bert", "t5", "mixtral")}
BUILDERS.update(qwen2=_qwen2, qwen3=_qwen3, gemma=_gemma, t5_gated=_t5_gated, phi3=_phi3)

#: model -> (kind, op, how many swapped); ops of other kinds than those listed: none swapped.
EXPECTED_SWAPS = {
    "llama": {("norm", "rms_norm"): 5, ("mlp", "silu_mul"): 2, ("loss", "cross_entropy"): 1},
    "qwen2": {("norm", "rms_norm"): 5, ("mlp", "silu_mul"): 2, ("loss", "cross_entropy"): 1},
    "qwen3": {("norm", "rms_norm"): 9, ("mlp", "silu_mul"): 2, ("loss", "cross_entropy"): 1},
    "gemma": {("norm", "rms_norm(x, 1 + weight)"): 5, ("mlp", "gelu_mul(approximate='tanh')"): 2, ("loss", "cross_entropy"): 1},
    "gpt2": {("norm", "layer_norm"): 5, ("loss", "cross_entropy"): 1},
    "bert": {("norm", "layer_norm"): 6},
    "t5": {("norm", "rms_norm"): 12},
    "t5_gated": {("norm", "rms_norm"): 12, ("mlp", "gelu_mul(approximate='tanh')"): 4},
    "mixtral": {("norm", "rms_norm"): 5, ("loss", "cross_entropy"): 1},
    "phi3": {("norm", "rms_norm"): 5, ("mlp", "silu_mul"): 2, ("loss", "cross_entropy"): 1},
}
#: model -> (kind, words of the reason) of candidates that must be left alone.
EXPECTED_SKIPS = {
    "bert": [("loss", "loss computed inline")],
    "t5": [("loss", "loss computed inline"), ("mlp", "2 nn.Linear children")],
    "mixtral": [("mlp", "raw parameters")],
}


def _build(name):
    model, inputs = BUILDERS[name]()
    with torch.no_grad():  # norms start at 1 (Gemma's at 0): move them, so a wrong weight shows
        gen = torch.Generator().manual_seed(2)
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn(p.shape, generator=gen) * 0.2)
    return model, inputs


def _step(model, inputs):
    model.zero_grad(set_to_none=True)
    loss = model(**inputs).loss
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def _assert_same_step(loss, grads, ref_loss, ref_grads):
    assert math.isclose(float(loss), float(ref_loss), rel_tol=LOSS_RTOL), (float(loss), float(ref_loss))
    assert grads.keys() == ref_grads.keys()
    # a floor of 1e-5 of the whole gradient's norm: gradients that are 0 in exact arithmetic (the
    # attention key bias) are rounding noise in both runs
    total = math.sqrt(sum(float(g.double().square().sum()) for g in ref_grads.values()))
    for name, ref in ref_grads.items():
        err = float((grads[name].double() - ref.double()).norm()) / (float(ref.double().norm()) + 1e-5 * total)
        assert err <= GRAD_RTOL, f"{name}: relative gradient error {err:.3g}"


def _swap_counts(report):
    counts = {}
    for s in report.swapped:
        op = s.op.split(" (")[0]  # "silu_mul (gate=..., ...)" -> "silu_mul"
        counts[(s.kind, op)] = counts.get((s.kind, op), 0) + 1
    return counts


class _Calls:
    """Counts calls of kernelab.ops functions (the patched forwards look them up at call time)."""

    def __init__(self, monkeypatch, names=("layer_norm", "rms_norm", "silu_mul", "gelu_mul", "cross_entropy")):
        self.counts = dict.fromkeys(names, 0)
        for name in names:
            monkeypatch.setattr(kernelab.ops, name, self._wrap(name, getattr(kernelab.ops, name)))

    def _wrap(self, name, fn):
        def counted(*args, **kwargs):
            self.counts[name] += 1
            return fn(*args, **kwargs)
        return counted


def _recording_compile(module):
    """(torch.compile(module, fullgraph=True) through a backend that runs the graph as traced, the
    list it fills with every call_function target of the graphs it is given)."""
    targets = []

    def recording_backend(gm, example_inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    return torch.compile(module, backend=recording_backend, fullgraph=True), targets


# ============================================================================= real models
@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_patched_step_equals_unpatched_and_report_lists_swaps(name, monkeypatch):
    model, inputs = _build(name)
    ref_loss, ref_grads = _step(model, inputs)
    report = kernelab.patch(model)
    assert _swap_counts(report) == EXPECTED_SWAPS[name], str(report)
    for kind, words in EXPECTED_SKIPS.get(name, []):
        assert any(s.kind == kind and words in s.reason for s in report.skipped), str(report)
    calls = _Calls(monkeypatch)
    loss, grads = _step(model, inputs)
    _assert_same_step(loss, grads, ref_loss, ref_grads)
    # every swap ran once per forward (the kernels, not the original forwards, made these numbers)
    expected_calls = {"layer_norm": 0, "rms_norm": 0, "silu_mul": 0, "gelu_mul": 0, "cross_entropy": 0}
    for (kind, op), n in EXPECTED_SWAPS[name].items():
        expected_calls[op.split("(")[0]] += n
    assert calls.counts == expected_calls


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_unpatch_restores_bit_for_bit(name):
    model, inputs = _build(name)
    dict_before = {path: dict(m.__dict__) for path, m in model.named_modules()}
    state_before = {k: (v.data_ptr(), v.clone()) for k, v in model.state_dict().items()}
    with torch.no_grad():
        before = model(**inputs).logits
    kernelab.patch(model)
    assert model.state_dict().keys() == state_before.keys()  # patching adds no parameter or buffer
    report = kernelab.unpatch(model)
    assert report.swapped
    for path, m in model.named_modules():
        assert m.__dict__.keys() == dict_before[path].keys(), path
        assert all(m.__dict__[k] is v for k, v in dict_before[path].items()), path
    for k, v in model.state_dict().items():
        assert v.data_ptr() == state_before[k][0] and torch.equal(v, state_before[k][1]), k
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, before)


def test_patch_twice_is_idempotent_and_other_options_are_refused():
    model, _ = _build("llama")
    report = kernelab.patch(model)
    assert kernelab.patch(model) is report
    with pytest.raises(KernelabError, match="already patched"):
        kernelab.patch(model, loss=False)
    kernelab.unpatch(model)
    with pytest.raises(KernelabError, match="not patched"):
        kernelab.unpatch(model)
    assert _swap_counts(kernelab.patch(model, mlp=False, loss=False)) == {("norm", "rms_norm"): 5}


def test_patching_a_submodule_first_leaves_its_swaps_to_it():
    model, _ = _build("llama")
    inner = kernelab.patch(model.model.layers[0])
    outer = kernelab.patch(model)
    assert len(inner.swapped) == 3  # two norms and the MLP of layer 0
    already = [s for s in outer.skipped if "already replaced" in s.reason and "kernelab" in s.reason]
    assert {s.path for s in already} == {f"model.layers.0.{p}" for p in ("mlp", "input_layernorm", "post_attention_layernorm")}
    kernelab.unpatch(model)
    assert "forward" in model.model.layers[0].mlp.__dict__  # still the submodule's patch
    kernelab.unpatch(model.model.layers[0])
    assert "forward" not in model.model.layers[0].mlp.__dict__


@pytest.mark.parametrize("name", ["llama", "gemma"])
def test_compiled_fullgraph_runs_the_kernels(name):
    model, inputs = _build(name)
    ref_loss, ref_grads = _step(model, inputs)
    kernelab.patch(model)
    compiled, targets = _recording_compile(model)
    loss, grads = _step(compiled, inputs)
    _assert_same_step(loss, {k.removeprefix("_orig_mod."): v for k, v in grads.items()}, ref_loss, ref_grads)
    norm_calls = sum(t.startswith("kernelab.norm") for t in targets)
    assert norm_calls == 5 and targets.count("kernelab.pointwise.default") == 2
    assert targets.count("kernelab.cross_entropy.default") == 1
    # the compiled model's original module is the patched one
    assert kernelab.patch(compiled) is kernelab.patch(model)


def test_deep_copy_of_a_patched_model_runs_on_its_own_weights():
    model, inputs = _build("llama")
    kernelab.patch(model)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.model.norm.weight.mul_(2.0)
        a, b = model(**inputs).logits, twin(**inputs).logits
    assert not torch.allclose(a, b)
    assert twin.model.norm.forward.__self__ is twin.model.norm
    kernelab.unpatch(twin)
    assert "forward" in model.model.norm.__dict__  # the original stays patched


# ============================================================================= one module at a time
class ScaleNorm(nn.Module):
    """RMSNorm under another name, epsilon as ``epsilon``: recognised by what it computes."""

    def __init__(self, h, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h))
        self.epsilon = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.epsilon) * self.weight


class MeanAbsNorm(ScaleNorm):
    """An RMSNorm look-alike with other math (mean |x|): must be left alone."""

    def forward(self, x):
        return x / (x.abs().mean(-1, keepdim=True) + self.epsilon) * self.weight


class HiddenEpsNorm(ScaleNorm):
    """RMS math, but not with the epsilon it stores."""

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-2) * self.weight


class GatedMLP(nn.Module):
    def __init__(self, h, i, act=None, dropout=0.0, formula="gate_up", bias=True):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = nn.Linear(h, i, bias), nn.Linear(h, i, bias), nn.Linear(i, h)
        self.act = act or nn.SiLU()
        self.drop = nn.Dropout(dropout)
        self.formula = formula

    def forward(self, x):
        g, u = self.gate_proj(x), self.up_proj(x)
        if self.formula == "up_gate":  # the names lie: the activation is on up_proj
            return self.down_proj(self.drop(self.act(u) * g))
        if self.formula == "sum":
            return self.down_proj(self.act(g) + u)
        return self.down_proj(self.drop(self.act(g) * u))


class HalvesMLP(nn.Module):
    """gate and up as the halves of one [H -> 2I] projection (Phi-3's and GLM-4's gate_up_proj)."""

    def __init__(self, h, i, act=None, gate_first=True, bias=False, ratio=2):
        super().__init__()
        self.gate_up_proj, self.down_proj = nn.Linear(h, ratio * i, bias), nn.Linear(i, h, bias=False)
        self.activation_fn = act or nn.SiLU()
        self.gate_first = gate_first

    def forward(self, x):
        a, b = self.gate_up_proj(x).chunk(2, dim=-1)
        gate, up = (a, b) if self.gate_first else (b, a)
        return self.down_proj(self.activation_fn(gate) * up)


def _module_grads(module, x):
    """(output, input gradient, parameter gradients) of one forward and backward."""
    module.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_(True)
    y = module(x)
    y.backward(torch.cos(torch.arange(y.numel(), dtype=y.dtype)).reshape(y.shape))
    return [y.detach(), x.grad, *(p.grad.clone() for _, p in sorted(module.named_parameters()))]


def _check_module(module, x, rtol=2e-5):
    """Patch ``module``; its output and gradients must be as close to a float64 run of the original
    as the original's own float32 run is (or within rtol of the largest value): an ill-conditioned
    gradient (an RMS norm of width 1) is allowed the error PyTorch itself makes."""
    exact = _module_grads(copy.deepcopy(module).double(), x.double())
    torch_run = _module_grads(module, x)
    report = kernelab.patch(module)
    ours = _module_grads(module, x)
    for a, b, ref in zip(ours, torch_run, exact):
        assert a.dtype == b.dtype and a.shape == ref.shape
        scale = float(ref.abs().max()) if ref.numel() else 1.0
        err, torch_err = (float((t.double() - ref).abs().max()) if ref.numel() else 0.0 for t in (a, b))
        assert err <= max(rtol * scale, 4 * torch_err), (err, torch_err, scale)
    return report


def _randomized(module):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.3 + (1 if p.dim() == 1 else 0))
    return module


def _x(*shape, noncontig=False):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(3)) * 2 + 0.5
    return x.transpose(0, 1).contiguous().transpose(0, 1) if noncontig else x


@pytest.mark.parametrize("make, h, op", [
    (lambda h: nn.LayerNorm(h), 199, "layer_norm"),
    (lambda h: nn.LayerNorm(h, bias=False), 768, "layer_norm"),
    (lambda h: nn.LayerNorm(h, elementwise_affine=False), 7, "layer_norm"),
    (lambda h: nn.LayerNorm((4, h)), 33, "layer_norm"),
    (lambda h: nn.RMSNorm(h), 2880, "rms_norm"),
    (lambda h: nn.RMSNorm(h, eps=1e-5, elementwise_affine=False), 1, "rms_norm"),
    (lambda h: ScaleNorm(h), 199, "rms_norm"),
])
def test_norm_modules_are_swapped_and_exact(make, h, op):
    module = _randomized(make(h))
    shape = module.normalized_shape if isinstance(module, (nn.LayerNorm, nn.RMSNorm)) else (h,)
    report = _check_module(module, _x(3, 5, *shape, noncontig=True))
    assert [(s.path, s.kind, s.op) for s in report.swapped] == [("", "norm", op)]


@pytest.mark.parametrize("module, words", [
    (MeanAbsNorm(64), "computes none of"),
    (HiddenEpsNorm(64), "computes none of"),
    (nn.GroupNorm(1, 64), "groups of channels"),
    (nn.BatchNorm1d(64), "running statistics"),
])
def test_look_alikes_with_other_math_are_left_alone_with_a_reason(module, words):
    x = _x(4, 64)
    with torch.no_grad():
        before = module(x)
    report = kernelab.patch(module)
    assert not report.swapped and len(report.skipped) == 1
    assert report.skipped[0].kind == "norm" and words in report.skipped[0].reason, report.skipped[0].reason
    assert "forward" not in module.__dict__
    with torch.no_grad():
        assert torch.equal(module(x), before)


@pytest.mark.parametrize("act, op", [(nn.SiLU(), "silu_mul"), (nn.GELU(), "gelu_mul"), (nn.GELU("tanh"), "gelu_mul(approximate='tanh')")])
def test_gated_mlps_are_swapped_and_exact(act, op):
    module = _randomized(GatedMLP(48, 80, act))
    report = _check_module(module, _x(2, 7, 48))
    assert [(s.kind, s.op.split(" (")[0]) for s in report.swapped] == [("mlp", op)]


def test_gated_mlp_roles_come_from_the_math_not_the_names():
    module = _randomized(GatedMLP(48, 80, formula="up_gate"))
    report = _check_module(module, _x(2, 7, 48))
    assert report.swapped[0].op == "silu_mul (gate=up_proj, up=gate_proj, down=down_proj)"


@pytest.mark.parametrize("gate_first", [True, False], ids=["gate first", "up first"])
@pytest.mark.parametrize("act, op", [(nn.SiLU(), "silu_mul"), (nn.GELU("tanh"), "gelu_mul(approximate='tanh')")])
def test_gate_and_up_as_halves_of_one_linear_are_swapped_and_exact(act, op, gate_first):
    module = _randomized(HalvesMLP(48, 80, act, gate_first, bias=True))
    report = _check_module(module, _x(2, 7, 48))
    half = "first" if gate_first else "second"
    assert [s.op for s in report.swapped] == [f"{op} (gate_up=gate_up_proj, gate={half} half, down=down_proj)"]
    dual = kernelab.patch(_randomized(HalvesMLP(48, 80)), fused_mlp=True).swapped[0].op
    assert "gate and up are one nn.Linear already" in dual and dual.startswith("silu_mul")


@pytest.mark.parametrize("module, words", [
    (HalvesMLP(48, 80, ratio=3), "neither [H -> 2I] with an [I -> H]"),
    (GatedMLP(48, 80, nn.ReLU()), "gated relu: no fused kernel"),
    (GatedMLP(48, 80, dropout=0.1), "dropout drop (p=0.1)"),
    (GatedMLP(48, 80, formula="sum"), "forward is not down(act(gate(x)) * up(x))"),
])
def test_mlps_that_are_not_fusable_are_left_alone_with_a_reason(module, words):
    report = kernelab.patch(module)
    assert not report.swapped and [s.kind for s in report.skipped] == ["mlp"]
    assert words in report.skipped[0].reason, report.skipped[0].reason


def test_output_dtype_follows_the_original_forward():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    x = _x(3, 64).half()
    for weight_dtype in (torch.float32, torch.float16):
        module = _randomized(LlamaRMSNorm(64, eps=1e-5)).to(weight_dtype)
        with torch.no_grad():
            ref = module(x)  # Llama: float32 out for a float32 weight, float16 for a float16 one
            kernelab.patch(module)
            out = module(x)
        assert out.dtype == ref.dtype
        torch.testing.assert_close(out, ref, rtol=4e-3, atol=4e-3)
        kernelab.unpatch(module)


def test_calls_the_probe_did_not_cover_run_the_original_forward(monkeypatch):
    module = _randomized(ScaleNorm(64)).double()
    x64 = _x(3, 64).double()
    with torch.no_grad():
        before = module(x64)
    kernelab.patch(module)
    calls = _Calls(monkeypatch)
    with torch.no_grad():
        assert torch.equal(module(x64), before)  # float64: no kernel, the original forward
    assert calls.counts["rms_norm"] == 0


def test_empty_input_through_patched_modules():
    module = _randomized(nn.LayerNorm(64))
    kernelab.patch(module)
    x = torch.empty(0, 64, requires_grad=True)
    y = module(x)
    y.sum().backward()
    assert y.shape == (0, 64) and x.grad.shape == (0, 64)


# ============================================================================= the loss
def _loss_inputs(vocab=4097, seq=9, dtype=torch.float32):
    gen = torch.Generator().manual_seed(5)
    logits = (torch.randn(2, seq, vocab, generator=gen) * 3).to(dtype).requires_grad_(True)
    labels = torch.randint(0, vocab, (2, seq), generator=gen)
    labels[0, :3] = -100
    return logits, labels


@pytest.mark.parametrize("kwargs", [{}, {"num_items_in_batch": torch.tensor(11)}, {"ignore_index": 7},
                                    {"shift_labels": "given"}])
def test_causal_loss_matches_transformers(kwargs):
    from transformers.loss.loss_utils import ForCausalLMLoss

    logits, labels = _loss_inputs()
    if kwargs.get("shift_labels") == "given":
        kwargs = {"shift_labels": torch.roll(labels, 1, dims=1)}
    if "ignore_index" in kwargs:
        labels[labels == -100] = 7
    ref = ForCausalLMLoss(logits, labels, vocab_size=4097, **kwargs)
    (ref_grad,) = torch.autograd.grad(ref, logits)
    ours = patch_loss.causal_lm_loss(logits, labels, vocab_size=4097, **kwargs)
    (grad,) = torch.autograd.grad(ours, logits)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-7)


def test_causal_loss_in_float16_reads_the_logits_in_their_dtype():
    from transformers.loss.loss_utils import ForCausalLMLoss

    logits, labels = _loss_inputs(vocab=2880, dtype=torch.float16)
    ref = ForCausalLMLoss(logits, labels, vocab_size=2880)  # float32 copy of the logits inside
    (ref_grad,) = torch.autograd.grad(ref, logits)
    ours = patch_loss.causal_lm_loss(logits, labels, vocab_size=2880)
    (grad,) = torch.autograd.grad(ours, logits)
    assert ours.dtype == torch.float32 and grad.dtype == torch.float16
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=0)  # float32 out of the kernel: not rounded to float16
    with_items = patch_loss.causal_lm_loss(logits, labels, vocab_size=2880, num_items_in_batch=torch.tensor(7))
    assert with_items.dtype == torch.float32
    torch.testing.assert_close(with_items, ForCausalLMLoss(logits, labels, vocab_size=2880, num_items_in_batch=7),
                               rtol=1e-5, atol=0)
    torch.testing.assert_close(grad, ref_grad, rtol=4e-3, atol=2e-3 * float(ref_grad.abs().max()))


def test_a_loss_function_of_other_math_is_left_alone():
    model, inputs = _build("llama")
    model.loss_function = lambda logits, labels, vocab_size, **kw: F.cross_entropy(logits.reshape(-1, vocab_size), labels.reshape(-1)) * 2
    report = kernelab.patch(model)
    assert [s.kind for s in report.swapped].count("loss") == 0
    assert any(s.kind == "loss" and "neither causal nor token" in s.reason for s in report.skipped)


def test_a_classification_loss_is_refused_as_not_a_token_loss():
    """HF's image and sequence classifiers call ``self.loss_function`` too, with (labels,
    pooled_logits, config): the probe's token-loss call raises TypeError, reported in words."""
    config = transformers.ViTConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                                    image_size=16, patch_size=8, num_labels=3)
    report = kernelab.patch(transformers.ViTForImageClassification(config))
    reasons = [s.reason for s in report.skipped if s.kind == "loss"]
    assert reasons and "is not a token cross-entropy" in reasons[0], reasons


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_fused_lm_head_equals_unpatched_and_holds_no_logits(name, monkeypatch):
    model, inputs = _build(name)
    ref_loss, ref_grads = _step(model, inputs)
    report = kernelab.patch(model, fused_lm_head=True)
    assert [s.op for s in report.swapped if s.kind == "loss"] == [patch_lm_head.OP_LABEL]
    calls = _Calls(monkeypatch, names=("linear_cross_entropy", "cross_entropy"))
    loss, grads = _step(model, inputs)
    _assert_same_step(loss, grads, ref_loss, ref_grads)
    assert calls.counts == {"linear_cross_entropy": 1, "cross_entropy": 0}
    assert model(**inputs).logits is None
    with torch.no_grad():  # without labels: the original forward, logits and all
        assert model(input_ids=inputs["input_ids"]).logits.shape[-1] == model.config.vocab_size
    kernelab.unpatch(model)
    assert "forward" not in model.__dict__


def test_fused_lm_head_refused_where_the_forward_does_more():
    model, _ = _build("mixtral")  # the router's load-balancing loss is added to the LM loss
    report = kernelab.patch(model, fused_lm_head=True)
    assert any(s.kind == "loss" and "fused LM head: fused loss differs" in s.reason for s in report.skipped)
    assert [s.op for s in report.swapped if s.kind == "loss"] == ["cross_entropy (causal LM: labels shifted)"]


def test_fused_lm_head_refused_for_soft_capped_logits():
    """Gemma-2 caps its logits (30 * tanh(z / 30)) before the loss. At a freshly built model's
    small logits the cap is the identity to ~1e-4, and a probe at those weights alone swapped the
    head: a loss without the cap, silently (found 2026-12-05). The probe's second run at 64x the
    head's weight refuses it; the plain loss patch (on the capped logits) still applies."""
    cfg = transformers.Gemma2Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=16, vocab_size=128, max_position_embeddings=64,
                                    final_logit_softcapping=30.0)
    cfg._attn_implementation = "eager"  # (no SDPA path in Gemma-2's modeling)
    torch.manual_seed(0)
    model = transformers.Gemma2ForCausalLM(cfg).train()
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    inputs = {"input_ids": ids, "labels": ids.clone()}
    weight = model.get_output_embeddings().weight.detach().clone()
    ref_loss, ref_grads = _step(model, inputs)
    report = kernelab.patch(model, fused_lm_head=True)
    assert any(s.kind == "loss" and "fused LM head: fused loss differs" in s.reason for s in report.skipped)
    assert [s.op for s in report.swapped if s.kind == "loss"] == ["cross_entropy (causal LM: labels shifted)"]
    assert torch.equal(model.get_output_embeddings().weight, weight)  # the probe's scaling undone exactly
    _assert_same_step(*_step(model, inputs), ref_loss, ref_grads)


def test_fused_lm_head_probe_never_overflows_the_weights():
    """A float16 head with a weight of 2000: x 64 would be inf (float16 ends at 65504) and / 64
    would not bring it back, so the probe skips its scaled run and leaves every weight as it was."""
    model, _ = _build("llama")
    model = model.half()
    head = model.get_output_embeddings()
    with torch.no_grad():
        head.weight[0, 0] = 2000.0
    before = head.weight.detach().clone()
    kernelab.patch(model, fused_lm_head=True)
    assert torch.equal(model.get_output_embeddings().weight, before)


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_fused_mlp_equals_unpatched_and_runs_the_dual_gemm(name, monkeypatch):
    model, inputs = _build(name)
    ref_loss, ref_grads = _step(model, inputs)
    report = kernelab.patch(model, fused_mlp=True)
    layers = model.config.num_hidden_layers
    assert _swap_counts(report)[("mlp", "swiglu_linear")] == layers, str(report)
    calls = _Calls(monkeypatch, names=("swiglu_linear", "silu_mul"))
    loss, grads = _step(model, inputs)
    _assert_same_step(loss, grads, ref_loss, ref_grads)
    assert calls.counts == {"swiglu_linear": layers, "silu_mul": 0}
    # a hook on gate: the products are computed apart (the hook sees gate(x)), silu_mul fused
    seen = []
    model.model.layers[0].mlp.gate_proj.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    loss, grads = _step(model, inputs)
    _assert_same_step(loss, grads, ref_loss, ref_grads)
    assert len(seen) == 1 and calls.counts == {"swiglu_linear": 2 * layers - 1, "silu_mul": 1}


def test_fused_mlp_under_torch_compile_fullgraph():
    model, inputs = _build("llama")
    ref_loss, ref_grads = _step(model, inputs)
    kernelab.patch(model, fused_mlp=True)
    compiled, targets = _recording_compile(model)
    loss, grads = _step(compiled, inputs)
    _assert_same_step(loss, {k.removeprefix("_orig_mod."): v for k, v in grads.items()}, ref_loss, ref_grads)
    assert targets.count("kernelab.swiglu_linear.default") == model.config.num_hidden_layers
    assert targets.count("kernelab.pointwise.default") == 0  # no separate silu_mul


@pytest.mark.parametrize("module, words", [
    (GatedMLP(48, 80, nn.GELU(), bias=False), "fused_mlp: gated gelu"),
    (GatedMLP(48, 80, bias=True), "fused_mlp: gate or up has a bias"),
])
def test_fused_mlp_refusals_keep_the_activation_kernel(module, words):
    module = _randomized(module)
    x = _x(2, 7, 48)
    with torch.no_grad():
        before = module(x)
    report = kernelab.patch(module, fused_mlp=True)
    assert len(report.swapped) == 1 and words in report.swapped[0].op, report.swapped[0].op
    assert not report.swapped[0].op.startswith("swiglu_linear")
    with torch.no_grad():
        assert torch.allclose(module(x), before, rtol=1e-5, atol=1e-5)


def test_fused_mlp_under_autocast_falls_back_to_separate_products(monkeypatch):
    module = _randomized(GatedMLP(48, 80, bias=False))
    assert kernelab.patch(module, fused_mlp=True).swapped[0].op.startswith("swiglu_linear")
    calls = _Calls(monkeypatch, names=("swiglu_linear", "silu_mul"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = module(_x(2, 7, 48))
    assert y.dtype == torch.bfloat16 and calls.counts == {"swiglu_linear": 0, "silu_mul": 1}


# ============================================================================= the report
def test_report_prints_a_folded_table():
    model, _ = _build("llama")
    report = kernelab.patch(model)
    text = str(report)
    assert text.splitlines()[0] == "kernelab.patch: 8 swapped (5 norm, 2 mlp, 1 loss), 0 left alone"
    assert "model.layers.*.input_layernorm (x2)" in text and "LlamaRMSNorm" in text
    assert report.counts() == {"norm": 5, "mlp": 2, "loss": 1}
    assert report.paths("loss") == [""]
    from rich.console import Console

    console = Console(record=True, width=200)
    console.print(report)
    assert "model.layers.*.mlp (x2)" in console.export_text()


def test_patch_refuses_what_is_not_a_module():
    with pytest.raises(TypeError, match="expected a torch.nn.Module"):
        kernelab.patch(lambda x: x)


# ============================================================================= fused_linear (projection + activation)
class PlainMLP(nn.Module):
    """fc2(drop(act(fc1(x)))) -- BERT/ViT's MLP form; ``leak``: the forward also adds fc1(x)
    unactivated (fusing fc1 with act would then change the output)."""

    def __init__(self, h=48, i=80, act=None, leak=False, p=0.0):
        super().__init__()
        self.fc1, self.act, self.drop, self.fc2 = nn.Linear(h, i), act or nn.GELU(), nn.Dropout(p), nn.Linear(i, h)
        self.leak = leak

    def forward(self, x):
        z = self.fc1(x)
        y = self.drop(self.act(z))
        return self.fc2(y + z if self.leak else y)


def _zoo_step(name, model, inputs):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)  # dropout's masks: the same draws in both runs
    loss = ZOO[name].loss(model, inputs)
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name, fused", [("gpt2", 2), ("bert", 3), ("vit", 2)])
def test_fused_linear_equals_unpatched_and_runs_one_gemm_per_mlp(name, fused, monkeypatch):
    model, inputs = ZOO[name].build("tiny")
    ref_loss, ref_grads = _zoo_step(name, model, inputs)
    report = kernelab.patch(model, fused_linear=True)
    ops = [s.op for s in report.swapped if s.op.startswith("linear(")]
    assert len(ops) == fused, str(report)
    calls = _Calls(monkeypatch, names=("linear",))
    loss, grads = _zoo_step(name, model, inputs)
    _assert_same_step(loss, grads, ref_loss, ref_grads)
    assert calls.counts == {"linear": fused}
    kernelab.unpatch(model)
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert kernelab.patch(model).counts()["mlp"] == 0  # opt-in: the default patch leaves these MLPs alone


def test_fused_linear_under_torch_compile_fullgraph():
    module = _randomized(PlainMLP(p=0.0))
    x = _x(2, 7, 48)
    ref = _module_grads(module, x)
    kernelab.patch(module, fused_linear=True)
    compiled, targets = _recording_compile(module)
    got = _module_grads(compiled, x)
    for a, b in zip(got, ref):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5)
    assert targets.count("kernelab.linear.default") == 1


@pytest.mark.parametrize("make, words", [
    (lambda: PlainMLP(leak=True), "output changes when fused"),
    (lambda: PlainMLP(act=nn.Tanh()), None),  # not an activation kernelab fuses: not a candidate
])
def test_fused_linear_refuses_what_the_probe_disproves(make, words):
    module = _randomized(make())
    x = _x(2, 7, 48)
    with torch.no_grad():
        before = module(x)
    report = kernelab.patch(module, fused_linear=True)
    assert not report.swapped
    if words:
        assert any(words in s.reason for s in report.skipped), str(report)
    with torch.no_grad():
        assert torch.equal(module(x), before)


def test_fused_linear_leaves_shared_and_hooked_modules_alone():
    shared = nn.Sequential(PlainMLP(), PlainMLP())
    shared[1].act = shared[0].act
    report = kernelab.patch(shared, fused_linear=True)
    assert not report.swapped and any("more than one place" in s.reason for s in report.skipped)
    hooked = PlainMLP()
    hooked.fc1.register_forward_hook(lambda m, i, o: None)
    report = kernelab.patch(hooked, fused_linear=True)
    assert not report.swapped and any("forward hooks" in s.reason for s in report.skipped)


def test_fused_linear_with_dropout_and_under_autocast(monkeypatch):
    module = _randomized(PlainMLP(p=0.3)).train()
    x = _x(2, 7, 48)
    torch.manual_seed(5)
    before = module(x)
    assert kernelab.patch(module, fused_linear=True).swapped
    torch.manual_seed(5)
    assert torch.allclose(module(x), before, rtol=1e-5, atol=1e-5)  # the same dropout mask, after the activation
    calls = _Calls(monkeypatch, names=("linear",))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.manual_seed(5)
        y = module(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        kernelab.unpatch(module)
        torch.manual_seed(5)
        ref = module(x)
    assert calls.counts == {"linear": 0} and y.dtype == torch.bfloat16 and torch.equal(y, ref)
