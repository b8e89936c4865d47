"""kernelab.launch: direct launches bound to a compiled binary, with Triton's path as the fallback.

No GPU here: a fake kernel stands in for a JITFunction (``kernel[grid](...)`` records the call and
returns a fake binary whose ``run`` records the direct launches), and the CUDA-only lookups
(device, stream, tensors on CUDA) are patched.
"""

import pytest
import torch

from kernelab import launch as L


class FakeBinary:
    def __init__(self):
        self.runs = []
        self.function, self.packed_metadata = "fn", "meta"

    def _init_handles(self):
        pass

    def run(self, *args):
        self.runs.append(args)


class FakeKernel:
    arg_names = ["x_ptr", "y_ptr", "n", "eps", "BLOCK", "FLAG"]

    def __init__(self):
        self.triton_calls = []
        self.binary = FakeBinary()

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.triton_calls.append((grid, args, kwargs))
            return self.binary

        return run


@pytest.fixture
def cuda_free(monkeypatch):
    monkeypatch.setattr(L, "_cuda_index", lambda args: 0)
    monkeypatch.setattr(L, "_current_device", lambda: 0)
    monkeypatch.setattr(L, "_stream_function", lambda: lambda device: f"stream{device}")
    monkeypatch.delenv("KERNELAB_DIRECT_LAUNCH", raising=False)


def _args(n=4096, offset=0):
    x = torch.zeros(64)[offset:]
    return x, torch.zeros(64), n, 1e-5


def test_specialization_is_what_triton_specializes_on():
    x = torch.zeros(8)
    assert L.specialization(x) == (torch.float32, True)
    assert L.specialization(x[1:]) == (torch.float32, False)  # 4 bytes past a 16-byte boundary
    assert L.specialization(x.half()) != L.specialization(x)
    assert L.specialization(1) != L.specialization(2)        # == 1 is specialized away
    assert L.specialization(32) != L.specialization(33)      # divisibility by 16
    assert L.specialization(2**31 + 16) != L.specialization(16)  # i32 -> u32 / i64
    assert L.specialization(2**63 + 16) != L.specialization(2**31 + 16)  # i64 -> u64
    assert L.specialization(None) != L.specialization(False)
    assert L.specialization(1.5) is None


def test_second_launch_calls_the_binary_with_constexprs_in_signature_order(cuda_free):
    kernel = FakeKernel()
    launcher = L.Launcher(kernel, interpreted=False)
    launcher((8,), *_args(), num_warps=4, FLAG=True, BLOCK=256)
    assert len(kernel.triton_calls) == 1 and not kernel.binary.runs
    args = _args()
    launcher((8,), *args, num_warps=4, FLAG=True, BLOCK=256)
    assert len(kernel.triton_calls) == 1
    (run,) = kernel.binary.runs
    assert run[:7] == (8, 1, 1, "stream0", "fn", "meta", None)
    assert run[9:] == (*args, 256, True)  # BLOCK, FLAG: the signature's order, not the call's


def test_other_specializations_take_the_triton_path_and_bind_their_own(cuda_free):
    kernel = FakeKernel()
    launcher = L.Launcher(kernel, interpreted=False)
    launcher((8,), *_args(), num_warps=4, BLOCK=256, FLAG=True)
    launcher((8,), *_args(offset=1), num_warps=4, BLOCK=256, FLAG=True)   # misaligned pointer
    launcher((8,), *_args(n=4097), num_warps=4, BLOCK=256, FLAG=True)     # n not divisible by 16
    launcher((8,), *_args(), num_warps=8, BLOCK=256, FLAG=True)           # other warps
    launcher((8,), *_args(), num_warps=4, BLOCK=512, FLAG=True)           # other constexpr
    assert len(kernel.triton_calls) == 5 and not kernel.binary.runs
    launcher((8,), *_args(offset=1), num_warps=4, BLOCK=256, FLAG=True)
    assert len(kernel.binary.runs) == 1


