"""Graph rewrites before partitioning: ops the templates cannot generate, restated as ops they can.

``one_hot_indexing``: a gather or scatter of *one element per row along the last dim* (the
target logit of a cross-entropy and its gradient's ``-1`` at the target) is a comparison with the
column index, which a row kernel evaluates for free while the row is in registers:

    gather(x, -1, idx)            = sum(where(arange(N) == idx, x, 0), -1, keepdim=True)
    scatter(self, -1, idx, src)   = where(arange(N) == idx, src, self)

and a scatter of k <= 8 values a row (a top-k's backward) is k such wheres, one per index column.

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

import itertools
import math
import operator

import torch
import torch.fx as fx

from . import fusion, layout, ops_table

__all__ = ["Builder", "one_hot_indexing", "multiplications_by_one", "unsqueezed_repeats", "pads_as_cats", "slices_through_cats", "pointwise_into_copies", "permuted_trees_into_copies", "broadcast_cats_expanded", "fills_without_inputs", "casts_through_views", "cats_without_empties", "scatters_as_cats", "flips_as_gathers",
           "unsqueezes_toward_inputs", "extremes_without_indices", "full_reductions_as_rows",
           "aranges_as_constants", "index_puts_in_place", "scatter_sums_into_one_buffer", "half_precision_scatters_in_float32",
           "small_sums_as_adds", "reductions_of_one_element",
           "inputs_in_row_space", "trailing_reductions_as_rows",
           "conv_biases_as_adds", "clones_read_through_permutes", "negated_cat_pieces", "slices_through_products", "cats_of_products",
           "batch_norm_forwards_decomposed", "batch_norms_in_place", "cuda_clamps_without_nan_bounds", "gathers_before_casts",
           "batch_norm_backward_weights_contiguous",
           "truth_reductions_as_extremes", "common_subexpressions", "prologues_in_row_space",
           "middle_dims_kept_as_rows_then_columns", "batch_norm_statistics_as_rows_then_columns",
           "batch_norm_statistics_as_columns", "innermost_kept_sums_as_columns", "buffer_copies",
           "rewrite"]

aten = torch.ops.aten
prims = torch.ops.prims


def rewrite(gm: fx.GraphModule) -> int:
    """Every rewrite of this module, in order; how many nodes were rewritten."""
    return (common_subexpressions(gm) + unsqueezed_repeats(gm) + multiplications_by_one(gm) + cuda_clamps_without_nan_bounds(gm)
            + batch_norm_backward_weights_contiguous(gm) + batch_norms_in_place(gm)
            + fills_without_inputs(gm) + cats_without_empties(gm) + pads_as_cats(gm) + slices_through_cats(gm)
            + flips_as_gathers(gm)
            + scatters_as_cats(gm)
            + reductions_of_one_element(gm) + small_sums_as_adds(gm) + extremes_without_indices(gm) + truth_reductions_as_extremes(gm)
            + batch_norm_statistics_as_columns(gm) + batch_norm_statistics_as_rows_then_columns(gm)
            + full_reductions_as_rows(gm) + innermost_kept_sums_as_columns(gm) + middle_dims_kept_as_rows_then_columns(gm)
            + trailing_reductions_as_rows(gm) + prologues_in_row_space(gm) + aranges_as_constants(gm)
            + one_hot_indexing(gm) + casts_through_views(gm) + gathers_before_casts(gm)
            + unsqueezes_toward_inputs(gm) + index_puts_in_place(gm)
            + scatter_sums_into_one_buffer(gm) + half_precision_scatters_in_float32(gm) + inputs_in_row_space(gm) + conv_biases_as_adds(gm)
            + clones_read_through_permutes(gm)
            + slices_through_products(gm) + negated_cat_pieces(gm) + cats_of_products(gm) + broadcast_cats_expanded(gm)
            + casts_through_views(gm, squeezes=True) + permuted_trees_into_copies(gm) + pointwise_into_copies(gm))


def common_subexpressions(gm: fx.GraphModule) -> int:
    """Identical pure ops on the same operands -> one (torch's mutation-aware fx CSE, which
    aot_autograd runs on a training step's joint graph but not on an inference graph). A model
    that rebuilds the same value in every layer (Hugging Face's attention masks: T5's
    ``where(causal, position_bias, min)`` per layer, each from its own ``arange >= arange``) had
    every copy computed by one kernel at the first layer (they read the same inputs) and held until
    its layer: T5 inference at 16 x 512 tokens on the H200 wrote six identical (16, 12, 512, 512)
    masks, 0.6 GB, twice Inductor's peak. Random ops and outputs stay apart. Returns how many
    nodes were removed."""
    if not _repeats(gm.graph):
        return 0  # (and torch's CSE, whose import takes 1-2 s, is not loaded for nothing)
    from torch._functorch.compile_utils import fx_graph_cse

    before = len(gm.graph.nodes)
    graph = fx_graph_cse(gm.graph)
    removed = before - len(graph.nodes)
    if removed > 0:
        gm.graph = graph
        gm.recompile()
    return max(removed, 0)


def unsqueezed_repeats(gm: fx.GraphModule) -> int:
    """``op(unsqueeze(a, d), unsqueeze(b, d))`` where ``op(a, b)`` is computed already ->
    ``unsqueeze(op(a, b), d)``: the same values, a view instead of a second kernel. Cross-entropy
    with ``ignore_index`` computes its targets' clamp ``where(t != -100, t, 0)`` for the forward,
    then again on ``t.unsqueeze(1)`` for the backward (Hugging Face's causal-LM loss: a kernel of
    its own in every training step). Elementwise ops only, every tensor operand of the result's
    rank before the unsqueeze (a broadcast would change with it); single values pass as they are."""
    known = {}
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        found = _unsqueezed_repeat(node, known)
        if found is None:
            key = _op_key(node)
            if key is not None:
                known.setdefault(key, node)
            continue
        done, dim = found
        b = Builder(gm, node, fusion.value(node))
        view = b.op(aten.unsqueeze.default, done, dim)
        node.replace_all_uses_with(view)
        count += 1
    return _cleanup(gm, count)


def _op_key(node) -> tuple | None:
    try:
        key = (node.target, tuple(node.args), tuple(sorted(node.kwargs.items())))
        hash(key)
        return key
    except TypeError:  # a list among the arguments
        return None


def _unsqueezed_repeat(node, known: dict) -> tuple | None:
    """(the op computed already, the unsqueeze's dim) where ``node`` repeats it on unsqueezed
    operands, else None."""
    val = fusion.value(node)
    if fusion.target_name(node) not in ops_table.POINTWISE or not isinstance(val, torch.Tensor) or \
            any(isinstance(a, (list, tuple)) for a in node.args) or \
            any(isinstance(v, fx.Node) for v in node.kwargs.values()):
        return None
    dims, args = set(), []
    for a in node.args:
        if isinstance(a, fx.Node) and isinstance(fusion.value(a), torch.Tensor) and fusion.value(a).dim() > 0:
            if a.target is not aten.unsqueeze.default or fusion.value(a.args[0]).dim() != val.dim() - 1:
                return None
            dims.add(a.args[1] % val.dim())
            args.append(a.args[0])
        else:
            args.append(a)
    if len(dims) != 1:
        return None
    key = _op_key(node)
    done = known.get((node.target, tuple(args), key[2])) if key is not None else None
    if done is None:
        return None
    dim = dims.pop()
    have = fusion.value(done)
    if not (isinstance(have, torch.Tensor) and have.dtype == val.dtype and have.dim() == val.dim() - 1
            and tuple(have.unsqueeze(dim).shape) == tuple(val.shape)):
        return None
    return done, dim


def _repeats(graph: fx.Graph) -> bool:
    """Might two ops of ``graph`` be the same op on the same operands? (A cheap look first.)"""
    def key(a):
        return tuple(key(x) for x in a) if isinstance(a, (list, tuple)) else a

    seen = set()
    for n in graph.nodes:
        if n.op != "call_function":
            continue
        try:
            k = (n.target, key(n.args), tuple(sorted((name, key(v)) for name, v in n.kwargs.items())))
            if k in seen:
                return True
            seen.add(k)
        except TypeError:  # an operand that does not hash: let the CSE decide
            return True
    return False


#: ops whose second operand, a Python number equal to 1, leaves the first one's values unchanged
_BY_ONE = ("aten.mul.Scalar", "aten.mul.Tensor", "aten.div.Scalar", "aten.div.Tensor")


def multiplications_by_one(gm: fx.GraphModule) -> int:
    """``x * 1`` and ``x / 1`` -> ``x``: exact in IEEE arithmetic (NaN, infinities and the sign of
    zero pass unchanged; ``x + 0`` is not: -0 + 0 = +0). SDPA scales the scores by ``scale=1.0``
    where the model's weights absorb the scale (T5): a multiplication between a cast and a
    transpose, a kernel of its own writing the keys again in float32 before their product. Only
    where the result is ``x`` as it was (same dtype, shape and strides, so that every view of it
    stays valid) and is not an output of the graph (an output must not be its input)."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or fusion.target_name(node) not in _BY_ONE:
            continue
        x, other = (node.args + (None,))[:2]
        if not (isinstance(x, fx.Node) and type(other) in (int, float) and other == 1 and not node.kwargs):
            continue
        val, src = fusion.value(node), fusion.value(x)
        same = (isinstance(val, torch.Tensor) and isinstance(src, torch.Tensor) and val.dtype == src.dtype
                and val.shape == src.shape and val.stride() == src.stride())
        if same and all(user.op != "output" for user in node.users):
            node.replace_all_uses_with(x)
            count += 1
    return _cleanup(gm, count)


_CLAMPS = {aten.clamp.default: ("min", "max"), aten.clamp_min.default: ("min",), aten.clamp_max.default: ("max",)}


def cuda_clamps_without_nan_bounds(gm: fx.GraphModule) -> int:
    """A clamp's NaN *number* bound on a CUDA tensor becomes the infinity that bounds nothing
    (min -inf, max +inf), as CUDA eager ignores it: its kernel returns a NaN ``x`` as is and
    otherwise ``::max(x, lower)``, the device max, which returns the number of a pair with a NaN
    (``x.clamp(min=nan)`` is ``x`` on CUDA, all NaN on the CPU, where the generated code keeps
    the NaN, as it matches eager there). A tensor bound's NaN propagates on both devices
    (``maximum``) and is left alone."""
    count = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in _CLAMPS:
            continue
        val = fusion.value(node)
        if not (isinstance(val, torch.Tensor) and val.device.type == "cuda"):
            continue
        names = [a.name for a in node.target._schema.arguments]
        args, kwargs = list(node.args), dict(node.kwargs)
        for name in _CLAMPS[node.target]:
            i = names.index(name)
            held = kwargs if name in kwargs else args if i < len(args) else None
            key = name if held is kwargs else i
            if held is not None and isinstance(held[key], float) and held[key] != held[key]:
                held[key] = float("-inf") if name == "min" else float("inf")  # bounds nothing
                count += 1
        node.args, node.kwargs = tuple(args), kwargs
    return count


def batch_norm_backward_weights_contiguous(gm: fx.GraphModule) -> int:
    """ATen's ``native_batch_norm_backward`` kept whole (the CPU's default) reads a weight it is
    handed as a strided view (``w[:C]`` of a larger tensor, every other element) as if it were
    dense: the input's gradient takes the elements between (PyTorch 2.14's CPU kernel; eager gives
    NaN or garbage there too). Such a weight is copied dense first: C elements."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.native_batch_norm_backward.default:
            continue
        weight = node.args[2] if len(node.args) > 2 else None
        val = fusion.value(weight) if isinstance(weight, fx.Node) else None
        if not isinstance(val, torch.Tensor) or val.is_contiguous():
            continue
        dense = Builder(gm, node, val).op(aten.clone.default, weight, memory_format=torch.contiguous_format)
        node.replace_input_with(weight, dense)
        count += 1
    return count


#: the largest arange made a constant of the graph (elements): position ids, column indices
ARANGE_CONSTANT_MAX = 1 << 20


def aranges_as_constants(gm: fx.GraphModule) -> int:
    """``arange(start, end, step)`` of static numbers -> a buffer of the graph module, made once
    at compile time (position ids, a ``one_hot``'s columns): a launch per call less, as Inductor
    computes its aranges inside the kernels that read them. Only where nothing can write the buffer
    or hand it out: no reader is an output of the graph (the caller would get the buffer itself)
    nor an op that mutates or aliases its input; at most ``ARANGE_CONSTANT_MAX`` elements."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _ARANGES:
            continue
        val = fusion.value(node)
        numbers = [a for a in node.args if not isinstance(a, fx.Node)]
        if not (isinstance(val, torch.Tensor) and hasattr(val, "fake_mode") and len(numbers) == len(node.args)
                and all(isinstance(a, (int, float)) for a in numbers) and isinstance(val.shape[0], int)
                and 0 < val.numel() <= ARANGE_CONSTANT_MAX and all(_reads_only(u) for u in node.users)):
            continue
        b = Builder(gm, node, val)
        args, dtype = tuple(node.args), val.dtype
        name = f"_kl_arange_{'_'.join(str(a).replace('.', 'p').replace('-', 'm') for a in args)}_{str(dtype)[6:]}" \
               f"_{val.device.type}_{val.device.index}"
        start, step = (0, 1) if len(args) == 1 else (args[0], args[2] if len(args) > 2 else 1)
        made = b.constant(name, lambda: torch.arange(*args, dtype=dtype, device=val.device), arange=(start, step))
        node.replace_all_uses_with(made)
        count += 1
    return _cleanup(gm, count)


_ARANGES = (aten.arange.default, aten.arange.start, aten.arange.start_step)


def flips_as_gathers(gm: fx.GraphModule) -> int:
    """``flip(x, dims)`` that reverses one dim d of static size n > 1 (the others of size 1) ->
    ``index_select(x, d, arange(n - 1, -1, -1))``, the reversed positions a buffer of the graph
    module (made once, proved in [0, n) by ``bounds``): a gather, which the pointwise kernel
    reading the flip computes by loading x at the reversed positions, where ATen's flip was a copy
    kernel of its own before it (``x.flip(1) * 2``: one kernel, not two). A flip of several dims
    stays ATen's one kernel (a gather per dim would be a kernel per dim: a gather reads its source
    from memory); so does a symbolic size."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.flip.default:
            continue
        x, val = node.args[0], fusion.value(node)
        if not (isinstance(x, fx.Node) and isinstance(val, torch.Tensor) and hasattr(val, "fake_mode")
                and val.dim() > 0):
            continue
        flipped = {d % val.dim() for d in node.args[1]}
        if any(not isinstance(val.shape[d], int) for d in flipped):
            continue
        reversed_dims = [d for d in flipped if val.shape[d] > 1]
        if len(reversed_dims) != 1:
            continue
        (d,), n, device = reversed_dims, val.shape[reversed_dims[0]], val.device
        b = Builder(gm, node, val)
        positions = b.constant(f"_kl_reversed_{n}_{device.type}_{device.index}",
                               lambda: torch.arange(n - 1, -1, -1, device=device), arange=(n - 1, -1))
        node.replace_all_uses_with(b.op(aten.index_select.default, x, d, positions))
        count += 1
    return _cleanup(gm, count)


def _reads_only(user: fx.Node, depth: int = 0) -> bool:
    """``user`` reads its inputs without writing them (and is not the graph's output); a view of
    them counts when its own readers do (views of views: up to 8 deep)."""
    if user.op != "call_function" or depth > 8:
        return False
    schema = getattr(user.target, "_schema", None)
    if schema is None or any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return False
    if any(r.alias_info is not None for r in schema.returns):  # a view: its readers decide
        return bool(user.users) and all(_reads_only(u, depth + 1) for u in user.users)
    return True


#: reductions (over every dim here) -> the row reduction that replaces them
_FULL = {aten.sum.default: aten.sum.dim_IntList, aten.sum.dim_IntList: aten.sum.dim_IntList,
         aten.mean.default: aten.mean.dim, aten.mean.dim: aten.mean.dim,
         aten.amax.default: aten.amax.default, aten.amin.default: aten.amin.default,
         aten.max.default: aten.amax.default, aten.min.default: aten.amin.default}


def full_reductions_as_rows(gm: fx.GraphModule) -> int:
    """A reduction over every dim of a contiguous float tensor -> the same reduction over the last
    dim of its flat view (one row): ``loss.sum()``, ``losses.mean()``, a cross-entropy's sum of
    losses and count of targets. The row template then generates it with its prologue and
    epilogue (a cross-entropy forward: 5 kernels -> 3; ATen ran each as a kernel of its own).
    ``max()``/``min()`` propagate NaN as ``amax``/``amin`` do; an integer or bool sum keeps its
    int64 result (the count of valid targets). A dense tensor stored in another order (a
    channels-last activation) is first permuted into its memory order, a view with no copy: a
    reduction over every element does not depend on the order it visits them in (ATen's visits
    memory order too). Left alone: empty tensors (sum 0, mean NaN, max raises), integer means and
    extremes, inputs with gaps or overlaps (no flat view holds exactly their values), and (by the
    planner) rows longer than 65536, which ATen splits across blocks. Of a kernel's
    output of rank 2 or more the flat view is a kernel boundary: the reduction then runs as a
    generated kernel of its own, as ATen's did."""
    count, memo, recomputed = 0, {}, _recomputed_for_columns(gm)
    for node in list(gm.graph.nodes):
        row_op = _FULL.get(getattr(node, "target", None)) if node.op == "call_function" else None
        if row_op is None or not _over_every_dim(node):
            continue
        src, val = fusion.value(node.args[0]), fusion.value(node)
        if not isinstance(src, torch.Tensor) or (node.target is row_op and src.dim() == 1 and _dims(node)):
            continue  # (a named dim of a 1-D tensor: already a row reduction)
        if not (hasattr(src, "fake_mode")
                and (src.is_floating_point() or row_op is aten.sum.dim_IntList)
                and all(isinstance(s, int) for s in src.shape) and src.numel() > 0):
            continue
        order = _memory_order(src)
        if order is None:
            continue
        b = Builder(gm, node, val)
        flat = node.args[0]
        if order != list(range(src.dim())):
            try:  # a pointwise chain is recomputed on permuted operands: it stays the row kernel's prologue
                flat = _permuted(b, flat, order, recomputed, memo)
            except ValueError:  # an operand of higher rank: permute the value itself
                flat = b.op(aten.permute.default, flat, order)
        if src.dim() != 1:
            flat = b.op(aten.view.default, flat, [src.numel()])
        extra = {"dtype": node.kwargs["dtype"]} if node.kwargs.get("dtype") is not None else {}
        new = b.op(row_op, flat, [-1], False, **extra)
        if tuple(val.shape) != ():  # keepdim: ones in every dim
            new = b.op(aten.view.default, new, list(val.shape))
        node.replace_all_uses_with(new)
        count += 1
    return _cleanup(gm, count)


def _memory_order(t) -> list | None:
    """The permutation of ``t``'s dims that makes it contiguous (``layout.memory_order``), or None
    where none does (gaps, overlaps, a slice)."""
    if t.is_contiguous():
        return list(range(t.dim()))
    order = layout.memory_order(t)
    return order if t.permute(order).is_contiguous() else None


def conv_biases_as_adds(gm: fx.GraphModule) -> int:
    """``convolution(x, w, b, ...)`` -> ``convolution(x, w, None, ...) + b.view(1, C, 1, ...)``: ATen
    adds a convolution's bias in a kernel of its own after most of its algorithms (the 1x1
    convolutions run as GEMMs, the depthwise ones; ``count`` predicts an "add bias" kernel for
    them), where as an add it joins the generated kernel of what follows (ConvNeXt's 1x1 MLP: the
    GELU, the layer scale and the residual add). A reader that is a permute (ConvNeXt's depthwise
    convolution, read channels-last by its layer norm: ``x.permute(0, 2, 3, 1)``) gets the add after
    it, ``permute(conv) + b.view(1, 1, 1, C)``, the same values, so that the bias joins the layer
    norm's kernel as its prologue. Only where every reader is such a kernel, a permute read only by
    such kernels, or the graph's output (else the add would be one more kernel). The backward
    graph is traced already: its ``convolution_backward`` still computes the bias gradient."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.convolution.default or len(node.args) < 9:
            continue
        bias = node.args[2]
        val = fusion.value(node)
        if not (isinstance(bias, fx.Node) and isinstance(val, torch.Tensor) and hasattr(val, "fake_mode")
                and val.dim() >= 3 and fusion.value(bias).dtype == val.dtype and _bias_may_move(node)):
            continue
        b = Builder(gm, node, val)
        try:
            conv = b.op(aten.convolution.default, node.args[0], node.args[1], None, *node.args[3:])
            replaced = [(u, _bias_added(b, conv, bias, val, u)) for u in list(node.users) if _is_permute_of(u, node)]
            if len(replaced) < len(node.users):  # readers of the convolution itself
                replaced.append((node, _bias_added(b, conv, bias, val, None)))
        except Exception:  # noqa: BLE001 - shapes this restatement does not cover: leave it
            b.undo()
            continue
        for old, new in replaced:
            old.replace_all_uses_with(new)
        count += 1
    return _cleanup(gm, count)


def _bias_added(b: "Builder", conv: fx.Node, bias: fx.Node, val, permute: fx.Node | None) -> fx.Node:
    """``conv + bias`` with the bias along the channel dim (1), or ``permute(conv) + bias`` with the
    bias where ``permute`` moves the channel dim."""
    shape = [1] * val.dim()
    if permute is None:
        shape[1] = val.shape[1]
        return b.op(aten.add.Tensor, conv, b.op(aten.view.default, bias, shape))
    dims = [d % val.dim() for d in permute.args[1]]
    shape[dims.index(1)] = val.shape[1]
    return b.op(aten.add.Tensor, b.op(aten.permute.default, conv, dims), b.op(aten.view.default, bias, shape))


def _is_permute_of(node: fx.Node, source: fx.Node) -> bool:
    return node.op == "call_function" and node.target is aten.permute.default and node.args[0] is source


def _bias_may_move(conv: fx.Node) -> bool:
    """Every reader of the convolution is a generated kernel or the graph's output, or a permute
    whose readers all are: the bias as an add then joins kernels that run anyway."""
    direct = [u for u in conv.users if not _is_permute_of(u, conv)]
    permutes = [u for u in conv.users if _is_permute_of(u, conv)]
    if direct and not _read_by_kernels(conv, ignore=permutes):
        return False
    return bool(conv.users) and all(_read_by_kernels(p) for p in permutes)


def clones_read_through_permutes(gm: fx.GraphModule) -> int:
    """``clone(x)`` read only by permutes that only generated kernels read -> ``x``: the clone
    made a kernel of its own that copied x (an (N, H, W, C) activation) for nothing, since the
    permute after it is a view that moves values and a kernel's input is not fused through it.
    Without it the kernels read x through the permute, by strides (any strides do: a permute
    needs no particular layout, where a flattening view after a clone might). Seen on the H100:
    ConvNeXt's ``fc2`` output cloned before ``permute(0, 3, 1, 2)``, the layer scale and the
    residual add, 18 copies of the block's activation a step in inference, 37 in training (the
    backward recomputes the clone). Not where the clone or a permute of it is the graph's output
    (the caller, or the backward, gets a tensor of its own)."""
    count = 0
    for node in list(gm.graph.nodes):
        if not (node.op == "call_function" and node.target is aten.clone.default and node.users
                and isinstance(node.args[0], fx.Node)):
            continue
        if all(_is_permute_of(u, node) and _kernels_read_through_permutes(u) for u in node.users):
            node.replace_all_uses_with(node.args[0])
            _permutes_restrided(node.args[0])
            count += 1
    return _cleanup(gm, count)


def _permutes_restrided(source: fx.Node) -> None:
    """The fake values of the permutes that read ``source`` (and of permutes of them) recomputed:
    with the clone gone they view its input, whose strides may differ from the clone's."""
    val = fusion.value(source)
    if not (isinstance(val, torch.Tensor) and hasattr(val, "fake_mode")):
        return
    for u in source.users:
        if _is_permute_of(u, source):
            with val.fake_mode:
                u.meta["val"] = aten.permute.default(val, u.args[1])
            _permutes_restrided(u)


def _kernels_read_through_permutes(node: fx.Node) -> bool:
    """Every reader of ``node`` is an op a generated kernel computes, or a permute whose readers
    are such ops or permutes in turn (a backward reads a permuted value permuted back); none is
    the graph's output."""
    for u in node.users:
        if _is_permute_of(u, node):
            if not _kernels_read_through_permutes(u):
                return False
        elif not (u.op == "call_function" and fusion.classify(u)[0] in ("pointwise", "reduction")):
            return False
    return bool(node.users)


def slices_through_products(gm: fx.GraphModule) -> int:
    """``slice(a * b, d, s, e)`` -> ``slice(a, d, s, e) * slice(b, d, s, e)`` where every reader of
    the product is such a slice (an operand of size 1 along d is left whole): the product is no
    longer a kernel's output that the slices read back from memory. With ``cats_of_products`` this
    makes RoPE's backward (``cat([(g * sin)[..., h:], (g * sin)[..., :h]])``) one kernel that reads
    g and sin, where a kernel of its own wrote g * sin for the cat's pieces."""
    count = 0
    for node in list(gm.graph.nodes):
        if not (node.op == "call_function" and node.target is aten.mul.Tensor and node.users
                and all(u.op == "call_function" and u.target is aten.slice.Tensor and u.args[0] is node
                        for u in node.users)):
            continue
        val = fusion.value(node)
        if not (isinstance(val, torch.Tensor) and hasattr(val, "fake_mode") and fusion.static_shape(val)):
            continue
        for sl in list(node.users):
            new = _sliced_product(gm, node, sl, val)
            if new is not None:
                sl.replace_all_uses_with(new)
                count += 1
    return _cleanup(gm, count)


def _sliced_product(gm, product: fx.Node, sl: fx.Node, val) -> fx.Node | None:
    """The product of ``product``'s operands each sliced as ``sl`` slices the product, or None."""
    dim = sl.args[1] if len(sl.args) > 1 else 0
    dim = dim % val.dim()
    rest = list(sl.args[2:])
    if len(rest) > 2 and rest[2] != 1:  # a step: not covered
        return None
    b = Builder(gm, sl, fusion.value(sl))
    operands = []
    try:
        for a in product.args[:2]:
            av = fusion.value(a) if isinstance(a, fx.Node) else None
            if not isinstance(av, torch.Tensor):
                operands.append(a)
                continue
            d = dim - (val.dim() - av.dim())  # broadcasting aligns dims from the right
            if d < 0 or av.shape[d] == 1:
                operands.append(a)
            elif av.shape[d] == val.shape[dim]:
                operands.append(b.op(aten.slice.Tensor, a, d, *rest))
            else:
                return None
        return b.op(aten.mul.Tensor, *operands)
    except Exception:  # noqa: BLE001 - shapes this restatement does not cover: leave it
        return None


def cats_of_products(gm: fx.GraphModule) -> int:
    """``cat([a1 * b1, a2 * b2, ...], d) * s`` -> ``cat([a1, a2, ...], d) * cat([b1, b2, ...], d) * s``
    where every piece is a product read by the cat alone and each operand position has the piece's
    size along d (other dims may broadcast, alike in every piece): the cat's pieces are then read
    from the operands (inputs, or values written anyway) instead of from products a kernel of their
    own wrote. See ``slices_through_products``."""
    count = 0
    for node in list(gm.graph.nodes):
        if not (node.op == "call_function" and fusion.is_cat(node)):
            continue
        pieces = list(node.args[0])
        if len(pieces) < 2 or not all(isinstance(p, fx.Node) and p.op == "call_function" and p.target is aten.mul.Tensor
                                      and len(p.users) == 1 and len(p.args) == 2 and not p.kwargs for p in pieces):
            continue
        dim = fusion.cat_dim(node)
        columns = _catable_operands(pieces, dim, fusion.value(node).dim())
        if columns is None:
            continue
        b = Builder(gm, node, fusion.value(node))
        try:
            cats = [b.op(aten.cat.default, list(col), dim) for col in columns]
            new = b.op(aten.mul.Tensor, *cats)
        except Exception:  # noqa: BLE001 - shapes this restatement does not cover: leave it
            continue
        node.replace_all_uses_with(new)
        count += 1
    return _cleanup(gm, count)


def _catable_operands(pieces, dim: int, rank: int) -> list | None:
    """Per operand position, the pieces' operands, when each is a tensor of the cat's rank with its
    piece's size along ``dim`` and the same sizes as the other pieces' in every other dim."""
    columns = []
    for position in (0, 1):
        col = [p.args[position] for p in pieces]
        vals = [fusion.value(a) if isinstance(a, fx.Node) else None for a in col]
        if not all(isinstance(v, torch.Tensor) and v.dim() == rank and fusion.static_shape(v) for v in vals):
            return None
        if any(v.shape[dim] != fusion.value(p).shape[dim] for v, p in zip(vals, pieces)):
            return None
        others = {tuple(s for i, s in enumerate(v.shape) if i != dim) for v in vals}
        if len(others) != 1 or len({v.dtype for v in vals}) != 1:
            return None
        columns.append(col)
    return columns


def negated_cat_pieces(gm: fx.GraphModule) -> int:
    """``cat([neg(a), b], d)`` -> ``cat([a, b], d) * sign``, ``sign`` a graph constant of -1 over
    the negated pieces' range of dim d and 1 elsewhere (size 1 in every other dim). A cat reads
    its pieces from memory, so the negation was a kernel of its own that wrote its piece: RoPE's
    ``rotate_half`` (``cat([-x2, x1])``), a ``neg`` kernel for q and for k in every layer, forward
    and backward. Only where the cat is the negation's one reader."""
    count = 0
    for node in list(gm.graph.nodes):
        if not (node.op == "call_function" and fusion.is_cat(node)):
            continue
        pieces = list(node.args[0])
        negated = [isinstance(p, fx.Node) and p.op == "call_function" and p.target is aten.neg.default
                   and len(p.users) == 1 for p in pieces]
        val = fusion.value(node)
        if not any(negated) or not (isinstance(val, torch.Tensor) and hasattr(val, "fake_mode")
                                    and fusion.static_shape(val) and val.dtype.is_floating_point):
            continue
        dim = fusion.cat_dim(node)
        signs = []
        for p, neg in zip(pieces, negated):
            signs += [-1.0 if neg else 1.0] * int(fusion.value(p).shape[dim])
        shape = [1] * val.dim()
        shape[dim] = len(signs)
        b = Builder(gm, node, val)
        runs = "_".join(f"{'n' if neg else 'p'}{int(fusion.value(p).shape[dim])}" for p, neg in zip(pieces, negated))
        name = f"_kl_signs_{runs}_d{dim}_r{val.dim()}_{str(val.dtype)[6:]}_{val.device.type}"  # exact: one per pattern
        sign = b.constant(name, lambda: torch.tensor(signs, dtype=val.dtype, device=val.device).view(shape))
        kept = [p.args[0] if neg else p for p, neg in zip(pieces, negated)]
        try:
            new = b.op(aten.mul.Tensor, b.op(aten.cat.default, kept, *node.args[1:], **node.kwargs), sign)
        except Exception:  # noqa: BLE001 - pieces this restatement does not cover: leave it
            continue
        node.replace_all_uses_with(new)
        count += 1
    return _cleanup(gm, count)


def broadcast_cats_expanded(gm: fx.GraphModule) -> int:
    """``op(x, cat(pieces))`` where the cat broadcasts against ``x`` (size 1 in dims where the op's
    result is bigger) -> ``op(x, cat(expand(piece) ...))``, one expanded cat per such reader. A
    kernel joins only values of its own shape, so the small cat was a kernel of its own: RoPE's
    backward rotates ``sin`` (1, 1, S, D) by a cat of its halves before multiplying the (B, H, S, D)
    gradient by it, for q and for k in every layer (Llama). Expanded, the cat reads its pieces with
    stride 0 in the reader's kernel, as the full-size cat of the gradient's halves beside it."""
    count = 0
    for node in list(gm.graph.nodes):
        if not (node.op == "call_function" and fusion.is_cat(node) and fusion.static_shape(fusion.value(node))):
            continue
        for user in list(node.users):
            shape = _broadcast_into(node, user)
            if shape is None:
                continue
            dim = fusion.cat_dim(node)
            b = Builder(gm, user, fusion.value(user))
            try:
                pieces = [b.op(aten.expand.default, p, [fusion.value(p).shape[d] if d == dim else size
                                                       for d, size in enumerate(shape)]) for p in node.args[0]]
                expanded = b.op(aten.cat.default, pieces, dim)
            except Exception:  # noqa: BLE001 - pieces this restatement does not cover: leave it
                b.undo()
                continue
            user.replace_input_with(node, expanded)
            count += 1
    return _cleanup(gm, count)


def _broadcast_into(cat: fx.Node, user: fx.Node) -> list | None:
    """The shape ``cat`` takes in ``user`` where the user is an elementwise op whose result is
    bigger than the cat only in the cat's dims of size 1 (not its cat dim); else None."""
    val, out = fusion.value(cat), fusion.value(user)
    if (user.op != "call_function" or fusion.classify(user)[0] != "pointwise" or not isinstance(out, torch.Tensor)
            or out.dim() != val.dim() or not fusion.static_shape(out) or tuple(out.shape) == tuple(val.shape)):
        return None
    dim = fusion.cat_dim(cat)
    if out.shape[dim] != val.shape[dim] or any(v not in (1, o) for v, o in zip(val.shape, out.shape)):
        return None
    return list(out.shape)


def _read_by_kernels(node, ignore=()) -> bool:
    """Every reader of ``node`` (but those in ``ignore``) is an op a generated kernel computes (the
    add would join it) or the graph's output (a value saved for the backward): no view that moves
    values, no ATen op."""
    users = [u for u in node.users if u not in ignore]
    kernels = [u for u in users if u.op == "call_function" and fusion.classify(u)[0] in ("pointwise", "reduction")]
    return bool(kernels) and all(u in kernels or u.op == "output" for u in users)


#: reductions over the trailing dims restated over one flat last dim (``trailing_reductions_as_rows``)
_TRAILING = (aten.sum.dim_IntList, aten.mean.dim)


def middle_dims_kept_as_rows_then_columns(gm: fx.GraphModule) -> int:
    """``sum``/``mean`` over leading and trailing dims that keeps the dims between (a batch norm's
    per-channel sums of an NCHW tensor: over (0, 2, 3)) -> the same reduction over the trailing
    dims (rows: N * C of H * W, contiguous) and then over the leading ones (a column reduction of
    the (N, C) result). No template took the one reduction: ATen ran it, and the pointwise chain
    feeding it (a ReLU's backward, ``dy * (x - mean)``) was a kernel writing the whole tensor for
    it; split, the chain is the row kernel's prologue (``prologues_in_row_space``) and two sums of
    the same chain share that kernel. Only for a chain computed here (for a plain tensor ATen's one
    reduction is as good and one launch fewer), static shapes, contiguous trailing dims; the mean
    of equal-sized rows' means is the mean."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _TRAILING or not _pointwise_source(node.args[0]):
            continue
        src, val = fusion.value(node.args[0]), fusion.value(node)
        rank = src.dim()
        reduced = sorted({d % rank for d in _dims(node)}) if rank else []
        n_lead = next(i for i, d in enumerate(reduced + [None]) if d != i)  # reduced = 0, 1, .., n_lead - 1, ...
        lead, trail = reduced[:n_lead], reduced[n_lead:]
        if not lead or not trail or trail != list(range(rank - len(trail), rank)) or len(reduced) == rank:
            continue
        if src.dtype not in (torch.float32, torch.float16, torch.bfloat16) or \
                (len(trail) > 1 and _trailing_rows(node.args[0], trail) is None):
            continue
        keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        dtype = node.kwargs.get("dtype")
        # a half-precision sum's rows stay float32 until the end: one rounding, as ATen's one reduction
        inner = dtype or (torch.float32 if src.dtype != torch.float32 else None)
        b = Builder(gm, node, val)
        try:
            rows = b.op(node.target, node.args[0], trail, False, **({"dtype": inner} if inner else {}))
            new = b.op(node.target, rows, lead, False)
            if new.meta["val"].dtype != val.dtype:
                new = b.op(prims.convert_element_type.default, new, val.dtype)
            if keepdim:
                new = b.op(aten.view.default, new, list(val.shape))
        except Exception:  # noqa: BLE001 - a value the reductions do not take: left as it was
            continue
        node.replace_all_uses_with(new)
        count += 1
    return _cleanup(gm, count)


_VARIANCES = (prims.var.default, aten.var.correction)


def batch_norm_statistics_as_rows_then_columns(gm: fx.GraphModule) -> int:
    """A variance over leading and trailing dims that keeps one dim between (training batch norm's
    per-channel statistics of an (N, C, H, W) tensor: over (0, 2, 3)), and the sum beside it over
    the same dims -> one row kernel and one column kernel:

    * rows (N * C rows of L = H * W values, contiguous): each row's mean ``m`` and variance ``v``
      (the row template's two-pass variance: the row's mean, then its squared deviations);
    * columns (the (N, C) results summed over N, with the first sample's means ``s = m[0]`` as
      each channel's shift): ``S1 = sum(m - s)``, ``S2 = sum((m - s)^2)``, ``Q = sum(v) * L``;
      the mean is ``s + S1 / N`` and the sum of squared deviations from it
      ``Q + L * (S2 - S1^2 / N)`` (Chan's parallel combination of the rows' (mean, M2): the
      within-row part plus the spread of the row means around the channel's mean).

    Shifting by a sample mean keeps ``S2 - S1^2 / N`` from cancelling (a channel whose values sit
    at 1000 +- 1 loses no digits, where ``E[x^2] - mean^2`` in float32 would lose all of them);
    the rows' two-pass variance has no cancellation. ATen's kernel (Welford) reads the tensor at
    a fraction of the memory bandwidth (one block per channel: 4.1 ms of ResNet-50's step on the
    H200, ``benchmarks/NOTES_compiler.md`` stop 23); rows read it at full bandwidth. Only static
    shapes, one kept dim, contiguous trailing dims."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _VARIANCES:
            continue
        split = _channel_split(node)
        if split is None:
            continue
        count += _statistics_in_rows(gm, node, *split)
    return _cleanup(gm, count)


def batch_norm_statistics_as_columns(gm: fx.GraphModule) -> int:
    """The same variance (and the sum beside it) of a tensor whose kept dim is the innermost in
    memory (a channels-last activation, ``conv_layout.py``: (N, C, H, W) stored as N, H, W, C)
    -> one column kernel: the tensor is read as its memory lays it out, M = N * H * W rows of C
    columns (a permuted view: no copy), and each channel's variance and sum are column reductions
    of that view (``columns.py``), one kernel. Both in one pass over the tensor, where ATen's
    channels-last norm reads it for its statistics and again for the output: the output's
    ``(x - mean) * rstd`` joins the kernel after it (the ReLU, the residual add), and the
    running statistics the column kernel's per-column epilogue.

    The column template accumulates a variance as Welford's algorithm does, lanes and row splits
    merged by Chan's formula: no digit cancels wherever a channel's values sit (1000 +- 1) or
    however its first value lies (stops 37-38 shifted by it: a sparse channel whose first value is
    one of its few nonzeros came out 1e-3 off float64 at 32768 values, eager 5e-8).
    Only static shapes and float32/float64."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _VARIANCES:
            continue
        perm = _innermost_kept(node)
        if perm is not None:
            count += _statistics_in_columns(gm, node, perm)
    return _cleanup(gm, count)


def _innermost_kept(node, dtypes=(torch.float32, torch.float64)) -> list | None:
    """The permutation that moves the one dim reduction ``node`` keeps to the end, where that dim
    is the innermost in memory and the permuted view is contiguous (a channels-last tensor's
    channels); else None."""
    src = fusion.value(node.args[0])
    if not (isinstance(src, torch.Tensor) and src.dtype in dtypes
            and fusion.static_shape(src) and src.numel() > 0 and src.dim() >= 3):
        return None
    rank = src.dim()
    kept = sorted(set(range(rank)) - {d % rank for d in _dims(node)})
    if len(kept) != 1 or kept[0] == rank - 1 or src.shape[kept[0]] == 1:
        return None
    perm = [d for d in range(rank) if d != kept[0]] + kept
    return perm if src.permute(perm).is_contiguous() else None


def _sums_beside(var_node) -> list:
    """The sums of the variance's input over its dims, of its dtype, without keepdim: a mean's
    numerator, restated from the same statistics."""
    x = var_node.args[0]
    rank, dtype = fusion.value(x).dim(), fusion.value(var_node).dtype
    dims = sorted(d % rank for d in _dims(var_node))
    return [u for u in x.users if u.op == "call_function" and u.target in (prims.sum.default, aten.sum.dim_IntList)
            and sorted(d % rank for d in _dims(u)) == dims and not fusion.bound_args(u).get("keepdim")
            and fusion.value(u).dtype == dtype]


def _statistics_in_columns(gm, var_node, perm: list) -> int:
    correction = _correction(var_node)
    if correction is None:
        return 0
    x = var_node.args[0]
    src, val = fusion.value(x), fusion.value(var_node)
    sums = _sums_beside(var_node)
    channels = src.shape[perm[-1]]
    rows = src.numel() // channels
    if rows - correction <= 0:
        return 0
    b = Builder(gm, _first_of(gm, [var_node, *sums]), val)
    try:
        # memory order, (N, H, W, C); a cast before it (a float16 norm's) recomputed on the view
        matrix = _permuted(b, x, perm, _recomputed_for_columns(gm), {})
        lead = list(range(len(perm) - 1))
        new_var = b.op(aten.var.correction, matrix, lead, correction=correction)
        # every sum beside the variance is the same per-channel sum: one node stands for them all
        new_sum = b.op(aten.sum.dim_IntList, matrix, lead) if sums else None
        new_sums = [new_sum] * len(sums)
        if any(fusion.value(n).shape != val.shape for n in [new_var, *new_sums]):
            raise ValueError("the statistics' shape differs")
    except Exception:  # noqa: BLE001 - a value the ops do not take: left as it was
        b.undo()
        return 0
    return _statistics_replaced(var_node, new_var, sums, new_sums)


def innermost_kept_sums_as_columns(gm: fx.GraphModule) -> int:
    """``sum``/``mean`` over every dim but one, where the kept dim is the innermost in memory (a
    batch norm's backward over a channels-last activation: ``sum(dy, (0, 2, 3))`` and
    ``sum(dy * (x - mean), (0, 2, 3))``) -> the same reduction over the leading dims of a
    permuted view with the kept dim last (memory order: no copy), a column reduction
    (``columns.py``). A pointwise chain feeding it (the ReLU's backward, ``dy * (x - mean)``) is
    recomputed on its operands' permuted views, so it is the column kernel's prologue and two sums
    of one chain share that kernel; no template took the reduction as it was, and ATen ran it
    beside a kernel writing the whole chain for it. Static shapes, float sums."""
    count, memo = 0, {}  # (node, perm) -> its permuted node, shared: a chain two sums read is made once
    recomputed = _recomputed_for_columns(gm)
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _TRAILING:
            continue
        perm = _innermost_kept(node, (torch.float32, torch.float16, torch.bfloat16))
        if perm is None:
            continue
        val = fusion.value(node)
        keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        extra = {"dtype": node.kwargs["dtype"]} if node.kwargs.get("dtype") is not None else {}
        b = Builder(gm, node, val)
        try:
            moved = _permuted(b, node.args[0], perm, recomputed, memo)
            new = b.op(node.target, moved, list(range(len(perm) - 1)), False, **extra)
            if keepdim:
                new = b.op(aten.view.default, new, list(val.shape))
            if fusion.value(new).shape != val.shape or fusion.value(new).dtype != val.dtype:
                raise ValueError("the reduction's value differs")
        except Exception:  # noqa: BLE001 - a value the ops do not take: left as it was
            b.undo()
            memo.clear()  # (it may hold nodes just undone)
            continue
        node.replace_all_uses_with(new)
        count += 1
    return _cleanup(gm, count)


def _recomputable(node) -> bool:
    """A pointwise op ``innermost_kept_sums_as_columns`` recomputes on permuted operands (whatever
    else reads it: the original stays for them)."""
    return (_pointwise_source(node) and not any(isinstance(a, (list, tuple)) for a in node.args)
            and not any(isinstance(v, fx.Node) for v in node.kwargs.values()))


def _recomputed_for_columns(gm: fx.GraphModule):
    """``node -> bool``: a pointwise op a column reduction recomputes on permuted operands rather
    than reads, namely one whose value is not in memory anyway. A value stored anyway is read as
    it is (a permuted view): a ResNet stage's output gradient is ``where(mask, 0, g + where(mask',
    0, g' + ...))`` through every block of the stage, each block's term stored (it is added to the
    convolution's input gradient, which comes after it); recomputed, a norm's sums would read the
    operands of every block before it (and past four, none: they then read a permuted copy
    written just for them)."""
    position, stored = {n: i for i, n in enumerate(gm.graph.nodes)}, {}

    def recomputed(node) -> bool:  # (a node made since is no value of the graph as traced)
        if not _recomputable(node) or node not in position:
            return _recomputable(node)
        if node not in stored:
            stored[node] = _stored_anyway(node, position)
        return not stored[node]

    return recomputed


def _stored_anyway(node, position: dict) -> bool:
    """Is ``node`` in memory whatever the column reductions do: read by the graph's output or an
    ATen op (through views), or by a pointwise op that also reads an ATen op's result computed
    from ``node`` (no kernel spans the ATen op: ``node`` is written before it)? Sums, means and
    reductions over every element do not count (these rewrites may restate them as column or row
    reductions)."""
    for user in node.users:
        if user.op == "output":
            return True
        if user.op != "call_function" or user.target in _TRAILING or user.target in _VARIANCES or user.target in _FULL:
            continue
        kind = fusion.classify(user)[0]
        if kind == "eager" or (kind == "view" and _stored_anyway(user, position)):
            return True
        others = [a for a in user.all_input_nodes if a is not node]
        if kind == "pointwise" and any(_aten_result_of(a, node, position) for a in others):
            return True
    return False


def _aten_result_of(value, node, position: dict) -> bool:
    """Is ``value`` (through views and getitems) an ATen op's result that depends on ``node``?"""
    while value.op == "call_function" and (fusion.classify(value)[0] == "view" or value.target is operator.getitem):
        value = value.args[0]
    if value.op != "call_function" or fusion.classify(value)[0] != "eager":
        return False
    # backwards from the ATen op, no further up than ``node`` (the graph is in order; nodes made
    # by these rewrites have no position and are not walked: then it says no, and the column
    # kernel recomputes, as before)
    lowest, stack, seen = position.get(node, 0), [value], set()
    while stack:
        n = stack.pop()
        if n is node:
            return True
        if n in seen or position.get(n, -1) < lowest:
            continue
        seen.add(n)
        stack.extend(n.all_input_nodes)
    return False


def _channel_split(node) -> tuple | None:
    """(lead dims, flat row shape) for a float reduction over leading dims 0..a-1 and the trailing
    dims after one kept dim, the trailing block contiguous; else None."""
    src = fusion.value(node.args[0])
    if not (isinstance(src, torch.Tensor) and src.dtype in (torch.float32, torch.float64)
            and fusion.static_shape(src) and src.numel() > 0 and src.dim() >= 3):
        return None
    rank = src.dim()
    reduced = sorted({d % rank for d in _dims(node)})
    n_lead = next(i for i, d in enumerate(reduced + [None]) if d != i)
    lead, trail = reduced[:n_lead], reduced[n_lead:]
    if not lead or trail != list(range(n_lead + 1, rank)):
        return None  # exactly one kept dim, between the leading and the trailing ones
    if len(trail) == 1:
        return lead, list(src.shape)
    flat = _trailing_rows(node.args[0], trail)
    return (lead, flat) if flat is not None else None


def _correction(node) -> float | None:
    args = fusion.bound_args(node)
    if node.target is prims.var.default:
        return float(args["correction"])
    if args.get("keepdim"):
        return None
    c = args.get("correction")
    return 1.0 if c is None else float(c)


def _statistics_in_rows(gm, var_node, lead: list, flat: list) -> int:
    correction = _correction(var_node)
    if correction is None:
        return 0
    x = var_node.args[0]
    src, val = fusion.value(x), fusion.value(var_node)
    sums = _sums_beside(var_node)
    n_rows = math.prod(src.shape[d] for d in lead)
    length = flat[-1]
    count = n_rows * length
    b = Builder(gm, _first_of(gm, [var_node, *sums]), val)
    try:
        rows = b.op(aten.view.default, x, flat) if list(src.shape) != flat else x
        row_var = b.op(prims.var.default, rows, [len(flat) - 1], 0.0)  # (lead..., C)
        row_mean = b.op(aten.mean.dim, rows, [-1])
        shift = row_mean
        for _ in lead:  # the first sample's row means: one value per channel
            shift = b.op(aten.select.int, shift, 0, 0)
        deviation = b.op(aten.sub.Tensor, row_mean, shift)
        s1 = b.op(aten.sum.dim_IntList, deviation, lead)
        s2 = b.op(aten.sum.dim_IntList, b.op(aten.mul.Tensor, deviation, deviation), lead)
        within = b.op(aten.mul.Tensor, b.op(aten.sum.dim_IntList, row_var, lead), float(length))
        spread = b.op(aten.mul.Tensor, b.op(aten.sub.Tensor, s2, b.op(aten.div.Tensor, b.op(aten.mul.Tensor, s1, s1),
                                                                      float(n_rows))), float(length))
        new_var = b.op(aten.div.Tensor, b.op(aten.add.Tensor, within, spread), float(count) - correction)
        mean = b.op(aten.add.Tensor, shift, b.op(aten.div.Tensor, s1, float(n_rows)))
        new_sums = [b.op(aten.mul.Tensor, mean, float(count)) for _ in sums]
    except Exception:  # noqa: BLE001 - a value the ops do not take: left as it was
        b.undo()  # (nodes left unread would still be planned as kernels)
        return 0
    return _statistics_replaced(var_node, new_var, sums, new_sums)


def _first_of(gm: fx.GraphModule, nodes: list) -> fx.Node:
    """The earliest of ``nodes`` in the graph: restatements that replace them all go before it (a
    sum beside the variance may come first: a batch norm's backward over (N, C, 1) summed its
    input before the variance, and the restated sum, put before the variance, came after the sum's
    readers; the graph did not lint)."""
    wanted = set(nodes)
    return next(n for n in gm.graph.nodes if n in wanted)


def _statistics_replaced(var_node, new_var, sums: list, new_sums: list) -> int:
    """The variance and the sums beside it read from their restatements; 1 (one rewrite)."""
    var_node.replace_all_uses_with(new_var)
    for old, new in zip(sums, new_sums):
        old.replace_all_uses_with(new)
    return 1


def trailing_reductions_as_rows(gm: fx.GraphModule) -> int:
    """``sum``/``mean`` of a float tensor over its last k >= 2 dims (and not all of them) -> the
    same reduction over the last dim of a view with those dims flattened into one, viewed back:
    a global average pool (``x.mean((2, 3), keepdim=True)``: squeeze-and-excitation blocks, a
    CNN's head) and its backward's ``sum`` over (H, W). No template generated them: they ran as
    ATen reductions, and in EfficientNet's backward the kernels around them split into cycles
    that dissolved into ATen ops. Only where the trailing dims are contiguous (the flat view keeps
    every value in place) and the shape is static."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _TRAILING:
            continue
        flat_shape = _trailing_rows(node.args[0], _dims(node))
        if flat_shape is None:
            continue
        val = fusion.value(node)
        b = Builder(gm, node, val)
        extra = {"dtype": node.kwargs["dtype"]} if node.kwargs.get("dtype") is not None else {}
        try:
            flat = b.op(aten.view.default, node.args[0], flat_shape)
            new = b.op(node.target, flat, [-1], False, **extra)
            new = b.op(aten.view.default, new, list(val.shape))
        except Exception:  # noqa: BLE001 - the view does not exist on this layout: leave it
            continue
        node.replace_all_uses_with(new)
        count += 1
    return _cleanup(gm, count)


def prologues_in_row_space(gm: fx.GraphModule) -> int:
    """``view(f(a, b), rows)`` -> ``f(view(a), view(b))`` where the view only merges trailing dims
    (the flat view ``trailing_reductions_as_rows`` and ``full_reductions_as_rows`` put before a
    reduction: ``(x * 3).mean()`` of a 2-D ``x`` is one kernel, was two) and ``f`` is a
    pointwise op, repeated up the chain to values computed elsewhere or inputs, which are viewed
    (a view moves no data). The chain then runs in the row space and joins the row kernel as its
    prologue: ``where(out > 0, g, 0).sum((2, 3))`` (a ReLU's backward summed over H, W: a
    squeeze-and-excitation block's, a batch norm's) was a kernel writing the whole ``where`` and
    a row kernel reading it back. A chain that other ops read too is recomputed in the row space,
    not moved; where an operand's merged dims are neither all full nor all broadcast (or a view
    cannot be made on its layout) nothing changes."""
    count, memo, abandoned = 0, {}, 0  # memo: (node, k) -> its row-space node (a chain two reductions read is made once)
    for view in list(gm.graph.nodes):
        if not (view.op == "call_function" and view.target is aten.view.default and _pointwise_source(view.args[0])
                and all(u.op == "call_function" and u.target in _TRAILING for u in view.users)):
            continue
        merged = _merged_trailing(fusion.dims(view.args[0]), list(view.args[1]))
        if merged is None:
            continue
        try:
            moved = _in_rows(gm, view.args[0], merged, view, memo)
        except (RuntimeError, ValueError):  # a view this layout does not take, an odd broadcast
            # the part of the chain made before the refusal is read by nothing: removed below
            # (softmax's max below a GELU had left the GELU's row-space copy as a dead kernel)
            abandoned += 1
            continue
        view.replace_all_uses_with(moved)
        count += 1
    _cleanup(gm, count + abandoned)
    return count


def _pointwise_source(node) -> bool:
    return (isinstance(node, fx.Node) and node.op == "call_function"
            and fusion.target_name(node) in ops_table.POINTWISE and fusion.classify(node)[0] == "pointwise"
            and fusion.static_shape(fusion.value(node)))


def _merged_trailing(shape, flat) -> int | None:
    """k where ``flat`` is ``shape`` with dims k.. merged into one (k < rank - 1), else None."""
    shape, flat = list(shape), list(flat)
    k = len(flat) - 1
    if k < 0 or k >= len(shape) - 1 or shape[:k] != flat[:k] or math.prod(shape[k:]) != flat[k]:
        return None
    return k


def _row_shape_of(shape, rank: int, k: int) -> list:
    """An operand's shape (broadcast against ``rank`` dims) with dims k.. merged: each merged dim
    full (their product) or all broadcast (1); anything else raises ValueError."""
    padded = list(fusion.padded(tuple(shape), rank))
    tail = padded[k:]
    return padded[:k] + [1 if all(s == 1 for s in tail) else math.prod(tail)]


def _in_rows(gm, node, k: int, anchor, memo: dict):
    """``node``'s value with its dims k.. merged: pointwise ops recomputed on their operands' row
    views, anything else viewed."""
    if (node, k) in memo:
        return memo[node, k]
    val = fusion.value(node)
    rank = val.dim()
    b = Builder(gm, anchor, val)
    if not _pointwise_source(node):  # (its merged dims were checked by its reader's ``operand``)
        shape = _row_shape_of(val.shape, rank, k)
        memo[node, k] = out = b.op(aten.view.default, node, shape) if list(val.shape) != shape else node
        return out
    full_tail = list(val.shape[k:])

    def operand(a):
        if not isinstance(a, fx.Node):
            return a
        v = fusion.value(a)
        if not isinstance(v, torch.Tensor) or v.dim() == 0:
            return a
        tail = list(fusion.padded(tuple(v.shape), rank)[k:])
        if tail != full_tail and any(s != 1 for s in tail):
            raise ValueError("partly broadcast merged dims")
        if v.dim() == rank:
            return _in_rows(gm, a, k, anchor, memo)
        return b.op(aten.view.default, a, _row_shape_of(v.shape, rank, k))  # fewer dims: broadcast

    args = [operand(a) for a in node.args]
    kwargs = {key: operand(a) for key, a in node.kwargs.items()}
    memo[node, k] = out = b.op(node.target, *args, **kwargs)
    return out


def _trailing_rows(source, dims) -> list | None:
    """The flat shape (leading dims, product of the reduced trailing dims) when reducing
    ``source``, a static float tensor, over ``dims`` is over its last k >= 2 (not all) dims, and
    they are contiguous; else None."""
    src = fusion.value(source) if isinstance(source, fx.Node) else None
    if not (isinstance(src, torch.Tensor) and hasattr(src, "fake_mode") and src.is_floating_point()
            and fusion.static_shape(src) and src.numel() > 0):
        return None
    rank = src.dim()
    reduced = sorted({d % rank for d in dims}) if rank else []
    k = len(reduced)
    if k < 2 or k >= rank or reduced != list(range(rank - k, rank)):
        return None
    expected = 1
    for d in range(rank - 1, rank - k - 1, -1):  # the trailing block is row-major and dense
        if src.shape[d] != 1 and src.stride(d) != expected:
            return None
        expected *= src.shape[d]
    return list(src.shape[:rank - k]) + [expected]


def _over_every_dim(node) -> bool:
    """The node reduces every dim of its input (no dim list, an empty one, or all of them)."""
    if node.target in (aten.sum.default, aten.mean.default, aten.max.default, aten.min.default):
        return True
    src = fusion.value(node.args[0])
    if not isinstance(src, torch.Tensor):
        return False
    dims, rank = _dims(node), src.dim()
    return not dims or (rank > 0 and sorted(d % rank for d in dims) == list(range(rank)))


def _dims(node) -> list:
    """The dims a reduction names ([] for none: every dim); ATen's ``dim`` or a prim's ``dims``."""
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", node.kwargs.get("dims"))
    return [dims] if isinstance(dims, int) else list(dims or [])


#: ops with (values, indices) outputs -> the reduction of the values alone
_EXTREMES = {aten.max.dim: aten.amax.default, aten.min.dim: aten.amin.default}


def extremes_without_indices(gm: fx.GraphModule) -> int:
    """``max(x, dim, keepdim).values`` -> ``amax(x, [dim], keepdim)`` (and ``min`` -> ``amin``)
    where nothing reads the indices. ``x.max(dim).values`` (a softmax written by hand, a max-pool
    over a dim) is a two-output op the templates do not generate: it ran in ATen, a kernel and a
    (rows,) round trip of its own before the kernel that uses it; amax is a row reduction that
    joins that kernel (Inductor's one kernel). Values are the same, NaN included (both propagate
    NaN); an empty reduced dim raises in both."""
    count = 0
    for node in list(gm.graph.nodes):
        reduced = _EXTREMES.get(getattr(node, "target", None)) if node.op == "call_function" else None
        if reduced is None or not node.users:
            continue
        picks = list(node.users)
        if not all(u.op == "call_function" and u.target is _getitem and u.args[1] == 0 for u in picks):
            continue  # the indices are read (or the tuple escapes)
        val = fusion.value(picks[0])
        if not (isinstance(val, torch.Tensor) and hasattr(val, "fake_mode")):
            continue
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        try:
            new = Builder(gm, node, val).op(reduced, node.args[0], [dim], keepdim)
        except Exception:  # noqa: BLE001 - a value the reduction does not take: left as it was
            continue
        for pick in picks:
            pick.replace_all_uses_with(new)
        count += 1
    return _cleanup(gm, count)


_getitem = operator.getitem

#: ``any``/``all`` over dims -> the extreme of the truth values that gives the same answer
_TRUTHS = {aten.any.dim: aten.amax.default, aten.any.dims: aten.amax.default,
           aten.all.dim: aten.amin.default, aten.all.dims: aten.amin.default}


def truth_reductions_as_extremes(gm: fx.GraphModule) -> int:
    """``any(x, dims)`` -> ``amax(float(x != 0), dims) != 0`` and ``all`` -> ``amin``: ATen's
    boolean reduction was a kernel of its own (PyTorch's ``_safe_softmax``, SDPA's masked rows:
    ``all(x == -inf, -1)``, then a (rows,) round trip and a ``where`` kernel; T5 inference on the
    H200: 12 reductions and 12 ``where`` kernels a step), where the extreme is a row reduction
    that joins the softmax's kernel. The truth is taken before the float (NaN is true, as in
    ``any``). Only over dims of static, non-zero sizes: over an empty dim ``any`` is False and
    ``all`` True, where ``amax``/``amin`` raise."""
    count = 0
    for node in list(gm.graph.nodes):
        extreme = _TRUTHS.get(getattr(node, "target", None)) if node.op == "call_function" else None
        if extreme is None:
            continue
        src, val = fusion.value(node.args[0]), fusion.value(node)
        dims = _dims(node)
        if not (isinstance(src, torch.Tensor) and hasattr(src, "fake_mode") and dims and val.dtype == torch.bool
                and all(isinstance(src.shape[d], int) and src.shape[d] > 0 for d in dims)):
            continue
        keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        b = Builder(gm, node, val)
        truth = node.args[0] if src.dtype == torch.bool else b.op(aten.ne.Scalar, node.args[0], 0)
        ones = b.op(prims.convert_element_type.default, truth, torch.float32)
        new = b.op(aten.ne.Scalar, b.op(extreme, ones, dims, keepdim), 0)
        node.replace_all_uses_with(new)
        count += 1
    return _cleanup(gm, count)


def unsqueezes_toward_inputs(gm: fx.GraphModule) -> int:
    """``unsqueeze(f(a, b), d)`` -> ``f(unsqueeze(a, d), unsqueeze(b, d))`` for a pointwise ``f``
    whose operands all have its shape and whose only reader is the unsqueeze; repeated up the
    chain. Inference batch norm computes ``rsqrt(running_var + eps)`` per channel, shape (C,),
    then unsqueezes it twice to (C, 1, 1) to scale the (N, C, H, W) activations: the unsqueezes
    stood between the per-channel ops and the kernel that reads them, so each norm ran two
    C-element kernels of its own. Moved to the inputs, the per-channel ops have a shape that
    broadcasts against the activations and are recomputed inside their kernel (as Inductor does)."""
    count = 0
    work = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is aten.unsqueeze.default
            and _from_inputs(n.args[0])]
    while work:
        lifted = _lift_unsqueeze(gm, work.pop())
        count += lifted is not None
        work.extend(lifted or ())
    return _cleanup(gm, count)


def _from_inputs(node, seen=None) -> bool:
    """Whether ``node`` is computed by pointwise ops from graph inputs and constants only (a batch
    norm's running statistics and affine parameters). Values of a reduction (a group norm's
    per-group statistics) are left alone: their unsqueezes belong to the reduction's row values."""
    seen = {} if seen is None else seen
    if not isinstance(node, fx.Node):
        return True
    if node not in seen:
        if node.op in ("placeholder", "get_attr") or fusion.is_constant(node):
            seen[node] = True
        else:
            seen[node] = node.op == "call_function" and fusion.classify(node)[0] == "pointwise" and \
                all(_from_inputs(a, seen) for a in node.all_input_nodes)
    return seen[node]


def _lift_unsqueeze(gm, node) -> list | None:
    """The unsqueezes made on the operands (to lift further), or None where ``node`` stays."""
    src, dim = node.args[0], node.args[1]
    if not isinstance(src, fx.Node) or src.op != "call_function" or len(src.users) != 1:
        return None
    val = fusion.value(src)
    if fusion.classify(src)[0] != "pointwise" or not isinstance(val, torch.Tensor) or not hasattr(val, "fake_mode"):
        return None
    operands = [a for a in src.args if isinstance(a, fx.Node)]
    # every operand a tensor of the result's shape (a symbolic size operand, as in an embedding's
    # padding mask under dynamic shapes, is not a tensor to unsqueeze)
    if not operands or "memory_format" in src.kwargs or \
            any(not isinstance(fusion.value(a), torch.Tensor) or fusion.dims(a) != fusion.dims(src)
                for a in operands):  # (compared as expressions: comparing SymInts adds guards)
        return None
    b = Builder(gm, node, val)
    args = [b.op(aten.unsqueeze.default, a, dim) if isinstance(a, fx.Node) else a for a in src.args]
    lifted = b.op(src.target, *args, **src.kwargs)
    node.replace_all_uses_with(lifted)
    gm.graph.erase_node(node)
    gm.graph.erase_node(src)
    # the new operand unsqueezes lift further, and an unsqueeze reading the lifted op (the second
    # of two) may lift now
    return [a for a in args if isinstance(a, fx.Node)] + \
        [u for u in lifted.users if u.target is aten.unsqueeze.default]


def cats_without_empties(gm: fx.GraphModule) -> int:
    """``cat([empty, x], d)`` -> ``clone(x)``: an empty cache grown by one tensor. Hugging Face's
    ``DynamicCache`` starts each layer's keys and values as ``torch.tensor([])`` and concatenates
    the new ones to it (GPT-2, T5, Llama: two per layer). ATen ran each as a
    ``CatArrayBatchedCopy`` (24 of them 0.99 ms of GPT-2's inference step on the H200, Inductor's
    fused copies 0.16 ms); a copy is a pointwise op, which joins a generated kernel. Inputs with
    no elements are dropped (several left: a smaller cat), the result keeps cat's contiguous layout."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.cat.default:
            continue
        val = fusion.value(node)
        parts = node.args[0]
        kept = [p for p in parts if not _no_elements(p)]
        if len(kept) == len(parts) or not kept or not isinstance(val, torch.Tensor) or not hasattr(val, "fake_mode"):
            continue
        b = Builder(gm, node, val)
        if len(kept) == 1 and tuple(fusion.value(kept[0]).shape) == tuple(val.shape):
            new = b.op(aten.clone.default, kept[0], memory_format=torch.contiguous_format)
        else:
            new = b.op(aten.cat.default, kept, *node.args[1:], **node.kwargs)
        node.replace_all_uses_with(new)
        count += 1
    return _cleanup(gm, count)


def pads_as_cats(gm: fx.GraphModule) -> int:
    """``constant_pad_nd(x, pads, v)`` of one dim, with no negative pad -> ``cat([full(v), x,
    full(v)], d)``: a cat whose fills are literals (``emit.cat_expression``), computed in the
    kernel that reads it instead of ATen's pad kernel writing the padded copy. Every Hugging Face
    causal LM's loss shifts its labels so: ``pad(labels, (0, 1), value=-100)[..., 1:]``, which
    ``slices_through_cats`` then trims to the labels' own slice and one column of -100."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.constant_pad_nd.default:
            continue
        x, pads = node.args[0], list(node.args[1])
        value = node.args[2] if len(node.args) > 2 else node.kwargs.get("value", 0)
        val = fusion.value(node)
        if not (isinstance(x, fx.Node) and isinstance(val, torch.Tensor) and hasattr(val, "fake_mode")
                and fusion.static_shape(val) and all(isinstance(p, int) and p >= 0 for p in pads)
                and isinstance(value, (int, float)) and val.dtype in fusion.SUPPORTED_DTYPES):
            continue
        if sum(1 for k in range(len(pads) // 2) if pads[2 * k] or pads[2 * k + 1]) != 1:
            continue  # one padded dim: two would be a cat of a cat, whose inner one is written first
        k = next(k for k in range(len(pads) // 2) if pads[2 * k] or pads[2 * k + 1])
        lo, hi, d = pads[2 * k], pads[2 * k + 1], val.dim() - 1 - k
        shape = list(fusion.value(x).shape)
        b = Builder(gm, node, val)
        try:
            fills = [b.op(aten.full.default, shape[:d] + [n] + shape[d + 1:], value, dtype=val.dtype,
                          device=val.device) if n else None for n in (lo, hi)]
            padded = b.op(aten.cat.default, [p for p in (fills[0], x, fills[1]) if p is not None], d)
        except Exception:  # noqa: BLE001 - a value the dtype cannot hold (NaN into integers): ATen's pad
            b.undo()
            continue
        node.replace_all_uses_with(padded)
        count += 1
    return _cleanup(gm, count)


def slices_through_cats(gm: fx.GraphModule) -> int:
    """``slice(cat(pieces, d), d, start, end)`` -> the cat of the pieces' parts in [start, end)
    (a fill: a smaller fill), or that one part alone; a slice along another dim slices every
    piece. Only for a cat the slice alone reads (else the cat would be computed twice)."""
    count = 0
    for node in list(gm.graph.nodes):
        cat = node.args[0] if node.op == "call_function" and node.target is aten.slice.Tensor else None
        if not (fusion.is_cat(cat) and len(cat.users) == 1 and fusion.static_shape(fusion.value(node))):
            continue
        val = fusion.value(node)
        dim, start, end, step = (list(node.args[1:]) + [0, 0, None, 1][len(node.args) - 1:])[:4]
        dim = dim % val.dim()
        size = fusion.value(cat).shape[dim]
        start, end = _clamped(start, size, 0), _clamped(end, size, size)
        if step != 1:
            continue
        b = Builder(gm, node, val)
        try:
            parts = _sliced_pieces(b, cat, dim, start, end)
            new = parts[0] if len(parts) == 1 else b.op(aten.cat.default, parts, fusion.cat_dim(cat))
        except Exception:  # noqa: BLE001 - pieces this restatement does not cover: leave it
            b.undo()
            continue
        node.replace_all_uses_with(new)
        count += 1
    return _cleanup(gm, count)


def _clamped(i, size: int, default: int) -> int:
    """A slice bound as ATen takes it: None the default, negative from the end, clamped to [0, size]."""
    if i is None:
        return default
    return min(max(i + size if i < 0 else i, 0), size)


def _sliced_pieces(b: Builder, cat: fx.Node, dim: int, start: int, end: int) -> list:
    """The parts of ``cat``'s pieces that ``slice(cat, dim, start, end)`` keeps."""
    if dim != fusion.cat_dim(cat):
        return [_slice_of(b, p, dim, start, end) for p in cat.args[0]]
    parts = []
    for piece, lo, hi in fusion.cat_pieces(cat):
        a, z = max(start, lo), min(end, hi)
        if a < z:
            parts.append(_slice_of(b, piece, dim, a - lo, z - lo))
    if not parts:
        raise ValueError("an empty slice")
    return parts


def _slice_of(b: Builder, piece: fx.Node, dim: int, start: int, end: int) -> fx.Node:
    """``piece[start:end]`` along ``dim``: the piece itself when whole, a smaller fill for a fill."""
    val = fusion.value(piece)
    if start == 0 and end == val.shape[dim]:
        return piece
    if piece.target is aten.full.default and fusion.is_constant(piece):
        shape = list(val.shape)
        shape[dim] = end - start
        return b.op(aten.full.default, shape, *piece.args[1:], **piece.kwargs)
    return b.op(aten.slice.Tensor, piece, dim, start, end)


def scatters_as_cats(gm: fx.GraphModule) -> int:
    """``slice_scatter(zeros, a, d, 0, m) + slice_scatter(zeros, b, d, m, n)`` -> ``cat([a, b], d)``:
    the backward of a ``cat`` of two slices (RoPE's ``rotate_half``: two per layer, for q and k).
    Each ``slice_scatter`` copied the whole zero tensor before writing its half, and the zeros were a
    kernel of their own: four launches and five full-size passes become one that writes the result
    once. Only where the two ranges (step 1) tile dim d exactly, the base is a zero fill and every
    tensor has one dtype."""
    count = 0
    for node in list(gm.graph.nodes):
        parts = _tiling_scatters(node)
        if parts is None:
            continue
        dim, pieces = parts
        b = Builder(gm, node, fusion.value(node))
        node.replace_all_uses_with(b.op(aten.cat.default, pieces, dim))
        count += 1
    return _cleanup(gm, count)


def _tiling_scatters(node) -> tuple | None:
    """(dim, [src of the lower range, src of the upper]) when ``node`` adds two slice_scatters of
    one zero fill whose ranges tile dim d, else None."""
    if node.op != "call_function" or node.target is not aten.add.Tensor or node.kwargs or len(node.args) != 2:
        return None
    scatters = node.args
    if not all(isinstance(s, fx.Node) and s.target is aten.slice_scatter.default for s in scatters):
        return None
    base = scatters[0].args[0]
    val = fusion.value(node)
    if scatters[1].args[0] is not base or not _zero_fill(base) or not isinstance(val, torch.Tensor):
        return None
    ranges = []
    for s in scatters:
        args = list(s.args) + [None] * (6 - len(s.args))
        src, dim, start, end, step = args[1], args[2] if args[2] is not None else 0, args[3], args[4], args[5]
        dim = dim % val.dim()
        n = val.shape[dim]
        if (s.kwargs or step not in (None, 1) or not isinstance(n, int) or not all(isinstance(v, (int, type(None))) for v in (start, end))
                or fusion.value(src).dtype != val.dtype or fusion.value(base).dtype != val.dtype):
            return None
        start = 0 if start is None else start + n if start < 0 else min(start, n)
        end = n if end is None else end + n if end < 0 else min(end, n)
        ranges.append((start, end, dim, src))
    ranges.sort(key=lambda r: r[0])
    (s0, e0, d0, a), (s1, e1, d1, c) = ranges
    if d0 != d1 or (s0, e0, s1, e1) != (0, e0, e0, val.shape[d0]) or not 0 < e0 < val.shape[d0]:
        return None
    return d0, [a, c]


def _zero_fill(node) -> bool:
    return (isinstance(node, fx.Node) and node.op == "call_function"
            and ((node.target is aten.full.default and node.args[1] == 0) or node.target is aten.zeros.default))


def _no_elements(node) -> bool:
    val = fusion.value(node)
    return isinstance(val, torch.Tensor) and all(isinstance(s, int) for s in val.shape) and val.numel() == 0


def fills_without_inputs(gm: fx.GraphModule) -> int:
    """``full_like(x, v)`` of a contiguous ``x`` -> ``full(shape, v)``. The fill reads nothing of
    ``x`` but its shape, yet the edge to ``x`` made the fusion planner believe the kernel writing
    ``x`` must run first: cross-entropy's backward kept its ``exp(x - lse)`` in a kernel of its own
    (a float32 (rows, vocab) write and read) because the scatter's zero base hung off ``x``."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.full_like.default:
            continue
        val = fusion.value(node)
        fill = node.args[1] if len(node.args) > 1 else node.kwargs.get("fill_value")
        if not (isinstance(val, torch.Tensor) and hasattr(val, "fake_mode") and val.is_contiguous()
                and all(isinstance(s, int) for s in val.shape) and isinstance(fill, (int, float, bool))):
            continue
        b = Builder(gm, node, val)
        node.replace_all_uses_with(b.op(aten.full.default, list(val.shape), fill, dtype=val.dtype, device=val.device))
        count += 1
    return _cleanup(gm, count)


#: dtype conversions: elementwise, one tensor argument
_CASTS = ("prims.convert_element_type.default", "aten._to_copy.default")
#: views that only regroup the dims of a contiguous tensor
_RESHAPES = ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")


#: views that reorder dims: any layout has them (no contiguity needed)
_PERMUTES = ("aten.permute.default", "aten.transpose.int", "aten.t.default")
#: views that add or drop dims of size 1: any layout has them too
_SQUEEZES = ("aten.unsqueeze.default", "aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default")


def casts_through_views(gm: fx.GraphModule, squeezes: bool = False) -> int:
    """``view(cast(x))`` -> ``cast(view(x))`` where the cast's only users are such views, and
    ``cast(view(y))`` -> ``view(cast(y))`` where the view's only user is the cast. A view between
    a cast and the kernel that reads it keeps them apart (a view that moves the values is written
    first): HF's ``logits.float().view(-1, vocab)`` wrote the float32 logits, (rows, vocab), in a
    kernel of its own before the loss, and the gradient's ``.view(B, S, vocab).to(bf16)`` wrote
    them again in float32. Moved, the cast joins the kernel on the other side of the view.

    Reshapes move where the reshaped tensor is contiguous, permutes (transposes) always, and with
    ``squeezes`` (a second pass, after ``unsqueezes_toward_inputs`` has moved the per-channel
    unsqueezes of a batch norm toward its inputs) (un)squeezes too. SDPA's
    math path in 16 bits (T5's attention with its learned position bias, whose gradient the fused
    attentions do not give) casts q, k and v to float32, transposes k, and transposes the
    attention's output back after casting it to 16 bits: each cast before a transpose was a kernel
    of its own (T5-base training: 64 cast and 72 copy kernels a step on the H100, where Inductor
    fuses the casts into the copies). A moved cast can meet the next view (a reshape then a
    transpose): the pass repeats until nothing moves."""
    free_views = _PERMUTES + _SQUEEZES if squeezes else _PERMUTES
    return _until_settled(lambda: _casts_through_views_once(gm, free_views))


def _until_settled(one_pass, passes: int = 8) -> int:
    """``one_pass()`` again while it rewrote something (at most ``passes`` times): a chain of views
    is a few deep, and each pass moves an op past one of them. Returns the rewrites, summed."""
    total = 0
    for _ in range(passes):
        count = one_pass()
        total += count
        if not count:
            break
    return total


def _casts_through_views_once(gm: fx.GraphModule, free_views: tuple) -> int:
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or fusion.target_name(node) not in _CASTS or not _plain_cast(node):
            continue
        src = node.args[0]
        views = list(node.users)
        if views and _computed_by_aten(src) and all(_moves_with_casts(v, free_views, src) and v.args[0] is node for v in views):
            count += sum(_swap(gm, v, view_args=(src, *v.args[1:]), cast=node) for v in views)
        elif (isinstance(src, fx.Node) and _moves_with_casts(src, free_views) and len(src.users) == 1
              and isinstance(src.args[0], fx.Node) and not _computed_by_aten(src.args[0])):
            b = Builder(gm, node, fusion.value(node))
            cast = b.op(node.target, src.args[0], *node.args[1:], **node.kwargs)
            node.replace_all_uses_with(b.op(src.target, cast, *src.args[1:]))
            count += 1
    return _cleanup(gm, count)


#: views that pick part of a tensor: any layout has them
_SLICES = ("aten.slice.Tensor", "aten.select.int")


def pointwise_into_copies(gm: fx.GraphModule) -> int:
    """``clone(view(op(a, b)))`` -> ``clone(op(view(a), view(b)))`` for an elementwise op of inputs
    or ATen results of its own shape, whose only use is a permute, (un)squeeze or slice that ends in
    a copy: the op is computed inside the copy's kernel (and only where the slice reads), not in a
    kernel of its own before it. T5's backward added each cross-attention's key and value gradients
    to their cache's gradients, then sliced, transposed and copied the sum: two kernels each, where
    Inductor's one. Repeats until nothing moves (a slice then a transpose)."""
    return _until_settled(lambda: _pointwise_into_copies_once(gm))


def _pointwise_into_copies_once(gm: fx.GraphModule) -> int:
    count = 0
    for node in list(gm.graph.nodes):
        view = _lone_view_into_copy(node)
        if view is None:
            continue
        b = Builder(gm, view, fusion.value(view))
        try:
            args = [b.op(view.target, a, *view.args[1:], **view.kwargs) if isinstance(a, fx.Node) else a
                    for a in node.args]
            moved = b.op(node.target, *args, **node.kwargs)
        except RuntimeError:
            b.undo()
            continue
        view.replace_all_uses_with(moved)
        count += 1
    return _cleanup(gm, count)


def permuted_trees_into_copies(gm: fx.GraphModule) -> int:
    """``clone(permute(f(...)))`` where ``f`` is a tree of elementwise ops and cats that only this
    permute reads -> ``clone(f(permute(leaf) ...))``: the permute moves to the tree's leaves (a cat's
    dim moves with it), so the whole tree is computed inside the copy's kernel, in the copy's index
    order, instead of a kernel writing the tree's result and a second one reading it back transposed
    (one write and one read of the whole tensor saved). Llama's backward computes each layer's RoPE
    gradients for q and k as (B, H, S, D) and copies them transposed into (B, S, H*D) for the
    projection's matmul: four kernels a layer, two after. A leaf of lower rank (a broadcast
    operand) is first viewed at the tree's rank with leading 1s; nodes with other readers stay
    where they are, read through the permute."""
    count = 0
    for copy in list(gm.graph.nodes):
        permute = copy.args[0] if fusion.target_name(copy) == "aten.clone.default" else None
        if not (isinstance(permute, fx.Node) and fusion.target_name(permute) == "aten.permute.default"
                and len(permute.users) == 1 and _in_tree(permute.args[0])):
            continue
        b = Builder(gm, permute, fusion.value(permute))
        try:
            moved = _permuted(b, permute.args[0], list(permute.args[1]))
        except Exception:  # noqa: BLE001 - a tree this restatement does not cover: leave the graph
            b.undo()
            continue
        permute.replace_all_uses_with(moved)
        count += 1
    return _cleanup(gm, count)


def _in_tree(node) -> bool:
    """A node ``permuted_trees_into_copies`` recomputes in permuted order: an elementwise op or a
    cat, read only by the one node above it in the tree, of a static shape."""
    if not (isinstance(node, fx.Node) and node.op == "call_function" and len(node.users) == 1):
        return False
    val, name = fusion.value(node), fusion.target_name(node)
    if not (isinstance(val, torch.Tensor) and fusion.static_shape(val)) or name == "aten.clone.default":
        return False
    elementwise = name in ops_table.POINTWISE and not any(isinstance(a, (list, tuple)) for a in node.args)
    # (a tensor among the keyword arguments, clamp's min=t, would not be permuted with the rest)
    by_keyword = any(isinstance(v, fx.Node) for v in node.kwargs.values())
    return (elementwise or fusion.is_cat(node)) and not by_keyword and fusion.classify(node)[0] == "pointwise"


def _permuted(b: Builder, node: fx.Node, perm: list, member=_in_tree, memo: dict | None = None) -> fx.Node:
    """``permute(node, perm)``, computed from permuted leaves where ``node`` is in the tree
    (``member(node)``); ``memo`` ((node, perm) -> its permuted node) shares what is made between
    calls (keyed by the permutation too: one operand read by two reductions that keep different
    dims is permuted twice, once for each)."""
    key = (node, tuple(perm))
    if memo is not None and key in memo:
        return memo[key]
    rank, val = len(perm), fusion.value(node)
    if not member(node) or val.dim() != rank:
        if val.dim() < rank:  # a broadcast operand: the same values at the tree's rank
            node = b.op(aten.view.default, node, [1] * (rank - val.dim()) + list(val.shape))
        out = b.op(aten.permute.default, node, perm)
    elif fusion.is_cat(node):
        pieces = [_permuted(b, p, perm, member, memo) for p in node.args[0]]
        out = b.op(node.target, pieces, perm.index(fusion.cat_dim(node)))
    else:
        def operand(a):
            if not isinstance(a, fx.Node) or not isinstance(fusion.value(a), torch.Tensor) or fusion.value(a).dim() == 0:
                return a  # numbers and single values broadcast alike in any order
            if fusion.value(a).dim() > rank:
                raise ValueError("an operand of higher rank than the tree")
            return _permuted(b, a, perm, member, memo)

        out = b.op(node.target, *[operand(a) for a in node.args], **node.kwargs)
    if memo is not None:
        memo[key] = out
    return out


def _lone_view_into_copy(node) -> fx.Node | None:
    """The view of ``node`` that ``pointwise_into_copies`` moves it past, or None."""
    if node.op != "call_function" or fusion.target_name(node) == "aten.clone.default" or len(node.users) != 1:
        return None
    val = fusion.value(node)
    operands = [a for a in node.args if isinstance(a, fx.Node)]
    if (fusion.classify(node)[0] != "pointwise" or not operands or not isinstance(val, torch.Tensor)
            or any(isinstance(a, (list, tuple)) for a in node.args)
            or any(not _computed_by_aten(a) or not isinstance(fusion.value(a), torch.Tensor) or fusion.dims(a) != fusion.dims(node)
                   for a in operands)):
        return None
    view = next(iter(node.users))
    free = _PERMUTES + _SQUEEZES + _SLICES
    if fusion.target_name(view) not in free or view.args[0] is not node:
        return None
    end = view
    while fusion.target_name(end) in free and len(end.users) == 1:
        end = next(iter(end.users))
    return view if fusion.target_name(end) == "aten.clone.default" else None


def _moves_with_casts(view, free_views: tuple, base=None) -> bool:
    """One of ``free_views``, or a reshape of a contiguous tensor: the same view of ``base`` (the
    view's input by default; the cast's input when the view moves before the cast) exists. (A
    cast of a slice is contiguous where the slice is not: a reshape of the cast moved onto the
    slice failed to compile.)"""
    name = fusion.target_name(view)
    if name in free_views:
        return True
    if name not in _RESHAPES:
        return False
    base = view.args[0] if base is None else base
    return isinstance(base, fx.Node) and fusion.value(base).is_contiguous()


def gathers_before_casts(gm: fx.GraphModule) -> int:
    """``gather(cast(x), idx)`` -> ``cast(gather(x, idx))``: the same values (a cast is
    elementwise), but a gather reads its source from memory, so the cast before it was a kernel of
    its own writing the whole source in the new type: bfloat16 bilinear upsampling (its
    decomposition computes in float32) wrote the input again in float32, twice its bytes, before
    the interpolation kernel read it back; moved, the cast joins the interpolation kernel."""
    count = 0
    for node in list(gm.graph.nodes):
        src = node.args[0] if fusion.is_gather(node) else None
        if not (isinstance(src, fx.Node) and src.op == "call_function" and fusion.target_name(src) in _CASTS
                and _plain_cast(src)):
            continue
        b = Builder(gm, node, fusion.value(node))
        try:
            gathered = b.op(node.target, src.args[0], *node.args[1:], **node.kwargs)
        except RuntimeError:
            continue
        node.replace_all_uses_with(b.op(src.target, gathered, *src.args[1:], **src.kwargs))
        count += 1
    return _cleanup(gm, count)


def _computed_by_aten(node) -> bool:
    """An input or an ATen op's result (a matmul's logits), or a view of one (HF's
    ``logits.view(B, S, V)`` of the head's (B*S, V) product): a cast of it fuses only downstream.
    A cast of a generated value stays where it is, in its producer's kernel."""
    while isinstance(node, fx.Node) and node.op == "call_function" and \
            fusion.target_name(node) in _RESHAPES + _PERMUTES + _SQUEEZES:
        node = node.args[0]
    if not isinstance(node, fx.Node):
        return False
    return node.op == "placeholder" or (node.op == "call_function" and fusion.classify(node)[0] == "eager")


def _plain_cast(node) -> bool:
    """A dtype change only (no device, layout or memory-format change) of a static-shape value."""
    val, src = fusion.value(node), fusion.value(node.args[0])
    if not (isinstance(val, torch.Tensor) and isinstance(src, torch.Tensor) and hasattr(val, "fake_mode")):
        return False
    kwargs = dict(node.kwargs)
    same_place = kwargs.pop("layout", torch.strided) == torch.strided and \
        kwargs.pop("device", src.device) == src.device and kwargs.pop("memory_format", None) is None
    return same_place and set(kwargs) <= {"dtype"} and len(node.args) == 1 and \
        all(isinstance(s, int) for s in val.shape)


def _swap(gm, view, view_args, cast) -> bool:
    """``view`` (of ``cast``'s output) replaced by the same cast of the same view of its input;
    False (nothing changed) where the input cannot be viewed so (not contiguous)."""
    b = Builder(gm, view, fusion.value(view))
    try:
        moved = b.op(view.target, *view_args)
    except RuntimeError:
        return False
    view.replace_all_uses_with(b.op(cast.target, moved, *cast.args[1:], **cast.kwargs))
    return True


def batch_norm_forwards_decomposed(gm: fx.GraphModule, table: dict) -> int:
    """Training batch norm's forward (``_native_batch_norm_legit_functional``) replaced by its
    decomposition (``table``: the compiler's, so its variance is the one
    ``batch_norm_statistics_as_rows_then_columns`` reads as a row and a column kernel), in a graph
    aot_autograd has already partitioned (``KERNELAB_BN_FORWARD=generated``).

    Decomposed *after* partitioning, the norm's backward stays ATen's ``native_batch_norm_backward``
    (eager's fused formula, fed the saved mean and 1 / std the decomposition computes); decomposed
    before aot_autograd, the backward was autograd's derivative of the decomposition, several
    kernels of its own whatever ``KERNELAB_BN_BACKWARD`` said.

    A norm whose input is contiguous has its statistics as rows of H * W values
    (``batch_norm_statistics_as_rows_then_columns``); a channels-last one (``conv_layout.py``) as
    columns of C (``batch_norm_statistics_as_columns``); any other layout stays ATen's."""
    op = aten._native_batch_norm_legit_functional.default
    if op not in table:
        return 0
    count = 0
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is op and _contiguous_input(node):
            count += _decomposed_in_place(gm, node, table)
    return _cleanup(gm, count)


def _contiguous_input(node: fx.Node) -> bool:
    """Contiguous, or channels-last (``batch_norm_statistics_as_columns`` reads its statistics)."""
    val = fusion.value(node.args[0])
    return isinstance(val, torch.Tensor) and (
        val.is_contiguous() or (val.dim() == 4 and val.is_contiguous(memory_format=torch.channels_last)))


def _decomposed_in_place(gm: fx.GraphModule, node: fx.Node, table: dict) -> int:
    """``node`` replaced by the graph make_fx traces of its decomposition over its fake values;
    0 (the node kept) where the trace cannot be inlined as it is."""
    from torch.fx.experimental.proxy_tensor import make_fx

    tensors = [a for a in node.args if isinstance(a, fx.Node)]
    vals = [fusion.value(a) for a in tensors]
    fake_mode = torch._guards.detect_fake_mode(vals)
    if fake_mode is None or not all(isinstance(v, torch.Tensor) for v in vals):
        return 0

    def decomposed(*args):
        it = iter(args)
        return table[node.target](*[next(it) if isinstance(a, fx.Node) else a for a in node.args], **node.kwargs)

    with fake_mode:
        sub = make_fx(decomposed, decomposition_table=table)(*vals)
    nodes = list(sub.graph.nodes)
    if any(n.op == "get_attr" for n in nodes):
        return 0  # a constant of the trace's own module: not one of this graph's
    env = dict(zip([n for n in nodes if n.op == "placeholder"], tensors))
    copied = []
    with gm.graph.inserting_before(node):
        for n in nodes:
            if n.op == "call_function":
                env[n] = gm.graph.node_copy(n, lambda a: env[a])
                copied.append(env[n])
    results = [env[r] if isinstance(r, fx.Node) else r for r in nodes[-1].args[0]]  # the trace's output
    expected = node.meta["val"]
    if any(fusion.value(r).dtype != e.dtype or fusion.value(r).shape != e.shape for r, e in zip(results, expected)):
        for n in reversed(copied):  # unlike ATen's outputs: the node stays, its copy goes
            gm.graph.erase_node(n)
        return 0
    for user in list(node.users):
        user.replace_all_uses_with(results[user.args[1]])
        gm.graph.erase_node(user)
    gm.graph.erase_node(node)
    return 1


def batch_norms_in_place(gm: fx.GraphModule) -> int:
    """Training batch norm's state updates, kept in the graph (``keep_inference_input_mutations``),
    as ATen's in-place ops:

    * ``_native_batch_norm_legit_functional`` + ``copy_`` of its new running mean and variance into
      the buffers -> ``_native_batch_norm_legit``, whose kernel updates them (eager's way);
    * ``copy_(num_batches_tracked, add(num_batches_tracked, 1))`` -> ``add_``; several such
      increments by the same number -> one ``_foreach_add_`` (one launch for all of them on CUDA,
      where each ``add_`` was a launch: 53 of ResNet-50's training step).

    aot_autograd otherwise copied each of the three back with a ``memcpy`` after the graph (ResNet's
    training step launched more kernels than eager: 60 copies for 20 norms, ``count(predict=True)``).
    Only where the buffers are read by nothing else before the update."""
    count, increments, saved = 0, [], []
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is aten._native_batch_norm_legit_functional.default:
            count += _norm_in_place(gm, node, saved)
        elif node.op == "call_function" and node.target is aten.copy_.default:
            found = _increment(node)
            if found is not None:
                increments.append(found)
    by_step = {}
    for copy, buf, value in increments:
        v = fusion.value(buf)
        by_step.setdefault((value.args[1], v.dtype, v.device), []).append((copy, buf, value))
    for (step, _, _), items in by_step.items():
        count += _increments_in_place(gm, items, step)
    _snapshots(gm, saved)
    return _cleanup(gm, count)


def _norm_in_place(gm: fx.GraphModule, norm: fx.Node, saved: list) -> int:
    """One functional norm -> ATen's in-place norm; its new running statistics that the graph
    also returns (saved for ATen's backward) are appended to ``saved`` as (getitem, buffer, the
    in-place norm): they must stay tensors of their own (``_snapshots``)."""
    running = norm.args[3:5]
    outs = {u.args[1]: u for u in norm.users if u.target is operator.getitem}
    copies = []
    for k, buf in zip((3, 4), running):
        got = outs.get(k)
        if not (isinstance(buf, fx.Node) and buf.op == "placeholder" and got is not None):
            return 0
        copy = [u for u in got.users if u.target is aten.copy_.default and u.args[0] is buf]
        # the buffer read by the norm and its update only; the new value returned or updated only
        if len(copy) != 1 or set(buf.users) != {norm, copy[0]} or \
                any(u is not copy[0] and u.op != "output" for u in got.users):
            return 0
        copies.append((got, copy[0], buf))
    with gm.graph.inserting_before(norm):
        new = gm.graph.call_function(aten._native_batch_norm_legit.default, norm.args, norm.kwargs)
    new.meta["val"] = tuple(norm.meta["val"][:3])
    for k in (0, 1, 2):
        if k in outs:
            outs[k].args = (new, k)
    for got, copy, buf in copies:
        gm.graph.erase_node(copy)
        readers = list(got.users)
        got.replace_all_uses_with(buf)  # for now: _snapshots gives these readers a copy
        gm.graph.erase_node(got)
        if readers:
            saved.append((readers, buf, new))
    gm.graph.erase_node(norm)
    return 1


def _snapshots(gm: fx.GraphModule, saved: list) -> None:
    """The new running statistics a graph returns (ATen's batch norm backward takes them, so
    aot_autograd saves them), as copies of the updated buffers (``buffer_copies``). Returning the
    buffer itself instead (before 2026-12-05) broke models that call a norm twice before one
    backward (siamese or contrastive encoders, a GAN's discriminator on real then fake data): the
    second call updated the saved tensor in place and autograd raised "modified by an inplace
    operation". (The buffer stood in for the new value in its readers: ``_norm_in_place``.)"""
    buffer_copies(gm, [(buf, buf, readers, norm) for readers, buf, norm in saved])


def buffer_copies(gm: fx.GraphModule, items: list) -> fx.Node | None:
    """Copies of graph-input buffers updated in place, for readers that must get tensors of their
    own: ``items`` are (value, buffer, readers, writer); each reader's ``value`` input becomes a
    copy of ``buffer`` taken after ``writer`` (a node, or any node of the kernel that writes it:
    ``kl_after``, honoured by the runner's schedule; nothing else orders a read of a buffer after
    an op that writes it through a later argument or a kernel's store). One
    ``_foreach_mul(buffers, 1)`` for all (one launch on CUDA, exact copies), before the output;
    returns it (None for no items)."""
    if not items:
        return None
    output = next(n for n in gm.graph.nodes if n.op == "output")
    with gm.graph.inserting_before(output):
        copies = gm.graph.call_function(aten._foreach_mul.Scalar, ([buf for _, buf, _, _ in items], 1.0))
    vals = [fusion.value(buf) for _, buf, _, _ in items]
    with vals[0].fake_mode:
        copies.meta["val"] = [torch.empty_like(v) for v in vals]
    copies.meta["kl_after"] = [writer for _, _, _, writer in items]
    for i, (value, _, readers, _) in enumerate(items):
        with gm.graph.inserting_before(output):
            item = gm.graph.call_function(operator.getitem, (copies, i))
        item.meta["val"] = copies.meta["val"][i]
        for reader in readers:
            reader.replace_input_with(value, item)
    return copies


def _increment(copy: fx.Node) -> tuple | None:
    """(copy, buffer, add) for ``copy_(buf, add(buf, k))`` of a graph input read by nothing else."""
    buf, value = copy.args[0], copy.args[1]
    if not (isinstance(buf, fx.Node) and buf.op == "placeholder" and isinstance(value, fx.Node)
            and value.op == "call_function" and value.target is aten.add.Tensor and value.args[0] is buf
            and len(value.args) == 2 and isinstance(value.args[1], (int, float)) and not value.kwargs):
        return None
    if set(buf.users) != {value, copy} or set(value.users) != {copy} or copy.users:
        return None
    return copy, buf, value


def _increments_in_place(gm: fx.GraphModule, items: list, step) -> int:
    """The increments by ``step`` as one in-place op at the last of them: ``add_``, or one
    ``_foreach_add_`` for several (the buffers are read by nothing else: where is free)."""
    last = items[-1][0]
    with gm.graph.inserting_before(last):
        if len(items) == 1:
            buf, value = items[0][1], items[0][2]
            new = gm.graph.call_function(aten.add_.Tensor, (buf, step))
            new.meta["val"] = value.meta.get("val")
        else:
            new = gm.graph.call_function(aten._foreach_add_.Scalar, ([buf for _, buf, _ in items], step))
            new.meta["val"] = None
    for copy, _, value in items:
        gm.graph.erase_node(copy)
        gm.graph.erase_node(value)
    return len(items)


#: elementwise ops of two tensors whose operands may be regrouped (``inputs_in_row_space``)
_BINARY_POINTWISE = (aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor)
_REGROUPING_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def inputs_in_row_space(gm: fx.GraphModule) -> int:
    """``op(input, view(x))`` -> ``view(op(view(input), x))`` where the view only regroups the
    leading dims of a computed ``x`` (the last dim kept) and ``input`` is a graph input: the op
    then runs in ``x``'s own shape and joins the kernel that computes ``x``. A causal LM's
    backward adds the tangent of the returned (batch, tokens, vocab) logits to the loss's
    gradient, computed as (tokens, vocab) rows: the add ran as a kernel of its own (at Llama's
    8192 x 128256, 6 GB moved and one more logits-sized buffer at the step's memory peak,
    ``results/zoo_profile_llama_train_memory_h200.txt``); in row space it is the cross-entropy
    backward kernel's epilogue."""
    count = 0
    for node in list(gm.graph.nodes):
        regroup = _row_regrouping(node)
        if regroup is None:
            continue
        inp, view, position = regroup
        x = view.args[0]
        b = Builder(gm, node, fusion.value(node))
        try:
            flat = b.op(aten.view.default, inp, list(fusion.dims(x)))
            args = [flat, x] if position == 0 else [x, flat]
            inner = b.op(node.target, *args, *node.args[2:], **node.kwargs)
            new = b.op(aten.view.default, inner, list(fusion.dims(node)))
        except Exception:  # noqa: BLE001 - the input's layout does not take the view: leave it
            continue
        node.replace_all_uses_with(new)
        count += 1
    return _cleanup(gm, count)


def _row_regrouping(node) -> tuple | None:
    """(graph input, the view, the input's argument position) when ``node`` is a binary
    pointwise op of a graph input and a leading-dims regrouping view of a computed tensor of the
    same dtype, both of ``node``'s full shape."""
    if node.op != "call_function" or node.target not in _BINARY_POINTWISE or len(node.args) < 2:
        return None
    val = fusion.value(node)
    if not (isinstance(val, torch.Tensor) and hasattr(val, "fake_mode") and fusion.static_shape(val)):
        return None
    for position in (0, 1):
        inp, view = node.args[position], node.args[1 - position]
        if not (isinstance(inp, fx.Node) and inp.op == "placeholder" and isinstance(view, fx.Node)
                and view.op == "call_function" and view.target in _REGROUPING_VIEWS):
            continue
        x = view.args[0]
        if not (isinstance(x, fx.Node) and x.op == "call_function" and fusion.target_name(x) not in ops_table.VIEWS):
            continue
        shape, src, ishape = fusion.dims(node), fusion.dims(x), fusion.dims(inp)
        if (ishape == shape == fusion.dims(view) and len(src) < len(shape) and src[-1:] == shape[-1:]
                and fusion.value(inp).dtype == fusion.value(x).dtype == val.dtype):
            return inp, view, position
    return None


#: a sum over inner dims of at most this many elements becomes that many adds
SMALL_SUM_MAX = 16


_ONE_ELEMENT_REDUCTIONS = (aten.sum.dim_IntList, aten.mean.dim, aten.amax.default, aten.amin.default)


def reductions_of_one_element(gm: fx.GraphModule) -> int:
    """A sum, mean or extreme over dims of size 1 only -> its input, cast to the result's dtype (a
    fresh value, as the reduction's), the reduced dims squeezed unless kept. A softmax over a dim
    of size 1 has such a sum in its backward: the kernel's elements and its column values then
    had the same shape, every op took the column role, and the loop summing the rows read a value
    computed only after it (a kernel that did not run). Found by a random-program sweep."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _ONE_ELEMENT_REDUCTIONS:
            continue
        dims = _one_element_dims(node)
        if dims is None:
            continue
        val = fusion.value(node)
        b = Builder(gm, node, val)
        out = b.op(prims.convert_element_type.default, node.args[0], val.dtype)
        if not fusion.bound_args(node).get("keepdim", False):
            out = b.op(aten.squeeze.dims, out, dims)
        node.replace_all_uses_with(out)
        count += 1
    return _cleanup(gm, count)


def _one_element_dims(node) -> list | None:
    """The reduced dims (>= 0) where each has size 1 and the reduction is an identity, else None."""
    parts = _reduction_parts(node)
    if parts is None or any(parts[1].shape[d] != 1 for d in parts[2]) or parts[1].numel() == 0:
        return None
    return parts[2]


def _reduction_parts(node) -> tuple | None:
    """(source, its meta value, the reduced dims >= 0 in order (none given: every dim), keepdim) of
    a reduction over a tensor of static shape and rank >= 1, else None."""
    args = fusion.bound_args(node)
    src, val = args.get("self"), fusion.value(node)
    sval = fusion.value(src) if isinstance(src, fx.Node) else None
    if not isinstance(sval, torch.Tensor) or not isinstance(val, torch.Tensor) or not hasattr(val, "fake_mode") \
            or sval.dim() == 0 or not fusion.static_shape(sval):
        return None
    dims = args.get("dim")
    dims = [dims] if isinstance(dims, int) else list(dims or range(sval.dim()))
    return src, sval, sorted({d % sval.dim() for d in dims}), bool(args.get("keepdim", False))


def small_sums_as_adds(gm: fx.GraphModule) -> int:
    """``sum(x, dims)`` over dims that are neither the last nor all the leading ones, of at most
    ``SMALL_SUM_MAX`` elements in all -> the sum of the ``select`` views, accumulated in float32
    (as ATen's reduction accumulates 16-bit values). The backward of grouped-query attention's
    ``repeat_kv`` (an expand of the key and value heads) is such a sum over the group dim (4 in
    Llama-3.2-1B and Mixtral): no template generates it, so it ran as an ATen reduction, and the
    gradient's next op (RoPE's backward, an add) as a kernel of its own. As adds of strided views,
    it joins the pointwise kernel of what follows."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.sum.dim_IntList:
            continue
        plan = _small_sum(node)
        if plan is None:
            continue
        src, dims, keepdim = plan
        val = fusion.value(node)
        b = Builder(gm, node, val)
        acc_dtype = torch.float64 if val.dtype == torch.float64 else torch.float32
        total = None
        for index in itertools.product(*(range(fusion.value(src).shape[d]) for d in dims)):
            piece = src
            for d, i in sorted(zip(dims, index), reverse=True):  # highest dim first: lower dims keep their number
                piece = b.op(aten.select.int, piece, d, i)
            piece = b.op(prims.convert_element_type.default, piece, acc_dtype)
            total = piece if total is None else b.op(aten.add.Tensor, total, piece)
        total = b.op(prims.convert_element_type.default, total, val.dtype)
        if keepdim:
            for d in sorted(dims):
                total = b.op(aten.unsqueeze.default, total, d)
        node.replace_all_uses_with(total)
        count += 1
    return _cleanup(gm, count)


def _small_sum(node) -> tuple | None:
    """(source, reduced dims >= 0, keepdim) of a float sum over a few inner elements, else None."""
    parts = _reduction_parts(node)
    val = fusion.value(node)
    if parts is None or fusion.bound_args(node).get("dtype") is not None:
        return None
    src, sval, dims, keepdim = parts
    if not (val.is_floating_point() and val.dtype == sval.dtype):
        return None
    rank = sval.dim()
    if len(dims) == rank or dims == [rank - 1] or dims == list(range(rank - 1)):
        return None  # a row or column reduction (the templates generate those), or every dim
    elements = math.prod(sval.shape[d] for d in dims)
    return (src, dims, keepdim) if 1 <= elements <= SMALL_SUM_MAX else None


#: factories whose value is made afresh on every call and read by nothing before it is written
_FRESH_BUFFERS = (aten.empty.memory_format, aten.empty_permuted.default, aten.empty_strided.default,
                  aten.new_empty.default)


def index_puts_in_place(gm: fx.GraphModule) -> int:
    """``index_put(fresh, idx, v, acc)`` -> ``index_put_(fresh, idx, v, acc)`` where ``fresh`` is a
    fill or an uninitialized buffer made on every call. The functional op copies its base before
    writing into it: an embedding's backward (``embedding_dense_backward``, decomposed) filled a
    (vocab, hidden) float32 buffer with zeros, copied it whole (a ``memcpy DtoD``: 1 GB and 0.5 ms
    at Llama's 128256 x 2048 on the H200), then accumulated the rows; Mixtral's routing writes its
    tokens back the same way. A base that other ops read too is first duplicated (a fill or an
    allocation, no copy of data), so each ``index_put_`` writes into a buffer of its own."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.index_put.default:
            continue
        base = node.args[0]
        if not _fresh_buffer(base):
            continue
        if len(base.users) > 1:
            with gm.graph.inserting_before(node):
                own = gm.graph.node_copy(base)
            own.meta = dict(base.meta)
            node.replace_input_with(base, own)
        node.target = aten.index_put_.default
        count += 1
    if count:
        gm.recompile()
    return count


def scatter_sums_into_one_buffer(gm: fx.GraphModule) -> int:
    """``add(index_put_(a, I, v, True), index_put_(zeros, J, w, True))`` ->
    ``index_put_(index_put_(a, I, v, True), J, w, True)``: a sum of accumulating scatters, each into
    a zero fill of its own, accumulates into one buffer. The backward of a gather that reads a
    tensor at several places is such a sum: bilinear interpolation's (four neighbours) was four
    fills, four scatters and three adds, now one fill and four scatters into it (bicubic: sixteen).
    Only where both scatters are read by the add alone, and the second's base is a zero fill read
    by its scatter alone."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.add.Tensor or node.kwargs.get("alpha", 1) != 1:
            continue
        if len(node.args) != 2 or node.args[0] is node.args[1] or not all(_private_scatter(a, node) for a in node.args):
            continue  # (``s + s``: one scatter added to itself is no second buffer to merge)
        first, second = node.args
        if not _zero_fill_of(second):
            first, second = second, first
        if not _zero_fill_of(second) or fusion.value(first).shape != fusion.value(node).shape \
                or fusion.value(first).dtype != fusion.value(node).dtype:
            continue
        with gm.graph.inserting_before(node):
            merged = gm.graph.call_function(aten.index_put_.default, (first,) + tuple(second.args[1:]), second.kwargs)
        merged.meta = dict(node.meta)
        node.replace_all_uses_with(merged)
        gm.graph.erase_node(node)
        fill = second.args[0]
        gm.graph.erase_node(second)
        gm.graph.erase_node(fill)
        count += 1
    if count:
        gm.recompile()
    return count


def half_precision_scatters_in_float32(gm: fx.GraphModule) -> int:
    """Accumulating scatters of float16 / bfloat16 values into a zero fill (a chain of them into
    one buffer) -> the same scatters of the values cast to float32 into a float32 zero fill, cast
    back once at the end. Atomic adds are generated in float32 only, so Mixtral's expert outputs,
    scattered back to their tokens in bfloat16 in the backward, ran ATen's sorting ``index_put_``
    (radix sorts, a histogram and its own kernel, four times a step on the H100) where Inductor
    accumulates in float32. The sums are at least as exact (one rounding at the end). Only where
    the float32 scatters are then generated (``fusion.classify``: indices proved in range); deterministic algorithms keep ATen's sorted kernel."""
    if torch.are_deterministic_algorithms_enabled():
        return 0
    count = 0
    for fill in list(gm.graph.nodes):
        chain = _half_precision_scatter_chain(fill)
        if not chain:
            continue
        last = chain[-1]
        b = Builder(gm, last, fusion.value(last))
        try:
            buffer = b.op(fill.target, *fill.args, **{**fill.kwargs, "dtype": torch.float32})
            for scatter in chain:
                values = b.op(prims.convert_element_type.default, scatter.args[2], torch.float32)
                buffer = b.op(aten.index_put_.default, buffer, scatter.args[1], values, True)
                kind, why = fusion.classify(buffer)  # (marks it a generated scatter: the next one's base)
                if kind != "scatter":
                    raise ValueError(why)
            result = b.op(prims.convert_element_type.default, buffer, fusion.value(last).dtype)
        except (RuntimeError, ValueError):
            b.undo()
            continue
        last.replace_all_uses_with(result)
        for scatter in reversed(chain):
            gm.graph.erase_node(scatter)
        count += 1
    return _cleanup(gm, count)


def _half_precision_scatter_chain(fill) -> list:
    """The accumulating ``index_put_`` chain into ``fill``, a float16 / bfloat16 zero fill of
    static sizes that only the chain's first scatter reads, each scatter read only by the next
    (the last by anything); [] where ``fill`` is not such a buffer."""
    val = fusion.value(fill) if isinstance(fill, fx.Node) else None
    if not (isinstance(val, torch.Tensor) and val.dtype in (torch.float16, torch.bfloat16)
            and fill.op == "call_function" and fill.target is aten.full.default and len(fill.users) == 1
            and fusion.is_constant(fill) and fusion.constant_value(fill) == 0
            and all(isinstance(d, int) for d in val.shape)):
        return []
    chain, node = [], next(iter(fill.users))
    while (node.op == "call_function" and node.target is aten.index_put_.default and len(node.args) >= 3
           and fusion.accumulating_index_put(node) and node.args[0] is (chain[-1] if chain else fill)
           and isinstance(node.args[2], fx.Node) and fusion.value(node.args[2]).dtype == val.dtype):
        chain.append(node)
        if len(node.users) != 1:
            break
        node = next(iter(node.users))
    return chain


def _private_scatter(node, reader) -> bool:
    """An accumulating in-place ``index_put_`` whose result ``reader`` alone reads."""
    return (isinstance(node, fx.Node) and node.op == "call_function" and node.target is aten.index_put_.default
            and fusion.accumulating_index_put(node) and set(node.users) == {reader} and len(node.args) >= 3)


def _zero_fill_of(scatter) -> bool:
    """The scatter's base is a zero fill that only the scatter reads."""
    base = scatter.args[0]
    return (isinstance(base, fx.Node) and fusion.is_constant(base) and fusion.constant_value(base) == 0
            and set(base.users) == {scatter})


def _fresh_buffer(node) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and (
        fusion.is_constant(node) or node.target in _FRESH_BUFFERS)


def _cleanup(gm, count: int) -> int:
    if count:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return count


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
    return _cleanup(gm, rewritten)


#: a scatter of at most this many values a row is restated as that many comparisons
_SCATTERED_PER_ROW = 8


def _eligible(node, source, index) -> bool:
    """One index per row (a scatter: a few) along the last dim of a floating-point tensor with
    static sizes."""
    val, idx = fusion.value(source), fusion.value(index)
    if not (isinstance(val, torch.Tensor) and isinstance(idx, torch.Tensor) and hasattr(val, "fake_mode")):
        return False
    if not val.dtype.is_floating_point or val.dtype not in fusion.SUPPORTED_DTYPES or val.dim() == 0:
        return False
    if idx.dim() != val.dim() or not all(isinstance(s, int) for s in (*val.shape, *idx.shape)):
        return False
    dim = node.args[1] % val.dim()
    # a gather picks one value a row; a scatter may place up to _SCATTERED_PER_ROW (a top-k's
    # backward puts k gradients a row back among the experts: Mixtral's router, k = 2)
    per_row = _SCATTERED_PER_ROW if node.target in (aten.scatter.value, aten.scatter.src) else 1
    if dim != val.dim() - 1 or not 1 <= idx.shape[-1] <= per_row or tuple(idx.shape[:-1]) != tuple(val.shape[:-1]):
        return False
    if node.kwargs.get("sparse_grad") or node.kwargs.get("reduce") or len(node.args) > 4:
        return False
    return node.target is not aten.scatter.src or tuple(fusion.value(node.args[3]).shape) == tuple(idx.shape)


class Builder:
    """Inserts nodes before ``anchor`` and gives each its fake value (what fusion reads)."""

    def __init__(self, gm: fx.GraphModule, anchor: fx.Node, like: torch.Tensor):
        self.gm, self.anchor, self.fake_mode, self.device = gm, anchor, like.fake_mode, like.device
        self.made: list = []  # the nodes inserted so far, for ``undo``

    def op(self, target, *args, **kwargs) -> fx.Node:
        with self.gm.graph.inserting_before(self.anchor):
            node = self.gm.graph.call_function(target, args, kwargs)
        vals = fx.node.map_arg((args, kwargs), fusion.value)
        try:
            with self.fake_mode:
                node.meta["val"] = target(*vals[0], **vals[1])
        except Exception:  # the op does not apply to these values: leave the graph as it was
            self.gm.graph.erase_node(node)
            raise
        self.made.append(node)
        return node

    def undo(self) -> None:
        """Erase the nodes this builder inserted (a restatement given up halfway): left in the
        graph unread, an elementwise one would still be planned, a kernel computing nothing used."""
        for node in reversed(self.made):
            if not node.users:
                self.gm.graph.erase_node(node)
        self.made.clear()

    def scalar(self, value, dtype) -> fx.Node:
        return self.op(aten.scalar_tensor.default, value, dtype=dtype, device=self.device)

    def columns(self, n: int) -> fx.Node:
        """``arange(n)`` (int64) as a buffer of the graph module: made once, read by every call."""
        return self.constant(f"_kl_columns_{n}_{self.device.type}_{self.device.index}",
                             lambda: torch.arange(n, device=self.device), arange=(0, 1))

    def constant(self, name: str, make, arange: tuple | None = None) -> fx.Node:
        """A get_attr of buffer ``name`` of the graph module, ``make()`` once (a real tensor);
        ``arange``: (start, step) when the buffer is an arange (a row kernel reading it along its
        row computes it from the column index instead: ``emit.arange_of``)."""
        if not hasattr(self.gm, name):
            from torch._subclasses.fake_tensor import unset_fake_temporarily

            with unset_fake_temporarily():  # a real tensor, even while aot_autograd traces
                self.gm.register_buffer(name, make())
        with self.gm.graph.inserting_before(self.anchor):
            node = self.gm.graph.get_attr(name)
        node.meta["val"] = self.fake_mode.from_tensor(getattr(self.gm, name), static_shapes=True)
        if arange is not None:
            node.meta["kl_arange"] = arange
        return node

    def in_range(self, index: fx.Node, n: int) -> fx.Node:
        return self.op(aten.logical_and.default, self.op(aten.ge.Scalar, index, 0), self.op(aten.lt.Scalar, index, n))


def _rewrite_gather(gm, node) -> None:
    source, _, index = node.args[:3]
    val = fusion.value(source)
    n = val.shape[-1]
    b = Builder(gm, node, val)
    # gather(x - r1 - r2, t) = gather(x, t) - r1 - r2 for per-row r (log_softmax's max and log-sum):
    # the pick then reads x itself and rides along the softmax's own pass over the row
    # (placed right after x and the index: the softmax's reductions, later in the graph, then join
    # the pick's kernel because it reads their input)
    source, per_row = _row_subtractions(source)
    early = b
    if per_row:
        first_reader = next(n for n in gm.graph.nodes if source in n.all_input_nodes)
        if _hoist_before(gm, index, first_reader):
            early = Builder(gm, first_reader, val)
    hit = early.op(aten.eq.Tensor, early.columns(n), index)
    picked = early.op(aten.sum.dim_IntList, early.op(aten.where.self, hit, source, early.scalar(0, val.dtype)), [-1], True)
    for r in per_row:
        picked = b.op(aten.sub.Tensor, picked, r)
    result = b.op(aten.where.self, b.in_range(index, n), picked, b.scalar(float("nan"), val.dtype))
    node.replace_all_uses_with(result)


def _hoist_before(gm: fx.GraphModule, node: fx.Node, anchor: fx.Node) -> bool:
    """Move ``node`` and those of its producers that come after ``anchor`` to just before it, in
    their order, when all of them are pure ATen ops; False (nothing moved) otherwise."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    late, stack = set(), [node]
    while stack:
        n = stack.pop()
        if n in late or order[n] < order[anchor]:
            continue
        if n.op != "call_function" or n.is_impure() or n is anchor:
            return False
        late.add(n)
        stack.extend(n.all_input_nodes)
    for n in sorted(late, key=order.get):
        anchor.prepend(n)
    return True


def _row_subtractions(source: fx.Node) -> tuple:
    """(x, [r1, r2, ...]) for ``source = x - r1 - r2 ...`` where each r is one value per row
    (``fusion.constant_along_rows``) of x's dtype that broadcasts into x without growing it (x has
    the difference's shape): innermost first; (source, []) otherwise."""
    per_row = []
    while (source.op == "call_function" and source.target is aten.sub.Tensor and len(source.args) == 2
           and not source.kwargs and all(isinstance(a, fx.Node) for a in source.args)):
        x, r = source.args
        xv, rv, sv = fusion.value(x), fusion.value(r), fusion.value(source)
        if not (isinstance(xv, torch.Tensor) and isinstance(rv, torch.Tensor) and xv.shape == sv.shape
                and xv.dtype == rv.dtype == sv.dtype and fusion.constant_along_rows(r)):
            break
        per_row.append(r)
        source = x
    return source, per_row[::-1]


def _rewrite_scatter(gm, node) -> None:
    base, _, index, src = node.args[:4]
    val = fusion.value(base)
    n = val.shape[-1]
    b = Builder(gm, node, val)
    k = fusion.value(index).shape[-1]
    if node.target is aten.scatter.value:
        src = b.scalar(src, val.dtype)
    columns, scattered, in_range = b.columns(n), base, None
    # k indices a row: the j-th value where the column is the j-th index; a later j wins a column
    # two indices name, as ATen's CPU loop writes them in order (CUDA's order is unspecified)
    for j in range(k):
        index_j = index if k == 1 else b.op(aten.slice.Tensor, index, -1, j, j + 1)
        src_j = src if k == 1 or not isinstance(src, fx.Node) or fusion.value(src).dim() == 0 else \
            b.op(aten.slice.Tensor, src, -1, j, j + 1)
        scattered = b.op(aten.where.self, b.op(aten.eq.Tensor, columns, index_j), src_j, scattered)
        inside = b.in_range(index_j, n)
        in_range = inside if in_range is None else b.op(aten.logical_and.default, in_range, inside)
    result = b.op(aten.where.self, in_range, scattered, b.scalar(float("nan"), val.dtype))
    node.replace_all_uses_with(result)
