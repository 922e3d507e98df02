"""What :class:`~muon_offload.offload.OffloadMuon` and :class:`~muon_offload.in_process.InProcessMuon`
share: :class:`MuonOptimizerBase`, a torch.optim.Optimizer whose param groups are split into
Muon groups (torch.optim.Muon's keys, computed by a subclass) and AdamW groups (updated by an
inner ``torch.optim.AdamW``: its foreach or fused path as torch picks, its state in this
optimizer's state_dict exactly as torch.optim.AdamW keeps it), the apply rule of torch.optim.Muon,
data-parallel averaging without DDP, checkpoint checks and timing."""
from __future__ import annotations

import contextlib
import os
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from ._native import InvalidArgument, NonFiniteGradient
from . import plan as plan_reader
from .compute_layouts import match as match_layout, resolve as resolve_layout
from .config import MuonConfig
from .layouts import is_dtensor, local_tensor
from .muon_param import MuonParam
from .routing import Router, matrix_shape

__all__ = ["MuonOptimizerBase", "muon_config", "base_keywords"]

# The constructor keywords both optimizers take and hand to MuonOptimizerBase unchanged (their
# meaning is documented on OffloadMuon); one list, so the two classes cannot drift apart.
BASE_KEYWORDS = ("adamw_lr", "adamw_betas", "adamw_eps", "adamw_weight_decay", "mode", "names",
                 "route", "ddp", "process_group", "prefix")


def base_keywords(scope: dict) -> dict:
    """The BASE_KEYWORDS entries of ``scope`` (a subclass constructor's ``locals()``), to pass
    on as ``super().__init__(..., **base_keywords(locals()))``. KeyError names a missing one."""
    return {k: scope[k] for k in BASE_KEYWORDS}


