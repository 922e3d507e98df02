"""Which tensors go to the server (and as which matrix shape), which to the built-in AdamW."""
import json
import warnings

import pytest
import torch
import torch.nn as nn

from helpers import TinyNet, same_params, train
from muon_offload.torch import InProcessMuon, OffloadMuon, default_route

EXPECTED = {
    "embed.weight": ("adamw", None),
    "conv.weight": ("muon", (4, 12)),      # conv (out, in, kh, kw) -> (out, in*kh*kw)
    "conv.bias": ("adamw", None),
    "norm.weight": ("adamw", None),
    "norm.bias": ("adamw", None),
    "fc1.weight": ("muon", (24, 12)),
    "fc1.bias": ("adamw", None),
    "fc2.weight": ("muon", (12, 24)),
    "fc2.bias": ("adamw", None),
    "experts": ("muon", (3, 12, 12)),      # expert stack: 3 matrices of 12x12
    "head.weight": ("adamw", None),
}


@pytest.mark.parametrize("name,shape,kind", [
    ("model.embed_tokens.weight", (100, 8), "adamw"),
    ("transformer.wte.weight", (100, 8), "adamw"),
    ("transformer.wpe.weight", (64, 8), "adamw"),
    ("tok_emb.weight", (100, 8), "adamw"),
    ("lm_head.weight", (100, 8), "adamw"),
    ("output.weight", (100, 8), "adamw"),            # Meta Llama's head
    ("classifier.weight", (10, 8), "adamw"),
    ("model.norm.weight", (8, 8), "adamw"),
    ("blocks.0.ln_1.weight", (8, 8), "adamw"),
    ("blocks.0.ln1.weight", (8,), "adamw"),
    ("blocks.0.mlp.fc.bias", (32,), "adamw"),
    ("scale", (), "adamw"),
    ("layers.0.attention.output.dense.weight", (8, 8), "muon"),  # BERT: not the head
    ("blocks.0.linear.weight", (8, 8), "muon"),                  # "ln" prefix rule
    ("blocks.0.attn.qkv.weight", (24, 8), "muon"),
    ("layers.0.moe.experts", (4, 8, 16), "muon"),
    ("conv1.weight", (6, 3, 3, 3), "muon"),
    (None, (8, 8), "muon"),
])
def test_default_route(name, shape, kind):
    assert default_route(name, torch.empty(shape)) == kind


def test_routing_of_a_model_inprocess():
    opt = InProcessMuon(TinyNet().named_parameters())
    assert opt.routing == EXPECTED
    kinds = {g["use_muon"] for g in opt.param_groups}
    assert kinds == {True, False}
    adamw = [g for g in opt.param_groups if not g["use_muon"]][0]
    assert adamw["lr"] == 3e-4 and adamw["betas"] == (0.9, 0.95)


def test_routing_and_shapes_on_the_server(server):
    """The server registers conv and expert parameters with the flattened / batched shapes, and
    the updates come back in the parameters' own shapes, bitwise as in process."""
    m1, m2 = TinyNet(), TinyNet()
    off = OffloadMuon(m1.named_parameters(), servers=[server.socket], weight_decay=0.01)
    ref = InProcessMuon(m2.named_parameters(), weight_decay=0.01)
    assert off.routing == EXPECTED
    before = {n: p.detach().clone() for n, p in m1.named_parameters()}
    train(m1, off, 2)
    train(m2, ref, 2)
    for n, p in m1.named_parameters():
        assert p.shape == before[n].shape
        assert not torch.equal(p, before[n]), f"{n} was not updated"
    assert same_params(m1, m2)
    off.close()


