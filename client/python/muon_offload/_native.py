"""ctypes bindings of the C ABIs in client/muon_client.h (libmuon_offload_client.so) and
client/muon_reference.h (libmuon_offload_reference.so, the in-process reference).

The client library is found through, in order:
  1. the environment variable ``MUON_OFFLOAD_LIB`` (path of the .so),
  2. ``<repo>/build/client/libmuon_offload_client.so`` (what ``scripts/test.sh`` and
     ``scripts/demo.sh`` build).
The reference library, loaded only by :func:`~muon_offload.local_update` and ``InProcessMuon``
(it brings OpenBLAS; the client library carries no BLAS, cuBLAS or CUDA runtime), through:
  1. ``MUON_OFFLOAD_REFERENCE_LIB`` (path of the .so),
  2. next to the client library (its folder, as the build and an install lay them out),
  3. ``<repo>/build/client/libmuon_offload_reference.so``.

Every C function returns 0 or a negative ``MUON_ERR_*`` code; :func:`check` turns it into the
exception of the failure's cause (``muon_last_error_code()``, an ErrorCode integer; the types are
in :mod:`muon_offload.errors`) carrying ``muon_last_error()`` (the message names the server,
parameter, step and rank involved). ctypes releases the GIL during each call, so pushes and waits
do not block other Python threads.
"""
from __future__ import annotations

import ctypes
import os
import pathlib
import threading

__all__ = [
    "MuonOffloadError", "InvalidArgument", "ServerError", "ConnectionLost", "PeerLost",
    "NonFiniteGradient", "StepMismatch", "Timeout", "DeviceError", "BackendUnavailable", "lib",
    "check", "library_path", "has_cuda", "reference_lib", "reference_library_path",
    "check_reference", "cuda_runtime", "default_socket_path",
]

from .errors import (MUON_ERR_UNAVAILABLE, BackendUnavailable, ConnectionLost, DeviceError,
                     InvalidArgument, MuonOffloadError, NonFiniteGradient, PeerLost, ServerError,
                     StepMismatch, Timeout, error_class)

_LIB_NAME = "libmuon_offload_client.so"


def _repo_root() -> pathlib.Path:
    # client/python/muon_offload/_native.py -> repository root
    return pathlib.Path(__file__).resolve().parents[3]


def library_path() -> str:
    """Path of libmuon_offload_client.so (see the module docstring for the search order)."""
    env = os.environ.get("MUON_OFFLOAD_LIB")
    if env:
        if not os.path.isfile(env):
            raise MuonOffloadError(f"MUON_OFFLOAD_LIB={env} does not exist")
        return env
    candidate = _repo_root() / "build" / "client" / _LIB_NAME
    if candidate.is_file():
        return str(candidate)
    raise MuonOffloadError(
        f"{_LIB_NAME} not found: set MUON_OFFLOAD_LIB to its path, or build it into "
        f"{_repo_root() / 'build'} with\n"
        f"  cmake -S {_repo_root()} -B {_repo_root() / 'build'} && "
        f"cmake --build {_repo_root() / 'build'} --target muon_offload_client "
        f"muon_offload_reference muon-offloadd muon-offload\n(scripts/demo.sh and scripts/test.sh "
        f"do this)")


_lib = None
_lib_lock = threading.Lock()

c_int64_p = ctypes.POINTER(ctypes.c_int64)
c_float_p = ctypes.POINTER(ctypes.c_float)


