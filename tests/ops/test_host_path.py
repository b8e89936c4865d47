"""The host path shared by the ops (``kernelab/ops/_common.py``): allocation through Inductor's C++
entry point, rows passed without views, the autograd node skipped when nothing needs a gradient,
launch settings prepared once. Values are the ops' own tests' business; these check the plumbing
that makes them cheap, against what torch itself would give."""

import importlib

import pytest
import torch
import torch.nn.functional as F

import kernelab.ops as K
from kernelab import launch
from kernelab.ops import _common
from kernelab.ops._common import empty as real_empty  # the autouse fixture poisons _common.empty

SHAPES = [(), (0,), (7,), (3, 0, 5), (1, 1, 4097), torch.Size([2, 3, 768]), [4, 5]]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32])
def test_empty_is_torch_empty(shape, dtype):
    got, ref = real_empty(shape, dtype, torch.device("cpu")), torch.empty(shape, dtype=dtype)
    assert (got.shape, got.stride(), got.dtype, got.device) == (ref.shape, ref.stride(), ref.dtype, ref.device)
    assert got.is_contiguous() and not got.requires_grad


def test_row_view_passes_contiguous_tensors_as_they_are():
    x = torch.randn(3, 5, 64)
    assert _common.row_view(x, 64) == (x, 64)
    strided = torch.randn(15, 80)[:, :64]
    rows, stride = _common.row_view(strided, 64)
    assert stride == 80 and torch.equal(rows, strided)
    transposed = torch.randn(64, 15).t()  # unit column stride only after a copy
    rows, stride = _common.row_view(transposed, 64)
    assert rows.stride() == (64, 1) and stride == 64 and torch.equal(rows, transposed)


BROADCASTS = [((), ()), ((3,), ()), ((2, 3, 768), (768,)), ((4, 1, 5), (3, 1)), ((1,), (7, 1, 0)),
              ((0, 4), (1, 4)), ((2, 3), (3, 2)), ((5,), (4,)), ((2, 1, 3), (2, 4, 1, 1))]


@pytest.mark.parametrize("a,b", BROADCASTS, ids=str)
def test_broadcast_shape_is_torchs(a, b):
    """The cached broadcast (torch's goes through its symbolic reference, ~30 us a call) gives
    torch's shape, or torch's own error where the shapes do not broadcast."""
    a, b = torch.Size(a), torch.Size(b)
    try:
        want = torch.broadcast_shapes(a, b)
    except RuntimeError as exc:
        with pytest.raises(RuntimeError, match=str(exc).split(".")[0][:40]):
            _common.broadcast_shape(a, b)
        return
    got = _common.broadcast_shape(a, b)
    assert got == want and type(got) is torch.Size


def test_traced_sees_subclasses_only():
    x = torch.randn(4)
    assert not _common.traced(x, torch.nn.Parameter(x), None, 3, 1.5, "mean", [1, 2], True)

    class Sub(torch.Tensor):
        pass

    assert _common.traced(x, x.as_subclass(Sub))


@pytest.mark.parametrize("op", ["softmax", "layer_norm", "silu_mul", "cross_entropy", "linear"])
def test_no_autograd_node_without_grad(op):
    """Nothing requires grad, or grad mode is off: the forward alone runs (no grad_fn), with the
    same values as with the autograd node."""
    x, w, b = torch.randn(7, 64), torch.randn(64), torch.randn(64)
    target = torch.randint(0, 64, (7,))
    calls = {
        "softmax": lambda x: K.softmax(x, -1),
        "layer_norm": lambda x: K.layer_norm(x, (64,), w, b),
        "silu_mul": lambda x: K.silu_mul(x, x.flip(0)),
        "cross_entropy": lambda x: K.cross_entropy(x, target),
        "linear": lambda x: K.linear(x, w.expand(32, 64).contiguous(), b[:32], activation="gelu"),
    }
    fn = calls[op]
    plain = fn(x)
    assert plain.grad_fn is None
    with torch.no_grad():
        assert fn(x.clone().requires_grad_(True)).grad_fn is None
    with_node = fn(x.clone().requires_grad_(True))
    assert with_node.grad_fn is not None
    torch.testing.assert_close(plain, with_node.detach(), rtol=0, atol=0)


