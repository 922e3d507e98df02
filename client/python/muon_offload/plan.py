"""The plan reader of the trainer: a plan written by ``muon-offload plan --output`` (JSON,
schema ``muon-offload-plan/...``, plan/plan_json.cpp) read for :func:`targets` (the server each
planned parameter is pushed to from a rank). Standard library only. (scripts/muon-offload-launch
reads the servers and GPUs of its node from the same plan itself.)

Plan fields read: ``schema``; ``nodes[]`` (``node_rank``, ``servers[].id``); ``ranks[]``
(``rank``, ``domain``); ``parameters[]`` (``name``, ``owner``, ``relays[domain]``);
``servers[]`` (``id``, ``buddy``) for :func:`failover_pairs`.
"""
from __future__ import annotations

import json
import os
from typing import Dict, Optional, Tuple

__all__ = ["read", "node_rank", "targets", "failover_pairs", "row_blocks", "PlanError"]


class PlanError(ValueError):
    """A plan that cannot be read or used; the message names the file and what is wrong."""


def read(path: str) -> dict:
    """The plan at ``path``. Raises PlanError (unreadable, not JSON, not a muon-offload plan)."""
    try:
        with open(path) as f:
            plan = json.load(f)
    except (OSError, ValueError) as e:
        raise PlanError(f"plan '{path}': {e}") from None
    if not isinstance(plan, dict) or not str(plan.get("schema", "")).startswith(
            "muon-offload-plan/"):
        schema = plan.get("schema") if isinstance(plan, dict) else None
        raise PlanError(f"plan '{path}': not a muon-offload plan (schema {schema!r})")
    return plan


def row_blocks(path: Optional[str]) -> Dict[str, int]:
    """``{parameter name: row blocks}`` of the plan at ``path`` for every parameter it cuts into
    more than one block of rows (``parameters[].row_blocks``, the model config's); {} without
    a plan. Raises PlanError as :func:`read`, or for a row_blocks that is not an integer >= 1."""
    if not path:
        return {}
    out = {}
    for p in read(path).get("parameters", []):
        n = p.get("row_blocks", 1)
        if not _is_index(n) or n < 1:
            raise PlanError(f"plan '{path}': parameter {p.get('name')!r} has row_blocks {n!r}")
        if n > 1:
            out[str(p["name"])] = int(n)
    return out


def node_rank(environ=os.environ) -> int:
    """This node's index in the plan from the environment: ``SLURM_NODEID`` (srun),
    ``NODE_RANK`` (torchrun's --node-rank, Lightning), ``GROUP_RANK`` (torchrun's elastic
    agent), else 0. Raises PlanError for a value that is not an integer >= 0."""
    for key in ("SLURM_NODEID", "NODE_RANK", "GROUP_RANK"):
        value = environ.get(key)
        if value:
            if not value.isdigit():
                raise PlanError(f"environment {key}={value!r} is not a node index (an integer "
                                ">= 0)")
            return int(value)
    return 0


