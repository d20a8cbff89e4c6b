"""Dynamic batching by budget, and the SLO policy that picks each batch's budget.

Requests wait in one bounded queue (counted in texts). A single worker coroutine takes the oldest
request, waits up to ``max_wait_ms`` for others of the same kind to fill the batch, and runs the
batch in one worker thread (the event loop keeps accepting and shedding meanwhile):

* requests with an explicit budget batch with requests of the same (snapped) budget;
* requests with a deadline (``latency_ms``, or the server's target under the ``slo`` policy)
  batch together, and the batch runs at the largest budget whose predicted completion meets the
  earliest deadline in it *and* leaves the backlog behind it on time (:func:`pick_budget`), never
  below the floor; with ``arrival_window_ms`` > 0 it must also leave the requests expected to
  arrive meanwhile (the arrival rate of the last window) servable on time at the floor.

Every budget runs on the same weights (the engine's sliced model), so batching by budget copies
nothing. A full queue refuses new work (:class:`Overloaded`, HTTP 503 with ``Retry-After``); a
request whose deadline passed while it waited is dropped (:class:`DeadlineExpired`) when
``shed_expired`` is on, so an overloaded server spends its time on requests that can still make it.
With ``deadline_batching`` a policy batch is also cut to the requests that can finish in time at the
floor, and a request that cannot even alone is dropped before its deadline passes.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from budgeted_attention.serving.config import ServeConfig, snap_to
from budgeted_attention.serving.errors import EngineUnavailable
from budgeted_attention.serving.latency import Arrivals, LatencyModel, pick_budget

SLO = "slo"  # the batching key of requests whose budget the policy picks
log = logging.getLogger("budgeted_attention.serve")


class Overloaded(Exception):
    """The queue is full; ``retry_after`` is a suggested wait in seconds."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class DeadlineExpired(Exception):
    """The request's deadline passed before it could run."""

    retry_after = 1


class Runner(Protocol):
    """What the batcher needs of the engine: run token ids at a budget, return probabilities."""

    def run(self, ids: list[list[int]], budget: float) -> Any: ...


class BatchObserver(Protocol):
    """Metrics hooks (see :mod:`budgeted_attention.serving.metrics`)."""

    def batch(self, budget: float, n_texts: int, seconds: float) -> None: ...

    def shed(self, reason: str, n: int = 1) -> None: ...

    def queue(self, n_texts: int) -> None: ...


@dataclass
class Job:
    """One request in the queue.

    Attributes:
        ids: token ids per text (unpadded).
        key: the budget (explicit requests) or :data:`SLO`.
        deadline_ms: monotonic milliseconds by which the answer is due (``inf``: none).
        arrival_ms: monotonic milliseconds at admission.
        client_deadline: the deadline is the client's own (``latency_ms``), not the server's target.
    """

    ids: list[list[int]]
    key: float | str
    deadline_ms: float
    arrival_ms: float
    future: asyncio.Future = field(repr=False)
    client_deadline: bool = False

    @property
    def n_texts(self) -> int:
        return len(self.ids)

    @property
    def n_tokens(self) -> int:
        return max(len(x) for x in self.ids)


@dataclass
class BatchResult:
    """What a request gets back: its rows of the batch's probabilities and how they were made."""

    probabilities: Any
    budget: float
    queue_ms: float
    batch_size: int


def now_ms() -> float:
    return time.monotonic() * 1e3