def test_interpreter_switch_and_hooks_take_the_triton_path(cuda_free, monkeypatch):
    kernel = FakeKernel()
    L.Launcher(kernel, interpreted=True)((8,), *_args(), num_warps=4, BLOCK=256, FLAG=True)
    L.Launcher(kernel, interpreted=True)((8,), *_args(), num_warps=4, BLOCK=256, FLAG=True)
    assert len(kernel.triton_calls) == 2 and not kernel.binary.runs

    monkeypatch.setenv("KERNELAB_DIRECT_LAUNCH", "0")
    launcher = L.Launcher(kernel, interpreted=False)
    for _ in range(2):
        launcher((8,), *_args(), num_warps=4, BLOCK=256, FLAG=True)
    assert len(kernel.triton_calls) == 4 and not kernel.binary.runs

    monkeypatch.delenv("KERNELAB_DIRECT_LAUNCH")
    from triton import knobs

    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda *a: None)
    for _ in range(2):
        launcher((8,), *_args(), num_warps=4, BLOCK=256, FLAG=True)
    assert len(kernel.triton_calls) == 6 and not kernel.binary.runs


def test_a_signature_it_does_not_understand_keeps_the_triton_path(cuda_free):
    kernel = FakeKernel()
    launcher = L.Launcher(kernel, interpreted=False)
    for _ in range(3):  # FLAG missing from the constexprs: Triton's default would apply
        launcher((8,), *_args(), num_warps=4, BLOCK=256)
    assert len(kernel.triton_calls) == 3 and not kernel.binary.runs


def test_cpu_tensors_take_the_triton_path(monkeypatch):
    kernel = FakeKernel()
    launcher = L.Launcher(kernel, interpreted=False)
    for _ in range(2):
        launcher((8,), *_args(), num_warps=4, BLOCK=256, FLAG=True)
    assert len(kernel.triton_calls) == 2


def test_tensors_on_another_device_launch_under_its_guard(cuda_free, monkeypatch):
    """Triton launches on the current device: a launch whose tensors sit on cuda:1 while cuda:0 is
    current runs with cuda:1 made current, and binds its own binary and stream there."""
    current = [0]
    entered = []

    class Guard:
        def __init__(self, index):
            self.index = index

        def __enter__(self):
            entered.append(self.index)
            current.insert(0, self.index)

        def __exit__(self, *exc):
            current.pop(0)

    monkeypatch.setattr(L, "_cuda_index", lambda args: 1)
    monkeypatch.setattr(L, "_current_device", lambda: current[0])
    monkeypatch.setattr(L, "_device_guard", Guard)
    kernel = FakeKernel()
    launcher = L.Launcher(kernel, interpreted=False)
    launcher((8,), *_args(), num_warps=4, FLAG=True, BLOCK=256)
    launcher((8,), *_args(), num_warps=4, FLAG=True, BLOCK=256)
    assert entered == [1, 1] and current == [0]
    (run,) = kernel.binary.runs
    assert run[3] == "stream1"  # the stream of the tensors' device
    assert all(bound.device == 1 for slot in launcher.slots.values() for bound in slot.site.bound.values())


def test_cuda_index_of_cpu_tensors_is_none():
    assert L._cuda_index((torch.zeros(2), 3)) is None
    assert L._cuda_index((5, None)) is None


# ------------------------------------------------------------------ torch's precompiled launcher


class FakeSource:
    """Triton's ASTSource of a kernel (x_ptr, y_ptr, n, one, eps, BLOCK): ``one`` was specialized to
    the constant 1 at the first launch and BLOCK is a constexpr."""

    class fn:
        arg_names = ["x_ptr", "y_ptr", "n", "one", "eps", "BLOCK"]

    signature = {"x_ptr": "*fp32", "y_ptr": "*bf16", "n": "i32", "one": "constexpr", "eps": "fp32",
                 "BLOCK": "constexpr"}
    constants = {(3,): 1, (5,): 1024}


class FakeCompiled:
    hash = "abc123"
    asm = {"cubin": b"\x7fELF fake cubin"}
    src = FakeSource


class FakeTorchKernel:
    """torch's StaticallyLaunchedCudaKernel: reads the cubin path, loads, knows its arg types."""

    def __init__(self, compiled, scratch=True):
        self.path = compiled._cubin_path
        self.arg_tys = "OOif"
        self.has_global_scratch = scratch
        self.function, self.num_warps, self.shared = 77, 4, 0
        self.loaded_on = None

    def load_kernel(self, device):
        self.loaded_on = device


