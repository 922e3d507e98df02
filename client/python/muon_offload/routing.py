"""Which tensors Muon takes and how the server sees them: :func:`default_route`, the matrix shape
of a tensor, and :class:`Router`, which splits a user's param group into a Muon group and an
AdamW group (the group layout of :class:`~muon_offload.offload.OffloadMuon` and
:class:`~muon_offload.in_process.InProcessMuon`)."""
from __future__ import annotations

import math
import re
import warnings
from typing import Callable, Dict, List, Mapping, Optional, Tuple

import torch

from ._native import InvalidArgument
from .config import MuonConfig

__all__ = ["default_route", "embedding_params", "matrix_shape", "names_from", "Router",
           "ADAMW_GROUP_KEYS"]

# A user group's AdamW keys -> torch.optim.AdamW's.
ADAMW_GROUP_KEYS = {"adamw_lr": "lr", "adamw_betas": "betas", "adamw_eps": "eps",
                    "adamw_weight_decay": "weight_decay"}

ROUTES = ("muon", "muon_flat", "adamw")


def default_route(name: Optional[str], p: torch.Tensor) -> str:
    """The usual split. Returns ``"muon"`` or ``"adamw"``:

    - fewer than 2 dimensions (biases, norm gains, scalars): AdamW;
    - a module path component that names an embedding or an output head (contains ``embed``;
      ``wte``, ``wpe``, ``tok_emb``, ``pos_emb``, ``lm_head``, ``head``, ``classifier``; a
      top-level ``output``) or a norm (contains ``norm``, or starts with ``ln``): AdamW;
    - everything else with 2+ dimensions (linear, conv, expert stacks): Muon.

    Without names (plain tensors given to the optimizer) only the ndim rule applies. A leading
    ``module.`` (DistributedDataParallel's wrapper) is not a component of its own.
    """
    if p.ndim < 2:
        return "adamw"
    if name:
        comps = name.split(".")
        if comps[0] == "module" and len(comps) > 2:
            comps = comps[1:]
        mods = [c.lower() for c in comps[:-1]] or [comps[0].lower()]
        for c in mods:
            if "embed" in c or "norm" in c or re.match(r"ln(_|\d|f|$)", c):
                return "adamw"
            if c in ("wte", "wpe", "tok_emb", "pos_emb", "lm_head", "head", "classifier"):
                return "adamw"
        if comps[0].lower() == "output" and len(comps) <= 2:
            return "adamw"
    return "muon"


def matrix_shape(p: torch.Tensor, flatten: bool) -> Tuple[int, ...]:
    """The shape the server sees: ``[r, c]`` for 2-D; ``[b, r, c]`` for a 3-D expert stack (b
    independent matrices); ``(out, in*kh*kw...)`` for conv weights (4-D and up, or 3-D when
    ``flatten``)."""
    s = tuple(p.shape)
    if len(s) == 2:
        return s
    if len(s) == 3 and not flatten:
        return s
    return (s[0], math.prod(s[1:]))


def names_from(names) -> Dict[int, str]:
    """``id(tensor) -> name`` from a module (its ``named_parameters()``; a DDP wrapper's inner
    module, so the names are the unwrapped model's), a ``{name: tensor}`` or ``{tensor: name}``
    mapping, or None."""
    if names is None:
        return {}
    if isinstance(names, torch.nn.Module):
        inner = getattr(names, "module", None)
        if isinstance(inner, torch.nn.Module) and _is_ddp(names):
            names = inner
        return {id(p): n for n, p in names.named_parameters()}
    out = {}
    for k, v in dict(names).items():
        if isinstance(k, str):
            out[id(v)] = k
        else:
            out[id(k)] = str(v)
    return out


def embedding_params(names) -> set:
    """``id(tensor)`` of every parameter an ``nn.Embedding`` or ``nn.EmbeddingBag`` of module
    ``names`` holds (a DDP wrapper's inner module); empty for anything but a module. These go to
    AdamW whatever their name says (``"0.weight"`` inside an ``nn.Sequential``), a weight-tied
    output head with them."""
    if not isinstance(names, torch.nn.Module):
        return set()
    inner = getattr(names, "module", None)
    if isinstance(inner, torch.nn.Module) and _is_ddp(names):
        names = inner
    kinds = (torch.nn.Embedding, torch.nn.EmbeddingBag)
    return {id(p) for m in names.modules() if isinstance(m, kinds)
            for p in m.parameters(recurse=False)}


def _numeric_path(name: str) -> bool:
    """True when every module component of ``name`` is an index ("0.weight", "layers.3.w" is
    not): a parameter of nn.Sequential's children, named by position only."""
    comps = name.split(".")[:-1]
    if comps and comps[0] == "module":
        comps = comps[1:]
    return bool(comps) and all(c.isdigit() for c in comps)


