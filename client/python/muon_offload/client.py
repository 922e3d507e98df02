"""A Python client of muon-offloadd: a thin wrapper over the C ABI (client/muon_client.h).

Buffers are NumPy arrays or torch tensors: contiguous, of the registered dtype (float32, or
bfloat16 for a "bf16" gradient/update dtype). CUDA tensors are accepted by ``push`` and
``wait_update`` (the device entry points of the C ABI, on the tensor's current torch stream); every
other buffer must be on the CPU. Nothing here imports torch unless given a CUDA tensor.

Servers are Unix socket paths, or ``"tcp://HOST:PORT"`` for a server's TCP control plane (another
node): the server's token (``auth_token=``, else the file named by ``MUON_OFFLOAD_TOKEN_FILE``)
is sent in the hello over TCP only; a missing or wrong one is refused with
:class:`~muon_offload.ServerError` (``server_code`` "unauthorized"). ``tcp://`` endpoints use the
data plane named by ``MUON_OFFLOAD_REMOTE_DATA_PLANE`` when it is set (the launcher sets "nccl"
for a plan spanning hosts), the data plane below otherwise.

Data plane (``data_plane=``, or the environment variable ``MUON_OFFLOAD_DATA_PLANE``): ``"shm"``
(default; host shared memory, a server on this node), ``"cuda_ipc"`` (the server's device rings
over CUDA IPC, same node, a server on the CUDA backend: gradients go from the trainer's GPU to the
server's with no host staging) or ``"nccl"`` (NCCL point-to-point with a CUDA server built with
NCCL, e.g. over ``tcp://`` on another node; not with a server on the same GPU). With ``cuda_ipc``
or ``nccl`` create the client with the trainer's device current (``torch.cuda.set_device``); a CPU
server refuses them with :class:`~muon_offload.ServerError`, a library built without NCCL refuses
``nccl`` with :class:`~muon_offload.BackendUnavailable`.

Typical step of compute rank r (what :class:`muon_offload.torch.OffloadMuon` does for you)::

    c = Client(["/run/user/1000/muon-offload/muon-offloadd.sock"], rank=r, world_size=w)
    c.register("blocks.0.mlp.w1", (512, 128), {"mu": 0.95}, push=[(0, 512*128)])
    c.push("blocks.0.mlp.w1", step, 0, grad)      # as soon as autograd produced it
    c.commit("blocks.0.mlp.w1", step)             # the server starts Newton-Schulz once all
    applied = c.wait_update("blocks.0.mlp.w1", step, out)   # contributors committed
"""
from __future__ import annotations

import ctypes
import json
import os
import stat
import threading
from typing import Iterable, List, Mapping, Optional, Sequence, Tuple

from . import _native
from ._native import check, int64_array

Range = Tuple[int, int]

