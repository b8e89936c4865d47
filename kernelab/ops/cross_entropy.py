"""cross_entropy over class logits, forward and backward, never materializing the probabilities.

    per row i, target t, C classes, class weights w (default 1), smoothing eps:
      lse     = log sum_j exp(x_j)
      nll     = w_t * (lse - x_t)
      smooth  = sum_j w_j * (lse - x_j) = lse * sum(w) - sum_j w_j x_j
      loss_i  = (1 - eps) * nll + eps / C * smooth                  (0 when t == ignore_index)
    reduction  none: loss_i;  sum: sum_i loss_i;  mean: sum_i loss_i / sum_i w_{t_i} (not ignored)
    gradient   dx_ij = s_i * ((1 - eps) * w_t * (p_ij - [j == t]) + eps / C * (sum(w) * p_ij - w_j))
               p_ij = exp(x_ij - lse_i);  s_i = grad_i (none), grad (sum), grad / denominator (mean)

Traffic: forward reads the logits once (writes 3 floats a row); backward reads them once more and
writes the gradient: 3 passes over the [M, C] logits for forward + backward. A target outside
[0, C) that is not ignore_index raises PyTorch's IndexError when the targets are in CPU memory; on
a GPU its row's loss is NaN (PyTorch asserts on the device; checking here would cost a sync).
Probability ("soft") targets are computed from kernelab's log_softmax and PyTorch reductions.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ..errors import KernelabError
from . import _common
from .softmax import log_softmax, lse_update

_REDUCTIONS = ("none", "mean", "sum")
#: Classes per chunk: forward (one program per row, looping) and backward (one program per chunk).
#: Forward: 1024 up to 8192 classes, 2048 above (None = this rule). Measured on the H200 (bf16,
#: GPU time of the kernels, results/ops_tune4_h200.csv): 32768x4096 1.86 TB/s with 4096-class
#: chunks, 2.30 with 2048, 2.53 with 1024; 8192x32000 2.87 / 2.97 / 2.55 with 4096 / 2048 / 8192.
#: Backward chunks of 1024-8192 measured within 2 % of each other; 4096 stays.
FWD_BLOCK_C = None
BWD_BLOCK_C = 4096
#: Splitting long rows into chunks reduced by separate programs (merged by a second launch) was
#: built and measured slower at 4096-128256 classes (0.83-0.97x), 1.05x at 262144
#: (results/ops_tune8_h200.csv); it was removed: one program loops over each row.


def _fwd_chunk(c: int) -> int:
    return FWD_BLOCK_C or (1024 if c <= 8192 else 2048)


# --------------------------------------------------------------------------- jitted helpers
# Shared with linear_cross_entropy (its fused kernel runs the forward row pass and the gradient pass).
@triton.jit
def target_of(target_ptr, C):
    """(t, valid, t_safe): the row's target as int64, whether it is a class in [0, C), and an index
    that is safe to load (0 for an invalid target)."""
    t = tl.load(target_ptr).to(tl.int64)
    valid = (t >= 0) & (t < C)
    return t, valid, tl.where(valid, t, 0)


@triton.jit
def row_lse(x_row, weight_ptr, C, HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, BLOCK_C: tl.constexpr,
            STAGES: tl.constexpr):
    """One pass over a row of C logits: (lse, sum_j w_j x_j), the second only with SMOOTH (else 0).
    Online logsumexp: every logit is read once."""
    cols = tl.arange(0, BLOCK_C)
    m = tl.full((), float("-inf"), tl.float32)
    s = tl.full((), 0.0, tl.float32)
    wx = tl.zeros((BLOCK_C,), tl.float32)
    for start in tl.range(0, C, BLOCK_C, num_stages=STAGES):
        idx = start + cols
        x = tl.load(x_row + idx, mask=idx < C, other=float("-inf")).to(tl.float32)
        m, s = lse_update(m, s, x)
        if SMOOTH:
            xs = tl.where(idx < C, x, 0.0)
            if HAS_WEIGHT:
                xs = xs * tl.load(weight_ptr + idx, mask=idx < C, other=0.0).to(tl.float32)
            wx += xs
    return tl.where(m == float("-inf"), 0.0, m) + tl.log(s), tl.sum(wx, axis=0)


@triton.jit
def row_loss(lse, x_t, w_t, wx_sum, wsum_ptr, t, valid, C, ignore_index, smoothing,
             HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr):
    """loss_i from the row's lse, target logit and weight: 0 for an ignored row, NaN for a target
    outside [0, C) (it poisons the reduction instead of reading out of bounds)."""
    loss = w_t * (lse - x_t)
    if SMOOTH:
        wsum = tl.load(wsum_ptr) if HAS_WEIGHT else C * 1.0
        loss = (1.0 - smoothing) * loss + smoothing / C * (lse * wsum - wx_sum)
    return tl.where(t == ignore_index, 0.0, tl.where(valid, loss, float("nan")))


@triton.jit
def row_scale(scale, t, valid, ignore_index):
    """The row's gradient scale: 0 for an ignored row, NaN for a target outside [0, C)."""
    return tl.where(t == ignore_index, 0.0, tl.where(valid, scale, float("nan")))


