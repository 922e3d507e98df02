"""Storage layouts: what a rank holds of a sharded parameter, as blocks over the global matrix
(the architecture guide, section 10). The one home of "DTensor placements -> element ranges".

A parameter of a sharded model (FSDP2 ``fully_shard``, tensor parallel ``parallelize_module``,
both on a 2-D mesh, expert stacks sharded on the expert dimension) is a DTensor: a global shape,
a device mesh and one placement per mesh dimension. :func:`storage_layout` turns that into a
:class:`StorageLayout`: per tensor dimension the global indices this rank holds (one interval for
every placement torch uses: ``Shard``, the uneven last shard and an empty one included, and the
``_StridedShard`` of FSDP x TP), the element ranges of the flattened global tensor that the
registration names (``held``: what this rank pushes, ``wanted``: the update it gets back), and
the contributor count the server sums per element.

The index sets come from torch's own split (``placement._split_tensor`` on index vectors, mesh
dimension by mesh dimension, as ``distribute_tensor`` does), so they are DTensor's semantics by
construction, uneven chunks and strided shards included. Replicate placements:

- a mesh dimension whose ranks hold *the same* gradient (TP's replicated parameters, FSDP's HSDP
  replicas when FSDP all-reduces them): only coordinate 0 pushes, every rank wants the update;
- a mesh dimension listed in ``summed_mesh_dims`` (HSDP replicas whose all-reduce is left to the
  server): every rank pushes, the server sums them (``contributors`` = the product of those
  dimensions' sizes) — the pusher divides by ``contributors`` to keep the mean;
- a root-mesh dimension outside a sub-mesh parameter's own mesh, named in ``summed_root_dims``
  (HSDP replicas of a module sharded on the "shard" sub-mesh, which FSDP never all-reduces):
  the same, every replica pushes and the server sums them.

Anything else (``Partial``, an unknown placement, a local shard whose indices are not ascending,
a mesh that spans part of the job without a root mesh naming the rest) raises
:class:`~muon_offload.InvalidArgument` naming the parameter and the placement: never a silent
all-gather.
"""
from __future__ import annotations

import dataclasses
import math
from typing import List, Optional, Sequence, Tuple

import torch

from ._native import InvalidArgument

Range = Tuple[int, int]

__all__ = ["StorageLayout", "storage_layout", "layout_at", "is_dtensor", "local_tensor", "ranges_bytes",
           "shard_like", "replica_groups"]


def is_dtensor(t) -> bool:
    """True for a torch.distributed DTensor (a parameter or gradient of FSDP2 / TP)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch without distributed
        return False
    return isinstance(t, DTensor)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The rank's own tensor of a DTensor (the storage the optimizer reads and updates in
    place; no communication), ``t`` itself otherwise."""
    return t._local_tensor if is_dtensor(t) else t


def shard_like(full: torch.Tensor, layout: "StorageLayout", param) -> torch.Tensor:
    """This rank's blocks of ``full`` (a tensor of the global shape, e.g. the momentum fetched
    from the server) as a DTensor laid out like DTensor ``param`` (same mesh, placements,
    global shape): what a sharded ``state_dict()`` holds, which torch.distributed.checkpoint
    saves shard by shard and reshards on load. No communication."""
    from torch.distributed.tensor import DTensor
    flat = full.reshape(-1)
    local = (torch.cat([flat[b:e] for b, e in layout.wanted]) if layout.wanted
             else flat[:0]).view(layout.local_shape).clone()
    return DTensor.from_local(local, param.device_mesh, param.placements, run_check=False,
                              shape=param.shape, stride=param.stride())


def ranges_bytes(ranges: Sequence[Range], element_size: int) -> int:
    """Bytes of ``ranges`` of elements of ``element_size`` bytes each."""
    return sum(e - b for b, e in ranges) * element_size


