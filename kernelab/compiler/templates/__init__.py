"""The kernel templates: one module per kind of group, each the one home of that kind's kernel.

A group's kind (``Group.kind``, decided while planning) names its template:

=============  ===================  ==========================================================
kind           module               the kernel
=============  ===================  ==========================================================
pointwise      ``pointwise.py``     every element once (gathers, cat pieces, scatters too)
reduction      ``rows.py``          reductions over the last dim: the row in registers, or
                                    passes over it (``rows_looped.py``) for long rows
column         ``columns.py``       sums, means and variances over every dim but the last
=============  ===================  ==========================================================

Each module provides the same four things, which is all the group runner (``group_runner.py``)
and the code generator need of a kind:

* ``KIND``: the group kind it generates; ``CATEGORY``: what its kernels count as in a prediction
  (``kernelab count``: pointwise or reduction);
* ``source(group, rank, persistent) -> str``: the ``@triton.jit`` function (one variant per
  merged rank, and for rows per persistent/looped);
* ``prepare(runner, raw, shape, device) -> base.Call``: for one call's inputs, the outputs'
  layouts, the grid, the launch settings (``launch``, from ``tiling.py``'s data) and the
  arguments after the pointers, cached by the runner per shape key;
* ``reads_before_it_stores(group) -> bool``: whether every element of an input is read before
  the same element of an output is stored (an output may then take a dead input's memory).

A new kind of kernel is a new module here with these four names, added to :data:`TEMPLATES`
(and the planner's rules that form its groups, in ``graph.py`` and ``fusion.py``).
"""
from __future__ import annotations

from ..emit import name_locally
from . import columns, pointwise, rows
from .base import HEADER

__all__ = ["TEMPLATES", "template", "kernel_source"]

#: group kind -> its template module
TEMPLATES = {module.KIND: module for module in (pointwise, rows, columns)}


def template(kind: str):
    """The template module of a group kind (a ValueError naming the kinds there are otherwise)."""
    try:
        return TEMPLATES[kind]
    except KeyError:
        raise ValueError(f"no kernel template for groups of kind {kind!r} (kinds: {', '.join(TEMPLATES)})") from None


def kernel_source(group, rank: int, persistent: bool = True) -> str:
    """The whole module text of one kernel variant: the header, then the template's function."""
    name_locally(group)
    return HEADER + template(group.kind).source(group, rank, persistent)
