"""The host side of the team kernels (``kernelab/ops/teams.py``): which rows get a team, how big
the grid is, the register cap that keeps the whole grid resident, the per-stream buffers.

The kernels themselves cannot run under the interpreter (their barrier waits for programs the
interpreter runs later); ``tests/gpu/test_teams.py`` runs them on a GPU, and
``test_sm90_compile.py`` compiles them for sm_90 here.
"""

import importlib

import pytest
import torch

from kernelab.ops import _common

teams = importlib.import_module("kernelab.ops.teams")
CUDA = torch.device("cuda", 0)


@pytest.fixture
def h200(monkeypatch):
    """Plans as on a 132-SM GPU, outside the interpreter."""
    monkeypatch.setattr(teams, "enabled", lambda: True)
    monkeypatch.setattr(_common, "sm_count", lambda device: 132)


def test_register_cap_fits_the_programs_per_sm():
    assert teams.register_cap(8, 4) == 64  # 4 x 256 threads x 64 = 65536 registers
    assert teams.register_cap(8, 2) == 128
    assert teams.register_cap(8, 3) == 80  # 85 rounded down to ptxas's unit of 8
    assert teams.register_cap(1, 1) == 255  # the hardware's most
    for warps, per_sm in ((4, 8), (8, 3), (16, 2), (8, 5)):
        assert teams.register_cap(warps, per_sm) * warps * 32 * per_sm <= 65536


def test_no_teams_under_the_interpreter():
    assert _common.INTERPRETED
    assert teams.plan(64, 65536, CUDA, 8192, 8, 4) is None


def test_plan_sizes(h200):
    p = teams.plan(1000, 65536, CUDA, 8192, 8, 4)
    assert (p.chunk, p.team, p.warps, p.maxnreg) == (8192, 8, 8, 64)
    assert p.teams == 132 * 4 // 8  # every resident slot used
    assert p.grid == (p.teams * 8,) and p.grid[0] <= 132 * 4
    assert p.team_p2 == 8
    odd = teams.plan(5, 40000, CUDA, 8192, 8, 4)
    assert (odd.team, odd.team_p2, odd.teams) == (5, 8, 5)  # one team a row when rows are few


def test_grid_never_exceeds_the_resident_programs(h200):
    for n in (16385, 65536, 100003, 262144, 1 << 20, 2 << 20):
        for per_sm in (2, 4):
            p = teams.plan(1 << 20, n, CUDA, 8192, 8, per_sm)
            assert p is not None, n
            assert p.grid[0] <= 132 * per_sm
            assert p.team * p.chunk >= n > (p.team - 1) * p.chunk


def test_rows_without_a_team(h200):
    assert teams.plan(64, 16384, CUDA, 8192, 8, 4) is None  # one program holds the row
    assert teams.plan(64, 12000, CUDA, 4096, 8, 2, longer_than=8192) is not None  # the norm backward's threshold
    too_long = (teams.MAX_TEAM + 1) * 8192
    assert teams.plan(64, too_long, CUDA, 8192, 8, 4) is None  # larger than MAX_TEAM: two passes
    assert teams.plan(64, 200 * 8192, CUDA, 8192, 8, 1) is None  # more members than resident programs


def test_switches(h200, monkeypatch):
    monkeypatch.undo()
    monkeypatch.setattr(_common, "INTERPRETED", False)
    monkeypatch.setattr(_common, "sm_count", lambda device: 132)
    assert teams.plan(64, 65536, CUDA, 8192, 8, 4) is not None
    monkeypatch.setenv("KERNELAB_TEAMS", "0")
    assert teams.plan(64, 65536, CUDA, 8192, 8, 4) is None
    monkeypatch.delenv("KERNELAB_TEAMS")
    monkeypatch.setattr(teams, "ENABLED", False)
    assert teams.plan(64, 65536, CUDA, 8192, 8, 4) is None


def test_buffers_grow_and_counters_start_at_zero(h200, monkeypatch):
    monkeypatch.setattr(teams, "_BUFFERS", {})
    cpu = torch.device("cpu")
    small = teams.plan(10, 65536, CUDA, 8192, 8, 4)
    part, arrived, gone = teams.buffers(cpu, small)
    assert part.dtype == torch.float32 and part.numel() >= small.teams * 4 * small.team_p2
    assert arrived.dtype == gone.dtype == torch.int32
    assert arrived.numel() >= small.teams and int(arrived.abs().sum()) == int(gone.abs().sum()) == 0
    again = teams.buffers(cpu, small)
    assert again[0] is part  # reused, not reallocated
    big = teams.plan(10_000, 65536, CUDA, 8192, 8, 4)
    part2, arrived2, _ = teams.buffers(cpu, big)
    assert part2.numel() >= big.teams * 4 * big.team_p2 and arrived2.numel() >= big.teams
