"""softmax and log_softmax over one dimension, forward and backward.

    forward   m = max_j x_j,  s = sum_j exp(x_j - m)
              y = exp(x - m) / s                        (softmax)
              y = x - m - log(s)                        (log_softmax)
    backward  dx = y * (dy - sum_j dy_j * y_j)          (softmax)
              dx = dy - exp(y) * sum_j dy_j             (log_softmax)

Traffic, in passes over one [M, N] tensor: forward reads x and writes y (2), backward reads y and
dy and writes dx (3). Rows of up to MAX_FUSED elements are held in registers, so that is exactly
what moves (a row of a non-power-of-two width as two power-of-two parts, a head and a masked
tail, where that idles fewer lanes than one tile: ``_common.row_tile``). Longer rows are split
across a team of programs (``teams.py``): each member holds
8192 columns and the team exchanges (max, sum of exp) (backward: its sum) through a GPU barrier,
so the traffic stays 2 and 3 passes. Measured on the H200 (bf16, kernels' GPU time,
``results/ops_tune7_h200.csv``): 3.05 TB/s forward at 2048x262144, 3.11 at 4096x65536, where the
two-pass kernels below run 2.69 and 3.08: the barrier costs about what the saved read gains at
65536 columns. Under the interpreter, past MAX_TEAM members and with ``KERNELAB_TEAMS=0``, long
rows are looped over in 8192-element chunks, twice: a first pass for the statistics (online max
and sum), a second for the output, which walks the row backwards, newest chunk first, after
evict-last loads in the first pass, so that L2 can serve part of the re-read.
"""

from __future__ import annotations

import functools
import operator

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch._prims_common import canonicalize_dim

from . import _common, teams
from ._common import row_offsets, tail_offsets

#: Elements per program and per thread of the one-pass backward (it holds y and dy); None: the
#: forward's rule (``_common.row_tile``).
BWD_TILE = None
BWD_PER_THREAD = None
#: log_softmax's backward of long rows by teams (off: two passes). Its first pass reads dy only, so
#: the two-pass kernel moves 4 passes for 3 counted, and measured faster than the team kernel on
#: the H200 (bf16 fwd+bwd, GPU time of the kernels, results/ops_tune9_h200.csv: 3.49 vs 3.05 TB/s
#: at 4096x65536, 3.16 vs 2.92 at 2048x262144). softmax's backward reads y and dy in both passes
#: and gains from teams (ops_tune7_h200.csv: 3.13 vs 3.09, 3.04 vs 2.64).
TEAM_BACKWARD_LOG = False


# --------------------------------------------------------------------------- jitted helpers
@triton.jit
def lse_update(m, s, x):
    """Fold chunk ``x`` (fp32, masked lanes -inf) into the running max ``m`` and ``s = sum exp(x - m)``.

    Shared with cross_entropy. A row that is all -inf so far keeps ``s = 0`` (no exp(-inf + inf)).
    """
    m_new = tl.maximum(m, tl.max(x, axis=0))
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    s = s * tl.exp(m - shift) + tl.sum(tl.exp(x - shift), axis=0)
    return m_new, s


@triton.jit
def _normalize(x, shift, s, LOG: tl.constexpr):
    """y from x and the row statistics (``shift`` = max, or 0 for an all -inf row; ``s`` = sum exp)."""
    if LOG:
        return x - shift - tl.log(s)
    else:
        return tl.exp(x - shift) * (1.0 / s)


@triton.jit
def _grad_term(y, dy, LOG: tl.constexpr):
    """The per-element term whose row sum the gradient needs."""
    if LOG:
        return dy
    else:
        return dy * y


@triton.jit
def _grad(y, dy, acc, LOG: tl.constexpr):
    """dx from y, dy and the row sum ``acc`` of ``_grad_term``."""
    if LOG:
        return dy - tl.exp(y) * acc
    else:
        return y * (dy - acc)


