"""The training stages of the paper.

1. ``train_dense``: the dense warm start (no gate code runs).
2. ``train_budgeted``: sample a budget per step, gate heads softly with g(b), penalise the
   estimated cost C(b) exceeding b, optionally distil from the dense teacher. Used both after
   the warm start (method ``budgeted``) and from a random init (ablation ``budgeted-scratch``).
3. ``train_hard``: hard-gate adaptation. The forward pass uses the hard 0/1 mask of the
   budget's kept heads (nested ranking fixed before the stage) and distils from the soft
   budgeted model at the same budget. The gates are frozen in this stage, so the ranking
   stored with the checkpoint is still the one its gates define.

Budget sampling (``train.budget_sampling``): ``single`` draws one budget per step (the paper);
``sandwich`` runs, every step, the full model (b = 1, cross-entropy on the labels), the smallest
budget and ``sandwich_random`` random budgets, the sub-models distilled in place from the full
model's output (the sandwich rule of slimmable / once-for-all networks), in both the soft and
the hard stage. A sandwich step runs 2 + ``sandwich_random`` forward/backward passes.

Units: the gates are every unit the model gates (heads, and FFN neuron groups under
``budget_scope: all``); C(b) is their compute-weighted gate mass (:func:`estimated_cost`).

Every stage works on any :class:`budgeted_attention.model.family.GatedModel`
(``model(ids, mask, gates=G)`` and ``model.gates``), so every model family reuses it unchanged.
Each stage returns a :class:`StageLog` with the optimiser steps it ran.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from budgeted_attention.data.dataset import Split
from budgeted_attention.errors import ConfigError
from budgeted_attention.model.cost import estimated_cost
from budgeted_attention.model.gates import UnitGates
from budgeted_attention.pruning.selection import Ranking
from budgeted_attention.tasks import CLASSIFY, Task
from budgeted_attention.training import distributed
from budgeted_attention.training.config import TrainConfig

LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor, random.Random], tuple[torch.Tensor, dict]]


@dataclass
class StageLog:
    """What a training stage did.

    Attributes:
        losses: training loss per optimiser step run.
        steps: optimiser steps that produced the returned weights (with early stopping: the
            step of the best validation score, whose weights are restored).
        steps_run: optimiser steps actually run (>= steps).
        val_history: (step, validation score) at each evaluation (early stopping only): accuracy,
            or minus the loss for a language model (higher is better).
    """

    losses: list[float] = field(default_factory=list)
    steps: int = 0
    steps_run: int = 0
    val_history: list[tuple[int, float]] = field(default_factory=list)

    def loss_curve(self, points: int = 100) -> list[tuple[int, float]]:
        """The training loss as at most ``points`` (last step, mean loss) pairs over equal windows
        of steps: a curve small enough to store with a unit's record."""
        if not self.losses:
            return []
        window = max(1, math.ceil(len(self.losses) / points))
        return [
            (min(start + window, len(self.losses)), sum(chunk) / len(chunk))
            for start in range(0, len(self.losses), window)
            for chunk in [self.losses[start:start + window]]
        ]


def seed_everything(seed: int) -> None:
    """Seed Python and torch RNGs (model init, dropout)."""
    random.seed(seed)
    torch.manual_seed(seed)


def is_gate_parameter(name: str) -> bool:
    """Parameters of the budget gates (heads: ``gates.*``, FFN groups: ``ffn_gates.*``)."""
    return any(part in ("gates", "ffn_gates") for part in name.split(".")[:-1])


def _param_groups(model: nn.Module, lr: float, gate_lr: float, weight_decay: float) -> list[dict]:
    """Weight decay on matrices only; the budget gates get their own (larger) learning rate, and so
    does a per-input head router when ``router.lr`` is set."""
    decay, no_decay, gates, router = [], [], [], []
    router_module = getattr(model, "router", None)
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if is_gate_parameter(name):
            gates.append(param)
        elif name.startswith("router.") and router_module is not None and router_module.cfg.lr > 0:
            router.append(param)
        elif param.ndim >= 2 and "embedding" not in name:
            decay.append(param)
        else:
            no_decay.append(param)
    groups = [
        {"params": decay, "lr": lr, "weight_decay": weight_decay},
        {"params": no_decay, "lr": lr, "weight_decay": 0.0},
    ]
    if gates:
        groups.append({"params": gates, "lr": gate_lr, "weight_decay": 0.0})
    if router:  # a per-input head router with its own rate (router.lr)
        groups.append({"params": router, "lr": router_module.cfg.lr, "weight_decay": 0.0})
    return [g for g in groups if g["params"]]