class Batcher:
    """The queue and its worker. Use from one event loop: ``await submit(...)``; ``start()`` /
    ``await drain()`` around the server's life."""

    def __init__(self, runner: Runner, cfg: ServeConfig, latency: LatencyModel, floor: float, observer: BatchObserver | None = None) -> None:
        self.runner = runner
        self.cfg = cfg
        self.latency = latency
        self.floor = floor
        self.observer = observer
        self.queue: deque[Job] = deque()
        self.queued_texts = 0
        self._recent: deque[tuple[float, int]] = deque()  # (arrival ms, texts) within arrival_window_ms
        self._wake = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task | None = None
        # One thread: model calls never overlap (each already uses cfg.threads cores).
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="baa-model")

    # ------------------------------------------------------------------ life cycle

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._work(), name="baa-batcher")

    async def drain(self) -> None:
        """Finish every queued request, then stop the worker (graceful shutdown)."""
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            await self._task
        self._executor.shutdown(wait=True)

    # ------------------------------------------------------------------ admission

    async def submit(self, ids: list[list[int]], budget: float | None, latency_ms: float | None) -> BatchResult:
        """Queue one request and wait for its answer.

        Args:
            budget: an explicit budget (already snapped to a configured one), or None.
            latency_ms: the request's deadline from now, or None (then the policy decides).

        Raises:
            Overloaded: the queue cannot take ``len(ids)`` more texts.
            DeadlineExpired: the deadline passed while the request waited.
        """
        if self._stopping:
            raise Overloaded("server is shutting down", retry_after=1)
        if self.queued_texts + len(ids) > self.cfg.max_queue:
            if self.observer:
                self.observer.shed("queue_full", 1)
            raise Overloaded(
                f"queue full ({self.queued_texts} texts waiting, limit serve.max_queue = {self.cfg.max_queue})",
                retry_after=self._retry_after(),
            )
        arrival = now_ms()
        if budget is not None:
            key: float | str = budget
            deadline = arrival + latency_ms if latency_ms is not None else math.inf
        elif latency_ms is not None:
            key, deadline = SLO, arrival + latency_ms
        elif self.cfg.policy == "slo":
            key, deadline = SLO, arrival + self.cfg.target_p95_ms
        else:
            key, deadline = snap_to(self.cfg.default_budget, self.cfg.budgets), math.inf
        job = Job(ids, key, deadline, arrival, asyncio.get_running_loop().create_future(), client_deadline=latency_ms is not None)
        if key == SLO:  # the look-ahead protects policy requests; fixed budgets have their own
            self._note_arrival(arrival, job.n_texts)
        self.queue.append(job)
        self.queued_texts += job.n_texts
        self._report_queue()
        self._wake.set()
        return await job.future

    def _retry_after(self) -> int:
        """Seconds until the queue has drained at the floor budget, rounded up (at least 1)."""
        per_batch = self.latency.predict_ms(self.floor, self.cfg.max_batch_size, self.latency.seq_len)
        batches = math.ceil(self.queued_texts / self.cfg.max_batch_size)
        return max(1, math.ceil(batches * per_batch / 1e3))

    def _report_queue(self) -> None:
        if self.observer:
            self.observer.queue(self.queued_texts)

    # ------------------------------------------------------------------ the worker

    async def _work(self) -> None:
        while True:
            if not self.queue:
                if self._stopping:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            await self._fill(self.queue[0])
            clock = now_ms()  # one reading for shedding and cutting: a job is not judged twice apart
            self._shed_expired(clock)
            if not self.queue:
                continue
            jobs = self._take_batch(clock)
            try:
                await self._run(jobs, self._choose_budget(jobs))
            except Exception as exc:  # noqa: BLE001 - a bug in bookkeeping fails this batch, never the worker
                if not isinstance(exc, EngineUnavailable):  # expected while the engine restarts: the supervisor logged it
                    log.exception("baa serve: batch failed")
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(exc)

    async def _fill(self, first: Job) -> None:
        """Wait until the first job's batch is full or it has waited ``max_wait_ms``."""
        while not self._stopping:
            waiting = sum(j.n_texts for j in self.queue if j.key == first.key)
            remaining = first.arrival_ms + self.cfg.max_wait_ms - now_ms()
            if waiting >= self.cfg.max_batch_size or remaining <= 0:
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), remaining / 1e3)
            except TimeoutError:
                return

    def _shed_expired(self, clock: float) -> None:
        """Drop the queued requests whose deadline has passed at ``clock`` (with ``deadline_batching``:
        also the policy requests with a deadline of their own that could not finish by it even
        alone at the floor, starting then)."""
        if not self.cfg.shed_expired:
            return
        passed = [j for j in self.queue if j.deadline_ms < clock]
        unreachable = [j for j in self.queue if j.deadline_ms >= clock and j.client_deadline and self._hopeless(j, clock)]
        for job in passed + unreachable:
            self.queue.remove(job)
            self.queued_texts -= job.n_texts
            if not job.future.done():
                why = "deadline passed" if job.deadline_ms < clock else f"deadline {job.deadline_ms - clock:.0f} ms away, too close to answer in time"
                job.future.set_exception(DeadlineExpired(f"{why} after {clock - job.arrival_ms:.0f} ms in the queue"))
        for reason, shed in (("deadline_expired", passed), ("deadline_unreachable", unreachable)):
            if shed and self.observer:
                self.observer.shed(reason, len(shed))
        if passed or unreachable:
            self._report_queue()

    def _hopeless(self, job: Job, clock: float) -> bool:
        """With ``deadline_batching``: a policy job that would miss its deadline even alone at the floor from ``clock``."""
        if not self.cfg.deadline_batching or job.key != SLO:
            return False
        return clock + self.latency.predict_ms(self.floor, job.n_texts, job.n_tokens) > job.deadline_ms

    def _fit_to_deadlines(self, jobs: list[Job], clock: float) -> list[Job]:
        """With ``deadline_batching``, the longest prefix of the policy batch ``jobs`` (queue order)
        predicted to finish by the deadlines in it at the floor budget if it starts at ``clock``.
        Deadlines that cannot be met even alone do not count (those requests are late whatever
        the batch), so the whole batch runs when none can be met. A job with a tighter deadline
        than those before it ends the prefix there: the batch keeps queue order."""
        if not self.cfg.deadline_batching or jobs[0].key != SLO or len(jobs) == 1:
            return jobs
        texts = tokens = fits = 0
        deadline = math.inf
        for count, job in enumerate(jobs, start=1):
            # Each job adds time and can only bring the deadline forward: stop at the first miss.
            texts, tokens = texts + job.n_texts, max(tokens, job.n_tokens)
            if not self._hopeless(job, clock):
                deadline = min(deadline, job.deadline_ms)
            if clock + self.latency.predict_ms(self.floor, texts, tokens) > deadline:
                break
            fits = count
        return jobs[:fits] if fits else jobs

    def _next_batch(self, jobs: list[Job]) -> list[Job]:
        """The batch the worker forms from ``jobs`` (in queue order): the first job and the following
        jobs of the same key, up to ``max_batch_size`` texts (a single larger job runs alone)."""
        batch, texts = [], 0
        for job in jobs:
            if job.key != jobs[0].key:
                continue
            if batch and texts + job.n_texts > self.cfg.max_batch_size:
                break
            batch.append(job)
            texts += job.n_texts
        return batch

    def _take_batch(self, clock: float) -> list[Job]:
        """Remove and return the next batch from the queue (``clock``: now, in ms)."""
        jobs = self._fit_to_deadlines(self._next_batch(list(self.queue)), clock)
        for job in jobs:
            self.queue.remove(job)
        self.queued_texts -= sum(j.n_texts for j in jobs)
        self._report_queue()
        return jobs

    def _choose_budget(self, jobs: list[Job]) -> float:
        key = jobs[0].key
        if key != SLO:
            return float(key)
        current = (sum(j.n_texts for j in jobs), max(j.n_tokens for j in jobs), min(j.deadline_ms for j in jobs))
        clock = now_ms()
        return pick_budget(self.latency, [current, *self._backlog()], clock, self.floor, self._forecast(jobs, clock))

    def _note_arrival(self, arrival_ms: float, n_texts: int) -> None:
        """Record an admission for the arrival rate; entries older than the window are dropped
        here too, so the record stays bounded when no policy batch ever reads it."""
        if self.cfg.arrival_window_ms <= 0:
            return
        self._recent.append((arrival_ms, n_texts))
        self._forget_before(arrival_ms - max(self.cfg.arrival_window_ms, self.cfg.arrival_memory_ms))

    def _forget_before(self, start_ms: float) -> None:
        while self._recent and self._recent[0][0] < start_ms:
            self._recent.popleft()

    def _forecast(self, jobs: list[Job], clock: float) -> Arrivals | None:
        """Arrivals expected next: the texts/ms of the last ``arrival_window_ms``, asking for the
        latency this batch asks for (None when the window is 0, i.e. the check is off)."""
        window = self.cfg.arrival_window_ms
        if window <= 0:
            return None
        self._forget_before(clock - max(window, self.cfg.arrival_memory_ms))
        rate = max(sum(n for t, n in self._recent if t >= clock - window), self._peak_count(window)) / window
        latencies = [j.deadline_ms - j.arrival_ms for j in jobs if math.isfinite(j.deadline_ms)]
        return Arrivals(
            rate_per_ms=rate,
            n_tokens=max(j.n_tokens for j in jobs),
            latency_ms=min(latencies) if latencies else self.cfg.target_p95_ms,
            max_batch=self.cfg.max_batch_size,
        )

    def _peak_count(self, window: float) -> int:
        """The most texts that arrived within any ``window`` ms of the remembered arrivals (0 when
        ``arrival_memory_ms`` is 0): one pass with a trailing pointer over the time-ordered record."""
        if self.cfg.arrival_memory_ms <= 0:
            return 0
        best = inside = start = 0
        times = list(self._recent)
        for arrival, n in times:
            inside += n
            while times[start][0] < arrival - window:
                inside -= times[start][1]
                start += 1
            best = max(best, inside)
        return best

    def _backlog(self) -> list[tuple[int, int, float, float | None]]:
        """The queued jobs as the worker would batch them, in order (oldest job's kind first, up to
        ``max_batch_size`` texts of that kind): (texts, tokens, earliest deadline, fixed budget or
        None for policy batches)."""
        pending = list(self.queue)
        batches: list[tuple[int, int, float, float | None]] = []
        while pending:
            group = self._next_batch(pending)
            for job in group:
                pending.remove(job)
            fixed = None if group[0].key == SLO else float(group[0].key)
            batches.append((sum(j.n_texts for j in group), max(j.n_tokens for j in group), min(j.deadline_ms for j in group), fixed))
        return batches

    async def _run(self, jobs: list[Job], budget: float) -> None:
        ids = [x for job in jobs for x in job.ids]
        start = now_ms()
        probabilities = await asyncio.get_running_loop().run_in_executor(self._executor, self.runner.run, ids, budget)
        elapsed = now_ms() - start
        self.latency.observe(budget, len(ids), max(len(x) for x in ids), elapsed)
        if self.observer:
            self.observer.batch(budget, len(ids), elapsed / 1e3)
        row = 0
        for job in jobs:
            if not job.future.done():  # a client that went away cancelled its future
                job.future.set_result(BatchResult(probabilities[row : row + job.n_texts], budget, start - job.arrival_ms, len(ids)))
            row += job.n_texts
