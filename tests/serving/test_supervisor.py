"""The engine's supervisor: a dead or hung engine process is killed, restarted and recalibrated
without an operator; requests in flight get 503 with Retry-After, never 500; the server gives up
(``/healthz`` 503) after ``serve.max_restarts`` failed restarts."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from budgeted_attention.serving.config import ServeConfig
from budgeted_attention.serving.errors import EngineGone, EngineUnavailable
from budgeted_attention.serving.latency import LatencyModel
from budgeted_attention.serving.supervisor import FAILED, READY, RESTARTING, STOPPED, Supervisor

FAST = dict(freeze_gc=False, warmup_batches=0, calibration_batch_sizes=[1], max_texts=4, max_text_chars=200, max_batch_size=4)


class FakeEngine:
    """An engine 'in a child': ``hang`` makes calls time out, ``dead`` makes it exit."""

    in_child = True

    def __init__(self, number: int) -> None:
        self.number, self.hang, self.dead, self.killed, self.timeouts = number, False, False, False, []

    def run(self, ids, budget, timeout):
        self.timeouts.append(timeout)
        if self.hang or self.dead:
            raise EngineGone("did not answer" if self.hang else "exited")
        return [[1.0]] * len(ids)

    def ping(self, timeout):
        if self.hang:
            raise EngineGone("did not answer a heartbeat")

    def alive(self):
        return not self.dead and not self.killed

    def kill(self):
        self.killed = True

    def close(self):
        pass


def latency_model() -> LatencyModel:
    return LatencyModel({1.0: {1: 10.0, 4: 20.0}}, seq_len=8)


def wait_for(condition, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert condition()


def make_supervisor(fail_starts=0, **settings):
    engines, attempts = [], [0]

    def start():
        attempts[0] += 1
        if engines:
            threading.Event().wait(0.2)  # a restart takes a while (a real one loads a model)
        if len(engines) >= 1 and attempts[0] - 1 <= fail_starts:
            raise RuntimeError(f"start {attempts[0]} failed")
        engines.append(FakeEngine(len(engines)))
        return engines[-1]

    restarts = []
    cfg = ServeConfig(budgets=[1.0], min_budget=1.0, watchdog_min_ms=100, **FAST, **settings)
    supervisor = Supervisor(start, lambda engine: latency_model(), cfg, on_restart=lambda: restarts.append(1))
    supervisor.first_start()
    return supervisor, engines, restarts


def test_the_batch_deadline_comes_from_the_calibrated_latency():
    supervisor, engines, _ = make_supervisor(watchdog_factor=10)
    supervisor.run([[1, 2]], 1.0)
    assert engines[0].timeouts == [pytest.approx(0.1)]  # 10 x 10 ms is below the 100 ms floor
    supervisor.cfg.watchdog_factor = 50
    supervisor.run([[1] * 8] * 4, 1.0)  # the calibrated shape: 4 texts of 8 tokens
    assert engines[0].timeouts[-1] == pytest.approx(50 * 20.0 / 1e3)


def test_a_hung_engine_is_killed_restarted_and_the_batch_gets_unavailable():
    supervisor, engines, restarts = make_supervisor()
    engines[0].hang = True
    with pytest.raises(EngineUnavailable) as caught:
        supervisor.run([[1]], 1.0)
    assert caught.value.retry_after >= 1 and "restarting" in str(caught.value)
    assert engines[0].killed
    wait_for(lambda: supervisor.state == READY)
    assert supervisor.engine is engines[1] and restarts == [1] and supervisor.restarts == 1
    assert supervisor.run([[1]], 1.0) == [[1.0]]


def test_calls_while_restarting_are_refused_at_once():
    supervisor, engines, _ = make_supervisor()
    supervisor.state = RESTARTING
    with pytest.raises(EngineUnavailable):
        supervisor.run([[1]], 1.0)
    assert engines[0].timeouts == []


def test_the_heartbeat_finds_a_dead_or_stopped_idle_engine():
    supervisor, engines, _ = make_supervisor(heartbeat_s=0.01)
    engines[0].dead = True
    assert not supervisor.ready_now()
    wait_for(lambda: supervisor.state == READY)
    time.sleep(0.02)
    engines[1].hang = True  # stopped while idle: only the ping notices
    supervisor.check()
    assert engines[1].killed
    wait_for(lambda: supervisor.state == READY and supervisor.engine is engines[2])


def test_a_stale_heartbeat_does_not_kill_the_engine_that_replaced_its_engine():
    """check() read engine 0, which died and was replaced while it asked; its failed ping must
    not kill engine 1."""
    engines = []

    class Racing(FakeEngine):
        race = False

        def alive(self):
            if self.race:  # between check()'s read of the engine and its ping: death and a fast restart
                self.race, self.dead = False, True
                supervisor.ready_now()  # a probe finds it dead: the restart starts (and may be done at once)
                wait_for(lambda: supervisor.state == READY and supervisor.engine is not self)
                return True  # what check() acts on was read before the death
            return super().alive()

        def ping(self, timeout):
            if self.dead:
                raise EngineGone("exited")

    def start():
        engines.append(Racing(len(engines)))
        return engines[-1]

    cfg = ServeConfig(budgets=[1.0], min_budget=1.0, watchdog_min_ms=100, heartbeat_s=0.01, **FAST)
    supervisor = Supervisor(start, lambda engine: latency_model(), cfg)
    supervisor.first_start()
    time.sleep(0.05)
    engines[0].race = True
    supervisor.check()
    time.sleep(0.1)
    assert not engines[1].killed and supervisor.state == READY and supervisor.engine is engines[1] and len(engines) == 2


def test_after_max_restarts_failed_tries_the_supervisor_gives_up(monkeypatch):
    monkeypatch.setattr(time, "sleep", lambda s: None)  # no back-off waits in the test
    supervisor, engines, _ = make_supervisor(fail_starts=5, max_restarts=2)
    engines[0].dead = True
    supervisor.ready_now()
    wait_for(lambda: supervisor.state == FAILED)
    assert "could not be restarted (2 tries" in supervisor.reason and supervisor.restarts == 0


def test_a_restart_that_hangs_is_killed_at_its_deadline(monkeypatch):
    """A new child that hangs while it starts is killed past the restart deadline (RESTART_FACTOR x
    the last start, at least RESTART_FLOOR_S), and the next try brings the engine back."""
    from budgeted_attention.serving import supervisor as module  # noqa: PLC0415

    monkeypatch.setattr(module, "RESTART_FLOOR_S", 0.3)
    monkeypatch.setattr(time, "sleep", lambda s: None)  # no back-off waits in the test
    engines, hung = [], []

    class Starting(FakeEngine):
        def __init__(self, number):
            super().__init__(number)
            self.gone = threading.Event()

        def kill(self):
            super().kill()
            self.gone.set()

    def start():
        engine = Starting(len(engines))
        engines.append(engine)
        if len(engines) == 2:  # the first restart: its child runs, then hangs while loading
            supervisor.spawned(engine)
            hung.append(engine)
            if not engine.gone.wait(30):
                raise AssertionError("the hung start was never killed")
            raise EngineGone("the engine process exited (code -9) while starting")
        return engine

    cfg = ServeConfig(budgets=[1.0], min_budget=1.0, watchdog_min_ms=100, **FAST)
    supervisor = Supervisor(start, lambda engine: latency_model(), cfg)
    supervisor.first_start()
    assert supervisor.restart_deadline_s() == pytest.approx(0.3)  # the fake starts at once: the floor
    engines[0].dead = True
    started = time.monotonic()
    supervisor.ready_now()
    wait_for(lambda: supervisor.state == READY and supervisor.engine is not engines[0], 10)
    assert hung and hung[0].killed and supervisor.engine is engines[2]
    assert supervisor.failed_tries == 0 and supervisor.restarts == 1
    assert time.monotonic() - started < 5


def test_a_shutdown_during_the_first_load_is_not_held_by_it(monkeypatch):
    """SIGTERM while the model loads: the engine process still starting is killed and the lifespan
    ends at once, not when (if ever) the load finishes."""
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    from fastapi.testclient import TestClient  # noqa: PLC0415

    from budgeted_attention.serving import remote  # noqa: PLC0415
    from budgeted_attention.serving.app import create_app  # noqa: PLC0415

    loads = []

    class HungLoad:  # a RemoteEngine whose child runs, then never finishes loading
        def __init__(self, run_dir, cfg, *, seed=None, onnx_dir=None, on_spawn=None):
            self.gone = threading.Event()
            loads.append(self)
            if on_spawn is not None:
                on_spawn(self)
            self.gone.wait(10)
            raise EngineGone("the engine process exited (code -9) while starting")

        def kill(self):
            self.gone.set()

    monkeypatch.setattr(remote, "RemoteEngine", HungLoad)
    app = create_app("unused", ServeConfig(budgets=[1.0], min_budget=1.0, engine_process=True, **FAST))
    with TestClient(app) as client:
        wait_for(lambda: bool(loads))
        assert client.get("/readyz").status_code == 503
        started = time.monotonic()
    assert time.monotonic() - started < 3 and loads[0].gone.is_set()


def test_after_the_shutdown_began_a_failed_engine_is_not_restarted():
    supervisor, engines, restarts = make_supervisor()
    supervisor.shut_down()  # the lifespan's first step at shutdown, before the queue drains
    engines[0].hang = True
    with pytest.raises(EngineUnavailable, match="shutdown"):
        supervisor.run([[1]], 1.0)
    assert engines[0].killed and supervisor.state == STOPPED
    with pytest.raises(EngineUnavailable):  # the batches still queued fail at once
        supervisor.run([[1]], 1.0)
    time.sleep(0.3)
    assert len(engines) == 1 and restarts == [] and supervisor.restarts == 0


def test_giving_up_is_reported_once_and_not_during_a_shutdown(monkeypatch):
    monkeypatch.setattr(time, "sleep", lambda s: None)
    supervisor, engines, _ = make_supervisor(fail_starts=5, max_restarts=2)
    reasons = []
    supervisor._on_give_up = reasons.append
    engines[0].dead = True
    supervisor.ready_now()
    wait_for(lambda: supervisor.state == FAILED)
    assert len(reasons) == 1 and "could not be restarted" in reasons[0]
    closing, _, _ = make_supervisor()
    closing._on_give_up = reasons.append
    closing.shut_down()
    closing._give_up("model load abandoned: the server is shutting down")
    assert len(reasons) == 1


def test_a_worker_whose_model_cannot_load_exits_and_stops_the_server(tmp_path, monkeypatch):
    """--workers N: a worker that gave up exits (its /healthz 503 would alternate with the other
    workers' 200); one whose first load failed exits with uvicorn's start-up failure code (3),
    which makes uvicorn stop the server, and tells the parent why."""
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    from fastapi.testclient import TestClient  # noqa: PLC0415

    from budgeted_attention.serving import app as module  # noqa: PLC0415

    signals, exits = [], []
    monkeypatch.setattr(module.os, "kill", lambda pid, sig: signals.append((pid, sig)))
    monkeypatch.setattr(module.os, "_exit", exits.append)
    failed = tmp_path / "failed.txt"
    monkeypatch.setenv(module.ENV_FAILED_FILE, str(failed))
    app = module.create_app(tmp_path / "no-run", ServeConfig(budgets=[1.0], min_budget=1.0, engine_process=False, **FAST), exit_when_failed=True)
    with TestClient(app) as client:
        wait_for(lambda: bool(signals))
        assert client.get("/healthz").status_code == 503
    assert signals == [(os.getpid(), signal.SIGTERM)] and exits == [3]
    assert "model failed to load" in failed.read_text()


def test_a_model_in_this_process_is_not_supervised():
    class Local:
        in_child = False

        def run(self, ids, budget):
            raise ValueError("a batch failed")

    supervisor = Supervisor(Local, lambda engine: latency_model(), ServeConfig(budgets=[1.0], min_budget=1.0, **FAST))
    supervisor.first_start()
    with pytest.raises(ValueError, match="a batch failed"):
        supervisor.run([[1]], 1.0)
    assert supervisor.state == READY


# ---------------------------------------------------------------- the real engine process


def test_a_stopped_engine_under_load_gives_503s_then_serves_again(tiny_run):
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    from fastapi.testclient import TestClient  # noqa: PLC0415

    from budgeted_attention.serving.app import create_app  # noqa: PLC0415

    cfg = ServeConfig(budgets=[1.0], min_budget=1.0, watchdog_min_ms=300, heartbeat_s=0.2, **FAST)
    app = create_app(tiny_run, cfg)
    with TestClient(app) as client:
        wait_for(lambda: client.get("/readyz").status_code == 200, 120)
        engine, timing = app.state.baa.engine, app.state.baa.latency
        os.kill(engine.pid, signal.SIGSTOP)  # a hang: the process exists and never answers
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            responses = list(pool.map(lambda i: client.post("/v1/classify", json={"texts": [f"text {i}"]}), range(16)))
        statuses = [r.status_code for r in responses]
        assert 500 not in statuses and 503 in statuses, statuses
        assert all(int(r.headers["Retry-After"]) >= 1 for r in responses if r.status_code == 503)
        assert time.monotonic() - started < 30  # the watchdog's deadline, not the old 300 s
        wait_for(lambda: client.get("/readyz").status_code == 200, 120)
        assert app.state.baa.engine is not engine and not engine.alive()
        assert app.state.baa.latency is not timing and app.state.baa.batcher.latency is app.state.baa.latency  # recalibrated
        assert client.post("/v1/classify", json={"texts": ["after"]}).status_code == 200
        metrics = client.get("/metrics").text
        assert "baa_engine_restarts_total 1.0" in metrics and 'status="500"' not in metrics


# ---------------------------------------------------------------- baa serve as a process


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, data: bytes | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def serve_command(run_dir, port, *extra) -> list[str]:
    return [sys.executable, "-m", "budgeted_attention.cli", "serve", str(run_dir), "--port", str(port), "--log-level", "warning",
            "--set", "warmup_batches=0", "--set", "calibration_batch_sizes=[1]", *extra]


def test_a_busy_port_fails_before_the_model_loads(tiny_run):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        done = subprocess.run(serve_command(tiny_run, port), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip() == f"baa: error: --port {port}: 127.0.0.1:{port} is already in use"
    assert time.monotonic() - started < 60


def test_weights_that_fail_their_hash_stop_the_server_with_exit_2(tiny_run, tmp_path):
    import shutil  # noqa: PLC0415

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    weights = run / "checkpoints" / "seed0" / "budgeted-hard.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    done = subprocess.run(serve_command(run, free_port()), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "SHA-256 differs" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def spawned_children(pid: int) -> list[int]:
    """Process ids of ``pid``'s children started by multiprocessing's spawn (not its resource tracker)."""
    children = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as listing:
            children += [int(c) for c in listing.read().split()]
    found = []
    for child in children:
        try:
            with open(f"/proc/{child}/cmdline", "rb") as cmdline:
                command = cmdline.read()
        except OSError:
            continue
        if b"multiprocessing.spawn" in command and b"resource_tracker" not in command:
            found.append(child)
    return found


def engine_children(server_pid: int) -> list[int]:
    """The engine processes of a ``--workers N`` server: uvicorn's workers are its spawned
    children, and each worker's engine is a spawned child of that worker."""
    return [engine for worker in spawned_children(server_pid) for engine in spawned_children(worker)]


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="finds the engine processes through /proc")
def test_with_two_workers_a_killed_engine_comes_back(tiny_run):
    port = free_port()
    server = subprocess.Popen(serve_command(tiny_run, port, "--workers", "2"))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and len(engine_children(server.pid)) < 2:
            time.sleep(0.2)
        while time.monotonic() < deadline:
            try:
                if all(get(f"{url}/readyz")[0] == 200 for _ in range(6)):
                    break
            except OSError:
                pass
            time.sleep(0.2)
        engines = engine_children(server.pid)
        assert len(engines) == 2, engines
        os.kill(engines[0], signal.SIGKILL)
        statuses = []
        body = json.dumps({"texts": ["the team won"], "budget": 1.0}).encode()
        until = time.monotonic() + 120
        while time.monotonic() < until:
            statuses.append(get(f"{url}/v1/classify", body)[0])
            if len(statuses) > 10 and statuses[-10:] == [200] * 10 and len(set(engine_children(server.pid)) - set(engines)) == 1:
                break
            time.sleep(0.05)
        assert 500 not in statuses and statuses[-10:] == [200] * 10, statuses
        assert len(set(engine_children(server.pid)) - set(engines)) == 1  # one new engine process
        restarts = [line for line in urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode().splitlines()
                    if line.startswith("baa_engine_restarts_total")]
        assert restarts == ["baa_engine_restarts_total 1.0"]
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0


def test_another_runs_tokenizer_stops_the_server_with_exit_2(tiny_run, tmp_path):
    import shutil  # noqa: PLC0415

    from budgeted_attention.errors import CheckpointError  # noqa: PLC0415
    from budgeted_attention.serving.engine import Engine  # noqa: PLC0415

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    tokenizer = run / "tokenizer.json"
    data = json.loads(tokenizer.read_text())
    vocab = data["model"]["vocab"]
    data["model"]["vocab"] = {token: len(vocab) - 1 - index for token, index in vocab.items()}  # same words, reordered
    tokenizer.write_text(json.dumps(data))
    done = subprocess.run(serve_command(run, free_port()), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert f"'{tokenizer}' is not the tokenizer" in done.stderr and "budgeted-hard.json" in done.stderr
    with pytest.raises(CheckpointError, match="is not the tokenizer"):  # the engine checks too (what the child loads)
        Engine(run, ServeConfig(budgets=[1.0], min_budget=1.0, **FAST))
