"""How close a result must be to its reference: tolerances and comparisons shared by the CPU tests
(``tests/compiler/conftest.py`` re-exports them) and the GPU tests. Importing this module changes
nothing else: ``tests/compiler/conftest.py`` sets TRITON_INTERPRET=1 when imported, which would
make a GPU test's kernels run in the interpreter."""
import torch

#: (rtol, atol) per dtype against a float64 reference; atol is relative to the largest magnitude.
TOLERANCE = {torch.float32: (2e-5, 2e-6), torch.float16: (4e-3, 2e-3)}


def assert_close(actual, expected, dtype=torch.float32, what=""):
    """Values (NaN where the reference has NaN, same infinities) within the dtype's tolerance."""
    rtol, atol = TOLERANCE.get(dtype, TOLERANCE[torch.float32])
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    if not expected.is_floating_point():
        assert torch.equal(actual, expected), what
        return
    a, e = actual.double(), expected.double()
    finite = torch.isfinite(e)
    scale = e[finite].abs().max().item() if finite.any() else 1.0
    torch.testing.assert_close(a, e, rtol=rtol, atol=atol * max(scale, 1.0), equal_nan=True, msg=lambda m: f"{what}: {m}")


#: relative-norm tolerance of a model's loss, logits and each gradient against eager (float32)
REL = 1e-4
#: absolute slack, relative to the largest gradient norm of the model: gradients that are zero in
#: exact arithmetic (a softmax's key bias, whose gradient cancels over each row) are rounding noise
#: in both runs, so their relative error means nothing
ABS = 1e-5


def rel_norm(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected||, in float64."""
    return ((actual.double() - expected.double()).norm() / expected.double().norm().clamp_min(1e-30)).item()


def gradients_off(grads: dict, ref: dict) -> dict:
    """name -> relative error of each gradient off its reference by more than REL (plus ABS of the
    largest reference gradient's norm)."""
    scale = max(g.double().norm().item() for g in ref.values())
    return {n: rel_norm(grads[n], g) for n, g in ref.items()
            if (grads[n].double() - g.double()).norm().item() > REL * g.double().norm().item() + ABS * scale}


#: how much farther from float64 than eager's a gradient may land, where the model is so
#: ill-conditioned in float32 that eager itself is far from float64 (``less_accurate_than_eager``)
ACCURACY_RATIO = 1.5


def less_accurate_than_eager(grads: dict, ref: dict, exact: dict, names) -> dict:
    """name -> (error, eager's error), both relative to the float64 gradient ``exact[name]``, of each
    of ``names`` whose error exceeds ``ACCURACY_RATIO`` times eager's plus REL. For gradients that
    ``gradients_off`` finds off eager's: in a model whose float32 gradients are themselves far from
    float64 (batch norm over a few values, RegNet's at 4x4 pixels: eager 1e-2 off float64), two
    float32 computations summing in other orders (eager's own, at another thread count) land 1e-3
    apart, and the meaningful question is whether the compiled one is less accurate than eager."""
    out = {}
    for name in names:
        err, eager_err = rel_norm(grads[name], exact[name]), rel_norm(ref[name], exact[name])
        if err > ACCURACY_RATIO * eager_err + REL:
            out[name] = (err, eager_err)
    return out
