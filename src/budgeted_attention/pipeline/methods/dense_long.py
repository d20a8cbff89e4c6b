"""``dense-long``: the dense model trained on for as many steps as the budgeted path adds
(budgeted + hard), the equal-steps control for any "beats dense" claim."""

from __future__ import annotations

from typing import Any

from budgeted_attention.pipeline.context import RunContext
from budgeted_attention.pipeline.methods.base import Method, dense_row, dense_unit, stopping
from budgeted_attention.pipeline.units import Unit, UnitId
from budgeted_attention.training.stages import train_dense


class DenseLong(Method):
    names = ("dense-long",)

    def units(self, cfg, seed: int) -> list[Unit]:
        return [Unit(UnitId("dense-long", seed), self.train)]

    def train(self, ctx: RunContext, unit: UnitId) -> dict[str, Any]:
        """The dense warm start trained on for the budgeted path's steps. With
        ``train.early_stop_budgeted`` (and a patience) it is early-stopped on validation as the
        warm start, the ladder and the budgeted stages are (those steps the maximum, best weights
        kept); without it, a fixed schedule as in the published runs."""
        model, description = ctx.load(dense_unit(unit.seed))
        val = ctx.splits.val if ctx.cfg.train.early_stop_budgeted else None
        log = train_dense(
            model, ctx.splits.train, ctx.cfg.train, seed=unit.seed, progress=ctx.progress, val=val, steps=ctx.cfg.path_steps,
            desc="dense-long", task=ctx.task,
        )
        return {"rows": [dense_row(ctx, "dense-long", model, unit.seed, int(description["steps"]) + log.steps)], **stopping(log)}