@triton.jit
def logit_grad(x, idx, t, lse, w_t, weight_ptr, wsum_ptr, C, smoothing, HAS_WEIGHT: tl.constexpr,
               SMOOTH: tl.constexpr):
    """d loss_i / d x_ij for a chunk of columns ``idx`` (fp32 ``x``), before the row's scale: the
    softmax recomputed from lse, minus the (smoothed) target distribution."""
    p = tl.exp(x - lse)
    dx = (1.0 - smoothing) * w_t * (p - tl.where(idx == t, 1.0, 0.0))
    if SMOOTH:
        if HAS_WEIGHT:
            w = tl.load(weight_ptr + idx, mask=idx < C, other=0.0).to(tl.float32)
            dx += smoothing / C * (tl.load(wsum_ptr) * p - w)
        else:
            dx += smoothing * p - smoothing / C
    return dx


# --------------------------------------------------------------------------- kernels
@triton.jit
def _ce_fwd_kernel(
    x_ptr, target_ptr, weight_ptr, wsum_ptr, loss_ptr, lse_ptr, wt_ptr,
    stride_x,
    M, C,
    ignore_index, smoothing,
    HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, BLOCK_C: tl.constexpr, STAGES: tl.constexpr,
):
    """One row per program: loss_i, lse_i and the target's weight (0 if ignored); x read once."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    # the target's logit and weight first: dependent scalar loads whose latency then overlaps the
    # row's loads instead of following them
    t, valid, t_safe = target_of(target_ptr + row, C)
    x_t = tl.load(x_row + t_safe).to(tl.float32)
    w_t = tl.load(weight_ptr + t_safe).to(tl.float32) if HAS_WEIGHT else 1.0
    # pass over the row: online logsumexp, and sum_j w_j x_j for label smoothing
    lse, wx_sum = row_lse(x_row, weight_ptr, C, HAS_WEIGHT, SMOOTH, BLOCK_C, STAGES)
    loss = row_loss(lse, x_t, w_t, wx_sum, wsum_ptr, t, valid, C, ignore_index, smoothing, HAS_WEIGHT, SMOOTH)
    tl.store(loss_ptr + row, loss.to(loss_ptr.dtype.element_ty))
    tl.store(lse_ptr + row, lse)
    tl.store(wt_ptr + row, tl.where(t == ignore_index, 0.0, w_t))


@triton.jit
def _ce_reduce_kernel(loss_ptr, wt_ptr, out_ptr, denom_ptr, M, MEAN: tl.constexpr, BLOCK: tl.constexpr):
    """The reduction, in one program and one launch (torch: a sum, a sum, a division and a cast):
    out = sum(loss) ("sum") or sum(loss) / sum(wt) ("mean"), rounded once into out's dtype;
    denom = sum(wt), float32, kept for the backward. Summed in float32, lane-wise then as a tree."""
    offs = tl.arange(0, BLOCK)
    acc_loss = tl.zeros((BLOCK,), tl.float32)
    acc_wt = tl.zeros((BLOCK,), tl.float32)
    for start in tl.range(0, M, BLOCK, num_stages=2):
        idx = start + offs
        acc_loss += tl.load(loss_ptr + idx, mask=idx < M, other=0.0)
        if MEAN:
            acc_wt += tl.load(wt_ptr + idx, mask=idx < M, other=0.0)
    total = tl.sum(acc_loss, axis=0)
    if MEAN:
        denom = tl.sum(acc_wt, axis=0)
        # no weight at all (every row ignored, or every target's class weight 0): torch's 0 / 0,
        # NaN, also with label smoothing, whose part of the sum is not 0 (it gave +-inf)
        denom = tl.where(denom == 0, float("nan"), denom)
        tl.store(denom_ptr, denom)
        total = total / denom
    tl.store(out_ptr, total.to(out_ptr.dtype.element_ty))


@triton.jit
def _ce_bwd_kernel(
    x_ptr, target_ptr, weight_ptr, wsum_ptr, lse_ptr, grad_ptr, denom_ptr, dx_ptr,
    stride_x, stride_grad, stride_dx,
    M, C,
    ignore_index, smoothing,
    HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, MEAN: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """dx for one BLOCK_C chunk of one row (program = row * chunks + chunk): x read once, dx written once."""
    chunks = tl.cdiv(C, BLOCK_C)
    pid = tl.program_id(0).to(tl.int64)
    row, pid_c = pid // chunks, pid % chunks
    idx = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = idx < C
    # load the logits chunk and the row's scalars
    x = tl.load(x_ptr + row * stride_x + idx, mask=ok, other=0.0).to(tl.float32)
    t, valid, t_safe = target_of(target_ptr + row, C)
    lse = tl.load(lse_ptr + row)
    scale = tl.load(grad_ptr + row * stride_grad).to(tl.float32)
    if MEAN:
        scale = scale / tl.load(denom_ptr)
    scale = row_scale(scale, t, valid, ignore_index)
    w_t = tl.load(weight_ptr + t_safe).to(tl.float32) if HAS_WEIGHT else 1.0
    dx = logit_grad(x, idx, t, lse, w_t, weight_ptr, wsum_ptr, C, smoothing, HAS_WEIGHT, SMOOTH)
    tl.store(dx_ptr + row * stride_dx + idx, (dx * scale).to(dx_ptr.dtype.element_ty), mask=ok)


# --------------------------------------------------------------------------- launchers
def _weight_sum(weight, smoothing: float) -> torch.Tensor | None:
    return weight.sum(dtype=torch.float32) if weight is not None and smoothing > 0 else None


#: Rows summed per step of the reduction kernel (one program of 8 warps).
REDUCE_BLOCK = 4096


def _ce_forward(logits, target, weight, ignore_index: int, smoothing: float, reduction: str,
                float32_loss: bool = False):
    """(loss, lse, denom) for [M, C] logits and [M] targets; loss reduced, in the logits' dtype
    (float32 with ``float32_loss``: the float32 accumulation not rounded); denom (the mean's
    divisor, float32) is only written for reduction "mean".

    Two launches at most: the row kernel, and for "sum" and "mean" one reduction kernel; "none"
    stores each row's loss in the logits' dtype directly. The target weights (internal) and denom
    share one float32 allocation (outputs of a custom op must not alias each other: lse has its own)."""
    m, c = logits.shape
    device = logits.device
    lse = _common.empty((m,), torch.float32, device)
    # denom and the target weights (internal) in allocations of their own: two allocations cost
    # the host less than one sliced in two
    denom, wt = _common.empty((), torch.float32, device), _common.empty((m,), torch.float32, device)
    none = reduction == "none"
    out_dtype = torch.float32 if float32_loss else logits.dtype
    loss = _common.empty((m,), out_dtype if none else torch.float32, device)
    if m and c:
        x, stride_x = _common.row_view(logits, c)
        _fwd_launch(c, weight is not None, smoothing > 0, FWD_BLOCK_C)(
            (m,), x, target, weight, _weight_sum(weight, smoothing), loss, lse, wt, stride_x, m, c, ignore_index,
            smoothing,
        )
    elif m:
        loss.fill_(float("nan")), lse.fill_(float("-inf")), wt.fill_(1.0)
    if none:
        return loss, lse, denom
    out = _common.empty((), out_dtype, device)
    _reduce_launch(reduction == "mean")((1,), loss, wt, out, denom, m)
    return out, lse, denom


@functools.lru_cache(maxsize=1024)
def _fwd_launch(c: int, has_weight: bool, smooth: bool, _block_override):
    """The row kernel prepared for C classes (cached: host time per call; FWD_BLOCK_C, the tuning
    override, is part of the key)."""
    block_c = min(_common.next_pow2(c), _fwd_chunk(c))
    return _common.prepared(_ce_fwd_kernel, HAS_WEIGHT=has_weight, SMOOTH=smooth, BLOCK_C=block_c,
                            STAGES=_common.STAGES, num_warps=_common.warps_for(block_c))


@functools.lru_cache(maxsize=None)
def _reduce_launch(mean: bool):
    return _common.prepared(_ce_reduce_kernel, MEAN=mean, BLOCK=REDUCE_BLOCK, num_warps=8)


def _ce_backward(grad, logits, target, weight, lse, denom, ignore_index: int, smoothing: float, reduction: str):
    """d loss / d logits, [M, C] in the logits' dtype."""
    m, c = logits.shape
    dx = _common.empty((m, c), logits.dtype, logits.device)
    if m == 0 or c == 0:
        return dx
    x, stride_x = _common.row_view(logits, c)
    col_blocks, launch = _bwd_launch(c, weight is not None, smoothing > 0, reduction == "mean", BWD_BLOCK_C)
    launch(
        (col_blocks * m,), x, target, weight, _weight_sum(weight, smoothing), lse, grad, denom, dx,
        stride_x, grad.stride(0) if grad.dim() else 0, c, m, c, ignore_index, smoothing,
    )
    return dx


