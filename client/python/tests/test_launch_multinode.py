"""scripts/muon-offload-launch with a plan whose domain spans hosts (an NVL72 rack cut into
nodes): every node's servers also listen on TCP (token-checked), and the trainer gets every
server of the plan in id order, its own node's by socket and the others' as tcp://HOST:PORT,
with the owners indexed globally. Real servers (CPU backend) on this machine; the tests of what
each server is told of the pool (--plan, --server-id, --pool-servers) use a fake server that
records its command line."""
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
        "domains": [{"id": 0, "servers": [0, 1], "compute_ranks": [0, 1]}],
        "ranks": [{"rank": 0, "node_rank": 0, "domain": 0,
                   "endpoints": [{"server": 0, "same_host": True},
                                 {"server": 1, "same_host": False}]},
                  {"rank": 1, "node_rank": 1, "domain": 0,
                   "endpoints": [{"server": 0, "same_host": False},
                                 {"server": 1, "same_host": True}]}],
        # one domain: its relay of each parameter is the owner
        "parameters": [{"name": "fc1.weight", "owner": 1, "relays": [1]},
                       {"name": "fc2.weight", "owner": 0, "relays": [0]}],
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
    from muon_offload import offload as mt
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
    assert mt.plan_targets(str(plan)) == {"fc1.weight": 1, "fc2.weight": 0}


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


# -- what each server is told of the pool (relays forward to owners) ---------------------------
# A fake muon-offloadd records its command line, so these tests run without real servers.

FAKE_DAEMON = r"""#!/bin/bash
# Records its arguments, one a line, in <socket>.args; runs until SIGTERM.
sock=
prev=
for a in "$@"; do [ "$prev" = --socket ] && sock=$a; prev=$a; done
printf '%s\n' "$@" > "$sock.args.tmp" && mv "$sock.args.tmp" "$sock.args"
trap 'exit 0' TERM
while :; do sleep 0.05; done
"""

FAKE_CLI = r"""#!/bin/bash
# "health --socket S ...": healthy once the fake server has recorded its arguments.
[ "$1" = health ] && [ -e "$3.args" ] && exit 0
sleep 0.05
exit 1
"""


def fake_bin_dir(root):
    d = root / "fakebin"
    d.mkdir()
    for name, text in (("muon-offloadd", FAKE_DAEMON), ("muon-offload", FAKE_CLI)):
        (d / name).write_text(text)
        (d / name).chmod(0o755)
    return str(d)


def server_args(run_dir, socket_name):
    return (run_dir / f"{socket_name}.args").read_text().splitlines()


def flag(args, name):
    """The value of a flag given exactly once."""
    assert args.count(name) == 1, args
    return args[args.index(name) + 1]


def launch_fake(tmp, plan_arg, *extra):
    """The launcher with the fake binaries, run in `tmp` (the plan may be a relative path);
    returns the trainer's MUON_OFFLOAD_SERVERS and the run dir."""
    run_dir = tmp / "run"
    r = subprocess.run([LAUNCH, "--cpu", "--plan", plan_arg, "--bin-dir", fake_bin_dir(tmp),
                        "--run-dir", str(run_dir), *extra, "--",
                        "bash", "-c", 'echo "$MUON_OFFLOAD_SERVERS"'],
                       capture_output=True, text=True, timeout=60, cwd=tmp)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip(), run_dir


