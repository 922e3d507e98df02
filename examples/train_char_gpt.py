#!/usr/bin/env python3
"""A small GPT trained character by character on the fortunes of Debian's `fortunes` package,
with Muon offloaded to muon-offloadd (--optimizer offload), the same Muon computed in process by
the same C++ kernels (inprocess), torch.optim.Muon with torch.optim.AdamW for the rest (torch:
the anchor), or AdamW alone (adamw). With more than one rank the model is wrapped in
DistributedDataParallel and the loop is DDP's for every optimizer (OffloadMuon's DDP hook sends
the Muon gradients to the server instead of all-reducing them).

    # one rank, the server started for you:
    scripts/muon-offload-launch --cpu -- $(scripts/venv-python) examples/train_char_gpt.py --steps 200
    # two ranks (gloo, CPU) spawned here, or torchrun-style (RANK/WORLD_SIZE/MASTER_ADDR/PORT):
    scripts/muon-offload-launch --cpu -- $(scripts/venv-python) examples/train_char_gpt.py --world 2
    $(scripts/venv-python) examples/train_char_gpt.py --optimizer inprocess --world 2 --out in.json
    # sharded: FSDP2 over the ranks, or FSDP2 x tensor parallel (the MLP) on a (world/N, N) mesh:
    scripts/muon-offload-launch --cpu -- $(scripts/venv-python) examples/train_char_gpt.py \\
        --world 2 --fsdp
    scripts/muon-offload-launch --cpu -- $(scripts/venv-python) examples/train_char_gpt.py \\
        --world 4 --fsdp --tp 2

(scripts/venv-python is the project's Python: the venv scripts/install_deps.sh makes, torch from
PyPI.)

Checkpoints: --checkpoint PATH saves the model, the optimizer (for offload: the server-held
momentum too, fetched by state_dict()), the schedule and the data order every --checkpoint-every
steps (atomically; PATH.rank<r> per rank with several ranks). --resume loads it and goes on from
its step, bitwise as if never interrupted: load_state_dict() puts the momentum back into the
server, so a crashed server may be replaced by a fresh one. --until N stops after step N (a job
split over several runs, or a rehearsal of a crash):

    scripts/muon-offload-launch --cpu -- $(scripts/venv-python) examples/train_char_gpt.py \
        --steps 200 --until 100 --checkpoint ck.pt --checkpoint-every 50
    scripts/muon-offload-launch --cpu -- $(scripts/venv-python) examples/train_char_gpt.py \
        --steps 200 --checkpoint ck.pt --checkpoint-every 50 --resume

After a server crash (ConnectionLost, saying what the server's snapshots kept) rerun with
--resume: the steps since the last checkpoint are computed again.

Prints per step: the loss (cross-entropy in nats per character, mean over ranks), tokens/s and
the optimizer time the trainer waited for (step() plus gradient hooks). --out writes the losses
and the measurements as JSON. Everything is seeded: two runs with the same arguments print the
same losses, and offload/inprocess print bitwise the same losses (same kernels, the server and
the in-process reference both run OpenBLAS with --threads 1).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import socket
import statistics
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "client" / "python"))
# One BLAS/OpenMP thread per rank (2 ranks + the server share 2 cores here); it also keeps torch's
# matmuls identical between runs.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

CORPUS = "/usr/share/games/fortunes"


# ---- data -----------------------------------------------------------------------------------

def load_corpus(path: str = CORPUS) -> str:
    """The fortune files concatenated in name order (.dat index files and .u8 links skipped)."""
    d = pathlib.Path(path)
    if not d.is_dir():
        raise SystemExit(f"corpus {path} not found: install Debian's `fortunes` package "
                         "(scripts/install_deps.sh does)")
    parts = []
    for f in sorted(d.iterdir()):
        if f.suffix == ".dat" or f.is_symlink() or not f.is_file():
            continue
        parts.append(f.read_bytes().decode("utf-8", errors="replace"))
    return "".join(parts)


def unigram_entropy(text: str) -> float:
    """-sum p(c) ln p(c) over the characters of text, in nats per character."""
    counts = {}
    for ch in text:
        counts[ch] = counts.get(ch, 0) + 1
    n = len(text)
    return -sum(c / n * math.log(c / n) for c in counts.values())


# ---- model ----------------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)   # fused QKV: Muon with row_splits [d, d, d]
        self.proj = nn.Linear(d, d, bias=False)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d, bias=False)
        self.out = nn.Linear(4 * d, d, bias=False)

    def forward(self, x, mask):
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
        att = att.masked_fill(mask[:t, :t], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class CharGPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, context: int):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d)
        self.pos_emb = nn.Embedding(context, d)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.register_buffer("mask", torch.triu(torch.ones(context, context, dtype=torch.bool), 1))
        for name, p in self.named_parameters():
            if p.ndim == 2:
                nn.init.normal_(p, std=0.02)
            if name.endswith("proj.weight") or name.endswith("out.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers))

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.tok_emb(idx) + self.pos_emb.weight[:t]
        for blk in self.blocks:
            x = blk(x, self.mask)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


# ---- sharding -------------------------------------------------------------------------------

def shard_model(model: CharGPT, args, world: int):
    """--tp N: the MLP of every block tensor parallel over N ranks (fc ColwiseParallel, out
    RowwiseParallel, Megatron's split); --fsdp: FSDP2 fully_shard of every block and the root
    over the data-parallel ranks (world/N). Returns the data-parallel rank of this process (the
    ranks of one TP group train on the same batch)."""
    from torch.distributed.device_mesh import init_device_mesh
    tp = args.tp
    if world % tp:
        raise SystemExit(f"--tp {tp} does not divide the world size {world}")
    mesh = init_device_mesh("cpu", (world // tp, tp), mesh_dim_names=("dp", "tp"))
    if tp > 1:
        from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                       parallelize_module)
        for blk in model.blocks:
            parallelize_module(blk, mesh["tp"], {"fc": ColwiseParallel(),
                                                 "out": RowwiseParallel()})
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard
        for blk in model.blocks:
            fully_shard(blk, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
    return mesh.get_coordinate()[0]


# ---- training -------------------------------------------------------------------------------

class TorchMuonAdamW:
    """torch.optim.Muon for the matrices muon_offload routes to Muon (the same rule:
    muon_offload.routing.default_route) and torch.optim.AdamW for the rest, stepped together:
    what users run without muon-offload."""

    def __init__(self, model, args):
        from muon_offload.routing import default_route
        named = list(model.named_parameters())
        muon = [p for n, p in named if default_route(n, p) == "muon"]
        rest = [p for n, p in named if default_route(n, p) != "muon"]
        self.muon = torch.optim.Muon(muon, lr=args.lr, momentum=0.95, nesterov=True,
                                     weight_decay=args.weight_decay)
        self.adamw = torch.optim.AdamW(rest, lr=args.adamw_lr, betas=(0.9, 0.95),
                                       weight_decay=args.weight_decay)
        self.param_groups = self.muon.param_groups + self.adamw.param_groups

    def zero_grad(self, set_to_none=True):
        self.muon.zero_grad(set_to_none)
        self.adamw.zero_grad(set_to_none)

    def step(self):
        self.muon.step()
        self.adamw.step()

    def schedulers(self, factor):
        return [torch.optim.lr_scheduler.LambdaLR(o, factor) for o in (self.muon, self.adamw)]


def make_optimizer(args, model, ddp):
    """The optimizer of --optimizer. Muon's keywords are torch.optim.Muon's for every Muon run
    (lr, momentum 0.95, Nesterov, weight decay; the default Newton-Schulz and adjust_lr), so the
    offloaded run and torch.optim.Muon compute the same math."""
    if args.optimizer == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=args.adamw_lr, betas=(0.9, 0.95),
                                 weight_decay=args.weight_decay)
    if args.optimizer == "torch":
        return TorchMuonAdamW(model, args)
    from muon_offload import InProcessMuon, OffloadMuon
    # Clipping reads every gradient between backward and step(): the Muon ones stay in .grad
    # until step() pushes them (overlap=False) instead of going to the server during backward.
    common = dict(lr=args.lr, momentum=0.95, nesterov=True, weight_decay=args.weight_decay,
                  adamw_lr=args.adamw_lr, adamw_betas=(0.9, 0.95), mode=args.mode,
                  ddp=ddp, overlap=not args.clip_grad_norm)
    if args.optimizer == "offload":
        return OffloadMuon(model.named_parameters(), **common)
    return InProcessMuon(model.named_parameters(), threads=args.threads, **common)


def train(rank: int, world: int, args) -> dict:
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    text = load_corpus(args.corpus)
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    n_val = len(data) // 20
    train_data, val_data = data[:-n_val], data[-n_val:]
    # --device cuda: rank r on GPU r (modulo the visible ones); gradients, updates and the
    # optimizer's buffers stay on the device (OffloadMuon pushes from device memory).
    device = torch.device(args.device if args.device == "cpu"
                          else f"cuda:{rank % max(1, torch.cuda.device_count())}")
    model = CharGPT(len(chars), args.d_model, args.layers, args.heads, args.context).to(device)
    sharded = args.fsdp or args.tp > 1
    if sharded and (world == 1 or args.optimizer not in ("offload", "inprocess")):
        raise SystemExit("--fsdp and --tp need torch.distributed (--world 2 or more, or torchrun) "
                         "and --optimizer offload or inprocess")
    data_rank = shard_model(model, args, world) if sharded else rank
    # DDP for more than one rank (mode shard: the optimizer all-reduces itself; sharded: FSDP
    # reduces).
    ddp = (torch.nn.parallel.DistributedDataParallel(model)
           if world > 1 and args.mode == "server_reduce" and not sharded else None)
    net = ddp or model
    opt = make_optimizer(args, model, ddp)
    warm = max(1, args.steps // 20)

    def factor(s):
        return min(1.0, (s + 1) / warm) * (1.0 - 0.9 * s / max(1, args.steps))

    scheds = (opt.schedulers(factor) if isinstance(opt, TorchMuonAdamW)
              else [torch.optim.lr_scheduler.LambdaLR(opt, factor)])
    gen = torch.Generator().manual_seed(args.seed * 1000 + data_rank)

    def batch(src, g):
        ix = torch.randint(len(src) - args.context - 1, (args.batch,), generator=g)
        x = torch.stack([src[i:i + args.context] for i in ix])
        y = torch.stack([src[i + 1:i + 1 + args.context] for i in ix])
        return x.to(device), y.to(device)

    def allreduce_mean_(flat):
        if world > 1:
            flat.div_(world)
            dist.all_reduce(flat)
        return flat

    ckpt = None
    if args.checkpoint:
        ckpt = pathlib.Path(args.checkpoint if world == 1 else f"{args.checkpoint}.rank{rank}")
    start = load_checkpoint(ckpt, model, opt, scheds, gen) if args.resume else 0

    losses, tok_s, opt_ms = [], [], []
    tokens = args.batch * args.context * (world // args.tp)
    pushed_per_step = []
    t_start = time.perf_counter()
    for step in range(start, min(args.steps, args.until or args.steps)):
        t0 = time.perf_counter()
        x, y = batch(train_data, gen)
        opt.zero_grad(set_to_none=True)
        loss = net(x, y)
        loss.backward()
        t_opt = time.perf_counter()
        if ddp is None and world > 1 and args.optimizer in ("adamw", "torch"):
            # mode shard's runs: the data-parallel mean of the gradients by hand
            ps = [p for p in model.parameters() if p.grad is not None]
            flat = allreduce_mean_(torch.cat([p.grad.reshape(-1) for p in ps]))
            pos = 0
            for p in ps:
                p.grad.copy_(flat[pos:pos + p.numel()].view_as(p))
                pos += p.numel()
        if args.clip_grad_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
        opt.step()
        for sched in scheds:
            sched.step()
        if args.optimizer in ("adamw", "torch"):
            exposed = time.perf_counter() - t_opt  # all of step(): nothing overlaps it
        else:
            exposed = opt.exposed_seconds
        if args.optimizer == "offload":
            pushed_per_step.append(opt.last_step_stats["bytes_pushed"])
        if ckpt is not None and (step + 1) % args.checkpoint_every == 0:
            save_checkpoint(ckpt, step + 1, model, opt, scheds, gen)
        global_loss = allreduce_mean_(loss.detach().reshape(1).clone()).item()
        dt = time.perf_counter() - t0
        losses.append(global_loss)
        tok_s.append(tokens / dt)
        opt_ms.append(exposed * 1000)
        if rank == 0 and (step % args.log_every == 0 or step + 1 == args.steps):
            print(f"[{args.optimizer}] step {step:4d}  loss {global_loss:.4f}  "
                  f"{tokens / dt:8.0f} tok/s  optimizer exposed {exposed * 1000:7.2f} ms",
                  flush=True)
    wall = time.perf_counter() - t_start
    # Held-out loss on fixed batches (same on every rank and run).
    model.eval()
    g = torch.Generator().manual_seed(4242)
    with torch.no_grad():
        val = sum(model(*batch(val_data, g)).item() for _ in range(args.eval_batches))
    val /= args.eval_batches
    extra = {}
    if args.optimizer == "offload":
        # Gradient bytes each rank pushed per step next to the full Muon matrices (f32).
        full = 4 * sum(math.prod(shape) for kind, shape in opt.routing.values() if kind == "muon")
        mine = statistics.median(pushed_per_step) if pushed_per_step else 0
        per_rank = [mine]
        if world > 1:
            per_rank = [None] * world
            dist.all_gather_object(per_rank, mine)
        extra = {"bytes_pushed_per_rank_per_step": per_rank, "muon_bytes_full": full}
        if rank == 0:
            print(f"[{args.optimizer}] gradient bytes pushed per step: "
                  + ", ".join(f"rank {r} {b / 1e6:.3f} MB" for r, b in enumerate(per_rank))
                  + f"; the model's full Muon matrices: {full / 1e6:.3f} MB", flush=True)
    if hasattr(opt, "close"):
        opt.close()
    return dict(extra, **{
        "optimizer": args.optimizer,
        "mode": args.mode if args.optimizer in ("offload", "inprocess") else None,
        "ddp": ddp is not None,
        "world": world, "steps": args.steps, "start_step": start, "losses": losses,
        "val_loss": val,
        "loss_unit": "nats/char",
        "unigram_entropy_nats": unigram_entropy(text), "vocab": len(chars),
        "corpus_chars": len(text), "tokens_per_step": tokens,
        "tokens_per_s_median": statistics.median(tok_s),
        "optimizer_exposed_ms_median": statistics.median(opt_ms),
        "optimizer_exposed_ms_mean": statistics.fmean(opt_ms),
        "train_wall_s": wall,
        "params": sum(p.numel() for p in model.parameters()),
        "config": {k: v for k, v in vars(args).items()},
    })


def save_checkpoint(path: pathlib.Path, step: int, model, opt, scheds, gen) -> None:
    """Everything this rank needs to go on after `step` steps, written atomically (a temporary
    file renamed over `path`): model, optimizer (OffloadMuon: with the server's momentum), the
    schedulers and the data generator."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict(),
                "scheds": [s.state_dict() for s in scheds], "gen": gen.get_state()}, tmp)
    os.replace(tmp, path)