def _is_index(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def targets(plan: dict, rank: int, global_scope: bool = False,
            this_node: Optional[int] = None) -> Dict[str, int]:
    """``{parameter name: server index}``: where ``rank`` pushes each planned parameter, as an
    index into the trainer's server list (``MUON_OFFLOAD_SERVERS``). The server is the relay of
    the rank's domain (``parameters[].relays[domain]``, the domain from ``ranks[]``), else the
    owner (a null relay, or a rank the plan does not list); a relay sums its domain's
    contributions, forwards one partial sum to the owner and returns the owner's update.
    ``global_scope`` (``MUON_OFFLOAD_SERVERS_SCOPE=global``, a plan spanning hosts): the list is
    every server of the plan in id order, so an id is its index. Otherwise the list is this
    node's servers in the plan's order (``this_node``, default :func:`node_rank`), and
    parameters placed on other nodes' servers are left out."""
    chosen = {p["name"]: _target(p, _domain(plan, rank)) for p in plan.get("parameters", [])}
    index = _server_index(plan, global_scope, this_node)
    return {name: index(t) for name, t in chosen.items() if index(t) is not None}


def failover_pairs(plan: dict, rank: int, global_scope: bool = False,
                   this_node: Optional[int] = None,
                   source: str = "plan") -> Dict[str, Tuple[int, int]]:
    """``{parameter name: (owner index, buddy index)}`` for each planned parameter that ``rank``
    pushes straight to its owner (no relay in its domain) and whose owner has a buddy
    (``servers[].buddy``), both in the trainer's server list (indices as :func:`targets`).
    When the owner is lost the rank registers the parameter with the buddy, which holds its
    replica, and pushes the step in flight again; when that server is lost in turn, back to the
    owner (restarted meanwhile: the buddy's buddy). A buddy may own parameters of its own, with
    its own buddy (ring buddies: server 1 buddies 2, 2 buddies 1). Raises PlanError, naming
    ``source``, for a buddy that is not a server id of the plan, the server itself, or relays
    one of its owner's parameters for some domain (at a takeover it would be both the owner
    and a relay of it; plan/plan.cpp choose_buddies never picks one, daemon/pool_routes.cpp
    refuses it too)."""
    servers = plan.get("servers") or []
    ids = {s.get("id") for s in servers if isinstance(s, dict)}
    buddy = {}
    for s in servers:
        b = s.get("buddy") if isinstance(s, dict) else None
        if b is None:
            continue
        if not _is_index(b) or b not in ids:
            raise PlanError(f"{source}: server {s.get('id')} has buddy {b!r}, not a server id "
                            f"of the plan")
        if b == s.get("id"):
            raise PlanError(f"{source}: server {b} is its own buddy")
        buddy[s["id"]] = b
    # Domains with compute ranks: a relay for a domain of none forwards nothing.
    ranked = {d for d, dom in enumerate(plan.get("domains") or [])
              if isinstance(dom, dict) and dom.get("compute_ranks")}
    for p in plan.get("parameters", []):
        b = buddy.get(p.get("owner"))
        relays = p.get("relays") if isinstance(p.get("relays"), list) else []
        for d, r in enumerate(relays):
            if b is not None and r == b and d in ranked:
                raise PlanError(
                    f"{source}: parameter {p.get('name')!r}: server {b} relays it for domain "
                    f"{d} and is the buddy of its owner, server {p.get('owner')}: a buddy must "
                    "relay none of its owner's parameters")
    domain = _domain(plan, rank)
    index = _server_index(plan, global_scope, this_node)
    pairs = {}
    for p in plan.get("parameters", []):
        owner = p.get("owner")
        if _target(p, domain) != owner or owner not in buddy:
            continue  # relayed: the relay fails over, not the rank
        a, b = index(owner), index(buddy[owner])
        if a is not None and b is not None:
            pairs[str(p["name"])] = (a, b)
    return pairs


def _domain(plan: dict, rank: int):
    """The domain of compute rank ``rank`` (``ranks[]``), None when the plan does not list it."""
    return next((r.get("domain") for r in plan.get("ranks") or []
                 if isinstance(r, dict) and r.get("rank") == rank), None)


def _target(p: dict, domain):
    """The server id a rank of ``domain`` pushes parameter ``p`` to: its domain's relay, else the
    owner."""
    relays = p.get("relays")
    if (_is_index(domain) and isinstance(relays, list) and domain < len(relays)
            and _is_index(relays[domain])):
        return relays[domain]
    return p.get("owner")


def _server_index(plan: dict, global_scope: bool, this_node: Optional[int]):
    """A function from a server id to its index in the trainer's server list (None when the
    list lacks it): the id itself for ``global_scope``, else its position among this node's
    servers (``this_node``, default :func:`node_rank`)."""
    if global_scope:
        return lambda t: t if _is_index(t) else None
    local = {}
    node = node_rank() if this_node is None else this_node
    for n in plan.get("nodes", []):
        if n.get("node_rank") == node:
            local = {s["id"]: i for i, s in enumerate(n.get("servers", []))}
    return lambda t: local.get(t) if _is_index(t) else None
