"""OffloadMuon on FSDP2 (fully_shard, gloo, CPU, 2 ranks) against InProcessMuon on the unsharded
model, which averages the full gradients itself.

Each rank pushes its local shard after FSDP's reduce-scatter and gets back its shard's update.
With 2 ranks the weights are bitwise the reference's: FSDP's reduce-scatter averages with
ReduceOp.AVG, (a + b) / 2, the reference a / 2 + b / 2, equal in binary floating point (halving
is exact). Also checked: each rank pushes exactly its shards' bytes and receives exactly its
shards' update bytes (the client's counters), and step() issues no collective at all (torch's
CommDebugMode, which sees the reference's all-reduce), backward only FSDP's own all-gather and
reduce-scatter."""
import torch
import torch.multiprocessing as mp

import shard_worker
from helpers import free_port

WORLD, STEPS = 2, 3


def test_fsdp2_bitwise_in_process_shard_bytes_no_collectives(server, tmpdir_private):
    init = f"tcp://127.0.0.1:{free_port()}"
    mp.spawn(shard_worker.run_fsdp, args=(WORLD, init, server.socket, str(tmpdir_private),
                                          STEPS), nprocs=WORLD, join=True)
    out = [torch.load(tmpdir_private / f"fsdp_{r}.pt") for r in range(WORLD)]
    ref = out[0]["inprocess"]
    for r, o in enumerate(out):
        assert set(o["fsdp"]) == set(ref)
        for n, p in o["fsdp"].items():
            assert torch.equal(p, ref[n]), f"rank {r}: '{n}' differs from the in-process run"
            assert not torch.equal(p, initial_params()[n]), f"'{n}' did not train"
    for r, o in enumerate(out):
        muon = [n for n, (kind, _) in o["routing"].items() if kind == "muon"]
        assert sorted(muon) == ["experts", "fc1.weight", "fc2.weight", "gate.weight"]
        shard_bytes = 4 * sum(o["local_numel"][n] for n in muon)
        held = sum(1 for n in muon if o["local_numel"][n])
        for s in o["stats"]:
            assert s["push_frames"] == held, (r, s)  # one push per held shard per step
            assert s["bytes_pushed"] == shard_bytes, (r, s)
            assert s["bytes_received"] == shard_bytes, (r, s)
        assert o["step"] == [{}] * STEPS, f"rank {r}: step() issued collectives {o['step']}"
        # c10d's names: FSDP's all-gather of the parameters and reduce-scatter of the gradients.
        assert set(o["backward"]) == {"_allgather_base_", "_reduce_scatter_base_"}, o["backward"]
        # The counter sees collectives: the reference's step all-reduces.
        assert all(c.get("allreduce_", 0) > 0 for c in o["ref_step"]), o["ref_step"]
    # 5 rows over 2 ranks: 3 and 2; the 1-row gate: rank 1 holds none of it.
    assert [o["local_numel"]["fc1.weight"] for o in out] == [36, 24]
    assert [o["local_numel"]["gate.weight"] for o in out] == [12, 0]


def initial_params():
    return {n: p.detach() for n, p in shard_worker.ShardNet().named_parameters()}