@dataclasses.dataclass(frozen=True)
class StorageLayout:
    """What one rank holds of one parameter (see the module docstring).

    Attributes:
        shape: the global tensor shape (ints).
        intervals: per tensor dimension, the half-open global index intervals held, ascending
            (one interval for every torch placement; a rank with no rows has ``[]`` there).
        local_shape: the shape of the rank's local tensor (the product of the intervals).
        held: element ranges [begin, end) of the flattened global tensor this rank pushes
            (``[]`` when another rank pushes the same copy), ascending and merged.
        wanted: element ranges this rank receives updates for: exactly its local tensor, packed
            in ascending order = the local tensor in row-major order.
        contributors: how many ranks push each element (the server sums them); the pushed
            gradient is the local one divided by this count.
        placements: the placements as text, for messages.
    """
    shape: Tuple[int, ...]
    intervals: Tuple[Tuple[Range, ...], ...]
    local_shape: Tuple[int, ...]
    held: Tuple[Range, ...]
    wanted: Tuple[Range, ...]
    contributors: int
    placements: str

    @property
    def local_numel(self) -> int:
        return math.prod(self.local_shape)

    def row_segments(self, blocks: Sequence[int], row_dim: int) -> List[Tuple[int, int, int]]:
        """The local tensor's row-major elements cut by compute blocks of rows: ``blocks`` are
        row counts along tensor dimension ``row_dim`` (the matrix's rows: 0 for a matrix or a
        conv weight seen as (out, in*kh*kw), 1 for an expert stack [E, r, c]), summing to its
        size. Returns ``[(local_begin, local_end, block_rows)]`` covering [0, local_numel) in
        order, adjacent pieces of the same block size merged. The apply rule scales each piece
        by its block's lr factor (the block's global shape, never the local shard's)."""
        cuts, r = [], 0
        for rows in blocks:
            cuts.append((r, r + rows, rows))
            r += rows
        row_elems = math.prod(self.local_shape[row_dim + 1:])
        out: List[Tuple[int, int, int]] = []
        pos = 0
        lead = math.prod(self.local_shape[:row_dim])
        for _ in range(lead):
            for a, b in self.intervals[row_dim]:
                for c0, c1, rows in cuts:
                    lo, hi = max(a, c0), min(b, c1)
                    if hi <= lo:
                        continue
                    n = (hi - lo) * row_elems
                    if out and out[-1][2] == rows and out[-1][1] == pos:
                        out[-1] = (out[-1][0], pos + n, rows)
                    else:
                        out.append((pos, pos + n, rows))
                    pos += n
        return out


def _placement_text(placements) -> str:
    return "(" + ", ".join(str(p) for p in placements) + ")"


def _root_replicas(name: str, mesh, world_size: Optional[int],
                   summed_root_dims: Sequence[str] = ()) -> Tuple[bool, int]:
    """(whether this rank's copy of ``mesh`` pushes, how many copies the server sums): a
    DTensor on a sub-mesh (FSDP on the "dp" dimension of a dp x tp mesh, for a parameter TP
    leaves whole) has one copy per coordinate of the root mesh's other dimensions. Along a
    dimension named in ``summed_root_dims`` the copies hold different gradients (HSDP replicas
    whose module is sharded on the "shard" sub-mesh, so FSDP never reduces across them): every
    copy pushes and the server sums them. Along any other, the copies hold the same gradient
    (TP ranks): the copy at coordinate 0 pushes."""
    get_root = getattr(mesh, "_get_root_mesh", None)
    root = get_root() if get_root is not None else mesh
    names = tuple(mesh.mesh_dim_names or ())
    summed = tuple(summed_root_dims)
    own = [d for d in summed if d in names]
    if own:
        raise InvalidArgument(
            f"parameter '{name}': replica mesh dimension {own[0]!r} is a dimension of its own "
            f"DTensor mesh {names}: FSDP already all-reduces the gradient across it (HSDP on "
            "the 2-D mesh), so the server summing the replicas would reduce twice. Shard its "
            "module on the sub-mesh without it (fully_shard(module, mesh=mesh[...])) to let "
            "the server sum the replicas, or leave replica_mesh_dims empty")
    if root is None or root is mesh or root.ndim == mesh.ndim:
        if summed:
            raise InvalidArgument(
                f"parameter '{name}': replica mesh dimensions {summed} are not dimensions of "
                f"its DTensor's root mesh ({names})")
        if world_size is not None and mesh.size() != world_size:
            raise InvalidArgument(
                f"parameter '{name}': its DTensor mesh has {mesh.size()} of the job's "
                f"{world_size} ranks and no root mesh names the others, so which rank pushes "
                "each copy is unknown: build the meshes with one init_device_mesh and slice it")
        return True, 1
    root_names = tuple(root.mesh_dim_names or ())
    if not names or not set(names) <= set(root_names):
        raise InvalidArgument(
            f"parameter '{name}': its mesh dimensions {names} are not dimensions of the root "
            f"mesh {root_names} (a flattened sub-mesh): not supported")
    unknown = [d for d in summed if d not in root_names]
    if unknown:
        raise InvalidArgument(f"parameter '{name}': replica mesh dimension {unknown[0]!r} is "
                              f"not a dimension of its root mesh {root_names}")
    coord = root.get_coordinate()
    others = [i for i, n in enumerate(root_names) if n not in names]
    first = all(coord[i] == 0 for i in others if root_names[i] not in summed)
    return first, math.prod(root.size(i) for i in others if root_names[i] in summed)


