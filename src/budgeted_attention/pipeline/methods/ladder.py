"""``ladder``: what a user would pick instead of one budgeted checkpoint: separately trained
dense models of the shapes in the config's ``ladder`` (smaller width/depth), each trained from
scratch for the same total steps as the budgeted-hard path (at most: early-stopped on validation,
as the dense warm start is, when ``train.early_stopping_patience`` > 0), saved as
``ladder-<index>`` and timed by the unit ``bench-ladder-<index>`` against the same dense reference.
Neither side of the comparison gets a checkpoint chosen on validation that the other lacks."""

from __future__ import annotations

from typing import Any

from budgeted_attention.benchmark.runner import bench_against_reference
from budgeted_attention.errors import ConfigError
from budgeted_attention.model.family import GatedModel
from budgeted_attention.model.registry import families_with
from budgeted_attention.pipeline.context import RunContext
from budgeted_attention.pipeline.methods.base import Method, bench_config, bench_kwargs, dense_unit, saved_or_timed
from budgeted_attention.pipeline.outputs import Collected, attach_speed
from budgeted_attention.pipeline.units import Unit, UnitId
from budgeted_attention.reporting.rows import ResultRow
from budgeted_attention.training.stages import train_dense

# Model keys a ladder entry may change (``name`` labels its rows: ``ladder (name)`` in tables).
LADDER_KEYS = ("d_model", "n_layers", "n_heads", "head_dim", "d_ff", "qk_norm", "residual_gate", "name")


def _shape(entry: dict[str, Any]) -> dict[str, Any]:
    """The model keys of a ladder entry (without its ``name``)."""
    return {k: v for k, v in entry.items() if k != "name"}


def _fraction(ctx: RunContext, big: GatedModel, model: GatedModel) -> float:
    """The ladder model's forward FLOPs over the full model's, at the bench sequence length."""
    return model.cost_model(ctx.bench_seq).total_flops() / big.cost_model(ctx.bench_seq).total_flops()


class Ladder(Method):
    names = ("ladder",)

    def check(self, cfg) -> None:
        if not cfg.ladder:
            families = " or ".join(f"'{name}'" for name in families_with("depth"))
            raise ConfigError(f"method 'ladder' needs model_family {families} and a non-empty 'ladder' list of model shapes")
        for index, shape in enumerate(cfg.ladder):
            unknown = sorted(set(shape) - set(LADDER_KEYS))
            if unknown:
                raise ConfigError(f"unknown key 'ladder[{index}].{unknown[0]}' (known: {', '.join(LADDER_KEYS)})")
            if "name" in shape and (not isinstance(shape["name"], str) or not shape["name"]):
                raise ConfigError(f"ladder[{index}].name must be a non-empty string, got {shape['name']!r}")
            try:
                cfg.model.unpruned(**{"head_dim": 0, **_shape(shape)}, ffn_group_size=0)
            except ConfigError as exc:
                raise ConfigError(f"ladder[{index}]: {exc}") from None

    def units(self, cfg, seed: int) -> list[Unit]:
        return [
            unit for index in range(len(cfg.ladder)) for unit in (
                Unit(UnitId("ladder", seed, index=index), self.train, self.collect),
                Unit(UnitId("bench-ladder", seed, index=index), self.bench, self.collect_bench, timing=True, seeded=False),
            )
        ]

    def train(self, ctx: RunContext, unit: UnitId) -> dict[str, Any]:
        big, _ = ctx.load(dense_unit(unit.seed))
        entry = ctx.cfg.ladder[unit.index]
        config = big.config.unpruned(**{"head_dim": 0, **_shape(entry)}, ffn_group_size=0)
        model = type(big)(config)
        log = train_dense(
            model, ctx.splits.train, ctx.cfg.train, seed=unit.seed, progress=ctx.progress, val=ctx.splits.val,
            steps=ctx.steps_of(dense_unit(unit.seed)) + ctx.cfg.path_steps, desc=f"ladder {unit.index}", task=ctx.task,
        )
        ctx.save(unit, model, log.steps)
        fraction = _fraction(ctx, big, model)
        row = ResultRow(
            method="ladder", budget=round(min(1.0, fraction), 3), seed=unit.seed, **ctx.metrics(model),
            cost=fraction, cost_kind="smaller-dense", steps=log.steps, heads_kept=sum(config.heads_per_layer),
            heads_per_layer=config.heads_per_layer, ideal_speedup=1.0 / fraction, flops_fraction=fraction,
            ffn_per_layer=[config.d_ff] * config.n_layers, scope="all",  # its cost is whole-model FLOPs
        )
        # Its name, else the shape it changes: the rows of different ladder models stay apart and say what they are.
        row.variant = entry.get("name") or ", ".join(f"{key} {value}" for key, value in _shape(entry).items())
        return {"rows": [row], "shape": entry, "loss_curve": log.loss_curve(), "steps_run": log.steps_run, "val_history": log.val_history}

    def bench(self, ctx: RunContext, unit: UnitId) -> dict[str, Any]:
        """Ladder model ``index`` timed against the full dense model, both lean executors: a unit of its
        own, so the timing can be redone on a quiet machine (delete its record) without retraining."""
        trained = UnitId("ladder", unit.seed, index=unit.index)
        old = saved_or_timed(ctx, trained)
        if old is not None:
            return {"rows": [], "bench": old["bench"], "ideal_speedup": old["rows"][0]["ideal_speedup"]}
        big, _ = ctx.load(dense_unit(unit.seed))
        model, _ = ctx.load(trained)
        timed = bench_against_reference(big, {"ladder": model}, bench_config(ctx, [], include_sliced=False), **bench_kwargs(ctx))
        return {"rows": [], "bench": timed, "ideal_speedup": 1.0 / _fraction(ctx, big, model)}

    @staticmethod
    def collect(ctx: RunContext, collected: Collected, unit: UnitId, record: dict[str, Any]) -> None:
        collected.add_rows(unit, record)
        if record.get("loss_curve"):
            collected.curves[f"ladder {record['shape'].get('name', unit.index)}, seed {unit.seed}"] = record["loss_curve"]

    @staticmethod
    def collect_bench(ctx: RunContext, collected: Collected, unit: UnitId, record: dict[str, Any]) -> None:
        timed = {**record["bench"][0], "ideal_speedup": record["ideal_speedup"]}
        attach_speed(collected.unit_rows.get(UnitId("ladder", unit.seed, index=unit.index), []), timed)
