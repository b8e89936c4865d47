"""Gathers (``x[..., i, j]``, interpolation's neighbour reads) generated as loads inside pointwise
kernels, when their indices are proved in range (``kernelab.compiler.bounds``); indices that come
from the data stay ATen's, with the reason in the plan.

Before (2026-12-04), every ``aten.index`` ran as an ATen kernel writing a full-size tensor that the
next kernel read back: bilinear upsampling was four gathers and a kernel of lerps (Segformer's
training step predicted more kernels than eager)."""
import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F

import kernelab.compiler as klc
from kernelab.compiler import bounds
from kernelab.compiler.fusion import GATHERS
from tests.compiler.conftest import REL, rel_norm

aten = torch.ops.aten


def _graph(fn, *example):
    """The ATen graph of ``fn`` with ``val`` metadata (make_fx on fake tensors)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, tracing_mode="fake")(*example)


def _node(gm: fx.GraphModule, target):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is target][-1]


def _gathers(group) -> bool:
    """Does the planned kernel hold a gather? (By op: a long kernel name ends in "_etc".)"""
    return any(op.split(" = ")[-1] in ("index", "embedding", "index_select") for op in group.ops)


def test_bounds_of_an_interpolation_index_chain():
    """trunc(clamp((arange(10) + 0.5) * 0.5 - 0.5, 0)) lies in [0, 4]: bilinear's source rows."""
    gm = _graph(lambda x: ((torch.arange(10, dtype=torch.float32) + 0.5) * 0.5 - 0.5).clamp(min=0).long() + x,
                torch.zeros((), dtype=torch.int64))
    index = _node(gm, aten._to_copy.default)
    assert bounds.bounds(index) == (0.0, 4.0)
    assert bounds.within(index, 5) and not bounds.within(index, 4)


def test_bounds_are_conservative_at_an_integer_edge():
    """arange(11) * 0.5 reaches 5.0 exactly: float32 rounding could make it 5.0000x, truncated 5
    either way; with 0.45 it stays below 5 by more than the slack: proved within 5 elements."""
    gm = _graph(lambda x: (torch.arange(11, dtype=torch.float32) * 0.5).long() + x, torch.zeros((), dtype=torch.int64))
    assert not bounds.within(_node(gm, aten._to_copy.default), 5)
    gm = _graph(lambda x: (torch.arange(11, dtype=torch.float32) * 0.45).long() + x, torch.zeros((), dtype=torch.int64))
    assert bounds.within(_node(gm, aten._to_copy.default), 5)


def test_bounds_of_positions_and_of_data():
    """A top-k's indices are positions along its dim; a tensor from outside the graph has none."""
    gm = _graph(lambda x: x.topk(3, -1).indices + 0, torch.randn(4, 7))
    assert bounds.bounds(_node(gm, aten.add.Tensor)) == (0.0, 6.0)
    gm = _graph(lambda i: i.clamp(-2, 3) + 1, torch.zeros(5, dtype=torch.int64))
    assert bounds.bounds(_node(gm, aten.add.Tensor)) == (-1.0, 4.0)
    gm = _graph(lambda i: i + 1, torch.zeros(5, dtype=torch.int64))
    assert bounds.bounds(_node(gm, aten.add.Tensor)) is None


def _inverse(perm):
    """The inverse of a permutation, written slot by slot into an empty tensor."""
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel())
    return inv


