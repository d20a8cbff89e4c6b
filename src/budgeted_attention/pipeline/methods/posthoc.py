"""``posthoc``: zero-shot structural pruning of the dense model, units ranked on the validation
split (gradient of a unit mask, Michel et al. 2019; or leave-one-out, heads only), no retraining.
The ranking is kept beside the unit records (``posthoc-ranking.json``) for the recovered methods.

``posthoc-recovered``: post-hoc pruning of the dense model plus as many recovery steps as the
budgeted path adds (``train.recovery_steps`` when set); ``posthoc-recovered-1ep``: one recovery
epoch (the paper's variant). One unit per budget below 1."""

from __future__ import annotations

import json
from typing import Any

from budgeted_attention.errors import CheckpointError, ConfigError
from budgeted_attention.io import write_json_atomic
from budgeted_attention.model.family import GatedModel
from budgeted_attention.model.gates import UnitGates
from budgeted_attention.pipeline.context import RunContext
from budgeted_attention.pipeline.methods.base import Method, dense_unit, hard_rows
from budgeted_attention.pipeline.units import UNIT_DIGEST_KEY, Unit, UnitId
from budgeted_attention.pruning.importance import leave_one_out_importance, unit_gradient_importance
from budgeted_attention.pruning.selection import Ranking
from budgeted_attention.training import distributed
from budgeted_attention.training.stages import train_masked

RANKING = "posthoc-ranking.json"


def posthoc_ranking(ctx: RunContext, seed: int, dense: GatedModel | None = None) -> Ranking:
    """The dense model's units of ``seed`` ranked by importance on validation: computed once, then
    read back. ``dense``: that dense model when the caller holds it (else it is loaded)."""
    path = ctx.run.unit_dir(seed) / RANKING
    if path.exists():
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
            ranking = Ranking.from_dict(saved)
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError, IndexError) as exc:
            raise CheckpointError(f"post-hoc ranking '{path}' is malformed ({exc}); delete it to recompute") from exc
        ctx.check_unit_digest(path, saved)
        return ranking
    if dense is None:
        dense, _ = ctx.load(dense_unit(seed))
    dense.to(distributed.current().device)  # where the splits are (the training device)
    # Importance on the validation split (never test), as in Michel et al. (2019).
    batch = _importance_batch(ctx, dense)
    if ctx.cfg.posthoc_importance == "gradient":
        scores = unit_gradient_importance(dense, ctx.splits.val, batch_size=batch, task=ctx.task)
    else:
        scores = UnitGates(leave_one_out_importance(dense, ctx.splits.val, dense.n_layers, dense.n_heads, batch_size=2 * batch, task=ctx.task), None)
    ranking = ctx.rank(dense, scores)
    saved = {"heads": scores.heads.tolist(), **({"ffn": scores.ffn.tolist()} if scores.ffn is not None else {})}
    write_json_atomic(path, {**ranking.to_dict(), "scores": saved, "importance": ctx.cfg.posthoc_importance, UNIT_DIGEST_KEY: ctx.unit_digest})
    return ranking


# Logit elements (batch x seq x vocabulary) one importance batch may hold: 2^26 floats, 256 MiB.
_LOGIT_ELEMENTS = 1 << 26


def _importance_batch(ctx: RunContext, dense: GatedModel) -> int:
    """Examples per importance batch: 128, fewer for a language model whose logits would not fit
    (Gemma 3's 262,144-token vocabulary: 4 blocks of 64 tokens, where 128 would need 8.6 GB for the
    logits alone, and as much again for their gradient). The score sums |gradient| per batch, so
    the batch is part of the ranking: it stays 128 wherever that fits."""
    if ctx.task.kind != "lm":
        return 128
    return max(1, min(128, _LOGIT_ELEMENTS // (ctx.splits.seq_len * dense.vocab_size)))


class Posthoc(Method):
    names = ("posthoc",)

    def check(self, cfg) -> None:
        """Leave-one-out scores heads only: refused under ``budget_scope: all``."""
        if cfg.budget_scope == "all" and cfg.posthoc_importance != "gradient":
            raise ConfigError("posthoc_importance 'leave-one-out' scores heads only; use 'gradient' with budget_scope 'all'")

    def units(self, cfg, seed: int) -> list[Unit]:
        return [Unit(UnitId("posthoc", seed), self.evaluate)]

    def evaluate(self, ctx: RunContext, unit: UnitId) -> dict[str, Any]:
        dense, steps = ctx.load(dense_unit(unit.seed))
        ranking = posthoc_ranking(ctx, unit.seed)
        kept = {b: ranking.kept(b) for b in ctx.cfg.budgets}
        return {"rows": hard_rows(ctx, "posthoc", dense, unit.seed, steps, kept)}


class Recovered(Posthoc):
    """Recovery of the post-hoc pruned model at each budget below 1 (``method`` names which one),
    with the post-hoc method's check."""

    def __init__(self, method: str) -> None:
        self.names = (method,)

    def units(self, cfg, seed: int) -> list[Unit]:
        return [Unit(UnitId(self.names[0], seed, budget=b), self.train) for b in cfg.budgets if b < 1.0]

    def train(self, ctx: RunContext, unit: UnitId) -> dict[str, Any]:
        method, budget = unit.kind, unit.budget
        model, dense_steps = ctx.load(dense_unit(unit.seed))
        ranking = posthoc_ranking(ctx, unit.seed)
        if method == "posthoc-recovered":
            steps = ctx.cfg.train.recovery_steps or ctx.cfg.path_steps
        else:
            steps = ctx.cfg.train.epoch_steps(len(ctx.splits.train))
        log = train_masked(
            model, ctx.splits.train, ctx.cfg.train, ranking.masks(budget), steps=steps, seed=unit.seed, desc=f"{method} b={budget}",
            progress=ctx.progress, task=ctx.task,
        )
        return {"rows": hard_rows(ctx, method, model, unit.seed, dense_steps + log.steps, {budget: ranking.kept(budget)})}