def test_names_mapping_route_override_and_groups():
    model = TinyNet()
    # plain tensors + names=model: same routing as named_parameters()
    opt = InProcessMuon(list(model.parameters()), names=model)
    assert opt.routing == EXPECTED
    # a route override: everything 2-D+ to Muon, the embedding included
    opt = InProcessMuon(model.named_parameters(),
                        route=lambda n, p: "muon" if p.ndim >= 2 else "adamw")
    assert opt.routing["embed.weight"] == ("muon", (16, 12))
    assert opt.routing["head.weight"] == ("muon", (16, 12))
    # a group forced to AdamW, another with its own lr
    named = dict(model.named_parameters())
    opt = InProcessMuon([
        {"params": [("fc1.weight", named["fc1.weight"])], "use_muon": False},
        {"params": [(n, p) for n, p in named.items() if n != "fc1.weight"], "lr": 0.05,
         "adamw_lr": 1e-3},
    ])
    assert opt.routing["fc1.weight"] == ("adamw", None)
    lrs = {(g["use_muon"], g["lr"]) for g in opt.param_groups}
    assert (True, 0.05) in lrs and (False, 1e-3) in lrs


def test_a_module_routes_its_embeddings_to_adamw_by_type_whatever_their_names():
    # Inside nn.Sequential an embedding is "0.weight", a tied head shares its tensor: the name
    # rule cannot see either; names=model (or ddp=) gives the module types.
    emb = nn.Embedding(50, 8)
    head = nn.Linear(8, 50, bias=False)
    head.weight = emb.weight  # weight tying
    model = nn.Sequential(emb, nn.Linear(8, 8), nn.EmbeddingBag(30, 8), head)
    opt = InProcessMuon(model.parameters(), names=model)
    assert opt.routing == {"0.weight": ("adamw", None), "1.weight": ("muon", (8, 8)),
                           "1.bias": ("adamw", None), "2.weight": ("adamw", None)}
    # named_parameters() alone carries no module type: the 2-D rule applies, with a warning
    with pytest.warns(UserWarning, match="'0.weight' goes to Muon by the name rule"):
        assert InProcessMuon(model.named_parameters()).routing["0.weight"] == ("muon", (50, 8))
    # an explicit route still decides first
    opt = InProcessMuon(model.parameters(), names=model,
                        route=lambda n, p: "muon" if p.ndim >= 2 else "adamw")
    assert opt.routing["0.weight"] == ("muon", (50, 8))


def test_conv1d_flattened_on_request_and_unnamed_warning():
    conv1d = nn.Conv1d(4, 5, 3)
    opt = InProcessMuon([("conv1d.weight", conv1d.weight), ("conv1d.bias", conv1d.bias)],
                        route=lambda n, p: "muon_flat" if p.ndim == 3 else None)
    assert opt.routing["conv1d.weight"] == ("muon", (5, 12))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        opt = InProcessMuon(nn.Linear(3, 4).parameters())
    assert any("without names" in str(x.message) for x in w)
    assert opt.routing == {"param.0": ("muon", (4, 3)), "param.1": ("adamw", None)}


def test_lr_scheduler_drives_both_parts():
    model = TinyNet()
    opt = InProcessMuon(model.named_parameters(), lr=0.02, adamw_lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 ** s)
    train(model, opt, 2, sched=sched)
    lrs = sorted(g["lr"] for g in opt.param_groups)
    assert lrs == pytest.approx([1e-3 * 0.25, 0.02 * 0.25])


# -- a plan's relays: which server each rank pushes a planned parameter to ----------------------

