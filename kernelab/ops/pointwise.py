"""Pointwise fusions, forward and backward: add_relu, bias_gelu, silu_mul (SwiGLU), gelu_mul (GeGLU).

    add_relu   y = relu(a + b)            da = db = dy * [y > 0]  (NaN passes, as in PyTorch)
    bias_gelu  y = gelu(x + bias)         dx = dbias = dy * gelu'(x + bias)
    silu_mul   y = silu(g) * u            dg = dy * u * silu'(g),   du = dy * silu(g)
    gelu_mul   y = gelu(g) * u            dg = dy * u * gelu'(g),   du = dy * gelu(g)
    silu(z) = z * sigmoid(z);  gelu(z) = z/2 * (1 + erf(z / sqrt 2)), or with approximate="tanh"
    z/2 * (1 + tanh(sqrt(2/pi) * (z + 0.044715 z^3)))

Traffic: each operand read once, the output written once; backward reads dy and the saved tensors
(add_relu saves only its output) once and writes each gradient once. An operand broadcast along
rows (a bias of shape [N] against [M, N]) is read through a zero row stride, and its gradient is
summed per program in-kernel (a [programs, N] float32 partial) rather than written at full size.
"""

from __future__ import annotations

import functools
import numbers
from typing import Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from . import _common

# Activation codes (constexpr): which function, and whether the second operand multiplies or adds.
RELU, GELU, GELU_TANH, SILU = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2), tl.constexpr(3)
#: The exact (erf) GELU with a short erfc approximation instead of libdevice's erff (``_phi``).
GELU_FAST = tl.constexpr(4)
#: 16-bit inputs take GELU_FAST (off: libdevice's erff for every dtype). float32 keeps erff.
FAST_GELU_16BIT = True
#: kind -> (activation, multiply): y = act(a) * b if multiply else act(a + b)
KINDS = {
    "add_relu": (RELU.value, False),
    "bias_gelu": (GELU.value, False),
    "bias_gelu_tanh": (GELU_TANH.value, False),
    "silu_mul": (SILU.value, True),
    "gelu_mul": (GELU.value, True),
    "gelu_tanh_mul": (GELU_TANH.value, True),
}
#: kind -> the PyTorch expression it fuses: the fallback, and what double backward differentiates
REFERENCES = {
    "add_relu": lambda a, b: torch.relu(a + b),
    "bias_gelu": lambda a, b: F.gelu(a + b),
    "bias_gelu_tanh": lambda a, b: F.gelu(a + b, approximate="tanh"),
    "silu_mul": lambda a, b: F.silu(a) * b,
    "gelu_mul": lambda a, b: F.gelu(a) * b,
    "gelu_tanh_mul": lambda a, b: F.gelu(a, approximate="tanh") * b,
}
# How the backward produces the second operand's gradient.
DB_SAME, DB_FULL, DB_ROWSUM = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)


# --------------------------------------------------------------------------- jitted helpers
@triton.jit
def _tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def _phi(z):
    """Phi(z), the standard normal CDF, as 0.5 * erfc(-z / sqrt 2) with the Chebyshev erfc fit of
    Numerical Recipes (erfcc: fractional error < 1.2e-7 everywhere, so the lower tail keeps its
    relative accuracy instead of cancelling in 1 + erf): one exp, one approximate division and
    nine FMAs, branch-free, where libdevice's erff takes two divergent paths (|x| < 1 or not) and
    made the erf GELU compute-bound (bias_gelu 16384x16384 bf16: 2.67 TB/s, 0.7e12 elements/s).
    Checked in float32 over [-12, 12] against math.erfc: GELU's relative error <= 4.2e-6 for
    z >= -6 (tests/ops/test_pointwise.py). Used for 16-bit inputs only."""
    a = tl.abs(z) * 0.7071067811865476
    t = tl.fdiv(1.0, 1.0 + 0.5 * a)
    p = -0.82215223 + t * 0.17087277
    p = 1.48851587 + t * p
    p = -1.13520398 + t * p
    p = 0.27886807 + t * p
    p = -0.18628806 + t * p
    p = 0.09678418 + t * p
    p = 0.37409196 + t * p
    p = 1.00002368 + t * p
    p = -1.26551223 + t * p
    half_erfc = 0.5 * t * tl.exp(p - a * a)
    return tl.where(z >= 0.0, 1.0 - half_erfc, half_erfc)


