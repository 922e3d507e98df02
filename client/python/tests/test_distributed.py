"""2 ranks under torch.distributed (gloo, CPU), both modes, against the in-process reference:

- server_reduce: each rank pushes grad/2 of its own data; the server sums the 2 contributions.
- shard: ranks all-reduce, then each pushes its row shard (one contributor per element).

Ranks see different data, so the final weights only agree if the gradients were averaged. With
2 ranks the three variants are bitwise equal (a two-term float sum is commutative)."""
import socket

import torch
import torch.multiprocessing as mp

import dist_worker


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_both_modes_bitwise_inprocess(server, tmpdir_private):
    init = f"tcp://127.0.0.1:{free_port()}"
    mp.spawn(dist_worker.run, args=(2, init, server.socket, str(tmpdir_private)), nprocs=2,
             join=True)
    out = {(v, r): torch.load(tmpdir_private / f"{v}_{r}.pt")
           for v in ("inprocess", "server_reduce", "shard") for r in (0, 1)}
    ref = out[("inprocess", 0)]
    for key, o in out.items():
        assert len(o["params"]) == len(ref["params"])
        for i, (p, q) in enumerate(zip(o["params"], ref["params"])):
            assert torch.equal(p, q), f"{key}: parameter {i} differs from in-process rank 0"
    # different data per rank: the local losses differ, the weights do not
    assert out[("server_reduce", 0)]["losses"] != out[("server_reduce", 1)]["losses"]
    assert out[("server_reduce", 0)]["losses"] == ref["losses"]
    assert out[("shard", 1)]["losses"] == out[("inprocess", 1)]["losses"]


def test_a_parameter_one_rank_did_not_use_is_reduced_with_zeros_as_ddp_does(server,
                                                                            tmpdir_private):
    """Without DDP, rank 1 leaves a Muon matrix and an AdamW bias without gradients at steps 1
    and 3 (both ranks at step 2): the ranks agree on which gradients exist, a missing one counts
    as zero and one no rank has is skipped, bitwise as under DDP with find_unused_parameters,
    in process and through the server. Before, the all-reduce of the ranks' lists of gradients
    mixed parameters (or failed on their sizes), and the server paired rank 0's step with rank
    1's next one, one step late from then on, silently."""
    init = f"tcp://127.0.0.1:{free_port()}"
    mp.spawn(dist_worker.run_unused, args=(2, init, server.socket, str(tmpdir_private)),
             nprocs=2, join=True)
    out = {(v, r): torch.load(tmpdir_private / f"{v}_{r}.pt")
           for v in ("ddp", "bare", "server_reduce", "shard_overlap_off") for r in (0, 1)}
    ref = out[("ddp", 0)]
    for key, o in out.items():
        for i, (p, q) in enumerate(zip(o["params"], ref["params"])):
            assert torch.equal(p, q), f"{key}: parameter {i} differs from DDP's rank 0"
    # The gate and its bias did step (with rank 0's gradient alone at steps 1 and 3).
    init_model = dist_worker.BranchNet()
    names = [n for n, _ in init_model.named_parameters()]
    for name in ("gate.weight", "gate_bias"):
        i = names.index(name)
        assert not torch.equal(ref["params"][i], dict(init_model.named_parameters())[name]), name
