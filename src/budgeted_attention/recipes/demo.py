"""``baa demo``: the main job on the synthetic marked-token task.

Per seed: dense warm-start -> budgeted (soft gates) -> hard-gate adaptation, plus the
from-scratch budgeted ablation; evaluated over a budget sweep; pruned models are timed against
the plain dense model. Writes a run directory with config, checkpoints, results and plot.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from budgeted_attention.benchmark.config import BenchConfig
from budgeted_attention.benchmark.runner import bench_markdown, bench_models
from budgeted_attention.budget import default_budget_sweep, validate_budget
from budgeted_attention.checkpoint import save_model
from budgeted_attention.config import apply_overrides, deep_merge, from_dict, load_yaml, to_dict
from budgeted_attention.data.synthetic import SyntheticConfig, make_synthetic_splits
from budgeted_attention.data.dataset import TensorSplits
from budgeted_attention.errors import ConfigError
from budgeted_attention.io import write_json_atomic, write_text_atomic
from budgeted_attention.model.config import ModelConfig
from budgeted_attention.model.cost import CostModel
from budgeted_attention.model.transformer import EncoderClassifier
from budgeted_attention.pruning.selection import HeadRanking
from budgeted_attention.recipes.common import attach_latency, sweep_hard, sweep_soft
from budgeted_attention.recipes.rundir import init_run_dir
from budgeted_attention.reporting.plots import plot_accuracy_vs_cost, plot_speedups
from budgeted_attention.reporting.results import write_results
from budgeted_attention.reporting.summary import headline, headline_markdown
from budgeted_attention.training.config import TrainConfig
from budgeted_attention.training.evaluate import evaluate_accuracy
from budgeted_attention.training.stages import seed_everything, train_budgeted, train_dense, train_hard


@dataclass
class DemoConfig:
    """Everything ``baa demo`` does; every field can be set from YAML or ``key=value``."""

    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    data_seed: int = 0
    budgets: list[float] = field(default_factory=default_budget_sweep)
    min_one_per_layer: bool = True
    hard: bool = True
    scratch: bool = True
    data: SyntheticConfig = field(default_factory=SyntheticConfig)
    model: ModelConfig = field(default_factory=lambda: ModelConfig(d_model=64, n_layers=4, n_heads=4, d_ff=256, max_len=128))
    train: TrainConfig = field(
        default_factory=lambda: TrainConfig(dense_steps=2000, budgeted_steps=800, hard_steps=1500, hard_lr=2e-3, lr=2e-3)
    )
    bench: BenchConfig = field(
        default_factory=lambda: BenchConfig(
            budgets=[0.25, 0.5, 0.75], batch_sizes=[1], seq_lens=[128], rounds=3, min_run_time=0.1
        )
    )

    def __post_init__(self) -> None:
        if not self.seeds:
            raise ConfigError("seeds must list at least one seed")
        try:
            self.budgets = [validate_budget(b) for b in self.budgets]
            self.bench.budgets = [validate_budget(b) for b in self.bench.budgets]
        except ValueError as exc:
            raise ConfigError(f"invalid budget in config: {exc}") from exc


def quick_config() -> DemoConfig:
    """A tiny model and a few hundred steps: the whole demo in well under a minute."""
    return DemoConfig(
        seeds=[0, 1],
        budgets=[0.25, 0.5, 0.75, 1.0],
        data=SyntheticConfig(n_train=2000, n_val=200, n_test=400, seq_len=12),
        model=ModelConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64, max_len=32),
        train=TrainConfig(dense_steps=300, budgeted_steps=200, hard_steps=100, batch_size=32, lr=3e-3),
        bench=BenchConfig(budgets=[0.5], batch_sizes=[1], seq_lens=[32], rounds=1, min_run_time=0.02),
    )


def load_demo_config(path: str | None, overrides: list[str], quick: bool) -> DemoConfig:
    """Defaults (or the quick preset), then the YAML file, then ``key=value`` overrides."""
    base = to_dict(quick_config() if quick else DemoConfig())
    # Derived model fields are recomputed from the user's shape, not carried from the defaults.
    base["model"]["head_dim"] = 0
    base["model"]["heads_per_layer"] = []
    if path is not None:
        base = deep_merge(base, load_yaml(path))
    base = apply_overrides(base, overrides)
    return from_dict(DemoConfig, base, "demo")


def _model_config(cfg: DemoConfig, splits: TensorSplits) -> ModelConfig:
    model_cfg = dataclasses.replace(
        cfg.model, vocab_size=splits.vocab_size, n_classes=splits.n_classes, pad_id=splits.pad_id, heads_per_layer=[]
    )
    if splits.seq_len > model_cfg.max_len:
        raise ConfigError(f"model.max_len ({model_cfg.max_len}) is shorter than the data ({splits.seq_len} tokens)")
    return model_cfg


def run_seed(cfg: DemoConfig, splits: TensorSplits, model_cfg: ModelConfig, seed: int, out: Path, progress: bool) -> tuple[list[dict[str, Any]], EncoderClassifier | None, HeadRanking | None]:
    """All methods for one seed; returns (rows, hard-adapted model, its ranking)."""
    tc, batch = cfg.train, cfg.train.eval_batch_size
    head_costs = CostModel(model_cfg, splits.seq_len).head_costs()
    ckpt = out / "checkpoints" / f"seed{seed}"
    rows: list[dict[str, Any]] = []

    seed_everything(seed)
    dense = EncoderClassifier(model_cfg)
    train_dense(dense, splits.train, tc, seed=seed, progress=progress)
    rows.append({"method": "dense", "budget": 1.0, "seed": seed, "accuracy": evaluate_accuracy(dense, splits.test, batch), "estimated_cost": 1.0})
    save_model(dense, ckpt / "dense", method="dense", seed=seed)

    budgeted = copy.deepcopy(dense)
    train_budgeted(budgeted, splits.train, tc, head_costs, seed=seed, teacher=dense, progress=progress)
    rows += sweep_soft(budgeted, splits, cfg.budgets, head_costs, "budgeted", seed, batch)
    save_model(budgeted, ckpt / "budgeted", method="budgeted", seed=seed)

    if cfg.scratch:
        seed_everything(seed)
        scratch = EncoderClassifier(model_cfg)
        train_budgeted(scratch, splits.train, tc, head_costs, seed=seed, steps=tc.effective_scratch_steps, desc="scratch", progress=progress)
        rows += sweep_soft(scratch, splits, cfg.budgets, head_costs, "budgeted-scratch", seed, batch)
        save_model(scratch, ckpt / "budgeted-scratch", method="budgeted-scratch", seed=seed)

    if not cfg.hard:
        return rows, None, None
    ranking = HeadRanking.from_scores(budgeted.gates.importance(), cfg.min_one_per_layer)
    hard = copy.deepcopy(budgeted)
    before = {r["budget"]: r["accuracy"] for r in sweep_hard(hard, splits, cfg.budgets, ranking, seed, batch)}
    train_hard(hard, splits.train, tc, ranking, seed=seed, progress=progress)
    hard_rows = sweep_hard(hard, splits, cfg.budgets, ranking, seed, batch)
    for row in hard_rows:
        row["accuracy_before_adaptation"] = before[row["budget"]]
    rows += hard_rows
    save_model(hard, ckpt / "budgeted-hard", method="budgeted-hard", seed=seed, ranking=ranking.to_dict())
    return rows, hard, ranking


def run_demo(cfg: DemoConfig, out_dir: str | Path, *, progress: bool = True, log=print) -> dict[str, Any]:
    """Run the whole demo; returns ``{"rows": ..., "table": markdown, "bench": {...}}``."""
    started = time.time()
    out = init_run_dir(out_dir, to_dict(cfg), cfg.seeds)
    splits = make_synthetic_splits(cfg.data, cfg.data_seed)
    model_cfg = _model_config(cfg, splits)
    rows: list[dict[str, Any]] = []
    bench_results = {}
    for seed in tqdm(cfg.seeds, desc="seeds", disable=not progress):
        seed_rows, hard, ranking = run_seed(cfg, splits, model_cfg, seed, out, progress)
        rows += seed_rows
        if hard is not None and cfg.bench.budgets:
            bench_budgets = sorted(set(cfg.bench.budgets) | set(b for b in cfg.budgets if b < 1.0))
            bench_cfg = dataclasses.replace(cfg.bench, budgets=bench_budgets, batch_sizes=cfg.bench.batch_sizes[:1], seq_lens=cfg.bench.seq_lens[:1])
            bench = bench_models(hard, ranking, bench_cfg, progress=progress)
            attach_latency(rows, bench, seed)
            bench_results[seed] = bench
        write_json_atomic(out / "results.json", {"rows": rows})  # progress so far
    notes = (
        f"Synthetic marked-token task, {len(cfg.seeds)} seed(s); mean ± std over seeds. "
        "Soft rows: estimated cost C(b). budgeted-hard rows: cost = kept-head fraction; speedup over the plain "
        f"dense model at batch {cfg.bench.batch_sizes[0]}, sequence {cfg.bench.seq_lens[0]}, {cfg.bench.threads} thread(s).\n"
        f"Wall time: {time.time() - started:.0f} s.\n"
    )
    summary = headline(rows)
    write_json_atomic(out / "summary.json", summary)
    notes += "\n## Headline figures (soft budgeted model, per seed)\n\n" + headline_markdown(summary)
    table = write_results(out, rows, title="baa demo results", notes=notes)
    plot_accuracy_vs_cost(rows, out / "accuracy_vs_cost.png", "synthetic marked-token task")
    if bench_results:
        first = bench_results[cfg.seeds[0]]
        write_json_atomic(out / "bench.json", first)
        write_text_atomic(out / "bench.md", bench_markdown(first))
        plot_speedups(first["rows"], out / "speedup.png")
    log(table)
    log(notes)
    log(f"run directory: {out}")
    return {"rows": rows, "table": table, "bench": bench_results}