def replica_groups(param, summed_root_dims: Sequence[str]):
    """``[(process group, size)]`` of the root-mesh dimensions in ``summed_root_dims`` that
    DTensor ``param``'s own mesh lacks (the replicas the server sums for a Muon parameter):
    what an AdamW parameter of such a module is averaged over by the optimizer, since FSDP
    does not. [] for a parameter on its root mesh."""
    mesh = param.device_mesh
    get_root = getattr(mesh, "_get_root_mesh", None)
    root = get_root() if get_root is not None else None
    if root is None or root is mesh or root.ndim == mesh.ndim:
        return []
    names = set(mesh.mesh_dim_names or ())
    return [(root.get_group(d), root.size(i)) for i, d in enumerate(root.mesh_dim_names or ())
            if d in summed_root_dims and d not in names]


def storage_layout(name: str, param: torch.Tensor, summed_mesh_dims: Sequence[int] = (),
                   world_size: Optional[int] = None,
                   summed_root_dims: Sequence[str] = ()) -> StorageLayout:
    """The storage layout of DTensor ``param`` on this rank (see the module docstring).

    Args:
        name: the parameter's name, for messages.
        param: a DTensor (its ``device_mesh``, ``placements`` and global ``shape`` are read; no
            communication).
        summed_mesh_dims: mesh dimensions (indices into ``param.device_mesh``) with a Replicate
            placement whose ranks hold different gradients the server sums.
        world_size: the job's rank count, to check that the mesh covers the job.
        summed_root_dims: names of root-mesh dimensions outside the parameter's own mesh whose
            ranks hold different gradients the server sums (HSDP replicas of a module sharded
            on the "shard" sub-mesh: FSDP reduce-scatters within a replica and never
            all-reduces across them); every replica pushes, ``contributors`` multiplies by their
            sizes.

    Raises InvalidArgument naming the parameter and the placement for a placement it cannot
    express (Partial, unknown kinds, a summed dimension that is not Replicate), or naming the
    dimension for a summed root dimension that is not one (or is one of the parameter's own
    mesh: FSDP already reduces there), TypeError for a tensor that is not a DTensor.
    """
    if not is_dtensor(param):
        raise TypeError(f"storage_layout: '{name}' is not a DTensor")
    mesh = param.device_mesh
    coord = mesh.get_coordinate()
    if coord is None:
        raise InvalidArgument(f"parameter '{name}': this rank is not in its DTensor mesh")
    first_copy, replicas = _root_replicas(name, mesh, world_size, summed_root_dims)
    return layout_at(name, param.shape, param.placements, mesh.shape, coord, summed_mesh_dims,
                     first_copy, replicas)


