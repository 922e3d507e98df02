"""examples/train_char_gpt.py --checkpoint/--resume after a server crash: the run is split at a
checkpoint, the server SIGKILLed and replaced by a fresh one, and the resumed run's losses are
bitwise those of an uninterrupted run (load_state_dict puts the momentum back)."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from conftest import REPO

EXAMPLE = REPO / "examples" / "train_char_gpt.py"
SMALL = ["--steps", "6", "--d-model", "32", "--layers", "1", "--heads", "2", "--context", "16",
         "--batch", "4", "--eval-batches", "1", "--log-every", "1"]


def run(server, *args):
    env = dict(os.environ, MUON_OFFLOAD_SERVERS=server.socket)
    r = subprocess.run([sys.executable, str(EXAMPLE), *SMALL, *args], capture_output=True,
                       text=True, timeout=600, env=env)
    return r


@pytest.mark.skipif(not pathlib.Path("/usr/share/games/fortunes").is_dir(),
                    reason="the example's corpus (Debian's fortunes package) is not installed")
def test_resume_after_a_server_crash_is_bitwise(server_factory, tmpdir_private):
    whole = tmpdir_private / "whole.json"
    r = run(server_factory("whole"), "--out", str(whole))
    assert r.returncode == 0, r.stdout + r.stderr
    ref = json.loads(whole.read_text())["losses"]

    ck = tmpdir_private / "ck.pt"
    s = server_factory("crash")
    r = run(s, "--until", "3", "--checkpoint", str(ck), "--checkpoint-every", "3")
    assert r.returncode == 0, r.stdout + r.stderr
    s.kill()     # the crash: the server's momentum is gone
    s.restart()  # a fresh server, nothing restored
    part = tmpdir_private / "part.json"
    r = run(s, "--checkpoint", str(ck), "--checkpoint-every", "3", "--resume", "--out",
            str(part))
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(part.read_text())
    assert out["start_step"] == 3 and len(out["losses"]) == 3
    assert out["losses"] == ref[3:], (out["losses"], ref)


def test_resume_needs_a_checkpoint(server, tmpdir_private):
    r = run(server, "--resume")
    assert r.returncode != 0 and "--resume needs --checkpoint PATH" in r.stderr
    r = run(server, "--resume", "--checkpoint", str(tmpdir_private / "none.pt"))
    assert r.returncode != 0 and "no checkpoint at" in r.stderr


@pytest.mark.skipif(not pathlib.Path("/usr/share/games/fortunes").is_dir(),
                    reason="the example's corpus (Debian's fortunes package) is not installed")
def test_clipped_training_through_the_server_is_bitwise_the_in_process_run(server,
                                                                          tmpdir_private):
    # --clip-grad-norm: the offloaded run keeps its gradients for the clip (overlap=False) and
    # its losses are bitwise the in-process optimizer's, which clips the same gradients; the
    # clip does change the run.
    losses = {}
    for name, args in (("offload", ["--optimizer", "offload", "--clip-grad-norm", "0.1"]),
                       ("inprocess", ["--optimizer", "inprocess", "--clip-grad-norm", "0.1"]),
                       ("unclipped", ["--optimizer", "offload"])):
        out = tmpdir_private / f"{name}.json"
        r = run(server, *args, "--out", str(out))
        assert r.returncode == 0, r.stdout + r.stderr
        losses[name] = json.loads(out.read_text())["losses"]
    assert losses["offload"] == losses["inprocess"]
    assert losses["offload"] != losses["unclipped"]
