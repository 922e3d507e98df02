"""The in-process reference: :class:`InProcessMuon`, the optimizer of
:class:`~muon_offload.offload.OffloadMuon` with the Muon update computed in this process by the
server's own C++ kernels (``muon_local_update``)."""
from __future__ import annotations

import time
from typing import Callable, Optional, Tuple

import torch

from ._native import InvalidArgument, NonFiniteGradient
from .base import MuonOptimizerBase, base_keywords, muon_config
from .client import local_update
from .config import MuonConfig

__all__ = ["InProcessMuon"]

# OffloadMuon's arguments that InProcessMuon accepts and ignores, so the classes swap freely.
_OFFLOAD_ONLY = {"overlap", "servers", "assign", "grad_dtype", "update_dtype",
                 "connect_timeout_s", "timeout_s", "resume_from_server", "data_plane"}


class InProcessMuon(MuonOptimizerBase):
    """The reference: the same optimizer as :class:`~muon_offload.offload.OffloadMuon` (same
    arguments, routing, torch.optim.AdamW part, apply rule, state_dict format), with the Muon
    update computed in this process by the server's own C++ kernels (CPU backend, ``threads``
    OpenBLAS threads). With the server's thread count (``muon-offloadd --threads``, 1 in the
    demo) the updates, and so the whole training run, are bitwise those of OffloadMuon. Momentum
    lives in ``state[p]["momentum_buffer"]`` (fp32, matrix shape). Under torch.distributed,
    gradients are averaged as grad/world + one all-reduce (sum) — the server's reduction with 2
    ranks — in both modes; under DDP (``ddp=`` or :meth:`attach_ddp`) DDP averages them.
    ``no_commit()`` is accepted and does nothing (gradients accumulate in .grad).

    The kernels set the OpenBLAS thread count of the whole process (``threads``); where torch
    runs on the same OpenBLAS, that count applies to torch's matmuls too — set
    ``OPENBLAS_NUM_THREADS`` to the same value for reproducible runs."""

    def __init__(self, params_or_groups, *muon_args, config: Optional[MuonConfig] = None,
                 threads: int = 1, adamw_lr: float = 3e-4,
                 adamw_betas: Tuple[float, float] = (0.9, 0.95), adamw_eps: float = 1e-8,
                 adamw_weight_decay: Optional[float] = None, mode: str = "server_reduce",
                 names=None, route: Optional[Callable] = None, ddp=None, process_group=None,
                 prefix: str = "", **keywords):
        for k in [k for k in keywords if k in _OFFLOAD_ONLY]:
            del keywords[k]  # accepted so that the two classes swap freely
        config = muon_config(config, muon_args, keywords, type(self).__name__)
        self.threads = int(threads)
        super().__init__(params_or_groups, config=config, **base_keywords(locals()))
        if ddp is not None:
            self.attach_ddp(ddp)

    def momentum_buffer(self, p: torch.Tensor) -> torch.Tensor:
        """A copy of the momentum of Muon parameter ``p`` (fp32, the matrix shape)."""
        m = self._meta.get(p)
        if m is None:
            raise InvalidArgument("momentum_buffer(): not a Muon parameter of this optimizer")
        st = self.state.get(p) or {}
        buf = st.get("momentum_buffer")
        return (torch.zeros(m.shape, dtype=torch.float32) if buf is None
                else buf.detach().to("cpu", torch.float32).reshape(m.shape).clone())

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        t0 = time.perf_counter()
        self._check_fixed_keys()
        self._agree_on_grads([p for _, p in self._muon_items()] + self._adamw_params())
        items = [(g, p) for g, p in self._muon_items() if p.grad is not None]
        for _, p in items:
            self._refuse_unsupported_grad(self._meta[p].name, p.grad)
        if self._ddp is None:
            self._average_([p.grad for _, p in items])
        errors = []
        updates = []
        for g, p in items:
            m = self._meta[p]
            st = self.state[p]
            st.setdefault("step", 0)
            if "momentum_buffer" not in st:
                st["momentum_buffer"] = torch.zeros(m.shape, dtype=torch.float32)
            gm = p.grad.reshape(m.shape).to("cpu", torch.float32).contiguous()
            mom = st["momentum_buffer"]
            if not mom.is_contiguous() or mom.dtype != torch.float32:
                mom = st["momentum_buffer"] = mom.to(torch.float32).contiguous()
            upd = torch.empty(m.shape, dtype=torch.float32)
            try:
                local_update(m.name, m.shape, m.options, gm, mom, upd, self.threads)
            except NonFiniteGradient as e:
                errors.append(e)
                st["step"] += 1
                continue
            st["step"] += 1
            updates.append((g, p, upd))
        self._adamw_step()
        for g, p, upd in updates:
            self._apply(p, upd, g)
        self.last_hook_seconds = 0.0
        self.last_step_seconds = time.perf_counter() - t0
        self._raise_nonfinite(errors)
        return loss
