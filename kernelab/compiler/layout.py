"""Row strides padded to 16 bytes around matrix products (Inductor's "comprehensive padding").

cuBLAS chooses its kernels by the alignment of each matrix's leading dimension. A row of 50257
bf16 values (GPT-2's vocabulary) is 100514 bytes: 2-byte aligned, so every product that writes or
reads the (tokens, vocab) logits runs an sm75 CUTLASS kernel for unaligned operands
(``cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_tn_align1``): 6.7 ms of GPT-2's 12.0 ms
inference step on the H200, where Inductor, whose buffers have padded strides, ran the same product
in 0.88 ms (``benchmarks/results/zoo_profile_gpt2_infer_h200.txt``).

The plan: a value whose rows are long (at least ``PAD_MIN_COLS`` columns, Inductor's threshold) and
not a multiple of 16 bytes is laid out with its row stride rounded up to 16 bytes when

* a matrix product computes it (the product writes into the padded buffer through ``out=``), or
* a generated kernel computes it and a matrix product reads it, directly or through views
  (cross-entropy's gradient of the logits, read by the LM head's two backward products).

The padding columns are never written nor read. A product the graph returns is returned padded,
a view of the padded buffer, as Inductor returns GPT-2's logits (row stride 50264; measured on an
H100, ``results/host_events_fast_runner_stop32_h100.txt``): the caller gets the values, in rows
16-byte apart, without a copy of the (tokens, vocabulary) matrix. Saved for the backward, a padded
value stays padded too (the backward's kernels take strides per call). Other padded values the
caller sees are copied back into the traced layout (``traced_layout``). A value is not padded when
a view of it would not exist on the padded layout (flattening the rows into one dim) or when an op
reads its storage by explicit strides (``as_strided``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.fx as fx

from .. import config
from . import fusion

__all__ = ["memory_order", "PAD_MIN_COLS", "ALIGN_BYTES", "PAD_N", "MATMULS", "padded_cols", "pads_columns", "Padding", "plan",
           "copies_as_kernels", "visible",
           "PaddedProduct", "WidenedProduct", "padded_copy", "traced_layout", "enabled"]

#: Rows shorter than this stay unpadded (Inductor's ``padding_stride_threshold``): the padding's
#: memory and the broken-up contiguous spans cost more than an unaligned product loses there.
PAD_MIN_COLS = 1024
#: cuBLAS's fast kernels want every leading dimension a multiple of 16 bytes.
ALIGN_BYTES = 16
#: Matrix products run by ATen: their output can be written into a padded buffer (``out=``).
MATMULS = {"aten.mm.default": torch.ops.aten.mm.out, "aten.addmm.default": torch.ops.aten.addmm.out,
           "aten.bmm.default": torch.ops.aten.bmm.out}
#: Ops that read their input through a layout of their own: the input must keep the traced layout.
_EXPLICIT_LAYOUT = {"aten.as_strided.default", "aten._reinterpret_tensor.default", "aten.view_as_real.default",
                    "aten.view_as_complex.default", "aten.view.dtype"}
#: Views whose result on the padded layout is checked by replaying them (on meta tensors).
_VIEWS = {"aten.view.default", "aten._unsafe_view.default", "aten.permute.default", "aten.transpose.int",
          "aten.t.default", "aten.expand.default", "aten.unsqueeze.default", "aten.squeeze.dim", "aten.squeeze.dims",
          "aten.squeeze.default", "aten.select.int", "aten.slice.Tensor", "aten.alias.default", "aten.detach.default"}


def padded_cols(n_cols: int, itemsize: int) -> int:
    """The row stride, in elements, of a row of ``n_cols`` values: rounded up to ``ALIGN_BYTES``
    when the row is long and unaligned, else ``n_cols``."""
    if n_cols < PAD_MIN_COLS or (n_cols * itemsize) % ALIGN_BYTES == 0 or ALIGN_BYTES % itemsize:
        return n_cols
    per = ALIGN_BYTES // itemsize
    return -(-n_cols // per) * per


#: Whether a padded product also pads its N (the weight copied into padded columns, as Inductor's
#: ``pad_mm`` does), for products of at least ``PAD_N_MIN_ROWS`` rows (the copy of the (K, N)
#: operand costs as much as the product below a few hundred rows). Decided on the H200 with
#: ``benchmarks/mm_alignment.py``.
PAD_N = True
PAD_N_MIN_ROWS = 1024


def pads_columns(shape) -> bool:
    """Whether a padded product of output ``shape`` pads its N too (``PAD_N``)."""
    rows = 1
    for s in shape[:-1]:
        rows *= s
    return PAD_N and rows >= PAD_N_MIN_ROWS


def padded_strides(shape, row_stride: int) -> list[int]:
    """Strides of a row-major layout of ``shape`` whose rows are ``row_stride`` elements apart."""
    strides, step = [1] * len(shape), row_stride
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = step
        step *= shape[d]
    return strides


@dataclass
class Padding:
    """The plan for one graph: padded row stride per value, and the returned values to copy back."""

    rows: dict = field(default_factory=dict)  # fx.Node -> padded row stride (elements)
    #: returned nodes whose value may come out padded: copied into the traced layout
    restore: set = field(default_factory=set)
    widen: dict = field(default_factory=dict)  # fx.Node (an ATen mm reading a padded value) -> row stride
    #: graph inputs copied into padded rows as the graph starts (a gradient of the logits that the
    #: loss's graph computed, read by this graph's backward products)
    copies: set = field(default_factory=set)
    #: returned nodes that come out with the padded rows of a product (as Inductor returns them)
    returned_padded: set = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.rows)

    def describe(self) -> list[str]:
        """One line per padded value, for ``explain`` and ``KERNELAB_DEBUG=2``."""
        lines = []
        for node, stride in self.rows.items():
            cols = fusion.value(node).shape[-1]
            how = "a product writes" if fusion.target_name(node) in MATMULS else "a product reads"
            how = "an input a product reads" if node.op == "placeholder" else how
            lines.append(f"{node.name}: rows of {cols} padded to {stride} ({how} it; 16-byte aligned for cuBLAS)")
        lines += [f"{node.name}: returned, copied back into its unpadded layout" for node in self.restore]
        lines += [f"{node.name}: returned with its padded rows (as Inductor returns a product): the caller's "
                  f"tensor is a view whose rows are {self.rows[_padded_source(node, self.rows)]} elements apart; "
                  f"flatten it with .reshape, not .view" for node in self.returned_padded]
        lines += [f"{node.name}: a product reading padded rows, run on the whole padded matrix"
                  for node in self.widen]
        lines += [f"{node.name}: an input copied into padded rows" for node in self.copies]
        return lines


def plan(gm: fx.GraphModule, part, returned: set) -> Padding:
    """Which values of ``gm`` get padded rows. ``part``: the partition (a generated kernel's
    outputs are padded only when a product reads them); ``returned``: the graph's output nodes."""
    rows, copies = {}, set()
    for node in gm.graph.nodes:
        stride = _candidate(node)
        if stride is None:
            continue
        group = part.group_of.get(node)
        by_matmul = group is None and fusion.target_name(node) in MATMULS
        by_kernel = group is not None and _padding_kernel(group, node) and _read_by_matmul(node)
        by_copy = node.op == "placeholder" and _rows(node) >= PAD_N_MIN_ROWS and _read_by_matmul(node)
        if (by_matmul or by_kernel or by_copy) and _views_hold(node, stride):
            rows[node] = stride
            if by_copy:
                copies.add(node)
    widen = {}
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.mm.default and node not in rows:
            source = _padded_source(node.args[0], rows)
            if source is not None:
                widen[node] = rows[source]
    # a returned product (or view of one) keeps its padded rows, as Inductor returns them: the
    # caller sees its values through a view whose rows are the padded stride apart (GPT-2's logits
    # come back from Inductor with a row stride of 50264); other padded values go back into the
    # traced layout
    restore = {n for n in returned if _reaches(n, rows) and fusion.target_name(_padded_source(n, rows)) not in MATMULS}
    kept = {n for n in returned if _reaches(n, rows) and n not in restore}
    return Padding(rows, restore, widen, copies, kept)


