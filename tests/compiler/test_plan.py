"""Plans without running kernels: kernel counts, bytes, refusals with reasons, explain output."""
import io
import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from rich.console import Console

import kernelab.compiler as klc
from kernelab.compiler import graph
from kernelab.programs import all_programs
from kernelab.traffic import kernel_bytes
from tests.compiler.test_golden import forward_groups

MB4 = 4096 * 1024 * 4


def _names(kernels):
    return [k.name for k in kernels]


@pytest.mark.parametrize("program, expected", [
    ("add_relu", ["kl_fused_add_relu"]),
    ("softmax", ["kl_fused_amax_sub_exp_sum_div"]),
    ("rms_norm_manual", ["kl_fused_pow_mean_add_rsqrt_mul"]),
    ("gelu_affine", ["kl_fused_mul_add_erf"]),
    ("outer_add", ["kl_fused_add"]),
])
def test_one_kernel_per_program(program, expected):
    p = all_programs()[program]
    assert _names(klc.plan_kernels(p.make_target(), p.make_args(), {})) == expected


def test_layer_norm_is_one_kernel_and_its_backward_two():
    """Forward: one row kernel. Backward: the row part (dx), and one column kernel for both the
    weight and the bias gradients; nothing left to ATen."""
    p = all_programs()["layer_norm_backward"]
    kernels = klc.plan_kernels(p.make_target(), p.make_args(), {})
    names = _names(kernels)
    assert len(names) == 3 and all(n.startswith("kl_fused_") for n in names), names
    column = kernels[-1] if kernels[-1].ops.count("sum") == 2 else kernels[-2]
    assert column.ops.count("sum") == 2, names


def test_bytes_of_the_fused_kernel_are_its_inputs_and_outputs():
    p = all_programs()["silu_gate"]
    (kernel,) = klc.plan_kernels(p.make_target(), p.make_args(), {})
    assert kernel_bytes(kernel) == (2 * MB4, MB4)


def test_library_ops_keep_their_eager_kernels():
    p = all_programs()["addmm_relu"]
    names = _names(klc.plan_kernels(p.make_target(), p.make_args(), {}))
    assert names[0].startswith("gemm") and names[1] == "kl_fused_relu", names


def test_graph_breaks_count_their_eager_ops():
    def fn(x):
        y = x.sin() + 1
        torch._dynamo.graph_break()
        return y.cos() * 2

    names = _names(klc.plan_kernels(fn, (torch.randn(100),), {}))
    assert names == ["kl_fused_sin_add", "kl_fused_cos_mul"]


def test_plan_does_not_touch_the_callers_tensors():
    p = all_programs()["inplace_chain"]
    (x,) = p.make_args()
    before = x.clone()
    klc.plan_kernels(p.make_target(), (x,), {})
    assert torch.equal(x, before)


def test_explain_prints_groups_bytes_and_reasons():
    x, w = torch.randn(64, 32), torch.randn(32, 16)
    plan = klc.explain(lambda x, w: torch.softmax(x @ w, -1).sum(0), x, w)
    text = io.StringIO()
    Console(file=text, width=200).print(plan)
    out = text.getvalue()
    # softmax's row statistics, then the column sum recomputing softmax from them: nothing
    # full-size is written between the two kernels
    assert "kl_fused_amax_sub_exp_sum" in out and "column" in out
    assert "cuBLAS" in out
    d = plan.to_dict()
    json.dumps(d)
    rows, cols = d["graphs"][0]["groups"]
    assert (rows["kind"], cols["kind"]) == ("reduction", "column")
    assert all(g["bytes_after"] < g["bytes_before"] for g in (rows, cols))


@pytest.mark.parametrize("fn, node_reason", [
    (lambda x: x.pow(2.5) + 1, "no exact short Triton expression"),
    (lambda x: x.amax(0) * 2, "amax over the leading dims is not generated"),
    (lambda x: (x + 1).t() * 2, None),  # a transpose between two groups: both still fuse
])
def test_refusals_carry_reasons(fn, node_reason):
    found = []

    def fw(gm, example_inputs):
        found.append(graph.partition(gm))
        return gm.forward
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from kernelab.compiler.backend import decompositions

    backend = aot_autograd(fw_compiler=lambda gm, ex: make_boxed_func(fw(gm, ex)), decompositions=decompositions())
    x = torch.randn(8, 8)
    torch.compile(fn, backend=backend)(x)
    reasons = [why for why in found[0].eager.values() if why]
    if node_reason is None:
        assert len(found[0].groups) == 2 and not reasons
        first = found[0].groups[0]
        assert [n.name for n in first.nodes] == ["add"]  # the transposed value is written, then read
    else:
        assert any(node_reason in why for why in reasons), reasons


