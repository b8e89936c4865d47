"""Chains of ATen views replayed as one aliasing of their root (the runner's host path).

A transformer block's forward has ~25 view calls (~4-6 us each on the H200's host); the runner
replays each chain of views as one ``as_strided`` (values the caller sees) or one untracked alias
(everything else) once the first call has recorded its layout.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from . import fusion

__all__ = ["ViewChain", "view_chains", "tracked_view", "UNTRACKED_VIEW", "alias", "nodes_in", "static_arg",
           "aliases_its_input", "alias_roots"]


#: ATen views with one output and static arguments: a chain of them is one aliasing of its root.
_CHAIN_VIEWS = {
    "aten.view.default", "aten._unsafe_view.default", "aten.permute.default", "aten.transpose.int",
    "aten.t.default", "aten.expand.default", "aten.unsqueeze.default", "aten.squeeze.dim",
    "aten.squeeze.dims", "aten.squeeze.default", "aten.select.int", "aten.slice.Tensor",
    "aten.alias.default", "aten.detach.default", "aten.diagonal.default",
}


def aliases_its_input(node: fx.Node) -> bool:
    """The op returns memory of its first argument without writing it: a view (its schema says so:
    ``view``, ``expand``, ``alias``, ``split``'s pieces...) or ``_unsafe_view``, whose schema does
    not say so."""
    if fusion.target_name(node) == "aten._unsafe_view.default":
        return True
    schema = getattr(node.target, "_schema", None)
    return schema is not None and any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)


def alias_roots(gm: fx.GraphModule) -> dict:
    """Each node -> the value whose memory it is: itself, or through views (``aliases_its_input``)
    and a split's pieces the first value of the chain. Read by the reuse planning (no other view
    of a buffer read later) and by fusion (groups reading views of one value share a kernel)."""
    root = {}
    for n in gm.graph.nodes:
        src = n.args[0] if n.args and isinstance(n.args[0], fx.Node) else None
        if src is not None and (aliases_its_input(n) or (n.target is operator.getitem and aliases_its_input(src))):
            root[n] = root.get(src, src)
        else:
            root[n] = n
    return root


def tracked_view(root, size, stride, offset):
    return root.as_strided(size, stride, offset)


#: Inductor's ``reinterpret_tensor``: an alias of a tensor's storage with the given layout, made in
#: C++ without the dispatcher (~2 us on the H200's host against ~4-6 us for a view op or
#: ``as_strided``). It records no view relation, so only values the graph does not return use it.
_REINTERPRET = getattr(getattr(torch._C._dynamo, "guards", None), "_reinterpret_tensor", None)


def _untracked_view(root, size, stride, offset):
    """An alias of ``root``'s storage at the absolute storage ``offset``. ``_reinterpret_tensor``
    takes the offset *relative to root's own* storage offset: passing the absolute one put a view
    of a split (root at offset 1536) at 3072, past the storage's end (GPT-2's attention, issue 11)."""
    return _REINTERPRET(root, size, stride, offset - root.storage_offset())


UNTRACKED_VIEW = _untracked_view if _REINTERPRET is not None else tracked_view


def alias(root, size, stride, delta):
    """An untracked alias of ``root``'s storage at ``delta`` elements past ``root``'s own offset
    (what a specialized runner replays a recorded chain as: ``ViewChain.recorded``)."""
    if _REINTERPRET is not None:
        return _REINTERPRET(root, size, stride, delta)
    return root.as_strided(size, stride, root.storage_offset() + delta)


class ViewChain:
    """Views applied one after another to a root value, replayed as one aliasing of the root.

    Every view's result is a (size, stride, storage offset) of the root's storage that depends only
    on the root's own (size, stride, offset): the first call runs the views and records the result;
    later calls with the root laid out alike make one alias of the root instead of one ATen call per
    view (a transformer block's forward has ~25 such calls, ~4-6 us each on the H200's host). A
    value the caller sees is replayed as an ``as_strided`` view (aot_autograd may look at its
    base); others, tensors saved for the backward included, as an untracked alias
    (``UNTRACKED_VIEW``: aot_autograd detaches saved views, one more ATen call each)."""

    __slots__ = ("steps", "key", "size", "stride", "offset", "make")

    def __init__(self, steps, returned: bool):
        self.steps = steps  # [(target, extra args)], root first
        self.key = None
        self.make = tracked_view if returned else UNTRACKED_VIEW

    def __call__(self, root):
        key = (root.shape, root.stride(), root.storage_offset())
        if key == self.key:
            return self.make(root, self.size, self.stride, self.offset)
        out = root
        for target, args in self.steps:
            out = self._step(target, out, args)
        if out.untyped_storage().data_ptr() == root.untyped_storage().data_ptr():
            self.key, self.size, self.stride, self.offset = key, out.shape, out.stride(), out.storage_offset()
        return out

    def recorded(self):
        """(size, stride, offset past the root's own, tracked) of the alias the last call replayed
        or recorded, or None where none was recorded (the chain copied: a reshape). In a graph of
        fixed shapes the root is laid out alike on every call, so the alias is too."""
        if self.key is None:
            return None
        return self.size, self.stride, self.offset - self.key[2], self.make is tracked_view

    def _step(self, target, value, args):
        """One view; a ``view`` the value's layout cannot take (a kernel's output laid out other
        than the traced value: Mamba's ``permute -> unsqueeze -> view`` of a row kernel's
        row-major output) is a ``reshape``, a copy, where the caller never sees the result (a
        returned view must alias its base as traced: there the error stands). The copy is never
        recorded as an alias of the root (``__call__``)."""
        try:
            return target(value, *args)
        except RuntimeError:
            if self.make is tracked_view or target not in _RESHAPEABLE:
                raise
            return torch.ops.aten.reshape.default(value, *args)


#: views by size alone, a reshape where the layout refuses them
_RESHAPEABLE = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)


def view_chains(runner) -> tuple[dict, set]:
    """({terminal view node: (root, ViewChain)}, elided view nodes): views of one or more steps
    whose intermediate results nothing else reads."""
    outputs = set(nodes_in(runner.output_args))
    visible = outputs
    if runner.visible_outputs is not None and isinstance(runner.output_args, (list, tuple)):
        visible = set(nodes_in(list(runner.output_args[:runner.visible_outputs])))

    def chainable(n) -> bool:
        if not (isinstance(n, fx.Node) and n.op == "call_function" and fusion.target_name(n) in _CHAIN_VIEWS):
            return False
        if n.kwargs or not n.args or not isinstance(n.args[0], fx.Node):
            return False
        return all(static_arg(a) for a in n.args[1:]) and fusion.static_shape(fusion.value(n))

    nodes = [item for kind, item in runner.steps if kind == "node"]
    views = {n for n in nodes if chainable(n)}
    # read by other views only: never computed (every reader is either elided too or folded; a
    # one-step view reads a non-view root)
    elided = {n for n in views if n.users and n not in outputs and all(u in views for u in n.users)}
    chains = {}
    for n in views - elided:
        steps, cur = [], n
        while cur in views:
            steps.append((cur.target, tuple(cur.args[1:])))
            cur = cur.args[0]
            if cur not in elided:
                break
        chains[n] = (cur, ViewChain(steps[::-1], n in visible))
    return chains, elided


def nodes_in(arg) -> list:
    """The fx.Nodes inside an argument (nested lists and tuples included)."""
    found = []
    fx.node.map_arg(arg, lambda n: found.append(n))
    return found


def static_arg(a) -> bool:
    """An argument written into the runner's source as a literal (None, bool, int, lists of them)."""
    if isinstance(a, (list, tuple)):
        return all(static_arg(x) for x in a)
    return a is None or isinstance(a, (bool, int))
