#!/usr/bin/env python3
"""Bytes a rank moves per step for the Muon matrices of a model under FSDP over N ranks:
muon-offload (push the shard, receive the shard's update) vs an all-gather of the full
matrices (ZeRO-3 style: every rank gathers every gradient and runs Newton-Schulz on all of
them) vs an all-to-all to owner ranks (torchtitan DistMuon / Canzona style: each matrix's
shards go to one owner rank, which runs Newton-Schulz and sends the update shards back).

The matrices and shapes come from a plan (``muon-offload plan --output plan.json``: its
``parameters[].shape``); each rank's shard from muon_offload.layouts.layout_at with FSDP2's
placement Shard(0) (torch.chunk rows: the uneven last shard included). Per rank, the maximum
over ranks of:

- ours: gradient bytes pushed to the owner server + update bytes received from it (exactly the
  rank's rows, once each way);
- all-gather: bytes received + sent (a ring all-gather: each rank receives every row it does not
  hold and forwards as many);
- all-to-all: phase 1, a rank sends its rows of the matrices others own and receives the others'
  rows of its own; phase 2, the same back with the update; owners by the plan's LPT order (each
  matrix to the least-loaded rank by Newton-Schulz cost, as the plan spreads servers).

Usage: scripts/venv-python bench/shard_bytes.py --plan plan.json [--ranks 8 64]
           [--element-bytes 4]
Prints a Markdown table (MiB per rank per step).
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "client" / "python"))

from muon_offload.layouts import layout_at  # noqa: E402

MIB = 1024.0 ** 2


def rank_rows(shape, world: int):
    """Element counts of each rank's FSDP2 Shard(0) shard of a matrix of ``shape``."""
    from torch.distributed.tensor import Shard
    return [sum(e - b for b, e in layout_at("m", shape, [Shard(0)], [world], [r]).wanted)
            for r in range(world)]


def owners(params, world: int):
    """Each matrix's owner rank: longest cost first, to the least-loaded rank."""
    load = [0.0] * world
    out = {}
    for p in sorted(params, key=lambda p: -p["ns_flops"]):
        r = min(range(world), key=lambda i: load[i])
        out[p["name"]] = r
        load[r] += p["ns_flops"]
    return out


def bytes_per_rank(params, world: int, esize: int):
    """(ours, all-gather, all-to-all): the max over ranks of bytes sent + received per step."""
    ours = [0] * world
    gather = [0] * world
    a2a = [0] * world
    owner = owners(params, world)
    for p in params:
        shape = [int(s) for s in p["shape"]]
        full = math.prod(shape)
        local = rank_rows(shape, world)
        o = owner[p["name"]]
        for r in range(world):
            ours[r] += 2 * local[r]                   # push the rows, receive their update
            gather[r] += 2 * (full - local[r])        # ring: receive and forward the rest
            if r == o:
                a2a[r] += 2 * 2 * (full - local[r])   # gather in, scatter out; both phases
            else:
                a2a[r] += 2 * 2 * local[r]
    return tuple(max(v) * esize for v in (ours, gather, a2a))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", required=True, help="a plan JSON (muon-offload plan --output)")
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--element-bytes", type=int, default=4,
                    help="bytes per gradient/update element (4: f32, 2: bf16)")
    args = ap.parse_args(argv)
    plan = json.loads(pathlib.Path(args.plan).read_text())
    params = plan["parameters"]
    total = sum(math.prod(p["shape"]) for p in params) * args.element_bytes
    print(f"{plan['model']['name']}: {len(params)} Muon matrices, {total / MIB:.0f} MiB at "
          f"{args.element_bytes} bytes per element\n")
    print("| FSDP ranks | ours (push + update) | all-gather | all-to-all to owners | "
          "all-gather / ours | all-to-all / ours |")
    print("|---|---|---|---|---|---|")
    for world in args.ranks:
        ours, gather, a2a = bytes_per_rank(params, world, args.element_bytes)
        print(f"| {world} | {ours / MIB:.1f} MiB | {gather / MIB:.1f} MiB | {a2a / MIB:.1f} MiB"
              f" | {gather / ours:.1f} | {a2a / ours:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
