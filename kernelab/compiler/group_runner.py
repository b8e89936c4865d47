"""One group's kernel at run time: generate, import, specialize per shape, launch.

Nothing about sizes is baked into a kernel. At each launch the runner looks at the actual tensors,
merges the dims every operand walks alike (a contiguous add becomes 1-D whatever its rank), and
picks the variant (rank after merging; persistent or looped rows) and the launch parameters
(block sizes, warps, int32 or int64 offsets) from a cache keyed on the shapes. A new shape is a new
cache entry, never a recompilation guard. Triton specializes what it always does: pointers on
16-byte alignment, integers on divisibility by 16 and on equality to 1 (a unit stride).
"""
from __future__ import annotations

import functools
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from .. import config
from ..errors import KernelabFallbackWarning
from ..launch import StaticLauncher, current_stream as launch_stream, enabled as launch_enabled, hooked, specialization
from ..report import debug_level
from . import codegen, columns, emit, fusion, layout, loops, ops_table
from .eventlog import record_fallback, record_launch, record_reuse
from .kcache import cache_dir, kernel_module
from .tiling import DEFAULT as DEFAULT_TILING, Tiling

__all__ = ["SymbolValues", "GroupRunner", "Launch", "Call", "FastLaunch", "run_reference", "call_node", "lookup", "interpreted",
           "persistent_max", "PERSISTENT_MAX", "INT32_MAX", "pow2", "sm_count", "bound_launch"]


INT32_MAX = 2**31 - 1
META = torch.device("meta")
# Longest row (a power of two) kept in registers by one block. Interpreted: 4096, so that the
# tests' 4097-long rows take the looped path.
PERSISTENT_MAX = {"gpu": 8192, "interpreter": 4096}


def persistent_max() -> int:
    """The longest row kept in registers on a GPU: ``PERSISTENT_MAX["gpu"]``, or
    ``KERNELAB_PERSISTENT_MAX`` (a power of two; shorter sends more rows to the looped template)."""
    return config.persistent_max(PERSISTENT_MAX["gpu"])


#: Launch options in a call's meta that are not kernel parameters.
_OPTIONS = ("num_warps",)


@functools.lru_cache(maxsize=1)
def interpreted() -> bool:
    """Triton runs kernels on CPU tensors (TRITON_INTERPRET=1 when triton was imported)."""
    import triton

    @triton.jit
    def _probe():
        pass

    return type(_probe).__name__ == "InterpretedFunction"


# ---------------------------------------------------------------------------------------------
# geometry


def _collapse(shape, stride_lists):
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


def _max_offset(sizes, strides) -> int:
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
    direct: "_DirectLaunch | None" = None  # Triton's launcher, bound once (GPU only)
    move: tuple = ()  # inputs on another device than the kernel's (0-d CPU scalars): copied per call
    workspace: int = 0  # values of scratch a column reduction's splits need per launch
    workspace_dtype: torch.dtype = torch.float32  # its partials' type (float64 for float64 reductions)
    col_blocks: int = 0  # a column reduction's column blocks: one arrival counter each
    counters: dict = field(default_factory=dict)  # stream -> int32 counters, zeroed once, reset by the kernel
    transient: bool = False  # counters zeroed per call instead (under CUDA graphs: see GroupRunner)
    empty: object = None  # (size, stride, dtype) -> uninitialized tensor on ``device``: see _allocator
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
        self.empty = _allocator(self.device)
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


# ---------------------------------------------------------------------------------------------
# launching without Triton's per-call work


#: how many references hold a storage (tensors and views over it, storage objects, saved copies)
_storage_use_count = torch._C._storage_Use_Count


def _specialization_key(varying) -> tuple:
    """What selects the binary among a cached call's varying arguments: a tensor's 16-byte alignment
    (its dtype is fixed for the graph), a scalar's :func:`specialization`."""
    return tuple([a.data_ptr() % 16 == 0 if isinstance(a, torch.Tensor) else specialization(a) for a in varying])


def _allocator(device: torch.device):
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


def _out_spec(o: torch.Tensor) -> tuple:
    """(size, stride, dtype, columns) to allocate an output laid out like the meta tensor ``o``.
    Rows padded by ``layout.py`` (row stride above the row length) are allocated whole, padding
    included, so that a product may read the padded rows as a full matrix; ``columns`` is then
    the row length the output is viewed to (None otherwise)."""
    if o.dim() >= 2 and o.stride(-1) == 1 and o.stride(-2) > o.shape[-1] > 0:
        full = (*o.shape[:-1], o.stride(-2))
        if list(o.stride()) == layout.padded_strides(full, o.stride(-2)):
            return full, o.stride(), o.dtype, o.shape[-1]
    return tuple(o.shape), o.stride(), o.dtype, None


def _no_direct(call: Call, why: str) -> None:
    if debug_level() >= 2:
        name = getattr(call.kernel, "__name__", "a kernel")
        print(f"kernelab: {name} launches through kernel[grid](...): {why}", file=sys.stderr)
    return None


