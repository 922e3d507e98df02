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
- both of the pair killed: the error says so and counts the steps lost against the snapshot,
  for a rank pushing straight to the owner and for one behind the relay (whose error names
  what the lost servers snapshot: the rank counts);
- a takeover's registration answered to the first registrant (the relay), not waiting for a
  rank straight to the owner that has no reason to come yet: bitwise, deterministic;
- 2 gloo ranks, rank 0 behind the relay and rank 1 straight to the owner: the same soak while
  both step on (failover_worker.py), bitwise on both ranks;
- the buddy killed alone: a warning in the owner's log, training goes on bitwise, the restarted
  buddy gets every replica back, and a later owner kill fails over to it.

Short form (the test command): 3 owner kills each. Long form by hand:
    MUON_FAILOVER_KILLS=50 pytest -s test_failover.py -k "soak or straight or two_ranks"
"""
import contextlib
import os
import random
import signal
import statistics
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

import failover_worker
from helpers import TinyNet, free_port, param_diff, same_params, train
from muon_offload import Client, ConnectionLost, PeerLost, crash_report, local_update
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
    if kill_to_step:
        print(f"\n{label}: {len(kill_to_step)} owner kills over {step} steps, 0 errors seen "
              f"by the trainer; kill to next completed step: median "
              f"{statistics.median(kill_to_step):.3f} s, max {max(kill_to_step):.3f} s")


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


def test_replicate_off_a_direct_rank_does_not_fail_over(tmpdir_private, monkeypatch):
    """--replicate off (the launcher's --no-replication, MUON_OFFLOAD_REPLICATE=off): the buddy
    holds no replica, so a rank pushing straight to a lost owner raises ConnectionLost instead
    of registering with a buddy that would start from nothing."""
    socks, servers, plan = start_pool(tmpdir_private, failover_plan(MUON, "direct")[0],
                                      replicate="off")
    monkeypatch.setenv("MUON_OFFLOAD_PLAN", str(plan))
    monkeypatch.setenv("MUON_OFFLOAD_SERVERS_SCOPE", "global")
    monkeypatch.setenv("MUON_OFFLOAD_REPLICATE", "off")
    with reported(servers, set(shm_segments())):
        m = TinyNet()
        opt = OffloadMuon(m.named_parameters(), servers=socks, **KW)
        train(m, opt, 2)
        servers[0].kill()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with pytest.raises(ConnectionLost, match="no --snapshot: the momentum it held"):
                train(m, opt, 1, start=2)
        assert not [w for w in seen if "which holds their replica" in str(w.message)]
        assert replicas(socks[1]) == {} and status(socks[1]).get("parameters", []) == []
        opt.close()


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
    socks, servers, plan = start_pool(tmpdir_private, failover_plan(MUON, "direct")[0])
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
        tmpdir_private, failover_plan(MUON, "direct")[0],
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


def test_owner_and_buddy_both_killed_behind_the_relay_the_error_counts_the_steps_lost(
        tmpdir_private):
    """The same behind relay server 0: the relay fails the step over to the buddy, finds it gone
    too (within its 1 s failover connect wait, not 10 s), and answers PeerLost naming what
    the lost servers snapshot; the rank counts the steps lost against the owner's snapshot
    (step 3, the optimizer at step 4: 1 step)."""
    snaps = [str(tmpdir_private / f"s{i}.safetensors") for i in range(3)]
    socks, servers, _ = start_pool(
        tmpdir_private, failover_plan(MUON)[0],
        extra=lambda i: ["--snapshot", snaps[i], "--snapshot-every", "2"])
    m = TinyNet()
    opt = OffloadMuon(m.named_parameters(), servers=socks[:1], **KW)
    try:
        train(m, opt, 4)  # steps 0-3: the owner's periodic snapshots after steps 1 and 3
        give_up = time.monotonic() + 60
        while (crash_report.snapshot_steps(snaps[1]) or {}).get(MUON[0]) != 3:
            assert time.monotonic() < give_up, "the periodic snapshot of step 3 never appeared"
            time.sleep(0.01)
        train(m, opt, 1, start=4)
        servers[1].kill()
        servers[2].kill()
        began = time.monotonic()
        with pytest.raises(PeerLost) as e:
            train(m, opt, 1, start=5)
        waited = time.monotonic() - began
        msg = str(e.value)
        assert "cannot reach owner server" in msg and "Connection refused" in msg, msg
        assert (f"Server {socks[1]}: lost; its snapshot {snaps[1]} holds step 3 of its 4 "
                "parameter(s), this optimizer is at step 4: the momentum of 1 step(s) (4..4) "
                "is lost (it snapshots every 2 step(s))") in msg, msg
        assert f"restart it with `--restore {snaps[1]}`" in msg, msg
        assert f"Server {socks[2]}: lost" in msg, msg  # the buddy, which the relay never heard
        assert waited < 8.0, (f"the relay took {waited:.1f} s to give up on both\n"
                              + server_logs(servers[:1]))
        print(f"\nowner and buddy killed behind the relay: PeerLost after {waited:.2f} s")
    finally:
        opt.close()
        for s in servers:
            s.stop()


@contextlib.contextmanager
def worker_logs(tmp, ctx):
    """Kills the ranks of ``ctx`` (torch.multiprocessing) still running at the end. When the
    body failed, first asks them for their Python stacks (SIGUSR1: where a hang waits), then
    prints every rank's log (failover_worker.py: its stdout and stderr)."""
    try:
        yield
    except BaseException:
        alive = [p for p in ctx.processes if p.is_alive()]
        for p in alive:
            os.kill(p.pid, signal.SIGUSR1)
        if alive:
            time.sleep(1.0)  # the stacks written before the kill below
        for r in range(len(ctx.processes)):
            log = tmp / f"rank{r}.log"
            print(f"--- rank {r} log ---\n" + (log.read_text()[-6000:] if log.exists() else ""))
        raise
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()


def wait_for(cond, what, timeout=60.0):
    """Polls ``cond()`` until true; AssertionError naming ``what`` after ``timeout`` s."""
    give_up = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < give_up, f"{what} within {timeout} s"
        time.sleep(0.02)


def gathering(socket, name):
    """The step server ``socket`` gathers for ``name`` once it is registered there, else None."""
    for p in status(socket).get("parameters", []):
        if p["name"] == name and p.get("registered"):
            return p.get("gathering_step")
    return None


def test_a_takeover_answers_its_first_registrant_without_the_ranks_that_are_not_there_yet(
        tmpdir_private):
    """The owner's replicas name its registrants and their ranges, so the buddy's registration
    of a taken-over parameter is complete with the first registrant that comes. Rank 0 behind
    relay server 0 and rank 1 straight to the owner (server 1, buddy 2) take steps 0 and 1; the
    owner is SIGKILLed between steps; rank 0 pushes step 2 and the relay registers the
    parameter with the buddy, which answers at once and gathers the step while rank 1 is not
    there. Waiting for rank 1 instead hung the 2-rank soak below: a rank that had the lost
    owner's last update comes only with its next step, and a trainer's collective between the
    steps waited for rank 0, whose update of that step the relay could get only once its
    registration was answered. Rank 1 then registers with the buddy and pushes step 2: both
    ranks get its update, bitwise the in-process one."""
    plan, owner, buddy = failover_plan(["w"], "mixed")
    socks, servers, _ = start_pool(tmpdir_private, plan)
    shape, opts = (12, 20), {"mu": 0.9}
    rng = np.random.default_rng(5)
    grads = [[rng.standard_normal(shape).astype(np.float32) for _ in range(2)] for _ in range(3)]
    mom, ref = np.zeros(shape, np.float32), np.empty(shape, np.float32)
    pool = ThreadPoolExecutor(2)

    def step(client, rank, s):
        client.push("w", s, 0, grads[s][rank])
        client.commit("w", s)
        out = np.empty(shape, np.float32)
        assert client.wait_update("w", s, out)
        return out

    with reported(servers, set(shm_segments())), pool:
        r0 = Client([socks[0]], rank=0, world_size=2)
        r1 = Client([socks[owner]], rank=1, world_size=2)
        clients = [r0, r1]
        try:
            for f in [pool.submit(c.register, "w", shape, opts) for c in clients]:
                f.result(timeout=60)  # a registration waits for every registrant
            for s in range(2):
                outs = [f.result(timeout=60)
                        for f in [pool.submit(step, c, r, s) for r, c in enumerate(clients)]]
                assert local_update("w", shape, opts, grads[s][1] + grads[s][0], mom, ref)
                assert all(np.array_equal(o, ref) for o in outs), s
            assert replicas(socks[buddy]) == {"w": 1}
            servers[owner].kill()
            late = pool.submit(step, r0, 0, 2)
            wait_for(lambda: gathering(socks[buddy], "w") == 2,
                     "the buddy answering the relay's registration and gathering step 2",
                     timeout=10.0)
            assert not late.done()  # rank 1's gradient is still missing
            clients.append(Client([socks[buddy]], rank=1, world_size=2))
            clients[-1].register("w", shape, opts)  # the replica's ranges: answered at once
            mine = step(clients[-1], 1, 2)
            outs = [late.result(timeout=60), mine]
            assert local_update("w", shape, opts, grads[2][1] + grads[2][0], mom, ref)
            assert all(np.array_equal(o, ref) for o in outs)
        finally:
            for c in clients:
                c.close()


def test_two_ranks_one_behind_a_relay_one_straight_to_the_owner_lose_no_step(tmpdir_private):
    """2 gloo ranks: rank 0 behind relay server 0, rank 1 straight to the owner (server 1, buddy
    2), stepping on while the current owner is SIGKILLed at random moments, restarted empty, and
    killed again once it holds the replicas (the roles swapped): the relay fails over for rank 0,
    rank 1 itself; both ranks end bitwise on the uninterrupted in-process run, rank 1 warned
    once a kill, nothing hangs, no shared-memory segment is left over."""
    shm_before = set(shm_segments())
    plan, owner, buddy = failover_plan(MUON, "mixed")
    socks, servers, path = start_pool(tmpdir_private, plan)
    init = f"tcp://127.0.0.1:{free_port()}"
    ctx = mp.spawn(failover_worker.run, args=(init, str(path), socks, str(tmpdir_private)),
                   nprocs=2, join=False)
    rng, kill_times = random.Random(31), []
    # The servers stop last: a rank that hangs is asked for its stacks while they still run.
    with reported(servers, shm_before), worker_logs(tmpdir_private, ctx):
        wait_for(lambda: all(replicas(socks[buddy]).get(n, -1) >= 2 for n in MUON),
                 "the ranks' first steps")
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.0, 0.15))
            kill_times.append(time.monotonic())
            servers[owner].kill()
            servers[owner].restart()  # empty: the new owner's buddy
            owner, buddy = buddy, owner
            wait_for(lambda: all(n in replicas(socks[buddy]) for n in MUON),
                     f"the replicas back on server {buddy}")
        (tmpdir_private / "stop").write_text("")
        # A hang guard (a rank stuck in a collective never returns), with time for the
        # in-process reference of every step the soak took (50 kills: ~14000 steps).
        for _ in range(24 + 4 * KILLS):
            if ctx.join(timeout=5):
                break
        else:
            raise AssertionError(f"the ranks did not finish within {120 + 20 * KILLS} s "
                                 "(a hang)")
        outs = [torch.load(tmpdir_private / f"rank{r}.pt") for r in (0, 1)]
        for r, o in enumerate(outs):
            assert o["error"] is None, f"rank {r}: {o['error']}"
            assert all(torch.equal(p, q) for p, q in zip(o["params"], o["reference"])), r
        assert outs[0]["steps"] == outs[1]["steps"]
        moved = [w for w in outs[1]["warnings"] if "which holds their replica" in w]
        assert len(moved) == KILLS and not outs[0]["warnings"], (outs[0]["warnings"], moved)
    kill_to_step = [min(e for e in outs[0]["ends"] if e > t) - t for t in kill_times]
    print(f"\nfailover soak (2 ranks, relay + direct): {KILLS} owner kills over "
          f"{outs[0]['steps']} steps, 0 errors seen by the trainers; kill to next completed "
          f"step: median {statistics.median(kill_to_step):.3f} s, max {max(kill_to_step):.3f} s")


