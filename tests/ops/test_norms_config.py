"""layer_norm / rms_norm launch settings (``norms.NormConfig`` through ``norms.configured``) at the
widths models use: values and gradients of x, weight and bias against float64 PyTorch.

Every setting a tuning run may pick must be correct at every width class: non-powers of two that
waste lanes of a power-of-two tile (768, 2880, 5120, 7168; held as a head and a tail where that
wastes fewer, or as one tile), the long-row backward (12288: a stats
kernel, then column tiles), several rows per program (narrow rows, few programs), the weight
gradients summed by atomics with the last program finishing them.
"""

import pytest
import torch
import torch.nn.functional as F

from kernelab.ops import _common, norms
from tests.ops.conftest import assert_close, grads
from tests.ops.helpers import randn, ref_copy

CONFIGS = {
    "default": norms.DEFAULT,
    "4/SM, 2 stages": norms.NormConfig(bwd_programs_per_sm=4, bwd_stages=2),
    "4/SM in waves": norms.NormConfig(bwd_programs_per_sm=4, bwd_stages=2, bwd_one_wave=False),
    "1 program/SM, 3 stages, w held": norms.NormConfig(bwd_programs_per_sm=1, bwd_stages=3, bwd_hold_w=True),
    "atomic, 1 program/SM": norms.NormConfig(bwd_atomic=True, bwd_programs_per_sm=1),
    "atomic, long rows past 4096": norms.NormConfig(bwd_atomic=True, bwd_max_fused=4096),
    "4096-element tiles, 8 a thread": norms.NormConfig(fwd_tile=4096, fwd_per_thread=8, bwd_tile=4096, bwd_per_thread=8),
    # the forward's long-row settings: no register cap, and rows past 4096 taken by the long-row
    # path (teams on a GPU, the looped kernel under the interpreter)
    "forward: no register cap, long rows past 4096": norms.NormConfig(fwd_reg_cap=0, fwd_one_pass_max=4096),
    "forward: looped kernel past 4096": norms.NormConfig(fwd_one_pass_max=4096, fwd_teams=False),
    # long rows' backward in one kernel (x and dy re-read from L2), one and two rows at a time
    "backward: long rows past 4096 in one kernel": norms.NormConfig(bwd_max_fused=4096, bwd_long_one_kernel=True),
    "backward: long rows past 4096 in one kernel, 2 rows x 1024": norms.NormConfig(
        bwd_max_fused=4096, bwd_long_one_kernel=True, bwd_long_rows=2, bwd_long_chunk=1024, bwd_long_warps=4),
    # rows of non-power-of-two widths as one power-of-two tile instead of a head and a tail
    "one tile (rows not split)": norms.NormConfig(fwd_split=False, bwd_split=False),
    "forward: looped kernel past 4096, 1024-element chunks, 4 warps":
        norms.NormConfig(fwd_one_pass_max=4096, fwd_teams=False, fwd_loop_chunk=1024, fwd_loop_warps=4,
                         fwd_loop_stages=1),
}
#: (rows, width): model widths with an odd number of rows (rows per program do not divide evenly)
SHAPES = [(37, 768), (9, 2880), (5, 5120), (7, 7168), (3, 12288)]


def check(config, rms, shape, dtype=torch.float32, weight=True, bias=True, seed=0):
    m, n = shape
    ops = norms.configured(config)
    x = randn(shape, dtype, scale=2.0, shift=1.0, seed=seed)
    w = randn((n,), dtype, shift=1.0, seed=seed + 1, grad=weight is True) if weight else None
    b = randn((n,), dtype, seed=seed + 2, grad=bias is True) if bias and not rms else None
    y = ops.rms_norm(x, (n,), w, 1e-6) if rms else ops.layer_norm(x, (n,), w, b, 1e-5)
    xr, wr, br = ref_copy(x), ref_copy(w), ref_copy(b)
    ref = F.rms_norm(xr, (n,), wr, 1e-6) if rms else F.layer_norm(xr, (n,), wr, br, 1e-5)
    assert_close(y, ref, dtype, "forward")
    g = torch.randn(shape, generator=torch.Generator().manual_seed(seed + 3), dtype=torch.float64).to(dtype)
    named = [(name, t, r) for name, t, r in (("dx", x, xr), ("dw", w, wr), ("db", b, br)) if t is not None and t.requires_grad]
    ours = grads(y, [t for _, t, _ in named], g)
    theirs = grads(ref, [r for _, _, r in named], g.double())
    for (name, t, _), a, r in zip(named, ours, theirs):
        assert_close(a, r, t.dtype, f"{name} ({config})")


@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
@pytest.mark.parametrize("label", list(CONFIGS))
def test_configs_at_model_widths(label, rms):
    for i, shape in enumerate(SHAPES):
        check(CONFIGS[label], rms, shape, seed=i)


@pytest.mark.parametrize("label", ["default", "atomic, 1 program/SM"])
def test_float16_and_partial_grads(label):
    config = CONFIGS[label]
    check(config, False, (6, 2880), torch.float16)
    check(config, False, (5, 768), weight="no grad", bias=True)   # db only
    check(config, False, (5, 768), weight=True, bias="no grad")   # dw only
    check(config, False, (5, 768), weight=None, bias=None)        # dx only
    check(config, True, (4, 5120), weight="no grad")


