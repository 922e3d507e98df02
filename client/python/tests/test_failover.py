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

Short form (the test command): 3 owner kills. Long form by hand:
    MUON_FAILOVER_KILLS=50 pytest -s test_failover.py -k soak
"""
import json
import os
import random
import statistics
import subprocess
import threading
import time

from conftest import Server, find_binary
from helpers import TinyNet, param_diff, same_params, train
from muon_offload.torch import InProcessMuon, OffloadMuon

KW = dict(lr=0.03, weight_decay=0.05, adamw_lr=2e-3)
KILLS = int(os.environ.get("MUON_FAILOVER_KILLS", "3"))
MUON = ("conv.weight", "fc1.weight", "fc2.weight", "experts")


def shm_segments():
    return [n for n in os.listdir("/dev/shm") if n.startswith("muon-")]


def status(socket):
    r = subprocess.run([find_binary("muon-offload", "cli"), "status", "--socket", socket,
                        "--json"], capture_output=True, text=True, timeout=30)
    return json.loads(r.stdout) if r.returncode in (0, 3) and r.stdout else {}


def start_pool(tmp, replicate="on"):
    """Servers 0 (domain 0: the trainer's rank 0; relays every parameter), 1 (owner) and 2 (its
    buddy), both in domain 1, which has no compute rank."""
    plan = {
        "schema": "muon-offload-plan/1",
        "servers": [{"id": 0, "domain": 0}, {"id": 1, "domain": 1, "buddy": 2},
                    {"id": 2, "domain": 1}],
        "domains": [{"id": 0, "servers": [0], "compute_ranks": [0]},
                    {"id": 1, "servers": [1, 2], "compute_ranks": []}],
        "ranks": [{"rank": 0, "domain": 0}],
        "parameters": [{"name": n, "owner": 1, "relays": [0, None]} for n in MUON],
    }
    path = tmp / "plan.json"
    path.write_text(json.dumps(plan))
    socks = [str(tmp / f"pool{i}.sock") for i in range(3)]
    servers = []
    for i in range(3):
        servers.append(Server(socks[i], ["--plan", str(path), "--server-id", str(i),
                                         "--pool-servers", ",".join(socks),
                                         "--replicate", replicate]))
    return socks, servers


def replicas(socket):
    return {r["name"]: r["step"] for r in status(socket).get("replicas", [])}


def train_until_replicated(m, opt, step, socket, timeout=30.0):
    """Trains step after step until the server at `socket` holds a replica of every parameter
    at the last one (an owner retries a buddy it lost after 2 s). Returns the next step."""
    give_up = time.monotonic() + timeout
    while True:
        train(m, opt, 1, start=step)
        step += 1
        if all(replicas(socket).get(n, -2) == step - 1 for n in MUON):
            return step
        assert time.monotonic() < give_up, f"{socket}: replicas {replicas(socket)}"


def test_the_buddy_holds_every_step_the_trainer_has_seen(tmpdir_private):
    socks, servers = start_pool(tmpdir_private)
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
    socks, servers = start_pool(tmpdir_private, replicate="off")
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


class Killer(threading.Thread):
    """SIGKILLs servers[target] once per arming, after a random delay (seeded)."""

    def __init__(self, servers, seed):
        super().__init__(daemon=True)
        self.servers, self.rng = servers, random.Random(seed)
        self.armed, self.stop = threading.Event(), threading.Event()
        self.target, self.kills, self.killed_at = None, 0, None

    def run(self):
        while not self.stop.is_set():
            if not self.armed.wait(0.05):
                continue
            time.sleep(self.rng.uniform(0.0, 0.15))
            if self.stop.is_set():
                continue
            proc = self.servers[self.target].proc
            self.killed_at = time.monotonic()
            self.armed.clear()
            proc.kill()
            self.kills += 1


def test_soak_owner_killed_at_random_moments_loses_no_step(tmpdir_private):
    shm_before = set(shm_segments())
    socks, servers = start_pool(tmpdir_private)
    m = TinyNet()
    opt = OffloadMuon(m.named_parameters(), servers=[socks[0]], assign={n: 0 for n in MUON},
                      **KW)
    step = 0
    try:
        train(m, opt, 2, start=step)
        step = 2
        # The buddy killed: a warning on the owner, training goes on; restarted, it gets the
        # replicas back at the next steps.
        servers[2].kill()
        train(m, opt, 2, start=step)
        step += 2
        servers[2].restart()
        step = train_until_replicated(m, opt, step, socks[2])
        assert "replication to buddy" in open(servers[1].log).read()

        killer = Killer(servers, seed=23)
        killer.start()
        owner, buddy = 1, 2
        kill_to_step = []
        try:
            while killer.kills < KILLS or killer.killed_at is not None:
                if killer.kills < KILLS and not killer.armed.is_set() and \
                        killer.killed_at is None:
                    killer.target = owner
                    killer.armed.set()
                t_start = time.monotonic()
                train(m, opt, 1, start=step)  # never raises: the relay fails over
                step += 1
                t_end = time.monotonic()
                assert t_end - t_start < 30, "a step took 30 s (a hang)"
                if killer.killed_at is None or servers[owner].proc.poll() is None:
                    continue
                if killer.killed_at > t_end:  # landed after that step: time the next one
                    train(m, opt, 1, start=step)
                    step += 1
                    t_end = time.monotonic()
                kill_to_step.append(t_end - killer.killed_at)
                servers[owner].proc = None
                servers[owner].restart()  # empty: the new owner's buddy
                owner, buddy = buddy, owner
                step = train_until_replicated(m, opt, step, socks[buddy])
                killer.killed_at = None
        finally:
            killer.stop.set()
            killer.join()
        opt.close()
        ref = TinyNet()
        train(ref, InProcessMuon(ref.named_parameters(), **KW), step)
        assert same_params(m, ref), param_diff(m, ref)
        assert killer.kills == KILLS
        print(f"\nfailover soak: {killer.kills} owner kills over {step} steps, 0 errors seen by "
              f"the trainer; kill to next completed step: median "
              f"{statistics.median(kill_to_step):.3f} s, max {max(kill_to_step):.3f} s")
    except BaseException:
        for i, s in enumerate(servers):  # what the servers said, for the failure's report
            print(f"--- server {i} log ---\n" + open(s.log).read()[-3000:])
        raise
    finally:
        for s in servers:
            s.stop()
    assert set(shm_segments()) <= shm_before, set(shm_segments()) - shm_before
