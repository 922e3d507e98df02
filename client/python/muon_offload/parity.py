"""Parity checks against torch.optim.Muon: its Newton-Schulz in fp32.

torch.optim.Muon runs Newton-Schulz in bfloat16 (torch/optim/_muon.py,
``_zeropower_via_newtonschulz``). Against the server's fp32 iteration the parameters then differ
by bf16 rounding (1e-4 .. 3e-3 relative over 60 steps), which hides any other difference; and on a
CPU without bf16 matrix units bf16 GEMMs run ~60x slower than fp32 ones. ``torch_newton_schulz_fp32``
is torch's function with bfloat16 replaced by float32, so that the two differ only by BLAS
summation order (within 1e-5 relative over 60 steps, see tests/test_torch_muon.py);
``torch_muon_in_fp32()`` makes torch.optim.Muon use it while the context is open.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Tuple

import torch

__all__ = ["torch_newton_schulz_fp32", "torch_muon_in_fp32"]


def torch_newton_schulz_fp32(grad: torch.Tensor, ns_coefficients: Tuple[float, float, float],
                             ns_steps: int, eps: float, *_) -> torch.Tensor:
    """torch.optim.Muon's Newton-Schulz with its operations and order, in float32.

    grad: a 2-D tensor (r, c), any float dtype; returns float32 (r, c). The quintic
    X <- a X + (b A + c A^2) X with A = X X^T on the wide orientation (transposed when r > c),
    after X / max(||X||_F, eps) — torch's clamp, not the server's scale-invariant rule."""
    a, b, c = ns_coefficients
    x = grad.to(dtype=torch.float32, copy=True)
    if grad.size(0) > grad.size(1):
        x = x.T
    x.div_(x.norm().clamp(min=eps))
    for _ in range(ns_steps):
        gram = x @ x.T
        upd = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, upd, x, beta=a)
    if grad.size(0) > grad.size(1):
        x = x.T
    return x


@contextlib.contextmanager
def torch_muon_in_fp32() -> Iterator[None]:
    """While open, torch.optim.Muon runs :func:`torch_newton_schulz_fp32` (it looks the
    function up in torch.optim._muon at every step); restored on exit."""
    import torch.optim._muon as torch_muon
    saved = torch_muon._zeropower_via_newtonschulz
    torch_muon._zeropower_via_newtonschulz = torch_newton_schulz_fp32
    try:
        yield
    finally:
        torch_muon._zeropower_via_newtonschulz = saved
