"""The experiment config (``baa experiment`` / ``baa lm`` / ``baa demo``) and its digests.

The digests are what a run directory is stamped with (``config.sha256``) and what every
finished-unit record carries: a resumed run is refused when they differ, so they must stay
byte-identical across releases for run directories of older code to resume.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

from budgeted_attention.benchmark.config import BenchConfig
from budgeted_attention.config import (
    apply_overrides, check_budgets, check_int, deep_merge, from_dict, load_yaml, to_dict, validate_run_name, validate_seeds,
)
from budgeted_attention.data.lm import LMDataConfig
from budgeted_attention.data.synthetic import SyntheticConfig
from budgeted_attention.data.text import TextDataConfig
from budgeted_attention.errors import ConfigError
from budgeted_attention.model.config import MetaConfig, ModelConfig
from budgeted_attention.model.registry import families_with, get_family
from budgeted_attention.model.router import RouterConfig
from budgeted_attention.pipeline.builders import PretrainedConfig
from budgeted_attention.pipeline.methods import check_method_names, check_methods
from budgeted_attention.tasks import TASKS
from budgeted_attention.training.config import TrainConfig


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
    ffn_sort_examples: int = 0
    head_cost_weight: float = 1.0
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
        check_method_names(self.methods)
        if self.posthoc_importance not in ("gradient", "leave-one-out"):
            raise ConfigError(f"posthoc_importance must be 'gradient' or 'leave-one-out', got {self.posthoc_importance!r}")
        if self.budget_scope not in ("heads", "all"):
            raise ConfigError(f"budget_scope must be 'heads' or 'all', got {self.budget_scope!r}")
        check_int(self.ffn_group_size, "ffn_group_size", ge=1)
        check_int(self.reference_seq_len, "reference_seq_len", ge=0)
        check_int(self.ffn_sort_examples, "ffn_sort_examples", ge=0)
        check_head_cost_weight(self.head_cost_weight, self.budget_scope)
        if self.model.ffn_group_size or self.model.ffn_group_ids:
            raise ConfigError("model.ffn_group_size/ffn_group_ids are set by the pipeline: use budget_scope: all and ffn_group_size")
        check_family_names(self)
        self.budgets = check_budgets(self.budgets, "budgets")
        self.static_budgets = check_budgets(self.static_budgets, "static_budgets", allow_empty=True)
        check_methods(self)  # each method's own checks, on the checked fields above

    @property
    def group_size(self) -> int:
        """FFN neurons per gated group, 0 when the FFN is not under the budget."""
        return self.ffn_group_size if self.budget_scope == "all" else 0

    @property
    def path_steps(self) -> int:
        """Steps the budgeted path adds after the dense model (budgeted + hard stages)."""
        return self.train.budgeted_steps + self.train.hard_steps


def check_head_cost_weight(weight: Any, budget_scope: str) -> None:
    """``head_cost_weight``: a number in [0.01, 100], other than 1 only where heads and FFN groups
    share the budget (under ``budget_scope: heads`` every unit is a head, so it would change nothing)."""
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or not 0.01 <= weight <= 100:
        raise ConfigError(f"head_cost_weight must be a number in [0.01, 100], got {weight!r}")
    if weight != 1 and budget_scope != "all":
        raise ConfigError(f"head_cost_weight {weight!r} weighs heads against FFN groups: it needs budget_scope 'all'")


def check_family_names(cfg: ExperimentConfig) -> None:
    """The config's family against the registry's capabilities (no list of family names here)."""
    family = get_family(cfg.model_family)

    def names(capability: str) -> str:
        return " or ".join(f"'{name}'" for name in families_with(capability))

    if cfg.budget_scope == "all" and not family.supports("pretrained") and (cfg.model.d_ff == 0 or cfg.model.d_ff % cfg.ffn_group_size):
        raise ConfigError(f"ffn_group_size ({cfg.ffn_group_size}) must divide model.d_ff ({cfg.model.d_ff}), which must be > 0")
    if (cfg.task == "lm") != family.supports("lm"):
        raise ConfigError(f"task 'lm' needs model_family {names('lm')} and the decoder needs task 'lm'; got task {cfg.task!r} with model_family {cfg.model_family!r}")
    if "ladder" in cfg.methods and not family.supports("depth"):
        raise ConfigError(f"method 'ladder' needs model_family {names('depth')} and a non-empty 'ladder' list of model shapes")
    if {"budgetformer", "capped-routing"} & set(cfg.methods) and (not family.supports("routing") or cfg.budget_scope != "heads"):
        raise ConfigError(f"budgetformer / capped-routing route heads per input: model_family {names('routing')} with budget_scope 'heads'")
    if cfg.train.freeze_embeddings and not family.supports("pretrained"):
        raise ConfigError(f"train.freeze_embeddings keeps a pretrained embedding; model_family {cfg.model_family!r} trains its own from scratch")
    if cfg.train.gate_init == "importance" and cfg.budget_scope == "all" and cfg.posthoc_importance != "gradient":
        raise ConfigError("train.gate_init 'importance' under budget_scope 'all' needs posthoc_importance 'gradient' (leave-one-out scores heads only)")
    if cfg.train.gate_forward == "straight-through" and (sandwich := [m for m in cfg.methods if m.endswith("-sandwich")]):
        raise ConfigError(f"train.gate_forward 'straight-through' runs one budget per step; methods {', '.join(sandwich)} use the sandwich rule")


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
    ("bench", "cuda_graphs"): False, ("train", "early_stop_budgeted"): False, ("bench", "int8"): False,
    ("train", "gate_forward"): "soft", ("train", "freeze_embeddings"): False,
    ("train", "gate_init"): "zeros", ("ffn_sort_examples",): 0, ("train", "hard_budget_min"): None,
    ("head_cost_weight",): 1.0,
}

def config_digest(cfg: ExperimentConfig) -> str:
    """SHA-256 of the resolved config (what ``config.sha256`` stamps in a run directory)."""
    return _digest_of(to_dict(cfg))


def unit_config_digest(cfg: ExperimentConfig) -> str:
    """SHA-256 of the resolved config without its ``seeds``: what every finished-unit record
    carries (:data:`~budgeted_attention.pipeline.units.UNIT_DIGEST_KEY`). The seed list is left out because a unit belongs to one seed,
    and the units of a merged run come from parts with other seed lists."""
    data = to_dict(cfg)
    data.pop("seeds", None)
    return _digest_of(data)


def _digest_of(data: dict[str, Any]) -> str:
    """SHA-256 of a resolved config mapping, without the training device and the later keys at
    their defaults, and with the data format of a pretrained decoder's LM blocks."""
    data["train"].pop("device", None)  # where a run trains is not what it computes: resumable anywhere
    if data.get("task") == "lm" and data.get("model_family") in families_with("pretrained"):
        # Its blocks start with the tokenizer's BOS; a run directory made while they started bare
        # has another digest, so it is refused instead of resumed on other data.
        data["lm_blocks"] = "tokenizer-prefix"
    for path, default in _LATER_KEYS.items():
        parent = data
        for key in path[:-1]:
            parent = parent.get(key, {})
        if path[-1] in parent and parent[path[-1]] == default:
            del parent[path[-1]]
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def config_from_dict(data: dict[str, Any], overrides: list[str] | None = None) -> ExperimentConfig:
    """Defaults, then ``data`` (a parsed YAML mapping), then ``key=value`` overrides."""
    base = to_dict(ExperimentConfig())
    base["model"]["head_dim"] = 0
    base["model"]["heads_per_layer"] = []
    base["model"]["head_ids"] = []
    merged = apply_overrides(deep_merge(base, data), overrides or [])
    return from_dict(ExperimentConfig, merged, "experiment")


