"""HSDP without an all-reduce of Muon gradients across the replicas: 4 gloo ranks on a 2 x 2
(replicate, shard) mesh, the modules holding Muon matrices sharded on mesh["shard"] (FSDP
reduce-scatters within a replica, never across), OffloadMuon(replica_mesh_dims=("replicate",)):
every replica pushes its shard, the server sums the replicas.

Checked: after 3 steps every rank's parameters equal InProcessMuon on the unsharded model
averaging all 4 gradients, within 1e-5 relative + 1e-6 absolute, not bitwise: the mean of 4
gradients is formed in another order (FSDP's reduce-scatter AVG within a replica, then the
server's sum of the replicas halved, against the reference's all-reduce of g/4), which rounds
differently; the optimizer adds no difference of its own (test_fsdp.py: bitwise where the
gradient is the same). Each rank pushes exactly its shards' bytes, both replicas, one push per
shard per step. No all-reduce moves a Muon gradient: backward all-reduces only the root's AdamW
shards (embed, head: FSDP's native HSDP), step() only the sub-mesh modules' AdamW biases."""
import torch
import torch.multiprocessing as mp

import shard_worker
from helpers import free_port

WORLD, STEPS = 4, 3


def test_hsdp_server_sums_replicas_without_muon_all_reduce(server, tmpdir_private):
    init = f"tcp://127.0.0.1:{free_port()}"
    mp.spawn(shard_worker.run_hsdp, args=(WORLD, init, server.socket, str(tmpdir_private),
                                          STEPS), nprocs=WORLD, join=True)
    out = [torch.load(tmpdir_private / f"hsdp_{r}.pt") for r in range(WORLD)]
    init_params = dict(shard_worker.HNet().named_parameters())
    ref = out[0]["ref"]
    for r, o in enumerate(out):
        for n, p in o["hsdp"].items():
            assert torch.allclose(p, ref[n], rtol=1e-5, atol=1e-6), \
                f"rank {r}: '{n}' off by {(p - ref[n]).abs().max().item()}"
            assert (ref[n] - init_params[n]).abs().max().item() > 1e-3, f"'{n}' did not move"
        loc = o["local_numel"]
        muon = ("fc1.weight", "fc2.weight")
        for s in o["hsdp_stats"]:
            assert s["bytes_pushed"] == 4 * sum(loc[n] for n in muon), (r, s)  # both replicas
            assert s["bytes_received"] == 4 * sum(loc[n] for n in muon), (r, s)
            assert s["push_frames"] == 2, (r, s)
        # The only all-reduces: the root's AdamW shards in backward, the biases in step().
        root_adamw = 4 * (loc["embed.weight"] + loc["head.weight"])
        assert all(sum(b) == root_adamw for b in o["hsdp_backward_reduced"]), \
            (r, o["hsdp_backward_reduced"], root_adamw)
        biases = 4 * (loc["fc1.bias"] + loc["fc2.bias"])
        assert o["hsdp_step_reduced"] == [[biases]] * STEPS, (r, o["hsdp_step_reduced"])
    # A replica dimension FSDP already all-reduces (the 2-D root) is refused: no double
    # reduction; so is a name the mesh does not have.
    assert "already all-reduces the gradient across it" in out[0]["own_error"], out[0]
    assert "'own'" in out[0]["own_error"]
    assert "replica mesh dimension 'rep' is not a dimension of its root mesh" in \
        out[0]["unknown_error"], out[0]
    # The replicas of one shard hold the same rows: fc1's 5 rows as 3 and 2.
    assert [o["local_numel"]["fc1.weight"] for o in out] == [36, 24, 36, 24]
