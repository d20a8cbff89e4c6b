"""The HTTP API of ``baa serve`` (FastAPI).

* ``POST /v1/classify``: ``{"texts": [...], "budget": b}``, ``{"texts": [...], "latency_ms": d}``
  or ``{"texts": [...]}`` (server policy) -> labels, class probabilities, the budget used and its
  estimated cost.
* ``GET /healthz`` (the process is alive), ``GET /readyz`` (model loaded and latency calibrated),
  ``GET /metrics`` (Prometheus), ``GET /v1/info`` (model, budgets, latency table),
  ``GET /openapi.json`` (the schema).

Every error body is ``{"error": "..."}`` naming the problem: malformed JSON 400; a wrong type, a
missing or unknown field, an empty list, invalid Unicode, a budget outside (0, 1] 422; too many or
too long texts, or a body over ``serve.max_body_bytes``, 413; a missing or wrong API key 401; too
many or too large headers 431; a stalled request 408; an unknown route 404. Overload gets 503 with
``Retry-After`` (queue full, deadline passed, not ready yet, engine restarting).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from budgeted_attention.config import from_dict
from budgeted_attention.rundir import RunDir
from budgeted_attention.serving import http
from budgeted_attention.serving.batcher import Batcher, DeadlineExpired, Overloaded
from budgeted_attention.serving.config import ServeConfig, snap_to
from budgeted_attention.serving.errors import EngineUnavailable
from budgeted_attention.serving.latency import LatencyModel, calibrate
from budgeted_attention.serving.metrics import ServerMetrics, worker_exited
from budgeted_attention.serving.process import freeze_garbage_collector, pin_process, server_cpus
from budgeted_attention.serving.supervisor import FAILED, LOADING, READY, Supervisor

log = logging.getLogger("budgeted_attention.serve")
ENV_SETTINGS = "BAA_SERVE_SETTINGS"  # JSON settings for worker processes (baa serve --workers N)
ENV_API_KEY = "BAA_API_KEY"  # the API key (baa serve --api-key, or set by the operator)
ENV_FAILED_FILE = "BAA_SERVE_FAILED_FILE"  # where a worker whose model cannot load writes why (--workers N)
WORKER_START_FAILURE = 3  # uvicorn's exit code for a worker that failed to start: it stops the server


class ClassifyRequest(BaseModel):
    """Texts to classify, with an explicit budget, a deadline, or neither (the server's policy)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    texts: list[str] = Field(min_length=1, description="texts to classify (at least one)")
    budget: float | None = Field(default=None, gt=0.0, le=1.0, allow_inf_nan=False, description="attention budget in (0, 1]")
    latency_ms: float | None = Field(default=None, gt=0.0, allow_inf_nan=False, description="deadline in milliseconds from arrival")

    @field_validator("texts")
    @classmethod
    def _valid_unicode(cls, texts: list[str]) -> list[str]:
        """Texts must be encodable as UTF-8: JSON can carry a lone surrogate (``"\\ud800"``),
        which no tokenizer takes."""
        for index, text in enumerate(texts):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ValueError(f"texts[{index}] is not valid Unicode: lone surrogate U+{ord(text[exc.start]):04X} at character {exc.start}") from None
        return texts


class ClassifyResponse(BaseModel):
    labels: list[str] = Field(description="predicted class name per text")
    label_ids: list[int]
    probabilities: list[list[float]] = Field(description="class probabilities per text, in the order of /v1/info labels")
    budget: float = Field(description="the budget the texts ran at")
    estimated_cost: float = Field(description="fraction of the dense model's budgeted FLOPs at that budget")
    policy: str = Field(description="explicit, deadline or the server policy (slo / fixed)")
    queue_ms: float = Field(description="time the request waited before its batch ran")
    batch_size: int = Field(description="texts in the batch the request ran in")


class ErrorResponse(BaseModel):
    error: str


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _validation_message(exc: RequestValidationError, cfg: ServeConfig) -> tuple[int, str]:
    """(status, one line) for pydantic's errors: 400 for unparsable JSON, 413 for more than
    ``max_texts`` texts, else 422 naming the field."""
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        return 400, "malformed JSON body: " + str(errors[0].get("ctx", {}).get("error", errors[0].get("msg")))
    for error in errors:
        if error.get("type") == "too_long" and tuple(error.get("loc", ())) == ("body", "texts"):
            count = error.get("ctx", {}).get("actual_length")
            many = f"{count} texts" if count is not None else "too many texts"
            return 413, f"texts: {many}, the limit is serve.max_texts = {cfg.max_texts}"
    parts = []
    for error in errors[:3]:
        location = ".".join(str(p) for p in error.get("loc", ()) if p != "body") or "body"
        message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        if error.get("type") == "extra_forbidden":
            message = "unknown field"
        parts.append(f"{location}: {message}")
    return 422, "; ".join(parts)


_ABSOLUTE_PATH = re.compile(r"(?<![\w.:/])/(?:[^\s'\"/]+/)*([^\s'\"/]+)")
# A quoted absolute path is taken whole, spaces and all: 'quoted' or "quoted".
_QUOTED_PATH = re.compile(r"""(?P<q>['"])/(?:[^'"\n]*/)?(?P<last>[^'"/\n]*)(?P=q)""")


def hide_paths(text: str) -> str:
    """``text`` with every absolute path cut to its last part (error bodies and ``/v1/info`` do not
    tell a client where the server's files live unless ``serve.expose_paths``). Quoted paths are
    matched whole, so a folder name with spaces leaks no part of itself."""
    text = _QUOTED_PATH.sub(lambda m: f"{m['q']}{m['last']}{m['q']}", text)
    return _ABSOLUTE_PATH.sub(r"\1", text)


class ServerState:
    """Everything the routes share; ready while the supervisor has an engine that answers."""

    def __init__(self, cfg: ServeConfig, metrics: ServerMetrics, supervisor: Supervisor) -> None:
        self.cfg, self.metrics, self.supervisor = cfg, metrics, supervisor
        self.batcher: Batcher | None = None
        self.floor = 1.0
        self.loaded = False  # the batcher runs (the first engine came up)
        self.started = time.monotonic()
        self.ready_seconds: float | None = None  # from app creation (imports before it not counted)
        self.exit_code: int | None = None  # set when a worker gives up (exit_when_failed)

    @property
    def engine(self) -> Any:
        return self.supervisor.engine

    @property
    def latency(self) -> LatencyModel | None:
        return self.supervisor.latency

    @property
    def failed(self) -> str | None:
        """Why no request can be served now: the engine failed or restarts (None while it loads or is ready)."""
        return None if self.supervisor.state in (LOADING, READY) else self.public(self.supervisor.reason)

    def serving(self) -> bool:
        """An engine is ready (``/readyz`` 200); False while it loads or restarts."""
        return self.loaded and self.supervisor.ready_now()

    def alive(self) -> bool:
        """False once the engine cannot be brought back (``/healthz`` 503)."""
        return self.supervisor.state != FAILED

    def retry_after(self) -> str:
        return str(self.supervisor.retry_after())

    def public(self, text: str) -> str:
        return text if self.cfg.expose_paths else hide_paths(text)


async def in_daemon_thread(function: Any, name: str) -> Any:
    """``function()`` run in a daemon thread of its own; awaiting it can be cancelled, and the
    process can exit while it still runs (``asyncio.to_thread`` threads are joined at exit)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if not future.done():
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)

    def run() -> None:
        try:
            result, error = function(), None
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            result, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop has closed: nobody waits any more
            pass

    threading.Thread(target=run, name=name, daemon=True).start()
    return await future


def calibrate_engine(engine: Any, cfg: ServeConfig, seq_len: int) -> LatencyModel:
    """Time every configured budget at the calibration batch sizes with synthetic texts of ``seq_len`` tokens."""
    from budgeted_attention.data.inputs import random_ids  # noqa: PLC0415 - torch, in the loader thread only

    vocab = engine.tokenizer.get_vocab_size()
    low = min(engine.first_ordinary_id, vocab // 2)
    calls = iter(range(1 << 30))  # a new seed per call: every timed batch holds other ids

    def run_batch(budget: float, size: int) -> float:
        ids = random_ids(vocab, size, seq_len, seed=next(calls), low=low).tolist()
        start = time.perf_counter()
        engine.run(ids, budget)
        return time.perf_counter() - start

    return calibrate(run_batch, cfg.budgets, cfg.calibration_batch_sizes, seq_len=seq_len, warmup=cfg.warmup_batches)


def calibration_length(engine: Any, cfg: ServeConfig) -> int:
    """Tokens per text in the start-up timing: the config's, else the run's median, else 64 (capped at max_len)."""
    if cfg.calibration_seq_len:
        return min(cfg.calibration_seq_len, engine.max_len)
    try:
        lengths = sorted(json.loads(RunDir(engine.run_dir).lengths.read_text())["lengths"])
        return min(int(lengths[len(lengths) // 2]), engine.max_len)
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return min(64, engine.max_len)


def create_app(
    run_dir: str | Path | None,
    cfg: ServeConfig,
    *,
    seed: int | None = None,
    onnx_dir: str | Path | None = None,
    engine: Any = None,
    api_key: str | None = None,
    exit_when_failed: bool = False,
) -> FastAPI:
    """The server for a run directory's budgeted-hard model (or a given ``engine``, for tests).

    The model loads in the background after start-up, so ``/healthz`` answers at once and
    ``/readyz`` turns 200 when the model is loaded, warmed and its latency calibrated. With
    ``api_key`` every route but the probes needs ``Authorization: Bearer <api_key>``.

    ``exit_when_failed`` (a worker of ``--workers N``): once the engine cannot be brought back,
    the worker exits instead of answering ``/healthz`` 503 beside workers that answer 200 (a
    probe would see it flip): after failed restarts uvicorn starts a fresh worker in its place;
    after a first load that failed the worker exits with uvicorn's start-up failure code (3), and
    uvicorn stops the server (a fresh worker would fail the same way).
    """
    metrics = ServerMetrics()

    def start_engine() -> Any:
        from budgeted_attention.serving.engine import Engine  # noqa: PLC0415 - torch loads in the loader thread, not at import
        from budgeted_attention.serving.remote import RemoteEngine  # noqa: PLC0415 - as above

        if engine is not None:
            return engine
        if cfg.engine_process:
            started = RemoteEngine(run_dir, cfg, seed=seed, onnx_dir=onnx_dir, on_spawn=supervisor.spawned)
        else:
            started = Engine(run_dir, cfg, seed=seed, onnx_dir=onnx_dir)
        if cfg.engine_cpus:  # the engine process has pinned itself; this process leaves its CPUs to it
            pin_process(server_cpus(cfg.engine_cpus))
        return started

    def set_latency(latency: LatencyModel) -> None:
        if state.batcher is not None:  # a restarted engine's new timing
            state.batcher.latency = latency

    def worker_gives_up(reason: str) -> None:
        state.exit_code = 0 if state.loaded else WORKER_START_FAILURE
        what = "exits; uvicorn starts a fresh worker" if state.loaded else "stops the server (the model cannot load)"
        log.error("baa serve: worker %d %s: %s", os.getpid(), what, state.public(reason))
        if not state.loaded and os.environ.get(ENV_FAILED_FILE):  # the parent exits 1 with this reason
            Path(os.environ[ENV_FAILED_FILE]).write_text(reason, encoding="utf-8")
        os.kill(os.getpid(), signal.SIGTERM)  # uvicorn's graceful shutdown of this worker

    supervisor = Supervisor(
        start_engine, lambda e: calibrate_engine(e, cfg, calibration_length(e, cfg)), cfg,
        on_restart=metrics.restarts.inc, on_latency=set_latency,
        on_give_up=worker_gives_up if exit_when_failed else (lambda reason: None),
    )
    state = ServerState(cfg, metrics, supervisor)

    async def watch() -> None:
        """The heartbeat: a dead or stopped engine process is found between batches too."""
        while True:
            await asyncio.sleep(cfg.heartbeat_s)
            try:
                await asyncio.to_thread(state.supervisor.check)
            except Exception:  # noqa: BLE001 - one failed check must not end the heartbeat for good
                log.exception("baa serve: the engine heartbeat failed; it goes on")

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        watcher: asyncio.Task | None = None

        async def start() -> None:
            nonlocal watcher
            try:
                # A daemon thread, not the loop's executor: a shutdown during the load must not wait for it.
                await in_daemon_thread(state.supervisor.first_start, "baa-engine-load")
            except Exception:  # noqa: BLE001 - reported by /readyz, /healthz and the log; the process stays up
                return
            if state.supervisor.closed or state.engine is None:  # the shutdown began while it loaded
                return
            state.floor = state.engine.min_allowed_budget()
            state.batcher = Batcher(state.supervisor, cfg, state.latency, state.floor, state.metrics)
            if cfg.freeze_gc and engine is None:  # a test's injected engine shares this process with pytest
                freeze_garbage_collector()
            state.batcher.start()
            watcher = asyncio.create_task(watch(), name="baa-engine-heartbeat")
            state.loaded = True
            state.ready_seconds = time.monotonic() - state.started
            log.info("baa serve: ready in %.1f s", state.ready_seconds)

        loader = asyncio.create_task(start())
        app.state.baa = state
        yield
        # From here on nothing is restarted: an engine that fails while the queue drains stays down.
        state.supervisor.shut_down()  # also kills an engine process still loading
        if not loader.done():
            log.warning("baa serve: shutting down before the model was ready: the load is abandoned")
            loader.cancel()
            await asyncio.gather(loader, return_exceptions=True)
        if watcher is not None:
            watcher.cancel()
        if state.batcher is not None:
            drain = asyncio.ensure_future(state.batcher.drain())  # in-flight and queued requests finish first
            done, _ = await asyncio.wait({drain}, timeout=cfg.shutdown_timeout_s + cfg.watchdog_min_ms / 1e3)
            if not done:  # a batch that does not end: stop the engine, the rest then fail at once
                log.warning("baa serve: the queue did not drain within %.1f s: stopping the engine", cfg.shutdown_timeout_s)
                if engine is None:
                    await asyncio.to_thread(state.supervisor.kill)
                await drain
        if engine is None:  # our engine process exits after the last batch
            await asyncio.to_thread(state.supervisor.close)
        worker_exited()  # with several workers: this one's queue gauge stops counting
        if state.exit_code:  # a worker whose model cannot load: uvicorn's code for "stop the server"
            for handler in logging.getLogger().handlers:
                handler.flush()
            os._exit(state.exit_code)

    # The request model with this server's max_texts: a longer list stops validating at the first
    # text past the limit (413 below) instead of checking every text first.
    request_model = create_model(
        "ClassifyRequest", __base__=ClassifyRequest,
        texts=(list[str], Field(min_length=1, max_length=cfg.max_texts, description=f"texts to classify (1 to serve.max_texts = {cfg.max_texts})")),
    )

    app = FastAPI(
        title="budgeted_attention server",
        version="1",
        description="Text classification at an attention budget, a deadline, or the server's latency policy.",
        lifespan=lifespan,
    )
    app.add_middleware(
        http.RequestGuard, cfg=cfg, api_key=api_key, count=state.metrics.request, disconnected=state.metrics.disconnects.inc,
    )
    http.guarded_protocol_observer(state.metrics.request)

    def unavailable(message: str) -> JSONResponse:
        return _error(503, message, {"Retry-After": state.retry_after()})

    def refused(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
        """An error answer, counted in the request metrics."""
        state.metrics.request(status)
        return _error(status, message, headers)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return refused(*_validation_message(exc, cfg))

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # The framework's own refusals (404, 405) in the server's one error shape.
        return refused(exc.status_code, str(exc.detail), dict(exc.headers or {}))

    @app.exception_handler(Exception)
    async def on_unexpected_error(request: Request, exc: Exception) -> JSONResponse:
        # A bug, not a bad request: still JSON, still counted (the traceback goes to the log).
        log.exception("baa serve: unexpected error on %s", request.url.path)
        return refused(500, f"internal error: {type(exc).__name__}")

    @app.get("/healthz", responses={503: {"model": ErrorResponse}})
    async def healthz() -> Any:
        """200 while the server can serve or recover; 503 once the engine cannot be brought back."""
        if state.alive():
            return {"status": "ok"}
        return _error(503, state.failed or "engine failed")

    @app.get("/readyz", responses={503: {"model": ErrorResponse}})
    async def readyz() -> Any:
        """200 while an engine is loaded, warmed and answering, else 503."""
        if state.serving():
            return {"status": "ready", "ready_seconds": round(state.ready_seconds or 0.0, 3), **supervisor.startup, "restarts": supervisor.restarts}
        return unavailable(state.failed or "loading")

    @app.get("/metrics")
    async def metrics() -> Response:
        body, content_type = state.metrics.exposition()
        return Response(body, media_type=content_type)

    @app.get("/v1/info", responses={503: {"model": ErrorResponse}})
    async def info() -> Any:
        """Model, budgets with their estimated cost and validation accuracy, the latency model."""
        if not state.serving():
            return unavailable(state.failed or "loading")
        return {
            **state.engine.describe(cfg.expose_paths),
            "policy": cfg.policy,
            "floor_budget": state.floor,
            "latency_model": state.latency.as_dict(),
            "config": asdict(cfg),
            "restarts": state.supervisor.restarts,
        }

    async def classify(body: ClassifyRequest, request: Request) -> Any:
        """Classify texts at ``budget``, within ``latency_ms``, or under the server's policy."""
        arrival = time.perf_counter()
        for index, text in enumerate(body.texts):  # too many texts: 413 from the request model already
            if len(text) > cfg.max_text_chars:
                return refused(413, f"texts[{index}]: {len(text)} characters, the limit is serve.max_text_chars = {cfg.max_text_chars}")
        if body.budget is not None and body.latency_ms is not None:
            return refused(422, "give either budget or latency_ms, not both")
        if not state.serving():
            return refused(503, state.failed or "model is loading", {"Retry-After": state.retry_after()})
        ids = state.engine.tokenize(body.texts)
        budget = snap_to(body.budget, cfg.budgets) if body.budget is not None else None
        try:
            result = await state.batcher.submit(ids, budget, body.latency_ms)
        except (Overloaded, DeadlineExpired, EngineUnavailable) as exc:
            return refused(503, state.public(str(exc)), {"Retry-After": str(exc.retry_after)})
        if await request.is_disconnected():  # the answer would go nowhere: a disconnect, not a 200
            state.metrics.disconnects.inc()
            log.info("baa serve: client disconnected before its answer (POST /v1/classify)")
            return Response(status_code=204)
        probabilities = result.probabilities
        label_ids = probabilities.argmax(dim=-1).tolist()
        policy = "explicit" if body.budget is not None else "deadline" if body.latency_ms is not None else cfg.policy
        state.metrics.request(200, time.perf_counter() - arrival, result.budget)
        return ClassifyResponse(
            labels=[state.engine.labels[i] for i in label_ids],
            label_ids=label_ids,
            probabilities=[[round(p, 6) for p in row] for row in probabilities.tolist()],
            budget=result.budget,
            estimated_cost=round(state.engine.costs[result.budget], 4),
            policy=policy,
            queue_ms=round(result.queue_ms, 3),
            batch_size=result.batch_size,
        )

    # This server's request model (with its max_texts); the annotations are strings here (from
    # __future__ import annotations), and a local class cannot be found by name.
    classify.__annotations__["body"] = request_model
    app.post(
        "/v1/classify",
        response_model=ClassifyResponse,
        responses={s: {"model": ErrorResponse} for s in (400, 401, 408, 413, 422, 431, 503)},
    )(classify)
    return app


def app_from_env() -> FastAPI:
    """App factory for uvicorn worker processes (``baa serve --workers N``): settings from the environment."""
    settings = json.loads(os.environ[ENV_SETTINGS])
    cfg = from_dict(ServeConfig, settings["serve"], "serve")
    api_key = os.environ.get(ENV_API_KEY) or None  # the key travels in the environment, never in the settings
    return create_app(settings["run_dir"], cfg, seed=settings.get("seed"), onnx_dir=settings.get("onnx_dir"), api_key=api_key, exit_when_failed=True)
