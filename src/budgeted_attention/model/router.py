"""Per-input head allocation (BudgetFormer, arXiv 2604.22583) and its budget-capped variant.

A :class:`HeadRouter` attached to any :class:`~budgeted_attention.model.family.GatedModel`
decides, for each input, how many heads every layer runs and which:

* a **budget controller** (two-layer MLP on the mean-pooled token embeddings) gives a head
  fraction s per input; k = ceil(s * H) heads run in every layer;
* a **head scorer** (one linear layer on the same pooled vector) gives relevance logits per
  (layer, head); the top-k heads of each layer run.

Training follows BudgetFormer's schedule: an **exploration** phase with noise on the scores and a
temperature-annealed soft top-k (:meth:`HeadRouter._soft_top_k`: differentiable ranks, a soft
cut at s * H), then an **exploitation** phase with the hard top-k mask in the forward pass and
the soft gates' gradient (straight-through). Regularisers (:meth:`HeadRouter.take_loss`): an entropy term on the head
distribution (low entropy = decisive selection) and a hinge on the budget.

Two modes (``router.mode``):

* ``learned`` (BudgetFormer): s = s_min + (s_max - s_min) * sigmoid(MLP(x)), clamped to
  [0.1, 0.9] by default; the hinge max(0, mean(s) - target) bounds the learned mean budget.
  There is no budget knob: the model chooses.
* ``capped`` (ours): the caller's budget b enters as s = sigmoid(z(x) + logit(b) + delta(b));
  budgets are sampled per step as in BAA. The offset delta(b) is calibrated on validation data
  (:func:`~budgeted_attention.training.routed.calibrate_router`) so that the realised mean cost,
  with k rounded up, is at most b. How z(x) spreads the heads over inputs
  (``router.allocation``):

  - ``difficulty`` (default): z is a regression onto the input's difficulty, the entropy of the
    frozen dense teacher's prediction (standardised in the batch, times ``spread``), so inputs the
    dense model is unsure of get more heads and confident ones fewer. The difficulty signal is
    exogenous: it does not depend on the heads the router gave, so there is no feedback loop.
  - ``gradient``: z learns from the task loss through the soft top-k, with the hinge
    max(0, mean_batch(s) - b). In practice the hinge dominates the weak per-input gradient and
    every input ends at the same head count (kept for comparison).

At evaluation the router returns boolean (batch, n_layers, n_heads) masks; the families execute
only the selected heads (grouping the inputs of a batch by their head set per layer), so the
saving is real, not masked.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from budgeted_attention.budget import validate_budget
from budgeted_attention.config import check_float, check_int
from budgeted_attention.errors import ConfigError

ROUTER_MODES = ("learned", "capped")
ALLOCATIONS = ("difficulty", "gradient")


@dataclass
class RouterConfig:
    """Per-input head allocation (``router:`` in an experiment config).

    Attributes:
        mode: ``learned`` (BudgetFormer: the model picks its own budget) or ``capped`` (the
            caller's budget bounds the mean per-input cost).
        fraction_min, fraction_max: clamp of the learned head fraction s (``learned`` only;
            BudgetFormer's [0.1, 0.9]).
        hidden: hidden units of the budget controller.
        temperature_start, temperature_end: softmax temperature of the head scores, annealed
            linearly over the exploration phase (then held at the end value).
        noise: scale of the Gumbel noise added to the scores during exploration.
        explore_fraction: share of the routing stage's steps spent exploring (soft gates); the
            rest exploit (hard top-k forward, straight-through gradient).
        count_temperature: softness, in heads, of the soft top-k's cut at s * H.
        entropy_weight: weight of the mean normalised entropy of the head distribution.
        hinge_weight: weight of the budget hinge.
        target: the learned mode's hinge target for the batch-mean fraction (within the clamp;
            learned only: the capped mode's fraction is bounded by the caller's budget).
        lr: the router's learning rate (0: the stage's rate). A fresh router on a pretrained
            model fine-tuned at 5e-5 needs a larger one.
        allocation: how the capped mode spreads heads over inputs: ``difficulty`` (regression
            onto the dense teacher's predictive entropy) or ``gradient`` (task loss and hinge).
        spread: ``difficulty`` allocation: the controller's target is ``spread`` logits per
            standard deviation of (log) difficulty; 0 gives every input the same count.
        difficulty_weight: weight of the difficulty regression loss.
    """

    mode: str = "learned"
    fraction_min: float = 0.1
    fraction_max: float = 0.9
    hidden: int = 64
    temperature_start: float = 1.0
    temperature_end: float = 0.1
    noise: float = 1.0
    explore_fraction: float = 0.5
    count_temperature: float = 0.5
    entropy_weight: float = 0.01
    hinge_weight: float = 1.0
    target: float = 0.5
    lr: float = 0.0
    allocation: str = "difficulty"
    spread: float = 1.0
    difficulty_weight: float = 1.0

    def __post_init__(self) -> None:
        if self.mode not in ROUTER_MODES:
            raise ConfigError(f"router.mode must be one of {', '.join(ROUTER_MODES)}, got {self.mode!r}")
        self.fraction_min = check_float(self.fraction_min, "router.fraction_min", gt=0.0, le=1.0)
        self.fraction_max = check_float(self.fraction_max, "router.fraction_max", gt=0.0, le=1.0)
        if self.fraction_min > self.fraction_max:
            raise ConfigError(f"router.fraction_min ({self.fraction_min}) must not exceed router.fraction_max ({self.fraction_max})")
        check_int(self.hidden, "router.hidden", ge=1)
        self.temperature_start = check_float(self.temperature_start, "router.temperature_start", gt=0.0)
        self.temperature_end = check_float(self.temperature_end, "router.temperature_end", gt=0.0)
        self.noise = check_float(self.noise, "router.noise", ge=0.0)
        # 1 would train soft gates only while evaluation runs the hard top-k: never trained that way.
        self.explore_fraction = check_float(self.explore_fraction, "router.explore_fraction", ge=0.0, lt=1.0)
        self.count_temperature = check_float(self.count_temperature, "router.count_temperature", gt=0.0)
        self.entropy_weight = check_float(self.entropy_weight, "router.entropy_weight", ge=0.0)
        self.hinge_weight = check_float(self.hinge_weight, "router.hinge_weight", ge=0.0)
        self.target = check_float(self.target, "router.target", gt=0.0, le=1.0)
        self.lr = check_float(self.lr, "router.lr", ge=0.0)
        if self.allocation not in ALLOCATIONS:
            raise ConfigError(f"router.allocation must be one of {', '.join(ALLOCATIONS)}, got {self.allocation!r}")
        self.spread = check_float(self.spread, "router.spread", ge=0.0)
        self.difficulty_weight = check_float(self.difficulty_weight, "router.difficulty_weight", ge=0.0)
        if not self.fraction_min <= self.target <= self.fraction_max:
            raise ConfigError(
                f"router.target ({self.target}) must lie in [router.fraction_min, router.fraction_max] = "
                f"[{self.fraction_min}, {self.fraction_max}], or the budget hinge is always or never active"
            )

    @classmethod
    def from_dict(cls, data: Any) -> RouterConfig:
        if not isinstance(data, dict):
            raise ConfigError(f"router must be a mapping, got {data!r}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown router key(s) {unknown}; known: {sorted(known)}")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _StraightThrough(torch.autograd.Function):
    """Forward: the exact hard 0/1 mask; backward: the soft gates' gradient (straight-through)."""

    @staticmethod
    def forward(ctx, hard: torch.Tensor, soft: torch.Tensor) -> torch.Tensor:  # noqa: ARG004
        return hard

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[None, torch.Tensor]:  # noqa: ARG004
        return None, grad


def _logit(p: float) -> float:
    return math.log(p) - math.log1p(-p)


class HeadRouter(nn.Module):
    """Budget controller + head scorer over a (n_layers, n_heads) grid.

    Call :meth:`decide` with pooled input features; the phase attributes (``temperature``,
    ``noise``, ``exploit``) are set by the routing training stage and ignored in eval mode.
    """

    def __init__(self, d_model: int, n_layers: int, n_heads: int, cfg: RouterConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.n_layers, self.n_heads = n_layers, n_heads
        self.controller = nn.Sequential(nn.Linear(d_model, cfg.hidden), nn.GELU(), nn.Linear(cfg.hidden, 1))
        self.scorer = nn.Linear(d_model, n_layers * n_heads)
        nn.init.zeros_(self.scorer.weight)  # equal scores at the start: exploration decides
        nn.init.zeros_(self.scorer.bias)
        with torch.no_grad():  # start near the middle of the fraction range (learned) / at b (capped)
            if not self.by_difficulty:  # a regression target is not a start to keep
                self.controller[2].weight.mul_(0.1)
            self.controller[2].bias.fill_(0.0)
        self.temperature = cfg.temperature_start
        self.noise = 0.0
        self.exploit = False
        # Calibration of the capped mode: budget -> logit offset, fitted on validation data.
        self.calibration: dict[float, float] = {}
        # Difficulty allocation: budget -> multiplier of z (0 = every input the same count), chosen
        # on validation (training.routed.choose_spread); 1 where none was chosen.
        self.spread_scale: dict[float, float] = {}
        self._pending: list[torch.Tensor] = []
        self.last_fraction: torch.Tensor | None = None  # (batch,) s of the last decision
        self._last_heads: torch.Tensor | int | None = None  # k of the last decision (an int for one input: see last_heads)
        self._last_raw: torch.Tensor | None = None  # (batch,) controller output z of the last training decision

    @property
    def last_heads(self) -> torch.Tensor | None:
        """(batch,) long: heads per layer (k) each input of the last decision ran. A one-input
        decision (:meth:`decide_sets`) keeps its k as an int and makes the tensor here, when asked:
        building it costs about 10 µs, a tenth of that decision, and serving never asks."""
        if isinstance(self._last_heads, int):
            self._last_heads = torch.tensor([self._last_heads])
        return self._last_heads

    @property
    def by_difficulty(self) -> bool:
        """True when the controller is a difficulty regression (capped mode, ``difficulty``
        allocation): training must feed :meth:`fit_difficulty` every step."""
        return self.cfg.mode == "capped" and self.cfg.allocation == "difficulty"

    # ------------------------------------------------------------------ decisions

    def offset(self, budget: float) -> float:
        """delta(b): the calibrated logit offset, linear in logit(b) between calibrated budgets.

        The cap (realised mean cost <= b on validation) is fitted at the calibrated budgets; between
        them the offset (and a chosen spread) are interpolated, which keeps the cost near b but
        does not guarantee it."""
        return _interpolate(self.calibration, budget, 0.0)

    def scale(self, budget: float) -> float:
        """The multiplier of the difficulty logit z at ``budget`` (1 unless chosen on validation)."""
        return _interpolate(self.spread_scale, budget, 1.0)

    def fraction(self, pooled: torch.Tensor, budget: float | None, offset: float | None = None) -> torch.Tensor:
        """Head fraction s per input, shape (batch,), from pooled features (batch, d_model)."""
        if self.by_difficulty:  # mean-pooled embeddings are tiny (init std 0.02): a regression
            # from them at the stage's learning rate would take thousands of steps to spread
            pooled = F.layer_norm(pooled, pooled.shape[-1:])
        first, _, last = self.controller  # functional calls: the module calls' overhead is most of a batch-1 decision
        raw = F.linear(F.gelu(F.linear(pooled, first.weight, first.bias)), last.weight, last.bias).squeeze(-1)
        if self.training:
            self._last_raw = raw
        if self.cfg.mode == "learned":
            if budget is not None and validate_budget(budget) != 1.0:
                raise ValueError(
                    f"this router learns its own budget (router.mode 'learned'): run it without a budget, got {budget!r}"
                )
            lo, hi = self.cfg.fraction_min, self.cfg.fraction_max
            return lo + (hi - lo) * torch.sigmoid(raw)
        if budget is None:
            raise ValueError("a budget-capped router needs the caller's budget b in (0, 1]")
        b = validate_budget(budget)
        if b == 1.0:  # logit(1) = inf: every head
            return torch.ones_like(raw)
        delta = self.offset(b) if offset is None else offset
        scale = self.scale(b)
        return torch.sigmoid((raw if scale == 1.0 else raw * scale) + _logit(b) + delta)

    def heads_for(self, fraction: torch.Tensor) -> torch.Tensor:
        """k = ceil(s * H) heads per layer, at least 1: (batch,) long."""
        if not bool(torch.isfinite(fraction).all()):
            raise ValueError("the head router produced a non-finite head fraction (diverged training?)")
        return torch.ceil(fraction.detach() * self.n_heads - 1e-6).clamp(1, self.n_heads).long()

    def head_counts(self, pooled: torch.Tensor, budget: float | None, offset: float | None = None) -> torch.Tensor:
        """Heads per layer each input runs, (batch,) long; a capped router without a budget is the
        dense model (every head), as in the forward pass."""
        if self.cfg.mode == "capped" and budget is None:
            budget = 1.0
        return self.heads_for(self.fraction(pooled, budget, offset))

    def decide(self, pooled: torch.Tensor, budget: float | None, offset: float | None = None) -> torch.Tensor:
        """Per-input head gates, (batch, n_layers, n_heads).

        Training: float gates (soft in exploration, straight-through hard top-k in exploitation),
        and the regulariser is queued for :meth:`take_loss`. Evaluation: a boolean mask of the
        top-k heads of every layer.
        """
        if not self.training and pooled.shape[0] == 1:
            return self._decide_one(pooled, budget, offset)
        s = self.fraction(pooled, budget, offset)
        k = self.heads_for(s)
        self.last_fraction, self._last_heads = s.detach(), k
        if self.by_difficulty:  # the count follows the difficulty regression alone, not the task loss
            s = s.detach()
        scores = self.scorer(pooled).view(-1, self.n_layers, self.n_heads)
        if not self.training:
            return self._top_k(scores, k)
        noisy = scores
        if not self.exploit and self.noise > 0:
            uniform = torch.rand_like(scores).clamp(1e-9, 1.0 - 1e-9)
            gumbel = -torch.log(-torch.log(uniform))
            noisy = scores + self.noise * gumbel
        probs = F.softmax(noisy / self.temperature, dim=-1)
        soft = self._soft_top_k(noisy, s)
        self._queue_loss(probs, s, budget)
        if not self.exploit:
            return soft
        return _StraightThrough.apply(self._top_k(noisy, k).to(soft.dtype), soft)

    def _decide_one(self, pooled: torch.Tensor, budget: float | None, offset: float | None) -> torch.Tensor:
        """:meth:`decide` for one input in evaluation, (1, n_layers, n_heads) bool (from :meth:`decide_sets`)."""
        sets = self.decide_sets(pooled, budget, offset)
        return torch.tensor([[[h in heads for h in range(self.n_heads)] for heads in sets]], dtype=torch.bool, device=pooled.device)

    def decide_sets(self, pooled: torch.Tensor, budget: float | None, offset: float | None = None) -> list[tuple[int, ...]]:
        """One input's decision in evaluation as the head ids each layer runs, ascending: the same
        decision as :meth:`decide` (fraction, k = ceil(s * H), top-k with ties to the lower index),
        with the arithmetic on the n_layers * n_heads + 1 numbers done in Python. At batch 1 each
        tensor op costs microseconds of dispatch, and the router's dozen small ops and a mask
        tensor per layer were a tenth of a small model's forward pass.

        Args:
            pooled: (1, d_model) pooled features of one input.
        """
        if pooled.shape[0] != 1 or self.training:
            raise ValueError(f"decide_sets is for one input in evaluation, got a batch of {pooled.shape[0]} (training={self.training})")
        s_tensor = self.fraction(pooled, budget, offset)
        scores = F.linear(pooled, self.scorer.weight, self.scorer.bias)
        # s * H - 1e-6 in float32 as in heads_for: in double precision the ceiling can differ
        # for an input on a count boundary (calibration puts some validation input near one).
        count, *flat = torch.cat([(s_tensor * self.n_heads - 1e-6).view(1), scores.view(-1)]).tolist()
        if not math.isfinite(count):
            raise ValueError("the head router produced a non-finite head fraction (diverged training?)")
        k = min(max(math.ceil(count), 1), self.n_heads)
        sets, heads = [], range(self.n_heads)
        for layer in range(self.n_layers):
            layer_scores = flat[layer * self.n_heads : (layer + 1) * self.n_heads]
            # sorted() is stable, also with reverse=True: ties go to the lower index, as in the batched top-k
            sets.append(tuple(sorted(sorted(heads, key=layer_scores.__getitem__, reverse=True)[:k])))
        self.last_fraction, self._last_heads = s_tensor.detach(), k
        return sets

    def _soft_top_k(self, scores: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """Differentiable top-k gates, (batch, n_layers, n_heads) in (0, 1).

        A head's soft rank is the number of heads scoring above it, sum_j sigmoid((z_j - z_h) / tau)
        (0 for the best head; the exact rank as tau -> 0), and its gate sigmoid((s * H - rank) /
        count_temperature): on when rank < s * H, which is exactly the top ceil(s * H). The
        gradient reaches the scores through the ranks and the fraction s through the boundary
        heads (min(1, s * H * softmax) would give s no gradient once the softmax is sharp).
        """
        pairwise = torch.sigmoid((scores.unsqueeze(-2) - scores.unsqueeze(-1)) / self.temperature)  # [.., h, j]: z_j > z_h
        rank = pairwise.sum(-1) - 0.5  # the j = h term is sigmoid(0) = 0.5
        return torch.sigmoid((s.view(-1, 1, 1) * self.n_heads - rank) / self.cfg.count_temperature)

    def _top_k(self, scores: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Boolean mask of the k[i] highest scores of every layer of input i; ties go to the lower
        head index (stable sort), so an input gets the same heads alone and in any batch."""
        order = scores.argsort(dim=-1, descending=True, stable=True)
        if scores.shape[0] == 1:  # one input: one k, fewer small ops on the serving path
            return torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, order[..., : int(k[0])], True)
        rank = torch.empty_like(order)
        rank.scatter_(-1, order, torch.arange(self.n_heads, device=scores.device).expand_as(order))
        return rank < k.view(-1, 1, 1)

    def _queue_loss(self, probs: torch.Tensor, s: torch.Tensor, budget: float | None) -> None:
        cfg = self.cfg
        entropy = -(probs * probs.clamp_min(1e-9).log()).sum(-1).mean() / math.log(max(self.n_heads, 2))
        if self.by_difficulty:  # the mean is set by calibration; the hinge would only flatten z
            self._pending.append(cfg.entropy_weight * entropy)
            return
        target = cfg.target if cfg.mode == "learned" else validate_budget(budget if budget is not None else 1.0)
        hinge = F.relu(s.mean() - target)
        self._pending.append(cfg.entropy_weight * entropy + cfg.hinge_weight * hinge)

    def fit_difficulty(self, difficulty: torch.Tensor) -> None:
        """Queue the controller's regression onto ``difficulty`` ((batch,) > 0, higher = harder,
        e.g. the teacher's predictive entropy in nats) for the last training decision.

        Target: ``spread`` x the batch z-score of log(difficulty), clipped to +-3 standard
        deviations, so z is centred (the budget's mean is set by logit(b) and calibration) and
        its spread is fixed in logits. A batch of one input carries no ranking: skipped.
        """
        if not self.by_difficulty:
            raise ValueError("fit_difficulty is for a capped router with router.allocation 'difficulty'")
        raw = self._last_raw
        if raw is None or raw.shape != difficulty.shape:
            raise ValueError(
                f"fit_difficulty needs one difficulty per input of the last training decision "
                f"({None if raw is None else tuple(raw.shape)}), got {tuple(difficulty.shape)}"
            )
        if difficulty.numel() < 2:
            return
        log_d = difficulty.detach().to(raw.dtype).clamp_min(1e-6).log()
        z = (log_d - log_d.mean()) / log_d.std().clamp_min(1e-6)
        target = self.cfg.spread * z.clamp(-3.0, 3.0)
        self._pending.append(self.cfg.difficulty_weight * F.mse_loss(raw, target))

    def take_loss(self) -> torch.Tensor | None:
        """The regularisers queued by training forward passes since the last call, summed; then cleared."""
        if not self._pending:
            return None
        total = torch.stack(self._pending).sum()
        self._pending = []
        return total

    # ------------------------------------------------------------------ schedule

    def set_phase(self, step: int, total: int) -> None:
        """Exploration (noise, annealed temperature) for the first ``explore_fraction`` of
        ``total`` steps, then exploitation (hard top-k, straight-through)."""
        cfg = self.cfg
        explore_steps = int(round(cfg.explore_fraction * total))
        self.exploit = step >= explore_steps
        progress = min(1.0, step / max(1, explore_steps))
        self.temperature = cfg.temperature_start + (cfg.temperature_end - cfg.temperature_start) * progress
        self.noise = 0.0 if self.exploit else cfg.noise

    # ------------------------------------------------------------------ save / load

    def describe(self) -> dict[str, Any]:
        return {
            "config": self.cfg.to_dict(),
            "calibration": {str(b): d for b, d in sorted(self.calibration.items())},
            "spread_scale": {str(b): c for b, c in sorted(self.spread_scale.items())},
        }

    def load_calibration(self, table: dict[str, float], spread_scale: dict[str, float] | None = None) -> None:
        self.calibration = {validate_budget(float(b)): float(d) for b, d in table.items()}
        self.spread_scale = {validate_budget(float(b)): float(c) for b, c in (spread_scale or {}).items()}


def _interpolate(table: dict[float, float], budget: float, default: float) -> float:
    """A per-budget value, linear in logit(b) between the budgets of ``table`` and held beyond them."""
    return _interpolate_points(tuple(table.items()), budget) if table else default


@functools.lru_cache(maxsize=256)
def _interpolate_points(items: tuple[tuple[float, float], ...], budget: float) -> float:
    """:func:`_interpolate` of a table given as its items (cached: every batch-1 decision asks it twice)."""
    points = sorted((_logit(min(b, 1 - 1e-6)), v) for b, v in items)
    x = _logit(min(budget, 1 - 1e-6))
    if x <= points[0][0]:
        return points[0][1]
    for (x0, v0), (x1, v1) in zip(points, points[1:]):
        if x <= x1:
            return v0 + (v1 - v0) * (x - x0) / max(x1 - x0, 1e-12)
    return points[-1][1]


def pooled_embeddings(embedding: nn.Embedding, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of the token embeddings over real tokens: (batch, seq) -> (batch, d_model)."""
    x = embedding(input_ids)
    if attention_mask is None:  # sum / T by a tensor as below (not mean(), not a Python divisor, which
        # CUDA turns into a multiply by the reciprocal): the same bits as an all-ones mask
        return x.sum(dim=1) / x.new_full((1, 1), float(x.shape[1]))
    weights = attention_mask.to(x.dtype).unsqueeze(-1)
    return (x * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1.0)
