"""muon_offload: Python client of the muon-offload server (ctypes over libmuon_offload_client.so).

- :class:`muon_offload.Muon` — a drop-in for torch.optim.Muon computed by muon-offloadd
  (:mod:`muon_offload.muon`).
- :class:`muon_offload.OffloadMuon` — Muon for the matrices on the servers, torch.optim.AdamW for
  the rest, hooks that push during backward, DDP, checkpoints (:mod:`muon_offload.offload`);
  :class:`muon_offload.InProcessMuon` — the same optimizer computed in process by the same C++
  kernels (:mod:`muon_offload.in_process`). Both over :mod:`muon_offload.base` (the param groups,
  AdamW, the apply rule), :mod:`muon_offload.routing` (what goes to Muon) and
  :mod:`muon_offload.muon_param` (what a rank holds of a parameter).
- :class:`muon_offload.MuonConfig` — the one configuration object of the Muon math
  (:mod:`muon_offload.config`).
- :mod:`muon_offload.ddp` — the DistributedDataParallel communication hook;
  :mod:`muon_offload.plan` — the plan reader (also used by scripts/muon-offload-launch).
- :class:`muon_offload.Client` — the C ABI as Python (register, push, commit, wait_update, ...).

The torch-based classes are imported on first use: the rest of the package does not need torch.
The library is found through ``MUON_OFFLOAD_LIB`` or ``<repo>/build/client/``; servers through
``MUON_OFFLOAD_SERVERS`` (comma-separated socket paths, set by scripts/muon-offload-launch).
"""
from ._native import has_cuda, library_path
from .errors import (BackendUnavailable, ConnectionLost, DeviceError, InvalidArgument,
                     MuonOffloadError, NonFiniteGradient, PeerLost, ServerError, StepMismatch,
                     Timeout)
from .client import Client, local_update
from .config import MuonConfig

__all__ = [
    "Muon", "OffloadMuon", "InProcessMuon", "MuonConfig", "Client", "local_update",
    "library_path", "MuonOffloadError", "InvalidArgument", "ServerError", "ConnectionLost",
    "PeerLost", "NonFiniteGradient", "StepMismatch", "Timeout", "DeviceError", "BackendUnavailable", "has_cuda",
]
__version__ = "0.1.0"

_LAZY = {"Muon": "muon", "OffloadMuon": "offload", "InProcessMuon": "in_process"}


def __getattr__(name):
    # These need torch; the rest of the package does not, so they are imported on first use.
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'muon_offload' has no attribute {name!r}")