def _adamw(groups: list[dict]) -> torch.optim.AdamW:
    """AdamW, fused where the parameters' device supports it (one kernel for all tensors: the
    optimiser step of small models is otherwise a large share of a CPU training step)."""
    try:
        return torch.optim.AdamW(groups, fused=True)
    except (RuntimeError, TypeError, ValueError):  # pragma: no cover - devices without a fused kernel
        return torch.optim.AdamW(groups)


def _schedule(step: int, total: int, warmup_frac: float) -> float:
    """Linear warm-up then cosine decay to 10%, as a multiplier of the base learning rate."""
    warmup = max(1, int(total * warmup_frac))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))


class _LossStep(nn.Module):
    """One training step's loss as a module, so DistributedDataParallel sees one forward per
    backward even when the loss runs the model several times (sandwich rule, teacher passes)."""

    def __init__(self, model: nn.Module, loss_fn: LossFn) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, ids, mask, labels, rng: random.Random, scale: float = 1.0) -> tuple[torch.Tensor, dict]:
        loss, info = self.loss_fn(self.model, ids, mask, labels, rng)
        auxiliary = self.model.auxiliary_loss() if hasattr(self.model, "auxiliary_loss") else None
        if auxiliary is not None:  # e.g. Meta-Attention's routing KL of this step's forward passes
            loss = loss + auxiliary
            info = {**info, "aux": float(auxiliary.detach())}
        return loss * scale, info


def _distributed_step(model: nn.Module, loss_fn: LossFn, runtime: distributed.Runtime) -> nn.Module:
    """The step module: wrapped in DDP under torchrun (gradients averaged over ranks), else plain."""
    step = _LossStep(model, loss_fn)
    if not runtime.distributed:
        return step
    from torch.nn.parallel import DistributedDataParallel  # noqa: PLC0415 - DDP only under torchrun

    device_ids = [runtime.device.index] if runtime.device.type == "cuda" else None
    # find_unused_parameters: the dense stage leaves the gates unused, hard stages freeze them.
    return DistributedDataParallel(step, device_ids=device_ids, find_unused_parameters=True)


def run_steps(
    model: nn.Module,
    train: Split,
    steps: int,
    loss_fn: LossFn,
    cfg: TrainConfig,
    *,
    seed: int,
    lr: float,
    desc: str,
    progress: bool = True,
    evaluate: Callable[[nn.Module], float] | None = None,
    eval_every: int = 0,
    patience: int = 0,
) -> StageLog:
    """Optimise ``loss_fn`` for at most ``steps`` AdamW steps over shuffled epochs of ``train``.

    Early stopping (``evaluate`` given, ``eval_every`` > 0): the score (validation accuracy) is
    computed every ``eval_every`` steps and at the end; training stops after ``patience``
    evaluations without improvement (0 = never stops early), and the best weights are restored.
    """
    log = StageLog()
    if steps == 0:
        return log
    frozen = _frozen_embedding(model) if cfg.freeze_embeddings else []
    try:
        return _run_steps(model, train, steps, loss_fn, cfg, log, seed=seed, lr=lr, desc=desc, progress=progress,
                          evaluate=evaluate, eval_every=eval_every, patience=patience)
    finally:
        for param in frozen:
            param.requires_grad_(True)


def _frozen_embedding(model: nn.Module) -> list[nn.Parameter]:
    """Switch off the gradient of the token embedding's trainable parameters (``train.freeze_embeddings``);
    returns them, to be switched back on after the stage. A tied output layer is the same tensor."""
    embedding = model.input_embedding() if hasattr(model, "input_embedding") else None
    if embedding is None:
        raise ConfigError(f"train.freeze_embeddings: {type(model).__name__} has no input_embedding() to freeze")
    frozen = [p for p in embedding.parameters() if p.requires_grad]
    for param in frozen:
        param.requires_grad_(False)
    return frozen


