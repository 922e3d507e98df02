"""Pool relays end to end from PyTorch: 4 gloo ranks in 2 domains, 2 servers started with a plan
(each owns half the Muon parameters and relays the other half for its domain), OffloadMuon
routing each parameter to its domain's server. The server-side tree reduction is checked bitwise
by tests/daemon/test_pool_relay.cpp; here the whole path trains a model like the in-process
optimizer:

- shard: ranks all-reduce, then push their row shards: every element has one contributor, so the
  owner's gradient is what one server without relays forms: the run is bitwise the same run
  through a single server (variant "single");
- server_reduce: each rank pushes grad/4 and the pool sums ((r0 + r1) + (r2 + r3)).
Both agree with the in-process optimizer to float rounding only: with 4 ranks, gloo's all-reduce
orders its sums by buffer layout (the in-process optimizer reduces one flat buffer)."""
import json
import os
import subprocess

import torch
import torch.multiprocessing as mp

import dist_worker
from conftest import Server, find_binary
from test_distributed import free_port

WORLD = 4
MUON = [f"{variant}/{name}" for variant in ("server_reduce", "shard")
        for name in ("conv.weight", "fc1.weight", "fc2.weight", "experts", "gate.weight")]


def write_plan(path):
    """Servers 0 (domain 0: ranks 0, 1) and 1 (domain 1: ranks 2, 3); parameter i owned by
    server i % 2; each domain's ranks push to their own server."""
    plan = {
        "schema": "muon-offload-plan/1",
        "servers": [{"id": 0, "domain": 0}, {"id": 1, "domain": 1}],
        "domains": [{"id": 0, "servers": [0], "compute_ranks": [0, 1]},
                    {"id": 1, "servers": [1], "compute_ranks": [2, 3]}],
        "ranks": [{"rank": r, "domain": r // 2} for r in range(WORLD)],
        "parameters": [{"name": n, "owner": i % 2, "relays": [0, 1]} for i, n in enumerate(MUON)],
    }
    path.write_text(json.dumps(plan))


def status(socket):
    r = subprocess.run([find_binary("muon-offload", "cli"), "status", "--socket", socket,
                        "--json"], capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def test_four_ranks_in_two_domains_train_through_owners_and_relays(tmpdir_private, monkeypatch):
    plan = tmpdir_private / "plan.json"
    write_plan(plan)
    socks = [str(tmpdir_private / f"pool{i}.sock") for i in range(2)]
    servers = [Server(socks[i], ["--plan", str(plan), "--server-id", str(i), "--pool-servers",
                                 ",".join(socks)]) for i in range(2)]
    single = str(tmpdir_private / "single.sock")
    servers.append(Server(single))
    try:
        monkeypatch.setenv("MUON_OFFLOAD_PLAN", str(plan))
        monkeypatch.setenv("MUON_OFFLOAD_SERVERS_SCOPE", "global")
        init = f"tcp://127.0.0.1:{free_port()}"
        mp.spawn(dist_worker.run_pool, args=(WORLD, init, socks, single, str(tmpdir_private)),
                 nprocs=WORLD, join=True)
        # Every parameter went to the rank's own domain's server.
        for r in range(WORLD):
            routed = {}
            for variant in ("server_reduce", "shard"):
                routed.update(torch.load(tmpdir_private / f"{variant}_{r}.pt")["servers"])
            assert {n: routed[n] for n in MUON} == {n: r // 2 for n in MUON}, f"rank {r}"
        # Each server owns half and relays the other half to its owner.
        for i, s in enumerate(socks):
            params = {p["name"]: p for p in status(s)["parameters"]}
            for j, n in enumerate(MUON):
                if j % 2 == i:
                    assert "relayed_to" not in params[n] and params[n]["last_step"] == 4, (i, n)
                else:
                    assert params[n]["relayed_to"] == j % 2, (i, n)
        for r in range(WORLD):
            ref = torch.load(tmpdir_private / f"inprocess_{r}.pt")
            one = torch.load(tmpdir_private / f"single_{r}.pt")
            shard = torch.load(tmpdir_private / f"shard_{r}.pt")
            reduce = torch.load(tmpdir_private / f"server_reduce_{r}.pt")
            for i, (p, q) in enumerate(zip(shard["params"], one["params"])):
                assert torch.equal(p, q), f"shard rank {r}: parameter {i} differs from one server"
            assert shard["losses"] == one["losses"]
            # The checkpoint's momentum (fetched through a relay for half the parameters) is the
            # single server's, bit for bit.
            for k, st in one["state"]["state"].items():
                if "momentum_buffer" in st:
                    assert torch.equal(shard["state"]["state"][k]["momentum_buffer"],
                                       st["momentum_buffer"]), f"rank {r}: momentum {k}"
            for name, run in (("shard", shard), ("server_reduce", reduce)):
                for i, (p, q) in enumerate(zip(run["params"], ref["params"])):
                    torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6,
                                               msg=f"{name} rank {r}: parameter {i}")
    finally:
        for s in servers:
            assert s.stop() == 0
