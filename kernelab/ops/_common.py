"""Plumbing shared by every kernel family of ``kernelab.ops`` (no op kernels live here).

* where a call runs: Triton on CUDA tensors, Triton's interpreter on CPU tensors under
  ``TRITON_INTERPRET=1``, else the PyTorch reference (said once, with a reason);
* which path a call takes: a plain ``autograd.Function`` in eager code (cheapest per call), the
  registered ``torch.library`` custom op when something traces (``torch.compile``, a dispatch mode
  such as FakeTensorMode or ``kernelab.count``'s recorder);
* how a tensor becomes the ``[M, N]`` rows the row kernels read, and how outputs are allocated;
* launch configurations (block sizes, warps, grids), one function per kind of kernel.
"""

from __future__ import annotations

import functools
import warnings
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..errors import KernelabFallbackWarning
from ..launch import Launcher


@triton.jit
def _probe():
    pass


#: Triton was imported with TRITON_INTERPRET=1: kernels then run (slowly, exactly) on CPU tensors.
INTERPRETED = type(_probe).__name__ == "InterpretedFunction"

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INT32_MAX = 2**31 - 1


# --------------------------------------------------------------------------- where and how a call runs
def use_triton(t: torch.Tensor) -> bool:
    """True when ``t`` can be handed to a Triton kernel. False for other dtypes (float64, integers:
    PyTorch's implementation runs, with its own errors) and, with a warning said once, for
    tensors that are neither on CUDA nor on the CPU under the interpreter."""
    if t.dtype not in FLOAT_DTYPES:
        return False
    if t.is_cuda or (INTERPRETED and t.device.type == "cpu"):
        return True
    if not torch.compiler.is_compiling():
        warnings.warn(
            "kernelab.ops: tensors are not on a CUDA device and TRITON_INTERPRET=1 was not set when "
            "Triton was imported, so the ops run their PyTorch reference implementations instead of "
            "the Triton kernels",
            KernelabFallbackWarning,
            stacklevel=1,  # one location: Python's default filter then says it once per process
        )
    return False


def traced(*tensors) -> bool:
    """True when the call must go through the registered custom op rather than the eager fast path.

    The custom op is what torch.compile and dispatch modes (FakeTensorMode, kernelab.count) see;
    eager code skips its ~10 us of dispatch overhead by calling the same launchers through an
    autograd.Function. ``tensors`` may hold None and non-tensor arguments (ints, floats, strings):
    only a tensor of a subclass (a fake or functional tensor, a user's subclass) counts.
    """
    if _is_compiling() or _dispatch_modes() > 0:
        return True
    for t in tensors:
        if type(t) not in _PLAIN and isinstance(t, torch.Tensor):
            return True
    return False


_is_compiling = torch.compiler.is_compiling
_dispatch_modes = torch._C._len_torch_dispatch_stack
#: Argument types that never make a call traced (checked before the slower isinstance).
_PLAIN = frozenset({torch.Tensor, torch.nn.Parameter, type(None), int, float, bool, str, list, tuple})


def any_requires_grad(*tensors) -> bool:
    """Some of these tensors (None allowed) requires grad."""
    for t in tensors:
        if t is not None and t.requires_grad:
            return True
    return False


def apply(function: type[torch.autograd.Function], op, *args):
    """Run ``op(*args)`` (the custom op) when tracing, else ``function.apply(*args)``, or, when
    nothing is to be differentiated (grad mode off, no input requiring grad), the function's
    forward alone: no autograd node, no context (``eager_function``)."""
    if traced(*args):
        return op(*args)
    if _grad_enabled():
        for a in args:
            if type(a) in _TENSORS and a.requires_grad:
                return function.apply(*args)
    return function.launch_forward(*args)


_grad_enabled = torch.is_grad_enabled
_TENSORS = frozenset({torch.Tensor, torch.nn.Parameter})  # traced() sent every other tensor type away


def call(op, launcher, *args):
    """Backward helper: the custom backward op when tracing, the launcher itself in eager code."""
    return op(*args) if traced(*args) else launcher(*args)


