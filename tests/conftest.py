"""Shared fixtures: tiny offline models and data so the suite runs in seconds."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from budgeted_attention.model.config import ModelConfig
from budgeted_attention.model.transformer import EncoderClassifier
from budgeted_attention.pipeline import Experiment, load_experiment_config


def tiny_config(**overrides) -> ModelConfig:
    base = dict(vocab_size=29, n_classes=3, max_len=16, d_model=32, n_layers=3, n_heads=4, d_ff=48)
    base.update(overrides)
    return ModelConfig(**base)


def randomize_gates(model: EncoderClassifier, seed: int = 0) -> None:
    """Give gates distinct values so rankings and equalities are non-trivial."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.gates.bias.copy_(torch.randn(model.gates.bias.shape, generator=gen))
        model.gates.slope_raw.copy_(torch.randn(model.gates.slope_raw.shape, generator=gen))


@pytest.fixture
def tiny_model() -> EncoderClassifier:
    torch.manual_seed(0)
    model = EncoderClassifier(tiny_config())
    # Non-zero biases so that an empty layer's constant output is actually exercised.
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv_bias.normal_(std=0.1)
            block.attn.out_bias.normal_(std=0.1)
    randomize_gates(model)
    return model.eval()


@pytest.fixture
def tiny_ids() -> torch.Tensor:
    return torch.randint(0, 29, (5, 11), generator=torch.Generator().manual_seed(1))


# A tiny trained run directory (whole-model budget scope): the serving and export tests.
FIXTURES = Path(__file__).parent / "fixtures"

# The data and model sections of the tiny experiments (fixture AG News CSVs, a 2 x 2-head encoder).
TINY_DATA_AND_MODEL = f"""data:
  source: ag_news
  train_file: {FIXTURES / "ag_news_train.csv"}
  test_file: {FIXTURES / "ag_news_test.csv"}
  max_len: 12
  min_frequency: 1
  val_fraction: 0.25
model: {{d_model: 16, n_layers: 2, n_heads: 2, d_ff: 32, max_len: 16, dropout: 0.0}}"""

TINY_RUN = f"""
name: tiny-serve
seeds: [0]
methods: [dense, budgeted, budgeted-hard]
budgets: [0.25, 0.5, 1.0]
budget_scope: all
ffn_group_size: 8
{TINY_DATA_AND_MODEL}
train: {{dense_steps: 6, budgeted_steps: 6, hard_steps: 4, batch_size: 8}}
bench: {{rounds: 1, min_run_time: 0.005, batch_sizes: [1]}}
"""


def make_tiny_run(folder: Path) -> Path:
    config = folder / "tiny.yaml"
    config.write_text(TINY_RUN)
    out = folder / "run"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fixture CSV's deliberately malformed rows
        Experiment(load_experiment_config(str(config)), out, progress=False, log=lambda *_: None).run()
    return out


@pytest.fixture
def tiny_data_and_model() -> str:
    """YAML of the tiny experiments' data and model sections (to build other tiny configs)."""
    return TINY_DATA_AND_MODEL


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    return make_tiny_run(tmp_path_factory.mktemp("serve"))
