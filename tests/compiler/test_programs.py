"""Every built-in example program (kernelab.programs), compiled with the kernelab backend, against
eager PyTorch: outputs, gradients left in .grad, and inputs mutated in place. bfloat16 programs
run too (the interpreter's bf16 rounding is unreliable: they get a bf16-sized tolerance)."""
import copy

import pytest
import torch
from torch.utils import _pytree as pytree

import kernelab.compiler as klc
from kernelab.programs import all_programs


def _leaves(tree):
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _rel(a, b) -> float:
    a, b = a.double(), b.double()
    finite = torch.isfinite(b)
    if not torch.equal(finite, torch.isfinite(a)) or not torch.equal(a[~finite].nan_to_num(), b[~finite].nan_to_num()):
        return float("inf")
    return ((a[finite] - b[finite]).norm() / (b[finite].norm() + 1e-30)).item() if finite.any() else 0.0


def _grads(target, args):
    if isinstance(target, torch.nn.Module):
        return [p.grad for p in target.parameters()]
    return [t.grad for t in _leaves(args) if t.requires_grad]


@pytest.mark.parametrize("name", list(all_programs()))
def test_program_matches_eager(name):
    p = all_programs()[name]
    target, args = p.make_target(), p.make_args()
    mine, my_args = copy.deepcopy(target), p.make_args()
    expected = target(*args)
    got = klc.compile(mine)(*my_args)
    # autocast computes in bf16 inside: the interpreter truncates to bf16 where a GPU rounds
    bf16 = any(t.dtype == torch.bfloat16 for t in _leaves((expected, args))) or "autocast" in name
    tol = 2e-2 if bf16 else 2e-6
    pairs = list(zip(_leaves(got), _leaves(expected)))
    pairs += [(g, e) for g, e in zip(_grads(mine, my_args), _grads(target, args)) if e is not None]
    pairs += list(zip(_leaves(my_args), _leaves(args)))  # in-place updates
    assert pairs
    for i, (g, e) in enumerate(pairs):
        assert g.shape == e.shape and g.dtype == e.dtype, (i, g.shape, e.shape, g.dtype, e.dtype)
        if g.is_floating_point():
            assert _rel(g, e) <= tol, (i, _rel(g, e))
        else:
            assert torch.equal(g, e), i
