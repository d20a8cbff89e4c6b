"""Training, calibration and statistics of per-input head routing (BudgetFormer and its
budget-capped variant; :mod:`budgeted_attention.model.router`).

* :func:`train_routed`: the routing stage. Starts from a trained dense model with a fresh
  router; every step runs the router's phase schedule (exploration, then exploitation), the
  task loss, optional distillation from the frozen dense model (as BAA's budgeted stage) and the
  router's regularisers (through ``model.auxiliary_loss()``). A capped router gets one budget
  per step, sampled as in BAA (:func:`~budgeted_attention.training.stages.sample_budget`).
* :func:`calibrate_router`: the capped router's logit offset per budget, fitted on VALIDATION
  inputs so that the realised mean head fraction (k rounded up) is at most the budget.
* :func:`routing_summary`: accuracy, realised mean cost, heads per input and FLOPs on a split.
"""

from __future__ import annotations

import copy
import dataclasses
import random
from dataclasses import dataclass
from typing import Any

import torch

from budgeted_attention.data.dataset import Split
from budgeted_attention.data.synthetic import marker_counts
from budgeted_attention.model.cost import CostModel
from budgeted_attention.model.family import GatedModel
from budgeted_attention.model.router import pooled_embeddings
from budgeted_attention.tasks import CLASSIFY, Task
from budgeted_attention.training.config import TrainConfig
from budgeted_attention.training import distributed
from budgeted_attention.training.stages import StageLog, run_steps, sample_budget


def train_routed(
    model: GatedModel,
    train: Split,
    cfg: TrainConfig,
    *,
    seed: int,
    steps: int,
    teacher: GatedModel | None = None,
    desc: str = "routed",
    progress: bool = True,
    task: Task = CLASSIFY,
) -> StageLog:
    """The routing stage on ``model`` (which has a router attached): ``steps`` AdamW steps at ``cfg.lr``.

    ``teacher``: the frozen dense model to distil from with ``cfg.distill_weight`` (None: no
    distillation); a capped router with ``difficulty`` allocation also learns its per-input
    difficulty from the teacher's predictions.
    """
    router = model.router
    if router is None:
        raise ValueError("train_routed needs a model with a head router (model.attach_router)")
    if teacher is not None:
        teacher = copy.deepcopy(teacher).eval().to(distributed.current().device)
        for param in teacher.parameters():
            param.requires_grad_(False)
    capped = router.cfg.mode == "capped"
    # The capped router never sees b = 1 here: at b = 1 the model is the dense one, no routing.
    stage_cfg = dataclasses.replace(cfg, full_budget_prob=0.0) if capped else cfg
    counter = {"step": 0}

    def loss_fn(m, ids, mask, labels, rng: random.Random):
        router.set_phase(counter["step"], steps)
        counter["step"] += 1
        budget = sample_budget(stage_cfg, rng) if capped else None
        logits = m(ids, mask, budget=budget)
        loss = task.loss(logits, ids, mask, labels)
        teacher_logits = None
        if teacher is not None and (cfg.distill_weight > 0 or router.by_difficulty):
            with torch.no_grad():
                teacher_logits = teacher(ids, mask)
        if teacher_logits is not None and cfg.distill_weight > 0:
            loss = loss + cfg.distill_weight * task.distill(logits, teacher_logits, mask, cfg.distill_temperature)
        if router.by_difficulty:
            # The dense teacher's uncertainty: exogenous, so the heads an input got cannot feed back.
            # Without a teacher, the model's own (routed) prediction stands in.
            router.fit_difficulty(task.difficulty(logits.detach() if teacher_logits is None else teacher_logits, mask))
        info = {"s": float(router.last_fraction.mean())}
        if budget is not None:
            info["b"] = budget
        return loss, info

    return run_steps(model, train, steps, loss_fn, cfg, seed=seed, lr=cfg.lr, desc=desc, progress=progress)


@torch.no_grad()
def _pooled(model: GatedModel, split: Split, batch_size: int) -> torch.Tensor:
    """Pooled router features of every input of ``split``: (N, d_model)."""
    parts = [
        pooled_embeddings(model.input_embedding(), ids, mask)
        for ids, mask, _ in split.batches(batch_size, shuffle=False)
    ]
    return torch.cat(parts)


