"""Muon for PyTorch with the optimizer math in a muon-offloadd server (:class:`OffloadMuon`), and
the same optimizer computed in process with the server's own C++ kernels (:class:`InProcessMuon`).

The Muon math is :class:`muon_offload.config.MuonConfig`'s, torch.optim.Muon's by default (Muon:
Keller Jordan, "Muon: An optimizer for hidden layers in neural networks", 2024,
https://kellerjordan.github.io/posts/muon/), per matrix parameter W of shape (r, c) with
gradient G:

    M <- lerp(M, G, 1-mu)                (momentum_convention "ema"; "sum": M <- mu*M + G)
    X  = lerp(G, M, mu) (Nesterov) or M  ("sum": G + mu*M)
    U  = NS(X)                           Newton-Schulz, (3.4445, -4.7750, 2.0315) x ns_steps,
                                         on X/||X||_F (eps_mode; the server computes it)
    W <- W*(1 - lr*wd)                   (on the trainer: lr and wd may follow a scheduler)
    W <- W - lr*adjust_lr(r, c)*U        (adjust_lr_fn, torch's; or a server-side ``scale``)

Everything else — embeddings, the output head, norms, biases — is updated by a built-in AdamW
(Loshchilov & Hutter, arXiv:1711.05101: decoupled weight decay, bias-corrected moments).
"""
from __future__ import annotations

import contextlib
import math
import os
import re
import time
import warnings
import weakref
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from . import _native
from .client import Client, local_update
from .config import MuonConfig
from ._native import (ConnectionLost, InvalidArgument, MuonOffloadError, NonFiniteGradient)

__all__ = ["OffloadMuon", "InProcessMuon", "default_route", "MuonOffloadError"]

_TORCH_DTYPE = {"f32": torch.float32, "bf16": torch.bfloat16}


# ---------------------------------------------------------------------------------------------
# Routing: which tensors go to Muon, which to AdamW.

def default_route(name: Optional[str], p: torch.Tensor) -> str:
    """The usual split. Returns ``"muon"`` or ``"adamw"``:

    - fewer than 2 dimensions (biases, norm gains, scalars): AdamW;
    - a module path component that names an embedding or an output head (contains ``embed``;
      ``wte``, ``wpe``, ``tok_emb``, ``pos_emb``, ``lm_head``, ``head``, ``classifier``; a
      top-level ``output``) or a norm (contains ``norm``, or starts with ``ln``): AdamW;
    - everything else with 2+ dimensions (linear, conv, expert stacks): Muon.

    Without names (plain tensors given to the optimizer) only the ndim rule applies.
    """
    if p.ndim < 2:
        return "adamw"
    if name:
        comps = name.split(".")
        mods = [c.lower() for c in comps[:-1]] or [comps[0].lower()]
        for c in mods:
            if "embed" in c or "norm" in c or re.match(r"ln(_|\d|f|$)", c):
                return "adamw"
            if c in ("wte", "wpe", "tok_emb", "pos_emb", "lm_head", "head", "classifier"):
                return "adamw"
        if comps[0].lower() == "output" and len(comps) <= 2:
            return "adamw"
    return "muon"


def _matrix_shape(p: torch.Tensor, flatten: bool) -> Tuple[int, ...]:
    """[r, c] for 2-D; [b, r, c] for a 3-D expert stack; (out, in*kh*kw...) for conv weights
    (4-D and up, or 3-D when ``flatten``)."""
    s = tuple(p.shape)
    if len(s) == 2:
        return s
    if len(s) == 3 and not flatten:
        return s
    return (s[0], math.prod(s[1:]))


class _Meta:
    """What the optimizer knows about one Muon parameter. ``shape``: the matrix shape the server
    sees; ``blocks``: the row blocks orthogonalized separately ([rows] without row_splits)."""
    __slots__ = ("name", "shape", "options", "push", "server", "blocks")

    def __init__(self, name, shape, options, push, server, blocks):
        self.name, self.shape, self.options, self.push, self.server = (name, shape, options,
                                                                        push, server)
        self.blocks = blocks

    @property
    def numel(self):
        return math.prod(self.shape)


def _names_from(names) -> Dict[int, str]:
    if names is None:
        return {}
    if isinstance(names, torch.nn.Module):
        return {id(p): n for n, p in names.named_parameters()}
    out = {}
    for k, v in dict(names).items():
        if isinstance(k, str):
            out[id(v)] = k
        else:
            out[id(k)] = str(v)
    return out


def muon_config(config: Optional[MuonConfig], args: Sequence, keywords: Mapping,
                where: str) -> MuonConfig:
    """The MuonConfig of an optimizer's ``*muon_args, **muon_keywords`` (positional in
    torch.optim.Muon's order, MuonConfig.KEYWORDS), on top of ``config`` when given. TypeError
    for too many positional arguments, one given twice, or an unknown keyword."""
    if len(args) > len(MuonConfig.KEYWORDS):
        raise TypeError(f"{where} takes at most {len(MuonConfig.KEYWORDS)} positional Muon "
                        f"arguments ({', '.join(MuonConfig.KEYWORDS)}), got {len(args)}")
    given = dict(zip(MuonConfig.KEYWORDS, args))
    twice = sorted(set(given) & set(keywords))
    if twice:
        raise TypeError(f"{where} got multiple values for {twice}")
    given.update(keywords)
    if config is None:
        return MuonConfig.from_keywords(given, where)
    if not given:
        return config
    MuonConfig.from_keywords(given, where)  # names checked
    return config.replace(**given)


