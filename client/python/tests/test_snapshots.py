"""Snapshots hold one step for every parameter, a crash says what it cost, and a resume refuses
a mix of steps: real servers (SIGKILL for a crash, SIGTERM for a stop), the resume paths."""
import copy
import json
import os
import struct
import time

import pytest
import torch

from helpers import TinyNet, batch, param_diff, same_params, train
from muon_offload import ConnectionLost, InvalidArgument, MuonOffloadError
from muon_offload.torch import InProcessMuon, OffloadMuon

KW = dict(lr=0.03, weight_decay=0.05, adamw_lr=2e-3)


def reference(steps):
    m = TinyNet()
    train(m, InProcessMuon(m.named_parameters(), **KW), steps)
    return m


def snapshot_steps(path) -> dict:
    """The safetensors header's metadata of a snapshot: {"step:<name>": "<step>", "step": ...}."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        meta = json.loads(f.read(n))["__metadata__"]
    return {k: v for k, v in meta.items() if k.startswith("step")}


def only_fc1_step(model, opt, s):
    """A training step in which only fc1 takes a gradient (the other Muon parameters skip it):
    afterwards the server holds fc1 one step ahead of the rest."""
    opt.zero_grad(set_to_none=True)
    x, _ = batch(s)
    model.fc1(model.embed(x)).pow(2).mean().backward()
    opt.step()


def test_periodic_snapshot_one_step_and_a_crash_says_what_it_lost(server_factory,
                                                                  tmpdir_private):
    snap = str(tmpdir_private / "momentum.safetensors")
    s = server_factory("every", extra=["--snapshot", snap, "--snapshot-every", "2"])
    m = TinyNet()
    opt = OffloadMuon(m.named_parameters(), servers=[s.socket], **KW)
    train(m, opt, 4)  # steps 0-3: periodic snapshots after steps 1 and 3
    ckpt = copy.deepcopy({"model": m.state_dict(), "opt": opt.state_dict()})
    momentum = {opt._meta[p].name: opt.momentum_buffer(p) for p in opt._muon_params}
    # The snapshot of step 3 is written off the io thread: wait until it is on disk.
    give_up = time.monotonic() + 120
    while not os.path.exists(snap) or snapshot_steps(snap).get("step") != "3":
        assert time.monotonic() < give_up, "the periodic snapshot of step 3 never appeared"
        time.sleep(0.01)
    train(m, opt, 1, start=4)  # step 4: lost by the crash (no snapshot is due after it)
    s.kill()  # SIGKILL: a crash, no final snapshot
    steps = snapshot_steps(snap)
    names = [k for k in steps if k.startswith("step:")]
    assert len(names) == 4 and all(steps[k] == "3" for k in names), steps
    assert steps["step"] == "3"  # one step for every parameter, said once
    with pytest.raises(ConnectionLost) as e:
        train(m, opt, 1, start=5)
    msg = str(e.value)
    assert "every 2 steps" in msg and snap in msg and "at most 2" in msg, msg
    assert "is there" not in msg and "--restore SNAPSHOT" in msg and "reconnect()" in msg
    # The steps lost counted: the snapshot's step 3 against the optimizer's last, 4.
    assert (f"its snapshot {snap} holds step 3 of its 4 parameter(s), this optimizer is at "
            "step 4: the momentum of 1 step(s) (4..4) is lost") in msg, msg
    assert (f"restart it with `--restore {snap}`, call optimizer.reconnect(), then load your "
            "trainer checkpoint taken after step 3 (optimizer state step 4)") in msg, msg
    opt.close()

    # Resume in a new trainer: the server restores step 3, the trainer its checkpoint of step 3.
    s.restart(extra=["--snapshot", snap, "--snapshot-every", "2", "--restore", snap])
    m2 = TinyNet()
    m2.load_state_dict(ckpt["model"])
    opt2 = OffloadMuon(m2.named_parameters(), servers=[s.socket], resume_from_server=True, **KW)
    assert all(opt2.state[p]["step"] == 4 for p in opt2._muon_params)
    for p in opt2._muon_params:  # the restored momentum is bitwise that of step 3
        assert torch.equal(opt2.momentum_buffer(p), momentum[opt2._meta[p].name])
    opt2.load_state_dict(ckpt["opt"])  # the AdamW part's state (and the same momentum)
    train(m2, opt2, 2, start=4)
    assert same_params(m2, reference(6)), param_diff(m2, reference(6))
    opt2.close()


def test_mixed_snapshot_is_refused_on_resume_unless_per_parameter(server_factory,
                                                                  tmpdir_private):
    snap = str(tmpdir_private / "mixed.safetensors")
    s = server_factory("mixed", extra=["--snapshot", snap])
    m = TinyNet()
    opt = OffloadMuon(m.named_parameters(), servers=[s.socket], **KW)
    train(m, opt, 2)
    only_fc1_step(m, opt, 2)
    opt.snapshot()
    opt.close()
    steps = snapshot_steps(snap)
    assert steps["step:fc1.weight"] == "2" and steps["step:fc2.weight"] == "1"
    assert "step" not in steps  # no single step to name
    s.kill()
    s.restart(extra=["--restore", snap])
    assert "mixes steps" in open(s.log).read()
    with pytest.raises(InvalidArgument) as e:
        OffloadMuon(TinyNet().named_parameters(), servers=[s.socket], resume_from_server=True,
                    **KW)
    msg = str(e.value)
    assert "3 at step 1" in msg and "1 at step 2 ('fc1.weight')" in msg, msg
    assert "per_parameter" in msg and "--snapshot-every" in msg
    # Asked for, each parameter's own step is adopted.
    opt2 = OffloadMuon(TinyNet().named_parameters(), servers=[s.socket],
                       resume_from_server="per_parameter", **KW)
    assert {opt2._meta[p].name: opt2.state[p]["step"] for p in opt2._muon_params} == {
        "conv.weight": 2, "fc1.weight": 3, "fc2.weight": 2, "experts": 2}
    opt2.close()
    with pytest.raises(InvalidArgument, match="resume_from_server"):
        OffloadMuon(TinyNet().named_parameters(), servers=[s.socket], resume_from_server="yes",
                    **KW)


def test_stop_mid_step_keeps_the_periodic_snapshot(server_factory, tmpdir_private):
    snap = str(tmpdir_private / "kept.safetensors")
    s = server_factory("kept", extra=["--snapshot", snap, "--snapshot-every", "2"])
    m = TinyNet()
    opt = OffloadMuon(m.named_parameters(), servers=[s.socket], **KW)
    train(m, opt, 2)  # periodic snapshot after step 1
    only_fc1_step(m, opt, 2)  # fc1 at step 2, the rest at 1: a stop now has no single step
    opt.close()
    assert s.stop() == 0  # SIGTERM: the final snapshot would mix steps
    assert snapshot_steps(snap)["step"] == "1"
    assert "final snapshot skipped" in open(s.log).read()


def test_a_stop_mid_step_says_why_and_how_to_resume_and_the_run_goes_on_bitwise(
        server_factory, tmpdir_private):
    snap = str(tmpdir_private / "stopped.safetensors")
    s = server_factory("stopped", extra=["--snapshot", snap])
    m = TinyNet()
    opt = OffloadMuon(m.named_parameters(), servers=[s.socket], **KW)
    train(m, opt, 2)
    # Step 2's gradients pushed, not committed (no_commit): the server is gathering them when
    # it is stopped, so it aborts step 2 with the momentum untouched and snapshots step 1.
    opt.zero_grad(set_to_none=True)
    x, y = batch(2)
    with opt.no_commit():
        m(x, y).backward()
    assert s.stop() == 0  # SIGTERM
    with pytest.raises(MuonOffloadError) as e:
        opt.step()
    msg = str(e.value)
    # Why (the signal), that the server was stopped rather than lost, what its snapshot holds
    # against this optimizer, and how to resume.
    assert "server shutting down (signal SIGTERM)" in msg, msg
    assert "was stopped" in msg and "no step lost" in msg and "--restore" in msg, msg
    assert snapshot_steps(snap)["step"] == "1"
    # As the message says: restart from the snapshot, reconnect, step on (step 2 again).
    s.restart(extra=["--snapshot", snap, "--restore", snap])
    opt.reconnect()
    train(m, opt, 2, start=2)
    assert same_params(m, reference(4)), param_diff(m, reference(4))
    opt.close()


def test_snapshot_every_needs_a_path(tmpdir_private):
    from conftest import Server
    with pytest.raises(RuntimeError) as e:
        Server(str(tmpdir_private / "bad.sock"), ["--snapshot-every", "3"])
    assert "--snapshot-every 3 needs --snapshot PATH" in str(e.value)


def test_the_crash_report_says_what_each_lost_server_keeps(tmpdir_private):
    """lost_steps_report, line by line: no --snapshot, a snapshot not on disk, one holding the
    optimizer's step (nothing lost), one behind (steps counted), a file that is not ours, and a
    server still connected (not mentioned)."""
    from muon_offload.crash_report import lost_steps_report, snapshot_steps

    def snapshot(path, steps):
        header = json.dumps({"__metadata__": dict(
            {"format": "muon-offload-momentum", "version": "1"},
            **{f"step:{n}": str(s) for n, s in steps.items()})}).encode()
        path.write_bytes(struct.pack("<Q", len(header)) + header)
        return str(path)

    at7 = snapshot(tmpdir_private / "a.safetensors", {"w": 7, "v": 7})
    at4 = snapshot(tmpdir_private / "b.safetensors", {"w": 4, "u": 9})
    junk = tmpdir_private / "junk"
    junk.write_bytes(b"\xff" * 64)
    assert snapshot_steps(at4) == {"w": 4, "u": 9}
    assert snapshot_steps(str(junk)) is None and snapshot_steps(str(tmpdir_private / "x")) is None
    missing = str(tmpdir_private / "none.safetensors")
    report = lost_steps_report(
        ["s0", "s1", "s2", "s3", "s4", "s5"],
        [(True, ("", 0)), (True, (missing, 5)), (True, (at7, 2)), (True, (at4, 0)),
         (True, (str(junk), 1)), (False, (at4, 1))],
        {"w": 7, "v": 7})
    lines = report.splitlines()
    assert len(lines) == 5, report
    assert lines[0].startswith("Server s0: lost, with no --snapshot: the momentum it held is gone")
    assert lines[1].startswith(f"Server s1: lost; its snapshot {missing} is not on disk here")
    assert lines[2].startswith(f"Server s2: lost; its snapshot {at7} holds step 7 of its 2 "
                               "parameter(s), this optimizer's last step: no step lost")
    assert lines[3].startswith(f"Server s3: lost; its snapshot {at4} holds step 4 of its 1 "
                               "parameter(s), this optimizer is at step 7: the momentum of 3 "
                               "step(s) (5..7) is lost. To resume")
    assert lines[4].startswith("Server s4: lost; its snapshot") and "not on disk" in lines[4]
