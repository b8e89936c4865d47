"""linear_cross_entropy: a language model's head and its loss, without ever holding the [N, V] logits.

    logits = hidden @ weight.T (+ bias)           [N, H] x [V, H] -> [N, V], in the input dtype
    loss   = cross_entropy(logits.float(), target, ignore_index, reduction, label_smoothing)

The N token rows are processed in chunks of R rows. For each chunk (all on the GPU, no sync):

    logits_c = hidden_c @ W.T (+ bias)                       cuBLAS, into one reused [R, V] buffer
    one Triton kernel, one program per row: pass 1 reads the row (online logsumexp -> loss_i),
        pass 2 reads it again and overwrites it in place with
        dlogits = s_i * ((1 - eps) * (p - onehot(t)) + eps * p - eps / V),   p = exp(x - lse)
    dhidden_c  = dlogits_c @ W                              [R, V] x [V, H], straight into dhidden
    dW        += dlogits_c.T @ hidden_c                     [V, R] x [R, H], addmm_ (beta = 1)
    dbias     += sum over rows of dlogits_c                  float32

Memory: one [R, V] chunk besides the gradients (which must exist anyway); never [N, V].
Traffic per chunk: the chunk's logits are written once by the matmul, read twice and written once
by the kernel, read twice by the two gradient matmuls; dW is read and written once per chunk
(a [V, H] read-modify-write: fewer, larger chunks move less), dhidden written once.

Vocabulary chunks (``vocab_chunk`` < V; the default): the [R, V] chunk above is R x V elements
beside the gradients, where Liger-Kernel holds about N x H. Here a block of R token rows is
processed C classes at a time, twice:

    pass 1, for each class chunk c:  logits_c = hidden_b @ W_c.T (+ bias_c)      [R, C]
        one kernel merges the chunk's logsumexp, logit sum and target logit into the rows' running
        statistics; the last chunk turns them into loss_i
    pass 2, for each class chunk c, last first:  logits_c recomputed (the last one is still in
        the buffer), overwritten in place with dlogits_c
        dhidden_b += dlogits_c @ W_c       float32 accumulator [R, H] (cuBLAS, beta = 1)
        dW_c      (+)= dlogits_c.T @ hidden_b   [C, H] rows of dW: written by the first block,
                                                 accumulated by later ones (beta = 1)

Memory beside the gradients: [R, C] logits and the [R, H] float32 accumulator, together sized by
:func:`chunk_shape_for` to fit within Liger-Kernel's chunk of logits (near N x H elements).
Cost: the logits matmul twice but for each block's last chunk (4 matmuls of N x H x V instead
of 3), dW read and written once per token block (4 blocks), and (N / R) x (V / C) chunks of 6
launches each: the host's share grows as H shrinks (the budget is near N x H).

For reductions "mean" and "sum" the gradient is computed in the forward (as Liger-Kernel does: the
targets, hence the mean's divisor, are known) and the backward multiplies it by grad_output, in
place, skipping the multiplication when grad_output == 1 (``loss.backward()``: x * 1 == x exactly).
For "none" the per-row grad_output is only known in the backward, which recomputes the chunks.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from . import _common
from .cross_entropy import check_targets_on_host, logit_grad, row_lse, row_loss, row_scale, target_of

_REDUCTIONS = ("none", "mean", "sum")
#: Bytes of one chunk of logits ([R, V] in the input dtype), the memory the op adds beside the
#: gradients. Larger chunks: fewer read-modify-write passes over dW ([V, H], once per chunk) and
#: larger matmuls (dW's inner dimension is R); smaller: less memory. Liger-Kernel sizes its chunk
#: near N x H elements instead (ceil(N / ceil(V / H)) rows, a power of two). Not tuned on a GPU.
CHUNK_BYTES = 256 * 2**20
#: Columns per step of the fused kernel's row loops (cross_entropy's forward uses 2048 above 8192
#: classes), and warps from them (16 elements a thread). A chunk of fewer than FEW_ROWS_PER_SM rows
#: per SM (small chunks: Liger's rule gives 128-256 rows) runs FEW_ROWS_BLOCK_C columns per step,
#: so that the few programs there are keep enough loads in flight. Neither is tuned on a GPU.
BLOCK_C = 2048
FEW_ROWS_BLOCK_C = 8192
FEW_ROWS_PER_SM = 4
#: Elements per step of the in-place scale kernel, and its programs per SM.
SCALE_BLOCK = 4096
SCALE_PER_SM = 4


#: Token blocks of the vocabulary-chunked path: N is cut into this many blocks (rows a multiple of
#: 128 when above 512), so the float32 dhidden accumulator is N x H / BLOCKS floats.
VOCAB_PATH_BLOCKS = 4


def liger_chunk_rows(n: int, h: int, v: int) -> int:
    """Liger-Kernel's token chunk for its fused linear cross-entropy: next_pow2(ceil(N / ceil(V / H)))
    rows of V logits (near N x H elements), the memory it holds beside the gradients."""
    rows = -(-n // max(1, -(-v // max(1, h))))
    return 1 << max(0, rows - 1).bit_length()


def chunk_shape_for(n: int, h: int, v: int, elem_size: int) -> tuple[int, int]:
    """(rows, classes) per chunk of the default, vocabulary-chunked path. Memory beside the
    gradients within Liger-Kernel's chunk ([liger_chunk_rows, V] logits, at most N x V): the
    [rows, H] float32 accumulator of dhidden (rows a quarter of N past 512 rows, a multiple of 128;
    fewer when it would take more than half), the rest for the [rows, classes] logits. Classes a
    multiple of 128 (at least 128, at most V: V means one chunk, the token path). Launches scale
    as N x V / (rows x classes): a smaller budget costs host time (more, smaller chunks)."""
    budget = min(liger_chunk_rows(n, h, v), max(n, 1)) * max(v, 1) * elem_size
    rows = n if n <= 512 else _common.cdiv(_common.cdiv(n, VOCAB_PATH_BLOCKS), 128) * 128
    if rows > 512 and rows * h * 4 > budget // 2:
        rows = max(128, budget // 2 // (h * 4) // 128 * 128)
    rows = max(1, min(n, rows))
    acc = rows * h * 4 if elem_size < 4 else 0  # float32 inputs accumulate in dhidden itself
    small = n * 4 + rows * 12  # the rows' float32 losses and running statistics
    cols = max(0, budget - acc - small) // (rows * elem_size)
    cols = max(128, cols - cols % 128)
    return rows, min(max(v, 1), cols)


def chunk_rows_for(n: int, v: int, elem_size: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Rows per chunk: as many as fit ``chunk_bytes`` of [rows, v] logits, a multiple of 128 when
    at least 128 (tensor-core friendly inner dimension of dW's matmul), at least 1, at most n."""
    rows = chunk_bytes // max(1, v * elem_size)
    if rows >= 128:
        rows -= rows % 128
    return max(1, min(max(n, 1), rows))


