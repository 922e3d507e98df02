"""One rank of the lost-rank tests (spawned by test_lost_rank.py): 2 ranks under gloo train
TinyNet (Muon and AdamW parameters) for 2 steps; then rank 1 dies or stalls and rank 0 records
what it learns, and how."""
import json
import os
import time

import torch
import torch.distributed as dist

from helpers import TinyNet, train

KW = dict(lr=0.03, weight_decay=0.05, adamw_lr=2e-3)


def wait_for(path: str, what: str, limit_s: float = 120.0):
    """Polls for a file (a hang guard, not a timing assertion)."""
    give_up = time.monotonic() + limit_s
    while not os.path.exists(path):
        if time.monotonic() > give_up:
            raise RuntimeError(f"{what}: {path} did not appear within {limit_s} s")
        time.sleep(0.01)


def run(rank: int, scenario: str, init: str, socket: str, outdir: str):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    from muon_offload.torch import OffloadMuon
    model = TinyNet()
    opt = OffloadMuon(model.named_parameters(), servers=[socket], **KW)
    train(model, opt, 2, rank=rank)
    done = os.path.join(outdir, "rank0.json")
    if rank == 1:
        if scenario == "stalls":
            wait_for(done, "rank 1 waiting for rank 0's verdict")  # paused, pushing nothing
        os._exit(0)  # no goodbye: the server sees the connection break
    out = {}
    if scenario == "between_steps":
        # Rank 0 calls nothing of the client: the server's report must come by itself.
        give_up = time.monotonic() + 120.0
        while opt._client.lost_peer() is None:
            if time.monotonic() > give_up:
                raise RuntimeError("no report of the lost rank within 120 s")
            time.sleep(0.01)
        out["lost_peer"] = list(opt._client.lost_peer())
    try:
        train(model, opt, 1, start=2, rank=rank)
        out["error"] = None
    except Exception as e:  # noqa: BLE001 - the type is what the test checks
        out["error"] = type(e).__name__
        out["message"] = str(e)
    with open(done + ".tmp", "w") as f:
        json.dump(out, f)
    os.rename(done + ".tmp", done)
    os._exit(0)  # the process group has a dead peer: no orderly teardown
