"""Golden files of the generated Triton source: a change to a template (``kernelab/compiler/templates/``) shows up as a diff here.

Regenerate after an intended change with ``KERNELAB_UPDATE_GOLDEN=1`` and review the diff.
"""
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

from kernelab.compiler import graph, templates
from kernelab.compiler.backend import decompositions

GOLDEN = Path(__file__).parent / "golden"


def forward_groups(fn, *args):
    """The groups of the forward graph of ``fn`` (compiled with kernelab's decompositions)."""
    found = []

    def fw(gm, example_inputs):
        found.append(graph.partition(gm))
        return make_boxed_func(gm.forward)

    backend = aot_autograd(fw_compiler=fw, decompositions=decompositions())
    torch.compile(fn, backend=backend)(*args)
    return found[0].groups


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


CASES = {
    # name: (function, inputs, rank after merging dims, persistent)
    "add_relu": (lambda a, b: (a + b).relu(), (torch.randn(1000), torch.randn(1000)), 1, True),
    "outer_add_2d": (lambda c, r: (c + r).sigmoid(), (torch.randn(8, 1), torch.randn(16)), 2, True),
    "softmax_persistent": (lambda x: torch.softmax(x, -1), (torch.randn(4, 64),), 1, True),
    "softmax_looped": (lambda x: torch.softmax(x, -1), (torch.randn(4, 64),), 1, False),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (64,), w, b), (torch.randn(4, 64), torch.randn(64),
                                                                  torch.randn(64)), 1, True),
    "rms_norm_looped": (rms_norm, (torch.randn(4, 64), torch.randn(64)), 1, False),
    "column_sum": (lambda x, w: (x * w).sum(0) * 2, (torch.randn(64, 40), torch.randn(40)), 1, True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_generated_source_matches_golden(name):
    fn, args, rank, persistent = CASES[name]
    groups = forward_groups(fn, *args)
    assert len(groups) == 1, [g.name for g in groups]
    source = templates.kernel_source(groups[0], rank, persistent)
    path = GOLDEN / f"{name}.py"
    if os.environ.get("KERNELAB_UPDATE_GOLDEN") == "1" or not path.exists():
        path.parent.mkdir(exist_ok=True)
        path.write_text(source)
    assert source == path.read_text(), f"generated source of {name} changed: see {path} (KERNELAB_UPDATE_GOLDEN=1)"


def test_golden_sources_compile_and_run():
    """The golden kernels are real kernels: the persistent softmax one computes softmax."""
    from kernelab.compiler.runtime import kernel_module

    source = (GOLDEN / "softmax_persistent.py").read_text()
    name = source.split("def ")[1].split("(")[0]
    kernel = kernel_module(source, name)
    x = torch.randn(4, 64)
    padded = torch.full((4, 72), float("nan"))
    out = padded[:, :64]  # rows 72 apart (compiler/layout.py)
    kernel[(1,)](x, out, x.stride(0), x.stride(1), 4, 4, 64, 72, XBLOCK=4, RBLOCK=64, INT64=False)
    torch.testing.assert_close(out, torch.softmax(x, -1))
    assert padded[:, 64:].isnan().all()  # the padding is never written
