"""``baa experiment CONFIG.yaml``: method x budget x seed on one data set, resumable.

Methods (the ``method`` values of ``results.json``):

* ``dense``: full attention (fine-tuned to convergence; the warm start of the others);
* ``budgeted``: the one budgeted checkpoint with soft gates, evaluated at every budget;
* ``budgeted-hard``: the same checkpoint after hard-gate adaptation, hard masks (= pruned model);
* ``static``: per-budget specialists, gates trained at one fixed budget from the dense model
  (soft gates, evaluated at that budget);
* ``posthoc``: zero-shot structural pruning of the dense model, heads ranked on the validation
  split (gradient of a head mask, Michel et al. 2019; or leave-one-out), no retraining;
* ``posthoc-recovered``: the same plus one recovery epoch per budget with the mask fixed.

Resumability: the work is cut into units (one per seed and method, and per budget for the
per-budget methods). Each finished unit leaves ``units/seed<N>/<unit>.json`` (written
atomically, after the unit's checkpoint); a rerun skips finished units, reloads the
checkpoints it needs, and ends with the same rows (every unit seeds its own RNGs).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from budgeted_attention.benchmark.config import BenchConfig
from budgeted_attention.budget import validate_budget
from budgeted_attention.config import apply_overrides, deep_merge, from_dict, load_yaml, to_dict
from budgeted_attention.data.dataset import TensorSplits
from budgeted_attention.data.synthetic import SyntheticConfig, make_synthetic_splits
from budgeted_attention.data.text import TextDataConfig, make_text_splits
from budgeted_attention.errors import ConfigError
from budgeted_attention.io import write_json_atomic, write_text_atomic
from budgeted_attention.model.config import ModelConfig
from budgeted_attention.pruning.importance import gradient_importance, leave_one_out_importance
from budgeted_attention.pruning.selection import HeadRanking
from budgeted_attention.recipes.common import attach_latency, sweep_hard, sweep_soft
from budgeted_attention.recipes.families import PretrainedConfig, make_family
from budgeted_attention.recipes.rundir import init_run_dir
from budgeted_attention.reporting.plots import plot_accuracy_vs_budget, plot_accuracy_vs_speedup
from budgeted_attention.reporting.results import write_results
from budgeted_attention.training.config import TrainConfig
from budgeted_attention.training.evaluate import evaluate_accuracy
from budgeted_attention.training.stages import seed_everything, train_budgeted, train_dense, train_hard, train_masked

ALL_METHODS = ["dense", "budgeted", "budgeted-hard", "static", "posthoc", "posthoc-recovered"]


@dataclass
class ExperimentConfig:
    """One experiment: data, model, training, methods, budgets, seeds, benchmark."""

    name: str = "experiment"
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    methods: list[str] = field(default_factory=lambda: list(ALL_METHODS))
    budgets: list[float] = field(default_factory=lambda: [0.25, 0.5, 0.75, 1.0])
    static_budgets: list[float] = field(default_factory=lambda: [0.25, 0.5, 0.75])
    posthoc_importance: str = "gradient"
    min_one_per_layer: bool = True
    model_family: str = "encoder"
    pretrained: PretrainedConfig = field(default_factory=PretrainedConfig)
    data: TextDataConfig = field(default_factory=TextDataConfig)
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    model: ModelConfig = field(default_factory=lambda: ModelConfig(d_model=128, n_layers=4, n_heads=4, d_ff=512, max_len=64, pooling="mean", dropout=0.1))
    train: TrainConfig = field(default_factory=TrainConfig)
    bench: BenchConfig = field(default_factory=lambda: BenchConfig(budgets=[], batch_sizes=[1], seq_lens=[], rounds=5, min_run_time=0.2))

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in ALL_METHODS]
        if unknown:
            raise ConfigError(f"unknown method {unknown[0]!r} (known: {', '.join(ALL_METHODS)})")
        if not self.seeds:
            raise ConfigError("seeds must list at least one seed")
        if self.posthoc_importance not in ("gradient", "leave-one-out"):
            raise ConfigError(f"posthoc_importance must be 'gradient' or 'leave-one-out', got {self.posthoc_importance!r}")
        try:
            self.budgets = [validate_budget(b) for b in self.budgets]
            self.static_budgets = [validate_budget(b) for b in self.static_budgets]
        except ValueError as exc:
            raise ConfigError(f"invalid budget in config: {exc}") from exc


def load_experiment_config(path: str, overrides: list[str] | None = None) -> ExperimentConfig:
    """Defaults, then the YAML file, then ``key=value`` overrides."""
    base = to_dict(ExperimentConfig())
    base["model"]["head_dim"] = 0
    base["model"]["heads_per_layer"] = []
    merged = apply_overrides(deep_merge(base, load_yaml(path)), overrides or [])
    return from_dict(ExperimentConfig, merged, "experiment")


def make_splits(cfg: ExperimentConfig, out: Path, pretrained_tokenizer=None) -> TensorSplits:
    if cfg.data.source == "synthetic":
        return make_synthetic_splits(cfg.synthetic, cfg.data.split_seed)
    splits, _ = make_text_splits(cfg.data, tokenizer_path=out / "tokenizer.json", pretrained_tokenizer=pretrained_tokenizer)
    return splits


class Experiment:
    """Runs the units of an :class:`ExperimentConfig` into a run directory, skipping finished ones."""

    def __init__(self, cfg: ExperimentConfig, out_dir: str | Path, progress: bool = True, log=print) -> None:
        self.cfg, self.out, self.progress, self.log = cfg, Path(out_dir), progress, log
        self.out.mkdir(parents=True, exist_ok=True)
        self._check_same_config()
        init_run_dir(self.out, to_dict(cfg), cfg.seeds)
        self.family = make_family(cfg.model_family, cfg.model, cfg.pretrained)
        self.splits = make_splits(cfg, self.out, self.family.pretrained_tokenizer())
        self.family.prepare(self.splits)
        self.n_layers, self.n_heads = self.family.shape
        self.head_costs = self.family.cost(self.splits.seq_len).head_costs()
        self.eval_batch = cfg.train.eval_batch_size

    # ---------------------------------------------------------------- bookkeeping

    def _check_same_config(self) -> None:
        """Refuse to resume a run directory made with a different configuration."""
        digest = hashlib.sha256(json.dumps(to_dict(self.cfg), sort_keys=True).encode()).hexdigest()
        stamp = self.out / "config.sha256"
        if stamp.exists() and stamp.read_text().strip() != digest:
            raise ConfigError(f"'{self.out}' holds a run with a different configuration; use another --out")
        write_text_atomic(stamp, digest + "\n")

    def _unit_path(self, seed: int, unit: str) -> Path:
        return self.out / "units" / f"seed{seed}" / f"{unit}.json"

    def _ckpt(self, seed: int, name: str) -> Path:
        return self.out / "checkpoints" / f"seed{seed}" / name

    def _unit(self, seed: int, unit: str, index: int, work) -> list[dict[str, Any]]:
        """Run ``work()`` unless the unit is finished; returns its rows."""
        path = self._unit_path(seed, unit)
        if path.exists():
            return json.loads(path.read_text())["rows"]
        seed_everything(1000 * seed + index)
        started = time.time()
        rows = work()
        write_json_atomic(path, {"rows": rows, "seconds": time.time() - started})
        return rows

    def _load(self, seed: int, name: str):
        model, _ = self.family.load(self._ckpt(seed, name))
        return model

    # ---------------------------------------------------------------- methods

    def _dense(self, seed: int) -> list[dict[str, Any]]:
        model = self.family.create()
        train_dense(model, self.splits.train, self.cfg.train, seed=seed, progress=self.progress)
        self.family.save(model, self._ckpt(seed, "dense"), method="dense", seed=seed)
        accuracy = evaluate_accuracy(model, self.splits.test, self.eval_batch)
        return [{"method": "dense", "budget": 1.0, "seed": seed, "accuracy": accuracy, "estimated_cost": 1.0,
                 "heads_kept": self.n_layers * self.n_heads, "speedup": 1.0, "ideal_speedup": 1.0}]

    def _budgeted(self, seed: int) -> list[dict[str, Any]]:
        dense = self._load(seed, "dense")
        model = copy.deepcopy(dense)
        train_budgeted(model, self.splits.train, self.cfg.train, self.head_costs, seed=seed, teacher=dense, progress=self.progress)
        self.family.save(model, self._ckpt(seed, "budgeted"), method="budgeted", seed=seed)
        return sweep_soft(model, self.splits, self.cfg.budgets, self.head_costs, "budgeted", seed, self.eval_batch)

    def _hard(self, seed: int) -> list[dict[str, Any]]:
        model = self._load(seed, "budgeted")
        ranking = HeadRanking.from_scores(model.gates.importance(), self.cfg.min_one_per_layer)
        before = {r["budget"]: r["accuracy"] for r in sweep_hard(model, self.splits, self.cfg.budgets, ranking, seed, self.eval_batch)}
        train_hard(model, self.splits.train, self.cfg.train, ranking, seed=seed, progress=self.progress)
        self.family.save(model, self._ckpt(seed, "budgeted-hard"), method="budgeted-hard", seed=seed, ranking=ranking.to_dict())
        rows = sweep_hard(model, self.splits, self.cfg.budgets, ranking, seed, self.eval_batch)
        for row in rows:
            row["accuracy_before_adaptation"] = before[row["budget"]]
        self._add_ideal(rows)
        return rows

    def _static(self, seed: int, budget: float) -> list[dict[str, Any]]:
        dense = self._load(seed, "dense")
        model = copy.deepcopy(dense)
        fixed = dataclasses.replace(self.cfg.train, budget_min=budget, budget_max=budget)
        train_budgeted(model, self.splits.train, fixed, self.head_costs, seed=seed, teacher=dense, desc=f"static b={budget}", progress=self.progress)
        rows = sweep_soft(model, self.splits, [budget], self.head_costs, "static", seed, self.eval_batch)
        return rows

    def _posthoc_ranking(self, seed: int) -> HeadRanking:
        path = self.out / "units" / f"seed{seed}" / "posthoc-ranking.json"
        if path.exists():
            return HeadRanking.from_dict(json.loads(path.read_text()))
        dense = self._load(seed, "dense")
        if self.cfg.posthoc_importance == "gradient":
            scores = gradient_importance(dense, self.splits.val, self.n_layers, self.n_heads)
        else:
            scores = leave_one_out_importance(dense, self.splits.val, self.n_layers, self.n_heads)
        ranking = HeadRanking.from_scores(scores, self.cfg.min_one_per_layer)
        write_json_atomic(path, {**ranking.to_dict(), "scores": scores.tolist(), "importance": self.cfg.posthoc_importance})
        return ranking

    def _posthoc(self, seed: int) -> list[dict[str, Any]]:
        dense = self._load(seed, "dense")
        rows = sweep_hard(dense, self.splits, self.cfg.budgets, self._posthoc_ranking(seed), seed, self.eval_batch, method="posthoc")
        self._add_ideal(rows)
        return rows

    def _recovered(self, seed: int, budget: float) -> list[dict[str, Any]]:
        model = self._load(seed, "dense")
        ranking = self._posthoc_ranking(seed)
        steps = self.cfg.train.recovery_steps or self.cfg.train.epoch_steps(len(self.splits.train))
        train_masked(model, self.splits.train, self.cfg.train, ranking.mask(budget), steps=steps, seed=seed, desc=f"recover b={budget}", progress=self.progress)
        rows = sweep_hard(model, self.splits, [budget], ranking, seed, self.eval_batch, method="posthoc-recovered")
        self._add_ideal(rows)
        return rows

    def _bench(self, seed: int) -> list[dict[str, Any]]:
        model, description = self.family.load(self._ckpt(seed, "budgeted-hard"))
        ranking = HeadRanking.from_dict(description["ranking"])
        budgets = self.cfg.bench.budgets or [b for b in self.cfg.budgets if b < 1.0]
        seq_lens = self.cfg.bench.seq_lens or [self.splits.seq_len]
        bench_cfg = dataclasses.replace(self.cfg.bench, budgets=budgets, seq_lens=seq_lens[:1], batch_sizes=self.cfg.bench.batch_sizes[:1])
        result = self.family.bench(model, ranking, bench_cfg, self.progress)
        return result["rows"]

    def _add_ideal(self, rows: list[dict[str, Any]]) -> None:
        cost = self.family.cost(self.splits.seq_len)
        for row in rows:
            row["ideal_speedup"] = cost.ideal_speedup(row["heads_per_layer"])

    # ---------------------------------------------------------------- driver

    def plan(self) -> list[tuple[int, str, Any]]:
        """(seed, unit name, callable) in execution order."""
        methods = set(self.cfg.methods)
        needs_budgeted = bool(methods & {"budgeted", "budgeted-hard"})
        units: list[tuple[int, str, Any]] = []
        for seed in self.cfg.seeds:
            units.append((seed, "dense", lambda s=seed: self._dense(s)))
            if needs_budgeted:
                units.append((seed, "budgeted", lambda s=seed: self._budgeted(s)))
            if "budgeted-hard" in methods:
                units.append((seed, "budgeted-hard", lambda s=seed: self._hard(s)))
                units.append((seed, "bench", lambda s=seed: self._bench(s)))
            if "static" in methods:
                for b in self.cfg.static_budgets:
                    units.append((seed, f"static-b{b}", lambda s=seed, b=b: self._static(s, b)))
            if "posthoc" in methods:
                units.append((seed, "posthoc", lambda s=seed: self._posthoc(s)))
            if "posthoc-recovered" in methods:
                for b in [b for b in self.cfg.budgets if b < 1.0]:
                    units.append((seed, f"posthoc-recovered-b{b}", lambda s=seed, b=b: self._recovered(s, b)))
        return units

    def run(self) -> dict[str, Any]:
        started = time.time()
        units = self.plan()
        done = sum(self._unit_path(seed, name).exists() for seed, name, _ in units)
        if done:
            self.log(f"resuming: {done} of {len(units)} units already finished in {self.out}")
        rows: list[dict[str, Any]] = []
        bench_rows: dict[int, list[dict[str, Any]]] = {}
        bar = tqdm(units, desc=self.cfg.name, disable=not self.progress)
        for index, (seed, name, work) in enumerate(bar):
            bar.set_postfix(unit=f"seed{seed}/{name}")
            unit_rows = self._unit(seed, name, index, work)
            if name == "bench":
                bench_rows[seed] = unit_rows
            else:
                rows += unit_rows
        for seed, brows in bench_rows.items():
            attach_latency(rows, {"rows": brows}, seed)
        rows = [r for r in rows if r["method"] in self.cfg.methods]
        setting = self.cfg.bench
        notes = (
            f"Experiment '{self.cfg.name}' on data source '{self.cfg.data.source}', {len(self.cfg.seeds)} seed(s), mean ± std. "
            f"Speedups: budgeted-hard pruned models over a plain dense model, batch {setting.batch_sizes[0]}, sequence "
            f"{(setting.seq_lens or [self.splits.seq_len])[0]}, {setting.threads} thread(s); FLOP-ideal from the cost model.\n"
            f"Wall time of this invocation: {time.time() - started:.0f} s.\n"
        )
        table = write_results(self.out, rows, title=f"baa experiment: {self.cfg.name}", notes=notes)
        plot_accuracy_vs_budget(rows, self.out / "accuracy_vs_budget.png", self.cfg.name)
        plot_accuracy_vs_speedup(rows, self.out / "accuracy_vs_speedup.png", self.cfg.name)
        self.log(table)
        self.log(notes)
        self.log(f"run directory: {self.out}")
        return {"rows": rows, "table": table}


def run_experiment(config_path: str, out_dir: str | None, overrides: list[str] | None = None, progress: bool = True) -> dict[str, Any]:
    cfg = load_experiment_config(config_path, overrides)
    out = out_dir or f"runs/{cfg.name}"
    return Experiment(cfg, out, progress=progress).run()
