"""Teams: one long row split across several programs that exchange row statistics on the GPU.

Rows too long for one program's registers (softmax, log_softmax, layer_norm and rms_norm above
``_common.MAX_FUSED`` = 16384 elements) otherwise take two passes over the row: one for the
statistics, one for the output, so x is read twice (3 passes instead of 2, at best 2/3 of copy
bandwidth when the re-read misses L2, as it does for rows of 65536+ elements on the H200).

A team is ``TEAM = cdiv(N, CHUNK)`` programs with consecutive program ids. Member ``i`` holds
columns ``[i * CHUNK, (i + 1) * CHUNK)`` of the team's current row in registers, reduces them to
two float32 partials (softmax: max and sum of exp; layer norm: mean and M2), publishes them and
waits at a team barrier until every member has; then each member combines the team's partials
and writes its chunk. x is read once and y written once: the 2-pass traffic of short rows.

The grid is persistent: ``teams x TEAM`` programs, each team walking rows ``team, team + teams,
...``. A barrier waits for programs of the same grid, so every program must be resident on the
GPU at once, or the first ones would wait forever for programs that cannot start. That is
guaranteed by construction: the kernels are compiled with a register cap (``maxnreg``) that lets
``per_sm`` programs share an SM (65536 registers, at most 64 warps), and the grid holds at most
``per_sm`` programs per SM. (Shared memory is not the limit: these kernels use a few hundred bytes
for their cross-warp reductions.)

The barrier is a counter per team, counting arrivals. For the k-th row (``phase`` k) a member
stores its partials into the team's slot of parity k % 2, a CTA barrier orders every thread's
store before one release increment (``publish``); it then issues the loads of its next row, and
spins on acquire loads until the counter reaches ``(k + 1) * TEAM`` (``gather``), so the wait
overlaps the next row's memory traffic; the partials are then read past L1 (``.cg``). Two slots suffice: a
member can only overwrite a slot (row k + 2) after every member arrived for row k + 1, that is,
after every member read row k's partials. The last member to leave resets its team's counters,
so the buffers are zeroed once per stream and reused by every launch on that stream.

Triton's interpreter runs programs one after another, so a barrier cannot run there: under
``TRITON_INTERPRET=1`` (and with ``KERNELAB_TEAMS=0``) long rows take the two-pass kernels. The
team kernels are checked on the GPU (``benchmarks/bench_ops.py`` compares every shape of its grid
with a float64 reference, outputs poisoned; ``tests/ops/test_teams.py`` on a CUDA machine) and
compiled for sm_90 on CPU by ``tests/ops/test_sm90_compile.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .. import config
from ..launch import current_stream
from . import _common

#: Elements of a row per member, warps per member and members per SM, by kernel kind. Forward
#: kernels hold one chunk (32 floats a thread at 8192 x 8 warps); the backward (softmax's) holds two,
#: y and dy, and each next row's, hence fewer per SM.
FWD_CHUNK, FWD_WARPS, FWD_PER_SM = 8192, 8, 4
BWD_CHUNK, BWD_WARPS, BWD_PER_SM = 8192, 8, 2
#: Largest team: longer rows (over 2M elements at 8192 a member) take the two-pass kernels.
MAX_TEAM = 256
#: Off: long rows take the two-pass kernels (a tuning switch; ``KERNELAB_TEAMS=0`` does the same).
ENABLED = True


def enabled() -> bool:
    """Team kernels may run (not under the interpreter; ``KERNELAB_TEAMS=0`` turns them off)."""
    return ENABLED and not _common.INTERPRETED and config.teams()


@dataclass(frozen=True)
class Plan:
    """A team launch: ``teams * team`` programs of ``warps`` warps, ``chunk`` columns a member,
    compiled with ``maxnreg`` registers a thread so that ``per_sm`` programs fit one SM."""

    chunk: int
    team: int
    teams: int
    warps: int
    maxnreg: int

    @property
    def grid(self) -> tuple[int]:
        return (self.teams * self.team,)

    @property
    def team_p2(self) -> int:
        return _common.next_pow2(self.team)


def register_cap(warps: int, per_sm: int) -> int:
    """Registers a thread may use so that ``per_sm`` programs of ``warps`` warps share one SM's
    65536 (ptxas allocates in units of 8; 255 is the hardware's most)."""
    return min(255, (65536 // (per_sm * warps * 32)) // 8 * 8)


def plan(m: int, n: int, device: torch.device, chunk: int, warps: int, per_sm: int,
         longer_than: int = _common.MAX_FUSED) -> Plan | None:
    """The team launch for ``m`` rows of ``n`` elements, or None where teams do not apply (the
    interpreter, ``KERNELAB_TEAMS=0``, rows of at most ``longer_than`` elements, which one program
    holds, teams larger than MAX_TEAM)."""
    if not enabled() or n <= longer_than:
        return None
    team = _common.cdiv(n, chunk)
    resident = _common.sm_count(device) * per_sm  # programs that run at once, by the register cap
    if team > min(MAX_TEAM, resident):
        return None
    assert per_sm * warps <= 64, "an SM runs at most 64 warps"
    teams = max(1, min(m, resident // team))
    return Plan(chunk=chunk, team=team, teams=teams, warps=warps, maxnreg=register_cap(warps, per_sm))


# --------------------------------------------------------------------------- per-stream buffers
_BUFFERS: dict = {}


def buffers(device: torch.device, p: Plan) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(partials, arrivals, departures) for a launch of plan ``p`` on the current stream of ``device``.

    partials: float32 [teams, 2 parities, 2 values, team_p2], written before being read each row;
    arrivals and departures: int32 counters, one per team, zero between launches (the kernels reset
    them). One pair per (device, stream), grown when a launch needs more: launches on one stream
    run one after another and never share them while they count; two streams get two pairs.
    """
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        key = (index, current_stream(index))
    else:  # a compile-only run (tests/ops/sm90.py) records launches on CPU tensors
        key = (str(device), None)
    need = p.teams * 4 * p.team_p2
    held = _BUFFERS.get(key)
    if held is None or held[0].numel() < need or held[1].shape[1] < p.teams:
        teams = max(p.teams, held[1].shape[1] if held else 0)
        held = (torch.empty(max(need, held[0].numel() if held else 0), dtype=torch.float32, device=device),
                torch.zeros((2, teams), dtype=torch.int32, device=device))
        _BUFFERS[key] = held
    return held[0], held[1][0], held[1][1]


# --------------------------------------------------------------------------- jitted helpers
@triton.jit
def member(CHUNK: tl.constexpr, TEAM: tl.constexpr):
    """(team, member, teams, cols): this program's team and place in it, the number of teams, and
    the columns of the row it holds."""
    pid = tl.program_id(0)
    team = pid // TEAM
    rank = pid % TEAM
    cols = rank * CHUNK + tl.arange(0, CHUNK)
    return team, rank, tl.num_programs(0) // TEAM, cols


@triton.jit
def load_row(ptr, row, stride, cols, ok, M, other):
    """A member's chunk of ``row`` (all ``other`` past the last row: the prefetch after it)."""
    return tl.load(ptr + row * stride + cols, mask=ok & (row < M), other=other)


@triton.jit
def publish(part_ptr, count_ptr, team, rank, phase, a, b, TEAM_P2: tl.constexpr):
    """Publish this member's partials ``(a, b)`` of its team's ``phase``-th row and count it in.

    The increment is a release: it waits for this program's earlier memory operations, so a
    kernel issues its next row's loads after ``publish`` and before ``gather``, where they overlap
    the wait."""
    slot = part_ptr + ((team * 2 + phase % 2) * 2) * TEAM_P2
    tl.store(slot + rank, a)
    tl.store(slot + TEAM_P2 + rank, b)
    tl.debug_barrier()  # every thread's stores precede the release below
    tl.atomic_add(count_ptr + team, 1, sem="release", scope="gpu")


@triton.jit
def gather(part_ptr, count_ptr, team, phase, TEAM: tl.constexpr, TEAM_P2: tl.constexpr):
    """Wait until the whole team has published its ``phase``-th row, then return every member's
    partials as two [TEAM_P2] float32 vectors (lanes past TEAM: 0) and the lane mask."""
    target = (phase + 1) * TEAM
    arrived = tl.atomic_add(count_ptr + team, 0, sem="acquire", scope="gpu")
    while arrived < target:
        arrived = tl.atomic_add(count_ptr + team, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()
    slot = part_ptr + ((team * 2 + phase % 2) * 2) * TEAM_P2
    lanes = tl.arange(0, TEAM_P2)
    valid = lanes < TEAM
    a_all = tl.load(slot + lanes, mask=valid, other=0.0, cache_modifier=".cg")
    b_all = tl.load(slot + TEAM_P2 + lanes, mask=valid, other=0.0, cache_modifier=".cg")
    return a_all, b_all, valid


@triton.jit
def leave(count_ptr, gone_ptr, team, TEAM: tl.constexpr):
    """Count this member out; the team's last one zeroes both of its counters for the next launch
    (every member has passed its last barrier by then: nobody reads them any more)."""
    gone = tl.atomic_add(gone_ptr + team, 1, sem="acq_rel", scope="gpu")
    if gone == TEAM - 1:
        tl.atomic_xchg(count_ptr + team, 0)
        tl.atomic_xchg(gone_ptr + team, 0)
