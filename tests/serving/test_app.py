import importlib.util
import json
import time

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed")
from fastapi.testclient import TestClient  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from budgeted_attention.serving.app import ClassifyRequest, create_app  # noqa: E402
from budgeted_attention.serving.config import ServeConfig  # noqa: E402
from budgeted_attention.serving.fuzz import encode_body, request_bodies  # noqa: E402

# The model in this process (engine_process off): the in-process branch, and fast to start;
# tests/serving/test_remote.py covers the server with its engine process (the default).
FAST = dict(freeze_gc=False, warmup_batches=0, calibration_batch_sizes=[1], max_texts=4, max_text_chars=200, max_batch_size=4, engine_process=False)


def wait_ready(client, seconds=60.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        response = client.get("/readyz")
        if response.status_code == 200:
            return response
        assert response.status_code == 503
        time.sleep(0.05)
    raise AssertionError("server never became ready")


BUDGETS = [0.25, 0.5, 1.0]
# Every test on `client` runs on each backend: PyTorch, ONNX Runtime float and ONNX Runtime int8
# (the graphs of `baa export [--int8]`), so the int8 server passes what the float ones pass.
NEEDS_ORT = pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None, reason="the serve extra (onnxruntime) is not installed")
BACKENDS = {
    "torch": ({}, "lean copy (CompactEncoder)"),
    "onnxruntime": ({"backend": "onnxruntime"}, "onnxruntime"),
    "onnxruntime-int8": ({"backend": "onnxruntime", "int8": True}, "onnxruntime int8"),
}


@pytest.fixture(scope="module")
def graphs(tiny_run, tmp_path_factory):
    """The run's float and int8 ONNX graphs of every budget, as `baa export --int8` writes them."""
    from budgeted_attention.cli import main  # noqa: PLC0415

    out = tmp_path_factory.mktemp("graphs")
    assert main(["export", str(tiny_run), "--budget", ",".join(f"{b:g}" for b in BUDGETS), "--out", str(out), "--int8"]) == 0
    return out


@pytest.fixture(scope="module", params=[name if name == "torch" else pytest.param(name, marks=NEEDS_ORT) for name in BACKENDS])
def client(request, tiny_run):
    options, _ = BACKENDS[request.param]
    onnx_dir = request.getfixturevalue("graphs") if options else None
    app = create_app(tiny_run, ServeConfig(budgets=BUDGETS, **options, **FAST), onnx_dir=onnx_dir)
    with TestClient(app) as c:
        wait_ready(c)
        c.backend = request.param
        yield c


def test_health_ready_and_info(client, tiny_run):
    assert client.get("/healthz").json() == {"status": "ok"}
    info = client.get("/v1/info").json()
    assert info["budgets"] == BUDGETS
    assert info["runtime"] == BACKENDS[client.backend][1]
    assert info["labels"] == json.loads((tiny_run / "labels.json").read_text())["class_names"]
    assert set(info["latency_model"]["table_ms"]) == {"0.25", "0.5", "1.0"}
    assert set(info["validation_accuracy"]) == {"0.25", "0.5", "1.0"}  # from results.json, never test


def test_classify_at_a_budget_matches_the_pruned_model(client, tiny_run, request):
    import torch

    from budgeted_attention.checkpoint import load_model, load_ranking
    from budgeted_attention.pruning.surgery import prune_to_budget
    from budgeted_attention.serving.config import ServeConfig
    from budgeted_attention.serving.engine import Engine

    texts = ["shares fall as the market opens", "the team won the match"]
    body = client.post("/v1/classify", json={"texts": texts, "budget": 0.5}).json()
    assert body["budget"] == 0.5 and body["policy"] == "explicit" and len(body["probabilities"]) == 2
    assert 0 < body["estimated_cost"] <= 0.5 + 1e-9
    engine = Engine(tiny_run, ServeConfig(**FAST))
    checkpoint = tiny_run / "checkpoints" / "seed0" / "budgeted-hard.json"
    model, description = load_model(checkpoint)
    pruned = prune_to_budget(model, load_ranking(checkpoint, description, model), 0.5)
    ids, mask = engine.pad(engine.tokenize(texts))
    with torch.no_grad():
        expected = torch.softmax(pruned(ids, mask), dim=-1)
    if client.backend == "onnxruntime-int8":  # the quantized graph's own answer (int8 rounding moves it from PyTorch's)
        from budgeted_attention.export.onnx import graph_path, make_session  # noqa: PLC0415

        session = make_session(graph_path(request.getfixturevalue("graphs"), 0.5, int8=True))
        expected = torch.softmax(torch.from_numpy(session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]), dim=-1)
    assert torch.allclose(torch.tensor(body["probabilities"]), expected, atol=1e-5)
    assert body["labels"] == [engine.labels[i] for i in expected.argmax(-1).tolist()]


def test_budgets_snap_down_to_a_configured_one(client):
    assert client.post("/v1/classify", json={"texts": ["a"], "budget": 0.7}).json()["budget"] == 0.5
    assert client.post("/v1/classify", json={"texts": ["a"], "budget": 0.1}).json()["budget"] == 0.25


