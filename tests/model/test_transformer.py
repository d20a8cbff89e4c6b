import pytest
import torch

from budgeted_attention.errors import ConfigError
from budgeted_attention.model.config import ModelConfig
from budgeted_attention.model.transformer import EncoderClassifier

from conftest import tiny_config


def test_full_budget_equals_no_gating(tiny_model, tiny_ids):
    with torch.no_grad():
        ungated = tiny_model(tiny_ids)
        at_one = tiny_model(tiny_ids, budget=1.0)
        ones = tiny_model(tiny_ids, gates=torch.ones(3, 4))
    assert torch.equal(ungated, at_one)
    assert torch.equal(ungated, ones)


def test_gates_change_output_below_full_budget(tiny_model, tiny_ids):
    with torch.no_grad():
        assert not torch.allclose(tiny_model(tiny_ids), tiny_model(tiny_ids, budget=0.3))


def test_shapes_and_invalid_budget(tiny_model, tiny_ids):
    assert tiny_model(tiny_ids).shape == (5, 3)
    with pytest.raises(ValueError, match="budget"):
        tiny_model(tiny_ids, budget=0.0)
    with pytest.raises(ValueError, match="max_len"):
        tiny_model(torch.zeros(1, 17, dtype=torch.long))


def test_padding_mask_makes_padded_tokens_irrelevant(tiny_ids):
    torch.manual_seed(0)
    model = EncoderClassifier(tiny_config(pooling="mean")).eval()
    mask = torch.ones_like(tiny_ids)
    mask[:, 7:] = 0
    other = tiny_ids.clone()
    other[:, 7:] = 0
    with torch.no_grad():
        assert torch.allclose(model(tiny_ids, mask), model(other, mask), atol=1e-6)
        assert torch.allclose(model(tiny_ids, mask), model(tiny_ids[:, :7]), atol=1e-5)


def test_lean_executor_has_same_logits(tiny_model, tiny_ids):
    with torch.no_grad():
        assert torch.allclose(tiny_model.eval().inference_module()(tiny_ids), tiny_model(tiny_ids), atol=1e-5)


def test_attention_only_model_runs(tiny_ids):
    model = EncoderClassifier(tiny_config(d_ff=0)).eval()
    assert model(tiny_ids, budget=0.5).shape == (5, 3)


@pytest.mark.parametrize(
    "kwargs, message",
    [({"d_model": 30, "n_heads": 4}, "divisible"), ({"pooling": "max"}, "pooling"), ({"heads_per_layer": [1, 2]}, "heads_per_layer"), ({"n_layers": 0}, "n_layers")],
)
def test_bad_model_config(kwargs, message):
    base = dict(vocab_size=10, n_classes=2)
    base.update(kwargs)
    with pytest.raises(ConfigError, match=message):
        ModelConfig(**base)