@triton.jit
def _act(z, ACT: tl.constexpr):
    """The activation, in float32."""
    if ACT == RELU:
        return tl.where(z < 0.0, 0.0, z)  # NaN stays NaN, as in torch.relu
    elif ACT == GELU:
        return 0.5 * z * (1.0 + tl.erf(z * 0.7071067811865476))
    elif ACT == GELU_TANH:
        return 0.5 * z * (1.0 + _tanh(0.7978845608028654 * (z + 0.044715 * z * z * z)))
    elif ACT == GELU_FAST:
        return z * _phi(z)
    else:
        return z * tl.sigmoid(z)


@triton.jit
def _act_grad(z, ACT: tl.constexpr):
    """d act / dz (for RELU, ``z`` is the saved output y: the derivative is [not y <= 0], which
    lets a NaN through exactly as torch's threshold_backward does)."""
    if ACT == RELU:
        return tl.where(z <= 0.0, 0.0, 1.0)
    elif ACT == GELU:
        cdf = 0.5 * (1.0 + tl.erf(z * 0.7071067811865476))
        return cdf + z * tl.exp(-0.5 * z * z) * 0.3989422804014327
    elif ACT == GELU_TANH:
        t = _tanh(0.7978845608028654 * (z + 0.044715 * z * z * z))
        # (1 - t^2) is exactly 0 where tanh saturates: skip the term there (z^3 may be inf)
        dt = tl.where(t * t == 1.0, 0.0, 0.5 * z * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 0.134145 * z * z))
        return 0.5 * (1.0 + t) + dt
    elif ACT == GELU_FAST:
        return _phi(z) + z * tl.exp(-0.5 * z * z) * 0.3989422804014327
    else:
        s = tl.sigmoid(z)
        return s * (1.0 + z * (1.0 - s))


#: The activation and its derivative, shared with the GEMM epilogues of ``kernelab.ops.gemm``.
activation, activation_grad = _act, _act_grad


@triton.jit
def _tile(pid_n, rows_start, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INT64: tl.constexpr):
    """Row and column indices of a tile; int64 when some offset can pass 2^31."""
    rows = rows_start + tl.arange(0, BLOCK_M)
    if INT64:
        rows = rows.to(tl.int64)
        pid_n = pid_n.to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    return rows, cols