# --------------------------------------------------------------------------- kernels
@triton.jit
def _lce_kernel(
    x_ptr, target_ptr, scale_ptr, denom_ptr, loss_ptr,
    stride_x, stride_scale,
    M, C,
    ignore_index, smoothing,
    SMOOTH: tl.constexpr, SCALED: tl.constexpr, MEAN: tl.constexpr, GRAD: tl.constexpr,
    BLOCK_C: tl.constexpr, STAGES: tl.constexpr,
):
    """One row of logits per program: loss_i (float32) and, with GRAD, the row overwritten in place
    by d loss / d logits = s_i * logit_grad, s_i = grad_i (SCALED, else 1) / denom (MEAN).
    Reads the row twice, writes it once; no class weights (the kernels' weight pointers are x)."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    t, valid, t_safe = target_of(target_ptr + row, C)
    x_t = tl.load(x_row + t_safe).to(tl.float32)
    # pass 1: online logsumexp (and sum_j x_j for label smoothing) -> the row's loss
    lse, x_sum = row_lse(x_row, x_row, C, False, SMOOTH, BLOCK_C, STAGES)
    loss = row_loss(lse, x_t, 1.0, x_sum, x_row, t, valid, C, ignore_index, smoothing, False, SMOOTH)
    tl.store(loss_ptr + row, loss)
    if GRAD:
        scale = _grad_scale(scale_ptr, stride_scale, denom_ptr, row, t, valid, ignore_index, SCALED, MEAN)
        cols = tl.arange(0, BLOCK_C)
        # pass 2: re-read each chunk of the row, write its gradient over it
        for start in tl.range(0, C, BLOCK_C, num_stages=STAGES):
            idx = start + cols
            x = tl.load(x_row + idx, mask=idx < C, other=0.0).to(tl.float32)
            dx = logit_grad(x, idx, t, lse, 1.0, x_row, x_row, C, smoothing, False, SMOOTH)
            tl.store(x_row + idx, (dx * scale).to(x_ptr.dtype.element_ty), mask=idx < C)


@triton.jit
def _grad_scale(scale_ptr, stride_scale, denom_ptr, row, t, valid, ignore_index, SCALED: tl.constexpr,
                MEAN: tl.constexpr):
    """The row's gradient scale: grad_output (SCALED: per row or 0-d, else 1) / denom (MEAN), 0 for
    an ignored row, NaN for a target outside the classes."""
    scale = tl.load(scale_ptr + row * stride_scale).to(tl.float32) if SCALED else 1.0
    if MEAN:
        scale = scale / tl.load(denom_ptr)
    return row_scale(scale, t, valid, ignore_index)


@triton.jit
def _chunk_stats_kernel(
    x_ptr, target_ptr, stats_ptr, loss_ptr,
    stride_x,
    c0, CC, V,
    ignore_index, smoothing,
    FIRST: tl.constexpr, LAST: tl.constexpr, SMOOTH: tl.constexpr, BLOCK_C: tl.constexpr, STAGES: tl.constexpr,
):
    """Pass 1 of the vocabulary-chunked path, one row of a [R, CC] chunk of logits (classes c0 ..
    c0 + CC of V) per program: the chunk's logsumexp, logit sum (SMOOTH) and the target's logit
    (when the target is in the chunk) merged into the row's running [lse, sum, x_t] (float32,
    ``stats``); the LAST chunk writes loss_i and leaves lse for pass 2. The chunk is read once."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    st = stats_ptr + row * 3
    t, valid, _ = target_of(target_ptr + row, V)
    local = t - c0
    here = (local >= 0) & (local < CC)
    x_t = tl.load(x_row + tl.where(here, local, 0)).to(tl.float32)
    lse, x_sum = row_lse(x_row, x_row, CC, False, SMOOTH, BLOCK_C, STAGES)
    if not FIRST:
        # log(e^a + e^b) around the larger one (-inf only if both are: an all -inf row)
        prev = tl.load(st)
        hi = tl.maximum(prev, lse)
        hi = tl.where(hi == float("-inf"), 0.0, hi)
        lse = hi + tl.log(tl.exp(prev - hi) + tl.exp(lse - hi))
        x_sum += tl.load(st + 1)
        x_t = tl.where(here, x_t, tl.load(st + 2))
    if LAST:
        tl.store(loss_ptr + row, row_loss(lse, x_t, 1.0, x_sum, x_row, t, valid, V, ignore_index, smoothing,
                                          False, SMOOTH))
    tl.store(st, lse)
    tl.store(st + 1, x_sum)
    tl.store(st + 2, x_t)


