"""The pipeline's config checks ask the family registry (capabilities), not lists of names."""

from __future__ import annotations

import pytest

from budgeted_attention.errors import ConfigError
from budgeted_attention.pipeline import config_from_dict


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"model_family": "gpt9"}, "model_family must be one of encoder, bert, decoder, hf-decoder, hf-decoder-classifier, got 'gpt9'"),
        ({"model_family": "bert", "methods": ["dense", "ladder"], "ladder": [{"d_model": 16}]}, "method 'ladder' needs model_family 'encoder' or 'decoder'"),
        ({"methods": ["dense", "budgetformer"], "budget_scope": "all"}, "model_family 'encoder' or 'bert' with budget_scope 'heads'"),
        ({"task": "lm", "model_family": "encoder"}, "task 'lm' needs model_family 'decoder'"),
    ],
)
def test_family_capability_errors_name_the_value(data, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict({"seeds": [0], **data})


def test_straight_through_gates_with_a_sandwich_method_are_refused_before_any_training():
    data = {"seeds": [0], "methods": ["dense", "budgeted-sandwich"], "train": {"gate_forward": "straight-through"}}
    with pytest.raises(ConfigError, match="straight-through.*budgeted-sandwich use the sandwich rule"):
        config_from_dict(data)
