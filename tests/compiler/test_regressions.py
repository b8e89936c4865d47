"""Bugs found by people who tried the compiler on code we did not write (issue 11), each pinned by
the smallest program that showed it, compared with eager forward and backward."""
import os
import warnings

import pytest
import torch
import torch.nn.functional as F

import kernelab.compiler as klc
from kernelab.compiler import fusion
from tests.compiler.conftest import assert_close
from tests.compiler.test_golden import forward_groups


def _r(*shape, seed=0, grad=False):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).requires_grad_(grad)


def literal_scale(x):
    return x * torch.tensor(2.0)


def zero_first_column(x):
    y = x * 3
    y[:, 0] = 0
    return y + 1


def zero_masked(x):
    y = x * 2
    y[x > 0.5] = 0
    return y.sin()


def cat_after_empty(x):
    return torch.cat([torch.tensor([]), x.flatten()]) * 2


def literal_bias(x):
    return (x + torch.tensor([1.0, -2.0, 0.5])).relu()


def split_views(x, w):
    """GPT-2's attention input: one projection split in three, each viewed as heads. The views of
    the 2nd and 3rd splits start inside the storage (offsets 1/3 and 2/3 of a row)."""
    q, k, v = (x @ w).split(x.shape[-1], dim=-1)
    heads = [t.view(2, 5, 2, 4).transpose(1, 2) for t in (q, k, v)]
    return (heads[0] * heads[1]).sigmoid() + heads[2].tanh()


def _loss_and_grad(fn, x, *rest):
    """fn(x, *rest) (a scalar) and the gradient of x, eager then compiled: ((eager), (compiled))."""
    results = []
    for f in (fn, torch.compile(fn, backend="kernelab")):
        x.grad = None
        loss = f(x, *rest)
        loss.backward()
        results.append((loss.detach(), x.grad.clone()))
    return results


def _broken(message):
    def fail(*args, **kwargs):
        raise RuntimeError(message)
    return fail


PROGRAMS = {
    "tensor literal": (literal_scale, lambda: (_r(2, 3, grad=True),)),
    "x[:, 0] = 0": (zero_first_column, lambda: (_r(4, 5, grad=True),)),
    "y[mask] = 0": (zero_masked, lambda: (_r(4, 5, grad=True),)),
    "cat with torch.tensor([])": (cat_after_empty, lambda: (_r(3, 4, grad=True),)),
    "literal vector": (literal_bias, lambda: (_r(4, 3, grad=True),)),
    "split then views": (split_views, lambda: (_r(2, 5, 8, grad=True), _r(8, 24, seed=1, grad=True))),
}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_program_forward_and_backward(name):
    fn, make = PROGRAMS[name]
    args = make()
    expected = fn(*args)
    expected.sum().backward()
    ref_grads = [a.grad.clone() for a in args if a.requires_grad]
    for a in args:
        a.grad = None
    compiled = torch.compile(fn, backend="kernelab")
    compiled(*args).sum().backward()  # the first call records layouts (views, launches) ...
    for a in args:
        a.grad = None
    actual = compiled(*args)  # ... the second replays them
    actual.sum().backward()
    assert_close(actual, expected, what=f"{name} forward")
    for a, g in zip([a for a in args if a.requires_grad], ref_grads):
        assert_close(a.grad, g, what=f"{name} gradient")


def test_literal_explained_without_running():
    """Plan mode (no kernel runs) handles a tensor literal too: it used to fail with KeyError."""
    plan = klc.explain(literal_scale, _r(2, 3))
    assert plan.generated == 1


def test_sdpa_gradients_on_cpu():
    """The CPU flash-attention op was decomposed in the forward only: gradients 25-33x off."""
    q, k, v = (_r(2, 4, 16, 16, seed=i, grad=True) for i in range(3))

    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).sum()

    attention(q, k, v).backward()
    expected = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    torch.compile(attention, backend="kernelab")(q, k, v).backward()
    for t, g in zip((q, k, v), expected):
        assert_close(t.grad, g, what="attention gradient")


def test_sign_of_nan_is_zero():
    x = torch.tensor([float("nan"), -3.0, -0.0, 0.0, 2.0])
    actual = torch.compile(lambda x: torch.sign(x) + 1, backend="kernelab")(x)
    assert torch.equal(actual, torch.sign(x) + 1)


def test_truncated_cache_file_is_rebuilt(tmp_path, monkeypatch):
    """A kernel file cut short is often still valid Python that computes garbage: it must be
    noticed (it no longer matches its source hash), rewritten and used correctly."""
    monkeypatch.setenv("KERNELAB_CACHE", str(tmp_path))
    x = _r(64, 33)

    def fn(x):
        return (x.exp() * 3 - 1).softmax(-1)

    expected = fn(x)
    assert_close(torch.compile(fn, backend="kernelab")(x), expected, what="first compile")
    kernel_dir = tmp_path / "compiler"
    files = sorted(kernel_dir.glob("kl_fused_*.py"))
    assert files, "no kernel written to the cache"
    for f in files:  # keep only the head: the stores at the end are gone
        text = f.read_text()
        cut = text.rfind("tl.store")
        f.write_text(text[:cut] + "# truncated\n")

    from kernelab.compiler import kcache

    kcache.forget_imports()  # what a new process sees: only the disk
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        actual = torch.compile(fn, backend="kernelab")(x)
    assert_close(actual, expected, what="after truncation")
    assert any("does not match its source hash" in str(w.message) for w in seen)
    assert all(f.read_text().count("tl.store") >= 1 for f in files)


def test_fallback_is_recorded_with_its_reason(monkeypatch):
    """Without KERNELAB_STRICT a graph the compiler cannot plan runs as ATen, with one warning and
    an event naming the reason; the values are eager's."""
    import kernelab.compiler.graph as graph

    monkeypatch.delenv("KERNELAB_STRICT")
    monkeypatch.setattr(graph, "partition", _broken("planted planner bug"))
    klc.reset_events()
    x = _r(8, 8)
    with pytest.warns(UserWarning, match="planted planner bug"):
        actual = torch.compile(lambda x: x.sin() * 2, backend="kernelab")(x)
    assert_close(actual, x.sin() * 2, what="fallback")
    [(what, _, why)] = klc.events().fallbacks
    assert what == "graph" and "planted planner bug" in why


def test_strict_raises_instead_of_falling_back(monkeypatch):
    import kernelab.compiler.graph as graph

    monkeypatch.setattr(graph, "partition", _broken("planted planner bug"))
    with pytest.raises(Exception, match="planted planner bug"):
        torch.compile(lambda x: x.sin() * 2, backend="kernelab")(_r(8, 8))


def test_env_is_strict_in_tests():
    assert os.environ.get("KERNELAB_STRICT") == "1"


def test_aot_failure_runs_the_graph_eagerly(monkeypatch):
    """aot_autograd itself failing (a decomposition bug, an op it cannot trace) is a fallback too:
    the dynamo graph runs as captured, with the reason recorded."""
    import torch._functorch.aot_autograd as aot

    monkeypatch.delenv("KERNELAB_STRICT")
    monkeypatch.setattr(aot, "aot_module_simplified", _broken("planted tracing bug"))
    klc.reset_events()
    x = _r(4, 4)
    with pytest.warns(UserWarning, match="planted tracing bug"):
        actual = torch.compile(lambda x: x.cos() + 1, backend="kernelab")(x)
    assert_close(actual, x.cos() + 1, what="eager fallback")
    assert [what for what, _, _ in klc.events().fallbacks] == ["graph"]


def test_repeated_layers_share_one_kernel(tmp_path, monkeypatch):
    """The same group in two layers generates the same source (nodes named by position, not by
    their graph names), so it is written, imported and compiled once."""
    monkeypatch.setenv("KERNELAB_CACHE", str(tmp_path))

    def two_layers(x, w):
        h = F.layer_norm(x, (64,)) @ w
        return F.layer_norm(h, (64,)) @ w

    x, w = _r(8, 64), _r(64, 64, seed=1)
    klc.reset_events()
    assert_close(torch.compile(two_layers, backend="kernelab")(x, w), two_layers(x, w), what="two layers")
    assert klc.events().kernels_launched == 2
    assert len(list((tmp_path / "compiler").glob("kl_fused_*.py"))) == 1


def _ce(logits, target):
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), target.view(-1))


def test_cross_entropy_picks_its_logit_in_the_log_softmax_kernel():
    """gather(log_softmax, -1, target) is rewritten as a masked row sum: the forward is one row
    kernel (plus the target mask and the mean), never writing the (rows, vocab) log-probabilities."""
    logits, target = _r(2, 8, 50, grad=True), torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(1))
    target[0, 0] = -100  # ignored
    (expected, ref_grad), (actual, grad) = _loss_and_grad(_ce, logits, target)
    assert_close(actual, expected, what="loss")
    assert_close(grad, ref_grad, what="gradient")
    plan = klc.explain(_ce, logits.detach(), target)
    forward = plan.graphs[0]
    assert not any(op.startswith("aten.gather") for _, op, _ in forward.eager)
    assert any("amax" in " ".join(g.ops) and "eq" in " ".join(g.ops) for g in forward.groups)


def test_out_of_range_class_gives_nan_not_a_number():
    """Eager stops on a class index outside [0, N); the rewritten gather would pick nothing, so it
    gives NaN: loud, never a plausible loss."""
    logits = _r(4, 10)
    target = torch.tensor([1, 2, 13, 0])
    assert torch.isnan(torch.compile(_ce, backend="kernelab")(logits, target))


def test_scatter_of_one_value_per_row():
    def put(x, idx, src):
        return x.scatter(-1, idx, src) * 2 + x.scatter(-1, idx, 3.0)

    x, src = _r(6, 9), _r(6, 1, seed=1)
    idx = torch.tensor([[0], [8], [3], [3], [5], [1]])
    assert_close(torch.compile(put, backend="kernelab")(x, idx, src), put(x, idx, src), what="scatter")


def test_a_top_k_backward_scatters_its_k_gradients_in_the_softmax_kernel():
    """Mixtral's router: softmax, top-2, then the weights' gradient goes back among the experts
    by ``zeros.scatter(-1, indices, grad)``, two values a row. Restated as two comparisons with
    the column index (``one_hot_indexing``), the scatter joins the softmax backward's row kernel
    instead of running as ATen's scatter (a kernel, and its zero fill, a layer)."""
    def route(logits):
        weights, _ = torch.topk(torch.softmax(logits, -1), 2, dim=-1)
        return (weights * torch.tensor([1.0, 3.0])).sum()

    logits = _r(12, 8, grad=True)
    (expected, ref_grad), (actual, grad) = _loss_and_grad(route, logits)
    assert_close(actual, expected, what="loss")
    assert_close(grad, ref_grad, what="gradient")
    torch._dynamo.reset()
    plan = klc.explain(lambda x: route(x).backward(), logits.detach().clone().requires_grad_())
    backward = [gp for gp in plan.graphs if gp.kind == "backward"]
    assert backward and not [e for gp in backward for e in gp.eager if e[1].startswith("aten.scatter")], backward


