"""A run's outputs from its finished units: results.{json,csv,md}, summary.json, the figures,
the benchmark files of the timed methods and routed.{json,md}."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from budgeted_attention.io import write_json_atomic, write_text_atomic
from budgeted_attention.model.registry import get_family
from budgeted_attention.pipeline.context import RunContext
from budgeted_attention.pipeline.units import UnitId
from budgeted_attention.reporting.bench_table import bench_table
from budgeted_attention.reporting.per_input import routed_markdown
from budgeted_attention.reporting.plots import (
    plot_accuracy_vs_budget, plot_accuracy_vs_cost, plot_accuracy_vs_speedup, plot_speedups, plot_training_curves,
)
from budgeted_attention.reporting.results import write_results
from budgeted_attention.reporting.rows import ResultRow
from budgeted_attention.reporting.summary import headline, headline_markdown

# Files of the run directory that :class:`~budgeted_attention.rundir.RunDir` does not name.
FIGURES = ("accuracy_vs_budget.png", "accuracy_vs_cost.png", "accuracy_vs_speedup.png")
TRAINING_CURVES = "training_curves.png"


def attach_speed(rows: list[dict[str, Any]], bench_row: dict[str, Any]) -> None:
    """One benchmark row's measured speed onto result rows (dicts, updated in place)."""
    for row in rows:
        result = ResultRow(**{k: v for k, v in row.items() if k in ResultRow.__dataclass_fields__})
        result.attach_speed(bench_row)
        row.update(result.to_dict())


@dataclass
class Collected:
    """What the finished units contribute to the outputs, gathered in plan order.

    Attributes:
        rows: every unit's result rows (dicts; measured speed is attached to them in place).
        unit_rows: the same rows by the unit that made them (where a timing unit attaches its speed).
        curves: training-loss curves by legend label (``training_curves.png``).
        benches: per timed method, its timing record per seed; ``bench_stems`` the stem of its
            files (``bench.json``/``.md``, ``speedup.png``, of the first seed).
        routed_benches / routed_records: the per-input routing timings per seed and the routed
            methods' records per seed (``routed.json``/``.md``).
    """

    rows: list[dict[str, Any]] = field(default_factory=list)
    unit_rows: dict[UnitId, list[dict[str, Any]]] = field(default_factory=dict)
    curves: dict[str, list[list[float]]] = field(default_factory=dict)
    benches: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    bench_stems: dict[str, str] = field(default_factory=dict)
    routed_benches: dict[int, dict[str, Any]] = field(default_factory=dict)
    routed_records: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)

    def add_rows(self, unit: UnitId, record: dict[str, Any]) -> None:
        self.unit_rows[unit] = record.get("rows", [])
        self.rows += self.unit_rows[unit]


def _write_routed(ctx: RunContext, collected: Collected) -> None:
    """``routed.md`` / ``routed.json``: per-input routing speed, calibration and heads by difficulty."""
    records = collected.routed_records
    if not collected.routed_benches and not records:
        return
    data = {"bench": {str(seed): bench for seed, bench in collected.routed_benches.items()}}
    for key in ("difficulty", "calibration", "spread", "difficulty_as_trained"):
        data[key] = {m: {str(seed): r.get(key, {}) for seed, r in by_seed.items()} for m, by_seed in records.items()}
    write_json_atomic(ctx.run.routed_json, data)
    write_text_atomic(ctx.run.routed_md, f"# Per-input head routing: {ctx.cfg.name}\n\n" + routed_markdown(data))


def write_outputs(ctx: RunContext, collected: Collected, seconds: float, partial: str | None) -> dict[str, Any]:
    """Write the outputs of the rows of the run's methods; returns ``rows``, the Markdown
    ``table`` and the ``bench`` records per timed method and seed. ``partial``: the sentence
    saying which units are missing (a ``--finished-only`` run), else None."""
    cfg, run, setting, lm = ctx.cfg, ctx.run, ctx.cfg.bench, ctx.cfg.task == "lm"
    rows = [r for r in collected.rows if r["method"] in cfg.methods]
    # A pretrained decoder reads its own tokenizer; lm_data.tokenizer only names the one trained from scratch.
    tokens = "the model's own" if get_family(cfg.model_family).supports("pretrained") else cfg.lm_data.tokenizer
    source = f"'{cfg.lm_data.source}' ({tokens} tokens, blocks of {cfg.lm_data.seq_len})" if lm else f"'{cfg.data.source}'"
    metric = (
        "Loss: next-token cross-entropy in nats per token on the test documents (perplexity = exp(loss)), choices made on validation."
        if lm else "Accuracy: test split at choices made on validation."
    )
    weighted = (
        f" Costs of the budgeted methods weigh each head {cfg.head_cost_weight:g} times its FLOPs against the FFN groups "
        "(head_cost_weight): a fraction of that weighted cost, not of FLOPs; ladder rows stay FLOP fractions."
        if cfg.head_cost_weight != 1 else ""
    )
    notes = (
        f"Experiment '{cfg.name}' on data source {source}, {len(cfg.seeds)} seed(s), mean ± std. "
        f"{metric} Cost kinds: soft-estimate (C(b) of soft gates, no speed), "
        f"kept-heads (physically pruned; with budget_scope 'all' the kept heads and FFN groups). Budget scope: '{cfg.budget_scope}'.{weighted} Speedups: pruned models over the dense model at b = 1, both through the family's lean executor, "
        f"batch {setting.batch_sizes[0]}, sequence {ctx.bench_seq}, {setting.threads} thread(s); FLOP-ideal from the cost model.\n"
        f"Wall time of this invocation: {seconds:.0f} s.\n"
    )
    if cfg.notes:
        notes = cfg.notes.strip() + "\n\n" + notes
    if partial:
        notes = f"**{partial}**\n\n" + notes
    # The headline picks operating points by validation accuracy: classification runs only
    # (a language model's sweep is its table of losses).
    summary = headline(rows) if cfg.task == "classify" else {"task": cfg.task, "per_seed": []}
    write_json_atomic(run.summary, summary)
    if summary.get("per_seed"):
        notes += "\n## Headline figures (soft budgeted model, per seed; budgets chosen on validation)\n\n" + headline_markdown(summary)
    table = write_results(run.path, rows, title=f"baa experiment: {cfg.name}", notes=notes, partial=partial)
    for plot, name in zip((plot_accuracy_vs_budget, plot_accuracy_vs_cost, plot_accuracy_vs_speedup), FIGURES, strict=True):
        plot(rows, run.path / name, cfg.name)
    if collected.curves:
        ylabel = "training loss (nats/token)" if lm else "training loss"
        plot_training_curves(collected.curves, run.path / TRAINING_CURVES, f"{cfg.name}: training from initialisation", ylabel)
    _write_routed(ctx, collected)
    for method, by_seed in collected.benches.items():
        first, stem = by_seed[min(by_seed)], collected.bench_stems[method]
        write_json_atomic(run.path / f"{stem}.json", first)
        write_text_atomic(run.path / f"{stem}.md", f"# baa bench (seed {min(by_seed)}, {method})\n\n" + bench_table(first))
        plot_speedups(first["rows"], run.path / ("speedup.png" if stem == "bench" else f"speedup-{stem}.png"))
    ctx.log(table)
    ctx.log(notes)
    ctx.log(f"run directory: {run.path}")
    return {"rows": rows, "table": table, "bench": collected.benches}
