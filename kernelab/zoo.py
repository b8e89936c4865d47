"""Real models built from their configs, no weights: the zoo the compiler is checked against.

    from kernelab.zoo import ZOO
    zm = ZOO["gpt2"]
    model, inputs = zm.build("tiny", device="cpu", dtype=torch.float32)
    zm.loss(model, inputs).backward()                    # one training step's forward + backward
    logits = zm.forward(model, inputs)                    # inference (call under torch.no_grad())
    zm.loss(torch.compile(model, backend="kernelab"), inputs)

Two sizes: ``"tiny"`` (CPU tests under Triton's interpreter: hidden 48-64, 2 layers, 16 tokens,
batch 2, 32x32 or 64x64 images, vocab ~128) and ``"bench"`` (what an H200 runs: GPT-2 small at 1024
tokens, a Llama-3.2-1B config cut to 4 layers at 2048 tokens, BERT-base at 512, T5-base cut to 6+6
layers, a Mixtral-style MoE cut small, ViT-B/16 and ConvNeXt-T at 224, torchvision ResNet-50).

Every build is deterministic: ``torch.manual_seed(0)`` before the model is made (on ``device``),
inputs drawn from a seeded CPU generator and then moved, so the same size, device and dtype give
the same weights and inputs every time. Dropout is off everywhere (every dropout probability is 0),
and the model comes back in train mode, so a training step is deterministic and batch norm uses
batch statistics; call ``model.eval()`` for inference. Hugging Face models use
``attn_implementation="sdpa"`` (falling back to ``"eager"`` where a version does not offer it).

Inputs: a dict of keyword arguments for Hugging Face models (``labels`` included: ``loss`` passes
them, ``forward`` drops them; Mixtral trains with its router's load-balancing loss added, as it is
trained, and infers without it), a tuple ``(images, labels)`` for vision models (labels drawn from the
seeded generator; the loss is cross-entropy in float32, as autocast would compute it).

transformers, timm and torchvision are imported inside ``build`` only: importing this module costs
nothing and needs none of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Union

import torch

__all__ = ["ZOO", "ZooModel", "SIZES"]

SIZES = ("tiny", "bench")
Inputs = Union[dict, tuple]
_SEED = 0


@dataclass(frozen=True)
class ZooModel:
    """One model of the zoo: how to build it at each size, call it and take its loss.

    ``kind`` is ``"hf"`` (inputs: dict of keyword arguments with ``labels``; ``.loss`` and
    ``.logits`` of the output) or ``"vision"`` (inputs: ``(images, labels)``; logits out).
    ``dtype`` is the dtype the model is usually run in on a GPU (bf16 for the language models,
    ViT and ConvNeXt; fp32 for ResNet); ``build`` itself uses whatever dtype it is given.
    """

    name: str
    kind: str
    dtype: torch.dtype
    summary: dict = field(compare=False)  # size -> one line describing config and inputs
    _make: Callable = field(repr=False, compare=False)  # (size, gen) -> (module factory, CPU inputs)
    infer_kwargs: dict = field(default_factory=dict, compare=False)  # HF: extra keywords for inference

    def build(self, size: str = "tiny", device="cpu", dtype: torch.dtype = torch.float32):
        """``(module, inputs)`` at ``size`` on ``device`` in ``dtype`` (floating inputs too)."""
        if size not in SIZES:
            raise ValueError(f"size must be one of {SIZES}, not {size!r}")
        device = torch.device(device)
        factory, inputs = self._make(size, torch.Generator().manual_seed(_SEED))  # inputs on the CPU
        torch.manual_seed(_SEED)
        with torch.device(device):  # weights made (and initialized) where they will live
            module = factory()
        module = module.to(device=device, dtype=dtype).train()
        return module, _to(inputs, device, dtype)

    def forward(self, module, inputs: Inputs) -> torch.Tensor:
        """The logits (inference): labels are not passed."""
        if self.kind == "vision":
            return module(inputs[0])
        return module(**{k: v for k, v in inputs.items() if k != "labels"}, **self.infer_kwargs).logits

    def loss(self, module, inputs: Inputs) -> torch.Tensor:
        """Scalar training loss: the model's own ``.loss`` with labels (HF), else cross-entropy."""
        if self.kind == "vision":
            images, labels = inputs
            return torch.nn.functional.cross_entropy(module(images).float(), labels)
        return module(**inputs).loss


def _to(inputs: Inputs, device, dtype):
    def move(t):
        return t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)

    if isinstance(inputs, dict):
        return {k: move(v) for k, v in inputs.items()}
    return tuple(move(v) for v in inputs)


def _tokens(gen, vocab: int, batch: int, seq: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=gen, device="cpu")