def _declare(lib: ctypes.CDLL) -> None:
    i, i64, vp, cp = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p, ctypes.c_char_p
    h = ctypes.c_void_p  # muon_client*
    sigs = {
        "muon_last_error": (cp, []),
        "muon_last_error_code": (i, []),
        "muon_last_error_param": (cp, []),
        "muon_last_error_step": (i64, []),
        "muon_last_error_rank": (i, []),
        "muon_error_code_name": (cp, [i]),
        "muon_default_socket_path": (cp, []),
        "muon_client_create": (i, [ctypes.POINTER(cp), i, i, i, cp, i64, i64,
                                   ctypes.POINTER(ctypes.c_void_p)]),
        "muon_client_create_ex": (i, [ctypes.POINTER(cp), i, i, i, cp, i64, i64, cp,
                                      ctypes.POINTER(ctypes.c_void_p)]),
        "muon_client_create_auth": (i, [ctypes.POINTER(cp), i, i, i, cp, i64, i64, cp, cp,
                                        ctypes.POINTER(ctypes.c_void_p)]),
        "muon_client_destroy": (None, [h]),
        "muon_client_set_job": (i, [h, cp, i]),
        "muon_client_has_cuda": (i, []),
        "muon_client_cuda_runtime": (cp, []),
        "muon_client_register": (i, [h, cp, c_int64_p, i, cp, cp, cp, c_int64_p, i, c_int64_p, i,
                                     i]),
        "muon_client_push": (i, [h, cp, i64, i64, vp, i64]),
        "muon_client_push_device": (i, [h, cp, i64, i64, vp, i64, vp]),
        "muon_client_push_packed": (i, [h, cp, i64, i64, vp, i64]),
        "muon_client_push_packed_device": (i, [h, cp, i64, i64, vp, i64, vp]),
        "muon_client_last_push_frames": (i, [h, c_int64_p]),
        "muon_client_push_stream": (i, [h, cp, ctypes.POINTER(ctypes.c_void_p)]),
        "muon_client_commit": (i, [h, cp, i64]),
        "muon_client_wait_update": (i, [h, cp, i64, vp, i64, ctypes.POINTER(i)]),
        "muon_client_wait_update_device": (i, [h, cp, i64, vp, i64, vp, ctypes.POINTER(i)]),
        "muon_client_update_ready": (i, [h, cp, i64]),
        "muon_client_update_state": (i, [h, cp, i64]),
        "muon_client_fetch_momentum": (i, [h, cp, vp, i64, c_int64_p]),
        "muon_client_fetch_momentum_after": (i, [h, cp, i64, vp, i64, c_int64_p]),
        "muon_client_load_momentum": (i, [h, cp, i64, vp, i64]),
        "muon_client_snapshot": (i, [h, i, cp]),
        "muon_client_lost_peer": (i, [h, ctypes.POINTER(i), cp, i64]),
        "muon_client_snapshot_config": (i, [h, i, cp, i64, c_int64_p, ctypes.POINTER(i)]),
        "muon_client_reconnect": (i, [h]),
        "muon_client_report_step": (i, [h, i64, ctypes.POINTER(ctypes.c_double), c_int64_p,
                                        ctypes.POINTER(i), cp, i64]),
    }
    _set_signatures(lib, sigs)


def _set_signatures(lib: ctypes.CDLL, sigs) -> None:
    for name, (res, args) in sigs.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args


def _declare_reference(lib: ctypes.CDLL) -> None:
    i, vp, cp = ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p
    _set_signatures(lib, {
        "muon_reference_last_error": (cp, []),
        "muon_reference_last_error_code": (i, []),
        "muon_local_update": (i, [cp, c_int64_p, i, cp, vp, vp, vp, i]),
    })


def _load(path: str, declare) -> ctypes.CDLL:
    try:
        loaded = ctypes.CDLL(path)
    except OSError as e:
        raise MuonOffloadError(f"cannot load {path}: {e}") from None
    declare(loaded)
    return loaded


def lib() -> ctypes.CDLL:
    """The loaded library (loaded on first use)."""
    global _lib
    with _lib_lock:
        if _lib is None:
            _lib = _load(library_path(), _declare)
        return _lib


_REFERENCE_NAME = "libmuon_offload_reference.so"
_reference = None