def test_static_launcher_passes_runtime_arguments_and_scratch(tmp_path, monkeypatch):
    launched = []

    class Entry:
        @staticmethod
        def _launch_kernel(*args):
            launched.append(args)

    monkeypatch.setattr(torch._C, "_StaticCudaLauncher", Entry, raising=False)
    static = L.StaticLauncher(FakeCompiled(), FakeTorchKernel, 0, 5, str(tmp_path / "cubin"))
    assert static.owner.loaded_on == 0
    assert open(static.owner.path, "rb").read() == FakeCompiled.asm["cubin"]
    x, y = torch.zeros(4), torch.zeros(4, dtype=torch.bfloat16)
    static.launch((3, 1, 1), 1234, (x, y, 4096, 1, 0.5))
    (call,) = launched
    assert call[:7] == (77, 3, 1, 1, 4, 0, "OOifO")  # one scratch pointer added
    assert call[7][0] is x and call[7][1] is y and call[7][2:] == (4096, 0.5, None) and call[8] == 1234


def test_static_launcher_refuses_a_signature_it_cannot_map(tmp_path, monkeypatch):
    monkeypatch.setattr(torch._C, "_StaticCudaLauncher", object, raising=False)

    class Wrong(FakeTorchKernel):
        def __init__(self, compiled):
            super().__init__(compiled)
            self.arg_tys = "OOi"  # the binary takes fewer runtime arguments than the signature says

    with pytest.raises(ValueError):
        L.StaticLauncher(FakeCompiled(), Wrong, 0, 5, str(tmp_path))
    # bind() turns every such failure into None: Triton's own launcher is used
    monkeypatch.setattr(L, "_static_launcher_class", lambda: Wrong)
    assert L.StaticLauncher.bind(FakeCompiled(), 0, 5, str(tmp_path)) is None
    monkeypatch.setattr(L, "_static_launcher_class", lambda: None)
    assert L.StaticLauncher.bind(FakeCompiled(), 0, 5, str(tmp_path)) is None


def test_static_launcher_switch_and_cpu_build(monkeypatch):
    L._static_launcher_class.cache_clear()
    monkeypatch.setenv("KERNELAB_STATIC_LAUNCH", "0")
    try:
        assert L._static_launcher_class() is None
    finally:
        L._static_launcher_class.cache_clear()


# ------------------------------------------------------------------ keys, options, prepared launches


def test_compile_options_bind_and_stay_out_of_the_constexpr_tail(cuda_free):
    """num_stages (every GEMM config passes it), num_ctas, maxnreg: keywords that name no parameter
    are Triton's compile options; the launch binds all the same, and they are not passed as
    arguments. maxnreg=None is dropped on Triton's path (Triton has no such value)."""
    kernel = FakeKernel()
    launcher = L.Launcher(kernel, interpreted=False)
    args = _args()
    for _ in range(2):
        launcher((8,), *args, num_warps=4, num_stages=3, num_ctas=1, maxnreg=None, BLOCK=256, FLAG=True)
    assert len(kernel.triton_calls) == 1
    assert kernel.triton_calls[0][2] == dict(num_warps=4, num_stages=3, num_ctas=1, BLOCK=256, FLAG=True)
    (run,) = kernel.binary.runs
    assert run[9:] == (*args, 256, True)
    launcher((8,), *args, num_warps=4, num_stages=4, num_ctas=1, maxnreg=None, BLOCK=256, FLAG=True)
    assert len(kernel.triton_calls) == 2  # another stage count: another binary, Triton's path first


def test_prepared_launch_is_the_keyword_launch(cuda_free):
    kernel = FakeKernel()
    launcher = L.Launcher(kernel, interpreted=False)
    prepared = launcher.prepare(num_warps=4, BLOCK=256, FLAG=True)
    prepared((8,), *_args())
    prepared((8, 2), *_args())
    launcher((8, 2, 3), *_args(), num_warps=4, BLOCK=256, FLAG=True)  # shares the binding
    assert len(kernel.triton_calls) == 1
    assert [run[:3] for run in kernel.binary.runs] == [(8, 2, 1), (8, 2, 3)]


def test_triton_path_switch(cuda_free):
    kernel = FakeKernel()
    launcher = L.Launcher(kernel, interpreted=False)
    for _ in range(2):
        launcher((8,), *_args(), num_warps=4, BLOCK=256, FLAG=True)
    with L.triton_path():
        launcher((8,), *_args(), num_warps=4, BLOCK=256, FLAG=True)
    assert len(kernel.triton_calls) == 2 and len(kernel.binary.runs) == 1
    launcher((8,), *_args(), num_warps=4, BLOCK=256, FLAG=True)
    assert len(kernel.binary.runs) == 2


