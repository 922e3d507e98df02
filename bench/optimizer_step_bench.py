#!/usr/bin/env python3
"""The optimizer step a trainer sees, on GPT-2 small's parameters: OffloadMuon (muon-offloadd)
vs torch.optim.Muon (+ torch.optim.AdamW for the rest) vs torch.optim.AdamW alone, measured in
one run, interleaved, and reported as ratios (bench/README.md has the table and the command).

    scripts/muon-offload-launch --cpu --threads 2 -- $(scripts/venv-python) \\
        bench/optimizer_step_bench.py [--layers 12] [--steps 5] [--threads 2]

Parameters: GPT-2 small (124 M: wte 50257x768, wpe 1024x768, 12 blocks of c_attn 2304x768,
attn c_proj 768x768, mlp c_fc 3072x768, mlp c_proj 768x3072 with biases and two LayerNorms,
ln_f), as nn.Linear stores them; Muon takes the 48 block matrices (the routing of
muon_offload.routing.default_route, for all three), AdamW the rest. Gradients: fixed random
tensors set as .grad before each step (no backward, so nothing overlaps the step: for
OffloadMuon the figure is the whole round trip, pushes included, not the tail a trainer sees when
the hooks push during backward). Figure per optimizer: the median over --steps timed steps of the
wall time of step() (after one warm-up step); the optimizers take turns step by step so that they
share the machine's load. Prints one line per optimizer and the ratios, and --json writes them.

torch.optim.Muon runs Newton-Schulz in bfloat16. On a GPU that is its fast path; on a CPU without
bf16 matrix units (this project's 2-core machine: 0.36 GFLOP/s in bf16 against 23 in fp32, one
thread) one GPT-2 small step would take hours. So by default its Newton-Schulz runs in fp32 here
(torch's own function with bfloat16 replaced by float32, as the side-by-side tests do), the fair
CPU anchor; --torch-bf16 runs it unmodified.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import statistics
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "client" / "python"))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402


def gpt2_small(layers: int) -> nn.Module:
    """GPT-2 small's parameters (names as in nanoGPT / Hugging Face), no forward."""
    d, vocab, ctx = 768, 50257, 1024
    m = nn.Module()
    m.wte = nn.Embedding(vocab, d)
    m.wpe = nn.Embedding(ctx, d)
    m.h = nn.ModuleList()
    for _ in range(layers):
        b = nn.Module()
        b.ln_1, b.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        b.attn = nn.Module()
        b.attn.c_attn, b.attn.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        b.mlp = nn.Module()
        b.mlp.c_fc, b.mlp.c_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        m.h.append(b)
    m.ln_f = nn.LayerNorm(d)
    return m


class TorchMuonAdamW:
    """torch.optim.Muon on the Muon matrices and torch.optim.AdamW on the rest."""

    def __init__(self, model, muon_names, lr, adamw_lr):
        named = dict(model.named_parameters())
        self.muon = torch.optim.Muon([named[n] for n in muon_names], lr=lr)
        self.adamw = torch.optim.AdamW([p for n, p in named.items() if n not in muon_names],
                                       lr=adamw_lr)

    def step(self):
        self.muon.step()
        self.adamw.step()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=12, help="GPT-2 small blocks (12)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per optimizer")
    ap.add_argument("--threads", type=int, default=2, help="torch threads in this process")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--torch-bf16", action="store_true",
                    help="torch.optim.Muon unmodified (bf16 Newton-Schulz; slow on most CPUs)")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    from muon_offload.parity import torch_muon_in_fp32
    with contextlib.nullcontext() if a.torch_bf16 else torch_muon_in_fp32():
        return measure(a)


def measure(a) -> int:
    """The run of main(), its arguments parsed."""
    from muon_offload import OffloadMuon
    from muon_offload.routing import default_route

    models = {k: gpt2_small(a.layers) for k in ("offload", "torch_muon", "adamw")}
    for m in models.values():
        m.load_state_dict(models["offload"].state_dict())
    named = list(models["offload"].named_parameters())
    muon_names = [n for n, p in named if default_route(n, p) == "muon"]
    gen = torch.Generator().manual_seed(0)
    grads = {n: torch.randn(p.shape, generator=gen) * 1e-3 for n, p in named}
    opts = {
        "offload": OffloadMuon(models["offload"].named_parameters(), lr=0.02, adamw_lr=3e-4),
        "torch_muon": TorchMuonAdamW(models["torch_muon"], muon_names, 0.02, 3e-4),
        "adamw": torch.optim.AdamW(models["adamw"].parameters(), lr=3e-4),
    }
    times = {k: [] for k in opts}
    for it in range(a.steps + 1):  # the first round warms up (buffers, registration, threads)
        for k, opt in opts.items():
            for n, p in models[k].named_parameters():
                p.grad = grads[n].clone()
            t0 = time.perf_counter()
            opt.step()
            dt = time.perf_counter() - t0
            if it > 0:
                times[k].append(dt)
    opts["offload"].close()
    med = {k: statistics.median(v) for k, v in times.items()}
    muon_numel = sum(p.numel() for n, p in named if n in muon_names)
    print(f"GPT-2 small, {a.layers} blocks: {len(muon_names)} Muon matrices "
          f"({muon_numel / 1e6:.1f} M), {len(named) - len(muon_names)} AdamW tensors "
          f"({(sum(p.numel() for _, p in named) - muon_numel) / 1e6:.1f} M); torch "
          f"{torch.__version__}, {a.threads} threads; median of {a.steps} steps; torch.optim.Muon's "
          f"Newton-Schulz in {'bf16' if a.torch_bf16 else 'fp32'}")
    for k in opts:
        print(f"  {k:11s} step() {med[k] * 1e3:9.1f} ms")
    ratios = {"offload/torch_muon": med["offload"] / med["torch_muon"],
              "offload/adamw": med["offload"] / med["adamw"],
              "torch_muon/adamw": med["torch_muon"] / med["adamw"]}
    for k, v in ratios.items():
        print(f"  {k:18s} {v:7.2f}")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(
            {"layers": a.layers, "steps": a.steps, "threads": a.threads,
             "torch": torch.__version__, "torch_ns": "bf16" if a.torch_bf16 else "fp32",
             "servers": os.environ.get("MUON_OFFLOAD_SERVERS"),
             "median_s": med, "ratios": ratios, "times_s": times}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
