"""muon_offload: Python client of the muon-offload server (ctypes over libmuon_offload_client.so).

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

__all__ = [
    "Client", "local_update", "library_path", "MuonOffloadError", "InvalidArgument",
    "ServerError", "ConnectionLost", "PeerLost", "NonFiniteGradient", "Timeout", "DeviceError",
    "BackendUnavailable", "has_cuda",
]
__version__ = "0.1.0"
