"""``budgeted-hard``: the budgeted checkpoint after hard-gate adaptation; its hard masks are the
pruned models, timed by the unit ``bench`` (``bench.json``). ``budgeted-hard-sandwich``: the same
from ``budgeted-sandwich``, trained with the sandwich rule, timed by ``bench-sandwich``."""

from __future__ import annotations

from typing import Any

from budgeted_attention.benchmark.runner import bench_ranking
from budgeted_attention.pipeline.context import RunContext
from budgeted_attention.pipeline.methods.base import Method, bench_config, bench_kwargs, hard_rows, stopping, variant_train_config
from budgeted_attention.pipeline.outputs import Collected, attach_speed
from budgeted_attention.pipeline.units import Unit, UnitId
from budgeted_attention.training.stages import train_hard


class BudgetedHard(Method):
    """The hard stage of the path (``variant`` ``""``) or of its ``-sandwich`` variant, and its timing."""

    def __init__(self, variant: str = "") -> None:
        self.variant = variant
        self.names = (f"budgeted-hard{variant}",)
        self.requires = (f"budgeted{variant}",)

    def units(self, cfg, seed: int) -> list[Unit]:
        return [
            Unit(UnitId("budgeted-hard", seed, variant=self.variant), self.train),
            Unit(UnitId("bench", seed, variant=self.variant), self.bench, self.collect_bench, timing=True),
        ]

    def train(self, ctx: RunContext, unit: UnitId) -> dict[str, Any]:
        model, budgeted_steps = ctx.load(UnitId("budgeted", unit.seed, variant=unit.variant))
        ranking = ctx.rank(model, model.unit_importance())
        kept = {b: ranking.kept(b) for b in ctx.cfg.budgets}
        before = {r.budget: r for r in hard_rows(ctx, "before", model, unit.seed, 0, kept)}
        log = train_hard(
            model, ctx.splits.train, variant_train_config(ctx.cfg, unit.variant), ranking, seed=unit.seed, desc=unit.name,
            progress=ctx.progress, task=ctx.task, val=ctx.splits.val, val_budgets=ctx.cfg.budgets,
        )
        steps = budgeted_steps + log.steps
        ctx.save(unit, model, steps, ranking=ranking.to_dict())
        rows = hard_rows(ctx, unit.name, model, unit.seed, steps, kept)
        for row in rows:
            row.accuracy_before_adaptation = before[row.budget].accuracy
            row.val_accuracy_before_adaptation = before[row.budget].val_accuracy
            row.loss_before_adaptation = before[row.budget].loss
        return {"rows": rows, **stopping(log)}

    def bench(self, ctx: RunContext, unit: UnitId) -> dict[str, Any]:
        """The hard checkpoint pruned at each benchmark budget (default: the budgets below 1), timed."""
        model, ranking = ctx.load_ranked(UnitId("budgeted-hard", unit.seed, variant=unit.variant))
        budgets = ctx.cfg.bench.budgets or [b for b in ctx.cfg.budgets if b < 1.0]
        return {"bench": bench_ranking(model, ranking, bench_config(ctx, budgets), **bench_kwargs(ctx))}

    def collect_bench(self, ctx: RunContext, collected: Collected, unit: UnitId, record: dict[str, Any]) -> None:
        """The timing of the first benchmark setting (of the run's scope) at each budget onto the seed's hard rows."""
        collected.benches.setdefault(self.names[0], {})[unit.seed] = record["bench"]
        collected.bench_stems[self.names[0]] = unit.name  # bench.json / bench-sandwich.json, of the first seed
        first: dict[float, dict[str, Any]] = {}
        for r in record["bench"]["rows"]:
            if r.get("scope", "heads") == ctx.cfg.budget_scope:
                first.setdefault(r["budget"], r)
        for row in collected.unit_rows.get(UnitId("budgeted-hard", unit.seed, variant=unit.variant), []):
            if row["budget"] in first:
                attach_speed([row], first[row["budget"]])