def builds_graph() -> bool:
    """True inside a backward that must itself be differentiable: ``torch.autograd.grad(...,
    create_graph=True)`` (double backward: gradient penalties, Hessian-vector products) runs the
    backward with grad mode on; a plain backward, and the backward that aot_autograd traces for
    torch.compile, run it with grad mode off. The Triton kernels' gradients carry no graph, so the
    ops then compute their gradient with differentiable PyTorch ops instead."""
    return torch.is_grad_enabled()


def reference_grads(reference, inputs, needs, grad_out):
    """d reference(*inputs) / d inputs, contracted with ``grad_out``, for the inputs flagged in
    ``needs`` (None for the others), built with ``create_graph=True``: the gradients are
    differentiable again, with respect to the inputs and to ``grad_out``."""
    wanted = [t for t, need in zip(inputs, needs) if need]
    with torch.enable_grad():
        got = iter(torch.autograd.grad(reference(*inputs), wanted, grad_out, create_graph=True, allow_unused=True))
    return [next(got) if need else None for need in needs]


def eager_function(name: str, forward, setup_context, backward) -> type[torch.autograd.Function]:
    """An autograd.Function built from the pieces registered on the custom op (shared, not copied);
    ``launch_forward`` is the bare forward, for calls with nothing to differentiate (``apply``).

    Ops whose extra outputs are saved statistics (the norms' mean and rstd, cross-entropy's lse)
    call ``ctx.set_materialize_grads(False)`` in ``setup_context``: autograd would otherwise
    allocate and zero-fill a gradient for each of them on every backward (two fill kernels
    measured in a layer_norm step on the H200), and their backward accepts None instead.
    """

    def _forward(ctx, *args):
        out = forward(*args)
        setup_context(ctx, args, out)
        return out

    return type(
        name,
        (torch.autograd.Function,),
        {"forward": staticmethod(_forward), "backward": staticmethod(backward), "launch_forward": staticmethod(forward)},
    )


# --------------------------------------------------------------------------- launching
_LAUNCHERS: dict = {}


def launch(kernel, grid):
    """``launch(kernel, grid)(*args, num_warps=w, **constexprs)``: ``kernel[grid](...)`` through
    ``kernelab.launch.Launcher`` (Triton's binding and specialization skipped while the arguments
    specialize as at the first launch; the interpreter and launch hooks take Triton's path)."""
    return functools.partial(_launcher(kernel), grid)


def prepared(kernel, **keywords):
    """``prepared(kernel, **keywords)(grid, *args)``: ``launch(kernel, grid)(*args, **keywords)``
    with the keywords (constexprs, warps, stages) hashed once, for launchers that cache their
    launch settings per shape: keep the returned object with them (keyword values hashable)."""
    return _launcher(kernel).prepare(**keywords)


def _launcher(kernel) -> Launcher:
    launcher = _LAUNCHERS.get(id(kernel))  # by id: a JITFunction's hash is its source's cache key
    if launcher is None or launcher.kernel is not kernel:
        launcher = _LAUNCHERS[id(kernel)] = Launcher(kernel, INTERPRETED)
    return launcher