def load_experiment_config(path: str, overrides: list[str] | None = None, task: str | None = None, quick: bool = False) -> ExperimentConfig:
    """Defaults, then the YAML file, then ``key=value`` overrides.

    ``task="lm"`` (``baa lm``): ``task: lm`` and ``model_family: decoder`` become the defaults, and
    a file that asks for another task is refused.

    A file's ``quick:`` mapping (keys as in the file, sections nested) is the quick variant of its
    study (``--quick``): merged over the file before the overrides; without ``quick`` it is ignored.
    It never reaches the resolved config, so it changes no digest.
    """
    data, quick_changes = split_quick(load_yaml(path), path)
    if quick and not quick_changes:
        raise ConfigError(f"'{path}' has no quick: section; --quick runs a config's quick variant")
    if task == "lm":
        if data.get("task", "lm") != "lm":
            raise ConfigError(f"'{path}' sets task {data['task']!r}; 'baa lm' runs language models (task: lm), use 'baa experiment' for it")
        data = {"task": "lm", "model_family": families_with("lm")[0], **data}  # the first LM family is the default
    if quick_changes:
        try:  # checked whichever variant runs, so a mistake in quick: surfaces on the full run too
            quick_cfg = config_from_dict(deep_merge(data, quick_changes), overrides)
        except ConfigError as exc:
            raise ConfigError(f"'{path}' quick: {exc}") from exc
        if quick:
            return quick_cfg
    return config_from_dict(data, overrides)


def split_quick(data: dict[str, Any], path: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(the file's mapping without its ``quick:`` section, that section or None), the section checked to be a mapping."""
    data = dict(data)
    quick_changes = data.pop("quick", None)
    if quick_changes is not None and not isinstance(quick_changes, dict):
        raise ConfigError(f"'{path}': quick must be a mapping of config keys, got {type(quick_changes).__name__}")
    return data, quick_changes
