"""Team kernels (``kernelab/ops/teams.py``) on a CUDA GPU: long rows split across programs that
wait for each other, which Triton's interpreter cannot run (it runs programs one at a time).

Run on a GPU machine WITHOUT TRITON_INTERPRET: ``python -m pytest tests/gpu -q``. Skipped
elsewhere (CI has no GPU; under the interpreter the ops take the two-pass kernels instead).
"""

import importlib

import pytest
import torch

from kernelab import ops as K
from kernelab.ops import _common

teams = importlib.import_module("kernelab.ops.teams")

pytestmark = pytest.mark.skipif(
    _common.INTERPRETED or not torch.cuda.is_available(), reason="team kernels run on a CUDA GPU, without the interpreter"
)

TOL = {torch.float32: (2e-5, 1e-5), torch.bfloat16: (2e-2, 1.6e-2)}
#: (rows, columns): more rows than teams (each team loops), fewer, odd lengths, teams of 2 to 32.
SHAPES = [(3, 65536), (300, 40000), (1, 262144), (1000, 131072), (7, 16385), (64, 24577)]


def close(out, ref, dtype, what):
    rtol, atol = TOL[dtype]
    ref = ref.to(torch.float64)
    scale = ref[torch.isfinite(ref)].abs().max().item() if torch.isfinite(ref).any() else 1.0
    assert out.shape == ref.shape, what
    same_nan = torch.equal(torch.isnan(out), torch.isnan(ref))
    assert same_nan, f"{what}: NaN positions differ"
    torch.testing.assert_close(out.double().nan_to_num(0.0), ref.nan_to_num(0.0), rtol=rtol, atol=atol * scale, msg=what)


def inputs(shape, dtype, seed=0, strided=False):
    g = torch.Generator("cuda").manual_seed(seed)
    m, n = shape
    x = torch.randn(m, n + (64 if strided else 0), device="cuda", generator=g, dtype=torch.float32) * 3
    x = x[:, :n].to(dtype) if strided else x.to(dtype)
    dy = torch.randn(m, n, device="cuda", generator=g, dtype=torch.float32).to(dtype)
    return x, dy


def counters_zero():
    torch.cuda.synchronize()
    return all(int(c.abs().sum()) == 0 for _, c in teams._BUFFERS.values())


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_team(shape, dtype, log):
    assert teams.plan(*shape, torch.device("cuda"), teams.FWD_CHUNK, teams.FWD_WARPS, teams.FWD_PER_SM) is not None
    x, dy = inputs(shape, dtype, strided=shape[0] == 300)
    x.requires_grad_(True)
    y = (K.log_softmax if log else K.softmax)(x, -1)
    (dx,) = torch.autograd.grad(y, x, dy)
    x64 = x.detach().double().requires_grad_(True)
    y64 = torch.log_softmax(x64, -1) if log else torch.softmax(x64, -1)
    (dx64,) = torch.autograd.grad(y64, x64, dy.double())
    close(y, y64, dtype, "y")
    close(dx, dx64, dtype, "dx")
    assert counters_zero()


def test_softmax_team_special_rows():
    x = torch.randn(8, 65536, device="cuda")
    x[1] = float("-inf")  # all -inf: NaN, as torch
    x[2, :40000] = float("-inf")  # whole members -inf, others finite
    x[3, 12345] = 1e4  # one huge value
    x[4, 100] = float("nan")
    close(K.softmax(x, -1), torch.softmax(x.double(), -1), torch.float32, "special rows")
    assert counters_zero()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rms", [False, True])
def test_norm_team(shape, dtype, rms):
    """The forward by teams, the backward by the two-pass kernels."""
    m, n = shape
    x, dy = inputs(shape, dtype, seed=1, strided=m == 300)
    x = (x + 5).requires_grad_(True)  # an offset: the mean matters
    g = torch.Generator("cuda").manual_seed(2)
    w = torch.randn(n, device="cuda", generator=g).to(dtype).requires_grad_(True)
    b = torch.randn(n, device="cuda", generator=g).to(dtype).requires_grad_(True)
    leaves = [x, w] if rms else [x, w, b]
    y = K.rms_norm(x, (n,), w, eps=1e-6) if rms else K.layer_norm(x, (n,), w, b)
    grads = torch.autograd.grad(y, leaves, dy)
    ref_leaves = [t.detach().double().requires_grad_(True) for t in leaves]
    if rms:
        y64 = torch.nn.functional.rms_norm(ref_leaves[0], (n,), ref_leaves[1], eps=1e-6)
    else:
        y64 = torch.nn.functional.layer_norm(ref_leaves[0], (n,), ref_leaves[1], ref_leaves[2])
    ref_grads = torch.autograd.grad(y64, ref_leaves, dy.double())
    close(y, y64, dtype, "y")
    for name, got, want in zip("xwb", grads, ref_grads):
        close(got, want, dtype, f"d{name}")
    assert counters_zero()


def test_two_streams_get_their_own_buffers():
    x = torch.randn(64, 65536, device="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        y_side = K.softmax(x, -1)
    y_main = K.softmax(x, -1)
    torch.cuda.synchronize()
    assert len({key[1] for key in teams._BUFFERS}) >= 2
    close(y_side, torch.softmax(x.double(), -1), torch.float32, "side stream")
    close(y_main, torch.softmax(x.double(), -1), torch.float32, "main stream")
    assert counters_zero()


def test_teams_off_takes_the_two_pass_kernels(monkeypatch):
    monkeypatch.setattr(teams, "ENABLED", False)
    assert teams.plan(4, 65536, torch.device("cuda"), teams.FWD_CHUNK, teams.FWD_WARPS, teams.FWD_PER_SM) is None
    x = torch.randn(4, 65536, device="cuda")
    close(K.softmax(x, -1), torch.softmax(x.double(), -1), torch.float32, "two-pass")
