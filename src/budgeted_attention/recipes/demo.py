"""``baa demo``: the main job, an embedded experiment config run by the one pipeline.

The paper's headline on the synthetic marked-token task: one budgeted checkpoint evaluated at
every budget (accuracy vs cost), its hard-adapted, physically pruned versions and their
measured CPU speed, 2 seeds. About 5 minutes on 2 cores. A third seed, the from-scratch
ablation and the equal-steps dense control live in ``configs/demo_ablation.yaml``; all
baselines in ``configs/synthetic.yaml``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from budgeted_attention.config import deep_merge, load_yaml
from budgeted_attention.pipeline import ExperimentConfig, config_from_dict, run_config
from budgeted_attention.pipeline.config import split_quick

# The default demo (what `make demo` runs). b = 0.99 sits next to b = 1 to show there is no
# cliff at full budget; the hard stage and the speed benchmark use the budgets below 1.
DEMO_CONFIG: dict[str, Any] = {
    "name": "demo",
    "seeds": [0, 1],
    "methods": ["dense", "budgeted", "budgeted-hard"],
    "budgets": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.99, 1.0],
    "data": {"source": "synthetic"},
    "synthetic": {"seq_len": 16, "n_val": 1000, "n_test": 2000},
    "model": {"d_model": 64, "n_layers": 4, "n_heads": 4, "d_ff": 256, "max_len": 128, "pooling": "cls", "dropout": 0.0},
    "train": {"lr": 0.002, "dense_steps": 2000, "budgeted_steps": 800, "hard_steps": 1000, "hard_lr": 0.002},
    # Empty budgets: every sweep budget below 1 is pruned and timed.
    "bench": {"budgets": [], "batch_sizes": [1], "seq_lens": [128], "rounds": 3, "min_run_time": 0.1},
}

# A tiny model and a few hundred steps: the whole pipeline in well under a minute.
QUICK_CONFIG: dict[str, Any] = {
    "name": "quick",
    "seeds": [0, 1],
    "methods": ["dense", "budgeted", "budgeted-hard"],
    "budgets": [0.25, 0.5, 0.75, 0.99, 1.0],
    "data": {"source": "synthetic"},
    "synthetic": {"n_train": 2000, "n_val": 200, "n_test": 400, "seq_len": 12},
    "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64, "max_len": 32, "pooling": "cls", "dropout": 0.0},
    "train": {"dense_steps": 300, "budgeted_steps": 200, "hard_steps": 100, "batch_size": 32, "lr": 0.003},
    "bench": {"budgets": [0.5], "batch_sizes": [1], "seq_lens": [32], "rounds": 1, "min_run_time": 0.02},
}


def load_demo_config(path: str | None, overrides: list[str], quick: bool) -> ExperimentConfig:
    """The embedded demo (or quick) config, then the YAML file, then ``key=value`` overrides."""
    data = copy.deepcopy(QUICK_CONFIG if quick else DEMO_CONFIG)
    if path is not None:  # an experiment config's quick: section is its own variant, not the demo's --quick
        data = deep_merge(data, split_quick(load_yaml(path), path)[0])
    return config_from_dict(data, overrides)


def run_demo(cfg: ExperimentConfig, out_dir: str | Path, *, progress: bool = True, log=print) -> dict[str, Any]:
    """Run the demo config through the pipeline into ``out_dir``."""
    return run_config(cfg, out_dir, progress, log)