# --------------------------------------------------------------------------- kernels
@triton.jit
def _softmax_fwd_kernel(
    x_ptr, y_ptr,
    stride_x, stride_y,
    M, N,
    LOG: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TAIL: tl.constexpr, STAGES: tl.constexpr,
):
    """Blocks of BLOCK_M whole rows held in registers (one block per program as launched; the
    loop also serves a persistent grid): x read once, y written once. TAIL > 0: a row is its first
    BLOCK_N columns and a masked tail of TAIL after them (``_common.row_tile``)."""
    for blk in tl.range(tl.program_id(0).to(tl.int64), tl.cdiv(M, BLOCK_M), tl.num_programs(0), num_stages=STAGES):
        rows, cols = row_offsets(blk, BLOCK_M, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        # load x (masked lanes -inf: they drop out of max and sum)
        x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=float("-inf"))
        x = x.to(tl.float32)
        if TAIL > 0:
            cols_t, mask_t = tail_offsets(rows, M, N, BLOCK_N, TAIL)
            x_t = tl.load(x_ptr + rows[:, None] * stride_x + cols_t[None, :], mask=mask_t, other=float("-inf"))
            x_t = x_t.to(tl.float32)
        # reduce: row max, then row sum of exp(x - max)
        m = tl.max(x, axis=1)
        if TAIL > 0:
            m = tl.maximum(m, tl.max(x_t, axis=1))
        shift = tl.where(m == float("-inf"), 0.0, m)[:, None]
        s = tl.sum(tl.exp(x - shift), axis=1)[:, None]
        if TAIL > 0:
            s += tl.sum(tl.exp(x_t - shift), axis=1)[:, None]
        # normalize and store y
        y = _normalize(x, shift, s, LOG)
        tl.store(y_ptr + rows[:, None] * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
        if TAIL > 0:
            y_t = _normalize(x_t, shift, s, LOG)
            tl.store(y_ptr + rows[:, None] * stride_y + cols_t[None, :], y_t.to(y_ptr.dtype.element_ty), mask=mask_t)


@triton.jit
def _softmax_fwd_looped_kernel(
    x_ptr, y_ptr,
    stride_x, stride_y,
    M, N,
    LOG: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Rows of any length: persistent programs, each row in two passes over BLOCK_N chunks.

    Each pass loads chunk c+1 before reducing chunk c, so two chunks are in flight per program.
    """
    cols = tl.arange(0, BLOCK_N)
    n_chunks = tl.cdiv(N, BLOCK_N)
    for row in range(tl.program_id(0).to(tl.int64), M, tl.num_programs(0)):
        x_row = x_ptr + row * stride_x
        y_row = y_ptr + row * stride_y
        # pass 1, read x: online max and sum of exp (evict-last: pass 2 re-reads from L2)
        m = tl.full((), float("-inf"), tl.float32)
        s = tl.full((), 0.0, tl.float32)
        x_next = tl.load(x_row + cols, mask=cols < N, other=float("-inf"), eviction_policy="evict_last")
        for c in range(0, n_chunks):
            x = x_next
            idx = (c + 1) * BLOCK_N + cols
            x_next = tl.load(x_row + idx, mask=idx < N, other=float("-inf"), eviction_policy="evict_last")
            m, s = lse_update(m, s, x.to(tl.float32))
        shift = tl.where(m == float("-inf"), 0.0, m)
        # pass 2, re-read x newest chunk first (L2 hits), normalize, write y
        idx = (n_chunks - 1) * BLOCK_N + cols
        x_next = tl.load(x_row + idx, mask=idx < N, other=0.0, eviction_policy="evict_first")
        for c in range(0, n_chunks):
            x, out = x_next, idx
            idx = (n_chunks - 2 - c) * BLOCK_N + cols
            x_next = tl.load(x_row + idx, mask=(idx >= 0) & (idx < N), other=0.0, eviction_policy="evict_first")
            y = _normalize(x.to(tl.float32), shift, s, LOG)
            tl.store(y_row + out, y.to(y_ptr.dtype.element_ty), mask=out < N)


@triton.jit
def _softmax_bwd_kernel(
    y_ptr, dy_ptr, dx_ptr,
    stride_y, stride_dy, stride_dx,
    M, N,
    LOG: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TAIL: tl.constexpr, STAGES: tl.constexpr,
):
    """Blocks of BLOCK_M whole rows (one block per program as launched): y and dy read once, dx
    written once. TAIL > 0: rows split into BLOCK_N columns and a masked tail, as in the forward."""
    for blk in tl.range(tl.program_id(0).to(tl.int64), tl.cdiv(M, BLOCK_M), tl.num_programs(0), num_stages=STAGES):
        rows, cols = row_offsets(blk, BLOCK_M, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        # load y and dy
        y = tl.load(y_ptr + rows[:, None] * stride_y + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if TAIL > 0:
            cols_t, mask_t = tail_offsets(rows, M, N, BLOCK_N, TAIL)
            y_t = tl.load(y_ptr + rows[:, None] * stride_y + cols_t[None, :], mask=mask_t, other=0.0).to(tl.float32)
            dy_t = tl.load(dy_ptr + rows[:, None] * stride_dy + cols_t[None, :], mask=mask_t, other=0.0).to(tl.float32)
        # reduce: sum(dy * y) or sum(dy)
        acc = tl.sum(_grad_term(y, dy, LOG), axis=1)[:, None]
        if TAIL > 0:
            acc += tl.sum(_grad_term(y_t, dy_t, LOG), axis=1)[:, None]
        # store dx
        dx = _grad(y, dy, acc, LOG)
        tl.store(dx_ptr + rows[:, None] * stride_dx + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if TAIL > 0:
            dx_t = _grad(y_t, dy_t, acc, LOG)
            tl.store(dx_ptr + rows[:, None] * stride_dx + cols_t[None, :], dx_t.to(dx_ptr.dtype.element_ty),
                     mask=mask_t)


@triton.jit
def _softmax_bwd_looped_kernel(
    y_ptr, dy_ptr, dx_ptr,
    stride_y, stride_dy, stride_dx,
    M, N,
    LOG: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Rows of any length: persistent programs, two passes (row sum, then dx), second one reversed.

    Each pass loads chunk c+1 before using chunk c.
    """
    cols = tl.arange(0, BLOCK_N)
    n_chunks = tl.cdiv(N, BLOCK_N)
    for row in range(tl.program_id(0).to(tl.int64), M, tl.num_programs(0)):
        y_row = y_ptr + row * stride_y
        dy_row = dy_ptr + row * stride_dy
        dx_row = dx_ptr + row * stride_dx
        # pass 1, read y and dy: the row sum (evict-last: pass 2 re-reads from L2)
        acc = tl.zeros((BLOCK_N,), tl.float32)
        y_next = tl.load(y_row + cols, mask=cols < N, other=0.0, eviction_policy="evict_last")
        dy_next = tl.load(dy_row + cols, mask=cols < N, other=0.0, eviction_policy="evict_last")
        for c in range(0, n_chunks):
            y, dy = y_next, dy_next
            idx = (c + 1) * BLOCK_N + cols
            y_next = tl.load(y_row + idx, mask=idx < N, other=0.0, eviction_policy="evict_last")
            dy_next = tl.load(dy_row + idx, mask=idx < N, other=0.0, eviction_policy="evict_last")
            acc += _grad_term(y.to(tl.float32), dy.to(tl.float32), LOG)
        total = tl.sum(acc, axis=0)
        # pass 2, re-read newest chunk first (L2 hits), write dx
        idx = (n_chunks - 1) * BLOCK_N + cols
        y_next = tl.load(y_row + idx, mask=idx < N, other=0.0, eviction_policy="evict_first")
        dy_next = tl.load(dy_row + idx, mask=idx < N, other=0.0, eviction_policy="evict_first")
        for c in range(0, n_chunks):
            y, dy, out = y_next, dy_next, idx
            idx = (n_chunks - 2 - c) * BLOCK_N + cols
            valid = (idx >= 0) & (idx < N)
            y_next = tl.load(y_row + idx, mask=valid, other=0.0, eviction_policy="evict_first")
            dy_next = tl.load(dy_row + idx, mask=valid, other=0.0, eviction_policy="evict_first")
            dx = _grad(y.to(tl.float32), dy.to(tl.float32), total, LOG)
            tl.store(dx_row + out, dx.to(dx_ptr.dtype.element_ty), mask=out < N)


@triton.jit
def _softmax_fwd_team_kernel(
    x_ptr, y_ptr, part_ptr, count_ptr, gone_ptr,
    stride_x, stride_y,
    M, N,
    LOG: tl.constexpr, CHUNK: tl.constexpr, TEAM: tl.constexpr, TEAM_P2: tl.constexpr,
):
    """Long rows split across a team of programs (``teams.py``): each member holds CHUNK columns,
    the team exchanges (max, sum of exp) per row. x read once, y written once; the next row's
    chunk is loaded while the team waits."""
    team, rank, n_teams, cols = teams.member(CHUNK, TEAM)
    ok = cols < N
    x_next = teams.load_row(x_ptr, team.to(tl.int64), stride_x, cols, ok, M, float("-inf"))
    phase = 0
    for row in range(team.to(tl.int64), M, n_teams):
        # this member's chunk: its max and sum of exp; publish them, load the next row, wait
        x = x_next.to(tl.float32)
        m = tl.max(x, axis=0)
        shift = tl.where(m == float("-inf"), 0.0, m)
        s = tl.sum(tl.exp(x - shift), axis=0)
        teams.publish(part_ptr, count_ptr, team, rank, phase, m, s, TEAM_P2)
        x_next = teams.load_row(x_ptr, row + n_teams, stride_x, cols, ok, M, float("-inf"))
        ms, ss, valid = teams.gather(part_ptr, count_ptr, team, phase, TEAM, TEAM_P2)
        # the team's: rescale every member's sum to the row max
        ms = tl.where(valid, ms, float("-inf"))
        m_row = tl.max(ms, axis=0)
        shift_row = tl.where(m_row == float("-inf"), 0.0, m_row)
        s_row = tl.sum(ss * tl.exp(ms - shift_row), axis=0)
        y = _normalize(x, shift_row, s_row, LOG)
        tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=ok)
        phase += 1
    teams.leave(count_ptr, gone_ptr, team, TEAM)


@triton.jit
def _softmax_bwd_team_kernel(
    y_ptr, dy_ptr, dx_ptr, part_ptr, count_ptr, gone_ptr,
    stride_y, stride_dy, stride_dx,
    M, N,
    LOG: tl.constexpr, CHUNK: tl.constexpr, TEAM: tl.constexpr, TEAM_P2: tl.constexpr,
):
    """Long rows split across a team of programs: the team adds up its members' sums of
    ``_grad_term``. y and dy read once, dx written once."""
    team, rank, n_teams, cols = teams.member(CHUNK, TEAM)
    ok = cols < N
    y_next = teams.load_row(y_ptr, team.to(tl.int64), stride_y, cols, ok, M, 0.0)
    dy_next = teams.load_row(dy_ptr, team.to(tl.int64), stride_dy, cols, ok, M, 0.0)
    phase = 0
    for row in range(team.to(tl.int64), M, n_teams):
        y = y_next.to(tl.float32)
        dy = dy_next.to(tl.float32)
        teams.publish(part_ptr, count_ptr, team, rank, phase, tl.sum(_grad_term(y, dy, LOG), axis=0), 0.0, TEAM_P2)
        y_next = teams.load_row(y_ptr, row + n_teams, stride_y, cols, ok, M, 0.0)
        dy_next = teams.load_row(dy_ptr, row + n_teams, stride_dy, cols, ok, M, 0.0)
        parts, _, _ = teams.gather(part_ptr, count_ptr, team, phase, TEAM, TEAM_P2)
        dx = _grad(y, dy, tl.sum(parts, axis=0), LOG)
        tl.store(dx_ptr + row * stride_dx + cols, dx.to(dx_ptr.dtype.element_ty), mask=ok)
        phase += 1
    teams.leave(count_ptr, gone_ptr, team, TEAM)


# --------------------------------------------------------------------------- launchers
@functools.lru_cache(maxsize=1024)
def _one_pass_launch(backward: bool, m: int, n: int, log: bool, tile, per_thread, split: bool) -> tuple:
    """(grid, prepared launch) of the one-pass forward or backward kernel (cached per call shape;
    ``tile``, ``per_thread`` and ``split`` are ``row_tile``'s settings in force). Keyed by a bool,
    not by the kernel: a JITFunction hashes through Triton's ``cache_key`` property, about a
    microsecond of host time a call."""
    kernel = _softmax_bwd_kernel if backward else _softmax_fwd_kernel
    t = _common.row_tile(m, n, tile=tile, per_thread=per_thread, split=split)
    grid = (_common.tile_grid(m, t.block_m, t.warps, None),)
    return grid, _common.prepared(kernel, LOG=log, BLOCK_M=t.block_m, BLOCK_N=t.block_n, TAIL=t.tail,
                                  STAGES=_common.ONE_PASS_STAGES, num_warps=t.warps)


def _softmax_forward(x: torch.Tensor, log: bool) -> torch.Tensor:
    """y = softmax / log_softmax of ``x`` over its last dim; contiguous, x's dtype (written as
    [M, N] rows of stride N: no view made)."""
    n = x.shape[-1] if x.dim() else 1
    y = _common.empty(x.shape, x.dtype, x.device)
    numel = x.numel()
    if numel == 0:
        return y
    (x2, stride_x), m = _common.row_view(x, n), numel // n
    if n <= _common.MAX_FUSED:
        grid, launch = _one_pass_launch(False, m, n, log, _common.ROW_TILE, _common.ROW_PER_THREAD,
                                        _common.SPLIT_ROWS)
        launch(grid, x2, y, stride_x, n, m, n)
        return y
    if (p := teams.plan(m, n, x.device, teams.FWD_CHUNK, teams.FWD_WARPS, teams.FWD_PER_SM)) is not None:
        _common.launch(_softmax_fwd_team_kernel, p.grid)(
            x2, y, *teams.buffers(x.device, p), stride_x, n, m, n,
            LOG=log, CHUNK=p.chunk, TEAM=p.team, TEAM_P2=p.team_p2, num_warps=p.warps, maxnreg=p.maxnreg,
        )
    else:
        block_n, warps = _common.chunk_config(x.element_size())
        grid = _common.persistent_grid(m, n * x.element_size(), x.device)
        _common.launch(_softmax_fwd_looped_kernel, (grid,))(
            x2, y, stride_x, n, m, n,
            LOG=log, BLOCK_N=block_n, num_warps=warps,
        )
    return y


def _softmax_backward(dy: torch.Tensor, y: torch.Tensor, log: bool) -> torch.Tensor:
    """dx from the saved output ``y`` and the incoming gradient ``dy`` (same shape); dx contiguous
    (written as [M, N] rows of stride N)."""
    n = y.shape[-1] if y.dim() else 1
    dx = _common.empty(y.shape, y.dtype, y.device)
    numel = y.numel()
    if numel == 0:
        return dx
    (y2, stride_y), (dy2, stride_dy), m = _common.row_view(y, n), _common.row_view(dy, n), numel // n
    if n <= _common.MAX_FUSED:
        grid, launch = _one_pass_launch(True, m, n, log, BWD_TILE or _common.ROW_TILE,
                                        BWD_PER_THREAD or _common.ROW_PER_THREAD, _common.SPLIT_ROWS)
        launch(grid, y2, dy2, dx, stride_y, stride_dy, n, m, n)
        return dx
    if (not log or TEAM_BACKWARD_LOG) and (
            p := teams.plan(m, n, y.device, teams.BWD_CHUNK, teams.BWD_WARPS, teams.BWD_PER_SM)) is not None:
        _common.launch(_softmax_bwd_team_kernel, p.grid)(
            y2, dy2, dx, *teams.buffers(y.device, p), stride_y, stride_dy, n, m, n,
            LOG=log, CHUNK=p.chunk, TEAM=p.team, TEAM_P2=p.team_p2, num_warps=p.warps, maxnreg=p.maxnreg,
        )
    else:
        block_n, warps = _common.chunk_config(max(y.element_size(), dy.element_size()))
        grid = _common.persistent_grid(m, n * (y.element_size() + dy.element_size()), y.device)
        _common.launch(_softmax_bwd_looped_kernel, (grid,))(
            y2, dy2, dx, stride_y, stride_dy, n, m, n,
            LOG=log, BLOCK_N=block_n, num_warps=warps,
        )
    return dx


# --------------------------------------------------------------------------- custom ops and autograd
@torch.library.custom_op("kernelab::softmax", mutates_args=())
def _softmax_op(x: torch.Tensor, log: bool) -> torch.Tensor:
    return _softmax_forward(x, log)


@_softmax_op.register_fake
def _(x, log):
    return x.new_empty(x.shape)


@torch.library.custom_op("kernelab::softmax_backward", mutates_args=())
def _softmax_backward_op(dy: torch.Tensor, y: torch.Tensor, log: bool) -> torch.Tensor:
    return _softmax_backward(dy, y, log)


@_softmax_backward_op.register_fake
def _(dy, y, log):
    return y.new_empty(y.shape)


def _setup_context(ctx, inputs, output):
    ctx.log = inputs[1]
    ctx.save_for_backward(output)


def _backward(ctx, dy):
    (y,) = ctx.saved_tensors
    if _common.builds_graph():  # double backward: the same formula in differentiable PyTorch ops
        return _reference_grad(dy, y, ctx.log), None
    return _common.call(_softmax_backward_op, _softmax_backward, dy, y, ctx.log), None


def _reference_grad(dy: torch.Tensor, y: torch.Tensor, log: bool) -> torch.Tensor:
    """dx from the saved output y (itself differentiable through this op), in float32 as the
    kernels compute it: softmax y * (dy - sum(dy * y)), log_softmax dy - exp(y) * sum(dy)."""
    y32, dy32 = y.float(), dy.float()
    if log:
        dx = dy32 - y32.exp() * dy32.sum(-1, keepdim=True)
    else:
        dx = y32 * (dy32 - (dy32 * y32).sum(-1, keepdim=True))
    return dx.to(y.dtype)


_softmax_op.register_autograd(_backward, setup_context=_setup_context)
_Softmax = _common.eager_function("_Softmax", _softmax_forward, _setup_context, _backward)


# --------------------------------------------------------------------------- public functions
def _run(name: str, input: torch.Tensor, dim, stacklevel: int, dtype, log: bool) -> torch.Tensor:
    if dim is None:
        dim = F._get_softmax_dim(name, input.dim(), stacklevel + 1)
    dim = _int_dim(name, dim)
    if dtype is not None:
        input = input.to(dtype)
    dim = canonicalize_dim(input.dim(), dim)  # IndexError, worded as PyTorch words it
    if not _common.use_triton(input):
        return torch.log_softmax(input, dim) if log else torch.softmax(input, dim)
    last = max(input.dim() - 1, 0)
    x = input.movedim(dim, -1) if dim != last else input
    y = _common.apply(_Softmax, _softmax_op, x, log)
    return y.movedim(-1, dim) if dim != last else y


def _int_dim(name: str, dim) -> int:
    """``dim`` as an int, or PyTorch's TypeError: a tuple, a string, a float or a bool is refused
    (a tuple reached a comparison deep inside and raised an unrelated TypeError)."""
    try:
        if isinstance(dim, bool):
            raise TypeError
        return operator.index(dim)
    except TypeError:
        raise TypeError(f"{name}(): argument 'dim' (position 1) must be int, not {type(dim).__name__}") from None


def softmax(input: torch.Tensor, dim: int | None = None, _stacklevel: int = 3, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Drop-in for ``torch.nn.functional.softmax``: ``exp(x - max) / sum(exp(x - max))`` along ``dim``.

    One Triton kernel forward (x read once, y written once) and one backward (y and dy read once,
    dx written once), at any row length: rows over 16384 elements are split across programs that
    exchange their partial sums on the GPU (rows over 2M elements, and the interpreter, take two
    passes whose second is partly served from L2). float32, float16 and bfloat16, computed in float32.
    ``dtype`` casts the input first, as in PyTorch.
    """
    return _run("softmax", input, dim, _stacklevel, dtype, log=False)


def log_softmax(input: torch.Tensor, dim: int | None = None, _stacklevel: int = 3, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Drop-in for ``torch.nn.functional.log_softmax``: ``x - max - log(sum(exp(x - max)))``.

    Same kernels, traffic and dtypes as :func:`softmax`.
    """
    return _run("log_softmax", input, dim, _stacklevel, dtype, log=True)