def test_a_scatter_of_several_values_a_row_matches_atens_cpu_order():
    """Two indices naming one column: the later value wins, as ATen's CPU loop writes them; an
    index outside the row gives that row NaN (eager stops), never a plausible value."""
    def put(x, idx, src):
        return x.scatter(-1, idx, src) * 2 + x.scatter(-1, idx, 3.0)

    x, src = _r(4, 9), _r(4, 3, seed=1)
    idx = torch.tensor([[0, 0, 2], [8, 1, 3], [3, 3, 3], [5, 6, 7]])
    assert_close(torch.compile(put, backend="kernelab")(x, idx, src), put(x, idx, src), what="scatter")
    plan = klc.explain(put, x, idx, src)
    assert not any(op.startswith("aten.scatter") for graph in plan.graphs for _, op, _ in graph.eager)
    bad = idx.clone()
    bad[1, 2] = 9
    out = torch.compile(put, backend="kernelab")(x, bad, src)
    assert torch.isnan(out[1]).all() and not torch.isnan(out[[0, 2, 3]]).any()


_PADS = {
    "hf_shifted_labels": (lambda x: F.pad(x, (0, 1), value=-100)[..., 1:].contiguous() * 1,
                          lambda: torch.randint(0, 50, (3, 7))),
    "both_sides": (lambda x: F.pad(x, (2, 3), value=1.5) * 2, lambda: _r(2, 3, 4)),
    "middle_dim": (lambda x: F.pad(x, (0, 0, 1, 2), value=-1.0) + x.sum(), lambda: _r(2, 3, 4)),
    "sliced_back": (lambda x: F.pad(x, (1, 1))[..., 1:-1] + 1, lambda: _r(5, 6)),
    "sliced_into_the_fill": (lambda x: F.pad(x, (3, 0))[:, :2] + 1, lambda: _r(5, 6)),
    "nan_fill": (lambda x: F.pad(x, (1, 2), value=float("nan")) + 1, lambda: _r(5, 6)),
    "half": (lambda x: F.pad(x, (1, 2), value=7) + 1, lambda: _r(5, 6).half()),
    "bool": (lambda x: F.pad(x, (0, 2), value=1), lambda: _r(5, 6) > 0),
    "transposed": (lambda x: F.pad(x.t(), (1, 0), value=2.0) * 3, lambda: _r(5, 6)),
}


@pytest.mark.parametrize("name", list(_PADS))
def test_a_constant_pad_of_one_dim_is_generated(name):
    """``F.pad`` of one dim is a cat whose fills are literals (``rewrites.pads_as_cats``), and a
    slice of it keeps only the parts it reads (``slices_through_cats``): no ATen pad kernel. The
    loss of every Hugging Face causal LM shifts its labels so (``hf_shifted_labels``)."""
    fn, make = _PADS[name]
    x = make()
    torch.testing.assert_close(torch.compile(fn, backend="kernelab")(x), fn(x), equal_nan=True)
    plan = klc.explain(fn, x)
    assert not any(op == "aten.constant_pad_nd.default" for _, op, _ in plan.graphs[0].eager), plan


def test_a_pad_of_two_dims_stays_atens():
    """Two padded dims would be a cat of a cat, the inner one written to memory first: ATen's one
    pad kernel is kept (values as eager's)."""
    fn = lambda x: F.pad(x, (1, 1, 1, 1), value=0.5) * 2  # noqa: E731
    x = _r(3, 4)
    torch.testing.assert_close(torch.compile(fn, backend="kernelab")(x), fn(x), rtol=0, atol=0)
    assert any(op == "aten.constant_pad_nd.default" for _, op, _ in klc.explain(fn, x).graphs[0].eager)


def test_an_op_repeated_on_unsqueezed_operands_is_a_view_of_the_first():
    """Cross-entropy with ``ignore_index`` clamps its targets ``where(t != -100, t, 0)`` for the
    forward and again on ``t.unsqueeze(1)`` for the backward: ``rewrites.unsqueezed_repeats``
    makes the second an unsqueeze of the first (one kernel computes the clamp, where two did).
    An operand that would broadcast otherwise once unsqueezed is left alone."""
    def clamps(t):
        first = torch.where(t != -100, t, 0)
        again = torch.where(t.unsqueeze(1) != -100, t.unsqueeze(1), 0)
        return first * 3, again

    t = torch.tensor([4, -100, 7, 0, -100, 2])
    for got, want in zip(torch.compile(clamps, backend="kernelab")(t), clamps(t)):
        assert torch.equal(got, want)
    groups = forward_groups(clamps, t)
    assert sum(fusion.short_name(n) == "where" for g in groups for n in g.nodes) == 1, groups

    def broadcasting(a, b):  # (4,) with (3, 4): unsqueezed, (4, 1) with (3, 1, 4) is another shape
        return a + b, a.unsqueeze(1) + b.unsqueeze(1)

    a, b = _r(4), _r(3, 4, seed=1)
    for got, want in zip(torch.compile(broadcasting, backend="kernelab")(a, b), broadcasting(a, b)):
        torch.testing.assert_close(got, want)


def test_upcast_logits_are_never_written_in_float32():
    """HF's loss: ``logits.float().view(-1, V)`` then cross-entropy. The cast moves below the view
    into the loss kernel (forward) and the gradient's cast back above its view (backward): no
    kernel writes the float32 (rows, vocab) logits or their float32 gradient."""
    def hf_loss(logits, target):
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), target.view(-1))

    logits = _r(2, 8, 40).half().requires_grad_(True)
    target = torch.randint(0, 40, (2, 8), generator=torch.Generator().manual_seed(3))
    (expected, ref_grad), (actual, grad) = _loss_and_grad(hf_loss, logits, target)
    assert_close(actual, expected, what="loss")
    assert_close(grad, ref_grad, dtype=torch.float16, what="gradient")
    plan = klc.explain(hf_loss, logits.detach(), target)
    full = [k for k in plan.kernels if k.name.startswith("kl_fused_")
            and any(w.dtype == "float32" and w.numel == logits.numel() for w in k.writes)]
    assert not full, [k.name for k in full]


def _lm_head_loss(hidden, weight, target):
    """GPT-2's head and loss: a vocabulary whose rows are not a multiple of 16 bytes."""
    logits = hidden @ weight.t()
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), target)


def test_products_around_unaligned_rows_use_padded_strides(monkeypatch):
    """A (tokens, 1031) float32 product would make cuBLAS take its unaligned kernels (GPT-2's LM
    head: 6.7 ms against 0.88 with aligned rows on the H200). The forward product writes into rows
    padded to 1032 columns, the backward's gradient of the logits is written padded for the two
    products that read it, and the logits saved for the backward come back in the traced layout:
    values and gradients equal eager's."""
    from kernelab.compiler import layout

    layouts, plans = [], []
    product, plan_of = layout.PaddedProduct.__call__, layout.plan

    def spy(self, *args, **kwargs):
        out = product(self, *args, **kwargs)
        layouts.append(out.stride())
        return out

    def plan_spy(*args):
        plans.append(plan_of(*args).describe())
        return plan_of(*args)

    widened = []
    widen = layout.WidenedProduct.__call__

    def widen_spy(self, a, b):
        out = widen(self, a, b)
        widened.append(tuple(out.shape))
        return out

    monkeypatch.setattr(layout.PaddedProduct, "__call__", spy)
    monkeypatch.setattr(layout.WidenedProduct, "__call__", widen_spy)
    monkeypatch.setattr(layout, "plan", plan_spy)
    hidden, weight = _r(48, 32, grad=True), _r(1031, 32, seed=1, grad=True)
    target = torch.randint(0, 1031, (48,), generator=torch.Generator().manual_seed(2))
    results = []
    for f in (_lm_head_loss, torch.compile(_lm_head_loss, backend="kernelab")):
        hidden.grad = weight.grad = None
        loss = f(hidden, weight, target)
        loss.backward()
        results.append((loss.detach(), hidden.grad.clone(), weight.grad.clone()))
    for e, a, what in zip(results[0], results[1], ("loss", "hidden gradient", "weight gradient")):
        assert_close(a, e, what=what)
    assert layouts == [(1032, 1)]
    assert sorted(widened) == [(48, 32), (1031, 32)]  # the two backward products, on padded rows
    forward, backward = plans
    assert "mm: rows of 1031 padded to 1032 (a product writes it; 16-byte aligned for cuBLAS)" in forward
    # the logits saved for the backward leave the graph padded (``layout.visible``): no copy back
    assert not any("copied back" in line for line in forward), forward
    assert any("padded to 1032 (a product reads it" in line for line in backward)
    assert sum("run on the whole padded matrix" in line for line in backward) == 2
    explained = klc.explain(lambda h, w: _lm_head_loss(h, w, target), hidden.detach(), weight.detach())
    assert any("rows of 1031 padded to 1032" in line for line in explained.graphs[0].padded)


@pytest.mark.parametrize("bias", [False, True])
def test_padded_logits_saved_for_the_backward_are_held_once(bias):
    """BERT's masked-LM head (30522 words: unaligned rows) in a training step: the padded product's
    logits are saved for the backward as they are, padded (the backward's kernels take strides),
    not copied back into the traced layout, which held them twice at the forward's end; and the
    backward's gradient of the logits, padded for the two products that read it, is stored over
    them (``GroupRunner.reuse``: the same padded layout). CPU peak of BERT's head before: 2.43x
    Inductor's; after 0.95x (``benchmarks/memory_cpu.py OUT --only bert_head``). Gradients equal
    eager's."""
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 1031, bias=bias)
    h = _r(1024, 16, grad=True)
    target = torch.randint(0, 1031, (1024,), generator=torch.Generator().manual_seed(2))

    def step(h):
        return F.cross_entropy(head(h), target)

    results = []
    klc.reset_events()
    for f in (step, torch.compile(step, backend="kernelab")):
        head.zero_grad(set_to_none=True)
        h.grad = None
        f(h).backward()
        results.append([h.grad.clone()] + [p.grad.clone() for p in head.parameters()])
    for a, e in zip(results[1], results[0]):
        assert_close(a, e, what="gradient")
    assert klc.events().reused, "the gradient of the logits was not stored over the saved logits"
    plan = klc.explain(step, h)
    forward = plan.graphs[0]
    assert any("rows of 1031 padded to 1032" in line for line in forward.padded), forward.padded
    assert not any("copied back" in line for line in forward.padded), forward.padded
    assert not [g.name for g in forward.groups if g.name == "kl_fused_copy"], [g.name for g in forward.groups]


@pytest.mark.parametrize("rows", [5, 1024])
def test_padded_product_returned_in_eager_layout(rows):
    """A padded product the caller sees comes back contiguous, as eager gives it. From
    ``layout.PAD_N_MIN_ROWS`` rows on, N is padded too (the weight copied into padded columns)."""
    def head(h, w):
        return (h @ w.t()).relu()

    h, w = _r(rows, 16), _r(1031, 16, seed=1)
    out = torch.compile(head, backend="kernelab")(h, w)
    assert out.stride() == (1031, 1)
    assert_close(out, head(h, w), what="relu(h @ w.T)")