# ---------------------------------------------------------------------------------------------

class _MuonBase(torch.optim.Optimizer):
    """Shared by OffloadMuon and InProcessMuon: parameter parsing and routing, the AdamW part,
    the apply rule, distributed gradient averaging, timing."""

    def __init__(self, params, *, config: MuonConfig, adamw_lr, adamw_betas, adamw_eps,
                 adamw_weight_decay, names, route, mode, process_group, prefix):
        if mode not in ("server_reduce", "shard"):
            raise InvalidArgument(f"mode must be 'server_reduce' or 'shard', got {mode!r}")
        if adamw_lr < 0:
            raise InvalidArgument("learning rates must be >= 0")
        self.mode = mode
        self.config = config
        self._route = route
        self._names = _names_from(names)
        self._row_splits = dict(config.row_splits or {})
        self._prefix = prefix
        if process_group is None and dist.is_available() and dist.is_initialized():
            process_group = dist.group.WORLD
        self._pg = process_group
        self.world_size = dist.get_world_size(process_group) if process_group is not None else 1
        self.rank = dist.get_rank(process_group) if process_group is not None else 0
        self._meta: Dict[torch.Tensor, _Meta] = {}
        self._muon_params: List[torch.Tensor] = []
        self._unnamed = 0
        self._warned_unnamed = False
        self._ready = False
        self._adamw_defaults = {"lr": adamw_lr, "betas": tuple(adamw_betas), "eps": adamw_eps,
                                "weight_decay": (config.weight_decay if adamw_weight_decay is None
                                                 else adamw_weight_decay)}
        # A Muon group's keys are torch.optim.Muon's (its state_dict layout).
        defaults = {k: getattr(config, k) for k in MuonConfig.KEYWORDS}
        self.last_step_seconds = 0.0
        self.last_hook_seconds = 0.0
        self._hook_seconds = 0.0
        super().__init__(self._parse(params), defaults)
        self._ready = True

    # -- parameters and groups --------------------------------------------------------------
    def _parse(self, params) -> List[dict]:
        if isinstance(params, torch.Tensor):
            raise TypeError("params must be an iterable of tensors, (name, tensor) pairs or "
                            "dicts, not a tensor")
        items = list(params)
        if not items:
            raise InvalidArgument("optimizer got an empty parameter list")
        if all(isinstance(g, dict) for g in items):
            return items
        return [{"params": items}]

    def _name_of(self, p, given: Optional[str]) -> str:
        if given:
            return given
        n = self._names.get(id(p))
        if n:
            return n
        self._unnamed += 1
        return f"param.{self._unnamed - 1}"

    def add_param_group(self, param_group: dict) -> None:
        """Splits a user group into a Muon group (``use_muon=True``) and an AdamW group
        (``use_muon=False``, with ``adamw_lr``/``adamw_betas``/``adamw_eps``/
        ``adamw_weight_decay`` of the group or the optimizer). A group that sets ``use_muon``
        itself is taken as is. Keys of a group: lr, weight_decay (Muon), and the AdamW keys."""
        if "use_muon" in param_group and "param_names" in param_group:
            self._add_split_group(param_group)
            return
        g = dict(param_group)
        raw = g.pop("params")
        if isinstance(raw, torch.Tensor):
            raw = [raw]
        forced = g.pop("use_muon", None)
        muon, muon_names, adamw, adamw_names = [], [], [], []
        for item in raw:
            if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
                given, p = item
            else:
                given, p = None, item
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"optimizer can only optimize tensors, got {type(p).__name__}")
            name = self._name_of(p, given)
            if given is None and id(p) not in self._names and p.ndim >= 2 and forced is None \
                    and self._route is None and not self._warned_unnamed:
                warnings.warn("muon_offload: parameters without names are routed by ndim only "
                              "(every 2-D tensor goes to Muon, embeddings and the output head "
                              "too); pass model.named_parameters() or names=model to route "
                              "them to AdamW", stacklevel=4)
                self._warned_unnamed = True
            if forced is not None:
                kind = "muon" if forced else "adamw"
            else:
                kind = (self._route(name, p) if self._route else None) or default_route(name, p)
            if kind not in ("muon", "muon_flat", "adamw"):
                raise InvalidArgument(f"route returned {kind!r} for '{name}': expected 'muon', "
                                      "'muon_flat' or 'adamw'")
            if kind.startswith("muon") and p.ndim < 2:
                raise InvalidArgument(f"parameter '{name}' has shape {tuple(p.shape)}: Muon needs "
                                      "2 or more dimensions; route it to AdamW")
            if kind.startswith("muon"):
                muon.append(p)
                muon_names.append((name, kind == "muon_flat"))
            else:
                adamw.append(p)
                adamw_names.append(name)
        adamw_keys = {"adamw_lr": "lr", "adamw_betas": "betas", "adamw_eps": "eps",
                      "adamw_weight_decay": "weight_decay"}
        common = {k: v for k, v in g.items() if k not in adamw_keys
                  and k not in MuonConfig.KEYWORDS}
        if muon:
            mg = dict(g)
            for k in adamw_keys:
                mg.pop(k, None)
            mg.update(params=muon, use_muon=True, param_names=[n for n, _ in muon_names],
                      flatten=[f for _, f in muon_names])
            self._add_split_group(mg)
        if adamw:
            ag = dict(common)
            ag.update({short: g.get(long, self._adamw_defaults[short])
                       for long, short in adamw_keys.items()})
            ag.update(params=adamw, use_muon=False, param_names=adamw_names)
            self._add_split_group(ag)

    def _add_split_group(self, group: dict) -> None:
        if group["use_muon"]:
            super().add_param_group(group)
            flatten = group.get("flatten") or [False] * len(group["params"])
            new = []
            # The group's own torch.optim.Muon keywords (a group may set momentum, ns_steps...).
            cfg = self.config.replace(**{k: group[k] for k in MuonConfig.KEYWORDS
                                         if k != "ns_coefficients"},
                                      ns_coefficients=tuple(group["ns_coefficients"]))
            for p, name, flat in zip(group["params"], group["param_names"], flatten):
                shape = _matrix_shape(p, flat)
                opts = cfg.server_options()
                blocks = [shape[-2]]
                if name in self._row_splits:
                    blocks = [int(x) for x in self._row_splits[name]]
                    opts["row_splits"] = blocks
                self._meta[p] = _Meta(self._prefix + name, shape, opts, None, 0, blocks)
                self._muon_params.append(p)
                new.append(p)
            if self._ready:
                self._register(new)
        else:
            super().add_param_group(group)

    @property
    def routing(self) -> Dict[str, Tuple[str, Optional[Tuple[int, ...]]]]:
        """name -> ("muon", matrix shape as the server sees it) or ("adamw", None)."""
        out = {}
        for g in self.param_groups:
            for p, n in zip(g["params"], g["param_names"]):
                out[n] = ("muon", self._meta[p].shape) if g["use_muon"] else ("adamw", None)
        return out

    def _register(self, params: Sequence[torch.Tensor]) -> None:
        pass

    # -- shared math ---------------------------------------------------------------------
    def _average(self, tensors: List[torch.Tensor]) -> List[torch.Tensor]:
        """Data-parallel mean of local gradients: each rank divides by the world size, then one
        all-reduce (sum). With 2 ranks this is bitwise the server's contributor-order sum of
        grad/world (a two-term float sum is commutative)."""
        if self.world_size == 1 or not tensors:
            return tensors
        flat = torch.cat([t.reshape(-1).to(torch.float32) for t in tensors])
        flat.div_(self.world_size)
        dist.all_reduce(flat, group=self._pg)
        out, pos = [], 0
        for t in tensors:
            out.append(flat[pos:pos + t.numel()].view(t.shape).to(t.dtype))
            pos += t.numel()
        return out

    def _adamw_step(self) -> None:
        items = [(g, p) for g in self.param_groups if not g["use_muon"]
                 for p in g["params"] if p.grad is not None]
        if not items:
            return
        grads = self._average([p.grad for _, p in items])
        for (group, p), grad in zip(items, grads):
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            st = self.state[p]
            if not st:
                st["step"] = 0
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["step"] += 1
            t = st["step"]
            if wd != 0:
                p.mul_(1 - lr * wd)
            st["exp_avg"].mul_(b1).add_(grad, alpha=1 - b1)
            st["exp_avg_sq"].mul_(b2).addcmul_(grad, grad, value=1 - b2)
            denom = (st["exp_avg_sq"].sqrt() / math.sqrt(1 - b2 ** t)).add_(eps)
            p.addcdiv_(st["exp_avg"], denom, value=-lr / (1 - b1 ** t))

    def _apply(self, p: torch.Tensor, update: torch.Tensor, group: dict) -> None:
        """torch.optim.Muon's two in-place ops: W <- W*(1 - lr*wd), then W <- W - adjusted_lr*U
        with adjusted_lr = lr * adjust_lr(block shape) per row block (MuonConfig.lr_factor of
        the group's adjust_lr_fn; 1 when the server applied a ``scale``)."""
        lr, wd = group["lr"], group["weight_decay"]
        cfg = self.config
        if group.get("adjust_lr_fn") != cfg.adjust_lr_fn:
            cfg = cfg.replace(adjust_lr_fn=group.get("adjust_lr_fn"))
        m = self._meta[p]
        p.mul_(1 - lr * wd)
        u = update.to(device=p.device, dtype=p.dtype)
        cols = m.shape[-1]
        if len(m.blocks) == 1:
            p.add_(u.view(p.shape), alpha=-(lr * cfg.lr_factor(m.blocks[0], cols)))
            return
        u, w = u.view(m.shape), p.view(m.shape)
        r0 = 0
        for rows in m.blocks:
            w[..., r0:r0 + rows, :].add_(u[..., r0:r0 + rows, :],
                                        alpha=-(lr * cfg.lr_factor(rows, cols)))
            r0 += rows

    # Keys a Muon group's server registration fixed: a checkpoint must agree on them.
    _FIXED_KEYS = ("momentum", "nesterov", "ns_coefficients", "eps", "ns_steps")

    def load_state_dict(self, state_dict):
        """torch's load_state_dict, accepting torch.optim.Muon's layout too (no ``step``: taken
        as 1) and keeping this optimizer's own group keys (use_muon, param_names, flatten).
        Raises InvalidArgument when a Muon group of the checkpoint has another momentum,
        nesterov, ns_coefficients, eps or ns_steps than this optimizer registered."""
        for mine, saved in zip(self.param_groups, state_dict.get("param_groups", [])):
            if not mine["use_muon"]:
                continue
            for k in self._FIXED_KEYS:
                a, b = mine.get(k), saved.get(k, mine.get(k))
                if k == "ns_coefficients":
                    a, b = tuple(map(float, a)), tuple(map(float, b))
                if a != b:
                    raise InvalidArgument(
                        f"checkpoint group has {k}={b!r}, this optimizer registered {k}={a!r} "
                        "with its server: construct the optimizer with the checkpoint's value")
        private = [{k: g[k] for k in ("use_muon", "param_names", "flatten") if k in g}
                   for g in self.param_groups]
        super().load_state_dict(state_dict)
        for g, keys in zip(self.param_groups, private):
            for k, v in keys.items():
                g.setdefault(k, v)
        for _, p in self._muon_items():
            st = self.state.get(p)
            if st and "momentum_buffer" in st and "step" not in st:
                st["step"] = 1

    def momentum_buffer(self, p: torch.Tensor) -> torch.Tensor:
        """The momentum of Muon parameter ``p`` (fp32, CPU, the matrix shape the server sees:
        ``p``'s own for 2-D), as its last step left it; zeros before the first step."""
        raise NotImplementedError

    def _muon_items(self):
        for g in self.param_groups:
            if g["use_muon"]:
                for p in g["params"]:
                    yield g, p

    @property
    def exposed_seconds(self) -> float:
        """Optimizer time the trainer waited for in the last step: time inside step() plus time
        spent in the gradient hooks during the backward before it."""
        return self.last_step_seconds + self.last_hook_seconds

    @contextlib.contextmanager
    def no_commit(self):
        """Gradient accumulation: inside this context, backward passes push their gradients (they
        accumulate on the server) but do not commit them; the micro-batch after the context (or
        step()) commits. Use it for all but the last micro-batch::

            for i, mb in enumerate(micro_batches):
                ctx = opt.no_commit() if i + 1 < len(micro_batches) else contextlib.nullcontext()
                with ctx:
                    loss_fn(model(mb)).backward()
            opt.step()
        """
        self._no_commit_depth = getattr(self, "_no_commit_depth", 0) + 1
        try:
            yield self
        finally:
            self._no_commit_depth -= 1

    accumulating = no_commit