def _run_steps(
    model: nn.Module,
    train: Split,
    steps: int,
    loss_fn: LossFn,
    cfg: TrainConfig,
    log: StageLog,
    *,
    seed: int,
    lr: float,
    desc: str,
    progress: bool,
    evaluate: Callable[[nn.Module], float] | None,
    eval_every: int,
    patience: int,
) -> StageLog:
    runtime = distributed.current()
    best_score, best_state, stale = -math.inf, None, 0
    model.to(runtime.device)  # a no-op when the pipeline already moved it
    model.train()
    step_module = _distributed_step(model, loss_fn, runtime)
    optimizer = _adamw(_param_groups(model, lr, cfg.gate_lr, cfg.weight_decay))
    base_lrs = [group["lr"] for group in optimizer.param_groups]
    batch_gen = torch.Generator().manual_seed(seed)
    budget_rng = random.Random(seed)
    losses: list[float] = []
    batches = iter(())
    bar = tqdm(range(steps), desc=desc, disable=not progress or not runtime.is_main, leave=False, dynamic_ncols=True)
    for step in bar:
        try:
            batch = next(batches)
        except StopIteration:
            batches = train.batches(cfg.batch_size, shuffle=True, generator=batch_gen)
            batch = next(batches)
        # Every rank drew the same global batch (same generator); each trains on its shard.
        (ids, mask, labels), scale = distributed.shard(tuple(t.to(runtime.device, non_blocking=True) for t in batch), runtime)
        factor = _schedule(step, steps, cfg.warmup_frac)
        for group, base in zip(optimizer.param_groups, base_lrs):
            group["lr"] = base * factor
        with runtime.autocast():
            loss, info = step_module(ids, mask, labels, budget_rng, scale)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip > 0:
            nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        # A fused step writes the weights without bumping their version counters; the caches
        # keyed on versions (gathered head sets, lean inference copies) must see the change.
        torch.autograd.graph.increment_version([p for group in optimizer.param_groups for p in group["params"]])
        losses.append(float(loss.detach()) / scale if scale else float("nan"))
        if step % 20 == 0:
            bar.set_postfix(loss=f"{float(loss.detach()):.3f}", **{k: f"{v:.3f}" for k, v in info.items()})
        done = step + 1
        if evaluate is not None and eval_every > 0 and (done % eval_every == 0 or done == steps):
            score = evaluate(model)
            model.train()
            log.val_history.append((done, score))
            if score > best_score:
                best_score, best_state, stale, log.steps = score, copy.deepcopy(model.state_dict()), 0, done
            else:
                stale += 1
                if distributed.agree(bool(patience and stale >= patience)):  # every rank stops together
                    break
    bar.close()
    log.losses, log.steps_run = losses, len(losses)
    if best_state is not None:
        model.load_state_dict(best_state)
    else:
        log.steps = log.steps_run
    model.eval()
    return log


def train_dense(
    model: nn.Module,
    train: Split,
    cfg: TrainConfig,
    *,
    seed: int,
    progress: bool = True,
    val: Split | None = None,
    steps: int | None = None,
    desc: str = "dense",
    task: Task = CLASSIFY,
) -> StageLog:
    """Stage 1: dense training with all gates off (no gate code in the forward pass).

    With ``cfg.early_stopping_patience`` > 0 and a validation split, ``cfg.dense_steps`` is the
    maximum and training stops when the validation metric stops improving (best weights kept).
    """

    def loss_fn(m, ids, mask, labels, _rng):
        return task.loss(m(ids, mask), ids, mask, labels), {}

    early = cfg.early_stopping_patience > 0 and val is not None
    evaluate = (lambda m: task.score(task.evaluate(m, val, cfg.eval_batch_size))) if early else None
    n_steps = cfg.dense_steps if steps is None else steps
    return run_steps(
        model, train, n_steps, loss_fn, cfg, seed=seed, lr=cfg.lr, desc=desc, progress=progress,
        evaluate=evaluate, eval_every=cfg.eval_every if early else 0, patience=cfg.early_stopping_patience,
    )


