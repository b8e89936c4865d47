"""FX graph -> groups of fusible nodes.

Walk the (functional, decomposed) ATen graph in order. Each node is classified
(``fusion.classify``): pointwise, reduction over the last dim, a view, a constant, or eager. A
fusible node joins the group of one of its producers, or else of a group that already reads one of
its inputs, when ``fusion.role_in`` says its shape fits that group and no cycle through another
kernel would result. Pointwise groups feeding it are then merged in when their shape fits (the same
shape; one value per row of a reduction; a smaller shape that broadcasts, if nothing else reads
it). Everything else runs as ATen, with the reason recorded.

Three kinds of group:

* ``pointwise``: nodes have the group's shape S (or a smaller private shape that broadcasts to
  it, recomputed at every element); inputs broadcast to S.
* ``reduction``: rows of a full shape S = (..., N) reduced over the last dim. Nodes are ``full``
  (shape S, one value per element) or ``row`` (one value per row: shape S[:-1] + (1,) or S[:-1]).
  Softmax, layer norm and RMS norm written from primitives each become one such group.
* ``column``: reductions over every dim but the last of one full shape S = (..., C) (bias and
  norm-weight gradients), with their pointwise prologue and per-column epilogue. Nodes are
  ``full`` or ``col`` (one value per column). Before placing anything, each cluster of such
  reductions takes the pointwise chain feeding it (``private_column_prologues``): as its own
  copy when another generated kernel reads the chain too (the kernel recomputes ``dy * xhat``
  from ``dy``, ``x``, mean and rstd instead of reading a full-size intermediate another kernel
  would have to write), or the chain itself when only ATen ops read it (GELU's backward feeding
  both the bias gradient and a matmul: computed once, written once, summed on the way).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from . import fusion, layout, rewrites, views

__all__ = ["Group", "Partition", "partition", "absorb_copies"]


@dataclass
class Group:
    gid: int
    kind: str  # "pointwise" | "reduction" | "column"
    shape: tuple  # the full iteration shape S (sizes as ints or sympy expressions)
    nodes: list = field(default_factory=list)  # fx.Nodes in graph order
    roles: dict = field(default_factory=dict)  # node -> "full" | "row" | "col"
    inputs: list = field(default_factory=list)  # external tensor nodes, in first-use order
    scalars: list = field(default_factory=list)  # external symbolic scalars (SymInt/SymFloat nodes)
    outputs: list = field(default_factory=list)  # nodes whose values are needed outside the group

    @property
    def name(self) -> str:
        """Self-describing kernel name: kl_fused_<ops in order, deduplicated, at most 6>. A
        reduction kernel always names a reduction (sum, amax, mean, var...), so that a profiler
        line tells pointwise from reduction kernels."""
        ops = []
        for n in self.nodes:
            op = fusion.short_name(n)
            if op and op not in ops:
                ops.append(op)
        shown = ops[:6]
        reductions = [fusion.short_name(n) for n in self.nodes if fusion.is_reduction(n)]
        if reductions and not set(reductions) & set(shown):
            shown = ops[:5] + [reductions[0]]
        # a group of copies alone (a layout change, a copy into padded rows) names itself a copy
        return "kl_fused_" + ("_".join(shown) or "copy") + ("_etc" if len(ops) > len(shown) else "")


@dataclass
class Partition:
    groups: list  # Group
    group_of: dict  # node -> Group
    eager: dict  # node -> reason it runs as ATen ("" for views and placeholders)
    refusals: list  # (node name, reason) for every fusion refused
    #: (group, reader's name, names of the ops it recomputes) for every chain a kernel recomputes
    #: instead of reading (``_State._recompute_producers``)
    recomputed: list = field(default_factory=list)
    #: ``copy_(input, value)`` nodes whose value's kernel stores straight into the input
    #: (``absorb_copies``): copy node -> (group, value node, input node)
    into: dict = field(default_factory=dict)


def partition(gm: fx.GraphModule) -> Partition:
    rewrites.rewrite(gm)
    if layout.enabled():
        layout.copies_as_kernels(gm)
    private_column_prologues(gm)
    # nothing a rewrite left unread is placed: a chain half built and abandoned (a GELU's copy in a
    # sum's row space, ``prologues_in_row_space``, refused at softmax's max) became a group of no
    # outputs, a kernel that wrote nothing, whose specialized runner line did not compile (FX
    # keeps mutating ops: they are impure)
    if gm.graph.eliminate_dead_code():
        gm.recompile()
    state = _State(gm)
    for node in gm.graph.nodes:
        if node.op == "call_function":
            state.place(node)
    state.drop_unread_originals()
    _break_cycles(gm, state)
    for group in state.groups:
        _finish(group, state.group_of)
    part = Partition(state.groups, state.group_of, state.eager, state.refusals,
                     recomputed=[r for r in state.recomputed_notes if r[0] in state.groups])
    absorb_copies(gm, part)
    return part


def absorb_copies(gm: fx.GraphModule, part: Partition) -> None:
    """``copy_(buf, v)`` of a graph input ``buf`` that only ``v``'s kernel reads otherwise (a
    training batch norm's running statistics, kept in the graph as their update:
    ``keep_inference_input_mutations``) -> that kernel stores ``v`` into ``buf`` itself, instead
    of writing ``v`` and an ATen copy (a launch per buffer) copying it over, where nothing but
    the kernel and the graph's output reads ``v``. The kernel reads each old value where it
    stores the new one: a pointwise kernel at the same element (``v`` has the
    kernel's full shape), a column kernel in its per-column epilogue, after every read of its
    prologue (the epilogue runs once all of a column's row blocks have arrived). The copy node
    stays in the graph and runs nothing; the runner copies after all where the buffer's layout
    is not the one the kernel writes (``group_runner.GroupRunner.run_values``). A value the graph
    also returns (saved for ATen's batch norm backward) is returned as a copy of the buffer
    (``_returned_copies``): returned as the buffer itself, the next call's update changed it in
    place (autograd's "modified by an inplace operation", or a saved tensor changed silently
    through ``.data``: found by a held-out sweep)."""
    taken, returned = set(), []
    for group in part.groups:
        members = set(group.nodes)
        for v in group.outputs:
            for copy in list(v.users):
                buf = copy.args[0] if copy.target is torch.ops.aten.copy_.default and len(copy.args) == 2 else None
                if buf is None or copy.args[1] is not v or buf in taken or not _stores_in_place(group, v, buf):
                    continue
                others = [u for u in v.users if u is not copy and u not in members]
                # the buffer read by this kernel alone; the value besides by the graph's output only
                if all(u is copy or u in members for u in buf.users) and all(u.op == "output" for u in others):
                    part.into[copy] = (group, v, buf)
                    part.eager[copy] = ""  # no ATen op: listed with the plan's in-place stores
                    taken.add(buf)
                    if others:
                        returned.append((v, buf, group))
    _returned_copies(gm, part, returned)


def _returned_copies(gm: fx.GraphModule, part: Partition, returned: list) -> None:
    """The returned values of ``returned`` ((value, buffer, group)) as copies of the buffers the
    groups' kernels stored them into (``rewrites.buffer_copies``: one launch for all), listed with
    the ATen ops."""
    output = next(n for n in gm.graph.nodes if n.op == "output")
    copies = rewrites.buffer_copies(gm, [(v, buf, [output], group.nodes[0]) for v, buf, group in returned])
    if copies is None:
        return
    part.eager[copies] = "copies of the buffers kernels stored into, for the values the graph returns"
    for item in copies.users:
        part.eager[item] = ""
    gm.recompile()


def _stores_in_place(group: Group, v: fx.Node, buf: fx.Node) -> bool:
    """Can ``group``'s kernel store ``v`` into ``buf``, a graph input of the same static shape and
    dtype, reading ``buf``'s old values only where it stores (see ``absorb_copies``)?"""
    if buf.op != "placeholder":
        return False
    bv, vv = fusion.value(buf), fusion.value(v)
    if not (fusion.is_tensor_node(buf) and fusion.is_tensor_node(v) and fusion.static_shape(bv)
            and tuple(bv.shape) == tuple(vv.shape) and bv.dtype == vv.dtype):
        return False
    if group.kind == "pointwise":
        return tuple(vv.shape) == tuple(group.shape)
    return group.kind == "column" and group.roles.get(v) == "col"


#: at most this many ops (and views) of another kernel are recomputed in a kernel that reads them
MAX_RECOMPUTED = 4
#: views a recomputed chain pushes down to its inputs (``_State._recompute_broadcast``)
PUSHED_VIEWS = (torch.ops.aten.unsqueeze.default, torch.ops.aten.expand.default)
#: ``_sibling_role`` of a reduction group merged into another of its shape: its nodes keep theirs
KEEP_ROLES = "keep"


class _State:
    def __init__(self, gm: fx.GraphModule):
        self.groups: list[Group] = []
        self.group_of: dict = {}
        self.eager: dict = {}
        self.refusals: list = []
        self.columns: dict = {}  # column cluster id -> Group
        self.index = {n: i for i, n in enumerate(gm.graph.nodes)}
        self.roots = views.alias_roots(gm)  # node -> the value whose memory it is
        self.root_readers: dict = {}  # an ATen value or input -> groups reading it through views
        self.recomputed: dict = {}  # id(group) -> {node of another kernel: its copy in the group}
        self.chains: dict = {}  # id(group) -> {node read: the chain recomputing it there}
        self.copied: set = set()  # nodes recomputed somewhere (``drop_unread_originals``)
        self.on_gpu = any(_device_type(n) == "cuda" for n in gm.graph.nodes)
        self.recomputed_notes: list = []  # (group, reader's name, the ops' names): ``Partition.recomputed``

    def place(self, node: fx.Node) -> None:
        if COLUMN_TAG in node.meta:
            self._place_column(node)
            return
        if self.on_gpu and _device_type(node) == "cpu":
            # a 0-dim CPU value beside CUDA ones (``v[..., 1] = 2.5`` lifts the literal 2.5 as a CPU
            # tensor): a kernel of the GPU's cannot write host memory (its launch failed, "CUDA
            # driver error: invalid argument"), and ATen computes one value on the host for free
            self.eager[node] = "a value on the CPU in a graph on the GPU: ATen computes it on the host"
            return
        if self.on_gpu and _reads_host_array(node):
            # (``torch.tensor([...]).to(x.device)``: as a cast in a GPU kernel it would load the
            # vector through a host pointer; a 0-dim CPU value is a scalar any kernel reads)
            self.eager[node] = "copies a CPU tensor to the GPU: ATen's host-to-device copy"
            return
        kind, reason = fusion.classify(node)
        if kind in ("eager", "constant"):
            self.eager[node] = reason
            return
        refused = []
        # a reduction group first: the pointwise groups also feeding the node then merge into it
        # as its full-size nodes (the picked logit of a cross-entropy joins its log-softmax)
        producers = sorted(self._producer_groups(node), key=lambda g: g.kind != "reduction")
        for group in producers + self._sharing_groups(node):
            role, why = fusion.role_in(group, node, kind)
            if role is None:
                refused.append((node.name, f"not fused into {group.name}: {why}"))
                continue
            if self._creates_cycle(group, node):
                refused.append((node.name, f"not fused into {group.name}: it would depend on itself "
                                           "through a kernel outside the group"))
                continue
            self._join(group, node, role)
            return
        self.refusals.extend(refused)  # kept only for nodes no producer's group could take
        if fusion.is_scatter(node) and fusion.is_scatter(node.args[0]):
            # it adds into the buffer of a scatter it cannot join: ATen adds into that kernel's output
            node.meta["kl_scatter"] = False
            self.eager[node] = "an accumulating index_put into a buffer another kernel's scatter fills: ATen"
            return
        if kind == "view":
            self.eager[node] = ""  # a view launches nothing
            return
        shape = fusion.full_shape(node, kind)
        group = Group(len(self.groups), "reduction" if kind == "reduction" else "pointwise", shape)
        self.groups.append(group)
        self._join(group, node, "full" if kind != "reduction" else "row")

    def _place_column(self, node: fx.Node) -> None:
        """A column reduction or a node of its private prologue: into its cluster's group."""
        cluster = node.meta[COLUMN_TAG]
        group = self.columns.get(cluster)
        if group is None:
            group = self.columns[cluster] = Group(len(self.groups), "column", node.meta[COLUMN_SHAPE])
            self.groups.append(group)
        self._add(group, node, "col" if fusion.is_reduction(node) else "full")

    def _producer_groups(self, node):
        seen = []
        for p in node.all_input_nodes:
            g = self.group_of.get(p)
            if g is not None and g not in seen:
                seen.append(g)
        return seen

    def _sharing_groups(self, node):
        """Groups that already read one of ``node``'s inputs: joining one reads that input once
        (layer norm's mean and variance of x, x.sin() and x.cos()); then groups reading other
        views of the same ATen value or input (GPT-2's key and value, two slices of one qkv
        product, each transposed and copied into the cache: one kernel for both, as Inductor's)."""
        seen = self._producer_groups(node)
        out = []
        for p in node.all_input_nodes:
            if fusion.is_constant(p) or (p in self.group_of and not _stays_pointwise(self.group_of[p])):
                continue  # (a cat's kernel takes no reduction: its output is read like an input)
            for user in p.users:
                g = self.group_of.get(user)
                if g is not None and g not in seen and g not in out:
                    out.append(g)
        for p in node.all_input_nodes:
            for g in self.root_readers.get(self.roots.get(p, p), ()):
                if g in self.groups and g not in seen and g not in out:
                    out.append(g)
        return out

    def _add(self, group: Group, node, role: str) -> None:
        if group.kind == "pointwise" and fusion.is_reduction(node):
            group.kind = "reduction"  # a pointwise prologue becomes the reduction's full nodes
        group.nodes.append(node)
        group.roles[node] = role
        self.group_of[node] = group
        for p in node.all_input_nodes:
            root = self.roots.get(p, p)
            if root is not p and root not in self.group_of and not fusion.is_constant(root):
                readers = self.root_readers.setdefault(root, [])
                if group not in readers:
                    readers.append(group)

    def _join(self, group: Group, node, role: str) -> None:
        """``node`` into ``group``, its producers' groups merged in where they fit
        (``_merge_siblings``), then what it still reads of other kernels recomputed where that
        fits (``_recompute_producers``); when the node made the group a reduction, for all its
        nodes: row values fit it now."""
        kind = group.kind
        self._add(group, node, role)
        self._merge_siblings(group, node)
        for n in [node] if group.kind == kind else list(group.nodes):
            self._recompute_producers(group, n)

    def _recompute_producers(self, group: Group, node) -> None:
        """A short chain of another kernel's pointwise ops (and views of them) that reads one value
        from memory is recomputed here rather than read: a mean cross-entropy's ``labels !=
        ignore_index`` and ``where(kept, labels, 0)`` feed both its count of kept labels and the
        loss's row kernel. Read from the counting kernel, they made that kernel a producer of the
        loss's, and the two reductions of the same rows (the count, the sum of losses) could not
        share a kernel; recomputed, they do (one kernel fewer, as Inductor's). The kernel reads the
        chain's input where it read the chain's result: no more bytes for a one-input chain."""
        for p in list(node.all_input_nodes):
            chain = self._recomputable_chain(p, group)
            if chain and self._copy_chain(group, node, p, chain):
                continue
            if self._recompute_broadcast(group, node, p):
                continue
            if chain and group.kind != "pointwise":
                self.refusals.append((node.name, f"{p.name} not recomputed in {group.name}: a shape that "
                                                 "fits neither the kernel's elements nor its rows"))

    def _recompute_broadcast(self, group: Group, node, p) -> bool:
        """A chain of another kernel's ops read through unsqueezes and expands (a causal mask:
        ``where(expand(le(pos[None, :], pos[:, None])), 0, -inf)``, the positions an ``arange``
        plus an offset) recomputed here at the shapes that broadcast against the kernel's: the views
        pushed down to the chain's inputs, ``f(a, b)[None] = f(a[None], b[None])``, the expands left
        to broadcasting. The mask kernel, the comparison kernel and the positions kernel become the
        one that reads the mask (Inductor's one). At most ``MAX_RECOMPUTED`` ops reading at most two
        values from memory, each smaller than the kernel's shape when there are two."""
        member: dict = {}
        if not _reads_by_broadcasting(node) or not self._broadcast_member(p, group, member):
            return False
        ops, leaves, stack, seen = [], set(), [p], set()
        while stack:
            n = stack.pop()
            if n in seen or fusion.is_constant(n) or fusion.is_scalar(n):
                continue
            seen.add(n)
            if self._broadcast_member(n, group, member):
                ops += [n] if n in self.group_of else []
                stack.extend(n.all_input_nodes)
            else:
                leaves.add(n)
        # what is read from memory: one value per root (two views of one arange are one), single
        # values (an offset) not counted
        read = {_view_root(x) for x in leaves if fusion.value(x).numel() > 1}
        size = math.prod(fusion.hint(s) for s in group.shape)
        if not ops or len(ops) > MAX_RECOMPUTED or len(read) > 2 or any(x in self.group_of for x in leaves) or \
                (len(read) == 2 and any(fusion.value(x).numel() >= size for x in read)):
            return False
        b = rewrites.Builder(node.graph.owning_module, node, fusion.value(node))
        try:
            top = self._pushed_copy(p, (), b, group, member, {})
        except Exception:  # an op whose fake value does not follow (a shape it cannot take)
            b.undo()
            return False
        if not self._place_pushed(group, node, p, top, b.made):
            return False
        self.copied.update(ops)
        self.recomputed_notes.append((group, node.name, [n.name for n in sorted(ops, key=self.index.__getitem__)]))
        self._drop_unread_views(seen)
        return True

    def _broadcast_member(self, n, group: Group, member: dict) -> bool:
        """Is ``n`` an op of another kernel, or an unsqueeze or expand of one (transitively)?"""
        if n not in member:
            member[n] = False
            if self._in_other_kernel(n, group):
                member[n] = True
            elif n.op == "call_function" and n.target in PUSHED_VIEWS and n not in self.group_of:
                member[n] = isinstance(n.args[0], fx.Node) and self._broadcast_member(n.args[0], group, member)
        return member[n]

    def _pushed_copy(self, n, dims: tuple, b, group: Group, member: dict, made: dict):
        """A node computing ``n`` with ``unsqueeze(., d)`` for each d of ``dims`` applied, views
        pushed to the chain's inputs; expands dropped (the kernel broadcasts)."""
        key = (n, dims)
        if key in made:
            return made[key]
        if not isinstance(n, fx.Node) or not member.get(n):
            out = n
            for d in dims:
                out = b.op(torch.ops.aten.unsqueeze.default, out, d)
        elif n.target is torch.ops.aten.unsqueeze.default:
            src, d = n.args[0], n.args[1]
            d = d if d >= 0 else d + len(fusion.dims(src)) + 1
            out = self._pushed_copy(src, (d,) + dims, b, group, member, made)
        elif n.target is torch.ops.aten.expand.default:
            src = n.args[0]
            out = self._pushed_copy(src, (0,) * (len(fusion.dims(n)) - len(fusion.dims(src))) + dims, b, group,
                                    member, made)
        else:
            rank = len(fusion.dims(n))

            def operand(a):
                if not isinstance(a, fx.Node) or not isinstance(fusion.value(a), torch.Tensor) or fusion.is_constant(a):
                    return a
                return self._pushed_copy(a, (0,) * (rank - len(fusion.dims(a))) + dims, b, group, member, made)
            args, kwargs = fx.node.map_arg((n.args, n.kwargs), operand)
            out = b.op(n.target, *args, **kwargs) if dims or args != n.args else n
            want = list(fusion.dims(n))
            for d in dims:
                want.insert(d, 1)
            got = fusion.dims(out)  # (smaller where an expand was dropped; an op making its own shape: refused)
            if len(got) != len(want) or not fusion.broadcasts_to(got, tuple(want)):
                raise ValueError(f"{n.name}: pushed views give {fusion.dims(out)}, not {tuple(want)}")
        made[key] = out
        return out

    def _place_pushed(self, group: Group, node, p, top, made: list) -> bool:
        """The pushed copies into ``group`` (their views ATen's, before it), ``node`` reading ``top``;
        False (nothing changed) where a copy's shape or ``node`` does not fit the group."""
        base = self.index[node]
        added = []
        for i, n in enumerate(made):
            self.index[n] = base - 1 + (i + 1) / (len(made) + 1)
            if n.target is torch.ops.aten.unsqueeze.default:
                self.eager[n] = ""
                continue
            role = _broadcast_role(group, fusion.dims(n))
            if role is None:
                break
            self._add(group, n, role)
            added.append(n)
        else:
            node.replace_input_with(p, top)
            if _keeps_its_shape(node) and fusion.role_in(group, node, fusion.classify(node)[0])[0] is not None:
                group.nodes.sort(key=self.index.__getitem__)
                return True
            node.replace_input_with(top, p)
        for n in added:
            group.nodes.remove(n)
            del group.roles[n]
            del self.group_of[n]
        for n in reversed(made):
            self.eager.pop(n, None)
            if not n.users:
                n.graph.erase_node(n)
        return False

    def _drop_unread_views(self, nodes) -> None:
        """ATen views of a recomputed chain that nothing reads any more."""
        for n in sorted(nodes, key=self.index.__getitem__, reverse=True):
            if n.op == "call_function" and not n.users and n not in self.group_of and \
                    fusion.classify(n)[0] == "view":
                self.eager.pop(n, None)
                n.graph.erase_node(n)

    def _recomputable_chain(self, p, group: Group) -> list | None:
        """The nodes (in graph order) computing ``p`` in other kernels, views of them included,
        when they are at most ``MAX_RECOMPUTED`` pointwise ops and views that read exactly one
        tensor from memory; else None. (Originals no reader is left to are dropped at the end:
        ``drop_unread_originals``.)"""
        chains = self.chains.setdefault(id(group), {})
        if p in chains:  # copied for another reader already
            return chains[p]
        # views join the chain above its ops only (unsqueeze(where(...))): a view an op reads is
        # in memory anyway, whatever kernel wrote its source
        chain, leaves, stack, seen = [], set(), [(p, True)], set()
        while stack:
            n, top = stack.pop()
            if n in seen or fusion.is_constant(n) or fusion.is_scalar(n):
                continue
            seen.add(n)
            op = self._in_other_kernel(n, group)
            if op or (top and self._view_of_other_kernel(n, group)):
                chain.append(n)
                stack.extend((a, top and not op) for a in n.all_input_nodes)
            else:
                leaves.add(n)
        generated = [n for n in chain if n in self.group_of]
        if not generated or len(chain) > MAX_RECOMPUTED or len(leaves) != 1 or \
                any(leaf in self.group_of for leaf in leaves):
            return None
        chains[p] = sorted(chain, key=self.index.__getitem__)
        return chains[p]

    def _in_other_kernel(self, n, group: Group) -> bool:
        other = self.group_of.get(n)
        return other is not None and other is not group and other.kind in ("pointwise", "reduction") \
            and other.roles.get(n) in ("full", "row") and fusion.classify(n)[0] == "pointwise" \
            and not (fusion.is_cat(n) or fusion.is_gather(n) or fusion.is_scatter(n))

    def _view_of_other_kernel(self, n, group: Group) -> bool:
        if n in self.group_of or n.op != "call_function" or fusion.classify(n)[0] != "view":
            return False
        src = n.args[0]
        return isinstance(src, fx.Node) and (self._in_other_kernel(src, group) or self._view_of_other_kernel(src, group))

    def _copy_chain(self, group: Group, node, p, chain: list) -> bool:
        """Copies of ``chain`` into ``group`` (once per group), ``node`` reading the copy of ``p``;
        False (and nothing changed) where a copy or ``node`` would not fit the group."""
        memo = self.recomputed.setdefault(id(group), {})
        made = []
        base = self.index[node]
        for i, n in enumerate(chain):
            place = base - 1 + (i + 1) / (len(chain) + 1)  # just before the reader, in chain order
            if n in memo:
                if self.index[memo[n]] > place:  # made for a later reader: moved before this one
                    node.prepend(memo[n])
                    self.index[memo[n]] = place
                continue
            with node.graph.inserting_before(node):
                copy = node.graph.node_copy(n, lambda a: memo.get(a, a))
            self.index[copy] = place
            memo[n] = copy
            self.copied.add(n)
            made.append((n, copy))
            role, _ = fusion.role_in(group, copy, fusion.classify(copy)[0])
            if role is None:
                return self._undo_copies(group, made)
            self._add(group, copy, role)
        node.replace_input_with(p, memo[p])
        if fusion.role_in(group, node, fusion.classify(node)[0])[0] is None:
            node.replace_input_with(memo[p], p)
            return self._undo_copies(group, made)
        group.nodes.sort(key=self.index.__getitem__)
        self.recomputed_notes.append((group, node.name, [n.name for n in chain if n in self.group_of]))
        for n in reversed(chain):  # an ATen view nobody reads any more is dropped
            if not n.users and n not in self.group_of:
                self.eager.pop(n, None)
                n.graph.erase_node(n)
        return True

    def drop_unread_originals(self) -> None:
        """A recomputed node that no reader is left to (every one took a copy) leaves its kernel,
        and a kernel left with nothing, the plan: it would compute what nobody reads."""
        for n in sorted(self.copied, key=self.index.__getitem__, reverse=True):
            if n.users or n not in self.group_of:
                continue
            group = self.group_of.pop(n)
            group.nodes.remove(n)
            del group.roles[n]
            n.graph.erase_node(n)
            if not group.nodes:
                self.groups.remove(group)
        for i, g in enumerate(self.groups):
            g.gid = i

    def _undo_copies(self, group: Group, made: list) -> bool:
        memo = self.recomputed[id(group)]
        self.chains[id(group)].clear()  # (a chain that did not fit is looked at afresh)
        for n, copy in reversed(made):
            memo.pop(n, None)
            if copy in group.roles:
                group.nodes.remove(copy)
                del group.roles[copy]
                del self.group_of[copy]
            copy.graph.erase_node(copy)
        return False

    def _merge_siblings(self, group: Group, node) -> None:
        """Pointwise groups feeding ``node`` join its group when their shape fits: the same shape
        (x.sin() + y.cos()), or, into a reduction group, one value per row (rsqrt(var + eps)).
        A cat's pieces are read from memory: their groups stay apart."""
        if fusion.is_cat(node):
            return
        for other in self._producer_groups(node):
            role = self._sibling_role(group, other)
            if other is group or role is None or not _placed_reads_from_memory(group.nodes + other.nodes):
                continue
            if any(self._depends_on(p, group.nodes) for n in other.nodes for p in n.all_input_nodes
                   if self.group_of.get(p) is not other):
                continue
            if any(self._depends_on(p, other.nodes) for n in group.nodes for p in n.all_input_nodes
                   if self.group_of.get(p) not in (group, other)):
                continue
            for n in other.nodes:
                group.roles[n] = other.roles[n] if role == KEEP_ROLES else role
                self.group_of[n] = group
            group.nodes = sorted(group.nodes + other.nodes, key=self.index.__getitem__)
            self.groups.remove(other)
            for n in other.nodes:
                self._recompute_producers(group, n)
        for i, g in enumerate(self.groups):
            g.gid = i

    @staticmethod
    def _sibling_role(group: Group, other: Group) -> str | None:
        """same shape: full; (..., 1) rows of a reduction: row; a smaller shape that broadcasts
        (a (S, S) mask for (B, S, S) scores): full, recomputed at every element, if nothing
        outside the two groups reads it."""
        if other.kind == "reduction":
            # reductions of the same rows share one pass over them (a mean cross-entropy's sum of
            # losses and its count of kept labels: one kernel instead of two, as Inductor's)
            return KEEP_ROLES if group.kind == "reduction" and other.shape == group.shape else None
        if other.kind != "pointwise" or fusion.has_scatter(other):
            return None  # (a scatter's buffer is complete only when its kernel has finished)
        if _stays_pointwise(other):  # its pieces are placed by coordinate: the same iteration space only
            # (a gathered value merged into a bigger pointwise kernel kept that kernel from joining
            # the row reduction after it: GPT-2's wte(ids) + wpe(positions) then took the layer
            # norm's residual add, and the sum made one more round trip through memory)
            return "full" if group.kind == "pointwise" and other.shape == group.shape else None
        if group.kind == "column":  # per-column values only, computed after the reduction
            return "col" if fusion.padded(other.shape, 1)[-1:] == fusion.col_shape(group) and \
                all(s == 1 for s in other.shape[:-1]) else None
        if other.shape == group.shape:
            return "full"
        if group.kind == "reduction" and fusion.padded(other.shape, len(group.shape)) == fusion.row_shape(group):
            return "row"
        private = all(u in group.roles or u in other.roles for n in other.nodes for u in n.users)
        if not (private and fusion.broadcasts_to(other.shape, group.shape)):
            return None
        # read by a row value of a reduction (``sum(x, 1) + v``, v of the rows' count, which a square
        # group's width equals): one value per row, not a broadcast along the row; "full" loaded it
        # at every element (the kernel did not compile: found by a random-program sweep)
        return None if any(group.roles.get(u) == "row" for n in other.nodes for u in n.users) else "full"

    def _creates_cycle(self, group: Group, node) -> bool:
        return any(self._depends_on(p, group.nodes) for p in node.all_input_nodes if self.group_of.get(p) is not group)

    def _depends_on(self, start, members) -> bool:
        """Does ``start`` (transitively) read any node of ``members``?"""
        targets = set(members)
        lowest = min(self.index[m] for m in members)
        stack, seen = [start], set()
        while stack:
            n = stack.pop()
            if n in targets:
                return True
            if n in seen or self.index[n] < lowest:
                continue
            seen.add(n)
            stack.extend(n.all_input_nodes)
        return False


def _device_type(node) -> str | None:
    """The device type of a node's tensor value (None for anything else)."""
    value = node.meta.get("val")
    return value.device.type if isinstance(value, torch.Tensor) else None


def _reads_host_array(node) -> bool:
    """Does ``node`` read a CPU tensor of one dim or more (a device transfer's source)?"""
    return any(_device_type(a) == "cpu" and a.meta["val"].dim() > 0 for a in node.all_input_nodes)


def _reads_by_broadcasting(node) -> bool:
    """A pointwise op: reading an operand of a shape that broadcasts to the expanded one gives the
    same values. (A view or a reduction reads its input's shape: a view of repeat_kv's expanded
    keys, handed the unexpanded ones, failed at run time.)"""
    return fusion.classify(node)[0] == "pointwise" and not (
        fusion.is_cat(node) or fusion.is_gather(node) or fusion.is_scatter(node))


def _keeps_its_shape(node) -> bool:
    """Do ``node``'s operands still broadcast to its shape? (``clone(expand(k))``, repeat_kv's copy,
    handed the unexpanded keys would make a smaller tensor: kept reading the expand.)"""
    out = fusion.dims(node)
    shapes = [fusion.dims(a) for a in node.all_input_nodes if isinstance(fusion.value(a), torch.Tensor)]
    if any(len(s) > len(out) for s in shapes):
        return False
    shapes = [fusion.padded(s, len(out)) for s in shapes]
    return all(size == 1 or any(s[i] == size for s in shapes) for i, size in enumerate(out))


def _view_root(node):
    """The value a chain of views shows (views made while planning included)."""
    while node.op == "call_function" and fusion.classify(node)[0] == "view" and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    return node


def _broadcast_role(group: Group, shape) -> str | None:
    """A recomputed node's role: its group's shape or one that broadcasts against it at the same
    rank, "full" (computed at every element); a reduction's row shape, "row"."""
    if tuple(shape) == tuple(group.shape):
        return "full"
    if group.kind == "reduction" and fusion.padded(shape, len(group.shape)) == fusion.row_shape(group):
        return "row"
    if group.kind in ("pointwise", "reduction") and len(shape) == len(group.shape) and \
            fusion.broadcasts_to(shape, group.shape):
        return "full"
    return None


def _stays_pointwise(group: Group) -> bool:
    """A kernel with a cat, a gather or a scatter: values read or written at computed places,
    which only the pointwise template does; its output is read by a reduction like any input."""
    return fusion.has_cat(group) or fusion.has_gather(group) or fusion.has_scatter(group)


def _placed_reads_from_memory(nodes) -> bool:
    """Would every cat among ``nodes`` (one kernel's, merged) still read its pieces from memory,
    every gather its source, and every index computed among them broadcast as the gather or
    scatter reads it (``fusion._gather_role``, ``fusion._scatter_role``)? (A cat's group merged
    with its pieces' producers, the pieces computed in registers and stored nowhere, made a runner
    that named a value never written. An embedding's backward, ``index_put_(zeros, [clamp(ids)],
    dy, True)`` with dy (T, D), merged with the kernel of ``clamp(ids)``: the (T,) index, computed
    in a (T, D) kernel, broadcast along D, and every token's gradient summed into one column.)"""
    members = set(nodes)
    for n in nodes:
        if fusion.is_cat(n) and any(piece in members for piece, _, _ in fusion.cat_pieces(n)):
            return False
        if fusion.is_gather(n):
            parts = fusion.gather_parts(n)
            if parts.source in members or (parts.trail and any(i in members for i in parts.indices)):
                return False
        if fusion.is_scatter(n):
            parts = fusion.scatter_parts(n)
            if parts.trail and any(i in members for i in parts.indices):
                return False
    return True


def _break_cycles(gm: fx.GraphModule, state: _State) -> None:
    """Dissolve groups (their nodes run as ATen) until the groups and the nodes outside them form
    an acyclic graph. Placement checks cycles node by node, but a group runs as one kernel: a node
    joining group A may depend on group B through B's *other* members, and B on A the same way (in
    Mixtral's backward, a softmax group and a routing-weight group each read what the other writes
    through index_put). Rare; each dissolved group leaves a refusal with the reason.

    The victim is the group whose dissolution leaves the fewest groups on cycles (the smallest
    among equals): a group a cycle merely passes through stays on it as separate nodes, so
    dissolving it only costs a kernel (Mixtral's backward lost its RoPE and residual kernels
    that way before the group that closed the cycle, a routing-weight kernel, was reached)."""
    while True:
        stuck = _cyclic_units(gm, state.group_of)
        groups = [u for u in stuck if isinstance(u, Group)]
        if not groups:
            return
        victim = _best_victim(gm, state.group_of, groups)
        others = ", ".join(g.name for g in groups if g is not victim)
        late = _after_outside_paths(victim, state.group_of)
        if 0 < len(late) < len(victim.nodes) and _splittable(victim, late):
            _split(state, victim, late, others)
            continue
        for n in victim.nodes:
            del state.group_of[n]
            state.eager[n] = f"its group {victim.name} would run in a cycle with {others} through ATen ops"
        state.refusals.append((victim.nodes[0].name, f"group {victim.name} dissolved: it would depend on itself "
                                                     f"through {others}"))
        state.groups.remove(victim)
        for i, g in enumerate(state.groups):
            g.gid = i


def _after_outside_paths(group: Group, group_of: dict) -> list:
    """The members that depend on another member through a path leaving the group (through an
    ATen op or another kernel): they must run in a later kernel than the members they depend on.
    Another group runs as one kernel: reaching any of its members reaches all of its results."""
    members = set(group.nodes)
    stack = [u for n in group.nodes for u in n.users if u not in members]
    seen, seen_groups, late = set(), set(), set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in members:
            late.add(n)
        other = group_of.get(n)
        if other is not None and other is not group and id(other) not in seen_groups:
            seen_groups.add(id(other))
            stack.extend(m for m in other.nodes if m not in seen)
        stack.extend(n.users)
    return [n for n in group.nodes if n in late]


def _splittable(group: Group, late: list) -> bool:
    """Whether ``late`` can leave ``group`` as a pointwise kernel of its own: any part of a
    pointwise group; of a row reduction, full-size pointwise members only (its reductions and
    per-row values stay, with everything they read)."""
    if any(fusion.is_scatter(n) for n in late):
        return False  # a scatter stays with the buffer its chain adds into
    if group.kind == "pointwise":
        return True
    return group.kind == "reduction" and all(group.roles[n] == "full" and not fusion.is_reduction(n) for n in late)


def _split(state: _State, group: Group, late: list, others: str) -> None:
    """A group on a cycle split in two: the members that depend on the group through outside
    paths move to a new pointwise group, which runs after the rest (``_splittable``). In
    EfficientNet's backward a squeeze-and-excitation gate's sigmoid and its gradient shared a
    kernel, with the gate's gradient computed in between from the sigmoid; in Mixtral's, a row
    kernel summed the routing weights' gradient and scaled the experts' gradient by the routing
    weights, which are computed from that sum. Both groups used to dissolve into ATen ops."""
    moved = set(late)
    after = Group(len(state.groups), "pointwise", group.shape)
    for n in late:
        after.nodes.append(n)
        after.roles[n] = group.roles[n]
        state.group_of[n] = after
    group.nodes = [n for n in group.nodes if n not in moved]
    group.roles = {n: r for n, r in group.roles.items() if n not in moved}
    state.groups.append(after)
    state.refusals.append((late[0].name, f"group {group.name} split in two: {after.name} depends on it through "
                                         f"{others}"))


def _best_victim(gm: fx.GraphModule, group_of: dict, groups: list) -> Group:
    """The group of ``groups`` (all on or between cycles) whose dissolution leaves the fewest
    groups on cycles; the smallest first, stopping at one that leaves none."""
    best = None
    for g in sorted(groups, key=lambda g: (len(g.nodes), g.gid)):
        without = {n: other for n, other in group_of.items() if other is not g}
        left = sum(1 for u in _cyclic_units(gm, without) if isinstance(u, Group))
        if best is None or left < best[0]:
            best = (left, g)
        if left == 0:
            break
    return best[1]


def _cyclic_units(gm: fx.GraphModule, group_of: dict) -> list:
    """Units (a Group, or a node outside any group) on a cycle, or between two cycles: what remains
    after peeling units without predecessors, then units without successors. Empty: acyclic."""
    groups = {id(g): g for g in group_of.values()}  # Group is a dataclass (unhashable): keyed by id
    unit = {n: (id(group_of[n]) if n in group_of else n) for n in gm.graph.nodes if n.op == "call_function"}
    preds: dict = {u: set() for u in unit.values()}
    succs: dict = {u: set() for u in unit.values()}
    for n, u in unit.items():
        for p in n.all_input_nodes:
            pu = unit.get(p)
            if pu is not None and pu != u:
                preds[u].add(pu)
                succs[pu].add(u)
    alive = set(preds)
    for edges in (preds, succs):
        counts = {u: len(edges[u]) for u in alive}
        ready = [u for u in alive if counts[u] == 0]
        other = succs if edges is preds else preds
        while ready:
            u = ready.pop()
            alive.discard(u)
            for v in other[u]:
                if v in alive:
                    counts[v] -= 1
                    if counts[v] == 0:
                        ready.append(v)
        for u in list(alive):  # recount against the survivors for the second peel
            preds[u] &= alive
            succs[u] &= alive
    return [groups.get(u, u) if isinstance(u, int) else u for u in alive]


def _finish(group: Group, group_of: dict) -> None:
    """Inputs, scalar inputs and outputs of a group, in a stable order."""
    members = set(group.nodes)
    for n in group.nodes:
        for p in n.all_input_nodes:
            if p in members:
                continue
            if fusion.is_constant(p):  # inlined; but its sizes may be symbolic (ones(batch, 7))
                for q in _constant_sizes(p):
                    if q not in group.scalars:
                        group.scalars.append(q)
                continue
            target = group.scalars if fusion.is_scalar(p) else group.inputs
            if p not in target:
                target.append(p)
        if any(u not in members for u in n.users):
            group.outputs.append(n)


def _constant_sizes(node) -> list:
    """The symbolic scalars a constant's shape is made from, through chains of constants: when
    ATen makes the constant (a group that fell back), they must be at hand."""
    out, todo, seen = [], [node], set()
    while todo:
        n = todo.pop()
        for p in n.all_input_nodes:
            if p in seen:
                continue
            seen.add(p)
            if fusion.is_scalar(p):
                out.append(p)
            elif fusion.is_constant(p):
                todo.append(p)
    return out


# ---------------------------------------------------------------------------------------------
# column reductions: private prologues

COLUMN_TAG, COLUMN_SHAPE = "kl_column", "kl_column_shape"
#: A private prologue may read at most this many full-size tensors; beyond that, reading the one
#: intermediate its producer writes costs fewer bytes than recomputing it.
MAX_PROLOGUE_INPUTS = 4


def private_column_prologues(gm: fx.GraphModule) -> None:
    """Tag every column reduction with a cluster (reductions of one full shape that read a common
    full-size tensor and do not depend on each other share a kernel: a layer norm's weight and bias
    gradients both read dy) and give each cluster its own copy of the pointwise chain that feeds
    it. The originals stay for their other users; copies nobody else reads are private to the
    cluster's kernel. Idempotent: a graph already tagged is left as it is.

    Reductions that share no input are clustered only when they sum small row results
    (``SMALL_COLUMNS``): one kernel for every norm-weight gradient
    of a model (GPT-2: 25 layer norms, 50 sums) reads all of them at once, holds every layer's dy
    alive until the last layer's is computed, and ran at 6 GB/s on the H200 (4.1 ms, against
    0.1 ms as separate kernels: `results/zoo_profile_gpt2_llama_train_memory_h200.txt`)."""
    nodes = list(gm.graph.nodes)
    if any(COLUMN_TAG in n.meta for n in nodes):
        return
    index = {n: i for i, n in enumerate(nodes)}
    clusters: list[dict] = []
    for r in nodes:
        if not fusion.is_column_reduction(r):
            continue
        shape = fusion.dims(r.args[0])
        chain, leaves = _prologue(r.args[0], shape)
        # a reduction that reads anything the cluster's kernel computes (a member, or a moved chain
        # whose value a matmul turns into this reduction's input) needs a kernel of its own
        cluster = next((c for c in clusters if c["shape"] == shape
                        and (c["leaves"] & leaves or _small_row_results(shape, c["leaves"] | leaves))
                        and not _reads_any(r, c["computed"], index)), None)
        if cluster is None:
            cluster = {"id": len(clusters), "shape": shape, "members": [], "computed": [], "copies": {},
                       "leaves": set()}
            clusters.append(cluster)
        cluster["members"].append(r)
        cluster["computed"].append(r)
        cluster["leaves"] |= leaves
        r.meta[COLUMN_TAG], r.meta[COLUMN_SHAPE] = cluster["id"], shape
        if chain is None:
            continue
        if _must_copy(chain, cluster, shape):
            _copy_into(gm, r, chain, cluster, index)
        else:  # only ATen ops (a matmul) or the graph's output read it too: compute it here, write it once
            for n in chain:
                n.meta.setdefault(COLUMN_TAG, cluster["id"])
                n.meta.setdefault(COLUMN_SHAPE, shape)
            cluster["computed"].extend(chain)
    if clusters:
        gm.graph.eliminate_dead_code()
        gm.recompile()


#: column reductions of row reductions' results, of at most this many elements, share a kernel
#: even without a common input: a batch norm's two per-channel sums over N of its (N, C) row sums
#: (one kernel instead of two). Unrelated full-size tensors (gradients) never do: see above.
SMALL_COLUMNS = 1 << 20


def _small_row_results(shape, leaves) -> bool:
    """Is every input a row reduction's result, and ``shape`` at most ``SMALL_COLUMNS`` elements?"""
    if not all(isinstance(s, int) for s in shape) or math.prod(shape) > SMALL_COLUMNS:
        return False
    return all(fusion.is_reduction(_through_views(n)) for n in leaves)


def _through_views(node):
    """The value a chain of views shows (a row sum viewed back to its keepdim shape)."""
    while isinstance(node, fx.Node) and node.op == "call_function" and fusion.classify(node)[0] == "view":
        node = node.args[0]
    return node if isinstance(node, fx.Node) and node.op == "call_function" else None


def _prologue(start, shape) -> tuple[list | None, set]:
    """The pointwise nodes (graph order unknown yet) that compute ``start`` from tensors of at most
    ``shape`` (None when there are none or when they read too many full-size tensors), and the
    full-size tensors the reduction reads through them (``start`` alone when there is no chain)."""
    chain, leaves, stack, seen = [], set(), [start], set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if fusion.is_constant(n) or fusion.is_scalar(n):
            continue
        if isinstance(n, fx.Node) and n.op == "call_function" and fusion.classify(n)[0] == "pointwise" \
                and not fusion.reads_at_computed_places(n) and fusion.broadcasts_to(fusion.dims(n), shape):
            chain.append(n)
            stack.extend(n.all_input_nodes)
        elif fusion.is_tensor_node(n) and fusion.dims(n) == tuple(shape):
            leaves.add(n)
    if not chain or len(leaves) > MAX_PROLOGUE_INPUTS:
        # the reduction reads ``start`` from memory: that is all it reads. (The leaves of a chain
        # refused here once counted too: through BERT's residual adds, every layer norm's
        # gradient chain reached earlier layers' tensors, and one 3 ms kernel on the H200 summed
        # nine unrelated bias and weight gradients.)
        return None, {start}
    return chain, leaves


def _must_copy(chain, cluster, shape) -> bool:
    """Is moving ``chain`` into the cluster's kernel wrong or wasteful? It is when a generated
    kernel outside reads one of its nodes (that kernel would then read a full-size value the column
    kernel writes), when another cluster took a node already, or when a node read outside is
    smaller than the full shape (the column kernel writes full-size values only)."""
    inside = set(chain) | set(cluster["members"])
    for n in chain:
        if COLUMN_TAG in n.meta and n.meta[COLUMN_TAG] != cluster["id"]:
            return True
        outside = [u for u in n.users if u not in inside]
        if outside and fusion.dims(n) != tuple(shape):
            return True
        if any(u.op == "call_function" and fusion.classify(u)[0] not in ("eager", "view") for u in outside):
            return True
    return False


def _copy_into(gm, reduction, chain, cluster, index) -> None:
    """Copies of ``chain`` (once per cluster) just before ``reduction``, which then reads them."""
    copies = cluster["copies"]
    with gm.graph.inserting_before(reduction):
        for n in sorted(chain, key=index.__getitem__):
            if n in copies:
                continue
            c = gm.graph.node_copy(n, lambda a: copies.get(a, a))
            c.meta[COLUMN_TAG], c.meta[COLUMN_SHAPE] = cluster["id"], cluster["shape"]
            copies[n] = c
    reduction.args = fx.node.map_arg(reduction.args, lambda a: copies.get(a, a))


def _reads_any(node, members, index) -> bool:
    """Does ``node`` (transitively) read any of ``members``?"""
    targets = set(members)
    lowest = min(index[m] for m in members)
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        if n in targets:
            return True
        if n in seen or index.get(n, len(index)) < lowest:
            continue
        seen.add(n)
        stack.extend(n.all_input_nodes)
    return False
