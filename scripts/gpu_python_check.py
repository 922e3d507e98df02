#!/usr/bin/env python3
"""The Python path on the GPU (scripts/gpu_check.sh, stage python): OffloadMuon end to end with
CUDA parameters on the cuda_ipc data plane of a muon-offloadd --backend cuda, against the CPU
oracle (InProcessMuon: the server's C++ kernels on the CPU, fp32) fed the same gradients.

    scripts/gpu_python_check.py --bin-dir BUILD [--steps 3] [--require-gpu]

Each step, for every Muon matrix: rel = ||dW_gpu - dW_cpu||_F / ||dW_cpu||_F of the weight change
(dW = lr * update, plus the same weight decay on both), which must stay under 3e-2: the CUDA
backend runs Newton-Schulz in bf16 by default, and 3e-2 is the bf16 bound of the kernel tests
(tests/kernels/test_cuda_backend.cpp). The AdamW parameters (embedding, norms, head) run in torch
on both sides and must agree within 1e-4. Prints one line per parameter and step, then
"PYTHON GPU CHECK PASSED" (exit 0) or "... FAILED" (exit 1). Without a CUDA device: "SKIPPED"
and exit 0, or exit 1 with --require-gpu.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "client" / "python"))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

MUON_TOL = 3e-2
ADAMW_TOL = 1e-4


class Net(nn.Module):
    """Embedding (AdamW), two blocks of Linear layers in the shapes a small GPT has (Muon: square,
    wide, tall, a fused QKV with row splits), a norm and a head (AdamW)."""

    def __init__(self, vocab=96, d=256):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.fc = nn.Linear(d, 4 * d, bias=False)
        self.out = nn.Linear(4 * d, d, bias=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets):
        x = self.emb(idx)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        x = x + self.proj(torch.tanh(q) * k.sigmoid() + v)
        x = x + self.out(torch.nn.functional.gelu(self.fc(x)))
        logits = self.head(self.norm(x))
        return nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def start_server(bin_dir: pathlib.Path, socket: str, log: str):
    daemon = next(p for p in (bin_dir / "daemon" / "muon-offloadd", bin_dir / "muon-offloadd") if p.exists())
    cli = next(p for p in (bin_dir / "cli" / "muon-offload", bin_dir / "muon-offload") if p.exists())
    with open(log, "ab") as f:
        proc = subprocess.Popen([str(daemon), "--socket", socket, "--backend", "cuda",
                                 "--log-level", "warn"], stdout=f, stderr=f)
    r = subprocess.run([str(cli), "health", "--socket", socket, "--timeout-ms", "60000"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        proc.kill()
        raise SystemExit(f"muon-offloadd --backend cuda did not become healthy: {r.stderr}\n"
                         + pathlib.Path(log).read_text()[-3000:])
    return proc


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin-dir", required=True, type=pathlib.Path)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--require-gpu", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("SKIPPED: torch sees no CUDA device")
        return 1 if args.require_gpu else 0
    from muon_offload import has_cuda
    from muon_offload.torch import InProcessMuon, OffloadMuon
    if not has_cuda():
        print("FAILED: the client library was built without CUDA")
        return 1
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}; "
          f"client library {os.environ.get('MUON_OFFLOAD_LIB', '(default)')}")

    torch.manual_seed(0)
    gpu_net = Net().cuda()
    cpu_net = Net()
    cpu_net.load_state_dict({k: v.cpu() for k, v in gpu_net.state_dict().items()})
    kw = dict(lr=0.02, momentum=0.95, nesterov=True, weight_decay=0.01, adamw_lr=3e-3,
              row_splits={"qkv.weight": [256, 256, 256]})
    ok = True
    with tempfile.TemporaryDirectory(prefix="muon-gpu-py-") as tmp:
        sock = os.path.join(tmp, "s0.sock")
        server = start_server(args.bin_dir, sock, os.path.join(tmp, "server.log"))
        try:
            gpu_opt = OffloadMuon(gpu_net.named_parameters(), servers=[sock], data_plane="cuda_ipc", **kw)
            cpu_opt = InProcessMuon(cpu_net.named_parameters(), **kw)
            if not gpu_opt._device_io:
                print("FAILED: OffloadMuon did not take the device path for CUDA parameters")
                return 1
            g = torch.Generator().manual_seed(1)
            names = [n for n, _ in gpu_net.named_parameters()]
            for step in range(args.steps):
                x = torch.randint(96, (8, 32), generator=g)
                y = torch.randint(96, (8, 32), generator=g)
                before = {n: p.detach().cpu().clone() for n, p in cpu_net.named_parameters()}
                # The same gradients on both sides: computed once on the CPU copy, then copied to
                # the GPU model before its backward hooks would push them.
                gpu_opt.zero_grad(set_to_none=True)
                cpu_opt.zero_grad(set_to_none=True)
                cpu_net(x, y).backward()
                gpu_loss = gpu_net(x.cuda(), y.cuda())
                # Replace the GPU gradients by the CPU ones: a hook on each leaf's grad.
                cpu_grads = {n: p.grad.detach().clone() for n, p in cpu_net.named_parameters()}
                handles = [p.register_hook(lambda _g, n=n: cpu_grads[n].to(_g.device))
                           for n, p in gpu_net.named_parameters()]
                gpu_loss.backward()
                for h in handles:
                    h.remove()
                t0 = time.perf_counter()
                gpu_opt.step()
                torch.cuda.synchronize()
                t_gpu = time.perf_counter() - t0
                cpu_opt.step()
                for n, pg in gpu_net.named_parameters():
                    pc = dict(cpu_net.named_parameters())[n]
                    dg, dc = pg.detach().cpu() - before[n], pc.detach() - before[n]
                    err = rel(dg, dc)
                    muon = pg.ndim == 2 and n not in ("emb.weight", "head.weight")
                    tol = MUON_TOL if muon else ADAMW_TOL
                    good = err < tol and torch.isfinite(pg).all().item()
                    ok &= good
                    print(f"  step {step} {n:<12} {str(tuple(pg.shape)):<12} "
                          f"{'muon ' if muon else 'adamw'} rel {err:.2e} (< {tol:g}) "
                          f"{'ok' if good else 'FAILED'}")
                print(f"  step {step}: OffloadMuon.step {t_gpu * 1000:.1f} ms, "
                      f"{len(names)} parameters, pushed {gpu_opt.last_step_stats.get('bytes_pushed')} B")
            gpu_opt.close()
        finally:
            server.terminate()
            server.wait(timeout=30)
    print("PYTHON GPU CHECK " + ("PASSED" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