@triton.jit
def _chunk_grad_kernel(
    x_ptr, target_ptr, stats_ptr, scale_ptr, denom_ptr,
    stride_x, stride_scale,
    c0, CC, V,
    ignore_index, smoothing,
    SMOOTH: tl.constexpr, SCALED: tl.constexpr, MEAN: tl.constexpr, BLOCK_C: tl.constexpr, STAGES: tl.constexpr,
):
    """Pass 2, one row of a [R, CC] chunk per program: the logits overwritten in place by
    d loss / d logits (the row's lse from pass 1). Read once, written once."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    t, valid, _ = target_of(target_ptr + row, V)
    lse = tl.load(stats_ptr + row * 3)
    scale = _grad_scale(scale_ptr, stride_scale, denom_ptr, row, t, valid, ignore_index, SCALED, MEAN)
    cols = tl.arange(0, BLOCK_C)
    for start in tl.range(0, CC, BLOCK_C, num_stages=STAGES):
        idx = start + cols
        x = tl.load(x_row + idx, mask=idx < CC, other=0.0).to(tl.float32)
        dx = logit_grad(x, c0 + idx, t, lse, 1.0, x_row, x_row, V, smoothing, False, SMOOTH)
        tl.store(x_row + idx, (dx * scale).to(x_ptr.dtype.element_ty), mask=idx < CC)


@triton.jit
def _scale_kernel(x_ptr, g_ptr, N, BLOCK: tl.constexpr):
    """x *= g in place (persistent grid). Nothing is read or written when g == 1: x * 1 == x exactly."""
    g = tl.load(g_ptr).to(tl.float32)
    if g != 1.0:
        for blk in tl.range(tl.program_id(0).to(tl.int64), tl.cdiv(N, BLOCK), tl.num_programs(0)):
            offs = blk * BLOCK + tl.arange(0, BLOCK)  # int64: dW may pass 2^31 elements
            x = tl.load(x_ptr + offs, mask=offs < N, other=0.0).to(tl.float32)
            tl.store(x_ptr + offs, (x * g).to(x_ptr.dtype.element_ty), mask=offs < N)


# --------------------------------------------------------------------------- launchers
def _logits_into(out, hidden_c, weight, bias):
    """out = hidden_c @ weight.T (+ bias): cuBLAS, the input dtype, float32 accumulation."""
    if bias is None:
        torch.mm(hidden_c, weight.t(), out=out)
    else:
        torch.addmm(bias, hidden_c, weight.t(), out=out)


def _launch_rows(logits, target, scale, denom, loss_rows, smoothing, ignore_index, scaled, mean, grad):
    """The fused kernel over one chunk of contiguous [R, V] logits (row stride V)."""
    r, v = logits.shape
    launch = _rows_launch(r, v, _common.sm_count(logits.device), smoothing > 0, scaled, mean, grad,
                          (BLOCK_C, FEW_ROWS_BLOCK_C, FEW_ROWS_PER_SM))
    launch((r,), logits, target, scale if scaled else denom, denom, loss_rows,
           v, scale.stride(0) if scaled and scale.dim() else 0, r, v, ignore_index, smoothing)


def _block_c(c: int, r: int, sms: int, rule: tuple) -> int:
    """Columns per step of a row kernel over [r, c] chunks on ``sms`` SMs, ``rule`` = (BLOCK_C,
    FEW_ROWS_BLOCK_C, FEW_ROWS_PER_SM): longer steps when there are few rows per SM."""
    block, few_block, few_per_sm = rule
    return min(_common.next_pow2(c), few_block if r < few_per_sm * sms else block)


@functools.lru_cache(maxsize=1024)
def _rows_launch(r: int, v: int, sms: int, smooth: bool, scaled: bool, mean: bool, grad: bool, rule: tuple):
    """The fused kernel prepared for chunks of R rows of V classes on ``sms`` SMs, ``rule``
    (BLOCK_C, FEW_ROWS_BLOCK_C, FEW_ROWS_PER_SM) as set (cached: host time per call)."""
    block_c = _block_c(v, r, sms, rule)
    return _common.prepared(_lce_kernel, SMOOTH=smooth, SCALED=scaled, MEAN=mean, GRAD=grad, BLOCK_C=block_c,
                            STAGES=_common.STAGES, num_warps=_common.warps_for(block_c))


def _gradient_buffers(hidden, weight, needs):
    """(dhidden, dweight, dbias float32 zeros) for the gradients in ``needs``, None elsewhere; dW
    zeroed when there are no rows (nothing accumulates into it)."""
    need_h, need_w, need_b = needs
    (n, h), v, dev = hidden.shape, weight.shape[0], hidden.device
    dh = _common.empty((n, h), hidden.dtype, dev) if need_h else None
    dw = _common.empty((v, h), weight.dtype, dev) if need_w else None
    db = torch.zeros((v,), dtype=torch.float32, device=dev) if need_b else None
    if dw is not None and n == 0:
        dw.zero_()
    return dh, dw, db


def _chunk_loop(hidden, weight, target, bias, scale, denom, loss_rows, needs, ignore_index: int,
                smoothing: float, mean: bool, chunk_rows: int):
    """Runs every chunk; writes loss_rows; returns (dhidden, dweight, dbias), None where not in ``needs``.
    ``scale`` (None or grad_output, 0-d or [N]) multiplies each row's gradient; ``mean`` divides it by denom."""
    n, v, dev = hidden.shape[0], weight.shape[0], hidden.device
    dh, dw, db = _gradient_buffers(hidden, weight, needs)
    grad = any(needs)
    buf = _common.empty((min(chunk_rows, n), v), hidden.dtype, dev)
    per_row = scale is not None and scale.dim() > 0  # a per-row grad_output
    for start in range(0, n, chunk_rows):
        if n <= chunk_rows:  # one chunk: the tensors themselves (a slice costs the host a view each)
            hidden_c, logits, target_c, loss_c, scale_c, dh_c = hidden, buf, target, loss_rows, scale, dh
        else:
            hidden_c = hidden[start:start + chunk_rows]
            rows = slice(start, start + hidden_c.shape[0])
            logits, target_c, loss_c = buf[:hidden_c.shape[0]], target[rows], loss_rows[rows]
            scale_c = scale[rows] if per_row else scale
            dh_c = dh[rows] if dh is not None else None
        _logits_into(logits, hidden_c, weight, bias)
        _launch_rows(logits, target_c, scale_c, denom, loss_c, smoothing, ignore_index, scale is not None, mean, grad)
        if dh is not None:
            torch.mm(logits, weight, out=dh_c)
        if dw is not None:  # the first chunk writes dW, later ones accumulate (cuBLAS beta = 1)
            torch.mm(logits.t(), hidden_c, out=dw) if start == 0 else dw.addmm_(logits.t(), hidden_c)
        if db is not None:
            db += logits.sum(0, dtype=torch.float32)
    return dh, dw, None if db is None else db.to(bias.dtype)


