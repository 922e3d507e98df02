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
