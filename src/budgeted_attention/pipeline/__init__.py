"""The experiment pipeline: config (:mod:`.config`), the resumable scheduler of units
(:mod:`.scheduler`), the methods as plugins (:mod:`.methods`, one module each) and the outputs
(:mod:`.outputs`).

Budget scope (``budget_scope``): ``heads`` (the paper) puts the attention heads under the
budget; ``all`` adds the feed-forward blocks as groups of ``ffn_group_size`` neurons, so b is the
fraction of the prunable forward FLOPs (heads and FFN) at ``reference_seq_len`` tokens. Every
result row records ``steps``, the optimiser steps from initialisation that produced it, and
``cost_kind``.
"""

from budgeted_attention.pipeline.config import (
    ExperimentConfig, config_digest, config_from_dict, load_experiment_config, unit_config_digest,
)
from budgeted_attention.pipeline.context import RunContext, evaluate_model, make_splits
from budgeted_attention.pipeline.methods import ALL_METHODS, METHODS, REGISTRY
from budgeted_attention.pipeline.methods.ladder import LADDER_KEYS
from budgeted_attention.pipeline.methods.routed import ROUTED_METHODS
from budgeted_attention.pipeline.scheduler import Experiment, run_config, run_experiment, seed_indices
from budgeted_attention.pipeline.units import UNIT_DIGEST_KEY, Unit, UnitId

__all__ = [
    "ALL_METHODS", "LADDER_KEYS", "METHODS", "REGISTRY", "ROUTED_METHODS", "UNIT_DIGEST_KEY", "Experiment", "ExperimentConfig",
    "RunContext", "Unit", "UnitId", "config_digest", "config_from_dict", "evaluate_model", "load_experiment_config", "make_splits",
    "run_config", "run_experiment", "seed_indices", "unit_config_digest",
]