@functools.lru_cache(maxsize=1024)
def _chunk_launches(cc: int, r: int, sms: int, smooth: bool, scaled: bool, mean: bool, rule: tuple):
    """(stats launch by (first, last), grad launch) of the vocabulary-chunked path's kernels over
    [r, cc] chunks on ``sms`` SMs, ``rule`` as in ``_rows_launch`` (cached: host time per call)."""
    block_c = _block_c(cc, r, sms, rule)
    warps = _common.warps_for(block_c)
    stats = {(first, last): _common.prepared(_chunk_stats_kernel, FIRST=first, LAST=last, SMOOTH=smooth,
                                             BLOCK_C=block_c, STAGES=_common.STAGES, num_warps=warps)
             for first in (False, True) for last in (False, True)}
    grad = _common.prepared(_chunk_grad_kernel, SMOOTH=smooth, SCALED=scaled, MEAN=mean, BLOCK_C=block_c,
                            STAGES=_common.STAGES, num_warps=warps)
    return stats, grad


def _mm_float32(acc, a, b, first: bool) -> None:
    """acc (float32) = a @ b (first) or += a @ b, for a and b in the input dtype: cuBLAS with a
    float32 output (beta = 1 for the sum), never a rounding to the input dtype between chunks.
    CPU tensors (the interpreter's tests) have no mixed-dtype matmul: there a and b are upcast."""
    if a.dtype != torch.float32 and not a.is_cuda:
        a, b = a.float(), b.float()
    if a.dtype == torch.float32:
        torch.mm(a, b, out=acc) if first else acc.addmm_(a, b)
    elif first:
        torch.mm(a, b, out_dtype=torch.float32, out=acc)
    else:
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)


