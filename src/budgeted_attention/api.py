"""The public Python API: the handful of calls a user needs, re-exported at the package top.

    import budgeted_attention as baa

    bm = baa.load("runs/demo")                 # a run directory or a checkpoint file
    small = bm.prune(0.5)                      # a physically smaller model for b = 0.5
    served = bm.sliced(); served.set_budget(0.25)   # every budget from one sorted layout
    baa.save(small, "small.safetensors")
    rows = bm.bench(budgets=[0.5], seq_lens=[64])["rows"]

Own data: ``baa.wrap("prajjwal1/bert-mini", num_labels=4)`` (a local folder, a hub name or a
transformers model) or any family's model, then ``baa.train(model, train_split)`` runs the
paper's three stages (dense, budgeted, hard) and returns the same :class:`Budgeted`. Everything
here is a thin layer over the library's modules (checkpoint, pruning, training, benchmark); the
CLI and the experiment pipeline use those modules directly.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from budgeted_attention import checkpoint
from budgeted_attention.benchmark.config import BenchConfig
from budgeted_attention.benchmark.runner import bench_ranking
from budgeted_attention.budget import validate_budget
from budgeted_attention.data.dataset import Split
from budgeted_attention.errors import ConfigError
from budgeted_attention.model.family import GatedModel
from budgeted_attention.pruning.selection import Ranking
from budgeted_attention.pruning.surgery import prune_to_budget
from budgeted_attention.pruning.switching import SlicedModel
from budgeted_attention.rundir import RunDir
from budgeted_attention.training.config import TrainConfig
from budgeted_attention.training.stages import train_budgeted, train_dense, train_hard

STAGES = ("dense", "budgeted", "hard")


@dataclass
class Budgeted:
    """One checkpoint's every operating point: a gated model and its nested unit ranking.

    Attributes:
        model: the gated model (any family), in eval mode.
        ranking: the nested order of its heads (and FFN groups) that budgets cut; None for a
            model trained without the hard stage (soft gates only: ``model(ids, budget=b)``).
        source: where it was loaded from (None when trained in this process).
    """

    model: GatedModel
    ranking: Ranking | None
    source: Path | None = None

    def _ranking(self) -> Ranking:
        if self.ranking is None:
            raise ConfigError(f"{self.source or 'this model'} has no unit ranking (not a budgeted-hard checkpoint): only soft budgets apply")
        return self.ranking

    def prune(self, budget: float) -> GatedModel:
        """A physically smaller copy that keeps the ranking's units of ``budget`` (in (0, 1])."""
        return prune_to_budget(copy.deepcopy(self.model), self._ranking(), validate_budget(budget)).eval()

    def sliced(self) -> SlicedModel:
        """A sorted copy serving any budget by prefix slicing (``set_budget`` switches in microseconds)."""
        return SlicedModel(self.model, self._ranking()).eval()  # SlicedModel sorts a copy

    def bench(
        self, budgets: Sequence[float] = (0.25, 0.5, 0.75), *, batch_sizes: Sequence[int] = (1,), seq_lens: Sequence[int] | None = None,
        threads: int = 1, rounds: int = 5, min_run_time: float = 0.2, progress: bool = False,
    ) -> dict[str, Any]:
        """CPU latency of the pruned models of ``budgets`` against the dense model, as ``baa bench``
        measures it (interleaved rounds, medians); the result's ``rows`` hold the speedups.
        ``seq_lens`` default: 128 tokens, or the model's ``max_len`` when shorter."""
        cfg = BenchConfig(
            budgets=[validate_budget(b) for b in budgets], batch_sizes=list(batch_sizes),
            seq_lens=list(seq_lens) if seq_lens else [min(128, self.model.max_len)],
            threads=threads, rounds=rounds, min_run_time=min_run_time,
        )
        return bench_ranking(self.model, self._ranking(), cfg, progress=progress)