def test_an_add_transposed_then_copied_is_computed_in_the_copys_kernel():
    """Square: a transpose keeps the shape, not the values. The add of an input, whose one use is
    the transpose that the copy reads, moves past the transpose (``rewrites.pointwise_into_copies``):
    the copy's kernel computes it, and the product with ``x`` joins it; one kernel, not two."""
    def fn(x):
        return (x + 1).t().contiguous() * x

    x = torch.randn(8, 8)
    torch.testing.assert_close(torch.compile(fn, backend="kernelab")(x), fn(x))
    groups = forward_groups(fn, x)
    assert len(groups) == 1, groups
    assert sorted(n.name for n in groups[0].nodes if n.name != "clone") == ["add_tensor", "mul"]


def test_a_rope_tree_transposed_then_copied_is_one_kernel():
    """RoPE's gradient as Llama's backward computes it: a cat of the halves (one negated), products
    with (S, D) tables that broadcast, a sum, all of shape (B, H, S, D), then transposed and copied
    into (B, S, H, D) for the projection's matmul. Every op of the tree is read only by the next
    one, so ``rewrites.permuted_trees_into_copies`` moves the transpose to the leaves (the cat's dim
    with it) and the copy's kernel computes the tree: one kernel, where a tree kernel and a copy
    were two. Values as eager's, for a non-square transpose (H != S)."""
    def fn(g, sin, cos):
        rotated = torch.cat([g[..., 8:], -g[..., :8]], dim=-1)
        grad = rotated * sin + (g * 2.0) * cos
        return grad.transpose(1, 2).contiguous().view(2, 6, 3 * 16)

    g, sin, cos = torch.randn(2, 3, 6, 16), torch.randn(6, 16), torch.randn(6, 16)
    torch.testing.assert_close(torch.compile(fn, backend="kernelab")(g, sin, cos), fn(g, sin, cos))
    groups = forward_groups(fn, g, sin, cos)
    assert len(groups) == 1, groups
    assert any(n.name.startswith("cat") for n in groups[0].nodes), groups[0].nodes


def test_a_tree_given_up_halfway_leaves_no_node_behind(monkeypatch):
    """A restatement that fails after inserting nodes (``Builder.undo``) leaves the graph as it
    was: the nodes it made are erased, not left unread, where an elementwise one would still be
    planned as a kernel computing nothing used. Here the tree is rebuilt in full, then refused."""
    from kernelab.compiler import rewrites

    real, depth = rewrites._permuted, []

    def refused(b, node, perm):  # (the recursion comes back through here: refuse at the root only)
        depth.append(node)
        built = real(b, node, perm)
        depth.pop()
        if not depth:
            raise ValueError("refused after building")
        return built

    def fn(g, sin):
        return (torch.cat([g[..., 4:], -g[..., :4]], dim=-1) * sin).transpose(1, 2).contiguous()

    real_rewrite, unread = rewrites.permuted_trees_into_copies, []

    def watched(gm):  # the graph right after the rewrite, before any later one cleans it
        count = real_rewrite(gm)
        unread.extend(n.name for n in gm.graph.nodes if n.op == "call_function" and not n.users)
        return count

    g, sin = torch.randn(2, 3, 6, 8), torch.randn(6, 8)
    monkeypatch.setattr(rewrites, "_permuted", refused)
    monkeypatch.setattr(rewrites, "permuted_trees_into_copies", watched)
    torch.testing.assert_close(torch.compile(fn, backend="kernelab")(g, sin), fn(g, sin))
    assert not unread, unread
    assert len(forward_groups(fn, g, sin)) == 2


def test_a_tree_value_read_elsewhere_stays_and_is_read_transposed():
    """A node of the tree with a second reader is not recomputed: it stays where it is (written
    once) and the copy's kernel reads it through the transpose; the values stay eager's."""
    def fn(a, b):
        shared = a.sin() * b
        return (shared + 1.0).transpose(1, 2).contiguous(), shared.sum(-1)

    a, b = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4)
    out, ref = torch.compile(fn, backend="kernelab")(a, b), fn(a, b)
    torch.testing.assert_close(out, ref)
    assert out[0].is_contiguous()