def _hf(model_cls, config):
    """A factory of the model, with SDPA attention where this transformers version offers it."""

    def make():
        try:
            config._attn_implementation = "sdpa"
            return model_cls(config)
        except (ValueError, ImportError):
            config._attn_implementation = "eager"
            return model_cls(config)

    return make


def _causal_lm(model_cls, config, gen, batch: int, seq: int):
    ids = _tokens(gen, config.vocab_size, batch, seq)
    return _hf(model_cls, config), {"input_ids": ids, "labels": ids.clone()}


# ----------------------------------------------------------------------------- language models
_LM_TINY = (2, 16)  # batch, tokens


def _gpt2(size, gen):
    from transformers import GPT2Config, GPT2LMHeadModel

    if size == "tiny":
        cfg, (b, s) = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64), _LM_TINY
    else:  # GPT-2 small
        cfg, (b, s) = dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024), (8, 1024)
    eos = cfg["vocab_size"] - 1
    config = GPT2Config(**cfg, bos_token_id=eos, eos_token_id=eos, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return _causal_lm(GPT2LMHeadModel, config, gen, b, s)


def _llama(size, gen):
    from transformers import LlamaConfig, LlamaForCausalLM

    if size == "tiny":
        cfg = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
        b, s = _LM_TINY
    else:  # Llama-3.2-1B's config, 4 of its 16 layers
        cfg = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=4, num_attention_heads=32,
                   num_key_value_heads=8, vocab_size=128256, max_position_embeddings=2048,
                   rope_theta=500000.0, tie_word_embeddings=True, rms_norm_eps=1e-5)
        b, s = 4, 2048
    config = LlamaConfig(**cfg, attention_dropout=0.0, bos_token_id=0, eos_token_id=1, pad_token_id=None)
    return _causal_lm(LlamaForCausalLM, config, gen, b, s)


def _mixtral(size, gen):
    from transformers import MixtralConfig, MixtralForCausalLM

    if size == "tiny":
        cfg = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, vocab_size=128,
                   max_position_embeddings=64)
        b, s = _LM_TINY
    else:  # Mixtral-8x7B's shape (8 experts, top-2, GQA 4:1, d_ff 3.5 d) at 1/4 width, 4 layers
        cfg = dict(hidden_size=1024, intermediate_size=3584, num_hidden_layers=4, num_attention_heads=16,
                   num_key_value_heads=4, num_local_experts=8, num_experts_per_tok=2, vocab_size=32000,
                   max_position_embeddings=2048, rope_theta=1e6)
        b, s = 4, 2048
    # trained as Mixtral is: the router's load-balancing loss (coefficient 0.02) added to the LM loss
    config = MixtralConfig(**cfg, attention_dropout=0.0, router_jitter_noise=0.0, output_router_logits=True,
                           router_aux_loss_coef=0.02, bos_token_id=0, eos_token_id=1, pad_token_id=None)
    return _causal_lm(MixtralForCausalLM, config, gen, b, s)


def _bert(size, gen):
    from transformers import BertConfig, BertForMaskedLM

    if size == "tiny":
        cfg = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                   vocab_size=128, max_position_embeddings=64)
        b, s = _LM_TINY
    else:  # BERT-base
        cfg = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                   vocab_size=30522, max_position_embeddings=512)
        b, s = 16, 512
    config = BertConfig(**cfg, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=0)
    ids = _tokens(gen, cfg["vocab_size"], b, s)
    mask = torch.ones(b, s, dtype=torch.long)
    mask[-1, s - s // 4:] = 0  # the last sequence padded by a quarter, as batches of text are
    ids = ids.masked_fill(mask == 0, 0)
    labels = torch.full_like(ids, -100)
    pick = (torch.rand(b, s, generator=gen) < 0.15) & (mask == 1)
    pick[0, 0] = True  # at least one masked-LM target
    labels[pick] = ids[pick]
    inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids), "labels": labels}
    return _hf(BertForMaskedLM, config), inputs