def visible(output: fx.Node, visible_outputs: int | None) -> set:
    """The nodes among the graph's outputs that the caller sees: the first ``visible_outputs``
    (all where None). The others are saved for the backward graph, which takes them in any layout
    (its kernels take strides per call, its products run on padded rows where they find room):
    those stay padded, so that the padded product is the only copy of its value (BERT's saved
    logits over 30522 words were held twice at the forward's end, once padded and once copied
    back, and the backward's padded gradient of the logits could not take their memory)."""
    args = output.args[0]
    if visible_outputs is None or not isinstance(args, (list, tuple)):
        return set(output.all_input_nodes)
    found = []
    fx.node.map_arg(list(args[:visible_outputs]), found.append)
    return set(found)


def copies_as_kernels(gm: fx.GraphModule) -> int:
    """Before partitioning: an input with long unaligned rows that a product reads (the gradient of
    the logits that the loss's graph computed) is cloned for the products, as a ``clone`` node that
    a generated kernel computes: the clone is written padded (a generated kernel's value a product
    reads), instead of ``padded_copy`` at the graph's start (ATen's strided copy of unaligned rows
    ran at about 1.6 TB/s on the H200: 1.9 ms of GPT-2's training step with its copy back,
    ``results/zoo_profile_gpt2_llama_train_memory_h200.txt``). A returned product needs no copy:
    it is returned padded (``plan``). Where the plan then pads nothing (a view the padded layout
    cannot express), the clone is one copy. Returns how many clones were made."""
    count = 0
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node in placeholders:
        stride = _candidate(node)
        if stride is None or _rows(node) < PAD_N_MIN_ROWS or not _read_by_matmul(node) or not _views_hold(node, stride):
            continue
        with gm.graph.inserting_after(placeholders[-1]):
            clone = _clone(gm, node)
        if clone is not None:
            node.replace_all_uses_with(clone, delete_user_cb=lambda u: u is not clone)
            count += 1
    if count:
        gm.recompile()
    return count


