"""The plans of the pools the failover tests and bench/replication_bench.py start (standard
library only: the benchmark imports it without pytest or torch)."""
import json


def failover_plan(names, layout="relay"):
    """A plan whose parameters ``names`` are all owned by one server with a buddy.

    ``layout`` "relay": servers 0 (domain 0: compute rank 0; relays every parameter), 1 (the
    owner) and 2 (its buddy), both in domain 1, which has no compute rank. "direct": servers 0
    (the owner) and 1 (its buddy), in rank 0's domain, which has no relay: the rank pushes
    straight to the owner. "mixed": as "relay", and compute rank 1 in domain 1 with the owner
    and its buddy (straight to the owner, no relay). Returns (plan dict, owner id, buddy id)."""
    if layout == "direct":
        plan = {
            "schema": "muon-offload-plan/1",
            "servers": [{"id": 0, "domain": 0, "buddy": 1}, {"id": 1, "domain": 0}],
            "domains": [{"id": 0, "servers": [0, 1], "compute_ranks": [0]}],
            "ranks": [{"rank": 0, "domain": 0}],
            "parameters": [{"name": n, "owner": 0, "relays": [None]} for n in names],
        }
        return plan, 0, 1
    if layout not in ("relay", "mixed"):
        raise ValueError(f"layout {layout!r}: expected 'relay', 'direct' or 'mixed'")
    mixed = layout == "mixed"
    plan = {
        "schema": "muon-offload-plan/1",
        "servers": [{"id": 0, "domain": 0}, {"id": 1, "domain": 1, "buddy": 2},
                    {"id": 2, "domain": 1}],
        "domains": [{"id": 0, "servers": [0], "compute_ranks": [0]},
                    {"id": 1, "servers": [1, 2], "compute_ranks": [1] if mixed else []}],
        "ranks": [{"rank": 0, "domain": 0}] + ([{"rank": 1, "domain": 1}] if mixed else []),
        "parameters": [{"name": n, "owner": 1, "relays": [0, None]} for n in names],
    }
    return plan, 1, 2


def write_plan(tmp, plan, tag="plan"):
    """Writes ``plan`` to ``tmp``/``tag``.json; returns its path."""
    path = tmp / f"{tag}.json"
    path.write_text(json.dumps(plan))
    return path


def pool_flags(plan_path, server_id, sockets, replicate="on"):
    """muon-offloadd's flags for server ``server_id`` of the pool ``sockets`` under a plan."""
    return ["--plan", str(plan_path), "--server-id", str(server_id),
            "--pool-servers", ",".join(sockets), "--replicate", replicate]