@dataclass
class _DirectLaunch:
    """A cached call's binary with its launcher, bound once.

    ``kernel[grid](*args)`` binds the arguments to the signature, computes their specialization
    key and looks the binary up, every time: tens of microseconds of Python for a kernel that may
    run for two. A cached call's integer arguments and output pointers never change, so only the
    inputs' alignment (and the symbolic scalars) can select another binary; while they match the
    first launch's, the binary is launched directly: through torch's precompiled launcher
    (``launch.StaticLauncher``, no gcc at the first launch) where this torch has one, else
    through Triton's own launcher with the argument list Triton passes it (every bound argument,
    constexprs included, in signature order; Triton >= 3.3). Anything else (a profiler's launch
    hook, other alignment) takes the ordinary path.
    """

    compiled: object
    grid: tuple
    constexprs: tuple
    key: tuple
    device_index: int
    stream_of: object
    knobs: object
    static: object = None  # launch.StaticLauncher, or None: Triton's launcher

    @classmethod
    def bind(cls, call: Call, compiled, args, varying) -> "_DirectLaunch | None":
        try:
            import triton
            from triton import knobs
            from triton.runtime.driver import driver

            if tuple(int(p) for p in triton.__version__.split(".")[:2]) < (3, 3):
                return _no_direct(call, f"Triton {triton.__version__} < 3.3 passes other launcher arguments")
            names = list(call.kernel.arg_names)
            constexpr_names = names[len(args):]
            if len(args) > len(names) or sorted(constexpr_names) != sorted(k for k in call.meta if k not in _OPTIONS):
                return _no_direct(call, f"signature {names} does not end in the constexprs {list(call.meta)}")
            if hasattr(compiled, "result"):  # an asynchronous compile's future
                compiled = compiled.result()
            index = call.device.index if call.device.index is not None else torch.cuda.current_device()
            static = StaticLauncher.bind(compiled, index, len(args), os.path.join(cache_dir(), "cubin"))
            if static is None:
                compiled._init_handles()  # Triton's launcher (built with gcc by Triton <= 3.6)
            return cls(compiled, tuple(call.grid) + (1,) * (3 - len(call.grid)),
                       tuple(call.meta[n] for n in constexpr_names), _specialization_key(varying),
                       index, driver.active.get_current_stream, knobs, static)
        except Exception as exc:  # noqa: BLE001 - another Triton: the ordinary launch path still works
            return _no_direct(call, f"{type(exc).__name__}: {exc}")

    def launch(self, args, varying) -> bool:
        """Launch and return True, or return False (the caller takes Triton's ordinary path).
        ``varying``: the arguments that can differ between calls with one cache key (the inputs, the
        symbolic scalars and the outputs stored into graph inputs; other outputs are fresh
        allocations, aligned, and the rest is cached)."""
        runtime = self.knobs.runtime
        hook = hooked(runtime.launch_enter_hook) or hooked(runtime.launch_exit_hook)
        if hook or _specialization_key(varying) != self.key:
            if debug_level() >= 3:
                print(f"kernelab: {self.compiled.name} takes Triton's launch path "
                      f"({'a launch hook is set' if hook else 'other input alignment'})", file=sys.stderr)
            return False
        stream = self.stream_of(self.device_index)
        if self.static is not None:
            self.static.launch(self.grid, stream, args)
            return True
        c = self.compiled
        c.run(self.grid[0], self.grid[1], self.grid[2], stream, c.function,
              c.packed_metadata, None, None, None, *args, *self.constexprs)
        return True


def bound_launch(call: Call, varying, launcher) -> _DirectLaunch:
    """``call`` bound to ``launcher`` (anything with ``launch(grid, stream, args)``) the way a GPU
    binds its compiled binary: every later launch takes the direct path (specialization key, launch
    hooks, stream) and ends in ``launcher.launch``. For host-time measurements with the driver's
    launch stubbed on the CPU (``benchmarks/compiler_host_cpu.py``)."""
    from triton import knobs

    return _DirectLaunch(None, tuple(call.grid) + (1,) * (3 - len(call.grid)), (), _specialization_key(varying), 0,
                         lambda device_index: 0, knobs, launcher)


@dataclass(frozen=True)
class FastLaunch:
    """A group's one bound call, as a specialized runner line launches it (``runtime.py``): the
    outputs to allocate, the launcher, the arguments after the tensors, and which inputs the binary
    assumed 16-byte aligned. Everything ``run_values`` looks up per call (the shape key, the
    cached call, the output specs, the launch hooks, the stream, the binary's specialization key)
    is settled here once; the line checks only what can still differ in a graph of fixed shapes:
    those inputs' alignment (the graph's inputs are guarded once per call by the runner)."""

    outs: tuple  # (size, stride, dtype) per output
    empty: object  # the call's allocator
    launcher: object  # anything with launch(grid, stream, args): torch's StaticLauncher on a GPU
    grid: tuple  # three dims
    tail: tuple  # the arguments after the inputs, outputs and scratch
    aligned: tuple  # indices of the inputs the binary was specialized on as 16-byte aligned
    device_index: int
    stream_of: object  # device index -> the current stream's handle
    #: outputs that may take an input's memory (``GroupRunner.reuse``): inputs -> every output,
    #: decided per call; None: every output newly allocated
    allocate: object = None
    narrow: tuple = ()  # (output index, columns): padded outputs viewed to their columns
    zeroed: tuple = ()  # output indices zeroed before the launch
    scratch: object = None  # a column reduction's () -> (workspace, counters); None: no scratch
    #: output indices stored in place into the graph inputs of ``GroupRunner.into`` (in its order):
    #: the input tensor is passed as that output, nothing allocated for it
    into: tuple = ()
    #: positions in ``into`` of the graph inputs the binary assumed 16-byte aligned
    into_aligned: tuple = ()


# ---------------------------------------------------------------------------------------------
# one group