# --------------------------------------------------------------------------- tensors
def empty(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Every kernel output is allocated here (tests replace it to poison outputs with NaN):
    contiguous, through ``_allocator``'s C++ entry point (a third of ``torch.empty``'s host time)."""
    alloc = _ALLOCATORS.get(device)
    if alloc is None:
        alloc = _ALLOCATORS[device] = _allocator(device)
    layout = _LAYOUTS.get(shape) if type(shape) is not list else None
    if layout is None:
        layout = _layout(shape)
    return alloc(layout[0], layout[1], dtype)


_ALLOCATORS: dict = {}
_LAYOUTS: dict = {}


def _layout(shape) -> tuple:
    """(``shape`` as a plain tuple of ints, its row-major strides), cached: most calls repeat a
    few shapes (the allocation entry points take exact tuples, not a torch.Size)."""
    sizes = tuple(int(size) for size in shape)
    strides, step = [], 1
    for size in reversed(sizes):
        strides.append(step)
        step *= max(size, 1)
    layout = (sizes, tuple(reversed(strides)))
    if len(_LAYOUTS) > 4096:  # many shapes (varying batches): start over
        _LAYOUTS.clear()
    _LAYOUTS[sizes] = layout
    return layout


def _allocator(device: torch.device):
    """``alloc(shape, strides, dtype)`` on ``device``: Inductor's allocation entry points (C++,
    no argument parsing by the dispatcher; they allocate on the current CUDA device, so a tensor
    for another device takes ``torch.empty_strided``), or ``torch.empty_strided`` where this torch
    has none."""
    def fallback(shape, strides, dtype):
        return torch.empty_strided(shape, strides, dtype=dtype, device=device)

    fast = getattr(getattr(torch._C._dynamo, "guards", None), f"_empty_strided_{device.type}", None)
    if fast is None or device.type not in ("cuda", "cpu") or (device.type == "cuda" and device.index is None):
        return fallback
    if device.type == "cpu":
        return fast
    index, current = device.index, torch._C._cuda_getDevice

    def on_device(shape, strides, dtype):
        return fast(shape, strides, dtype) if current() == index else fallback(shape, strides, dtype)

    return on_device


@functools.lru_cache(maxsize=4096)
def _broadcast_ints(a: tuple, b: tuple) -> tuple | None:
    """The broadcast of two shapes of plain ints, None where they do not broadcast."""
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and x != 1 and y != 1:
            return None
        out.append(y if x == 1 else x)
    return tuple(reversed(out))


def broadcast_shape(a: torch.Size, b: torch.Size) -> torch.Size:
    """``torch.broadcast_shapes(a, b)`` in a cached lookup for shapes of plain ints: torch's goes
    through its symbolic-shape reference (~30 us of Python a call on the CPU, 60-70 on the H100's
    host; a biased GELU called it three times a forward+backward). Symbolic sizes, and shapes that
    do not broadcast (torch's own error), take torch's."""
    if all(type(d) is int for d in a) and all(type(d) is int for d in b):
        got = _broadcast_ints(tuple(a), tuple(b))
        if got is not None:
            return torch.Size(got)
    return torch.broadcast_shapes(a, b)


def as_rows(x: torch.Tensor, n: int) -> torch.Tensor:
    """``x`` viewed as ``[M, n]`` rows with unit column stride; copied only when no view exists."""
    x2 = x if x.dim() == 2 and x.shape[1] == n else x.reshape(-1, n)
    if n > 1 and x2.stride(1) != 1:
        x2 = x2.contiguous()
    return x2


def row_view(x: torch.Tensor, n: int) -> tuple[torch.Tensor, int]:
    """(tensor, row stride) for a row kernel that reads ``x`` as [M, n] rows with unit column
    stride: ``x`` itself and n when it is contiguous (no view: a view costs the host more than
    the rest of a launch's arguments), else :func:`as_rows` and its row stride."""
    if x.is_contiguous():
        return x, n
    x2 = as_rows(x, n)
    return x2, x2.stride(0)


def needs_int64(*tensors: torch.Tensor) -> bool:
    """True when some element offset of these tensors can exceed int32."""
    for t in tensors:
        if t is None or t.numel() == 0:
            continue
        if t.numel() <= INT32_MAX and t.is_contiguous():  # offsets < numel: the common case, cheap
            continue
        span = sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()))
        if max(span, t.numel()) > INT32_MAX:
            return True
    return False


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Multiprocessors of ``device``; 4 under the interpreter (enough to exercise persistent loops)."""
    count = _SM_COUNTS.get(device)
    if count is None:
        if device.type != "cuda":
            count = 4
        elif device.index is None:  # "cuda" alone: the current device, which can change
            return _sm_count(torch.cuda.current_device())
        else:
            count = _sm_count(device.index)
        _SM_COUNTS[device] = count
    return count


_SM_COUNTS: dict = {}


# --------------------------------------------------------------------------- launch configurations
# Host-side arithmetic in plain Python: triton.cdiv and triton.next_power_of_2 are Triton
# constexpr functions in recent Triton, ~4 us a call on the host (9 calls per layer_norm step).
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(0, int(n) - 1).bit_length()


# Memory-bound kernels want ~16 elements per thread (two or four 16-byte loads per operand in
# flight) and programs big enough that per-program overhead vanishes.
ELEMS_PER_THREAD = 16
#: Most warps one program runs (32 = 1024 threads, the hardware's limit).
MAX_WARPS = 32
#: Longest row held in registers by one program (one tensor). Longer rows loop over chunks.
MAX_FUSED = 16384
#: Rows up to this long share a program in one-pass kernels (ROW_TILE elements of rows each).
SHORT_ROW = 1024
#: Overrides of the one-pass rule below (None: the rule), for tuning runs (bench_ops --tune-s).
ROW_TILE = None
ROW_PER_THREAD = None


def warps_for(elements: int, per_thread: int | None = None) -> int:
    per_thread = per_thread or ELEMS_PER_THREAD
    return max(1, min(MAX_WARPS, elements // (32 * per_thread)))


#: One-pass kernels hold a row longer than SHORT_ROW as two power-of-two parts instead of one tile
#: of next_pow2(N) lanes: a head (half that tile) and a masked tail (the next power of two of the
#: rest), where that leaves fewer lanes idle: 5120 = 4096 + 1024, 12288 = 8192 + 4096, 2880 = 2048 +
#: 1024, 6144 = 4096 + 2048 (idle lanes 37.5 -> 0 %, 25 -> 0 %, 30 -> 6 %, 25 -> 0 %); 7168 keeps
#: its 8192 tile (its tail would be 4096). Idle lanes move no bytes but hold registers and threads:
#: fewer of them leave room for more programs an SM, hence more bytes in flight. False: one tile.
SPLIT_ROWS = True


class RowTile(NamedTuple):
    """How a one-pass row kernel covers its rows: BLOCK_M rows of ``block_n`` columns (the head),
    plus ``tail`` columns after them (0: none; only where BLOCK_M is 1), ``warps`` a program."""

    block_m: int
    block_n: int
    tail: int
    warps: int


def row_tile(m: int, n: int, max_fused: int = MAX_FUSED, tile: int | None = None,
             per_thread: int | None = None, split: bool = False) -> RowTile:
    """The tile of one-pass row kernels.

    The rule, from two tuning runs on the H200 (bf16 forwards, ``results/ops_tune1_h200.csv`` and
    ``ops_tune2_h200.csv``; TB/s before -> after):

    * rows of <= SHORT_ROW elements: programs of 1024 elements (4 rows of 256, one row of 1024),
      one warp, 32 elements a thread. Softmax, log_softmax, layer_norm, rms_norm forwards at
      N = 256 and 1024 went from 3.2-3.8 (4096-element programs of 8 warps) to 3.9-4.1;
    * one row per program above that, 16 elements a thread (8 warps at 4096, 16 at 8192);
    * 16384: 32 elements a thread, i.e. 16 warps, so that two programs share an SM (rms_norm
      2.76 -> 4.00, log_softmax 2.26 -> 3.86; with 32 warps one program held a whole SM).

    ``tile`` and ``per_thread`` override the rule (the norm backward passes its own). ``split``:
    a row of one program is held as a head and a tail where that idles fewer lanes (SPLIT_ROWS);
    the head's size sets the warps and elements a thread as the rule would for it.
    """
    block_n = next_pow2(max(n, 1))
    assert block_n <= max_fused
    short = block_n <= SHORT_ROW
    tile = tile or ROW_TILE or (SHORT_ROW if short else block_n)
    block_m = max(1, min(next_pow2(max(m, 1)), tile // block_n))
    tail = 0
    if split and block_m == 1 and not short and next_pow2(n - block_n // 2) < block_n // 2:
        block_n, tail = block_n // 2, next_pow2(n - block_n // 2)
    per_thread = per_thread or ROW_PER_THREAD or (32 if short or block_n >= 16384 else 16)
    return RowTile(block_m, block_n, tail, warps_for(block_m * block_n, per_thread))


#: Chunk of a looped (long-row) kernel, in elements.
CHUNK = 8192


def chunk_config(elem_size: int) -> tuple[int, int]:
    """(BLOCK_N, num_warps) for looped kernels: CHUNK-element chunks, ELEMS_PER_THREAD per thread."""
    return CHUNK, warps_for(CHUNK)


#: Software-pipelining depth of the persistent row loops (norm backward, cross-entropy chunks):
#: the next block is loaded (cp.async) while the current one is reduced.
STAGES = 2
#: One-pass kernels run one row block per program (below): no loop to pipeline, plain loads.
ONE_PASS_STAGES = 1


def tile_grid(m: int, block_m: int, num_warps: int, device: torch.device) -> int:
    """Programs of a one-pass row kernel: one per row block. Measured on the H200 (2026-12-02): a
    persistent grid of ~1024 threads per SM reached 3.2 TB/s on softmax 32768x4096, where one block
    per program (as Liger and Inductor launch) lets more programs share an SM and hide latency."""
    return max(1, cdiv(m, block_m))


#: Programs per SM of the looped (long-row) kernels. Measured (softmax fwd, bf16, H200): 1 per SM
#: 2.36 / 2.13 TB/s at N = 131072 / 262144, 2 per SM 2.87 / 2.68, 4 smaller ones 2.60.
LOOPED_PER_SM = 2


def persistent_grid(m: int, row_bytes: int, device: torch.device) -> int:
    """Programs of a persistent looped row kernel: LOOPED_PER_SM per SM (or fewer rows)."""
    return max(1, min(m, sm_count(device) * LOOPED_PER_SM))


#: Per-SM limits of an H100/H200 (sm_90), for devices whose properties do not say.
SM_THREADS, SM_REGISTERS, SM_SHARED = 2048, 65536, 228 * 1024
_RESIDENT: dict = {}


def occupancy(regs: int, shared: int, num_warps: int, threads: int = SM_THREADS, registers: int = SM_REGISTERS,
              shared_per_sm: int = SM_SHARED) -> int:
    """Programs of ``num_warps`` warps using ``regs`` registers a thread and ``shared`` bytes of
    shared memory that one SM runs at once: the least of its threads, its registers (allocated per
    warp in units of 256) and its shared memory (1 KiB reserved per program), at most 32."""
    by_threads = threads // (32 * num_warps)
    regs_per_warp = cdiv(max(regs, 1) * 32, 256) * 256
    by_registers = (registers // regs_per_warp) // num_warps
    by_shared = shared_per_sm // (shared + 1024) if shared else 32
    return max(1, min(32, by_threads, by_registers, by_shared))


def resident_per_sm(kernel, args: tuple, num_warps: int, device: torch.device, constexprs: dict, key=None) -> int | None:
    """Programs of ``kernel``, compiled for these arguments (types and specialization; compiled,
    not launched), that one SM of ``device`` runs at once (:func:`occupancy` of the binary); None
    when the binary cannot be inspected. Cached by ``key`` (the caller's name for everything that
    decides the binary; by default the constexprs, warps and argument types); 4 off the GPU (the
    interpreter, compile-only runs), as ``sm_count`` says 4 SMs there."""
    if device.type != "cuda" or INTERPRETED:
        return 4
    if key is None:
        key = (kernel, num_warps, tuple(constexprs.items()),
               tuple(a.dtype if isinstance(a, torch.Tensor) else a is None for a in args), device.index)
    if key not in _RESIDENT:
        _RESIDENT[key] = _binary_occupancy(kernel, args, num_warps, device, constexprs)
    return _RESIDENT[key]


def _binary_occupancy(kernel, args: tuple, num_warps: int, device: torch.device, constexprs: dict) -> int | None:
    try:
        compiled = kernel.warmup(*args, grid=(1,), num_warps=num_warps, **constexprs)
        if hasattr(compiled, "result"):  # an asynchronous compile's future
            compiled = compiled.result()
        compiled._init_handles()
        regs, shared = compiled.n_regs, compiled.metadata.shared
    except Exception:  # noqa: BLE001 - another Triton: the caller keeps its own count
        return None
    props = torch.cuda.get_device_properties(device)
    return occupancy(regs, shared, num_warps, getattr(props, "max_threads_per_multi_processor", SM_THREADS),
                     getattr(props, "regs_per_multiprocessor", SM_REGISTERS),
                     getattr(props, "shared_memory_per_multiprocessor", SM_SHARED))


_WORKSPACES: dict = {}


def zeroed_workspace(device: torch.device, floats: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(float32 buffer of at least ``floats`` zeros, int32 counter at zero) for the current stream of
    ``device``, for kernels that accumulate with atomics and leave both zero when they finish
    (the norm backward's ``_add_weight_grads``). Launches on one stream run one after another, so
    they share one pair; another stream gets its own; a longer request replaces the buffer."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        key = (index, torch._C._cuda_getCurrentRawStream(index))
    else:
        key = (str(device), None)
    held = _WORKSPACES.get(key)
    if held is None or held[0].numel() < floats:
        held = _WORKSPACES[key] = (torch.zeros(max(floats, 1024), dtype=torch.float32, device=device),
                                   torch.zeros(1, dtype=torch.int32, device=device))
    return held


# --------------------------------------------------------------------------- partial column sums
@triton.jit
def _sum_partials_kernel(a_ptr, b_ptr, out_a_ptr, out_b_ptr, P, N, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    """out_a[j] = sum_i a[i, j] (program axis 1 = 0) or out_b[j] = sum_i b[i, j] (axis 1 = 1): [P, N]
    float32 partial rows, summed in float32, rounded once into the output's dtype."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    src, dst = a_ptr, out_a_ptr
    if tl.program_id(1) == 1:
        src, dst = b_ptr, out_b_ptr
    acc = tl.zeros((BLOCK_P, BLOCK_N), tl.float32)
    for start in range(0, P, BLOCK_P):
        rows = start + tl.arange(0, BLOCK_P)
        mask = (rows[:, None] < P) & (cols[None, :] < N)
        acc += tl.load(src + rows[:, None].to(tl.int64) * N + cols[None, :], mask=mask, other=0.0)
    tl.store(dst + cols, tl.sum(acc, axis=0).to(dst.dtype.element_ty), mask=cols < N)


