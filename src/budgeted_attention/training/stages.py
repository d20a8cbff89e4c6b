"""The training stages of the paper.

1. ``train_dense``: the dense warm start (no gate code runs).
2. ``train_budgeted``: sample a budget per step, gate heads softly with g(b), penalise the
   estimated cost C(b) exceeding b, optionally distil from the dense teacher. Used both after
   the warm start (method ``budgeted``) and from a random init (ablation ``budgeted-scratch``).
3. ``train_hard``: hard-gate adaptation. The forward pass uses the hard 0/1 mask of the
   budget's kept heads (nested ranking fixed before the stage), with a straight-through
   estimator to the soft gates, and distils from the soft budgeted model at the same budget.

Every stage works on any model with the interface ``model(ids, mask, gates=G)`` and a
``model.gates`` :class:`BudgetGates`, so pretrained encoders reuse it unchanged.
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from budgeted_attention.data.dataset import Split
from budgeted_attention.model.cost import estimated_cost
from budgeted_attention.pruning.selection import HeadRanking
from budgeted_attention.training.config import TrainConfig

LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor, random.Random], tuple[torch.Tensor, dict]]


def seed_everything(seed: int) -> None:
    """Seed Python and torch RNGs (model init, dropout)."""
    random.seed(seed)
    torch.manual_seed(seed)


def _param_groups(model: nn.Module, lr: float, gate_lr: float, weight_decay: float) -> list[dict]:
    """Weight decay on matrices only; the budget gates get their own (larger) learning rate."""
    decay, no_decay, gates = [], [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if name.startswith("gates.") or ".gates." in name:
            gates.append(param)
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
    return [g for g in groups if g["params"]]


def _schedule(step: int, total: int, warmup_frac: float) -> float:
    """Linear warm-up then cosine decay to 10%, as a multiplier of the base learning rate."""
    warmup = max(1, int(total * warmup_frac))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))


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
) -> list[float]:
    """Optimise ``loss_fn`` for ``steps`` AdamW steps over shuffled epochs of ``train``.

    Returns the per-step loss values (for logging).
    """
    if steps == 0:
        return []
    model.train()
    optimizer = torch.optim.AdamW(_param_groups(model, lr, cfg.gate_lr, cfg.weight_decay))
    base_lrs = [group["lr"] for group in optimizer.param_groups]
    batch_gen = torch.Generator().manual_seed(seed)
    budget_rng = random.Random(seed)
    losses: list[float] = []
    batches = iter(())
    bar = tqdm(range(steps), desc=desc, disable=not progress, leave=False, dynamic_ncols=True)
    for step in bar:
        try:
            ids, mask, labels = next(batches)
        except StopIteration:
            batches = train.batches(cfg.batch_size, shuffle=True, generator=batch_gen)
            ids, mask, labels = next(batches)
        factor = _schedule(step, steps, cfg.warmup_frac)
        for group, base in zip(optimizer.param_groups, base_lrs):
            group["lr"] = base * factor
        loss, info = loss_fn(model, ids, mask, labels, budget_rng)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip > 0:
            nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        losses.append(float(loss.detach()))
        if step % 20 == 0:
            bar.set_postfix(loss=f"{float(loss.detach()):.3f}", **{k: f"{v:.3f}" for k, v in info.items()})
    model.eval()
    return losses


def _distill(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(teacher || student) on temperature-softened distributions, scaled by T^2."""
    t = temperature
    return F.kl_div(
        F.log_softmax(student_logits / t, dim=-1),
        F.log_softmax(teacher_logits / t, dim=-1),
        log_target=True,
        reduction="batchmean",
    ) * (t * t)


def train_dense(model: nn.Module, train: Split, cfg: TrainConfig, *, seed: int, progress: bool = True) -> list[float]:
    """Stage 1: dense training with all gates off (no gate code in the forward pass)."""

    def loss_fn(m, ids, mask, labels, _rng):
        return F.cross_entropy(m(ids, mask), labels), {}

    return run_steps(model, train, cfg.dense_steps, loss_fn, cfg, seed=seed, lr=cfg.lr, desc="dense", progress=progress)


