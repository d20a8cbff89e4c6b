"""The engine in a child process (``serve.engine_process: true``).

With the model in a worker thread of the server process, the event loop (parsing requests,
tokenising, writing answers) and the model share one interpreter lock: the model's Python code
holds it between tensor operations, so the answers of a finished batch can wait for the next
batch's forward pass. Here the model runs in a process of its own and the server's worker thread
only waits on a pipe (which releases the lock). Token ids go to the child, probabilities come
back; the tokenizer, labels and costs stay in the server process.

The child is started with ``spawn`` (a fresh interpreter: no forked thread pools or locks) and
builds the same :class:`~budgeted_attention.serving.engine.Engine` the server would have built.
"""

from __future__ import annotations

import multiprocessing
import signal
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from budgeted_attention.serving.config import ServeConfig
from budgeted_attention.serving.engine import EngineInfo, load_tokenizer
from budgeted_attention.serving.errors import EngineGone, EngineProcessError

START_TIMEOUT_S = 600.0  # loading a large checkpoint on a slow disk; a failed load answers at once
# The default wait for one batch when the caller gives none (direct use, start-up calibration).
# The server's supervisor passes a per-batch deadline derived from the calibrated latency instead.
RUN_TIMEOUT_S = 60.0
PING = "ping"  # the heartbeat message: the child answers ("pong", None) between batches



def _child(conn, run_dir: str, settings: dict[str, Any], seed: int | None, onnx_dir: str | None) -> None:
    """The child's loop: build the engine, send its metadata, then answer ``(ids, budget)``
    with ``("ok", probabilities as a NumPy array)`` or ``("error", message)`` until ``None`` or EOF."""
    # The server decides when the engine stops (it drains its queue first): Ctrl-C in a terminal or
    # a service manager's SIGTERM reach the whole process group, and must not end this process early.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from budgeted_attention.config import from_dict  # noqa: PLC0415 - in the engine process: the server process never imports torch
    from budgeted_attention.serving.process import freeze_garbage_collector, pin_process  # noqa: PLC0415 - as above
    from budgeted_attention.serving.engine import Engine  # noqa: PLC0415 - as above

    try:
        if settings.get("engine_cpus"):  # before the model loads: thread pools started later inherit it
            try:
                pin_process(settings["engine_cpus"])
            except OSError as exc:
                raise OSError(f"serve.engine_cpus {settings['engine_cpus']}: cannot pin the engine process there: {exc}") from exc
        engine = Engine(run_dir, from_dict(ServeConfig, settings, "serve"), seed=seed, onnx_dir=onnx_dir)
        if settings.get("freeze_gc"):
            freeze_garbage_collector()
        reply: tuple[str, Any] = ("ready", engine.metadata())
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it
        reply, engine = ("error", f"{type(exc).__name__}: {exc}"), None
    while True:
        try:
            conn.send(reply)
            if engine is None:
                return
            message = conn.recv()
        except (EOFError, OSError):  # the server went away
            return
        if message is None:
            return
        if message == PING:
            reply = ("pong", None)
            continue
        ids, budget = message
        try:
            reply = ("ok", engine.run(ids, budget).numpy())
        except Exception as exc:  # noqa: BLE001 - one failed batch, not a dead engine
            traceback.print_exc()  # the child's stderr is the server's: the whole traceback in its log
            reply = ("error", f"{type(exc).__name__}: {exc}")


