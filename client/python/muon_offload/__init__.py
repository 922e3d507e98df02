"""muon_offload: Python client of the muon-offload server (ctypes over libmuon_offload_client.so).

- :class:`muon_offload.Muon` — a drop-in for torch.optim.Muon computed by muon-offloadd
  (:mod:`muon_offload.muon`), over :class:`muon_offload.MuonConfig` (:mod:`muon_offload.config`),
  the one configuration object of every optimizer here.
- :class:`muon_offload.Client` — the C ABI as Python (register, push, commit, wait_update, ...).
- :mod:`muon_offload.torch` — :class:`~muon_offload.torch.OffloadMuon`, a torch.optim.Optimizer
  whose Muon math runs in muon-offloadd, and :class:`~muon_offload.torch.InProcessMuon`, the same
  optimizer computed in process with the same C++ kernels (imported lazily: this package itself
  does not need torch).

The library is found through ``MUON_OFFLOAD_LIB`` or ``<repo>/build/client/``; servers through
``MUON_OFFLOAD_SERVERS`` (comma-separated socket paths, set by scripts/muon-offload-launch).
"""
from ._native import (BackendUnavailable, ConnectionLost, DeviceError, InvalidArgument,
                      MuonOffloadError, NonFiniteGradient, PeerLost, ServerError, Timeout,
                      has_cuda, library_path)
from .client import Client, local_update
from .config import MuonConfig

__all__ = [
    "Muon", "MuonConfig", "Client", "local_update", "library_path", "MuonOffloadError", "InvalidArgument",
    "ServerError", "ConnectionLost", "PeerLost", "NonFiniteGradient", "Timeout", "DeviceError",
    "BackendUnavailable", "has_cuda",
]
__version__ = "0.1.0"


def __getattr__(name):
    # Muon needs torch; the rest of the package does not, so it is imported on first use.
    if name == "Muon":
        from .muon import Muon
        return Muon
    raise AttributeError(f"module 'muon_offload' has no attribute {name!r}")
