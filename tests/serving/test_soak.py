"""benchmarks/serve_soak.py end to end on the tiny run, shortened (timeouts of 1 s, a 20 s soak):
every probe gets the answer the limits promise, the soak's engine kill and hang are recovered
from with no server error, and ``baa report`` renders the run directory."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("aiohttp", reason="the serve extra is not installed")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "serve_soak.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_the_soak_benchmark_survives_its_faults(tiny_run, tmp_path):
    out, docs = tmp_path / "soak", tmp_path / "serving.md"
    docs.write_text("before\n<!-- serve_soak:begin -->\nold\n<!-- serve_soak:end -->\nafter\n")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tiny_run), "--out", str(out), "--port", str(free_port()), "--seconds", "20", "--rate", "8",
         "--docs", str(docs), "--set", "header_timeout_s=1", "--set", "body_timeout_s=1", "--set", "warmup_batches=0",
         "--set", "calibration_batch_sizes=[1]", "--set", "watchdog_min_ms=500", "--set", "heartbeat_s=0.5"],
        capture_output=True, text=True, timeout=400,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / "serve_soak.json").read_text())
    answers = {p["name"]: p["status"] for p in result["probes"]}
    assert answers == {
        "body-1gb-declared": 413, "body-1gb-chunked": 413, "texts-10m": 413, "headers-10k": 431, "header-1mib": 431,
        "headers-20mb": 431, "slow-head": 408, "slow-body": 408, "drip-body": 408, "idle-connection": None, "lone-surrogate": 422,
        "disconnect-mid-body": None, "unknown-route": 404,
    }
    assert all(p["rss_peak_delta_mb"] < 50 for p in result["probes"])
    soak = result["soak"]
    assert soak["server_errors"] == 0 and soak["restarts"] == 2 and soak["good_ok"] > 0
    assert soak["good_unanswered"] == 0 and "none" not in soak["by_kind"]["good"]  # every good request got an answer
    assert [e["what"] for e in soak["events"]] == ["SIGKILL", "SIGSTOP (hang)"]
    assert all(e["recovered_s"] is not None for e in soak["events"])
    assert result["shutdown"]["exit_code"] == 0
    assert "Traceback" not in (out / "server.log").read_text()
    text = docs.read_text()
    assert text.startswith("before\n<!-- serve_soak:begin -->\n<!-- written by: python benchmarks/serve_soak.py") and text.endswith("<!-- serve_soak:end -->\nafter\n")
    assert "| body-1gb-declared |" in text and "old" not in text
    report = tmp_path / "report.md"
    rendered = subprocess.run([sys.executable, "-m", "budgeted_attention.cli", "report", str(out), "--out", str(report)], capture_output=True, text=True)
    assert rendered.returncode == 0, rendered.stderr
    assert "faults and hostile clients (`serve_soak.json`)" in report.read_text()
