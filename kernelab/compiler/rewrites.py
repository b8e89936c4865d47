"""Graph rewrites before partitioning: ops the templates cannot generate, restated as ops they can.

``one_hot_indexing``: a gather or scatter of *one element per row along the last dim* (the
target logit of a cross-entropy and its gradient's ``-1`` at the target) is a comparison with the
column index, which a row kernel evaluates for free while the row is in registers:

    gather(x, -1, idx)            = sum(where(arange(N) == idx, x, 0), -1, keepdim=True)
    scatter(self, -1, idx, src)   = where(arange(N) == idx, src, self)

With it the whole cross-entropy forward (log-softmax and the picked logit) is one row kernel that
never writes the (rows, vocab) log-probabilities, and its backward one more: Inductor's two
kernels, instead of a log-softmax written in float32, an ATen gather, a zero fill and an ATen
scatter. ``arange(N)`` is a graph constant (a get_attr buffer made once at compile time), read
with a row stride of 0.

Eager PyTorch stops with an error on an index outside [0, N); the rewritten ops would silently
pick nothing, so an out-of-range row gives NaN instead (NaN for a gathered value, a NaN row for a
scatter into floating-point values): loud, never a plausible wrong number. A scatter into integer
values, or a gather from them, is left alone.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from . import fusion

__all__ = ["one_hot_indexing"]

aten = torch.ops.aten


def one_hot_indexing(gm: fx.GraphModule) -> int:
    """Rewrite every eligible gather/scatter in place; returns how many were rewritten."""
    rewritten = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is aten.gather.default and _eligible(node, node.args[0], node.args[2]):
            _rewrite_gather(gm, node)
        elif node.target in (aten.scatter.value, aten.scatter.src) and _eligible(node, node.args[0], node.args[2]):
            _rewrite_scatter(gm, node)
        else:
            continue
        rewritten += 1
    if rewritten:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return rewritten


def _eligible(node, source, index) -> bool:
    """One index per row along the last dim of a floating-point tensor with static sizes."""
    val, idx = fusion.value(source), fusion.value(index)
    if not (isinstance(val, torch.Tensor) and isinstance(idx, torch.Tensor) and hasattr(val, "fake_mode")):
        return False
    if not val.dtype.is_floating_point or val.dtype not in fusion.SUPPORTED_DTYPES or val.dim() == 0:
        return False
    if idx.dim() != val.dim() or not all(isinstance(s, int) for s in (*val.shape, *idx.shape)):
        return False
    dim = node.args[1] % val.dim()
    if dim != val.dim() - 1 or idx.shape[-1] != 1 or tuple(idx.shape[:-1]) != tuple(val.shape[:-1]):
        return False
    if node.kwargs.get("sparse_grad") or node.kwargs.get("reduce") or len(node.args) > 4:
        return False
    return node.target is not aten.scatter.src or tuple(fusion.value(node.args[3]).shape) == tuple(idx.shape)


class _Builder:
    """Inserts nodes before ``anchor`` and gives each its fake value (what fusion reads)."""

    def __init__(self, gm: fx.GraphModule, anchor: fx.Node, like: torch.Tensor):
        self.gm, self.anchor, self.fake_mode, self.device = gm, anchor, like.fake_mode, like.device

    def op(self, target, *args, **kwargs) -> fx.Node:
        with self.gm.graph.inserting_before(self.anchor):
            node = self.gm.graph.call_function(target, args, kwargs)
        vals = fx.node.map_arg((args, kwargs), fusion.value)
        with self.fake_mode:
            node.meta["val"] = target(*vals[0], **vals[1])
        return node

    def scalar(self, value, dtype) -> fx.Node:
        return self.op(aten.scalar_tensor.default, value, dtype=dtype, device=self.device)

    def columns(self, n: int) -> fx.Node:
        """``arange(n)`` (int64) as a buffer of the graph module: made once, read by every call."""
        name = f"_kl_columns_{n}_{self.device.type}_{self.device.index}"
        if not hasattr(self.gm, name):
            from torch._subclasses.fake_tensor import unset_fake_temporarily

            with unset_fake_temporarily():  # a real tensor, even while aot_autograd traces
                self.gm.register_buffer(name, torch.arange(n, device=self.device))
        with self.gm.graph.inserting_before(self.anchor):
            node = self.gm.graph.get_attr(name)
        node.meta["val"] = self.fake_mode.from_tensor(getattr(self.gm, name), static_shapes=True)
        return node

    def in_range(self, index: fx.Node, n: int) -> fx.Node:
        return self.op(aten.logical_and.default, self.op(aten.ge.Scalar, index, 0), self.op(aten.lt.Scalar, index, n))


def _rewrite_gather(gm, node) -> None:
    source, _, index = node.args[:3]
    val = fusion.value(source)
    n = val.shape[-1]
    b = _Builder(gm, node, val)
    hit = b.op(aten.eq.Tensor, b.columns(n), index)
    picked = b.op(aten.sum.dim_IntList, b.op(aten.where.self, hit, source, b.scalar(0, val.dtype)), [-1], True)
    result = b.op(aten.where.self, b.in_range(index, n), picked, b.scalar(float("nan"), val.dtype))
    node.replace_all_uses_with(result)


def _rewrite_scatter(gm, node) -> None:
    base, _, index, src = node.args[:4]
    val = fusion.value(base)
    n = val.shape[-1]
    b = _Builder(gm, node, val)
    if node.target is aten.scatter.value:
        src = b.scalar(src, val.dtype)
    hit = b.op(aten.eq.Tensor, b.columns(n), index)
    scattered = b.op(aten.where.self, hit, src, base)
    result = b.op(aten.where.self, b.in_range(index, n), scattered, b.scalar(float("nan"), val.dtype))
    node.replace_all_uses_with(result)