PROGRAMS = {
    "bilinear": (lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"), (2, 3, 5, 6)),
    "bilinear_corners": (lambda x: F.interpolate(x, size=(9, 13), mode="bilinear", align_corners=True), (2, 3, 5, 6)),
    "nearest": (lambda x: F.interpolate(x, scale_factor=2, mode="nearest") * 2, (2, 3, 5, 6)),
    "nearest_exact": (lambda x: F.interpolate(x, size=(7, 11), mode="nearest-exact"), (2, 3, 5, 6)),
    "bicubic": (lambda x: F.interpolate(x, size=(7, 9), mode="bicubic", align_corners=True), (2, 3, 5, 6)),
    "trilinear": (lambda x: F.interpolate(x, scale_factor=(2, 1.5, 2), mode="trilinear"), (1, 2, 3, 4, 5)),
    "channels_last": (lambda x: F.interpolate(x.to(memory_format=torch.channels_last), scale_factor=2,
                                              mode="bilinear").relu(), (2, 3, 5, 6)),
    "dims_after_the_index": (lambda x: x[:, torch.arange(-1, 4).clamp(0, 2)] + 1, (2, 3, 5, 6)),
    "topk_positions": (lambda x: x.flatten(1)[torch.arange(2)[:, None], x.flatten(1).topk(3, -1).indices], (2, 3, 5)),
    "sorted_rows": (lambda x: x[x[:, 0].sort().indices] * 3, (6, 4)),
    # MoE routing (Mixtral): each sorted expert slot's token, slot // top_k
    "position_embedding": (lambda x: F.embedding(torch.arange(3), x) + x[:3], (5, 4)),
    "index_select_arange": (lambda x: x.index_select(1, torch.arange(1, 4)) * 2, (3, 5, 2)),
    "inverse_permutation": (lambda x: x[_inverse(x[:, 0].sort().indices)] * 2, (6, 4)),
    "routing": (lambda x: x[(x @ x.t()).topk(2, -1).indices.view(-1).sort().indices // 2].sigmoid(), (6, 4)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_gather_program_matches_eager_and_is_generated(name, dtype):
    fn, shape = PROGRAMS[name]
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    want = fn(a)
    got = torch.compile(fn, backend="kernelab")(b)
    weight = torch.randn(want.shape, generator=torch.Generator().manual_seed(1))
    (want.float() * weight).sum().backward()
    (got.float() * weight).sum().backward()
    tol = REL if dtype == torch.float32 else 3e-3
    assert rel_norm(got.float(), want.float()) <= tol
    assert rel_norm(b.grad.float(), a.grad.float()) <= tol
    torch._dynamo.reset()
    plan = klc.explain(fn, x)
    generated = [g for gp in plan.graphs for g in gp.groups if _gathers(g)]
    left = [e for gp in plan.graphs for e in gp.eager if e[1] in GATHERS]
    assert generated and not left, (generated, left)


def test_indices_from_the_data_stay_aten_with_the_reason():
    """A user's index tensor may hold anything: the gather stays ATen's (which raises on a bad
    index); the result still matches, and the plan says why."""
    def fn(x, i):
        return x[:, i] * 2

    x, i = torch.randn(3, 5), torch.tensor([0, 4, 2, 2])
    assert torch.equal(torch.compile(fn, backend="kernelab")(x, i), fn(x, i))
    torch._dynamo.reset()
    plan = klc.explain(fn, x, i)
    (left,) = [e for gp in plan.graphs for e in gp.eager if e[1] == "aten.index.Tensor"]
    assert "indices from the data" in left[2]
    with pytest.raises(IndexError):
        torch.compile(fn, backend="kernelab")(x, torch.tensor([5]))


def test_an_index_that_may_be_negative_is_not_generated():
    """arange(-1, 4) unclamped reaches -1 (Python's wrap-around): not proved in [0, size)."""
    def fn(x):
        return x[:, torch.arange(-1, 3)] + 1

    x = torch.randn(2, 4)
    assert torch.equal(torch.compile(fn, backend="kernelab")(x), fn(x))
    torch._dynamo.reset()
    plan = klc.explain(fn, x)
    assert [e for gp in plan.graphs for e in gp.eager if e[1] == "aten.index.Tensor"]


def test_gathers_under_dynamic_shapes():
    """Interpolation called at three batch sizes with dynamic=True: right at every size."""
    fn = PROGRAMS["bilinear"][0]
    compiled = torch.compile(fn, backend="kernelab", dynamic=True)
    for n in (2, 3, 5):
        x = torch.randn(n, 3, 5, 6)
        assert rel_norm(compiled(x), fn(x)) <= REL


def test_inference_interpolation_is_one_kernel_with_its_indices():
    """Without a backward to save them for, nearest upsampling's index arithmetic is computed in
    the kernel that gathers: one kernel where eager launches one and the decomposition five."""
    fn = PROGRAMS["nearest"][0]
    with torch.no_grad():
        plan = klc.explain(fn, torch.randn(2, 3, 5, 6))
    (group,) = [g for gp in plan.graphs for g in gp.groups]
    assert "index" in group.name and not [e for gp in plan.graphs for e in gp.eager if "index" in e[1]]


def test_a_half_precision_interpolation_gathers_its_input_without_a_float32_copy():
    """Bilinear's decomposition computes a float16 input in float32: the cast before the gathers
    was a kernel of its own writing the input again in float32 (bfloat16 on the H200: 4 kernels,
    0.25x Inductor); the gathers now read the float16 input and the cast joins their kernel."""
    x = torch.randn(2, 3, 5, 6, dtype=torch.float16)

    def fn(x):
        return F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)

    with torch.no_grad():
        plan = klc.explain(fn, x)
        got = torch.compile(fn, backend="kernelab")(x)
    names = [g.name for gp in plan.graphs for g in gp.groups]
    assert len(names) == 2 and "kl_fused_cast" not in names, names
    torch.testing.assert_close(got, fn(x), rtol=2e-3, atol=2e-3)


def test_a_gather_recomputed_in_the_backward_keeps_the_forwards_proof():
    """The partitioner recomputes an interpolation in the backward from the indices the forward
    saved: those arrive as the backward graph's inputs, proved in range by the forward
    (``bounds.of_outputs``). Segformer's backward ran four such gathers as ATen's before."""
    labels = torch.zeros(2, 12, 12, dtype=torch.long)

    def step(x):
        y = F.interpolate(x, size=(12, 12), mode="bilinear")
        return F.cross_entropy(y, labels, reduction="none").sum()

    x = torch.randn(2, 3, 5, 6)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    step(a).backward()
    torch.compile(step, backend="kernelab")(b).backward()
    assert rel_norm(b.grad, a.grad) <= REL
    torch._dynamo.reset()
    plan = klc.explain(lambda x: step(x).backward(), x.clone().requires_grad_())
    backward = [gp for gp in plan.graphs if gp.kind == "backward"]
    assert backward and all(not [e for e in gp.eager if e[1] == "aten.index.Tensor"] for gp in backward)
    assert any(_gathers(g) for gp in backward for g in gp.groups)


def test_an_index_made_by_a_constant_fill():
    """A gather by a filled index (one value everywhere, inlined as a literal)."""
    def fn(x):
        return x[:, torch.full((4,), 2)] * 2

    x = torch.randn(3, 5)
    assert torch.equal(torch.compile(fn, backend="kernelab")(x), fn(x))


def test_the_backward_of_a_gather_at_four_places_accumulates_into_one_buffer():
    """Bilinear interpolation's backward: the four neighbours' scatters add into one zero fill
    (``rewrites.scatter_sums_into_one_buffer``), not four fills summed by three adds; the four are
    atomic adds of the kernel that computes their values (``fusion.scatter_refusal``), none ATen's."""
    x = torch.randn(2, 3, 5, 6, requires_grad=True)
    plan = klc.explain(lambda x: F.interpolate(x, scale_factor=2, mode="bilinear").sum().backward(), x)
    (backward,) = [gp for gp in plan.graphs if gp.kind == "backward"]
    ops = [e[1] for e in backward.eager]
    assert "aten.index_put_.default" not in ops, ops
    scatters = [g for g in backward.groups if any(op.endswith("= index_put_") for op in g.ops)]
    assert len(scatters) == 1 and sum(op.endswith("= index_put_") for op in scatters[0].ops) == 4, \
        [g.ops for g in backward.groups]
    adds_only = [g for g in backward.groups if all(op.endswith("= add") for op in g.ops)]
    assert not adds_only  # the four scatters' sums are gone


def test_the_place_scatter_add_kernel_matches_aten():
    """``kl_scatter_add`` (indices on consecutive dims, broadcast together, repeated places)
    against ATen's accumulating ``index_put_``; unproved, the same call is ATen's."""
    from kernelab.compiler import scatter

    g = torch.Generator().manual_seed(0)
    ih = torch.randint(0, 5, (7, 1), generator=g)
    iw = torch.randint(0, 6, (9,), generator=g)
    values = torch.randn(2, 3, 7, 9, generator=g)
    want = aten.index_put_.default(torch.zeros(2, 3, 5, 6), [None, None, ih, iw], values, True)
    run = scatter.ScatterAddRows(proved=True)
    assert run.kernel_for(torch.zeros(2, 3, 5, 6), [None, None, ih, iw], values) == scatter.PLACES_KERNEL_NAME
    got = run(torch.zeros(2, 3, 5, 6), [None, None, ih, iw], values, True)
    assert rel_norm(got, want) <= REL
    one = torch.randint(0, 4, (5,), generator=g)  # one indexed dim in the middle, trailing dims after
    values = torch.randn(3, 5, 2, generator=g)
    got = run(torch.zeros(3, 4, 2), [None, one], values, True)
    assert rel_norm(got, aten.index_put_.default(torch.zeros(3, 4, 2), [None, one], values, True)) <= REL
    assert scatter.ScatterAddRows().kernel_for(torch.zeros(2, 3, 5, 6), [None, None, ih, iw], values) is None


def test_an_interpolations_backward_scatters_in_its_kernel(monkeypatch):
    """The four scatters run inside the generated kernel (no place kernel, no ATen index_put_);
    under deterministic algorithms they are ATen's sorted kernel's, and the gradient is the same."""
    from kernelab.compiler import scatter

    calls = []
    real = scatter._scatter_add_places
    monkeypatch.setattr(scatter, "_scatter_add_places", lambda *a: calls.append(1) or real(*a))
    fn = PROGRAMS["bilinear"][0]
    x = torch.randn(2, 3, 5, 6)
    dy = torch.randn(2, 3, 10, 12)
    a = x.clone().requires_grad_()
    fn(a).backward(dy)
    for deterministic in (False, True):
        torch._dynamo.reset()
        b = x.clone().requires_grad_()
        torch.use_deterministic_algorithms(deterministic)
        try:
            klc.reset_events()
            torch.compile(fn, backend="kernelab")(b).backward(dy)
            plan = klc.explain(lambda x: fn(x).backward(dy), x.clone().requires_grad_())
        finally:
            torch.use_deterministic_algorithms(False)
        assert rel_norm(b.grad, a.grad) <= REL and not klc.events().fallbacks
        aten_scatters = [e for gp in plan.graphs for e in gp.eager if e[1] == "aten.index_put_.default"]
        assert len(aten_scatters) == (4 if deterministic else 0), aten_scatters
    assert not calls


def test_a_proved_scatter_into_a_computed_buffer_runs_the_place_kernel(monkeypatch):
    """A scatter adding into a buffer that is not zeros (a fill of another value: the kernels' atomic
    adds start from the runner's zero fill) stays outside the kernels; with its indices proved it
    runs the place kernel."""
    from kernelab.compiler import scatter

    calls = []
    real = scatter._scatter_add_places
    monkeypatch.setattr(scatter, "_scatter_add_places", lambda *a: calls.append(1) or real(*a))

    def fn(x, v):
        idx = torch.arange(4) * 2
        return aten.index_put.default(torch.full((3, 8), 1.5), [None, idx], v * 2, True).sin() + x

    x, v = torch.randn(3, 8), torch.randn(3, 4)
    assert rel_norm(torch.compile(fn, backend="kernelab")(x, v), fn(x, v)) <= REL
    assert len(calls) == 1


def test_an_embedding_of_token_ids_stays_aten_and_of_positions_is_generated():
    """GPT-2's two lookups: token ids come from the data (ATen's embedding, which checks them);
    positions are an arange, proved within the table: gathered in the kernel that adds them."""
    def fn(ids, wte, wpe):
        return F.embedding(ids, wte) + F.embedding(torch.arange(ids.shape[-1]), wpe)

    ids, wte, wpe = torch.randint(0, 11, (2, 6)), torch.randn(11, 4), torch.randn(8, 4)
    assert rel_norm(torch.compile(fn, backend="kernelab")(ids, wte, wpe), fn(ids, wte, wpe)) <= REL
    torch._dynamo.reset()
    plan = klc.explain(fn, ids, wte, wpe)
    (left,) = [e for gp in plan.graphs for e in gp.eager if e[1] == "aten.embedding.default"]
    assert "indices from the data" in left[2]
    assert [g for gp in plan.graphs for g in gp.groups if "embedding" in g.name]


BROADCAST = {
    # the gather's result broadcast into a bigger kernel: fewer dims, or size-1 dims
    "position_embedding_added": (lambda ids, wte, wpe: F.embedding(ids, wte) + F.embedding(torch.arange(6), wpe),
                                 lambda: (torch.randint(0, 11, (2, 6)), torch.randn(11, 4), torch.randn(8, 4))),
    "size_one_source_dim": (lambda x, y: x[:, torch.arange(3).clamp(0, 4)] * y,
                            lambda: (torch.randn(1, 5), torch.randn(2, 3))),
}


@pytest.mark.parametrize("name", sorted(BROADCAST))
def test_a_gathered_value_broadcast_against_a_bigger_one(name):
    """A gathered value meeting a bigger one (a position embedding added to token embeddings, a
    size-1 source dim): right, and still generated. (The gather keeps a kernel of its own shape:
    merged into the bigger kernel, GPT-2's sum of embeddings left the layer norm's kernel.)"""
    fn, make = BROADCAST[name]
    args = make()
    assert rel_norm(torch.compile(fn, backend="kernelab")(*args), fn(*args)) <= REL
    torch._dynamo.reset()
    plan = klc.explain(fn, *args)
    assert [g for gp in plan.graphs for g in gp.groups if _gathers(g)]


def test_bounds_refuse_what_they_cannot_prove():
    """A clamp to -inf from above, integers past their type (int32 wrap-around), half-precision
    rounding near an integer edge, a symbolic size: no proof."""
    def last(fn, *example, target):
        return _node(_graph(fn, *example), target)

    zero = torch.zeros((), dtype=torch.int64)
    clamped = last(lambda x: torch.arange(5, dtype=torch.float32).clamp(0.0, float("-inf")).long() + x, zero,
                   target=aten._to_copy.default)
    assert bounds.bounds(clamped) is None
    wrapped = last(lambda x: torch.arange(3, dtype=torch.int32) * 2**30 + x, torch.zeros((), dtype=torch.int32),
                   target=aten.add.Tensor)
    assert bounds.bounds(wrapped) is None
    half = last(lambda x: (torch.arange(11, dtype=torch.float16) * 0.4995).long() + x, zero,
                target=aten._to_copy.default)
    assert not bounds.within(half, 5)  # 4.995 in float16 may round to 5.0
    shifted = last(lambda x: torch.arange(4) + 1, zero, target=aten.add.Tensor)
    assert bounds.within(shifted, 5) and not bounds.within(shifted, 5.0)  # a size that is not an int


def _scattered_then_summed(x, w, b):
    return F.linear(x, w, b)[:, 6 - torch.arange(7)] * 2


def _bias_then_picked(x, b):
    return (x + b)[:, torch.arange(4) * 2]


def _scatter_then_column_sum(x):
    idx = torch.arange(6)
    z = x.new_zeros(6, 6).index_put_((idx[:, None], (5 - idx)[None, :]), x, accumulate=True)
    return z.sum(0)


@pytest.mark.parametrize("case", ["linear_reversed", "bias_picked", "column_sum", "nearest_1d"])
def test_a_scatter_never_joins_a_column_sum(case):
    """A scatter's buffer is complete only when its kernel has finished: a column reduction must
    not take the scatter into its prologue (a bias gradient summed the buffer in the same kernel:
    every gradient 1.1-1.5 off in relative norm, silently; other shapes crashed in the runner;
    found by a held-out sweep). Forward and every gradient against eager."""
    g = torch.Generator().manual_seed(0)
    if case == "linear_reversed":
        fn, args = _scattered_then_summed, (torch.randn(5, 3, generator=g), torch.randn(7, 3, generator=g),
                                             torch.randn(7, generator=g))
    elif case == "bias_picked":
        fn, args = _bias_then_picked, (torch.randn(5, 8, generator=g), torch.randn(8, generator=g))
    elif case == "column_sum":
        fn, args = _scatter_then_column_sum, (torch.randn(6, 6, generator=g),)
    else:
        def fn(x, b):
            return F.interpolate(x + b, scale_factor=2, mode="nearest")
        args = (torch.randn(2, 3, 5, generator=g), torch.randn(5, generator=g))
    eager_args = [a.clone().requires_grad_() for a in args]
    mine_args = [a.clone().requires_grad_() for a in args]
    want = fn(*eager_args)
    got = torch.compile(fn, backend="kernelab")(*mine_args)
    assert rel_norm(got, want) <= REL
    dy = torch.randn(want.shape, generator=g)
    for a, b in zip(torch.autograd.grad(got, mine_args, dy), torch.autograd.grad(want, eager_args, dy)):
        assert rel_norm(a, b) <= REL


@pytest.mark.parametrize("case", ["flip", "roll", "roll_negative", "fmod_negative"])
def test_flipped_and_rolled_indices_are_proved(case):
    """``x[:, arange(n).flip(0)]`` and ``torch.roll`` (whose decomposition gathers at
    ``fmod(arange + shift, n)``) have proved indices (``bounds``): generated gathers, and their
    backward's scatters, against eager. A C-style remainder of possibly negative values may be
    negative: not proved within [0, n) (ATen's, with its range check)."""
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(0))
    fns = {
        "flip": lambda x: (x * 2)[:, torch.arange(6).flip(0)],
        "roll": lambda x: torch.roll(x * 2, 2, 1),
        "roll_negative": lambda x: torch.roll(x * 2, -4, 1),
        "fmod_negative": lambda x: (x * 2)[:, torch.fmod(torch.arange(6) - 3, 6)],
    }
    fn = fns[case]
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    want = fn(a)  # (negative indices count from the end in eager indexing)
    got = torch.compile(fn, backend="kernelab")(b)
    assert rel_norm(got, want) <= REL
    dy = torch.randn(want.shape, generator=torch.Generator().manual_seed(1))
    assert rel_norm(torch.autograd.grad(got, b, dy)[0], torch.autograd.grad(want, a, dy)[0]) <= REL
    torch._dynamo.reset()
    plan = klc.explain(fn, x)
    gathers_left = [e for gp in plan.graphs for e in gp.eager if e[1] in ("aten.index.Tensor", "aten.index_select.default")]
    if case == "fmod_negative":
        assert gathers_left and "indices from the data" in gathers_left[0][2], gathers_left
    else:
        assert not gathers_left, gathers_left


def test_scatters_of_values_a_row_kernel_wrote_share_one_kernel():
    """The backward of an interpolation before a softmax: the row kernel of the softmax's backward
    writes the four neighbours' values, and the four scatters are one kernel of their own (the
    first took a kernel of its own and the other three ran as ATen's ``index_put_``)."""
    x = torch.randn(2, 3, 5, 6, generator=torch.Generator().manual_seed(0))
    dy = torch.randn(2, 3, 10, 12, generator=torch.Generator().manual_seed(1))

    def fn(x):
        return F.interpolate(x, scale_factor=2, mode="bilinear").softmax(-1)

    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    want = torch.autograd.grad(fn(a), a, dy)[0]
    got = torch.autograd.grad(torch.compile(fn, backend="kernelab")(b), b, dy)[0]
    assert rel_norm(got, want) <= REL
    torch._dynamo.reset()
    plan = klc.explain(lambda x: torch.autograd.grad(fn(x), x, dy), x.clone().requires_grad_())
    assert not [e for gp in plan.graphs for e in gp.eager if "index_put" in e[1]]
    scatters = [g for gp in plan.graphs for g in gp.groups if any(op.endswith("= index_put_") for op in g.ops)]
    assert len(scatters) == 1, [g.name for g in scatters]


def test_embedding_backward_scatter_at_a_constant_index():
    """``token_type_ids = zeros`` made inside the graph (MegatronBERT, Longformer, MobileBERT,
    SqueezeBERT): the embedding's backward is a scatter at a constant index, which the codegen
    looked up as a load and raised KeyError (found by a held-out sweep, 2026-12-05); the index is
    now a literal, as a gather's constant index already was."""
    def f(x, w):
        tt = torch.zeros(x.shape[:2], dtype=torch.long)
        return (x + F.embedding(tt, w)).sin().sum()

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 12, 32, generator=g), torch.randn(2, 32, generator=g)
    grads = []
    for fn in (f, torch.compile(f, backend="kernelab")):
        xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
        fn(xx, ww).backward()
        grads.append((xx.grad, ww.grad))
    for a, b in zip(grads[1], grads[0]):
        assert rel_norm(a, b) < REL


def test_a_where_proves_each_branch_under_its_side_of_the_condition():
    """where(i < 3, i, f(i)): f is proved where i >= 3 only. log(i) of i in [0, 9] proves nothing
    (log 0 = -inf); under i >= 3 it lies in [log 3, log 9]. An integer compared with a
    non-integer constant: i > 2.5 is i >= 3, not i >= 3.5."""
    def last_add(where_of):  # the where of where_of(i), i = arange(10) (traced with an unused input)
        zero = torch.zeros((), dtype=torch.int64)
        return _node(_graph(lambda z: where_of(torch.arange(10)) + z, zero), aten.where.self)

    log = _node(_graph(lambda z: torch.log(torch.arange(10).float()) + z, torch.zeros(())), aten.log.default)
    assert bounds.bounds(log) is None  # unconditionally: log(0)
    assert bounds.bounds(last_add(lambda i: torch.where(i < 3, i, torch.log(i.float()).long()))) == (0.0, 2.0)
    assert bounds.bounds(last_add(lambda i: torch.where(i > 2.5, i - 3, 0))) == (0.0, 6.0)
    assert bounds.bounds(last_add(lambda i: torch.where(2.5 < i, i - 4, 0))) == (-1.0, 5.0)  # constant on the left
    assert bounds.bounds(last_add(lambda i: torch.where(i < 20, i, -i))) == (0.0, 9.0)  # the false side never is
    def compared_with(z, y):
        i = torch.arange(10)
        return torch.where(i < y, i, torch.log(i.float()).long()) + z

    y = _node(_graph(compared_with,
                     torch.zeros((), dtype=torch.int64), torch.tensor(3)), aten.where.self)
    assert bounds.bounds(y) is None  # log(0) again: compared with a tensor of unknown value, nothing is known


@pytest.mark.parametrize("bidirectional", [True, False], ids=["encoder", "decoder"])
def test_t5_relative_position_buckets_are_proved_and_their_embedding_generated(bidirectional):
    """T5's position bias: buckets computed from aranges through abs/min, a log and a where
    (``T5Attention._relative_position_bucket``), then an embedding of (num_buckets, heads). The
    buckets are proved within the table (stop 44; they were "indices from the data"), so the
    lookup is a generated gather; values as eager's."""
    transformers = pytest.importorskip("transformers")
    bucket = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket
    table = torch.randn(8, 4)

    def bias(x):
        rel = torch.arange(16)[None, :] - torch.arange(16)[:, None]
        b = bucket(rel, bidirectional=bidirectional, num_buckets=8, max_distance=20)
        return F.embedding(b, table).permute(2, 0, 1).unsqueeze(0) + x

    x = torch.randn(1, 4, 16, 16)
    assert rel_norm(torch.compile(bias, backend="kernelab")(x), bias(x)) <= REL
    torch._dynamo.reset()
    plan = klc.explain(bias, x)
    assert not [e for gp in plan.graphs for e in gp.eager if e[1] == "aten.embedding.default"]
    assert [g for gp in plan.graphs for g in gp.groups if _gathers(g)]


@pytest.mark.parametrize("chained", [False, True], ids=["one", "two_into_one_buffer"])
def test_a_half_precision_scatter_accumulates_in_float32_in_a_generated_kernel(chained):
    """A MoE's combine in float16: tokens gathered in a routing order, computed, and added back
    into a zero fill at their positions (twice into one buffer: two experts). Atomic adds are
    generated in float32 only, so the float16 scatter was ATen's sorting ``index_put_`` (on the
    H100, Mixtral's backward: radix sorts, a histogram, its own kernel, four times a step); now it
    is the same scatter of float32 values into a float32 buffer, in the kernel computing the
    values, cast back once (``rewrites.half_precision_scatters_in_float32``)."""
    def combine(x, w):
        order = torch.argsort(x.sum(-1))
        out = torch.zeros(x.shape, dtype=x.dtype).index_put_((order,), (x[order] * w).relu(), accumulate=True)
        if chained:  # a sum of two scatters, each into its own fill: one buffer (scatter_sums_into_one_buffer)
            out = out + torch.zeros(x.shape, dtype=x.dtype).index_put_((order.flip(0),), x[order] * w, accumulate=True)
        return out * 2

    x, w = torch.randn(64, 32, dtype=torch.float16), torch.randn(32, dtype=torch.float16)
    got, want = torch.compile(combine, backend="kernelab")(x, w), combine(x, w)
    assert got.dtype == torch.float16
    assert rel_norm(got.float(), want.float()) <= 1e-3  # float16 rounding of each sum (eager's too)
    torch._dynamo.reset()
    plan = klc.explain(combine, x, w)
    assert not [e for gp in plan.graphs for e in gp.eager if "index_put" in e[1]]
    scatters = [g for gp in plan.graphs for g in gp.groups if any("index_put" in op for op in g.ops)]
    assert len(scatters) == 1  # both scatters in the one kernel that owns the buffer


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("flip", [lambda x: x.flip(1), lambda x: x.flip(-1), lambda x: x.unsqueeze(0).flip(0, 2),
                                  lambda x: x.flip(0)], ids=["dim 1", "dim -1", "with a size-1 dim", "dim 0"])
def test_a_flip_of_one_dim_is_read_reversed_by_the_kernel_reading_it(flip, dtype):
    """``flip`` (a copy kernel of ATen's) of one dim of static size: a gather at the reversed
    positions inside the kernel that reads it (``rewrites.flips_as_gathers``): one kernel for
    ``sin(flip(x) * 2)``, values and gradients eager's."""
    x = torch.randn(6, 33, dtype=dtype, requires_grad=True)

    def fn(x):
        return (flip(x) * 2).sin()

    plan = klc.explain(fn, x.detach())
    assert not [e for gp in plan.graphs for e in gp.eager if "flip" in str(e[1])], str(plan)
    assert sum(len(gp.groups) for gp in plan.graphs) == 1 and _gathers(plan.graphs[0].groups[0]), str(plan)
    got = torch.compile(fn, backend="kernelab")(x)
    want = fn(x)
    torch.testing.assert_close(got, want)
    (g,), (w,) = torch.autograd.grad(got.float().sum(), x), torch.autograd.grad(want.float().sum(), x)
    torch.testing.assert_close(g, w)


def test_a_flip_of_two_dims_and_a_symbolic_flip_stay_atens_copy():
    """A gather per flipped dim would be a kernel per dim (a gather reads its source from memory):
    ATen's one copy kernel stays, as it does for a dim whose size is symbolic; values eager's."""
    x = torch.randn(6, 33)
    two = klc.explain(lambda x: x.flip(0, 1) * 2, x)
    assert [e for gp in two.graphs for e in gp.eager if "flip" in str(e[1])], str(two)
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: x.flip(1) * 2, backend="kernelab", dynamic=True)
    for cols in (33, 40):
        y = torch.randn(5, cols)
        torch.testing.assert_close(compiled(y), y.flip(1) * 2)
