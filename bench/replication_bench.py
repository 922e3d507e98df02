#!/usr/bin/env python3
"""What buddy replication costs a step (docs/design.md, "Failover"): one run, two pools of three
CPU servers with the same plan (a rank behind relay server 0, every parameter owned by server 1
whose buddy is server 2), one with --replicate on and one with --replicate off, stepping in turn.
Each step the rank pushes every parameter's gradient, commits all, and waits for all updates;
the figure per pool is the median wall time of that step. With replication the owner streams
each parameter's momentum and update (fp32: 8 bytes per element) to its buddy over the replica
session's shared memory (the same host) and releases the update once the buddy sealed it; the
replication of one parameter overlaps the Newton-Schulz of the next ones.

    $(scripts/venv-python) bench/replication_bench.py [--shape 768x768] [--params 8] [--steps 10]

Prints the per-step medians, the ratio on/off and the replicated bytes per step."""
from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "client" / "python"))
sys.path.insert(0, str(ROOT / "client" / "python" / "tests"))

from pool_plan import failover_plan, pool_flags, write_plan  # noqa: E402 (the tests' pools)


def binary(name: str, sub: str) -> str:
    build = pathlib.Path(os.environ.get("MUON_OFFLOAD_BIN_DIR", ROOT / "build"))
    for cand in (build / sub / name, build / name):
        if cand.exists():
            return str(cand)
    raise SystemExit(f"{name} not found under {build} (build it, or set MUON_OFFLOAD_BIN_DIR)")


def start_pool(tmp: pathlib.Path, tag: str, names, replicate: str, threads: int):
    plan_path = write_plan(tmp, failover_plan(names)[0], f"plan-{tag}")
    socks = [str(tmp / f"{tag}{i}.sock") for i in range(3)]
    procs = []
    for i in range(3):
        log = open(tmp / f"{tag}{i}.log", "wb")
        procs.append(subprocess.Popen(
            [binary("muon-offloadd", "daemon"), "--socket", socks[i], "--threads", str(threads),
             "--log-level", "warn"] + pool_flags(plan_path, i, socks, replicate),
            stdout=log, stderr=log))
    for s in socks:
        subprocess.run([binary("muon-offload", "cli"), "health", "--socket", s,
                        "--timeout-ms", "20000"], check=True, capture_output=True)
    return socks, procs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="768x768")
    ap.add_argument("--params", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    rows, cols = (int(x) for x in args.shape.split("x"))
    from muon_offload import Client
    names = [f"w{i}" for i in range(args.params)]
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(rows * cols).astype(np.float32) for _ in names]
    out = np.empty(rows * cols, dtype=np.float32)
    with tempfile.TemporaryDirectory(prefix="muon-repl-") as d:
        tmp = pathlib.Path(d)
        os.chmod(tmp, 0o700)
        pools, clients, times = {}, {}, {"on": [], "off": []}
        try:
            for mode in ("on", "off"):
                pools[mode] = start_pool(tmp, mode, names, mode, args.threads)
                c = Client([pools[mode][0][0]], rank=0, world_size=1)
                for n in names:
                    c.register(n, (rows, cols), {"mu": 0.95})
                clients[mode] = c
            for step in range(args.steps + 1):  # step 0: warm-up
                for mode in ("on", "off"):
                    c = clients[mode]
                    t0 = time.perf_counter()
                    for n, g in zip(names, grads):
                        c.push(n, step, 0, g)
                        c.commit(n, step)
                    for n in names:
                        c.wait_update(n, step, out)
                    if step > 0:
                        times[mode].append(time.perf_counter() - t0)
        finally:
            for c in clients.values():
                c.close()
            for socks, procs in pools.values():
                for p in procs:
                    p.terminate()
                for p in procs:
                    p.wait(30)
    on, off = statistics.median(times["on"]), statistics.median(times["off"])
    replicated = args.params * rows * cols * 8
    print(f"{args.params} x {rows}x{cols} fp32, {args.steps} steps, {args.threads} thread(s) per "
          f"server: step median replicate on {on * 1e3:.1f} ms, off {off * 1e3:.1f} ms, ratio "
          f"on/off {on / off:.3f}; replicated per step {replicated / 2**20:.1f} MiB (momentum + "
          f"update, owner -> buddy, shared memory on one host)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
