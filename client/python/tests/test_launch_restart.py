"""scripts/muon-offload-launch --restart-crashed: a server SIGKILLed mid-run is started again from
its periodic snapshot (--snapshot-every), the trainer hears ConnectionLost once (saying what the
snapshots keep), reconnects, and finishes bitwise as an uninterrupted run."""
import json
import os
import subprocess
import sys

import torch

from conftest import HERE, REPO
from helpers import TinyNet, train
from muon_offload.torch import InProcessMuon
from test_launch_multinode import LAUNCH, bin_dir

KW = dict(lr=0.03, weight_decay=0.05, adamw_lr=2e-3)

TRAINER = r"""
import json, os, signal, struct, sys, time
sys.path.insert(0, sys.argv[3])
import torch
from helpers import TinyNet, train
from muon_offload import ConnectionLost
from muon_offload.torch import OffloadMuon
snap, out = sys.argv[1], sys.argv[2]
KW = dict(lr=0.03, weight_decay=0.05, adamw_lr=2e-3)

def snapshot_step():
    try:
        with open(snap, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            return json.loads(f.read(n))["__metadata__"].get("step")
    except (OSError, ValueError, struct.error):
        return None

m = TinyNet()
opt = OffloadMuon(m.named_parameters(), **KW)
train(m, opt, 2)                      # steps 0 and 1: periodic snapshots after each
while snapshot_step() != "1":         # the one of step 1 is on disk (written off the io thread)
    time.sleep(0.01)
server = json.load(open(os.environ["MUON_OFFLOAD_JOB"]))["servers"][0]
os.kill(server["pid"], signal.SIGKILL)  # the crash
message = None
try:
    train(m, opt, 1, start=2)
except ConnectionLost as e:
    message = str(e)
for _ in range(1200):                  # the launcher restarts it from the snapshot
    try:
        opt.reconnect()
        break
    except ConnectionLost:
        time.sleep(0.05)
train(m, opt, 2, start=2)              # nothing stale: the snapshot holds step 1
pids = [s["pid"] for s in json.load(open(os.environ["MUON_OFFLOAD_JOB"]))["servers"]]
torch.save([p.detach().clone() for p in m.parameters()], out)
opt.close()
print(json.dumps({"message": message, "old_pid": server["pid"], "pids": pids}))
"""


def test_crashed_server_restarts_from_its_snapshot(tmpdir_private):
    snap = tmpdir_private / "momentum.safetensors"
    out = tmpdir_private / "params.pt"
    env = dict(os.environ, XDG_RUNTIME_DIR=str(tmpdir_private),
               PYTHONPATH=str(REPO / "client" / "python"))
    r = subprocess.run([LAUNCH, "--cpu", "--bin-dir", bin_dir(), "--snapshot", str(snap),
                        "--snapshot-every", "1", "--restart-crashed", "--",
                        sys.executable, "-c", TRAINER, str(snap), str(out), str(HERE)],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert "snapshots every step" in seen["message"], seen["message"]
    assert "restarting it on" in r.stderr and f"--restore {snap}" in r.stderr, r.stderr
    assert seen["pids"] != [seen["old_pid"]]  # the manifest names the new server
    ref = TinyNet()
    train(ref, InProcessMuon(ref.named_parameters(), **KW), 4)
    got = torch.load(out)
    assert all(torch.equal(p, q) for p, q in zip(got, ref.parameters())), "differs"


def test_snapshot_every_needs_a_snapshot(tmpdir_private):
    r = subprocess.run([LAUNCH, "--cpu", "--bin-dir", bin_dir(), "--snapshot-every", "5", "--",
                        "true"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--snapshot-every needs --snapshot FILE" in r.stderr
