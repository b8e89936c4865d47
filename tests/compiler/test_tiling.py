"""The compiler's launch heuristics as data (``kernelab/compiler/tiling.py``): what a GPU launch of a
row or column reduction becomes under a given Tiling, passed through ``options={"tiling": ...}``
as the tuning scripts do (instead of patching ``GroupRunner`` methods)."""
import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import kernelab.compiler as kc
from kernelab.compiler import graph, group_runner
from kernelab.compiler.templates import columns, pointwise, rows
from kernelab.compiler.backend import decompositions
from kernelab.compiler.tiling import DEFAULT, ColumnTiling, PointwiseTiling, RowTiling, Tiling
from kernelab.errors import KernelabError


def _runner(fn, kind, tiling, *args):
    gm = make_fx(fn, decomposition_table=decompositions())(*args)
    (group,) = [g for g in graph.partition(gm).groups if g.kind == kind]
    return group_runner.GroupRunner(group, interpret=False, tiling=tiling)


def _row_launch(fn, tiling, x, *rest):
    runner = _runner(fn, "reduction", tiling, x, *rest)
    return rows.launch(runner, (x.shape[0],), [(x.shape[1],)], x.shape[0], x.shape[1], [x])


def test_rows_follow_the_tiling():
    x, w = torch.randn(64, 8192), torch.randn(8192)

    def norm(x, w):
        return F.layer_norm(x, (8192,), w)

    assert not _row_launch(norm, DEFAULT, x, w).persistent  # a variance over 8192: looped by default
    assert _row_launch(norm, Tiling(rows=RowTiling(var_persistent_max=8192)), x, w).persistent
    soft = _row_launch(lambda x: x.softmax(-1), DEFAULT, x)
    assert soft.persistent
    assert not _row_launch(lambda x: x.softmax(-1), Tiling(rows=RowTiling(looped=True)), x).persistent
    short = torch.randn(64, 1024)
    warps16 = _row_launch(lambda x: x.softmax(-1), DEFAULT, short).num_warps
    warps8 = _row_launch(lambda x: x.softmax(-1), Tiling(rows=RowTiling(per_thread=8)), short).num_warps
    assert warps8 == 2 * warps16  # half the elements a thread: twice the warps for one tile


def test_columns_follow_the_tiling(monkeypatch):
    monkeypatch.setattr(columns, "sm_count", lambda device: 132)  # an H200's, without a GPU here
    x, y = torch.randn(8192, 768), torch.randn(768)
    fn = lambda x, y: (x * y).sum(0)  # noqa: E731
    default = columns.launch(_runner(fn, "column", DEFAULT, x, y), 8192, 768, torch.device("cpu"))
    assert (default.block["CBLOCK"], default.num_warps) == (32, 4)  # a light group
    wide = Tiling(columns=ColumnTiling.uniform(128, 8192, 8, 8, programs_per_sm=4))
    launch = columns.launch(_runner(fn, "column", wide, x, y), 8192, 768, torch.device("cpu"))
    assert launch.block["CBLOCK"] == 128 and launch.block["XBLOCK"] == 64 and launch.num_warps == 8
    # 6 column blocks, 4 x 132 programs wanted, at most 128 tiles / 8 per split: 16 splits of 8 tiles
    assert launch.block["splits"] == 16 and launch.block["tiles"] == 8


def test_pointwise_kernels_follow_the_tiling():
    x = torch.randn(64, 256)
    fn = lambda x: (x * 2).relu()  # noqa: E731

    def launch(tiling, numel=1 << 20):
        return pointwise.launch(_runner(fn, "pointwise", tiling, x), [numel], [[1], [1]], numel)

    default = launch(DEFAULT)
    assert (default.block["BLOCK"], default.num_warps) == (2048, 8)  # 8 elements a thread
    small = launch(Tiling(pointwise=PointwiseTiling(1024, 4)))
    assert (small.block["BLOCK"], small.num_warps) == (1024, 8)
    odd = launch(Tiling(pointwise=PointwiseTiling(3000, 64)))  # a block rounds up to a power of two
    assert (odd.block["BLOCK"], odd.num_warps) == (4096, 2)
    assert launch(DEFAULT, numel=100).block["BLOCK"] == 128  # never more than the tensor


def test_a_tiling_passed_to_compile_gives_the_same_values():
    x, y = torch.randn(300, 40), torch.randn(40)
    tiling = Tiling(rows=RowTiling(per_thread=4, looped=True), columns=ColumnTiling.uniform(64, 1024, 8, 1))
    got = kc.compile(lambda x, y: ((x * y).sum(0), (x * y).softmax(-1)), options={"tiling": tiling})(x, y)
    torch.testing.assert_close(got[0], (x * y).sum(0), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(got[1], (x * y).softmax(-1), rtol=1e-5, atol=1e-6)


def test_bad_tilings_are_refused():
    with pytest.raises(KernelabError, match="must be a kernelab.compiler.tiling.Tiling"):
        kc.compile(lambda x: x + 1, options={"tiling": {"cblock": 64}})
    with pytest.raises(ValueError, match="ColumnTiling.cblock must be a positive integer"):
        ColumnTiling(cblock=0)
    with pytest.raises(ValueError, match="RowTiling.per_thread must be a positive integer"):
        RowTiling(per_thread=2.5)
    with pytest.raises(ValueError, match="PointwiseTiling.block must be a positive integer"):
        PointwiseTiling(block=-1)
