"""The body of one rank of the 2-rank gloo tests (spawned by test_distributed.py)."""
import contextlib
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

from helpers import TinyNet, train

KW = dict(lr=0.03, weight_decay=0.05, adamw_lr=2e-3)


@contextlib.contextmanager
def gloo_rank(rank: int, world: int, init: str):
    """This process as rank `rank` of a gloo group of `world` (one torch thread), for the body."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


class GatedNet(TinyNet):
    """TinyNet plus a 1 x 12 matrix: in mode "shard" with 2 ranks, rank 0's row shard is empty."""

    def __init__(self, seed=0):
        super().__init__(seed)
        self.gate = nn.Linear(12, 1, bias=False)

    def forward(self, idx, targets):
        return super().forward(idx, targets) + self.gate(self.embed(idx)).pow(2).mean()


class BranchNet(GatedNet):
    """GatedNet whose gate (a Muon matrix) and gate_bias (AdamW) a rank's batch may skip (an
    expert its tokens were not routed to): their gradients are then None on that rank only."""

    def __init__(self, seed=0):
        super().__init__(seed)
        self.gate_bias = nn.Parameter(torch.zeros(1))
        self.use_gate = True

    def forward(self, idx, targets):
        loss = TinyNet.forward(self, idx, targets)
        if not self.use_gate:
            return loss
        return loss + (self.gate(self.embed(idx)) + self.gate_bias).pow(2).mean()


def run_unused(rank: int, world: int, init: str, socket: str, outdir: str):
    """4 steps of InProcessMuon under DDP with find_unused_parameters (the reference), and
    without DDP InProcessMuon, OffloadMuon (server_reduce) and OffloadMuon (shard,
    overlap=False), each averaging itself; rank 1 skips the gate at steps 1 and 3, both ranks at
    step 2."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    from muon_offload.torch import InProcessMuon, OffloadMuon
    with gloo_rank(rank, world, init):
        for variant in ("ddp", "bare", "server_reduce", "shard_overlap_off"):
            model = BranchNet()
            wrapped = DDP(model, find_unused_parameters=True) if variant == "ddp" else model
            if variant == "server_reduce":
                opt = OffloadMuon(model.named_parameters(), servers=[socket], prefix="unused/",
                                  timeout_s=60, **KW)
            elif variant == "shard_overlap_off":  # the Muon gradients all-reduced in step()
                opt = OffloadMuon(model.named_parameters(), servers=[socket], mode="shard",
                                  overlap=False, prefix="unused_shard/", timeout_s=60, **KW)
            else:
                opt = InProcessMuon(model.named_parameters(),
                                    **(dict(KW, ddp=wrapped) if variant == "ddp" else KW))

            def gate(s, model=model):
                model.use_gate = not (s == 2 or (rank == 1 and s % 2 == 1))

            losses = train(model, opt, 4, rank=rank, forward=wrapped, before=gate)
            finish(outdir, variant, rank, model, opt, losses, opt.state_dict())

def run_clipped(rank: int, world: int, init: str, socket: str, outdir: str):
    """One rank of test_grad_edits.py's 2-rank case: clip_grad_norm_ over every parameter
    between backward and step(), 4 steps, OffloadMuon(overlap=False) under DDP (given at
    construction, and attached after it), bare (server_reduce) and bare (shard), each beside
    InProcessMuon in the same setting. Saves, as the state, the Muon bytes pushed per step."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    from muon_offload.torch import InProcessMuon, OffloadMuon
    with gloo_rank(rank, world, init):
        for variant in ("ddp", "ddp_late", "ddp_ref", "server_reduce", "shard", "bare_ref"):
            model = TinyNet()
            wrapped = DDP(model) if variant.startswith("ddp") else model
            at_construction = variant.startswith("ddp") and variant != "ddp_late"
            kw = dict(KW, overlap=False, ddp=wrapped if at_construction else None)
            if variant.endswith("ref"):
                opt = InProcessMuon(model.named_parameters(), **kw)
            else:
                opt = OffloadMuon(model.named_parameters(), servers=[socket], timeout_s=60,
                                  prefix=variant + "/",
                                  mode="shard" if variant == "shard" else "server_reduce", **kw)
            if variant == "ddp_late":
                opt.attach_ddp(wrapped)
            norms = []

            def clip(_, model=model, norms=norms):
                norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.2)))

            losses = train(model, opt, 4, rank=rank, forward=wrapped, between=clip)
            muon_grads = [p.grad is not None for p in opt._muon_params]
            pushed = getattr(opt, "last_step_stats", {}).get("bytes_pushed")
            momentum = [opt.momentum_buffer(p) for p in opt._muon_params]
            finish(outdir, variant, rank, model, opt, losses + norms + muon_grads,
                   {"bytes_pushed": pushed, "momentum": momentum})


def finish(outdir, variant, rank, model, opt, losses, sd):
    """Saves a variant's run (weights, losses, state dict, the server of each Muon parameter),
    closes the optimizer and waits for the other ranks."""
    torch.save({"params": [p.detach().clone() for p in model.parameters()],
                "losses": losses, "state": sd,
                "servers": {m.name: getattr(m, "server", None)
                            for m in getattr(opt, "_meta", {}).values()}},
               os.path.join(outdir, f"{variant}_{rank}.pt"))
    if hasattr(opt, "close"):
        opt.close()
    dist.barrier()