def test_argument_kinds_change_the_pattern(cuda_free):
    """None where a tensor was, a float where an int was, a bool where an int was: another pattern,
    Triton's path first, then a binding of its own; arguments of kinds no key takes (a tuple)
    always take Triton's path."""
    kernel = FakeKernel()
    launcher = L.Launcher(kernel, interpreted=False)
    x, y, n, eps = _args()
    variants = [(x, y, n, eps), (x, None, n, eps), (x, y, 4096.0, eps), (x, y, True, eps), (x, y, n, 1)]
    for args in variants:
        launcher((8,), *args, num_warps=4, BLOCK=256, FLAG=True)
    assert len(kernel.triton_calls) == len(variants) and not kernel.binary.runs
    for args in variants:
        launcher((8,), *args, num_warps=4, BLOCK=256, FLAG=True)
    assert len(kernel.triton_calls) == len(variants) and len(kernel.binary.runs) == len(variants)
    for _ in range(2):
        launcher((8,), x, (y, y), n, eps, num_warps=4, BLOCK=256, FLAG=True)
    assert len(kernel.triton_calls) == len(variants) + 2


INTS = [0, 1, 2, 15, 16, 17, 32, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16, 2**32, 2**32 + 16, 2**63 - 16, 2**63,
        2**63 + 16, -1, -16, -(2**31), -(2**31) - 1, -(2**31) - 16]


def test_generated_key_separates_what_triton_specializes():
    """Two ints with equal keys specialize alike (==1, divisible by 16, i32 / i64 / u64), and a
    bool or a float never shares an int's key."""
    key = L._key_function("TI")
    x = torch.zeros(4)
    keys = {v: key(x, v) for v in INTS}
    for a in INTS:
        for b in INTS:
            if keys[a] == keys[b]:
                assert L.specialization(a) == L.specialization(b), (a, b)
    assert key(x, True) not in keys.values() and key(x, False) not in keys.values()
    float_key = L._key_function("TF")
    assert float_key(x, 1.0) == float_key(x, 16.5) != float_key(x, 16)
    assert key(x, 16) != key(x[1:], 16)  # alignment
    assert key(x, 16) != key(x.half(), 16)  # dtype


def test_a_callable_grid_takes_the_triton_path(cuda_free):
    kernel = FakeKernel()
    launcher = L.Launcher(kernel, interpreted=False)
    for _ in range(2):
        launcher((8,), *_args(), num_warps=4, BLOCK=256, FLAG=True)
    grid = lambda meta: (8,)  # noqa: E731
    launcher(grid, *_args(), num_warps=4, BLOCK=256, FLAG=True)
    assert kernel.triton_calls[-1][0] is grid and len(kernel.binary.runs) == 1


def _triton_specialization(arg):
    """Triton's own specialization of a launch argument (type, key), as its binder computes it."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime import jit

    return jit.native_specialize_impl(BaseBackend, arg, False, True, True)


TENSORS = [torch.zeros(64, dtype=dtype)[offset:] for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64)
           for offset in (0, 1, 2, 4, 8)]


@pytest.mark.parametrize("pattern, values", [
    ("TI", INTS + [True, False, 16.0]), ("TF", [0.0, 1.0, 16.0, -2.5, float("inf"), 16, 1, True]),
    ("TB", [True, False, 1, 0]), ("TN", [None, 0, False]), ("TT", TENSORS + [None, 16]),
], ids=["int", "float", "bool", "none", "tensor"])
def test_generated_keys_never_join_what_triton_tells_apart(pattern, values):
    """Against this Triton's own specialization function (run this file on the GPU machine too, for
    its Triton): two arguments of the slot's kind with equal keys get the same binary from Triton,
    and an argument of another kind (which binds in a site of its own pattern) never has the key of
    one of the slot's kind."""
    key = L._key_function(pattern)
    x = torch.zeros(4)

    def ours(v):
        try:
            return key(x, v)
        except (AttributeError, TypeError):  # not of the slot's kind: Triton's path, no key
            return ("no key", id(v))

    members = [v for v in values if L._kind(v) == pattern[1]]
    outsiders = [v for v in values if L._kind(v) != pattern[1]]
    for a in members:
        for b in members:
            if ours(a) == ours(b):
                assert (type(a), _triton_specialization(a)) == (type(b), _triton_specialization(b)), (a, b)
    assert not {ours(v) for v in outsiders} & {ours(v) for v in members}