_DTYPE_BYTES = {"f32": 4, "fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2}

DATA_PLANES = ("shm", "cuda_ipc", "nccl")


def servers_from(value) -> List[str]:
    """The servers to connect to: ``value`` (a list, or a comma-separated string), else
    ``$MUON_OFFLOAD_SERVERS`` (scripts/muon-offload-launch sets it), else the default socket of
    a muon-offloadd started without ``--socket`` (:func:`_native.default_socket_path`) when a
    socket is there. InvalidArgument naming all three when none gives a server."""
    source = "servers="
    if value is None:
        value, source = os.environ.get("MUON_OFFLOAD_SERVERS", ""), "MUON_OFFLOAD_SERVERS"
        if not value:
            default = _native.default_socket_path()
            if stat.S_ISSOCK(os.stat(default).st_mode if os.path.exists(default) else 0):
                return [default]
            raise _native.InvalidArgument(
                "no server given: pass servers=[socket, ...], set MUON_OFFLOAD_SERVERS "
                "(scripts/muon-offload-launch starts servers and sets it), or start muon-offloadd "
                f"without --socket (it then listens on {default}, where no socket is now; "
                "$MUON_OFFLOAD_SOCKET, else $XDG_RUNTIME_DIR, decide that path: the server and "
                "this process must see the same)")
    servers = [s for s in value.split(",") if s] if isinstance(value, str) else list(value)
    if not servers:
        raise _native.InvalidArgument(f"{source} names no server ({value!r}): give socket paths "
                                      "or tcp://HOST:PORT endpoints, or leave it unset for the "
                                      "default socket")
    return servers


def data_plane_from(value: Optional[str]) -> str:
    """The data plane to use: ``value``, else ``$MUON_OFFLOAD_DATA_PLANE``, else ``"shm"``.
    Raises InvalidArgument naming the source for anything but "shm", "cuda_ipc" or "nccl"."""
    source = "data_plane"
    if value is None:
        value = os.environ.get("MUON_OFFLOAD_DATA_PLANE", "")
        source = "MUON_OFFLOAD_DATA_PLANE"
        if not value:
            return "shm"
    if not isinstance(value, str) or value not in DATA_PLANES:
        raise _native.InvalidArgument(f"{source}={value!r}: expected one of "
                                      f"{', '.join(DATA_PLANES)}")
    return value


def _is_cuda(x) -> bool:
    return bool(getattr(x, "is_cuda", False))


def _cuda_buffer(x, what: str, stream) -> Tuple[int, int, int]:
    """(address, bytes, cudaStream_t) of a contiguous CUDA tensor; ``stream`` None: the current
    torch stream of the tensor's device, else a torch.cuda.Stream or a raw cudaStream_t."""
    if not x.is_contiguous():
        raise _native.InvalidArgument(f"{what}: tensor is not contiguous")
    if stream is None:
        import torch
        stream = torch.cuda.current_stream(x.device)
    handle = int(getattr(stream, "cuda_stream", stream) or 0)
    return x.data_ptr(), x.numel() * x.element_size(), handle


def _record_stream(x, stream) -> None:
    """Tells torch's caching allocator that ``stream`` (a caller's ``stream=`` or the client's
    push stream: a torch.cuda.Stream or a raw cudaStream_t) uses CUDA tensor ``x``, so that its memory is not
    reused before the work queued there (a copy or NCCL transfer of the client) is done. None (the
    current stream, taken as the tensor's allocation stream) records nothing; recording the
    allocation stream itself is a no-op for the allocator."""
    if stream is None or not hasattr(x, "record_stream"):
        return
    import torch
    if not isinstance(stream, torch.cuda.Stream):
        stream = torch.cuda.ExternalStream(int(stream or 0), device=x.device)
    x.record_stream(stream)


def _buffer(x, what: str) -> Tuple[int, int]:
    """(address, bytes) of a contiguous CPU buffer (NumPy array or torch tensor)."""
    if hasattr(x, "data_ptr"):  # torch.Tensor
        if x.device.type != "cpu":
            raise _native.InvalidArgument(f"{what}: tensor is on {x.device}, need a CPU tensor")
        if not x.is_contiguous():
            raise _native.InvalidArgument(f"{what}: tensor is not contiguous")
        return x.data_ptr(), x.numel() * x.element_size()
    if hasattr(x, "__array_interface__"):  # numpy
        if not x.flags["C_CONTIGUOUS"]:
            raise _native.InvalidArgument(f"{what}: array is not C-contiguous")
        return x.ctypes.data, x.nbytes
    raise _native.InvalidArgument(f"{what}: expected a NumPy array or a torch tensor, got "
                                  f"{type(x).__name__}")


def _flat_ranges(ranges: Optional[Iterable[Range]]) -> Tuple["ctypes.Array", int]:
    flat = []
    n = 0
    for b, e in ranges or ():
        flat += [int(b), int(e)]
        n += 1
    return int64_array(flat), n


def options_json(options: Optional[Mapping]) -> bytes:
    """Muon options as the C ABI's JSON object (fields of `muon-offload orthogonalize` plus
    momentum, mu, nesterov; see client/muon_client.h). Missing fields take the defaults."""
    return json.dumps(dict(options or {})).encode()


class Client:
    """One compute rank's connection to the job's servers (Unix socket paths or
    ``"tcp://HOST:PORT"``).

    ``auth_token`` (str, optional): the servers' shared secret (muon-offloadd
    --auth-token-file), sent in the hello on ``tcp://`` endpoints only; None: read from the file
    named by ``MUON_OFFLOAD_TOKEN_FILE`` when a tcp endpoint is given.

    ``job`` (str, optional): the training job's identity, the same on every rank (e.g. a UUID
    rank 0 makes and broadcasts; at most 256 bytes). A server holding parameters of another job
    whose ranks have all left registers them anew for this one: fresh (no ``prefix=`` needed for
    a rerun), or with ``resume=True`` keeping the momentum and step the other job left. While a
    rank of that job is connected, registering fails with ServerError naming it. None: no
    identity, the server keeps state by name across jobs. See :meth:`set_job`.

    Raises :class:`~muon_offload.ConnectionLost` naming the socket when a server is unreachable
    within ``connect_timeout_ms``; :class:`~muon_offload.ServerError` when a server refuses the
    hello (the data plane; "unauthorized": a missing or wrong token over TCP). Not thread-safe by itself; this wrapper serialises calls with
    a lock so that autograd hooks on other threads may use it.
    """

    def __init__(self, servers: Sequence[str], rank: int = 0, world_size: int = 1,
                 name: str = "", connect_timeout_ms: int = 10000, op_timeout_ms: int = 120000,
                 data_plane: Optional[str] = None, auth_token: Optional[str] = None,
                 job: Optional[str] = None, resume: bool = False):
        if isinstance(servers, str):
            servers = [s for s in servers.split(",") if s]
        servers = [str(s) for s in servers]
        if not servers:
            raise _native.InvalidArgument("no server socket given")
        self.servers = servers
        self.rank, self.world_size = int(rank), int(world_size)
        self.data_plane = data_plane_from(data_plane)
        self._lib = _native.lib()
        arr = (ctypes.c_char_p * len(servers))(*[s.encode() for s in servers])
        handle = ctypes.c_void_p()
        self._mu = threading.RLock()
        self._h = None
        self._registered = {}
        # Update bytes written by wait_update (the want ranges' elements x the update dtype's
        # size) since the last report_step.
        self._received = 0
        token = None if auth_token is None else str(auth_token).encode()
        check(self._lib.muon_client_create_auth(arr, len(servers), self.rank, self.world_size,
                                                (name or f"rank {rank}").encode(),
                                                int(connect_timeout_ms), int(op_timeout_ms),
                                                self.data_plane.encode(), token,
                                                ctypes.byref(handle)),
              f"connecting rank {rank} to {', '.join(servers)} (data plane {self.data_plane})")
        self._h = handle
        if job is not None or resume:
            self.set_job(job or "", resume)

    # -- lifetime --------------------------------------------------------------------------
    def close(self) -> None:
        """Says goodbye to every server (an orderly disconnect, not a lost rank)."""
        with self._mu:
            if self._h is not None:
                self._lib.muon_client_destroy(self._h)
                self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _handle(self):
        if self._h is None:
            raise _native.MuonOffloadError("client is closed")
        return self._h

    # -- parameters ------------------------------------------------------------------------
    def set_job(self, job: str, resume: bool = False) -> None:
        """The job identity (str, "" for none) and resume flag of the registrations from now on
        (see the class docstring). Raises InvalidArgument for a job longer than 256 bytes."""
        with self._mu:
            check(self._lib.muon_client_set_job(self._handle(), str(job).encode(),
                                                int(bool(resume))), "set_job")

    def register(self, name: str, shape: Sequence[int], options: Optional[Mapping] = None,
                 push: Optional[Iterable[Range]] = None, want: Optional[Iterable[Range]] = None,
                 server: int = 0, grad_dtype: str = "f32", update_dtype: str = "f32") -> None:
        """Registers a parameter [rows, cols] or [batch, rows, cols] with server ``server`` and
        waits until every rank of the job registered it (a Timeout past ``op_timeout_ms`` names
        the ranks that have not). ``push``/``want`` are element ranges [begin, end) over the
        flattened parameter (default: all elements; ``[]`` an empty shard: the rank pushes
        nothing and its commits are ignored)."""
        numel = 1
        for d in shape:
            numel *= int(d)
        push = [(0, numel)] if push is None else list(push)
        want = [(0, numel)] if want is None else list(want)
        dims = int64_array(shape)
        p, n_push = _flat_ranges(push)
        w, n_want = _flat_ranges(want)
        with self._mu:
            check(self._lib.muon_client_register(
                self._handle(), name.encode(), dims, len(shape), grad_dtype.encode(),
                update_dtype.encode(), options_json(options), p, n_push, w, n_want, int(server)),
                f"registering '{name}'")
        self._registered[name] = {
            "shape": tuple(int(d) for d in shape), "numel": numel,
            "want": sum(e - b for b, e in want),
            "update_bytes": _DTYPE_BYTES.get(update_dtype, 4),
            "grad_bytes": _DTYPE_BYTES.get(grad_dtype, 4), "server": int(server)}

    def push(self, name: str, step: int, offset: int, data, count: Optional[int] = None,
             stream=None) -> None:
        """Pushes ``count`` elements of ``data`` (grad dtype) at element ``offset``. Pushes of
        the same elements within one step accumulate on the server.

        A CUDA tensor goes through ``muon_client_push_device``, ordered after the work queued on
        ``stream`` (default: the current torch stream of its device) and copied on the
        connection's own push stream, so ``stream`` never waits for the server: with
        ``cuda_ipc`` straight into the server's GPU, with ``nccl`` sent with ncclSend, returning
        once enqueued. The tensor is recorded on the push stream (``record_stream``), so it may
        simply be dropped; keep it unchanged until the step's ``wait_update`` (work queued after
        that is ordered after the copies). With ``shm`` it is staged through host memory. The
        stream must belong to the client's device (InvalidArgument naming both otherwise). Raises
        DeviceError / BackendUnavailable when CUDA cannot serve it; nothing is pushed then."""
        self._send(name, step, offset, data, count, stream, packed=False)

    def push_packed(self, name: str, step: int, packed: int, data, count: Optional[int] = None,
                    stream=None) -> None:
        """Pushes ``count`` elements of ``data`` (grad dtype) at packed position ``packed`` of
        this rank's push ranges, sorted and laid end to end: what a sharded rank holds (a
        DTensor's local tensor is its push ranges packed), so a column block — a row range x a
        column range, one range per row — goes as one push (one frame per ring slot of bytes)
        and the server scatters it into the matrix. CUDA tensors, streams and errors as
        :meth:`push`; InvalidArgument when the span is not inside the rank's push elements."""
        self._send(name, step, packed, data, count, stream, packed=True)

    def _send(self, name: str, step: int, at: int, data, count, stream, packed: bool) -> None:
        host_fn = self._lib.muon_client_push_packed if packed else self._lib.muon_client_push
        device_fn = (self._lib.muon_client_push_packed_device if packed
                     else self._lib.muon_client_push_device)
        offset = at
        if count is None:
            count = data.numel() if hasattr(data, "numel") and callable(data.numel) else data.size
        if _is_cuda(data):
            ptr, nbytes, s = _cuda_buffer(data, f"push '{name}'", stream)
            self._check_push(name, data, int(count), nbytes)
            with self._mu:
                check(device_fn(
                    self._handle(), name.encode(), int(step), int(offset), ctypes.c_void_p(ptr),
                    int(count), ctypes.c_void_p(s)), f"push of '{name}' step {step}")
                push_stream = ctypes.c_void_p()
                check(self._lib.muon_client_push_stream(self._handle(), name.encode(),
                                                        ctypes.byref(push_stream)),
                      f"push stream of '{name}'")
            # The copies read `data` on the push stream (None on shm: already read).
            if push_stream.value:
                _record_stream(data, push_stream.value)
            return
        ptr, nbytes = _buffer(data, f"push '{name}'")
        self._check_push(name, data, int(count), nbytes)
        with self._mu:
            check(host_fn(self._handle(), name.encode(), int(step), int(offset),
                          ctypes.c_void_p(ptr), int(count)),
                  f"push of '{name}' step {step}")

    def _check_push(self, name: str, data, count: int, nbytes: int) -> None:
        """Refuses a push whose buffer is smaller than ``count`` elements of the parameter's
        grad dtype, or whose element size is not that dtype's (a float64 or bf16 buffer for an
        f32 gradient): the library would read its bytes as they are."""
        reg = self._registered.get(name)
        if reg is None:
            return  # the library names the unknown parameter
        esize = reg["grad_bytes"]
        have = getattr(data, "element_size", None)
        have = have() if callable(have) else getattr(data, "itemsize", esize)
        torch_dtype = str(getattr(data, "dtype", "")) if hasattr(data, "data_ptr") else ""
        want_dtype = "torch.float32" if esize == 4 else "torch.bfloat16"
        if have != esize or (torch_dtype and torch_dtype != want_dtype):
            raise _native.InvalidArgument(
                f"push '{name}': buffer elements are {torch_dtype or str(have) + '-byte'}, the "
                f"gradient dtype of '{name}' is {'f32' if esize == 4 else 'bf16'} (convert the "
                f"tensor first)")
        if count < 0 or count * esize > nbytes:
            raise _native.InvalidArgument(
                f"push '{name}': {count} elements need {count * esize} bytes, the buffer has "
                f"{nbytes}")

    def commit(self, name: str, step: int) -> None:
        """Declares this rank's contribution to (name, step) complete. A rank that registered no
        push ranges for ``name`` contributes nothing: it need not commit, and a commit from it is
        ignored by the server."""
        with self._mu:
            check(self._lib.muon_client_commit(self._handle(), name.encode(), int(step)),
                  f"commit of '{name}' step {step}")

    def wait_update(self, name: str, step: int, out, stream=None) -> bool:
        """Waits for the update of (name, step) and writes the packed want ranges into ``out``.
        Returns False when the server skipped the step (non-finite policy "skip": zeros).

        A CUDA ``out`` goes through ``muon_client_wait_update_device``: the values are there for
        work queued on ``stream`` (default: the current torch stream of its device) after this
        call; with an explicit ``stream=``, ``out`` is recorded on it (``record_stream``) so that
        torch does not reuse its memory while the copy is queued. Raises DeviceError / BackendUnavailable when CUDA cannot serve it; the update then
        stays held (a later wait of the step still gets it)."""
        applied = ctypes.c_int(1)
        if _is_cuda(out):
            ptr, nbytes, s = _cuda_buffer(out, f"update of '{name}'", stream)
            with self._mu:
                check(self._lib.muon_client_wait_update_device(
                    self._handle(), name.encode(), int(step), ctypes.c_void_p(ptr), nbytes,
                    ctypes.c_void_p(s), ctypes.byref(applied)),
                    f"update of '{name}' step {step}")
            _record_stream(out, stream)
            self._count_received(name)
            return bool(applied.value)
        ptr, nbytes = _buffer(out, f"update of '{name}'")
        with self._mu:
            check(self._lib.muon_client_wait_update(self._handle(), name.encode(), int(step),
                                                     ctypes.c_void_p(ptr), nbytes,
                                                     ctypes.byref(applied)),
                  f"update of '{name}' step {step}")
        self._count_received(name)
        return bool(applied.value)

    def _count_received(self, name: str) -> None:
        reg = self._registered.get(name)
        if reg is not None:
            self._received += reg["want"] * reg["update_bytes"]

    #: muon_client_update_state's answers, by value.
    UPDATE_STATES = ("pending", "complete", "failed", "lost")

    def update_state(self, name: str, step: int) -> str:
        """Where the update of (name, step) stands, as :meth:`wait_update` would find it now:
        "pending" (it would wait), "complete", "failed" (the server failed the step: the wait
        raises its error) or "lost" (the connection). Never waits."""
        with self._mu:
            state = check(self._lib.muon_client_update_state(self._handle(), name.encode(),
                                                             int(step)),
                          f"update of '{name}' step {step}")
        return self.UPDATE_STATES[state]

    def update_ready(self, name: str, step: int) -> bool:
        with self._mu:
            return bool(check(self._lib.muon_client_update_ready(self._handle(), name.encode(),
                                                                 int(step)),
                              f"update of '{name}' step {step}"))

    def fetch_momentum(self, name: str, out, after_step: int = -1) -> int:
        """Copies the server-held fp32 momentum (all elements) into ``out``; returns its last
        applied step (-1: none). ``after_step`` >= 0: once the parameter's step has reached it
        (this rank's last optimizer step: a rank that wants no update of the parameter leaves
        its step() before the others pushed theirs), at the latest after the server's step
        timeout, with what it holds then."""
        ptr, nbytes = _buffer(out, f"momentum of '{name}'")
        last = ctypes.c_int64(-1)
        with self._mu:
            check(self._lib.muon_client_fetch_momentum_after(self._handle(), name.encode(),
                                                              int(after_step),
                                                              ctypes.c_void_p(ptr), nbytes // 4,
                                                              ctypes.byref(last)),
                  f"fetching the momentum of '{name}'")
        return int(last.value)

    def load_momentum(self, name: str, step: int, values) -> None:
        """Loads fp32 momentum (all elements) into the server; ``step`` is its last applied
        step, so the next step pushed must be ``step + 1``."""
        ptr, nbytes = _buffer(values, f"momentum of '{name}'")
        with self._mu:
            check(self._lib.muon_client_load_momentum(self._handle(), name.encode(), int(step),
                                                       ctypes.c_void_p(ptr), nbytes // 4),
                  f"loading the momentum of '{name}'")

    def snapshot(self, server: int = 0, path: str = "") -> None:
        """Asks server ``server`` to write a snapshot (empty path: its --snapshot path)."""
        with self._mu:
            check(self._lib.muon_client_snapshot(self._handle(), int(server), path.encode()),
                  f"snapshot of server {server}")

    def report_step(self, step: int) -> dict:
        """Closes this rank's step once every update of it is in hand: sends a step report to
        every server (it feeds ``muon_offload_client_exposed_wait_seconds`` and
        ``muon-offload status``) and returns the figures since the previous report:
        ``{"step", "exposed_wait_s" (seconds blocked in wait_update), "bytes_pushed" (gradient
        bytes), "push_frames" (push frames sent: one per ring slot of each push; a column block
        pushed with :meth:`push_packed` is one), "bytes_received" (update bytes wait_update
        wrote: the want ranges), "parameters" (updates taken), "slowest_parameter" (the one
        whose update arrived last, "" when none)}``."""
        wait = ctypes.c_double(0.0)
        pushed = ctypes.c_int64(0)
        count = ctypes.c_int(0)
        slowest = ctypes.create_string_buffer(1024)
        with self._mu:
            check(self._lib.muon_client_report_step(self._handle(), int(step), ctypes.byref(wait),
                                                     ctypes.byref(pushed), ctypes.byref(count),
                                                     slowest, len(slowest)),
                  f"step report of step {step}")
            frames = ctypes.c_int64(0)
            check(self._lib.muon_client_last_push_frames(self._handle(), ctypes.byref(frames)),
                  "push frames of the step report")
        received, self._received = self._received, 0
        return {"step": int(step), "exposed_wait_s": wait.value, "bytes_pushed": pushed.value,
                "push_frames": frames.value, "bytes_received": received,
                "parameters": count.value,
                "slowest_parameter": slowest.value.decode("utf-8", "replace")}

    def lost_peer(self) -> Optional[Tuple[int, str]]:
        """``(rank, message)`` of the lowest rank of this job a server reported lost (servers
        tell every rank at once, between steps too), or None. Cheap: no round trip."""
        rank = ctypes.c_int(-1)
        message = ctypes.create_string_buffer(2048)
        with self._mu:
            check(self._lib.muon_client_lost_peer(self._handle(), ctypes.byref(rank), message,
                                                   len(message)), "lost_peer")
        if rank.value < 0:
            return None
        return rank.value, message.value.decode("utf-8", "replace")

    def snapshot_config(self, server: int) -> Tuple[bool, Optional[Tuple[str, int]]]:
        """``(lost, (path, every))`` of server ``server``: whether the connection to it was
        lost, and what its hello said outlives a crash, its --snapshot path ("" none) and
        --snapshot-every steps (0: only on request and when stopped); None instead of the
        pair for a server not connected or that does not say. No round trip."""
        path = ctypes.create_string_buffer(4096)
        every = ctypes.c_int64(-1)
        lost = ctypes.c_int(0)
        with self._mu:
            check(self._lib.muon_client_snapshot_config(self._handle(), int(server), path,
                                                         len(path), ctypes.byref(every),
                                                         ctypes.byref(lost)),
                  f"snapshot config of server {server}")
        config = None if every.value < 0 else (path.value.decode("utf-8", "replace"),
                                               int(every.value))
        return bool(lost.value), config

    def reconnect(self) -> None:
        """Reconnects to every server and registers every parameter again (after a server
        restarted, e.g. from its snapshot)."""
        with self._mu:
            check(self._lib.muon_client_reconnect(self._handle()),
                  f"reconnecting to {', '.join(self.servers)}")


def local_update(name: str, shape: Sequence[int], options: Optional[Mapping], grad, momentum,
                 update, threads: int = 1) -> bool:
    """In-process Muon with the server's CPU kernels (OpenBLAS with ``threads`` threads):
    updates ``momentum`` (fp32, in place; None for momentum "none") and writes ``update``.
    Returns False when the non-finite policy "skip" skipped the step. With the same thread
    count as the server (``muon-offloadd --threads``) the update is bitwise the server's.
    Computed by libmuon_offload_reference.so (found next to the client library, or through
    ``MUON_OFFLOAD_REFERENCE_LIB``), loaded at the first call."""
    lib = _native.reference_lib()
    g, _ = _buffer(grad, f"gradient of '{name}'")
    u, _ = _buffer(update, f"update of '{name}'")
    m = _buffer(momentum, f"momentum of '{name}'")[0] if momentum is not None else None
    rc = _native.check_reference(
        lib.muon_local_update(name.encode(), int64_array(shape), len(shape),
                              options_json(options), ctypes.c_void_p(g),
                              ctypes.c_void_p(m) if m is not None else None,
                              ctypes.c_void_p(u), int(threads)),
        f"local update of '{name}'")
    return rc == 0
