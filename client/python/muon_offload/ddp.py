"""DistributedDataParallel with the Muon gradients reduced once, by the server: a DDP
communication hook (``DistributedDataParallel.register_comm_hook``) that hands each bucket's Muon
gradients to :class:`~muon_offload.offload.OffloadMuon` (pushed and committed as the bucket
becomes ready, during backward) and all-reduces only the rest of the bucket, the AdamW gradients,
asynchronously as DDP's own hook does (each rank divides by the world size, then one all-reduce
sum: bitwise the unwrapped optimizer's averaging with 2 ranks).

Used through ``OffloadMuon(..., ddp=ddp_model)`` or ``optimizer.attach_ddp(ddp_model)``; the
training loop stays DDP's. Gradient accumulation: ``with ddp_model.no_sync():`` (gradients
accumulate in ``.grad``; the last micro-batch's buckets push the sum), not
``optimizer.no_commit()``.
"""
import weakref

import torch
import torch.distributed as dist

__all__ = ["MuonCommHookState", "muon_comm_hook"]


class MuonCommHookState:
    """The hook's state: the optimizer (weakly), the process group, and what went where:
    ``allreduced_bytes`` (AdamW gradient bytes this rank all-reduced) and ``pushed_bytes``
    (Muon gradient bytes handed to the server), both cumulative."""

    def __init__(self, optimizer, process_group=None):
        self._optimizer = weakref.ref(optimizer)
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.allreduced_bytes = 0
        self.pushed_bytes = 0

    @property
    def optimizer(self):
        return self._optimizer()


# Annotations as DDP checks them (register_comm_hook compares the objects, not their text).
def muon_comm_hook(state: MuonCommHookState,
                   bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The communication hook. Muon parameters of ``state.optimizer`` in the bucket: their local
    gradient goes to the server (``OffloadMuon._on_ddp_grad``); the bucket's other gradients
    are divided by the world size and all-reduced. Returns the bucket buffer (Muon gradients
    left as they were: step() drops them) once the all-reduce is done."""
    opt = state.optimizer
    buf = bucket.buffer()
    rest = []
    for p, g in zip(bucket.parameters(), bucket.gradients()):
        if opt is not None and opt._on_ddp_grad(p, g):
            state.pushed_bytes += g.numel() * g.element_size()
        else:
            rest.append(g)
    if not rest:
        done = torch.futures.Future()
        done.set_result(buf)
        return done
    whole = len(rest) == len(bucket.gradients())
    flat = buf if whole else torch.cat([g.reshape(-1) for g in rest])
    flat.div_(state.world_size)
    state.allreduced_bytes += flat.numel() * flat.element_size()
    fut = dist.all_reduce(flat, group=state.process_group, async_op=True).get_future()

    def scatter(f):
        if not whole:
            pos = 0
            for g in rest:
                g.copy_(flat[pos:pos + g.numel()].view(g.shape))
                pos += g.numel()
        return buf

    return fut.then(scatter)
