"""Launching Triton kernels without Triton's per-call work, shared by ``kernelab.ops`` and the compiler.

``kernel[grid](*args, **constexprs)`` binds the arguments to the signature, computes their
specialization key, looks the binary up and builds the launcher's argument list, every call: tens
of microseconds of Python on a GPU host (15-20 us a launch on the H200's host, measured with
``benchmarks/compiler_overhead.py``), which is what a fused op's forward+backward step waits for
at sizes where its kernels run for a few hundred microseconds.

A launch binds to the compiled binary once. Later launches whose arguments specialize alike
(:func:`specialization`: the same dtypes, the same 16-byte alignment of every pointer, the same
integer classes) and whose constexprs and warps are the same call the binary's launcher directly,
with the argument list Triton itself passes it (every argument in signature order, constexprs
included; Triton >= 3.3). Anything else takes Triton's ordinary path: the interpreter, a launch
hook (a profiler such as proton), ``KERNELAB_DIRECT_LAUNCH=0``, another Triton.

:class:`StaticLauncher` launches a binary through torch's precompiled launcher instead of Triton's
(the compiler's runner uses it): no gcc build of a C launcher at a new signature's first launch.
"""

from __future__ import annotations

import functools
import os

import torch

_I32 = (-(2**31), 2**31)


def specialization(arg):
    """What Triton specializes a launch argument on: a tensor on its dtype and 16-byte alignment,
    an integer on equality to 1, divisibility by 16 and its integer type (i32, u32 or i64 by
    range); None and booleans on their value; anything else (a float) on nothing."""
    if isinstance(arg, torch.Tensor):
        return (arg.dtype, arg.data_ptr() % 16 == 0)
    if isinstance(arg, bool) or arg is None:
        return (arg,)
    if isinstance(arg, int):
        return (arg == 1, arg % 16 == 0, _I32[0] <= arg < _I32[1], arg < 2**32)
    return None


def hooked(hook) -> bool:
    """A launch hook is installed (a profiler such as proton): Triton >= 3.6 keeps an empty
    HookChain where older versions keep None."""
    return hook is not None and bool(getattr(hook, "calls", True))


def enabled() -> bool:
    """Direct launches are on (``KERNELAB_DIRECT_LAUNCH=0`` turns them off)."""
    return os.environ.get("KERNELAB_DIRECT_LAUNCH", "1") != "0"


@functools.lru_cache(maxsize=None)
def _triton_supported() -> bool:
    import triton

    return tuple(int(p) for p in triton.__version__.split(".")[:2]) >= (3, 3)


def _current_device() -> int:
    """The device Triton launches on: the current CUDA device (not the tensors')."""
    return torch.cuda.current_device()


def _current_stream(device: int):
    from triton.runtime.driver import driver

    return driver.active.get_current_stream(device)


def _cuda_index(args) -> int | None:
    """The CUDA device of the launch's first tensor argument; None when it is not on CUDA (then
    Triton's path decides)."""
    index = next((a.get_device() for a in args if isinstance(a, torch.Tensor)), -1)
    return index if index >= 0 else None


def _device_guard(index: int):
    return torch.cuda.device(index)


class Launcher:
    """``Launcher(kernel)(grid, *args, num_warps=w, **constexprs)`` does what
    ``kernel[grid](*args, num_warps=w, **constexprs)`` does.

    ``args`` are the kernel's leading, non-constexpr parameters in order; ``constexprs`` name every
    remaining one. One entry per (argument specialization, constexprs, warps, device): the first
    launch of an entry goes through Triton (compiling if needed) and binds its binary.
    """

    def __init__(self, kernel, interpreted: bool):
        self.kernel = kernel
        self.interpreted = interpreted
        self.bound: dict = {}

    def __call__(self, grid, *args, num_warps: int, maxnreg: int | None = None, **constexprs):
        index = None if self.interpreted else _cuda_index(args)
        if index is not None and index != _current_device():
            # Triton launches on the current device: make it the tensors' (a model on cuda:1
            # called while cuda:0 is current would otherwise launch on the wrong GPU)
            with _device_guard(index):
                return self(grid, *args, num_warps=num_warps, maxnreg=maxnreg, **constexprs)
        if self.interpreted or not enabled() or not _triton_supported() or index is None:
            return self._triton(grid, args, num_warps, maxnreg, constexprs)
        from triton import knobs

        runtime = knobs.runtime
        if hooked(runtime.launch_enter_hook) or hooked(runtime.launch_exit_hook):
            return self._triton(grid, args, num_warps, maxnreg, constexprs)
        device = index  # the current device, by the guard above
        key = (tuple(specialization(a) for a in args), tuple(constexprs.items()), num_warps, maxnreg, device)
        entry = self.bound.get(key)
        if entry is None:
            compiled = self._triton(grid, args, num_warps, maxnreg, constexprs)
            self.bound[key] = self._bind(compiled, len(args), constexprs)
            return compiled
        if entry is False:
            return self._triton(grid, args, num_warps, maxnreg, constexprs)
        compiled, tail = entry
        grid = tuple(grid) + (1,) * (3 - len(grid))
        compiled.run(grid[0], grid[1], grid[2], _current_stream(device), compiled.function,
                     compiled.packed_metadata, None, None, None, *args, *tail)
        return compiled

    def _triton(self, grid, args, num_warps: int, maxnreg: int | None, constexprs: dict):
        """Triton's own path. maxnreg (a register cap for ptxas) is a compile option, which the
        interpreter does not take."""
        if maxnreg is None or self.interpreted:
            return self.kernel[grid](*args, num_warps=num_warps, **constexprs)
        return self.kernel[grid](*args, num_warps=num_warps, maxnreg=maxnreg, **constexprs)

    def _bind(self, compiled, n_args: int, constexprs: dict):
        """(binary, constexpr values in signature order), or False where the signature is not
        (args..., constexprs...) as this launcher assumes: those launches keep Triton's path."""
        rest = list(self.kernel.arg_names)[n_args:]
        if sorted(rest) != sorted(constexprs):
            return False
        try:
            if hasattr(compiled, "result"):  # an asynchronous compile's future
                compiled = compiled.result()
            compiled._init_handles()
        except Exception:  # noqa: BLE001 - another Triton: its ordinary path still works
            return False
        return compiled, tuple(constexprs[n] for n in rest)


# ---------------------------------------------------------------------------------------------
# torch's precompiled launcher


@functools.lru_cache(maxsize=1)
def _static_launcher_class():
    """torch's ``StaticallyLaunchedCudaKernel`` (what Inductor launches Triton binaries with), or
    None: its module was renamed between torch versions, and CPU builds have no CUDA launcher."""
    import importlib

    if os.environ.get("KERNELAB_STATIC_LAUNCH", "1") == "0" or not hasattr(torch._C, "_StaticCudaLauncher"):
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
