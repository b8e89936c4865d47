"""The kernel templates (``kernelab/compiler/templates``): one module per group kind, each the one
home of its kernel's source, launch settings and outputs. What the group runner and the code
generator ask of a kind is the same six names in every module; a kind without a template is a
clear error, not a wrong kernel."""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kernelab.compiler import graph, group_runner, templates
from kernelab.compiler.backend import decompositions

CONTRACT = ("KIND", "CATEGORY", "source", "prepare", "launch", "reads_before_it_stores")


def test_every_template_module_has_the_contract_and_its_own_kind():
    assert sorted(templates.TEMPLATES) == ["column", "pointwise", "reduction"]
    for kind, module in templates.TEMPLATES.items():
        assert module.KIND == kind
        missing = [name for name in CONTRACT if not hasattr(module, name)]
        assert missing == [], f"{module.__name__} lacks {missing}"
        assert callable(module.source) and callable(module.prepare) and callable(module.launch)


def test_a_kind_without_a_template_is_refused_by_name():
    with pytest.raises(ValueError, match="no kernel template for groups of kind 'scan'.*pointwise"):
        templates.template("scan")


def _groups(fn, *args):
    gm = make_fx(fn, decomposition_table=decompositions())(*args)
    return graph.partition(gm).groups


def test_each_kind_the_planner_makes_prepares_a_launch_through_its_template():
    """A pointwise add, a row softmax and a column sum: each group's kind names the template whose
    ``prepare`` gives the runner its launch (grid, outputs in the op's shape); the kernel it
    compiled for that launch is the template's source, named after the group, and launched (the
    interpreter) it computes eager's values."""
    x, b = torch.randn(64, 48), torch.randn(48)
    cases = {
        "pointwise": ((lambda x, b: (x + b).relu()), (x, b), (64, 48)),
        "reduction": ((lambda x: torch.softmax(x, -1)), (x,), (64, 48)),
        "column": ((lambda x: (x * 2).sum(0)), (x,), (48,)),
    }
    for kind, (fn, args, out_shape) in cases.items():
        (group,) = [g for g in _groups(fn, *args) if g.kind == kind]
        runner = group_runner.GroupRunner(group, interpret=True)
        raw = [_value(load.node, args) for load in runner.loads]
        call = runner.prepare(raw)
        assert call is not None and all(g >= 1 for g in call.grid), (kind, call)
        assert [tuple(size) for size, _, _ in call.outs] == [out_shape], (kind, call.outs)
        ((rank, persistent),) = runner.kernels
        source = templates.kernel_source(group, rank, persistent)
        assert source.startswith(templates.base.HEADER) and f"def {group.name}(" in source, source[:300]
        (got,) = runner.run_values(raw, [])
        torch.testing.assert_close(got, fn(*args), msg=lambda m: f"{kind}: {m}")


def _value(node, args):
    """The example tensor a loaded placeholder stands for (the placeholders are the args, in order)."""
    placeholders = [n for n in node.graph.nodes if n.op == "placeholder"]
    return args[placeholders.index(node)]