def _clone(gm: fx.GraphModule, node: fx.Node) -> fx.Node | None:
    """A contiguous ``clone`` of ``node`` at the graph's insertion point, with its fake value."""
    val = fusion.value(node)
    if not hasattr(val, "fake_mode"):
        return None
    clone = gm.graph.call_function(torch.ops.aten.clone.default, (node,), {"memory_format": torch.contiguous_format})
    with val.fake_mode:
        clone.meta["val"] = torch.ops.aten.clone.default(val, memory_format=torch.contiguous_format)
    return clone


def _rows(node) -> int:
    shape = fusion.value(node).shape
    rows = 1
    for s in shape[:-1]:
        rows *= s
    return rows


def _padded_source(node, rows: dict):
    """The padded value ``node`` is (or is a view of), else None."""
    while isinstance(node, fx.Node):
        if node in rows:
            return node
        if fusion.target_name(node) not in _VIEWS or not node.args:
            return None
        node = node.args[0]
    return None


def _candidate(node: fx.Node) -> int | None:
    """The padded row stride of a contiguous, statically shaped, at least 2-D floating value
    with long unaligned rows; None for any other value."""
    val = fusion.value(node)
    if node.op not in ("call_function", "placeholder") or not isinstance(val, torch.Tensor) or val.dim() < 2:
        return None
    if not all(isinstance(s, int) for s in val.shape) or not val.is_floating_point() or not val.is_contiguous():
        return None
    stride = padded_cols(val.shape[-1], val.element_size())
    return stride if stride != val.shape[-1] else None


def _padding_kernel(group, node) -> bool:
    """Generated kernels that take an output's row stride: pointwise ones (every stride is an
    argument) and the full-size outputs of row reductions."""
    if fusion.is_scatter(node):  # its buffer is the scatter's own, added into at computed places
        return False
    return group.kind == "pointwise" or (group.kind == "reduction" and group.roles.get(node) == "full")


def _view_users(node: fx.Node) -> list:
    return [u for u in node.users if fusion.target_name(u) in _VIEWS and u.args and u.args[0] is node]


