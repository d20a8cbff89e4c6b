"""The one pipeline: method x budget x seed on one data set, resumable. ``baa experiment`` and
``baa demo`` (an embedded experiment config) both run it.

Methods (the ``method`` values of ``results.json``; every row records ``steps``, the optimiser
steps from initialisation that produced it, and ``cost_kind``):

* ``dense``: full attention, the warm start of the others (early-stopped on validation
  accuracy when ``train.early_stopping_patience`` > 0);
* ``dense-long``: the dense model trained on for as many steps as the budgeted path adds
  (budgeted + hard), the equal-steps control for any "beats dense" claim;
* ``budgeted``: the one budgeted checkpoint with soft gates at every budget (cost: soft estimate);
* ``budgeted-hard``: the same checkpoint after hard-gate adaptation, hard masks = pruned models;
* ``budgeted-sandwich`` / ``budgeted-hard-sandwich``: the same two stages trained with the
  sandwich rule (full model, smallest budget and random budgets every step, distilled in place),
  whatever ``train.budget_sampling`` says (``budgeted``/``budgeted-hard`` follow it);
* ``budgeted-scratch``: the budgeted stage from a random init for the same total steps (ablation);
* ``static``: a specialist per budget: gates trained at that one budget from the dense model,
  its own top-k heads, the same hard adaptation, structurally pruned, with measured speed;
  ``static-soft`` is the same specialist before hard adaptation (soft estimate);
* ``posthoc``: zero-shot structural pruning of the dense model, heads ranked on the validation
  split (gradient of a head mask, Michel et al. 2019; or leave-one-out), no retraining;
* ``posthoc-recovered``: the same plus as many recovery steps as the budgeted path adds after
  the dense model; ``posthoc-recovered-1ep``: one recovery epoch (the paper's variant);
* ``ladder``: what a user would pick instead of one budgeted checkpoint: separately trained
  dense encoders of the shapes in ``ladder`` (smaller width/depth), each trained from scratch for
  the same total steps as the budgeted-hard path (at most, early-stopped on validation as the
  dense warm start is when ``train.early_stopping_patience`` > 0), timed against the same dense reference.

Budget scope (``budget_scope``): ``heads`` (the paper) puts the attention heads under the
budget; ``all`` adds the feed-forward blocks as groups of ``ffn_group_size`` neurons, so b is the
fraction of the prunable forward FLOPs (heads and FFN) at ``reference_seq_len`` tokens. Under
``all`` the dense model's FFN neurons are sorted by importance on the training split right after
dense training (function-preserving), so every method starts from the same sorted dense model.

Choices never see the test split: it is sealed (:class:`budgeted_attention.data.dataset.SealedSplit`)
and read only in the final evaluation of each finished model.

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
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from budgeted_attention.benchmark.config import BenchConfig
from budgeted_attention.benchmark.runner import bench_against_reference, bench_models, bench_ranking
from budgeted_attention.reporting.bench_table import bench_table
from budgeted_attention.checkpoint import checkpoint_paths, load_model, load_ranking, save_model, verify_artifacts
from budgeted_attention.config import (
    apply_overrides,
    check_budgets,
    check_int,
    deep_merge,
    from_dict,
    load_yaml,
    to_dict,
    validate_run_name,
    validate_seeds,
)
from budgeted_attention.data.dataset import TensorSplits
from budgeted_attention.data.lm import LMDataConfig, make_lm_splits
from budgeted_attention.data.synthetic import SyntheticConfig, make_synthetic_splits
from budgeted_attention.data.text import TextDataConfig, make_text_splits
from budgeted_attention.errors import CheckpointError, ConfigError
from budgeted_attention.io import remove_stale_temp_files, write_json_atomic, write_text_atomic
from budgeted_attention.runlock import RunDirLock
from budgeted_attention.training import distributed
from budgeted_attention.model.config import MetaConfig, ModelConfig
from budgeted_attention.model.router import RouterConfig
from budgeted_attention.model.cost import estimated_cost
from budgeted_attention.model.family import GatedModel
from budgeted_attention.model.gates import UnitGates
from budgeted_attention.pruning.importance import leave_one_out_importance, sort_ffn_by_importance, unit_gradient_importance
from budgeted_attention.pruning.selection import KeptUnits, Ranking, rank_units, ranking_from_dict
from budgeted_attention.recipes.families import PretrainedConfig, make_builder
from budgeted_attention.recipes.rundir import init_run_dir
from budgeted_attention.reporting.plots import (
    plot_accuracy_vs_budget,
    plot_accuracy_vs_cost,
    plot_accuracy_vs_speedup,
    plot_speedups,
    plot_training_curves,
)
from budgeted_attention.reporting.results import write_results
from budgeted_attention.reporting.rows import ResultRow
from budgeted_attention.reporting.summary import headline, headline_markdown
from budgeted_attention.tasks import CLASSIFY, TASKS, Task
from budgeted_attention.training.config import TrainConfig
from budgeted_attention.training.routed import calibrate_router, choose_spread, difficulty_profile, routing_summary, train_routed
from budgeted_attention.training.stages import StageLog, seed_everything, train_budgeted, train_dense, train_hard, train_masked

# Benchmark unit name -> the method whose rows get its measured speed.
BENCH_UNITS = {"bench": "budgeted-hard", "bench-sandwich": "budgeted-hard-sandwich"}

ALL_METHODS = [
    "dense", "dense-long", "budgeted", "budgeted-hard", "budgeted-sandwich", "budgeted-hard-sandwich", "budgeted-scratch",
    "static", "static-soft", "posthoc", "posthoc-recovered", "posthoc-recovered-1ep", "ladder",
    "budgetformer", "capped-routing",
]
# Per-input head routing methods -> router mode (``router:`` config; the method sets the mode).
ROUTED_METHODS = {"budgetformer": "learned", "capped-routing": "capped"}
# Model keys a ladder entry may change (``name`` labels its rows: ``ladder (name)`` in tables).
LADDER_KEYS = ("d_model", "n_layers", "n_heads", "head_dim", "d_ff", "qk_norm", "residual_gate", "name")


@dataclass
class ExperimentConfig:
    """One experiment: data, model, training, methods, budgets, seeds, benchmark."""

    name: str = "experiment"
    notes: str = ""
    task: str = "classify"
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    methods: list[str] = field(default_factory=lambda: ["dense", "dense-long", "budgeted", "budgeted-hard", "static", "static-soft", "posthoc", "posthoc-recovered", "posthoc-recovered-1ep"])
    budgets: list[float] = field(default_factory=lambda: [0.25, 0.5, 0.75, 1.0])
    static_budgets: list[float] = field(default_factory=lambda: [0.25, 0.5, 0.75])
    posthoc_importance: str = "gradient"
    min_one_per_layer: bool = True
    budget_scope: str = "heads"
    ffn_group_size: int = 64
    reference_seq_len: int = 0
    ladder: list[dict[str, Any]] = field(default_factory=list)
    router: RouterConfig = field(default_factory=RouterConfig)
    model_family: str = "encoder"
    pretrained: PretrainedConfig = field(default_factory=PretrainedConfig)
    data: TextDataConfig = field(default_factory=TextDataConfig)
    lm_data: LMDataConfig = field(default_factory=LMDataConfig)
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    model: ModelConfig = field(default_factory=lambda: ModelConfig(d_model=128, n_layers=4, n_heads=4, d_ff=512, max_len=64, pooling="mean", dropout=0.1))
    train: TrainConfig = field(default_factory=TrainConfig)
    bench: BenchConfig = field(default_factory=lambda: BenchConfig(budgets=[], batch_sizes=[1], seq_lens=[], rounds=5, min_run_time=0.2))

    def __post_init__(self) -> None:
        self.name = validate_run_name(self.name)
        if self.task not in TASKS:
            raise ConfigError(f"task must be one of {', '.join(TASKS)}, got {self.task!r}")
        self.seeds = validate_seeds(self.seeds)
        unknown = [m for m in self.methods if m not in ALL_METHODS]
        if unknown:
            raise ConfigError(f"unknown method {unknown[0]!r} (known: {', '.join(ALL_METHODS)})")
        if not self.methods:
            raise ConfigError("methods must list at least one method")
        if self.posthoc_importance not in ("gradient", "leave-one-out"):
            raise ConfigError(f"posthoc_importance must be 'gradient' or 'leave-one-out', got {self.posthoc_importance!r}")
        if self.budget_scope not in ("heads", "all"):
            raise ConfigError(f"budget_scope must be 'heads' or 'all', got {self.budget_scope!r}")
        check_int(self.ffn_group_size, "ffn_group_size", ge=1)
        check_int(self.reference_seq_len, "reference_seq_len", ge=0)
        if self.budget_scope == "all" and self.posthoc_importance != "gradient" and {"posthoc", "posthoc-recovered", "posthoc-recovered-1ep"} & set(self.methods):
            raise ConfigError("posthoc_importance 'leave-one-out' scores heads only; use 'gradient' with budget_scope 'all'")
        self._check_ladder()
        if self.model.ffn_group_size or self.model.ffn_group_ids:
            raise ConfigError("model.ffn_group_size/ffn_group_ids are set by the pipeline: use budget_scope: all and ffn_group_size")
        if self.budget_scope == "all" and self.model_family in ("encoder", "decoder") and (self.model.d_ff == 0 or self.model.d_ff % self.ffn_group_size):
            raise ConfigError(f"ffn_group_size ({self.ffn_group_size}) must divide model.d_ff ({self.model.d_ff}), which must be > 0")
        if self.model_family not in ("encoder", "bert", "decoder"):
            raise ConfigError(f"model_family must be 'encoder', 'bert' or 'decoder', got {self.model_family!r}")
        if (self.task == "lm") != (self.model_family == "decoder"):
            raise ConfigError(f"task 'lm' needs model_family 'decoder' and the decoder needs task 'lm'; got task {self.task!r} with model_family {self.model_family!r}")
        self.budgets = check_budgets(self.budgets, "budgets")
        self.static_budgets = check_budgets(self.static_budgets, "static_budgets", allow_empty=True)
        if {"static", "static-soft"} & set(self.methods) and not self.static_budgets:
            raise ConfigError("static_budgets must list at least one budget when a static method is run")
        if set(ROUTED_METHODS) & set(self.methods) and (self.model_family not in ("encoder", "bert") or self.budget_scope != "heads"):
            raise ConfigError("budgetformer / capped-routing route heads per input: model_family 'encoder' or 'bert' with budget_scope 'heads'")

    def _check_ladder(self) -> None:
        if "ladder" not in self.methods:
            return
        if self.model_family not in ("encoder", "decoder") or not self.ladder:
            raise ConfigError("method 'ladder' needs model_family 'encoder' or 'decoder' and a non-empty 'ladder' list of model shapes")
        for index, shape in enumerate(self.ladder):
            unknown = sorted(set(shape) - set(LADDER_KEYS))
            if unknown:
                raise ConfigError(f"unknown key 'ladder[{index}].{unknown[0]}' (known: {', '.join(LADDER_KEYS)})")
            if "name" in shape and (not isinstance(shape["name"], str) or not shape["name"]):
                raise ConfigError(f"ladder[{index}].name must be a non-empty string, got {shape['name']!r}")
            try:
                self.model.unpruned(**{"head_dim": 0, **_shape(shape)}, ffn_group_size=0)
            except ConfigError as exc:
                raise ConfigError(f"ladder[{index}]: {exc}") from None

    @property
    def task_spec(self) -> Task:
        """The objective and metrics of :attr:`task`."""
        return TASKS[self.task]

    @property
    def group_size(self) -> int:
        """FFN neurons per gated group, 0 when the FFN is not under the budget."""
        return self.ffn_group_size if self.budget_scope == "all" else 0

    @property
    def path_steps(self) -> int:
        """Steps the budgeted path adds after the dense model (budgeted + hard stages)."""
        return self.train.budgeted_steps + self.train.hard_steps


# Config keys added after runs were stamped, with their defaults: left out of the digest while at
# the default, so a run directory made before they existed still resumes with the same config.
_LATER_KEYS = {
    ("budget_scope",): "heads", ("ffn_group_size",): 64, ("reference_seq_len",): 0, ("ladder",): [],
    ("train", "budget_sampling"): "single", ("train", "sandwich_random"): 2,
    ("model", "ffn_group_size"): 0, ("model", "ffn_group_ids"): [],
    ("notes",): "", ("task",): "classify", ("lm_data",): to_dict(LMDataConfig()), ("model", "qk_norm"): False, ("model", "residual_gate"): False,
    ("model", "attention"): "softmax", ("model", "meta"): to_dict(MetaConfig()), ("model", "positions"): "learned",
    ("router",): to_dict(RouterConfig()), ("synthetic", "mixed_markers"): False,
    ("train", "bf16"): False, ("bench", "onnx"): False, ("bench", "device"): "cpu", ("bench", "compile"): False,
    ("bench", "cuda_graphs"): False, ("train", "early_stop_budgeted"): False,
}


def _stopping(log: StageLog) -> dict[str, Any]:
    """A stage's early-stopping record for its unit (steps run, validation history), or nothing
    when the stage was not early-stopped."""
    return {"steps_run": log.steps_run, "val_history": log.val_history} if log.val_history else {}


def _shape(entry: dict[str, Any]) -> dict[str, Any]:
    """The model keys of a ladder entry (without its ``name``)."""
    return {k: v for k, v in entry.items() if k != "name"}


def config_digest(cfg: ExperimentConfig) -> str:
    """SHA-256 of the resolved config (what ``config.sha256`` stamps in a run directory)."""
    return _digest_of(to_dict(cfg))


def unit_config_digest(cfg: ExperimentConfig) -> str:
    """SHA-256 of the resolved config without its ``seeds``: what every finished-unit record
    carries (``UNIT_DIGEST_KEY``). The seed list is left out because a unit belongs to one seed,
    and the units of a merged run come from parts with other seed lists."""
    data = to_dict(cfg)
    data.pop("seeds", None)
    return _digest_of(data)


def _digest_of(data: dict[str, Any]) -> str:
    """SHA-256 of a resolved config mapping, without the training device and the later keys at their defaults."""
    data["train"].pop("device", None)  # where a run trains is not what it computes: resumable anywhere
    for path, default in _LATER_KEYS.items():
        parent = data
        for key in path[:-1]:
            parent = parent.get(key, {})
        if path[-1] in parent and parent[path[-1]] == default:
            del parent[path[-1]]
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


# The key of a finished-unit record holding :func:`unit_config_digest` (absent from records of older code).
UNIT_DIGEST_KEY = "config_sha256_except_seeds"


def config_from_dict(data: dict[str, Any], overrides: list[str] | None = None) -> ExperimentConfig:
    """Defaults, then ``data`` (a parsed YAML mapping), then ``key=value`` overrides."""
    base = to_dict(ExperimentConfig())
    base["model"]["head_dim"] = 0
    base["model"]["heads_per_layer"] = []
    base["model"]["head_ids"] = []
    merged = apply_overrides(deep_merge(base, data), overrides or [])
    return from_dict(ExperimentConfig, merged, "experiment")


def load_experiment_config(path: str, overrides: list[str] | None = None, task: str | None = None) -> ExperimentConfig:
    """Defaults, then the YAML file, then ``key=value`` overrides.

    ``task="lm"`` (``baa lm``): ``task: lm`` and ``model_family: decoder`` become the defaults, and
    a file that asks for another task is refused.
    """
    data = load_yaml(path)
    if task == "lm":
        if data.get("task", "lm") != "lm":
            raise ConfigError(f"'{path}' sets task {data['task']!r}; 'baa lm' runs language models (task: lm), use 'baa experiment' for it")
        data = {"task": "lm", "model_family": "decoder", **data}
    return config_from_dict(data, overrides)


def make_splits(cfg: ExperimentConfig, out: Path, pretrained_tokenizer=None) -> TensorSplits:
    if cfg.task == "lm":
        return make_lm_splits(cfg.lm_data, tokenizer_path=out / "tokenizer.json")
    if cfg.data.source == "synthetic":
        return make_synthetic_splits(cfg.synthetic, cfg.data.split_seed)
    splits, _ = make_text_splits(cfg.data, tokenizer_path=out / "tokenizer.json", pretrained_tokenizer=pretrained_tokenizer)
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
            from budgeted_attention.training.routing import routing_statistics  # noqa: PLC0415

            routing = routing_statistics(model, test, batch)
    if task.kind == "classify":
        return {"accuracy": metrics["accuracy"], "val_accuracy": val["accuracy"]}
    return {
        "accuracy": None, "val_accuracy": None, "loss": metrics["loss"], "perplexity": metrics["perplexity"], "val_loss": val["loss"],
        **({"routing": routing} if routing is not None else {}),
    }


# Timing units split off from training units after runs were published: they draw no random
# numbers and take no seed index, so every other unit keeps the seed it had before the split.
SPLIT_TIMING_UNITS = ("bench-ladder-", "bench-static-")


def seed_indices(units: list[tuple[int, str, Any]]) -> list[int]:
    """Per unit, the index its random seed is derived from (``1000 * seed + index``): its position
    in the plan, not counting the split-off timing units."""
    indices, position = [], 0
    for _, name, _ in units:
        indices.append(position)
        if not name.startswith(SPLIT_TIMING_UNITS):
            position += 1
    return indices


class Experiment:
    """Runs the units of an :class:`ExperimentConfig` into a run directory, skipping finished ones."""

    def __init__(self, cfg: ExperimentConfig, out_dir: str | Path, progress: bool = True, log=print) -> None:
        self.cfg, self.out, self.progress, self.log = cfg, Path(out_dir), progress, log
        # One writer per run directory, taken before anything is read: a second writer (another
        # config included) is told at once who holds it. Released at the end of :meth:`run`, on a
        # failed start, or when an object that never ran is collected.
        self._lock = RunDirLock(self.out, log=log).acquire()
        weakref.finalize(self, self._lock.release)
        try:
            self._start()
        except BaseException:
            self._lock.release()
            raise

    def _start(self) -> None:
        cfg = self.cfg
        self._check_resumable()
        if self._lock.held:  # every other writer of this directory is shut out: what is left over is stale
            remove_stale_temp_files(self.out, self.log)
        # Everything that can fail on a config or data mistake runs before the run directory is
        # stamped, so a failed start can be rerun into the same --out after the fix.
        self.builder = make_builder(cfg.model_family, cfg.model, cfg.pretrained, cfg.group_size)
        self.out.mkdir(parents=True, exist_ok=True)
        self.splits = make_splits(cfg, self.out, self.builder.pretrained_tokenizer())
        self.builder.prepare(self.splits, self.cfg.bench.seq_lens)
        self.eval_batch = cfg.train.eval_batch_size
        self.task = cfg.task_spec
        self._stamp_config()
        init_run_dir(self.out, to_dict(cfg), cfg.seeds)
        write_json_atomic(self.out / "lengths.json", {"split": "train", "lengths": self.splits.train.lengths()})
        self.splits.to(distributed.current().device)  # data moved once; training and evaluation batches start there
        if self.splits.class_names:  # what baa serve answers with
            write_json_atomic(self.out / "labels.json", {"class_names": list(self.splits.class_names)})
        distributed.barrier()  # every rank starts the units after rank 0 stamped the run directory

    # ---------------------------------------------------------------- bookkeeping

    def _digest(self) -> str:
        return config_digest(self.cfg)

    def _check_resumable(self) -> None:
        """Refuse to resume a run directory made with a different configuration."""
        stamp = self.out / "config.sha256"
        if stamp.is_file() and stamp.read_text().strip() != self._digest():
            raise ConfigError(f"'{self.out}' holds a run with a different configuration; use another --out")

    def _stamp_config(self) -> None:
        write_text_atomic(self.out / "config.sha256", self._digest() + "\n")

    def _unit_digest(self) -> str:
        return unit_config_digest(self.cfg)

    def _check_unit_digest(self, path: Path, record: dict[str, Any]) -> None:
        """Refuse a finished-unit record made under another configuration (records of older code
        carry no digest and are accepted)."""
        recorded = record.get(UNIT_DIGEST_KEY)
        if recorded is not None and recorded != self._unit_digest():
            raise ConfigError(
                f"finished-unit record '{path}' was made with another configuration ({UNIT_DIGEST_KEY} {recorded}, "
                f"this run's {self._unit_digest()}): delete it to rerun the unit, or use another --out"
            )

    def _unit_path(self, seed: int, unit: str) -> Path:
        return self.out / "units" / f"seed{seed}" / f"{unit}.json"

    def _ckpt(self, seed: int, name: str) -> Path:
        return self.out / "checkpoints" / f"seed{seed}" / name

    def _unit(self, seed: int, unit: str, index: int, work: Callable[[], dict[str, Any]], redo: bool = False) -> dict[str, Any]:
        """Run ``work()`` unless the unit is finished (``redo``: run it anyway, its record replaced
        atomically when it finishes); returns its record (``rows`` and extras)."""
        path = self._unit_path(seed, unit)
        if distributed.agree(path.exists() and not redo):  # rank 0 decides, so every rank runs the same units
            return self._read_unit(path)
        runtime = distributed.current()
        if runtime.distributed and unit.startswith("bench") and not runtime.is_main:
            # Timing-only units run on rank 0 alone (timing beside another rank's copy would be
            # contended); the other ranks wait in the barrier rank 0 enters after writing the
            # record, then read it. No second `agree` here: every rank makes exactly one per unit,
            # or rank 0's decision for the next unit would pair with this one.
            distributed.barrier()
            return self._read_unit(path)
        seed_everything(1000 * seed + index)
        started = time.time()
        record = work()
        record["rows"] = [r.to_dict() if isinstance(r, ResultRow) else r for r in record.get("rows", [])]
        record["seconds"] = time.time() - started
        record[UNIT_DIGEST_KEY] = self._unit_digest()
        write_json_atomic(path, record)  # rank 0 only (other ranks' writes are discarded)
        distributed.barrier()  # the next unit reads what rank 0 wrote (checkpoints, rankings)
        return record

    def _read_unit(self, path: Path) -> dict[str, Any]:
        """A finished unit's record, checked (a clear error names a corrupt or malformed file, or
        one made with another configuration)."""
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"finished-unit record '{path}' is not valid JSON ({exc}); delete it to rerun the unit") from exc
        rows = record.get("rows", []) if isinstance(record, dict) else None
        if not isinstance(rows, list) or not all(isinstance(r, dict) and "method" in r and "budget" in r for r in rows):
            raise CheckpointError(f"finished-unit record '{path}' is malformed; delete it to rerun the unit")
        self._check_unit_digest(path, record)
        return record

    def _load(self, seed: int, name: str) -> tuple[GatedModel, dict[str, Any]]:
        """A saved model of this run, refused when the run's tokenizer or labels are no longer
        the ones it was trained with (rebuilt differently on a resume)."""
        path = self._ckpt(seed, name)
        model, description = load_model(path)
        verify_artifacts(path, description, self.out, model)
        return model, description

    def _steps_of(self, seed: int, name: str) -> int:
        return int(self._load_description(seed, name).get("steps", 0))

    def _load_description(self, seed: int, name: str) -> dict[str, Any]:
        from budgeted_attention.checkpoint import read_description  # noqa: PLC0415

        return read_description(self._ckpt(seed, name))

    def _reference_seq(self) -> int:
        """Sequence length at which budgets are converted to FLOPs (training cost, ranking fit)."""
        return self.cfg.reference_seq_len or self.splits.seq_len

    def _unit_costs(self, model: GatedModel) -> UnitGates:
        """FLOPs per gated unit (heads; heads and FFN groups under ``budget_scope: all``)."""
        return model.unit_costs(self._reference_seq())

    def _rank(self, model: GatedModel, scores: UnitGates) -> Ranking:
        return rank_units(scores, self._unit_costs(model), self.cfg.min_one_per_layer)

    def _bench_seq(self) -> int:
        return (self.cfg.bench.seq_lens or [self.splits.seq_len])[0]

    # ---------------------------------------------------------------- rows

    def _metrics(self, model: GatedModel, **gating: Any) -> dict[str, float]:
        """Validation and test metrics of a finished model under ``gating`` (row fields)."""
        return evaluate_model(model, self.splits, self.eval_batch, self.task, **gating)

    def _dense_row(self, method: str, model: GatedModel, seed: int, steps: int) -> ResultRow:
        return ResultRow(method=method, budget=1.0, seed=seed, **self._metrics(model), cost=1.0, cost_kind="dense",
                         steps=steps, heads_kept=model.n_layers * model.n_heads, heads_per_layer=model.heads_per_layer)

    def _soft_rows(self, method: str, model: GatedModel, seed: int, steps: int, budgets: list[float]) -> list[ResultRow]:
        costs = self._unit_costs(model)
        rows = []
        with torch.no_grad():
            for b in budgets:
                gates = model.unit_gates(b)
                rows.append(ResultRow(
                    method=method, budget=b, seed=seed, **self._metrics(model, budget=b),
                    cost=float(estimated_cost(gates, costs)), cost_kind="soft-estimate", steps=steps,
                    layer_gates=[round(float(g), 4) for g in gates.heads.mean(dim=1)],
                    gates=[[round(float(v), 4) for v in layer] for layer in gates.heads],
                    ffn_layer_gates=None if gates.ffn is None else [round(float(g), 4) for g in gates.ffn.mean(dim=1)],
                    scope=self.cfg.budget_scope,
                ))
        return rows

    def _hard_rows(self, method: str, model: GatedModel, seed: int, steps: int, kept_by_budget: dict[float, KeptUnits]) -> list[ResultRow]:
        """Rows of hard masks (= the pruned models): cost is the kept units' share of the budgeted FLOPs."""
        costs = self._unit_costs(model)
        cost = model.cost_model(self._bench_seq())
        rows = []
        for b, kept in kept_by_budget.items():
            masks = kept.masks(model.n_heads, model.n_groups)
            heads = kept.heads_per_layer
            widths = None if kept.groups is None else [len(g) * model.group_size for g in kept.groups]
            rows.append(ResultRow(
                method=method, budget=b, seed=seed, **self._metrics(model, gates=masks),
                cost=float(estimated_cost(masks, costs)), cost_kind="kept-heads", steps=steps,
                heads_kept=sum(heads), heads_per_layer=heads, ideal_speedup=cost.ideal_speedup(heads, widths),
                scope=self.cfg.budget_scope, ffn_per_layer=widths,
                flops_fraction=cost.total_flops(heads, widths) / cost.total_flops(),
            ))
        return rows

    def _ranking_kept(self, ranking: Ranking, budgets: list[float]) -> dict[float, KeptUnits]:
        return {b: ranking.kept(b) for b in budgets}

    # ---------------------------------------------------------------- methods

    def _dense(self, seed: int) -> dict[str, Any]:
        model = self.builder.create()
        log = train_dense(model, self.splits.train, self.cfg.train, seed=seed, progress=self.progress, val=self.splits.val, task=self.task)
        if model.has_ffn_units:
            # DynaBERT-style reordering on the TRAINING split: groups of consecutive neurons then
            # hold neurons of similar importance, and the first groups the most important ones.
            sort_ffn_by_importance(model, self.splits.train, batch_size=self.cfg.train.batch_size, task=self.task)
        save_model(model, self._ckpt(seed, "dense"), artifacts_dir=self.out, method="dense", seed=seed, steps=log.steps)
        return {
            "rows": [self._dense_row("dense", model, seed, log.steps)], "steps_run": log.steps_run, "val_history": log.val_history,
            "loss_curve": log.loss_curve(),
        }

    def _dense_long(self, seed: int) -> dict[str, Any]:
        """The equal-steps dense control: the dense warm start trained on for the budgeted path's
        steps. With ``train.early_stop_budgeted`` (and a patience) it is early-stopped on
        validation as the warm start, the ladder and the budgeted stages are (those steps the
        maximum, best weights kept); without it, a fixed schedule as in the published runs."""
        model, description = self._load(seed, "dense")
        extra = self.cfg.path_steps
        val = self.splits.val if self.cfg.train.early_stop_budgeted else None
        log = train_dense(
            model, self.splits.train, self.cfg.train, seed=seed, progress=self.progress, val=val, steps=extra,
            desc="dense-long", task=self.task,
        )
        row = self._dense_row("dense-long", model, seed, int(description["steps"]) + log.steps)
        return {"rows": [row], **_stopping(log)}

    def _train_cfg(self, variant: str) -> TrainConfig:
        """The training config of the ``budgeted`` path (``""``) or its ``-sandwich`` variant."""
        if variant == "-sandwich":
            return dataclasses.replace(self.cfg.train, budget_sampling="sandwich")
        return self.cfg.train

    def _budgeted(self, seed: int, variant: str = "") -> dict[str, Any]:
        dense, description = self._load(seed, "dense")
        model = copy.deepcopy(dense)
        name = f"budgeted{variant}"
        train_cfg = self._train_cfg(variant)
        teacher = None if train_cfg.budget_sampling == "sandwich" else dense  # the sandwich distils in place
        log = train_budgeted(
            model, self.splits.train, train_cfg, self._unit_costs(model), seed=seed, teacher=teacher, desc=name, progress=self.progress,
            task=self.task, val=self.splits.val, val_budgets=self.cfg.budgets,
        )
        steps = int(description["steps"]) + log.steps
        save_model(model, self._ckpt(seed, name), artifacts_dir=self.out, method=name, seed=seed, steps=steps)
        return {"rows": self._soft_rows(name, model, seed, steps, self.cfg.budgets), **_stopping(log)}

    def _scratch(self, seed: int) -> dict[str, Any]:
        model = self.builder.create()
        # Same total steps as the warm-started path: the dense model's actual steps (it may have
        # stopped early) plus the budgeted stage.
        steps = self.cfg.train.scratch_steps or self._steps_of(seed, "dense") + self.cfg.train.budgeted_steps
        # The paper's ablation: one budget per step, whatever train.budget_sampling says.
        scratch_cfg = dataclasses.replace(self.cfg.train, budget_sampling="single")
        log = train_budgeted(
            model, self.splits.train, scratch_cfg, self._unit_costs(model), seed=seed, steps=steps, desc="scratch", progress=self.progress,
            task=self.task, val=self.splits.val, val_budgets=self.cfg.budgets,
        )
        return {"rows": self._soft_rows("budgeted-scratch", model, seed, log.steps, self.cfg.budgets), **_stopping(log)}

    def _hard(self, seed: int, variant: str = "") -> dict[str, Any]:
        model, description = self._load(seed, f"budgeted{variant}")
        name = f"budgeted-hard{variant}"
        ranking = self._rank(model, model.unit_importance())
        kept = self._ranking_kept(ranking, self.cfg.budgets)
        before = {r.budget: r for r in self._hard_rows("before", model, seed, 0, kept)}
        log = train_hard(
            model, self.splits.train, self._train_cfg(variant), ranking, seed=seed, desc=name, progress=self.progress, task=self.task,
            val=self.splits.val, val_budgets=self.cfg.budgets,
        )
        steps = int(description["steps"]) + log.steps
        save_model(model, self._ckpt(seed, name), artifacts_dir=self.out, method=name, seed=seed, steps=steps, ranking=ranking.to_dict())
        rows = self._hard_rows(name, model, seed, steps, kept)
        for row in rows:
            row.accuracy_before_adaptation = before[row.budget].accuracy
            row.val_accuracy_before_adaptation = before[row.budget].val_accuracy
            row.loss_before_adaptation = before[row.budget].loss
        return {"rows": rows, **_stopping(log)}

    def _bench_cfg(self, budgets: list[float]) -> BenchConfig:
        return dataclasses.replace(self.cfg.bench, budgets=budgets, seq_lens=[self._bench_seq()], batch_sizes=self.cfg.bench.batch_sizes)

    def _bench_kwargs(self) -> dict[str, Any]:
        # Language-model blocks are all full length: their "real lengths" input is the random one.
        lengths = self.splits.train.lengths() if self.cfg.bench.lengths and self.cfg.task != "lm" else None
        return {"lengths": lengths, "pad_id": self.splits.pad_id, "progress": self.progress}

    def _bench(self, seed: int, variant: str = "") -> dict[str, Any]:
        name = f"budgeted-hard{variant}"
        model, description = self._load(seed, name)
        ranking = load_ranking(self._ckpt(seed, name), description, model)
        budgets = self.cfg.bench.budgets or [b for b in self.cfg.budgets if b < 1.0]
        return {"bench": bench_ranking(model, ranking, self._bench_cfg(budgets), **self._bench_kwargs())}

    def _static(self, seed: int, budget: float) -> dict[str, Any]:
        """A specialist for one budget: soft gates at b only, its own top-k, hard adaptation; saved as
        ``static-b<b>`` and timed by the unit ``bench-static-b<b>``."""
        dense, description = self._load(seed, "dense")
        model = copy.deepcopy(dense)
        # One budget only: the sandwich rule does not apply to a specialist.
        fixed = dataclasses.replace(self.cfg.train, budget_min=budget, budget_max=budget, full_budget_prob=0.0, budget_sampling="single")
        log = train_budgeted(
            model, self.splits.train, fixed, self._unit_costs(model), seed=seed, teacher=dense, desc=f"static b={budget}", progress=self.progress,
            task=self.task, val=self.splits.val, val_budgets=[budget],
        )
        soft_steps = int(description["steps"]) + log.steps
        rows = self._soft_rows("static-soft", model, seed, soft_steps, [budget])
        ranking = self._rank(model, model.unit_gates(budget))
        hard_log = train_hard(
            model, self.splits.train, fixed, ranking, seed=seed, budgets=(budget, budget), desc=f"static-hard b={budget}", progress=self.progress,
            task=self.task, val=self.splits.val, val_budgets=[budget],
        )
        hard_rows = self._hard_rows("static", model, seed, soft_steps + hard_log.steps, {budget: ranking.kept(budget)})
        save_model(model, self._ckpt(seed, f"static-b{budget}"), artifacts_dir=self.out, method="static", seed=seed, steps=soft_steps + hard_log.steps, ranking=ranking.to_dict())
        stopping = {f"{stage}_{key}": value for stage, stage_log in (("soft", log), ("hard", hard_log)) for key, value in _stopping(stage_log).items()}
        return {"rows": rows + hard_rows, **stopping}

    def _saved_or_timed(self, seed: int, name: str) -> dict[str, Any] | None:
        """None when the model of training unit ``name`` was saved (time it now); else the timing
        its record holds (a run made before timing was split from training, resumed)."""
        _, description_path = checkpoint_paths(self._ckpt(seed, name))
        if description_path.exists():
            return None
        record = self._read_unit(self._unit_path(seed, name))
        if record.get("bench"):
            return record
        raise CheckpointError(
            f"'{description_path}' is missing and units/seed{seed}/{name}.json holds no timing; delete that record to retrain it"
        )

    def _bench_static(self, seed: int, budget: float) -> dict[str, Any]:
        """Time the specialist of ``budget`` pruned to its kept units (a unit of its own, so the timing
        can be redone without retraining)."""
        name = f"static-b{budget}"
        old = self._saved_or_timed(seed, name)
        if old is not None:
            return {"rows": [], "bench": old["bench"]}
        model, description = self._load(seed, name)
        kept = {budget: load_ranking(self._ckpt(seed, name), description, model).kept(budget)}
        return {"rows": [], "bench": bench_models(model, kept, dataclasses.replace(self._bench_cfg([budget]), include_sliced=False), **self._bench_kwargs())}

    def _posthoc_ranking(self, seed: int) -> Ranking:
        path = self.out / "units" / f"seed{seed}" / "posthoc-ranking.json"
        if path.exists():
            try:
                saved = json.loads(path.read_text(encoding="utf-8"))
                ranking = ranking_from_dict(saved)
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError, IndexError) as exc:
                raise CheckpointError(f"post-hoc ranking '{path}' is malformed ({exc}); delete it to recompute") from exc
            self._check_unit_digest(path, saved)
            return ranking
        dense, _ = self._load(seed, "dense")
        # Importance on the validation split (never test), as in Michel et al. (2019).
        if self.cfg.posthoc_importance == "gradient":
            scores = unit_gradient_importance(dense, self.splits.val, task=self.task)
        else:
            scores = UnitGates(leave_one_out_importance(dense, self.splits.val, dense.n_layers, dense.n_heads, task=self.task), None)
        ranking = self._rank(dense, scores)
        saved = {"heads": scores.heads.tolist(), **({"ffn": scores.ffn.tolist()} if scores.ffn is not None else {})}
        write_json_atomic(path, {**ranking.to_dict(), "scores": saved, "importance": self.cfg.posthoc_importance, UNIT_DIGEST_KEY: self._unit_digest()})
        return ranking

    def _posthoc(self, seed: int) -> dict[str, Any]:
        dense, description = self._load(seed, "dense")
        kept = self._ranking_kept(self._posthoc_ranking(seed), self.cfg.budgets)
        return {"rows": self._hard_rows("posthoc", dense, seed, int(description["steps"]), kept)}

    def _recovered(self, seed: int, budget: float, method: str) -> dict[str, Any]:
        model, description = self._load(seed, "dense")
        ranking = self._posthoc_ranking(seed)
        if method == "posthoc-recovered":
            steps = self.cfg.train.recovery_steps or self.cfg.path_steps
        else:
            steps = self.cfg.train.epoch_steps(len(self.splits.train))
        log = train_masked(model, self.splits.train, self.cfg.train, ranking.masks(budget), steps=steps, seed=seed, desc=f"{method} b={budget}", progress=self.progress, task=self.task)
        kept = {budget: ranking.kept(budget)}
        return {"rows": self._hard_rows(method, model, seed, int(description["steps"]) + log.steps, kept)}

    def _ladder(self, seed: int, index: int) -> dict[str, Any]:
        """A smaller dense model of the same family trained from scratch for the budgeted-hard path's
        total steps, saved as ``ladder-<index>``; its unit ``bench-ladder-<index>`` times it. With
        ``train.early_stopping_patience`` > 0 it is early-stopped on validation as the dense warm
        start is (those steps the maximum, best weights kept): neither side of the comparison gets
        a checkpoint chosen on validation that the other lacks."""
        big, _ = self._load(seed, "dense")
        entry = self.cfg.ladder[index]
        config = big.config.unpruned(**{"head_dim": 0, **_shape(entry)}, ffn_group_size=0)
        model = type(big)(config)
        steps = self._steps_of(seed, "dense") + self.cfg.path_steps
        log = train_dense(
            model, self.splits.train, self.cfg.train, seed=seed, progress=self.progress, val=self.splits.val, steps=steps,
            desc=f"ladder {index}", task=self.task,
        )
        save_model(model, self._ckpt(seed, f"ladder-{index}"), artifacts_dir=self.out, method="ladder", seed=seed, steps=log.steps)
        fraction = self._ladder_fraction(big, model)
        row = ResultRow(
            method="ladder", budget=round(min(1.0, fraction), 3), seed=seed, **self._metrics(model),
            cost=fraction, cost_kind="smaller-dense", steps=log.steps, heads_kept=sum(config.heads_per_layer),
            heads_per_layer=config.heads_per_layer, ideal_speedup=1.0 / fraction, flops_fraction=fraction,
            ffn_per_layer=[config.d_ff] * config.n_layers, scope="all",  # its cost is whole-model FLOPs
        )
        # Its name, else the shape it changes: the rows of different ladder models stay apart and say what they are.
        row.variant = entry.get("name") or ", ".join(f"{key} {value}" for key, value in _shape(entry).items())
        return {"rows": [row], "shape": entry, "loss_curve": log.loss_curve(), "steps_run": log.steps_run, "val_history": log.val_history}

    def _ladder_fraction(self, big: GatedModel, model: GatedModel) -> float:
        """The ladder model's forward FLOPs over the full model's, at the bench sequence length."""
        seq = self._bench_seq()
        return model.cost_model(seq).total_flops() / big.cost_model(seq).total_flops()

    def _bench_ladder(self, seed: int, index: int) -> dict[str, Any]:
        """Time ladder model ``index`` against the full dense model's plain reference: a unit of its
        own, so the timing can be redone on a quiet machine (delete its record) without retraining."""
        old = self._saved_or_timed(seed, f"ladder-{index}")
        if old is not None:
            return {"rows": [], "bench": old["bench"], "ideal_speedup": old["rows"][0]["ideal_speedup"]}
        big, _ = self._load(seed, "dense")
        model, _ = self._load(seed, f"ladder-{index}")
        cfg = dataclasses.replace(self._bench_cfg([]), include_sliced=False)
        timed = bench_against_reference(big, {"ladder": model}, cfg, **self._bench_kwargs())
        return {"rows": [], "bench": timed, "ideal_speedup": 1.0 / self._ladder_fraction(big, model)}

    def _routed(self, seed: int, method: str) -> dict[str, Any]:
        """Per-input head routing (BudgetFormer: ``learned``; ours: ``capped``) trained from the dense
        model for the budgeted-hard path's steps, distilling from it; a capped router is calibrated
        on validation. Rows: test metrics, realised mean cost and heads at each budget."""
        mode = ROUTED_METHODS[method]
        dense, description = self._load(seed, "dense")
        model = copy.deepcopy(dense)
        model.attach_router(dataclasses.replace(self.cfg.router, mode=mode))
        log = train_routed(model, self.splits.train, self.cfg.train, seed=seed, steps=self.cfg.path_steps, teacher=dense, desc=method, progress=self.progress, task=self.task)
        steps = int(description["steps"]) + log.steps
        budgets: list[float | None] = [None] if mode == "learned" else list(self.cfg.budgets)
        calibration = calibrate_router(model, self.splits.val, [b for b in budgets if b is not None], batch_size=self.eval_batch) if mode == "capped" else {}
        spread = {}
        if model.router.by_difficulty:  # how unequal the allocation is, chosen per budget on validation
            spread = choose_spread(model, self.splits.val, [b for b in budgets if b is not None], task=self.task, batch_size=self.eval_batch)
            calibration = {b: model.router.calibration[b] for b in calibration}
        save_model(model, self._ckpt(seed, method), artifacts_dir=self.out, method=method, seed=seed, steps=steps)
        cost = model.cost_model(self._bench_seq())
        rows, profiles, as_trained = [], {}, {}
        for b in budgets:
            with self.splits.final_evaluation() as test:  # realised cost on test: measured, no choice
                summary = routing_summary(model, test, cost, budget=b, batch_size=self.eval_batch, task=None)
                profiles["learned" if b is None else str(b)] = difficulty_profile(summary.heads, dense, test, self.cfg.data.source, self.eval_batch)
                if b is not None and b in spread and spread[b]["scale"] != 1.0:
                    as_trained[str(b)] = self._heads_as_trained(model, dense, test, cost, b, float(spread[b]["offsets"]["1.0"]))
            rows.append(ResultRow(
                method=method, budget=1.0 if b is None else b, seed=seed, **self._metrics(model, budget=b),
                cost=summary.cost, cost_kind="routed", steps=steps, mean_heads=summary.mean_heads,
                ideal_speedup=summary.ideal_speedup, flops_fraction=summary.flops_fraction,
                variant="learned budget" if b is None else None,
            ))
        return {
            "rows": rows, "calibration": {str(b): d for b, d in calibration.items()}, "spread": {str(b): c for b, c in spread.items()},
            "difficulty": profiles, "difficulty_as_trained": as_trained, "loss_curve": log.loss_curve(),
        }

    def _heads_as_trained(self, model: GatedModel, dense: GatedModel, split: Any, cost: Any, budget: float, offset: float) -> dict[str, Any]:
        """How the heads track difficulty at spread 1 (as trained) where validation chose another
        spread: shown beside the chosen allocation, never used for a result row."""
        router = model.router
        chosen = router.spread_scale[budget], router.calibration[budget]
        router.spread_scale[budget], router.calibration[budget] = 1.0, offset
        try:
            summary = routing_summary(model, split, cost, budget=budget, batch_size=self.eval_batch, task=None)
            profile = difficulty_profile(summary.heads, dense, split, self.cfg.data.source, self.eval_batch)
        finally:
            router.spread_scale[budget], router.calibration[budget] = chosen
        return {**profile, "cost": summary.cost}

    def _bench_routed(self, seed: int) -> dict[str, Any]:
        """Per-input routed models timed on validation inputs against the plain dense reference, at
        every benchmark batch size (validation: timing inputs are not a choice, and the test split
        stays sealed)."""
        from budgeted_attention.benchmark.per_input import bench_per_input  # noqa: PLC0415

        dense, _ = self._load(seed, "dense")
        reference = dense.plain_reference()
        rows = []
        for method, mode in ROUTED_METHODS.items():
            if method not in self.cfg.methods:
                continue
            model, _ = self._load(seed, method)
            budgets: list[float | None] = [None] if mode == "learned" else [b for b in self.cfg.budgets if b < 1.0]
            for batch_size in self.cfg.bench.batch_sizes:
                inputs = max(32, 4 * batch_size)
                batches = [(ids, mask) for ids, mask, _ in self.splits.val.batches(batch_size)][: max(1, inputs // batch_size)]
                rows += bench_per_input(model, reference, batches, budgets, self.cfg.bench, method=method)
        return {"bench": {"rows": rows}}

    # ---------------------------------------------------------------- driver

    def plan(self) -> list[tuple[int, str, Callable[[], dict[str, Any]]]]:
        """(seed, unit name, callable) in execution order."""
        methods = set(self.cfg.methods)
        needs_budgeted = bool(methods & {"budgeted", "budgeted-hard"})
        needs_sandwich = bool(methods & {"budgeted-sandwich", "budgeted-hard-sandwich"})
        sub_one = [b for b in self.cfg.budgets if b < 1.0]
        units: list[tuple[int, str, Callable[[], dict[str, Any]]]] = []
        for seed in self.cfg.seeds:
            units.append((seed, "dense", lambda s=seed: self._dense(s)))
            if "dense-long" in methods:
                units.append((seed, "dense-long", lambda s=seed: self._dense_long(s)))
            if needs_budgeted:
                units.append((seed, "budgeted", lambda s=seed: self._budgeted(s)))
            if "budgeted-hard" in methods:
                units.append((seed, "budgeted-hard", lambda s=seed: self._hard(s)))
                units.append((seed, "bench", lambda s=seed: self._bench(s)))
            if needs_sandwich:
                units.append((seed, "budgeted-sandwich", lambda s=seed: self._budgeted(s, "-sandwich")))
            if "budgeted-hard-sandwich" in methods:
                units.append((seed, "budgeted-hard-sandwich", lambda s=seed: self._hard(s, "-sandwich")))
                units.append((seed, "bench-sandwich", lambda s=seed: self._bench(s, "-sandwich")))
            if "budgeted-scratch" in methods:
                units.append((seed, "budgeted-scratch", lambda s=seed: self._scratch(s)))
            if methods & {"static", "static-soft"}:
                for b in self.cfg.static_budgets:
                    units.append((seed, f"static-b{b}", lambda s=seed, b=b: self._static(s, b)))
                    units.append((seed, f"bench-static-b{b}", lambda s=seed, b=b: self._bench_static(s, b)))
            if "posthoc" in methods:
                units.append((seed, "posthoc", lambda s=seed: self._posthoc(s)))
            for method in ("posthoc-recovered", "posthoc-recovered-1ep"):
                if method in methods:
                    for b in sub_one:
                        units.append((seed, f"{method}-b{b}", lambda s=seed, b=b, m=method: self._recovered(s, b, m)))
            if "ladder" in methods:
                for index in range(len(self.cfg.ladder)):
                    units.append((seed, f"ladder-{index}", lambda s=seed, i=index: self._ladder(s, i)))
                    units.append((seed, f"bench-ladder-{index}", lambda s=seed, i=index: self._bench_ladder(s, i)))
            routed = [m for m in ROUTED_METHODS if m in methods]
            for method in routed:
                units.append((seed, method, lambda s=seed, m=method: self._routed(s, m)))
            if routed:
                units.append((seed, "bench-routed", lambda s=seed: self._bench_routed(s)))
        return units

    def _timing_to_redo(self, units: list[tuple[int, str, Any]]) -> set[tuple[int, str]]:
        """The plan's timing units (``bench*``), to be run again over their records; refuses a run
        whose training units are not all finished (a retime trains nothing)."""
        missing = [f"seed{seed}/{name}" for seed, name, _ in units if not name.startswith("bench") and not self._unit_path(seed, name).exists()]
        if distributed.agree(bool(missing)):
            raise ConfigError(
                f"--retime times a finished run, and '{self.out}' misses {len(missing)} training unit(s) "
                f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}): run it without --retime first"
            )
        return {(seed, name) for seed, name, _ in units if name.startswith("bench")}

    def run(self, finished_only: bool = False, retime: bool = False) -> dict[str, Any]:
        """Run every unfinished unit, then write the outputs. ``finished_only``: run nothing and
        write the outputs of the units already finished (a partial run, said so in the notes).
        ``retime``: run every timing unit again (its record replaced when it finishes, so an
        interrupted retime keeps the timings it has not redone); the run must be finished, and
        nothing is trained. For timings taken on a busy machine, e.g. seeds trained side by side.
        The run directory's lock is held throughout and released at the end, whatever happens."""
        self._lock.acquire()  # again when this object ran before (its lock was released then)
        try:
            return self._run(finished_only, retime)
        finally:
            self._lock.release()

    def _run(self, finished_only: bool, retime: bool) -> dict[str, Any]:
        if finished_only and retime:
            raise ConfigError("--retime times the models again and --finished-only runs nothing: use one of them")
        started = time.time()
        units = self.plan()
        redo = self._timing_to_redo(units) if retime else set()
        if redo:
            self.log(f"retiming: {len(redo)} timing unit(s) run again in {self.out}; trained models are kept")
        done = sum(self._unit_path(seed, name).exists() for seed, name, _ in units)
        if done:
            self.log(f"resuming: {done} of {len(units)} units already finished in {self.out}")
        self.partial = None
        if finished_only:
            finished = [distributed.agree(self._unit_path(seed, name).exists()) for seed, name, _ in units]  # rank 0 decides
            missing = [f"seed{seed}/{name}" for (seed, name, _), ok in zip(units, finished, strict=True) if not ok]
            units = [u for u, ok in zip(units, finished, strict=True) if ok]
            if missing:
                self.partial = f"PARTIAL RUN: {len(units)} of {len(units) + len(missing)} units finished; missing: {', '.join(missing)}."
        rows: list[dict[str, Any]] = []
        benches: dict[str, dict[int, dict[str, Any]]] = {}
        routed_benches: dict[int, dict[str, Any]] = {}
        self.routed_records: dict[str, dict[int, dict[str, Any]]] = {}
        self.curves: dict[str, list[list[float]]] = {}
        ladder_rows: dict[tuple[int, str], list[dict[str, Any]]] = {}
        bar = tqdm(units, desc=self.cfg.name, disable=not self.progress)
        for (seed, name, work), index in zip(bar, seed_indices(units), strict=True):
            bar.set_postfix(unit=f"seed{seed}/{name}")
            record = self._unit(seed, name, index, work, redo=(seed, name) in redo)
            rows += record.get("rows", [])
            if name == "dense" and record.get("loss_curve"):
                self.curves[f"dense, seed {seed}"] = record["loss_curve"]
            if name.startswith("ladder-"):
                ladder_rows[(seed, name.removeprefix("ladder-"))] = record.get("rows", [])  # the same dicts as in ``rows``
                if record.get("loss_curve"):
                    self.curves[f"ladder {record['shape'].get('name', name.removeprefix('ladder-'))}, seed {seed}"] = record["loss_curve"]
            if name.startswith("bench-ladder-"):
                timed = {**record["bench"][0], "ideal_speedup": record["ideal_speedup"]}
                self._attach_speed(ladder_rows.get((seed, name.removeprefix("bench-ladder-")), []), timed)
            if name.startswith("bench-static-"):
                timed = record["bench"]["rows"][0]
                self._attach_speed([r for r in rows if r["method"] == "static" and r["seed"] == seed and r["budget"] == timed["budget"]], timed)
            if name in BENCH_UNITS:
                benches.setdefault(BENCH_UNITS[name], {})[seed] = record["bench"]
            if name == "bench-routed":
                routed_benches[seed] = record["bench"]
            if name in ROUTED_METHODS:
                self.routed_records.setdefault(name, {})[seed] = record
        for method, by_seed in benches.items():
            self._attach_bench(rows, by_seed, method)
        self._attach_routed_bench(rows, routed_benches)
        self.routed_benches = routed_benches
        rows = [r for r in rows if r["method"] in self.cfg.methods]
        return self._write_outputs(rows, benches, time.time() - started)

    def _attach_bench(self, rows: list[dict[str, Any]], benches: dict[int, dict[str, Any]], method: str) -> None:
        """Measured speed of the first benchmark setting (of the run's scope) onto each seed's ``method`` rows."""
        for seed, bench in benches.items():
            first = {}
            for r in bench["rows"]:
                if r.get("scope", "heads") == self.cfg.budget_scope:
                    first.setdefault(r["budget"], r)
            for row in rows:
                if row["method"] == method and row["seed"] == seed and row["budget"] in first:
                    self._attach_speed([row], first[row["budget"]])

    @staticmethod
    def _attach_speed(rows: list[dict[str, Any]], bench_row: dict[str, Any]) -> None:
        """One benchmark row's measured speed onto result rows (dicts, updated in place)."""
        for row in rows:
            result = ResultRow(**{k: v for k, v in row.items() if k in ResultRow.__dataclass_fields__})
            result.attach_speed(bench_row)
            row.update(result.to_dict())

    def _write_routed_outputs(self) -> None:
        """``routed.md`` / ``routed.json``: per-input routing speed, calibration and heads by difficulty."""
        from budgeted_attention.reporting.per_input import routed_markdown  # noqa: PLC0415

        benches = getattr(self, "routed_benches", {})
        records = getattr(self, "routed_records", {})
        if not benches and not records:
            return
        data = {
            "bench": {str(seed): bench for seed, bench in benches.items()},
            "difficulty": {m: {str(seed): r.get("difficulty", {}) for seed, r in by_seed.items()} for m, by_seed in records.items()},
            "calibration": {m: {str(seed): r.get("calibration", {}) for seed, r in by_seed.items()} for m, by_seed in records.items()},
            "spread": {m: {str(seed): r.get("spread", {}) for seed, r in by_seed.items()} for m, by_seed in records.items()},
            "difficulty_as_trained": {
                m: {str(seed): r.get("difficulty_as_trained", {}) for seed, r in by_seed.items()} for m, by_seed in records.items()
            },
        }
        write_json_atomic(self.out / "routed.json", data)
        write_text_atomic(self.out / "routed.md", f"# Per-input head routing: {self.cfg.name}\n\n" + routed_markdown(data))

    def _attach_routed_bench(self, rows: list[dict[str, Any]], benches: dict[int, dict[str, Any]]) -> None:
        """Measured speed at the first benchmark batch size onto each seed's routed rows."""
        first_batch = self.cfg.bench.batch_sizes[0]
        for seed, bench in benches.items():
            timed = {(r["method"], r["budget"]): r for r in bench["rows"] if r["batch_size"] == first_batch}
            for row in rows:
                entry = timed.get((row["method"], row["budget"])) if row["seed"] == seed else None
                if entry is not None:  # the FLOP-ideal of the timed (validation) inputs goes with their measured speed
                    self._attach_speed([row], entry)

    def _source(self) -> str:
        if self.cfg.task == "lm":
            return f"'{self.cfg.lm_data.source}' ({self.cfg.lm_data.tokenizer} tokens, blocks of {self.cfg.lm_data.seq_len})"
        return f"'{self.cfg.data.source}'"

    def _metric_note(self) -> str:
        if self.cfg.task == "lm":
            return "Loss: next-token cross-entropy in nats per token on the test documents (perplexity = exp(loss)), choices made on validation."
        return "Accuracy: test split at choices made on validation."

    def _write_outputs(self, rows: list[dict[str, Any]], benches: dict[str, dict[int, dict[str, Any]]], seconds: float) -> dict[str, Any]:
        setting = self.cfg.bench
        notes = (
            f"Experiment '{self.cfg.name}' on data source {self._source()}, {len(self.cfg.seeds)} seed(s), mean ± std. "
            f"{self._metric_note()} Cost kinds: soft-estimate (C(b) of soft gates, no speed), "
            f"kept-heads (physically pruned; with budget_scope 'all' the kept heads and FFN groups). Budget scope: '{self.cfg.budget_scope}'. Speedups: pruned models over the plain dense reference (same kernels, no gate code), "
            f"batch {setting.batch_sizes[0]}, sequence {self._bench_seq()}, {setting.threads} thread(s); FLOP-ideal from the cost model.\n"
            f"Wall time of this invocation: {seconds:.0f} s.\n"
        )
        if self.cfg.notes:
            notes = self.cfg.notes.strip() + "\n\n" + notes
        if getattr(self, "partial", None):
            notes = f"**{self.partial}**\n\n" + notes
        # The headline picks operating points by validation accuracy: classification runs only
        # (a language model's sweep is its table of losses).
        summary = headline(rows) if self.cfg.task == "classify" else {"task": self.cfg.task, "per_seed": []}
        write_json_atomic(self.out / "summary.json", summary)
        if summary.get("per_seed"):
            notes += "\n## Headline figures (soft budgeted model, per seed; budgets chosen on validation)\n\n" + headline_markdown(summary)
        table = write_results(self.out, rows, title=f"baa experiment: {self.cfg.name}", notes=notes, partial=getattr(self, "partial", None))
        plot_accuracy_vs_budget(rows, self.out / "accuracy_vs_budget.png", self.cfg.name)
        plot_accuracy_vs_cost(rows, self.out / "accuracy_vs_cost.png", self.cfg.name)
        plot_accuracy_vs_speedup(rows, self.out / "accuracy_vs_speedup.png", self.cfg.name)
        if getattr(self, "curves", None):
            ylabel = "training loss (nats/token)" if self.cfg.task == "lm" else "training loss"
            plot_training_curves(self.curves, self.out / "training_curves.png", f"{self.cfg.name}: training from initialisation", ylabel)
        self._write_routed_outputs()
        for method, by_seed in benches.items():
            first = by_seed[min(by_seed)]
            stem = "bench" if method == "budgeted-hard" else f"bench-{method.removeprefix('budgeted-hard-')}"
            write_json_atomic(self.out / f"{stem}.json", first)
            write_text_atomic(self.out / f"{stem}.md", f"# baa bench (seed {min(by_seed)}, {method})\n\n" + bench_table(first))
            plot_speedups(first["rows"], self.out / ("speedup.png" if stem == "bench" else f"speedup-{stem}.png"))
        self.log(table)
        self.log(notes)
        self.log(f"run directory: {self.out}")
        return {"rows": rows, "table": table, "bench": benches}


def run_experiment(
    config_path: str, out_dir: str | None, overrides: list[str] | None = None, progress: bool = True, finished_only: bool = False,
    task: str | None = None, retime: bool = False,
) -> dict[str, Any]:
    if finished_only and retime:  # before anything is read or written
        raise ConfigError("--retime times the models again and --finished-only runs nothing: use one of them")
    cfg = load_experiment_config(config_path, overrides, task)
    out = out_dir or f"runs/{cfg.name}"
    with distributed.running(cfg.train.device, cfg.train.bf16) as runtime:
        quiet = not runtime.is_main  # one process reports (rank 0)
        log = (lambda *_: None) if quiet else print
        return Experiment(cfg, out, progress=progress and not quiet, log=log).run(finished_only=finished_only, retime=retime)