# --------------------------------------------------------------------------- kernels
@triton.jit
def _pointwise_fwd_kernel(
    a_ptr, b_ptr, y_ptr,
    stride_am, stride_an, stride_bm, stride_bn, stride_ym,
    M, N,
    rows_per_program,
    ACT: tl.constexpr, MUL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INT64: tl.constexpr,
):
    """y = act(a) * b or act(a + b) over [M, N]; program (column block, row group).

    Reads a and b once (a broadcast operand through stride 0), writes y once.
    """
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    first = pid_m * rows_per_program
    for start in range(first, tl.minimum(first + rows_per_program, M), BLOCK_M):
        rows, cols = _tile(pid_n, start, BLOCK_M, BLOCK_N, INT64)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        # load both operands
        a = tl.load(a_ptr + rows[:, None] * stride_am + cols[None, :] * stride_an, mask=mask, other=0.0)
        b = tl.load(b_ptr + rows[:, None] * stride_bm + cols[None, :] * stride_bn, mask=mask, other=0.0)
        a, b = a.to(tl.float32), b.to(tl.float32)
        # combine and store
        y = _act(a, ACT) * b if MUL else _act(a + b, ACT)
        tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _pointwise_bwd_kernel(
    dy_ptr, a_ptr, b_ptr, da_ptr, db_ptr,
    stride_dym, stride_dyn, stride_am, stride_an, stride_bm, stride_bn, stride_dam, stride_dbm,
    M, N,
    rows_per_program,
    ACT: tl.constexpr, MUL: tl.constexpr, DB_MODE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INT64: tl.constexpr,
):
    """da (and db) over [M, N] from dy and the saved operands (for add_relu: a is the output y).

    DB_MODE: DB_SAME (db equals da, not written), DB_FULL (written like da), DB_ROWSUM (b was
    broadcast along rows: this program's column sums of db go to row pid_m of db_ptr).
    Reads dy and the operands once; writes da once (db once, or a partial row).
    """
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    first = pid_m * rows_per_program
    db_acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for start in range(first, tl.minimum(first + rows_per_program, M), BLOCK_M):
        rows, cols = _tile(pid_n, start, BLOCK_M, BLOCK_N, INT64)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        # load dy and the saved operands
        dy = tl.load(dy_ptr + rows[:, None] * stride_dym + cols[None, :] * stride_dyn, mask=mask, other=0.0)
        a = tl.load(a_ptr + rows[:, None] * stride_am + cols[None, :] * stride_an, mask=mask, other=0.0)
        dy, a = dy.to(tl.float32), a.to(tl.float32)
        # chain rule
        if MUL:
            b = tl.load(b_ptr + rows[:, None] * stride_bm + cols[None, :] * stride_bn, mask=mask, other=0.0)
            b = b.to(tl.float32)
            da = dy * b * _act_grad(a, ACT)
            db = dy * _act(a, ACT)
        elif ACT == RELU:
            da = dy * _act_grad(a, ACT)
            db = da
        else:
            b = tl.load(b_ptr + rows[:, None] * stride_bm + cols[None, :] * stride_bn, mask=mask, other=0.0)
            da = dy * _act_grad(a + b.to(tl.float32), ACT)
            db = da
        # store da; db in full, or accumulate its column sums
        tl.store(da_ptr + rows[:, None] * stride_dam + cols[None, :], da.to(da_ptr.dtype.element_ty), mask=mask)
        if DB_MODE == DB_FULL:
            tl.store(db_ptr + rows[:, None] * stride_dbm + cols[None, :], db.to(db_ptr.dtype.element_ty), mask=mask)
        if DB_MODE == DB_ROWSUM:
            db_acc += tl.where(mask, db, 0.0)
    if DB_MODE == DB_ROWSUM:
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        tl.store(db_ptr + pid_m.to(tl.int64) * N + cols, tl.sum(db_acc, axis=0), mask=cols < N)


# --------------------------------------------------------------------------- launchers
def _as_2d(t: torch.Tensor, shape: torch.Size, m: int, n: int) -> torch.Tensor:
    """``t`` broadcast to ``shape`` and viewed as [m, n]; materialized only if no view exists."""
    e = t.expand(shape)
    try:
        return e.view(m, n)
    except RuntimeError:
        return e.contiguous().view(m, n)


def _layout(a: torch.Tensor, b: torch.Tensor):
    """(shape, m, n, (a2, its [M, N] strides), (b2, its strides)): the broadcast shape as [m, n]
    rows; operands of one shape, both contiguous (the common case), as flat [1, numel] rows
    passed as they are (no view made)."""
    if a.shape == b.shape:
        shape = a.shape
        if a.is_contiguous() and b.is_contiguous():
            numel = shape.numel()
            return shape, 1, numel, (a, (numel, 1)), (b, (numel, 1))
    else:
        shape = _common.broadcast_shape(a.shape, b.shape)
    numel = shape.numel()
    n = shape[-1] if len(shape) else 1
    m = numel // n if n else 0
    a2, b2 = _as_2d(a, shape, m, n), _as_2d(b, shape, m, n)
    return shape, m, n, (a2, a2.stride()), (b2, b2.stride())


def _rows(t: torch.Tensor, shape: torch.Size, m: int, n: int):
    """(t2, its [M, N] strides) for ``t`` of the layout's shape: ``t`` itself when contiguous."""
    if t.shape == shape and t.is_contiguous():
        return t, (n, 1)
    t2 = _as_2d(t, shape, m, n)
    return t2, t2.stride()


