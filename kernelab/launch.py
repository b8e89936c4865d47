"""Launching Triton kernels without Triton's per-call work, shared by ``kernelab.ops`` and the compiler.

``kernel[grid](*args, **constexprs)`` binds the arguments to the signature, computes their
specialization key, looks the binary up and builds the launcher's argument list, every call: tens
of microseconds of Python on a GPU host (15-20 us a launch on the H200's host, measured with
``benchmarks/compiler_overhead.py``), which is what a fused op's forward+backward step waits for
at sizes where its kernels run for a few hundred microseconds.

A launch binds to the compiled binary once. Later launches with the same keywords (constexprs,
warps, stages and Triton's other compile options) whose arguments specialize alike
(:func:`specialization`: the same dtypes, the same 16-byte alignment of every pointer, the same
integer classes; the same device) call the binary's launcher directly, with the argument list
Triton itself passes it (every argument in signature order, constexprs included; Triton >= 3.3).
The specialization key is computed by a small function generated per pattern of argument kinds
(tensor, int, float, bool, None), a few Python operations an argument; ``Launcher.prepare``
hashes the keywords once for callers that cache their launch settings per shape (``kernelab.ops``
does). Anything else takes Triton's ordinary path: the interpreter, a launch hook (a profiler such
as proton), ``KERNELAB_DIRECT_LAUNCH=0`` (read when a launch would bind: set it before the first
launch), :func:`triton_path` (tests and benchmarks), another Triton, a signature the launch does
not match, arguments of other kinds.

:class:`StaticLauncher` launches a binary through torch's precompiled launcher instead of Triton's
(the compiler's runner uses it): no gcc build of a C launcher at a new signature's first launch.
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch

from . import config

_I32 = (-(2**31), 2**31)
_U64 = 2**63  # Triton types a Python int as i32 in int32's range, u64 from 2^63, else i64


def specialization(arg):
    """What Triton specializes a launch argument on: a tensor on its dtype and 16-byte alignment,
    an integer on equality to 1, divisibility by 16 and its integer type (i32, i64 or u64 by
    range); None and booleans on their value; anything else (a float) on nothing."""
    if isinstance(arg, torch.Tensor):
        return (arg.dtype, arg.data_ptr() % 16 == 0)
    if isinstance(arg, bool) or arg is None:
        return (arg,)
    if isinstance(arg, int):
        return (arg == 1, arg % 16 == 0, _I32[0] <= arg < _I32[1], arg >= _U64)
    return None


def hooked(hook) -> bool:
    """A launch hook is installed (a profiler such as proton): Triton >= 3.6 keeps an empty
    HookChain where older versions keep None."""
    return hook is not None and bool(getattr(hook, "calls", True))


def enabled() -> bool:
    """Direct launches are on (``KERNELAB_DIRECT_LAUNCH=0`` turns them off)."""
    return config.direct_launch()


_direct = True  # False inside triton_path()


@contextlib.contextmanager
def triton_path():
    """Every :class:`Launcher` launch inside takes Triton's ordinary path, bound or not (tests and
    benchmarks compare the two paths in one process)."""
    global _direct
    held, _direct = _direct, False
    try:
        yield
    finally:
        _direct = held


@functools.lru_cache(maxsize=None)
def _triton_supported() -> bool:
    import triton

    return tuple(int(p) for p in triton.__version__.split(".")[:2]) >= (3, 3)


def _current_device() -> int:
    """The device Triton launches on: the current CUDA device (not the tensors'). Asked only
    where a launch has CUDA tensors, so CUDA is initialized: torch's C++ getter, without
    ``torch.cuda.current_device``'s Python."""
    return _get_device()


_get_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


def _stream_function():
    """``device index -> the current stream's handle``, as Triton's driver gets it (torch's
    ``_cuda_getCurrentRawStream``), resolved once per binding rather than per launch."""
    from triton.runtime.driver import driver

    return driver.active.get_current_stream


def current_stream(device: int):
    """The current stream's raw handle on ``device``, as Triton's launcher gets it (``teams.py``
    keys its buffers by it, the compiler its column counters): torch's raw-handle call directly,
    which costs much less than a Stream object or an import per call (a hot path)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(device) if raw is not None else _stream_function()(device)


def _runtime_knobs():
    """Triton's runtime knobs (where the launch hooks live)."""
    from triton import knobs

    return knobs.runtime


def hooks_set() -> bool:
    """Triton's launch hooks are installed (a profiler): launches must take Triton's own path."""
    runtime = _runtime_knobs()
    return hooked(runtime.launch_enter_hook) or hooked(runtime.launch_exit_hook)


def _cuda_index(args) -> int | None:
    """The CUDA device of the launch's first tensor argument; None when it is not on CUDA (then
    Triton's path decides)."""
    index = next((a.get_device() for a in args if isinstance(a, torch.Tensor)), -1)
    return index if index >= 0 else None


def _device_guard(index: int):
    return torch.cuda.device(index)


# ---------------------------------------------------------------------------------------------
# specialization keys, one generated function per pattern of argument kinds


def _kind(arg) -> str | None:
    """T(ensor), I(nt), F(loat), B(ool), N(one), or None: a kind the direct path does not take."""
    if isinstance(arg, torch.Tensor):
        return "T"
    return {int: "I", float: "F", bool: "B", type(None): "N"}.get(type(arg))


def _int_class(a):
    """An int's specialization apart from the common cases (0 <= a < 2^31): its type (a bool or a
    numpy integer is not an int to Triton), == 1, divisibility by 16, i32 / i64 / u64."""
    return (a.__class__, a == 1, a & 15 == 0, _I32[0] <= a < _I32[1], a >= _U64)


#: How each kind enters the key (``{a}`` is the argument). A tensor: dtype and 16-byte alignment
#: (anything without them raises: the caller then takes Triton's path). An int of type int between
#: 2 and 2^31: divisibility by 16 alone (True / False); 0 and 1 (unit strides): -1 and -2; any
#: other: ``_int_class`` (a tuple). Floats and bools: their type (Triton does not specialize their
#: values). None: being None.
_KEY_PARTS = {
    "T": "{a}.dtype, {a}.data_ptr() & 15 == 0",
    "I": ("({a} & 15 == 0 if 1 < {a} < 2147483648 else -1 - {a} if 0 <= {a} <= 1 else _int_class({a})) "
          "if {a}.__class__ is int else _int_class({a})"),
    "F": "{a}.__class__",
    "B": "{a}.__class__",
    "N": "{a} is None",
}


@functools.lru_cache(maxsize=None)
def _key_function(pattern: str):
    """``key(*args)`` for arguments of these kinds: the first tensor's device, then each argument's
    part of its specialization (``_KEY_PARTS``). Generated once per pattern (as Triton generates
    its binder): no loop and no type dispatch per launch."""
    names = [f"a{i}" for i in range(len(pattern))]
    first = names[pattern.index("T")]
    parts = [f"{first}.get_device()"] + [
        f"({_KEY_PARTS[k].format(a=a)})" if k == "I" else _KEY_PARTS[k].format(a=a) for a, k in zip(names, pattern)
    ]
    source = f"def key({', '.join(names)}):\n    return ({', '.join(parts)},)\n"
    scope = {"_int_class": _int_class}
    exec(compile(source, f"<kernelab.launch key {pattern}>", "exec"), scope)  # noqa: S102 - our own source
    return scope["key"]


def _pattern(args) -> str | None:
    """The kinds of ``args`` as a string ("TTNII..."), None when one is of no known kind or no
    argument is a tensor (the device comes from the first tensor)."""
    kinds = [_kind(a) for a in args]
    if None in kinds or "T" not in kinds:
        return None
    return "".join(kinds)


class _Site:
    """The launches of one kernel with one set of keywords and one pattern of argument kinds: the
    key function and the binaries bound so far, by key."""

    __slots__ = ("pattern", "key", "bound")

    def __init__(self, pattern: str):
        self.pattern, self.key, self.bound = pattern, _key_function(pattern), {}


class _Bound:
    """A binary bound for direct launches: its launcher, handles, constexpr tail and stream getter."""

    __slots__ = ("compiled", "run", "function", "metadata", "tail", "device", "stream")

    def __init__(self, compiled, tail: tuple, device: int, stream):
        self.compiled, self.run, self.tail, self.device, self.stream = compiled, compiled.run, tail, device, stream
        self.function, self.metadata = compiled.function, compiled.packed_metadata


class _Slot:
    """One set of keywords of a kernel: the :class:`_Site` of the latest pattern of arguments
    launched with them (None until a launch binds)."""

    __slots__ = ("site",)

    def __init__(self):
        self.site = None


class Launcher:
    """``Launcher(kernel)(grid, *args, num_warps=w, **keywords)`` does what
    ``kernel[grid](*args, num_warps=w, **keywords)`` does.

    ``args`` are the kernel's leading, non-constexpr parameters in order; the keywords name every
    remaining parameter (constexprs) and any of Triton's compile options (``num_warps``,
    ``num_stages``, ``num_ctas``, ``maxnreg``, ...; ``maxnreg=None`` means none). One site per
    keywords (and pattern of argument kinds), one binding per specialization key within it: the
    first launch of a key goes through Triton (compiling if needed) and binds its binary.
    ``prepare(**keywords)`` hashes the keywords once, for callers that keep their launch settings.
    """

    def __init__(self, kernel, interpreted: bool):
        self.kernel = kernel
        self.interpreted = interpreted
        self.slots: dict = {}  # keywords (as a tuple of items) -> _Slot
        self.patterns: dict = {}  # (keywords, pattern) -> _Site
        self.runtime = None  # Triton's runtime knobs, once a launch bound

    def prepare(self, **keywords) -> "Prepared":
        """``prepare(**keywords)(grid, *args)`` does what ``self(grid, *args, **keywords)`` does."""
        return Prepared(self, self._slot(tuple(keywords.items())), keywords)

    def __call__(self, grid, *args, **keywords):
        try:
            slot = self.slots[tuple(keywords.items())]
        except (KeyError, TypeError):  # no launch with these keywords bound yet, or unhashable ones
            return self._launch(grid, args, keywords)
        return self._run(slot, grid, args, keywords)

    def _run(self, slot: _Slot, grid, args: tuple, keywords: dict):
        """The direct launch when the arguments' key has a binding on the current device and no
        launch hook is set; else :meth:`_launch`."""
        site = slot.site
        try:
            bound = site.bound.get(site.key(*args))
            n = len(grid)  # a tuple (a callable grid takes Triton's path)
        except (AttributeError, TypeError, RuntimeError):  # nothing bound, an argument of another kind
            bound = None
        if bound and _direct and bound.device == _current_device():
            runtime = self.runtime
            if not (hooked(runtime.launch_enter_hook) or hooked(runtime.launch_exit_hook)):
                return self._direct(bound, grid, n, args)
        return self._launch(grid, args, keywords, slot)

    @staticmethod
    def _direct(bound: _Bound, grid, n: int, args: tuple):
        """Call the bound binary's launcher as Triton does: grid padded to 3 dims, the current
        stream, no launch metadata or hooks, every argument then the constexprs."""
        bound.run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, bound.stream(bound.device),
                  bound.function, bound.metadata, None, None, None, *args, *bound.tail)
        return bound.compiled

    def _slot(self, name: tuple) -> _Slot:
        slot = self.slots.get(name)
        if slot is None:
            slot = self.slots[name] = _Slot()
        return slot

    def _hooked(self) -> bool:
        runtime = self.runtime
        return hooked(runtime.launch_enter_hook) or hooked(runtime.launch_exit_hook)

    def _launch(self, grid, args: tuple, keywords: dict, slot: _Slot | None = None):
        """Everything but the common direct launch: under the tensors' device; the binding of
        another pattern of arguments (the slot then follows it); else Triton's path, binding its
        binary where this launch allows."""
        index = None if self.interpreted else _cuda_index(args)
        if index is not None and index != _current_device():
            # Triton launches on the current device: make it the tensors' (a model on cuda:1
            # called while cuda:0 is current would otherwise launch on the wrong GPU)
            with _device_guard(index):
                return self(grid, *args, **keywords)
        site = self._site(args, keywords, slot) if index is not None else None
        if site is None:
            return self._triton(grid, args, keywords)
        key = site.key(*args)
        bound = site.bound.get(key)
        if bound and _direct and isinstance(grid, (tuple, list)):
            return self._direct(bound, grid, len(grid), args)
        compiled = self._triton(grid, args, keywords)
        if key not in site.bound:  # the first launch of this specialization: bind
            site.bound[key] = self._bind(compiled, len(args), keywords, index)
        return compiled

    def _site(self, args: tuple, keywords: dict, slot: _Slot | None) -> _Site | None:
        """The site of these keywords and the arguments' pattern (made the slot's), or None where
        no launch may bind: direct launches off, another Triton, a launch hook, an argument of a
        kind no key takes, an unhashable keyword."""
        if not enabled() or not _triton_supported():
            return None
        if self.runtime is None:
            self.runtime = _runtime_knobs()
        pattern = _pattern(args)
        if pattern is None or self._hooked():
            return None
        name = tuple(keywords.items())
        try:
            site = self.patterns.get((name, pattern))
            slot = slot or self._slot(name)
        except TypeError:  # an unhashable keyword value
            return None
        if site is None:
            site = self.patterns[(name, pattern)] = _Site(pattern)
        slot.site = site
        return site

    def _triton(self, grid, args, keywords: dict):
        """Triton's own path. maxnreg (a register cap for ptxas) is a compile option, which the
        interpreter does not take."""
        if "maxnreg" in keywords and (keywords["maxnreg"] is None or self.interpreted):
            keywords = {k: v for k, v in keywords.items() if k != "maxnreg"}
        return self.kernel[grid](*args, **keywords)

    def _bind(self, compiled, n_args: int, keywords: dict, device: int):
        """A :class:`_Bound`, or False where the signature is not (args..., constexprs...) as this
        launcher assumes (a parameter left to its default, say): those launches keep Triton's path.
        Keywords that name no parameter are compile options, decided by the site."""
        names = list(self.kernel.arg_names)
        rest = names[n_args:]
        if sorted(rest) != sorted(k for k in keywords if k in names):
            return False
        try:
            if hasattr(compiled, "result"):  # an asynchronous compile's future
                compiled = compiled.result()
            compiled._init_handles()
            return _Bound(compiled, tuple(keywords[n] for n in rest), device, _stream_function())
        except Exception:  # noqa: BLE001 - another Triton: its ordinary path still works
            return False


