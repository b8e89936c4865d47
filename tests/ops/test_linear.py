"""linear (GEMM + bias + activation + residual) and swiglu_linear: values and gradients against a
float64 reference, every epilogue, odd and decode shapes, non-contiguous and empty inputs, both
tile loaders (pointers and TMA descriptors, which the 3.8 interpreter runs), torch.compile, errors."""

import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F

from kernelab.errors import KernelabError
import kernelab.ops as L
from kernelab.ops import gemm
from kernelab.ops.linear import ACTIVATIONS
from tests.ops.conftest import DTYPES, assert_close, grads
from tests.ops.helpers import randn, ref_copy

REFERENCE_ACTS = {
    None: lambda z: z,
    "relu": torch.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"),
    "silu": F.silu,
}


def reference(x, w, b, r, act):
    y = REFERENCE_ACTS[act](F.linear(x, w, b))
    return y + r if r is not None else y


def make(m_shape, n, k, dtype, bias=True, residual=True, seed=0, noncontig=False):
    """x [*m_shape, k], weight [n, k] scaled so that pre-activations are O(1), bias, residual."""
    x = randn((*m_shape, k), dtype, seed=seed, noncontig=noncontig)
    w = randn((n, k), dtype, scale=1 / math.sqrt(max(k, 1)), seed=seed + 1)
    b = randn((n,), dtype, scale=0.5, seed=seed + 2) if bias else None
    r = randn((*m_shape, n), dtype, seed=seed + 3, noncontig=noncontig) if residual else None
    return x, w, b, r


def check_linear(x, w, b, r, act, backward=True, fn=L.linear):
    dtype = x.dtype
    y = fn(x, w, b, act, r)
    refs = [ref_copy(t) for t in (x, w, b, r)]
    ref = reference(*refs, act)
    assert y.dtype == dtype
    assert_close(y, ref, dtype, f"linear {act} forward")
    if not backward:
        return
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64).to(dtype)
    got, want = grads(y, [x, w, b, r], g), grads(ref, refs, g.double())
    for name, o, e in zip("x w b r".split(), got, want):
        assert (o is None) == (e is None), name
        if o is not None:
            assert_close(o, e, dtype, f"linear {act} d{name}")


def check_swiglu(x, wg, wu, fn=L.swiglu_linear):
    y = fn(x, wg, wu)
    refs = [ref_copy(t) for t in (x, wg, wu)]
    ref = F.silu(F.linear(refs[0], refs[1])) * F.linear(refs[0], refs[2])
    assert_close(y, ref, x.dtype, "swiglu forward")
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(8), dtype=torch.float64).to(x.dtype)
    for name, o, e in zip(("x", "w_gate", "w_up"), grads(y, [x, wg, wu], g), grads(ref, refs, g.double())):
        assert_close(o, e, x.dtype, f"swiglu d{name}")