def test_prepared_launch_settings_follow_the_tuning_switches(monkeypatch):
    """Launch settings cached per shape still follow the module switches a tuning run sets
    (cross_entropy.BWD_BLOCK_C here): the switch is part of the cache key."""
    ce = importlib.import_module("kernelab.ops.cross_entropy")
    x = torch.randn(5, 300, requires_grad=True)
    target = torch.randint(0, 300, (5,))
    (ref,) = torch.autograd.grad(F.cross_entropy(x, target), x)
    for block, expected in ((4096, 512), (128, 128)):
        monkeypatch.setattr(ce, "BWD_BLOCK_C", block)
        (got,) = torch.autograd.grad(K.cross_entropy(x, target), x)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
        col_blocks, launch = ce._bwd_launch(300, False, False, True, block)
        assert launch.keywords["BLOCK_C"] == expected and col_blocks == -(-300 // expected)


# --------------------------------------------------------------------------- direct launches, replayed
#: Functions caching prepared launches (they hold the launchers they were made with).
LAUNCH_CACHES = {
    "norms": ("_fwd_launch",), "softmax": ("_one_pass_launch",),
    "cross_entropy": ("_fwd_launch", "_reduce_launch", "_bwd_launch"), "pointwise": ("_prepared",),
    "gemm": ("_gemm_launch", "_activation_backward_launch"), "linear_cross_entropy": ("_rows_launch",),
    "_common": ("_sum_partials_launch",),
}


def _clear_launch_caches():
    for module, names in LAUNCH_CACHES.items():
        for name in names:
            getattr(importlib.import_module(f"kernelab.ops.{module}"), name).cache_clear()
    importlib.import_module("kernelab.ops.norms")._BWD_PLANS.clear()


class _Replay:
    """A stand-in for a compiled binary: its launcher ``run`` replays the direct launch's argument
    list positionally through the interpreter, as Triton's launcher takes it (every parameter in
    signature order, constexprs included), with the launch's compile options as keywords."""

    function = packed_metadata = None

    def __init__(self, kernel, options: dict, replays: list):
        self.kernel, self.options, self.replays = kernel, options, replays

    def _init_handles(self):
        pass

    def run(self, g0, g1, g2, stream, function, metadata, launch_metadata, enter, exit, *params):
        self.replays.append(self.kernel.__name__)
        self.kernel[(g0, g1, g2)](*params, **self.options)


@pytest.fixture
def replayed(monkeypatch):
    """Launchers that bind as on a GPU (CPU tensors taken for device 0) to ``_Replay`` binaries:
    (direct launches replayed, launches through Triton's path)."""
    replays, ordinary = [], []

    class Simulated(launch.Launcher):
        def __init__(self, kernel, interpreted):
            super().__init__(kernel, False)

        def _triton(self, grid, args, keywords):
            ordinary.append(self.kernel.__name__)
            keywords = {k: v for k, v in keywords.items() if k != "maxnreg"}  # the interpreter takes none
            self.kernel[grid](*args, **keywords)
            return _Replay(self.kernel, {k: v for k, v in keywords.items() if k not in self.kernel.arg_names}, replays)

    monkeypatch.setattr(_common, "Launcher", Simulated)
    monkeypatch.setattr(_common, "_LAUNCHERS", {})
    monkeypatch.setattr(launch, "_cuda_index", lambda args: 0)
    monkeypatch.setattr(launch, "_current_device", lambda: 0)
    monkeypatch.setattr(launch, "_stream_function", lambda: lambda device: 0)
    monkeypatch.setattr(launch, "_triton_supported", lambda: True)
    monkeypatch.delenv("KERNELAB_DIRECT_LAUNCH", raising=False)
    _clear_launch_caches()
    yield replays, ordinary
    _clear_launch_caches()


def _replay_case(op: str):
    """(kernelab function, its PyTorch reference, inputs, indices to differentiate)."""
    g = torch.Generator().manual_seed(0)
    x, other = torch.randn(7, 33, generator=g), torch.randn(7, 33, generator=g)
    w, b = torch.randn(33, generator=g), torch.randn(33, generator=g)
    wt, wt2 = torch.randn(20, 33, generator=g) * 0.3, torch.randn(20, 33, generator=g) * 0.3
    res = torch.randn(7, 20, generator=g)
    target = torch.tensor([3, -100, 0, 32, 5, 5, 17])
    cases = {
        "layer_norm": (lambda x, w, b: K.layer_norm(x, (33,), w, b), lambda x, w, b: F.layer_norm(x, (33,), w, b),
                       (x, w, b)),
        "rms_norm": (lambda x, w: K.rms_norm(x, (33,), w), lambda x, w: F.rms_norm(x, (33,), w), (x, w)),
        "softmax": (lambda x: K.softmax(x, -1), lambda x: F.softmax(x, -1), (x,)),
        "log_softmax": (lambda x: K.log_softmax(x, -1), lambda x: F.log_softmax(x, -1), (x,)),
        "cross_entropy": (lambda x, w: K.cross_entropy(x, target, w, label_smoothing=0.1),
                          lambda x, w: F.cross_entropy(x, target, w, label_smoothing=0.1), (x, w.abs())),
        "add_relu": (K.add_relu, lambda a, c: torch.relu(a + c), (x, other)),
        "bias_gelu": (K.bias_gelu, lambda a, c: F.gelu(a + c), (x, b)),
        "silu_mul": (K.silu_mul, lambda a, c: F.silu(a) * c, (x, other)),
        "linear": (lambda x, w, b, r: K.linear(x, w, b, activation="gelu", residual=r),
                   lambda x, w, b, r: F.gelu(F.linear(x, w, b)) + r, (x, wt, b[:20], res)),
        "swiglu_linear": (K.swiglu_linear, lambda x, u, v: F.silu(F.linear(x, u)) * F.linear(x, v), (x, wt, wt2)),
        "linear_cross_entropy": (lambda x, w: K.linear_cross_entropy(x, w, target.clamp(max=19)),
                                 lambda x, w: F.cross_entropy(F.linear(x, w), target.clamp(max=19)), (x, wt)),
    }
    fn, ref, inputs = cases[op]
    grad_of = tuple(i for i, t in enumerate(inputs) if op != "cross_entropy" or i == 0)
    return fn, ref, inputs, grad_of


def _outputs(fn, inputs, grad_of):
    leaves = [t.clone().requires_grad_(i in grad_of) for i, t in enumerate(inputs)]
    out = fn(*leaves)
    return [out.detach(), *torch.autograd.grad(out.pow(2).sum(), [leaves[i] for i in grad_of])]


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "softmax", "log_softmax", "cross_entropy", "add_relu",
                                "bias_gelu", "silu_mul", "linear", "swiglu_linear", "linear_cross_entropy"])
def test_direct_launch_argument_lists(op, replayed):
    """The second forward + backward launches every kernel directly (GEMMs launched with
    num_stages included), and the argument lists it builds (arguments, then the constexprs in
    signature order, positionally) give PyTorch's values: what Triton's launcher gets on a GPU."""
    replays, ordinary = replayed
    fn, ref, inputs, grad_of = _replay_case(op)
    _outputs(fn, inputs, grad_of)  # binds
    replays.clear(), ordinary.clear()
    got = _outputs(fn, inputs, grad_of)
    assert replays and not ordinary, f"launched through Triton's path: {ordinary}"
    for i, (g, r) in enumerate(zip(got, _outputs(ref, inputs, grad_of))):
        torch.testing.assert_close(g, r, rtol=2e-4, atol=2e-5, msg=f"{op} output {i}")
