"""Muon for PyTorch with the optimizer math in muon-offloadd servers: :class:`OffloadMuon`.

The Muon math is :class:`muon_offload.config.MuonConfig`'s, torch.optim.Muon's by default (Muon:
Keller Jordan, "Muon: An optimizer for hidden layers in neural networks", 2024,
https://kellerjordan.github.io/posts/muon/), per matrix parameter W of shape (r, c) with
gradient G:

    M <- lerp(M, G, 1-mu)                (momentum_convention "ema"; "sum": M <- mu*M + G)
    X  = lerp(G, M, mu) (Nesterov) or M  ("sum": G + mu*M)
    U  = NS(X)                           Newton-Schulz, ns_coefficients x ns_steps, on
                                         X/||X||_F (eps_mode; the server computes it)
    W <- W*(1 - lr*wd)                   (on the trainer: lr and wd may follow a scheduler)
    W <- W - lr*adjust_lr(r, c)*U        (adjust_lr_fn, torch's; or a server-side ``scale``)

Everything else — embeddings, the output head, norms, biases — is updated by torch.optim.AdamW.
"""
from __future__ import annotations

import contextlib
import os
import time
import uuid
import warnings
import weakref
from typing import Callable, Dict, Mapping, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from . import _native
from . import plan as plan_reader
from .base import MuonOptimizerBase, base_keywords, muon_config
from .client import Client, servers_from
from .config import MuonConfig
from ._native import ConnectionLost, InvalidArgument, MuonOffloadError, NonFiniteGradient
from .errors import MUON_ERR_CONNECTION, MUON_ERR_PEER_LOST, PeerLost, ServerError
from .crash_report import lost_steps_report, relay_lost_servers
from .failover import DirectFailover
from .layouts import is_dtensor, local_tensor, replica_groups, shard_like, storage_layout
from .muon_param import MuonParam, row_shard

__all__ = ["OffloadMuon"]

_TORCH_DTYPE = {"f32": torch.float32, "bf16": torch.bfloat16}
# The ErrorCode integer of peer_lost (core/error_code.hpp; stable across versions).
_PEER_LOST_CAUSE = 5


def plan_rank(process_group=None) -> int:
    """This process's rank among a plan's compute ranks: its torch.distributed (global) rank
    when a process group is in use, else environment ``RANK`` (torchrun), else 0."""
    if process_group is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    try:
        return int(os.environ.get("RANK") or 0)
    except ValueError:
        raise InvalidArgument(f"environment RANK={os.environ['RANK']!r} is not an "
                              "integer") from None


def plan_targets(path: Optional[str], rank: int = 0) -> Dict[str, int]:
    """The server index (into MUON_OFFLOAD_SERVERS) ``rank`` pushes each parameter of the plan at
    ``path`` to (:func:`muon_offload.plan.targets`; ``MUON_OFFLOAD_SERVERS_SCOPE=global`` for a
    plan spanning hosts); {} without a plan. Raises ValueError (PlanError) for a bad plan."""
    if not path:
        return {}
    return plan_reader.targets(plan_reader.read(path), rank,
                               os.environ.get("MUON_OFFLOAD_SERVERS_SCOPE") == "global")


def plan_failover_pairs(path: Optional[str], rank: int = 0) -> Dict[str, Tuple[int, int]]:
    """``{name: (owner index, buddy index)}`` of the parameters ``rank`` pushes straight to an
    owner with a buddy in the plan at ``path`` (:func:`muon_offload.plan.failover_pairs`); {}
    without a plan. Raises PlanError for a bad plan or a buddy the plan may not name."""
    if not path:
        return {}
    return plan_reader.failover_pairs(plan_reader.read(path), rank,
                                      os.environ.get("MUON_OFFLOAD_SERVERS_SCOPE") == "global",
                                      source=f"plan '{path}'")


# How the server words an orderly stop (daemon/engine.cpp, Engine::shutdown): the start of the
# error it sends every rank, which the client library also gives as a lost connection's reason.
_SERVER_STOPPED = "server shutting down ("


def _stopped(e: Exception) -> bool:
    """Whether ``e`` says a server was stopped in order (SIGTERM, a stop request) rather than
    lost: its ``shutdown`` error, or the connection it then closed."""
    if isinstance(e, ServerError) and e.error_name == "shutdown":
        return True
    return isinstance(e, ConnectionLost) and _SERVER_STOPPED in str(e)


