"""The PyTorch optimizers, for ``from muon_offload.torch import ...``: :class:`OffloadMuon`
(:mod:`muon_offload.offload`), :class:`InProcessMuon` (:mod:`muon_offload.in_process`),
:func:`default_route` (:mod:`muon_offload.routing`). The drop-in for torch.optim.Muon is
:class:`muon_offload.Muon` (:mod:`muon_offload.muon`)."""
from ._native import MuonOffloadError
from .in_process import InProcessMuon
from .offload import OffloadMuon
from .routing import default_route

__all__ = ["OffloadMuon", "InProcessMuon", "default_route", "MuonOffloadError"]