@functools.lru_cache(maxsize=1024)
def _bwd_launch(c: int, has_weight: bool, smooth: bool, mean: bool, block: int) -> tuple:
    """(column blocks a row, the backward kernel prepared), ``block`` BWD_BLOCK_C (cached: host time)."""
    block_c = min(_common.next_pow2(c), block)
    return _common.cdiv(c, block_c), _common.prepared(
        _ce_bwd_kernel, HAS_WEIGHT=has_weight, SMOOTH=smooth, MEAN=mean, BLOCK_C=block_c,
        num_warps=_common.warps_for(block_c))


# --------------------------------------------------------------------------- custom ops and autograd
@torch.library.custom_op("kernelab::cross_entropy", mutates_args=())
def _ce_op(
    logits: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor],
    ignore_index: int, smoothing: float, reduction: str, float32_loss: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _ce_forward(logits, target, weight, ignore_index, smoothing, reduction, float32_loss)


@_ce_op.register_fake
def _(logits, target, weight, ignore_index, smoothing, reduction, float32_loss):
    m = logits.shape[0]
    out = logits.new_empty((m,) if reduction == "none" else (), dtype=torch.float32 if float32_loss else logits.dtype)
    return out, logits.new_empty((m,), dtype=torch.float32), logits.new_empty((), dtype=torch.float32)


