"""Bodies of the ranks of the sharded-model tests (spawned by test_layouts.py and test_fsdp.py):
real DTensors from distribute_tensor, fully_shard and parallelize_module under gloo on the CPU."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn


def _init(rank: int, world: int, init: str):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)


def _packed(full: torch.Tensor, ranges) -> torch.Tensor:
    flat = full.reshape(-1)
    return torch.cat([flat[b:e] for b, e in ranges]) if ranges else flat[:0]


def run_layouts(rank: int, world: int, init: str, outdir: str):
    """World 4. For each DTensor: its layout, and whether the local tensor equals the packed
    wanted ranges of the full tensor. Saves {case: (layout fields, local_ok)}, plus the refusal
    message of a Partial placement."""
    _init(rank, world, init)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor, DTensor
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    from muon_offload.layouts import storage_layout
    from muon_offload import InvalidArgument
    out = {}

    def record(case, dt, summed=()):
        lay = storage_layout(case, dt, summed, world_size=world)
        full = dt.full_tensor()  # the test's own all-gather, to check against
        ok = torch.equal(_packed(full, lay.wanted), dt.to_local().reshape(-1))
        out[case] = dict(held=list(lay.held), wanted=list(lay.wanted),
                         contributors=lay.contributors, local_shape=lay.local_shape,
                         local_ok=ok, intervals=lay.intervals)

    try:
        mesh = init_device_mesh("cpu", (world,))
        g = torch.arange(5 * 6, dtype=torch.float32).reshape(5, 6)
        record("shard0_uneven", distribute_tensor(g, mesh, [Shard(0)]))
        record("shard1", distribute_tensor(torch.arange(3 * 8.).reshape(3, 8), mesh, [Shard(1)]))
        record("replicate", distribute_tensor(g, mesh, [Replicate()]))
        record("experts", distribute_tensor(torch.arange(6 * 2 * 3.).reshape(6, 2, 3), mesh,
                                            [Shard(0)]))
        torch.manual_seed(0)
        fs = nn.Linear(6, 5, bias=False)
        fully_shard(fs)
        record("fsdp", fs.weight)
        tp = nn.Sequential(nn.Linear(8, 4, bias=False), nn.Linear(4, 8, bias=False))
        parallelize_module(tp, mesh, {"0": ColwiseParallel(), "1": RowwiseParallel()})
        record("tp_colwise", tp[0].weight)
        record("tp_rowwise", tp[1].weight)
        mesh2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        m2 = nn.Sequential(nn.Linear(8, 6, bias=False), nn.ReLU(), nn.Linear(6, 8, bias=False),
                           nn.Linear(8, 3, bias=False))
        parallelize_module(m2, mesh2["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        fully_shard(m2, mesh=mesh2["dp"])
        record("fsdp_tp_colwise", m2[0].weight)  # (_StridedShard(0, sf=2), Shard(0))
        record("fsdp_tp_rowwise", m2[2].weight)  # (Shard(0), Shard(1))
        record("fsdp_dp_only", m2[3].weight)     # on the dp sub-mesh, whole across tp
        hs = nn.Linear(8, 5, bias=False)
        fully_shard(hs, mesh=init_device_mesh("cpu", (2, 2), mesh_dim_names=("rep", "shard")))
        record("hsdp", hs.weight)
        record("hsdp_summed", hs.weight, summed=(0,))
        partial = DTensor.from_local(torch.ones(2, 3), mesh, [Partial()])
        try:
            storage_layout("blocks.0.w", partial)
            out["partial_error"] = None
        except InvalidArgument as e:
            out["partial_error"] = str(e)
        try:
            storage_layout("blocks.1.w", fs.weight, summed_mesh_dims=(0,))
            out["summed_shard_error"] = None
        except InvalidArgument as e:
            out["summed_shard_error"] = str(e)
        torch.save(out, os.path.join(outdir, f"layouts_{rank}.pt"))
    finally:
        dist.destroy_process_group()


VOCAB = 16


class ShardNet(nn.Module):
    """embed / head (AdamW), fc1 12 -> 5 (5 rows: an uneven shard, over 4 ranks a rank with no
    rows), fc2 5 -> 12, gate 12 -> 1 (one row: every rank but 0 holds nothing), experts 3 x 12
    x 12 (sharded on the expert dimension), biases (AdamW)."""

    def __init__(self):
        super().__init__()
        g = torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, 12)
        self.fc1 = nn.Linear(12, 5)
        self.fc2 = nn.Linear(5, 12)
        self.gate = nn.Linear(12, 1, bias=False)
        self.experts = nn.Parameter(torch.randn(3, 12, 12, generator=g) * 0.2)
        self.head = nn.Linear(12, VOCAB, bias=False)

    def forward(self, idx, targets):
        import torch.nn.functional as F
        h = self.embed(idx)
        h = h + self.fc2(F.gelu(self.fc1(h)))
        h = h + torch.einsum("btd,edf->btf", h, self.experts) / 3
        loss = F.cross_entropy(self.head(h).reshape(-1, VOCAB), targets.reshape(-1))
        return loss + self.gate(h).pow(2).mean()


def shard_batch(step: int, rank: int):
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randint(VOCAB, (4, 6), generator=g)
    return x, (x * 3 + 1) % VOCAB


def _counted(fn):
    """Runs fn() under torch's CommDebugMode; returns {collective name: count}."""
    from torch.distributed.tensor.debug import CommDebugMode
    comm = CommDebugMode()
    with comm:
        fn()
    return {str(k).split(".")[-1]: v for k, v in comm.get_comm_counts().items()}


