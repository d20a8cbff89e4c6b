import math

import pytest

from budgeted_attention.config import apply_overrides, from_dict, load_yaml, parse_yaml, validate_run_name, validate_seeds
from budgeted_attention.data.sources import DataSourceConfig
from budgeted_attention.data.text import TextDataConfig
from budgeted_attention.errors import ConfigError
from budgeted_attention.model.config import ModelConfig
from budgeted_attention.recipes.demo import load_demo_config
from budgeted_attention.pipeline import ExperimentConfig as DemoConfig


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


# --------------------------------------------------------------------------- early validation

@pytest.mark.parametrize(
    "yaml_text, fragment",
    [
        ("bench:\n  batch_sizes: []\n", "bench.batch_sizes"),
        ("bench:\n  threads: 0\n", "bench.threads"),
        ("bench:\n  budgets: [.nan]\n", "nan"),
        ("train:\n  distill_temperature: 0\n", "train.distill_temperature"),
        ("train:\n  grad_clip: .inf\n", "train.grad_clip"),
        ("train:\n  warmup_frac: 1.0\n", "train.warmup_frac"),
        ("model:\n  dropout: .nan\n", "model.dropout"),
    ],
)
def test_demo_yaml_bad_values_fail_before_training(tmp_path, yaml_text, fragment):
    path = tmp_path / "c.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError) as info:
        load_demo_config(str(path), [], quick=True)
    assert fragment in str(info.value)


def test_yaml_file_with_exponent_floats(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  lr: 1e-3\n  gate_lr: 2E-2\n  weight_decay: .5\n  overshoot_margin: -2.5e-1\n")
    cfg = load_demo_config(str(path), [], quick=True)
    assert cfg.train.lr == 0.001 and cfg.train.gate_lr == 0.02
    assert cfg.train.weight_decay == 0.5 and cfg.train.overshoot_margin == -0.25


def test_override_exponent_float_is_a_float():
    assert apply_overrides({}, ["train.lr=1e-3"]) == {"train": {"lr": 0.001}}
    cfg = load_demo_config(None, ["train.lr=1e-3"], quick=True)
    assert cfg.train.lr == 0.001
    # 2e1 is a float, never silently an int: the integer key refuses it.
    with pytest.raises(ConfigError, match="train.dense_steps"):
        load_demo_config(None, ["train.dense_steps=2e1"], quick=True)


@pytest.mark.parametrize(
    "text, expected",
    [("1e-3", 0.001), ("1E5", 100000.0), (".5", 0.5), ("-2.5e-1", -0.25), ("+.5", 0.5), ("7", 7), ("-3", -3), ("1_000", 1000)],
)
def test_number_forms(text, expected):
    value = parse_yaml(text)
    assert value == expected and type(value) is type(expected)


def test_nan_and_inf_still_parse_then_fail_validation():
    assert math.isnan(parse_yaml(".nan")) and parse_yaml("-.inf") == -math.inf
    with pytest.raises(ConfigError, match="train.lr"):
        load_demo_config(None, ["train.lr=.nan"], quick=True)


def test_plain_safe_load_is_unchanged():
    import yaml

    assert yaml.safe_load("1e-3") == "1e-3"  # only our loader reads it as a float


def test_bool_is_never_a_float():
    with pytest.raises(ConfigError, match="demo.train.lr"):
        from_dict(DemoConfig, {"train": {"lr": True}}, "demo")
    with pytest.raises(ConfigError, match="demo.budgets"):
        from_dict(DemoConfig, {"budgets": [True]}, "demo")


def test_validate_seeds():
    assert validate_seeds([3, 1, 2]) == [3, 1, 2]
    with pytest.raises(ConfigError, match="seeds.*listed twice"):
        validate_seeds([0, 1, 0])
    with pytest.raises(ConfigError, match="at least one"):
        validate_seeds([])
    with pytest.raises(ConfigError, match=r"experiment.seeds\[1\]"):
        validate_seeds([0, True], key="experiment.seeds")
    with pytest.raises(ConfigError, match=r"seeds\[0\]"):
        validate_seeds([1.5])
    with pytest.raises(ConfigError, match="seeds"):
        validate_seeds("012")


@pytest.mark.parametrize("bad", ["../x", "..", ".", "", "a/b", ".hidden", "a b", "x..y", "r\u00e9sum\u00e9", None, 3])
def test_validate_run_name_rejects(bad):
    with pytest.raises(ConfigError, match="name"):
        validate_run_name(bad)


@pytest.mark.parametrize("good", ["bbc_short", "run-1.v2", "A9"])
def test_validate_run_name_accepts(good):
    assert validate_run_name(good) == good


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"dropout": math.nan}, "model.dropout"),
        ({"pad_id": 64}, "model.pad_id"),
        ({"pad_id": -1}, "model.pad_id"),
        ({"n_layers": True}, "model.n_layers"),
        ({"d_ff": -1}, "model.d_ff"),
        ({"head_dim": -4}, "model.head_dim"),
    ],
)
def test_model_config_rejects(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        ModelConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"source": "csv", "text_columns": ["t"]}, "data.train_file"),
        ({"source": "csv", "train_file": "a.csv"}, "data.text_columns"),
        ({"source": "csv", "train_file": "a.csv", "text_columns": ["t"], "delimiter": ";;"}, "data.delimiter"),
        ({"source": "ag_news", "test_file": "t.csv"}, "data.train_file"),
        ({"label_column": ""}, "data.label_column"),
        ({"use_hub": "yes"}, "data.use_hub"),
    ],
)
def test_data_source_config_rejects(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        DataSourceConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"val_fraction": math.nan}, "data.val_fraction"),
        ({"test_fraction": math.inf}, "data.test_fraction"),
        ({"n_per_class": -1}, "data.n_per_class"),
        ({"n_test_per_class": -1}, "data.n_test_per_class"),
        ({"min_frequency": -1}, "data.min_frequency"),
        ({"max_vocab": 3}, "data.max_vocab"),
        ({"max_len": 1}, "data.max_len"),
    ],
)
def test_text_data_config_rejects(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        TextDataConfig(**kwargs)
