import pytest

from budgeted_attention.config import apply_overrides, from_dict, load_yaml
from budgeted_attention.errors import ConfigError
from budgeted_attention.recipes.demo import DemoConfig, load_demo_config


def test_unknown_key_is_named():
    with pytest.raises(ConfigError, match="demo.trian"):
        from_dict(DemoConfig, {"trian": {}}, "demo")


def test_wrong_type_is_named():
    with pytest.raises(ConfigError, match="demo.train.lr"):
        from_dict(DemoConfig, {"train": {"lr": "fast"}}, "demo")


def test_bad_budget_in_config():
    with pytest.raises(ConfigError, match="1.5"):
        from_dict(DemoConfig, {"budgets": [0.5, 1.5]}, "demo")


def test_yaml_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  d_model: 48\n  n_heads: 3\ntrain:\n  dense_steps: 7\n")
    cfg = load_demo_config(str(path), ["train.budgeted_steps=9", "seeds=[4]"], quick=True)
    assert cfg.model.d_model == 48 and cfg.model.head_dim == 16
    assert cfg.train.dense_steps == 7 and cfg.train.budgeted_steps == 9 and cfg.seeds == [4]


def test_missing_and_malformed_yaml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_yaml(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_yaml(bad)
    with pytest.raises(ConfigError, match="key=value"):
        apply_overrides({}, ["novalue"])
