"""What the work of a unit sees: the config, the run directory, the data and the model builder,
with the lookups every method shares (saved models, unit records, unit costs, metrics)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from budgeted_attention.checkpoint import load_model, load_ranking, read_description, save_model, verify_artifacts
from budgeted_attention.data.dataset import TensorSplits
from budgeted_attention.data.lm import make_lm_splits
from budgeted_attention.data.synthetic import make_synthetic_splits
from budgeted_attention.data.text import make_text_splits
from budgeted_attention.errors import CheckpointError, ConfigError
from budgeted_attention.model.family import GatedModel
from budgeted_attention.model.gates import UnitGates
from budgeted_attention.pipeline.units import UNIT_DIGEST_KEY, UnitId
from budgeted_attention.pruning.selection import Ranking
from budgeted_attention.rundir import RunDir
from budgeted_attention.tasks import CLASSIFY, TASKS, Task
from budgeted_attention.training.routing import routing_statistics

if TYPE_CHECKING:
    from budgeted_attention.pipeline.builders import EncoderBuilder, PretrainedBuilder
    from budgeted_attention.pipeline.config import ExperimentConfig


def make_splits(cfg: ExperimentConfig, run: RunDir, pretrained_tokenizer=None) -> TensorSplits:
    """The run's data; a tokenizer trained on it is saved as the run's ``tokenizer.json``."""
    if cfg.task == "lm":
        return make_lm_splits(cfg.lm_data, tokenizer_path=run.tokenizer, pretrained=pretrained_tokenizer)
    if cfg.data.source == "synthetic":
        return make_synthetic_splits(cfg.synthetic, cfg.data.split_seed)
    splits, _ = make_text_splits(cfg.data, tokenizer_path=run.tokenizer, pretrained_tokenizer=pretrained_tokenizer)
    return splits


def evaluate_model(model: GatedModel, splits: TensorSplits, batch: int, task: Task = CLASSIFY, **gating: Any) -> dict[str, float]:
    """Result-row metrics of a finished model; the only place the test split is read.

    Classification: ``accuracy`` (test) and ``val_accuracy``; language model: ``loss`` and
    ``perplexity`` (test) and ``val_loss`` (nats per token), and for an ungated Meta-Attention
    model its test-split ``routing`` statistics.
    """
    val = task.evaluate(model, splits.val, batch, **gating)
    routing = None
    with splits.final_evaluation() as test:
        metrics = task.evaluate(model, test, batch, **gating)
        if not gating and getattr(model, "meta_layers", lambda: [])():
            routing = routing_statistics(model, test, batch)
    if task.kind == "classify":
        return {"accuracy": metrics["accuracy"], "val_accuracy": val["accuracy"]}
    return {
        "accuracy": None, "val_accuracy": None, "loss": metrics["loss"], "perplexity": metrics["perplexity"], "val_loss": val["loss"],
        **({"routing": routing} if routing is not None else {}),
    }


@dataclass
class RunContext:
    """One run's shared state, built by the scheduler once the run directory is stamped;
    ``unit_digest`` is the config's digest without seeds, which every unit record carries."""

    cfg: ExperimentConfig
    run: RunDir
    splits: TensorSplits
    builder: EncoderBuilder | PretrainedBuilder
    progress: bool
    log: Callable[..., None]
    unit_digest: str

    @property
    def task(self) -> Task:
        """The objective and metrics of the config's ``task``."""
        return TASKS[self.cfg.task]

    @property
    def eval_batch(self) -> int:
        return self.cfg.train.eval_batch_size

    # ---------------------------------------------------------------- unit records

    def unit_path(self, unit: UnitId) -> Path:
        """``units/seed<N>/<name>.json``: the record of a finished unit."""
        return self.run.unit(unit.seed, unit.name)

    def checkpoint(self, unit: UnitId) -> Path:
        """``checkpoints/seed<N>/<name>``: the model a training unit saved."""
        return self.run.checkpoint(unit.seed, unit.name)

    def check_unit_digest(self, path: Path, record: dict[str, Any]) -> None:
        """Refuse a record made under another configuration (records of older code carry no
        digest and are accepted)."""
        recorded = record.get(UNIT_DIGEST_KEY)
        if recorded is not None and recorded != self.unit_digest:
            raise ConfigError(
                f"finished-unit record '{path}' was made with another configuration ({UNIT_DIGEST_KEY} {recorded}, "
                f"this run's {self.unit_digest}): delete it to rerun the unit, or use another --out"
            )

    def read_unit(self, unit: UnitId) -> dict[str, Any]:
        """A finished unit's record, checked (a clear error names a corrupt or malformed file, or
        one made with another configuration)."""
        path = self.unit_path(unit)
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"finished-unit record '{path}' is not valid JSON ({exc}); delete it to rerun the unit") from exc
        rows = record.get("rows", []) if isinstance(record, dict) else None
        if not isinstance(rows, list) or not all(isinstance(r, dict) and "method" in r and "budget" in r for r in rows):
            raise CheckpointError(f"finished-unit record '{path}' is malformed; delete it to rerun the unit")
        self.check_unit_digest(path, record)
        return record

    # ---------------------------------------------------------------- saved models

    def save(self, unit: UnitId, model: GatedModel, steps: int, **extra: Any) -> None:
        """Save ``model``, ``steps`` optimiser steps from initialisation, as training unit
        ``unit``'s checkpoint (its ``method``: the unit's kind and variant; ``extra``, e.g. its
        ``ranking``, goes into the description)."""
        method = unit.kind + unit.variant
        save_model(model, self.checkpoint(unit), artifacts_dir=self.run.path, method=method, seed=unit.seed, steps=steps, **extra)

    def load(self, unit: UnitId) -> tuple[GatedModel, int]:
        """The model training unit ``unit`` saved and its optimiser steps from initialisation."""
        model, description = self._load(unit)
        return model, int(description.get("steps", 0))

    def load_ranked(self, unit: UnitId) -> tuple[GatedModel, Ranking]:
        """The model training unit ``unit`` saved and the ranking saved with it."""
        model, description = self._load(unit)
        return model, load_ranking(self.checkpoint(unit), description, model)

    def _load(self, unit: UnitId) -> tuple[GatedModel, dict[str, Any]]:
        """The saved model and its description, refused when the run's tokenizer or labels are
        no longer the ones it was trained with (rebuilt differently on a resume)."""
        path = self.checkpoint(unit)
        model, description = load_model(path)
        verify_artifacts(path, description, self.run.path, model)
        return model, description

    def steps_of(self, unit: UnitId) -> int:
        """Optimiser steps from initialisation of the model ``unit`` saved."""
        return int(read_description(self.checkpoint(unit)).get("steps", 0))

    # ---------------------------------------------------------------- costs

    @property
    def bench_seq(self) -> int:
        """The first benchmark sequence length (the data's padded length when none is set)."""
        return (self.cfg.bench.seq_lens or [self.splits.seq_len])[0]

    def unit_costs(self, model: GatedModel) -> UnitGates:
        """Cost per gated unit (heads; heads and FFN groups under ``budget_scope: all``): its FLOPs
        at ``reference_seq_len`` (the data's padded length when 0), the sequence length at which
        budgets are converted to costs (training cost, ranking fit), with every head's FLOPs
        times ``head_cost_weight`` (1: the budget is a fraction of the prunable FLOPs; measured
        on a runtime, e.g. by ``benchmarks/unit_costs.py``: a fraction of its time)."""
        costs = model.unit_costs(self.cfg.reference_seq_len or self.splits.seq_len)
        if self.cfg.head_cost_weight == 1:
            return costs
        return UnitGates(costs.heads * self.cfg.head_cost_weight, costs.ffn)

    def rank(self, model: GatedModel, scores: UnitGates) -> Ranking:
        return Ranking.from_scores(scores, self.unit_costs(model), self.cfg.min_one_per_layer)

    def metrics(self, model: GatedModel, **gating: Any) -> dict[str, float]:
        """Validation and test metrics of a finished model under ``gating`` (row fields)."""
        return evaluate_model(model, self.splits, self.eval_batch, self.task, **gating)