def run(rank: int, world: int, init: str, socket: str, outdir: str):
    from muon_offload.torch import InProcessMuon, OffloadMuon
    with gloo_rank(rank, world, init):
        for variant in ("inprocess", "server_reduce", "shard"):
            model = GatedNet()
            if variant == "inprocess":
                opt = InProcessMuon(model.named_parameters(), **KW)
            else:
                opt = OffloadMuon(model.named_parameters(), servers=[socket], mode=variant,
                                  prefix=variant + "/", **KW)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
            losses = train(model, opt, 3, rank=rank, sched=sched)
            # accumulation with 2 micro-batches, then a checkpoint round trip on every rank
            losses += train(model, opt, 1, start=3, rank=rank, micro=2)
            sd = opt.state_dict()
            opt.load_state_dict(sd)
            losses += train(model, opt, 1, start=4, rank=rank)
            finish(outdir, variant, rank, model, opt, losses, sd)


def run_pool(rank: int, world: int, init: str, sockets, single: str, outdir: str):
    """One rank of the pool-relay test (test_relays.py): the environment names the plan
    (MUON_OFFLOAD_PLAN, global scope), so OffloadMuon sends each planned parameter to the server
    of this rank's domain; that server owns it or relays it to its owner. Variant "single" is
    mode shard on one server `single` without a plan (every parameter assigned to it)."""
    from muon_offload.torch import InProcessMuon, OffloadMuon
    with gloo_rank(rank, world, init):
        for variant in ("inprocess", "server_reduce", "shard", "single"):
            model = GatedNet()
            if variant == "inprocess":
                opt = InProcessMuon(model.named_parameters(), **KW)
            elif variant == "single":
                names = ("conv.weight", "fc1.weight", "fc2.weight", "experts", "gate.weight")
                opt = OffloadMuon(model.named_parameters(), servers=[single], mode="shard",
                                  prefix="single/", assign={"single/" + n: 0 for n in names}, **KW)
            else:
                opt = OffloadMuon(model.named_parameters(), servers=list(sockets), mode=variant,
                                  prefix=variant + "/", **KW)
            losses = train(model, opt, 3, rank=rank)
            # A checkpoint round trip: rank 0 loads every momentum through its domain's server.
            sd = opt.state_dict()
            opt.load_state_dict(sd)
            losses += train(model, opt, 2, start=3, rank=rank)
            finish(outdir, variant, rank, model, opt, losses, sd)


def run_ddp(rank: int, world: int, init: str, socket: str, outdir: str):
    """One rank of the DDP test (test_ddp.py): OffloadMuon on the bare model (its own averaging)
    and under DistributedDataParallel (default buckets, and one bucket per parameter), with and
    without gradient accumulation (no_commit bare, no_sync under DDP). Counts the bytes every
    torch.distributed.all_reduce of the DDP runs moved."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    from muon_offload import OffloadMuon
    from helpers import batch
    reduced = []
    plain_all_reduce = dist.all_reduce

    def counting_all_reduce(tensor, *args, **kwargs):
        reduced.append(tensor.numel() * tensor.element_size())
        return plain_all_reduce(tensor, *args, **kwargs)

    with gloo_rank(rank, world, init):
        for variant in ("bare", "ddp", "ddp_small_buckets", "bare_acc", "ddp_acc"):
            model = TinyNet()
            micro = 2 if variant.endswith("acc") else 1
            if variant.startswith("ddp"):
                cap = 1e-6 if variant == "ddp_small_buckets" else 25
                wrapped = DDP(model, bucket_cap_mb=cap)
                opt = OffloadMuon(model.named_parameters(), servers=[socket], ddp=wrapped,
                                  prefix=variant + "/", **KW)
            else:
                wrapped = model
                opt = OffloadMuon(model.named_parameters(), servers=[socket],
                                  prefix=variant + "/", **KW)
            reduced.clear()
            dist.all_reduce = counting_all_reduce
            losses = []
            for s in range(4):
                opt.zero_grad(set_to_none=True)
                for m in range(micro):
                    x, y = batch(s * micro + m, rank)
                    last = m + 1 == micro
                    if last:
                        ctx = _Null()
                    elif variant.startswith("ddp"):
                        ctx = wrapped.no_sync()
                    else:
                        ctx = opt.no_commit()
                    with ctx:
                        loss = wrapped(x, y) / micro
                        loss.backward()
                    losses.append(loss.item())
                opt.step()
            dist.all_reduce = plain_all_reduce
            hook = opt.ddp_hook_state
            torch.save({"params": [p.detach().clone() for p in model.parameters()],
                        "losses": losses, "reduced_bytes": sum(reduced),
                        "hook": None if hook is None else
                        {"allreduced": hook.allreduced_bytes, "pushed": hook.pushed_bytes},
                        "adamw_bytes": sum(p.numel() * 4 for g in opt.param_groups
                                           if not g["use_muon"] for p in g["params"]),
                        # step()'s agreement on which gradients exist, without DDP: an int32
                        # flag per parameter (OptimizerBase._agree_on_grads)
                        "flag_bytes": 4 * sum(len(g["params"]) for g in opt.param_groups),
                        "muon_bytes": sum(p.numel() * 4 for g in opt.param_groups
                                          if g["use_muon"] for p in g["params"]),
                        "muon_grads": [p.grad for g in opt.param_groups if g["use_muon"]
                                       for p in g["params"]]},
                       os.path.join(outdir, f"{variant}_{rank}.pt"))
            opt.close()
            dist.barrier()


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False