def test_buddy_killed_costs_a_warning_then_its_restart_holds_the_replicas(tmpdir_private,
                                                                          monkeypatch):
    """The buddy SIGKILLed: the owner warns once (naming the buddy and what a crash of its own
    now loses) and training goes on unreplicated, bitwise; the buddy restarted (the plan's
    buddy: relays and ranks fail over to the buddy the plan names, so a new one cannot be
    chosen at run time) gets every replica back, and the owner says so; a kill of the owner
    then fails over to it."""
    socks, servers, plan = start_pool(tmpdir_private, failover_plan(MUON, "direct")[0])
    monkeypatch.setenv("MUON_OFFLOAD_PLAN", str(plan))
    monkeypatch.setenv("MUON_OFFLOAD_SERVERS_SCOPE", "global")
    with reported(servers, set(shm_segments())):
        m = TinyNet()
        opt = OffloadMuon(m.named_parameters(), servers=socks, **KW)
        train(m, opt, 2)
        servers[1].kill()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            train(m, opt, 3, start=2)  # unreplicated: nothing reaches the trainer
        assert not seen, [str(w.message) for w in seen]
        log = open(servers[0].log).read()
        assert log.count("replication to buddy server 1") == 1, log
        assert (f"replication to buddy server 1 ({socks[1]}) failed" in log and
                "its parameters' updates go out unreplicated until it answers again, so a "
                "crash of this server now loses their momentum (no --snapshot-every)" in log), log
        servers[1].restart()
        step = train_until_replicated(m, opt, 5, socks[1], MUON)
        assert f"buddy server 1 ({socks[1]}) holds this server's replicas again" in \
            open(servers[0].log).read()
        servers[0].kill()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the failover's own
            train(m, opt, 2, start=step)
        bitwise_after(m, opt, step + 2, "buddy killed, then the owner", [])