@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
def test_looped_forward_merges_its_lanes_exactly(rms):
    """The looped forward keeps a running mean and M2 per lane and merges the lanes at the end:
    rows whose last chunk is partial (lanes that saw one value fewer), a row shorter than one
    chunk, and rows far from zero (100 + noise: a sum of squares minus the squared mean would
    lose three digits of the variance in float32) against float64."""
    config = norms.NormConfig(fwd_one_pass_max=16, fwd_teams=False, fwd_loop_chunk=256, fwd_loop_warps=2)
    ops = norms.configured(config)
    for n in (100, 256, 257, 700, 1280):
        x = torch.randn(3, n, generator=torch.Generator().manual_seed(n)) + (0.0 if rms else 100.0)
        w = torch.rand(n, generator=torch.Generator().manual_seed(n + 1)) + 0.5
        y = ops.rms_norm(x, (n,), w, 1e-6) if rms else ops.layer_norm(x, (n,), w, None, 1e-5)
        xd, wd = x.double(), w.double()
        ref = F.rms_norm(xd, (n,), wd, 1e-6) if rms else F.layer_norm(xd, (n,), wd, None, 1e-5)
        assert_close(y, ref, torch.float32, f"looped forward, {n} columns")


@pytest.mark.parametrize("rows", [1, 2])
def test_long_rows_in_one_kernel_add_each_programs_row_blocks(rows):
    """The one-kernel long-row backward adds every row block of a program into that program's
    partial row (the first block writes it): 61 rows on 16 programs (4 SMs x 4 under the
    interpreter) is 3-4 row blocks a program; the last chunk of 5121 columns is partial. dw and
    db alone, and float16."""
    config = norms.NormConfig(bwd_max_fused=4096, bwd_long_one_kernel=True, bwd_long_rows=rows, bwd_long_chunk=1024,
                              bwd_long_warps=4)
    check(config, False, (61, 5121), seed=3)
    check(config, True, (61, 5121), seed=4)
    check(config, False, (29, 4500), weight="no grad", bias=True)
    check(config, False, (29, 4500), weight=True, bias="no grad")
    check(config, False, (10, 4200), torch.float16)


def test_default_split_rules_are_the_measured_ones():
    """The defaults the H200 chose (benchmarks/results/norm_tune_split_stop28_h200.csv): the forward
    splits rows of non-power-of-two widths; the backward splits rms_norm's rows at every width and
    layer_norm's up to LN_BWD_SPLIT_MAX columns (its split at 5120 and 6144 measured slower)."""
    fwd = norms._fwd_tile(4096, 5120, False, norms.DEFAULT)[0]
    assert (fwd.block_n, fwd.tail) == (4096, 1024)
    for n, rms, tail in ((2880, False, 1024), (5120, False, 0), (6144, False, 0), (5120, True, 1024),
                         (6144, True, 2048), (7168, True, 0)):
        assert norms._bwd_tile(4096, n, rms, norms.DEFAULT).tail == tail, (n, rms)
    assert norms._bwd_tile(4096, 5120, False, norms.NormConfig(bwd_split=True)).tail == 1024
    assert norms._bwd_tile(4096, 5120, True, norms.NormConfig(bwd_atomic=True)).tail == 0  # atomics: one part


def test_atomic_workspace_is_left_zero_and_reused():
    config = CONFIGS["atomic, 1 program/SM"]
    for seed in range(2):  # a second call on the same workspace gives float64-exact gradients again
        check(config, False, (11, 3072), seed=seed)
    ws, count = _common.zeroed_workspace(torch.device("cpu"), 0)
    assert int(count.item()) == 0 and not ws.any()


def test_configured_rejects_other_settings():
    with pytest.raises(TypeError, match="NormConfig"):
        norms.configured({"bwd_atomic": True})


def test_occupancy_of_the_h200_binaries():
    """Programs an SM runs at once, for register / shared-memory figures ptxas gave the backward
    (``python -m tests.ops.sm90 --norms``): threads, registers per warp in units of 256, shared
    memory with 1 KiB reserved per program."""
    assert _common.occupancy(106, 49236, 16) == 1   # 5120-8192 columns, 16 warps
    assert _common.occupancy(71, 24628, 8) == 3     # 2560-4096 columns, 8 warps
    assert _common.occupancy(64, 24628, 8) == 4
    assert _common.occupancy(115, 10296, 4) == 4    # 768-1024 columns, 4 warps
    assert _common.occupancy(94, 10280, 4) == 5
    assert _common.occupancy(64, 98392, 16) == 2    # shared memory: two 97 KiB programs fit 228 KiB
    assert _common.occupancy(64, 120_000, 4) == 1
    assert _common.occupancy(32, 0, 1) == 32        # at most 32 programs an SM
    # off the GPU (interpreter), the count the launchers' 4 simulated SMs assume
    assert _common.resident_per_sm(None, (), 4, torch.device("cpu"), {}) == 4


def test_tile_settings_must_be_powers_of_two():
    for bad in ({"fwd_loop_chunk": 3000}, {"bwd_long_rows": 3}, {"bwd_long_warps": 0}):
        with pytest.raises(ValueError, match="power of two"):
            norms.NormConfig(**bad)
