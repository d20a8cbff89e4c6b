"""Prometheus metrics of the server, correct with one or several worker processes.

With several uvicorn workers each process counts in its own memory-mapped files under
``PROMETHEUS_MULTIPROC_DIR`` (``baa serve --workers N`` sets it up), and ``/metrics`` aggregates
them with ``MultiProcessCollector``; with one worker the metrics live in a registry of their own
(so several apps in one process, as in the tests, do not collide).

Live gauges (the queue length) of a worker that exited must stop counting: prometheus_client
keeps a process's files until ``mark_process_dead(pid)``. A worker marks itself at shutdown
(:func:`worker_exited`), and ``/metrics`` forgets the files of workers that are no longer running
(a crash, or uvicorn's restart of a worker).
"""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from budgeted_attention.io import pid_alive

LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0)


def multiprocess_dir() -> str | None:
    """The shared metrics directory when running with several workers, else None."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def forget_dead_workers(directory: str) -> list[int]:
    """Mark the workers whose live-gauge files remain in ``directory`` but whose process is gone
    as dead (their gauges then stop counting); returns their process ids."""
    from prometheus_client import multiprocess  # noqa: PLC0415 - multiprocess mode only with several workers

    dead = set()
    for path in Path(directory).glob("gauge_live*_*.db"):
        pid = path.stem.rsplit("_", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            dead.add(int(pid))
    for pid in sorted(dead):
        try:
            multiprocess.mark_process_dead(pid, directory)
        except FileNotFoundError:  # another worker's scrape removed the files first
            pass
    return sorted(dead)


def worker_exited() -> None:
    """Called by a worker at shutdown: its live gauges stop counting (multiprocess mode only)."""
    directory = multiprocess_dir()
    if directory:
        from prometheus_client import multiprocess  # noqa: PLC0415 - multiprocess mode only with several workers

        multiprocess.mark_process_dead(os.getpid(), directory)


def budget_label(budget: float | None) -> str:
    return "none" if budget is None else f"{budget:g}"


class ServerMetrics:
    """The server's counters, histograms and gauges (names prefixed ``baa_``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("baa_requests", "Classification requests by HTTP status", ["status"], registry=r)
        self.texts = Counter("baa_texts", "Texts classified, by budget", ["budget"], registry=r)
        self.latency = Histogram(
            "baa_request_latency_seconds", "Request latency from arrival to answer, by budget used", ["budget"],
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.batch_seconds = Histogram(
            "baa_batch_seconds", "Model time per batch, by budget", ["budget"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.batch_size = Histogram("baa_batch_texts", "Texts per batch", buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=r)
        self.shed_count = Counter("baa_shed", "Requests refused or dropped under load, by reason", ["reason"], registry=r)
        self.restarts = Counter("baa_engine_restarts", "Engine processes restarted after they died or hung", registry=r)
        self.disconnects = Counter("baa_client_disconnects", "Clients that went away before their answer (not server errors)", registry=r)
        # Gauges: the sum over workers of waiting texts; the budget of the latest batch of any worker.
        self.queue_texts = Gauge("baa_queue_texts", "Texts waiting in the queue", multiprocess_mode="livesum", registry=r)
        self.budget_in_use = Gauge("baa_budget_in_use", "Budget of the latest batch", multiprocess_mode="mostrecent", registry=r)

    # BatchObserver hooks (called by the batcher)
    def batch(self, budget: float, n_texts: int, seconds: float) -> None:
        self.batch_seconds.labels(budget_label(budget)).observe(seconds)
        self.batch_size.observe(n_texts)
        self.texts.labels(budget_label(budget)).inc(n_texts)
        self.budget_in_use.set(budget)

    def shed(self, reason: str, n: int = 1) -> None:
        self.shed_count.labels(reason).inc(n)

    def queue(self, n_texts: int) -> None:
        self.queue_texts.set(n_texts)

    def request(self, status: int, seconds: float | None = None, budget: float | None = None) -> None:
        self.requests.labels(str(status)).inc()
        if seconds is not None:
            self.latency.labels(budget_label(budget)).observe(seconds)

    def exposition(self) -> tuple[bytes, str]:
        """(body, content type) of ``GET /metrics``: this process's metrics, or every worker's."""
        directory = multiprocess_dir()
        if directory:
            from prometheus_client import multiprocess  # noqa: PLC0415 - multiprocess mode only with several workers

            forget_dead_workers(directory)
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry, path=directory)
            return generate_latest(registry), CONTENT_TYPE_LATEST
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
