"""Direct launches (``kernelab.launch.Launcher``: a bound binary's launcher called with the argument
list Triton passes it) against Triton's ordinary ``kernel[grid](...)`` path, on a CUDA GPU.

Triton's launcher arguments differ between versions (the GPU machine runs 3.6, CI 3.8), so what
the interpreter-only CI cannot show is checked here: for every op family, forward and backward,
the second call of a step makes no launch through Triton's path (every kernel, GEMMs launched
with ``num_stages`` and team kernels with ``maxnreg`` included, was bound at the first) and gives
bit-for-bit the outputs and gradients of the same step run with direct launches off. Misaligned
inputs (their own specialization) and a side stream too.

Run on a GPU machine WITHOUT TRITON_INTERPRET: ``python -m pytest tests/gpu -q``.
"""

import pytest
import torch

import torch.nn.functional as F

from kernelab import launch
from kernelab import ops as K
from kernelab.ops import _common

pytestmark = pytest.mark.skipif(
    _common.INTERPRETED or not torch.cuda.is_available(), reason="direct launches run on a CUDA GPU, without the interpreter"
)


def _randn(*shape, dtype, seed, scale=1.0):
    g = torch.Generator("cuda").manual_seed(seed)
    return (torch.randn(*shape, device="cuda", generator=g) * scale).to(dtype)


def _case(name: str, dtype: torch.dtype, m: int, n: int, reference: bool = False):
    """(function of the inputs, inputs, indices of the inputs to differentiate) for one op family:
    kernelab's, or with ``reference`` PyTorch's on float64 copies of the inputs."""
    x = _randn(m, n, dtype=dtype, seed=1, scale=2.0)
    w, b = _randn(n, dtype=dtype, seed=2), _randn(n, dtype=dtype, seed=3)
    other = _randn(m, n, dtype=dtype, seed=4)
    target = torch.randint(0, n, (m,), device="cuda", generator=torch.Generator("cuda").manual_seed(5))
    target[::7] = -100
    k = 96
    hidden, weight = _randn(m, k, dtype=dtype, seed=6), _randn(n, k, dtype=dtype, seed=7, scale=0.1)
    w_up = _randn(n, k, dtype=dtype, seed=8, scale=0.1)
    inputs = {
        "layer_norm": (x, w, b), "rms_norm": (x, w), "softmax": (x,), "log_softmax": (x,), "cross_entropy": (x,),
        "add_relu": (x, other), "bias_gelu": (x, b), "silu_mul": (x, other), "gelu_mul": (x, other),
        # the GEMM kernel (launched with num_stages), its activation backward, the bias sum
        "linear": (hidden, weight, b), "swiglu_linear": (hidden, weight, w_up), "linear_cross_entropy": (hidden, weight),
    }[name]
    kernelab = {
        "layer_norm": lambda x, w, b: K.layer_norm(x, (n,), w, b),
        "rms_norm": lambda x, w: K.rms_norm(x, (n,), w),
        "softmax": lambda x: K.softmax(x, -1),
        "log_softmax": lambda x: K.log_softmax(x, -1),
        "cross_entropy": lambda x: K.cross_entropy(x, target, label_smoothing=0.1),
        "add_relu": K.add_relu, "bias_gelu": K.bias_gelu, "silu_mul": K.silu_mul, "gelu_mul": K.gelu_mul,
        "linear": lambda h, wt, bias: K.linear(h, wt, bias, activation="gelu"),
        "swiglu_linear": K.swiglu_linear,
        "linear_cross_entropy": lambda h, wt: K.linear_cross_entropy(h, wt, target),
    }
    torch_ = {
        "layer_norm": lambda x, w, b: F.layer_norm(x, (n,), w, b),
        "rms_norm": lambda x, w: F.rms_norm(x, (n,), w),
        "softmax": lambda x: F.softmax(x, -1),
        "log_softmax": lambda x: F.log_softmax(x, -1),
        "cross_entropy": lambda x: F.cross_entropy(x, target, label_smoothing=0.1),
        "add_relu": lambda a, c: torch.relu(a + c), "bias_gelu": lambda a, c: F.gelu(a + c),
        "silu_mul": lambda a, c: F.silu(a) * c, "gelu_mul": lambda a, c: F.gelu(a) * c,
        "linear": lambda h, wt, bias: F.gelu(F.linear(h, wt, bias)),
        "swiglu_linear": lambda h, u, v: F.silu(F.linear(h, u)) * F.linear(h, v),
        "linear_cross_entropy": lambda h, wt: F.cross_entropy(F.linear(h, wt), target),
    }
    if reference:
        return torch_[name], tuple(t.double() for t in inputs), tuple(range(len(inputs)))
    return kernelab[name], inputs, tuple(range(len(inputs)))