@torch.no_grad()
def realised_cost(model: GatedModel, pooled: torch.Tensor, budget: float | None, offset: float | None = None) -> float:
    """Mean over inputs of the head fraction actually run, k / n_heads (k = ceil(s * H))."""
    k = model.router.head_counts(pooled, budget, offset)
    return float(k.float().mean()) / model.router.n_heads


@torch.no_grad()
def calibrate_router(
    model: GatedModel, val: Split, budgets: list[float], *, batch_size: int = 256, iterations: int = 40, replace: bool = True,
) -> dict[float, float]:
    """Fit the capped router's offset delta(b) for each budget on VALIDATION inputs.

    For each b < 1, bisection finds the largest offset whose realised mean head fraction is at
    most b, then the smallest offset with that same realised cost; the offset is the middle of
    that interval, so no validation input sits on a count boundary (where the rounding of a
    batch-1 and a batched evaluation could disagree). A budget below 1 / n_heads cannot be met
    (every input runs at least one head per layer); its offset is then the lowest searched.

    Returns the table (budget -> offset), which is also stored on the router: replacing its
    table, or (``replace=False``) updating the given budgets' entries only.
    """
    router = model.router
    if router is None or router.cfg.mode != "capped":
        raise ValueError("calibration is for a budget-capped router (router.mode 'capped')")
    if len(val) == 0:
        raise ValueError("calibration needs validation inputs: the validation split is empty")
    model.eval()
    pooled = _pooled(model, val, batch_size)
    table: dict[float, float] = {}
    for b in budgets:
        if b >= 1.0:
            continue
        low, high = -20.0, 20.0
        if realised_cost(model, pooled, b, low) > b:
            table[b] = low
            continue
        for _ in range(iterations):
            mid = 0.5 * (low + high)
            if realised_cost(model, pooled, b, mid) <= b:
                low = mid
            else:
                high = mid
        cost = realised_cost(model, pooled, b, low)
        below, edge = -20.0, low  # the flat interval (below, edge] of offsets with this same cost
        for _ in range(iterations):
            mid = 0.5 * (below + edge)
            if realised_cost(model, pooled, b, mid) < cost:
                below = mid
            else:
                edge = mid
        table[b] = 0.5 * (edge + low)
    if replace:
        router.calibration = dict(table)
    else:
        router.calibration.update(table)
    return table


SPREAD_SCALES = (0.0, 0.5, 1.0)


@torch.no_grad()
def choose_spread(
    model: GatedModel, val: Split, budgets: list[float], *, scales: tuple[float, ...] = SPREAD_SCALES,
    task: Task = CLASSIFY, batch_size: int = 256,
) -> dict[float, dict[str, Any]]:
    """For each budget b < 1, the multiplier of a difficulty router's z, chosen on VALIDATION.

    Each candidate c (0: every input the same head count; 1: the spread trained for) is
    calibrated to the budget (:func:`calibrate_router`), then scored on the validation split;
    the best score wins, ties to the smaller c. How unequal the allocation should be is an
    empirical question per budget and data set: at a low budget, taking heads from easy inputs
    can cost more than hard inputs gain. The choice and its offset are stored on the router.

    Returns:
        ``{b: {"scale": c, "val_scores": {c: score}, "offsets": {c: delta}}}`` (score: the task's
        higher-is-better metric; keys of the inner maps are ``str(c)``).
    """
    router = model.router
    if router is None or not router.by_difficulty:
        raise ValueError("choose_spread is for a capped router with router.allocation 'difficulty'")
    choices: dict[float, dict[str, Any]] = {}
    for b in budgets:
        if b >= 1.0:
            continue
        scores, offsets = {}, {}
        before = dict(router.spread_scale), dict(router.calibration)
        try:
            for c in scales:
                router.spread_scale[b] = c
                offsets[c] = calibrate_router(model, val, [b], batch_size=batch_size, replace=False)[b]
                scores[c] = task.score(task.evaluate(model, val, batch_size, budget=b))
        except BaseException:
            router.spread_scale, router.calibration = before  # no half-tried candidate left behind
            raise
        best = max(scales, key=lambda c: (scores[c], -c))
        router.spread_scale[b], router.calibration[b] = best, offsets[best]
        choices[b] = {"scale": best, "val_scores": {str(c): v for c, v in scores.items()}, "offsets": {str(c): d for c, d in offsets.items()}}
    return choices