def sum_partials(a: torch.Tensor, b: torch.Tensor | None, dtype: torch.dtype):
    """Column sums of one or two [P, N] float32 buffers of per-program partial rows (weight and
    bias gradients), in ``dtype``: one launch where torch would run a sum and a cast per buffer."""
    p, n = a.shape
    out_a = empty((n,), dtype, a.device)
    out_b = empty((n,), dtype, a.device) if b is not None else None
    _sum_partials_launch()(
        (cdiv(n, 64), 1 if b is None else 2), a, b if b is not None else a, out_a, out_b if out_b is not None else out_a,
        p, n,
    )
    return out_a, out_b


@functools.lru_cache(maxsize=None)
def _sum_partials_launch():
    return prepared(_sum_partials_kernel, BLOCK_P=32, BLOCK_N=64, num_warps=4)


@triton.jit
def tail_offsets(rows, M, N, BLOCK_N: tl.constexpr, TAIL: tl.constexpr):
    """A split row's tail (``row_tile``): its column indices, after the BLOCK_N of the head, and
    the mask of ``rows`` x those columns."""
    cols = BLOCK_N + tl.arange(0, TAIL)
    return cols, (rows[:, None] < M) & (cols[None, :] < N)


@triton.jit
def row_offsets(blk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Row indices of row block ``blk`` (an int64: row offsets can pass 2^31) and column indices."""
    rows = blk * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    return rows, cols