OPS = ["layer_norm", "rms_norm", "softmax", "log_softmax", "cross_entropy", "add_relu", "bias_gelu", "silu_mul",
       "gelu_mul", "linear", "swiglu_linear", "linear_cross_entropy"]
#: (op, dtype, (rows, width)): every op at a model width and an odd one, float32 and bfloat16; the
#: row ops at rows over 16384 too (team kernels, launched with maxnreg), bfloat16.
CASES = ([(op, dtype, shape) for op in OPS for dtype in (torch.float32, torch.bfloat16)
          for shape in ((64, 768), (33, 4097))]
         + [(op, torch.bfloat16, (4, 65536)) for op in ("layer_norm", "rms_norm", "softmax", "log_softmax")])


def _step(fn, inputs, grad_of):
    """Outputs and gradients of one forward + backward (the gradient of the output's sum of
    squares, so that every element matters)."""
    leaves = [t.detach().requires_grad_(i in grad_of) for i, t in enumerate(inputs)]  # same memory, alignment
    out = fn(*leaves)
    grads = torch.autograd.grad(out.to(torch.promote_types(out.dtype, torch.float32)).pow(2).sum(),
                                [leaves[i] for i in grad_of])
    return [out.detach(), *grads]


@pytest.fixture
def fresh(monkeypatch):
    """A record of the launches that took Triton's path (direct launches on)."""
    monkeypatch.delenv("KERNELAB_DIRECT_LAUNCH", raising=False)
    ordinary = []
    triton_path = launch.Launcher._launch

    def counting(self, *args, **kwargs):
        ordinary.append(getattr(self.kernel, "__name__", str(self.kernel)))
        return triton_path(self, *args, **kwargs)

    monkeypatch.setattr(launch.Launcher, "_launch", counting)
    return ordinary


def _ordinary_path(fn, inputs, grad_of):
    """The same step with every launch through Triton's ordinary path."""
    with launch.triton_path():
        return _step(fn, inputs, grad_of)


def _same(direct, ordinary, what):
    assert len(direct) == len(ordinary), what
    for i, (d, o) in enumerate(zip(direct, ordinary)):
        torch.testing.assert_close(d, o, rtol=0, atol=0, equal_nan=True, msg=f"{what}, output {i}")


@pytest.mark.parametrize("name, dtype, shape", CASES,
                         ids=[f"{n}-{str(d)[6:]}-{s[0]}x{s[1]}" for n, d, s in CASES])
def test_direct_launch_matches_triton_path(name, dtype, shape, fresh):
    fn, inputs, grad_of = _case(name, dtype, *shape)
    _step(fn, inputs, grad_of)  # the first launch of each kernel binds it
    fresh.clear()
    direct = _step(fn, inputs, grad_of)
    torch.cuda.synchronize()
    took_triton_path = list(fresh)
    ordinary = _ordinary_path(fn, inputs, grad_of)
    same = len(direct) == len(ordinary) and all(
        torch.equal(torch.isnan(d), torch.isnan(o)) and torch.equal(d.nan_to_num(), o.nan_to_num())
        for d, o in zip(direct, ordinary))
    if took_triton_path or not same:
        pytest.fail(_report(name, dtype, shape, took_triton_path, direct, ordinary))


