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

from kernelab import launch
from kernelab import ops as K
from kernelab.ops import _common

pytestmark = pytest.mark.skipif(
    _common.INTERPRETED or not torch.cuda.is_available(), reason="direct launches run on a CUDA GPU, without the interpreter"
)


def _randn(*shape, dtype, seed, scale=1.0):
    g = torch.Generator("cuda").manual_seed(seed)
    return (torch.randn(*shape, device="cuda", generator=g) * scale).to(dtype)


def _case(name: str, dtype: torch.dtype, m: int, n: int):
    """(function of the inputs, inputs, indices of the inputs to differentiate) for one op family."""
    x = _randn(m, n, dtype=dtype, seed=1, scale=2.0)
    w, b = _randn(n, dtype=dtype, seed=2), _randn(n, dtype=dtype, seed=3)
    other = _randn(m, n, dtype=dtype, seed=4)
    target = torch.randint(0, n, (m,), device="cuda", generator=torch.Generator("cuda").manual_seed(5))
    target[::7] = -100
    k = 96
    hidden, weight = _randn(m, k, dtype=dtype, seed=6), _randn(n, k, dtype=dtype, seed=7, scale=0.1)
    cases = {
        "layer_norm": (lambda x, w, b: K.layer_norm(x, (n,), w, b), (x, w, b), (0, 1, 2)),
        "rms_norm": (lambda x, w: K.rms_norm(x, (n,), w), (x, w), (0, 1)),
        "softmax": (lambda x: K.softmax(x, -1), (x,), (0,)),
        "log_softmax": (lambda x: K.log_softmax(x, -1), (x,), (0,)),
        "cross_entropy": (lambda x: K.cross_entropy(x, target, label_smoothing=0.1), (x,), (0,)),
        "add_relu": (K.add_relu, (x, other), (0, 1)),
        "bias_gelu": (K.bias_gelu, (x, b), (0, 1)),
        "silu_mul": (K.silu_mul, (x, other), (0, 1)),
        "gelu_mul": (K.gelu_mul, (x, other), (0, 1)),
        # the GEMM kernel (launched with num_stages), its activation backward, the bias sum
        "linear": (lambda h, wt, bias: K.linear(h, wt, bias, activation="gelu"), (hidden, weight, b), (0, 1, 2)),
        "swiglu_linear": (K.swiglu_linear, (hidden, weight, _randn(n, k, dtype=dtype, seed=8, scale=0.1)), (0, 1, 2)),
        "linear_cross_entropy": (lambda h, wt: K.linear_cross_entropy(h, wt, target), (hidden, weight), (0, 1)),
    }
    return cases[name]


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
    leaves = [t.detach().clone().requires_grad_(i in grad_of) for i, t in enumerate(inputs)]
    out = fn(*leaves)
    grads = torch.autograd.grad(out.float().pow(2).sum(), [leaves[i] for i in grad_of])
    return [out.detach(), *grads]


@pytest.fixture
def fresh(monkeypatch):
    """A record of the launches that took Triton's path (direct launches on)."""
    monkeypatch.delenv("KERNELAB_DIRECT_LAUNCH", raising=False)
    ordinary = []
    triton_path = launch.Launcher._launch

    def counting(self, grid, args, keywords):
        ordinary.append(getattr(self.kernel, "__name__", str(self.kernel)))
        return triton_path(self, grid, args, keywords)

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
    assert fresh == [], f"{name}: these launches took Triton's path on the second step: {fresh}"
    _same(direct, _ordinary_path(fn, inputs, grad_of), f"{name} {dtype} {shape}")


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
