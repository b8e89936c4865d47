"""Row scatter-add: ``index_put_(base, [idx], values, accumulate=True)`` as one kernel of atomic adds.

An embedding's backward (``embedding_dense_backward``, decomposed) adds every token's gradient row
into the weight row of its id: ``zeros(V, H).index_put_([ids], dy, accumulate=True)``. ATen's CUDA
kernel for an accumulating ``index_put_`` sorts the indices and walks equal ones one after another:
BERT's token-type ids (all 0: 8192 rows into one) and position ids (16 rows each) took 5.7 ms of
a 25.7 ms training step on the H200 (``benchmarks/results/zoo_profile_bert_train_h200.txt``), where
Inductor's kernel of atomic adds takes ~0.1 ms.

Here each program takes ``ROWS`` indices and adds their value rows into ``base`` with float32
atomic adds, ``BLOCK`` columns at a time: every value is read once (4 bytes a value, plus one
8-byte index a row) and every add is one atomic in L2, where equal indices meet. The order of the
additions is not fixed (floating-point addition is not associative): under
``torch.use_deterministic_algorithms(True)`` ATen's sorted kernel runs instead, as it does for
every call outside the fast path (:func:`fast_path`).

An index outside ``[-V, V)`` makes eager PyTorch stop with an error; a kernel cannot raise, so such
a row adds NaN to row 0 instead: loud, never a plausible wrong number (the convention of the
compiler's other indexing, ``rewrites.one_hot_indexing``). Embedding indices never get here out of
range: the forward's lookup of the same ids has already raised.

Place scatter-add (``kl_scatter_add``): indices on several consecutive dims, broadcast together
(``zeros(N, C, H, W).index_put_([None, None, ih, iw], dy, accumulate=True)``: the backward of an
interpolation's gather of a neighbour), one atomic add per value, ``BLOCK`` values a program. It
runs only where the compiler proved the indices in range (``bounds.py``: the forward proved them
and saved them for the backward), so it has no out-of-range convention: anything unproved is ATen's.
"""
from __future__ import annotations

import functools
import math

import torch

from ..launch import Launcher
from .fusion import accumulating_index_put as accumulates, gathered_shape
from .group_runner import interpreted
from .templates.base import pow2

__all__ = ["KERNEL_NAME", "PLACES_KERNEL_NAME", "ScatterAddRows", "accumulates", "fast_path", "fits", "places_fit"]

aten = torch.ops.aten

#: the kernel's name, as profilers and ``kernelab.count`` show it
KERNEL_NAME = "kl_scatter_add_rows"
#: the place scatter-add kernel's name
PLACES_KERNEL_NAME = "kl_scatter_add"
#: index rows per program, and the widest column block one step of a program adds
ROWS, MAX_BLOCK = 4, 1024
#: values a program of the place kernel adds, and the most indexed dims it takes
PLACES_BLOCK, MAX_INDEXED = 1024, 3


def fits(base: torch.Tensor, indices, values: torch.Tensor) -> bool:
    """Does the call have the kernel's form, whatever its device? One index tensor (int64 or int32)
    on the first dim of a contiguous, non-empty float32 ``base``, ``values`` of exactly
    ``indices.shape + base.shape[1:]`` and ``base``'s dtype, deterministic algorithms off. (An
    empty ``base`` has no row 0 to flag a bad index in: ATen runs it, and raises.)"""
    if len(indices) != 1 or indices[0] is None or torch.are_deterministic_algorithms_enabled():
        return False
    idx = indices[0]
    if idx.dtype not in (torch.int64, torch.int32) or base.dtype != torch.float32 or values.dtype != base.dtype:
        return False
    return base.dim() >= 1 and base.numel() > 0 and base.is_contiguous() and \
        tuple(values.shape) == tuple(idx.shape) + tuple(base.shape[1:])


def places_fit(base: torch.Tensor, indices, values: torch.Tensor) -> bool:
    """The place kernel's form: up to three integer index tensors on consecutive dims of a
    contiguous, non-empty float32 ``base``, broadcast together, ``values`` of the gather's shape
    (``base`` with the indexed dims replaced by the indices' broadcast shape), deterministic
    algorithms off. The indices' range is the caller's proof (``ScatterAddRows(proved=True)``)."""
    if torch.are_deterministic_algorithms_enabled() or base.dtype != torch.float32 or values.dtype != base.dtype:
        return False
    dims = [d for d, i in enumerate(indices) if i is not None]
    if not dims or len(dims) > MAX_INDEXED or dims != list(range(dims[0], dims[-1] + 1)):
        return False
    idx = [indices[d] for d in dims]
    if any(i.dtype not in (torch.int64, torch.int32) for i in idx) or base.numel() == 0 or not base.is_contiguous():
        return False
    return tuple(values.shape) == gathered_shape(base.shape, [i.shape for i in idx], dims)


def fast_path(base: torch.Tensor, indices, values: torch.Tensor) -> bool:
    """Does the kernel run this call? It :func:`fits`, on one CUDA device (or on the CPU under
    Triton's interpreter). Anything else runs ATen's ``index_put_``."""
    if not fits(base, indices, values) or len({base.device, indices[0].device, values.device}) != 1:
        return False
    return base.is_cuda or (interpreted() and base.device.type == "cpu")


def _on_our_device(base, indices, values) -> bool:
    tensors = [base, values] + [i for i in indices if i is not None]
    if len({t.device for t in tensors}) != 1:
        return False
    return base.is_cuda or (interpreted() and base.device.type == "cpu")