def _read_by_matmul(node: fx.Node) -> bool:
    """Whether a matrix product reads ``node``, directly or through views."""
    for u in node.users:
        if fusion.target_name(u) in MATMULS:
            return True
    return any(_read_by_matmul(v) for v in _view_users(node))


def _views_hold(node: fx.Node, stride: int) -> bool:
    """Every view of ``node`` (and views of those) exists on the padded layout, and no op reads
    it, or a view of it, by explicit strides: replayed on meta tensors."""
    val = fusion.value(node)
    padded = torch.empty_strided(tuple(val.shape), padded_strides(val.shape, stride), dtype=val.dtype, device="meta")
    return _replay(node, padded)


def _replay(node: fx.Node, value: torch.Tensor) -> bool:
    for u in node.users:
        name = fusion.target_name(u)
        if name in _EXPLICIT_LAYOUT:
            return False
        if name not in _VIEWS or not u.args or u.args[0] is not node:
            continue
        try:
            view = u.target(value, *u.args[1:], **u.kwargs)
        except (RuntimeError, ValueError):  # "view size is not compatible with input tensor's size and stride"
            return False
        if not _replay(u, view):
            return False
    return True


def _reaches(node, rows: dict) -> bool:
    """Whether ``node`` is a padded value or a view (of a view ...) of one."""
    return _padded_source(node, rows) is not None


# ---------------------------------------------------------------------------------------------
# at run time


class PaddedProduct:
    """An ATen matrix product (mm, addmm, bmm) writing into a buffer whose rows are ``row_stride``
    elements apart (``py``): cuBLAS takes the padded row stride as the output's leading
    dimension, so it runs its kernels for 16-byte aligned matrices."""

    __slots__ = ("out_op", "row_stride")

    def __init__(self, out_op, row_stride: int):
        self.out_op, self.row_stride = out_op, row_stride

    def __call__(self, *args, **kwargs):
        shape = _product_shape(self.out_op, args)
        ref = args[-1] if isinstance(args[-1], torch.Tensor) else args[1]
        full = torch.empty([*shape[:-1], self.row_stride], dtype=ref.dtype, device=ref.device)
        out = full[..., :shape[-1]]
        if pads_columns(shape):
            # the product's N padded too: ``b`` (and a 1-D bias) copied into padded columns, the
            # whole padded output computed, the first N columns returned
            self.out_op(*_with_padded_columns(self.out_op, args, self.row_stride), **kwargs, out=full)
            return out
        return self.out_op(*args, **kwargs, out=out)


def _with_padded_columns(out_op, args, n_pad: int) -> tuple:
    """``args`` of mm(a, b) / bmm(a, b) / addmm(bias, a, b) with ``b`` (and a 1-D ``bias``) widened
    to ``n_pad`` columns: copies in the operands' own layouts; the new columns are left unwritten
    (they only reach output columns nobody reads)."""
    args = list(args)
    b_at = 2 if out_op is torch.ops.aten.addmm.out else 1
    args[b_at] = _widened(args[b_at], n_pad)
    if b_at == 2 and isinstance(args[0], torch.Tensor) and args[0].dim() == 1 and args[0].shape[0] > 1:
        args[0] = _widened(args[0], n_pad)
    return tuple(args)


def _widened(t: torch.Tensor, n_pad: int) -> torch.Tensor:
    """``t`` (..., N) copied into the first N of ``n_pad`` columns, keeping whether its last two
    dims are stored row-major or transposed (a weight's ``.t()``)."""
    shape = [*t.shape[:-1], n_pad]
    if _has_room(t, n_pad):  # padded rows already (a value laid out by this plan): read them whole
        return t.as_strided(shape, t.stride())
    if t.dim() >= 2 and t.stride(-2) == 1 and t.stride(-1) != 1:  # column-major (K, N): allocate (N_pad, K)
        buf = torch.empty([*shape[:-2], n_pad, shape[-2]], dtype=t.dtype, device=t.device).transpose(-1, -2)
    else:
        buf = torch.empty(shape, dtype=t.dtype, device=t.device)
    buf[..., :t.shape[-1]].copy_(t)
    return buf