def muon_config(config: Optional[MuonConfig], args: Sequence, keywords: dict,
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


class MuonOptimizerBase(torch.optim.Optimizer):
    """The shared part (see the module docstring). Subclasses compute the Muon updates
    (``_register`` for new Muon parameters, ``step``, ``momentum_buffer``).

    Group layout: every user group becomes a Muon group (``use_muon=True``, torch.optim.Muon's
    keys ``lr``, ``weight_decay``, ``momentum``, ``nesterov``, ``ns_coefficients``, ``eps``,
    ``ns_steps``, ``adjust_lr_fn``, plus ``param_names`` and ``flatten``) and an AdamW group
    (``use_muon=False``, torch.optim.AdamW's keys, ``param_names``), empty ones left out.
    ``state[p]`` of an AdamW parameter is torch.optim.AdamW's (``step``, ``exp_avg``,
    ``exp_avg_sq``); of a Muon parameter ``step`` (int, the next step) and the subclass's.
    """

    def __init__(self, params, *, config: MuonConfig, adamw_lr, adamw_betas, adamw_eps,
                 adamw_weight_decay, names, route, ddp, mode, process_group, prefix):
        """``ddp`` names the parameters when ``names`` is None (its named_parameters()); the
        subclass attaches it (:meth:`attach_ddp`) once it can serve it."""
        if ddp is not None and names is None:
            names = ddp
        if mode not in ("server_reduce", "shard"):
            raise InvalidArgument(f"mode must be 'server_reduce' or 'shard', got {mode!r}")
        if adamw_lr < 0:
            raise InvalidArgument("learning rates must be >= 0")
        self.mode = mode
        self.config = config
        self._row_splits = dict(config.row_splits or {})
        self._compute_layouts = dict(config.compute_layouts or {})
        self._plan_row_blocks = plan_reader.row_blocks(os.environ.get("MUON_OFFLOAD_PLAN"))
        self._prefix = prefix
        self._adamw_defaults = {"lr": adamw_lr, "betas": tuple(adamw_betas), "eps": adamw_eps,
                                "weight_decay": (config.weight_decay if adamw_weight_decay is None
                                                 else adamw_weight_decay)}
        self._router = Router(names, route, self._adamw_defaults)
        if process_group is None and dist.is_available() and dist.is_initialized():
            process_group = dist.group.WORLD
        self._pg = process_group
        self.world_size = dist.get_world_size(process_group) if process_group is not None else 1
        self.rank = dist.get_rank(process_group) if process_group is not None else 0
        # The _FIXED_KEYS of each Muon group (by index) as its parameters were registered.
        self._registered_keys: Dict[int, dict] = {}
        self._meta: Dict[torch.Tensor, MuonParam] = {}
        self._tensor_of_name: Dict[str, torch.Tensor] = {}  # every group's names (unique)
        self._muon_params: List[torch.Tensor] = []
        self._adamw: Optional[torch.optim.AdamW] = None
        self._ddp = None  # the DistributedDataParallel module attach_ddp() was given
        self._ready = False
        self._no_commit_depth = 0
        self.last_step_seconds = 0.0
        self.last_hook_seconds = 0.0
        self._hook_seconds = 0.0
        # A Muon group's keys are torch.optim.Muon's (its state_dict layout).
        defaults = {k: getattr(config, k) for k in MuonConfig.KEYWORDS}
        super().__init__(self._parse(params), defaults)
        self._ready = True

    # -- parameters and groups --------------------------------------------------------------
    @staticmethod
    def _parse(params) -> List[dict]:
        if isinstance(params, torch.Tensor):
            raise TypeError("params must be an iterable of tensors, (name, tensor) pairs or "
                            "dicts, not a tensor")
        items = list(params)
        if not items:
            raise InvalidArgument("optimizer got an empty parameter list")
        if all(isinstance(g, dict) for g in items):
            return items
        return [{"params": items}]

    def add_param_group(self, param_group: dict) -> None:
        """Splits a user group into a Muon group and an AdamW group (:class:`Router`), with the
        user group's ``lr``/``weight_decay``/... for Muon and ``adamw_lr``/``adamw_betas``/
        ``adamw_eps``/``adamw_weight_decay`` (else the optimizer's) for AdamW. A group that
        sets ``use_muon`` and ``param_names`` itself is taken as is."""
        if "use_muon" in param_group and "param_names" in param_group:
            self._add_split_group(param_group)
            return
        for group in self._router.split(param_group):
            self._add_split_group(group)

    def _check_names_unique(self, group: dict) -> None:
        """InvalidArgument when a name of ``group`` already names another tensor of this
        optimizer: names key the server's parameters, ``routing`` and the checkpoint, so two
        models whose ``named_parameters()`` share names (two ``nn.Sequential``) would collide."""
        for p, name in zip(group["params"], group["param_names"]):
            other = self._tensor_of_name.setdefault(name, p)
            if other is not p:
                raise InvalidArgument(
                    f"two tensors are both named '{name}': names key the server's parameters, "
                    "the routing and the checkpoint, so each must be unique in one optimizer; "
                    "give the models their own names (e.g. [(f\"dec.{n}\", p) for n, p in "
                    "dec.named_parameters()]) or put them under one nn.Module")

    def _add_split_group(self, group: dict) -> None:
        self._check_names_unique(group)
        if not group["use_muon"]:
            self._add_adamw_group(group)
            return
        super().add_param_group(group)
        self._registered_keys[len(self.param_groups) - 1] = self._fixed_values(group)
        flatten = group.get("flatten") or [False] * len(group["params"])
        # The group's own torch.optim.Muon keywords (a group may set momentum, ns_steps...).
        cfg = self.config.replace(**{k: group[k] for k in MuonConfig.KEYWORDS
                                     if k != "ns_coefficients"},
                                  ns_coefficients=tuple(group["ns_coefficients"]))
        new = []
        for i, (p, name, flat) in enumerate(zip(group["params"], group["param_names"], flatten)):
            if torch.is_complex(p):  # torch.optim.Muon refuses them too (at its step)
                raise InvalidArgument(f"parameter '{name}': Muon does not support complex "
                                      "parameters")
            layout = self._compute_layout(name)
            flat_by_layout, blocks = resolve_layout(name, tuple(p.shape), matrix_shape(p, flat),
                                                    layout)
            if flat_by_layout and not flat:
                flat = group.setdefault("flatten", list(flatten))[i] = True
            shape = matrix_shape(p, flat)
            opts = cfg.server_options()
            if len(blocks) > 1 or name in self._row_splits:
                opts["row_splits"] = blocks
            self._meta[p] = MuonParam(self._prefix + name, shape, opts, blocks)
            self._muon_params.append(p)
            new.append(p)
        if self._ready:
            self._register(new)

    def _compute_layout(self, name: str):
        """The compute layout of Muon parameter ``name`` (muon_offload.compute_layouts): its
        ``row_splits``, else the first ``compute_layouts`` pattern that matches, else the plan's
        ``row_blocks``, else None (the whole matrix; each expert of a 3-D stack)."""
        if name in self._row_splits:
            return [int(x) for x in self._row_splits[name]]
        layout = match_layout(name, self._compute_layouts)
        if layout is None and self._prefix + name in self._plan_row_blocks:
            layout = f"row_blocks:{self._plan_row_blocks[self._prefix + name]}"
        return layout

    def _add_adamw_group(self, group: dict) -> None:
        """torch.optim.AdamW's checks and defaults fill the group (the same dict object then
        sits in both optimizers' param_groups, so LR schedulers and load_state_dict see one)."""
        mine = {p for g in self.param_groups for p in g["params"]}
        if not mine.isdisjoint(group["params"]):
            raise ValueError("some parameters appear in more than one parameter group")
        if self._adamw is None:
            self._adamw = torch.optim.AdamW([group], **self._adamw_defaults)
            self._adamw.state = self.state
        else:
            self._adamw.add_param_group(group)
        self.param_groups.append(group)

    def _relink_adamw(self) -> None:
        """After load_state_dict replaced the groups and the state: the inner AdamW takes the new
        AdamW groups and this state (AdamW's __setstate__ fills keys an older checkpoint lacks
        and makes an integer ``step`` a tensor)."""
        if self._adamw is not None:
            self._adamw.__setstate__({"state": self.state, "param_groups": [
                g for g in self.param_groups if not g["use_muon"]]})
            self._adamw.state = self.state

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

    def _muon_items(self):
        for g in self.param_groups:
            if g["use_muon"]:
                for p in g["params"]:
                    yield g, p

    # -- DistributedDataParallel --------------------------------------------------------------
    def attach_ddp(self, ddp_model) -> None:
        """Trains under ``ddp_model`` (a DistributedDataParallel over this optimizer's model):
        DDP then averages the AdamW gradients (step() does not), and the subclass decides what
        happens to the Muon gradients. Call once, before the first backward."""
        from torch.nn.parallel import DistributedDataParallel
        if not isinstance(ddp_model, DistributedDataParallel):
            raise InvalidArgument(f"attach_ddp() needs a DistributedDataParallel module, got "
                                  f"{type(ddp_model).__name__}")
        if self._ddp is not None:
            raise InvalidArgument("attach_ddp(): a DistributedDataParallel is attached already")
        mine = set(self._muon_params) | {p for g in self.param_groups for p in g["params"]}
        theirs = [p for p in ddp_model.parameters() if p.requires_grad]
        if not set(theirs) <= mine:
            raise InvalidArgument("attach_ddp(): the DistributedDataParallel module has "
                                  "parameters this optimizer does not hold")
        self._ddp = ddp_model

    # -- shared math ---------------------------------------------------------------------
    def _average_(self, tensors: List[torch.Tensor]) -> None:
        """Data-parallel mean of local gradients, in place: each rank divides by the world size,
        then one all-reduce (sum) over the flattened tensors. With 2 ranks this is bitwise the
        server's contributor-order sum of grad/world (a two-term float sum is commutative), and
        DDP's own mean."""
        self._start_average(tensors)()

    def _start_average(self, tensors: List[torch.Tensor]) -> Callable[[], None]:
        """:meth:`_average_` started: the all-reduce runs in the background (``async_op``) and
        the returned function waits for it and writes the means back (a no-op without one)."""
        if self.world_size == 1 or not tensors:
            return lambda: None
        flat = torch.cat([t.reshape(-1).to(torch.float32) for t in tensors])
        flat.div_(self.world_size)
        work = dist.all_reduce(flat, group=self._pg, async_op=True)

        def finish() -> None:
            work.wait()
            pos = 0
            for t in tensors:
                t.copy_(flat[pos:pos + t.numel()].view(t.shape))
                pos += t.numel()
        return finish

    def _agree_on_grads(self, params: Sequence[torch.Tensor], pushed=()) -> None:
        """Data parallel without DDP: a parameter that some rank has a gradient for (or pushed
        it, ``pushed``) and this rank has not, an expert or a branch this rank's batch did not
        use, gets a zero gradient here, as DDP's mean gives it; one that no rank has stays None
        and is skipped, as torch skips it. Without this the ranks' lists of gradients differ and
        their all-reduce mixes parameters (or fails on the sizes). Costs one all-reduce of a flag
        per parameter (none with one rank, under DDP, or for DTensors, which FSDP reduces).
        Both optimizers call it first in step(); OffloadMuon's zero pushes then precede its
        waits for updates (a rank that pushes nothing would hold every other rank's step), and
        its :meth:`_await` watches the server meanwhile."""
        if self.world_size == 1 or self._ddp is not None:
            return
        ps = [p for p in params if not is_dtensor(p)]
        if not ps:
            return
        device = (torch.device("cuda", torch.cuda.current_device())
                  if dist.get_backend(self._pg) == "nccl" else torch.device("cpu"))
        flags = torch.tensor([int(p.grad is not None or p in pushed) for p in ps],
                             dtype=torch.int32, device=device)
        work = dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self._pg, async_op=True)
        self._collective(lambda: self._await(work))
        for p, any_rank in zip(ps, flags.tolist()):
            if any_rank and p.grad is None and p not in pushed:
                p.grad = torch.zeros_like(p)

    def _await(self, work) -> None:
        """Waits for an async collective of step() (``work``)."""
        work.wait()

    def _collective(self, run: Callable[[], None]) -> None:
        """Runs a torch.distributed wait (``run``); a subclass may say more when it fails (a
        server's report of a lost rank)."""
        run()

    def _adamw_params(self) -> List[torch.Tensor]:
        """The AdamW parameters, in group order (the same on every rank)."""
        if self._adamw is None:
            return []
        return [p for g in self._adamw.param_groups for p in g["params"]]

    def _adamw_grads(self) -> List[torch.Tensor]:
        """The AdamW gradients this optimizer averages itself: none under DDP (attach_ddp) and
        none of DTensors (the training stack reduced them: FSDP2's reduce-scatter)."""
        if self._adamw is None or self._ddp is not None:
            return []
        return [p.grad for g in self._adamw.param_groups for p in g["params"]
                if p.grad is not None and not is_dtensor(p.grad)]

    def _adamw_step(self) -> None:
        """torch.optim.AdamW on the AdamW groups; their gradients averaged first unless DDP did
        (attach_ddp) or the training stack did (DTensor gradients: FSDP2's reduce-scatter)."""
        if self._adamw is None:
            return
        self._average_(self._adamw_grads())
        self._adamw.step()

    def _apply(self, p: torch.Tensor, update: torch.Tensor, group: dict) -> None:
        """torch.optim.Muon's two in-place ops: W <- W*(1 - lr*wd), then W <- W - adjusted_lr*U
        with adjusted_lr = lr * adjust_lr(block shape) per row block (MuonConfig.lr_factor of
        the group's adjust_lr_fn; 1 when the server applied a ``scale``). A DTensor parameter
        (FSDP2 / TP) is updated in its local tensor, ``update`` being its packed blocks; each
        piece takes the factor of the compute block it lies in (its global shape)."""
        lr, wd = group["lr"], group["weight_decay"]
        cfg = self.config
        if group.get("adjust_lr_fn") != cfg.adjust_lr_fn:
            cfg = cfg.replace(adjust_lr_fn=group.get("adjust_lr_fn"))
        m = self._meta[p]
        cols = m.shape[-1]
        if m.layout is not None:
            w = local_tensor(p)
            w.mul_(1 - lr * wd)
            u, flat = update.to(device=w.device, dtype=w.dtype), w.view(-1)
            for b, e, rows in m.layout.row_segments(m.blocks, len(m.shape) - 2):
                flat[b:e].add_(u[b:e], alpha=-(lr * cfg.lr_factor(rows, cols)))
            return
        p.mul_(1 - lr * wd)
        u = update.to(device=p.device, dtype=p.dtype)
        if len(m.blocks) == 1:
            p.add_(u.view(p.shape), alpha=-(lr * cfg.lr_factor(m.blocks[0], cols)))
            return
        u, w = u.view(m.shape), p.view(m.shape)
        r0 = 0
        for rows in m.blocks:
            w[..., r0:r0 + rows, :].add_(u[..., r0:r0 + rows, :],
                                        alpha=-(lr * cfg.lr_factor(rows, cols)))
            r0 += rows

    @staticmethod
    def _raise_nonfinite(errors: List[NonFiniteGradient]) -> None:
        """The step's non-finite gradients as one error (their parameters were not updated)."""
        if errors:
            raise errors[0].with_message("; ".join(str(e) for e in errors) +
                                         " (these parameters were not updated this step)")

    # -- checkpoints ------------------------------------------------------------------------
    # Keys a Muon group's server registration fixed: a checkpoint must agree on them.
    _FIXED_KEYS = ("momentum", "nesterov", "ns_coefficients", "eps", "ns_steps")

    @staticmethod
    def _refuse_unsupported_grad(name: str, grad: Optional[torch.Tensor]) -> None:
        """Raises InvalidArgument for a gradient Muon cannot take (as torch.optim.Muon does)."""
        if grad is not None and grad.is_sparse:
            raise InvalidArgument(f"parameter '{name}': Muon does not support sparse gradients")

    @classmethod
    def _fixed_values(cls, group: dict) -> dict:
        return {k: tuple(map(float, group[k])) if k == "ns_coefficients" else group[k]
                for k in cls._FIXED_KEYS if k in group}

    def _check_fixed_keys(self) -> None:
        """Raises InvalidArgument when a Muon group's momentum, nesterov, ns_coefficients, eps or
        ns_steps changed since its parameters were registered: the server steps them with the
        registered values, so a change (a scheduler's, a user's) would be ignored silently,
        while torch.optim.Muon reads the group at every step."""
        for i, g in enumerate(self.param_groups):
            was = self._registered_keys.get(i)
            if not g.get("use_muon") or was is None:
                continue
            now = self._fixed_values(g)
            for k, old in was.items():
                if now.get(k, old) != old:
                    raise InvalidArgument(
                        f"param group {i}: {k} changed from {old!r} to {now[k]!r} after its "
                        f"parameters were registered with the server, which steps them with "
                        f"{k}={old!r}: construct the optimizer with the value you want (a "
                        "scheduler that cycles momentum, e.g. OneCycleLR, needs "
                        "cycle_momentum=False; lr and weight_decay may change at any step)")

    def load_state_dict(self, state_dict):
        """torch's load_state_dict, accepting torch.optim.Muon's layout too (no ``step``: taken
        as 1) and keeping this optimizer's own group keys (use_muon, param_names, flatten).
        Raises InvalidArgument when a Muon group of the checkpoint has another momentum,
        nesterov, ns_coefficients, eps or ns_steps than this optimizer registered."""
        for mine, saved in zip(self.param_groups, state_dict.get("param_groups", [])):
            if not mine["use_muon"]:
                continue
            ours, theirs = self._fixed_values(mine), self._fixed_values({**mine, **saved})
            for k, a in ours.items():
                b = theirs[k]
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
        self._relink_adamw()
        for _, p in self._muon_items():
            st = self.state.get(p)
            if st and "momentum_buffer" in st and "step" not in st:
                st["step"] = 1

    def momentum_buffer(self, p: torch.Tensor) -> torch.Tensor:
        """The momentum of Muon parameter ``p`` (fp32, CPU, the matrix shape the server sees:
        ``p``'s own for 2-D), as its last step left it; zeros before the first step."""
        raise NotImplementedError

    # -- timing and accumulation ----------------------------------------------------------------
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

        Under DistributedDataParallel use its ``no_sync()`` instead (gradients accumulate in
        ``.grad`` and go to the server once, with the last micro-batch's buckets)."""
        self._no_commit_depth += 1
        try:
            yield self
        finally:
            self._no_commit_depth -= 1