class Prepared:
    """A launcher with one set of keywords (:meth:`Launcher.prepare`): ``prepared(grid, *args)``."""

    __slots__ = ("launcher", "slot", "keywords")

    def __init__(self, launcher: Launcher, slot: _Slot, keywords: dict):
        self.launcher, self.slot, self.keywords = launcher, slot, keywords

    def __call__(self, grid, *args):
        return self.launcher._run(self.slot, grid, args, self.keywords)


# ---------------------------------------------------------------------------------------------
# torch's precompiled launcher


@functools.lru_cache(maxsize=1)
def _static_launcher_class():
    """torch's ``StaticallyLaunchedCudaKernel`` (what Inductor launches Triton binaries with), or
    None: its module was renamed between torch versions, and CPU builds have no CUDA launcher."""
    import importlib

    if not config.static_launch() or not hasattr(torch._C, "_StaticCudaLauncher"):
        return None
    for name in ("torch._inductor.runtime.static_triton_launcher", "torch._inductor.runtime.static_cuda_launcher"):
        try:
            return importlib.import_module(name).StaticallyLaunchedCudaKernel
        except (ImportError, AttributeError):
            continue
    return None


class StaticLauncher:
    """A Triton binary launched through ``torch._C._StaticCudaLauncher``: a C++ launcher compiled
    into torch, so the binary's first launch builds nothing. Triton <= 3.6 writes and compiles (gcc)
    a C launcher for every new argument signature instead, 0.17-0.20 s on the H200's host.

    torch's own wrapper class loads the binary (it knows this torch's loader and the binary's extra
    scratch parameters); launches call the C++ entry with the runtime arguments: the positional
    arguments whose parameter the binary did not specialize into a constant."""

    __slots__ = ("owner", "function", "num_warps", "shared", "arg_types", "keep", "extra", "entry")

    @classmethod
    def bind(cls, compiled, device_index: int, n_args: int, cubin_dir: str) -> "StaticLauncher | None":
        kernel_class = _static_launcher_class()
        if kernel_class is None:
            return None
        try:
            return cls(compiled, kernel_class, device_index, n_args, cubin_dir)
        except Exception:  # noqa: BLE001 - shared memory, hooks, scratch it does not take: Triton's launcher
            return None

    def __init__(self, compiled, kernel_class, device_index: int, n_args: int, cubin_dir: str):
        compiled._cubin_path = _write_cubin(compiled, cubin_dir)
        loaded = kernel_class(compiled)
        try:
            loaded.load_kernel(device_index)
        except TypeError:  # older torch: the current device
            loaded.load_kernel()
        src = compiled.src
        names = list(src.fn.arg_names)

        def position(key) -> int:
            return names.index(key) if isinstance(key, str) else key[0] if isinstance(key, tuple) else key

        signature = {position(k): v for k, v in src.signature.items()}
        constants = {position(k) for k in getattr(src, "constants", {})}
        keep = tuple(i for i in sorted(signature) if signature[i] != "constexpr" and i not in constants)
        if not keep or len(keep) != len(loaded.arg_tys) or keep[-1] >= n_args:
            raise ValueError("the binary's runtime parameters are not the launch's positional arguments")
        self.extra = (None,) * (bool(getattr(loaded, "has_global_scratch", False))
                                + bool(getattr(loaded, "has_profile_scratch", False)))
        self.arg_types = loaded.arg_tys + "O" * len(self.extra)
        self.owner = loaded  # holds the loaded module: torch's class unloads it when collected
        self.function, self.num_warps, self.shared, self.keep = loaded.function, loaded.num_warps, loaded.shared, keep
        self.entry = torch._C._StaticCudaLauncher._launch_kernel

    def runtime_tail(self, leading: int, tail: tuple) -> "tuple | None":
        """What :meth:`launch` passes after the first ``leading`` arguments (tensors) for a launch
        whose other arguments never change (``tail``): the ones the binary takes at run time, its
        scratch placeholders appended; computed once, so that a caller may call :attr:`entry`
        itself with ``(*tensors, *runtime_tail)`` (the compiler's specialized runner: no argument
        filtering a launch, where Triton made an argument of 1, such as an innermost stride, a
        constant). None where the binary made one of the leading arguments a constant."""
        keep = self.keep
        if keep[:leading] != tuple(range(leading)) or len(tail) + leading <= keep[-1]:
            return None
        return tuple(tail[i - leading] for i in keep[leading:]) + self.extra

    def launch(self, grid: tuple, stream: int, args: tuple) -> None:
        keep = self.keep
        runtime = (args[:len(keep)] if keep[-1] == len(keep) - 1 else tuple([args[i] for i in keep])) + self.extra
        self.entry(self.function, grid[0], grid[1], grid[2], self.num_warps, self.shared, self.arg_types,
                   runtime, stream)


def _write_cubin(compiled, cubin_dir: str) -> str:
    """The binary's cubin as a file (torch's loader reads a path), named by Triton's hash."""
    path = os.path.join(cubin_dir, f"{compiled.hash}.cubin")
    if not os.path.exists(path):
        os.makedirs(cubin_dir, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as fh:
            fh.write(compiled.asm["cubin"])
        os.replace(tmp, path)
    return path
