"""torch.distributed.checkpoint of a sharded OffloadMuon job: 4 FSDP2 ranks save (each rank's
momentum shard is a DTensor in the optimizer's state_dict), 2 ranks load into their own
sharding and continue.

Checked: after the load the server holds bitwise the momentum the 4-rank job had at the
checkpoint, the step counters and the parameters are the same; the next 2 steps (the same batch
on every rank) give the 4-rank job's parameters within 1e-6 relative. Not bitwise there: FSDP
averages 4 gradients in one job and 2 in the other (ReduceOp.AVG: (a+a+a+a)/4 and (a+a)/2
round differently)."""
import torch
import torch.multiprocessing as mp

import shard_worker
from helpers import free_port


def test_dcp_four_ranks_saved_two_ranks_loaded(server_factory, tmpdir_private):
    for phase, world in (("save", 4), ("load", 2)):
        # A server serves one job's world size: the 2-rank job gets its own.
        srv = server_factory(phase)
        mp.spawn(shard_worker.run_dcp, args=(world, f"tcp://127.0.0.1:{free_port()}",
                                             srv.socket, str(tmpdir_private), phase),
                 nprocs=world, join=True)
    saved = torch.load(tmpdir_private / "dcp_save_0.pt")
    for r in range(2):
        loaded = torch.load(tmpdir_private / f"dcp_load_{r}.pt")
        assert loaded["steps"] == saved["steps"] == {n: 2 for n in saved["steps"]}
        for n, m in saved["momentum"].items():
            assert m.abs().sum() > 0, n
            assert torch.equal(loaded["momentum"][n], m), f"rank {r}: momentum of '{n}'"
        for n, p in saved["params"].items():
            assert torch.equal(loaded["params"][n], p), f"rank {r}: parameter '{n}'"
        for n, p in saved["final"].items():
            assert torch.allclose(loaded["final"][n], p, rtol=1e-6, atol=1e-7), \
                f"rank {r}: '{n}' after 2 more steps off by {(loaded['final'][n] - p).abs().max()}"
            assert not torch.equal(p, saved["params"][n]), f"'{n}' did not move"