@torch.library.custom_op("kernelab::cross_entropy_backward", mutates_args=())
def _ce_backward_op(
    grad: torch.Tensor, logits: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor],
    lse: torch.Tensor, denom: torch.Tensor, ignore_index: int, smoothing: float, reduction: str,
) -> torch.Tensor:
    return _ce_backward(grad, logits, target, weight, lse, denom, ignore_index, smoothing, reduction)


@_ce_backward_op.register_fake
def _(grad, logits, target, weight, lse, denom, ignore_index, smoothing, reduction):
    return logits.new_empty(logits.shape)


def _setup_context(ctx, inputs, output):
    logits, target, weight, ignore_index, smoothing, reduction, _ = inputs
    _, lse, denom = output
    ctx.args = (ignore_index, smoothing, reduction)
    ctx.save_for_backward(logits, target, weight, lse, denom)
    # lse and denom are internal outputs: no zero gradients are built for them (see _common)
    ctx.set_materialize_grads(False)


def _backward(ctx, grad, _dlse, _ddenom):
    if grad is None:
        return None, None, None, None, None, None, None
    logits, target, weight, lse, denom = ctx.saved_tensors
    if _common.builds_graph():  # double backward: PyTorch's differentiable gradient
        return _reference_grad(ctx, grad, logits, target, weight), None, None, None, None, None, None
    dx = _common.call(_ce_backward_op, _ce_backward, grad, logits, target, weight, lse, denom, *ctx.args)
    return dx, None, None, None, None, None, None


