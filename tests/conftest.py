"""Shared fixtures: tiny offline models and data so the suite runs in seconds."""

from __future__ import annotations

import pytest
import torch

from budgeted_attention.model.config import ModelConfig
from budgeted_attention.model.transformer import EncoderClassifier


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