class RemoteEngine(EngineInfo):
    """The same interface as :class:`~budgeted_attention.serving.engine.Engine`, with the model in
    a child process. Not thread-safe (one call at a time, as the batcher makes them); ``close()``
    stops the child."""

    def __init__(
        self, run_dir: str | Path, cfg: ServeConfig, *, seed: int | None = None, onnx_dir: str | Path | None = None,
        on_spawn: Callable[[RemoteEngine], None] | None = None,
    ) -> None:
        """``on_spawn`` is called with this engine as soon as its child runs, before the model has
        loaded (the supervisor's restart deadline and shutdown kill a child that is still starting)."""
        self.run_dir = Path(run_dir)
        self.cfg = cfg
        context = multiprocessing.get_context("spawn")
        self._conn, child_conn = context.Pipe()
        self._process = context.Process(
            target=_child, args=(child_conn, str(run_dir), asdict(cfg), seed, None if onnx_dir is None else str(onnx_dir)),
            name="baa-engine", daemon=True,
        )
        self._process.start()
        child_conn.close()  # the child holds its end; EOF here means the child is gone
        try:
            if on_spawn is not None:
                on_spawn(self)
            self._adopt(*self._receive(START_TIMEOUT_S, "starting"))
        except BaseException:  # nothing may leave a child holding a model copy behind
            self.close()
            raise

    def _adopt(self, kind: str, payload: Any) -> None:
        """Take the child's metadata (:meth:`EngineInfo.metadata`, or its load error) and load the tokenizer here."""
        if kind != "ready":
            raise EngineProcessError(f"the engine process failed to load the model: {payload}")
        vars(self).update(payload)  # pickled through the pipe: the child's own types
        self.checkpoint = Path(payload["checkpoint"])
        self.tokenizer, self.pad_id = load_tokenizer(self.folder(), self.max_len)

    in_child = True

    @property
    def pid(self) -> int | None:
        return self._process.pid

    @property
    def exitcode(self) -> int | None:
        return self._process.exitcode

    def alive(self) -> bool:
        """Whether the child can still answer (``/readyz`` turns 503 when it cannot)."""
        return self._process.is_alive()

    def _receive(self, timeout: float, doing: str) -> tuple[str, Any]:
        try:
            if not self._conn.poll(timeout):
                raise EngineGone(f"the engine process did not answer within {timeout:.3g} s while {doing}")
            return self._conn.recv()
        except (EOFError, OSError):
            self._process.join(timeout=1.0)
            raise EngineGone(f"the engine process exited (code {self._process.exitcode}) while {doing}") from None

    def _call(self, message: Any, timeout: float, doing: str) -> tuple[str, Any]:
        """Send ``message`` and wait up to ``timeout`` seconds for the reply; a child that is gone
        or hung is killed (later calls then fail at once instead of waiting again)."""
        try:
            self._conn.send(message)
        except (BrokenPipeError, OSError):
            self.kill()
            raise EngineGone(f"the engine process is gone (exit code {self._process.exitcode})") from None
        try:
            return self._receive(timeout, doing)
        except EngineGone:
            self.kill()
            raise

    def run(self, ids: list[list[int]], budget: float, timeout: float = RUN_TIMEOUT_S) -> torch.Tensor:
        """(batch, n_classes) class probabilities, computed in the child process.

        Raises:
            EngineGone: the child exited, or gave no answer within ``timeout`` seconds (it is killed).
            EngineProcessError: the child failed this batch (and keeps serving).
        """
        kind, payload = self._call((ids, budget), timeout, "running a batch")
        if kind != "ok":
            raise EngineProcessError(f"the engine process failed a batch: {payload}")
        return torch.from_numpy(payload)

    def ping(self, timeout: float) -> None:
        """A heartbeat between batches: returns when the child answers, else raises :class:`EngineGone`
        (a stopped or hung child is killed)."""
        self._call(PING, timeout, "answering a heartbeat")

    def kill(self) -> None:
        """Stop the child at once (SIGKILL works on a stopped process too) and reap it."""
        if self._process.is_alive():
            self._process.kill()
        self._process.join(5.0)

    def close(self, timeout: float = 10.0) -> None:
        """Ask the child to exit (it finishes the call it is in), then make sure it has."""
        if self._process.is_alive():
            try:
                self._conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            self._process.join(timeout)
            if self._process.is_alive():
                self._process.kill()  # it ignores SIGTERM (see _child)
                self._process.join(timeout)
        self._conn.close()