def test_servers_get_the_plan_their_id_and_the_pool_across_hosts(tmpdir_private):
    """Global mode: each server's --pool-servers is the trainer's MUON_OFFLOAD_SERVERS of its
    node (every server of the plan in id order, this node's by socket, the others' over TCP)."""
    plan = tmpdir_private / "plan.json"
    plan.write_text(json.dumps(plan_two_nodes()))
    token = tmpdir_private / "token"
    token.write_text("0123456789abcdef-job-secret\n")
    token.chmod(0o600)
    base = 41000
    for node, own, other, other_port in ((0, "gpu3.sock", 1, base + 5),
                                         (1, "gpu5.sock", 0, base + 3)):
        tmp = tmpdir_private / f"node{node}"
        tmp.mkdir()
        servers, run_dir = launch_fake(tmp, "../plan.json", "--node-rank", str(node),
                                       "--token-file", str(token), "--tcp-port-base", str(base))
        pool = [str(run_dir / own), f"tcp://127.0.0.1:{other_port}"]
        if node == 1:
            pool.reverse()  # id order: server 0 (node 0) first
        assert servers == ",".join(pool)
        args = server_args(run_dir, own)
        assert flag(args, "--plan") == str(plan)          # absolute, though given relative
        assert flag(args, "--server-id") == str(node)
        assert flag(args, "--pool-servers") == servers
        assert flag(args, "--listen") == f"0.0.0.0:{base + (3 if node == 0 else 5)}"


def one_host_plan():
    """Two servers on one host, one per domain, each relaying fc1 (owner 1) for its ranks."""
    servers = [{"id": 0, "host": "node0", "node_rank": 0, "gpu": 3, "socket_name": "gpu3.sock"},
               {"id": 1, "host": "node0", "node_rank": 0, "gpu": 7, "socket_name": "gpu7.sock"}]
    return {
        "schema": "muon-offload-plan/1",
        "nodes": [{"node_rank": 0, "host": "node0",
                   "servers": [{"id": 0, "gpu": 3, "cuda_visible_devices": "3",
                                "socket_name": "gpu3.sock", "numactl": ""},
                               {"id": 1, "gpu": 7, "cuda_visible_devices": "7",
                                "socket_name": "gpu7.sock", "numactl": ""}],
                   "compute": {"cuda_visible_devices": "0,1,2"}}],
        "servers": servers,
        "domains": [{"id": 0, "servers": [0], "compute_ranks": [0]},
                    {"id": 1, "servers": [1], "compute_ranks": [1]}],
        "ranks": [{"rank": 0, "node_rank": 0, "domain": 0,
                   "endpoints": [{"server": 0, "same_host": True}]},
                  {"rank": 1, "node_rank": 0, "domain": 1,
                   "endpoints": [{"server": 1, "same_host": True}]}],
        "parameters": [{"name": "fc1.weight", "owner": 1, "relays": [0, 1]}],
    }


def test_servers_get_the_plan_their_id_and_the_pool_on_one_host(tmpdir_private):
    """One host: the pool is every server's socket in id order (the trainer's list too); a plan
    without the top-level server list gives the same pool from its nodes; no plan, no flags."""
    plan = tmpdir_private / "plan.json"
    for i, doc in enumerate((one_host_plan(), {k: v for k, v in one_host_plan().items()
                                               if k != "servers"})):
        plan.write_text(json.dumps(doc))
        tmp = tmpdir_private / f"try{i}"
        tmp.mkdir()
        servers, run_dir = launch_fake(tmp, str(plan))
        pool = f"{run_dir}/gpu3.sock,{run_dir}/gpu7.sock"
        assert servers == pool
        for sid, sock in ((0, "gpu3.sock"), (1, "gpu7.sock")):
            args = server_args(run_dir, sock)
            assert flag(args, "--plan") == str(plan)
            assert flag(args, "--server-id") == str(sid)
            assert flag(args, "--pool-servers") == pool
            assert "--listen" not in args
    # server ids must index the pool
    bad = one_host_plan()
    bad["servers"][1]["id"] = 2
    plan.write_text(json.dumps(bad))
    r = subprocess.run([LAUNCH, "--cpu", "--plan", str(plan), "--bin-dir",
                        fake_bin_dir(tmpdir_private), "--", "true"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "are not 0..1" in r.stderr, r.stderr
    # without a plan: none of the pool flags
    run_dir = tmpdir_private / "noplan"
    r = subprocess.run([LAUNCH, "--cpu", "--servers", "2", "--bin-dir",
                        str(tmpdir_private / "fakebin"), "--run-dir", str(run_dir), "--", "true"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for sock in ("s0.sock", "s1.sock"):
        args = server_args(run_dir, sock)
        assert not {"--plan", "--server-id", "--pool-servers"} & set(args), args
