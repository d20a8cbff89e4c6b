import pytest

from budgeted_attention.errors import ConfigError
from budgeted_attention.serving.cli import load_serve_config
from budgeted_attention.serving.config import ServeConfig, snap_to
from budgeted_attention.serving.process import supported

LINUX = pytest.mark.skipif(not supported(), reason="CPU pinning needs Linux")
ANY_CPU = min(__import__("os").sched_getaffinity(0)) if supported() else 0


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
        ({"engine_process": "yes"}, "serve.engine_process"),
        ({"engine_cpus": [-1]}, "serve.engine_cpus[0]"),
        ({"engine_cpus": "0"}, "serve.engine_cpus"),
        ({"max_connections": 0}, "serve.max_connections"),
        pytest.param({"engine_cpus": [0, 0]}, "serve.engine_cpus lists a CPU twice", marks=LINUX),
        pytest.param({"engine_cpus": [100000]}, "serve.engine_cpus: CPU 100000 is not one this process may run on", marks=LINUX),
        pytest.param({"engine_cpus": [ANY_CPU], "engine_process": False}, "serve.engine_cpus .* needs serve.engine_process", marks=LINUX),
    ],
)
def test_bad_settings_name_the_key(settings, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        ServeConfig(**settings)


def test_snap_to_rounds_down():
    cfg = ServeConfig(budgets=[0.25, 0.5, 1.0])
    assert [snap_to(b, cfg.budgets) for b in (0.1, 0.25, 0.6, 0.99, 1.0)] == [0.25, 0.25, 0.5, 0.5, 1.0]


def test_yaml_file_and_overrides(tmp_path):
    path = tmp_path / "serve.yaml"
    path.write_text("serve:\n  target_p95_ms: 40\n  budgets: [0.5, 1.0]\n")
    cfg = load_serve_config(str(path), ["serve.max_wait_ms=2", "min_budget=0.5"], backend="onnxruntime")
    assert (cfg.target_p95_ms, cfg.max_wait_ms, cfg.min_budget, cfg.backend) == (40.0, 2.0, 0.5, "onnxruntime")
    with pytest.raises(ConfigError, match="unknown"):
        load_serve_config(None, ["max_wiat_ms=2"])


def test_floor_budget_from_min_budget_and_validation_accuracy():
    from budgeted_attention.serving.engine import floor_budget

    cfg = ServeConfig(budgets=[0.25, 0.5, 1.0], min_budget=0.3)
    assert floor_budget(cfg, {}) == 0.5  # the smallest configured budget at or above min_budget
    cfg = ServeConfig(budgets=[0.25, 0.5, 1.0], min_budget=0.25, min_accuracy=0.9)
    assert floor_budget(cfg, {0.25: 0.85, 0.5: 0.91, 1.0: 0.95}) == 0.5
    with pytest.raises(ConfigError, match="met by no budget"):
        floor_budget(cfg, {0.25: 0.5, 0.5: 0.6, 1.0: 0.7})


def test_min_accuracy_that_no_budget_meets_fails_before_start_up(tiny_run, capsys, monkeypatch):
    from budgeted_attention.cli import main
    from budgeted_attention.serving import engine

    monkeypatch.setattr(engine, "validation_accuracy", lambda run_dir, seed: {0.25: 0.5, 0.5: 0.6, 1.0: 0.7})
    assert main(["serve", str(tiny_run), "--set", "min_accuracy=0.9"]) == 2
    assert "serve.min_accuracy (0.9) is met by no budget" in capsys.readouterr().err


def test_check_port_binds_every_address_the_host_resolves_to(monkeypatch):
    """'localhost' may resolve to ::1 first; uvicorn binds 127.0.0.1 as well, so a port busy there
    must be found even when it is free on ::1."""
    import socket

    from budgeted_attention.serving.cli import check_port

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        answers = [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", port, 0, 0)), (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]
        monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: answers)
        with pytest.raises(ConfigError, match=f"--port {port}: localhost:{port} is already in use"):
            check_port("localhost", port)
