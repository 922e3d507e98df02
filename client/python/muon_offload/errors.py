"""The exceptions of muon_offload, chosen by the error's cause code, not by its message text.

Every failure of the C library carries two numbers: the C ABI's return code (``MUON_ERR_*``,
``code``) and the cause, an ``ErrorCode`` integer (core/error_code.hpp, stable across versions,
``error_code``; its wire name ``error_name``). The server sends its cause with every error (as
the integer and its name), the client library sets its own causes (``connection_lost``,
``invalid_argument``, ...); :func:`error_class` picks the exception type from the cause, so a
caller tells a refused parameter from a lost peer or a non-finite gradient by type::

    try:
        opt.step()
    except muon_offload.NonFiniteGradient as e:   # e.error_name == "non_finite"
        ...

The causes and their types (:data:`CAUSE_TYPES`): ``invalid_argument`` -> InvalidArgument;
``peer_lost`` -> PeerLost; ``timeout`` -> Timeout; ``non_finite`` -> NonFiniteGradient;
``step_mismatch`` -> StepMismatch; ``connection_lost`` -> ConnectionLost; ``device`` ->
DeviceError; ``unavailable`` -> BackendUnavailable; ``internal`` -> MuonOffloadError; every other
server cause (``bad_request``, ``unsupported``, ``unauthorized``, ``shutdown``, ...) ->
ServerError. An unknown cause (a newer server) falls back to the return code's type.
"""
from __future__ import annotations

from typing import Dict, Type

__all__ = [
    "MuonOffloadError", "InvalidArgument", "ServerError", "ConnectionLost", "PeerLost",
    "NonFiniteGradient", "StepMismatch", "Timeout", "DeviceError", "BackendUnavailable",
    "error_class", "CAUSE_TYPES", "RETURN_CODE_TYPES",
]

# The C ABI's return codes (client/muon_client.h).
MUON_OK = 0
MUON_ERR_INVALID = -1
MUON_ERR_SERVER = -2
MUON_ERR_CONNECTION = -3
MUON_ERR_TIMEOUT = -4
MUON_ERR_NONFINITE = -5
MUON_ERR_PEER_LOST = -6
MUON_ERR_INTERNAL = -7
MUON_ERR_DEVICE = -8
MUON_ERR_UNAVAILABLE = -9


class MuonOffloadError(RuntimeError):
    """Base of every error raised by muon_offload.

    Attributes: ``code`` the C ABI's MUON_ERR_* return code; ``error_code`` the cause's
    ErrorCode integer and ``error_name`` its name ("peer_lost"); 0 and "" for an error the
    Python package raised itself (a bad argument it checked before calling the library).
    ``param``, ``step`` and ``rank``: what a server's error names (the parameter, the step, a
    rank), "" and -1 where it names none or the error is not the server's."""

    def __init__(self, message: str, code: int = MUON_ERR_INTERNAL, error_code: int = 0,
                 error_name: str = "", param: str = "", step: int = -1, rank: int = -1):
        super().__init__(message)
        self.code = code
        self.error_code = error_code
        self.error_name = error_name
        self.param = param
        self.step = step
        self.rank = rank

    def with_message(self, message: str) -> "MuonOffloadError":
        """The same error type and codes with another message (to add advice when re-raising)."""
        return type(self)(message, self.code, self.error_code, self.error_name, self.param,
                          self.step, self.rank)


class InvalidArgument(MuonOffloadError, ValueError):
    """A bad argument: shape, name, range or option (cause ``invalid_argument``)."""


class ServerError(MuonOffloadError):
    """The server refused or failed a request, e.g. it refused a parameter. ``server_code`` is
    the server's cause name: "bad_request", "unauthorized" (a TCP hello without the token),
    "unsupported" (a data plane the server cannot serve), "shutdown", ... (= ``error_name``)."""

    @property
    def server_code(self) -> str:
        return self.error_name


class ConnectionLost(MuonOffloadError, ConnectionError):
    """The server is unreachable, or the connection to it was lost: the server died, was
    stopped, or restarted (cause ``connection_lost``)."""


class PeerLost(ServerError):
    """Another compute rank of the job (or a relay's owner) was lost mid-step; the message names
    it (cause ``peer_lost``)."""