class ScatterAddRows:
    """Runs an accumulating ``index_put_`` node: the row kernel on its fast path, the place kernel
    where the node's indices were proved in range (``proved``) and the call has its form, ATen
    otherwise."""

    kernel_name = KERNEL_NAME

    def __init__(self, proved: bool = False):
        self.proved = proved

    def kernel_for(self, base, indices, values) -> str | None:
        """The kernel a call of this form runs, whatever its device (a plan's prediction), or None
        (ATen's ``index_put_``)."""
        if fits(base, indices, values):
            return KERNEL_NAME
        return PLACES_KERNEL_NAME if self.proved and places_fit(base, indices, values) else None

    def __call__(self, base, indices, values, accumulate=False):
        if accumulate and self.proved and not fits(base, indices, values) and places_fit(base, indices, values) \
                and _on_our_device(base, indices, values):
            return _scatter_add_places(base, indices, values)
        if not accumulate or not fast_path(base, indices, values):
            return aten.index_put_.default(base, indices, values, accumulate)
        idx = indices[0].reshape(-1)
        n_idx = idx.numel()
        width = base.numel() // base.shape[0]  # base is not empty (fits)
        if n_idx == 0:
            return base
        # a view where the values' layout allows one (any strides: a transposed gradient, as a
        # product's backward hands over, is read through both of them), else one copy
        rows = values.reshape(n_idx, width)
        block = min(pow2(width), MAX_BLOCK)
        grid = ((n_idx + ROWS - 1) // ROWS,)
        _launcher()(grid, base, idx, rows, n_idx, base.shape[0], width, rows.stride(0), rows.stride(1),
                    ROWS=ROWS, BLOCK=block, num_warps=4 if block >= 512 else 2)
        return base


def _scatter_add_places(base, indices, values):
    """base[..., i, j, ...] += values, one atomic add per value (``places_fit``; indices proved)."""
    if values.numel() == 0:
        return base
    dims = [d for d, i in enumerate(indices) if i is not None]
    first, last = dims[0], dims[-1] + 1
    idx = [i.to(torch.int64).contiguous() for i in torch.broadcast_tensors(*(indices[d] for d in dims))]
    places = idx[0].numel()  # positions of the indices' broadcast shape
    inner = math.prod(base.shape[last:])  # elements of the dims after the indexed ones
    outer_stride = math.prod(base.shape[first:])  # one step of the dims before them (base is contiguous)
    strides = [base.stride(d) for d in dims] + [0] * (MAX_INDEXED - len(dims))
    pointers = idx + [idx[0]] * (MAX_INDEXED - len(dims))  # unused slots: never read (K)
    src = values.contiguous()
    numel = src.numel()
    grid = ((numel + PLACES_BLOCK - 1) // PLACES_BLOCK,)
    _places_launcher()(grid, base, src, *pointers, numel, places, inner, outer_stride, *strides,
                       K=len(dims), BLOCK=PLACES_BLOCK, num_warps=4)
    return base


@functools.cache
def _launcher() -> Launcher:
    return Launcher(_kernel(), interpreted())


@functools.cache
def _places_launcher() -> Launcher:
    return Launcher(_places_kernel(), interpreted())


@functools.cache
def _places_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def kl_scatter_add(base_ptr, src_ptr, i0_ptr, i1_ptr, i2_ptr, numel, places, inner, outer_stride,
                       stride0, stride1, stride2, K: tl.constexpr, BLOCK: tl.constexpr):
        # value v at (outer o, place p of the indices' broadcast shape, inner t), contiguous;
        # it goes to base[o, i0[p], i1[p], i2[p], t]: o * outer_stride + sum(ik[p] * stride_k) + t
        v = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = v < numel
        t = v % inner
        q = v // inner
        p = q % places
        o = q // places
        target = o * outer_stride + t + tl.load(i0_ptr + p, mask=mask, other=0).to(tl.int64) * stride0
        if K > 1:
            target += tl.load(i1_ptr + p, mask=mask, other=0).to(tl.int64) * stride1
        if K > 2:
            target += tl.load(i2_ptr + p, mask=mask, other=0).to(tl.int64) * stride2
        value = tl.load(src_ptr + v, mask=mask, other=0.0)
        tl.atomic_add(base_ptr + target, value, mask=mask, sem="relaxed")

    return kl_scatter_add


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def kl_scatter_add_rows(base_ptr, idx_ptr, src_ptr, n_idx, n_rows, width, src_stride, src_col_stride,
                            ROWS: tl.constexpr, BLOCK: tl.constexpr):
        # ROWS indices a program; their value rows are added into base[idx] BLOCK columns a step
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        rmask = rows < n_idx
        idx = tl.load(idx_ptr + rows, mask=rmask, other=0).to(tl.int64)
        idx = tl.where(idx < 0, idx + n_rows, idx)  # negative indices count from the end, as in torch
        ok = (idx >= 0) & (idx < n_rows)
        target = tl.where(ok, idx, 0)[:, None] * width  # out of range: NaN into row 0 (module doc)
        source = rows.to(tl.int64)[:, None] * src_stride
        for start in range(0, width, BLOCK):
            cols = start + tl.arange(0, BLOCK)[None, :]
            mask = rmask[:, None] & (cols < width)
            # (a column stride of 1, the usual case, is specialized by Triton: contiguous loads)
            v = tl.load(src_ptr + source + cols * src_col_stride, mask=mask, other=0.0)
            v = tl.where(ok[:, None], v, float("nan"))
            tl.atomic_add(base_ptr + target + cols, v, mask=mask, sem="relaxed")

    return kl_scatter_add_rows