def layout_at(name: str, shape: Sequence[int], placements: Sequence, mesh_shape: Sequence[int],
              coordinate: Sequence[int], summed_mesh_dims: Sequence[int] = (),
              pushes: bool = True, replicas: int = 1) -> StorageLayout:
    """The storage layout at mesh ``coordinate`` of a tensor of global ``shape`` with
    ``placements`` on a mesh of ``mesh_shape``: :func:`storage_layout` without a DTensor (no
    process group needed: the byte counts of bench/shard_bytes.py use it for every rank of a
    job). ``pushes`` False: another copy of the mesh pushes (a sub-mesh's other coordinates);
    ``replicas``: copies of the mesh the server sums (each pushes; multiplies ``contributors``).
    Raises InvalidArgument as :func:`storage_layout`."""
    from torch.distributed.tensor import Replicate, Shard
    placements = tuple(placements)
    shape = tuple(int(s) for s in shape)
    text = _placement_text(placements)
    coord = [int(c) for c in coordinate]
    sizes = [int(n) for n in mesh_shape]
    summed = set(int(d) for d in summed_mesh_dims)
    idx = [torch.arange(n) for n in shape]
    contributors = int(replicas)
    for k, pl in enumerate(placements):
        kind = type(pl).__name__
        if isinstance(pl, Replicate):
            if k in summed:
                contributors *= sizes[k]
            elif coord[k] != 0:
                pushes = False
            continue
        if k in summed:
            raise InvalidArgument(f"parameter '{name}': mesh dimension {k} is {pl}, not "
                                  f"Replicate, so its ranks cannot be summed (placements {text})")
        # Shard and _StridedShard (a Shard subclass in some torch versions, not in others).
        if not (isinstance(pl, Shard) or kind == "_StridedShard") or not hasattr(pl, "dim"):
            raise InvalidArgument(
                f"parameter '{name}': placement {pl} on mesh dimension {k} (placements {text}) "
                "cannot be expressed as blocks of the global matrix; a Partial parameter must be "
                "reduced by the training stack first (muon-offload never all-gathers it)")
        d = pl.dim if pl.dim >= 0 else pl.dim + len(shape)
        # torch's own split on an index vector laid along dimension d.
        v = idx[d].reshape([1] * d + [-1])
        chunks, _ = pl._split_tensor(v, sizes[k], with_padding=False)
        idx[d] = chunks[coord[k]].reshape(-1) if coord[k] < len(chunks) else idx[d][:0]
    intervals = []
    for d, v in enumerate(idx):
        step = v[1:] - v[:-1]
        if bool((step <= 0).any()):
            raise InvalidArgument(f"parameter '{name}': placements {text} give this rank "
                                  f"indices of dimension {d} out of order: not supported")
        # Runs of consecutive indices (one for every placement torch uses).
        breaks = (step != 1).nonzero().reshape(-1).tolist()
        starts, ends = [0] + [b + 1 for b in breaks], breaks + [v.numel() - 1]
        intervals.append(tuple((int(v[a]), int(v[b]) + 1) for a, b in zip(starts, ends))
                         if v.numel() else ())
    local_shape = tuple(sum(b - a for a, b in ivs) for ivs in intervals)
    wanted = tuple(_element_ranges(shape, intervals))
    return StorageLayout(shape=shape, intervals=tuple(intervals), local_shape=local_shape,
                         held=wanted if pushes else (), wanted=wanted,
                         contributors=contributors, placements=text)


def _element_ranges(shape: Sequence[int], intervals: Sequence[Sequence[Range]]) -> List[Range]:
    """Element ranges of the flattened ``shape`` covered by the product of per-dimension
    ``intervals``, ascending and merged (row-major order: the local tensor's order)."""
    if any(not ivs for ivs in intervals):
        return []
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    out: List[Range] = []

    whole = [len(ivs) == 1 and ivs[0] == (0, n) for ivs, n in zip(intervals, shape)]

    def walk(d: int, base: int):
        if d == len(shape) - 1 or all(whole[d + 1:]):
            # The later dimensions are whole: each interval of d is one contiguous range.
            for a, b in intervals[d]:
                lo, hi = base + a * strides[d], base + b * strides[d]
                if out and out[-1][1] == lo:
                    out[-1] = (out[-1][0], hi)
                else:
                    out.append((lo, hi))
            return
        for a, b in intervals[d]:
            for i in range(a, b):
                walk(d + 1, base + i * strides[d])

    walk(0, 0)
    return out
