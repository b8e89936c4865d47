"""linear_cross_entropy: loss and gradients (hidden, weight, bias) against PyTorch's formula in
float64, every reduction, ignore_index, label smoothing, chunkings that do not divide N, 3-D and
non-contiguous hidden, partial requires_grad, torch.compile, double backward, errors, and a check
that no tensor the size of the full logits is ever made."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import kernelab.ops as K
from tests.ops.conftest import DTYPES, assert_close
from tests.ops.helpers import randn, ref_copy

ROOT = Path(__file__).resolve().parents[2]


def targets(shape, v, seed=0, ignore_every=4, ignore_index=-100):
    t = torch.randint(0, v, shape, generator=torch.Generator().manual_seed(seed))
    if ignore_every:
        t.view(-1)[::ignore_every] = ignore_index
    return t


def inputs(n, h, v, dtype, bias=True, seed=0, lead=None, noncontig=False):
    """hidden (lead or (n,), h) of unit scale; weight and bias scaled so that logits are O(3)."""
    hidden = randn((*(lead or (n,)), h), dtype, seed=seed, noncontig=noncontig)
    weight = randn((v, h), dtype, scale=3.0 / max(1, h) ** 0.5, seed=seed + 1)
    b = randn((v,), dtype, seed=seed + 2) if bias else None
    return hidden, weight, b


def reference(hidden, weight, target, bias, **kw):
    """PyTorch's formula in float64 on the same (rounded) inputs."""
    hr, wr, br = ref_copy(hidden), ref_copy(weight), ref_copy(bias)
    logits = F.linear(hr, wr, br)
    loss = F.cross_entropy(logits.reshape(-1, weight.shape[0]), target.reshape(-1).long(), **kw)
    if kw.get("reduction") == "none":
        loss = loss.reshape(target.shape)
    return loss, (hr, wr, br)


def check(hidden, weight, target, bias=None, seed=5, **kw):
    """Loss and every requested gradient match the float64 reference."""
    y = K.linear_cross_entropy(hidden, weight, target, bias, **kw)
    kw.pop("chunk_rows", None)
    kw.pop("vocab_chunk", None)
    ref, ref_inputs = reference(hidden, weight, target, bias, **kw)
    assert y.dtype == torch.promote_types(hidden.dtype, torch.float32) and y.shape == ref.shape
    tol = torch.float32 if hidden.dtype == torch.float64 else hidden.dtype
    assert_close(y, ref, tol, "loss")
    ours = [t for t in (hidden, weight, bias) if t is not None and t.requires_grad]
    theirs = [r for t, r in zip((hidden, weight, bias), ref_inputs) if t is not None and t.requires_grad]
    if not ours:
        return y
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    got = torch.autograd.grad(y, ours, g.float())
    want = torch.autograd.grad(ref, theirs, g)
    for name, a, r in zip(("first", "second", "third"), got, want):
        assert a.dtype == hidden.dtype
        assert_close(a, r, tol, f"{name} gradient")
    return y


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,h,v", [(1, 48, 7), (7, 48, 1), (199, 200, 1000), (3, 48, 50257)], ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_shapes_and_reductions(dtype, n, h, v, reduction):
    hidden, weight, bias = inputs(n, h, v, dtype)
    check(hidden, weight, targets((n,), v), bias, reduction=reduction, chunk_rows=64)


@pytest.mark.parametrize("chunk_rows", [1, 7, 64, 199, 1000, None])
def test_chunkings(chunk_rows):
    """Chunks that do not divide N (the last one short), one row each, one chunk for all."""
    hidden, weight, bias = inputs(199, 48, 300, torch.float32)
    check(hidden, weight, targets((199,), 300), bias, chunk_rows=chunk_rows)
    check(hidden, weight, targets((199,), 300), bias, chunk_rows=chunk_rows, reduction="none")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,cols", [(None, None), (5, 37), (16, 64), (64, 128), (50, 299), (None, 300),
                                       (None, 1000)], ids=str)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_vocabulary_chunks(dtype, rows, cols, reduction):
    """The vocabulary-chunked path: class chunks that do not divide V (the last one short), one
    class a chunk, the whole vocabulary (the token path), token blocks that do not divide N;
    the target in every chunk, ignored rows, label smoothing, a bias."""
    hidden, weight, bias = inputs(37, 24, 300, dtype)
    t = targets((37,), 300, ignore_every=5)
    check(hidden, weight, t, bias, chunk_rows=rows, vocab_chunk=cols, reduction=reduction)
    check(hidden, weight, t, bias, chunk_rows=rows, vocab_chunk=cols, reduction=reduction, label_smoothing=0.3)


