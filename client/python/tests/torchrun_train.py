"""A trainer as users write it for torchrun (test_torchrun.py runs it as
``scripts/muon-offload-launch -- torchrun --standalone --nproc-per-node 2 torchrun_train.py OUT``):
the process group from torchrun's environment, the model under DistributedDataParallel,
OffloadMuon on the launcher's servers (MUON_OFFLOAD_SERVERS), and the same training with
InProcessMuon as the reference. Writes OUT/rank<r>.pt."""
import faulthandler
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers import TinyNet, batch
from muon_offload import InProcessMuon, OffloadMuon


def train(opt_class, rank, **kw):
    model = TinyNet()
    ddp = DDP(model)
    opt = opt_class(model.named_parameters(), ddp=ddp, lr=0.03, weight_decay=0.05,
                    adamw_lr=2e-3, **kw)
    losses = []
    for s in range(3):
        opt.zero_grad(set_to_none=True)
        x, y = batch(s, rank)
        loss = ddp(x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    if hasattr(opt, "close"):
        opt.close()
    return [p.detach().clone() for p in model.parameters()], losses


def main():
    # A rank that aborts in C++ ("terminate called without an active exception", seen twice
    # under load, 2026-12-07) prints where each Python thread was.
    faulthandler.enable(all_threads=True)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR/PORT from torchrun
    rank = dist.get_rank()
    offload, losses = train(OffloadMuon, rank)  # servers: MUON_OFFLOAD_SERVERS
    reference, ref_losses = train(InProcessMuon, rank)
    torch.save({"world": dist.get_world_size(), "local_rank": int(os.environ["LOCAL_RANK"]),
                "servers": os.environ["MUON_OFFLOAD_SERVERS"], "offload": offload,
                "reference": reference, "losses": losses, "ref_losses": ref_losses},
               os.path.join(sys.argv[1], f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
