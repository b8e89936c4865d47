"""Every kernel tied to the nn.Module that launched it and to the user's source line (issue 13 part 1)."""
import json

import pytest
import torch
from torch import nn

import kernelab
from kernelab.api import modules_from_neighbours
from kernelab.attribution import fx_site, source_line
from kernelab.module_tree import common_module, top_wasters
from kernelab.report import Kernel, Report


def _line_of(marker: str) -> int:
    """The line of this file that carries ``marker`` in a comment."""
    with open(__file__) as f:
        return next(i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# {marker}"))


class Block(nn.Module):
    def __init__(self, width=8):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.act = nn.ReLU()
        self.ln = nn.LayerNorm(width)

    def forward(self, x):
        h = self.act(self.fc(x))  # BLOCK_MLP
        return self.ln(x + h)  # BLOCK_RESIDUAL


def _text(renderable) -> str:
    """Plain text with the terminal's line folds undone."""
    return " ".join(str(renderable).split())


def _sites(report):
    return [(k.ops[0], k.module, k.backward) for k in report.kernels]


def test_sequential_forward_and_backward_kernels_sit_under_their_modules():
    seq = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

    def step(x):
        seq(x).sum().backward()  # SEQ_STEP

    r = kernelab.count(step, torch.randn(5, 8), predict=True)
    assert _sites(r) == [
        ("addmm", "seq.0", False), ("relu", "seq.1", False), ("addmm", "seq.2", False),
        ("sum", "", False), ("ones_like", "", False),  # the loss and backward's seed: the function's own
        ("mm", "seq.2", True), ("mm", "seq.2", True), ("sum", "seq.2", True),  # grads of input, weight, bias
        ("threshold_backward", "seq.1", True),
        ("mm", "seq.0", True), ("sum", "seq.0", True),  # x needs no grad: weight and bias only
    ]
    # nn.Linear's code is torch's: the user's line is the one that called the model
    assert {source_line(k.source) for k in r.kernels} == {_line_of("SEQ_STEP")}
    assert all(k.source.endswith(f"test_modules.py:{_line_of('SEQ_STEP')}") for k in r.kernels)
    assert r.module_types == {"seq": "Sequential", "seq.0": "Linear", "seq.1": "ReLU", "seq.2": "Linear"}


def test_residual_block_pointwise_at_the_parent_with_its_line():
    block = Block()
    x = torch.randn(7, 8, requires_grad=True)

    def step(x):
        block(x).sum().backward()

    r = kernelab.count(step, x, predict=True)
    by_op = {(k.ops[0], k.backward): k for k in r.kernels}
    add = by_op[("add", False)]
    assert (add.module, source_line(add.source)) == ("block", _line_of("BLOCK_RESIDUAL"))
    assert (by_op[("addmm", False)].module, source_line(by_op[("addmm", False)].source)) == \
        ("block.fc", _line_of("BLOCK_MLP"))
    assert by_op[("native_layer_norm", False)].module == "block.ln"
    # backward kernels: the module whose forward they differentiate, at that forward's line
    lnb = [k for k in r.kernels if k.ops == ["native_layer_norm_backward"]]
    assert lnb and all(k.module == "block.ln" and k.backward for k in lnb)
    assert all(source_line(k.source) == _line_of("BLOCK_RESIDUAL") for k in lnb)
    assert by_op[("threshold_backward", True)].module == "block.act"
    assert [k.module for k in r.kernels if k.ops == ["mm"]] == ["block.fc", "block.fc"]  # grads of x and weight


def test_module_target_paths_are_relative_to_it():
    r = kernelab.count(Block().eval(), torch.randn(4, 8), predict=True)
    assert _sites(r) == [("addmm", "fc", False), ("relu", "act", False), ("add", "", False),
                         ("native_layer_norm", "ln", False)]
    assert r.module_types[""] == "Block"
    assert r.by_module().find("fc").type == "Linear"


def test_inductor_fused_kernel_lists_every_module_it_spans():
    block = Block()

    def step(x):
        block(x).sum().backward()

    r = kernelab.count(step, torch.randn(7, 8, requires_grad=True), mode="inductor", predict=True)
    # relu (block.act), the residual add (block's own) and the norm (block.ln): one kernel
    fused = [k for k in r.kernels if k.ops == ["relu", "add", "native_layer_norm"]]
    assert len(fused) == 1 and fused[0].modules == ["block.act", "block", "block.ln"]
    assert fused[0].module == "block" and not fused[0].backward
    assert source_line(fused[0].source) == _line_of("BLOCK_MLP")  # its first op's line
    gemms = [k for k in r.kernels if k.category == "matmul"]
    assert gemms and all(k.module == "block.fc" for k in gemms)
    assert all(k.modules for k in r.kernels)


def test_kernelab_mode_kernels_take_the_modules_of_the_eager_kernels_they_replace():
    block = Block()

    def step(x):
        # (a gradient of ones, not .sum(): a full sum now joins the norm's kernel, and the
        # proportional alignment then slices that kernel's eager run before block.ln; see NOTES_compiler)
        block(x).backward(torch.ones(7, 8))

    r = kernelab.count(step, torch.randn(7, 8, requires_grad=True), mode="kernelab", predict=True)
    assert all(k.modules for k in r.kernels)
    gemms = [k for k in r.kernels if k.category == "matmul"]
    assert len(gemms) == 3 and all(k.modules == ["block.fc"] for k in gemms)
    norm = next(k for k in r.kernels if k.name.startswith("kl_fused") and "rsqrt" in k.ops and not k.backward)
    assert "block.ln" in norm.modules
    assert any("aligned in launch order" in n for n in r.notes)


class _Cube(torch.autograd.Function):
    """x**3 by hand: three multiplications back (grad * x * x * 3), none of them a torch call the
    forward's module saw."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * x * x * 3


class _Cubed(nn.Module):
    def forward(self, x):
        return _Cube.apply(x)


def test_custom_autograd_function_backward_is_tied_to_its_module():
    net = nn.Sequential(nn.Linear(4, 4), _Cubed())

    def step(x):
        net(x).sum().backward()

    r = kernelab.count(step, torch.randn(3, 4), predict=True)
    muls = [(k.module, k.backward) for k in r.kernels if k.ops == ["mul"]]
    assert muls == [("net.1", False)] * 2 + [("net.1", True)] * 3


def test_tree_totals_add_up_and_match_the_report():
    block = Block()

    def step(x):
        block(x).sum().backward()

    r = kernelab.count(step, torch.randn(199, 8, requires_grad=True), predict=True)
    root = r.by_module()
    assert root.totals.kernels == r.num_kernels and root.totals.bytes == r.bytes
    assert root.totals.round_trips == len(r.round_trips)
    assert root.totals.time_us == pytest.approx(r.kernel_time_us)
    for node in root.walk():
        assert node.totals.kernels == node.own.kernels + sum(c.totals.kernels for c in node.children)
        assert node.totals.bytes_over_ideal == node.own.bytes_over_ideal + sum(
            c.totals.bytes_over_ideal for c in node.children)
    assert sorted(i for n in root.walk() for i in n.kernels) == list(range(len(r.kernels)))
    fc = root.find("block.fc")
    # forward GEMM; backward: grads of x and weight, bias grad, and x's two gradients summed
    assert [(r.kernels[i].ops[0], r.kernels[i].backward) for i in fc.kernels] == [
        ("addmm", False), ("mm", True), ("mm", True), ("sum", True), ("add", True)]
    assert (fc.totals.kernels, fc.totals.backward) == (5, 4)


def test_bytes_over_ideal_per_kernel():
    n = 4097
    r = kernelab.count(lambda a, b: (a + b).relu(), torch.randn(n), torch.randn(n), predict=True)
    # add writes t, relu reads it back: each moves one array over the fused ideal
    assert [k.bytes_over_ideal for k in r.kernels] == [4 * n, 4 * n]
    assert sum(k.bytes_over_ideal for k in r.kernels) == r.bytes - r.ideal_bytes
    fused = kernelab.count(lambda a, b: (a + b).relu(), torch.randn(n), torch.randn(n), mode="inductor",
                           predict=True)
    assert [k.bytes_over_ideal for k in fused.kernels] == [0]
    assert "nothing left to fuse" in _text(fused.module_tree())


def test_sorting_and_top_wasters():
    block = Block(768)

    def step(x):
        block(x).sum().backward()

    r = kernelab.count(step, torch.randn(64, 768, requires_grad=True), predict=True)
    root = r.by_module().find("block")
    by_waste = [c.path for c in root.sorted_children("waste")]
    over = {c.path: c.totals.bytes_over_ideal for c in root.children}
    assert by_waste == sorted(over, key=over.get, reverse=True)
    by_time = [c.totals.time_us for c in root.sorted_children("time")]
    assert by_time == sorted(by_time, reverse=True)
    top = top_wasters(r.by_module(), 2)
    assert len(top) == 2 and top[0].own.bytes_over_ideal >= top[1].own.bytes_over_ideal > 0
    assert f"top wasters: {top[0].path} (" in _text(r.module_tree(sort="waste"))
    with pytest.raises(ValueError, match="unknown sort"):
        r.module_tree(sort="size")


def test_json_round_trip_keeps_modules_sources_and_tree():
    block = Block()

    def step(x):
        block(x).sum().backward()

    r = kernelab.count(step, torch.randn(7, 8, requires_grad=True), mode="inductor", predict=True)
    d = json.loads(json.dumps(r.to_dict()))
    assert d["kernels"][0]["module"] == "block.fc" and d["kernels"][0]["source"]
    assert d["modules"]["children"][0]["path"] == "block"
    back = Report.from_dict(d)
    assert [(k.modules, k.source, k.backward, k.bytes_over_ideal) for k in back.kernels] == \
        [(k.modules, k.source, k.backward, k.bytes_over_ideal) for k in r.kernels]
    again = back.to_dict()
    assert again["modules"]["totals"]["pct_of_ceiling"] == pytest.approx(d["modules"]["totals"]["pct_of_ceiling"])
    assert again["totals"] == d["totals"] and again["kernels"][3]["module"] == d["kernels"][3]["module"]
    assert str(back.module_tree()) == str(r.module_tree())


def test_common_module():
    assert common_module(["h.0.ln_1", "h.0.attn.c_attn"]) == "h.0"
    assert common_module(["h.1", "h.10"]) == "h"
    assert common_module(["", "fc"]) == "" and common_module([]) == ""


def test_unpaired_measured_kernels_take_their_neighbours_module():
    kernels = [Kernel("memset", "memset", ["?"]), Kernel("gemm", "matmul", ["mm"], modules=["fc"], source="m.py:3"),
               Kernel("x", "pointwise", ["?"], reason="not paired"), Kernel("relu", "pointwise", ["relu"], modules=["act"])]
    modules_from_neighbours(kernels)
    assert [k.modules for k in kernels] == [["fc"], ["fc"], ["fc"], ["act"]]
    assert kernels[2].source == "m.py:3" and "launched next to it" in kernels[2].reason


def test_fx_site_reads_dynamo_and_aot_autograd_metadata():
    """For a compiler that maps its kernels to FX nodes: forward nodes carry nn_module_stack,
    aot_autograd's backward nodes fwd_nn_module_stack."""
    from torch._functorch.aot_autograd import aot_module_simplified
    from functorch.compile import make_boxed_func

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])

        def forward(self, x):
            return self.layers[1](x).relu() + 1  # NET_LINE

    graphs = []

    def backend(gm, example_inputs):
        def keep(graph, inputs):
            graphs.append(graph)
            return make_boxed_func(graph.forward)
        return aot_module_simplified(gm, example_inputs, fw_compiler=keep, bw_compiler=keep)

    torch._dynamo.reset()
    torch.compile(Net(), backend=backend)(torch.randn(2, 4, requires_grad=True)).sum().backward()
    sites = {n.name: fx_site([n]) for g in graphs for n in g.graph.nodes if n.op == "call_function"}
    assert sites["addmm"][0] == ["layers.1"] and sites["mm"][0] == ["layers.1"]
    assert sites["add"][0] == [""]
    assert source_line(sites["addmm"][1]) == _line_of("NET_LINE")


def test_gpt2_tiny_every_kernel_has_a_module():
    pytest.importorskip("transformers")
    from kernelab.zoo import ZOO

    zm = ZOO["gpt2"]
    model, inputs = zm.build("tiny")

    def step(inputs):
        zm.loss(model, inputs).backward()

    for mode in ("eager", "inductor"):
        r = kernelab.count(step, inputs, mode=mode, predict=True)
        assert all(k.modules for k in r.kernels), mode
        c_fc = r.by_module().find("model.transformer.h.0.mlp.c_fc")
        assert c_fc.type == "Conv1D"
        assert [r.kernels[i].category for i in c_fc.kernels if not r.kernels[i].backward] == ["matmul"]
        assert sum(r.kernels[i].category == "matmul" for i in c_fc.kernels if r.kernels[i].backward) == 2
        assert r.by_module().find("model.transformer.h.1.attn").totals.kernels > 0
        assert "modeling_gpt2.py:" in r.kernels[0].source
