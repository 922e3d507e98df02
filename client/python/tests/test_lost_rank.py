"""A rank lost or stalled under gloo: the other rank hears the server's verdict (PeerLost or
Timeout naming the rank), never a collective's "Connection reset by peer" or a silent wait in
the AdamW all-reduce. Real processes, a real server; 2 ranks of TinyNet (Muon and AdamW
parameters)."""
import json
import socket

import torch.multiprocessing as mp

import lost_rank_worker


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(scenario, server, outdir) -> dict:
    init = f"tcp://127.0.0.1:{free_port()}"
    ctx = mp.spawn(lost_rank_worker.run, args=(scenario, init, server.socket, str(outdir)),
                   nprocs=2, join=False)
    # A hang guard: a rank stuck in a collective would never return.
    for _ in range(60):
        if ctx.join(timeout=5):
            break
    else:
        for p in ctx.processes:
            p.kill()
        raise AssertionError(f"{scenario}: the ranks did not finish within 300 s (a hang)")
    return json.loads((outdir / "rank0.json").read_text())


def test_rank_lost_between_steps_is_reported_at_once(server, tmpdir_private):
    out = run_ranks("between_steps", server, tmpdir_private)
    rank, message = out["lost_peer"]
    assert rank == 1 and "rank 1" in message and "was lost" in message, message
    assert "at once" in message
    assert out["error"] == "PeerLost", out
    assert "rank 1" in out["message"]


def test_rank_dying_before_its_push_surfaces_as_peer_lost(server, tmpdir_private):
    out = run_ranks("dies", server, tmpdir_private)
    assert out["error"] == "PeerLost", out  # not a gloo RuntimeError from the AdamW all-reduce
    assert "rank 1" in out["message"]


def test_stalled_rank_surfaces_as_the_servers_timeout(server_factory, tmpdir_private):
    s = server_factory("stall", extra=["--step-timeout-ms", "1500"])
    out = run_ranks("stalls", s, tmpdir_private)
    assert out["error"] == "Timeout", out  # not a silent wait in the AdamW all-reduce
    assert "ranks [1] did not commit" in out["message"], out["message"]
    assert "--step-timeout-ms" in out["message"] and "timeout_s" not in out["message"]
