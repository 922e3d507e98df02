"""Column blocks on the wire: a rank that holds a row range x a column range of a matrix (a
column shard: one element range per row) registers it as one block and pushes it with one push,
and gets its update back as one block (the raw client, two ranks of one job in one process).

The matrix has 5000 rows, more than a registration could list as ranges before blocks (4096);
the update each rank receives is bitwise the in-process Muon update of the whole gradient,
restricted to its columns."""
import threading

import numpy as np
import pytest

from muon_offload import Client, InvalidArgument, local_update

OPTS = {"mu": 0.9, "nesterov": True}
ROWS, COLS = 5000, 4
CUT = 1  # rank 0 holds columns [0, 1), rank 1 columns [1, 4)


def column_ranges(c0: int, c1: int):
    return [(r * COLS + c0, r * COLS + c1) for r in range(ROWS)]


def test_column_block_is_one_push_and_one_update(server_factory):
    srv = server_factory("blocks")
    cols = [(0, CUT), (CUT, COLS)]
    clients = [Client([srv.socket], rank=r, world_size=2) for r in range(2)]
    try:
        def register(r):
            rs = column_ranges(*cols[r])
            clients[r].register("w", (ROWS, COLS), OPTS, push=rs, want=rs)

        t = threading.Thread(target=register, args=(0,))
        t.start()
        register(1)
        t.join()
        rng = np.random.default_rng(5)
        mom = np.zeros((ROWS, COLS), np.float32)
        for step in range(2):
            g = rng.standard_normal((ROWS, COLS)).astype(np.float32)
            for r, (c0, c1) in enumerate(cols):
                block = np.ascontiguousarray(g[:, c0:c1])  # the rank's local shard
                clients[r].push_packed("w", step, 0, block.reshape(-1))
                clients[r].commit("w", step)
            ref = np.empty((ROWS, COLS), np.float32)
            assert local_update("w", (ROWS, COLS), OPTS, g, mom, ref, threads=1)
            for r, (c0, c1) in enumerate(cols):
                out = np.empty(ROWS * (c1 - c0), np.float32)
                assert clients[r].wait_update("w", step, out)
                assert np.array_equal(out.reshape(ROWS, c1 - c0), ref[:, c0:c1]), (step, r)
                stats = clients[r].report_step(step)
                block_bytes = ROWS * (c1 - c0) * 4
                assert stats["bytes_pushed"] == block_bytes, stats
                assert stats["bytes_received"] == block_bytes, stats
                assert stats["push_frames"] == 1, stats  # 5000 rows, one push frame
        # A packed span past the rank's block is refused before anything is sent.
        with pytest.raises(InvalidArgument, match=r"packed elements \[4999, 5001\)"):
            clients[0].push_packed("w", 2, ROWS - 1, np.zeros(2, np.float32))
    finally:
        for c in clients:
            c.close()