def _is_ddp(module) -> bool:
    from torch.nn.parallel import DistributedDataParallel
    return isinstance(module, DistributedDataParallel)


class Router:
    """Splits param groups: each tensor goes to Muon or AdamW by ``route(name, tensor)`` (None:
    :func:`default_route`), a group key ``use_muon`` forcing a whole group.

    Args:
        names: see :func:`names_from`; tensors given without a name are called ``param.<i>``.
            A module also routes its embeddings' parameters to AdamW by module type
            (:func:`embedding_params`), before ``route``'s default.
        route: ``callable(name, tensor) -> "muon" | "muon_flat" | "adamw" | None``;
            ``"muon_flat"`` flattens a 3-D tensor (Conv1d) instead of taking it as an expert
            stack.
        adamw_defaults: torch.optim.AdamW's ``lr``, ``betas``, ``eps``, ``weight_decay`` for
            groups that do not set ``adamw_lr`` etc.
    """

    def __init__(self, names, route: Optional[Callable], adamw_defaults: Mapping):
        self._names = names_from(names)
        self._embeddings = embedding_params(names)
        self._module_given = isinstance(names, torch.nn.Module)
        self._warned_numeric = False
        self._route = route
        self._adamw_defaults = dict(adamw_defaults)
        self._unnamed = 0
        self._warned_unnamed = False

    def name_of(self, p: torch.Tensor, given: Optional[str]) -> str:
        if given:
            return given
        n = self._names.get(id(p))
        if n:
            return n
        self._unnamed += 1
        return f"param.{self._unnamed - 1}"

    def split(self, param_group: dict) -> List[dict]:
        """The Muon group (``use_muon=True``, ``param_names``, ``flatten`` per tensor, the
        group's other keys) and the AdamW group (``use_muon=False``, ``param_names``, AdamW's
        keys from ``adamw_*`` or the defaults) of one user group; an empty one is left out.
        Raises TypeError for a non-tensor, InvalidArgument for a bad route or a Muon tensor
        below 2-D."""
        g = dict(param_group)
        raw = g.pop("params")
        if isinstance(raw, torch.Tensor):
            raw = [raw]
        forced = g.pop("use_muon", None)
        muon, muon_names, flatten, adamw, adamw_names = [], [], [], [], []
        for item in raw:
            if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
                given, p = item
            else:
                given, p = None, item
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"optimizer can only optimize tensors, got {type(p).__name__}")
            name = self.name_of(p, given)
            if given is None and id(p) not in self._names and p.ndim >= 2 and forced is None \
                    and self._route is None and not self._warned_unnamed:
                warnings.warn("muon_offload: parameters without names are routed by ndim only "
                              "(every 2-D tensor goes to Muon, embeddings and the output head "
                              "too); pass model.named_parameters() or names=model to route "
                              "them to AdamW", stacklevel=5)
                self._warned_unnamed = True
            if forced is not None:
                kind = "muon" if forced else "adamw"
            else:
                kind = ((self._route(name, p) if self._route else None) or
                        ("adamw" if id(p) in self._embeddings else default_route(name, p)))
            if kind.startswith("muon") and forced is None and self._route is None and \
                    not self._module_given and not self._warned_numeric and \
                    _numeric_path(name):
                warnings.warn(f"muon_offload: '{name}' goes to Muon by the name rule, but names "
                              "of nn.Sequential's children ('0.weight', '3.weight') say nothing "
                              "of embeddings or the output head: pass names=model (an "
                              "nn.Embedding then goes to AdamW by its type) or route=, and "
                              "check opt.routing", stacklevel=5)
                self._warned_numeric = True
            if kind not in ROUTES:
                raise InvalidArgument(f"route returned {kind!r} for '{name}': expected 'muon', "
                                      "'muon_flat' or 'adamw'")
            if kind.startswith("muon") and p.ndim < 2:
                raise InvalidArgument(f"parameter '{name}' has shape {tuple(p.shape)}: Muon needs "
                                      "2 or more dimensions; route it to AdamW")
            if kind.startswith("muon"):
                muon.append(p)
                muon_names.append(name)
                flatten.append(kind == "muon_flat")
            else:
                adamw.append(p)
                adamw_names.append(name)
        groups = []
        if muon:
            mg = {k: v for k, v in g.items() if k not in ADAMW_GROUP_KEYS}
            mg.update(params=muon, use_muon=True, param_names=muon_names, flatten=flatten)
            groups.append(mg)
        if adamw:
            ag = {k: v for k, v in g.items()
                  if k not in ADAMW_GROUP_KEYS and k not in MuonConfig.KEYWORDS}
            ag.update({short: g.get(long, self._adamw_defaults[short])
                       for long, short in ADAMW_GROUP_KEYS.items()})
            ag.update(params=adamw, use_muon=False, param_names=adamw_names)
            groups.append(ag)
        return groups
