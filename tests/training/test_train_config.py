"""TrainConfig validates every value on construction (named ``tests/training/test_train_config.py``:
tests/ has no ``__init__.py`` files, so test module basenames must be unique)."""

import math

import pytest

from budgeted_attention.config import from_dict, load_yaml
from budgeted_attention.errors import ConfigError
from budgeted_attention.training.config import TrainConfig


@pytest.mark.parametrize(
    "key, value",
    [
        ("distill_temperature", 0.0),
        ("distill_temperature", -1.0),
        ("grad_clip", math.inf),
        ("grad_clip", -0.1),
        ("warmup_frac", 1.0),
        ("warmup_frac", -0.01),
        ("warmup_frac", math.nan),
        ("lr", math.nan),
        ("gate_lr", math.inf),
        ("hard_lr", 0.0),
        ("weight_decay", -0.01),
        ("weight_decay", math.nan),
        ("overshoot_weight", -1.0),
        ("overshoot_margin", math.nan),
        ("overshoot_margin", -math.inf),
        ("gate_mass_weight", math.inf),
        ("polarization_weight", -0.5),
        ("distill_weight", math.nan),
        ("budget_min", math.nan),
        ("budget_max", 1.5),
        ("batch_size", 0),
        ("eval_batch_size", -3),
        ("dense_steps", -1),
        ("recovery_steps", -5),
        ("batch_size", True),
        ("gate_forward", "hard"),
        ("freeze_embeddings", "yes"),
        ("gate_init", "random"),
        ("hard_budget_min", 0.0),
        ("hard_budget_min", 1.5),
    ],
)
def test_bad_value_is_named(key, value):
    with pytest.raises(ConfigError) as info:
        TrainConfig(**{key: value})
    message = str(info.value)
    assert f"train.{key}" in message and repr(value) in message


def test_budget_min_above_max():
    with pytest.raises(ConfigError, match="budget_min"):
        TrainConfig(budget_min=0.8, budget_max=0.5)


def test_straight_through_needs_single_budget_sampling():
    with pytest.raises(ConfigError, match="gate_forward.*sandwich"):
        TrainConfig(gate_forward="straight-through", budget_sampling="sandwich")


def test_edge_values_are_accepted():
    cfg = TrainConfig(grad_clip=0.0, warmup_frac=0.0, weight_decay=0.0, overshoot_margin=-0.05, distill_weight=0.0, dense_steps=0)
    assert cfg.grad_clip == 0.0 and cfg.overshoot_margin == -0.05


@pytest.mark.parametrize("text, key", [("distill_temperature: 0", "distill_temperature"),
                                       ("grad_clip: .inf", "grad_clip"),
                                       ("warmup_frac: 1.0", "warmup_frac"),
                                       ("lr: .nan", "lr")])
def test_bad_yaml_values_are_rejected(tmp_path, text, key):
    path = tmp_path / "t.yaml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError, match=f"train.{key}"):
        from_dict(TrainConfig, load_yaml(path), "train")


def test_yaml_exponent_floats(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("lr: 1e-3\ngate_lr: 2E-2\nhard_lr: .5e-3\nweight_decay: 1e-2\ndense_steps: 10\n")
    cfg = from_dict(TrainConfig, load_yaml(path), "train")
    assert cfg.lr == 0.001 and cfg.gate_lr == 0.02 and cfg.hard_lr == 0.0005 and cfg.weight_decay == 0.01
    assert cfg.dense_steps == 10 and isinstance(cfg.dense_steps, int)


def test_bool_is_not_a_number():
    with pytest.raises(ConfigError, match="train.lr"):
        from_dict(TrainConfig, {"lr": True}, "train")
    cfg = from_dict(TrainConfig, {"lr": 1}, "train")
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float)