def _product_shape(out_op, args) -> list[int]:
    """The output shape of mm(a, b), addmm(bias, a, b) or bmm(a, b)."""
    if out_op is torch.ops.aten.addmm.out:
        a, b = args[1], args[2]
    else:
        a, b = args[0], args[1]
    return [*a.shape[:-1], b.shape[-1]]


def traced_layout(value: torch.Tensor, node: fx.Node) -> torch.Tensor:
    """``value`` in the layout the traced graph gave ``node`` (a copy when it came out padded)."""
    meta = fusion.value(node)
    if not isinstance(value, torch.Tensor) or tuple(value.stride()) == tuple(meta.stride()):
        return value
    out = torch.empty_strided(tuple(value.shape), tuple(meta.stride()), dtype=value.dtype, device=value.device)
    return out.copy_(value)


def enabled() -> bool:
    """Padded rows around matrix products (``py``); ``KERNELAB_PAD=0`` turns them off."""
    return config.pad()


def _has_room(t: torch.Tensor, n_pad: int) -> bool:
    """Whether ``t`` (..., N) is row-major with rows ``n_pad`` apart and its storage holds the
    padding of its last row too (a whole padded buffer, as this plan allocates them)."""
    if t.dim() < 2 or t.stride(-1) != 1 or t.stride(-2) != n_pad or list(t.stride()) != padded_strides(t.shape, n_pad):
        return False
    rows = t.numel() // max(t.shape[-1], 1)
    return t.untyped_storage().nbytes() >= (t.storage_offset() + rows * n_pad) * t.element_size()


class WidenedProduct:
    """``mm(a, b)`` where ``a`` is a padded value, or the transpose of one, whose padded dim makes
    the product unaligned (``benchmarks/results/mm_alignment_h200.csv``: GPT-2's backward products
    through the (tokens, 50257) gradient of the logits, 6.1 and 5.8 ms with the rows' stride padded
    alone, 1.0 and 1.1 ms run on the whole padded matrix):

    * ``a`` (M, N) with N the reduced dim: the padding columns are zeroed, ``b`` (N, K) gets as
      many zero rows, and the product runs over the padded N;
    * ``a`` = (N, M) transposed (N the output's rows): the padded rows' product is computed and its
      first N rows returned (the padding rows are never read).

    Anything else (the storage without the padding, another layout) runs the plain product."""

    __slots__ = ("n_pad",)

    def __init__(self, n_pad: int):
        self.n_pad = n_pad

    def __call__(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        n_pad = self.n_pad
        if a.dim() == 2 and a.shape[1] < n_pad and _has_room(a, n_pad):
            full = a.as_strided((a.shape[0], n_pad), a.stride())
            full[:, a.shape[1]:].zero_()
            b_full = torch.empty((n_pad, b.shape[1]), dtype=b.dtype, device=b.device)
            b_full[:b.shape[0]].copy_(b)
            b_full[b.shape[0]:].zero_()
            return torch.mm(full, b_full)
        if a.dim() == 2 and a.shape[0] < n_pad and _has_room(a.t(), n_pad):
            full = a.t().as_strided((a.shape[1], n_pad), a.t().stride()).t()
            return torch.mm(full, b)[:a.shape[0]]
        return torch.mm(a, b)


def padded_copy(t: torch.Tensor, n_pad: int) -> torch.Tensor:
    """``t`` (..., N) copied into rows ``n_pad`` apart, the padding zeroed (the reduced dim of a
    product may run over it): one pass over ``t``, against a product in cuBLAS's unaligned kernels
    (4-6x slower at GPT-2's 50257 columns, ``mm_alignment_h200.csv``)."""
    if t.dim() < 2 or t.shape[-1] >= n_pad:
        return t
    full = torch.empty((*t.shape[:-1], n_pad), dtype=t.dtype, device=t.device)
    full[..., t.shape[-1]:].zero_()
    out = full[..., :t.shape[-1]]
    return out.copy_(t)


def memory_order(t: torch.Tensor) -> list[int]:
    """``t``'s dims from outermost to innermost in memory (by stride, ties: the later dim inner):
    (0, 2, 3, 1) for a channels-last 4-D tensor, the identity for a contiguous one."""
    return sorted(range(t.dim()), key=lambda d: (-t.stride(d), -d)) if t.dim() else []
