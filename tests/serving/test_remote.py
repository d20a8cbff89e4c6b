"""serve.engine_process: the model in a child process answers exactly as in the server's own."""

from __future__ import annotations

import os
import time

import pytest
import torch

from budgeted_attention.serving.config import ServeConfig
from budgeted_attention.serving.engine import Engine
from budgeted_attention.serving.remote import EngineProcessError, RemoteEngine

FAST = dict(freeze_gc=False, warmup_batches=0, calibration_batch_sizes=[1], max_texts=4, max_text_chars=200, max_batch_size=4)
TEXTS = ["shares fall as the market opens", "the team won the match", "a new phone"]


def wait_serving(app, seconds=120.0):
    """Wait until the app's engine answers (it loads in the background); fail with the reason if it does not."""
    deadline = time.monotonic() + seconds
    while not app.state.baa.serving() and app.state.baa.failed is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert app.state.baa.serving(), app.state.baa.failed


@pytest.fixture(scope="module")
def engines(tiny_run):
    cfg = ServeConfig(budgets=[0.25, 0.5, 1.0], **FAST)
    remote = RemoteEngine(tiny_run, cfg)
    yield Engine(tiny_run, cfg), remote
    remote.close()


def test_the_child_answers_as_the_engine_in_this_process(engines):
    local, remote = engines
    assert remote.pid not in (None, os.getpid())
    assert remote.metadata() == local.metadata()
    assert remote.describe()["labels"] == local.labels and remote.min_allowed_budget() == local.min_allowed_budget()
    ids = remote.tokenize(TEXTS)
    assert ids == local.tokenize(TEXTS)
    for budget in (0.25, 0.5, 1.0):
        assert torch.equal(remote.run(ids, budget), local.run(ids, budget))
    assert torch.equal(remote.classify(TEXTS, 1.0).probabilities, local.classify(TEXTS, 1.0).probabilities)


def test_the_int8_onnx_backend_answers_from_the_child_as_in_this_process(tiny_run, tmp_path):
    pytest.importorskip("onnxruntime", reason="the serve extra is not installed")
    from budgeted_attention.cli import main  # noqa: PLC0415

    assert main(["export", str(tiny_run), "--budget", "0.5,1", "--out", str(tmp_path / "onnx"), "--int8"]) == 0
    cfg = ServeConfig(budgets=[0.5, 1.0], min_budget=0.5, backend="onnxruntime", int8=True, **FAST)
    local, remote = Engine(tiny_run, cfg, onnx_dir=tmp_path / "onnx"), RemoteEngine(tiny_run, cfg, onnx_dir=tmp_path / "onnx")
    try:
        assert remote.describe()["runtime"] == local.runtime == "onnxruntime int8"
        ids = remote.tokenize(TEXTS)
        for budget in (0.5, 1.0):
            assert torch.equal(remote.run(ids, budget), local.run(ids, budget))
    finally:
        remote.close()


def test_a_failed_batch_is_reported_and_the_child_keeps_serving(engines):
    _, remote = engines
    with pytest.raises(EngineProcessError, match="failed a batch: IndexError"):
        remote.run([[10**9]], 1.0)  # a token id outside the vocabulary
    assert remote.run(remote.tokenize(TEXTS[:1]), 1.0).shape == (1, remote.n_classes)


def test_a_dead_child_fails_calls_loudly(tiny_run):
    remote = RemoteEngine(tiny_run, ServeConfig(budgets=[1.0], min_budget=1.0, **FAST))
    remote._process.kill()
    remote._process.join(10)
    with pytest.raises(EngineProcessError, match="exited|gone"):
        remote.run(remote.tokenize(TEXTS[:1]), 1.0)
    remote.close()


def test_a_child_killed_while_starting_fails_the_start_at_once(tiny_run):
    """on_spawn hands the engine over before the model loads (the supervisor's restart deadline
    kills a start that hangs): a start killed there fails at once instead of waiting 600 s."""
    from budgeted_attention.serving.remote import EngineGone  # noqa: PLC0415

    spawned = []
    started = time.monotonic()
    with pytest.raises(EngineGone, match="exited .* while starting"):
        RemoteEngine(tiny_run, ServeConfig(budgets=[1.0], min_budget=1.0, **FAST), on_spawn=lambda engine: (spawned.append(engine), engine.kill()))
    assert len(spawned) == 1 and not spawned[0].alive() and time.monotonic() - started < 30


