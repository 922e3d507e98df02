"""The server's updates against a pure-PyTorch Muon written here from the published formula, in
float64 (Keller Jordan, "Muon: An optimizer for hidden layers in neural networks", 2024;
modded-nanogpt zeropower_via_newtonschulz5; momentum convention "sum" of Moonlight, Liu et al.
2025):

    M <- mu*M + G;   X = G + mu*M (Nesterov)
    X <- X / (||X||_F + 1e-7), transposed when rows > cols
    5 x { A = X X^T;  B = b A + c A A;  X = a X + B X },  (a, b, c) = (3.4445, -4.7750, 2.0315)
    U = max(1, rows/cols)^0.5 * X            (scale "keller"; per matrix of an expert stack, per
                                              row block of a fused QKV)
    W <- W*(1 - lr*wd) - lr*U
"""
import torch
import torch.nn as nn

from muon_offload.torch import OffloadMuon

KELLER = (3.4445, -4.7750, 2.0315)
MU = 0.95


def ns_keller(g: torch.Tensor) -> torch.Tensor:
    x = g.to(torch.float64)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / (torch.linalg.norm(x) + 1e-7)
    a, b, c = KELLER
    for _ in range(5):
        A = x @ x.T
        B = b * A + c * (A @ A)
        x = a * x + B @ x
    if tall:
        x = x.T
    return x * max(1.0, g.shape[0] / g.shape[1]) ** 0.5


def reference_update(g: torch.Tensor, row_splits=None) -> torch.Tensor:
    """U for a [r, c] matrix (row blocks separately) or a [b, r, c] stack (each matrix)."""
    if g.ndim == 3:
        return torch.stack([reference_update(m) for m in g])
    if row_splits:
        return torch.cat([ns_keller(blk) for blk in torch.split(g, row_splits, dim=0)], dim=0)
    return ns_keller(g)


class Recording(OffloadMuon):
    """Records the update of each Muon parameter as step() applies it."""

    def __init__(self, *a, **k):
        self.updates = {}
        super().__init__(*a, **k)

    def _apply(self, p, update, group):
        self.updates[id(p)] = update.detach().clone().view(self._meta[p].shape)
        super()._apply(p, update, group)


def test_server_update_matches_the_published_formula(server):
    torch.manual_seed(7)
    params = {
        "wide.weight": nn.Parameter(torch.randn(16, 48) * 0.1),
        "tall.weight": nn.Parameter(torch.randn(48, 16) * 0.1),
        "conv.weight": nn.Parameter(torch.randn(8, 4, 3, 3) * 0.1),     # -> (8, 36)
        "moe.experts": nn.Parameter(torch.randn(3, 12, 20) * 0.1),      # 3 x (12, 20)
        "attn.qkv.weight": nn.Parameter(torch.randn(24, 8) * 0.1),      # blocks of 8 rows
    }
    splits = {"attn.qkv.weight": [8, 8, 8]}
    lr, wd = 0.05, 0.1
    # The published formula's choices: momentum "sum", eps added, the keller scale applied by
    # the server (the defaults are torch.optim.Muon's: ema, scale invariant, adjust_lr_fn).
    opt = Recording(list(params.items()), servers=[server.socket], lr=lr, momentum=MU,
                    weight_decay=wd, row_splits=splits, momentum_convention="sum",
                    eps_mode="add", scale="keller")
    assert all(kind == "muon" for kind, _ in opt.routing.values())
    shapes = {n: s for n, (_, s) in opt.routing.items()}
    momentum = {n: torch.zeros(shapes[n], dtype=torch.float64) for n in params}
    worst = 0.0
    for step in range(4):
        gen = torch.Generator().manual_seed(100 + step)
        targets = {n: torch.randn(p.shape, generator=gen) for n, p in params.items()}
        before = {n: p.detach().clone() for n, p in params.items()}
        opt.zero_grad()
        loss = sum(((p - targets[n]) ** 2).sum() / 2 for n, p in params.items())
        loss.backward()            # gradients are pushed by the hooks: G = W - target
        opt.step()
        for n, p in params.items():
            g = (before[n] - targets[n]).reshape(shapes[n]).to(torch.float64)
            momentum[n] = MU * momentum[n] + g
            x = g + MU * momentum[n]
            u_ref = reference_update(x, splits.get(n))
            u = opt.updates[id(p)].to(torch.float64)
            rel = (torch.linalg.norm(u - u_ref) / torch.linalg.norm(u_ref)).item()
            worst = max(worst, rel)
            assert rel < 1e-5, f"{n} step {step}: relative error {rel:.2e}"
            # and the apply rule, W <- W*(1 - lr*wd) - lr*U
            w_ref = before[n] * (1 - lr * wd) - lr * opt.updates[id(p)].view(p.shape)
            assert torch.allclose(p.detach(), w_ref, rtol=0, atol=1e-7), n
    print(f"worst relative error against the float64 reference: {worst:.2e}")
    opt.close()
