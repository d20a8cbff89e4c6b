"""``budgeted``: the one budgeted checkpoint, soft gates trained from the dense model and
evaluated at every budget (cost: soft estimate). ``budgeted-sandwich`` is the same stage trained
with the sandwich rule (full model, smallest budget and random budgets every step, distilled in
place), whatever ``train.budget_sampling`` says (``budgeted`` follows it)."""

from __future__ import annotations

import copy
from typing import Any

from budgeted_attention.checkpoint import save_model
from budgeted_attention.pipeline.context import RunContext
from budgeted_attention.pipeline.methods.base import Method, dense_unit, soft_rows, stopping, variant_train_config
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
        dense, description = ctx.load(dense_unit(unit.seed))
        model = copy.deepcopy(dense)
        train_cfg = variant_train_config(ctx.cfg, unit.variant)
        teacher = None if train_cfg.budget_sampling == "sandwich" else dense  # the sandwich distils in place
        log = train_budgeted(
            model, ctx.splits.train, train_cfg, ctx.unit_costs(model), seed=unit.seed, teacher=teacher, desc=unit.name,
            progress=ctx.progress, task=ctx.task, val=ctx.splits.val, val_budgets=ctx.cfg.budgets,
        )
        steps = int(description["steps"]) + log.steps
        save_model(model, ctx.checkpoint(unit), artifacts_dir=ctx.run.path, method=unit.name, seed=unit.seed, steps=steps)
        return {"rows": soft_rows(ctx, unit.name, model, unit.seed, steps, ctx.cfg.budgets), **stopping(log)}
