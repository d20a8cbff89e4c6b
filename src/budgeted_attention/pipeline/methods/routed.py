"""Per-input head routing: ``budgetformer`` (a learned router that picks its own budget) and
``capped-routing`` (ours: a router capped at each budget, calibrated on validation), each
trained from the dense model for the budgeted-hard path's steps, distilling from it, and timed
together by the unit ``bench-routed`` (``routed.json``/``.md``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from budgeted_attention.benchmark.per_input import bench_per_input
from budgeted_attention.model.family import GatedModel
from budgeted_attention.pipeline.context import RunContext
from budgeted_attention.pipeline.methods.base import Method, dense_unit, warm_start
from budgeted_attention.pipeline.outputs import Collected, attach_speed
from budgeted_attention.pipeline.units import Unit, UnitId
from budgeted_attention.reporting.rows import ResultRow
from budgeted_attention.training.routed import calibrate_router, choose_spread, difficulty_profile, routing_summary, train_routed

# Routing method -> router mode (``router:`` config; the method sets the mode).
ROUTED_METHODS = {"budgetformer": "learned", "capped-routing": "capped"}


class Routed(Method):
    names = tuple(ROUTED_METHODS)

    def units(self, cfg, seed: int) -> list[Unit]:
        routed = [Unit(UnitId(method, seed), self.train, self.collect) for method in ROUTED_METHODS if method in cfg.methods]
        return [*routed, Unit(UnitId("bench-routed", seed), self.bench, self.collect_bench, timing=True)]

    @staticmethod
    def _budgets(ctx: RunContext, mode: str, below_one: bool = False) -> list[float | None]:
        """The budgets a router of ``mode`` is evaluated at (None: the learned router's own)."""
        return [None] if mode == "learned" else [b for b in ctx.cfg.budgets if b < 1.0 or not below_one]

    def train(self, ctx: RunContext, unit: UnitId) -> dict[str, Any]:
        """Rows: test metrics, realised mean cost and heads at each budget; a capped router is
        calibrated on validation."""
        method, seed, mode = unit.kind, unit.seed, ROUTED_METHODS[unit.kind]
        dense, model, dense_steps = warm_start(ctx, seed)
        model.attach_router(dataclasses.replace(ctx.cfg.router, mode=mode))
        log = train_routed(
            model, ctx.splits.train, ctx.cfg.train, seed=seed, steps=ctx.cfg.path_steps, teacher=dense, desc=method, progress=ctx.progress, task=ctx.task,
        )
        steps = dense_steps + log.steps
        budgets = self._budgets(ctx, mode)
        fixed = [b for b in budgets if b is not None]
        calibration = calibrate_router(model, ctx.splits.val, fixed, batch_size=ctx.eval_batch) if mode == "capped" else {}
        spread = {}
        if model.router.by_difficulty:  # how unequal the allocation is, chosen per budget on validation
            spread = choose_spread(model, ctx.splits.val, fixed, task=ctx.task, batch_size=ctx.eval_batch)
            calibration = {b: model.router.calibration[b] for b in calibration}
        ctx.save(unit, model, steps)
        cost = model.cost_model(ctx.bench_seq)
        rows, profiles, as_trained = [], {}, {}
        for b in budgets:
            with ctx.splits.final_evaluation() as test:  # realised cost on test: measured, no choice
                summary = routing_summary(model, test, cost, budget=b, batch_size=ctx.eval_batch, task=None)
                profiles["learned" if b is None else str(b)] = difficulty_profile(summary.heads, dense, test, ctx.cfg.data.source, ctx.eval_batch)
                if b is not None and b in spread and spread[b]["scale"] != 1.0:
                    as_trained[str(b)] = self._heads_as_trained(ctx, model, dense, test, cost, b, float(spread[b]["offsets"]["1.0"]))
            rows.append(ResultRow(
                method=method, budget=1.0 if b is None else b, seed=seed, **ctx.metrics(model, budget=b),
                cost=summary.cost, cost_kind="routed", steps=steps, mean_heads=summary.mean_heads,
                ideal_speedup=summary.ideal_speedup, flops_fraction=summary.flops_fraction,
                variant="learned budget" if b is None else None,
            ))
        return {
            "rows": rows, "calibration": {str(b): d for b, d in calibration.items()}, "spread": {str(b): c for b, c in spread.items()},
            "difficulty": profiles, "difficulty_as_trained": as_trained, "loss_curve": log.loss_curve(),
        }

    @staticmethod
    def _heads_as_trained(ctx: RunContext, model: GatedModel, dense: GatedModel, split: Any, cost: Any, budget: float, offset: float) -> dict[str, Any]:
        """How the heads track difficulty at spread 1 (as trained) where validation chose another
        spread: shown beside the chosen allocation, never used for a result row."""
        router = model.router
        chosen = router.spread_scale[budget], router.calibration[budget]
        router.spread_scale[budget], router.calibration[budget] = 1.0, offset
        try:
            summary = routing_summary(model, split, cost, budget=budget, batch_size=ctx.eval_batch, task=None)
            profile = difficulty_profile(summary.heads, dense, split, ctx.cfg.data.source, ctx.eval_batch)
        finally:
            router.spread_scale[budget], router.calibration[budget] = chosen
        return {**profile, "cost": summary.cost}

    def bench(self, ctx: RunContext, unit: UnitId) -> dict[str, Any]:
        """The routed models timed on validation inputs against the dense model's lean executor, at
        every benchmark batch size (validation: timing inputs are not a choice, and the test split
        stays sealed); budgets below 1."""
        dense, _ = ctx.load(dense_unit(unit.seed))
        reference = dense.eval().inference_module()
        rows = []
        for method, mode in ROUTED_METHODS.items():
            if method not in ctx.cfg.methods:
                continue
            model, _ = ctx.load(UnitId(method, unit.seed))
            for batch_size in ctx.cfg.bench.batch_sizes:
                inputs = max(32, 4 * batch_size)
                batches = [(ids, mask) for ids, mask, _ in ctx.splits.val.batches(batch_size)][: max(1, inputs // batch_size)]
                rows += bench_per_input(model, reference, batches, self._budgets(ctx, mode, below_one=True), ctx.cfg.bench, method=method)
        return {"bench": {"rows": rows}}

    @staticmethod
    def collect(ctx: RunContext, collected: Collected, unit: UnitId, record: dict[str, Any]) -> None:
        collected.add_rows(unit, record)
        collected.routed_records.setdefault(unit.kind, {})[unit.seed] = record

    @staticmethod
    def collect_bench(ctx: RunContext, collected: Collected, unit: UnitId, record: dict[str, Any]) -> None:
        """Measured speed at the first benchmark batch size onto the seed's routed rows."""
        collected.routed_benches[unit.seed] = record["bench"]
        first_batch = ctx.cfg.bench.batch_sizes[0]
        timed = {(r["method"], r["budget"]): r for r in record["bench"]["rows"] if r["batch_size"] == first_batch}
        for method in ROUTED_METHODS:
            for row in collected.unit_rows.get(UnitId(method, unit.seed), []):
                entry = timed.get((row["method"], row["budget"]))
                if entry is not None:  # the FLOP-ideal of the timed (validation) inputs goes with their measured speed
                    attach_speed([row], entry)
