"""What an optimizer knows about one Muon parameter: :class:`MuonParam`.

Two things are kept apart (the architecture guide's storage and compute layouts):

- what NS runs on — ``shape``, the global matrix as the server sees it (``[r, c]``, ``[b, r, c]``
  for an expert stack, a conv kernel as ``(out, in*kh*kw)``), cut into ``blocks`` of rows that are
  orthogonalized separately (a fused QKV);
- what this rank holds — ``held``: the element ranges of the flattened global matrix that this
  rank pushes gradients for (``[(0, numel)]`` when the parameter is replicated, as under DDP; a
  row range in mode ``shard``; a DTensor's blocks under FSDP2 / tensor parallel, from
  ``layout``, a :class:`~muon_offload.layouts.StorageLayout`), and ``wanted``: the ranges it
  receives updates for (the whole matrix, or the DTensor's local blocks).
"""
from __future__ import annotations

import math
from typing import Dict, List, Sequence, Tuple

Range = Tuple[int, int]

__all__ = ["MuonParam", "row_shard"]


class MuonParam:
    """One registered Muon parameter.

    Attributes:
        name: the name the server knows it by (the optimizer's ``prefix`` included).
        shape: the global matrix shape the server sees (ints).
        options: the registration's options JSON (:meth:`MuonConfig.server_options`).
        blocks: row counts of the blocks orthogonalized separately (``[shape[-2]]`` when one).
        held: element ranges of the flattened global matrix this rank pushes.
        wanted: element ranges this rank receives updates for.
        server: index of the server it is registered with (set at registration).
        layout: the StorageLayout of a DTensor parameter (None for a plain tensor): then the
            gradient pushed and the update applied are the rank's local tensor, packed.
    """
    __slots__ = ("name", "shape", "options", "blocks", "held", "wanted", "server", "layout")

    def __init__(self, name: str, shape: Sequence[int], options: Dict, blocks: List[int]):
        self.name = name
        self.shape = tuple(int(s) for s in shape)
        self.options = options
        self.blocks = list(blocks)
        self.held: List[Range] = [(0, self.numel)]
        self.wanted: List[Range] = [(0, self.numel)]
        self.server = 0
        self.layout = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def wanted_numel(self) -> int:
        """Elements of the update this rank receives (its packed wanted ranges)."""
        return sum(e - b for b, e in self.wanted)

    @property
    def cost(self) -> int:
        """Newton-Schulz cost ~ batch * (min side)^2 * max side (FLOPs per step, up to a
        constant), what servers are balanced by when no plan places the parameter."""
        r, c = self.shape[-2], self.shape[-1]
        return (self.shape[0] if len(self.shape) == 3 else 1) * min(r, c) ** 2 * max(r, c)


def row_shard(shape: Sequence[int], rank: int, world: int) -> List[Range]:
    """Rank ``rank``'s share of whole rows of a matrix of ``shape`` cut evenly over ``world``
    ranks (the last rows of a ragged cut go to the higher ranks; a rank may get none): the
    element ranges of mode ``shard``."""
    cols = shape[-1]
    rows = math.prod(shape) // cols
    cut = [(i * rows // world) * cols for i in range(world + 1)]
    b, e = cut[rank], cut[rank + 1]
    return [(b, e)] if e > b else []