def budgeted_loss(
    model: nn.Module,
    head_costs: torch.Tensor,
    cfg: TrainConfig,
    teacher: nn.Module | None,
) -> LossFn:
    """The budgeted objective at one budget sampled per step (see :class:`TrainConfig`)."""

    def loss_fn(m, ids, mask, labels, rng):
        budget = rng.uniform(cfg.budget_min, cfg.budget_max)
        gates = m.gates(budget)
        logits = m(ids, mask, gates=gates)
        cost = estimated_cost(gates, head_costs)
        loss = F.cross_entropy(logits, labels)
        loss = loss + cfg.overshoot_weight * F.relu(cost - budget + cfg.overshoot_margin)
        loss = loss + cfg.gate_mass_weight * cost
        # g(1 - g) is 0 for decided gates and 0.25 for g = 0.5: it pushes gates towards 0/1 so
        # that the soft cost is carried by few heads, which makes the hard ranking meaningful.
        loss = loss + cfg.polarization_weight * (gates * (1 - gates)).mean()
        if teacher is not None and cfg.distill_weight > 0:
            with torch.no_grad():
                teacher_logits = teacher(ids, mask)
            loss = loss + cfg.distill_weight * _distill(logits, teacher_logits, cfg.distill_temperature)
        return loss, {"b": budget, "C": float(cost.detach())}

    return loss_fn


def train_budgeted(
    model: nn.Module,
    train: Split,
    cfg: TrainConfig,
    head_costs: torch.Tensor,
    *,
    seed: int,
    teacher: nn.Module | None = None,
    steps: int | None = None,
    desc: str = "budgeted",
    progress: bool = True,
) -> list[float]:
    """Stage 2: budgeted training with soft gates (``teacher``: the frozen dense model, optional)."""
    if teacher is not None:
        teacher = copy.deepcopy(teacher).eval()
        for param in teacher.parameters():
            param.requires_grad_(False)
    loss_fn = budgeted_loss(model, head_costs, cfg, teacher)
    n_steps = cfg.budgeted_steps if steps is None else steps
    return run_steps(model, train, n_steps, loss_fn, cfg, seed=seed, lr=cfg.lr, desc=desc, progress=progress)


def train_hard(
    model: nn.Module,
    train: Split,
    cfg: TrainConfig,
    ranking: HeadRanking,
    *,
    seed: int,
    progress: bool = True,
) -> list[float]:
    """Stage 3: hard-gate adaptation with a straight-through estimator and soft-model distillation.

    The forward pass uses ``mask + g - g.detach()``: exactly the hard 0/1 mask of the budget's
    kept heads, while gradients reach the soft gates. ``ranking`` is fixed for the whole stage
    (the weights adapt to one nested order, which is then stored with the checkpoint).
    """
    teacher = copy.deepcopy(model).eval()
    for param in teacher.parameters():
        param.requires_grad_(False)

    def loss_fn(m, ids, mask, labels, rng):
        budget = rng.uniform(cfg.budget_min, cfg.budget_max)
        soft = m.gates(budget)
        hard = ranking.mask(budget).to(soft.dtype)
        gates = hard + soft - soft.detach()
        logits = m(ids, mask, gates=gates)
        loss = F.cross_entropy(logits, labels)
        if cfg.distill_weight > 0:
            with torch.no_grad():
                teacher_logits = teacher(ids, mask, gates=teacher.gates(budget))
            loss = loss + cfg.distill_weight * _distill(logits, teacher_logits, cfg.distill_temperature)
        return loss, {"b": budget}

    return run_steps(model, train, cfg.hard_steps, loss_fn, cfg, seed=seed, lr=cfg.hard_lr, desc="hard", progress=progress)


def train_masked(
    model: nn.Module,
    train: Split,
    cfg: TrainConfig,
    mask: torch.Tensor,
    *,
    steps: int,
    seed: int,
    desc: str = "recover",
    progress: bool = True,
) -> list[float]:
    """Fine-tune with a fixed hard head mask (the recovery epoch of the post-hoc baseline).

    Gates receive no gradient (the mask is a constant), so only the remaining weights adapt.
    """
    fixed = mask.detach().clone()

    def loss_fn(m, ids, attn, labels, _rng):
        return F.cross_entropy(m(ids, attn, gates=fixed), labels), {}

    return run_steps(model, train, steps, loss_fn, cfg, seed=seed, lr=cfg.hard_lr, desc=desc, progress=progress)