def _vocab_loop(hidden, weight, target, bias, scale, denom, loss_rows, needs, ignore_index: int,
                smoothing: float, mean: bool, rows: int, cols: int):
    """The vocabulary-chunked path (module docstring): blocks of ``rows`` token rows, ``cols``
    classes a chunk. Same contract as ``_chunk_loop``. Every view the loop uses is made once per
    call (the host's cost per chunk is the launches: 2 in pass 1, 4 in pass 2)."""
    (n, h), v, dev = hidden.shape, weight.shape[0], hidden.device
    dh, dw, db = _gradient_buffers(hidden, weight, needs)
    grad = any(needs)
    rows = max(1, min(rows, n))
    flat = _common.empty((rows * cols,), hidden.dtype, dev)  # one [rows, cols] chunk of logits, reused
    stats = _common.empty((rows, 3), torch.float32, dev)  # running lse, logit sum, target logit per row
    # dhidden's float32 accumulator: dh itself for float32 inputs
    acc = _common.empty((rows, h), torch.float32, dev) if dh is not None and hidden.dtype != torch.float32 else None
    chunks = _class_chunks(weight, bias, dw, db, v, cols)
    per_row = scale is not None and scale.dim() > 0
    views: dict = {}
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        hb, tb, rb = hidden[r0:r1], target[r0:r1], r1 - r0
        if rb not in views:  # launches and logits views for blocks of rb rows (at most two sizes)
            views[rb] = (_chunk_launches(cols, rb, _common.sm_count(dev), smoothing > 0, scale is not None, mean,
                                         (BLOCK_C, FEW_ROWS_BLOCK_C, FEW_ROWS_PER_SM)),
                         {cc: flat[:rb * cc].view(rb, cc) for cc in {c1 - c0 for c0, c1, *_ in chunks}})
        (stat_launch, grad_launch), logits_of = views[rb]
        loss_b = loss_rows[r0:r1]
        for c0, c1, w_c, wt_c, b_c, _, _ in chunks:  # pass 1: loss_i
            logits = logits_of[c1 - c0]
            torch.mm(hb, wt_c, out=logits) if b_c is None else torch.addmm(b_c, hb, wt_c, out=logits)
            stat_launch[c0 == 0, c1 == v]((rb,), logits, tb, stats, loss_b, c1 - c0, c0, c1 - c0, v,
                                          ignore_index, smoothing)
        if not grad:
            continue
        scale_b = (scale[r0:r1] if per_row else scale) if scale is not None else denom
        stride_scale = scale_b.stride(0) if per_row else 0
        acc_b = (dh[r0:r1] if acc is None else acc[:rb]) if dh is not None else None
        # pass 2: the gradients, last chunk first (still in the buffer from pass 1: not recomputed)
        for i, (c0, c1, w_c, wt_c, b_c, dw_c, db_c) in enumerate(reversed(chunks)):
            logits = logits_of[c1 - c0]
            if i > 0:
                torch.mm(hb, wt_c, out=logits) if b_c is None else torch.addmm(b_c, hb, wt_c, out=logits)
            grad_launch((rb,), logits, tb, stats, scale_b, denom, c1 - c0, stride_scale, c0, c1 - c0, v,
                        ignore_index, smoothing)
            if acc_b is not None:
                _mm_float32(acc_b, logits, w_c, first=i == 0)
            if dw_c is not None:  # rows c0:c1 of dW: written by the first block, accumulated by the rest
                torch.mm(logits.t(), hb, out=dw_c) if r0 == 0 else dw_c.addmm_(logits.t(), hb)
            if db_c is not None:
                db_c += logits.sum(0, dtype=torch.float32)
        if acc is not None:
            dh[r0:r1].copy_(acc[:rb])
    return dh, dw, None if db is None else db.to(bias.dtype)


def _class_chunks(weight, bias, dw, db, v: int, cols: int) -> list:
    """(c0, c1, W_c, W_c.T, bias_c, dW_c, db_c) for each chunk of ``cols`` classes (None where absent)."""
    out = []
    for c0 in range(0, v, cols):
        c1 = min(v, c0 + cols)
        w_c = weight[c0:c1]
        out.append((c0, c1, w_c, w_c.t(), None if bias is None else bias[c0:c1], None if dw is None else dw[c0:c1],
                    None if db is None else db[c0:c1]))
    return out


