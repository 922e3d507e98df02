"""A pool of real muon-offloadd servers with a plan, and the SIGKILL loop of the failover and
crash soaks (test_failover.py, test_crash_soak.py; the plan of bench/replication_bench.py).

The pools here: an owner with a buddy (plan ``servers[].buddy``) holding every Muon parameter of
the model, reached by the trainer's ranks through a relay server of their domain, or straight
(the ranks' domain lists the owner and its buddy, no relay).
"""
import json
import os
import random
import subprocess
import threading
import time

from conftest import Server, find_binary
from helpers import train
from pool_plan import failover_plan, pool_flags, write_plan  # noqa: F401 (the tests' too)


def shm_segments():
    """The sessions' shared-memory segments now (transport/shm_segment.cpp names them muon-*)."""
    return [n for n in os.listdir("/dev/shm") if n.startswith("muon-")]


def start_pool(tmp, plan, replicate="on", tag="pool", extra=lambda i: []):
    """One Server per plan server, on sockets ``tmp``/``tag``<i>.sock, with the flags
    ``extra(i)`` besides the pool's. Returns (sockets, servers, plan path)."""
    path = write_plan(tmp, plan, tag)
    socks = [str(tmp / f"{tag}{i}.sock") for i in range(len(plan["servers"]))]
    servers = [Server(socks[i], pool_flags(path, i, socks, replicate) + list(extra(i)))
               for i in range(len(socks))]
    return socks, servers, path


def status(socket):
    """`muon-offload status --json` of the server at ``socket`` ({} when it does not answer)."""
    r = subprocess.run([find_binary("muon-offload", "cli"), "status", "--socket", socket,
                        "--json"], capture_output=True, text=True, timeout=30)
    return json.loads(r.stdout) if r.returncode in (0, 3) and r.stdout else {}


def replicas(socket):
    """{parameter: step} of the replicas the server at ``socket`` holds as a buddy."""
    return {r["name"]: r["step"] for r in status(socket).get("replicas", [])}


def train_until_replicated(m, opt, step, socket, names, timeout=30.0):
    """Trains step after step until the server at `socket` holds a replica of every parameter
    of ``names`` at the last one (an owner retries a buddy it lost after 2 s). Returns the next
    step."""
    give_up = time.monotonic() + timeout
    while True:
        train(m, opt, 1, start=step)
        step += 1
        if all(replicas(socket).get(n, -2) == step - 1 for n in names):
            return step
        assert time.monotonic() < give_up, f"{socket}: replicas {replicas(socket)}"


class Killer(threading.Thread):
    """SIGKILLs ``servers[target]`` once per arming, after a random delay in [0, max_delay) s
    (in [0, first_max_delay) for the first kill, to land one in the first step; seeded; the
    moment of the step it lands in is the machine's). ``killed_at``: when the last kill
    landed, set before disarming (the trainer re-arms once it is None again); left None when
    the server was already gone."""

    def __init__(self, servers, seed, max_delay=0.25, first_max_delay=None):
        super().__init__(daemon=True)
        self.servers, self.rng, self.max_delay = servers, random.Random(seed), max_delay
        self.first_max_delay = max_delay if first_max_delay is None else first_max_delay
        self.armed, self.stop = threading.Event(), threading.Event()
        self.target, self.kills, self.killed_at = 0, 0, None

    def run(self):
        while not self.stop.is_set():
            if not self.armed.wait(0.05):
                continue
            time.sleep(self.rng.uniform(
                0.0, self.max_delay if self.kills else self.first_max_delay))
            if self.stop.is_set() or not self.armed.is_set():
                continue
            self.killed_at = time.monotonic()
            self.armed.clear()
            proc = self.servers[self.target].proc
            if proc is not None and proc.poll() is None:
                proc.kill()
                self.kills += 1
            else:
                self.killed_at = None


def kill_owners(m, opt, servers, socks, step, kills, owner, buddy, names, seed=23):
    """The failover soak's loop: SIGKILLs the current owner at a random moment of a step,
    ``kills`` times, training on meanwhile (a step never raises: the relay or the rank fails
    over to the buddy), each killed server restarted empty (the new owner's buddy) and trained
    on until it holds every replica; the roles swap. Returns (next step, kill to next completed
    step times in s)."""
    killer = Killer(servers, seed, max_delay=0.15)
    killer.start()
    kill_to_step = []
    try:
        while killer.kills < kills or killer.killed_at is not None:
            if killer.kills < kills and not killer.armed.is_set() and killer.killed_at is None:
                killer.target = owner
                killer.armed.set()
            t_start = time.monotonic()
            train(m, opt, 1, start=step)  # never raises: the failover is inside
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
            step = train_until_replicated(m, opt, step, socks[buddy], names)
            killer.killed_at = None
    finally:
        killer.stop.set()
        killer.join()
    assert killer.kills == kills, killer.kills
    return step, kill_to_step


def server_logs(servers):
    """The tail of every server's log, for a failure's report."""
    return "\n".join(f"--- server {i} log ---\n" + open(s.log).read()[-3000:]
                     for i, s in enumerate(servers))
