"""Storage layouts of real DTensors (muon_offload.layouts), 4 ranks under gloo: distribute_tensor,
fully_shard (uneven last shard, a rank with no rows), parallelize_module (Colwise = Shard(0),
Rowwise = Shard(1)), FSDP x TP on a 2 x 2 mesh (the strided shard), HSDP (replicate x shard),
an expert stack sharded on dim 0, a parameter on a sub-mesh; Partial refused by name.

Every rank's local tensor must equal the packed wanted ranges of the full tensor (so the ranges
are what the rank holds, in its order), and across ranks every element must be pushed by exactly
`contributors` ranks."""
import torch
import torch.multiprocessing as mp

import shard_worker
from helpers import free_port

WORLD = 4


def _coverage(numel, layouts):
    count = torch.zeros(numel, dtype=torch.int64)
    for lay in layouts:
        for b, e in lay["held"]:
            count[b:e] += 1
    return count


def test_layouts_of_real_dtensors(tmpdir_private):
    init = f"tcp://127.0.0.1:{free_port()}"
    mp.spawn(shard_worker.run_layouts, args=(WORLD, init, str(tmpdir_private)), nprocs=WORLD,
             join=True)
    out = [torch.load(tmpdir_private / f"layouts_{r}.pt") for r in range(WORLD)]
    numel = {"shard0_uneven": 30, "shard1": 24, "replicate": 30, "experts": 36, "fsdp": 30,
             "tp_colwise": 32, "tp_rowwise": 32, "fsdp_tp_colwise": 48, "fsdp_tp_rowwise": 48,
             "fsdp_dp_only": 24, "hsdp": 40, "hsdp_summed": 40}
    for case, n in numel.items():
        lays = [o[case] for o in out]
        for r, lay in enumerate(lays):
            assert lay["local_ok"], f"{case}: rank {r}'s local tensor is not its wanted ranges"
            assert sum(e - b for b, e in lay["wanted"]) == torch.Size(lay["local_shape"]).numel()
        c = lays[0]["contributors"]
        assert all(lay["contributors"] == c for lay in lays), case
        assert torch.equal(_coverage(n, lays), torch.full((n,), c)), \
            f"{case}: every element must be pushed by {c} rank(s)"

    def wanted(case):
        return [o[case]["wanted"] for o in out]

    def held(case):
        return [o[case]["held"] for o in out]

    # torch.chunk: 5 rows over 4 ranks are 2, 2, 1, 0 (the last rank holds nothing).
    assert wanted("shard0_uneven") == [[(0, 12)], [(12, 24)], [(24, 30)], []]
    assert wanted("fsdp") == wanted("shard0_uneven")
    assert [o["fsdp"]["local_shape"] for o in out] == [(2, 6), (2, 6), (1, 6), (0, 6)]
    # A column shard is one block of rows x columns: 3 element ranges of 2 for 3 rows.
    assert wanted("shard1")[1] == [(2, 4), (10, 12), (18, 20)]
    assert out[1]["shard1"]["intervals"] == (((0, 3),), ((2, 4),))
    assert wanted("tp_colwise") == [[(0, 8)], [(8, 16)], [(16, 24)], [(24, 32)]]
    assert wanted("tp_rowwise")[3] == [(4 * i + 3, 4 * i + 4) for i in range(8)]  # 8 x 4
    # Replicated: everyone wants it all, rank 0 pushes (the others hold the same gradient).
    assert held("replicate") == [[(0, 30)], [], [], []] and wanted("replicate") == [[(0, 30)]] * 4
    # 6 experts over 4 ranks: 2, 2, 2, 0, each expert 2 x 3.
    assert wanted("experts") == [[(0, 12)], [(12, 24)], [(24, 36)], []]
    # FSDP x TP, 6 rows: TP cuts first (rows 0-2 | 3-5), FSDP then cuts each half (2 | 1):
    # rank (dp, tp) = 2*dp + tp holds rows {0,1}, {3,4}, {2}, {5}.
    assert wanted("fsdp_tp_colwise") == [[(0, 16)], [(24, 40)], [(16, 24)], [(40, 48)]]
    # Rowwise under FSDP: rows by dp, columns by tp: a 4 x 3 block.
    assert out[3]["fsdp_tp_rowwise"]["intervals"] == (((4, 8),), ((3, 6),))
    # On the dp sub-mesh: the tp ranks hold copies; tp coordinate 0 (ranks 0 and 2) pushes.
    assert [bool(h) for h in held("fsdp_dp_only")] == [True, False, True, False]
    # HSDP: replica 0 pushes unless the replicas are summed by the server.
    assert [bool(h) for h in held("hsdp")] == [True, True, False, False]
    assert out[0]["hsdp"]["contributors"] == 1 and out[0]["hsdp_summed"]["contributors"] == 2
    assert held("hsdp_summed") == wanted("hsdp_summed") == wanted("hsdp")
    msg = out[0]["partial_error"]
    assert msg and "blocks.0.w" in msg and "Partial" in msg, msg
    msg = out[0]["summed_shard_error"]
    assert msg and "blocks.1.w" in msg and "not Replicate" in msg, msg
