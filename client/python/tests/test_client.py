"""The ctypes layer (muon_offload.Client, local_update) and scripts/muon-offload-launch."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import REPO, find_binary
from muon_offload import Client, InvalidArgument, local_update

OPTS = {"mu": 0.9, "nesterov": True}


def test_client_round_trip_is_bitwise_local_update(server):
    rng = np.random.default_rng(3)
    shape = (12, 20)
    n = 12 * 20
    with Client([server.socket]) as c:
        c.register("w", shape, OPTS)
        mom = np.zeros(shape, np.float32)
        for step in range(3):
            g = rng.standard_normal(shape).astype(np.float32)
            c.push("w", step, 0, g[:5].copy())           # two chunks
            c.push("w", step, 5 * 20, g[5:].copy())
            c.commit("w", step)
            out = np.empty(n, np.float32)
            assert c.wait_update("w", step, out)
            ref = np.empty(shape, np.float32)
            assert local_update("w", shape, OPTS, g, mom, ref, threads=1)
            assert np.array_equal(out.reshape(shape), ref)
        got = np.empty(n, np.float32)
        assert c.fetch_momentum("w", got) == 2
        assert np.array_equal(got.reshape(shape), mom)
        with pytest.raises(InvalidArgument, match="bytes"):
            c.wait_update("w", 3, np.empty(3, np.float32))
        with pytest.raises(InvalidArgument, match="contiguous"):
            c.push("w", 3, 0, np.zeros((4, 4), np.float32)[:, :2])


def test_bf16_wire_is_exact(server):
    """bf16 gradients are widened exactly on the server and the update rounded once to bf16:
    the result is bf16(local_update(float(g_bf16)))."""
    torch = pytest.importorskip("torch")
    shape = (6, 10)
    g = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    with Client([server.socket]) as c:
        c.register("b", shape, OPTS, grad_dtype="bf16", update_dtype="bf16")
        c.push("b", 0, 0, g.contiguous().view(-1))
        c.commit("b", 0)
        out = torch.empty(60, dtype=torch.bfloat16)
        assert c.wait_update("b", 0, out)
    ref = torch.empty(shape)
    local_update("b", shape, OPTS, g.float().contiguous(), torch.zeros(shape), ref, threads=1)
    assert torch.equal(out.view(shape), ref.to(torch.bfloat16))


LAUNCH_CHECK = textwrap.dedent("""
    import os, sys
    sys.path[:0] = [{pkg!r}, {pkg_parent!r}]
    from helpers import TinyNet, train
    from muon_offload.torch import OffloadMuon
    servers = os.environ["MUON_OFFLOAD_SERVERS"].split(",")
    assert len(servers) == 2 and os.environ["MUON_OFFLOAD_RUN_DIR"], servers
    m = TinyNet()
    opt = OffloadMuon(m.named_parameters())          # servers from the environment
    assert {{opt._meta[p].server for p in opt._muon_params}} == {{0, 1}}
    train(m, opt, 2)
    opt.close()
    sys.exit(7)
""")


def test_launch_script_runs_a_trainer_against_two_servers(tmpdir_private):
    daemon_dir = os.path.dirname(find_binary("muon-offloadd", "daemon"))
    # a build tree (<build>/daemon, <build>/cli) or one folder holding both binaries
    bin_dir = os.path.dirname(daemon_dir) if daemon_dir.endswith("/daemon") else daemon_dir
    script = tmpdir_private / "trainer.py"
    here = os.path.dirname(os.path.abspath(__file__))
    script.write_text(LAUNCH_CHECK.format(pkg=here, pkg_parent=os.path.dirname(here)))
    run_dir = tmpdir_private / "run"
    snap = tmpdir_private / "final.safetensors"
    r = subprocess.run([str(REPO / "scripts" / "muon-offload-launch"), "--cpu", "--servers", "2",
                        "--bin-dir", bin_dir, "--run-dir", str(run_dir), "--snapshot", str(snap),
                        "--", sys.executable, str(script)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 7, r.stderr            # the trainer's exit code
    # SIGTERM at the end: each server wrote its final snapshot and removed its socket
    assert (tmpdir_private / "final.safetensors.0").is_file(), r.stderr
    assert (tmpdir_private / "final.safetensors.1").is_file(), r.stderr
    assert not (run_dir / "s0.sock").exists()
    assert (run_dir / "server0.log").is_file()
    bad = subprocess.run([str(REPO / "scripts" / "muon-offload-launch"), "--bogus"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown option" in bad.stderr


PLAN = {
    "schema": "muon-offload-plan/1",
    "nodes": [{"node_rank": 0, "host": "node0",
               "servers": [{"id": 0, "cuda_visible_devices": "3", "socket_name": "gpu3.sock",
                            "numactl": ""},
                           {"id": 1, "cuda_visible_devices": "7", "socket_name": "gpu7.sock",
                            "numactl": "--cpunodebind=0 --membind=0"}],
               "compute": {"cuda_visible_devices": "0,1,2,4,5,6"}}],
    "servers": [{"id": 0, "host": "node0", "node_rank": 0, "gpu": 3, "domain": 0,
                 "socket_name": "gpu3.sock"},
                {"id": 1, "host": "node0", "node_rank": 0, "gpu": 7, "domain": 0,
                 "socket_name": "gpu7.sock"}],
    "domains": [{"id": 0, "servers": [0, 1], "compute_ranks": [0]}],
    "ranks": [{"rank": 0, "node_rank": 0, "domain": 0,
               "endpoints": [{"server": 0, "same_host": True},
                             {"server": 1, "same_host": True}]}],
    # one domain: its relay of each parameter is the owner
    "parameters": [{"name": "fc1.weight", "owner": 1, "relays": [1]},
                   {"name": "fc2.weight", "owner": 0, "relays": [0]},
                   {"name": "not.in.this.model", "owner": 1, "relays": [1]}],
}


def test_plan_gives_servers_sockets_and_owners(tmpdir_private, monkeypatch):
    import json
    from muon_offload import offload as mt
    daemon_dir = os.path.dirname(find_binary("muon-offloadd", "daemon"))
    bin_dir = os.path.dirname(daemon_dir) if daemon_dir.endswith("/daemon") else daemon_dir
    plan = tmpdir_private / "plan.json"
    plan.write_text(json.dumps(PLAN))
    r = subprocess.run([str(REPO / "scripts" / "muon-offload-launch"), "--cpu", "--plan", str(plan),
                        "--bin-dir", bin_dir, "--", "bash", "-c",
                        'for s in ${MUON_OFFLOAD_SERVERS//,/ }; do basename $s; done; '
                        'echo "plan=$MUON_OFFLOAD_PLAN"'],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split()
    assert lines[:2] == ["gpu3.sock", "gpu7.sock"], r.stdout   # the plan's servers, in order
    assert lines[2] == f"plan={plan}"
    # OffloadMuon sends each parameter the plan names to its owner (index into the servers):
    # in this plan's one domain the relay is the owner.
    monkeypatch.setenv("NODE_RANK", "0")
    assert mt.plan_targets(str(plan)) == {"fc1.weight": 1, "fc2.weight": 0,
                                           "not.in.this.model": 1}
    bad = dict(PLAN, nodes=[])
    plan.write_text(json.dumps(bad))
    r = subprocess.run([str(REPO / "scripts" / "muon-offload-launch"), "--cpu", "--plan", str(plan),
                        "--bin-dir", bin_dir, "--", "true"], capture_output=True, text=True)
    assert r.returncode == 2 and "has no node 0" in r.stderr, r.stderr
