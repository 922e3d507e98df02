"""``scripts/muon-offload-launch -- torchrun --nproc-per-node 2 train.py``: the launcher starts a
server, torchrun two ranks of a DDP trainer (torchrun_train.py) against it, and the offloaded
run equals the in-process reference bitwise on both ranks."""
import os
import pathlib
import subprocess
import sys

import torch

from conftest import REPO, find_binary

HERE = pathlib.Path(__file__).resolve().parent


def test_launcher_runs_torchrun_with_two_ddp_ranks(tmpdir_private):
    daemon_dir = os.path.dirname(find_binary("muon-offloadd", "daemon"))
    bin_dir = os.path.dirname(daemon_dir) if daemon_dir.endswith("/daemon") else daemon_dir
    torchrun = pathlib.Path(sys.executable).parent / "torchrun"  # next to the venv's python
    assert torchrun.is_file(), torchrun
    env = dict(os.environ, PATH=f"{torchrun.parent}:{os.environ['PATH']}",
               PYTHONPATH=f"{REPO / 'client' / 'python'}:{HERE}",
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    out = tmpdir_private / "out"
    out.mkdir()
    r = subprocess.run([str(REPO / "scripts" / "muon-offload-launch"), "--cpu", "--bin-dir",
                        bin_dir, "--", "torchrun", "--standalone", "--nproc-per-node", "2",
                        str(HERE / "torchrun_train.py"), str(out)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "1 server(s), backend cpu" in r.stderr
    ranks = [torch.load(out / f"rank{i}.pt") for i in (0, 1)]
    for i, got in enumerate(ranks):
        assert got["world"] == 2 and got["local_rank"] == i
        assert got["servers"].endswith("s0.sock")
        assert got["losses"] == got["ref_losses"]
        for p, q in zip(got["offload"], got["reference"]):
            assert torch.equal(p, q)
    for p, q in zip(ranks[0]["offload"], ranks[1]["offload"]):  # one model on both ranks
        assert torch.equal(p, q)
    assert ranks[0]["losses"] != ranks[1]["losses"]  # each rank on its own data
