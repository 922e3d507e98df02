"""``muon_offload.Muon``: a drop-in for ``torch.optim.Muon`` whose momentum and Newton-Schulz
run in muon-offloadd.

Same constructor, defaults, param-group keys and state_dict layout as torch.optim.Muon (torch
2.9+): swap ``torch.optim.Muon(model_matrices, ...)`` for ``muon_offload.Muon(...)``. The
momentum is bitwise torch's (its lerp, its rounding of ``1 - momentum``), the Newton-Schulz
result differs by the precision the server computes in (see :mod:`muon_offload.config`), and the
normalization is scale invariant by default (``eps_mode="torch"`` gives torch's
``norm().clamp(min=eps)``). Servers come from ``MUON_OFFLOAD_SERVERS`` (set by
scripts/muon-offload-launch) or ``servers=``; every other keyword of
:class:`~muon_offload.torch.OffloadMuon` is accepted too.
"""
from __future__ import annotations

from typing import Optional

import torch

from .config import MuonConfig
from .offload import OffloadMuon


class Muon(OffloadMuon):
    """torch.optim.Muon computed by muon-offloadd: every parameter must be 2-D (ValueError
    otherwise, as torch); biases, embeddings and the head go to another optimizer (or use
    :class:`~muon_offload.torch.OffloadMuon`, which routes them to AdamW itself).

    Args: torch.optim.Muon's (``lr``, ``weight_decay``, ``momentum``, ``nesterov``,
    ``ns_coefficients``, ``eps``, ``ns_steps``, ``adjust_lr_fn``; defaults from
    :class:`~muon_offload.config.MuonConfig`, which are torch's), then keyword-only the extra
    fields of MuonConfig and OffloadMuon's connection keywords (``servers``, ``timeout_s``,
    ``prefix``, ``resume_from_server``, ...).

    Gradients go to the server during backward (``overlap=True``): to clip them, unscale them
    with a GradScaler or skip a step() after backward, as with torch, pass ``overlap=False``
    (they then stay in ``.grad`` until step() pushes them).

    ``state_dict()``: ``state[i]["momentum_buffer"]`` (fp32, the parameter's shape, fetched from
    the server) and ``state[i]["step"]``, ``param_groups`` with torch's keys; a torch.optim.Muon
    checkpoint loads into it (its momentum goes to the server) and its checkpoint loads into
    torch.optim.Muon. ``momentum_buffer(p)`` reads one parameter's server-held momentum.
    """

    def __init__(self, params, lr: float = MuonConfig.lr,
                 weight_decay: float = MuonConfig.weight_decay,
                 momentum: float = MuonConfig.momentum, nesterov: bool = MuonConfig.nesterov,
                 ns_coefficients=MuonConfig.ns_coefficients, eps: float = MuonConfig.eps,
                 ns_steps: int = MuonConfig.ns_steps,
                 adjust_lr_fn: Optional[str] = MuonConfig.adjust_lr_fn, **keywords):
        if isinstance(params, torch.Tensor):
            raise TypeError("params argument given to the optimizer should be an iterable of "
                            "Tensors or dicts, but got a Tensor")
        items = list(params)
        groups = items if items and all(isinstance(g, dict) for g in items) else \
            [{"params": items}]
        checked = []
        for g in groups:
            g = dict(g)
            ps = g["params"]
            ps = [ps] if isinstance(ps, torch.Tensor) else list(ps)
            for item in ps:
                t = item[1] if isinstance(item, tuple) else item
                if isinstance(t, torch.Tensor) and t.ndim != 2:
                    raise ValueError("Muon only supports 2D parameters whereas we found a "
                                     f"parameter with size: {t.size()}")
            g["params"] = ps
            g["use_muon"] = True
            checked.append(g)
        super().__init__(checked, lr=lr, weight_decay=weight_decay, momentum=momentum,
                         nesterov=nesterov, ns_coefficients=tuple(ns_coefficients), eps=eps,
                         ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn, **keywords)