def run_fsdp(rank: int, world: int, init: str, socket: str, outdir: str, steps: int = 3):
    """One rank of test_fsdp.py: ShardNet under fully_shard with OffloadMuon, and the same model
    unsharded with InProcessMuon (the reference: it averages the full gradients itself). Saves
    the full parameters of both (gathered by the test, not the optimizer), the per-step byte
    counters and the collectives counted in backward and in step()."""
    _init(rank, world, init)
    from muon_offload import InProcessMuon, OffloadMuon
    kw = dict(lr=0.03, weight_decay=0.05, adamw_lr=2e-3)
    try:
        res = {"stats": [], "backward": [], "step": []}
        for variant in ("inprocess", "fsdp"):
            model = _fsdp_shardnet() if variant == "fsdp" else ShardNet()
            if variant == "fsdp":
                opt = OffloadMuon(model.named_parameters(), servers=[socket], prefix="fsdp/",
                                  **kw)
                res["local_numel"] = {n: p.to_local().numel() for n, p in
                                      model.named_parameters()}
                res["routing"] = opt.routing
            else:
                opt = InProcessMuon(model.named_parameters(), **kw)
            for s in range(steps):
                opt.zero_grad(set_to_none=True)
                x, y = shard_batch(s, rank)
                back = _counted(lambda: model(x, y).backward())
                st = _counted(opt.step)
                res["backward" if variant == "fsdp" else "ref_backward"] = back
                res.setdefault("step" if variant == "fsdp" else "ref_step", []).append(st)
                if variant == "fsdp":
                    res["stats"].append(dict(opt.last_step_stats))
            params = _full(model)
            res[variant] = params
            if hasattr(opt, "close"):
                opt.close()
        torch.save(res, os.path.join(outdir, f"fsdp_{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_fsdp_clipped(rank: int, world: int, init: str, socket: str, outdir: str,
                     steps: int = 3):
    """One rank of test_grad_edits.py's FSDP case: ShardNet under fully_shard with
    OffloadMuon(overlap=False), clip_grad_norm_ over every (DTensor) gradient between backward
    and step(); the reference is InProcessMuon under DDP, which clips the same mean gradient
    whole. Saves the full parameters and the norms of both."""
    _init(rank, world, init)
    from torch.nn.parallel import DistributedDataParallel as DDP
    from muon_offload import InProcessMuon, OffloadMuon
    kw = dict(lr=0.03, weight_decay=0.05, adamw_lr=2e-3, overlap=False)
    try:
        res = {}
        for variant in ("ddp", "fsdp"):
            model = _fsdp_shardnet() if variant == "fsdp" else ShardNet()
            if variant == "fsdp":
                forward = model
                opt = OffloadMuon(model.named_parameters(), servers=[socket],
                                  prefix="fsdp_clipped/", **kw)
            else:
                forward = DDP(model)
                opt = InProcessMuon(model.named_parameters(), ddp=forward, **kw)
            norms = []
            for s in range(steps):
                opt.zero_grad(set_to_none=True)
                forward(*shard_batch(s, rank)).backward()
                total = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.2)
                norms.append(float(total.full_tensor() if hasattr(total, "full_tensor")
                                   else total))
                opt.step()
            res[variant] = _full(model)
            res[variant + "_norms"] = norms
            if hasattr(opt, "close"):
                opt.close()
        torch.save(res, os.path.join(outdir, f"fsdp_clipped_{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


class TPNet(nn.Module):
    """embed / head (AdamW, plain tensors under TP), w1 8 -> 12 (ColwiseParallel: Shard(0)),
    w2 12 -> 8 (RowwiseParallel: Shard(1)), both Muon."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.embed = nn.Embedding(VOCAB, 8)
        self.w1 = nn.Linear(8, 12, bias=False)
        self.w2 = nn.Linear(12, 8, bias=False)
        self.head = nn.Linear(8, VOCAB, bias=False)

    def forward(self, idx, targets):
        import torch.nn.functional as F
        h = self.embed(idx)
        h = h + self.w2(F.gelu(self.w1(h)))
        return F.cross_entropy(self.head(h).reshape(-1, VOCAB), targets.reshape(-1))


def run_tp(rank: int, world: int, init: str, socket: str, outdir: str, steps: int = 3):
    """One rank of test_tp.py (world 4): TPNet under parallelize_module on a 1-D mesh of 4
    (every rank the same batch), under TP x FSDP on a 2 x 2 (dp, tp) mesh (the batch of
    the dp coordinate), and under HSDP (2 replicas x 2 shards, each rank its own batch), each with OffloadMuon and, unsharded, InProcessMuon averaging over the
    data-parallel ranks only. Saves the full parameters, byte counters, the bytes step()
    all-reduced and the collectives it issued."""
    _init(rank, world, init)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    from muon_offload import InProcessMuon, OffloadMuon
    kw = dict(lr=0.03, weight_decay=0.05, adamw_lr=2e-3)
    plan = {"w1": ColwiseParallel(), "w2": RowwiseParallel()}
    reduced = []
    plain_all_reduce = dist.all_reduce

    def counting_all_reduce(tensor, *args, **kwargs):
        reduced.append(tensor.numel() * tensor.element_size())
        return plain_all_reduce(tensor, *args, **kwargs)

    dist.all_reduce = counting_all_reduce
    mesh2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp_rank = mesh2.get_coordinate()[0]
    try:
        res = {}
        for variant in ("tp", "tp_ref", "fsdp_tp", "fsdp_tp_ref", "hsdp", "hsdp_ref"):
            model = TPNet()
            data_rank = {"tp": 0, "fsdp": dp_rank, "hsdp": rank}[variant.split("_")[0]]
            if variant == "tp":
                parallelize_module(model, init_device_mesh("cpu", (world,)), plan)
            if variant == "fsdp_tp":
                parallelize_module(model, mesh2["tp"], plan)
                fully_shard(model, mesh=mesh2["dp"])
            if variant == "hsdp":  # 2 replicas x 2 shards; FSDP all-reduces the replicas
                fully_shard(model, mesh=init_device_mesh("cpu", (2, 2),
                                                         mesh_dim_names=("rep", "shard")))
            if variant.endswith("_ref"):
                # The data-parallel group: all ranks for "tp" (same data) and "hsdp", the dp
                # ranks of this tp coordinate for "fsdp_tp".
                pg = mesh2["dp"].get_group() if variant == "fsdp_tp_ref" else None
                opt = InProcessMuon(model.named_parameters(), process_group=pg, **kw)
            else:
                opt = OffloadMuon(model.named_parameters(), servers=[socket],
                                  prefix=variant + "/", **kw)
                res[variant + "_local_numel"] = {
                    n: (p.to_local() if hasattr(p, "to_local") else p).numel()
                    for n, p in model.named_parameters()}
                res[variant + "_wanted_ranges"] = {m.name: len(m.wanted)
                                                   for m in opt._meta.values()}
            stats, step_reduced, step_colls = [], [], []
            for s in range(steps):
                opt.zero_grad(set_to_none=True)
                x, y = shard_batch(s, data_rank)
                model(x, y).backward()
                del reduced[:]
                step_colls.append(_counted(opt.step))
                step_reduced.append(sum(reduced))
                if hasattr(opt, "last_step_stats"):
                    stats.append(dict(opt.last_step_stats))
            res[variant] = _full(model)
            res[variant + "_stats"] = stats
            res[variant + "_step_reduced"] = step_reduced
            res[variant + "_step_collectives"] = step_colls
            if hasattr(opt, "close"):
                opt.close()
        torch.save(res, os.path.join(outdir, f"tp_{rank}.pt"))
        dist.barrier()
    finally:
        dist.all_reduce = plain_all_reduce
        dist.destroy_process_group()


def _fsdp_shardnet():
    from torch.distributed.fsdp import fully_shard
    model = ShardNet()
    fully_shard(model.fc1)
    fully_shard(model.fc2)
    fully_shard(model)
    return model


def _full(model):
    """Every parameter of ``model`` whole (a DTensor gathered), detached copies by name."""
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in model.named_parameters()}


def run_dcp(rank: int, world: int, init: str, socket: str, outdir: str, phase: str):
    """One rank of test_dcp.py. Phase "save" (4 ranks): FSDP2 ShardNet + OffloadMuon, 2 steps,
    a torch.distributed.checkpoint of get_state_dict(model, optimizer) (each rank's momentum
    shard a DTensor), then 2 more steps on the same batch on every rank. Phase "load" (2
    ranks): a fresh job loads the checkpoint (set_state_dict) and takes the same 2 steps.
    Saves the momentum and parameters right after the checkpoint/load and at the end."""
    _init(rank, world, init)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from muon_offload import OffloadMuon
    kw = dict(lr=0.03, weight_decay=0.05, adamw_lr=2e-3)
    ckpt = os.path.join(outdir, "ckpt")
    try:
        model = _fsdp_shardnet()
        opt = OffloadMuon(model.named_parameters(), servers=[socket], prefix=phase + "/", **kw)

        def train(steps, data_rank):
            for s in steps:
                opt.zero_grad(set_to_none=True)
                x, y = shard_batch(s, rank if data_rank is None else data_rank)
                model(x, y).backward()
                opt.step()

        if phase == "save":
            train(range(2), None)
            msd, osd = get_state_dict(model, opt)
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=ckpt)
        else:
            msd, osd = get_state_dict(model, opt)  # the templates, in this job's sharding
            state = {"model": msd, "optim": osd}
            dcp.load(state, checkpoint_id=ckpt)
            set_state_dict(model, opt, model_state_dict=state["model"],
                           optim_state_dict=state["optim"])
        names = dict(model.named_parameters())
        muon = [n for n, (kind, _) in opt.routing.items() if kind == "muon"]
        res = {"momentum": {n: opt.momentum_buffer(names[n]) for n in muon},
               "steps": {n: opt.state[names[n]]["step"] for n in muon},
               "params": _full(model)}
        train(range(2, 4), 0)
        res["final"] = _full(model)
        opt.close()
        torch.save(res, os.path.join(outdir, f"dcp_{phase}_{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


class HNet(nn.Module):
    """embed / head (AdamW, the root: native HSDP on the 2-D mesh), fc1 12 -> 5 and fc2 5 -> 12
    (Muon weights, AdamW biases), each sharded on the "shard" sub-mesh only."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.embed = nn.Embedding(VOCAB, 12)
        self.fc1 = nn.Linear(12, 5)
        self.fc2 = nn.Linear(5, 12)
        self.head = nn.Linear(12, VOCAB, bias=False)

    def forward(self, idx, targets):
        import torch.nn.functional as F
        h = self.embed(idx)
        h = h + self.fc2(F.gelu(self.fc1(h)))
        return F.cross_entropy(self.head(h).reshape(-1, VOCAB), targets.reshape(-1))


def run_hsdp(rank: int, world: int, init: str, socket: str, outdir: str, steps: int = 3):
    """One rank of test_hsdp.py (world 4, a 2 x 2 (replicate, shard) mesh, each rank its own
    batch): HNet with fc1 / fc2 sharded on mesh["shard"] and the root on the 2-D mesh, with
    OffloadMuon(replica_mesh_dims=("replicate",)), and the unsharded model with InProcessMuon
    averaging over all 4 ranks. Saves the full parameters, the step stats, and the bytes every
    all-reduce moved (FSDP's own included: torch.distributed.all_reduce is wrapped) in backward
    and in step()."""
    _init(rank, world, init)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from muon_offload import InProcessMuon, OffloadMuon
    kw = dict(lr=0.03, weight_decay=0.05, adamw_lr=2e-3)
    reduced = []
    plain_all_reduce = dist.all_reduce

    def counting_all_reduce(tensor, *args, **kwargs):
        reduced.append(tensor.numel() * tensor.element_size())
        return plain_all_reduce(tensor, *args, **kwargs)

    dist.all_reduce = counting_all_reduce
    try:
        res = {}
        for variant in ("hsdp", "ref"):
            model = HNet()
            if variant == "hsdp":
                mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
                fully_shard(model.fc1, mesh=mesh["shard"])
                fully_shard(model.fc2, mesh=mesh["shard"])
                fully_shard(model, mesh=mesh)
                opt = OffloadMuon(model.named_parameters(), servers=[socket], prefix="hsdp/",
                                  replica_mesh_dims=("replicate",), **kw)
                res["local_numel"] = {n: p.to_local().numel() for n, p in
                                      model.named_parameters()}
                from muon_offload import InvalidArgument
                from muon_offload.layouts import storage_layout
                for case, param, dims in (("own", model.embed.weight, ("replicate",)),
                                          ("unknown", model.fc1.weight, ("rep",))):
                    try:
                        storage_layout(case, param, summed_root_dims=dims)
                        res[case + "_error"] = None
                    except InvalidArgument as e:
                        res[case + "_error"] = str(e)
            else:
                opt = InProcessMuon(model.named_parameters(), **kw)
            stats, back, step_bytes = [], [], []
            for s in range(steps):
                opt.zero_grad(set_to_none=True)
                x, y = shard_batch(s, rank)
                del reduced[:]
                model(x, y).backward()
                back.append(list(reduced))
                del reduced[:]
                opt.step()
                step_bytes.append(list(reduced))
                if variant == "hsdp":
                    stats.append(dict(opt.last_step_stats))
            res[variant] = _full(model)
            res[variant + "_stats"] = stats
            res[variant + "_backward_reduced"] = back
            res[variant + "_step_reduced"] = step_bytes
            if hasattr(opt, "close"):
                opt.close()
        torch.save(res, os.path.join(outdir, f"hsdp_{rank}.pt"))
        dist.barrier()
    finally:
        dist.all_reduce = plain_all_reduce
        dist.destroy_process_group()