def _report(name, dtype, shape, took_triton_path, direct, ordinary) -> str:
    """Everything the next GPU run needs to tell a wrong value from a launch that was not direct:
    the launches that took Triton's path, the direct-launch switches, every launcher's bindings
    (refused ones too), and each output's distance between the paths and to float64 PyTorch."""
    ref_fn, ref_inputs, grad_of = _case(name, dtype, *shape, reference=True)
    reference = _step(ref_fn, ref_inputs, grad_of)
    runtime = launch._runtime_knobs()
    lines = [f"{name} {dtype} {shape}: launches through Triton's path on the second step: {took_triton_path}",
             f"enabled()={launch.enabled()} triton_supported={launch._triton_supported()} "
             f"hooks=({launch.hooked(runtime.launch_enter_hook)}, {launch.hooked(runtime.launch_exit_hook)})"]
    for launcher in _common._LAUNCHERS.values():
        for (keywords, pattern), site in launcher.patterns.items():
            kinds = [type(b).__name__ if b is not False else "REFUSED" for b in site.bound.values()]
            lines.append(f"  {launcher.kernel.__name__} {pattern} {dict(keywords)}: {kinds}")
    for i, (d, o, r) in enumerate(zip(direct, ordinary, reference)):
        def dist(a, b):
            return (a.double() - b.double()).abs().nan_to_num(float("inf")).max().item() if a.numel() else 0.0
        lines.append(f"  output {i} {tuple(d.shape)}: |direct - triton path| {dist(d, o):.3g}, "
                     f"|direct - float64| {dist(d, r):.3g}, |triton path - float64| {dist(o, r):.3g}")
    return "\n".join(lines)


def test_gemm_binds_with_num_stages(fresh):
    from kernelab.ops import gemm

    fn, inputs, grad_of = _case("linear", torch.bfloat16, 256, 512)
    for _ in range(2):
        _step(fn, inputs, grad_of)
    launcher = _common._LAUNCHERS[id(gemm._gemm_kernel)]
    bound = [(dict(name), b) for name, slot in launcher.slots.items() if slot.site for b in slot.site.bound.values()]
    assert bound and all("num_stages" in keywords and b for keywords, b in bound)


@pytest.mark.parametrize("name", ["layer_norm", "softmax", "silu_mul", "cross_entropy"])
def test_misaligned_inputs_bind_their_own_binary(name, fresh):
    """An input 4 bytes past a 16-byte boundary specializes differently: its own binding, the same
    values as Triton's path."""
    fn, inputs, grad_of = _case(name, torch.float32, 64, 768)
    _step(fn, inputs, grad_of)
    shifted = [torch.empty(t.numel() + 1, device="cuda", dtype=t.dtype)[1:].view(t.shape).copy_(t)
               if t.is_floating_point() else t for t in inputs]
    assert all(t.data_ptr() % 16 for t in shifted if t.is_floating_point())
    _step(fn, shifted, grad_of)
    fresh.clear()
    direct = _step(fn, shifted, grad_of)
    assert fresh == []
    _same(direct, _ordinary_path(fn, shifted, grad_of), f"{name} misaligned")


def test_side_stream(fresh):
    """Direct launches go to the current stream: a step on a side stream, waited for, gives the
    default stream's values."""
    fn, inputs, grad_of = _case("layer_norm", torch.bfloat16, 64, 768)
    expected = _step(fn, inputs, grad_of)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = _step(fn, inputs, grad_of)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    _same(got, expected, "side stream")


def test_launch_hook_takes_triton_path(fresh):
    """A launch hook (a profiler such as proton) sees every launch: bound kernels go back to
    Triton's path while it is set."""
    from triton import knobs

    fn, inputs, grad_of = _case("softmax", torch.float32, 64, 768)
    _step(fn, inputs, grad_of)
    seen = []
    hook = knobs.runtime.launch_enter_hook
    if hasattr(hook, "add"):  # Triton >= 3.6: a HookChain
        hook.add(seen.append)
        try:
            _step(fn, inputs, grad_of)
        finally:
            hook.remove(seen.append)
    else:
        knobs.runtime.launch_enter_hook = seen.append
        try:
            _step(fn, inputs, grad_of)
        finally:
            knobs.runtime.launch_enter_hook = hook
    assert len(seen) >= 2 and len(fresh) >= 2
