"""Failover inside a pool (docs/design.md, "Failover"): three real servers, the trainer's ranks
behind relay server 0, every Muon parameter owned by server 1 whose buddy is server 2. The owner
streams each applied step's state to its buddy and releases the update only once the buddy holds
it; a lost owner's parameters go (through the relay) to the buddy, which takes them over from
its replica, and the relay pushes the step in flight there again: the trainer sees nothing.

- replication alone: the buddy holds every parameter at the trainer's last step;
- the soak: the buddy SIGKILLed once (a warning, training goes on unreplicated, the restarted
  buddy gets the replicas back), then the current owner SIGKILLed at random moments of a step,
  alternating between the pair (each killed server restarted empty: the new owner's buddy).
  The final weights are bitwise those of an uninterrupted in-process run, nothing hangs, no
  shared-memory segment is left over; prints the kill to next completed step times.

- no relay: the rank pushes straight to the owner (server 0, buddy 1) and fails over itself
  (muon_offload/failover.py): the same soak, bitwise;
- both of the pair killed: the error says so and counts the steps lost against the snapshot.

Short form (the test command): 3 owner kills each. Long form by hand:
    MUON_FAILOVER_KILLS=50 pytest -s test_failover.py -k "soak or straight"
"""
import contextlib
import os
import statistics
import time
import warnings

import pytest

from helpers import TinyNet, param_diff, same_params, train
from muon_offload import ConnectionLost, crash_report
from muon_offload.torch import InProcessMuon, OffloadMuon
from pool import (failover_plan, kill_owners, replicas, server_logs, shm_segments, start_pool,
                  status, train_until_replicated)

KW = dict(lr=0.03, weight_decay=0.05, adamw_lr=2e-3)
KILLS = int(os.environ.get("MUON_FAILOVER_KILLS", "3"))
MUON = ("conv.weight", "fc1.weight", "fc2.weight", "experts")


def relayed_pool(tmp, replicate="on"):
    """Servers 0 (the relay of rank 0's domain), 1 (the owner of every Muon parameter) and 2
    (its buddy). Returns (sockets, servers)."""
    socks, servers, _ = start_pool(tmp, failover_plan(MUON)[0], replicate)
    return socks, servers


@contextlib.contextmanager
def reported(servers, shm_before):
    """Stops every server at the end, printing what they logged first when the body failed;
    then no shared-memory segment may be left over from before."""
    try:
        yield
    except BaseException:
        print(server_logs(servers))
        raise
    finally:
        for s in servers:
            s.stop()
    assert set(shm_segments()) <= shm_before, set(shm_segments()) - shm_before


def bitwise_after(m, opt, step, label, kill_to_step):
    """Closes ``opt``; ``m`` must be bitwise the model an uninterrupted in-process run of
    ``step`` steps trains. Prints the kill to next completed step figures."""
    opt.close()
    ref = TinyNet()
    train(ref, InProcessMuon(ref.named_parameters(), **KW), step)
    assert same_params(m, ref), param_diff(m, ref)
    print(f"\n{label}: {len(kill_to_step)} owner kills over {step} steps, 0 errors seen by the "
          f"trainer; kill to next completed step: median {statistics.median(kill_to_step):.3f} "
          f"s, max {max(kill_to_step):.3f} s")


def test_the_buddy_holds_every_step_the_trainer_has_seen(tmpdir_private):
    socks, servers = relayed_pool(tmpdir_private)
    try:
        m = TinyNet()
        opt = OffloadMuon(m.named_parameters(), servers=[socks[0]],
                          assign={n: 0 for n in MUON}, **KW)
        for step in range(4):
            train(m, opt, 1, start=step)
            # Released only once sealed at the buddy: no wait needed.
            assert replicas(socks[2]) == {n: step for n in MUON}, step
        owner = {p["name"]: p for p in status(socks[1])["parameters"]}
        assert all(owner[n]["replicated_to"] == 2 and owner[n]["last_step"] == 3 for n in MUON)
        opt.close()
        ref = TinyNet()
        train(ref, InProcessMuon(ref.named_parameters(), **KW), 4)
        assert same_params(m, ref), param_diff(m, ref)
    finally:
        for s in servers:
            assert s.stop() == 0


def test_replicate_off_keeps_no_replica(tmpdir_private):
    socks, servers = relayed_pool(tmpdir_private, replicate="off")
    try:
        m = TinyNet()
        opt = OffloadMuon(m.named_parameters(), servers=[socks[0]],
                          assign={n: 0 for n in MUON}, **KW)
        train(m, opt, 2)
        assert replicas(socks[2]) == {}
        owner = {p["name"]: p for p in status(socks[1])["parameters"]}
        assert all("replicated_to" not in owner[n] for n in MUON)
        opt.close()
    finally:
        for s in servers:
            assert s.stop() == 0