def reference_library_path() -> str:
    """Path of libmuon_offload_reference.so (see the module docstring for the search order).
    Raises MuonOffloadError naming the places looked at when it is in none of them."""
    env = os.environ.get("MUON_OFFLOAD_REFERENCE_LIB")
    if env:
        if not os.path.isfile(env):
            raise MuonOffloadError(f"MUON_OFFLOAD_REFERENCE_LIB={env} does not exist")
        return env
    looked = []
    try:
        looked.append(pathlib.Path(library_path()).resolve().parent / _REFERENCE_NAME)
    except MuonOffloadError:
        pass  # no client library either: the build folder is the last place to look
    looked.append(_repo_root() / "build" / "client" / _REFERENCE_NAME)
    for candidate in looked:
        if candidate.is_file():
            return str(candidate)
    raise MuonOffloadError(
        f"{_REFERENCE_NAME} (the in-process reference of local_update and InProcessMuon) not "
        f"found in {', '.join(str(p.parent) for p in looked)}: set MUON_OFFLOAD_REFERENCE_LIB to "
        f"its path, or build it (cmake --build build --target muon_offload_reference)")


def reference_lib() -> ctypes.CDLL:
    """The loaded reference library (loaded on first use)."""
    global _reference
    with _lib_lock:
        if _reference is None:
            _reference = _load(reference_library_path(), _declare_reference)
        return _reference


def check_reference(rc: int, what: str = "") -> int:
    """:func:`check` for calls into the reference library (which keeps its own last error)."""
    if rc >= 0:
        return rc
    ref = reference_lib()
    msg = ref.muon_reference_last_error().decode("utf-8", "replace")
    _raise(rc, f"{what}: {msg}" if what else msg, int(ref.muon_reference_last_error_code()))


def cuda_runtime() -> str:
    """The CUDA runtime the client library uses (loading it now): "libcudart.so.13 (already
    loaded)" when it shares the one in the process (PyTorch's), else the soname or path it
    loaded. Raises BackendUnavailable, with the reason, when there is none (no runtime found, or
    a library built without CUDA)."""
    origin = lib().muon_client_cuda_runtime().decode()
    if not origin:
        raise BackendUnavailable(last_error(), MUON_ERR_UNAVAILABLE)
    return origin


def default_socket_path() -> str:
    """The Unix socket a muon-offloadd started without ``--socket`` listens on, by the server's
    own rule (``$MUON_OFFLOAD_SOCKET``, else ``$XDG_RUNTIME_DIR/muon-offload/muon-offloadd.sock``,
    else ``/tmp/muon-offload-<uid>/muon-offloadd.sock``), from this process's environment."""
    return lib().muon_default_socket_path().decode()


def has_cuda() -> bool:
    """True when the loaded library was built with CUDA (device tensors and data plane
    ``cuda_ipc`` can work; whether a GPU is usable is another matter)."""
    return bool(lib().muon_client_has_cuda())


def last_error() -> str:
    return lib().muon_last_error().decode("utf-8", "replace")


def check(rc: int, what: str = "") -> int:
    """Returns rc when >= 0; raises the exception of the failure's cause otherwise
    (:func:`muon_offload.errors.error_class` of ``muon_last_error_code()``)."""
    if rc >= 0:
        return rc
    loaded = lib()
    msg = last_error() or f"error code {rc}"
    _raise(rc, f"{what}: {msg}" if what else msg, int(loaded.muon_last_error_code()),
           param=loaded.muon_last_error_param().decode("utf-8", "replace"),
           step=int(loaded.muon_last_error_step()), rank=int(loaded.muon_last_error_rank()))


def _raise(rc: int, msg: str, cause: int, param: str = "", step: int = -1, rank: int = -1):
    """Raises the exception of C return code ``rc`` with cause ``cause`` (an ErrorCode integer,
    named through the client library's muon_error_code_name) and what a server's error names
    (its parameter, step and rank)."""
    name = ""
    if cause:
        try:
            raw = lib().muon_error_code_name(cause)
            name = raw.decode() if raw else ""
        except MuonOffloadError:
            pass  # no client library to name it: the return code decides
    raise error_class(rc, name)(msg, rc, cause, name, param, step, rank)


def int64_array(values) -> "ctypes.Array":
    values = [int(v) for v in values]
    return (ctypes.c_int64 * max(1, len(values)))(*values)
