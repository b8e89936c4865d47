"""What every kernel template shares: the launch a template prepares (:class:`Launch`, cached per
shape; :class:`Call`, one cached launch with its outputs), the geometry it is worked out from
(dims merged where every operand walks them alike, the largest offset, powers of two), the
register budget of a row held by one block, and the header of every generated module.

A template module (``pointwise``, ``rows``, ``columns``) imports these; the group runner
(``group_runner.py``) launches the calls the templates prepare.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from ... import config
from ...launch import current_stream as launch_stream
from .. import layout

__all__ = ["INT32_MAX", "META", "PERSISTENT_MAX", "persistent_max", "collapse", "max_offset", "pow2", "Launch",
           "Call", "allocator", "out_spec", "current_stream", "sm_count", "HEADER"]

INT32_MAX = 2**31 - 1
META = torch.device("meta")
# Longest row (a power of two) kept in registers by one block. Interpreted: 4096, so that the
# tests' 4097-long rows take the looped path.
PERSISTENT_MAX = {"gpu": 8192, "interpreter": 4096}


def persistent_max() -> int:
    """The longest row kept in registers on a GPU: ``PERSISTENT_MAX["gpu"]``, or
    ``KERNELAB_PERSISTENT_MAX`` (a power of two; shorter sends more rows to the looped template)."""
    return config.persistent_max(PERSISTENT_MAX["gpu"])


# ---------------------------------------------------------------------------------------------
# geometry


def collapse(shape, stride_lists):
    """Drop size-1 dims and merge neighbours every tensor walks contiguously: (sizes, strides)."""
    dims = [d for d in range(len(shape)) if shape[d] != 1]
    sizes = [shape[d] for d in dims]
    strides = [[s[d] for d in dims] for s in stride_lists]
    i = len(sizes) - 1
    while i > 0:
        if all(st[i - 1] == st[i] * sizes[i] for st in strides):
            sizes[i - 1] *= sizes[i]
            for st in strides:
                st[i - 1] = st[i]
                del st[i]
            del sizes[i]
        i -= 1
    if not sizes:
        return [1], [[0] for _ in stride_lists]
    return sizes, strides


def max_offset(sizes, strides) -> int:
    return sum((s - 1) * abs(st) for s, st in zip(sizes, strides))


def pow2(n: int) -> int:
    return 1 << max(0, (max(n, 1) - 1).bit_length())


@dataclass
class Launch:
    """Everything one launch needs that depends on shapes only (cached per shape key)."""

    rank: int
    persistent: bool
    block: dict
    num_warps: int
    int64: bool


@dataclass
class Call:
    """One cached launch: the kernel, its grid, the arguments after the pointers, the constexprs
    and warps, and the outputs to allocate (shape, stride, dtype)."""

    kernel: object
    grid: tuple
    tail: list
    meta: dict
    outs: list
    device: object
    launched: bool = False  # compiled and launched once without error
    direct: object = None  # the binary's launcher, bound once (``group_runner``; GPU only)
    move: tuple = ()  # inputs on another device than the kernel's (0-d CPU scalars): copied per call
    workspace: int = 0  # values of scratch a column reduction's splits need per launch
    workspace_dtype: torch.dtype = torch.float32  # its partials' type (float64 for float64 reductions)
    col_blocks: int = 0  # a column reduction's column blocks: one arrival counter each
    counters: dict = field(default_factory=dict)  # stream -> int32 counters, zeroed once, reset by the kernel
    transient: bool = False  # counters zeroed per call instead (under CUDA graphs: see GroupRunner)
    empty: object = None  # (size, stride, dtype) -> uninitialized tensor on ``device``: see allocator
    narrow: tuple = ()  # (output index, columns): padded outputs, allocated whole, viewed to their columns
    zeroed: tuple = ()  # output indices zeroed before the launch: buffers its scatters add into
    #: (output index, input index): the output may be stored over that input, whose layout it has
    #: (``GroupRunner.reuse``, checked for this call's layouts); the memory is taken per launch
    #: where nothing else holds it
    reuse: tuple = ()
    reused: bool = False  # recorded in the event log (once per call)
    #: per output of ``GroupRunner.into``: whether the kernel stored it in its input (``_in_place``)
    #: at the last call; None: no call with inputs to store into yet
    stored_in_place: tuple = None

    def __post_init__(self):
        self.empty = allocator(self.device)
        self.narrow = tuple((i, cols) for i, (size, _, _, cols) in enumerate(self.outs) if cols is not None)
        self.outs = [spec[:3] for spec in self.outs]

    def scratch(self) -> tuple:
        """The column template's (workspace, counters) arguments; nothing for other kernels.
        Counters are per stream: launches on one stream run one after another, so they never
        share a counter while it counts; launches on two streams get two sets."""
        if not self.col_blocks:
            return ()
        if self.transient:  # one memset more per launch; nothing kept between calls
            counters = torch.zeros(self.col_blocks, dtype=torch.int32, device=self.device)
            work = torch.empty(self.workspace, dtype=self.workspace_dtype, device=self.device) if self.workspace else counters
            return work, counters
        stream = current_stream(self.device)
        counters = self.counters.get(stream)
        if counters is None:
            counters = self.counters[stream] = torch.zeros(self.col_blocks, dtype=torch.int32, device=self.device)
        work = torch.empty(self.workspace, dtype=self.workspace_dtype, device=self.device) if self.workspace else counters
        return work, counters



def allocator(device: torch.device):
    """``empty(size, stride, dtype)`` on ``device``. Inductor's own allocators (C++ entry points
    that skip the dispatcher's argument parsing: ~7 us an allocation through ``torch.empty_strided``
    on the H200's host, where a call allocates up to ten outputs) where this torch has them; they
    allocate on the current device, which the compiled call makes the graph's."""
    guards = getattr(torch._C._dynamo, "guards", None)
    fast = getattr(guards, f"_empty_strided_{device.type}", None)
    if fast is not None and (device.type != "cuda" or device.index is not None):
        return fast

    def empty(size, stride, dtype):
        return torch.empty_strided(size, stride, dtype=dtype, device=device)
    return empty


def out_spec(o: torch.Tensor) -> tuple:
    """(size, stride, dtype, columns) to allocate an output laid out like the meta tensor ``o``.
    Rows padded by ``layout.py`` (row stride above the row length) are allocated whole, padding
    included, so that a product may read the padded rows as a full matrix; ``columns`` is then
    the row length the output is viewed to (None otherwise)."""
    if o.dim() >= 2 and o.stride(-1) == 1 and o.stride(-2) > o.shape[-1] > 0:
        full = (*o.shape[:-1], o.stride(-2))
        if list(o.stride()) == layout.padded_strides(full, o.stride(-2)):
            return full, o.stride(), o.dtype, o.shape[-1]
    return tuple(o.shape), o.stride(), o.dtype, None



def current_stream(device) -> int:
    """The current CUDA stream's handle on ``device`` (``launch.current_stream``: the raw handle
    Triton's launcher uses); 0 off CUDA, or if it does not answer (then streams share one set)."""
    if device.type != "cuda":
        return 0
    try:
        return launch_stream(device.index if device.index is not None else torch.cuda.current_device())
    except Exception:  # noqa: BLE001 - a counter set shared by streams is the old behaviour, not an error
        return 0


@functools.lru_cache(maxsize=None)
def sm_count(device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


HEADER = ('"""Generated by kernelab.compiler: do not edit."""\n'
          "import triton\nimport triton.language as tl\n\nfrom kernelab.compiler import kl_math as klm\n\n\n")