def test_soak_owner_killed_at_random_moments_loses_no_step(tmpdir_private):
    shm_before = set(shm_segments())
    socks, servers = relayed_pool(tmpdir_private)
    with reported(servers, shm_before):
        m = TinyNet()
        opt = OffloadMuon(m.named_parameters(), servers=[socks[0]],
                          assign={n: 0 for n in MUON}, **KW)
        train(m, opt, 2)
        # The buddy killed: a warning on the owner, training goes on; restarted, it gets the
        # replicas back at the next steps.
        servers[2].kill()
        train(m, opt, 2, start=2)
        servers[2].restart()
        step = train_until_replicated(m, opt, 4, socks[2], MUON)
        assert "replication to buddy" in open(servers[1].log).read()
        step, kill_to_step = kill_owners(m, opt, servers, socks, step, KILLS, owner=1, buddy=2,
                                         names=MUON)
        bitwise_after(m, opt, step, "failover soak (relay)", kill_to_step)


def test_a_rank_pushing_straight_to_the_owner_fails_over_to_its_buddy(tmpdir_private,
                                                                      monkeypatch):
    """No relay: rank 0's domain holds the owner (server 0) and its buddy (server 1). Each kill
    of the current owner, at a random moment of a step: the rank registers its parameters with
    the other server, which takes them over from its replica, pushes the step in flight again
    from the gradients it holds, and goes on with a warning; bitwise the uninterrupted run."""
    shm_before = set(shm_segments())
    socks, servers, plan = start_pool(tmpdir_private, failover_plan(MUON, direct=True)[0])
    monkeypatch.setenv("MUON_OFFLOAD_PLAN", str(plan))
    monkeypatch.setenv("MUON_OFFLOAD_SERVERS_SCOPE", "global")  # the list: every plan server
    with reported(servers, shm_before):
        m = TinyNet()
        opt = OffloadMuon(m.named_parameters(), servers=socks, **KW)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            train(m, opt, 2)
            assert replicas(socks[1]) == {n: 1 for n in MUON}
            step, kill_to_step = kill_owners(m, opt, servers, socks, 2, KILLS, owner=0,
                                             buddy=1, names=MUON)
        moved = [str(w.message) for w in seen if "which holds their replica" in str(w.message)]
        assert len(moved) == KILLS, [str(w.message) for w in seen]
        assert f"lost server {socks[0]}" in moved[0] and f"go to {socks[1]}" in moved[0], moved
        bitwise_after(m, opt, step, "failover soak (direct)", kill_to_step)


def test_owner_and_buddy_both_killed_the_error_counts_the_steps_lost(tmpdir_private,
                                                                      monkeypatch):
    """Both servers of the pair SIGKILLed between steps: the rank fails over to the buddy, finds
    it gone too, and raises ConnectionLost saying so, with the step the owner's snapshot holds
    (--snapshot-every 2: step 3) against the optimizer's (4): 1 step lost, and how to resume."""
    snaps = [str(tmpdir_private / f"s{i}.safetensors") for i in range(2)]
    socks, servers, plan = start_pool(
        tmpdir_private, failover_plan(MUON, direct=True)[0],
        extra=lambda i: ["--snapshot", snaps[i], "--snapshot-every", "2"])
    monkeypatch.setenv("MUON_OFFLOAD_PLAN", str(plan))
    monkeypatch.setenv("MUON_OFFLOAD_SERVERS_SCOPE", "global")
    m = TinyNet()
    opt = OffloadMuon(m.named_parameters(), servers=socks, connect_timeout_s=1.0, **KW)
    try:
        train(m, opt, 4)  # steps 0-3: the owner's periodic snapshots after steps 1 and 3
        give_up = time.monotonic() + 60
        while (crash_report.snapshot_steps(snaps[0]) or {}).get(MUON[0]) != 3:
            assert time.monotonic() < give_up, "the periodic snapshot of step 3 never appeared"
            time.sleep(0.01)
        train(m, opt, 1, start=4)
        servers[0].kill()
        servers[1].kill()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the failover's own warnings
            with pytest.raises(ConnectionLost) as e:
                train(m, opt, 1, start=5)
        msg = str(e.value)
        assert (f"The owner and the buddy ({socks[0]}, {socks[1]}) of 4 parameter(s)" in msg
                and "were both lost within one step" in msg), msg
        assert (f"Server {socks[0]}: lost; its snapshot {snaps[0]} holds step 3 of its 4 "
                "parameter(s), this optimizer is at step 4: the momentum of 1 step(s) (4..4) "
                "is lost (it snapshots every 2 step(s))") in msg, msg
        assert f"restart it with `--restore {snaps[0]}`" in msg, msg
    finally:
        opt.close()
        for s in servers:
            s.stop()
