"""The plan reader of the trainer: a plan written by ``muon-offload plan --output`` (JSON,
schema ``muon-offload-plan/...``, plan/plan_json.cpp) read for :func:`targets` (the server each
planned parameter is pushed to from a rank). Standard library only. (scripts/muon-offload-launch
reads the servers and GPUs of its node from the same plan itself.)

Plan fields read: ``schema``; ``nodes[]`` (``node_rank``, ``servers[].id``); ``ranks[]``
(``rank``, ``domain``); ``parameters[]`` (``name``, ``owner``, ``relays[domain]``).
"""
from __future__ import annotations

import json
import os
from typing import Dict, Optional

__all__ = ["read", "node_rank", "targets", "row_blocks", "PlanError"]


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
    domain = next((r.get("domain") for r in plan.get("ranks") or []
                   if isinstance(r, dict) and r.get("rank") == rank), None)

    def target(p):
        relays = p.get("relays")
        if (_is_index(domain) and isinstance(relays, list) and domain < len(relays)
                and _is_index(relays[domain])):
            return relays[domain]
        return p.get("owner")

    chosen = {p["name"]: target(p) for p in plan.get("parameters", [])}
    if global_scope:
        return {name: t for name, t in chosen.items() if _is_index(t)}
    local = {}
    node = node_rank() if this_node is None else this_node
    for n in plan.get("nodes", []):
        if n.get("node_rank") == node:
            local = {s["id"]: i for i, s in enumerate(n.get("servers", []))}
    return {name: local[t] for name, t in chosen.items() if _is_index(t) and t in local}