@dataclass
class GroupRunner:
    group: object
    interpret: bool
    kernels: dict = field(default_factory=dict)  # (rank, persistent) -> jitted kernel
    loads: list = None  # emit.Load per kernel input, computed once
    calls: dict = field(default_factory=dict)  # (shapes, strides, devices, dtypes) -> Call or None
    compile_s: float = 0.0
    #: outputs laid out with padded rows (``layout.py``): node -> row stride in elements
    padded: dict = field(default_factory=dict)
    #: allocate a column reduction's arrival counters per call instead of once: a CUDA graph's
    #: memory pool must hold nothing between calls that the graph does not return (the trees check)
    transient_scratch: bool = False
    #: the launch heuristics' data (``tiling.py``; a tuning script passes its own)
    tiling: Tiling = DEFAULT_TILING
    #: (output index, graph input node): outputs stored into inputs (``graph.absorb_copies``)
    into: list = field(default_factory=list)
    #: (output index, load index): outputs that may be stored over an input whose last use is this
    #: kernel and whose memory the runner owns (a backward's donated saved activation, or a value
    #: the graph computed): the cross-entropy backward's gradient over the logits (``reusable``)
    reuse: list = field(default_factory=list)

    def __post_init__(self):
        self.loads = emit.loads_of(self.group) if self.group is not None else []
        self.load_nodes = [load.node for load in self.loads]

    def kernel(self, rank: int, persistent: bool):
        key = (rank, persistent)
        if key not in self.kernels:
            t0 = time.perf_counter()
            source = codegen.kernel_source(self.group, rank, persistent)
            self.kernels[key] = kernel_module(source, self.group.name)
            if debug_level() >= 3:  # 3: the generated source of every kernel variant
                print(source, file=sys.stderr)
            self.compile_s += time.perf_counter() - t0
        return self.kernels[key]

    def run(self, env: dict) -> None:
        """Launch the group's kernel on the values in ``env`` and put its outputs there."""
        scalars = [env[s] for s in self.group.scalars] if self.group.scalars else []
        raw = [env[n] for n in self.load_nodes]
        outs = self.run_values(raw, scalars, [env[buf] for _, buf in self.into]) if self.into else \
            self.run_values(raw, scalars)
        for n, t in zip(self.group.outputs, outs):
            env[n] = t

    def run_values(self, raw: list, scalars: list, into: list = ()) -> list:
        """The group's outputs for its loads' values ``raw`` (in ``loads`` order) and its scalars.
        Everything that depends only on the inputs' shapes and strides (variant, block sizes,
        output layouts, stride arguments) is worked out once per such key; a repeated call
        allocates the outputs and launches. ``into``: the input tensors of ``self.into``, which
        receive those outputs (stored there by the kernel where their layout is the one it
        writes, else copied after) and are returned in their place."""
        # dtypes and devices are fixed for one graph (dynamo guards the inputs'; the rest follow):
        # sizes and strides are what can change (dynamic shapes, a differently strided input)
        key = tuple([(t.shape, t.stride()) for t in raw] + list(scalars))
        call = self.calls.get(key, False)
        if call is False:
            call = self.calls[key] = self.prepare_or_refuse(raw, scalars)
        if call is None:
            return self._stored(self.reference(raw, scalars), into)
        empty = call.empty
        if call.reuse:
            outs = self._outputs_over_inputs(call, raw)
        else:
            outs = [empty(size, stride, dtype) for size, stride, dtype in call.outs]
        for i, cols in call.narrow:
            outs[i] = outs[i][..., :cols]
        for i in call.zeroed:
            outs[i].zero_()
        if into:
            call.stored_in_place = self._in_place(call, outs, into)
        ins = [t.to(call.device) if i in call.move else t for i, t in enumerate(raw)] if call.move else raw
        args = (*ins, *outs, *call.scratch(), *call.tail, *scalars) if call.col_blocks else (*ins, *outs, *call.tail, *scalars)
        # what may select another binary: the inputs, the scalars, and the outputs stored into graph
        # inputs (not fresh allocations: their alignment is the caller's)
        varying = (*ins, *scalars, *(outs[i] for i, _ in self.into)) if into else (*ins, *scalars)
        if call.direct is not None and call.direct.launch(args, varying):
            pass
        elif call.launched:
            call.kernel[call.grid](*args, **call.meta)
        else:  # the first launch compiles the kernel: a failure there falls back too
            try:
                call.direct = self.first_launch(call, args, varying)
                call.launched = True
                record_launch(self.group.name)
            except Exception as exc:
                self.calls[key] = None
                self.refuse(exc)
                return self._stored(self.reference(raw, scalars), into)
        return self._stored(outs, into) if into else outs

    def fast_launch(self) -> "FastLaunch | None":
        """The group's call as a :class:`FastLaunch`, where the runner may launch it without
        ``run_values``: one cached call only (one shape and layout ever seen), compiled, launched
        and bound to a launcher (torch's, or a test's), no input moved between devices, no
        symbolic scalars. None otherwise (the runner keeps
        ``run_values`` for it). Outputs stored into graph inputs (``into``) are launched in place
        where the first call stored them there: the specialized runner checks the inputs' layouts,
        which decide it (``_in_place``)."""
        if len(self.calls) != 1 or self.group.scalars:
            return None
        call = next(iter(self.calls.values()))
        direct = getattr(call, "direct", None)
        if call is None or not call.launched or direct is None or direct.static is None or call.move:
            return None
        if self.into and not (call.stored_in_place and all(call.stored_in_place)):
            return None
        aligned = tuple(i for i, ok in enumerate(direct.key[:len(self.loads)]) if ok is True)
        # the key's tail: the outputs stored into graph inputs (``run_values``'s ``varying``)
        into_aligned = tuple(k for k, ok in enumerate(direct.key[len(self.loads):]) if ok is True) if self.into else ()
        allocate = functools.partial(self._outputs_over_inputs, call) if call.reuse else None
        return FastLaunch(tuple(call.outs), call.empty, direct.static, direct.grid, tuple(call.tail), aligned,
                          direct.device_index, direct.stream_of, allocate, tuple(call.narrow), tuple(call.zeroed),
                          call.scratch if call.col_blocks else None, tuple(i for i, _ in self.into), into_aligned)

    def reusable(self, inputs: set) -> list:
        """(output index, load index) pairs of ``self.reuse``: an output may be stored over one of
        ``inputs`` (values whose last use is this kernel, their memory the runner's) where the
        kernel reads each element of that input only before the same element of the output is
        stored, and nowhere else: a pointwise kernel (it loads every input at the element it
        stores), or a row reduction storing its full-size outputs in its last pass over the row
        (``loops.stores_in_the_last_pass``); an input read once, as a whole ("full"), never
        gathered from; an output of its dtype and shape, not a scatter's buffer, not stored into a
        graph input. Layouts are checked per call (``_reuse_for_call``): a padded output (rows a
        product reads) over an input padded alike (a padded product saved for the backward, as
        ``layout.visible`` leaves it), the padding never written."""
        g = self.group
        if not inputs or g.kind not in ("pointwise", "reduction") or (
                g.kind == "reduction" and not loops.stores_in_the_last_pass(g)):
            return []
        barred = set(emit.scatter_outputs(g).values()) | {i for i, _ in self.into}
        pairs = []
        for k, load in enumerate(self.loads):
            p = load.node
            if p not in inputs or load.role != "full" or self.load_nodes.count(p) != 1:
                continue
            vp = fusion.value(p)
            if not isinstance(vp, torch.Tensor):
                continue
            for i, o in enumerate(g.outputs):
                vo = fusion.value(o)
                if i in barred or g.roles.get(o) != "full" or vo.dtype != vp.dtype or \
                        [str(d) for d in vo.shape] != [str(d) for d in vp.shape]:
                    continue
                pairs.append((i, k))
                barred.add(i)
                break
        return pairs

    def _reuse_for_call(self, raw, ins, outs) -> tuple:
        """The pairs of ``self.reuse`` whose input, as passed (``raw``) and as the kernel reads it
        (``ins``), has the output's shape and strides, so that the kernel addresses both alike."""
        pairs = []
        for i, k in self.reuse:
            t, seen, o = raw[k], ins[k], outs[i]
            if t.dtype == o.dtype and t.shape == o.shape == seen.shape and t.stride() == o.stride() == seen.stride() \
                    and t.storage_offset() == seen.storage_offset():
                pairs.append((i, k))
        return tuple(pairs)

    def _outputs_over_inputs(self, call: Call, raw: list) -> list:
        """The call's outputs, those of ``call.reuse`` in their input's memory where this input
        alone holds it (no other tensor, view or saved copy: its storage's use count is this tensor
        and the storage object asked for it), else newly allocated. Only 16-byte aligned memory:
        a binary bound at the first launch assumed its outputs aligned, as fresh allocations are
        (``_DirectLaunch`` checks the inputs' alignment only)."""
        taken = {}
        for i, k in call.reuse:
            t = raw[k]
            if _storage_use_count(t.untyped_storage()._cdata) == 2 and t.data_ptr() % 16 == 0 and \
                    not any(x is t for j, x in enumerate(raw) if j != k):
                taken[i] = t
        if taken and not call.reused:
            call.reused = True
            record_reuse(self.group.name)
        empty = call.empty
        return [taken[i] if i in taken else empty(size, stride, dtype) for i, (size, stride, dtype) in enumerate(call.outs)]

    def _in_place(self, call: Call, outs: list, into: list) -> tuple:
        """Swap the output buffers of ``self.into`` for the inputs that receive them, where the
        layout the call writes is theirs (a padded output, another stride: copied after); whether
        each was swapped."""
        narrow = {i for i, _ in call.narrow}
        taken = []
        for (i, _), t in zip(self.into, into):
            size, stride, dtype = call.outs[i]
            taken.append(i not in narrow and t.dtype == dtype and tuple(t.shape) == tuple(size) and
                         t.stride() == tuple(stride) and t.device == call.device)
            if taken[-1]:
                outs[i] = t
        return tuple(taken)

    def _stored(self, outs: list, into: list) -> list:
        """The outputs with those of ``self.into`` in their input tensors (copied there where the
        kernel did not store them: another layout, or the group ran as ATen)."""
        for (i, _), t in zip(self.into, into):
            if outs[i] is not t:
                t.copy_(outs[i])
                outs[i] = t
        return outs

    def first_launch(self, call: Call, args: tuple, varying: tuple) -> "_DirectLaunch | None":
        """Compile the call's binary, launch it, and return its bound launcher (None: every launch
        takes ``kernel[grid](...)``). On a GPU the binary is compiled without launching
        (``warmup``) and launched through torch's precompiled launcher where this torch has one:
        Triton <= 3.6 builds a C launcher with gcc for every new argument signature at a binary's
        first launch, 0.17-0.20 s on the H200's host (``benchmarks/compile_breakdown.py``), about
        half of a one-kernel graph's cold compile. Inductor launches the same way."""
        if self.interpret or not launch_enabled():
            call.kernel[call.grid](*args, **call.meta)
            return None
        compiled = call.kernel.warmup(*args, grid=call.grid, **call.meta)
        direct = _DirectLaunch.bind(call, compiled, args, varying)
        if direct is None or not direct.launch(args, varying):
            call.kernel[call.grid](*args, **call.meta)
        return direct

    def reference(self, raw: list, scalars: list) -> list:
        """The group's outputs computed by its ATen ops (empty tensors, a kernel that failed)."""
        env = dict(zip(self.load_nodes, raw))
        env.update(zip(self.group.scalars, scalars))
        run_reference(self.group, env)
        return [env[n] for n in self.group.outputs]

    def prepare_or_refuse(self, raw, scalars=()) -> "Call | None":
        """A launch, or None (ATen runs the group) when generating or compiling the kernel fails:
        said once per group, with the reason; KERNELAB_STRICT=1 raises instead."""
        try:
            return self.prepare(raw, scalars)
        except Exception as exc:
            self.refuse(exc)
            return None

    def refuse(self, exc: Exception) -> None:
        if config.strict():
            raise exc
        record_fallback("group", self.group.name, f"{type(exc).__name__}: {exc}")
        warnings.warn(f"kernelab: {self.group.name} runs as ATen ops: its kernel failed to build or launch "
                      f"({type(exc).__name__}: {exc})", KernelabFallbackWarning, stacklevel=3)

    def prepare(self, raw, scalars=()) -> "Call | None":
        """The launch for inputs like ``raw`` (None: empty tensors, run the ATen reference)."""
        shape = self.shape(raw, scalars)
        if any(s == 0 for s in shape):
            return None
        # a group may load no tensor at all (wav2vec2's output lengths: sizes and constants only)
        device = _device(raw) if raw else fusion.value(self.group.outputs[0]).device
        moved = [_on(t, device) for t in raw]
        if self.group.kind == "pointwise":
            call = self.prepare_pointwise(moved, shape, device)
        elif self.group.kind == "column":
            call = self.prepare_column(moved, shape, device)
        else:
            call = self.prepare_reduction(moved, shape, device)
        call.move = tuple(i for i, t in enumerate(raw) if t.device != device)
        if call.move and call.reuse:  # an input copied to the kernel's device per call: not its memory
            call.reuse = tuple((i, k) for i, k in call.reuse if k not in call.move)
        return call

    def shape(self, inputs, scalars=()) -> tuple:
        """The group's iteration shape for these inputs: its symbolic sizes evaluated with the
        values the inputs' sizes and the scalars give the symbols (``self.sizes``, kept for the
        outputs' shapes). Broadcasting the inputs' shapes, as before, misaligned per-row values:
        rows (N, 1) against (N, 1, C) gave N x N."""
        self.sizes = SymbolValues.bind(self.load_nodes, inputs, self.group.scalars, scalars, self.group.name)
        return self.sizes.shape(self.group.shape)

    # -- pointwise --------------------------------------------------------------------------
    def prepare_pointwise(self, raw, shape, device) -> "Call":
        g = self.group
        pieces = [load.role.startswith(("piece", "gsrc", "gidx", "sidx")) for load in self.loads]
        ins = [_placed(t, load, g, shape) for t, load in zip(raw, self.loads)]
        scatters = {i: n for n, i in emit.scatter_outputs(g).items()}  # output index -> a scatter into it
        # layouts only, no memory: a scatter's buffer in its own shape, the others in the group's
        outs = [torch.empty(fusion.value(n).shape, dtype=fusion.value(n).dtype, device=META) if i in scatters
                else _alloc(n, shape, META, self.padded.get(n)) for i, n in enumerate(g.outputs)]
        walked = [_scatter_view(o, scatters[i]) if i in scatters else o for i, o in enumerate(outs)]
        if any(pieces) or scatters:  # coordinates of given dims matter (a cat's, a gather's, a scatter's)
            sizes, strides = list(shape), [list(t.stride()) for t in ins + walked]
        else:
            order = layout.memory_order(outs[0] if outs else ins[0])
            sizes, strides = _collapse([shape[d] for d in order], [[t.stride(d) for d in order] for t in ins + outs])
        numel = math.prod(sizes)
        # gather sources and scatter buffers: an index may reach any of their elements
        reached = [t for t, load in zip(raw, self.loads) if load.role.startswith("gsrc")] + \
            [outs[i] for i in sorted(scatters)]
        launch = self.pointwise_launch(sizes, strides + [list(t.stride()) for t in reached], numel,
                                       [list(t.shape) for t in reached])
        block = launch.block["BLOCK"]
        tail = [s for st in strides for s in st] + _gather_strides(raw, self.loads, g) + \
            _scatter_strides(outs, scatters) + list(sizes) + [numel]
        return Call(self.kernel(launch.rank, True), ((numel + block - 1) // block,), tail,
                     {"BLOCK": block, "INT64": launch.int64, "num_warps": launch.num_warps},
                     [_out_spec(o) for o in outs], device, zeroed=tuple(sorted(scatters)),
                     reuse=self._reuse_for_call(raw, ins, outs))

    def pointwise_launch(self, sizes, strides, numel, source_sizes=()) -> Launch:
        """``source_sizes``: the sizes of gathers' sources, whose strides end ``strides``: an index
        may reach any of their elements."""
        # 8 elements a thread of 2048-element blocks (``tiling.PointwiseTiling``); interpreted,
        # bigger blocks are faster
        t = self.tiling.pointwise
        block = min(pow2(numel), 1 << 16 if self.interpret else pow2(t.block))
        warps = max(1, min(8, block // (32 * t.per_thread)))
        sizes_of = [sizes] * (len(strides) - len(source_sizes)) + list(source_sizes)
        int64 = numel > INT32_MAX or any(_max_offset(sz, st) > INT32_MAX for sz, st in zip(sizes_of, strides))
        return Launch(len(sizes), True, {"BLOCK": block}, warps, int64)

    # -- reduction --------------------------------------------------------------------------
    def prepare_reduction(self, raw, shape, device) -> "Call":
        g = self.group
        n_cols = shape[-1]
        rows = math.prod(shape[:-1])
        ins = [_as_rows(t, load, g, shape, self.sizes) for t, load in zip(raw, self.loads)]
        out_row = self.out_row(shape)
        outs = [_alloc_rows(n, g.roles[n], shape, META, out_row, self.sizes) for n in g.outputs]
        lead = list(shape[:-1]) or [1]
        contiguous_rows = [math.prod(lead[d + 1:]) for d in range(len(lead))]
        lead_strides = [list(t.stride()[:-1]) or [0] for t in ins] + [contiguous_rows]
        sizes, strides = _collapse(lead, lead_strides)
        strides = strides[:-1]
        launch = self.reduction_launch(sizes, strides, rows, n_cols, ins)
        xblock = launch.block["XBLOCK"]
        tail = [s for st in strides for s in st] + [t.stride(-1) for t in ins] + list(sizes) + [rows, n_cols, out_row]
        meta = {"XBLOCK": xblock, "RBLOCK": launch.block["RBLOCK"], "INT64": launch.int64,
                "num_warps": launch.num_warps}
        return Call(self.kernel(launch.rank, launch.persistent), ((rows + xblock - 1) // xblock,), tail, meta,
                     [_out_spec(o) for o in outs], device, reuse=self._reuse_for_call(raw, ins, outs))

    def out_row(self, shape) -> int:
        """The row stride of the full-size outputs: the row length, or the padded stride when
        ``layout.plan`` padded one of them (then all, so that one ``out_row`` serves every store)."""
        n_cols = shape[-1]
        padded = [self.padded[n] for n in self.group.outputs if n in self.padded]
        if not padded or any(s == 0 for s in shape):
            return n_cols
        sizes = [fusion.value(n).element_size() for n in self.group.outputs if self.group.roles[n] == "full"]
        return max(padded + [layout.padded_cols(n_cols, min(sizes))])

    def has_var(self) -> bool:
        return any(fusion.is_reduction(n) and fusion.reduction_kind(n) == "var" for n in self.group.nodes)

    def reduction_launch(self, sizes, strides, rows, n_cols, ins) -> Launch:
        rblock = pow2(n_cols)
        rows_tiling = self.tiling.rows
        persistent = rblock <= (PERSISTENT_MAX["interpreter"] if self.interpret else persistent_max()) and \
            (self.interpret or not rows_tiling.looped)
        if persistent and not self.interpret and rblock > rows_tiling.var_persistent_max and self.has_var():
            # a variance over a long row keeps the row and its deviations live: the layer norm
            # kernel over rows of 8192 needs 85 registers a thread at 16 warps (one program per
            # SM). Looped (three passes, the re-reads from L2), 16384x8192 bf16 went from 0.174 to
            # 0.151 ms on the H200 (compiler_suite, back-to-back calls; Inductor 0.147); RMS norm
            # (one sum) got slower looped (0.133 -> 0.140 ms) and stays persistent
            persistent = False
        if not persistent:
            rblock = 4096 if self.interpret else 2048
        # elements of one [XBLOCK, RBLOCK] tile: on the GPU 16 per thread per live value. Measured
        # on the H200 (benchmarks/row_tune.py): against 8 per thread, layer norm over 65536x1024
        # went from 75.8 to 69.3 us and over 32768x4096 from 162 to 133 us; softmax and RMS norm
        # over rows of 8192 did not move (16 warps either way), 4 per thread was slower. Looped
        # rows (longer than 8192) keep 8 per thread: measured at 1.1x Inductor on 1024x32768
        budget = (1 << 16) if self.interpret else (2048 if persistent else rblock)
        xblock = max(1, min(pow2(rows), budget // rblock))
        per_warp = 32 * (rows_tiling.per_thread if persistent else rows_tiling.looped_per_thread)
        warps = 1 if self.interpret else max(1, min(16, xblock * rblock // per_warp))
        span = rows * n_cols
        int64 = span > INT32_MAX or any(
            _max_offset(sizes, st) + (n_cols - 1) * abs(t.stride(-1)) > INT32_MAX for st, t in zip(strides, ins))
        return Launch(len(sizes), persistent, {"XBLOCK": xblock, "RBLOCK": rblock}, warps, int64)


    # -- column reduction -------------------------------------------------------------------
    def prepare_column(self, raw, shape, device) -> "Call":
        g = self.group
        n_cols, rows = shape[-1], math.prod(shape[:-1])
        # (a sum of values computed from constants alone, a zero gradient's column sum, loads no
        # full-size tensor: its rows are walked by index, every stride 0)
        ins = [t.expand(shape) if load.role == "full" else _as_cols(t, n_cols) for t, load in zip(raw, self.loads)]
        outs = [_alloc_cols(n, n_cols, META) if g.roles[n] == "col" else torch.empty(shape, dtype=fusion.value(n).dtype,
                                                                                     device=META)
                for n in g.outputs]
        lead = list(shape[:-1])
        lead_strides = [list(t.stride()[:-1]) if load.role == "full" else [0] * len(lead)
                        for t, load in zip(ins, self.loads)]
        sizes, strides = _collapse(lead, lead_strides)
        launch = self.column_launch(rows, n_cols, device)
        xblock, cblock, splits, tiles = (launch.block[k] for k in ("XBLOCK", "CBLOCK", "splits", "tiles"))
        int64 = any(_max_offset(sizes, st) + (n_cols - 1) * abs(t.stride(-1)) > INT32_MAX
                    for st, t in zip(strides, ins)) or rows * n_cols > INT32_MAX
        tail = [s for st in strides for s in st] + [t.stride(-1) for t in ins] + list(sizes) + [rows, n_cols, tiles,
                                                                                            splits]
        meta = {"XBLOCK": xblock, "CBLOCK": cblock, "SPLITS": pow2(splits), "INT64": int64,
                "num_warps": launch.num_warps}
        col_blocks = (n_cols + cblock - 1) // cblock
        call = Call(self.kernel(len(sizes), True), (col_blocks, splits), tail, meta,
                     [_out_spec(o) for o in outs], device)
        call.workspace = columns.workspace_slots(g) * splits * n_cols if splits > 1 else 0
        call.workspace_dtype = columns.workspace_dtype(g)
        call.col_blocks = col_blocks
        call.transient = self.transient_scratch
        return call

    def column_launch(self, rows, n_cols, device) -> Launch:
        """Column blocks of 32 columns and as many row splits as it takes to give every SM two
        programs, each walking at least two tiles. Measured on the H200 (benchmarks/column_tune.py,
        36 combinations of column block, tile, warps and tiles per split over four shapes of
        ``(x * y).sum(0)``): the best overall is 256-row tiles on 4 warps, 64 elements per thread
        (1.11x each shape's best). A real prologue then spills registers (the MLP's GELU-backward
        bias-gradient kernel went from 49 to 97 us, the layer-norm weight gradients from 24 to 47),
        so only light groups (one sum of at most two ops) take it; the others take 64-row tiles on
        8 warps, 8 elements per thread, the best of those holding at most 16 per thread."""
        light = sum(1 for n in self.group.nodes if self.group.roles[n] == "full") <= 2 and \
            sum(1 for n in self.group.nodes if fusion.is_reduction(n)) == 1
        t = self.tiling.columns
        cblock = min(pow2(n_cols), 16 if self.interpret else t.cblock)
        elems = 256 if self.interpret else (t.light_elems if light else t.heavy_elems)
        xblock = min(pow2(rows), max(1, elems // cblock))
        col_blocks = (n_cols + cblock - 1) // cblock
        tiles = (rows + xblock - 1) // xblock
        programs = 4 if self.interpret else t.programs_per_sm * sm_count(device)
        splits = max(1, min((programs + col_blocks - 1) // col_blocks, tiles // (1 if self.interpret else t.min_tiles)))
        per_split = (tiles + splits - 1) // splits
        splits = (tiles + per_split - 1) // per_split
        warps = 1 if self.interpret else (t.light_warps if light else t.heavy_warps)
        return Launch(0, True, {"XBLOCK": xblock, "CBLOCK": cblock, "splits": splits, "tiles": per_split},
                       warps, False)


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


def _as_cols(t: torch.Tensor, n_cols: int) -> torch.Tensor:
    """A per-column input (shape (C,), (1, .., C) or one value) as a 1-d view of C values."""
    return t.reshape(-1).expand(n_cols) if t.numel() in (1, n_cols) else t.reshape(n_cols)


def _alloc_cols(node, n_cols, device) -> torch.Tensor:
    """A column group's output: one value per column, contiguous, in the node's own shape."""
    meta = fusion.value(node)
    sizes = list(meta.shape) if fusion.static_shape(meta) else [1] * (meta.dim() - 1) + [n_cols]
    return torch.empty(sizes, dtype=meta.dtype, device=device)


class SymbolValues:
    """Sizes of symbolic shapes at run time, from what the inputs' sizes and the scalars bind."""

    def __init__(self, known: dict, where: str):
        self.known = known
        self.symbols = {e: v for e, v in known.items() if getattr(e, "is_Symbol", False)}
        self.where = where

    @classmethod
    def bind(cls, nodes, values, scalar_nodes, scalar_values, where: str) -> "SymbolValues":
        """What the run-time sizes of ``values`` (tensors of ``nodes``) and the scalars give each
        symbolic size of their meta values."""
        known = {}
        for node, t in zip(nodes, values):
            if isinstance(t, torch.Tensor):
                for m, r in zip(fusion.value(node).shape, t.shape):
                    known[_expr(m)] = r
                    known.setdefault(_unreplaced(m), r)
        for node, v in zip(scalar_nodes, scalar_values):
            known[_expr(fusion.value(node))] = int(v)
        return cls(known, where)

    def size(self, s) -> int:
        e = _expr(s)
        if isinstance(e, int):
            return e
        value = self.known.get(e)
        if value is None:
            value = e.xreplace(self.symbols)
        if value is None or not getattr(value, "is_number", True):
            raise NotImplementedError(f"the size {s} in {self.where} is not known from its inputs")
        return int(value)

    def shape(self, shape) -> tuple:
        return tuple(self.size(s) for s in shape)


def _expr(size):
    """A size as a sympy expression (an int stays an int)."""
    return size.node.expr if isinstance(size, torch.SymInt) else size


def _unreplaced(size):
    """A size's expression before the shape environment's replacements. A guard made while planning
    (``s17 == 6``, comparing two shapes) replaces s17 by 6 in ``_expr`` from then on, but a group's
    shape taken earlier still names s17: bound from the inputs under both names, it resolves."""
    return getattr(size.node, "_expr", size.node.expr) if isinstance(size, torch.SymInt) else size


def _device(tensors) -> torch.device:
    """Where the kernel runs: the device of the inputs that are not 0-d CPU scalars."""
    for t in tensors:
        if t.dim() > 0 or t.device.type != "cpu":
            return t.device
    return tensors[0].device


def _on(t: torch.Tensor, device) -> torch.Tensor:
    """A 0-d CPU tensor may meet CUDA tensors in one op: the kernel needs it on the device."""
    return t if t.device == device else t.to(device)


def _placed(t: torch.Tensor, load, group, shape) -> torch.Tensor:
    """An input as the pointwise kernel walks it over ``shape``: broadcast (expanded); a cat's
    piece with its own strides; a gather's source as a view of ``shape`` that walks the source's
    kept dims and stays put along the indices' dims (the kernel adds index x stride for those); an
    index tensor right-aligned against the dims before the kept trailing ones."""
    if load.role.startswith("piece"):
        return t
    parts = emit.gather_of(group, load)
    if parts is None:
        return t.expand(shape)
    if load.role.startswith("gsrc"):
        # the gather's own result shape first, then broadcast like any operand (a position
        # embedding's (S, D) gathered into a (B, S, D) kernel: GPT-2's wte(ids) + wpe(positions))
        strides = (list(t.stride()[:parts.first]) + [0] * parts.broadcast
                   + list(t.stride()[parts.first + len(parts.indices):]))
        return t.as_strided(parts.shape, strides, t.storage_offset()).expand(shape)
    return t[(...,) + (None,) * parts.trail].expand(shape)


def _gather_strides(raw, loads, group) -> list[int]:
    """Per gather source, in load order, its strides along the indexed dims (the kernel's
    ``in{i}_gstride{t}``)."""
    out = []
    for t, load in zip(raw, loads):
        if load.role.startswith("gsrc"):
            parts = emit.gather_of(group, load)
            out += [t.stride(parts.first + k) for k in range(len(parts.indices))]
    return out


def _scatter_view(buf: torch.Tensor, scatter) -> torch.Tensor:
    """A scatter's buffer as the pointwise kernel walks it over the values' shape: along the
    buffer's kept dims, put along the indices' broadcast dims (the kernel adds index x stride)."""
    parts = fusion.scatter_parts(scatter)
    strides = (list(buf.stride()[:parts.first]) + [0] * parts.broadcast
               + list(buf.stride()[parts.first + len(parts.indices):]))
    return buf.as_strided(parts.shape, strides)


def _scatter_strides(outs, scatters: dict) -> list[int]:
    """Per scatter buffer, in output order, its strides along the indexed dims (the kernel's
    ``out{i}_sstride{t}``)."""
    out = []
    for i in sorted(scatters):
        parts = fusion.scatter_parts(scatters[i])
        out += [outs[i].stride(parts.first + t) for t in range(len(parts.indices))]
    return out


def _alloc(node, shape, device, row_stride: int | None = None) -> torch.Tensor:
    """A pointwise output in the layout eager would give it (the dense layout its meta value has),
    or row-major with rows ``row_stride`` apart (``layout.py``)."""
    meta = fusion.value(node)
    if row_stride is not None and list(shape) == list(meta.shape):
        return torch.empty_strided(shape, layout.padded_strides(shape, row_stride), dtype=meta.dtype, device=device)
    order = layout.memory_order(meta) if meta.dim() == len(shape) else list(range(len(shape)))
    if sorted(order) != list(range(len(shape))) or meta.is_contiguous():
        return torch.empty(shape, dtype=meta.dtype, device=device)
    perm_shape = [shape[d] for d in order]
    t = torch.empty(perm_shape, dtype=meta.dtype, device=device)
    inverse = [order.index(d) for d in range(len(shape))]
    return t.permute(inverse)


def _alloc_rows(node, role: str, shape, device, out_row: int, symbols: SymbolValues) -> torch.Tensor:
    """A reduction group's output: full size with rows ``out_row`` apart, or one value per row
    (its meta shape, symbolic sizes evaluated)."""
    meta = fusion.value(node)
    if role == "full":
        return torch.empty_strided(shape, layout.padded_strides(shape, out_row), dtype=meta.dtype, device=device)
    return torch.empty(symbols.shape(meta.shape), dtype=meta.dtype, device=device)


def _in_row_order(t: torch.Tensor, lead: list[int]) -> bool:
    """``t`` holds one value per row, its dims the rows' dims in order with 1s anywhere: (N, 1, C)
    for rows (N, C). Such a value is a reshape of the rows, not a broadcast."""
    return t.numel() == math.prod(lead) and [s for s in t.shape if s != 1] == [s for s in lead if s != 1]


def _as_rows(t: torch.Tensor, load, group, shape, symbols: SymbolValues) -> torch.Tensor:
    """An input as a view of the full shape S: broadcast (full loads), or one value per row whose
    last-dim stride is 0 (row loads)."""
    if load.role == "full":
        return t.expand(shape)
    lead = list(shape[:-1])
    if _in_row_order(t, lead):
        return t.reshape(lead + [1]).expand(shape)
    if fusion.constant_along_rows(load.node):  # a scalar or size 1 in the last dim
        if t.dim() > len(shape):  # size-1 dims beyond the rows: an (N, C, 1, 1) gate, (N, C, H*W) rows
            t = t.reshape([]) if t.numel() == 1 else t.reshape(list(shape[:-1]) + [1])
        return t.expand(list(shape[:-1]) + [1]).expand(shape)
    users = [n for n in group.nodes if load.node in n.all_input_nodes and group.roles[n] == "row"]
    node_shape = list(symbols.shape(fusion.value(users[0]).shape)) if users else lead + [1]
    per_row = t.expand(node_shape).reshape(lead + [1])
    return per_row.expand(shape)


def run_reference(group, env: dict) -> None:
    """Run a group's nodes as ATen ops (plan mode, empty tensors)."""
    for n in group.nodes:
        env[n] = call_node(n, env)


def call_node(node: fx.Node, env: dict, target=None):
    args = fx.node.map_arg(node.args, lambda a: lookup(a, env))
    kwargs = fx.node.map_arg(node.kwargs, lambda a: lookup(a, env))
    return (target or node.target)(*args, **kwargs)


def lookup(node: fx.Node, env: dict):
    """A value. Constants are made only when an ATen op or the output needs them (kernels inline
    them): one fill of the folded value, whatever chain of ops computed it."""
    if node not in env and fusion.is_constant(node):
        meta = fusion.value(node)
        if fusion.target_name(node) in ops_table.CONSTANTS or not fusion.static_shape(meta):
            env[node] = call_node(node, env)
        else:
            env[node] = torch.full(tuple(meta.shape), fusion.constant_value(node), dtype=meta.dtype,
                                   device=meta.device)
    return env[node]


