"""The engine's supervisor: starts the model, watches it, and brings it back without an operator.

The batcher calls :meth:`Supervisor.run` for every batch. With the model in a child process
(``serve.engine_process``, the default) each batch gets a deadline derived from the calibrated
latency (``watchdog_factor`` times the predicted time, at least ``watchdog_min_ms``); a child that
exits, or gives no answer by then, is killed. Between batches a heartbeat (every ``heartbeat_s``)
catches a child that died or stopped while idle. Either way:

* the batch in flight and every later one fail with :class:`EngineUnavailable` (HTTP 503 with
  ``Retry-After``, never 500) while no engine is ready, and ``/readyz`` is 503;
* a new child is started and recalibrated in a background thread, then takes over;
* after ``max_restarts`` failed restarts in a row the supervisor gives up: ``/healthz`` turns 503
  so an orchestrator replaces the whole server.

A model in the server's own process (``engine_process: false``, or an engine handed to
``create_app`` by a test) cannot be killed or replaced: its errors pass through unchanged.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from budgeted_attention.serving.config import ServeConfig
from budgeted_attention.serving.latency import LatencyModel
from budgeted_attention.serving.errors import EngineGone, EngineUnavailable

log = logging.getLogger("budgeted_attention.serve")

LOADING, READY, RESTARTING, FAILED = "loading", "ready", "restarting", "failed"
STOPPED = "stopped"  # the engine failed after the shutdown began: not restarted, batches refused at once
# A restart (load + calibration) that takes longer than RESTART_FACTOR times the last start, and at
# least RESTART_FLOOR_S, is hung (a stuck disk, a stopped child): its child is killed and the try
# counts as failed, instead of waiting for the first start's 600 s limit on every try.
RESTART_FACTOR = 5.0
RESTART_FLOOR_S = 30.0


class Supervisor:
    """Owns the engine: the first start, the per-batch watchdog, the heartbeat and restarts.

    Args:
        start: builds and returns a new engine (blocking; raises on a failed load).
        calibrate: times an engine, returns its latency model (blocking).
        cfg: the server settings (watchdog and restart keys).
        on_restart: called after each successful restart (the metrics counter).
        on_latency: called with each new latency model (the batcher's).
        on_give_up: called with the reason once the engine cannot be brought back (state
            ``failed``), not during a shutdown.
    """

    def __init__(
        self,
        start: Callable[[], Any],
        calibrate: Callable[[Any], LatencyModel],
        cfg: ServeConfig,
        *,
        on_restart: Callable[[], None] = lambda: None,
        on_latency: Callable[[LatencyModel], None] = lambda latency: None,
        on_give_up: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self._start, self._calibrate, self.cfg = start, calibrate, cfg
        self._on_restart, self._on_latency, self._on_give_up = on_restart, on_latency, on_give_up
        self.engine: Any = None
        self.latency: LatencyModel | None = None
        self.state = LOADING
        self.reason = "model is loading"
        self.restarts = 0  # successful restarts over the server's life
        self.failed_tries = 0  # failed restarts since the last success
        self.start_seconds = 1.0  # the last start's load + calibration time (the Retry-After)
        self.startup: dict[str, float] = {}
        self._call_lock = threading.Lock()  # one call at a time on the engine's pipe
        self._state_lock = threading.Lock()
        self._last_call = time.monotonic()
        self._restarter: threading.Thread | None = None
        self.closed = False  # the shutdown began: nothing is restarted from now on
        self._starting: Any = None  # the engine being started (its child runs, the model may still load)
        self._overdue = False  # the start in progress passed its deadline (and was killed)

    # ------------------------------------------------------------------ start and restart

    def first_start(self) -> None:
        """Load and calibrate the first engine (blocking; a failure is final: state ``failed``)."""
        try:
            self._bring_up()
        except Exception as exc:
            self._give_up("model load abandoned: the server is shutting down" if self.closed else f"model failed to load: {type(exc).__name__}: {exc}")
            raise

    def restart_deadline_s(self) -> float:
        """How long a restart may take before it counts as hung: RESTART_FACTOR times the last
        start (load + calibration), at least RESTART_FLOOR_S."""
        return max(RESTART_FLOOR_S, RESTART_FACTOR * self.start_seconds)

    def spawned(self, engine: Any) -> None:
        """Called by an engine as soon as its child process runs, before the model has loaded: a
        start past its deadline, or a shutdown, can then kill it."""
        with self._state_lock:
            self._starting = engine
            stop = self.closed or self._overdue
        if stop:
            _stop(engine, "kill")

    def _start_overdue(self, deadline_s: float) -> None:
        with self._state_lock:
            self._overdue = True
            engine = self._starting
        log.error("baa serve: the engine did not start within %.1f s: killing it", deadline_s)
        _stop(engine, "kill")

    def _bring_up(self, deadline_s: float | None = None) -> None:
        """Start and calibrate an engine, then make it the current one; with ``deadline_s``, a
        start not done by then is killed and raises :class:`EngineGone`."""
        self._overdue = False
        timer = None
        if deadline_s is not None:
            timer = threading.Timer(deadline_s, self._start_overdue, args=(deadline_s,))
            timer.daemon = True
            timer.start()
        try:
            started = time.monotonic()
            engine = self._start()
            self.spawned(engine)
            loaded = time.monotonic()
            try:
                latency = self._calibrate(engine)
                if self._overdue:
                    raise EngineGone("killed")
            except BaseException:
                _stop(engine, "close")
                raise
        except Exception as exc:
            if self._overdue:
                raise EngineGone(f"the engine did not start within {deadline_s:.1f} s (the restart deadline: {RESTART_FACTOR:g} x the last start, "
                                 f"at least {RESTART_FLOOR_S:g} s); it was killed") from exc
            raise
        finally:
            if timer is not None:
                timer.cancel()
            with self._state_lock:
                self._starting = None
        self.startup = {"load_seconds": round(loaded - started, 3), "calibration_seconds": round(time.monotonic() - loaded, 3)}
        self.start_seconds = time.monotonic() - started
        with self._state_lock:
            if self.closed:
                _stop(engine, "close")
                return
            self.engine, self.latency = engine, latency
            self.state, self.reason = READY, "ready"
        self._on_latency(latency)

    @property
    def restartable(self) -> bool:
        return bool(getattr(self.engine, "in_child", False))

    def _went_down(self, engine: Any, reason: str) -> None:
        """``engine`` died or hung: kill it, stop taking batches, restart in the background. Nothing
        happens when it is no longer the current engine (a heartbeat or probe that read it before
        a restart replaced it must not kill its successor)."""
        with self._state_lock:
            if self.state != READY or engine is not self.engine:
                return
            closed = self.closed
            if closed:  # the server is stopping: no restart, the batches still queued fail at once
                self.state, self.reason = STOPPED, f"engine stopped during the shutdown: {reason}"
            else:
                self.state, self.reason = RESTARTING, f"engine restarting: {reason}"
        log.error("baa serve: %s", self.reason)
        _stop(engine, "kill")
        if closed:
            return
        self._restarter = threading.Thread(target=self._restart_loop, args=(engine,), name="baa-engine-restart", daemon=True)
        self._restarter.start()

    def _restart_loop(self, old: Any) -> None:
        _stop(old, "close")
        while not self.closed:
            try:
                self._bring_up(self.restart_deadline_s())
            except Exception as exc:  # noqa: BLE001 - counted, retried, then given up
                if self.closed:  # the shutdown killed it
                    return
                self.failed_tries += 1
                message = f"{type(exc).__name__}: {exc}"
                log.error("baa serve: engine restart %d of %d failed: %s", self.failed_tries, self.cfg.max_restarts, message)
                if self.failed_tries >= self.cfg.max_restarts:
                    self._give_up(f"the engine could not be restarted ({self.failed_tries} tries; last: {message})")
                    return
                time.sleep(min(30.0, 2.0 ** (self.failed_tries - 1)))  # 1, 2, 4 ... s between tries
                continue
            self.restarts += 1
            self.failed_tries = 0
            self._on_restart()
            log.warning("baa serve: engine restarted (%d so far) in %.1f s", self.restarts, self.start_seconds)
            return

    def _give_up(self, reason: str) -> None:
        with self._state_lock:
            self.state, self.reason = FAILED, reason
            closed = self.closed
        log.error("baa serve: %s", reason)
        if not closed:
            self._on_give_up(reason)

    # ------------------------------------------------------------------ calls

    def retry_after(self) -> int:
        """Seconds a client should wait: about one start of the engine (at least 1)."""
        return max(1, math.ceil(self.start_seconds))

    def batch_deadline_s(self, budget: float, n_texts: int, n_tokens: int) -> float:
        """How long a batch may take before the engine counts as hung: ``watchdog_factor`` times
        its predicted time, at least ``watchdog_min_ms``."""
        predicted = self.latency.predict_ms(budget, n_texts, n_tokens) if self.latency is not None else 0.0
        return max(self.cfg.watchdog_min_ms, self.cfg.watchdog_factor * predicted) / 1e3

    def run(self, ids: list[list[int]], budget: float) -> Any:
        """Class probabilities of one batch (the batcher's runner; called from its worker thread).

        Raises:
            EngineUnavailable: no engine is ready, or it died or hung during this batch.
        """
        with self._call_lock:
            engine = self.engine
            if self.state != READY or engine is None:
                raise EngineUnavailable(self.reason, self.retry_after())
            self._last_call = time.monotonic()
            try:
                if not self.restartable:
                    return engine.run(ids, budget)
                return engine.run(ids, budget, timeout=self.batch_deadline_s(budget, len(ids), max(len(x) for x in ids)))
            except EngineGone as exc:
                self._went_down(engine, str(exc))
                # This batch's own reason: a fast restart may already be done when it is read.
                reason = self.reason if self.state == STOPPED else f"engine restarting: {exc}"
                raise EngineUnavailable(reason, self.retry_after()) from None
            finally:
                self._last_call = time.monotonic()

    def ready_now(self) -> bool:
        """Whether an engine can answer now; a child found dead here is replaced at once (cheap:
        no message to the child, so ``/readyz`` can call it on every probe)."""
        engine = self.engine
        if self.state == READY and self.restartable and not engine.alive():
            self._went_down(engine, f"the engine process exited (code {getattr(engine, 'exitcode', None)})")
        return self.state == READY

    def check(self) -> None:
        """The heartbeat (call every ``heartbeat_s`` from any thread): a child that exited, or that
        does not answer a ping within ``watchdog_min_ms`` while idle, is replaced."""
        engine = self.engine
        if not self.restartable or not self.ready_now():  # an exited child is replaced there
            return
        if time.monotonic() - self._last_call < self.cfg.heartbeat_s or not self._call_lock.acquire(blocking=False):
            return  # a batch ran recently or runs now: its own deadline watches it
        try:
            engine.ping(self.cfg.watchdog_min_ms / 1e3)
            self._last_call = time.monotonic()
        except EngineGone as exc:
            self._went_down(engine, str(exc))
        finally:
            self._call_lock.release()

    def shut_down(self) -> None:
        """The server is stopping (call first, before draining): no restart from now on, and an
        engine still starting (the first load, or a restart) is killed."""
        with self._state_lock:
            self.closed = True
            starting = self._starting
        if starting is not None:
            log.warning("baa serve: shutting down while an engine starts: it is stopped")
            _stop(starting, "kill")

    def kill(self) -> None:
        """Kill the current engine at once (a drain past the shutdown timeout)."""
        _stop(self.engine, "kill")

    def close(self) -> None:
        """Stop the engine (after the batcher drained) and any restart in progress."""
        self.shut_down()
        with self._state_lock:
            engine = self.engine
        if self._restarter is not None:
            self._restarter.join(timeout=self.cfg.shutdown_timeout_s)
        _stop(engine, "close")


def _stop(engine: Any, method: str) -> None:
    """``engine.<method>()`` where the engine has it; a failure is only logged (at debug level)."""
    call = getattr(engine, method, None)
    if call is not None:
        try:
            call()
        except Exception:  # noqa: BLE001 - a dead child may fail to stop cleanly; it is being replaced or gone either way
            log.debug("baa serve: %s of an engine failed", method, exc_info=True)