def _grid(m: int, n: int, block_m: int, block_n: int, row_programs: int):
    """((column blocks, row groups), rows per program): row groups <= 65535 (grid axis 1)."""
    row_programs = max(1, min(row_programs, _common.cdiv(m, block_m), 65535))
    rows_per_program = _common.cdiv(_common.cdiv(m, row_programs), block_m) * block_m
    return (_common.cdiv(n, block_n), _common.cdiv(m, rows_per_program)), rows_per_program


def _config(n: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps): 4096-element tiles, 16 elements per thread."""
    block_n = min(_common.next_pow2(max(n, 1)), 4096)
    return max(1, 4096 // block_n), block_n, 8


@functools.lru_cache(maxsize=1024)
def _launch_config(m: int, n: int, programs: Optional[int]) -> tuple:
    """(grid, rows per program, BLOCK_M, BLOCK_N, num_warps) for [m, n]: one row block a program
    (``programs`` None), or at most ``programs`` programs shared among the column blocks (cached:
    host time per call)."""
    block_m, block_n, warps = _config(n)
    rows = _common.cdiv(m, block_m) if programs is None else programs // _common.cdiv(n, block_n)
    return (*_grid(m, n, block_m, block_n, rows), block_m, block_n, warps)


def _activation(kind: str, dtype: torch.dtype) -> tuple[int, bool]:
    """(activation code, multiply) of ``kind`` for inputs of ``dtype``."""
    act, mul = KINDS[kind]
    if act == GELU.value and FAST_GELU_16BIT and dtype in (torch.float16, torch.bfloat16):
        act = GELU_FAST.value
    return act, mul


def _pointwise_forward(a: torch.Tensor, b: torch.Tensor, kind: str) -> torch.Tensor:
    """y, contiguous (written as [M, N] rows of stride N: no view made)."""
    act, mul = _activation(kind, a.dtype)
    shape, m, n, (a2, sa), (b2, sb) = _layout(a, b)
    y = _common.empty(shape, a.dtype, a.device)
    if m == 0 or n == 0:
        return y
    grid, rows_per_program, block_m, block_n, warps = _launch_config(m, n, None)
    _prepared(_pointwise_fwd_kernel, act, mul, None, block_m, block_n, _common.needs_int64(a2, b2, y), warps)(
        grid, a2, b2, y, sa[0], sa[1], sb[0], sb[1], n, m, n, rows_per_program,
    )
    return y


@functools.lru_cache(maxsize=1024)
def _prepared(kernel, act: int, mul: bool, db_mode: Optional[int], block_m: int, block_n: int, int64: bool,
              warps: int):
    """``kernel`` prepared with these constexprs (DB_MODE for the backward kernel only; cached:
    host time per call)."""
    modes = {} if db_mode is None else {"DB_MODE": db_mode}
    return _common.prepared(kernel, ACT=act, MUL=mul, **modes, BLOCK_M=block_m, BLOCK_N=block_n, INT64=int64,
                            num_warps=warps)


def _pointwise_backward(dy: torch.Tensor, a: torch.Tensor, b: torch.Tensor, kind: str, a_shape: list[int], b_shape: list[int]):
    """(da, db) with shapes a_shape, b_shape (``b`` has b_shape). For add_relu, ``a`` is the
    forward's output. Gradients of the layout's shape are contiguous, written as [M, N] rows of
    stride N."""
    act, mul = _activation(kind, a.dtype)
    shape, m, n, (a2, sa), (b2, sb) = _layout(a, b)
    da = _common.empty(shape, a.dtype, a.device)
    if m == 0 or n == 0:
        db_shape = (0,) if _shares_grad(kind, a_shape, b_shape) else b_shape
        return torch.zeros(a_shape, dtype=a.dtype, device=a.device), torch.zeros(db_shape, dtype=b.dtype, device=b.device)
    dy2, sdy = _rows(dy, shape, m, n)
    b_full = b.shape == shape
    if not b_full and sb[0] == 0 and sb[1] == 1 and m > 1:  # b broadcast along rows: per-program column sums
        mode = DB_ROWSUM.value
        grid, rows_per_program, block_m, block_n, warps = _launch_config(m, n, 4 * _common.sm_count(a.device))
        db2 = _common.empty((grid[1], n), torch.float32, a.device)
    elif mul:
        mode = DB_FULL.value
        grid, rows_per_program, block_m, block_n, warps = _launch_config(m, n, None)
        db2 = _common.empty(shape, b.dtype, b.device)
    else:
        mode = DB_SAME.value
        grid, rows_per_program, block_m, block_n, warps = _launch_config(m, n, None)
        db2 = None
    _prepared(_pointwise_bwd_kernel, act, mul, mode, block_m, block_n, _common.needs_int64(dy2, a2, b2, da), warps)(
        grid, dy2, a2, b2, da, db2, sdy[0], sdy[1], sa[0], sa[1], sb[0], sb[1], n, n if db2 is not None else 0,
        m, n, rows_per_program,
    )
    # gradients of broadcast operands: sum over the broadcast dims
    if mode == DB_ROWSUM.value:
        db = _common.sum_partials(db2, None, b.dtype)[0].reshape(b_shape)
    elif mode == DB_FULL.value:
        db = db2 if b_full else db2.sum_to_size(b_shape)
    elif b_full:
        db = da.new_empty((0,))  # the same values as da: the caller reuses da (no copy, no alias)
    else:
        db = da.sum_to_size(b_shape)
    return (da if tuple(a_shape) == shape else da.sum_to_size(a_shape)), db


# --------------------------------------------------------------------------- custom ops and autograd
@torch.library.custom_op("kernelab::pointwise", mutates_args=())
def _pointwise_op(a: torch.Tensor, b: torch.Tensor, kind: str) -> torch.Tensor:
    return _pointwise_forward(a, b, kind)


@_pointwise_op.register_fake
def _(a, b, kind):
    return a.new_empty(_common.broadcast_shape(a.shape, b.shape))


@torch.library.custom_op("kernelab::pointwise_backward", mutates_args=())
def _pointwise_backward_op(
    dy: torch.Tensor, a: torch.Tensor, b: torch.Tensor, kind: str, a_shape: list[int], b_shape: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    return _pointwise_backward(dy, a, b, kind, a_shape, b_shape)


@_pointwise_backward_op.register_fake
def _(dy, a, b, kind, a_shape, b_shape):
    return a.new_empty(a_shape), b.new_empty((0,) if _shares_grad(kind, a_shape, b_shape) else b_shape)


def _setup_context(ctx, inputs, output):
    a, b, kind = inputs
    ctx.kind, ctx.a_shape, ctx.b_shape = kind, list(a.shape), list(b.shape)
    # add_relu needs only its output; the others recompute from their inputs
    ctx.save_for_backward(*((output, b) if kind == "add_relu" else (a, b)))


def _backward(ctx, dy):
    a, b = ctx.saved_tensors
    if _common.builds_graph():  # double backward: PyTorch's differentiable gradients
        return (*_reference_grads(ctx, dy, a, b), None)
    da, db = _common.call(_pointwise_backward_op, _pointwise_backward, dy, a, b, ctx.kind, ctx.a_shape, ctx.b_shape)
    if _shares_grad(ctx.kind, ctx.a_shape, ctx.b_shape):
        db = da  # additive kinds with equal shapes: one gradient tensor, as PyTorch's add returns
    return da, db, None


def _reference_grads(ctx, dy, a, b):
    """(da, db) differentiable again. add_relu saved its output y: da = db = dy where y > 0 (NaN
    passes), summed to each operand's shape, by relu's own backward op (its derivative in y is 0).
    The other kinds differentiate their PyTorch expression at (a, b)."""
    needs = ctx.needs_input_grad[:2]
    if ctx.kind == "add_relu":
        g = torch.ops.aten.threshold_backward(dy, a, 0)
        return [g.sum_to_size(shape) if need else None for need, shape in zip(needs, (ctx.a_shape, ctx.b_shape))]
    return _common.reference_grads(REFERENCES[ctx.kind], (a, b), needs, dy)


def _shares_grad(kind: str, a_shape: list[int], b_shape: list[int]) -> bool:
    return not KINDS[kind][1] and list(a_shape) == list(b_shape)


_pointwise_op.register_autograd(_backward, setup_context=_setup_context)
_Pointwise = _common.eager_function("_Pointwise", _pointwise_forward, _setup_context, _backward)


# --------------------------------------------------------------------------- public functions
def _category(dtype: torch.dtype) -> int:
    return 3 if dtype.is_complex else 2 if dtype.is_floating_point else 0 if dtype == torch.bool else 1


def _result_type(a: torch.Tensor, b) -> torch.dtype:
    """``torch.result_type(a, b)``, spelled so that torch.compile can trace it: a 0-dim tensor or
    a Python number only moves the result to a higher category (bool < int < float)."""
    if isinstance(b, torch.Tensor) and (b.dim() > 0) == (a.dim() > 0):
        return torch.promote_types(a.dtype, b.dtype)
    if isinstance(b, torch.Tensor):
        full, other = (a, b) if a.dim() > 0 else (b, a)
        if _category(other.dtype) > _category(full.dtype):
            return other.dtype if _category(other.dtype) > 1 else torch.promote_types(full.dtype, other.dtype)
        return full.dtype
    if isinstance(b, bool):
        return a.dtype
    if isinstance(b, int):
        return a.dtype if _category(a.dtype) >= 1 else torch.int64
    return a.dtype if _category(a.dtype) >= 2 else torch.get_default_dtype()


def _run(kind: str, a, b):
    """Promote dtypes as PyTorch does, then run the fused kernel (or the PyTorch reference)."""
    if not isinstance(a, torch.Tensor):
        raise TypeError(f"{kind}(): argument 'input' must be Tensor, not {type(a).__name__}")
    if not isinstance(b, (torch.Tensor, numbers.Number)):  # (None raised an AttributeError inside)
        raise TypeError(f"{kind}(): the second operand must be a Tensor or a number, not {type(b).__name__}")
    dtype = _result_type(a, b)
    device = a.device
    tensor = isinstance(b, torch.Tensor)
    if (not tensor and isinstance(b, numbers.Number)) or (tensor and b.dim() == 0 and b.device != device):
        b = torch.as_tensor(b, dtype=dtype, device=device)
    other_device = isinstance(b, torch.Tensor) and b.device != device  # PyTorch's error, or its rule
    if dtype not in _common.FLOAT_DTYPES or other_device or not _common.use_triton(a):
        return REFERENCES[kind](a, b)
    if a.dtype != dtype:
        a = a.to(dtype)
    if b.dtype != dtype:
        b = b.to(dtype)
    if not KINDS[kind][1] and b.shape != a.shape and _common.broadcast_shape(a.shape, b.shape) == b.shape:
        a, b = b, a  # additive kinds commute: keep the full-size operand first
    return _common.apply(_Pointwise, _pointwise_op, a, b, kind)


def _check_approximate(approximate: str) -> str:
    if approximate not in ("none", "tanh"):
        raise RuntimeError("approximate argument must be either none or tanh.")
    return "" if approximate == "none" else "_tanh"


def add_relu(input: torch.Tensor, other) -> torch.Tensor:
    """``torch.relu(input + other)`` in one kernel (eager PyTorch runs two and moves 5 arrays, this
    moves 3). Broadcasting and dtype promotion as ``torch.add``; backward in one kernel too."""
    return _run("add_relu", input, other)


def bias_gelu(input: torch.Tensor, bias, approximate: str = "none") -> torch.Tensor:
    """``F.gelu(input + bias, approximate=approximate)`` in one kernel; the bias (typically [N])
    broadcasts, and its gradient is reduced in the backward kernel."""
    suffix = _check_approximate(approximate)
    return _run("bias_gelu" + suffix, input, bias)


def silu_mul(gate: torch.Tensor, up) -> torch.Tensor:
    """SwiGLU's ``F.silu(gate) * up`` in one kernel, forward and backward."""
    return _run("silu_mul", gate, up)


def gelu_mul(gate: torch.Tensor, up, approximate: str = "none") -> torch.Tensor:
    """GeGLU's ``F.gelu(gate, approximate=approximate) * up`` in one kernel, forward and backward."""
    suffix = _check_approximate(approximate)
    return _run("gelu" + suffix + "_mul", gate, up)