def test_explain_of_a_padded_product_with_a_bias():
    """``kernelab.explain`` of a linear layer with a bias and long unaligned rows (BERT's masked-LM
    decoder over 30522 words): the product runs as ``addmm(..., out=padded)``, whose recorded op
    has its result as the ``out=`` tensor and no output of its own; the prediction rule read the
    missing output and ``explain`` raised IndexError (found on the CPU, 2026-12-05)."""
    lin = torch.nn.Linear(16, 1031)
    h = _r(1024, 16)
    plan = klc.explain(lambda x: lin(x).relu(), h)
    assert any("rows of 1031 padded to 1032" in line for line in plan.graphs[0].padded), plan.graphs[0].padded
    assert [k.name for k in plan.kernels if k.category == "matmul"] == ["gemm+bias (cuBLASLt)"], \
        [k.name for k in plan.kernels]


def test_flattening_view_keeps_the_product_unpadded():
    """A view that needs contiguous rows (flattening them into one dim) does not exist on the
    padded layout: that product stays unpadded."""
    def flat(h, w):
        return (h @ w.t()).view(-1).sin()

    h, w = _r(3, 8), _r(1031, 8, seed=1)
    assert_close(torch.compile(flat, backend="kernelab")(h, w), flat(h, w), what="flattened product")
    plan = klc.explain(flat, h, w)
    assert plan.graphs[0].padded == []


def test_cache_grown_from_empty_is_a_generated_copy():
    """Hugging Face's DynamicCache: ``torch.cat([torch.tensor([]), k], -2)`` per layer. The empty
    part is dropped and the copy joins a generated kernel: no ATen cat is left."""
    def attend(q, k):
        keys = torch.cat([torch.tensor([]), k.transpose(1, 2)], dim=-2)
        return (q @ keys.transpose(-1, -2)).softmax(-1), keys

    q, k = _r(2, 3, 5, 4), _r(2, 5, 3, 4, seed=1)
    expected = attend(q, k)
    actual = torch.compile(attend, backend="kernelab")(q, k)
    for a, e in zip(actual, expected):
        assert_close(a, e, what="attention with a cache grown from empty")
    assert actual[1].is_contiguous()
    plan = klc.explain(attend, q, k)
    assert not any(op.startswith("aten.cat") for _, op, _ in plan.graphs[0].eager)


def test_inference_batch_norm_is_one_kernel_with_its_relu():
    """Eval-mode batch norm decomposes to per-channel ops, (C,), unsqueezed to (C, 1, 1): the
    unsqueezes move to the inputs so the per-channel math is recomputed inside the kernel that
    normalizes (and applies the ReLU and the residual add), one kernel per norm, not three."""
    bn = torch.nn.BatchNorm2d(6).eval()
    with torch.no_grad():
        bn.running_mean.copy_(_r(6, seed=1))
        bn.running_var.copy_(_r(6, seed=2).abs() + 0.5)
        bn.weight.copy_(_r(6, seed=3))
        bn.bias.copy_(_r(6, seed=4))

    def block(x, skip):
        return (bn(x) + skip).relu()

    x, skip = _r(2, 6, 5, 7), _r(2, 6, 5, 7, seed=5)
    with torch.no_grad():
        assert_close(torch.compile(block, backend="kernelab")(x, skip), block(x, skip), what="bn + add + relu")
        plan = klc.explain(block, x, skip)
    graph = plan.graphs[0]
    assert len(graph.groups) == 1, [g.ops for g in graph.groups]
    assert not graph.eager, graph.eager


def test_gradient_from_another_graph_is_copied_into_padded_rows(monkeypatch):
    """HF computes the loss in a graph of its own (a graph break): the gradient of the logits
    reaches the head's backward graph as an input. From ``layout.PAD_N_MIN_ROWS`` rows it is copied
    once into padded rows and both backward products run on the padded matrix."""
    from kernelab.compiler import layout

    plans = []
    plan_of = layout.plan

    def plan_spy(*args):
        plans.append(plan_of(*args).describe())
        return plan_of(*args)

    monkeypatch.setattr(layout, "plan", plan_spy)
    rows, vocab = layout.PAD_N_MIN_ROWS, 1031
    hidden, weight = _r(rows, 16, grad=True), _r(vocab, 16, seed=1, grad=True)
    target = torch.randint(0, vocab, (rows,), generator=torch.Generator().manual_seed(2))

    def head(h, w):
        return (h @ w.t()).view(rows // 16, 16, vocab)

    results = []
    for f in (head, torch.compile(head, backend="kernelab")):
        hidden.grad = weight.grad = None
        loss = F.cross_entropy(f(hidden, weight).float().view(-1, vocab), target)  # outside the graph
        loss.backward()
        results.append((loss.detach(), hidden.grad.clone(), weight.grad.clone()))
    for e, a, what in zip(results[0], results[1], ("loss", "hidden gradient", "weight gradient")):
        assert_close(a, e, what=what)
    backward = plans[1]
    # copied by a generated kernel that writes padded rows (``layout.copies_as_kernels``)
    assert any(line.startswith("clone") and "(a product reads it" in line for line in backward), backward
    assert not any("an input copied into padded rows" in line for line in backward), backward
    assert sum("run on the whole padded matrix" in line for line in backward) == 2


def test_cross_entropy_reads_the_logits_once_each_way(tmp_path, monkeypatch):
    """Looped rows (a vocabulary longer than a block): the forward is one kernel with one pass
    over the logits (the target's logit picked from x itself, alongside the online max and sum);
    the backward reads the logits once; neither reads per element what is one value per row (max,
    log-sum, target, scale) nor loads the column index (computed from ``cols``). On the H200 the
    backward at Llama's 8192 x 128256 took 8.3 ms reading them per element (Inductor: 1.7 ms)."""
    monkeypatch.setenv("KERNELAB_CACHE", str(tmp_path))
    from kernelab.compiler.templates import base

    monkeypatch.setitem(base.PERSISTENT_MAX, "interpreter", 256)  # rows of 1000: the looped template
    monkeypatch.setenv("KERNELAB_PERSISTENT_MAX", "256")

    def hf_loss(logits, target):
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), target.view(-1), ignore_index=-100)

    logits = _r(2, 9, 1000).half().requires_grad_(True)
    target = torch.randint(0, 1000, (2, 9), generator=torch.Generator().manual_seed(3))
    target[0, 4] = -100
    (expected, ref_grad), (actual, grad) = _loss_and_grad(hf_loss, logits, target)
    assert_close(actual, expected, what="loss")
    assert_close(grad, ref_grad, dtype=torch.float16, what="gradient")
    looped = {f.name: f.read_text() for f in (tmp_path / "compiler").glob("kl_fused_*.py") if "for roff" in f.read_text()}
    forward = [t for name, t in looped.items() if "amax" in name]
    backward = [t for name, t in looped.items() if "amax" not in name]
    assert len(forward) == 1 and len(backward) == 1, sorted(looped)
    assert forward[0].count("for roff") == 1  # one pass: max, sum of exp and the pick together
    for text in forward + backward:
        per_element = [line for line in text.splitlines() if "tl.load(" in line and "cols" in line]
        assert len(per_element) == 1, per_element  # the logits, nothing else
        assert "tl.zeros([XBLOCK, 1], tl.int32) + cols" in text  # the column index, computed


def test_upcast_logits_of_a_head_are_never_written_in_float32():
    """As Hugging Face's causal LMs compute it: the head's product, ``.view(B, S, V)``, ``.float()``,
    ``.view(-1, V)``, cross-entropy, in a training step. The cast's source is a reshape of an ATen
    result (not an input, as in the test above): the forward wrote the float32 logits in a kernel of
    its own, and the backward's recomputed upcast another (Llama on the H200: 1.53 ms a step for the
    two, and 4.2 GB each at 8192 x 128256)."""
    def step(hidden, weight, target):
        logits = (hidden.view(-1, hidden.shape[-1]) @ weight.t()).view(*hidden.shape[:-1], weight.shape[0])
        F.cross_entropy(logits.float().view(-1, weight.shape[0]), target.view(-1)).backward()

    hidden = _r(2, 8, 16).half().requires_grad_(True)
    weight = _r(40, 16, seed=1).half().requires_grad_(True)
    target = torch.randint(0, 40, (2, 8), generator=torch.Generator().manual_seed(3))
    plan = klc.explain(step, hidden, weight, target)
    full = [k.name for k in plan.kernels if any(w.dtype == "float32" and w.numel == 2 * 8 * 40 for w in k.writes)]
    assert not full, full
    grads = []
    for fn in (step, torch.compile(step, backend="kernelab")):
        hidden.grad = weight.grad = None
        fn(hidden, weight, target)
        grads.append((hidden.grad.clone(), weight.grad.clone()))
    for got, want in zip(grads[1], grads[0]):
        assert_close(got, want, dtype=torch.float16, what="gradient")


def test_embedding_backward_accumulates_into_its_own_fill():
    """The embedding's weight gradient (a zero fill, then index_put with accumulation) writes into
    the fill: no copy of the (vocab, hidden) buffer first (``rewrites.index_puts_in_place``), and
    a second call starts from zeros again (the fill is made afresh)."""
    w = torch.randn(50, 16, requires_grad=True)
    idx = torch.tensor([[1, 3, 3, 7], [0, 1, 49, 3]])

    def step(w, idx):
        return (F.embedding(idx, w) * 2).sum()

    names = [k.name for k in klc.plan_kernels(lambda w, idx: torch.autograd.grad(step(w, idx), w), (w, idx))]
    assert "kl_scatter_add_rows" in names and not any("memcpy" in n for n in names), names
    compiled = torch.compile(step, backend="kernelab")
    ref = torch.autograd.grad(step(w, idx), w)[0]
    for _ in range(2):
        torch.testing.assert_close(torch.autograd.grad(compiled(w, idx), w)[0], ref)


def _repeat_heads(k, w):
    """Grouped-query attention's ``repeat_kv``: each key head expanded to 4 query heads."""
    b, h, s, d = k.shape
    return (k[:, :, None].expand(b, h, 4, s, d).reshape(b, h * 4, s, d) * w).sum()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("dims, keepdim", [(2, False), ((1, 3), True)])
def test_small_sums_over_inner_dims_are_generated(dims, keepdim, dtype):
    """A sum over inner dims of a few elements (the backward of an expand: GQA's repeated heads)
    is generated as adds of strided views (``rewrites.small_sums_as_adds``), accumulated in
    float32 as ATen does: no ATen reduction is left."""
    def fn(x):
        return x.sum(dims, keepdim=keepdim) * 2

    x = _r(2, 3, 4, 5, 6).to(dtype)
    assert_close(torch.compile(fn, backend="kernelab")(x), fn(x), what=f"sum over {dims}")
    plan = klc.explain(fn, x)
    assert not plan.graphs[0].eager, plan.graphs[0].eager
    k, w = _r(2, 3, 5, 8, grad=True), _r(2, 12, 5, 8, seed=1)
    expected = torch.autograd.grad(_repeat_heads(k, w), k)[0]
    assert_close(torch.autograd.grad(torch.compile(_repeat_heads, backend="kernelab")(k, w), k)[0], expected,
                 what="gradient of repeated heads")
    names = [kn.name for kn in klc.plan_kernels(lambda k, w: torch.autograd.grad(_repeat_heads(k, w), k), (k, w))]
    assert not any(n == "sum" for n in names), names