def _run_chunks(hidden, weight, target, bias, scale, denom, loss_rows, needs, ignore_index: int,
                smoothing: float, mean: bool, rows: int, cols: int):
    """Token chunks over the whole vocabulary (cols >= V) or the vocabulary-chunked path."""
    if cols >= weight.shape[0]:
        return _chunk_loop(hidden, weight, target, bias, scale, denom, loss_rows, needs, ignore_index, smoothing,
                           mean, rows)
    return _vocab_loop(hidden, weight, target, bias, scale, denom, loss_rows, needs, ignore_index, smoothing, mean,
                       rows, cols)


def _denominator(target, ignore_index: int):
    """Rows not ignored, float32 (the mean's divisor, as PyTorch's without class weights)."""
    return (target != ignore_index).sum(dtype=torch.float32)


def _or_empty(t, like):
    """Custom ops return tensors: an empty one stands for "not computed" (real tensors only: the
    fake implementation has its own)."""
    return _common.empty((0,), like.dtype, like.device) if t is None else t


def _lce_forward(hidden, weight, target, bias, ignore_index: int, smoothing: float, reduction: str,
                 chunk_rows: int, vocab_chunk: int, grad_hidden: bool, grad_weight: bool, grad_bias: bool):
    """(loss float32, dhidden, dweight, dbias, denom): the gradients of the reduced loss (for
    grad_output 1) where asked and reduction is not "none", else empty tensors."""
    n = hidden.shape[0]
    loss_rows = _common.empty((n,), torch.float32, hidden.device)
    denom = _denominator(target, ignore_index)
    needs = (grad_hidden, grad_weight, grad_bias) if reduction != "none" else (False, False, False)
    grads = _run_chunks(hidden, weight, target, bias, None, denom, loss_rows, needs, ignore_index, smoothing,
                        reduction == "mean", chunk_rows, vocab_chunk)
    if reduction == "none":
        loss = loss_rows
    else:
        loss = loss_rows.sum() / denom if reduction == "mean" else loss_rows.sum()
    return (loss, *(_or_empty(g, hidden) for g in grads), denom)


def _lce_backward(grad, hidden, weight, target, bias, denom, ignore_index: int, smoothing: float, reduction: str,
                  chunk_rows: int, vocab_chunk: int, grad_hidden: bool, grad_weight: bool, grad_bias: bool):
    """(dhidden, dweight, dbias) for grad_output ``grad``, the chunks recomputed (empty where not asked)."""
    loss_rows = _common.empty((hidden.shape[0],), torch.float32, hidden.device)  # rewritten, unused
    grads = _run_chunks(hidden, weight, target, bias, grad, denom, loss_rows, (grad_hidden, grad_weight, grad_bias),
                        ignore_index, smoothing, reduction == "mean", chunk_rows, vocab_chunk)
    return tuple(_or_empty(g, hidden) for g in grads)