def test_moe_routings_token_of_each_sorted_slot_is_generated():
    """Hugging Face's grouped-MM experts read ``hidden[perm // top_k]`` and ``weights[perm]``: the
    integer division by a constant is generated (exactly, floored as Python's ``//``:
    ``kl_math.int_div_floor``) in the kernel of the gather of its own shape (the routing
    weights'); it was an ATen kernel of its own ("integer division with rounding"): 2 kernels
    where 3 were. A tensor divisor, which may be zero, stays ATen's."""
    def fn(x, w, ids):
        perm = torch.sort(ids).indices
        return x[perm // 2] * w[perm].unsqueeze(-1)

    x, w, ids = torch.randn(8, 4), torch.rand(16), torch.randint(0, 4, (16,))
    torch.testing.assert_close(torch.compile(fn, backend="kernelab")(x, w, ids), fn(x, w, ids))
    groups = forward_groups(fn, x, w, ids)
    divisions = [n for g in groups for n in g.nodes if n.target is torch.ops.aten.div.Tensor_mode]
    assert len(groups) == 2 and len(divisions) == 1, groups
    plan = klc.explain(lambda a, b: torch.div(a, b, rounding_mode="floor") + 1,
                       torch.arange(-6, 6), torch.full((12,), 3))
    assert "a tensor or by zero" in str(plan), plan


def test_key_and_value_copies_of_one_product_are_one_kernel():
    """GPT-2's attention splits one qkv product and copies the key and the value, each
    transposed, into the KV cache: two copies of two slices of one ATen value. A group reading
    another view of the same memory is a sharing group (``views.alias_roots``), so both copies
    are one kernel with two outputs, as Inductor's; the query's product, of another shape,
    stays apart. Values and layouts as eager's."""
    def fn(qkv):
        q, k, v = qkv.split(32, dim=2)
        k = k.view(2, 8, 4, 8).transpose(1, 2).contiguous()
        v = v.view(2, 8, 4, 8).transpose(1, 2).contiguous()
        return q * 2, k, v

    x = torch.randn(2, 8, 96)
    for got, want in zip(torch.compile(fn, backend="kernelab")(x), fn(x)):
        assert torch.equal(got, want) and got.stride() == want.stride()
    groups = forward_groups(fn, x)
    copies = [g for g in groups if g.name == "kl_fused_copy"]
    assert len(groups) == 2 and len(copies) == 1 and len(copies[0].nodes) == 2, groups


def test_row_value_groups_merge_into_their_reduction():
    """rsqrt(var + eps) and the normalization land in one kernel with the statistics."""
    groups = forward_groups(lambda x, w: F.layer_norm(x, (32,), w, None), torch.randn(8, 32), torch.randn(32))
    assert len(groups) == 1 and groups[0].kind == "reduction"
    assert {groups[0].roles[n] for n in groups[0].nodes} == {"row", "full"}


def test_fallback_without_interpreter_or_gpu():
    """No CUDA and no TRITON_INTERPRET: right answers from ATen, and the reason said once."""
    code = (
        "import warnings, torch, kernelab.compiler as klc\n"
        "warnings.simplefilter('default')\n"
        "f = klc.compile(lambda a, b: torch.softmax((a + b).relu(), -1))\n"
        "a, b = torch.randn(4, 33), torch.randn(4, 33)\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('default')\n"
        "    for _ in range(3): out = f(a, b)\n"
        "said = [str(x.message) for x in w if 'kernelab' in str(x.message)]\n"
        "assert torch.allclose(out, torch.softmax((a + b).relu(), -1))\n"
        "print(len(said), said[0])\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    count, message = res.stdout.strip().split(" ", 1)
    assert count == "1" and "TRITON_INTERPRET" in message


def test_plan_of_meta_tensors_needs_no_memory():
    """A billion-element plan from meta tensors: sizes only, nothing allocated or computed."""
    a, b = torch.empty(10**9, device="meta"), torch.empty(10**9, device="meta")
    (kernel,) = klc.plan_kernels(lambda a, b: (a + b).relu(), (a, b), {})
    assert kernel.name == "kl_fused_add_relu" and kernel_bytes(kernel) == (8 * 10**9, 4 * 10**9)


def test_plan_trace_feeds_the_traffic_model():
    """Inputs, outputs and kernels share one storage numbering: a fused chain moves its ideal
    bytes and has no round trip; the layer norm backward has exactly its unfused round trips."""
    from kernelab.traffic import ideal_bytes, round_trips

    p = all_programs()["silu_gate"]
    trace, kernels = klc.plan_trace(p.make_target(), p.make_args(), {})
    assert ideal_bytes(trace, kernels) == 3 * MB4 and round_trips(kernels) == []
    p = all_programs()["layer_norm_backward"]
    trace, kernels = klc.plan_trace(p.make_target(), p.make_args(), {})
    assert len(trace.inputs) == 4 and ideal_bytes(trace, kernels) > 0
    assert all(t.writer < min(t.readers) for t in round_trips(kernels))


def test_backend_by_name_and_debug_output(capfd, monkeypatch):
    """backend="kernelab" resolves once kernelab.compiler is imported; KERNELAB_DEBUG=3 prints the
    decisions and the generated source."""
    monkeypatch.setenv("KERNELAB_DEBUG", "3")
    x = torch.randn(5, 40)
    out = torch.compile(lambda t: torch.sigmoid(t) * 2, backend="kernelab")(x)
    torch.testing.assert_close(out, torch.sigmoid(x) * 2)
    err = capfd.readouterr().err
    assert "group kl_fused_sigmoid_mul" in err and "@triton.jit" in err


def test_backend_name_resolves_after_a_bare_import_kernelab():
    """The installed entry point (group torch_dynamo_backends) makes backend="kernelab" work without
    importing kernelab.compiler first: a fresh interpreter proves nothing was imported already."""
    code = ("import torch, kernelab, sys; assert 'kernelab.compiler' not in sys.modules; "
            "f = torch.compile(lambda t: t * 2, backend='kernelab'); "
            "print(torch.equal(f(torch.ones(3)), torch.full((3,), 2.0)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"


def test_a_kernel_that_fails_to_build_falls_back_to_aten(monkeypatch):
    """Outside strict mode, a group whose kernel cannot be generated runs as ATen, said once."""
    from kernelab.compiler import group_runner

    monkeypatch.setenv("KERNELAB_STRICT", "0")
    monkeypatch.setattr(group_runner, "kernel_module", lambda source, name: 1 / 0)
    x = torch.randn(6, 10)
    with pytest.warns(UserWarning, match="kl_fused_exp_mul runs as ATen ops"):
        out = klc.compile(lambda t: t.exp() * 3)(x)
    torch.testing.assert_close(out, x.exp() * 3)


def test_a_smaller_private_operand_is_recomputed_inside_the_bigger_kernel():
    """A causal mask built as (S, S) and used only by (B, S, S) scores joins their softmax kernel."""
    def scores(s):
        mask = torch.ones(s.shape[-2:], dtype=torch.bool).tril()
        return torch.softmax(s.masked_fill(~mask, float("-inf")), -1)

    s = torch.randn(2, 9, 9)
    plan = klc.explain(scores, s)
    assert [len(g.groups) for g in plan.graphs] == [1], plan.graphs[0].decisions()
    torch.testing.assert_close(klc.compile(scores)(s), scores(s))



def test_generated_runner_matches_the_step_loop(monkeypatch, capfd):
    """The graph runs as one generated function (KERNELAB_DEBUG=3 prints it); the step-by-step loop
    it replaces gives the same values, gradients included."""
    from kernelab.compiler import runtime

    def fn(x, g, w, b):
        h = F.gelu(F.linear(F.layer_norm(x, (x.shape[-1],), g), w.t(), b))
        return (h.view(2, -1, h.shape[-1]).transpose(0, 1) * 2).sum(-1)

    def run():
        torch._dynamo.reset()
        gen = torch.Generator().manual_seed(0)
        args = [torch.randn(*s, generator=gen).requires_grad_() for s in ((6, 8), (8,), (8, 8), (8,))]
        out = klc.compile(fn)(*args)
        return [out] + list(torch.autograd.grad(out.sum(), args))

    def eager():
        gen = torch.Generator().manual_seed(0)
        args = [torch.randn(*s, generator=gen).requires_grad_() for s in ((6, 8), (8,), (8, 8), (8,))]
        out = fn(*args)
        return [out] + list(torch.autograd.grad(out.sum(), args))

    monkeypatch.setenv("KERNELAB_DEBUG", "3")
    generated = run()
    assert "def run(args):" in capfd.readouterr().err
    monkeypatch.setattr(runtime, "_straight_line", lambda runner: ("", None))
    looped = run()
    for a, b, e in zip(generated, looped, eager()):
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)


def test_view_chains_run_as_one_alias(monkeypatch, capfd):
    """Views between two ATen ops (a qkv split: view, select, permute) are replayed as one
    as_strided of their root in the generated runner; values and gradients match eager, on the
    first call (views run) and the next ones (as_strided)."""
    def attention_like(x, w):
        qkv = (x @ w).view(2, 4, 3, 2, 8)
        q, k = qkv.select(2, 0).permute(0, 2, 1, 3), qkv.select(2, 1).permute(0, 2, 3, 1)
        return (q @ k).softmax(-1)

    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 4, 16, generator=gen), torch.randn(16, 48, generator=gen)
    monkeypatch.setenv("KERNELAB_DEBUG", "3")
    torch._dynamo.reset()
    fast = klc.compile(attention_like)
    with torch.no_grad():
        outs = [fast(x, w) for _ in range(3)]
    source = capfd.readouterr().err
    runner = source[source.index("def run(args):"):]
    runner = runner[: runner.index("return")]
    # every view (the qkv split, the matmuls' reshapes) is replayed as an alias of its root: the
    # only ATen calls left are the two matmuls
    assert runner.count(" = t") == 2 and runner.count(" = f") >= 4, runner
    assert "select" not in runner and "permute" not in runner
    for out in outs:
        torch.testing.assert_close(out, attention_like(x, w))
    # gradients through the chains
    torch._dynamo.reset()
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    got = torch.autograd.grad(klc.compile(attention_like)(xg, wg).pow(2).sum(), [xg, wg])
    xe, we = x.clone().requires_grad_(), w.clone().requires_grad_()
    want = torch.autograd.grad(attention_like(xe, we).pow(2).sum(), [xe, we])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_view_chain_replays_only_for_the_layout_it_recorded():
    """ViewChain records the result of its views for one root layout; another layout (same
    shape, other strides or offset) runs the views again instead of a stale as_strided."""
    from kernelab.compiler.views import ViewChain

    aten = torch.ops.aten
    steps = [(aten.view.default, ([4, 6],)), (aten.select.int, (1, 2)), (aten.unsqueeze.default, (0,))]
    chain = ViewChain(steps, returned=False)
    base = torch.arange(48.0)
    for root in (base[:24], base[:24], base[24:], base.view(6, 8)[:, :4].reshape(24), base[:48:2]):
        want = root.view(4, 6).select(1, 2).unsqueeze(0)
        got = chain(root)
        assert got.shape == want.shape and got.stride() == want.stride()
        torch.testing.assert_close(got, want)
        assert got.untyped_storage().data_ptr() == root.untyped_storage().data_ptr()
    assert chain.key is not None
    # a value the graph returns stays a view of its root's base (aot_autograd may look at it)
    returned = ViewChain(steps, returned=True)
    for _ in range(2):
        assert returned(base[:24])._is_view()


def test_a_view_the_graph_returns_is_not_folded(capfd, monkeypatch):
    """Graph outputs keep their own view op (aot_autograd regenerates aliased outputs from them)."""
    def fn(x, w):
        y = (x @ w).view(3, 2, 4)
        return y.permute(1, 0, 2), y.sum()

    monkeypatch.setenv("KERNELAB_DEBUG", "3")
    torch._dynamo.reset()
    x, w = torch.randn(6, 5), torch.randn(5, 4)
    with torch.no_grad():
        a, s = klc.compile(fn)(x, w)
    ra, rs = fn(x, w)
    torch.testing.assert_close(a, ra)
    torch.testing.assert_close(s, rs)
    assert a.stride() == ra.stride()


def test_graph_device_is_its_first_cuda_input():
    """The compiled call runs under a guard of this device when another one is current."""
    import importlib

    backend = importlib.import_module("kernelab.compiler.backend")

    class OnCuda1(torch.Tensor):
        def get_device(self):
            return 1

    cpu = torch.zeros(2)
    assert backend._cuda_device([cpu, 3]) is None
    assert backend._cuda_device([cpu, cpu.as_subclass(OnCuda1)]) == 1


def test_long_rows_with_a_variance_take_the_looped_template():
    """On a GPU, rows of 8192 stay in registers unless the group takes a variance (layer norm:
    measured faster looped on the H200); RMS norm (one sum) and softmax stay persistent."""
    import torch.nn.functional as F
    from torch.fx.experimental.proxy_tensor import make_fx

    from kernelab.compiler import graph, group_runner
    from kernelab.compiler.backend import decompositions
    from kernelab.compiler.templates import rows

    def launch(fn, *args):
        gm = make_fx(fn, decomposition_table=decompositions())(*args)
        (group,) = [g for g in graph.partition(gm).groups if g.kind == "reduction"]
        runner = group_runner.GroupRunner(group, interpret=False)
        x = args[0]
        return rows.launch(runner, (x.shape[0],), [(x.shape[1],)], x.shape[0], x.shape[1], [x])

    x, w = torch.randn(4, 8192), torch.randn(8192)
    assert not launch(lambda x, w: F.layer_norm(x, (8192,), w), x, w).persistent
    assert launch(lambda x, w: F.layer_norm(x, (4096,), w), x[:, :4096].contiguous(), w[:4096]).persistent
    assert launch(lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w, x, w).persistent
    assert launch(lambda x: x.softmax(-1), x).persistent


def test_saved_views_are_untracked_aliases_and_visible_ones_views():
    """In a training forward, the outputs past aot_autograd's user outputs are saved for the
    backward (and detached there if they are views): they are replayed as untracked aliases; the
    outputs the caller sees stay views of their base."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from kernelab.compiler import graph, runtime, views

    gm = make_fx(lambda a, b: [a.t(), b.t()])(torch.randn(3, 4), torch.randn(4, 5))
    runner = runtime.GraphRunner.build(gm, graph.partition(gm), True, visible_outputs=1)
    chains, _ = views.view_chains(runner)
    makes = [chain.make for _, chain in sorted(chains.values(), key=lambda rc: rc[0].name)]
    assert makes == [views.tracked_view, views.UNTRACKED_VIEW]
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    for _ in range(2):  # the second call replays
        ta, tb = runner([a, b])
        assert torch.equal(ta, a.t()) and torch.equal(tb, b.t())
    assert ta._is_view() and not tb._is_view()


def test_persistent_max_setting(monkeypatch):
    from kernelab.compiler.templates import base

    monkeypatch.delenv("KERNELAB_PERSISTENT_MAX", raising=False)
    assert base.persistent_max() == base.PERSISTENT_MAX["gpu"]
    monkeypatch.setenv("KERNELAB_PERSISTENT_MAX", "4096")
    assert base.persistent_max() == 4096
    for bad in ("abc", "0", "-8"):
        monkeypatch.setenv("KERNELAB_PERSISTENT_MAX", bad)
        with pytest.raises(ValueError, match="KERNELAB_PERSISTENT_MAX must be a positive integer"):
            base.persistent_max()


def _softmax_by_max(x):
    e = (x - x.max(dim=-1, keepdim=True).values).exp()
    return e / e.sum(-1, keepdim=True)


@pytest.mark.parametrize("fn, expected", [
    (_softmax_by_max, ["kl_fused_amax_sub_exp_sum_div"]),
    (lambda x: x - x.min(dim=1).values[:, None], ["kl_fused_amin_sub"]),
])
def test_max_values_without_indices_join_the_kernel(fn, expected):
    """``x.max(dim).values`` with the indices unread is an amax: one row kernel, as Inductor's
    (it ran as an ATen two-output op and a kernel of its own before)."""
    assert _names(klc.plan_kernels(fn, (torch.randn(64, 256),), {})) == expected


def test_max_with_indices_read_stays_and_values_match():
    """Indices read (here, and by any training graph's backward): no rewrite; values as eager's;
    NaN in a row comes out of the rewritten amax as out of max."""
    x = torch.randn(8, 33)
    x[3, 5] = float("nan")
    both = lambda x: x.max(-1).values + x.max(-1).indices.float()  # noqa: E731
    assert "max" in _names(klc.plan_kernels(both, (x,), {}))
    for fn in (both, _softmax_by_max):
        got, want = klc.compile(fn)(x), fn(x)
        assert torch.equal(got.isnan(), want.isnan())
        torch.testing.assert_close(got, want, equal_nan=True)
    xs = torch.randn(8, 33, requires_grad=True)
    grad = torch.autograd.grad(klc.compile(_softmax_by_max)(xs)[:, 0].sum(), xs)[0]
    xe = xs.detach().clone().requires_grad_()
    torch.testing.assert_close(grad, torch.autograd.grad(_softmax_by_max(xe)[:, 0].sum(), xe)[0])


def test_full_reductions_become_rows_of_their_kernel():
    """A reduction over every dim of a contiguous tensor is generated as one row: ``x.sum() * 2``
    and ``(x * 3).mean()`` are one kernel each, a cross-entropy forward three (was five: two
    ATen sums, the losses and the count of valid targets)."""
    x1, x2 = torch.randn(1000), torch.randn(16, 40)
    # (one lambda a line: dynamo keys its automatic dynamic shapes by file, line and name)
    assert len(klc.plan_kernels(lambda x: x.sum() * 2, (x1,), {})) == 1
    assert len(klc.plan_kernels(lambda x: (x * 3).mean(), (x1,), {})) == 1
    # two reductions of one row, each over its own flat view of x: one kernel (the views share
    # their memory, so the second joins the first's group: graph._State._sharing_groups)
    assert _names(klc.plan_kernels(lambda x: x.amax() - x.amin(), (x2,), {})) == ["kl_fused_amax_amin_sub"]
    # of a 2-D pointwise chain, the chain runs on the flat view as the row's prologue
    # (rewrites.prologues_in_row_space; it was a kernel of its own, the flat view its boundary)
    assert _names(klc.plan_kernels(lambda x: (x * 3).mean(), (x2,), {})) == ["kl_fused_mul_mean"]
    x, t = torch.randn(64, 1000), torch.randint(0, 1000, (64,))
    # the row kernel (log-softmax and the picked logit) and one kernel for the count of kept
    # targets and the sum of losses, which reduce the same rows (graph._State._sibling_role; the
    # row kernel recomputes the kept mask rather than reading it: _recompute_producers): Inductor's 2
    assert len(klc.plan_kernels(lambda x, t: F.cross_entropy(x, t), (x, t), {})) == 2


@pytest.mark.parametrize("fn, make", [
    (lambda x: x.sum() * 2, lambda: torch.randn(7, 9)),
    (lambda x: x.mean(dtype=torch.float64), lambda: torch.randn(33)),
    (lambda x: x.sum(dim=(0, 1), keepdim=True) + x, lambda: torch.randn(5, 6)),
    (lambda x: x.max() + x.min(), lambda: torch.tensor([1.0, float("nan"), 3.0])),
    (lambda x: (x > 0).sum() + x.long().sum(), lambda: torch.randn(50) * 4),
    (lambda x: x.t().sum() * 2, lambda: torch.randn(8, 12)),  # not contiguous: left to ATen
    (lambda x: x.sum() + 1, lambda: torch.randn(0, 4)),  # empty: left to ATen (sum 0)
    (lambda x, t: F.cross_entropy(x, t, ignore_index=3), lambda: (torch.randn(20, 7), torch.arange(20) % 7)),
], ids=["sum", "mean_f64", "keepdim", "max_nan", "int_sums", "transposed", "empty", "cross_entropy"])
def test_full_reductions_match_eager(fn, make):
    args = make()
    args = args if isinstance(args, tuple) else (args,)
    got, want = klc.compile(fn)(*args), fn(*args)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, equal_nan=True)


def test_full_reduction_in_a_training_step():
    """``loss.mean()`` rewritten in the forward graph; the gradients are eager's."""
    x, w = torch.randn(32, 16, requires_grad=True), torch.randn(16, 8, requires_grad=True)
    fn = lambda x, w: ((x @ w).relu() ** 2).mean()  # noqa: E731
    got = torch.autograd.grad(klc.compile(fn)(x, w), (x, w))
    want = torch.autograd.grad(fn(x, w), (x, w))
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e)


def test_aranges_read_by_kernels_become_constants():
    """``torch.arange`` of static numbers read (through views) by kernels is a buffer made at
    compile time: no launch per call. One handed out (returned) stays a fresh tensor each call:
    writing into the returned one leaves the next call's values alone."""
    x = torch.randn(64, 128)
    fn = lambda x: x + torch.arange(x.shape[-1], dtype=x.dtype).unsqueeze(0) * 0.5  # noqa: E731
    assert _names(klc.plan_kernels(fn, (x,), {})) == ["kl_fused_mul_add"]
    torch.testing.assert_close(klc.compile(fn)(x), fn(x))
    steps = lambda x: (x * 2, torch.arange(3, 30, 3))  # noqa: E731
    compiled = klc.compile(steps)
    first = compiled(x)[1]
    first.fill_(-1)
    torch.testing.assert_close(compiled(x)[1], torch.arange(3, 30, 3))


def _rotate_half(x):
    """RoPE's rotation as Hugging Face writes it: its backward adds two slice_scatters of zeros."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def _rope(q, cos, sin):
    return ((q * cos + _rotate_half(q) * sin) * 1.5).sum()


def _gapped(q, cos, sin):  # slices that leave a gap: the scatters do not tile the last dim
    return (torch.cat((q[..., :3], q[..., 4:]), dim=-1) * sin[..., :7]).sum()


@pytest.mark.parametrize("fn, rewritten", [(_rope, True), (_gapped, False)], ids=["rope", "gapped"])
def test_scatters_that_tile_a_dim_become_one_cat(fn, rewritten):
    """The backward of ``cat`` of two slices, ``slice_scatter(zeros, a, d, 0, m) + slice_scatter(zeros,
    b, d, m, n)``, is ``cat([a, b], d)``: no zero fill, no scatter (four launches and five full-size
    passes become one). Where the ranges leave a gap it stays as it was. Gradients equal eager's."""
    q = torch.randn(2, 3, 5, 8, requires_grad=True)
    cos, sin = torch.randn(5, 8), torch.randn(5, 8)
    step = lambda: fn(q, cos, sin).backward()  # noqa: E731
    names = _names(klc.plan_kernels(step))
    q.grad = None
    assert ("slice_scatter" in names) != rewritten and ("full" in names) != rewritten, names
    got = torch.autograd.grad(klc.compile(fn)(q, cos, sin), q)[0]
    want = torch.autograd.grad(fn(q, cos, sin), q)[0]
    torch.testing.assert_close(got, want)


def _cat_mid(a, b):
    return torch.cat([a * 2, b, a], dim=1).relu()


def _cat_first(a, b):
    return torch.cat([a, b.t().contiguous().t()], dim=0) + 1  # a piece with column-major strides


def _cat_then_sum(a, b):
    return torch.cat([a, b], dim=-1).sum(-1)  # a row reduction reads the cat: the cat stays apart


def _cat_ints(a, b):
    return torch.cat([(a > 0).long(), (b > 0).long()], dim=-1) * 3


@pytest.mark.parametrize("fn, shapes, kernels", [
    (_cat_mid, ((3, 4, 5), (3, 2, 5)), ["kl_fused_mul", "kl_fused_cat_relu"]),
    (_cat_first, ((2, 6), (3, 6)), None),
    (_cat_then_sum, ((4, 3), (4, 5)), None),
    (_cat_ints, ((4, 3), (4, 5)), None),
], ids=["middle_dim", "first_dim_strided", "then_row_sum", "int64"])
def test_cat_is_generated_with_its_consumers(fn, shapes, kernels):
    """``cat`` is a pointwise op of the kernel that reads it: each piece loaded masked to its range
    of the cat's dim (no ``CatArrayBatchedCopy``, no written intermediate); pieces of any strides;
    values equal eager's. A row reduction of a cat keeps the cat in a kernel of its own."""
    a, b = (torch.randn(*s) for s in shapes)
    names = _names(klc.plan_kernels(fn, (a, b), {}))
    assert "cat" not in names and any("cat" in n for n in names), names
    if kernels is not None:
        assert names == kernels
    torch.testing.assert_close(klc.compile(fn)(a, b), fn(a, b))


def test_rope_forward_and_backward_cats_join_their_kernels():
    """RoPE (``q * cos + rotate_half(q) * sin``): the forward's cat is computed in the kernel of the
    products and the add, the backward's (from ``scatters_as_cats``) in the add of its two terms."""
    q = torch.randn(2, 3, 5, 8, requires_grad=True)
    cos, sin = torch.randn(5, 8), torch.randn(5, 8)
    fn = lambda q: q * cos + _rotate_half(q) * sin  # noqa: E731
    names = _names(klc.plan_kernels(lambda: fn(q).sum().backward()))
    q.grad = None
    # the backward's cat: ``cat([x2, x1]) * sign`` (``negated_cat_pieces``) with the add; no negation kernel
    assert "cat" not in names and "kl_fused_mul_cat_add" in names and "kl_fused_cat_mul_add" in names, names
    assert not any("neg" in n for n in names), names
    g = torch.randn(2, 3, 5, 8)
    got = torch.autograd.grad(klc.compile(fn)(q), q, g)[0]
    torch.testing.assert_close(got, torch.autograd.grad(fn(q), q, g)[0])


def test_planning_a_training_step_leaves_the_callers_model_alone():
    """``explain`` / ``count(predict=True)`` of a step that takes its model as an argument run it
    on private copies: no gradient accumulates in the caller's parameters (before: real gradients
    from the plan, fake ones from eager's capture, which broke the caller's next real step), no
    buffer moves."""
    import kernelab

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(5, 4)

    def step(m, x):
        m(x).relu().sum().backward()

    klc.explain(step, model, x)
    for mode in ("kernelab", "eager"):  # eager's capture left fake gradients in the real parameters
        assert kernelab.count(step, model, x, mode=mode, predict=True).kernels
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_prediction_with_symbolic_shapes_of_per_row_values():
    """Counting under dynamic shapes (a loop that counts models of several sizes makes dynamo
    trace later ones symbolically): the plan's empty-shape check broadcast a group's inputs,
    which misaligns per-row values ((1, C) against (N, C, H*W)) and raised; found counting timm's
    PoolFormer after other models in one process (2026-12-04)."""
    import torch._dynamo

    import kernelab

    def step(x, w, b):
        y = F.group_norm(x, 1, w, b) * F.group_norm(x, 2, w, b)
        y.sum().backward()
        return y

    x = torch.randn(2, 8, 3, 3, requires_grad=True)
    w, b = torch.randn(8, requires_grad=True), torch.randn(8, requires_grad=True)
    with torch._dynamo.config.patch(assume_static_by_default=False):
        symbolic = kernelab.count(step, x, w, b, mode="kernelab", predict=True).to_dict()["kernels"]
    torch._dynamo.reset()
    static = kernelab.count(step, x, w, b, mode="kernelab", predict=True).to_dict()["kernels"]
    # the forward's four group norms (ATen) move the same bytes with the sizes symbolic or not;
    # the backward's plan differs (size arithmetic as tensors, column sums of symbolic size left
    # to ATen: 38 kernels against 28), but its reductions are generated as well
    def moved(kernels):
        return [(k["name"], k["bytes_read"], k["bytes_written"]) for k in kernels[:4]]

    assert moved(symbolic) == moved(static) and all(k["name"] == "native_group_norm" for k in static[:4])
    assert any(k["name"].startswith("kl_fused_sum") for k in symbolic)


def test_a_group_of_copies_names_itself():
    """A kernel that only copies (here a transposed input made contiguous) was named "kl_fused_"."""
    plan = klc.explain(lambda x: x.t().contiguous(), torch.randn(8, 16))
    names = [k.name for k in plan.kernels]
    assert names and all(n != "kl_fused_" for n in names), names