def _t5(size, gen):
    from transformers import T5Config, T5ForConditionalGeneration

    if size == "tiny":
        cfg = dict(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
                   vocab_size=128, relative_attention_num_buckets=8, relative_attention_max_distance=32)
        b, s_enc, s_dec = 2, 16, 8
    else:  # T5-base widths, 6 encoder + 6 decoder layers (of 12 + 12)
        cfg = dict(d_model=768, d_kv=64, d_ff=3072, num_layers=6, num_decoder_layers=6, num_heads=12,
                   vocab_size=32128)
        b, s_enc, s_dec = 16, 512, 128
    config = T5Config(**cfg, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    model = _hf(T5ForConditionalGeneration, config)
    labels = _tokens(gen, cfg["vocab_size"] - 2, b, s_dec) + 2  # no pad (0) or eos (1) among targets
    decoder_ids = torch.cat([torch.zeros(b, 1, dtype=labels.dtype), labels[:, :-1]], dim=1)  # shift right
    ids = _tokens(gen, cfg["vocab_size"], b, s_enc)
    return model, {"input_ids": ids, "decoder_input_ids": decoder_ids, "labels": labels}


# ----------------------------------------------------------------------------- vision
def _images(gen, batch: int, side: int, classes: int):
    images = torch.randn(batch, 3, side, side, generator=gen)
    return images, torch.randint(0, classes, (batch,), generator=gen)


def _timm(tiny: tuple, bench: tuple):
    """A timm model's maker: (name, kwargs) for the tiny size and for the bench size."""
    def make_for(size, gen):
        import timm

        name, kw = tiny if size == "tiny" else bench
        b, side, classes = (2, 32, 10) if size == "tiny" else (32, 224, 1000)
        make = lambda: _zero_dropout(timm.create_model(name, pretrained=False, num_classes=classes, **kw))  # noqa: E731
        return make, _images(gen, b, side, classes)
    return make_for


# vit_small_patch16_224's recipe at 32x32, patch 8 (16 patches + class token)
_vit = _timm(("vit_small_patch16_224", dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4)),
             ("vit_base_patch16_224", {}))
_convnext = _timm(("convnext_atto", dict(depths=(1, 1, 2, 1), dims=(16, 32, 48, 64))), ("convnext_tiny", {}))


def _resnet(size, gen):
    import torchvision

    if size == "tiny":  # 64x64 so that layer4's batch norm sees 2x2x2 values per channel, not 2
        arch, (b, side, classes) = torchvision.models.resnet18, (2, 64, 10)
    else:
        arch, (b, side, classes) = torchvision.models.resnet50, (64, 224, 1000)
    return lambda: arch(num_classes=classes), _images(gen, b, side, classes)


def _zero_dropout(model):
    """timm's defaults are already 0; make sure no dropout or drop-path is live."""
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        if hasattr(m, "drop_prob"):
            m.drop_prob = 0.0
    return model


# ----------------------------------------------------------------------------- the registry
def _entry(name, kind, dtype, make, tiny, bench, **infer_kwargs):
    return name, ZooModel(name, kind, dtype, {"tiny": tiny, "bench": bench}, make, infer_kwargs)


ZOO: dict[str, ZooModel] = dict([
    _entry("gpt2", "hf", torch.bfloat16, _gpt2, "GPT2LMHeadModel 2L d64 h4 V128; 2x16 tokens",
           "GPT-2 small: 12L d768 h12 V50257; 8x1024 tokens"),
    _entry("llama", "hf", torch.bfloat16, _llama, "LlamaForCausalLM 2L d64 h4 kv2 ff96 V128; 2x16 tokens",
           "Llama-3.2-1B config cut to 4L: d2048 h32 kv8 ff8192 V128256 tied; 4x2048 tokens"),
    _entry("bert", "hf", torch.bfloat16, _bert, "BertForMaskedLM 2L d64 h4 ff128 V128; 2x16 tokens, padding",
           "BERT-base MLM: 12L d768 h12 ff3072 V30522; 16x512 tokens, padding"),
    _entry("t5", "hf", torch.bfloat16, _t5, "T5ForConditionalGeneration 2+2L d64 h4 ff128 V128; 2x16 -> 2x8",
           "T5-base widths, 6+6L d768 h12 ff3072 V32128; 16x512 -> 16x128 tokens"),
    _entry("mixtral", "hf", torch.bfloat16, _mixtral,
           "MixtralForCausalLM 2L d64 h4 kv2 4 experts top-2 V128, aux loss; 2x16 tokens",
           "Mixtral-style MoE 4L d1024 h16 kv4 ff3584 8 experts top-2 V32000, aux loss; 4x2048 tokens",
           output_router_logits=False),  # the load-balancing loss is for training only
    _entry("vit", "vision", torch.bfloat16, _vit, "timm ViT 2L d64 h4 patch 8; 2x3x32x32, 10 classes",
           "timm vit_base_patch16_224; 32x3x224x224, 1000 classes"),
    _entry("resnet", "vision", torch.float32, _resnet, "torchvision resnet18; 2x3x64x64, 10 classes",
           "torchvision resnet50; 64x3x224x224, 1000 classes"),
    _entry("convnext", "vision", torch.bfloat16, _convnext, "timm convnext_atto depths 1,1,2,1 dims 16-64; 2x3x32x32",
           "timm convnext_tiny; 32x3x224x224, 1000 classes"),
])
