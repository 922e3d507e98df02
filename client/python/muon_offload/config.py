"""The one configuration object of the Muon math: :class:`MuonConfig`.

Its first eight fields are torch.optim.Muon's keywords with torch's defaults and meaning (torch
2.9+, ``torch/optim/_muon.py``); :class:`muon_offload.Muon`, :class:`~muon_offload.OffloadMuon`
and :class:`~muon_offload.InProcessMuon` all take them (``MuonConfig.KEYWORDS``) and build one
``MuonConfig``, so a keyword means the same in every class. Per 2-D parameter W of shape (A, B)
with gradient G, torch's math is::

    buf <- lerp(buf, G, 1 - momentum)          # momentum_convention "ema" (torch's)
    X    = lerp(G, buf, momentum) if nesterov else buf
    O    = NS(X)                               # ns_steps steps of ns_coefficients (a, b, c)
    W   <- W * (1 - lr * weight_decay)         # decoupled weight decay, unadjusted lr
    W   <- W - adjust_lr(lr, A, B) * O         # adjust_lr_fn, on the trainer as torch does

``adjust_lr_fn``: None or "original" sqrt(max(1, A/B)) (Keller Jordan), "match_rms_adamw"
0.2*sqrt(max(A, B)) (Moonlight, arXiv:2502.16982), "spectral_unclamped" sqrt(A/B) (torch 2.15).
The factor uses the matrix shape the server sees (a row block of a fused QKV for ``row_splits``;
a conv kernel as (out, in*kh*kw)).

Beyond torch (keyword-only, with the name of the field):

- ``momentum_convention``: "ema" (torch's, above) or "sum" (Moonlight, dion: buf <- mu*buf + G,
  Nesterov input G + mu*buf).
- ``eps_mode``: how ``eps`` guards the normalization X / ||X||_F before Newton-Schulz.
  "scale_invariant" (default): X / ||X||_F, the norm formed in double (no overflow, no eps
  shrinking a small gradient), so NS(c*G) = NS(G) for every c that keeps c*G finite and non-zero
  in fp32; eps is not used, an all-zero X gives an all-zero update. "torch": X / max(||X||_F,
  eps), torch.optim.Muon's ``norm().clamp(min=eps)`` (for parity checks; a gradient whose norm is
  below eps is shrunk toward zero, torch's bug). "add": X / (||X||_F + eps) (Keller Jordan's
  reference).
- ``ns_coefficients``: any (a, b, c), run every step as torch does (the server's
  ``coefficients``; torch's default triple goes as the server's ``keller`` schedule, the same
  numbers). ``schedule``: a named coefficient schedule of the server (``muon-offload
  schedules``: Polar Express and others with per-step coefficients), instead of
  ``ns_coefficients``; ``scale`` / ``extra_scale``: a scale rule applied by the server to the
  update (``keller``, ``match_adamw``, ``sqrt_max``, ``unit_rms``, ``none``) instead of
  ``adjust_lr_fn`` on the trainer; ``row_splits``: ``{name: [rows, ...]}`` orthogonalizes row
  blocks of a fused QKV separately; ``compute_layouts``: ``{name pattern: layout}``, the
  matrices Newton-Schulz runs on per parameter ("whole", "per_expert", "row_blocks:N", a list
  of row counts; :mod:`muon_offload.compute_layouts`; the plan's ``row_blocks`` are the default).

- ``precision``: what the server runs Newton-Schulz in. "default": its backend's, fp32 on the
  CPU backend (the accurate one, within 3e-5 of the SVD oracle), bf16 products with fp32
  accumulation on the CUDA backend. "fp32". "torch_bf16": torch.optim.Muon's own bfloat16
  rounding points (the input, its norm, X / norm and each product rounded to bf16), emulated by
  CPU servers, for parity checks against torch.

Newton-Schulz dtype: torch.optim.Muon runs Newton-Schulz in bfloat16 (``grad.to(bfloat16)``) on
every device, and its update is a bf16 tensor. Against it, an fp32 Newton-Schulz differs by that
rounding: with the same gradients, the parameters of the two runs drift apart by ~1e-4..3e-3
relative over 60 steps at lr 1e-3 (client/python/tests/test_torch_muon.py). With
``precision="torch_bf16"`` only the rounding flips of GEMMs that sum in another order remain
(bf16 amplifies them, so no implementation reproduces torch's bf16 result bitwise): the
parameters stay within ~1e-5 relative of torch's over 60 steps, the bound that test asserts.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Optional, Sequence, Tuple

from ._native import InvalidArgument

# torch.optim.Muon's constants (Keller Jordan's post).
KELLER_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
ADJUST_LR_FNS = (None, "original", "match_rms_adamw", "spectral_unclamped")
MOMENTUM_CONVENTIONS = ("ema", "sum")
# MuonConfig.eps_mode -> the server's eps_mode name.
EPS_MODES = {"scale_invariant": "scale_invariant", "torch": "clamp", "add": "add"}
PRECISIONS = ("default", "fp32", "bf16", "torch_bf16")


@dataclasses.dataclass(frozen=True)
class MuonConfig:
    """The Muon keywords (see the module docstring). Immutable; ``replace(**kw)`` makes a copy
    with some fields changed. Raises :class:`~muon_offload.InvalidArgument` (a ValueError) for a
    value torch.optim.Muon refuses, or one the server cannot compute."""

    lr: float = 1e-3
    weight_decay: float = 0.1
    momentum: float = 0.95
    nesterov: bool = True
    ns_coefficients: Tuple[float, float, float] = KELLER_COEFFICIENTS
    eps: float = 1e-7
    ns_steps: int = 5
    adjust_lr_fn: Optional[str] = None
    momentum_convention: str = "ema"
    eps_mode: str = "scale_invariant"
    schedule: Optional[str] = None
    scale: Optional[str] = None
    extra_scale: float = 1.0
    row_splits: Optional[Mapping[str, Sequence[int]]] = None
    compute_layouts: Optional[Mapping[str, object]] = None
    precision: str = "default"

    #: torch.optim.Muon's keywords, in its order.
    KEYWORDS = ("lr", "weight_decay", "momentum", "nesterov", "ns_coefficients", "eps",
                "ns_steps", "adjust_lr_fn")

    def __post_init__(self):
        lr = float(self.lr)
        if not lr >= 0.0:
            raise InvalidArgument(f"Learning rate should be >= 0 but is: {self.lr}")
        if not float(self.momentum) >= 0.0 or not float(self.momentum) < 1.0:
            raise InvalidArgument(f"momentum should lie in [0, 1) but is: {self.momentum}")
        if not float(self.weight_decay) >= 0.0:
            raise InvalidArgument(f"weight decay should be >= 0 but is: {self.weight_decay}")
        if self.adjust_lr_fn not in ADJUST_LR_FNS:
            raise InvalidArgument(f"Adjust learning rate function {self.adjust_lr_fn} is not "
                                  f"supported (known: None, {', '.join(ADJUST_LR_FNS[1:])})")
        coefficients = tuple(self.ns_coefficients)
        if len(coefficients) != 3 or not all(
                isinstance(c, (int, float)) and math.isfinite(c) for c in coefficients):
            raise InvalidArgument("Coefficients must be a tuple of exactly 3 finite values, got "
                                  f"{self.ns_coefficients!r}")
        if not (isinstance(self.ns_steps, int) and 0 < self.ns_steps < 100):
            raise InvalidArgument(f"ns_steps must be an integer in [1, 100), got "
                                  f"{self.ns_steps!r}")
        if self.momentum_convention not in MOMENTUM_CONVENTIONS:
            raise InvalidArgument(f"momentum_convention must be one of "
                                  f"{', '.join(MOMENTUM_CONVENTIONS)}, got "
                                  f"{self.momentum_convention!r}")
        if self.eps_mode not in EPS_MODES:
            raise InvalidArgument(f"eps_mode must be one of {', '.join(EPS_MODES)}, got "
                                  f"{self.eps_mode!r}")
        if not (math.isfinite(float(self.eps)) and float(self.eps) >= 0.0):
            raise InvalidArgument(f"eps must be finite and >= 0, got {self.eps}")
        if self.schedule is not None and tuple(map(float, coefficients)) != KELLER_COEFFICIENTS:
            raise InvalidArgument(f"give ns_coefficients={coefficients} (one quintic every step) "
                                  f"or schedule={self.schedule!r}, not both")
        if self.precision not in PRECISIONS:
            raise InvalidArgument(f"precision must be one of {', '.join(PRECISIONS)}, got "
                                  f"{self.precision!r}")
        if self.scale is not None and self.adjust_lr_fn is not None:
            raise InvalidArgument("give adjust_lr_fn (an lr factor on the trainer, torch's) or "
                                  "scale (an update scale on the server), not both")

    def replace(self, **changes) -> "MuonConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_keywords(cls, keywords: Mapping, where: str) -> "MuonConfig":
        """A config from keyword arguments; TypeError naming ``where`` for an unknown one."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(keywords) - names)
        if unknown:
            raise TypeError(f"{where} got unexpected keyword argument(s) {unknown}")
        return cls(**dict(keywords))

    # -- what the server computes ----------------------------------------------------------
    def server_options(self, momentum: Optional[float] = None,
                       nesterov: Optional[bool] = None) -> dict:
        """The options JSON of a registration (client/muon_client.h): momentum, Newton-Schulz
        schedule and steps, eps and its mode, the server-side scale (``none`` when the trainer
        adjusts the lr, torch's way). ``momentum``/``nesterov`` override the config's (a param
        group's own values)."""
        options = {
            "momentum": self.momentum_convention,
            "mu": float(self.momentum if momentum is None else momentum),
            "nesterov": bool(self.nesterov if nesterov is None else nesterov),
            "schedule": self.schedule or "keller",
            "steps": int(self.ns_steps),
            "scale": self.scale or "none",
            "extra_scale": float(self.extra_scale),
            "eps": float(self.eps),
            "eps_mode": EPS_MODES[self.eps_mode],
            "precision": self.precision,
        }
        coefficients = tuple(map(float, self.ns_coefficients))
        if coefficients != KELLER_COEFFICIENTS:
            options["coefficients"] = list(coefficients)
        return options

    def lr_factor(self, rows: int, cols: int) -> float:
        """torch.optim.Muon's ``_adjust_lr`` ratio for a (rows, cols) matrix (1.0 when the
        server applies ``scale`` instead). In double, as torch computes it."""
        if self.scale is not None:
            return 1.0
        a, b = rows, cols
        if self.adjust_lr_fn is None or self.adjust_lr_fn == "original":
            return math.sqrt(max(1, a / b))
        if self.adjust_lr_fn == "match_rms_adamw":
            return 0.2 * math.sqrt(max(a, b))
        return math.sqrt(a / b)  # spectral_unclamped
