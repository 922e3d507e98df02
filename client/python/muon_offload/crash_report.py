"""What a crash of muon-offloadd servers cost the trainer, for the message of the
:class:`~muon_offload.ConnectionLost` that :class:`~muon_offload.torch.OffloadMuon` raises: for
each lost server, the step its snapshot on disk holds against the optimizer's last step, so the
steps whose momentum is gone are counted, and how to resume.

A server's snapshot is a safetensors file (daemon/snapshot.hpp): a u64 little-endian header
length, then a JSON header whose ``__metadata__`` holds ``"step:<name>"``, the last step applied
to each parameter's momentum. Only the header is read.

A trainer behind a relay learns what its lost servers snapshot from the relay's error instead
(daemon/pool/relay.cpp, Relay::forward_error): :func:`relay_lost_servers` reads that line.
"""
from __future__ import annotations

import json
import re
import struct
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

__all__ = ["snapshot_steps", "lost_steps_report", "relay_lost_servers"]

# The line of a relay's error about a forwarded step whose servers were lost (a JSON array
# follows; the client library may add its source location after it).
_RELAY_LOST = re.compile(r"^snapshots of the lost servers \(JSON\): ", re.MULTILINE)

# A header larger than this is not one of ours (a parameter's entry is ~200 bytes).
_MAX_HEADER = 1 << 28


def snapshot_steps(path: str) -> Optional[Dict[str, int]]:
    """``{parameter name: last applied step}`` of the momentum snapshot at ``path``; None when
    there is no file there (none written yet, or on another host) or it is not a muon-offload
    snapshot (truncated, another format)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                return None
            (n,) = struct.unpack("<Q", raw)
            if n > _MAX_HEADER:
                return None
            header = json.loads(f.read(n))
    except (OSError, ValueError):
        return None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(meta, dict) or meta.get("format") != "muon-offload-momentum":
        return None
    steps = {}
    for key, value in meta.items():
        if key.startswith("step:"):
            try:
                steps[key[len("step:"):]] = int(value)
            except ValueError:
                return None
    return steps


def relay_lost_servers(message: str) -> Optional[
        Tuple[List[str], List[Tuple[bool, Optional[Tuple[str, int]]]]]]:
    """``(endpoints, survival)`` for :func:`lost_steps_report` from a relay's PeerLost
    ``message``: the servers it lost under a step (the owner, and its buddy after a failover),
    each ``(True, (snapshot path, every))`` as its hello told the relay, or ``(True, None)`` when
    the relay never heard it; None when the message has no such line (not a relay's, or not a
    lost connection)."""
    found = _RELAY_LOST.search(message)
    if found is None:
        return None
    try:
        entries, _ = json.JSONDecoder().raw_decode(message, found.end())
    except ValueError:
        return None
    if not isinstance(entries, list):
        return None
    endpoints, survival = [], []
    for e in entries:
        if not isinstance(e, list) or not e or not isinstance(e[0], str):
            return None
        endpoints.append(e[0])
        ok = len(e) == 3 and isinstance(e[1], str) and isinstance(e[2], int)
        survival.append((True, (e[1], e[2]) if ok else None))
    return endpoints, survival


def lost_steps_report(servers: Sequence[str],
                      survival: Sequence[Tuple[bool, Optional[Tuple[str, int]]]],
                      last_steps: Mapping[str, int]) -> str:
    """The lines that say, for each lost server (``survival[i]``: ``(lost, (snapshot path,
    every) or None)`` as :meth:`muon_offload.Client.snapshot_config` gives them), what its
    snapshot keeps of the optimizer's parameters (``last_steps``: the optimizer's last applied
    step of each, by the name the servers see), how many steps of momentum are gone, and how
    to resume; "" when no server is known lost."""
    lines = []
    for endpoint, (lost, config) in zip(servers, survival):
        if not lost:
            continue
        if config is None:
            lines.append(f"Server {endpoint}: lost; it did not say what it snapshots.")
            continue
        path, every = config
        if not path:
            lines.append(f"Server {endpoint}: lost, with no --snapshot: the momentum it held is "
                         "gone; resume from your last trainer checkpoint (restart the server, "
                         "optimizer.reconnect(), then optimizer.load_state_dict(checkpoint)).")
            continue
        steps = snapshot_steps(path)
        if steps is None:
            lines.append(f"Server {endpoint}: lost; its snapshot {path} is not on disk here "
                         "or not one this package reads (none written yet, on another host, or "
                         "cut short): resume from your last trainer checkpoint.")
            continue
        held = {n: s for n, s in steps.items() if n in last_steps}
        if not held:
            lines.append(f"Server {endpoint}: lost; its snapshot {path} holds none of this "
                         "optimizer's parameters (it held only replicas, or none yet).")
            continue
        snap = min(held.values())
        mine = max(last_steps[n] for n in held)
        lost_count = max(mine - snap, 0)
        mixed = "" if len(set(held.values())) == 1 else \
            f" (its parameters at steps {min(held.values())}..{max(held.values())})"
        at = "no step" if snap < 0 else f"step {snap}"
        if lost_count == 0:
            lines.append(
                f"Server {endpoint}: lost; its snapshot {path} holds {at} of its {len(held)} "
                f"parameter(s), this optimizer's last step: no step lost. To resume: restart it "
                f"with `--restore {path}`, call optimizer.reconnect(), and step() goes on.")
            continue
        lines.append(
            f"Server {endpoint}: lost; its snapshot {path} holds {at}{mixed} of its {len(held)} "
            f"parameter(s), this optimizer is at step {mine}: the momentum of {lost_count} "
            f"step(s) ({snap + 1}..{mine}) is lost"
            f"{f' (it snapshots every {every} step(s))' if every > 0 else ''}. To resume: "
            f"restart it with `--restore {path}`, call optimizer.reconnect(), then load your "
            f"trainer checkpoint taken after step {snap} (optimizer state step {snap + 1}) and "
            "train on from there; from an older checkpoint, load that one instead "
            "(optimizer.load_state_dict puts its momentum back into the server).")
    return "\n".join(lines)
