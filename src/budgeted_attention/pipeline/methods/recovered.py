"""``posthoc-recovered``: post-hoc pruning of the dense model plus as many recovery steps as the
budgeted path adds (``train.recovery_steps`` when set); ``posthoc-recovered-1ep``: one recovery
epoch (the paper's variant). One unit per budget below 1."""

from __future__ import annotations

from typing import Any

from budgeted_attention.pipeline.context import RunContext
from budgeted_attention.pipeline.methods.base import Method, dense_unit, hard_rows
from budgeted_attention.pipeline.methods.posthoc import check_importance, posthoc_ranking
from budgeted_attention.pipeline.units import Unit, UnitId
from budgeted_attention.training.stages import train_masked


class Recovered(Method):
    """Recovery of the post-hoc pruned model at each budget below 1: ``method`` names which one."""

    def __init__(self, method: str) -> None:
        self.names = (method,)

    def check(self, cfg) -> None:
        check_importance(cfg)

    def units(self, cfg, seed: int) -> list[Unit]:
        return [Unit(UnitId(self.names[0], seed, budget=b), self.train) for b in cfg.budgets if b < 1.0]

    def train(self, ctx: RunContext, unit: UnitId) -> dict[str, Any]:
        method, budget = unit.kind, unit.budget
        model, description = ctx.load(dense_unit(unit.seed))
        ranking = posthoc_ranking(ctx, unit.seed)
        if method == "posthoc-recovered":
            steps = ctx.cfg.train.recovery_steps or ctx.cfg.path_steps
        else:
            steps = ctx.cfg.train.epoch_steps(len(ctx.splits.train))
        log = train_masked(
            model, ctx.splits.train, ctx.cfg.train, ranking.masks(budget), steps=steps, seed=unit.seed, desc=f"{method} b={budget}",
            progress=ctx.progress, task=ctx.task,
        )
        return {"rows": hard_rows(ctx, method, model, unit.seed, int(description["steps"]) + log.steps, {budget: ranking.kept(budget)})}
