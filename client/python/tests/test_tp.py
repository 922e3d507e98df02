"""OffloadMuon under tensor parallelism (parallelize_module: ColwiseParallel = Shard(0),
RowwiseParallel = Shard(1)) on 4 gloo ranks, FSDP2 x TP on a 2 x 2 (dp, tp) mesh (the
strided row shard of a column-parallel weight under FSDP, a row block x column block of a
row-parallel one), and HSDP (2 replicas x 2 shards: FSDP all-reduces the replicas, replica 0
pushes), against InProcessMuon on the unsharded model averaging over the data-parallel
ranks.

Tolerance, not bitwise: RowwiseParallel's forward sums partial products over the TP ranks (an
all-reduce) where the unsharded model sums them in one matmul, so activations and gradients
differ by float rounding (~1e-7 relative) before Muon sees them (HSDP: FSDP averages 4
gradients in another order than the reference's all-reduce); the optimizer adds no
difference of its own (test_fsdp.py shows it bitwise where the gradients are). Bound: 1e-5
relative + 1e-6 absolute on every parameter after 3 steps (the steps move them ~1e-2)."""
import torch
import torch.multiprocessing as mp

import shard_worker
from helpers import free_port

WORLD, STEPS = 4, 3


def test_tp_and_fsdp_tp_match_in_process(server, tmpdir_private):
    init = f"tcp://127.0.0.1:{free_port()}"
    mp.spawn(shard_worker.run_tp, args=(WORLD, init, server.socket, str(tmpdir_private), STEPS),
             nprocs=WORLD, join=True)
    out = [torch.load(tmpdir_private / f"tp_{r}.pt") for r in range(WORLD)]
    init_params = dict(shard_worker.TPNet().named_parameters())
    for variant in ("tp", "fsdp_tp", "hsdp"):
        for r, o in enumerate(out):
            ref = out[0][variant + "_ref"]
            for n, p in o[variant].items():
                assert torch.allclose(p, ref[n], rtol=1e-5, atol=1e-6), \
                    f"{variant} rank {r}: '{n}' off by {(p - ref[n]).abs().max().item()}"
                moved = (ref[n] - init_params[n]).abs().max().item()
                assert moved > 1e-3, f"{variant}: '{n}' moved only {moved}"
            muon = ("w1.weight", "w2.weight")
            shard_bytes = 4 * sum(o[variant + "_local_numel"][n] for n in muon)
            # HSDP: FSDP all-reduced the replicas, so replica 1 (ranks 2, 3) pushes nothing and
            # receives its shard's update.
            pushed = 0 if variant == "hsdp" and r >= 2 else shard_bytes
            for s in o[variant + "_stats"]:
                assert s["bytes_pushed"] == pushed and s["bytes_received"] == shard_bytes, \
                    (variant, r, s)
                # One push per parameter per step, the column block of w2 (8 rows under TP, 4
                # under FSDP x TP) included: registered as one block, pushed as one frame.
                assert s["push_frames"] == (2 if pushed else 0), (variant, r, s)
    for r, o in enumerate(out):
        # TP: w1 12 x 8 by rows (3 each), w2 8 x 12 by columns (3 each: one range per row,
        # one block on the wire).
        assert o["tp_local_numel"]["w1.weight"] == 24 and o["tp_local_numel"]["w2.weight"] == 24
        assert o["tp_wanted_ranges"] == {"tp/w1.weight": 1, "tp/w2.weight": 8}
        # FSDP x TP: w1 rows cut by tp (6) then dp (3); w2 rows by dp (4) x columns by tp (6).
        assert o["fsdp_tp_local_numel"]["w1.weight"] == 24
        assert o["fsdp_tp_local_numel"]["w2.weight"] == 24
        # step() all-reduces only the AdamW plain tensors (embed, head: 2 x 128 floats) under
        # TP, after the ranks agree on which of them have gradients (an int32 flag each);
        # nothing under FSDP x TP (FSDP reduced them; every parameter is a DTensor).
        assert o["tp_step_reduced"] == [2 * 4 + 2 * 128 * 4] * STEPS, o["tp_step_reduced"]
        assert o["fsdp_tp_step_reduced"] == [0] * STEPS
        assert o["fsdp_tp_step_collectives"] == [{}] * STEPS, o["fsdp_tp_step_collectives"]
        assert o["hsdp_step_collectives"] == [{}] * STEPS, o["hsdp_step_collectives"]
        assert all(set(c) == {"allreduce_"} for c in o["tp_step_collectives"])