def _reference_grad(ctx, grad, logits, target, weight):
    """d loss / d logits of PyTorch's cross_entropy over the same [M, C] rows, differentiable again."""
    ignore_index, smoothing, reduction = ctx.args

    def reference(logits):
        return F.cross_entropy(
            logits, target, weight, ignore_index=ignore_index, reduction=reduction, label_smoothing=smoothing
        )

    return _common.reference_grads(reference, (logits,), ctx.needs_input_grad[:1], grad)[0]


_ce_op.register_autograd(_backward, setup_context=_setup_context)
_CrossEntropy = _common.eager_function("_CrossEntropy", _ce_forward, _setup_context, _backward)


# --------------------------------------------------------------------------- public function
def _soft_targets(input, target, weight, reduction, smoothing, class_dim):
    """Probability targets: -sum_j w_j y_j log p_j, with kernelab's log_softmax."""
    c = input.shape[class_dim]
    logp = log_softmax(input, class_dim)
    if smoothing > 0:
        target = target * (1 - smoothing) + smoothing / c
    if weight is not None:
        shape = [1] * input.dim()
        shape[class_dim] = c
        target = target * weight.view(shape)
    loss = -(logp * target).sum(class_dim)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / (input.numel() / c if c else 0)


def check_targets_on_host(target: torch.Tensor, n_classes: int, ignore_index: int) -> None:
    """PyTorch's IndexError for a class target outside [0, C) that is not ignore_index, where the
    check is free: real targets in CPU memory (the interpreter), outside a compiled graph and
    fake-tensor tracing (a data-dependent branch there would break the graph). On a GPU such a row's loss is NaN instead: the
    check would cost a device-to-host sync per call."""
    if not target.is_cpu or target.numel() == 0 or torch.compiler.is_compiling():
        return
    from torch._subclasses.fake_tensor import is_fake

    if is_fake(target):
        return
    bad = (target != ignore_index) & ((target < 0) | (target >= n_classes))
    if bool(bad.any()):
        raise IndexError(f"Target {int(target[bad].flatten()[0])} is out of bounds.")


