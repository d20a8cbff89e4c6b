"""``static``: a specialist per budget: gates trained at that one budget from the dense model,
its own top-k units, the same hard adaptation, structurally pruned and timed (unit
``bench-static-b<b>``). ``static-soft``: the same specialist before hard adaptation (soft
estimate)."""

from __future__ import annotations

import dataclasses
from typing import Any

from budgeted_attention.benchmark.runner import bench_models
from budgeted_attention.errors import ConfigError
from budgeted_attention.pipeline.context import RunContext
from budgeted_attention.pipeline.methods.base import Method, bench_config, bench_kwargs, hard_rows, saved_or_timed, soft_rows, stopping, warm_start
from budgeted_attention.pipeline.outputs import Collected, attach_speed
from budgeted_attention.pipeline.units import Unit, UnitId
from budgeted_attention.training.stages import train_budgeted, train_hard


class Static(Method):
    names = ("static", "static-soft")

    def check(self, cfg) -> None:
        if not cfg.static_budgets:
            raise ConfigError("static_budgets must list at least one budget when a static method is run")

    def units(self, cfg, seed: int) -> list[Unit]:
        return [
            unit for b in cfg.static_budgets for unit in (
                Unit(UnitId("static", seed, budget=b), self.train),
                Unit(UnitId("bench-static", seed, budget=b), self.bench, self.collect_bench, timing=True, seeded=False),
            )
        ]

    def train(self, ctx: RunContext, unit: UnitId) -> dict[str, Any]:
        """Soft gates at b only, its own top-k, hard adaptation; saved as ``static-b<b>``."""
        seed, budget = unit.seed, unit.budget
        dense, model, dense_steps = warm_start(ctx, seed)
        # One budget only: the sandwich rule does not apply to a specialist.
        fixed = dataclasses.replace(ctx.cfg.train, budget_min=budget, budget_max=budget, full_budget_prob=0.0, budget_sampling="single")
        log = train_budgeted(
            model, ctx.splits.train, fixed, ctx.unit_costs(model), seed=seed, teacher=dense, desc=f"static b={budget}", progress=ctx.progress,
            task=ctx.task, val=ctx.splits.val, val_budgets=[budget], min_one_per_layer=ctx.cfg.min_one_per_layer,
        )
        soft_steps = dense_steps + log.steps
        rows = soft_rows(ctx, "static-soft", model, seed, soft_steps, [budget])
        ranking = ctx.rank(model, model.unit_gates(budget))
        hard_log = train_hard(
            model, ctx.splits.train, fixed, ranking, seed=seed, budgets=(budget, budget), desc=f"static-hard b={budget}", progress=ctx.progress,
            task=ctx.task, val=ctx.splits.val, val_budgets=[budget],
        )
        steps = soft_steps + hard_log.steps
        rows += hard_rows(ctx, "static", model, seed, steps, {budget: ranking.kept(budget)})
        ctx.save(unit, model, steps, ranking=ranking.to_dict())
        logs = (("soft", log), ("hard", hard_log))
        return {"rows": rows, **{f"{stage}_{key}": value for stage, stage_log in logs for key, value in stopping(stage_log).items()}}

    def bench(self, ctx: RunContext, unit: UnitId) -> dict[str, Any]:
        """The specialist pruned to its kept units, timed (a unit of its own, so the timing can be
        redone without retraining)."""
        trained = UnitId("static", unit.seed, budget=unit.budget)
        old = saved_or_timed(ctx, trained)
        if old is not None:
            return {"rows": [], "bench": old["bench"]}
        model, ranking = ctx.load_ranked(trained)
        kept = {unit.budget: ranking.kept(unit.budget)}
        return {"rows": [], "bench": bench_models(model, kept, bench_config(ctx, [unit.budget], include_sliced=False), **bench_kwargs(ctx))}

    @staticmethod
    def collect_bench(ctx: RunContext, collected: Collected, unit: UnitId, record: dict[str, Any]) -> None:
        timed = record["bench"]["rows"][0]
        trained = collected.unit_rows.get(UnitId("static", unit.seed, budget=unit.budget), [])
        attach_speed([r for r in trained if r["method"] == "static" and r["budget"] == timed["budget"]], timed)