def test_index_puts_sharing_one_fill_each_write_their_own():
    """Two accumulating index_puts into one zero fill (Mixtral's routing writes tokens back this
    way, in each layer): each writes in place into a fill of its own; neither sees the other's
    values, and no copy of the base is made."""
    idx = torch.tensor([0, 3, 3, 9])

    def two_scatters(v1, v2):
        z = torch.zeros(10, 4)
        return z.index_put((idx,), v1, accumulate=True) * 2 + z.index_put((idx,), v2, accumulate=True)

    v1, v2 = _r(4, 4), _r(4, 4, seed=1)
    compiled = torch.compile(two_scatters, backend="kernelab")
    for _ in range(2):
        assert_close(compiled(v1, v2), two_scatters(v1, v2), what="two index_puts into one fill")
    names = [k.name for k in klc.plan_kernels(two_scatters, (v1, v2))]
    assert names.count("kl_scatter_add_rows") == 2 and not any("memcpy" in n for n in names), names


def _head_and_loss(h, w, target):
    """A causal LM's head as Hugging Face writes it: (batch, tokens, vocab) logits returned, the
    loss computed on their (tokens, vocab) view."""
    logits = (h @ w.t()).view(2, h.shape[0] // 2, w.shape[0])
    return F.cross_entropy(logits.view(-1, w.shape[0]), target), logits


def test_gradient_of_returned_logits_joins_the_loss_backward_kernel(monkeypatch):
    """The returned logits' tangent is added to the loss's gradient in the (tokens, vocab) rows the
    cross-entropy backward computes (``rewrites.inputs_in_row_space``): no add kernel of its own,
    one logits-sized buffer fewer, and the same gradients as eager."""
    from kernelab.compiler import graph

    parts, partition = [], graph.partition
    monkeypatch.setattr(graph, "partition", lambda gm, *a: parts.append(partition(gm, *a)) or parts[-1])
    h, w = _r(16, 8, grad=True), _r(40, 8, seed=1, grad=True)
    target = torch.randint(0, 40, (16,), generator=torch.Generator().manual_seed(2))
    g = _r(2, 8, 40, seed=3)
    results = []
    for f in (_head_and_loss, torch.compile(_head_and_loss, backend="kernelab")):
        loss, logits = f(h, w, target)
        results.append(torch.autograd.grad(loss + (logits * g).sum(), (h, w)))
    for a, e, what in zip(results[1], results[0], ("hidden gradient", "weight gradient")):
        assert_close(a, e, what=what)
    backward = parts[-1].groups
    assert not any(gp.name == "kl_fused_add" for gp in backward), [gp.name for gp in backward]
    assert any(gp.kind == "reduction" and fusion.short_name(gp.nodes[-1]) == "add" for gp in backward), \
        [(gp.kind, gp.name) for gp in backward]


def test_batch_norm_updates_its_statistics_in_place():
    """Training batch norm: its running mean, variance and step count are updated by the norm's
    own kernel and one in-place add (``rewrites.batch_norms_in_place``), not copied back after the
    graph: the plan has no memcpy, and after two steps the buffers, output and gradients equal eager's."""
    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                   torch.nn.Conv2d(4, 4, 1), torch.nn.BatchNorm2d(4))

    x = _r(2, 3, 8, 8)
    ref, mine = make(), make()
    compiled = torch.compile(mine, backend="kernelab")
    for step in range(2):
        xs = x * (step + 1)
        for model, f in ((ref, ref), (mine, compiled)):
            model.zero_grad()
            f(xs).square().mean().backward()
    for (name, a), (_, e) in zip(mine.state_dict().items(), ref.state_dict().items()):
        assert_close(a.double(), e.double(), what=name)
    for (name, a), (_, e) in zip(mine.named_parameters(), ref.named_parameters()):
        assert_close(a.grad, e.grad, what=f"{name}.grad")

    def step(x):
        mine.zero_grad(set_to_none=True)  # no gradient accumulation (its own add_ kernels)
        mine(x).square().mean().backward()

    names = [k.name for k in klc.plan_kernels(step, (x,))]
    # the two norms' counters: one _foreach_add_ (rewrites.batch_norms_in_place), no add_ each
    assert not any("memcpy" in n for n in names) and names.count("_foreach_add_") == 1 and "add_" not in names, names


def _squeeze_excite(x, w1, w2):
    """A squeeze-and-excitation block (EfficientNet, MobileNetV3): a gate from the global average."""
    gate = torch.sigmoid(F.conv2d(F.silu(F.conv2d(x.mean((2, 3), keepdim=True), w1)), w2))
    return F.silu(x * gate)


def test_squeeze_excite_backward_plans_without_dissolving_kernels():
    """The gate's sigmoid and its gradient (computed from the sigmoid through the gate's products)
    fell into one pointwise group, which would depend on itself through another kernel: the whole
    group ran as ATen ops. It is now split in two (``graph._split``), and the global average is a
    row reduction over the flattened (H, W) (``rewrites.trailing_reductions_as_rows``)."""
    x, w1, w2 = _r(2, 8, 5, 5, grad=True), _r(4, 8, 1, 1, seed=1, grad=True), _r(8, 4, 1, 1, seed=2, grad=True)
    expected = torch.autograd.grad(_squeeze_excite(x, w1, w2).square().sum(), (x, w1, w2))
    compiled = torch.compile(_squeeze_excite, backend="kernelab")
    actual = torch.autograd.grad(compiled(x, w1, w2).square().sum(), (x, w1, w2))
    for a, e, what in zip(actual, expected, ("x", "w1", "w2")):
        assert_close(a, e, what=f"gradient of {what}")
    plan = klc.explain(lambda *a: torch.autograd.grad(_squeeze_excite(*a).square().sum(), a), x, w1, w2)
    refusals = [why for g in plan.graphs for _, why in g.refusals]
    assert not any("dissolved" in why for why in refusals), refusals
    eager = [op for g in plan.graphs for _, op, _ in g.eager]
    assert not any(op in ("aten.mean.dim", "aten.sum.dim_IntList", "aten.sigmoid.default") for op in eager), eager


def test_mixtral_backward_keeps_every_group():
    """Mixtral's backward: a row kernel summed the routing weights' gradient and scaled the
    experts' gradient by routing weights computed from that sum (through ATen's index_put), a
    cycle; the scaling now leaves as a pointwise kernel of its own (``graph._split``) where the
    whole group used to dissolve into ATen ops. (Its values: ``test_zoo.py``.)"""
    from kernelab.zoo import ZOO

    zm = ZOO["mixtral"]
    model, inputs = zm.build("tiny")

    def step(model, inputs):
        zm.loss(model, inputs).backward()

    plan = klc.explain(step, model, inputs)
    refusals = [why for g in plan.graphs for _, why in g.refusals]
    assert not any("dissolved" in why for why in refusals), [w for w in refusals if "dissolved" in w]
    assert any("split in two" in why for why in refusals), refusals


def _conv_mlp(x, w1, b1, w2, b2):
    """ConvNeXt's MLP as 1x1 convolutions with biases, its GELU and the residual add."""
    return x + F.conv2d(F.gelu(F.conv2d(x, w1, b1)), w2, b2)


def test_convolution_bias_joins_the_next_kernel():
    """ATen adds a 1x1 convolution's bias in a kernel of its own; as an add
    (``rewrites.conv_biases_as_adds``) it joins the GELU's and the residual's kernels: no "add bias"
    kernel is left, and values and every gradient (the bias's from convolution_backward) equal eager's."""
    args = [_r(2, 8, 5, 5), _r(16, 8, 1, 1, seed=1), _r(16, seed=2), _r(8, 16, 1, 1, seed=3), _r(8, seed=4)]
    leaves = [a.clone().requires_grad_() for a in args]
    expected = torch.autograd.grad(_conv_mlp(*leaves).square().sum(), leaves)
    actual = torch.autograd.grad(torch.compile(_conv_mlp, backend="kernelab")(*leaves).square().sum(), leaves)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert_close(a, e, what=f"gradient {i}")
    with torch.no_grad():
        assert_close(torch.compile(_conv_mlp, backend="kernelab")(*args), _conv_mlp(*args), what="inference")
        names = [k.name for k in klc.plan_kernels(_conv_mlp, tuple(args))]
    assert "add bias" not in names, names


def _gradients_and_values_as_eager(fn, args, g) -> None:
    """``fn`` compiled: every input's gradient for the output gradient ``g``, and the inference
    values, as eager's."""
    leaves = [a.clone().requires_grad_() for a in args]
    expected = torch.autograd.grad(fn(*leaves), leaves, g)
    actual = torch.autograd.grad(torch.compile(fn, backend="kernelab")(*leaves), leaves, g)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert_close(a, e, what=f"gradient {i}")
    with torch.no_grad():
        assert_close(torch.compile(fn, backend="kernelab")(*args), fn(*args), what="inference")


def _dw_conv_norm(x, w, b, nw, nb):
    """ConvNeXt's block head as timm writes it: a depthwise 7x7 convolution with a bias, then the
    layer norm over channels of its channels-last view."""
    y = F.conv2d(x, w, b, padding=3, groups=x.shape[1]).permute(0, 2, 3, 1)
    return F.layer_norm(y, (x.shape[1],), nw, nb, 1e-6)


@pytest.mark.parametrize("layout", ["traced", "channels_last"])
def test_a_depthwise_bias_read_through_a_permute_joins_the_layer_norm(layout, monkeypatch):
    """The depthwise convolution's reader is the permute before the layer norm: its bias was ATen's
    "add bias" kernel (one of ConvNeXt's 42 extra launches a step on the H200); added after the
    permute (``rewrites.conv_biases_as_adds``) it is the layer norm kernel's prologue. Values and
    every gradient (the bias's from convolution_backward) equal eager's, in both conv layouts."""
    monkeypatch.setenv("KERNELAB_CONV_LAYOUT", layout)
    c = 12
    args = [_r(2, c, 6, 5), _r(c, 1, 7, 7, seed=1), _r(c, seed=2), _r(c, seed=3), _r(c, seed=4)]
    _gradients_and_values_as_eager(_dw_conv_norm, args, _r(2, 6, 5, c, seed=5))
    with torch.no_grad():
        names = [k.name for k in klc.plan_kernels(_dw_conv_norm, tuple(args))]
        plan = klc.explain(_dw_conv_norm, *args)
    assert "add bias" not in names, names
    # the bias add is the first op of the layer norm's kernel (its statistics read it)
    fused = [grp for grp in plan.graphs[0].groups if grp.ops and grp.ops[0].endswith("= add") and any(o.endswith("= var") for o in grp.ops)]
    assert fused, str(plan)