def test_one_class_and_one_row_chunks():
    hidden, weight, bias = inputs(6, 8, 9, torch.float32)
    check(hidden, weight, targets((6,), 9, ignore_every=4), bias, chunk_rows=1, vocab_chunk=1, label_smoothing=0.2)


def test_vocabulary_chunks_partial_gradients_and_sum():
    hidden, weight, bias = inputs(29, 16, 130, torch.float32)
    t = targets((29,), 130)
    check(hidden, weight.detach(), t, bias.detach(), vocab_chunk=32, reduction="sum")   # frozen head: dh only
    check(hidden.detach(), weight, t, None, vocab_chunk=32, chunk_rows=8)            # dW only, 4 token blocks
    check(hidden.detach(), weight.detach(), t, bias, vocab_chunk=32)                 # db only
    check(hidden.detach(), weight.detach(), t, bias.detach(), vocab_chunk=32)        # loss only


def test_default_chunks_fit_liger_memory():
    """The default chunking keeps the logits chunk and dhidden's float32 accumulator together
    within Liger-Kernel's chunk of logits; token blocks a multiple of 128 rows (a quarter of N
    unless H is wide), classes a multiple of 128, and every chunk's matmuls of at least 128."""
    from kernelab.ops.linear_cross_entropy import chunk_shape_for, liger_chunk_rows

    for n, h, v, elem in [(4096, 2048, 128256, 2), (8192, 4096, 128256, 2), (4096, 3584, 151936, 2),
                          (16384, 768, 50257, 2), (2048, 5120, 262144, 2), (4096, 1536, 151936, 2),
                          (4096, 2048, 128256, 4), (32768, 8192, 128256, 2)]:
        rows, cols = chunk_shape_for(n, h, v, elem)
        assert rows % 128 == 0 and 128 <= rows <= -(-n // 4 // 128) * 128, (n, h, v, rows)
        assert cols % 128 == 0 and 128 <= cols < v, (n, h, v, cols)
        acc = rows * h * 4 if elem < 4 else 0
        small = n * 4 + rows * 12
        assert rows * cols * elem + acc + small <= liger_chunk_rows(n, h, v) * v * elem, (n, h, v)
    assert liger_chunk_rows(8192, 4096, 128256) == 256 and liger_chunk_rows(4096, 1536, 151936) == 64
    assert chunk_shape_for(37, 16, 300, 4) == (37, 128)  # at least 128 classes a chunk
    assert chunk_shape_for(8, 16, 100, 2) == (8, 100)  # one chunk: the token path


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1, 1.0])
def test_ignore_index_and_smoothing(reduction, smoothing):
    hidden, weight, bias = inputs(23, 40, 37, torch.float32)
    t = targets((23,), 37, ignore_every=3, ignore_index=5)  # ignore_index may be a class
    check(hidden, weight, t, bias, ignore_index=5, reduction=reduction, label_smoothing=smoothing, chunk_rows=8)
    check(hidden, weight, t, bias, reduction=reduction, label_smoothing=-0.5, chunk_rows=8)  # negative: none