class NonFiniteGradient(ServerError):
    """A gradient held NaN or Inf; the server refused the step of the named parameter and left
    its momentum untouched (cause ``non_finite``)."""


class StepMismatch(ServerError):
    """A step that does not follow the parameter's last applied step on the server: a step gap,
    or a step already applied (the server holds another run's state; cause ``step_mismatch``)."""


class Timeout(MuonOffloadError, TimeoutError):
    """A wait ran past its timeout, e.g. a rank never committed its gradient, or a server hangs
    (cause ``timeout``). The message ends with the knob that sets the wait and how to look."""

    HINT = ("The wait is OffloadMuon(timeout_s=...) (Client: op_timeout_ms). A rank that never "
            "commits or a server that hangs looks like this: see every server of the job with "
            "`muon-offload status --job NAME` (the launcher prints the name), or one with "
            "`muon-offload status --socket SOCKET`; raise the timeout only if steps are that slow.")

    #: For the server's own verdict on a parameter: its ranks did not all register it, or did
    #: not all push and commit a step, in time.
    STEP_HINT = ("The wait is the server's step timeout (muon-offloadd --step-timeout-ms, "
                 "default 30000): the ranks named never registered the parameter, or never "
                 "pushed and committed this step (stalled, stopped, or slower than that); see "
                 "every server of the job with `muon-offload status --job NAME`.")

    def __init__(self, message: str, code: int = MUON_ERR_TIMEOUT, error_code: int = 0,
                 error_name: str = "", param: str = "", step: int = -1, rank: int = -1):
        # The server's own verdict names its parameter (a registration's, or a step's): its
        # --step-timeout-ms; a wait of this client names none: the client's timeout.
        hint = self.STEP_HINT if error_name == "timeout" and param else self.HINT
        super().__init__(message if hint in message else f"{message}\n{hint}", code,
                         error_code, error_name, param, step, rank)


class DeviceError(MuonOffloadError):
    """A CUDA call failed, e.g. no usable GPU ("CUDA driver version is insufficient") (cause
    ``device``)."""


class BackendUnavailable(MuonOffloadError):
    """Not available in this build, e.g. the device data plane in a library built without CUDA
    (cause ``unavailable``)."""


#: Cause name -> exception type; server causes not listed here are ServerError.
CAUSE_TYPES: Dict[str, Type[MuonOffloadError]] = {
    "invalid_argument": InvalidArgument,
    "peer_lost": PeerLost,
    "timeout": Timeout,
    "non_finite": NonFiniteGradient,
    "step_mismatch": StepMismatch,
    "connection_lost": ConnectionLost,
    "device": DeviceError,
    "unavailable": BackendUnavailable,
    "internal": MuonOffloadError,
}

#: C ABI return code -> exception type, for a failure without a known cause.
RETURN_CODE_TYPES: Dict[int, Type[MuonOffloadError]] = {
    MUON_ERR_INVALID: InvalidArgument,
    MUON_ERR_SERVER: ServerError,
    MUON_ERR_CONNECTION: ConnectionLost,
    MUON_ERR_TIMEOUT: Timeout,
    MUON_ERR_NONFINITE: NonFiniteGradient,
    MUON_ERR_PEER_LOST: PeerLost,
    MUON_ERR_INTERNAL: MuonOffloadError,
    MUON_ERR_DEVICE: DeviceError,
    MUON_ERR_UNAVAILABLE: BackendUnavailable,
}

# The causes only the client library raises; every other known name is one the server sends.
_CLIENT_CAUSES = {"bad_reply", "connection_lost", "invalid_argument", "device", "unavailable",
                  "internal"}


def error_class(rc: int, error_name: str) -> Type[MuonOffloadError]:
    """The exception type of a failure with C return code ``rc`` (< 0) and cause
    ``error_name`` (the ErrorCode name, "" when none or unknown to this package)."""
    if error_name in CAUSE_TYPES:
        return CAUSE_TYPES[error_name]
    if error_name and error_name != "none" and error_name not in _CLIENT_CAUSES:
        return ServerError
    return RETURN_CODE_TYPES.get(rc, MuonOffloadError)