def relay_plan(node_servers=(0, 1)):
    """Two domains on one host: ranks 0, 1 and server 0 in domain 0, ranks 2, 3 and server 1 in
    domain 1. fc1 (owner 0) and fc2 (owner 1) are relayed by both domains' servers; experts
    (owner 0) has no relay in domain 1 (its ranks push straight to the owner)."""
    servers = [{"id": 0, "host": "node0", "node_rank": 0, "gpu": 3, "domain": 0,
                "socket_name": "gpu3.sock"},
               {"id": 1, "host": "node0", "node_rank": 0, "gpu": 7, "domain": 1,
                "socket_name": "gpu7.sock"}]
    return {
        "schema": "muon-offload-plan/1",
        "nodes": [{"node_rank": 0, "host": "node0",
                   "servers": [servers[i] for i in node_servers]}],
        "servers": servers,
        "domains": [{"id": 0, "servers": [0], "compute_ranks": [0, 1]},
                    {"id": 1, "servers": [1], "compute_ranks": [2, 3]}],
        "ranks": [{"rank": r, "node_rank": 0, "domain": r // 2} for r in range(4)],
        "parameters": [{"name": "fc1.weight", "shape": [24, 12], "owner": 0, "relays": [0, 1]},
                       {"name": "fc2.weight", "shape": [12, 24], "owner": 1, "relays": [0, 1]},
                       {"name": "experts", "shape": [3, 12, 12], "owner": 0,
                        "relays": [0, None]}],
    }


OWNERS = {"fc1.weight": 0, "fc2.weight": 1, "experts": 0}


@pytest.mark.parametrize("scope", ["global", None])
def test_plan_relays_route_each_rank_to_its_domains_server(tmp_path, monkeypatch, scope):
    from muon_offload.offload import plan_targets as _plan_targets
    if scope:
        monkeypatch.setenv("MUON_OFFLOAD_SERVERS_SCOPE", scope)
    else:
        monkeypatch.delenv("MUON_OFFLOAD_SERVERS_SCOPE", raising=False)
    monkeypatch.setenv("NODE_RANK", "0")
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(relay_plan()))
    # domain 0: its own server relays (and owns) everything
    for rank in (0, 1):
        assert _plan_targets(str(path), rank) == {"fc1.weight": 0, "fc2.weight": 0, "experts": 0}
    # domain 1: its relay, server 1, for both of the relayed parameters (whoever owns them);
    # a null relay: straight to the owner
    for rank in (2, 3):
        assert _plan_targets(str(path), rank) == {"fc1.weight": 1, "fc2.weight": 1, "experts": 0}
    # a rank the plan does not list, and a plan without ranks: the owners
    assert _plan_targets(str(path), 7) == OWNERS
    path.write_text(json.dumps(dict(relay_plan(), ranks=[])))
    assert _plan_targets(str(path), 2) == OWNERS


def test_plan_relays_map_to_node_local_indices(tmp_path, monkeypatch):
    """On one host the servers are this node's in the plan's node order: a relay's id is mapped
    to its index there like an owner's."""
    from muon_offload.offload import plan_targets as _plan_targets
    monkeypatch.delenv("MUON_OFFLOAD_SERVERS_SCOPE", raising=False)
    monkeypatch.setenv("NODE_RANK", "0")
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(relay_plan(node_servers=(1, 0))))  # server 1 first on the node
    assert _plan_targets(str(path), 2) == {"fc1.weight": 0, "fc2.weight": 0, "experts": 1}
    assert _plan_targets(str(path), 0) == {"fc1.weight": 1, "fc2.weight": 1, "experts": 1}
    monkeypatch.setenv("MUON_OFFLOAD_SERVERS_SCOPE", "global")  # ids index the servers
    assert _plan_targets(str(path), 2) == {"fc1.weight": 1, "fc2.weight": 1, "experts": 0}


