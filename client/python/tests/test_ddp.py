"""OffloadMuon under DistributedDataParallel, 2 gloo ranks, each on its own data.

The DDP-wrapped runs equal the unwrapped run bitwise: the Muon gradients go to the server from
DDP's buckets (each rank's local gradient / 2, summed by the server in contributor order, as
without DDP), the AdamW gradients are averaged by DDP through our communication hook exactly as
the bare optimizer averages them (divide by 2, one all-reduce sum; a two-term float sum is
commutative). Counted by wrapping torch.distributed.all_reduce: the DDP runs all-reduce exactly
the AdamW gradient bytes each step, so the Muon bytes DDP all-reduces are 0. Gradient
accumulation with DDP's no_sync() equals no_commit() without DDP (bitwise with 2 ranks: g/2 is
exact)."""
import torch
import torch.multiprocessing as mp

import dist_worker
from helpers import free_port

STEPS = 4


def test_ddp_equals_unwrapped_and_all_reduces_no_muon_bytes(server, tmpdir_private):
    init = f"tcp://127.0.0.1:{free_port()}"
    mp.spawn(dist_worker.run_ddp, args=(2, init, server.socket, str(tmpdir_private)), nprocs=2,
             join=True)
    out = {(v, r): torch.load(tmpdir_private / f"{v}_{r}.pt")
           for v in ("bare", "ddp", "ddp_small_buckets", "bare_acc", "ddp_acc") for r in (0, 1)}
    for r in (0, 1):
        for variant, ref in (("ddp", "bare"), ("ddp_small_buckets", "bare"),
                             ("ddp_acc", "bare_acc")):
            got, want = out[(variant, r)], out[(ref, r)]
            assert got["losses"] == want["losses"], (variant, r)
            for i, (p, q) in enumerate(zip(got["params"], want["params"])):
                assert torch.equal(p, q), f"{variant} rank {r}: parameter {i} differs"
            # Muon gradients are consumed under DDP too (step() drops DDP's copy).
            assert all(g is None for g in got["muon_grads"]), variant
            adamw, muon = got["adamw_bytes"], got["muon_bytes"]
            assert adamw > 0 and muon > 0
            # Every all-reduce of the DDP run: the AdamW gradients, once per step; no Muon byte.
            assert got["reduced_bytes"] == STEPS * adamw, (variant, got["reduced_bytes"])
            assert got["hook"] == {"allreduced": STEPS * adamw, "pushed": STEPS * muon}
        # The bare run averages its AdamW gradients itself: the same bytes, in step(), after the
        # ranks agree on which gradients exist (an int32 flag per parameter).
        bare = out[("bare", r)]
        assert bare["reduced_bytes"] == STEPS * (bare["adamw_bytes"] + bare["flag_bytes"])
    # Different data per rank, one model: the weights agree across ranks.
    for p, q in zip(out[("ddp", 0)]["params"], out[("ddp", 1)]["params"]):
        assert torch.equal(p, q)
    assert out[("ddp", 0)]["losses"] != out[("ddp", 1)]["losses"]