def test_a_load_failure_in_the_child_names_the_problem(tmp_path):
    with pytest.raises(EngineProcessError, match="failed to load the model: .*budgeted-hard"):
        RemoteEngine(tmp_path, ServeConfig(**FAST))


def test_the_server_with_an_engine_process(tiny_run):
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    from fastapi.testclient import TestClient  # noqa: PLC0415

    from budgeted_attention.serving.app import create_app  # noqa: PLC0415

    app = create_app(tiny_run, ServeConfig(budgets=[0.5, 1.0], engine_process=True, **FAST))
    with TestClient(app) as client:
        wait_serving(app)
        info = client.get("/v1/info").json()
        assert info["engine_process"] is True
        body = client.post("/v1/classify", json={"texts": TEXTS[:2], "budget": 0.5}).json()
        assert body["budget"] == 0.5 and len(body["probabilities"]) == 2
        engine = app.state.baa.engine
        assert isinstance(engine, RemoteEngine)
    assert not engine._process.is_alive()  # shutdown stopped the child after the last batch


def test_a_dead_engine_process_is_restarted_without_an_operator(tiny_run):
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    from fastapi.testclient import TestClient  # noqa: PLC0415

    from budgeted_attention.serving.app import create_app  # noqa: PLC0415

    app = create_app(tiny_run, ServeConfig(budgets=[1.0], min_budget=1.0, **FAST))  # engine_process: the default
    with TestClient(app) as client:
        wait_serving(app)
        assert client.get("/readyz").status_code == 200
        first = app.state.baa.engine
        first._process.kill()
        first._process.join(10)
        response = client.get("/readyz")  # unready at once, not after the next heartbeat
        assert response.status_code == 503 and "engine process exited" in response.json()["error"]
        assert "Retry-After" in response.headers and client.get("/healthz").status_code == 200
        refused = client.post("/v1/classify", json={"texts": ["a"]})
        assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1
        deadline = time.monotonic() + 120
        while client.get("/readyz").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert app.state.baa.engine is not first and app.state.baa.engine.alive()
        assert client.post("/v1/classify", json={"texts": ["a"]}).status_code == 200
        assert "baa_engine_restarts_total 1.0" in client.get("/metrics").text
        assert client.get("/readyz").json()["restarts"] == 1


def test_the_server_process_leaves_the_engine_cpus_to_the_engine(tiny_run, monkeypatch):
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    from fastapi.testclient import TestClient  # noqa: PLC0415

    from budgeted_attention.serving import app as app_module, process  # noqa: PLC0415

    if not process.supported():
        pytest.skip("CPU pinning needs Linux")
    pinned = []
    monkeypatch.setattr(app_module, "pin_process", pinned.append)  # pinning pytest itself would slow the suite
    cpu = min(os.sched_getaffinity(0))
    app = app_module.create_app(tiny_run, ServeConfig(budgets=[1.0], min_budget=1.0, engine_cpus=[cpu], **FAST))
    with TestClient(app) as client:
        wait_serving(app)
        assert client.get("/v1/info").json()["engine_cpus"] == [cpu]
        assert os.sched_getaffinity(app.state.baa.engine.pid) == {cpu}
    assert pinned == [process.server_cpus([cpu])]


def test_the_server_freezes_the_garbage_collector_once_ready(tiny_run, monkeypatch):
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    from fastapi.testclient import TestClient  # noqa: PLC0415

    from budgeted_attention.serving import app as app_module  # noqa: PLC0415

    frozen = []
    monkeypatch.setattr(app_module, "freeze_garbage_collector", lambda: frozen.append(True))  # not pytest's own GC
    app = app_module.create_app(tiny_run, ServeConfig(budgets=[1.0], min_budget=1.0, **{**FAST, "freeze_gc": True}))
    with TestClient(app):
        wait_serving(app)
    assert len(frozen) == 1
