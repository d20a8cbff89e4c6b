"""`baa serve` as a real process: start, answer, and a graceful SIGTERM (exit code 0)."""

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("uvicorn", reason="the serve extra is not installed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, data=None):
    request = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, json.loads(response.read())


def wait_ready(port: int, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if get(f"http://127.0.0.1:{port}/readyz")[0] == 200:
                return
        except OSError:
            time.sleep(0.2)


def serve(run_dir, port, *settings, **popen):
    command = [sys.executable, "-m", "budgeted_attention.cli", "serve", str(run_dir), "--port", str(port), "--log-level", "warning",
               "--set", "warmup_batches=0", "--set", "calibration_batch_sizes=[1]"]
    for setting in settings:
        command += ["--set", setting]
    return subprocess.Popen(command, **popen)


@pytest.mark.slow
def test_serve_answers_and_shuts_down_cleanly(tiny_run):
    port = free_port()
    server = serve(tiny_run, port)
    try:
        wait_ready(port)
        status, body = get(f"http://127.0.0.1:{port}/v1/classify", json.dumps({"texts": ["the team won"], "budget": 0.5}).encode())
        assert status == 200 and body["budget"] == 0.5
    finally:
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=60)
    assert code == 0


@pytest.mark.slow
def test_the_ready_benchmark_times_fresh_starts(tiny_run, tmp_path):
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "serve_ready.py"
    out = tmp_path / "ready"
    done = subprocess.run(
        [sys.executable, str(script), str(tiny_run), "--out", str(out), "--starts", "1", "--port", str(free_port()),
         "--set", "warmup_batches=0", "--set", "calibration_batch_sizes=[1]"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads((out / "ready.json").read_text())
    assert len(result["ready_seconds"]) == 1 and 0 < result["ready_seconds"][0] < 300
    assert "Start to ready over 1 start(s)" in (out / "results.md").read_text()


@pytest.mark.slow
def test_sigterm_with_slow_clients_exits_within_the_drain_time(tiny_run):
    port = free_port()
    server = serve(tiny_run, port, "shutdown_timeout_s=2", stderr=subprocess.PIPE, text=True)
    slow = []
    try:
        wait_ready(port)
        for partial in (b"POST /v1/classify HTTP/1.1\r\nHost: x\r\n",  # a head that never ends
                        b"POST /v1/classify HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: 500\r\n\r\n{\"texts\": [",
                        b"POST /v1/classify HTTP/1.1\r\nHost: x\r\ncontent-length: 500\r\n\r\n"):
            conn = socket.create_connection(("127.0.0.1", port))
            conn.sendall(partial)
            slow.append(conn)
        time.sleep(0.3)
        started = time.monotonic()
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=60)
        took = time.monotonic() - started
    finally:
        if server.poll() is None:
            server.kill()
    answers = []
    for conn in slow:
        conn.settimeout(5)
        try:
            answers.append(conn.recv(4096))
        except OSError:
            answers.append(b"")
        conn.close()
    assert code == 0 and took < 10, (code, took)
    assert all(a == b"" or a.startswith(b"HTTP/1.1 503") for a in answers), answers
    assert sum(a.startswith(b"HTTP/1.1 503") for a in answers) == 2  # the two with a body on its way
    assert "Traceback" not in server.stderr.read()
