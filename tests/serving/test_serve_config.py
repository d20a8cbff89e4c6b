import pytest

from budgeted_attention.errors import ConfigError
from budgeted_attention.serving.cli import load_serve_config
from budgeted_attention.serving.config import ServeConfig


def test_defaults_are_valid_and_budgets_sorted():
    cfg = ServeConfig(budgets=[1.0, 0.25, 0.5])
    assert cfg.budgets == [0.25, 0.5, 1.0]
    assert cfg.calibration_batch_sizes == [1, 4, 16]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"backend": "tensorrt"}, "serve.backend"),
        ({"policy": "fast"}, "serve.policy"),
        ({"budgets": [0.5, 1.5]}, "serve.budgets[1]"),
        ({"budgets": []}, "serve.budgets"),
        ({"max_batch_size": 0}, "serve.max_batch_size"),
        ({"max_queue": 8, "max_texts": 16}, "serve.max_queue"),
        ({"min_budget": 1.0, "budgets": [0.25, 0.5]}, "serve.min_budget"),
        ({"target_p95_ms": 0}, "serve.target_p95_ms"),
        ({"min_accuracy": 1.5}, "serve.min_accuracy"),
        ({"shed_expired": "yes"}, "serve.shed_expired"),
    ],
)
def test_bad_settings_name_the_key(settings, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        ServeConfig(**settings)


def test_snap_budget_rounds_down():
    cfg = ServeConfig(budgets=[0.25, 0.5, 1.0])
    assert [cfg.snap_budget(b) for b in (0.1, 0.25, 0.6, 0.99, 1.0)] == [0.25, 0.25, 0.5, 0.5, 1.0]


def test_yaml_file_and_overrides(tmp_path):
    path = tmp_path / "serve.yaml"
    path.write_text("serve:\n  target_p95_ms: 40\n  budgets: [0.5, 1.0]\n")
    cfg = load_serve_config(str(path), ["serve.max_wait_ms=2", "min_budget=0.5"], backend="onnxruntime")
    assert (cfg.target_p95_ms, cfg.max_wait_ms, cfg.min_budget, cfg.backend) == (40.0, 2.0, 0.5, "onnxruntime")
    with pytest.raises(ConfigError, match="unknown"):
        load_serve_config(None, ["max_wiat_ms=2"])
