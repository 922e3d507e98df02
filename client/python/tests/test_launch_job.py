"""What scripts/muon-offload-launch tells an operator: the job manifest in the user's jobs
directory (every server's socket, pid, log and metrics endpoint, removed at exit) that
`muon-offload status --job` and `health --job` read; one metrics port per server from a base;
the plan's socket_dir; and the options it refuses or warns about (--servers with --plan, one
--metrics-port for every server, a NUMA binding without numactl). Real CPU servers where the
servers must answer, the fake server of test_launch_multinode where only their command lines
matter."""
import json
import os
import subprocess
import sys
import urllib.request

from conftest import find_binary
from test_launch_multinode import (LAUNCH, bin_dir, fake_bin_dir, flag, free_port_base,
                                   one_host_plan, server_args)

TRAINER = r"""
import json, os, subprocess, sys, urllib.request
job = json.load(open(os.environ["MUON_OFFLOAD_JOB"]))
metrics = [urllib.request.urlopen(s["metrics_url"], timeout=10).read().decode()
           for s in job["servers"]]
status = subprocess.run([sys.argv[1], "status", "--job", job["job"], "--rate-window-ms", "0"],
                        capture_output=True, text=True, timeout=60)
print(json.dumps({"manifest": job, "metrics_ok": ["muon_offload_" in m for m in metrics],
                  "status": status.stdout, "status_rc": status.returncode,
                  "path": os.environ["MUON_OFFLOAD_JOB"]}))
"""


def test_job_manifest_names_every_server_and_goes_at_exit(tmpdir_private):
    xdg = tmpdir_private / "xdg"
    xdg.mkdir(mode=0o700)
    base = free_port_base(2)
    env = dict(os.environ, XDG_RUNTIME_DIR=str(xdg))
    cli = find_binary("muon-offload", "cli")
    r = subprocess.run([LAUNCH, "--cpu", "--servers", "2", "--bin-dir", bin_dir(),
                        "--job-name", "job7", "--metrics-port-base", str(base), "--",
                        sys.executable, "-c", TRAINER, cli],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)
    job = seen["manifest"]
    jobs_dir = xdg / "muon-offload" / "jobs"
    assert seen["path"].startswith(str(jobs_dir) + "/job7.node0.")
    assert job["schema"] == "muon-offload-job/1" and job["job"] == "job7"
    assert [s["index"] for s in job["servers"]] == [0, 1]
    assert [s["metrics_url"] for s in job["servers"]] == [
        f"http://127.0.0.1:{base}/metrics", f"http://127.0.0.1:{base + 1}/metrics"]
    assert seen["metrics_ok"] == [True, True]
    assert all(s["socket"].startswith(job["run_dir"]) for s in job["servers"])
    # The launcher printed every endpoint.
    for s in job["servers"]:
        assert f"socket {s['socket']}, pid {s['pid']}" in r.stderr, r.stderr
        assert f"metrics {s['metrics_url']}" in r.stderr, r.stderr
    # status --job saw both servers up.
    assert seen["status_rc"] == 0, seen["status"]
    rows = [line.split() for line in seen["status"].splitlines()]
    states = {w[0]: w[3] for w in rows if len(w) > 3 and w[0] in ("0", "1")}
    assert states == {"0": "up", "1": "up"}, seen["status"]
    # Gone with the launcher; the run dir too (the run succeeded).
    assert not os.path.exists(seen["path"])
    assert not os.path.exists(job["run_dir"])


def test_servers_and_plan_exclude_each_other_and_one_metrics_port_is_refused(tmpdir_private):
    plan = tmpdir_private / "plan.json"
    plan.write_text(json.dumps(one_host_plan()))
    r = subprocess.run([LAUNCH, "--cpu", "--servers", "2", "--plan", str(plan), "--", "true"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--servers and --plan exclude each other" in r.stderr, r.stderr
    r = subprocess.run([LAUNCH, "--cpu", "--servers", "2", "--server-arg", "--metrics-port=9400",
                        "--", "true"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "use --metrics-port-base" in r.stderr, r.stderr
    r = subprocess.run([LAUNCH, "--cpu", "--metrics-port-base", "80", "--", "true"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "1024..65535" in r.stderr, r.stderr


def test_plan_socket_dir_holds_the_sockets(tmpdir_private):
    doc = one_host_plan()
    socks = tmpdir_private / "socks"
    doc["socket_dir"] = str(socks)
    plan = tmpdir_private / "plan.json"
    plan.write_text(json.dumps(doc))
    run_dir = tmpdir_private / "run"
    r = subprocess.run([LAUNCH, "--cpu", "--plan", str(plan), "--bin-dir",
                        fake_bin_dir(tmpdir_private), "--run-dir", str(run_dir), "--",
                        "bash", "-c", 'echo "$MUON_OFFLOAD_SERVERS"'],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"{socks}/gpu3.sock,{socks}/gpu7.sock"
    assert flag(server_args(socks, "gpu3.sock"), "--socket") == str(socks / "gpu3.sock")
    assert (socks.stat().st_mode & 0o777) == 0o700
    assert (run_dir / "server0.log").exists()  # logs stay in the run dir


def test_numa_binding_without_numactl_is_said(tmpdir_private):
    doc = one_host_plan()
    doc["nodes"][0]["servers"][0]["numactl"] = "--cpunodebind=1 --membind=1"
    plan = tmpdir_private / "plan.json"
    plan.write_text(json.dumps(doc))
    env = dict(os.environ, MUON_OFFLOAD_NUMACTL=str(tmpdir_private / "no-numactl"))
    r = subprocess.run([LAUNCH, "--cpu", "--plan", str(plan), "--bin-dir",
                        fake_bin_dir(tmpdir_private), "--run-dir", str(tmpdir_private / "run"),
                        "--", "true"], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert ("server 0: numactl is not installed, so it runs without the plan's NUMA binding "
            "(--cpunodebind=1 --membind=1)") in r.stderr, r.stderr
    assert "server 1: numactl" not in r.stderr  # no binding asked for


def test_the_trainer_inherits_the_callers_variables_not_the_launchers(tmpdir_private):
    """The launcher's own shell variables (N, PLAN, THREADS, CPU, ...) share names with what a
    user may export: the trainer sees the caller's values, and what the launcher hands over on
    purpose (MUON_OFFLOAD_SERVERS)."""
    xdg = tmpdir_private / "xdg"
    xdg.mkdir(mode=0o700)
    mine = {"N": "7", "PLAN": "my-plan", "THREADS": "abc", "CPU": "x86", "REPLICATE": "no"}
    env = dict(os.environ, XDG_RUNTIME_DIR=str(xdg), **mine)
    show = ("import json, os; print(json.dumps({k: os.environ.get(k) for k in "
            f"{sorted(mine) + ['MUON_OFFLOAD_SERVERS']!r}}}))")
    r = subprocess.run([LAUNCH, "--cpu", "--servers", "2", "--bin-dir", bin_dir(), "--",
                        sys.executable, "-c", show],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)
    assert {k: seen[k] for k in mine} == mine
    assert len(seen["MUON_OFFLOAD_SERVERS"].split(",")) == 2