# ---------------------------------------------------------------------------------------------

class OffloadMuon(_MuonBase):
    """Muon with momentum and Newton-Schulz in muon-offloadd servers; a torch.optim.Optimizer.

    Args:
        params_or_groups: tensors, ``(name, tensor)`` pairs (``model.named_parameters()``), or
            param-group dicts of either. Names drive the routing (see :func:`default_route`);
            without names pass ``names=model`` (or a ``{name: tensor}`` mapping).
        *muon_args, **muon_keywords: the Muon math, the fields of one
            :class:`~muon_offload.config.MuonConfig` (or ``config=MuonConfig(...)``):
            torch.optim.Muon's ``lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
            ns_coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7, ns_steps=5,
            adjust_lr_fn=None`` with torch's defaults and meaning (positionally in that order),
            and the keyword-only ``momentum_convention``, ``eps_mode``, ``schedule``,
            ``scale``, ``extra_scale``, ``row_splits``. ``W <- W*(1 - lr*wd)``, then
            ``W <- W - lr*adjust_lr(r, c)*U`` as torch.optim.Muon; lr and weight_decay may change
            between steps (LR schedulers); momentum, nesterov and the Newton-Schulz keywords are
            fixed at registration. ``row_splits={name: [q, k, v]}`` orthogonalizes row blocks of
            a fused QKV separately (each block with its own adjust_lr factor).
        adamw_lr, adamw_betas, adamw_eps, adamw_weight_decay: the built-in AdamW for embeddings,
            the output head, norms and biases (weight decay defaults to ``weight_decay``).
        servers: Unix socket paths of the job's servers (list or comma-separated string);
            default: environment ``MUON_OFFLOAD_SERVERS`` (set by scripts/muon-offload-launch).
            Parameters are spread over the servers by Newton-Schulz cost (``assign`` overrides:
            ``{name: server index}``); with a plan (``MUON_OFFLOAD_PLAN``, set by the launcher's
            ``--plan``) each parameter it names goes to the server the plan gives this rank's
            domain: its relay (``parameters[].relays``), else its owner.
        mode: under torch.distributed with world size w > 1:
            ``"server_reduce"`` (default) — every rank pushes its local gradient divided by w and
            the server sums the w contributions (contributor order, deterministic): the server's
            sum is the mean gradient, like DDP; Muon matrices need no all-reduce at all.
            ``"shard"`` — ranks all-reduce each gradient themselves (mean), then each pushes only
            its row shard (1 contributor per element) and receives the whole update.
            AdamW parameters are averaged with one all-reduce in step() in both modes, so do not
            wrap the model in DistributedDataParallel.
        route: ``callable(name, tensor) -> "muon" | "muon_flat" | "adamw" | None`` overriding
            :func:`default_route` (None: default). ``"muon_flat"`` flattens a 3-D tensor (Conv1d)
            instead of treating it as an expert stack. A group key ``use_muon`` forces a group.
        prefix: prepended to the names the server sees (to share one server between jobs).
        resume_from_server: adopt the momentum and step the server holds (a server restarted
            with ``--restore``) instead of starting at step 0.
        data_plane: ``"shm"`` (host shared memory, any server) or ``"cuda_ipc"`` (the servers'
            device rings over CUDA IPC: same node, servers on the CUDA backend); default:
            environment ``MUON_OFFLOAD_DATA_PLANE``, else ``"shm"``. With ``cuda_ipc`` the rings
            are opened on the device of the first CUDA Muon parameter.

    Devices: CUDA parameters keep their gradients and updates on the device when the client
    library has CUDA (``muon_offload.has_cuda()``): gradients are pushed from device memory on
    the current stream (with ``cuda_ipc`` straight into the server's GPU, without host copies;
    with ``shm`` staged through the host by the library) and updates land in device buffers.
    CPU parameters go through host memory as always.

    Shapes: 2-D matrices go as they are; conv weights ``(out, in, kh, kw)`` as
    ``(out, in*kh*kw)`` (and scaled by that shape); 3-D ``(b, r, c)`` expert stacks as b
    independent matrices.

    Overlap: a hook on each Muon parameter pushes its gradient as soon as autograd has
    accumulated it and commits it, so the server runs Newton-Schulz while backward goes on. The
    pushed gradient is consumed: ``p.grad`` of Muon parameters is None after backward. step()
    runs the AdamW part, then waits for the updates and applies them. A Muon parameter that got
    no gradient is skipped (weights and momentum untouched), like torch optimizers do; under
    torch.distributed every rank must agree on which parameters have gradients.

    Gradient accumulation: wrap all but the last micro-batch in :meth:`no_commit` (alias
    ``accumulating``). In mode ``server_reduce`` each micro-batch's gradient is pushed and the
    pushes accumulate on the server (per rank, summed in contributor order); the last one
    commits. In mode ``shard`` gradients accumulate in ``.grad`` (like DDP's ``no_sync``) and
    are all-reduced and pushed once, by the last micro-batch. Missing ``no_commit``, a second
    backward before step() raises.

    Steps are explicit integers per parameter (``state[p]["step"]``), checked by the server.
    state_dict() carries the server-held momentum (``momentum_buffer``, fp32, matrix shape), so
    torch checkpoints resume bitwise; load_state_dict() loads it back into the server. The format
    is the same as InProcessMuon's.

    Figures: after each step(), ``last_step_stats`` holds what this rank saw of it —
    ``bytes_pushed`` (gradient bytes pushed since the previous step), ``exposed_wait_s`` (seconds
    step() was blocked waiting for updates: from its first wait to the last update in hand, not
    counting the time spent applying the updates already there), ``slowest_parameter`` (the
    parameter whose update arrived last), ``parameters`` (updates waited for) and ``step``. The
    same report goes to every server (``muon_offload_client_exposed_wait_seconds`` on its
    ``--metrics-port``; ``muon-offload status``). ``exposed_seconds`` is the wider figure: all of
    step() plus the gradient hooks.

    Errors: :class:`~muon_offload.ConnectionLost` when a server is unreachable or restarted (the
    message says how to recover: :meth:`reconnect` then :meth:`load_state_dict`),
    :class:`~muon_offload.ServerError` when it refuses a parameter (naming it),
    :class:`~muon_offload.PeerLost`, :class:`~muon_offload.Timeout`,
    :class:`~muon_offload.NonFiniteGradient` (the step of that parameter is consumed, its weights
    untouched).
    """

    def __init__(self, params_or_groups, *muon_args, config: Optional[MuonConfig] = None,
                 servers=None, adamw_lr: float = 3e-4,
                 adamw_betas: Tuple[float, float] = (0.9, 0.95), adamw_eps: float = 1e-8,
                 adamw_weight_decay: Optional[float] = None, mode: str = "server_reduce",
                 names=None, route: Optional[Callable] = None,
                 process_group=None, prefix: str = "", assign: Optional[Mapping[str, int]] = None,
                 grad_dtype: str = "f32", update_dtype: str = "f32",
                 connect_timeout_s: float = 10.0, timeout_s: float = 120.0,
                 resume_from_server: bool = False, data_plane: Optional[str] = None,
                 **muon_keywords):
        config = muon_config(config, muon_args, muon_keywords, type(self).__name__)
        if servers is None:
            servers = os.environ.get("MUON_OFFLOAD_SERVERS", "")
            if not servers:
                raise InvalidArgument(
                    "OffloadMuon: no server given: pass servers=[socket, ...] or set "
                    "MUON_OFFLOAD_SERVERS (scripts/muon-offload-launch starts servers and sets it)")
        if isinstance(servers, str):
            servers = [s for s in servers.split(",") if s]
        if grad_dtype not in _TORCH_DTYPE or update_dtype not in _TORCH_DTYPE:
            raise InvalidArgument("grad_dtype and update_dtype must be 'f32' or 'bf16'")
        self.servers = list(servers)
        self._grad_dtype, self._update_dtype = grad_dtype, update_dtype
        self._client: Optional[Client] = None
        self._pushed: Dict[torch.Tensor, int] = {}  # param -> step being gathered
        self._committed: Dict[torch.Tensor, bool] = {}  # ordered, identity-keyed
        self._hook_handles = []
        self._stale: Dict[str, str] = {}
        self._no_commit_depth = 0
        self._loads = [0.0] * len(self.servers)
        self.last_step_stats: Dict[str, object] = {}
        self._device_io = False  # CUDA tensors through the library's device entry points
        super().__init__(params_or_groups, config=config, adamw_lr=adamw_lr,
                         adamw_betas=adamw_betas, adamw_eps=adamw_eps,
                         adamw_weight_decay=adamw_weight_decay, names=names, route=route,
                         mode=mode, process_group=process_group, prefix=prefix)
        # After the base class: it resolved the process group, which gives this rank's domain.
        self._assign = dict(assign or {}) or _plan_targets(os.environ.get("MUON_OFFLOAD_PLAN"),
                                                           _plan_rank(self._pg))
        self._from_plan = not assign and bool(os.environ.get("MUON_OFFLOAD_PLAN"))
        cuda_params = [p for p in self._muon_params if p.is_cuda]
        # cuda_ipc opens the rings on the current device: the one the parameters live on.
        on_device = (torch.cuda.device(cuda_params[0].device) if cuda_params
                     else contextlib.nullcontext())
        try:
            with on_device:
                self._client = Client(self.servers, rank=self.rank, world_size=self.world_size,
                                      name=f"rank {self.rank} pid {os.getpid()}",
                                      connect_timeout_ms=int(connect_timeout_s * 1000),
                                      op_timeout_ms=int(timeout_s * 1000), data_plane=data_plane)
        except ConnectionLost as e:
            raise ConnectionLost(
                f"{e}\n(is muon-offloadd running? start it with scripts/muon-offload-launch, or "
                f"`muon-offloadd --socket {self.servers[0]}`; check with "
                f"`muon-offload health --socket {self.servers[0]}`)", e.code) from None
        self._device_io = bool(cuda_params) and _native.has_cuda()
        try:
            self._register(self._muon_params)
            if resume_from_server:
                self._adopt_server_state()
        except BaseException:
            self.close()  # a refused parameter: say goodbye, do not linger as rank r
            raise

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
            else:  # least-loaded server by Newton-Schulz cost ~ (min side)^2 * max side
                s = m.shape
                r, c = s[-2], s[-1]
                cost = (s[0] if len(s) == 3 else 1) * min(r, c) ** 2 * max(r, c)
                m.server = min(range(len(self.servers)), key=lambda i: self._loads[i])
                self._loads[m.server] += cost
            numel = m.numel
            if self.mode == "shard" and self.world_size > 1:
                cols = m.shape[-1]
                rows = numel // cols
                cut = [(i * rows // self.world_size) * cols for i in range(self.world_size + 1)]
                b, e = cut[self.rank], cut[self.rank + 1]
                m.push = [(b, e)] if e > b else []
            else:
                m.push = [(0, numel)]
            try:
                self._client.register(m.name, m.shape, m.options, push=m.push,
                                      want=[(0, numel)], server=m.server,
                                      grad_dtype=self._grad_dtype, update_dtype=self._update_dtype)
            except _native.MuonOffloadError as e:
                raise type(e)(f"the server refused parameter '{m.name}' (shape "
                              f"{tuple(p.shape)} -> {m.shape}, options {m.options}): {e}",
                              e.code) from None
            if p.requires_grad:
                self._install_hook(p)

    def _install_hook(self, p: torch.Tensor) -> None:
        ref = weakref.ref(self)

        def hook(*_):
            opt = ref()
            if opt is not None:
                opt._on_grad(p)

        # After the gradient is accumulated into p.grad (torch >= 2.1).
        self._hook_handles.append(p.register_post_accumulate_grad_hook(lambda t: hook()))

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
        if isinstance(e, ConnectionLost):
            raise ConnectionLost(
                f"{e}\nThe muon-offloadd server ({', '.join(self.servers)}) is unreachable, "
                "stopped or restarted; the server-held momentum of this job is there. Restart it "
                "(muon-offloadd --restore SNAPSHOT keeps the momentum of its last snapshot), then "
                "call optimizer.reconnect() and, unless the server restored exactly this step, "
                "optimizer.load_state_dict(checkpoint).", e.code) from None
        msg = str(e)
        if isinstance(e, _native.ServerError) and ("already applied" in msg or "step gap" in msg):
            raise type(e)(
                f"{msg}\nThe server's step for this parameter does not follow this optimizer's: "
                "it holds state from another run (use a fresh server, another prefix=, or "
                "resume_from_server=True) or the optimizer state was not loaded "
                "(optimizer.load_state_dict(checkpoint)).", e.code) from None
        raise e

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
        st = self.state[p]
        return int(st.get("step", 0))

    def _push(self, p: torch.Tensor, grad: Optional[torch.Tensor]) -> None:
        m = self._meta[p]
        step = self._server_step(p)
        if grad is None:
            g = torch.zeros(m.shape, dtype=torch.float32, device=self._io_device(p))
        else:
            g = grad.detach().reshape(m.shape)
            if self.world_size > 1:
                g = g.to(torch.float32) / self.world_size
                if self.mode == "shard":
                    dist.all_reduce(g, group=self._pg)
        # CUDA gradients stay on the device (pushed from device memory on the current stream).
        g = g.to(device=self._io_device(p),
                 dtype=_TORCH_DTYPE[self._grad_dtype]).contiguous().view(-1)
        for b, e in m.push:
            self._client.push(m.name, step, b, g[b:e], e - b)
        self._pushed[p] = step

    def _io_device(self, p: torch.Tensor) -> torch.device:
        """Where the gradient and update buffers of ``p`` live: its CUDA device when the library
        takes device memory, else the CPU."""
        return p.device if (self._device_io and p.is_cuda) else torch.device("cpu")

    def _commit(self, p: torch.Tensor) -> None:
        m = self._meta[p]
        if m.push:
            self._client.commit(m.name, self._pushed[p])
        self._committed[p] = True

    def _on_grad(self, p: torch.Tensor) -> None:
        if p.grad is None:
            return
        t0 = time.perf_counter()
        try:
            self._check_usable()
            if p in self._committed:
                raise MuonOffloadError(
                    f"gradient of '{self._meta[p].name}' arrived after its step "
                    f"{self._pushed.get(p)} was committed: for gradient accumulation wrap all "
                    "but the last micro-batch in `with optimizer.no_commit():`, or call step() "
                    "between backward passes")
            if self._no_commit_depth and self.mode == "shard" and self.world_size > 1:
                return  # like DDP's no_sync: accumulate in .grad, all-reduce once at the end
            self._push(p, p.grad)
            p.grad = None
            if not self._no_commit_depth:
                self._commit(p)
        except _native.MuonOffloadError as e:
            self._fail(e)
        finally:
            self._hook_seconds += time.perf_counter() - t0

    @torch.no_grad()
    def step(self, closure=None):
        """Commits what backward left uncommitted, runs AdamW, waits for the Muon updates and
        applies ``W <- W*(1 - lr*wd) - lr*U``. Returns the closure's loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        t0 = time.perf_counter()
        self._check_usable()
        errors = []
        try:
            for _, p in self._muon_items():
                if p not in self._pushed and p.grad is not None:
                    self._push(p, p.grad)  # gradients set without backward hooks
                    p.grad = None
                if p in self._pushed and p not in self._committed:
                    self._commit(p)
            self._adamw_step()  # runs while the server computes
            group_of = {p: g for g, p in self._muon_items()}
            waited = []
            for p in list(self._committed):
                m, g = self._meta[p], group_of[p]
                buf = torch.empty(m.numel, dtype=_TORCH_DTYPE[self._update_dtype],
                                  device=self._io_device(p))
                step = self._pushed[p]
                waited.append(step)
                try:
                    self._client.wait_update(m.name, step, buf)
                except NonFiniteGradient as e:  # the server consumed the step
                    errors.append(e)
                    self.state[p]["step"] = step + 1
                    continue
                self._apply(p, buf, g)
                self.state[p]["step"] = step + 1
        except _native.MuonOffloadError as e:
            self._fail(e)
        self._pushed.clear()
        self._committed.clear()
        self.last_hook_seconds, self._hook_seconds = self._hook_seconds, 0.0
        self.last_step_seconds = time.perf_counter() - t0
        if waited:
            self._report_step(max(waited))
        if errors:
            raise NonFiniteGradient("; ".join(str(e) for e in errors) +
                                    " (these parameters were not updated this step)",
                                    errors[0].code)
        return loss

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
        momentum (``momentum_buffer``, fp32, matrix shape) fetched from its server."""
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
                last = self._client.fetch_momentum(m.name, buf)
            except _native.MuonOffloadError as e:
                self._fail(e)
            if last != st["step"] - 1:
                raise MuonOffloadError(
                    f"server holds the momentum of '{m.name}' at step {last}, the optimizer "
                    f"expects step {st['step'] - 1}")
            sd["state"][idx[p]] = dict(st, momentum_buffer=buf)
        return sd

    def load_state_dict(self, state_dict):
        """Loads the torch state and puts each Muon parameter's momentum (bit-exact fp32) back
        into its server; the next step continues where the checkpoint left off."""
        if self._client is None:
            raise MuonOffloadError("OffloadMuon is closed")
        saved = state_dict["state"]
        momenta = {k: v.get("momentum_buffer") for k, v in saved.items() if isinstance(v, dict)}
        _MuonBase.load_state_dict(self, state_dict)
        self._pushed.clear()
        self._committed.clear()
        idx = self._param_index()
        last_per_server = {}
        for p in self._muon_params:
            st = self.state.get(p)
            st = st if st else {}
            st.pop("momentum_buffer", None)
            step = int(st.get("step", 0))
            if step == 0:
                continue
            m = self._meta[p]
            raw = momenta.get(idx[p])
            if raw is None:
                raise InvalidArgument(f"state dict has no momentum_buffer for '{m.name}' "
                                      f"(step {step})")
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
        left it, zeros before the first. The public way to read it (state_dict() carries the
        same tensors). Raises InvalidArgument for a parameter that is not on a server, the
        server's errors otherwise."""
        self._check_usable()
        m = self._meta.get(p)
        if m is None:
            raise InvalidArgument("momentum_buffer(): not a Muon parameter of this optimizer")
        buf = torch.empty(m.shape, dtype=torch.float32)
        try:
            self._client.fetch_momentum(m.name, buf)
        except _native.MuonOffloadError as e:
            self._fail(e)
        return buf

    def _server_last_step(self, m: _Meta) -> int:
        """The last step the server applied to a parameter (-1: none)."""
        return self._client.fetch_momentum(m.name, torch.empty(m.numel, dtype=torch.float32))

    def _adopt_server_state(self) -> None:
        for p in self._muon_params:
            last = self._server_last_step(self._meta[p])
            if last >= 0:
                self.state[p]["step"] = last + 1

    def snapshot(self, path: str = "") -> None:
        """Asks every server to write a snapshot (``path`` per server gets ``.<i>`` appended
        when there are several; empty: each server's --snapshot path)."""
        for i in range(len(self.servers)):
            p = path if (not path or len(self.servers) == 1) else f"{path}.{i}"
            self._client.snapshot(i, p)


# ---------------------------------------------------------------------------------------------

def _plan_rank(process_group=None) -> int:
    """This process's rank among the plan's compute ranks: its torch.distributed (global) rank
    when a process group is in use, else environment ``RANK`` (torchrun), else 0."""
    if process_group is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    try:
        return int(os.environ.get("RANK") or 0)
    except ValueError:
        raise InvalidArgument(f"environment RANK={os.environ['RANK']!r} is not an "
                              "integer") from None


def _plan_targets(path: Optional[str], rank: int = 0) -> Dict[str, int]:
    """The server (index into MUON_OFFLOAD_SERVERS) this rank pushes each planned parameter to:
    its domain's relay, or the owner. The plan is written by `muon-offload plan`
    (``MUON_OFFLOAD_PLAN``, set by scripts/muon-offload-launch); the relay is
    ``parameters[].relays[domain]``, ``domain`` being that of ``rank`` in the plan's ``ranks``;
    the owner where that relay is null or the plan does not list the rank. A relay sums its
    domain's contributions, forwards one partial sum to the owner and returns the owner's update
    to its domain's ranks. Parameters the plan does not name are placed by cost as without a
    plan. With ``MUON_OFFLOAD_SERVERS_SCOPE=global`` (a plan
    spanning hosts) the servers are every server of the plan in id order, so a server's id is its
    index; otherwise they are this node's servers in the plan's order."""
    if not path:
        return {}
    import json
    try:
        with open(path) as f:
            plan = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"MUON_OFFLOAD_PLAN '{path}': {e}") from None
    domain = next((r.get("domain") for r in plan.get("ranks") or []
                   if isinstance(r, dict) and r.get("rank") == rank), None)

    def target(p):
        relays = p.get("relays")
        if (_is_index(domain) and isinstance(relays, list) and domain < len(relays)
                and _is_index(relays[domain])):
            return relays[domain]
        return p.get("owner")

    targets = {p["name"]: target(p) for p in plan.get("parameters", [])}
    if os.environ.get("MUON_OFFLOAD_SERVERS_SCOPE") == "global":
        return {name: t for name, t in targets.items() if _is_index(t)}
    # The launcher lists this node's servers in the plan's order: map global ids to that order.
    node_servers = {}
    for node in plan.get("nodes", []):
        for i, s in enumerate(node.get("servers", [])):
            node_servers.setdefault(node.get("node_rank"), {})[s["id"]] = i
    node_rank = int(os.environ.get("SLURM_NODEID", os.environ.get("NODE_RANK",
                                                                  os.environ.get("GROUP_RANK", 0))))
    local = node_servers.get(node_rank, {})
    return {name: local[t] for name, t in targets.items() if _is_index(t) and t in local}


def _is_index(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


# OffloadMuon's arguments that InProcessMuon accepts and ignores, so the classes swap freely.
_OFFLOAD_ONLY = {"servers", "assign", "grad_dtype", "update_dtype", "connect_timeout_s",
                 "timeout_s", "resume_from_server", "data_plane"}


class InProcessMuon(_MuonBase):
    """The reference: the same optimizer as :class:`OffloadMuon` (same arguments, routing,
    AdamW, apply rule, state_dict format), with the Muon update computed in this process by the
    server's own C++ kernels (``muon_local_update``, CPU backend, ``threads`` OpenBLAS threads).
    With the server's thread count (``muon-offloadd --threads``, 1 in the demo) the updates, and
    so the whole training run, are bitwise those of OffloadMuon. Momentum lives in
    ``state[p]["momentum_buffer"]`` (fp32, matrix shape). Under torch.distributed, gradients are
    averaged as grad/world + one all-reduce (sum) — the server's reduction with 2 ranks — in
    both modes. ``no_commit()`` is accepted and does nothing (gradients accumulate in .grad).

    The kernels set the OpenBLAS thread count of the whole process (``threads``); where torch
    runs on the same OpenBLAS (Debian's python3-torch does), that count applies to torch's
    matmuls too — set ``OPENBLAS_NUM_THREADS`` to the same value for reproducible runs."""

    def __init__(self, params_or_groups, *muon_args, config: Optional[MuonConfig] = None,
                 threads: int = 1, adamw_lr: float = 3e-4,
                 adamw_betas: Tuple[float, float] = (0.9, 0.95), adamw_eps: float = 1e-8,
                 adamw_weight_decay: Optional[float] = None, mode: str = "server_reduce",
                 names=None, route: Optional[Callable] = None, process_group=None,
                 prefix: str = "", **keywords):
        offload_only = {k: keywords.pop(k) for k in list(keywords) if k in _OFFLOAD_ONLY}
        del offload_only  # accepted so that the two classes swap freely
        config = muon_config(config, muon_args, keywords, type(self).__name__)
        self.threads = int(threads)
        super().__init__(params_or_groups, config=config, adamw_lr=adamw_lr,
                         adamw_betas=adamw_betas, adamw_eps=adamw_eps,
                         adamw_weight_decay=adamw_weight_decay, names=names, route=route,
                         mode=mode, process_group=process_group, prefix=prefix)
        self._no_commit_depth = 0

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
        items = [(g, p) for g, p in self._muon_items() if p.grad is not None]
        grads = self._average([p.grad for _, p in items])
        errors = []
        updates = []
        for (g, p), grad in zip(items, grads):
            m = self._meta[p]
            st = self.state[p]
            st.setdefault("step", 0)
            if "momentum_buffer" not in st:
                st["momentum_buffer"] = torch.zeros(m.shape, dtype=torch.float32)
            gm = grad.reshape(m.shape).to("cpu", torch.float32).contiguous()
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
        if errors:
            raise NonFiniteGradient("; ".join(str(e) for e in errors) +
                                    " (these parameters were not updated this step)",
                                    errors[0].code)
        return loss