def _cloned_mlp_out(x, w, b, gamma, shortcut):
    """ConvNeXt's block tail as the H100's timm traced it: the MLP's output cloned, permuted back to
    NCHW, the layer scale and the residual add."""
    y = F.linear(x, w, b).clone().permute(0, 3, 1, 2)
    return y * gamma.reshape(1, -1, 1, 1) + shortcut


def test_a_clone_read_through_a_permute_is_no_copy_kernel():
    """A clone whose only readers are permutes read by generated kernels was a copy kernel of its
    own (the permute is a view kernels do not fuse through): 18 copies of ConvNeXt's activations
    in its inference step on the H100, 37 in training (the backward recomputes the clone).
    ``rewrites.clones_read_through_permutes`` drops it; values and gradients as eager's."""
    args = [_r(2, 4, 5, 32), _r(8, 32, seed=1), _r(8, seed=2), _r(8, seed=3),
            _r(2, 8, 4, 5, seed=4).to(memory_format=torch.channels_last)]
    g = _r(2, 8, 4, 5, seed=5)
    _gradients_and_values_as_eager(_cloned_mlp_out, args, g)
    with torch.no_grad():
        names = [k.name for k in klc.plan_kernels(_cloned_mlp_out, tuple(args))]
    assert "kl_fused_copy" not in names, names
    leaves = [a.clone().requires_grad_() for a in args]
    names = [k.name for k in klc.plan_kernels(lambda *a: torch.autograd.grad(_cloned_mlp_out(*a), a, g), tuple(leaves))]
    assert "kl_fused_copy" not in names, names
    # a clone of a transposed view: the permute then reads strides other than the clone's
    x, y = _r(2, 3, 5), _r(2, 3, 5, seed=1)
    _gradients_and_values_as_eager(_cloned_transpose, [x, y], _r(2, 3, 5, seed=2))
    with torch.no_grad():
        assert [k.name for k in klc.plan_kernels(_cloned_transpose, (x, y))] == ["kl_fused_mul_add"]


def _cloned_transpose(x, y):
    return x.transpose(1, 2).clone().permute(0, 2, 1) * 2 + y


def _rope(x, cos, sin):
    """Rotary embeddings as Hugging Face writes them: ``rotate_half`` is ``cat([-x2, x1])``."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def test_rotate_half_needs_no_negation_kernel():
    """``cat([-x2, x1])``: the negation was a kernel of its own (a cat reads its pieces from memory);
    as ``cat([x2, x1]) * sign`` (``rewrites.negated_cat_pieces``) RoPE's forward is one kernel,
    with eager's values and gradients."""
    x, cos, sin = _r(2, 3, 5, 8, grad=True), _r(1, 1, 5, 8, seed=1), _r(1, 1, 5, 8, seed=2)
    g = _r(2, 3, 5, 8, seed=3)
    expected = _rope(x, cos, sin)
    actual = torch.compile(_rope, backend="kernelab")(x, cos, sin)
    assert_close(actual, expected, what="rope")
    assert_close(torch.autograd.grad(actual, x, g)[0], torch.autograd.grad(expected, x, g)[0], what="rope gradient")
    with torch.no_grad():
        names = [k.name for k in klc.plan_kernels(_rope, (x, cos, sin))]
    assert names == ["kl_fused_mul_cat_add"], names
    # in Llama's training step, forward and backward (the backward's cat comes from
    # ``scatters_as_cats``): no negation kernel left
    from kernelab.zoo import ZOO

    zm = ZOO["llama"]
    model, inputs = zm.build("tiny")
    names = [k.name for k in klc.plan_kernels(lambda: zm.loss(model, inputs).backward())]
    assert not any("neg" in n for n in names), names
    # nor a kernel writing g * cos and g * sin for the backward's cat to read back
    # (``slices_through_products``, ``cats_of_products``): the cat reads g's halves
    assert "kl_fused_mul" not in names, names


def _scatter_add(base, idx, values):
    return (base * 1).index_put_((idx,), values, accumulate=True) * 2


@pytest.mark.parametrize("rows, idx_shape, width, index_dtype", [
    (10, (7,), 5, torch.int64),  # a few rows, some repeated, negative ones counted from the end
    (3, (2, 9), 1100, torch.int64),  # 2-D ids (an embedding's (batch, tokens)); wider than one column block
    (1, (33,), 8, torch.int32),  # every index the same row (BERT's token types)
])
def test_accumulating_index_put_runs_the_scatter_kernel(rows, idx_shape, width, index_dtype):
    """An accumulating ``index_put_`` into a fresh buffer runs the row scatter-add kernel
    (``scatter.py``: atomic adds, where ATen's sorted kernel walked BERT's equal ids one by one)
    and adds what ATen adds."""
    idx = torch.randint(-rows, rows, idx_shape, generator=torch.Generator().manual_seed(0)).to(index_dtype)
    values = _r(*idx_shape, width)

    def embedding_grad(values):
        return torch.zeros(rows, width).index_put_((idx,), values, accumulate=True) * 2

    compiled = torch.compile(embedding_grad, backend="kernelab")
    for _ in range(2):  # the second call starts from zeros again
        assert_close(compiled(values), embedding_grad(values), what="scatter-add")
    names = [k.name for k in klc.plan_kernels(embedding_grad, (values,))]
    assert "kl_scatter_add_rows" in names and "index_put_" not in names, names


def test_scatter_reads_values_through_their_strides():
    """Values that are not row-contiguous (a transposed gradient: ``(t[i] * w).sum()`` with ``w``
    a transposed tensor hands the index's backward ``w`` itself) are read through both strides.
    The kernel read them as contiguous rows: Swin's relative-position bias table got gradients off
    by 0.9-1.2 in relative norm under backend="kernelab" (found on a held-out model)."""
    from kernelab.compiler.scatter import ScatterAddRows
    idx = torch.tensor([0, 3, 3, 5, 1, 7])
    values = torch.arange(12.).view(2, 6).t()  # strides (1, 6)
    expected = torch.zeros(8, 2).index_put_((idx,), values, accumulate=True)
    torch.testing.assert_close(ScatterAddRows()(torch.zeros(8, 2), [idx], values, True), expected)
    table = torch.randn(169, 3, requires_grad=True)
    ids = torch.randint(0, 169, (49, 49), generator=torch.Generator().manual_seed(0))
    w = _r(3, 49, 49)

    def relative_position_bias(table, ids, w):  # timm's Swin / BEiT window attention
        bias = table[ids.view(-1)].view(49, 49, -1).permute(2, 0, 1).contiguous()
        return (bias * w).sum()

    eager, = torch.autograd.grad(relative_position_bias(table, ids, w), table)
    compiled, = torch.autograd.grad(torch.compile(relative_position_bias, backend="kernelab")(table, ids, w), table)
    assert_close(compiled, eager, what="relative-position bias table gradient")


def test_scatter_outside_the_kernel_form_runs_aten():
    """Calls the kernel does not take run ATen's index_put_ with its values: float16 buffers,
    deterministic algorithms (atomic adds add in no fixed order), values that broadcast."""
    from kernelab.compiler.scatter import ScatterAddRows, fast_path
    idx = torch.tensor([0, 2, 2])
    run = ScatterAddRows()
    half = torch.zeros(3, 4, dtype=torch.float16)
    assert not fast_path(half, [idx], torch.ones(3, 4, dtype=torch.float16))
    torch.testing.assert_close(run(half, [idx], torch.ones(3, 4, dtype=torch.float16), True),
                               torch.zeros(3, 4, dtype=torch.float16).index_put_((idx,), torch.ones(3, 4, dtype=torch.float16), True))
    assert not fast_path(torch.zeros(3, 4), [idx], torch.ones(4))  # broadcast values
    torch.use_deterministic_algorithms(True)
    try:
        assert not fast_path(torch.zeros(3, 4), [idx], torch.ones(3, 4))
    finally:
        torch.use_deterministic_algorithms(False)
    assert fast_path(torch.zeros(3, 4), [idx], torch.ones(3, 4))
    with pytest.raises(IndexError):  # an empty buffer has no row to take an index: ATen raises
        run(torch.zeros(0, 4), [idx], torch.ones(3, 4), True)


def test_scatter_index_out_of_range_is_loud():
    """An index eager PyTorch would refuse adds NaN to row 0 (a kernel cannot raise): never a
    plausible wrong gradient."""
    from kernelab.compiler.scatter import ScatterAddRows
    out = ScatterAddRows()(torch.zeros(3, 4), [torch.tensor([1, 7])], torch.ones(2, 4), True)
    assert torch.isnan(out[0]).all() and (out[1] == 1).all() and (out[2] == 0).all()


def test_runner_frees_each_input_after_its_last_use(monkeypatch):
    """The boxed calling convention hands the argument list over (aot_autograd's backward passes
    saved activations and tangents this way): the runner empties it, so an input is freed once the
    last kernel reading it has run, as Inductor's wrapper does, not when the whole graph returns."""
    import weakref

    from torch.fx.experimental.proxy_tensor import make_fx

    from kernelab.compiler import graph, group_runner, runtime

    def two_halves(a, b):
        return [(a * 2).sum(-1) + (b.sin() * 3).sum(-1)]

    # rows of two lengths: two kernels (reductions of the same rows would share one)
    a, b = _r(4, 8), _r(4, 16, seed=1)
    gm = make_fx(two_halves)(a, b)
    expected = two_halves(a, b)[0]
    seen = []
    original = group_runner.GroupRunner.run_values

    def spy(self, raw, scalars):
        seen.append(first() is None)
        return original(self, raw, scalars)

    for straight in (True, False):
        runner = runtime.GraphRunner.build(gm, graph.partition(gm), True)
        assert runner.straight is not None
        if not straight:
            runner.straight = None  # the step-by-step loop frees inputs too
        monkeypatch.setattr(group_runner.GroupRunner, "run_values", spy)
        args = [a.clone(), b.clone()]
        first = weakref.ref(args[1])  # b: its kernel runs first (sin, then a's kernel adds)
        seen.clear()
        out = runner(args)
        monkeypatch.setattr(group_runner.GroupRunner, "run_values", original)
        assert args == [] and first() is None
        assert_close(out[0], expected, what="two halves")
        assert seen[0] is False and seen[-1] is True, seen  # alive for its kernel, freed before the last


#: programs whose backward builds a zero buffer of the batch's size (slice / select / expand /
#: max / topk / embedding backward): under dynamic shapes that buffer is ``full([s0, ...], 0)``
_DYNAMIC_BATCH = {
    "slice_expand": lambda x, w: (x[:, :1] * w).mean(),
    "max_dim": lambda x, w: x.max(1).values * w.amax(1),
    "cat_of_slices": lambda x, w: torch.cat([x[..., :4] * 2, x[..., 4:] * w[..., 4:]], -1).sum(1),
    "topk": lambda x, w: x.topk(3, dim=-1).values * w[..., :3],
    "rows_by_index": lambda x, w: (x.reshape(-1, 8)[torch.tensor([0, 5, 5, 9])] * w.reshape(-1, 8)[:4]).sum(),
}


