"""GEMM with fused epilogues on a persistent grid: the kernels behind ``kernelab.ops.linear``.

    single  Y = act(A @ B^T + bias) + residual      (Z = A @ B^T + bias kept when the backward needs it)
    dual    Y = silu(A @ B^T) * (A @ B2^T)          (SwiGLU: gate and up products share A's tiles)
    A [M, K], B and B2 [N, K] (the layout of F.linear's input and weight), any strides; float32
    accumulators, one rounding into the output dtype.

Traffic of one call: A is read once per column block of tiles and B once per row block, but
GROUP_M row blocks sweep the column blocks together (grouped tile order), so those re-reads mostly
hit L2; Y is written once; the epilogue reads the bias (N) and the residual (M x N) once and writes
Z (M x N) once when asked. Eager PyTorch writes the product and reads it back once per pointwise
op that follows it.

One kernel, two ways to load tiles: pointers (any strides; what Triton's interpreter runs) or TMA
descriptors made on the device (Hopper and later, triton >= 3.4: ``tl.make_tensor_descriptor``;
each operand needs one dimension of stride 1 and the other a multiple of 16 bytes). Either
operand may be "K-major" (K contiguous, F.linear's x and weight) or not (the backward's
transposed views): a non-K-major tile is loaded as [BLOCK_K, rows] and transposed in registers.

The backward's pointwise half is here too: dZ = dY * act'(Z) and the bias gradient's per-program
column sums (one kernel), and SwiGLU's dG = dY * U * silu'(G), dU = dY * silu(G).
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl

from ..errors import KernelabError
from . import _common, gemm_tune
from .pointwise import GELU, GELU_FAST, GELU_TANH, RELU, SILU, activation, activation_grad

#: No activation (the identity): the activation codes of ``pointwise`` are 0..4.
NONE = tl.constexpr(-1)
#: Public activation names -> codes. 16-bit inputs take pointwise's fast erf GELU (``code_for``).
ACTIVATION_CODES = {"none": NONE.value, "relu": RELU.value, "gelu": GELU.value, "gelu_tanh": GELU_TANH.value,
                    "silu": SILU.value}


# --------------------------------------------------------------------------- jitted helpers
@triton.jit
def _grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of tile number ``tile``: GROUP_M row blocks walk the column blocks together,
    so each B tile they share is loaded from memory once and from L2 GROUP_M - 1 times."""
    tiles_per_group = GROUP_M * num_pid_n
    first_m = (tile // tiles_per_group) * GROUP_M
    rows_in_group = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % tiles_per_group) % rows_in_group
    pid_n = (tile % tiles_per_group) // rows_in_group
    return pid_m, pid_n


