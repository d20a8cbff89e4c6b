"""The interface of a method plugin and what several methods share: their result rows, the
training config of a variant, the early-stopping record and the benchmark settings."""

from __future__ import annotations

import copy
import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from budgeted_attention.benchmark.config import BenchConfig
from budgeted_attention.errors import CheckpointError
from budgeted_attention.model.cost import estimated_cost
from budgeted_attention.model.family import GatedModel
from budgeted_attention.pipeline.context import RunContext
from budgeted_attention.pipeline.units import Unit, UnitId
from budgeted_attention.pruning.selection import KeptUnits
from budgeted_attention.reporting.rows import ResultRow
from budgeted_attention.training.config import TrainConfig
from budgeted_attention.training.stages import StageLog

if TYPE_CHECKING:
    from budgeted_attention.pipeline.config import ExperimentConfig


class Method:
    """A method of the pipeline, registered in :mod:`budgeted_attention.pipeline.methods`.

    Attributes:
        names: the ``methods`` values of the config it runs for, which are also the ``method``
            of the result rows it makes (rows of a name the config does not list are dropped).
        requires: the methods whose units must have run before its own (it loads their models):
            they are planned whenever this one is, and are registered before it.
    """

    names: tuple[str, ...]
    requires: tuple[str, ...] = ("dense",)

    def check(self, cfg: ExperimentConfig) -> None:
        """Refuse a config this method cannot run (called when the config lists one of :attr:`names`)."""

    def units(self, cfg: ExperimentConfig, seed: int) -> list[Unit]:
        """This method's units of one seed, in execution order; by default one unit named after
        the method, done by its ``train(context, id)``."""
        return [Unit(UnitId(self.names[0], seed), self.train)]


def dense_unit(seed: int) -> UnitId:
    """The dense model of ``seed``: the checkpoint the other methods start from."""
    return UnitId("dense", seed)


def stopping(log: StageLog) -> dict[str, Any]:
    """A stage's early-stopping record for its unit (steps run, validation history), or nothing
    when the stage was not early-stopped."""
    return {"steps_run": log.steps_run, "val_history": log.val_history} if log.val_history else {}


def variant_train_config(cfg: ExperimentConfig, variant: str) -> TrainConfig:
    """The training config of the budgeted path (``""``) or of its ``-sandwich`` variant."""
    if variant == "-sandwich":
        return dataclasses.replace(cfg.train, budget_sampling="sandwich")
    return cfg.train


def dense_row(ctx: RunContext, method: str, model: GatedModel, seed: int, steps: int) -> ResultRow:
    return ResultRow(method=method, budget=1.0, seed=seed, **ctx.metrics(model), cost=1.0, cost_kind="dense",
                     steps=steps, heads_kept=model.n_layers * model.n_heads, heads_per_layer=model.heads_per_layer)


def soft_rows(ctx: RunContext, method: str, model: GatedModel, seed: int, steps: int, budgets: list[float]) -> list[ResultRow]:
    """Rows of the soft gates at each budget (cost: the soft estimate C(b), never timed); none when
    the config does not list ``method`` (a unit another method requires: its rows would be dropped,
    and an evaluation of a large-vocabulary LM takes minutes)."""
    if method not in ctx.cfg.methods:
        return []
    costs = ctx.unit_costs(model)
    rows = []
    with torch.no_grad():
        for b in budgets:
            gates = model.unit_gates(b)
            rows.append(ResultRow(
                method=method, budget=b, seed=seed, **ctx.metrics(model, budget=b),
                cost=float(estimated_cost(gates, costs)), cost_kind="soft-estimate", steps=steps,
                layer_gates=[round(float(g), 4) for g in gates.heads.mean(dim=1)],
                gates=[[round(float(v), 4) for v in layer] for layer in gates.heads],
                ffn_layer_gates=None if gates.ffn is None else [round(float(g), 4) for g in gates.ffn.mean(dim=1)],
                scope=ctx.cfg.budget_scope,
            ))
    return rows


def hard_rows(ctx: RunContext, method: str, model: GatedModel, seed: int, steps: int, kept_by_budget: dict[float, KeptUnits]) -> list[ResultRow]:
    """Rows of hard masks (= the pruned models): cost is the kept units' share of the budgeted FLOPs."""
    costs = ctx.unit_costs(model)
    cost = model.cost_model(ctx.bench_seq)
    rows = []
    for b, kept in kept_by_budget.items():
        masks = kept.masks(model.n_heads, model.n_groups)
        heads = kept.heads_per_layer
        widths = None if kept.groups is None else [len(g) * model.group_size for g in kept.groups]
        rows.append(ResultRow(
            method=method, budget=b, seed=seed, **ctx.metrics(model, gates=masks),
            cost=float(estimated_cost(masks, costs)), cost_kind="kept-heads", steps=steps,
            heads_kept=sum(heads), heads_per_layer=heads, ideal_speedup=cost.ideal_speedup(heads, widths),
            scope=ctx.cfg.budget_scope, ffn_per_layer=widths,
            flops_fraction=cost.total_flops(heads, widths) / cost.total_flops(),
        ))
    return rows


def bench_config(ctx: RunContext, budgets: list[float], **changes: Any) -> BenchConfig:
    """The run's benchmark settings at ``budgets`` and the first benchmark sequence length."""
    return dataclasses.replace(ctx.cfg.bench, budgets=budgets, seq_lens=[ctx.bench_seq], **changes)


def bench_kwargs(ctx: RunContext) -> dict[str, Any]:
    """The inputs of a benchmark: the training split's lengths (``bench.lengths``), pad id, progress."""
    # Language-model blocks are all full length: their "real lengths" input is the random one.
    lengths = ctx.splits.train.lengths() if ctx.cfg.bench.lengths and ctx.cfg.task != "lm" else None
    return {"lengths": lengths, "pad_id": ctx.splits.pad_id, "progress": ctx.progress}


def saved_or_timed(ctx: RunContext, unit: UnitId) -> dict[str, Any] | None:
    """None when training unit ``unit`` saved its model (time it now); else the timing its
    record holds (a run made before timing was split from training, resumed)."""
    description_path = ctx.run.checkpoint_description(unit.seed, unit.name)
    if description_path.exists():
        return None
    record = ctx.read_unit(unit)
    if record.get("bench"):
        return record
    raise CheckpointError(f"'{description_path}' is missing and units/{unit}.json holds no timing; delete that record to retrain it")


def warm_start(ctx: RunContext, seed: int) -> tuple[GatedModel, GatedModel, int]:
    """(the dense model of ``seed``, a copy of it to train, the dense model's steps from initialisation)."""
    dense, steps = ctx.load(dense_unit(seed))
    return dense, copy.deepcopy(dense), steps