def load_checkpoint(path, model, opt, scheds, gen) -> int:
    """Loads a save_checkpoint file into the run; returns its step (the next one to take)."""
    if path is None or not path.is_file():
        raise SystemExit(f"--resume: no checkpoint at {path} (give --checkpoint PATH)")
    ck = torch.load(path, weights_only=False)
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["opt"])  # OffloadMuon: puts the momentum back into the server
    for s, st in zip(scheds, ck["scheds"]):
        s.load_state_dict(st)
    gen.set_state(ck["gen"])
    return int(ck["step"])


def run_rank(rank: int, world: int, args, init: str):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        result = train(rank, world, args)
        if rank == 0 and args.out:
            pathlib.Path(args.out).write_text(json.dumps(result, indent=1))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--optimizer", choices=["offload", "inprocess", "torch", "adamw"],
                    default="offload")
    ap.add_argument("--mode", choices=["server_reduce", "shard"], default="server_reduce")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--world", type=int, default=1, help="ranks to spawn (gloo, CPU); ignored "
                    "when RANK/WORLD_SIZE are set (torchrun)")
    ap.add_argument("--batch", type=int, default=16, help="sequences per rank per step")
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--lr", type=float, default=0.02, help="Muon learning rate")
    ap.add_argument("--adamw-lr", type=float, default=3e-3,
                    help="AdamW learning rate (embeddings, head, norms; all of --optimizer adamw)")
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--clip-grad-norm", type=float, default=0.0, metavar="N",
                    help="clip the total gradient norm to N before each step (0: no clipping); "
                         "the offloaded runs then push in step() (overlap=False)")
    ap.add_argument("--threads", type=int, default=1,
                    help="OpenBLAS threads of the in-process kernels (= the server's --threads)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--eval-batches", type=int, default=8)
    ap.add_argument("--log-every", type=int, default=1)
    ap.add_argument("--corpus", default=CORPUS)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="where the model trains (cuda: rank r on GPU r; with GPU servers the "
                         "launcher sets MUON_OFFLOAD_DATA_PLANE=cuda_ipc)")
    ap.add_argument("--fsdp", action="store_true",
                    help="shard the model with FSDP2 (fully_shard) over the data-parallel ranks: "
                         "each rank pushes only its shard of each Muon matrix")
    ap.add_argument("--tp", type=int, default=1, metavar="N",
                    help="tensor parallel over N ranks (the MLPs: ColwiseParallel fc, "
                         "RowwiseParallel out) on a (world/N, N) mesh")
    ap.add_argument("--out", help="write losses and measurements here (JSON)")
    ap.add_argument("--checkpoint", metavar="PATH",
                    help="save a checkpoint here every --checkpoint-every steps")
    ap.add_argument("--checkpoint-every", type=int, default=50, metavar="N")
    ap.add_argument("--resume", action="store_true",
                    help="load --checkpoint first and go on from its step")
    ap.add_argument("--until", type=int, default=0, metavar="N",
                    help="stop after step N (default: --steps; the schedule still spans --steps)")
    args = ap.parse_args(argv)
    if (args.checkpoint or args.resume) and args.optimizer == "torch":
        ap.error("--checkpoint/--resume: not with --optimizer torch (its pair of optimizers "
                 "has no state_dict here)")
    if args.resume and not args.checkpoint:
        ap.error("--resume needs --checkpoint PATH")
    if args.checkpoint_every < 1:
        ap.error("--checkpoint-every must be >= 1")
    if not args.clip_grad_norm >= 0 or args.clip_grad_norm == float("inf"):
        ap.error("--clip-grad-norm must be a finite number >= 0")
    if args.clip_grad_norm and args.mode == "shard" and args.world > 1:
        ap.error("--clip-grad-norm with --mode shard: the optimizer averages the gradients in "
                 "step(), after the clip would have seen each rank's own (use server_reduce: "
                 "DDP averages first)")

    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if world > 1:
            run_rank(rank, world, args, "env://")
            return
    if args.world > 1:
        with socket.socket() as s:  # a free port for the rendezvous
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        torch.multiprocessing.spawn(run_rank, args=(args.world, args, f"tcp://127.0.0.1:{port}"),
                                    nprocs=args.world, join=True)
        return
    result = train(0, 1, args)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