class OffloadMuon(MuonOptimizerBase):
    """Muon with momentum and Newton-Schulz in muon-offloadd servers; a torch.optim.Optimizer.

    Args:
        params_or_groups: tensors, ``(name, tensor)`` pairs (``model.named_parameters()``), or
            param-group dicts of either. Names drive the routing (see
            :func:`~muon_offload.routing.default_route`); without names pass ``names=model`` (or
            a ``{name: tensor}`` mapping).
        *muon_args, **muon_keywords: the Muon math, the fields of one
            :class:`~muon_offload.config.MuonConfig` (or ``config=MuonConfig(...)``):
            torch.optim.Muon's ``lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
            ns_coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7, ns_steps=5,
            adjust_lr_fn=None`` with torch's defaults and meaning (positionally in that order),
            and the keyword-only ``momentum_convention``, ``eps_mode``, ``schedule``,
            ``scale``, ``extra_scale``, ``row_splits``, ``compute_layouts``, ``precision``.
            ``W <- W*(1 - lr*wd)``, then ``W <- W - lr*adjust_lr(r, c)*U`` as torch.optim.Muon; lr and weight_decay may
            change between steps (LR schedulers); momentum, nesterov and the Newton-Schulz
            keywords are fixed at registration. ``row_splits={name: [q, k, v]}`` orthogonalizes
            row blocks of a fused QKV separately (each block with its own adjust_lr factor);
            ``compute_layouts={"blocks.*.attn.qkv.weight": "row_blocks:3"}`` names them by
            pattern (:mod:`muon_offload.compute_layouts`; the plan's ``row_blocks`` are the
            default).
        adamw_lr, adamw_betas, adamw_eps, adamw_weight_decay: torch.optim.AdamW's for
            embeddings, the output head, norms and biases (weight decay defaults to
            ``weight_decay``); a group may set ``adamw_lr`` etc. for its own AdamW part.
        servers: the job's servers: Unix socket paths or ``tcp://HOST:PORT`` (list or
            comma-separated string); default: environment ``MUON_OFFLOAD_SERVERS`` (set by
            scripts/muon-offload-launch), else the socket of a muon-offloadd started without
            ``--socket`` when one is there. Parameters are spread over the servers by Newton-Schulz
            cost (``assign`` overrides: ``{name: server index}``); with a plan
            (``MUON_OFFLOAD_PLAN``, set by the launcher's ``--plan``) each parameter it names
            goes to the server the plan gives this rank's domain: its relay
            (``parameters[].relays``), else its owner.
        ddp: a ``DistributedDataParallel`` over the model (see :meth:`attach_ddp`); its names
            are the unwrapped model's.
        mode: under torch.distributed with world size w > 1:
            ``"server_reduce"`` (default) — every rank pushes its local gradient divided by w and
            the server sums the w contributions (contributor order, deterministic): the server's
            sum is the mean gradient, like DDP; Muon matrices need no all-reduce at all.
            ``"shard"`` — ranks all-reduce each gradient themselves (mean), then each pushes only
            its row shard (1 contributor per element) and receives the whole update.
            Without DDP, AdamW parameters are averaged with one all-reduce in step().
        route: ``callable(name, tensor) -> "muon" | "muon_flat" | "adamw" | None`` overriding
            the default route (None: default). ``"muon_flat"`` flattens a 3-D tensor (Conv1d)
            instead of treating it as an expert stack. A group key ``use_muon`` forces a group.
        prefix: prepended to the names the server sees (jobs that share one server one after
            the other keep their parameters apart; a server serves one job at a time).
        timeout_s: how long a server request (a registration waiting for every rank, an update)
            may take before :class:`~muon_offload.Timeout`; ``connect_timeout_s`` for the
            connection itself.
        resume_from_server: adopt the momentum and step the server holds (a server restarted
            with ``--restore``, or a previous job's state) instead of starting at step 0. The
            parameters must all be at one step (InvalidArgument naming the mix otherwise: a
            snapshot written mid-step); ``"per_parameter"`` adopts each parameter's own step
            (for parameters that really step apart).
        job: this training job's identity, the same on every rank (default: a UUID rank 0 makes
            and broadcasts over the process group). A server that holds parameters of the same
            names for another job starts them fresh once that job's ranks are gone (no
            ``prefix=`` needed for a rerun), or keeps their momentum and step with
            ``resume_from_server=True``; while a rank of that job is connected the registration
            is refused, naming it (daemon/README.md, "Jobs").
        replica_mesh_dims: names of root-mesh dimensions (HSDP's replicate dimension) across
            which the server sums the Muon gradients of modules sharded on a sub-mesh without
            them (see "Sharded models" below); default none.
        data_plane: ``"shm"`` (host shared memory, any server) or ``"cuda_ipc"`` (the servers'
            device rings over CUDA IPC: same node, servers on the CUDA backend); default:
            environment ``MUON_OFFLOAD_DATA_PLANE``, else ``"shm"``. With ``cuda_ipc`` the rings
            are opened on the device of the first CUDA Muon parameter.
        overlap: True (default): each Muon gradient goes to the server as backward produces it,
            and is committed, so the server runs Newton-Schulz while backward goes on; ``.grad``
            of Muon parameters is gone after backward (see "Overlap"). False: gradients stay in
            ``.grad`` until step() pushes them, as clipping (``clip_grad_norm_``), a
            ``GradScaler`` (``unscale_``, and the steps it skips), edits, or a step() skipped
            after backward left them: torch.optim.Muon's semantics, without the overlap (under
            DDP, DDP then all-reduces the Muon gradients too, and each rank pushes its row shard
            of their mean). ``.grad`` stays after step(), as with torch; ``zero_grad()`` clears
            it.

    Devices: CUDA parameters keep their gradients and updates on the device when the client
    library has CUDA (``muon_offload.has_cuda()``): gradients are pushed from device memory on
    the current stream (with ``cuda_ipc`` straight into the server's GPU, without host copies;
    with ``shm`` staged through the host by the library) and updates land in device buffers.
    CPU parameters go through host memory as always.

    Sharded models: a DTensor parameter (FSDP2 ``fully_shard``, tensor parallel) registers
    the blocks this rank holds (:func:`muon_offload.layouts.storage_layout`), whatever ``mode``
    says: its hook pushes the local gradient FSDP's reduce-scatter left (not averaged again),
    and step() receives and applies only the local blocks' update. AdamW DTensor gradients are
    not averaged either (FSDP did). InvalidArgument at construction for a placement that
    cannot be expressed (``Partial``...), naming the parameter and the placement.
    HSDP (a replicate x shard mesh): ``fully_shard(module, mesh=mesh)`` on the 2-D mesh
    all-reduces every gradient across the replicas itself, and then replica 0 alone pushes (no
    double reduction). To leave the replicas' Muon gradients unreduced, shard the modules
    holding Muon matrices on the shard sub-mesh (``fully_shard(block, mesh=mesh["shard"])``;
    the root may stay on the 2-D mesh) and pass ``replica_mesh_dims=("replicate",)`` (the
    replicate dimension's name): every replica pushes its reduce-scattered shard, divided by
    the replica count, and the server sums them: no all-reduce of Muon gradients across
    replicas at all; the AdamW gradients of those modules are averaged over the replicas by
    step() (one all-reduce per replica group, AdamW only).

    Shapes: 2-D matrices go as they are; conv weights ``(out, in, kh, kw)`` as
    ``(out, in*kh*kw)`` (and scaled by that shape); 3-D ``(b, r, c)`` expert stacks as b
    independent matrices.

    Overlap: a ``register_post_accumulate_grad_hook`` on each Muon parameter pushes its gradient
    as soon as autograd has accumulated it and commits it (under DDP: the communication hook,
    as each bucket is ready), so the server runs Newton-Schulz while backward goes on. The
    pushed gradient is consumed: ``p.grad`` of Muon parameters is None after backward (after
    step() under DDP); ``overlap=False`` keeps them for clipping and skipped steps. step()
    starts the AdamW gradients' all-reduce in the background, waits for the Muon updates and
    applies them, then finishes AdamW: a rank lost or stalled before
    its pushes surfaces as the server's PeerLost or Timeout naming it, never as a collective's
    error or a silent wait in it (docs/design.md, "Step order").
    A Muon parameter that got no gradient is skipped (weights and momentum untouched), like
    torch optimizers do. Under torch.distributed without DDP, step() first agrees with the other
    ranks on which parameters have gradients (one all-reduce of a flag each): a rank that lacks
    one another rank has pushes zeros, as DDP's mean counts it (mode ``server_reduce``, and
    mode ``shard`` with ``overlap=False``; in mode ``shard`` with the overlap the Muon gradients
    are all-reduced during backward, so every rank must produce them, as under DDP without
    find_unused_parameters).

    Gradient accumulation: wrap all but the last micro-batch in :meth:`no_commit`. In mode
    ``server_reduce`` each micro-batch's gradient is pushed and the pushes accumulate on the
    server (per rank, summed in contributor order); the last one commits. In mode ``shard``
    gradients accumulate in ``.grad`` (like DDP's ``no_sync``) and are all-reduced and pushed
    once, by the last micro-batch. Under DDP use ``ddp_model.no_sync()``. Missing
    ``no_commit``, a second backward before step() raises.

    Steps are explicit integers per parameter (``state[p]["step"]``), checked by the server.
    state_dict() carries the server-held momentum (``momentum_buffer``, fp32, matrix shape), so
    torch checkpoints resume bitwise; load_state_dict() loads it back into the server. The format
    is the same as InProcessMuon's. :meth:`momentum_buffer` reads one parameter's.

    Figures: after each step(), ``last_step_stats`` holds what this rank saw of it —
    ``bytes_pushed`` (gradient bytes pushed since the previous step), ``push_frames`` (push
    frames sent: a sharded parameter's local block is one push, one frame per ring slot of its
    bytes, whether it is rows or a column block), ``bytes_received`` (update
    bytes received: the wanted ranges, a sharded rank's own blocks), ``exposed_wait_s`` (seconds
    step() was blocked waiting for updates: from its first wait to the last update in hand, not
    counting the time spent applying the updates already there), ``slowest_parameter`` (the
    parameter whose update arrived last), ``parameters`` (updates waited for) and ``step``. The
    same report goes to every server (``muon_offload_client_exposed_wait_seconds`` on its
    ``--metrics-port``; ``muon-offload status``). ``exposed_seconds`` is the wider figure: all of
    step() plus the gradient hooks.

    Errors surface from step() and from backward() (the hooks push and commit during backward):
    :class:`~muon_offload.ConnectionLost` when a server is unreachable or restarted (the
    message counts the steps whose momentum is lost against each lost server's snapshot and
    says how to recover: :meth:`reconnect` then :meth:`load_state_dict`; a planned parameter
    pushed straight to an owner with a buddy fails over to the buddy instead, with a warning,
    see :mod:`muon_offload.failover`; not with ``MUON_OFFLOAD_REPLICATE=off``, which the
    launcher's ``--no-replication`` sets),
    :class:`~muon_offload.ServerError` when it refuses a parameter (naming it),
    :class:`~muon_offload.PeerLost`, :class:`~muon_offload.Timeout`,
    :class:`~muon_offload.NonFiniteGradient` (the step of that parameter is consumed, its weights
    untouched).
    """

    def __init__(self, params_or_groups, *muon_args, config: Optional[MuonConfig] = None,
                 servers=None, adamw_lr: float = 3e-4,
                 adamw_betas: Tuple[float, float] = (0.9, 0.95), adamw_eps: float = 1e-8,
                 adamw_weight_decay: Optional[float] = None, mode: str = "server_reduce",
                 names=None, route: Optional[Callable] = None, ddp=None,
                 process_group=None, prefix: str = "", assign: Optional[Mapping[str, int]] = None,
                 grad_dtype: str = "f32", update_dtype: str = "f32",
                 connect_timeout_s: float = 10.0, timeout_s: float = 120.0,
                 resume_from_server=False, data_plane: Optional[str] = None,
                 job: Optional[str] = None, replica_mesh_dims: Sequence[str] = (),
                 overlap: bool = True, **muon_keywords):
        config = muon_config(config, muon_args, muon_keywords, type(self).__name__)
        if resume_from_server not in (False, True, "per_parameter"):
            raise InvalidArgument(f"resume_from_server must be False, True or 'per_parameter', "
                                  f"got {resume_from_server!r}")
        try:
            servers = servers_from(servers)
        except InvalidArgument as e:
            raise e.with_message(f"OffloadMuon: {e}") from None
        if grad_dtype not in _TORCH_DTYPE or update_dtype not in _TORCH_DTYPE:
            raise InvalidArgument("grad_dtype and update_dtype must be 'f32' or 'bf16'")
        self.servers = list(servers)
        self._grad_dtype, self._update_dtype = grad_dtype, update_dtype
        self._replica_dims = tuple(replica_mesh_dims)
        self.overlap = bool(overlap)
        # Under DDP without the overlap every rank holds DDP's mean: each pushes only its row
        # shard of it (one contributor per element, the whole matrix once over the ranks).
        self._pushes_ddp_mean = ddp is not None and not self.overlap
        self._client: Optional[Client] = None
        self._pushed: Dict[torch.Tensor, int] = {}  # param -> step being gathered
        self._committed: Dict[torch.Tensor, bool] = {}  # ordered, identity-keyed
        self._hook_handles = []
        self._stale: Dict[str, str] = {}
        self._loads = [0.0] * len(self.servers)
        self.last_step_stats: Dict[str, object] = {}
        self._device_io = False  # CUDA tensors through the library's device entry points
        self.ddp_hook_state = None
        super().__init__(params_or_groups, config=config, **base_keywords(locals()))
        # After the base class: it resolved the process group, which gives this rank's domain.
        self._assign = dict(assign or {}) or plan_targets(os.environ.get("MUON_OFFLOAD_PLAN"),
                                                          plan_rank(self._pg))
        self._from_plan = not assign and bool(os.environ.get("MUON_OFFLOAD_PLAN"))
        # Parameters this rank pushes straight to an owner with a buddy fail over to the buddy
        # when the owner is lost (muon_offload/failover.py); relayed ones fail over in the relay.
        # Not when the servers do not replicate (the launcher's --no-replication sets
        # MUON_OFFLOAD_REPLICATE=off): a buddy without the replica cannot take over.
        replicated = os.environ.get("MUON_OFFLOAD_REPLICATE", "on") != "off"
        self._failover = DirectFailover(
            plan_failover_pairs(os.environ.get("MUON_OFFLOAD_PLAN"), plan_rank(self._pg))
            if self._from_plan and replicated else {})
        cuda_params = [p for p in self._muon_params if p.is_cuda]
        # cuda_ipc opens the rings on the current device: the one the parameters live on.
        on_device = (torch.cuda.device(cuda_params[0].device) if cuda_params
                     else contextlib.nullcontext())
        try:
            with on_device:
                self._client = Client(self.servers, rank=self.rank, world_size=self.world_size,
                                      name=f"rank {self.rank} pid {os.getpid()}",
                                      connect_timeout_ms=int(connect_timeout_s * 1000),
                                      op_timeout_ms=int(timeout_s * 1000), data_plane=data_plane,
                                      job=job if job is not None else self._job_identity(),
                                      resume=bool(resume_from_server))
        except ConnectionLost as e:
            first = self.servers[0]
            # A TCP endpoint is a server that listens on TCP beside its Unix socket.
            start = (f"`muon-offloadd --listen {first[len('tcp://'):]} --auth-token-file FILE` "
                     "on that host" if first.startswith("tcp://")
                     else f"`muon-offloadd --socket {first}`")
            raise e.with_message(
                f"{e}\n(is muon-offloadd running? start it with scripts/muon-offload-launch, or "
                f"{start}; check with `muon-offload health --socket {first}`)") from None
        self._device_io = bool(cuda_params) and _native.has_cuda()
        try:
            with on_device:  # connections opened on first use (global scope): the same device
                self._register(self._muon_params)
            if resume_from_server:
                self._adopt_server_state(resume_from_server == "per_parameter")
            if ddp is not None:
                self.attach_ddp(ddp)
        except BaseException:
            self.close()  # a refused parameter: say goodbye, do not linger as rank r
            raise

    def _job_identity(self) -> str:
        """A fresh job identity, the same on every rank: rank 0's UUID, broadcast over the
        process group (one object broadcast at construction)."""
        ident = [uuid.uuid4().hex if self.rank == 0 else None]
        if self._pg is not None and self.world_size > 1:
            dist.broadcast_object_list(ident, src=dist.get_global_rank(self._pg, 0),
                                       group=self._pg)
        return ident[0]

    # -- registration ----------------------------------------------------------------------
    def _register(self, params: Sequence[torch.Tensor]) -> None:
        if self._client is None:
            return
        unplanned = [self._meta[p].name for p in params if self._meta[p].name not in self._assign]
        if self._from_plan and unplanned:
            # Not an error (a plan made for another model still places what it names), but the
            # plan's relays and owners do not apply to these.
            warnings.warn(
                f"MUON_OFFLOAD_PLAN names {len(self._assign)} parameter(s) but not "
                f"{len(unplanned)} of this optimizer's ({', '.join(unplanned[:4])}"
                f"{', ...' if len(unplanned) > 4 else ''}): those are placed by cost and pushed "
                "straight to their server by every rank (check the names, including prefix=)",
                stacklevel=3)
        for p in params:
            m = self._meta[p]
            if m.name in self._assign:
                m.server = int(self._assign[m.name])
            else:  # least-loaded server by Newton-Schulz cost
                m.server = min(range(len(self.servers)), key=lambda i: self._loads[i])
                self._loads[m.server] += m.cost
            if is_dtensor(p):  # FSDP2 / tensor parallel: the rank's blocks, whatever the mode
                m.layout = storage_layout(m.name, p, world_size=self.world_size,
                                          summed_root_dims=self._replica_dims)
                m.held, m.wanted = list(m.layout.held), list(m.layout.wanted)
            elif (self.mode == "shard" or self._pushes_ddp_mean) and self.world_size > 1:
                m.held = row_shard(m.shape, self.rank, self.world_size)
            self._register_on_server(p)
            if p.requires_grad and self.overlap:
                self._install_hook(p)

    def _register_on_server(self, p: torch.Tensor) -> None:
        """Registers Muon parameter ``p`` with its server (``meta.server``) as planned above;
        the server's refusal re-raised naming the parameter, its shapes and options."""
        m = self._meta[p]
        try:
            self._client.register(m.name, m.shape, m.options, push=m.held, want=m.wanted,
                                  server=m.server, grad_dtype=self._grad_dtype,
                                  update_dtype=self._update_dtype)
        except ConnectionLost:
            raise
        except _native.MuonOffloadError as e:
            raise e.with_message(f"the server refused parameter '{m.name}' (shape "
                                 f"{tuple(p.shape)} -> {m.shape}, options {m.options}): "
                                 f"{e}") from None

    def _install_hook(self, p: torch.Tensor) -> None:
        ref = weakref.ref(self)

        def hook(_):
            opt = ref()
            if opt is not None:
                opt._on_grad(p)

        # After the gradient is accumulated into p.grad (torch >= 2.1).
        self._hook_handles.append(p.register_post_accumulate_grad_hook(hook))

    def attach_ddp(self, ddp_model) -> None:
        """Trains under ``ddp_model`` (a DistributedDataParallel over this optimizer's model,
        mode ``server_reduce``) with no change to the training loop: registers
        :func:`muon_offload.ddp.muon_comm_hook`, so DDP's buckets hand their Muon gradients to
        the server (pushed and committed as each bucket is ready) and all-reduce only the AdamW
        gradients, overlapped with backward as DDP does. ``ddp_hook_state`` then counts the
        bytes of each (``allreduced_bytes``, ``pushed_bytes``). With ``overlap=False`` no hook:
        DDP averages every gradient as usual and step() pushes the Muon means, each rank its row
        shard when ``ddp=`` was given at construction (attached later: rank 0 the mean, the
        others zeros). Call before the first backward; InvalidArgument for mode ``shard`` or a
        module that is not DDP."""
        if self.mode != "server_reduce":
            raise InvalidArgument("attach_ddp(): DDP needs mode 'server_reduce' (the server "
                                  "reduces the Muon gradients)")
        super().attach_ddp(ddp_model)
        if not self.overlap:
            return  # DDP averages every gradient itself; step() pushes the Muon means
        from .ddp import MuonCommHookState, muon_comm_hook
        self.ddp_hook_state = MuonCommHookState(self, ddp_model.process_group)
        ddp_model.register_comm_hook(self.ddp_hook_state, muon_comm_hook)

    def close(self) -> None:
        """Removes the hooks and disconnects (an orderly goodbye)."""
        for h in self._hook_handles:
            h.remove()
        self._hook_handles = []
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- errors ----------------------------------------------------------------------------
    def _fail(self, e: Exception):
        """Resets the step in flight and re-raises ``e`` with recovery advice."""
        self._pushed.clear()
        self._committed.clear()
        self._failover.end_step()
        if _stopped(e):
            # Stopped in order (a signal, a stop request): the steps being computed finished and
            # the --snapshot was written; the step it aborted left the momentum untouched.
            report = self._lost_steps_report()
            raise e.with_message(
                f"{e}\n{report + chr(10) if report else ''}"
                "The muon-offloadd server was stopped (the message says why: a signal from the "
                "launcher, the job scheduler or an operator, or a stop request); it finished the "
                "steps it was computing and wrote its --snapshot, if it has one. To resume: "
                "restart it (`--restore SNAPSHOT` brings that momentum back), call "
                "optimizer.reconnect(), and step() goes on where the snapshot holds this "
                "optimizer's last step; otherwise reload your last trainer checkpoint "
                "(optimizer.load_state_dict puts its momentum back into the server).") from None
        if isinstance(e, ConnectionLost):
            report = self._lost_steps_report()
            raise e.with_message(
                f"{e}\n{report + chr(10) if report else ''}"
                f"The muon-offloadd server ({', '.join(self.servers)}) is unreachable, "
                "stopped or crashed; what of its momentum survives is said above (a crashed "
                "server keeps only its last snapshot on disk). To resume: restart it "
                "(`--restore SNAPSHOT` keeps the momentum of its last snapshot), call "
                "optimizer.reconnect(), then reload your last trainer checkpoint "
                "(model.load_state_dict, optimizer.load_state_dict: it puts that checkpoint's "
                "momentum back into the server) unless the restored snapshot holds exactly this "
                "step (then reconnect() finds nothing stale and step() goes on).") from None
        msg = str(e)
        relayed = relay_lost_servers(msg) if isinstance(e, PeerLost) else None
        if relayed is not None:  # a relay lost the owner (and its buddy): count the steps here
            report = lost_steps_report(*relayed, self._last_steps())
            if report:
                raise e.with_message(f"{msg}\n{report}") from None
        if isinstance(e, _native.StepMismatch):  # by its cause code, step_mismatch
            raise e.with_message(
                f"{msg}\nThe server's step for this parameter does not follow this optimizer's: "
                "it holds state from another run (use a fresh server, another prefix=, or "
                "resume_from_server=True), the optimizer state was not loaded "
                "(optimizer.load_state_dict(checkpoint)), or a backward ran without its step(): "
                "its gradients were committed during backward and the server already applied "
                "them (with overlap=True a step() skipped after backward cannot be undone: "
                "reload a checkpoint, and pass overlap=False to skip steps, clip or unscale "
                "gradients as with torch).") from None
        raise e

    def _lost_steps_report(self) -> str:
        """For each server whose connection was lost: the step its snapshot holds against this
        optimizer's last step, the steps lost, how to resume (crash_report.py); "" when none
        is known lost, and never an error of its own (it only adds to one)."""
        try:
            survival = [self._client.snapshot_config(i) for i in range(len(self.servers))]
        except _native.MuonOffloadError:
            return ""
        return lost_steps_report(self.servers, survival, self._last_steps())

    def _last_steps(self) -> Dict[str, int]:
        """``{name the servers see: this optimizer's last applied step}`` of its Muon
        parameters."""
        return {self._meta[p].name: self._server_step(p) - 1 for p in self._muon_params}

    def _check_peers(self) -> None:
        """Raises PeerLost with the server's report when a server said a rank of this job was
        lost (servers tell every rank at once, between steps too)."""
        lost = self._client.lost_peer()
        if lost is not None:
            raise PeerLost(f"{lost[1]}\n(this rank, {self.rank}, stops before its own "
                           "collectives would fail on the dead peer)", MUON_ERR_PEER_LOST,
                           _PEER_LOST_CAUSE, "peer_lost")

    def _collective(self, run: Callable[[], None]) -> None:
        """Runs a torch.distributed wait (``run``); if it fails and a server reported a rank
        lost, raises the server's PeerLost (the collective's error chained), else re-raises."""
        try:
            run()
        except RuntimeError as e:
            if isinstance(e, _native.MuonOffloadError):
                raise
            try:
                self._check_peers()
            except PeerLost as lost:
                raise lost from e
            raise

    def _check_usable(self):
        if self._client is None:
            raise MuonOffloadError("OffloadMuon is closed")
        if self._stale:
            first = next(iter(self._stale.items()))
            raise MuonOffloadError(
                f"the server's momentum does not match this optimizer ({len(self._stale)} "
                f"parameter(s), e.g. '{first[0]}': {first[1]}); call "
                "optimizer.load_state_dict(checkpoint) to load a consistent state")

    # -- the step ------------------------------------------------------------------------------
    def _server_step(self, p) -> int:
        return int(self.state[p].get("step", 0))

    def _push(self, p: torch.Tensor, grad: Optional[torch.Tensor], averaged: bool = False) -> None:
        """Pushes ``grad`` (None: zeros) of Muon parameter ``p`` for its next step. ``averaged``:
        ``grad`` is already the ranks' mean (DDP's, with ``overlap=False``)."""
        if not self._pushed:  # the step's first push: nothing of it reached the server yet
            self._check_fixed_keys()
        m = self._meta[p]
        self._refuse_unsupported_grad(m.name, grad)
        step = self._server_step(p)
        if m.layout is not None:
            g = self._local_grad(m, grad, self._io_device(p))
        elif grad is None:
            g = torch.zeros(m.shape, dtype=torch.float32, device=self._io_device(p))
        else:
            g = grad.detach().reshape(m.shape)
            if self.world_size > 1 and averaged:
                # Every rank holds the mean. Registered as its row shard (ddp= at construction),
                # each pushes its rows of it; registered whole (DDP attached later), rank 0
                # pushes it and the others zeros: either way the server's sum is exactly the
                # mean (w copies of mean/w need not add up to it).
                if not self._pushes_ddp_mean and self.rank != 0:
                    g = torch.zeros_like(g)
            elif self.world_size > 1:
                g = g.to(torch.float32) / self.world_size
                if self.mode == "shard":
                    self._check_peers()
                    self._collective(lambda: dist.all_reduce(g, group=self._pg))
        # CUDA gradients stay on the device (pushed from device memory on the current stream).
        g = g.to(device=self._io_device(p),
                 dtype=_TORCH_DTYPE[self._grad_dtype]).contiguous().view(-1)
        self._pushed[p] = step
        self._failover.hold(m.name, g)  # before the push: a failover pushes it again
        server = m.server
        try:
            self._send(m, step, g)
        except ConnectionLost as e:
            if not self._failover.covers(m.name):
                raise
            self._fail_over(server, e)

    def _send(self, m: MuonParam, step: int, g: torch.Tensor) -> None:
        """Pushes ``g`` (the flat gradient as :meth:`_push` made it) of ``m`` for ``step``."""
        if m.layout is not None:
            # A DTensor's gradient is its local tensor: the held ranges packed, one push however
            # many ranges they are (a column block's rows), scattered by the server.
            if m.held:
                self._client.push_packed(m.name, step, 0, g, g.numel())
        else:
            # A plain tensor's gradient is the whole matrix, indexed by element.
            for b, e in m.held:
                self._client.push(m.name, step, b, g[b:e], e - b)

    def _fail_over(self, lost: int, error: ConnectionLost) -> None:
        """Server ``lost`` (an index into ``servers``) was lost with ``error``: every failover
        parameter that went there goes to the other server of its pair (failover.py), is
        registered there (the buddy takes it over from its replica; a restarted owner from the
        replicas its buddy streamed back), and the step in flight is pushed again from the held
        gradients and committed as far as it was. A server lost while doing so is failed over in
        turn, at most DirectFailover.MAX_MOVES_PER_STEP times a step; after that, or when a
        server holds another step than this optimizer's, raises ConnectionLost saying what is
        lost."""
        fo = self._failover
        while True:
            moved = [p for p in self._muon_params
                     if self._meta[p].server == lost and fo.covers(self._meta[p].name)]
            if not moved:
                raise error
            if fo.moves >= fo.MAX_MOVES_PER_STEP:
                raise self._both_lost(moved, error)
            fo.moves += 1
            for p in moved:
                m = self._meta[p]
                m.server = fo.other(m.name, lost)
            warnings.warn(
                f"muon_offload: rank {self.rank} lost server {self.servers[lost]} ({error}); its "
                f"{len(moved)} parameter(s) go to "
                f"{', '.join(sorted({self.servers[self._meta[p].server] for p in moved}))}, "
                "which holds their replica, and the step in flight is pushed there again",
                stacklevel=4)
            current, stale = None, []
            try:
                for p in moved:
                    current = self._meta[p].server
                    self._register_on_server(p)
                for p in moved:
                    current = self._meta[p].server
                    stale += self._taken_over_at_another_step(p)
                for p in moved if not stale else ():
                    m = self._meta[p]
                    current = m.server
                    if p in self._pushed:
                        for g in fo.held(m.name):
                            self._send(m, self._pushed[p], g)
                        if p in self._committed and m.held:
                            self._client.commit(m.name, self._pushed[p])
            except ConnectionLost as e:
                lost, error = current, e
                continue
            if stale:
                more = f" (and {len(stale) - 1} more)" if len(stale) > 1 else ""
                raise ConnectionLost(stale[0] + more, MUON_ERR_CONNECTION, 0, "connection_lost")
            return

    def _both_lost(self, moved, error: ConnectionLost) -> ConnectionLost:
        """The error when both servers of a failover pair were lost within one step: the
        replicas went with them; ``error`` is the last loss."""
        names = [self._meta[p].name for p in moved]
        pair = sorted({self.servers[i] for p in moved
                       for i in self._failover.pairs[self._meta[p].name]})
        return error.with_message(
            f"{error}\nThe owner and the buddy ({', '.join(pair)}) of {len(names)} parameter(s) "
            f"({', '.join(repr(n) for n in names[:3])}{', ...' if len(names) > 3 else ''}) were "
            "both lost within one step: no server holds their replica any more.")

    def _taken_over_at_another_step(self, p: torch.Tensor) -> list:
        """After a failover: the server now holding ``p`` must be at this optimizer's last step,
        or one past it when this rank's step in flight was applied before the loss (the server
        answers it from its replica). Returns [] then, else [a message naming both steps] (a
        buddy whose replication was off or had failed). Raises what fetching the step raises."""
        m = self._meta[p]
        last = self._server_last_step(m)
        mine = self._server_step(p) - 1
        if last == mine or (last == mine + 1 and p in self._pushed):
            return []
        return [f"server {self.servers[m.server]} took '{m.name}' over at "
                f"{'no step' if last < 0 else f'step {last}'}, but this optimizer's last step of "
                f"it is {mine}: the replica there is not this run's (replication off, or failing "
                "while its owner ran: see the owner's log); the momentum since is lost"]

    @staticmethod
    def _local_grad(m: MuonParam, grad, device: torch.device) -> torch.Tensor:
        """The gradient a DTensor parameter pushes: its local tensor (already reduced by the
        training stack: FSDP's reduce-scatter, TP's own), flattened, divided by the number of
        ranks the server sums for each element; zeros when the parameter got no gradient.
        InvalidArgument when the local gradient is not the parameter's local shape."""
        lay = m.layout
        if grad is None:
            return torch.zeros(lay.local_numel, dtype=torch.float32, device=device)
        g = local_tensor(grad).detach()
        if tuple(g.shape) != lay.local_shape:
            raise InvalidArgument(f"gradient of '{m.name}' has local shape {tuple(g.shape)}, "
                                  f"its parameter's placements {lay.placements} give "
                                  f"{lay.local_shape}")
        g = g.reshape(-1)
        if lay.contributors > 1:
            g = g.to(torch.float32) / lay.contributors
        return g

    def _io_device(self, p: torch.Tensor) -> torch.device:
        """Where the gradient and update buffers of ``p`` live: its CUDA device when the library
        takes device memory, else the CPU."""
        return p.device if (self._device_io and p.is_cuda) else torch.device("cpu")

    def _commit(self, p: torch.Tensor) -> None:
        m = self._meta[p]
        self._committed[p] = True  # before the commit: a failover commits it again
        if m.held:
            server = m.server
            try:
                self._client.commit(m.name, self._pushed[p])
            except ConnectionLost as e:
                if not self._failover.covers(m.name):
                    raise
                self._fail_over(server, e)

    def _await(self, work) -> None:
        """Waits for the collective of step() that agrees on the gradients while watching the
        server: a step this rank committed that the server failed meanwhile (the step timeout
        of a rank that stalled before its step(), which never joins the collective) raises the
        server's error here, as it would in the update waits that follow."""
        # The collective takes microseconds when every rank is here: sleep little at first (a
        # step pays it), back off to 1 ms, and ask the server only every 10 ms (one call per
        # committed parameter).
        nap, look = 1e-5, time.monotonic() + 0.01
        while not work.is_completed():
            if time.monotonic() >= look:
                for p in list(self._committed):
                    m = self._meta[p]
                    if m.wanted and self._client.update_state(m.name, self._pushed[p]) == "failed":
                        self._client.wait_update(m.name, self._pushed[p], torch.empty(
                            m.wanted_numel, dtype=_TORCH_DTYPE[self._update_dtype]))  # raises it
                look = time.monotonic() + 0.01
            time.sleep(nap)
            nap = min(2 * nap, 1e-3)
        work.wait()

    def _wait_update(self, p: torch.Tensor, step: int, buf: torch.Tensor) -> None:
        """Waits for the update of ``p``'s ``step`` into ``buf``, failing over (and waiting
        again on the other server of its pair) when its server is lost."""
        m = self._meta[p]
        while True:
            server = m.server
            try:
                self._client.wait_update(m.name, step, buf)
                self._failover.release(m.name)
                return
            except ConnectionLost as e:
                if not self._failover.covers(m.name):
                    raise
                self._fail_over(server, e)

    def _check_grad(self, p: torch.Tensor) -> None:
        """A gradient of ``p`` may be taken now: the optimizer is usable and ``p``'s step is not
        committed yet (MuonOffloadError otherwise). Called outside the hooks' _fail: a refusal
        leaves the step in flight, so that the next step() applies it (the server did) instead
        of the optimizer falling a step behind its server."""
        self._check_usable()
        if p in self._committed:
            raise MuonOffloadError(
                f"gradient of '{self._meta[p].name}' arrived after its step "
                f"{self._pushed.get(p)} was committed: for gradient accumulation wrap all "
                "but the last micro-batch in `with optimizer.no_commit():` (under DDP: "
                "`with model.no_sync():`), or call step() between backward passes. A backward "
                "whose step() is skipped was already applied by the server: that step stays in "
                "flight, and the next step() applies it (its gradient is that earlier "
                "backward's). To skip steps, or to clip or unscale gradients before step(), pass "
                "overlap=False")

    def _take_grad(self, p: torch.Tensor, grad: torch.Tensor) -> None:
        """Pushes ``grad`` for Muon parameter ``p`` and commits it (unless in no_commit)."""
        self._push(p, grad)
        if not self._no_commit_depth:
            self._commit(p)

    def _on_grad(self, p: torch.Tensor) -> None:
        """The post-accumulate-grad hook of a Muon parameter (not under DDP: the comm hook)."""
        if p.grad is None or self._ddp is not None:
            return
        t0 = time.perf_counter()
        self._check_grad(p)  # a refusal leaves the step in flight (no _fail)
        try:
            if self._no_commit_depth and self.mode == "shard" and self.world_size > 1 \
                    and self._meta[p].layout is None:
                return  # like DDP's no_sync: accumulate in .grad, all-reduce once at the end
            self._take_grad(p, p.grad)
            p.grad = None
        except _native.MuonOffloadError as e:
            self._fail(e)
        finally:
            self._hook_seconds += time.perf_counter() - t0

    def _on_ddp_grad(self, p: torch.Tensor, grad: torch.Tensor) -> bool:
        """From the DDP comm hook: takes the local gradient of Muon parameter ``p`` (True), or
        False for a parameter that is not this optimizer's Muon parameter."""
        if p not in self._meta:
            return False
        t0 = time.perf_counter()
        self._check_grad(p)  # a refusal leaves the step in flight (no _fail)
        try:
            if self._no_commit_depth:
                raise MuonOffloadError(
                    "optimizer.no_commit() under DistributedDataParallel: accumulate with "
                    "`with model.no_sync():` instead (DDP sums the micro-batches in .grad; the "
                    "last backward pushes the sum)")
            self._take_grad(p, grad)
        except _native.MuonOffloadError as e:
            self._fail(e)
        finally:
            self._hook_seconds += time.perf_counter() - t0
        return True

    @torch.no_grad()
    def step(self, closure=None):
        """Commits what backward left uncommitted, raises PeerLost when a server reported a rank
        of the job lost, starts the AdamW gradients' all-reduce, waits for the Muon updates and
        applies ``W <- W*(1 - lr*wd) - lr*U``, then steps AdamW. Returns the closure's loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        t0 = time.perf_counter()
        self._check_usable()
        self._check_fixed_keys()
        errors = []
        waited = []
        try:
            # A gradient another rank has and this one lacks is pushed as zeros below. In shard
            # mode with the overlap the Muon gradients were all-reduced as backward produced
            # them: AdamW only (with overlap=False they are all-reduced below, agreed first).
            self._agree_on_grads(([p for _, p in self._muon_items()]
                                  if self.mode == "server_reduce" or not self.overlap else []) +
                                 self._adamw_params(), self._pushed)
            for _, p in self._muon_items():
                if p not in self._pushed and p.grad is not None:
                    # overlap=False, or a gradient set without backward: pushed from .grad as
                    # clipping, unscaling or edits left it (under DDP: DDP's mean).
                    self._push(p, p.grad, averaged=self._ddp is not None and not self.overlap)
                    if self.overlap:
                        p.grad = None
                if p in self._pushed and p not in self._committed:
                    self._commit(p)
            # The server's verdict before any collective of ours: a rank it reported lost
            # surfaces as PeerLost, not as the all-reduce's "Connection reset by peer".
            self._check_peers()
            # The AdamW gradients' all-reduce runs in the background while the server computes;
            # it is waited for only after the Muon updates, so a rank that stalls or dies before
            # pushing shows as the server's timeout or peer_lost naming it, never as a silent
            # wait inside the all-reduce.
            averaged = self._start_average(self._adamw_grads())
            group_of = {p: g for g, p in self._muon_items()}
            for p in list(self._committed):
                m, g = self._meta[p], group_of[p]
                if self.overlap:
                    p.grad = None  # under DDP: the local gradient DDP copied back; consumed
                step = self._pushed[p]
                if not m.wanted:  # a rank that holds none of this sharded parameter
                    self.state[p]["step"] = step + 1
                    continue
                buf = torch.empty(m.wanted_numel, dtype=_TORCH_DTYPE[self._update_dtype],
                                  device=self._io_device(p))
                waited.append(step)
                try:
                    self._wait_update(p, step, buf)
                except NonFiniteGradient as e:  # the server consumed the step
                    errors.append(e)
                    self.state[p]["step"] = step + 1
                    continue
                self._apply(p, buf, g)
                self.state[p]["step"] = step + 1
            self._collective(averaged)
            self._collective(self._average_replicas)
            if self._adamw is not None:
                self._adamw.step()
        except _native.MuonOffloadError as e:
            self._fail(e)
        self._pushed.clear()
        self._committed.clear()
        self._failover.end_step()
        self.last_hook_seconds, self._hook_seconds = self._hook_seconds, 0.0
        self.last_step_seconds = time.perf_counter() - t0
        if waited:
            self._report_step(max(waited))
        self._raise_nonfinite(errors)
        return loss

    def _average_replicas(self) -> None:
        """Averages the AdamW DTensor gradients of modules sharded on a sub-mesh over the
        ``replica_mesh_dims`` their mesh lacks (FSDP reduce-scattered them within a replica
        only; the Muon gradients of those modules are summed by the server instead): one
        all-reduce per group of replicas, of AdamW gradients only."""
        if not self._replica_dims or self._adamw is None:
            return
        by_group: Dict[object, list] = {}
        for g in self._adamw.param_groups:
            for p in g["params"]:
                if p.grad is None or not is_dtensor(p.grad):
                    continue
                for pg, size in replica_groups(p, self._replica_dims):
                    by_group.setdefault(pg, [size]).append(local_tensor(p.grad))
        for pg, (size, *grads) in by_group.items():
            flat = torch.cat([t.reshape(-1).to(torch.float32) for t in grads]).div_(size)
            dist.all_reduce(flat, group=pg)
            pos = 0
            for t in grads:
                t.copy_(flat[pos:pos + t.numel()].view(t.shape))
                pos += t.numel()

    def _report_step(self, step: int) -> None:
        """Sends this rank's step report to the servers and keeps it as ``last_step_stats``."""
        try:
            stats = self._client.report_step(step)
        except _native.MuonOffloadError as e:
            self._fail(e)
        slowest = stats["slowest_parameter"]
        if self._prefix and slowest.startswith(self._prefix):
            slowest = slowest[len(self._prefix):]
        self.last_step_stats = {
            "step": stats["step"], "bytes_pushed": stats["bytes_pushed"],
            "push_frames": stats["push_frames"], "bytes_received": stats["bytes_received"],
            "exposed_wait_s": stats["exposed_wait_s"], "slowest_parameter": slowest,
            "parameters": stats["parameters"]}

    # -- state ---------------------------------------------------------------------------------
    def _param_index(self) -> Dict[torch.Tensor, int]:
        idx, i = {}, 0
        for g in self.param_groups:
            for p in g["params"]:
                if p not in idx:
                    idx[p] = i
                    i += 1
        return idx

    def state_dict(self):
        """The torch state dict plus, for each Muon parameter that took a step, the server-held
        momentum (``momentum_buffer``, fp32, matrix shape) fetched from its server. For a DTensor
        parameter (FSDP2 / TP) the momentum is this rank's shard as a DTensor laid out like the
        parameter (its global shape), so torch.distributed.checkpoint saves it shard by shard
        and loads it into another sharding (e.g. 4 ranks' checkpoint into 2)."""
        self._check_usable()
        if self._pushed:
            raise MuonOffloadError("state_dict() between backward and step(): call it after "
                                   "step()")
        sd = super().state_dict()
        idx = self._param_index()
        for p in self._muon_params:
            st = sd["state"].get(idx[p])
            if not st or not st.get("step"):
                continue
            m = self._meta[p]
            buf = torch.empty(m.shape, dtype=torch.float32)
            try:
                last = self._client.fetch_momentum(m.name, buf, after_step=st["step"] - 1)
            except _native.MuonOffloadError as e:
                self._fail(e)
            if last != st["step"] - 1:
                raise MuonOffloadError(
                    f"server holds the momentum of '{m.name}' at step {last}, the optimizer "
                    f"expects step {st['step'] - 1}")
            if m.layout is not None:
                buf = shard_like(buf, m.layout, p)
            sd["state"][idx[p]] = dict(st, momentum_buffer=buf)
        return sd

    def load_state_dict(self, state_dict):
        """Loads the torch state and puts each Muon parameter's momentum (bit-exact fp32) back
        into its server; the next step continues where the checkpoint left off. A DTensor
        momentum (a sharded state_dict, e.g. loaded by torch.distributed.checkpoint) is
        gathered once here (``full_tensor()``, on every rank: call it on all of them), since
        rank 0 loads each whole matrix into its server."""
        if self._client is None:
            raise MuonOffloadError("OffloadMuon is closed")
        saved = state_dict["state"]
        momenta = {k: v.get("momentum_buffer") for k, v in saved.items() if isinstance(v, dict)}
        MuonOptimizerBase.load_state_dict(self, state_dict)
        self._pushed.clear()
        self._committed.clear()
        # The saved key of each parameter, by position in the groups as torch.optim does
        # (ints from state_dict(); FQNs from torch.distributed.checkpoint.state_dict).
        key_of = {p: k for mine, saved_group in zip(self.param_groups,
                                                      state_dict.get("param_groups", []))
                  for p, k in zip(mine["params"], saved_group["params"])}
        last_per_server = {}
        for p in self._muon_params:
            st = self.state.get(p)
            st = st if st else {}
            st.pop("momentum_buffer", None)
            step = int(st.get("step", 0))
            if step == 0:
                continue
            m = self._meta[p]
            raw = momenta.get(key_of.get(p))
            if raw is None:
                raise InvalidArgument(f"state dict has no momentum_buffer for '{m.name}' "
                                      f"(step {step})")
            if is_dtensor(raw):
                raw = raw.full_tensor()
            if raw.numel() != m.numel:
                raise InvalidArgument(f"momentum_buffer of '{m.name}' has {raw.numel()} "
                                      f"elements, the parameter {m.numel}")
            if self.rank == 0:
                vals = raw.detach().to("cpu", torch.float32).contiguous().view(-1)
                try:
                    self._client.load_momentum(m.name, step - 1, vals)
                except _native.MuonOffloadError as e:
                    self._fail(e)
                last_per_server[m.server] = p
        # A round trip per server orders the loads before any rank's next push.
        for p in last_per_server.values():
            m = self._meta[p]
            try:
                self._client.fetch_momentum(m.name, torch.empty(m.numel, dtype=torch.float32))
            except _native.MuonOffloadError as e:
                self._fail(e)
        if self.world_size > 1:
            dist.barrier(group=self._pg)
        self._stale.clear()

    def reconnect(self) -> None:
        """Reconnects to every server and registers every parameter again (after a server
        restart). If the server's momentum does not match this optimizer's steps (a server that
        restarted without the right snapshot), step() refuses to run until load_state_dict()."""
        if self._client is None:
            raise MuonOffloadError("OffloadMuon is closed")
        self._pushed.clear()
        self._committed.clear()
        try:
            self._client.reconnect()
        except _native.MuonOffloadError as e:
            self._fail(e)
        self._stale.clear()
        for p in self._muon_params:
            m = self._meta[p]
            last = self._server_last_step(m)
            mine = self._server_step(p) - 1
            if last != mine:
                self._stale[m.name] = f"server at step {last}, optimizer at step {mine}"

    def momentum_buffer(self, p: torch.Tensor) -> torch.Tensor:
        """The server-held momentum of Muon parameter ``p`` (fp32, CPU, the matrix shape the
        server sees: ``p``'s own for 2-D), fetched from its server: as the last step applied
        left it, zeros before the first (waiting, up to the server's step timeout, for the step
        this optimizer last took to be applied there). The public way to read it (state_dict() carries the
        same tensors). Raises InvalidArgument for a parameter that is not on a server, the
        server's errors otherwise."""
        self._check_usable()
        m = self._meta.get(p)
        if m is None:
            raise InvalidArgument("momentum_buffer(): not a Muon parameter of this optimizer")
        buf = torch.empty(m.shape, dtype=torch.float32)
        try:
            # As of this optimizer's last step (a rank that wants no update of ``p`` leaves
            # step() before the server has applied it).
            self._client.fetch_momentum(m.name, buf, after_step=self._server_step(p) - 1)
        except _native.MuonOffloadError as e:
            self._fail(e)
        return buf

    def _server_last_step(self, m: MuonParam) -> int:
        """The last step the server applied to a parameter (-1: none)."""
        return self._client.fetch_momentum(m.name, torch.empty(m.numel, dtype=torch.float32))

    def _adopt_server_state(self, per_parameter: bool) -> None:
        """Takes each parameter's step from its server. InvalidArgument, naming the steps, when
        they differ (a snapshot written mid-step: a step applied to some parameters and not to
        others cannot be resumed from one trainer checkpoint), unless ``per_parameter``."""
        last = {p: self._server_last_step(self._meta[p]) for p in self._muon_params}
        if len(set(last.values())) > 1 and not per_parameter:
            by_step: Dict[int, list] = {}
            for p, s in last.items():
                by_step.setdefault(s, []).append(self._meta[p].name)
            parts = [f"{len(n)} at {'no step' if s < 0 else f'step {s}'} "
                     f"({', '.join(repr(x) for x in n[:3])}{', ...' if len(n) > 3 else ''})"
                     for s, n in sorted(by_step.items(), key=lambda kv: -len(kv[1]))]
            raise InvalidArgument(
                "resume_from_server: the servers hold this optimizer's parameters at different "
                f"steps: {'; '.join(parts)}. That is a snapshot written in the middle of a step "
                "(a server stopped mid-step, or a snapshot requested before every rank's step() "
                "returned); no trainer checkpoint matches it. Restore a snapshot written between "
                "steps (muon-offloadd --snapshot-every N, or optimizer.snapshot() after step()), "
                "or, if these parameters really step apart (some take no gradient on some "
                "steps), pass resume_from_server='per_parameter' to adopt each one's own step")
        fresh = [self._meta[p].name for p, s in last.items() if s < 0]
        if fresh:
            # Asked to resume, yet the server holds nothing of these: say so, not start silently.
            warnings.warn(
                f"resume_from_server: the servers hold no momentum for {len(fresh)} of this "
                f"optimizer's {len(last)} Muon parameter(s) ({', '.join(repr(n) for n in fresh[:3])}"
                f"{', ...' if len(fresh) > 3 else ''}): those start at step 0 with zero momentum "
                "(a server restarted without --restore, one that forgot the job after "
                "--forget-finished-jobs-after, or other names or prefix= than the run before); "
                "load your last trainer checkpoint to resume them", stacklevel=3)
        for p, s in last.items():
            if s >= 0:
                self.state[p]["step"] = s + 1

    def snapshot(self, path: str = "") -> None:
        """Asks every server to write a snapshot (``path`` per server gets ``.<i>`` appended
        when there are several; empty: each server's --snapshot path)."""
        for i in range(len(self.servers)):
            p = path if (not path or len(self.servers) == 1) else f"{path}.{i}"
            self._client.snapshot(i, p)