def _torch_decides(input, target, weight, reduction: str, label_smoothing: float) -> bool:
    """True for the calls that PyTorch runs itself: its result, or its error word for word and in
    its order. That covers bad arguments (reduction, label_smoothing > 1, a target that is no
    tensor), inputs the kernels do not take, no classes (C = 0: PyTorch's empty-input rules), a
    target or weight on another device (a target on "meta", say), a weight of the wrong shape or
    dtype, and class-index targets of the wrong shape or dtype, or with a class weight that
    requires grad (nll_loss has no derivative for it: PyTorch raises)."""
    if reduction not in _REDUCTIONS or label_smoothing > 1.0 or not isinstance(target, torch.Tensor):
        return True
    dim = input.dim()
    if dim == 0 or not _common.use_triton(input):
        return True
    class_dim = 0 if dim == 1 else 1
    c = input.shape[class_dim]
    device = input.device
    if c == 0 or target.device != device or (weight is not None and weight.device != device):
        return True
    if weight is not None and (weight.dim() != 1 or weight.numel() != c or weight.dtype != input.dtype):
        return True
    if target.is_floating_point() and target.shape == input.shape:
        return False  # probabilities: a differentiable formula, a weight may require grad
    weight_grad = weight is not None and weight.requires_grad and torch.is_grad_enabled()
    if dim == 2:  # the common (N, C) logits: the target is (N,)
        wrong_shape = target.dim() != 1 or target.shape[0] != input.shape[0]
    else:
        wrong_shape = target.shape != input.shape[:class_dim] + input.shape[class_dim + 1:]
    return wrong_shape or target.dtype not in (torch.int64, torch.uint8) or weight_grad


def cross_entropy(
    input: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    size_average=None,
    ignore_index: int = -100,
    reduce=None,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    *,
    loss_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Drop-in for ``torch.nn.functional.cross_entropy`` (class-index or probability targets).

    Logits (C), (N, C) or (N, C, d1, ...); class weights, ``ignore_index``, ``label_smoothing`` and
    every reduction. Forward: one kernel reading the logits once (online logsumexp); backward: one
    kernel reading them once more and writing the gradient: probabilities never reach memory. The
    loss has the logits' dtype and is accumulated in float32; ``loss_dtype=torch.float32`` (a kernelab
    keyword) returns that float32 value unrounded, as ``F.cross_entropy(input.float(), ...)`` would,
    without a float32 copy of the logits. As in PyTorch, a ``label_smoothing`` above 1 is an error
    and one that is not above 0 (negative, NaN) means no smoothing.
    """
    if size_average is not None or reduce is not None:
        reduction = torch.nn._reduction.legacy_get_string(size_average, reduce)
    if loss_dtype not in (None, torch.float32):
        raise KernelabError(f"cross_entropy: loss_dtype must be None (the logits' dtype) or torch.float32, "
                            f"got {loss_dtype}")
    float32_loss = loss_dtype is not None and isinstance(input, torch.Tensor) and input.dtype != torch.float32
    if _torch_decides(input, target, weight, reduction, label_smoothing):
        return F.cross_entropy(
            input.float() if float32_loss else input, target,
            weight.float() if float32_loss and weight is not None else weight,
            ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing)
    class_dim = 0 if input.dim() == 1 else 1
    c = input.shape[class_dim]
    smoothing = float(label_smoothing) if label_smoothing > 0 else 0.0  # negative or NaN: none, as in PyTorch
    if target.is_floating_point():  # (with float32_loss, computed on a float32 copy: a rare path)
        if float32_loss:
            input, target = input.float(), target.float()
            weight = None if weight is None else weight.float()
        return _soft_targets(input, target, weight, reduction, smoothing, class_dim)
    check_targets_on_host(target, c, ignore_index)
    # logits as [M, C] rows, class dim last (a K-dim input is transposed once)
    logits = input.movedim(class_dim, -1).reshape(-1, c) if input.dim() != 2 else input
    weight = None if weight is None else weight.contiguous()
    if target.dim() != 1 or not target.is_contiguous():  # (reshape makes a view even of a flat target)
        target = target.reshape(-1).contiguous()
    loss = _common.apply(_CrossEntropy, _ce_op, logits, target, weight, int(ignore_index), smoothing, reduction,
                         float32_loss)[0]
    return loss.reshape(input.shape[:class_dim] + input.shape[class_dim + 1:]) if reduction == "none" else loss