# --------------------------------------------------------------------------- linear
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", list(REFERENCE_ACTS))
@pytest.mark.parametrize("bias,residual", [(True, True), (False, False), (True, False), (False, True)])
def test_epilogues(dtype, act, bias, residual):
    check_linear(*make((7,), 45, 33, dtype, bias, residual), act)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m_shape,n,k", [((1,), 1, 1), ((7,), 33, 100), ((129,), 100, 7), ((33,), 129, 129),
                                         ((2, 3), 7, 33), ((3,), 80, 768), ((2,), 2880 // 16, 5120 // 16)], ids=str)
def test_odd_shapes(dtype, m_shape, n, k):
    check_linear(*make(m_shape, n, k, dtype), "gelu")


@pytest.mark.parametrize("m", [1, 2, 5, 16])
def test_decode_rows(m):
    """M = 1..16: the decode configurations (16-row tiles, deep K blocks), K past one block."""
    assert gemm.shape_class(m, 100, False, torch.device("cpu")) == "decode"
    check_linear(*make((m,), 100, 300, torch.float16, seed=m), "silu")


@pytest.mark.parametrize("engine", ["cublas", "triton"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_products_by_either_engine(monkeypatch, engine, dtype):
    """The backward's plain products (dX, dW; SwiGLU's dX as two products, the second adding the
    first) by torch.mm/addmm or by the GEMM kernel on transposed views: the same gradients."""
    monkeypatch.setattr(gemm, "PLAIN_PRODUCTS", engine)
    check_linear(*make((2, 9), 40, 72, dtype, seed=3), "gelu")
    x = randn((2, 9, 72), dtype, seed=4)
    check_swiglu(x, randn((40, 72), dtype, scale=1 / 8, seed=5), randn((40, 72), dtype, scale=1 / 8, seed=6))


def test_plain_product_engines():
    a, b, r = (torch.randn(s, dtype=torch.float32) for s in ((5, 7), (6, 7), (5, 6)))
    want = a.double() @ b.double().T + r.double()
    for engine in ("cublas", "triton"):
        assert_close(gemm.plain(a, b, r, engine=engine), want, torch.float32, engine)
    with pytest.raises(KernelabError, match="unknown engine 'cutlass'"):
        gemm.plain(a, b, engine="cutlass")


def test_noncontiguous_inputs():
    x, w, b, r = make((5, 3), 40, 24, torch.float32, noncontig=True)
    check_linear(x, w, b, r, "gelu_tanh")
    # a transposed weight (the "not K-major" loads) and a transposed x
    x = randn((24, 9), torch.float32).detach().t().requires_grad_()
    w = randn((24, 40), torch.float32, scale=0.2).detach().t().requires_grad_()
    check_linear(x, w, None, None, "relu")


@pytest.mark.parametrize("m_shape,n,k", [((0,), 5, 4), ((3,), 5, 0), ((3,), 0, 4), ((2, 0), 5, 4)], ids=str)
def test_empty(m_shape, n, k):
    """No rows, no columns, or K = 0 (the output is act(bias) + residual, dW is empty)."""
    check_linear(*make(m_shape, n, k, torch.float32), "gelu")


def test_special_values():
    """NaN and infinities in x reach the rows that read them, as in PyTorch (forward only: the
    reference's own gradients at inf are NaN by convention)."""
    x, w, b, r = make((4,), 6, 8, torch.float32, residual=False)
    x = x.detach().clone()
    x[1, 3], x[2, 0] = float("nan"), float("inf")
    check_linear(x, w.detach(), b.detach(), None, "relu", backward=False)


def test_double_backward():
    x, w, b, r = make((3,), 6, 5, torch.float32)
    refs = [ref_copy(t) for t in (x, w, b, r)]
    outs = []
    for args, fn in (((x, w, b, r), L.linear), (refs, reference)):
        y = fn(*args[:3], "gelu", args[3]) if fn is L.linear else fn(*args, "gelu")
        gx, gw = torch.autograd.grad(y.pow(2).sum(), args[:2], create_graph=True)
        outs.append(torch.autograd.grad((gx.sum() + gw.pow(2).sum()), args[:3]))
    for o, e in zip(*outs):
        assert_close(o, e, torch.float32, "double backward")


def test_no_grad_keeps_nothing():
    """Without gradients the forward writes no pre-activation: same values."""
    x, w, b, r = make((6,), 10, 12, torch.float32)
    with torch.no_grad():
        y = L.linear(x, w, b, "silu", r)
    assert not y.requires_grad
    assert_close(y, reference(*[ref_copy(t) for t in (x, w, b, r)], "silu"), torch.float32, "no_grad")


# --------------------------------------------------------------------------- swiglu_linear
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m_shape,n,k", [((1,), 7, 33), ((7,), 129, 100), ((2, 3), 33, 7), ((40,), 64, 129)], ids=str)
def test_swiglu(dtype, m_shape, n, k):
    x = randn((*m_shape, k), dtype)
    wg = randn((n, k), dtype, scale=1 / math.sqrt(k), seed=1)
    wu = randn((n, k), dtype, scale=1 / math.sqrt(k), seed=2)
    check_swiglu(x, wg, wu)


def test_swiglu_noncontiguous_weights():
    x = randn((5, 24), torch.float32, noncontig=True)
    wg = randn((24, 30), torch.float32, scale=0.2, seed=1).detach().t().requires_grad_()
    wu = randn((30, 24), torch.float32, scale=0.2, seed=2)  # other strides than wg: both made contiguous
    check_swiglu(x, wg, wu)


# --------------------------------------------------------------------------- the GEMM kernel itself
@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("kind", sorted(gemm.CONFIGS))
def test_every_configuration(kind, tma):
    """Each configuration of the table, with pointer and TMA loads, on a shape that leaves partial
    tiles in M, N and K; A and B also as transposed views (the backward's layouts; 16-byte
    aligned strides, so that descriptors can describe them)."""
    dual = kind.startswith("dual")
    m, n, k = (8 if "decode" in kind else 72), 72, 136
    a, b, b2 = (torch.randn(s, dtype=torch.float16) for s in ((m, k), (n, k), (n, k)))
    ref = F.silu(a.double() @ b.double().T) * (a.double() @ b2.double().T) if dual else a.double() @ b.double().T
    for config in gemm.CONFIGS[kind]:
        y, _, _ = gemm.gemm(a, b, b2=b2 if dual else None, config=config, tma=tma)
        assert_close(y, ref, torch.float16, f"{kind} {config}")
        if not dual:
            at, bt = a.t().contiguous().t(), b.t().contiguous().t()
            y, _, _ = gemm.gemm(at, bt, config=config, tma=tma)
            assert_close(y, ref, torch.float16, f"{kind} {config} transposed")


@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("options", [dict(programs_per_sm=2), dict(flatten=True), dict(tma_store=True),
                                     dict(programs_per_sm=2, flatten=True, tma_store=True)], ids=str)
def test_schedule_options(tma, options):
    """Two programs an SM, the flattened tile-and-K loop and the copy engine's stores change the
    schedule, never the values: every epilogue, partial tiles, several tiles per program; a
    TMA store is skipped where Y's rows are not 16-byte aligned (N = 71 in float16)."""
    for n in (72, 71):
        config = gemm.GemmConfig(32, 32, 32, 2, 4, 3, **options)
        x, w, b, r = (t.detach() for t in make((70,), n, 80, torch.float16, seed=n))
        for act in ("gelu", "silu"):
            y, z, _ = gemm.gemm(x, w, bias=b, residual=r, act=gemm.code_for(act, x.dtype), store_z=True, config=config,
                                tma=tma)
            assert_close(y, reference(*(t.double() for t in (x, w, b, r)), act), torch.float16, f"{options} {act}")
            assert_close(z, F.linear(x.double(), w.double(), b.double()), torch.float16, f"{options} Z")
        y, _, _ = gemm.gemm(x, w, b2=w.flip(0), config=config, tma=tma)
        want = F.silu(x.double() @ w.double().T) * (x.double() @ w.flip(0).double().T)
        assert_close(y, want, torch.float16, f"{options} dual")


def test_tma_needs_aligned_operands():
    a = torch.randn(4, 7)  # 28-byte rows: no descriptor
    with pytest.raises(KernelabError, match="tma=True"):
        gemm.gemm(a, a, tma=True)
    assert_close(gemm.gemm(a, a)[0], a.double() @ a.double().T, torch.float32, "pointer path")


def test_fp32_configs_fit():
    """float32 halves BLOCK_K (same bytes per stage), caps tiles at 128 x 128 and takes 8 warps
    there; no candidate twice."""
    for m, n, dual in ((4096, 4096, False), (4096, 4096, True), (200, 300, False), (8, 4096, False)):
        configs = gemm.candidates(m, n, dual, torch.float32, torch.device("cpu"))
        assert len(set(configs)) == len(configs)
        for config in configs:
            assert config.block_k >= 16 and config.block_m <= 128 and config.block_n <= 128
            assert config.num_warps >= 8 or config.block_m * config.block_n < 128 * 128


# --------------------------------------------------------------------------- tracing and errors
def test_torch_compile_fullgraph():
    x, w, b, r = make((2, 5), 24, 16, torch.float32)
    wg, wu = randn((24, 16), torch.float32, scale=0.25, seed=5), randn((24, 16), torch.float32, scale=0.25, seed=6)

    def fn(x, w, b, r, wg, wu):
        return L.linear(x, w, b, "gelu", r) + L.swiglu_linear(x, wg, wu)

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    y = compiled(x, w, b, r, wg, wu)
    refs = [ref_copy(t) for t in (x, w, b, r, wg, wu)]
    ref = reference(*refs[:4], "gelu") + F.silu(F.linear(refs[0], refs[4])) * F.linear(refs[0], refs[5])
    assert_close(y, ref, torch.float32, "compiled forward")
    g = torch.randn(y.shape, dtype=torch.float64)
    for o, e in zip(grads(y, [x, w, b, r, wg, wu], g.float()), grads(ref, refs, g)):
        assert_close(o, e, torch.float32, "compiled backward")


def test_errors():
    x, w, b, r = make((3,), 5, 4, torch.float32)
    with pytest.raises(KernelabError, match=r"last dimension is 4 but weight is \(5, 6\)"):
        L.linear(x, torch.randn(5, 6))
    with pytest.raises(KernelabError, match="weight is torch.float16 but x is torch.float32"):
        L.linear(x, w.half())
    with pytest.raises(KernelabError, match="bias is on meta"):
        L.linear(x, w, torch.empty(5, device="meta"))
    with pytest.raises(KernelabError, match="unsupported activation 'tanh'"):
        L.linear(x, w, b, "tanh")
    with pytest.raises(KernelabError, match=r"bias has shape \(4,\), expected \(5,\)"):
        L.linear(x, w, torch.randn(4))
    with pytest.raises(KernelabError, match=r"residual has shape \(5,\)"):
        L.linear(x, w, b, None, torch.randn(5))
    with pytest.raises(KernelabError, match="needs x of shape"):
        L.linear(x, torch.randn(4))
    with pytest.raises(KernelabError, match="w_up has shape"):
        L.swiglu_linear(x, w, torch.randn(6, 4))
    with pytest.raises(KernelabError, match="w_up is torch.float64"):
        L.swiglu_linear(x, w, w.double())


# --------------------------------------------------------------------------- per-shape tuning
def test_tuning_picks_the_fastest_and_remembers_it_on_disk(monkeypatch, tmp_path):
    """With gemm_tune.TUNE the first call of a shape times every candidate (here a fake timer
    that makes the last one fastest), uses it, and writes it to $KERNELAB_CACHE; a new process
    (the caches forgotten) reads it back without timing anything; an edited file is ignored."""
    from kernelab.ops import gemm_tune

    monkeypatch.setenv("KERNELAB_CACHE", str(tmp_path))
    monkeypatch.setattr(gemm_tune, "TUNE", True)
    gemm_tune.forget()
    a, b = torch.randn(40, 24), torch.randn(36, 24)
    cands = gemm.candidates(40, 36, False, torch.float32, a.device)
    timed = []

    def fake_time(run):
        timed.append(run)
        return 10.0 - len(timed)  # each later candidate "faster"

    monkeypatch.setattr(gemm_tune, "time_ms", fake_time)
    y = gemm.gemm(a, b)[0]
    assert_close(y, a.double() @ b.double().T, torch.float32, "tuned")
    assert len(timed) == len(cands)
    files = list(tmp_path.glob("gemm-tune-*.json"))
    assert len(files) == 1 and list(json.loads(files[0].read_text()).values()) == [dataclasses.asdict(cands[-1])]
    gemm_tune.forget()
    timed.clear()
    assert_close(gemm.gemm(a, b)[0], a.double() @ b.double().T, torch.float32, "from disk")
    assert not timed
    files[0].write_text("{not json")
    gemm_tune.forget()
    with pytest.warns(UserWarning, match="ignoring the GEMM tuning cache"):
        gemm.gemm(a, b)
    assert len(timed) == len(cands)
    gemm_tune.forget()


def test_tuning_skips_a_candidate_that_fails(monkeypatch, tmp_path):
    """A candidate that raises while tuning is skipped with a warning; the others are timed."""
    from kernelab.ops import gemm_tune

    monkeypatch.setenv("KERNELAB_CACHE", str(tmp_path))
    gemm_tune.forget()
    cands = gemm.candidates(40, 36, False, torch.float32, torch.device("cpu"))

    def run(config):
        if config == cands[0]:
            raise RuntimeError("out of resources")

    with pytest.warns(UserWarning, match="skipped while tuning: RuntimeError: out of resources"):
        best = gemm_tune.choose(("k",), cands, run, torch.device("cpu"), timer=lambda fn: 1.0)
    assert best == cands[1]
    gemm_tune.forget()


@pytest.mark.parametrize("act", ["gelu", "relu", None])
@pytest.mark.parametrize("wants", ["residual", "residual+bias", "x+residual"])
def test_gradients_of_some_inputs_only(act, wants):
    """Only some inputs require a gradient, the residual among them: the pre-activation is kept
    only for x, weight and bias, so a backward wanting the residual's alone must not read it (it
    read an empty tensor: a segfault under the interpreter, found by a held-out sweep)."""
    x = torch.randn(6, 16, generator=torch.Generator().manual_seed(0))
    w = torch.randn(8, 16, generator=torch.Generator().manual_seed(1)) / 4
    b = torch.randn(8, generator=torch.Generator().manual_seed(2))
    r = torch.randn(6, 8, generator=torch.Generator().manual_seed(3))
    names = wants.split("+")
    args = {"x": x, "weight": w, "bias": b, "residual": r}
    for name in names:
        args[name] = args[name].clone().requires_grad_()
    ref = {k: v.detach().clone().requires_grad_(v.requires_grad) for k, v in args.items()}
    y = L.linear(args["x"], args["weight"], args["bias"], act, args["residual"])
    z = F.linear(ref["x"], ref["weight"], ref["bias"])
    want = ACTIVATIONS[act or "none"](z) + ref["residual"]
    g = torch.randn(6, 8, generator=torch.Generator().manual_seed(4))
    got = torch.autograd.grad(y, [args[n] for n in names], g)
    expected = torch.autograd.grad(want, [ref[n] for n in names], g)
    assert_close(y, want, torch.float32, "output")
    for name, a, e in zip(names, got, expected):
        assert_close(a, e, torch.float32, name)