@pytest.mark.parametrize("name", sorted(_DYNAMIC_BATCH))
def test_a_second_batch_size_runs_and_matches_eager(name):
    """A call with another batch size (an epoch's last, smaller batch) makes torch.compile trace
    again with symbolic sizes. Constants of symbolic shape (the zero buffers of slice / select /
    topk backwards) were made by the runner with none of the values their sizes come from:
    ``KeyError: primals_1`` / ``sym_size_int_3`` at the second call (found by a layout/shape fuzz
    of small programs)."""
    fn = _DYNAMIC_BATCH[name]
    compiled = torch.compile(fn, backend="kernelab")
    for batch in (4, 5, 6):
        x, w = _r(batch, 6, 8, seed=batch), _r(batch, 6, 8, seed=batch + 10)
        xe, we = x.clone().requires_grad_(), w.clone().requires_grad_()
        xk, wk = x.clone().requires_grad_(), w.clone().requires_grad_()
        expected = fn(xe, we)
        got = compiled(xk, wk)
        assert_close(got, expected, what=f"{name}, batch {batch}")
        g = _r(*expected.shape, seed=99) if expected.dim() else torch.tensor(1.0)
        for a, e in zip(torch.autograd.grad(got, (xk, wk), g, allow_unused=True),
                        torch.autograd.grad(expected, (xe, we), g, allow_unused=True)):
            if e is None:
                assert a is None or not a.any()
            else:
                assert_close(a, e, what=f"{name} gradient, batch {batch}")


def test_dynamo_restarts_pass_through_the_backend(monkeypatch):
    """A RestartAnalysis raised while the backend traces (dynamo's signal to trace the frame again,
    e.g. ``TensorifyScalarRestartAnalysis`` when a float scalar becomes a tensor) is dynamo's control
    flow, not a failure: it must reach dynamo. The backend caught it as a failed graph and ran the
    graph eagerly: ``kernelab.count(step, qwen3, ids, mode="kernelab")`` after a count of Gemma-2's
    step predicted eager's 337 kernels instead of the compiled 109 (a held-out sweep)."""
    import torch._functorch.aot_autograd as aot_autograd
    from torch._dynamo.exc import RestartAnalysis, TensorifyScalarRestartAnalysis

    from kernelab.compiler import backend

    def restart(*args, **kwargs):
        raise TensorifyScalarRestartAnalysis()

    monkeypatch.setattr(aot_autograd, "aot_module_simplified", restart)
    monkeypatch.setenv("KERNELAB_STRICT", "0")  # as users run: failures fall back (strict re-raises all)
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    klc.reset_events()
    with pytest.raises(RestartAnalysis):
        backend.kernelab_backend(gm, [torch.randn(2)])
    assert klc.events().fallbacks == []


def test_any_and_all_join_the_row_kernel_of_a_safe_softmax():
    """``_safe_softmax`` (SDPA's masked rows, T5's attention on the H200) ends in ``all(x == -inf,
    -1)``: ATen's boolean reduction and a ``where`` were two kernels of their own per call; as an
    extreme of the truth values it joins the softmax's row kernel. Fully masked rows give 0."""
    x = _r(4, 8, 16)
    x[0, 1] = float("-inf")
    x[1, 2, :3] = float("-inf")

    def safe(x):
        return torch.ops.aten._safe_softmax(x, -1)

    plan = klc.explain(safe, x)
    assert len([g for gp in plan.graphs for g in gp.groups]) == 1
    assert not [e for gp in plan.graphs for e in gp.eager if "any" in e[1] or "all" in e[1]]
    got = torch.compile(safe, backend="kernelab")(x)
    assert_close(got, safe(x))
    assert got[0, 1].eq(0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool], ids=str)
def test_any_and_all_match_eager(dtype):
    """NaN is true; keepdim, several dims, a dim of size one; over an empty dim ``any`` is False and
    ``all`` True (ATen runs those: amax/amin of nothing raise)."""
    x = (_r(3, 4, 5) * 2).round().to(dtype)
    if dtype == torch.float32:
        x[0, 0, 0] = float("nan")

    def fn(x):
        return (x.any(-1), x.all(1), x.any(dim=(0, 2)), x.all(-1, keepdim=True), x[:, :1].all(1),
                (x > 0).any(0))

    for got, want in zip(torch.compile(fn, backend="kernelab")(x), fn(x)):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    empty = torch.zeros(3, 0, dtype=dtype)
    torch._dynamo.reset()
    got = torch.compile(lambda e: (e.any(-1), e.all(-1)), backend="kernelab")(empty)
    assert got[0].tolist() == [False] * 3 and got[1].tolist() == [True] * 3


def test_a_value_rebuilt_in_every_layer_is_computed_once():
    """Hugging Face models rebuild the same mask in every layer (T5: ``where(arange >= arange,
    bias, min)`` before each attention). The inference graph was not deduplicated: one kernel at
    the first layer computed every layer's copy (they read the same inputs) and each was held
    until its layer (T5 at 16 x 512 tokens on the H200: six identical 96 MiB masks, peak twice
    Inductor's). Now the graph's common subexpressions are one node: one copy, read by all."""
    def layers(y, bias):
        for _ in range(3):
            causal = torch.arange(8)[:, None] >= torch.arange(8)[None, :]
            y = torch.mm(torch.where(causal, bias, -1e4), y)
        return y

    y, bias = _r(8, 4), _r(8, 8, seed=1)
    with torch.no_grad():
        plan = klc.explain(layers, y, bias)
        got = torch.compile(layers, backend="kernelab")(y, bias)
    ops = [op for gp in plan.graphs for g in gp.groups for op in g.ops]
    assert sum(op.endswith("= where") for op in ops) == 1 and sum(op.endswith("= ge") for op in ops) <= 1, ops
    assert_close(got, layers(y, bias))


def test_random_values_are_never_merged_as_common_subexpressions():
    """Two draws of the same random op are different values: deduplication leaves them apart."""
    def draws(x):
        return torch.rand_like(x) - torch.rand_like(x), F.dropout(x, 0.5, True) - F.dropout(x, 0.5, True)

    with torch.no_grad():
        a, b = torch.compile(draws, backend="kernelab")(torch.ones(1000))
    assert a.abs().max() > 0.5 and b.abs().max() == 2.0


def test_a_pointwise_chain_summed_over_trailing_dims_is_the_row_kernels_prologue():
    """``where(out > 0, g, 0).sum((2, 3))`` and ``(dy * (x - mean)).sum((2, 3))`` (a ReLU's and a
    batch norm's backward, summed over H, W) were a kernel writing the chain and row kernels
    reading it back; the chain now runs in the row space as the row kernel's prologue (both sums
    in one kernel: they share it). An operand broadcast along only some of the merged dims keeps
    the old plan."""
    def sums(g, out, x, m):
        dy = torch.where(out > 0, g, 0)
        return dy.sum([2, 3]).sum(0), (dy * (x - m.view(1, -1, 1, 1))).sum([2, 3]).sum(0)

    def partly(x, y):
        return (x * y).sum((2, 3))

    args = [_r(4, 8, 5, 5, seed=s) for s in range(3)] + [_r(8, seed=3)]
    with torch.no_grad():
        plan = klc.explain(sums, *args)
        groups = [g for gp in plan.graphs for g in gp.groups]
        rows = [g for g in groups if g.kind == "reduction"]
        assert len(rows) == 1 and any(op.endswith("= where") for op in rows[0].ops), [g.name for g in groups]
        for got, want in zip(torch.compile(sums, backend="kernelab")(*args), sums(*args)):
            assert_close(got, want)
        x, y = _r(4, 8, 5, 6), _r(1, 1, 5, 1, seed=1)
        assert_close(torch.compile(partly, backend="kernelab")(x, y), partly(x, y))
    x = _r(4, 8, 5, 6, grad=True)
    half = torch.compile(lambda x: (x.half().float() * 2).sum((2, 3)), backend="kernelab")
    assert_close(half(x), (x.half().float() * 2).sum((2, 3)))


@pytest.mark.parametrize("dims, keepdim, dtype", [
    ([0, 2, 3], False, torch.float32), ([0, 2, 3], True, torch.float32), ([0, -1, -2], False, torch.float32),
    ([0, 1, 3], False, torch.float32), ([0, 2, 3], False, torch.float16)])
def test_sums_that_keep_a_middle_dim_are_rows_then_columns(dims, keepdim, dtype):
    """A batch norm's per-channel sums over (N, H, W) of a computed chain: ATen's one reduction
    with the chain written before it -> a row kernel over (H, W) with the chain as its prologue
    and a column kernel over N. Half precision rows stay float32 until the end (one rounding, as
    ATen's); means too."""
    x = _r(4, 6, 5, 7).to(dtype)

    def fn(x):
        return (x.relu() * 2).sum(dims, keepdim=keepdim), (x + 1).mean(dims, keepdim=keepdim)

    with torch.no_grad():
        plan = klc.explain(fn, x)
        got = torch.compile(fn, backend="kernelab")(x)
    assert not [e for gp in plan.graphs for e in gp.eager if "sum" in e[1] or "mean" in e[1]]
    for g, w in zip(got, fn(x)):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert_close(g, w, dtype=dtype)


@pytest.mark.parametrize("channels_last", [False, True])
def test_generated_batch_norm_backward_matches_eager(monkeypatch, channels_last):
    """KERNELAB_BN_BACKWARD=generated (experimental): the training norm's backward decomposed,
    its per-channel sums a row kernel with the ReLU's backward as prologue plus column kernels;
    gradients as eager's, for NCHW and channels-last activations; no batch norm backward op left.
    ATen's forward, so that the column kernels counted below are the backward's."""
    monkeypatch.setenv("KERNELAB_BN_BACKWARD", "generated")
    monkeypatch.setenv("KERNELAB_BN_FORWARD", "aten")
    monkeypatch.setenv("KERNELAB_CONV_LAYOUT", "traced")  # the activations' layout is the parameter's
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                              torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8))
    x = _r(3, 3, 11, 10)
    if channels_last:
        net, x = net.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
    ref = __import__("copy").deepcopy(net)

    def step(model, x):
        model(x).square().mean().backward()

    step(ref, x)
    plan = klc.explain(lambda x: step(net, x), x)
    assert not [e for gp in plan.graphs for e in gp.eager if "batch_norm_backward" in e[1]]
    if not channels_last:  # each norm's two per-channel sums over N: one column kernel (graph.SMALL_COLUMNS)
        columns = [g for gp in plan.graphs for g in gp.groups if g.kind == "column"]
        assert [sum(op.endswith("= sum") for op in g.ops) for g in columns] == [2, 2], [g.ops for g in columns]
    net.zero_grad()
    torch.compile(lambda x: step(net, x), backend="kernelab")(x)
    for (name, p), q in zip(net.named_parameters(), ref.parameters()):
        assert_close(p.grad, q.grad, what=name)


def _math_attention(q, k, v, bias):
    """SDPA with a bias that requires grad (T5's learned position bias): the math path, which casts
    16-bit q, k, v to float32, transposes k, and transposes the output back after casting it."""
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


