"""``dense``: full attention, the warm start of every other method (early-stopped on validation
accuracy when ``train.early_stopping_patience`` > 0). Under ``budget_scope: all`` its FFN neurons
are then sorted by importance on the training split (function-preserving), so every method
starts from the same sorted dense model.

``dense-long``: the dense model trained on for as many steps as the budgeted path adds (budgeted
+ hard), the equal-steps control for any "beats dense" claim.
"""

from __future__ import annotations

from typing import Any

from budgeted_attention.pipeline.context import RunContext
from budgeted_attention.pipeline.methods.base import Method, dense_row, dense_unit, stopping
from budgeted_attention.pipeline.outputs import Collected
from budgeted_attention.pipeline.units import Unit, UnitId
from budgeted_attention.pruning.importance import sort_ffn_by_importance
from budgeted_attention.training.stages import train_dense


class Dense(Method):
    names = ("dense",)
    requires = ()

    def units(self, cfg, seed: int) -> list[Unit]:
        return [Unit(dense_unit(seed), self.train, self.collect)]

    def train(self, ctx: RunContext, unit: UnitId) -> dict[str, Any]:
        model = ctx.builder.create()
        log = train_dense(model, ctx.splits.train, ctx.cfg.train, seed=unit.seed, progress=ctx.progress, val=ctx.splits.val, task=ctx.task)
        if model.has_ffn_units:
            # DynaBERT-style reordering on the TRAINING split: groups of consecutive neurons then
            # hold neurons of similar importance, and the first groups the most important ones.
            # ffn_sort_examples > 0: a seeded sample of the training split (the whole split is a full
            # forward and backward pass, minutes for a large-vocabulary decoder).
            sort_ffn_by_importance(
                model, ctx.splits.train, batch_size=ctx.cfg.train.batch_size, task=ctx.task,
                max_examples=ctx.cfg.ffn_sort_examples, seed=unit.seed,
            )
        ctx.save(unit, model, log.steps)
        return {
            "rows": [dense_row(ctx, "dense", model, unit.seed, log.steps)], "steps_run": log.steps_run, "val_history": log.val_history,
            "loss_curve": log.loss_curve(),
        }

    @staticmethod
    def collect(ctx: RunContext, collected: Collected, unit: UnitId, record: dict[str, Any]) -> None:
        collected.add_rows(unit, record)
        if record.get("loss_curve"):
            collected.curves[f"dense, seed {unit.seed}"] = record["loss_curve"]


class DenseLong(Method):
    names = ("dense-long",)

    def train(self, ctx: RunContext, unit: UnitId) -> dict[str, Any]:
        """The dense warm start trained on for the budgeted path's steps. With
        ``train.early_stop_budgeted`` (and a patience) it is early-stopped on validation as the
        warm start, the ladder and the budgeted stages are (those steps the maximum, best weights
        kept); without it, a fixed schedule as in the published runs."""
        model, steps = ctx.load(dense_unit(unit.seed))
        val = ctx.splits.val if ctx.cfg.train.early_stop_budgeted else None
        log = train_dense(
            model, ctx.splits.train, ctx.cfg.train, seed=unit.seed, progress=ctx.progress, val=val, steps=ctx.cfg.path_steps,
            desc="dense-long", task=ctx.task,
        )
        return {"rows": [dense_row(ctx, "dense-long", model, unit.seed, steps + log.steps)], **stopping(log)}