@triton.jit
def _k_loop_pointers(a_ptr, b_ptr, b2_ptr, stride_am, stride_ak, stride_bn, stride_bk, rows, cols, K, acc, acc2,
                     DUAL: tl.constexpr, PRECISION: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc += A[rows, :] @ B[cols, :]^T (and acc2 with B2) over K in BLOCK_K steps. ``rows`` and
    ``cols`` are already clamped into range, so only K needs a mask (zeros past K add nothing)."""
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak      # [BLOCK_M, BLOCK_K]
    b_offs = ks[:, None] * stride_bk + cols[None, :] * stride_bn               # [BLOCK_K, BLOCK_N]
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=ks[None, :] < k_left, other=0.0)
        b = tl.load(b_ptr + b_offs, mask=ks[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        if DUAL:
            b2 = tl.load(b2_ptr + b_offs, mask=ks[:, None] < k_left, other=0.0)
            acc2 = tl.dot(a, b2, acc2, input_precision=PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_offs += BLOCK_K * stride_bk
    return acc, acc2


@triton.jit
def _descriptor(ptr, rows, K, stride_r, stride_k, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
                K_MAJOR: tl.constexpr):
    """A TMA descriptor of an operand [rows, K]: over [rows, K] when K is contiguous, else over
    its transpose [K, rows] (rows contiguous). Out-of-range parts of a block read as zeros."""
    if K_MAJOR:
        return tl.make_tensor_descriptor(ptr, shape=[rows, K], strides=[stride_r, 1], block_shape=[BLOCK_R, BLOCK_K])
    else:
        return tl.make_tensor_descriptor(ptr, shape=[K, rows], strides=[stride_k, 1], block_shape=[BLOCK_K, BLOCK_R])


@triton.jit
def _tma_rows_by_k(desc, off_r, off_k, K_MAJOR: tl.constexpr):
    """The [BLOCK_R, BLOCK_K] block at (off_r, off_k) of an operand (A's tile)."""
    if K_MAJOR:
        return desc.load([off_r, off_k])
    else:
        return desc.load([off_k, off_r]).T


@triton.jit
def _tma_k_by_rows(desc, off_r, off_k, K_MAJOR: tl.constexpr):
    """The [BLOCK_K, BLOCK_R] block at (off_k, off_r) of an operand's transpose (B^T's tile)."""
    if K_MAJOR:
        return desc.load([off_r, off_k]).T
    else:
        return desc.load([off_k, off_r])


@triton.jit
def _k_loop_tma(a_desc, b_desc, b2_desc, off_m, off_n, K, acc, acc2, A_K_MAJOR: tl.constexpr,
                B_K_MAJOR: tl.constexpr, DUAL: tl.constexpr, PRECISION: tl.constexpr, BLOCK_K: tl.constexpr):
    """The K loop of ``_k_loop_pointers`` with TMA loads (asynchronous copies into shared memory)."""
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        off_k = k * BLOCK_K
        a = _tma_rows_by_k(a_desc, off_m, off_k, A_K_MAJOR)
        acc = tl.dot(a, _tma_k_by_rows(b_desc, off_n, off_k, B_K_MAJOR), acc, input_precision=PRECISION)
        if DUAL:
            acc2 = tl.dot(a, _tma_k_by_rows(b2_desc, off_n, off_k, B_K_MAJOR), acc2, input_precision=PRECISION)
    return acc, acc2


@triton.jit
def _halves(acc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The left and right column halves of a [BLOCK_M, BLOCK_N] tile (registers only)."""
    return tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))


@triton.jit
def _epilogue(acc, acc2, rows, cols, off_m, off_n, M, N, bias_ptr, res_ptr, y_ptr, z_ptr, z2_ptr, y_desc,
              stride_rm, stride_rn, stride_ym, ACT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
              STORE_Z: tl.constexpr, DUAL: tl.constexpr, TMA_STORE: tl.constexpr):
    """Finish one [BLOCK_M, BLOCK_N] tile (at row off_m, column off_n; ``rows`` and ``cols`` its
    indices) in float32 and store it (Y, and Z when asked). Y goes out through pointers, or with
    TMA_STORE as one asynchronous bulk copy from shared memory (the copy engine clips the parts
    past M and N; the registers are free as soon as it starts)."""
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    out = rows[:, None] * stride_ym + cols[None, :]
    dtype = y_ptr.dtype.element_ty
    if DUAL:
        if STORE_Z:  # the gate and up products, for the backward
            tl.store(z_ptr + out, acc.to(dtype), mask=mask)
            tl.store(z2_ptr + out, acc2.to(dtype), mask=mask)
        y = activation(acc, SILU) * acc2
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        if STORE_Z:  # the pre-activation, for act' in the backward
            tl.store(z_ptr + out, acc.to(dtype), mask=mask)
        y = acc
        if ACT != NONE:
            y = activation(acc, ACT)
        if HAS_RESIDUAL:
            res = tl.load(res_ptr + rows[:, None] * stride_rm + cols[None, :] * stride_rn, mask=mask, other=0.0)
            y += res.to(tl.float32)
    if TMA_STORE:
        y_desc.store([off_m, off_n], y.to(dtype))
    else:
        tl.store(y_ptr + out, y.to(dtype), mask=mask)


# --------------------------------------------------------------------------- kernels
@triton.jit
def _gemm_kernel(
    a_ptr, b_ptr, b2_ptr, bias_ptr, res_ptr, y_ptr, z_ptr, z2_ptr,
    stride_am, stride_ak, stride_bn, stride_bk, stride_rm, stride_rn, stride_ym,
    M, N, K,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, STORE_Z: tl.constexpr,
    DUAL: tl.constexpr, TMA: tl.constexpr, A_K_MAJOR: tl.constexpr, B_K_MAJOR: tl.constexpr,
    PRECISION: tl.constexpr, INT64: tl.constexpr, SPLIT_EPILOGUE: tl.constexpr, TMA_STORE: tl.constexpr,
    FLATTEN: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    """Y = act(A @ B^T + bias) + residual, or silu(A @ B^T) * (A @ B2^T) (DUAL), over [M, N].

    Persistent: each program takes tiles pid, pid + programs, ... in grouped order (FLATTEN: the
    tile and K loops software-pipelined as one, so the next tile's loads overlap this tile's
    epilogue); B2 shares B's strides; Y, Z and Z2 are contiguous [M, N] (row stride stride_ym)."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    EPILOGUE_N: tl.constexpr = BLOCK_N // 2 if SPLIT_EPILOGUE else BLOCK_N
    y_desc = y_ptr
    if TMA_STORE:
        y_desc = tl.make_tensor_descriptor(y_ptr, shape=[M, N], strides=[stride_ym, 1],
                                           block_shape=[BLOCK_M, EPILOGUE_N])
    if TMA:
        a_desc = _descriptor(a_ptr, M, K, stride_am, stride_ak, BLOCK_M, BLOCK_K, A_K_MAJOR)
        b_desc = _descriptor(b_ptr, N, K, stride_bn, stride_bk, BLOCK_N, BLOCK_K, B_K_MAJOR)
        b2_desc = b_desc
        if DUAL:
            b2_desc = _descriptor(b2_ptr, N, K, stride_bn, stride_bk, BLOCK_N, BLOCK_K, B_K_MAJOR)
    for tile in tl.range(tl.program_id(0), num_pid_m * num_pid_n, tl.num_programs(0), flatten=FLATTEN):
        pid_m, pid_n = _grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        off_m, off_n = pid_m * BLOCK_M, pid_n * BLOCK_N
        rows = off_m + tl.arange(0, BLOCK_M)
        cols = off_n + tl.arange(0, BLOCK_N)
        if INT64:
            rows, cols = rows.to(tl.int64), cols.to(tl.int64)
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        acc2 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        # multiply: the K loop
        if TMA:
            acc, acc2 = _k_loop_tma(a_desc, b_desc, b2_desc, off_m, off_n, K, acc, acc2,
                                    A_K_MAJOR, B_K_MAJOR, DUAL, PRECISION, BLOCK_K)
        else:
            # rows and columns past the end read row 0 (in range); their results are not stored
            safe_rows = tl.max_contiguous(tl.multiple_of(tl.where(rows < M, rows, 0), BLOCK_M), BLOCK_M)
            safe_cols = tl.max_contiguous(tl.multiple_of(tl.where(cols < N, cols, 0), BLOCK_N), BLOCK_N)
            acc, acc2 = _k_loop_pointers(a_ptr, b_ptr, b2_ptr, stride_am, stride_ak, stride_bn, stride_bk,
                                         safe_rows, safe_cols, K, acc, acc2, DUAL, PRECISION, BLOCK_K)
        # finish: bias, activation, residual; store (in two column halves: fewer live registers)
        if SPLIT_EPILOGUE:
            left = off_n + tl.arange(0, BLOCK_N // 2)
            if INT64:
                left = left.to(tl.int64)
            acc_l, acc_r = _halves(acc, BLOCK_M, BLOCK_N)
            acc2_l, acc2_r = _halves(acc2, BLOCK_M, BLOCK_N)
            _epilogue(acc_l, acc2_l, rows, left, off_m, off_n, M, N, bias_ptr, res_ptr, y_ptr, z_ptr, z2_ptr,
                      y_desc, stride_rm, stride_rn, stride_ym, ACT, HAS_BIAS, HAS_RESIDUAL, STORE_Z, DUAL, TMA_STORE)
            _epilogue(acc_r, acc2_r, rows, left + BLOCK_N // 2, off_m, off_n + BLOCK_N // 2, M, N, bias_ptr, res_ptr,
                      y_ptr, z_ptr, z2_ptr, y_desc, stride_rm, stride_rn, stride_ym, ACT, HAS_BIAS, HAS_RESIDUAL,
                      STORE_Z, DUAL, TMA_STORE)
        else:
            _epilogue(acc, acc2, rows, cols, off_m, off_n, M, N, bias_ptr, res_ptr, y_ptr, z_ptr, z2_ptr, y_desc,
                      stride_rm, stride_rn, stride_ym, ACT, HAS_BIAS, HAS_RESIDUAL, STORE_Z, DUAL, TMA_STORE)


@triton.jit
def _activation_backward_kernel(
    dy_ptr, z_ptr, u_ptr, dz_ptr, du_ptr, db_ptr,
    stride_dym, stride_dyn,
    M, N, rows_per_program,
    ACT: tl.constexpr, DUAL: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INT64: tl.constexpr,
):
    """single: dZ = dY * act'(Z) (not written for ACT NONE: dZ is dY), and with a bias, this
    program's column sums of dZ into row pid_m of the float32 partials db.
    dual:   dG = dY * U * silu'(G), dU = dY * silu(G) (Z holds G).
    Reads dY, Z (and U) once, writes dZ (and dU) once; Z, U, dZ, dU are contiguous [M, N]."""
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # the bias gradient: dZ added up elementwise over the loop (registers, no communication) and
    # summed over rows once at the end; a sum over rows per step made every step a cross-warp
    # reduction through shared memory (this kernel took 132 us for 8192 x 3072 bf16 on the H200,
    # eager's gelu_backward 48 us, probe of 2026-12-03)
    db_acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    first = pid_m * rows_per_program
    for start in range(first, tl.minimum(first + rows_per_program, M), BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        if INT64:
            rows = rows.to(tl.int64)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        at = rows[:, None] * N + cols[None, :]
        dy = tl.load(dy_ptr + rows[:, None] * stride_dym + cols[None, :] * stride_dyn, mask=mask, other=0.0)
        dz = dy.to(tl.float32)
        if DUAL:
            g = tl.load(z_ptr + at, mask=mask, other=0.0).to(tl.float32)
            u = tl.load(u_ptr + at, mask=mask, other=0.0).to(tl.float32)
            tl.store(du_ptr + at, (dz * activation(g, SILU)).to(du_ptr.dtype.element_ty), mask=mask)
            dz = dz * u * activation_grad(g, SILU)
        elif ACT != NONE:
            dz = dz * activation_grad(tl.load(z_ptr + at, mask=mask, other=0.0).to(tl.float32), ACT)
        if DUAL or ACT != NONE:
            tl.store(dz_ptr + at, dz.to(dz_ptr.dtype.element_ty), mask=mask)
        if HAS_BIAS:
            db_acc += tl.where(mask, dz, 0.0)
    if HAS_BIAS:
        tl.store(db_ptr + pid_m.to(tl.int64) * N + cols, tl.sum(db_acc, axis=0), mask=cols < N)


# --------------------------------------------------------------------------- configurations
@dataclasses.dataclass(frozen=True)
class GemmConfig:
    """One launch configuration of ``_gemm_kernel`` (for 16-bit inputs: float32 halves BLOCK_K).

    programs_per_sm: the persistent grid's programs per SM (2 where two fit: one program's
    epilogue runs while the other's K loop keeps the tensor cores busy); flatten: the tile and K
    loops pipelined as one; tma_store: Y stored by the copy engine (used only where the loads
    use TMA and Y's rows are 16-byte aligned)."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    programs_per_sm: int = 1
    flatten: bool = False
    tma_store: bool = False


#: Candidates per shape class, best guess first (``pick_config`` takes the first; the benchmark
#: times them all). Shared memory per stage: (BLOCK_M + BLOCK_N * (2 if dual else 1)) * BLOCK_K
#: * 2 bytes, under the H200's 227 KB at these stage counts (a TMA store adds a [BLOCK_M, BLOCK_N / 2]
#: staging tile). Decode rows (M <= 16) read the weight once: narrow column blocks give the SMs
#: enough tiles, deep K blocks keep loads in flight. Schedules: two programs an SM (128 x 128 x 64
#: at 3 stages fits twice: 96-115 KB and 105-128 registers a thread at 8 warps, ``python -m
#: tests.ops.sm90 --gemm``), the flattened loop, TMA stores.
_C = GemmConfig
CONFIGS = {
    "decode": (_C(16, 64, 256, 1, 4, 4), _C(16, 128, 128, 1, 4, 5), _C(16, 32, 512, 1, 4, 3)),
    "small": (_C(128, 128, 64, 8, 8, 4), _C(64, 128, 64, 8, 4, 4), _C(64, 64, 64, 8, 4, 4),
              _C(128, 128, 64, 8, 8, 3, programs_per_sm=2, tma_store=True)),
    # three H200 runs of 2026-12-03 (kernelab bench linear's tune, bf16, 9 shapes, gelu+bias): the
    # flattened loop best at 5, 7 and 6 of 9 (geomean 0.94-0.97 of each shape's best), two programs
    # an SM best at 0-1 (0.69-0.94), the old first (128 x 256, not flattened) 0.89-0.90
    "large": (_C(128, 256, 64, 8, 8, 3, flatten=True), _C(128, 128, 64, 8, 8, 3, programs_per_sm=2),
              _C(128, 128, 64, 8, 8, 4, flatten=True, tma_store=True), _C(256, 128, 64, 8, 8, 3),
              _C(256, 128, 64, 8, 8, 3, flatten=True), _C(128, 256, 64, 8, 8, 3)),
    # two float32 accumulators: at most 128 x 128 per program
    "dual_decode": (_C(16, 64, 128, 1, 4, 4), _C(16, 32, 256, 1, 4, 3)),
    "dual_small": (_C(64, 128, 64, 8, 4, 3), _C(64, 64, 64, 8, 4, 4)),
    "dual_large": (_C(128, 128, 64, 8, 8, 3), _C(128, 64, 64, 8, 4, 4), _C(64, 128, 64, 8, 4, 4),
                   _C(128, 128, 64, 8, 8, 3, tma_store=True), _C(128, 128, 64, 8, 8, 3, flatten=True, tma_store=True)),
}


def shape_class(m: int, n: int, dual: bool, device: torch.device) -> str:
    """"decode" for M <= 16, "small" when 128 x 128 tiles would not fill the SMs, else "large"."""
    if m <= 16:
        kind = "decode"
    elif _common.cdiv(m, 128) * _common.cdiv(n, 128) < _common.sm_count(device):
        kind = "small"
    else:
        kind = "large"
    return "dual_" + kind if dual else kind


def candidates(m: int, n: int, dual: bool, dtype: torch.dtype, device: torch.device) -> list[GemmConfig]:
    """The configurations to try for this shape, fitted to the dtype (float32: half BLOCK_K, so
    that a stage holds the same bytes, tiles of at most 128 x 128 and 8 warps there: a 128 x 256
    float32 tile spills 112-152 bytes a thread when compiled for sm_90, and 128 x 128 with 4
    warps spills too)."""
    return list(_fitted(shape_class(m, n, dual, device), dtype))


@functools.lru_cache(maxsize=None)
def _fitted(kind: str, dtype: torch.dtype) -> tuple[GemmConfig, ...]:
    """CONFIGS[kind] fitted to ``dtype`` (see ``candidates``; cached: host time per call)."""
    configs = CONFIGS[kind]
    if dtype == torch.float32:
        configs = tuple(dict.fromkeys(  # (the caps can make two candidates one)
            dataclasses.replace(c, block_m=min(c.block_m, 128), block_n=min(c.block_n, 128),
                                block_k=max(16, c.block_k // 2),
                                num_warps=8 if min(c.block_m, 128) * min(c.block_n, 128) >= 128 * 128 else c.num_warps)
            for c in configs))
    return configs


# --------------------------------------------------------------------------- launchers
def code_for(activation_name: str, dtype: torch.dtype) -> int:
    """The activation code of a public name; 16-bit inputs take the fast erf GELU as pointwise does."""
    code = ACTIVATION_CODES[activation_name]
    if code == GELU.value and dtype in (torch.float16, torch.bfloat16):
        return GELU_FAST.value
    return code


def tma_supported(device: torch.device) -> bool:
    """TMA descriptors exist in this Triton and this device has the copy engine (sm_90+)."""
    supported = _TMA.get(device)
    if supported is None:
        supported = hasattr(tl, "make_tensor_descriptor") and device.type == "cuda" and (
            torch.cuda.get_device_capability(device)[0] >= 9)
        if device.type != "cuda" or device.index is not None:  # "cuda" alone: the current device
            _TMA[device] = supported
    return supported


_TMA: dict = {}


def _k_major(t: torch.Tensor) -> bool | None:
    """True when ``t`` ([rows, K]) has K contiguous, False when rows are, None when a TMA
    descriptor cannot describe it (no unit stride, another stride not 16-byte aligned, or an
    unaligned start)."""
    size = t.element_size()
    if t.data_ptr() % 16:
        return None
    if t.stride(1) == 1 and (t.stride(0) * size) % 16 == 0:
        return True
    if t.stride(0) == 1 and (t.stride(1) * size) % 16 == 0:
        return False
    return None


def _scratch(size: int, alignment: int, stream):
    """Global memory for the descriptors the kernel makes (128 bytes each, per program)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _use_tma(a: torch.Tensor, b: torch.Tensor, tma: bool | None) -> tuple[bool, bool, bool]:
    """(use TMA, A K-major, B K-major). ``tma``: None decides (16-bit operands that descriptors
    can describe, on Hopper or later), True insists (error when the operands do not allow it),
    False never. float32 (tf32) stays on pointers: its TMA variant spills ~6 KB a thread when
    compiled for sm_90 (Triton 3.6 and 3.8, 128 x 128 x 32 tiles), the pointer variant none."""
    layout = (_k_major(a), _k_major(b))
    possible = None not in layout and a.shape[1] > 0
    if tma is None:
        tma = possible and a.dtype != torch.float32 and tma_supported(a.device)
    if tma and not possible:
        raise KernelabError("gemm: tma=True needs operands with a unit stride, other strides and starts 16-byte aligned")
    return bool(tma), bool(layout[0]), bool(layout[1])


def _precision(dtype: torch.dtype) -> str:
    """tl.dot's input precision: float32 goes through tf32 only where PyTorch allows it."""
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"


def gemm(a: torch.Tensor, b: torch.Tensor, *, b2: torch.Tensor | None = None, bias: torch.Tensor | None = None,
         residual: torch.Tensor | None = None, act: int = NONE.value, store_z: bool = False,
         config: GemmConfig | None = None, tma: bool | None = None):
    """(Y, Z, Z2) for A [M, K] and B [N, K] (views of any strides; B2 with B's strides), see the
    module docstring; Z and Z2 are None unless ``store_z``. ``config``: None picks the first
    candidate of the shape's class, or with ``gemm_tune.TUNE`` the fastest, timed on the first call
    of the shape and remembered on disk; ``tma``: see ``_use_tma``. Inputs share one dtype and device."""
    (m, k), n = a.shape, b.shape[0]
    dual, dtype, device = b2 is not None, a.dtype, a.device
    y = _common.empty((m, n), dtype, device)
    z = _common.empty((m, n), dtype, device) if store_z else None
    z2 = _common.empty((m, n), dtype, device) if store_z and dual else None
    if m == 0 or n == 0:
        return y, z, z2
    use_tma, a_k_major, b_k_major = _use_tma(a, b, tma)
    if config is None:
        if gemm_tune.TUNE:
            key = (m, n, k, dtype, dual, act, bias is not None, residual is not None, store_z, use_tma, a_k_major,
                   b_k_major, _precision(dtype))
            config = gemm_tune.choose(key, candidates(m, n, dual, dtype, device), lambda c: gemm(
                a, b, b2=b2, bias=bias, residual=residual, act=act, store_z=store_z, config=c, tma=tma), device)
        else:
            config = _first_config(m, n, dual, dtype, device)
    if use_tma and not _common.INTERPRETED:
        triton.set_allocator(_scratch)  # per launch: the allocator is a context variable (autograd's threads)
    tiles = _common.cdiv(m, config.block_m) * _common.cdiv(n, config.block_n)
    res = residual if residual is not None else y
    tma_store = use_tma and config.tma_store and (n * y.element_size()) % 16 == 0
    launch, constexprs = _gemm_launch(config, act, bias is not None, residual is not None, store_z, dual, use_tma,
                                      a_k_major, b_k_major, _precision(dtype), _common.needs_int64(a, b, res, y),
                                      tma_store)
    (sam, sak), (sbn, sbk) = a.stride(), b.stride()
    srm, srn = residual.stride() if residual is not None else (n, 1)  # y and z: contiguous, row stride n
    args = (a, b, b2 if dual else b, bias if bias is not None else y, res, y,
            z if z is not None else y, z2 if z2 is not None else y,
            sam, sak, sbn, sbk, srm, srn, n,
            m, n, k)
    launch((min(tiles, _programs_per_sm(config, args, constexprs, device) * _common.sm_count(device)),), *args)
    return y, z, z2


def _programs_per_sm(config: GemmConfig, args: tuple, constexprs: dict, device: torch.device) -> int:
    """``config.programs_per_sm``, capped by the programs one SM can hold of the compiled kernel
    (``_common.resident_per_sm``): a persistent program that cannot start until another ends
    would run its tiles after the wave, a tail as long as the wave."""
    if config.programs_per_sm == 1:
        return 1
    resident = _common.resident_per_sm(_gemm_kernel, args, config.num_warps, device, constexprs,
                                       key=("gemm", config.num_warps, tuple(constexprs.items()), args[0].dtype,
                                            device))
    return max(1, min(config.programs_per_sm, resident or 1))


#: Who runs a product with nothing to fuse (the backward's dX and dW, on transposed views):
#: "cublas" (torch.mm / torch.addmm: split-K and tiles tuned per shape, e.g. dW's tall K on a small
#: output) or "triton" (``gemm``). ``benchmarks/linear_bench.py`` times both.
PLAIN_PRODUCTS = "cublas"


def plain(a: torch.Tensor, b: torch.Tensor, residual: torch.Tensor | None = None,
          engine: str | None = None) -> torch.Tensor:
    """A @ B^T (+ residual) for A [M, K], B [N, K] of any strides, by ``engine`` (default
    ``PLAIN_PRODUCTS``); float32 inputs follow ``torch.backends.cuda.matmul.allow_tf32`` either way."""
    engine = engine or PLAIN_PRODUCTS
    if engine == "cublas":
        return torch.mm(a, b.t()) if residual is None else torch.addmm(residual, a, b.t())
    if engine != "triton":
        raise KernelabError(f"gemm: unknown engine {engine!r} for plain products (choose 'cublas' or 'triton')")
    return gemm(a, b, residual=residual)[0]


@functools.lru_cache(maxsize=1024)
def _first_config(m: int, n: int, dual: bool, dtype: torch.dtype, device: torch.device) -> GemmConfig:
    """The first candidate of the shape's class (cached: host time per call)."""
    return _fitted(shape_class(m, n, dual, device), dtype)[0]


@functools.lru_cache(maxsize=1024)
def _gemm_launch(config: GemmConfig, act: int, has_bias: bool, has_residual: bool, store_z: bool, dual: bool,
                 tma: bool, a_k_major: bool, b_k_major: bool, precision: str, int64: bool, tma_store: bool):
    """(``_gemm_kernel`` prepared with these constexprs, the config's tiles, warps and stages; the
    keywords) (cached: host time per call)."""
    keywords = dict(
        ACT=act, HAS_BIAS=has_bias, HAS_RESIDUAL=has_residual, STORE_Z=store_z, DUAL=dual, TMA=tma,
        A_K_MAJOR=a_k_major, B_K_MAJOR=b_k_major, PRECISION=precision, INT64=int64,
        SPLIT_EPILOGUE=config.block_n >= 128, TMA_STORE=tma_store, FLATTEN=config.flatten, BLOCK_M=config.block_m,
        BLOCK_N=config.block_n, BLOCK_K=config.block_k, GROUP_M=config.group_m, num_stages=config.num_stages,
    )
    return _common.prepared(_gemm_kernel, num_warps=config.num_warps, **keywords), keywords


def activation_backward(dy: torch.Tensor, z: torch.Tensor | None, act: int, has_bias: bool,
                        u: torch.Tensor | None = None):
    """(dZ, dU, db) for dY [M, N] (any strides) and the saved Z (and U: the SwiGLU form, then Z
    is the gate G); dZ is dY itself for ACT NONE, dU None unless ``u``, db None without a bias."""
    m, n = dy.shape
    dual = u is not None
    computes = dual or act != NONE.value
    dz = _common.empty((m, n), dy.dtype, dy.device) if computes else dy
    du = _common.empty((m, n), dy.dtype, dy.device) if dual else None
    if m == 0 or n == 0 or not (computes or has_bias):
        db = torch.zeros((n,), dtype=dy.dtype, device=dy.device) if has_bias else None
        return dz, du, db
    grid, rows_per_program, launch = _activation_backward_launch(
        m, n, _common.sm_count(dy.device), act, dual, has_bias, _common.needs_int64(dy, dz))
    partials = _common.empty((grid[1], n), torch.float32, dy.device) if has_bias else None
    launch(
        grid, dy, z if z is not None else dy, u if dual else dy, dz, du if dual else dz,
        partials if has_bias else dz,
        dy.stride(0), dy.stride(1), m, n, rows_per_program,
    )
    db = _common.sum_partials(partials, None, dy.dtype)[0] if has_bias else None
    return dz, du, db


@functools.lru_cache(maxsize=1024)
def _activation_backward_launch(m: int, n: int, sms: int, act: int, dual: bool, has_bias: bool, int64: bool):
    """(grid, rows per program, prepared launch) of ``_activation_backward_kernel`` for [m, n] on
    ``sms`` SMs: 4096-element tiles, at most 4 programs an SM (cached: host time per call)."""
    block_n = min(_common.next_pow2(n), 256)
    block_m = max(1, 4096 // block_n)
    col_blocks = _common.cdiv(n, block_n)
    row_programs = max(1, min(_common.cdiv(m, block_m), 4 * sms // col_blocks, 65535))
    rows_per_program = _common.cdiv(_common.cdiv(m, row_programs), block_m) * block_m
    grid = (col_blocks, _common.cdiv(m, rows_per_program))
    return grid, rows_per_program, _common.prepared(
        _activation_backward_kernel, ACT=act, DUAL=dual, HAS_BIAS=has_bias, BLOCK_M=block_m, BLOCK_N=block_n,
        INT64=int64, num_warps=8)