def test_casts_move_through_transposes_into_the_kernels_beside_them():
    """T5-base training wrote 64 lone casts and 72 copies a step on the H100 (Inductor: casts fused
    into its copies). Each cast before a transpose (the keys), or after one (the output, the keys'
    gradient), and each cast after an unsqueeze (the bias gradient) was a kernel of its own: 7
    generated kernels in the forward and 8 in the backward of one attention, now 5 and 6. Values
    and gradients as eager's."""
    gen = torch.Generator().manual_seed(5)
    shapes = [(2, 4, 16, 8)] * 3 + [(1, 4, 16, 16)]
    inputs = [torch.randn(s, generator=gen).half().requires_grad_(True) for s in shapes]
    grad_out = torch.randn(2, 16, 32, generator=gen).half()

    def step(*xs):
        out = _math_attention(*xs)
        out.backward(grad_out)
        return out.detach()

    grads = []
    for f in (step, torch.compile(step, backend="kernelab")):
        for x in inputs:
            x.grad = None
        grads.append([f(*inputs)] + [x.grad.clone() for x in inputs])
    for want, got, what in zip(grads[0], grads[1], ("output", "dq", "dk", "dv", "dbias")):
        assert_close(got, want, dtype=torch.float16, what=what)
    graphs = [graph for graph in klc.explain(step, *inputs).graphs if graph.kind != "inference"]
    generated = [[g.name for g in graph.groups] for graph in graphs]
    assert [len(names) for names in generated] == [5, 6], generated
    assert not any(name == "kl_fused_copy" for names in generated for name in names), generated


def test_multiplications_by_one_are_no_kernels():
    """``x * 1.0`` (SDPA's ``scale=1.0``, T5's) is ``x``: a transposed operand scaled by one goes to
    the product as the transposed view, no kernel. An output stays a new tensor (never the input),
    and a product that changes the dtype (an integer times 1.0) stays a multiplication."""
    def scaled_product(a, b):
        return a @ (b.t() * 1.0)

    a, b = _r(6, 5), _r(7, 5, seed=1)
    assert_close(torch.compile(scaled_product, backend="kernelab")(a, b), scaled_product(a, b), what="product")
    assert not klc.explain(scaled_product, a, b).graphs[0].groups

    def returned(x):
        return x * 1.0, x / 1

    x = _r(4, 3)
    got = torch.compile(returned, backend="kernelab")(x)
    assert all(g.data_ptr() != x.data_ptr() and torch.equal(g, x) for g in got)
    ints = torch.arange(6).reshape(2, 3)
    promoted = torch.compile(lambda i: i * 1.0, backend="kernelab")(ints)
    assert promoted.dtype == torch.float32 and torch.equal(promoted, ints.float())