def load(path: str | Path, *, seed: int | None = None) -> Budgeted:
    """A run directory (its ``budgeted-hard`` checkpoint; ``seed``: which seed's, default the
    first) or one checkpoint (``.safetensors`` or ``.json``) of any family, hash-checked."""
    target = Path(path)
    if target.is_dir():
        _, target = RunDir.locate(target, seed, command="baa experiment")
    model, description = checkpoint.load_model(target)
    ranking = checkpoint.load_ranking(target, description, model) if "ranking" in description else None
    return Budgeted(model.eval(), ranking, target)


def wrap(model: str | Path | nn.Module, num_labels: int | None = None, *, ffn_group_size: int = 0) -> GatedModel:
    """A BERT-family sequence classifier under budget gates: ``model`` is a transformers model,
    a local folder, a hub name (needs network) or ``"minilm"`` (the offline all-MiniLM-L6-v2).
    ``num_labels`` is required for a path; ``ffn_group_size`` > 0 puts the feed-forward neurons
    under the budget too, in groups of that many."""
    from budgeted_attention.hf.bert import GatedBertClassifier, load_gated_bert, minilm_path  # noqa: PLC0415 - transformers is optional

    if isinstance(model, nn.Module):
        return GatedBertClassifier(model, ffn_group_size=ffn_group_size)
    if num_labels is None:
        raise ConfigError(f"wrap('{model}') needs num_labels (the classifier head is new)")
    path = minilm_path() if str(model) == "minilm" else model
    return load_gated_bert(path, num_labels, ffn_group_size=ffn_group_size)


def save(model: GatedModel | Budgeted, path: str | Path) -> Path:
    """Write ``path`` (.safetensors) and its JSON description atomically; a :class:`Budgeted`
    keeps its ranking, so :func:`load` gives every budget back."""
    if isinstance(model, Budgeted):
        extra = {} if model.ranking is None else {"ranking": model.ranking.to_dict()}
        return checkpoint.save_model(model.model, path, **extra)
    return checkpoint.save_model(model, path)


def train(
    model: GatedModel, train_split: Split, *, config: TrainConfig | None = None, stages: Sequence[str] = STAGES, seed: int = 0,
    val: Split | None = None, seq_len: int | None = None, progress: bool = True,
) -> Budgeted:
    """Train ``model`` in place through the paper's stages and return it with its ranking.

    Args:
        train_split: :class:`~budgeted_attention.data.dataset.Split` of (N, T) ``input_ids``,
            ``attention_mask`` and (N,) ``labels``.
        config: step counts and loss weights (default :class:`TrainConfig`).
        stages: which of ``("dense", "budgeted", "hard")`` to run, always in that order (a model
            already trained dense can start at "budgeted"); the hard stage's ranking comes from
            the model's gates as they are when it starts.
        seq_len: the length at which budgets are turned into FLOPs (default the split's).
    """
    unknown = [s for s in stages if s not in STAGES]
    if unknown or not stages:
        raise ConfigError(f"stages must be a non-empty subset of {', '.join(STAGES)}, got {list(stages)!r}")
    cfg = config or TrainConfig()
    costs = model.unit_costs(seq_len or int(train_split.input_ids.shape[1]))
    if "dense" in stages:
        train_dense(model, train_split, cfg, seed=seed, progress=progress, val=val)
    if "budgeted" in stages:
        teacher = copy.deepcopy(model) if cfg.budget_sampling != "sandwich" else None
        train_budgeted(model, train_split, cfg, costs, seed=seed, teacher=teacher, progress=progress, val=val)
    ranking = None
    if "hard" in stages:
        ranking = Ranking.from_scores(model.unit_importance(), costs)
        train_hard(model, train_split, cfg, ranking, seed=seed, progress=progress, val=val)
    return Budgeted(model.eval(), ranking)


__all__ = ["Budgeted", "load", "save", "train", "wrap"]