def _scale_in_place(t: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    if t.numel():
        grid = min(_common.cdiv(t.numel(), SCALE_BLOCK), _common.sm_count(t.device) * SCALE_PER_SM)
        _common.launch(_scale_kernel, (grid,))(t, grad, t.numel(), BLOCK=SCALE_BLOCK, num_warps=4)
    return t


# --------------------------------------------------------------------------- custom ops and autograd
@torch.library.custom_op("kernelab::linear_cross_entropy", mutates_args=())
def _lce_op(
    hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor],
    ignore_index: int, smoothing: float, reduction: str, chunk_rows: int, vocab_chunk: int,
    grad_hidden: bool, grad_weight: bool, grad_bias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _lce_forward(hidden, weight, target, bias, ignore_index, smoothing, reduction, chunk_rows, vocab_chunk,
                        grad_hidden, grad_weight, grad_bias)


def _fake_grads(hidden, weight, bias, grad_hidden, grad_weight, grad_bias):
    return (hidden.new_empty(hidden.shape if grad_hidden else (0,)),
            weight.new_empty(weight.shape if grad_weight else (0,)),
            hidden.new_empty((weight.shape[0],) if grad_bias else (0,)))


@_lce_op.register_fake
def _(hidden, weight, target, bias, ignore_index, smoothing, reduction, chunk_rows, vocab_chunk, grad_hidden, grad_weight,
      grad_bias):
    none = reduction == "none"
    loss = hidden.new_empty((hidden.shape[0],) if none else (), dtype=torch.float32)
    grads = _fake_grads(hidden, weight, bias, grad_hidden and not none, grad_weight and not none, grad_bias and not none)
    return (loss, *grads, hidden.new_empty((), dtype=torch.float32))


@torch.library.custom_op("kernelab::linear_cross_entropy_backward", mutates_args=())
def _lce_backward_op(
    grad: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor],
    denom: torch.Tensor, ignore_index: int, smoothing: float, reduction: str, chunk_rows: int, vocab_chunk: int,
    grad_hidden: bool, grad_weight: bool, grad_bias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _lce_backward(grad, hidden, weight, target, bias, denom, ignore_index, smoothing, reduction, chunk_rows,
                         vocab_chunk, grad_hidden, grad_weight, grad_bias)


@_lce_backward_op.register_fake
def _(grad, hidden, weight, target, bias, denom, ignore_index, smoothing, reduction, chunk_rows, vocab_chunk,
      grad_hidden, grad_weight, grad_bias):
    return _fake_grads(hidden, weight, bias, grad_hidden, grad_weight, grad_bias)


def _setup_context(ctx, inputs, output):
    hidden, weight, target, bias, *args = inputs
    _, dh, dw, db, denom = output
    ctx.args = tuple(args)  # ignore_index, smoothing, reduction, chunk_rows, vocab_chunk, grad_hidden, grad_weight, grad_bias
    ctx.fresh = True  # the forward's gradients have not been scaled in place yet
    ctx.save_for_backward(hidden, weight, target, bias, dh, dw, db, denom)
    ctx.mark_non_differentiable(dh, dw, db, denom)  # internal outputs: no gradient flows into them,
    ctx.set_materialize_grads(False)  # and none is built for them


def _backward(ctx, grad, *_internal):
    if grad is None:
        return (None,) * 12
    hidden, weight, target, bias, dh, dw, db, denom = ctx.saved_tensors
    ignore_index, smoothing, reduction, chunk_rows, vocab_chunk, *needs = ctx.args
    if _common.builds_graph():  # double backward: PyTorch's differentiable gradient (full logits)
        grads = _reference_grads(grad, hidden, weight, target, bias, ctx.args)
    elif reduction == "none" or not (ctx.fresh or _common.traced(grad, hidden)):
        # per-row grad_output, or a second backward (retain_graph) after the in-place scaling
        grads = _common.call(_lce_backward_op, _lce_backward, grad, hidden, weight, target, bias, denom, *ctx.args)
    elif _common.traced(grad, hidden):
        grads = tuple(g * grad for g in (dh, dw, db))
    else:
        ctx.fresh = False
        grads = tuple(_scale_in_place(g, grad) for g in (dh, dw, db))
    dh, dw, db = (g if need else None for g, need in zip(grads, needs))
    return dh, dw, None, db, None, None, None, None, None, None, None, None


def _reference_grads(grad, hidden, weight, target, bias, args):
    ignore_index, smoothing, reduction, _, _, *needs = args

    def reference(hidden, weight, bias):
        return _reference(hidden, weight, target, bias, ignore_index, reduction, smoothing)

    return _common.reference_grads(reference, (hidden, weight, bias), needs, grad)


_lce_op.register_autograd(_backward, setup_context=_setup_context)
_LinearCrossEntropy = _common.eager_function("_LinearCrossEntropy", _lce_forward, _setup_context, _backward)


# --------------------------------------------------------------------------- public function
def _reference(hidden, weight, target, bias, ignore_index, reduction, smoothing):
    """PyTorch: the full logits in the input dtype, the loss on their float32 copy (as Hugging Face)."""
    logits = F.linear(hidden, weight, bias)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # 16-bit: .float(); float64 stays
    loss = F.cross_entropy(logits.reshape(-1, weight.shape[0]), target.reshape(-1), ignore_index=ignore_index,
                           reduction=reduction, label_smoothing=smoothing)
    return loss.reshape(target.shape) if reduction == "none" else loss


def _check(hidden, weight, target, bias, reduction, label_smoothing, chunk_rows, vocab_chunk) -> None:
    """One-line errors for the calls this op refuses."""
    for name, t in (("hidden", hidden), ("weight", weight), ("target", target), ("bias", bias)):
        if not isinstance(t, torch.Tensor) and not (name == "bias" and t is None):
            raise TypeError(f"linear_cross_entropy: {name} must be a tensor, got {type(t).__name__}")
    if not hidden.is_floating_point() or hidden.dim() < 1:
        raise TypeError(f"linear_cross_entropy: hidden must be a floating-point (..., H) tensor, got {hidden.dtype} "
                        f"of shape {tuple(hidden.shape)}")
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"linear_cross_entropy: weight must be (V, H) with H = hidden's last dim "
                         f"{hidden.shape[-1]}, got {tuple(weight.shape)}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"linear_cross_entropy: bias must be (V,) = ({weight.shape[0]},), got {tuple(bias.shape)}")
    if target.shape != hidden.shape[:-1]:
        raise ValueError(f"linear_cross_entropy: target must have hidden's leading shape {tuple(hidden.shape[:-1])}, "
                         f"got {tuple(target.shape)}")
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        raise TypeError(f"linear_cross_entropy: target must hold class indices (an integer dtype), got {target.dtype}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.dtype != hidden.dtype:
            raise TypeError(f"linear_cross_entropy: {name} is {t.dtype} but hidden is {hidden.dtype}")
    for name, t in (("weight", weight), ("target", target), ("bias", bias)):
        if t is not None and t.device != hidden.device:
            raise ValueError(f"linear_cross_entropy: {name} is on {t.device} but hidden is on {hidden.device}")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"linear_cross_entropy: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if label_smoothing > 1.0:
        raise ValueError(f"linear_cross_entropy: label_smoothing must be at most 1.0, got {label_smoothing}")
    for name, value in (("chunk_rows", chunk_rows), ("vocab_chunk", vocab_chunk)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"linear_cross_entropy: {name} must be a positive int, got {value!r}")


def _autocast(hidden, weight, bias):
    """Under torch.autocast, the dtype F.linear would compute in (a float32 LM head in a bfloat16
    autocast region): the casts are differentiable, the gradients flow back to the float32 tensors."""
    if not isinstance(hidden, torch.Tensor) or not torch.is_autocast_enabled(hidden.device.type):
        return hidden, weight, bias
    dtype = torch.get_autocast_dtype(hidden.device.type)
    return tuple(t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                 for t in (hidden, weight, bias))


def _chunks(n: int, h: int, v: int, elem_size: int, chunk_rows, vocab_chunk) -> tuple[int, int]:
    """(token rows, classes) a chunk for the caller's settings (see linear_cross_entropy)."""
    if vocab_chunk is None and chunk_rows is not None:
        return chunk_rows, max(v, 1)
    rows, cols = chunk_shape_for(n, h, v, elem_size)
    return chunk_rows or rows, min(vocab_chunk or cols, max(v, 1))


def _needs_grad(t) -> bool:
    return t is not None and t.requires_grad and torch.is_grad_enabled()


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    chunk_rows: int | None = None,
    vocab_chunk: int | None = None,
) -> torch.Tensor:
    """``F.cross_entropy(F.linear(hidden, weight, bias).float(), target, ...)`` without the logits.

    ``hidden`` (..., H), ``weight`` (V, H) as ``nn.Linear`` / an LM head holds it, ``bias`` (V,) or
    None, ``target`` (...) class indices (any integer dtype; ``ignore_index`` rows count zero).
    ``reduction`` "mean" (over rows not ignored; NaN when all are, as PyTorch), "sum" or "none";
    ``label_smoothing`` as in PyTorch. The logits are computed in the input dtype with float32
    accumulation, as cuBLAS does, then the loss in float32: the loss is float32 (float64 for float64
    inputs, which run PyTorch's formula).

    Chunks (module docstring): by default blocks of a quarter of the token rows, ``vocab_chunk``
    classes at a time (:func:`chunk_shape_for`), so that memory beside the gradients stays within
    N x H input-dtype elements, as Liger-Kernel's; ``chunk_rows`` alone: that many token rows
    over the whole vocabulary a chunk ([rows, V] logits, no recomputed matmul, more memory);
    both: blocks of ``chunk_rows`` rows, ``vocab_chunk`` classes a chunk. Gradients are computed
    only for the tensors that require them; dhidden accumulates in float32 across class chunks,
    the weight gradient across token blocks in the weight's dtype (cuBLAS addmm, beta = 1: one
    rounding per block, as Liger-Kernel's default). Under ``torch.autocast`` the inputs are first cast to
    its dtype, as ``F.linear`` would. A double backward (``create_graph=True``) differentiates
    PyTorch's formula instead, holding the full logits. Without CUDA and without
    ``TRITON_INTERPRET=1`` (or for float64) the PyTorch formula runs, with the full logits.
    """
    hidden, weight, bias = _autocast(hidden, weight, bias)
    _check(hidden, weight, target, bias, reduction, label_smoothing, chunk_rows, vocab_chunk)
    smoothing = float(label_smoothing) if label_smoothing > 0 else 0.0  # negative or NaN: none, as in PyTorch
    v, h = weight.shape
    if not _common.use_triton(hidden) or v == 0:
        return _reference(hidden, weight, target, bias, ignore_index, reduction, smoothing)
    flat_target = target if target.dim() == 1 and target.is_contiguous() else target.reshape(-1).contiguous()
    check_targets_on_host(flat_target, v, ignore_index)
    hidden2 = hidden if hidden.dim() == 2 else hidden.reshape(flat_target.numel(), h)  # (-1, h): ambiguous for h = 0
    rows, cols = _chunks(hidden2.shape[0], h, v, hidden.element_size(), chunk_rows, vocab_chunk)
    needs = (_needs_grad(hidden), _needs_grad(weight), _needs_grad(bias))
    loss = _common.apply(_LinearCrossEntropy, _lce_op, hidden2, weight, flat_target, bias, int(ignore_index),
                         smoothing, reduction, rows, cols, *needs)[0]
    return loss.reshape(target.shape) if reduction == "none" else loss
