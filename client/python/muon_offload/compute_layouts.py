"""Compute layouts: the matrices Newton-Schulz runs on for each Muon parameter (the architecture
guide, section 10), named per parameter by a name pattern, as torchtitan does.

A layout is one of:

- ``"whole"``: the matrix as the server sees it (2-D as is; a 3-D or larger tensor flattened
  to ``(d0, d1*d2*...)``, one matrix);
- ``"per_expert"``: a 3-D expert stack ``[E, r, c]`` as E independent ``[r, c]`` matrices (the
  default for 3-D tensors);
- ``"row_blocks:N"`` (or ``{"row_blocks": N}``): N equal blocks of rows orthogonalized
  separately (each head of a fused QKV, per-head Muon); N must divide the rows;
- a list of row counts ``[q, k, v]`` summing to the rows (a fused QKV of unequal parts).

Which applies to a parameter, first match wins: ``row_splits[name]`` (MuonConfig's exact-name
lists), the first pattern of ``compute_layouts`` (``fnmatch`` over the name, in the mapping's
order) that matches, the plan's ``row_blocks`` for the parameter (``MUON_OFFLOAD_PLAN``:
``parameters[].row_blocks``), else ``whole`` (``per_expert`` for 3-D). The scale rule and the
lr factor use each block's global shape (rows of the block x the matrix's columns), never a
local shard's.
"""
from __future__ import annotations

import fnmatch
from typing import List, Mapping, Optional, Sequence, Tuple

from ._native import InvalidArgument

__all__ = ["resolve", "match"]


def match(name: str, patterns: Optional[Mapping[str, object]]):
    """The layout of the first pattern in ``patterns`` that matches ``name`` (an exact key
    first), or None."""
    if not patterns:
        return None
    if name in patterns:
        return patterns[name]
    for pattern, layout in patterns.items():
        if fnmatch.fnmatchcase(name, pattern):
            return layout
    return None


def resolve(name: str, tensor_shape: Sequence[int], matrix_shape: Sequence[int],
            layout) -> Tuple[bool, List[int]]:
    """What ``layout`` (see the module docstring; None: the default) means for a parameter of
    ``tensor_shape`` that the server would see as ``matrix_shape``: ``(flatten, blocks)`` —
    whether a 3-D tensor is flattened to one matrix, and the row counts of the blocks (one
    block: ``[rows]``). Raises InvalidArgument naming the parameter for an unknown layout,
    ``per_expert`` on a tensor that is not 3-D, or blocks that do not cut the rows."""
    rows = int(matrix_shape[-2])
    if layout is None:
        return False, [rows]
    if isinstance(layout, dict) and set(layout) == {"row_blocks"}:
        layout = f"row_blocks:{layout['row_blocks']}"
    if layout == "whole":
        flat = len(tensor_shape) == 3
        return flat, [int(tensor_shape[0]) if flat else rows]
    if layout == "per_expert":
        if len(tensor_shape) != 3:
            raise InvalidArgument(f"compute layout of '{name}': per_expert needs a 3-D expert "
                                  f"stack [E, r, c], the tensor is {tuple(tensor_shape)}")
        return False, [rows]
    if isinstance(layout, str) and layout.startswith("row_blocks:"):
        try:
            n = int(layout.split(":", 1)[1])
        except ValueError:
            n = 0
        if n < 1 or rows % n:
            raise InvalidArgument(f"compute layout of '{name}': {layout!r} must be a block "
                                  f"count >= 1 that divides its {rows} rows")
        return False, [rows // n] * n
    if isinstance(layout, (list, tuple)) and layout and all(
            isinstance(r, int) and not isinstance(r, bool) for r in layout):
        if any(r <= 0 for r in layout) or sum(layout) != rows:
            raise InvalidArgument(f"compute layout of '{name}': row blocks {list(layout)} must "
                                  f"be positive and sum to its {rows} rows")
        return False, [int(r) for r in layout]
    raise InvalidArgument(f"compute layout of '{name}': {layout!r} is not 'whole', "
                          "'per_expert', 'row_blocks:N' or a list of row counts")

