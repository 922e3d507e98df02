"""OffloadMuon on FSDP2 (fully_shard, gloo, CPU, 2 and 4 ranks) against InProcessMuon on the
unsharded model, which averages the full gradients itself.

Each rank pushes its local shard after FSDP's reduce-scatter and gets back its shard's update.
With 2 ranks the weights are bitwise the reference's: FSDP's reduce-scatter averages with
ReduceOp.AVG, (a + b) / 2, the reference a / 2 + b / 2, equal in binary floating point (halving
is exact). With 4 ranks within 1e-6 relative + 1e-7 absolute, not bitwise: ReduceOp.AVG forms
(a + b + c + d) / 4, the reference a/4 + b/4 + c/4 + d/4, which round differently; there fc1's
5 rows go 2, 2, 1, 0 (a rank with no rows), the 1-row gate to rank 0 alone. Also checked: each rank pushes exactly its shards' bytes and receives exactly its
shards' update bytes (the client's counters), and step() issues no collective at all (torch's
CommDebugMode, which sees the reference's all-reduce), backward only FSDP's own all-gather and
reduce-scatter."""
import pytest
import torch
import torch.multiprocessing as mp

import shard_worker
from helpers import free_port

STEPS = 3


@pytest.mark.parametrize("world", [2, 4])
def test_fsdp2_in_process_shard_bytes_no_collectives(world, server, tmpdir_private):
    init = f"tcp://127.0.0.1:{free_port()}"
    mp.spawn(shard_worker.run_fsdp, args=(world, init, server.socket, str(tmpdir_private),
                                          STEPS), nprocs=world, join=True)
    out = [torch.load(tmpdir_private / f"fsdp_{r}.pt") for r in range(world)]
    ref = out[0]["inprocess"]
    for r, o in enumerate(out):
        assert set(o["fsdp"]) == set(ref)
        for n, p in o["fsdp"].items():
            if world == 2:
                assert torch.equal(p, ref[n]), f"rank {r}: '{n}' differs from the in-process run"
            else:
                assert torch.allclose(p, ref[n], rtol=1e-6, atol=1e-7), \
                    f"rank {r}: '{n}' off by {(p - ref[n]).abs().max().item()}"
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
    # 5 rows over 2 ranks: 3 and 2, over 4: 2, 2, 1, 0; the 1-row gate: rank 0 alone.
    assert [o["local_numel"]["fc1.weight"] for o in out] == \
        ([36, 24] if world == 2 else [24, 24, 12, 0])
    assert [o["local_numel"]["gate.weight"] for o in out] == [12] + [0] * (world - 1)


def initial_params():
    return {n: p.detach() for n, p in shard_worker.ShardNet().named_parameters()}
