"""``budgeted``: the one budgeted checkpoint, soft gates trained from the dense model and
evaluated at every budget (cost: soft estimate). ``budgeted-sandwich`` is the same stage trained
with the sandwich rule (full model, smallest budget and random budgets every step, distilled in
place), whatever ``train.budget_sampling`` says (``budgeted`` follows it).

With ``train.gate_init: importance`` the warm-started stages start from gates ordered as the
post-hoc ranking (computed once per seed on the validation split, shared with ``posthoc``).

``budgeted-scratch``: the budgeted stage from a random init for the same total steps (the
paper's ablation: one budget per step, whatever ``train.budget_sampling`` says; its gates start
at zero whatever ``train.gate_init`` says: a random model has no ranking to start from)."""

from __future__ import annotations

import dataclasses
from typing import Any

from budgeted_attention.pipeline.context import RunContext
from budgeted_attention.pipeline.methods.base import Method, dense_unit, soft_rows, stopping, variant_train_config, warm_start
from budgeted_attention.pipeline.methods.posthoc import posthoc_ranking
from budgeted_attention.pipeline.units import Unit, UnitId
from budgeted_attention.training.stages import train_budgeted


class Budgeted(Method):
    """The budgeted stage of the path (``variant`` ``""``) or of its ``-sandwich`` variant."""

    def __init__(self, variant: str = "") -> None:
        self.variant = variant
        self.names = (f"budgeted{variant}",)

    def units(self, cfg, seed: int) -> list[Unit]:
        return [Unit(UnitId("budgeted", seed, variant=self.variant), self.train)]

    def train(self, ctx: RunContext, unit: UnitId) -> dict[str, Any]:
        dense, model, dense_steps = warm_start(ctx, unit.seed)
        train_cfg = variant_train_config(ctx.cfg, unit.variant)
        if train_cfg.gate_init == "importance":  # the gates start ordered as the post-hoc ranking (validation split)
            model.centre_gates(posthoc_ranking(ctx, unit.seed, dense).admission_budgets())
        teacher = None if train_cfg.budget_sampling == "sandwich" else dense  # the sandwich distils in place
        log = train_budgeted(
            model, ctx.splits.train, train_cfg, ctx.unit_costs(model), seed=unit.seed, teacher=teacher, desc=unit.name,
            progress=ctx.progress, task=ctx.task, val=ctx.splits.val, val_budgets=ctx.cfg.budgets, min_one_per_layer=ctx.cfg.min_one_per_layer,
        )
        steps = dense_steps + log.steps
        ctx.save(unit, model, steps)
        return {"rows": soft_rows(ctx, unit.name, model, unit.seed, steps, ctx.cfg.budgets), **stopping(log)}


class Scratch(Method):
    names = ("budgeted-scratch",)

    def train(self, ctx: RunContext, unit: UnitId) -> dict[str, Any]:
        model = ctx.builder.create()
        # Same total steps as the warm-started path: the dense model's actual steps (it may have
        # stopped early) plus the budgeted stage.
        steps = ctx.cfg.train.scratch_steps or ctx.steps_of(dense_unit(unit.seed)) + ctx.cfg.train.budgeted_steps
        scratch_cfg = dataclasses.replace(ctx.cfg.train, budget_sampling="single")
        log = train_budgeted(
            model, ctx.splits.train, scratch_cfg, ctx.unit_costs(model), seed=unit.seed, steps=steps, desc="scratch", progress=ctx.progress,
            task=ctx.task, val=ctx.splits.val, val_budgets=ctx.cfg.budgets, min_one_per_layer=ctx.cfg.min_one_per_layer,
        )
        return {"rows": soft_rows(ctx, "budgeted-scratch", model, unit.seed, log.steps, ctx.cfg.budgets), **stopping(log)}
