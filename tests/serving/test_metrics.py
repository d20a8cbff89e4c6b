"""Prometheus metrics with several worker processes: a worker that exited stops counting."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("prometheus_client")

# Each snippet runs in a process of its own: prometheus_client picks its multiprocess storage when
# it is imported, from PROMETHEUS_MULTIPROC_DIR.
WORKER = """
import sys
from budgeted_attention.serving.metrics import ServerMetrics, worker_exited
m = ServerMetrics()
m.queue({queued})
m.request(200, 0.01, 0.5)
if {clean}:
    worker_exited()
"""
READER = """
from budgeted_attention.serving.metrics import ServerMetrics
m = ServerMetrics()
m.queue(2)
body, _ = m.exposition()
print(body.decode())
"""


def _run(code: str, directory) -> str:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _value(body: str, name: str) -> float:
    lines = [line for line in body.splitlines() if line.startswith(name + " ") or line.startswith(name + "{")]
    assert len(lines) == 1, lines
    return float(lines[0].rsplit(" ", 1)[1])


def test_queue_gauge_counts_live_workers_only_and_counters_keep_everything(tmp_path):
    _run(WORKER.format(queued=5, clean=False), tmp_path)  # a worker that died without marking itself
    _run(WORKER.format(queued=7, clean=True), tmp_path)  # one that shut down cleanly
    body = _run(READER, tmp_path)
    assert _value(body, "baa_queue_texts") == 2  # only the reader's own queue; 5 and 7 are gone
    assert _value(body, 'baa_requests_total{status="200"}') == 2  # counters of exited workers still count
    assert not list(tmp_path.glob("gauge_live*"))[1:]  # the dead workers' live files were removed
