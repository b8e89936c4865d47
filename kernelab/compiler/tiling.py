"""The compiler's launch heuristics as data: how a row or a column reduction is tiled on a GPU.

The templates' ``launch`` functions (``templates/pointwise.py``, ``rows.py``, ``columns.py``) read
these; a tuning script passes its own (``kernelab.compile(fn, options={"tiling": Tiling(...)})``)
instead of patching those functions. The interpreter keeps its own small tiles (its programs run
one at a time) whatever is passed. The defaults are what the H200 measured (the functions'
docstrings say how).
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["PointwiseTiling", "RowTiling", "ColumnTiling", "Tiling", "DEFAULT"]


@dataclass(frozen=True)
class PointwiseTiling:
    """A pointwise kernel: ``block`` elements a program (fewer where the tensor is smaller),
    ``per_thread`` of them a thread (the warps follow, 1 to 8)."""

    block: int = 2048
    per_thread: int = 8

    def __post_init__(self):
        _positive(self, "block", "per_thread")


@dataclass(frozen=True)
class RowTiling:
    """A row reduction (softmax, norms: a reduction over the last dim).

    ``per_thread``: elements of one [XBLOCK, RBLOCK] tile per thread per live value for rows held
    in registers; ``looped_per_thread``: the same for rows walked in chunks (longer than
    ``persistent_max``); ``looped``: walk every row in chunks; ``var_persistent_max``: the longest
    row kept in registers when the group takes a variance."""

    per_thread: int = 16
    looped_per_thread: int = 8
    looped: bool = False
    var_persistent_max: int = 4096

    def __post_init__(self):
        _positive(self, "per_thread", "looped_per_thread", "var_persistent_max")


@dataclass(frozen=True)
class ColumnTiling:
    """A column reduction (sums over every dim but the last: bias and norm-weight gradients).

    Column blocks of ``cblock`` columns; a tile of ``light_elems`` (``heavy_elems``) elements on
    ``light_warps`` (``heavy_warps``) warps for a light group (one sum of at most two ops) (any
    other); rows split so that every SM gets ``programs_per_sm`` programs, each walking at least
    ``min_tiles`` tiles."""

    cblock: int = 32
    light_elems: int = 8192
    heavy_elems: int = 2048
    light_warps: int = 4
    heavy_warps: int = 8
    min_tiles: int = 2
    programs_per_sm: int = 2

    def __post_init__(self):
        _positive(self, "cblock", "light_elems", "heavy_elems", "light_warps", "heavy_warps", "min_tiles",
                  "programs_per_sm")

    @classmethod
    def uniform(cls, cblock: int, elems: int, warps: int, min_tiles: int, programs_per_sm: int = 2) -> "ColumnTiling":
        """One setting for light and heavy groups alike (a tuning grid's point)."""
        return cls(cblock, elems, elems, warps, warps, min_tiles, programs_per_sm)


@dataclass(frozen=True)
class Tiling:
    pointwise: PointwiseTiling = field(default_factory=PointwiseTiling)
    rows: RowTiling = field(default_factory=RowTiling)
    columns: ColumnTiling = field(default_factory=ColumnTiling)


def _positive(obj, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{type(obj).__name__}.{name} must be a positive integer, got {value!r}")


#: What the methods use where nothing is passed in.
DEFAULT = Tiling()
