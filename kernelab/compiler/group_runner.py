"""One group's kernel at run time: generate, import, specialize per shape, launch.

Nothing about sizes is baked into a kernel. At each launch the runner looks at the actual tensors
and asks the group's template (``templates/``: one module per group kind) for the launch: it
merges the dims every operand walks alike (a contiguous add becomes 1-D whatever its rank), picks
the variant (rank after merging; persistent or looped rows) and the launch parameters (block
sizes, warps, int32 or int64 offsets). The runner caches that launch per shape key: a new shape is
a new cache entry, never a recompilation guard. Triton specializes what it always does: pointers
on 16-byte alignment, integers on divisibility by 16 and on equality to 1 (a unit stride).
"""
from __future__ import annotations

import functools
import os
import sys
import time
import warnings
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from .. import config
from ..errors import KernelabFallbackWarning
from ..launch import StaticLauncher, enabled as launch_enabled, hooked, specialization
from ..report import debug_level
from . import emit, fusion, ops_table
from .eventlog import record_fallback, record_launch, record_reuse
from .kcache import cache_dir, kernel_module
from .templates import kernel_source, template
from .templates.base import Call
from .tiling import DEFAULT as DEFAULT_TILING, Tiling

__all__ = ["SymbolValues", "GroupRunner", "FastLaunch", "run_reference", "call_node", "lookup", "interpreted",
           "bound_launch"]

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
# launching without Triton's per-call work


#: how many references hold a storage (tensors and views over it, storage objects, saved copies)
_storage_use_count = torch._C._storage_Use_Count


def _specialization_key(varying) -> tuple:
    """What selects the binary among a cached call's varying arguments: a tensor's 16-byte alignment
    (its dtype is fixed for the graph), a scalar's :func:`specialization`."""
    return tuple([a.data_ptr() % 16 == 0 if isinstance(a, torch.Tensor) else specialization(a) for a in varying])


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
            source = kernel_source(self.group, rank, persistent)
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
        stored, and nowhere else (the template's ``reads_before_it_stores``: a pointwise kernel, or
        a row reduction storing its full-size outputs in its last pass over the row); an input read
        once, as a whole ("full"), never gathered from; an output of its dtype and shape, not a
        scatter's buffer, not stored into a graph input. Layouts are checked per call
        (``reuse_for_call``): a padded output (rows a
        product reads) over an input padded alike (a padded product saved for the backward, as
        ``layout.visible`` leaves it), the padding never written."""
        g = self.group
        if not inputs or not template(g.kind).reads_before_it_stores(g):
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

    def reuse_for_call(self, raw, ins, outs) -> tuple:
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
        call = template(self.group.kind).prepare(self, moved, shape, device)
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