def test_all_ignored_mean_is_nan_with_zero_gradients():
    hidden, weight, bias = inputs(6, 16, 11, torch.float32)
    y = check(hidden, weight, torch.full((6,), -100), bias, chunk_rows=4)
    assert torch.isnan(y)
    check(hidden, weight, torch.full((6,), -100), bias, reduction="sum", label_smoothing=0.2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_3d_and_noncontiguous_hidden(dtype):
    hidden, weight, bias = inputs(0, 48, 97, dtype, lead=(3, 5))
    check(hidden, weight, targets((3, 5), 97), bias, chunk_rows=4)
    check(hidden, weight, targets((3, 5), 97), bias, chunk_rows=4, reduction="none")
    hidden, weight, _ = inputs(0, 48, 97, dtype, lead=(9,), noncontig=True)
    check(hidden, weight, targets((9,), 97), chunk_rows=4)
    transposed = randn((48, 9), dtype, seed=3).detach().t().requires_grad_()  # hidden as a transposed view
    check(transposed, weight.detach().t().contiguous().t().contiguous().requires_grad_(), targets((9,), 97))


def test_only_the_gradients_that_are_required():
    hidden, weight, bias = inputs(17, 32, 50, torch.float32)
    t = targets((17,), 50)
    check(hidden, weight.detach(), t, bias.detach(), chunk_rows=5)             # frozen head
    check(hidden.detach(), weight, t, None, chunk_rows=5)                       # weight only
    check(hidden.detach(), weight.detach(), t, bias, chunk_rows=5)             # bias only
    check(hidden.detach(), weight.detach(), t, bias.detach(), chunk_rows=5)    # nothing: loss only
    with torch.no_grad():
        y = K.linear_cross_entropy(hidden, weight, t, bias, chunk_rows=5)
    assert not y.requires_grad
    assert_close(y, reference(hidden, weight, t, bias)[0], torch.float32, "loss under no_grad")
    # all three require grad, only dh is asked for
    ref, (hr, _, _) = reference(hidden, weight, t, bias)
    (dh,) = torch.autograd.grad(K.linear_cross_entropy(hidden, weight, t, bias, chunk_rows=5), [hidden])
    assert_close(dh, torch.autograd.grad(ref, [hr])[0], torch.float32, "dh alone")


def test_autocast_casts_like_linear():
    """A float32 head under autocast computes in the autocast dtype; gradients reach the float32 tensors."""
    hidden, weight, bias = inputs(11, 32, 60, torch.float32)
    t = targets((11,), 60)
    with torch.autocast("cpu", dtype=torch.float16):
        y = K.linear_cross_entropy(hidden, weight, t, bias, chunk_rows=4)
    got = torch.autograd.grad(y, [hidden, weight, bias])
    h16, w16, b16 = (x.detach().half().requires_grad_() for x in (hidden, weight, bias))
    ref, refs = reference(h16, w16, t, b16)
    assert_close(y, ref, torch.float16, "loss under autocast")
    for a, r in zip(got, torch.autograd.grad(ref, list(refs))):
        assert a.dtype == torch.float32
        assert_close(a, r, torch.float16, "gradient under autocast")


def test_few_rows_per_chunk_take_long_blocks():
    """Chunks of fewer rows than 4 per SM (4 SMs under the interpreter) run the long-block launch."""
    hidden, weight, bias = inputs(40, 16, 9000, torch.float32)
    check(hidden, weight, targets((40,), 9000), bias, chunk_rows=8, label_smoothing=0.1)


def test_integer_target_dtypes():
    hidden, weight, bias = inputs(9, 16, 20, torch.float32)
    t = targets((9,), 20, ignore_every=0)
    for dtype in (torch.int32, torch.int16, torch.uint8):
        check(hidden, weight, t.to(dtype), bias, chunk_rows=4)


def test_empty_inputs():
    hidden, weight, bias = inputs(0, 16, 20, torch.float32)
    y = check(hidden, weight, torch.empty((0,), dtype=torch.long), bias)  # mean of nothing: NaN, zero gradients
    assert torch.isnan(y)
    check(hidden, weight, torch.empty((0,), dtype=torch.long), bias, reduction="none")
    check(hidden, weight, torch.empty((0,), dtype=torch.long), bias, reduction="sum")
    h0, w0, b0 = inputs(5, 0, 20, torch.float32)  # H = 0: logits are the bias
    check(h0, w0, targets((5,), 20), b0)


def test_retain_graph_second_backward():
    """The forward's gradients are scaled in place on the first backward; a second one (retain_graph)
    with another grad_output recomputes instead of scaling them twice."""
    hidden, weight, bias = inputs(13, 24, 30, torch.float32)
    t = targets((13,), 30)
    y = K.linear_cross_entropy(hidden, weight, t, bias, chunk_rows=4)
    ref, refs = reference(hidden, weight, t, bias)
    for g in (2.5, -0.75, 1.0):
        got = torch.autograd.grad(y, [hidden, weight, bias], torch.tensor(g), retain_graph=True)
        want = torch.autograd.grad(ref, list(refs), torch.tensor(g, dtype=torch.float64), retain_graph=True)
        for a, r in zip(got, want):
            assert_close(a, r, torch.float32, f"grad_output {g}")


def test_double_backward_gradient_penalty():
    hidden, weight, bias = inputs(7, 16, 12, torch.float32)
    t = targets((7,), 12)

    def penalty(fn, h, w, b):
        loss = fn(h, w, b)
        (dh,) = torch.autograd.grad(loss, [h], create_graph=True)
        return loss + (dh ** 2).sum()

    ours = penalty(lambda h, w, b: K.linear_cross_entropy(h, w, t, b, chunk_rows=3), hidden, weight, bias)
    hr, wr, br = ref_copy(hidden), ref_copy(weight), ref_copy(bias)
    theirs = penalty(lambda h, w, b: F.cross_entropy(F.linear(h, w, b), t), hr, wr, br)
    assert_close(ours, theirs, torch.float32, "loss + penalty")
    for a, r in zip(torch.autograd.grad(ours, [hidden, weight, bias]), torch.autograd.grad(theirs, [hr, wr, br])):
        assert_close(a, r, torch.float32, "gradient through the penalty")


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_compile_fullgraph(reduction):
    hidden, weight, bias = inputs(0, 24, 40, torch.float32, lead=(2, 7))
    t = targets((2, 7), 40)
    torch._dynamo.reset()
    fn = torch.compile(lambda h, w, b: K.linear_cross_entropy(h, w, t, b, reduction=reduction, chunk_rows=5),
                       fullgraph=True, backend="aot_eager")
    y = fn(hidden, weight, bias)
    ref, refs = reference(hidden, weight, t, bias, reduction=reduction)
    assert_close(y, ref, torch.float32, "compiled loss")
    g = torch.rand(y.shape, dtype=torch.float64) + 0.5
    for a, r in zip(torch.autograd.grad(y, [hidden, weight, bias], g.float()), torch.autograd.grad(ref, list(refs), g)):
        assert_close(a, r, torch.float32, "compiled gradient")


def test_compiled_graph_holds_the_custom_op():
    from torch._dynamo.testing import EagerAndRecordGraphs

    torch._dynamo.reset()
    backend = EagerAndRecordGraphs()
    hidden, weight, _ = inputs(4, 8, 10, torch.float32)
    torch.compile(lambda h, w: K.linear_cross_entropy(h, w, torch.tensor([1, 2, 3, 4])), fullgraph=True,
                  backend=backend)(hidden, weight)
    assert "kernelab.linear_cross_entropy" in backend.graphs[0].code


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_opcheck(reduction):
    hidden, weight, bias = inputs(6, 8, 10, torch.float32)
    t = torch.tensor([1, 2, -100, 9, 0, 3])
    for vocab_chunk in (10, 4):  # the token path, the vocabulary-chunked one
        args = (hidden, weight, t, bias, -100, 0.1, reduction, 4, vocab_chunk, True, True, True)
        torch.library.opcheck(torch.ops.kernelab.linear_cross_entropy.default, args,
                              test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
        grad = torch.ones((6,) if reduction == "none" else ())
        torch.library.opcheck(torch.ops.kernelab.linear_cross_entropy_backward.default,
                              (grad, hidden.detach(), weight.detach(), t, bias.detach(), torch.tensor(5.0), -100, 0.1,
                               reduction, 4, vocab_chunk, True, True, True),
                              test_utils=("test_schema", "test_faketensor"))


def test_never_holds_the_full_logits():
    """Every op the call runs (forward and backward) sees tensors of at most one chunk of logits
    (chunk_rows x V), never N x V; the chunk's matmuls do run at chunk size."""
    n, h, v, rows = 96, 8, 300, 16
    hidden, weight, bias = inputs(n, h, v, torch.float32)
    t = targets((n,), v)
    for reduction in ("mean", "none"):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
            y = K.linear_cross_entropy(hidden, weight, t, bias, chunk_rows=rows, reduction=reduction)
            torch.autograd.grad(y, [hidden, weight, bias], torch.ones_like(y))
        # tensors of 2 dims or more (the interpreter moves each kernel argument's storage as 1-D bytes)
        shapes = [tuple(s) for e in prof.events() for s in e.input_shapes
                  if isinstance(s, (list, tuple)) and len(s) >= 2 and all(isinstance(d, int) for d in s)]
        biggest = max(torch.Size(s).numel() for s in shapes)
        assert biggest <= rows * v < n * v, (reduction, biggest)
        assert (rows, v) in shapes, reduction


def test_vocabulary_chunks_never_hold_a_token_chunk():
    """The default path's largest tensors are the gradients (dW: V x H, dhidden: N x H) and one
    [rows, classes] chunk; nothing of V columns but the weight's own rows."""
    n, h, v = 96, 8, 300
    hidden, weight, bias = inputs(n, h, v, torch.float32)
    t = targets((n,), v)
    for reduction in ("mean", "none"):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
            y = K.linear_cross_entropy(hidden, weight, t, bias, reduction=reduction, chunk_rows=32, vocab_chunk=128)
            torch.autograd.grad(y, [hidden, weight, bias], torch.ones_like(y))
        shapes = {tuple(s) for e in prof.events() for s in e.input_shapes
                  if isinstance(s, (list, tuple)) and len(s) >= 2 and all(isinstance(d, int) for d in s)}
        logit_like = {s for s in shapes if s not in {(v, h), (n, h), (h, v)} and s[-1] != h and s[0] != h}
        assert max(torch.Size(s).numel() for s in logit_like) <= 32 * 128, (reduction, sorted(logit_like))
        assert (32, 128) in shapes and (32, 300 - 256) in shapes, reduction


@pytest.mark.parametrize(
    "make,error,match",
    [
        (lambda h, w, t: (h, w[:, :-1], t), ValueError, "weight must be"),
        (lambda h, w, t: (h, w, t[:-1]), ValueError, "target must have"),
        (lambda h, w, t: (h, w, t.float()), TypeError, "class indices"),
        (lambda h, w, t: (h, w, t.bool()), TypeError, "class indices"),
        (lambda h, w, t: (h, w.half(), t), TypeError, "weight is torch.float16"),
        (lambda h, w, t: (h.long(), w, t), TypeError, "floating-point"),
        (lambda h, w, t: (h, w, t.to("meta")), ValueError, "target is on meta"),
        (lambda h, w, t: (h, w.to("meta"), t), ValueError, "weight is on meta"),
        (lambda h, w, t: (h, w[0], t), ValueError, "weight must be"),
        (lambda h, w, t: (h, w, [1, 2]), TypeError, "target must be a tensor"),
    ],
)
def test_errors(make, error, match):
    hidden, weight, _ = inputs(4, 8, 10, torch.float32)
    with pytest.raises(error, match=match):
        K.linear_cross_entropy(*make(hidden, weight, targets((4,), 10)))


def test_argument_errors():
    hidden, weight, bias = inputs(4, 8, 10, torch.float32)
    t = targets((4,), 10)
    for kw, match in [(dict(reduction="avg"), "reduction"), (dict(label_smoothing=1.5), "label_smoothing"),
                      (dict(chunk_rows=0), "chunk_rows"), (dict(vocab_chunk=0), "vocab_chunk"),
                      (dict(vocab_chunk=2.5), "vocab_chunk"), (dict(vocab_chunk=True), "vocab_chunk"),
                      (dict(bias=bias[:-1]), "bias must be"),
                      (dict(bias=bias.half()), "bias is torch.float16")]:
        with pytest.raises((ValueError, TypeError), match=match):
            K.linear_cross_entropy(hidden, weight, t, **kw)


def test_out_of_range_target():
    """On the host: PyTorch's IndexError. Where nothing checks (GPU targets), the row's loss is NaN and
    so is every gradient it reaches (never a silently wrong value)."""
    import importlib

    hidden, weight, bias = inputs(3, 8, 5, torch.float32)
    with pytest.raises(IndexError, match="Target 9 is out of bounds"):
        K.linear_cross_entropy(hidden, weight, torch.tensor([0, 9, 1]), bias)
    K.linear_cross_entropy(hidden, weight, torch.tensor([0, -100, 1]), bias)  # ignore_index is not out of range
    module = importlib.import_module("kernelab.ops.linear_cross_entropy")
    original = module.check_targets_on_host
    try:
        module.check_targets_on_host = lambda *a: None
        y = K.linear_cross_entropy(hidden, weight, torch.tensor([0, 9, 1]), bias, reduction="none")
        assert torch.isnan(y[1]) and not torch.isnan(y[0]) and not torch.isnan(y[2])
        (dw,) = torch.autograd.grad(K.linear_cross_entropy(hidden, weight, torch.tensor([0, 9, 1]), bias), [weight])
        assert torch.isnan(dw).all()
    finally:
        module.check_targets_on_host = original


def test_float64_runs_the_reference():
    hidden, weight, bias = inputs(5, 8, 10, torch.float64)
    check(hidden, weight, targets((5,), 10), bias)


def test_fallback_without_interpreter_matches_reference():
    script = textwrap.dedent(
        """
        import torch, torch.nn.functional as F, warnings
        import kernelab.ops as K
        h = torch.randn(6, 8, requires_grad=True); w = torch.randn(10, 8, requires_grad=True)
        t = torch.tensor([1, 2, -100, 9, 0, 3])
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("default")
            y = K.linear_cross_entropy(h, w, t, label_smoothing=0.1)
        ref = F.cross_entropy(F.linear(h, w), t, label_smoothing=0.1)
        assert torch.allclose(y, ref), (y, ref)
        y.backward()
        assert w.grad is not None and h.grad is not None
        print("ok")
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