def test_deadline_and_policy_requests(client):
    body = client.post("/v1/classify", json={"texts": ["a"], "latency_ms": 5000}).json()
    assert body["policy"] == "deadline" and body["budget"] == 1.0
    assert client.post("/v1/classify", json={"texts": ["a"]}).json()["policy"] == "slo"


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ('{"texts": [', 400, "malformed JSON"),
        ({"texts": []}, 422, "texts"),
        ({"texts": ["a"], "budget": 0}, 422, "budget"),
        ({"texts": ["a"], "budget": 1.5}, 422, "budget"),
        ({"texts": ["a"], "budget": "0.5"}, 422, "budget"),
        ({"texts": ["a"], "budget": True}, 422, "budget"),
        ({"texts": [1]}, 422, "texts.0"),
        ({"texts": "a"}, 422, "texts"),
        ({"texts": ["a"], "foo": 1}, 422, "foo: unknown field"),
        ({"texts": ["a"], "budget": 0.5, "latency_ms": 10}, 422, "not both"),
        ({"texts": ["a"], "latency_ms": -1}, 422, "latency_ms"),
        ({"texts": ["a"] * 5}, 413, "serve.max_texts"),
        ({"texts": [1] * 5}, 413, "texts: 5 texts, the limit is serve.max_texts = 4"),  # refused before each text is checked
        ({"texts": ["x" * 201]}, 413, "texts[0]"),
        ([1, 2], 422, "body"),
    ],
)
def test_bad_requests_get_a_4xx_naming_the_problem(client, body, status, message):
    if isinstance(body, str):
        response = client.post("/v1/classify", content=body, headers={"content-type": "application/json"})
    else:
        response = client.post("/v1/classify", json=body)
    assert response.status_code == status
    assert message in response.json()["error"]


def test_metrics_count_requests_budgets_and_queue(client):
    client.post("/v1/classify", json={"texts": ["a", "b"], "budget": 0.25})
    client.post("/v1/classify", json={"texts": []})
    text = client.get("/metrics").text
    assert 'baa_requests_total{status="200"}' in text and 'baa_requests_total{status="422"}' in text
    assert 'baa_texts_total{budget="0.25"}' in text
    assert "baa_queue_texts" in text and "baa_budget_in_use" in text and "baa_request_latency_seconds_bucket" in text


def test_a_failing_heartbeat_check_does_not_stop_the_heartbeat(tiny_run):
    app = create_app(tiny_run, ServeConfig(budgets=[1.0], min_budget=1.0, heartbeat_s=0.02, **FAST))
    with TestClient(app) as client:
        wait_ready(client)
        calls = []

        def check():
            calls.append(1)
            if len(calls) <= 2:
                raise RuntimeError("a bug in one check")

        app.state.baa.supervisor.check = check
        deadline = time.monotonic() + 5
        while len(calls) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(calls) >= 4


def test_openapi_schema_lists_the_routes(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/classify", "/healthz", "/readyz", "/metrics", "/v1/info"} <= set(paths)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=request_bodies(ClassifyRequest.model_json_schema()))
def test_fuzzed_bodies_never_get_a_5xx(client, body):
    # NaN / Infinity are not JSON: they must give a 4xx too
    response = client.post("/v1/classify", content=encode_body(body), headers={"content-type": "application/json"})
    assert response.status_code in (200, 400, 413, 422, 503), response.text
    if response.status_code != 200:
        assert response.json()["error"]


def test_the_fuzz_reaches_surrogates_and_control_characters():
    from hypothesis import find  # noqa: PLC0415

    from budgeted_attention.serving.fuzz import texts  # noqa: PLC0415

    # Derandomized, no example database, a generous search: the same answer on every run and machine.
    search = settings(max_examples=2000, database=None, derandomize=True)
    assert find(texts(5), lambda t: any(0xD800 <= ord(c) <= 0xDFFF for c in t), settings=search)
    assert find(texts(5), lambda t: any(ord(c) < 32 for c in t), settings=search)


def test_control_characters_are_text_and_lone_surrogates_a_422(client):
    assert client.post("/v1/classify", json={"texts": ["tab\there\x00nul\x1b[31m"]}).status_code == 200
    response = client.post("/v1/classify", content=b'{"texts": ["ok", "\\udfff alone"]}', headers={"content-type": "application/json"})
    assert response.status_code == 422 and response.json() == {"error": "texts: texts[1] is not valid Unicode: lone surrogate U+DFFF at character 0"}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=40))
def test_fuzzed_bytes_never_get_a_5xx(client, raw):
    response = client.post("/v1/classify", content=raw, headers={"content-type": "application/json"})
    assert response.status_code in (200, 400, 422)


def test_not_ready_answers_503_with_retry_after(tiny_run):
    app = create_app(tiny_run, ServeConfig(**FAST))
    with TestClient(app) as c:
        response = c.post("/v1/classify", json={"texts": ["a"]})
        if response.status_code == 503:  # still loading (the usual case this early)
            assert response.headers["Retry-After"] == "1"
        wait_ready(c)


def test_a_run_that_fails_to_load_reports_it_on_readyz(tmp_path):
    app = create_app(tmp_path / "missing", ServeConfig(**FAST))
    with TestClient(app) as c:
        for _ in range(100):
            response = c.get("/readyz")
            if "run directory not found" in response.text:
                break
            time.sleep(0.05)
        assert response.status_code == 503 and "run directory not found: 'missing'" in response.json()["error"]
        assert str(tmp_path) not in response.text  # no absolute paths in error bodies by default
        health = c.get("/healthz")  # a model that cannot load is not coming back: the orchestrator should replace us
        assert health.status_code == 503 and "failed to load" in health.json()["error"]


def test_an_unexpected_error_is_a_json_500_and_counted(tiny_run):
    from budgeted_attention.serving.engine import Engine

    class Failing(Engine):
        def tokenize(self, texts):
            raise RuntimeError("tokenizer bug")

    app = create_app(tiny_run, ServeConfig(**FAST), engine=Failing(tiny_run, ServeConfig(**FAST)))
    with TestClient(app, raise_server_exceptions=False) as c:
        wait_ready(c)
        response = c.post("/v1/classify", json={"texts": ["a"]})
        assert response.status_code == 500 and response.json() == {"error": "internal error: RuntimeError"}
        assert 'baa_requests_total{status="500"}' in c.get("/metrics").text