def sample_budget(cfg: TrainConfig, rng: random.Random) -> float:
    """A training budget: exactly 1 with probability ``cfg.full_budget_prob``, else Uniform[min, max].

    Steps at b = 1 train the ungated dense path (g(1) = 1), so the model at b = 1 stays the limit
    of the model at b -> 1 instead of a cliff the budgeted stage never visits.
    """
    if cfg.full_budget_prob > 0 and rng.random() < cfg.full_budget_prob:
        return 1.0
    return rng.uniform(cfg.budget_min, cfg.budget_max)


def sandwich_budgets(cfg: TrainConfig, rng: random.Random) -> list[float]:
    """The sub-model budgets of one sandwich step: the smallest, then ``sandwich_random`` random ones."""
    return [cfg.budget_min] + [rng.uniform(cfg.budget_min, cfg.budget_max) for _ in range(cfg.sandwich_random)]


def _cost_terms(gates: UnitGates, costs: UnitGates, budget: float, cfg: TrainConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(budget penalty, C(b)) of soft gates at ``budget``."""
    cost = estimated_cost(gates, costs)
    penalty = cfg.overshoot_weight * F.relu(cost - budget + cfg.overshoot_margin) + cfg.gate_mass_weight * cost
    # g(1 - g) is 0 for decided gates and 0.25 for g = 0.5: it pushes gates towards 0/1 so
    # that the soft cost is carried by few units, which makes the hard ranking meaningful.
    values = torch.cat([part.flatten() for part in gates.parts()])
    penalty = penalty + cfg.polarization_weight * (values * (1 - values)).mean()
    return penalty, cost


def _soft_gates(m: nn.Module, budget: float, costs: UnitGates) -> UnitGates:
    """g(b) of the gated units: heads only when ``costs`` cover heads only."""
    return m.unit_gates(budget) if costs.ffn is not None else UnitGates(m.gates(budget))


def _straight_through(m: nn.Module, gates: UnitGates, budget: float, costs: UnitGates, min_one_per_layer: bool) -> UnitGates:
    """The hard 0/1 masks of ``budget`` in the forward pass, the gradient of ``gates`` (g(b)) in the
    backward pass: mask + g - sg(g).

    The kept units are the hard stage's: ranked by the area under each gate curve
    (:meth:`unit_importance`), cut where the FLOPs reach b, so training sees the sub-models the
    pruned checkpoints will be. Shapes as ``gates`` (full grids)."""
    importance = m.unit_importance()
    if costs.ffn is None:
        importance = UnitGates(importance.heads)
    masks = Ranking.from_scores(importance, costs, min_one_per_layer).masks(budget)
    return UnitGates(
        *[mask.to(g) + g - g.detach() for mask, g in zip(masks.parts(), gates.parts())]
    )


def budgeted_loss(
    model: nn.Module,
    unit_costs: UnitGates,
    cfg: TrainConfig,
    teacher: nn.Module | None,
    task: Task = CLASSIFY,
    min_one_per_layer: bool = True,
) -> LossFn:
    """The budgeted objective (see :class:`TrainConfig`), one budget per step or the sandwich rule.

    ``unit_costs``: FLOPs per gated unit (heads, and FFN groups when they are under the budget).
    """

    straight_through = cfg.gate_forward == "straight-through"

    def single(m, ids, mask, labels, rng):
        budget = sample_budget(cfg, rng)
        gates = _soft_gates(m, budget, unit_costs)
        if straight_through:
            logits = m(ids, mask, gates=_straight_through(m, gates, budget, unit_costs, min_one_per_layer))
            cost = estimated_cost(gates, unit_costs)
            # Two-sided and smooth: the forward already meets b, the term only keeps the gates'
            # level near g = b (away from sigmoid saturation, where the area ranking would tie).
            penalty = cfg.overshoot_weight * (cost - budget) ** 2
        else:
            logits = m(ids, mask, gates=gates)
            penalty, cost = _cost_terms(gates, unit_costs, budget, cfg)
        loss = task.loss(logits, ids, mask, labels) + penalty
        if teacher is not None and cfg.distill_weight > 0:
            with torch.no_grad():
                teacher_logits = teacher(ids, mask)
            loss = loss + cfg.distill_weight * task.distill(logits, teacher_logits, mask, cfg.distill_temperature)
        return loss, {"b": budget, "C": float(cost.detach())}

    def sandwich(m, ids, mask, labels, rng):
        full_logits = m(ids, mask)  # b = 1: every gate is exactly 1
        loss = task.loss(full_logits, ids, mask, labels)
        target = full_logits.detach()
        costs = []
        for budget in sandwich_budgets(cfg, rng):
            gates = _soft_gates(m, budget, unit_costs)
            penalty, cost = _cost_terms(gates, unit_costs, budget, cfg)
            loss = loss + task.distill(m(ids, mask, gates=gates), target, mask, cfg.distill_temperature) + penalty
            costs.append(float(cost.detach()))
        return loss, {"C_min": costs[0]}

    return sandwich if cfg.budget_sampling == "sandwich" else single


def _stage_validation(
    cfg: TrainConfig, task: Task, val: Split | None, budgets: Sequence[float], gating: Callable[[float], dict[str, Any]],
) -> tuple[Callable[[nn.Module], float] | None, int]:
    """(evaluate, eval_every) of a budgeted stage: with ``cfg.early_stop_budgeted`` (and a
    patience, a validation split and budgets), the mean validation score over ``budgets``, each
    evaluated with ``gating(b)`` (soft gates or a hard mask); else (None, 0), no early stopping."""
    if not (cfg.early_stop_budgeted and cfg.early_stopping_patience > 0 and val is not None and budgets):
        return None, 0

    def evaluate(m: nn.Module) -> float:
        return sum(task.score(task.evaluate(m, val, cfg.eval_batch_size, **gating(b))) for b in budgets) / len(budgets)

    return evaluate, cfg.eval_every


def train_budgeted(
    model: nn.Module,
    train: Split,
    cfg: TrainConfig,
    unit_costs: UnitGates,
    *,
    seed: int,
    teacher: nn.Module | None = None,
    steps: int | None = None,
    desc: str = "budgeted",
    progress: bool = True,
    task: Task = CLASSIFY,
    val: Split | None = None,
    val_budgets: Sequence[float] = (),
    min_one_per_layer: bool = True,
) -> StageLog:
    """Stage 2: budgeted training with soft gates (``teacher``: the frozen dense model, optional;
    the sandwich rule distils from the model's own full output instead).

    ``unit_costs``: FLOPs per gated unit (:meth:`GatedModel.unit_costs`: heads, and FFN groups when gated).
    With ``cfg.early_stop_budgeted``: early-stopped on the mean validation score of the soft
    gates at ``val_budgets`` (best weights and gates kept). ``min_one_per_layer``: the ranking
    rule of the straight-through forward (``cfg.gate_forward``), the run's.
    """
    if teacher is not None:
        teacher = copy.deepcopy(teacher).eval().to(distributed.current().device)
        for param in teacher.parameters():
            param.requires_grad_(False)
    device = distributed.current().device  # the costs meet the gates on the training device
    unit_costs = unit_costs.map(lambda t: t.to(device))
    loss_fn = budgeted_loss(model, unit_costs, cfg, teacher, task, min_one_per_layer)
    n_steps = cfg.budgeted_steps if steps is None else steps
    evaluate, eval_every = _stage_validation(cfg, task, val, val_budgets, lambda b: {"budget": b})
    return run_steps(
        model, train, n_steps, loss_fn, cfg, seed=seed, lr=cfg.lr, desc=desc, progress=progress,
        evaluate=evaluate, eval_every=eval_every, patience=cfg.early_stopping_patience,
    )


def train_hard(
    model: nn.Module,
    train: Split,
    cfg: TrainConfig,
    ranking: Ranking,
    *,
    seed: int,
    progress: bool = True,
    budgets: tuple[float, float] | None = None,
    desc: str = "hard",
    task: Task = CLASSIFY,
    val: Split | None = None,
    val_budgets: Sequence[float] = (),
) -> StageLog:
    """Stage 3: hard-gate adaptation with soft-model distillation; the gates are frozen.

    Each step samples a budget (``budgets`` = (min, max), default (``cfg.hard_budget_min`` or
    ``cfg.budget_min``, ``cfg.budget_max``), plus b = 1 with ``cfg.full_budget_prob``), runs exactly the ranking's kept heads for it (hard 0/1 mask)
    and distils from the soft budgeted model at the same budget. ``ranking`` is fixed and the
    gates do not move, so the ranking derived from the saved gates is the stored one.

    With ``cfg.budget_sampling == "sandwich"``: each step the full model (cross-entropy), the
    hard sub-models of the smallest and ``sandwich_random`` random budgets distilled in place from
    the full model's output.

    With ``cfg.early_stop_budgeted``: early-stopped on the mean validation score of the hard
    models of ``val_budgets`` (each budget's kept units; best weights kept).
    """
    use_sandwich = cfg.budget_sampling == "sandwich"
    teacher = None
    if not use_sandwich:  # the sandwich distils from the model's own full output
        teacher = copy.deepcopy(model).eval().to(distributed.current().device)
        for param in teacher.parameters():
            param.requires_grad_(False)
    hard_min = cfg.budget_min if cfg.hard_budget_min is None else cfg.hard_budget_min
    low, high = budgets if budgets is not None else (hard_min, cfg.budget_max)
    stage_cfg = dataclasses.replace(cfg, budget_min=low, budget_max=high)
    masks: dict[float, UnitGates] = {}

    def hard_mask(budget: float) -> UnitGates:
        # Only the budgets that recur (the range ends, b = 1) are cached; uniform draws never repeat.
        hard = masks.get(budget)
        if hard is None:
            hard = ranking.masks(budget)
            if budget in (low, high, 1.0):
                masks[budget] = hard
        return hard

    def sandwich(m, ids, mask, labels, rng):
        full_logits = m(ids, mask)
        loss = task.loss(full_logits, ids, mask, labels)
        target = full_logits.detach()
        for budget in sandwich_budgets(stage_cfg, rng):
            loss = loss + task.distill(m(ids, mask, gates=hard_mask(budget)), target, mask, cfg.distill_temperature)
        return loss, {}

    def loss_fn(m, ids, mask, labels, rng):
        budget = sample_budget(stage_cfg, rng)
        logits = m(ids, mask, gates=hard_mask(budget))
        loss = task.loss(logits, ids, mask, labels)
        if cfg.distill_weight > 0:
            with torch.no_grad():
                teacher_logits = teacher(ids, mask, budget=budget)
            loss = loss + cfg.distill_weight * task.distill(logits, teacher_logits, mask, cfg.distill_temperature)
        return loss, {"b": budget}

    frozen = [p for name, p in model.named_parameters() if is_gate_parameter(name) and p.requires_grad]
    for param in frozen:
        param.requires_grad_(False)
    chosen = sandwich if use_sandwich else loss_fn
    evaluate, eval_every = _stage_validation(cfg, task, val, val_budgets, lambda b: {"gates": hard_mask(b)})
    try:
        return run_steps(
            model, train, cfg.hard_steps, chosen, cfg, seed=seed, lr=cfg.hard_lr, desc=desc, progress=progress,
            evaluate=evaluate, eval_every=eval_every, patience=cfg.early_stopping_patience,
        )
    finally:
        for param in frozen:
            param.requires_grad_(True)


def train_masked(
    model: nn.Module,
    train: Split,
    cfg: TrainConfig,
    mask: UnitGates,
    *,
    steps: int,
    seed: int,
    desc: str = "recover",
    progress: bool = True,
    task: Task = CLASSIFY,
) -> StageLog:
    """Fine-tune with a fixed hard mask of the gated units (the recovery of the post-hoc baseline).

    Gates receive no gradient (the mask is a constant), so only the remaining weights adapt.
    """
    fixed = mask.map(lambda t: t.detach().clone())

    def loss_fn(m, ids, attn, labels, _rng):
        return task.loss(m(ids, attn, gates=fixed), ids, attn, labels), {}

    return run_steps(model, train, steps, loss_fn, cfg, seed=seed, lr=cfg.hard_lr, desc=desc, progress=progress)