def test_a_sum_sliced_transposed_and_copied_is_one_kernel():
    """T5's backward added each cross-attention's key (and value) gradient to its cache's
    gradient, then sliced, transposed and copied the sum: the add was a kernel of its own before
    the copy. The add moves past the views into the copy's kernel and computes only the slice."""
    def f(a, b):
        return (a + b)[:, :, :4].transpose(1, 2).contiguous()

    a, b = _r(2, 3, 6, 5), _r(2, 3, 6, 5, seed=1)
    got = torch.compile(f, backend="kernelab")(a, b)
    assert_close(got, f(a, b), what="sliced sum")
    assert got.is_contiguous()
    assert [g.name for g in klc.explain(f, a, b).graphs[0].groups] == ["kl_fused_add"]


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def test_rope_backward_rotates_sin_inside_the_gradients_kernel():
    """RoPE's backward multiplies the (B, H, S, D) gradient by ``sin`` (1, 1, S, D) rotated by a
    cat of its halves: the small cat was a kernel of its own for q and for k in every layer (a
    kernel joins only values of its own shape). Expanded to the gradient's shape, it is read with
    stride 0 inside the gradient's kernel (``rewrites.broadcast_cats_expanded``)."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(2, 3, 5, 8, generator=gen).requires_grad_(True)
    angles = torch.randn(1, 1, 5, 4, generator=gen)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    g = torch.randn(2, 3, 5, 8, generator=gen)

    def step(x, cos, sin):
        y = x * cos + _rotate_half(x) * sin
        y.backward(g)
        return y.detach()

    results = []
    for f in (step, torch.compile(step, backend="kernelab")):
        x.grad = None
        results.append((f(x, cos, sin), x.grad.clone()))
    assert_close(results[1][0], results[0][0], what="rope")
    assert_close(results[1][1], results[0][1], what="rope gradient")
    backward = [graph for graph in klc.explain(step, x, cos, sin).graphs if graph.kind == "backward"][0]
    assert len(backward.groups) == 1, [g.ops for g in backward.groups]


@pytest.mark.parametrize("op", ["sum", "mean", "amax"])
def test_a_full_reduction_of_a_channels_last_tensor_is_a_generated_row(op):
    """A reduction over every element of a tensor stored channels-last (a loss over a conv's
    activation, ``x.sum()``) went to ATen ("neither over the last dim nor over all the leading
    dims"): the flat view of a non-contiguous tensor does not exist. Permuted into memory order
    first (a view; the pointwise chain recomputed on permuted operands) it is the row template's,
    in as many kernels as for a contiguous tensor (a sum or mean with its chain as prologue: one;
    an extreme's chain is a kernel before it in both)."""
    def f(x):
        return getattr(torch, op)(x * 2 + 1)

    x = _r(2, 5, 4, 3)
    with torch.no_grad():
        contiguous = [k.name for k in klc.plan_kernels(f, (x,))]
        x = x.to(memory_format=torch.channels_last)
        names = [k.name for k in klc.plan_kernels(f, (x,))]
    assert all(n.startswith("kl_") for n in names) and names == contiguous, (names, contiguous)
    assert len(names) == (1 if op != "amax" else 2), names
    _gradients_and_values_as_eager(f, [x], torch.tensor(0.7))


def test_a_backward_whose_inputs_are_all_scalars_runs_interpreted_on_the_cpu():
    """Found by a random-program sweep: ``where(w > w, 1, -1)`` does not depend on ``w``'s values,
    so the backward of a program summing it (broadcast against ``y - w``) is left with 0-dim
    tangents as its only inputs, yet computes (4, 8) CPU tensors, a column sum among them. Whether
    a graph runs under the interpreter was decided from its inputs of at least one dim only: none,
    so the column kernel asked CUDA for its SM count ("Found no NVIDIA driver")."""
    def f(y, w):
        v1 = y - w
        v2 = torch.where(w > w, 1.0, -1.0)
        v3 = torch.tanh(v2)
        return v3.sum() + (v3 + v1).sum() * 2 + v2.sum() * 3 + (v3 ** 2).sum() * 0.01

    _gradients_and_values_as_eager(f, [_r(4, 8, grad=True), _r(8, seed=1, grad=True)], torch.tensor(0.7))


def test_a_cat_and_its_pieces_producers_stay_in_separate_kernels():
    """Found by a random-program sweep (and there before stop 45): ``gt(a, cat([a - a, a]))``
    read both the cat and its piece ``a``; the pieces' kernel (of the smaller shape, read only by
    the cat's kernel) merged into the cat's as a broadcast sibling, so the pieces were computed in
    registers and stored nowhere, and the cat read them from memory: the runner named a value
    never written (``NameError: name 'v9' is not defined``)."""
    def f(z):
        a = z.sum(0, keepdim=True).abs()
        c = torch.cat([a - a, a], -1)
        return torch.where(a > c, 1.0, -1.0).sum() * 2 + c.sum() * 3

    _gradients_and_values_as_eager(f, [_r(2, 4, 1, grad=True)], torch.tensor(0.7))


def test_a_size_that_changes_to_equal_another_compiles_without_a_guard_and_runs():
    """Found by a random-program sweep: with the rows of ``y`` dynamic (5, then 6, equal to its
    width 6), two rewrites compared shapes as SymInts (``tuple(a.shape) != tuple(b.shape)``), which
    guards ``s17 == 6`` and replaces s17 by 6 in the shape environment; the kernel's shape, taken
    before, still named s17, its inputs' shapes now said 6, and the runner raised "the size s17 in
    kl_fused_sub is not known from its inputs". Shapes are compared as expressions now (no guard:
    a fourth size compiles nothing new), and a guard made elsewhere no longer breaks the runner
    (next test)."""
    def f(y, w):
        v1 = w - y
        v2 = (w > 0).float() * 2
        v3 = v1.unsqueeze(0)
        v5 = torch.cat([v2, torch.cat([v2, v2], -1)], -1)
        return v3.sum() + v1.sum() * 2 + v5.sum() * 3 + (v3 ** 2).sum() * 0.01

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="kernelab")
    for rows in (5, 6, 6, 7):
        if rows == 7:
            graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        y, w = _r(rows, 6, seed=rows, grad=True), _r(6, seed=1, grad=True)
        got, want = compiled(y, w), f(y, w)
        assert_close(got, want, what=f"value, {rows} rows")
        for a, e in zip(torch.autograd.grad(got, (y, w)), torch.autograd.grad(want, (y, w))):
            assert_close(a, e, what=f"gradient, {rows} rows")
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs, "7 rows compiled again: a guard"


def test_symbol_values_bind_a_size_the_shape_environment_replaced_since():
    """A guard made while planning replaces a symbol in every SymInt's expression; a kernel's
    shape taken before still names the symbol. Both names are bound from the inputs."""
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from kernelab.compiler.group_runner import SymbolValues

    env = ShapeEnv()
    symbol = env.create_symbol(6, ConstantSource("rows"))
    rows = env.create_symintnode(symbol, hint=6)
    with FakeTensorMode(shape_env=env):
        meta = torch.empty(rows, 6)
    node = torch.fx.Graph().placeholder("y")
    node.meta["val"] = meta
    assert bool(rows == 6)  # the guard: s -> 6 from now on
    values = SymbolValues.bind([node], [torch.empty(6, 6)], [], [], "kl_test")
    assert values.shape((symbol, 6)) == (6, 6)


def test_a_reshape_of_a_cast_slice_is_not_moved_onto_the_slice():
    """Found by a random-program sweep (float16): ``y[..., 1:].float().view(-1)``. The cast's
    output is contiguous where the slice is not, and ``casts_through_views`` moved the reshape
    before the cast onto the slice: "Cannot view a tensor with shape [4, 5] and strides (6, 1)"
    while compiling. A reshape moves before a cast only where the cast's input is contiguous."""
    def f(y, z):
        kept = y[..., 1:]
        return kept.float().sum() + (z - y).float().sum() * 2 + (kept ** 2).sum() * 0.01

    y, z = _r(4, 6).half().requires_grad_(), _r(2, 4, 1, seed=1).half().requires_grad_()
    got, want = torch.compile(f, backend="kernelab")(y, z), f(y, z)
    assert_close(got, want, torch.float16, what="value")  # (eager rounds z - y to float16 first)
    for a, e in zip(torch.autograd.grad(got, (y, z)), torch.autograd.grad(want, (y, z))):
        assert_close(a, e, torch.float16, what="gradient")


@pytest.mark.parametrize("op", ["amax", "floor"])
def test_a_float16_value_computed_in_a_kernel_is_rounded_before_it_is_compared(op):
    """Found by a random-program sweep (float16): ``(x * w).amax(1).sum()``'s backward recomputes
    ``x * w`` and compares it with the saved float16 maximum to find where the maximum was. The
    kernel held the product in float32, unrounded, so it equalled no float16 maximum: no match in
    any row, a 0/0 and NaN gradients. Comparisons (and floor, ceil, round, trunc, sign) now round a
    float16/bfloat16 operand to its own type first, as eager's stored operand is."""
    def f(x, w):
        y = x * w
        return y.amax(1, keepdim=True).sum() if op == "amax" else (torch.floor(y) * y).sum()

    x, w = _r(3, 5, 6).half().requires_grad_(), _r(6, seed=1).half().requires_grad_()
    if op == "floor":  # products just past an integer in float32 that round onto it in float16
        x = torch.tensor([4.7578125, -5.73046875, -3.73828125, 1.5], dtype=torch.float16, requires_grad=True)
        w = torch.tensor([-5.46484375, 3.31640625, 5.3515625, 2.0], dtype=torch.float16, requires_grad=True)
    got, want = torch.compile(f, backend="kernelab")(x, w), f(x, w)
    assert_close(got, want, torch.float16, what="value")
    for a, e in zip(torch.autograd.grad(got, (x, w)), torch.autograd.grad(want, (x, w))):
        assert not a.isnan().any(), "NaN gradient"
        assert_close(a, e, torch.float16, what="gradient")


def test_a_float16_operand_loaded_from_memory_is_not_rounded_again():
    """The rounding above is for values computed in the kernel. A float16 operand loaded from
    memory is a float16 already: rounding it again costs two converts an element and changes
    nothing (a bfloat16 ReLU backward's ``le`` of the stored output, in every model's step). In
    ``x > y * w`` only the product is rounded."""
    from kernelab.compiler import templates

    def f(x, y, w):
        return torch.where(x > y * w, x, y)

    x, y, w = (_r(64, seed=k).half() for k in range(3))
    (group,) = forward_groups(f, x, y, w)
    source = templates.kernel_source(group, 1, True)
    comparisons = [line for line in source.splitlines() if " > " in line]
    assert comparisons, source  # one a path: the full blocks' and the last block's
    for line in comparisons:  # the product rounded, the loaded x not
        assert line.count(".to(tl.float16).to(tl.float32)") == 1, line
    got = torch.compile(f, backend="kernelab")(x, y, w)
    assert torch.equal(got, f(x, y, w))


def test_a_column_sum_of_values_computed_from_constants_alone_is_generated():
    """Found by a random-program sweep: ``floor``'s gradient is zero, so the backward of
    ``exp(floor((w - y) * 3))`` sums a (5, 8) zero fill times 3 over its rows for ``w``'s
    gradient: a column kernel that loads no full-size tensor. It raised "a column reduction
    without a full-size input" at its first launch (ATen ran it, with a warning). Its rows are
    walked by index now; a forward column sum of a constant likewise."""
    def f(y, w):
        return torch.exp(torch.floor((w - y) * 3)).sum() + (torch.full((5, 8), 2.0) * 3).sum(0) @ w

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning either
        _gradients_and_values_as_eager(f, [_r(5, 8), _r(8, seed=1)], torch.tensor(0.7))


@pytest.mark.parametrize("case", ["softmax", "count", "mean"])
def test_a_reduction_over_dims_of_size_one_is_its_input(case):
    """Found by a random-program sweep: the backward of a softmax over a dim of size 1 sums over
    that dim; the kernel's elements and its column values had the same shape, every op took the
    column role, and the loop summing the rows read a value computed after it ("cannot access
    local variable 'v_n10'" in the interpreter). Such a reduction is its input now, cast to the
    result's dtype (a count of booleans is int64)."""
    def f(w):
        x = w.unsqueeze(0)
        if case == "softmax":
            return (torch.softmax(x, 0) * torch.arange(8.0)).sum()
        if case == "count":
            return (x > 0).sum(0).float() * w
        return x.mean((0,), keepdim=True).amax(0) * w

    _gradients_and_values_as_eager(f, [_r(8)], torch.tensor(0.7) if case == "softmax" else _r(8, seed=3))


def test_a_scatter_added_to_itself_is_not_merged_into_itself():
    """Found by a random-program sweep: ``v = w[idx]; (v + v)[idx2]``'s backward adds one
    accumulating scatter to itself; ``scatter_sums_into_one_buffer`` took it for two scatters and
    erased the one it had just made the base of the merge ("Tried to erase Node index_put but it
    still had 1 users": the whole graph ran as ATen with a warning, or raised under strict)."""
    def f(w):
        v = w[..., torch.tensor([2, 7, 1])]
        u = (v + v)[..., torch.tensor([0, 2, 2])]
        return u.sum() + (u ** 2).sum() * 0.01

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _gradients_and_values_as_eager(f, [_r(8)], torch.tensor(0.7))


def test_an_embedding_index_computed_with_its_gradient_is_placed_along_the_tokens():
    """Found by a random-program sweep with indexing: an embedding's backward is
    ``index_put_(zeros, [clamp(ids)], dy, True)`` with dy (T, D) and the index (T,). The kernel of
    ``clamp(ids)`` was merged into the scatter's (T, D) kernel, where the (T,) index broadcast
    along D: token t's gradient row was summed into row ids[t] at column t, silently (the other
    columns got nothing). A computed index that dims follow stays out of a scatter's kernel, as
    a gather's does."""
    def f(y):
        picked = torch.gather(y, -1, (torch.arange(8) * 2 % 8).expand((5, 8)))
        return (picked @ picked.t()).sum() + F.embedding(torch.arange(8) % 5, y).sum()

    y, y2 = _r(5, 8).requires_grad_(), _r(5, 8).requires_grad_()
    (want,) = torch.autograd.grad(f(y), y)
    (got,) = torch.autograd.grad(torch.compile(f, backend="kernelab")(y2), y2)
    torch.testing.assert_close(got, want)


def test_a_cpu_literal_in_a_gpu_graph_is_left_to_aten():
    """Found by the random programs on an H100: ``v[..., 1] = 2.5`` lifts the literal 2.5 as a
    0-dim CPU tensor (``lift_fresh_copy``) in a graph on the GPU. Its copy became a kernel of its
    own, launched on the GPU with a host pointer: "CUDA driver error: invalid argument" (strict
    raised; otherwise the graph ran as ATen with a warning). A value on the CPU in a graph on the
    GPU is ATen's now. The GPU's plan is traced here with fake CUDA tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from kernelab.compiler import graph
    from kernelab.compiler.backend import decompositions

    def f(y):
        v = y.clone()
        v[..., 1] = 2.5
        return v @ v.t()

    with FakeTensorMode(allow_non_fake_inputs=True):
        gm = make_fx(f, decomposition_table=decompositions())(torch.empty(5, 8, device="cuda"))
    part = graph.partition(gm)
    lifted = [n for n in gm.graph.nodes if n.target is torch.ops.aten.lift_fresh_copy.default]
    assert lifted and lifted[0] not in part.group_of
    assert "on the CPU in a graph on the GPU" in part.eager[lifted[0]]
    assert all(n.meta["val"].device.type == "cuda" for g in part.groups for n in g.nodes)


def test_a_gpu_graph_with_a_cpu_vector_runs_its_kernels_on_the_gpu():
    """A graph with CUDA values and a CPU value of one dim or more (a literal vector) was taken as
    one to interpret (``"cpu" in devices``): on the GPU, where the interpreter is off, it was left
    whole to ATen, and where it was on, its GPU kernels got the interpreter's tiling. It runs
    generated kernels on the GPU now, the CPU value ATen's, and so is the copy of the vector to the
    GPU (as a cast in the kernel, it would have loaded the vector through a host pointer)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from kernelab.compiler import backend, graph
    from kernelab.compiler.backend import decompositions

    def f(y):
        return (y * torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]).to(y.device)).relu()

    with FakeTensorMode(allow_non_fake_inputs=True):
        y = torch.empty(5, 8, device="cuda")
        gm = make_fx(f, decomposition_table=decompositions())(y)
    devices = backend._devices([y], gm)
    assert devices == {"cpu", "cuda"}
    assert backend._can_run(devices)[0] and not backend._interpreted(devices)
    assert backend._interpreted({"cpu"}) and not backend._interpreted({"cuda"})
    part = graph.partition(gm)
    assert part.groups and all(n.meta["val"].device.type == "cuda" for g in part.groups for n in g.nodes)
    assert all(a.meta["val"].device.type == "cuda" or a.meta["val"].dim() == 0
               for g in part.groups for n in g.nodes for a in n.all_input_nodes)
    copy = next(n for n in gm.graph.nodes if n.target is torch.ops.aten._to_copy.default)
    assert "host-to-device" in part.eager[copy]


def test_a_scatter_of_a_scatters_buffer_is_not_in_its_kernel():
    """Found by a random-program sweep (programs that read class ids, seed 6312): the gradient of
    ``w.index_select(0, r).index_select(0, r)`` scatters into one zero buffer, then scatters that
    buffer into another at the same indices (dynamo shares ``r``). The second scatter joined the
    first's kernel with the buffer as its values: element j would read the buffer before every add
    into it had landed (here the runner's plan failed first: StopIteration)."""
    from kernelab.errors import KernelabFallbackWarning

    def f(w, i):
        r = i.reshape(-1) % 8
        return (w.index_select(0, r).index_select(0, r) ** 2).sum()

    w, i = _r(8, grad=True), torch.randint(0, 8, (2, 4), generator=torch.Generator().manual_seed(3))
    (want,) = torch.autograd.grad(f(w, i), w)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelabFallbackWarning)
        (got,) = torch.autograd.grad(torch.compile(f, backend="kernelab")(w, i), w)
    assert_close(got, want, what="gradient of w")
    plan = klc.explain(lambda w: torch.autograd.grad(f(w, i), w), w)
    refusals = [why for g in plan.graphs for _, why in g.refusals]
    assert any("a scatter's buffer is complete only when its kernel has finished" in why for why in refusals), refusals


def test_a_per_row_vector_merged_into_a_square_reduction_is_not_broadcast_along_rows():
    """Found by a random-program sweep: the backward of ``maximum(v, w.unsqueeze(1))`` with
    ``v[..., 1] = 2.5`` set in place adds a (6,) vector (the item set's gradient, a ``where``) to a
    row sum of a (6, 6) kernel. The vector's kernel was merged into the reduction's as a broadcast
    sibling ("full": one value per column), but its reader is a row value: the kernel loaded it at
    every element and failed to compile (strict raised; otherwise ATen ran it with a warning)."""
    def f(w):
        v = w.clone()
        v[..., 1] = 2.5
        return (torch.maximum(v, w.unsqueeze(1)) ** 2).sum()

    w, w2 = _r(6).requires_grad_(), _r(6).requires_grad_()
    (want,) = torch.autograd.grad(f(w), w)
    (got,) = torch.autograd.grad(torch.compile(f, backend="kernelab")(w2), w2)
    torch.testing.assert_close(got, want)
