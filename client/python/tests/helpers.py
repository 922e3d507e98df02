"""A tiny model with every kind of tensor the optimizer routes, and a deterministic loop."""
import socket

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 16


class TinyNet(nn.Module):
    """embed (AdamW), conv 4x3x2x2 (Muon as 4x12), norm (AdamW), fc1 24x12 / fc2 12x24 (Muon),
    experts 3x12x12 (Muon, a batch of 3), head (AdamW), biases (AdamW)."""

    def __init__(self, seed: int = 0):
        super().__init__()
        g = torch.manual_seed(seed)
        self.embed = nn.Embedding(VOCAB, 12)
        self.conv = nn.Conv2d(3, 4, 2)
        self.norm = nn.LayerNorm(12)
        self.fc1 = nn.Linear(12, 24)
        self.fc2 = nn.Linear(24, 12)
        self.experts = nn.Parameter(torch.randn(3, 12, 12, generator=g) * 0.2)
        self.head = nn.Linear(12, VOCAB, bias=False)

    def forward(self, idx, targets):
        b, t = idx.shape
        h = self.embed(idx)
        c = self.conv(h.reshape(b * t, 3, 2, 2)).reshape(b, t, 4)
        h = self.norm(h + c.repeat(1, 1, 3))
        h = h + self.fc2(F.gelu(self.fc1(h)))
        h = h + torch.einsum("btd,edf->btf", h, self.experts) / 3
        return F.cross_entropy(self.head(h).reshape(-1, VOCAB), targets.reshape(-1))


def batch(step: int, rank: int = 0, n: int = 4, t: int = 6):
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randint(VOCAB, (n, t), generator=g)
    return x, (x * 3 + 1) % VOCAB


def train(model, opt, steps, start=0, rank=0, sched=None, micro=1, forward=None, before=None,
          between=None):
    """`steps` optimizer steps from step `start`; `micro` micro-batches per step (gradient
    accumulation through no_commit). `forward` runs the model (default: `model`, e.g. its DDP
    wrapper instead); `before(step)` runs before each step's first forward, `between(step)`
    between its last backward and step() (clipping). Returns the losses."""
    forward = forward or model
    losses = []
    for s in range(start, start + steps):
        if before is not None:
            before(s)
        opt.zero_grad(set_to_none=True)
        for m in range(micro):
            x, y = batch(s * micro + m, rank)
            last = m + 1 == micro
            ctx = opt.no_commit() if not last else _null()
            with ctx:
                loss = forward(x, y) / micro
                loss.backward()
            losses.append(loss.item())
        if between is not None:
            between(s)
        opt.step()
        if sched is not None:
            sched.step()
    return losses


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def same_params(a, b) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def param_diff(a, b):
    return [n for (n, p), q in zip(a.named_parameters(), b.parameters()) if not torch.equal(p, q)]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for torch.distributed's tcp:// init)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