@dataclass
class RoutingSummary:
    """Per-input routing on one split (at one budget, or the learned budget).

    Attributes:
        metrics: the task's evaluation (accuracy, ...), with the hard routing.
        cost: mean head fraction run, in [0, 1].
        mean_heads: mean heads per layer per input.
        heads: heads per layer of every input, in split order.
        flops_fraction: mean whole-model forward FLOPs over the dense model's (cost model at
            ``seq_len``).
        ideal_speedup: dense FLOPs / mean routed FLOPs (the FLOP limit of the routed forward).
    """

    metrics: dict[str, float]
    cost: float
    mean_heads: float
    heads: list[int]
    flops_fraction: float
    ideal_speedup: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@torch.no_grad()
def routing_summary(
    model: GatedModel, split: Split, cost: CostModel, *, budget: float | None, batch_size: int = 256, task: Task | None = CLASSIFY,
) -> RoutingSummary:
    """Hard routing on ``split`` at ``budget`` (None for a learned router); ``task`` None: heads
    and FLOPs only (no metrics)."""
    if len(split) == 0:
        raise ValueError("routing_summary needs at least one input: the split is empty")
    model.eval()
    router = model.router
    metrics = {} if task is None else task.evaluate(model, split, batch_size, budget=budget)
    heads = [int(k) for k in router.head_counts(_pooled(model, split, batch_size), budget)]
    dense = cost.total_flops()
    flops = [cost.total_flops([k] * router.n_layers) for k in heads]
    mean_flops = sum(flops) / len(flops)
    return RoutingSummary(
        metrics=metrics, cost=sum(heads) / (len(heads) * router.n_heads), mean_heads=sum(heads) / len(heads),
        heads=heads, flops_fraction=mean_flops / dense, ideal_speedup=dense / mean_flops,
    )


def _ranks(values: torch.Tensor) -> torch.Tensor:
    """Average ranks (ties share their mean rank), float (N,)."""
    order = values.argsort()
    ranks = torch.empty(len(values), dtype=torch.float64)
    ranks[order] = torch.arange(len(values), dtype=torch.float64)
    for value in values.unique():  # ties: mean rank (heads take few distinct values)
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman rank correlation of two (N,) tensors; 0 when either is constant."""
    ra, rb = _ranks(a), _ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denominator = float(ra.norm() * rb.norm())
    return float((ra * rb).sum()) / denominator if denominator > 0 else 0.0


@torch.no_grad()
def difficulty_profile(heads: list[int], dense: GatedModel, split: Split, source: str, batch_size: int = 256) -> dict[str, Any]:
    """How the heads an input gets track its difficulty.

    Difficulty: the dense model's per-input loss (any data; bins = its quartiles) and, on the
    synthetic task, the number of markers in the input (``mixed_markers``).

    Args:
        heads: heads per layer of each input of ``split`` (split order).
        dense: the dense model the router was trained from.
        split: the inputs (e.g. the test split, inside its final evaluation).
        source: the data source name (``synthetic`` adds the marker bins).
    """
    dense.eval()
    losses, correct = [], []
    for ids, mask, labels in split.batches(batch_size):
        logits = dense(ids, mask)
        losses.append(torch.nn.functional.cross_entropy(logits, labels, reduction="none"))
        correct.append(logits.argmax(-1) == labels)
    loss, right = torch.cat(losses), torch.cat(correct).double()
    k = torch.tensor(heads, dtype=torch.float64)

    def bins(keys: torch.Tensor, labels: list[str]) -> list[dict[str, Any]]:
        out = []
        for index, label in enumerate(labels):
            chosen = keys == index
            if chosen.any():
                out.append({"bin": label, "count": int(chosen.sum()), "mean_heads": float(k[chosen].mean()), "dense_accuracy": float(right[chosen].mean())})
        return out

    quartile = torch.clamp((_ranks(loss) * 4 / len(loss)).long(), max=3)
    profile: dict[str, Any] = {
        "spearman_dense_loss": spearman(k, loss.double()),
        "by_dense_loss": bins(quartile, ["Q1 (easiest)", "Q2", "Q3", "Q4 (hardest)"]),
    }
    if source == "synthetic":
        markers = marker_counts(split.input_ids)
        values = sorted(int(m) for m in markers.unique())
        profile["by_markers"] = bins(torch.tensor([values.index(int(m)) for m in markers]), [str(v) for v in values])
        profile["spearman_markers"] = spearman(k, markers.double())
    return profile
