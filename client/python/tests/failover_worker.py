"""One rank of the 2-rank failover soak (test_failover.py): under gloo, OffloadMuon with the
plan of ``plan_path`` (rank 0 behind its domain's relay, rank 1 straight to the owner) trains
until rank 0 sees the file ``outdir``/stop, the ranks agreeing on the step with one broadcast a
step; then the same number of steps with InProcessMuon (the uninterrupted reference). Writes
``outdir``/rank<r>.pt: both runs' weights, the steps, each step's end (time.monotonic, the
machine's clock: the parent times its kills with it) and any error.

Its stdout and stderr (the library's and torch's messages, each failover warning as it comes,
with the step and the time) go to ``outdir``/rank<r>.log, which the test prints when it fails;
SIGUSR1 writes every thread's Python stack there (the test sends it to a rank that hangs)."""
import faulthandler
import os
import signal
import sys
import time
import traceback
import warnings

import torch
import torch.distributed as dist

from helpers import TinyNet, train


def log_to(path: str):
    """Points this process's stdout and stderr (the file descriptors: the C++ library's too) at
    ``path``, and SIGUSR1 at a dump of every thread's stack there. Returns the open file."""
    f = open(path, "a", buffering=1)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(f.fileno(), 1)
    os.dup2(f.fileno(), 2)
    faulthandler.register(signal.SIGUSR1, file=f, all_threads=True)
    return f


def run(rank: int, init: str, plan_path: str, sockets, outdir: str):
    log = log_to(os.path.join(outdir, f"rank{rank}.log"))
    torch.set_num_threads(1)
    os.environ["MUON_OFFLOAD_PLAN"] = plan_path
    os.environ["MUON_OFFLOAD_SERVERS_SCOPE"] = "global"  # the list: every server of the plan
    os.environ["RANK"] = str(rank)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    from muon_offload.torch import InProcessMuon, OffloadMuon
    kw = dict(lr=0.03, weight_decay=0.05, adamw_lr=2e-3)
    out = {"ends": [], "error": None, "warnings": []}
    try:
        model = TinyNet()
        opt = OffloadMuon(model.named_parameters(), servers=list(sockets), **kw)
        step = 0
        stop = torch.zeros(1)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            while True:
                stop[0] = float(rank == 0 and os.path.exists(os.path.join(outdir, "stop")))
                dist.broadcast(stop, src=0)
                if stop[0]:
                    break
                train(model, opt, 1, start=step, rank=rank)
                step += 1
                out["ends"].append(time.monotonic())
                for w in seen[len(out["warnings"]):]:
                    print(f"{time.monotonic():.3f} step {step - 1}: {w.message}", file=log)
                    out["warnings"].append(str(w.message))
        opt.close()
        out["steps"] = step
        out["params"] = [p.detach().clone() for p in model.parameters()]
        ref = TinyNet()
        train(ref, InProcessMuon(ref.named_parameters(), **kw), step, rank=rank)
        out["reference"] = [p.detach().clone() for p in ref.parameters()]
    except BaseException:
        out["error"] = traceback.format_exc()
        print(f"{time.monotonic():.3f} {out['error']}", file=log)
    finally:
        torch.save(out, os.path.join(outdir, f"rank{rank}.pt"))
        dist.destroy_process_group()
