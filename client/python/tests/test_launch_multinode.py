"""scripts/muon-offload-launch with a plan whose domain spans hosts (an NVL72 rack cut into
nodes): every node's servers also listen on TCP (token-checked), and the trainer gets every
server of the plan in id order, its own node's by socket and the others' as tcp://HOST:PORT,
with the owners indexed globally. Real servers (CPU backend) on this machine."""
import json
import os
import socket
import subprocess

from conftest import REPO, find_binary

LAUNCH = str(REPO / "scripts" / "muon-offload-launch")


def free_port_base(count: int) -> int:
    """A base port with `count` free ports after it (checked by binding each)."""
    for base in range(41000, 60000, 97):
        ok = True
        for p in range(base, base + count):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free ports")


def plan_two_nodes():
    """Two nodes of one domain, one server each (GPU 3 on node0, GPU 5 on node1), ranks on both
    nodes talking to both servers."""
    servers = [{"id": 0, "host": "127.0.0.1", "node_rank": 0, "gpu": 3, "socket_name": "gpu3.sock"},
               {"id": 1, "host": "127.0.0.1", "node_rank": 1, "gpu": 5, "socket_name": "gpu5.sock"}]
    return {
        "schema": "muon-offload-plan/1",
        "nodes": [{"node_rank": 0, "host": "node0",
                   "servers": [{"id": 0, "gpu": 3, "cuda_visible_devices": "3", "socket_name": "gpu3.sock",
                                "numactl": ""}],
                   "compute": {"cuda_visible_devices": "0,1,2"}},
                  {"node_rank": 1, "host": "node1",
                   "servers": [{"id": 1, "gpu": 5, "cuda_visible_devices": "5", "socket_name": "gpu5.sock",
                                "numactl": ""}],
                   "compute": {"cuda_visible_devices": "0,1,2"}}],
        "servers": servers,
        "ranks": [{"rank": 0, "node_rank": 0, "endpoints": [{"server": 0, "same_host": True},
                                                            {"server": 1, "same_host": False}]},
                  {"rank": 1, "node_rank": 1, "endpoints": [{"server": 0, "same_host": False},
                                                            {"server": 1, "same_host": True}]}],
        "parameters": [{"name": "fc1.weight", "owner": 1}, {"name": "fc2.weight", "owner": 0}],
    }


def bin_dir() -> str:
    daemon_dir = os.path.dirname(find_binary("muon-offloadd", "daemon"))
    return os.path.dirname(daemon_dir) if daemon_dir.endswith("/daemon") else daemon_dir


def test_plan_across_hosts_needs_a_token(tmpdir_private):
    plan = tmpdir_private / "plan.json"
    plan.write_text(json.dumps(plan_two_nodes()))
    env = {k: v for k, v in os.environ.items() if k != "MUON_OFFLOAD_TOKEN_FILE"}
    r = subprocess.run([LAUNCH, "--cpu", "--plan", str(plan), "--bin-dir", bin_dir(),
                        "--node-rank", "0", "--", "true"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 2, r.stderr
    assert "needs a shared token" in r.stderr, r.stderr


def test_plan_across_hosts_lists_every_server_and_listens_on_tcp(tmpdir_private, monkeypatch):
    from muon_offload import torch as mt
    plan = tmpdir_private / "plan.json"
    plan.write_text(json.dumps(plan_two_nodes()))
    token = tmpdir_private / "token"
    token.write_text("0123456789abcdef-job-secret\n")
    token.chmod(0o600)
    base = free_port_base(8)
    # The trainer on node 0 prints what it was given and checks the TCP listener of its own
    # server with a raw connection (a health frame needs no hello).
    probe = ("import os, socket, struct, json;"
             "print(os.environ['MUON_OFFLOAD_SERVERS']);"
             "print(os.environ.get('MUON_OFFLOAD_SERVERS_SCOPE'));"
             "print(os.environ.get('MUON_OFFLOAD_TOKEN_FILE'));"
             f"s = socket.create_connection(('127.0.0.1', {base + 3}), timeout=10);"
             "print('tcp-listening')")
    r = subprocess.run([LAUNCH, "--cpu", "--plan", str(plan), "--bin-dir", bin_dir(),
                        "--node-rank", "0", "--token-file", str(token),
                        "--tcp-port-base", str(base), "--", "/usr/bin/python3", "-c", probe],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    servers, scope, token_env, listening = r.stdout.split()
    first, second = servers.split(",")
    assert first.endswith("/gpu3.sock")                    # this node's server, by socket
    assert second == f"tcp://127.0.0.1:{base + 5}"         # the other node's, over TCP
    assert scope == "global" and token_env == str(token)
    assert listening == "tcp-listening"
    assert "cannot bind" not in r.stderr, r.stderr  # empty numactl fields stay empty
    # Owners index every server of the plan (global scope), not just this node's.
    monkeypatch.setenv("NODE_RANK", "0")
    monkeypatch.setenv("MUON_OFFLOAD_SERVERS_SCOPE", "global")
    assert mt._plan_owners(str(plan)) == {"fc1.weight": 1, "fc2.weight": 0}


def test_plan_across_hosts_refuses_ports_out_of_range_and_malformed_plans(tmpdir_private):
    plan = tmpdir_private / "plan.json"
    plan.write_text(json.dumps(plan_two_nodes()))
    token = tmpdir_private / "token"
    token.write_text("0123456789abcdef-job-secret\n")
    token.chmod(0o600)
    r = subprocess.run([LAUNCH, "--cpu", "--plan", str(plan), "--bin-dir", bin_dir(),
                        "--node-rank", "0", "--token-file", str(token),
                        "--tcp-port-base", "65533", "--", "true"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "outside 1024..65535" in r.stderr, r.stderr
    bad = plan_two_nodes()
    del bad["servers"][1]["host"]
    plan.write_text(json.dumps(bad))
    r = subprocess.run([LAUNCH, "--cpu", "--plan", str(plan), "--bin-dir", bin_dir(),
                        "--node-rank", "0", "--token-file", str(token), "--", "true"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "malformed" in r.stderr and "Traceback" not in r.stderr, r.stderr
