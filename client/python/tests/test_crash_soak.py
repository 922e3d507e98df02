"""A server SIGKILLed at random moments of training (pushes arriving, Newton-Schulz running,
updates going back, between steps), restarted from its periodic snapshot, and the trainer's
recovery loop of the ConnectionLost message (reconnect(), then its last checkpoint when the
server's momentum is stale): the final weights are bitwise those of an uninterrupted in-process
run, nothing hangs, no shared-memory segment is left over, and every ConnectionLost says what the
snapshots keep. (One server, one rank: no buddy to fail over to, so the trainer recomputes the
steps the snapshot lacks.)

Short form: 6 kills (the test command). Long form by hand:
    MUON_CRASH_SOAK_KILLS=50 MUON_CRASH_SOAK_STEPS=400 pytest -s test_crash_soak.py
(at least that many steps, more until every kill has landed and been recovered from; prints the
kills, the recoveries from the snapshot vs from the checkpoint, and the time from a
kill to the next completed step)."""
import copy
import os
import statistics
import time

from helpers import TinyNet, param_diff, same_params, train
from pool import Killer, shm_segments
from muon_offload import ConnectionLost
from muon_offload.torch import InProcessMuon, OffloadMuon

KW = dict(lr=0.03, weight_decay=0.05, adamw_lr=2e-3)
KILLS = int(os.environ.get("MUON_CRASH_SOAK_KILLS", "6"))
STEPS = int(os.environ.get("MUON_CRASH_SOAK_STEPS", "60"))


def test_random_server_kills_lose_nothing_of_the_result(server_factory, tmpdir_private):
    shm_before = set(shm_segments())
    snap = str(tmpdir_private / "momentum.safetensors")
    flags = ["--snapshot", snap, "--snapshot-every", "1"]
    s = server_factory("soak", extra=flags)
    m = TinyNet()
    opt = OffloadMuon(m.named_parameters(), servers=[s.socket], **KW)
    ckpt = copy.deepcopy({"model": m.state_dict(), "opt": opt.state_dict(), "step": 0})
    # The first kill lands within 5 ms of the start: in the first step, before any snapshot.
    killer = Killer([s], seed=17, first_max_delay=0.005)
    killer.start()
    step, recoveries, from_checkpoint, kill_to_step = 0, 0, 0, []
    recovered_from = None  # when the kill just recovered from landed
    give_up = time.monotonic() + 600
    try:
        while (step < STEPS or killer.kills < KILLS or killer.killed_at is not None
               or recovered_from is not None):
            assert time.monotonic() < give_up, "no progress within 600 s (a hang)"
            if killer.kills < KILLS and not killer.armed.is_set() and killer.killed_at is None:
                killer.armed.set()
            try:
                train(m, opt, 1, start=step)
                step += 1
                ckpt = copy.deepcopy({"model": m.state_dict(), "opt": opt.state_dict(),
                                      "step": step})
                if recovered_from is not None:
                    kill_to_step.append(time.monotonic() - recovered_from)
                    recovered_from = None
            except ConnectionLost as e:
                msg = str(e)
                assert "snapshots every step" in msg and "reconnect()" in msg, msg
                s.proc.wait()  # the kill landed: restart from the snapshot, if one is on disk
                s.proc = None
                s.restart(extra=flags + (["--restore", snap] if os.path.exists(snap) else []))
                opt.reconnect()
                recoveries += 1
                recovered_from, killer.killed_at = killer.killed_at, None  # may be re-armed
                if opt._stale:  # the snapshot is older than the optimizer: its checkpoint
                    m.load_state_dict(ckpt["model"])
                    # A copy: torch's load_state_dict keeps the checkpoint's AdamW tensors
                    # (step, exp_avg) as the live state, and AdamW updates them in place; the
                    # same in-memory checkpoint may have to be loaded again.
                    opt.load_state_dict(copy.deepcopy(ckpt["opt"]))
                    step = ckpt["step"]
                    from_checkpoint += 1
                else:  # the snapshot holds exactly the optimizer's step: go on from there
                    # (no state yet when the kill landed in the first step: step 0 again)
                    step = int(opt.state[opt._muon_params[0]].get("step", 0))
    finally:
        killer.stop.set()
        killer.join()
    opt.close()
    ref = TinyNet()
    train(ref, InProcessMuon(ref.named_parameters(), **KW), step)
    assert same_params(m, ref), param_diff(m, ref)
    assert killer.kills == KILLS and recoveries == KILLS, (killer.kills, recoveries)
    s.stop()
    assert set(shm_segments()) <= shm_before, set(shm_segments()) - shm_before  # none left over
    print(f"\ncrash soak: {killer.kills} kills, {recoveries} recoveries "
          f"({from_checkpoint} from the trainer's checkpoint, the rest from the snapshot); "
          f"kill to next completed step: median {statistics.median(kill_to_step):.3f} s, "
          f"max {max(kill_to_step):.3f} s over {len(kill_to_step)}; {step} steps")
