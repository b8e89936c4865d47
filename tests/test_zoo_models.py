"""The model zoo itself, in eager mode: every tiny model builds the same way twice, trains one step
to a finite loss near log(classes), gives every trainable parameter a finite, non-zero gradient
that matches a float64 recomputation, and runs inference in eval mode. (The compiler's checks
against the zoo live with the compiler's tests.)"""

from __future__ import annotations

import math

import pytest
import torch

from kernelab.zoo import SIZES, ZOO, ZooModel

pytest.importorskip("transformers")
pytest.importorskip("timm")
pytest.importorskip("torchvision")

NAMES = sorted(ZOO)


def _train_step(zm: ZooModel, dtype=torch.float32):
    model, inputs = zm.build("tiny", device="cpu", dtype=dtype)
    loss = zm.loss(model, inputs)
    loss.backward()
    return model, inputs, loss.detach()


def test_registry_lists_the_issue_models():
    assert set(ZOO) >= {"gpt2", "llama", "bert", "t5", "mixtral", "vit", "resnet", "convnext"}
    for name, zm in ZOO.items():
        assert zm.name == name and zm.kind in ("hf", "vision")
        assert set(zm.summary) == set(SIZES)


def test_import_is_lazy():
    import subprocess
    import sys

    code = "import sys, kernelab.zoo; print(any(m in sys.modules for m in ('transformers', 'timm', 'torchvision')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_unknown_size_is_refused():
    with pytest.raises(ValueError, match="size"):
        ZOO["gpt2"].build("huge")


@pytest.mark.parametrize("name", NAMES)
def test_tiny_train_step_is_finite_and_deterministic(name):
    zm = ZOO[name]
    model, inputs, loss = _train_step(zm)
    assert loss.ndim == 0 and torch.isfinite(loss)
    n_classes = model.config.vocab_size if zm.kind == "hf" else zm.forward(model, inputs).shape[-1]
    # untrained weights: the loss is near that of a uniform guess (within a factor of 2)
    assert 0.5 * math.log(n_classes) < float(loss) < 2 * math.log(n_classes)
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    assert trainable
    for n, p in trainable:
        assert p.grad is not None, f"{name}: {n} got no gradient"
        assert torch.isfinite(p.grad).all(), f"{name}: {n} has a non-finite gradient"
    nonzero = [n for n, p in trainable if p.grad.abs().max() > 0]
    assert len(nonzero) >= 0.9 * len(trainable), f"{name}: mostly zero gradients"

    model2, inputs2, loss2 = _train_step(zm)  # same seed: the same weights, inputs, loss, grads
    assert float(loss2) == float(loss)
    for (n, p), (_, p2) in zip(trainable, model2.named_parameters()):
        assert torch.equal(p, p2) and torch.equal(p.grad, p2.grad), n


@pytest.mark.parametrize("name", NAMES)
def test_tiny_float32_grads_match_float64(name):
    """The float32 step against the same model and inputs in float64: the zoo's models are
    numerically sane at tiny size (what a compiled float32 step will be compared with). The
    absolute floor (1e-6 of the global gradient norm) is for gradients that are zero in exact
    arithmetic: BERT's key biases (softmax is blind to a shift of every key) come out ~1e-21."""
    zm = ZOO[name]
    model, _, loss = _train_step(zm, torch.float32)
    model64, inputs64 = zm.build("tiny", dtype=torch.float64)
    if zm.kind == "hf" and model64.config._experts_implementation not in (None, "eager"):
        model64.set_experts_implementation("eager")  # torch._grouped_mm has no float64: the loop does
    loss64 = zm.loss(model64, inputs64)
    loss64.backward()
    loss64 = loss64.detach()
    assert abs(float(loss) - float(loss64)) <= 1e-5 * abs(float(loss64))
    total = math.sqrt(sum(float(p.grad.norm()) ** 2 for p in model64.parameters() if p.grad is not None))
    for (n, p), p64 in zip(model.named_parameters(), model64.parameters()):
        if not p.requires_grad:
            continue
        err = float((p.grad.double() - p64.grad).norm()) / (float(p64.grad.norm()) + 1e-6 * total)
        assert err < 1e-4, f"{name}: {n} float32 gradient off by {err:.2e} relative"


@pytest.mark.parametrize("name", NAMES)
def test_tiny_inference_gives_logits(name):
    zm = ZOO[name]
    model, inputs = zm.build("tiny")
    model.eval()
    with torch.no_grad():
        out = zm.forward(model, inputs)
        again = zm.forward(model, inputs)
    assert torch.isfinite(out).all() and torch.equal(out, again)
    if zm.kind == "hf":
        ids = inputs.get("decoder_input_ids", inputs["input_ids"])
        assert out.shape == (*ids.shape, model.config.vocab_size)
    else:
        images, labels = inputs
        assert out.ndim == 2 and out.shape[0] == images.shape[0] and out.shape[1] > int(labels.max())


def test_vision_inputs_are_images_and_labels():
    for name in ("vit", "resnet", "convnext"):
        zm = ZOO[name]
        model, (images, labels) = zm.build("tiny")
        assert images.dtype == torch.float32 and images.ndim == 4 and labels.dtype == torch.int64
        assert labels.shape == (images.shape[0],)
        assert int(labels.max()) < zm.forward(model, (images, labels)).shape[-1]


def test_build_honours_dtype():
    model, inputs = ZOO["llama"].build("tiny", dtype=torch.float64)
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    assert inputs["input_ids"].dtype == torch.int64  # token ids keep their integer dtype
    model, (images, labels) = ZOO["vit"].build("tiny", dtype=torch.float64)
    assert images.dtype == torch.float64 and labels.dtype == torch.int64


@pytest.mark.parametrize("name", NAMES)
def test_train_mode_is_deterministic(name):
    """Dropout is off: two training forwards without reseeding (the RNG moves on) agree exactly."""
    zm = ZOO[name]
    model, inputs = zm.build("tiny")
    assert model.training
    with torch.no_grad():
        first, second = zm.loss(model, inputs), zm.loss(model, inputs)
    assert torch.equal(first, second)