@pytest.mark.parametrize("rank,expected", [
    ("2", {"fc1.weight": 1, "fc2.weight": 1, "experts": 0}),
    ("0", {"fc1.weight": 0, "fc2.weight": 0, "experts": 0}),
    (None, {"fc1.weight": 0, "fc2.weight": 0, "experts": 0}),   # no RANK: rank 0
])
def test_offload_muon_registers_planned_parameters_with_its_domains_relay(
        server_factory, tmp_path, monkeypatch, rank, expected):
    """OffloadMuon (no torch.distributed: the rank comes from the environment's RANK) registers
    each planned parameter with the server the plan gives its rank's domain."""
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(relay_plan()))
    monkeypatch.setenv("MUON_OFFLOAD_PLAN", str(path))
    monkeypatch.delenv("MUON_OFFLOAD_SERVERS_SCOPE", raising=False)
    monkeypatch.setenv("NODE_RANK", "0")
    if rank is None:
        monkeypatch.delenv("RANK", raising=False)
    else:
        monkeypatch.setenv("RANK", rank)
    servers = [server_factory("s0").socket, server_factory("s1").socket]
    # The plan does not name conv.weight: said once, naming it.
    with pytest.warns(UserWarning, match=r"not 1 of this optimizer's \(conv\.weight\)"):
        opt = OffloadMuon(TinyNet().named_parameters(), servers=servers)
    try:
        placed = {n: opt._meta[p].server for g in opt.param_groups if g["use_muon"]
                  for p, n in zip(g["params"], g["param_names"])}
        assert {n: placed[n] for n in expected} == expected
        assert set(placed) == set(expected) | {"conv.weight"}  # conv: not planned, by cost
    finally:
        opt.close()


def test_failover_pairs_accept_ring_buddies_and_refuse_a_relaying_buddy():
    """Ring buddies (server 0 buddies 1, 1 buddies 0: each also an owner) are read; a rank
    fails over only what it pushes straight to the owner (a relayed parameter fails over in its
    relay); a buddy that relays one of its owner's parameters is refused, naming both."""
    from muon_offload.plan import PlanError, failover_pairs
    plan = relay_plan()
    plan["servers"] = [{"id": 0, "buddy": 1}, {"id": 1, "buddy": 0}]
    plan["domains"][1]["compute_ranks"] = []  # server 1 relays for a domain of no rank
    plan["parameters"] = [{"name": "fc1.weight", "owner": 0, "relays": [None, 1]},
                          {"name": "fc2.weight", "owner": 1, "relays": [None, None]},
                          {"name": "experts", "owner": 0, "relays": [0, None]}]
    assert failover_pairs(plan, 0, global_scope=True) == {
        "fc1.weight": (0, 1), "fc2.weight": (1, 0), "experts": (0, 1)}
    plan["parameters"][2]["relays"] = [1, None]  # rank 0's domain relays experts through 1
    with pytest.raises(PlanError, match=r"'experts': server 1 relays it for domain 0 and is the "
                                        r"buddy of its owner, server 0"):
        failover_pairs(plan, 0, global_scope=True, source="plan 'p.json'")
    plan["parameters"][2]["relays"] = [None, None]
    plan["servers"][1]["buddy"] = 1
    with pytest.raises(PlanError, match="server 1 is its own buddy"):
        failover_pairs(plan, 0, global_scope=True)
    plan["servers"][1]["buddy"] = 5
    with pytest.raises(PlanError, match="server 1 has buddy 5, not a server id"):
        failover_pairs(plan, 0, global_scope=True)


def test_failover_pairs_follow_the_ranks_domain_and_node():
    """The pair's indices are this node's server positions (ids with global scope); an owner
    without a buddy, and a buddy not on the rank's list, give no pair."""
    from muon_offload.plan import failover_pairs
    plan = relay_plan(node_servers=(1, 0))  # server 1 first on the node
    plan["servers"] = [{"id": 0, "buddy": 1}, {"id": 1}]
    plan["parameters"] = [{"name": "fc2.weight", "owner": 1, "relays": [0, 1]},
                          {"name": "experts", "owner": 0, "relays": [0, None]}]
    # rank 2 (domain 1) pushes experts straight to 0; fc2 to its owner 1, which has no buddy
    assert failover_pairs(plan, 2, this_node=0) == {"experts": (1, 0)}
    assert failover_pairs(plan, 2, global_scope=True) == {"experts": (0, 1)}
    plan["nodes"][0]["servers"] = [plan["servers"][0]]  # the buddy on another node
    assert failover_pairs(plan, 2, this_node=0) == {}
