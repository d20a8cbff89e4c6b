"""The server's HTTP limits, checked against a real uvicorn with the guarded protocol: request
heads bounded (431) and timed (408), bodies refused before parsing (413), invalid Unicode 422,
disconnects counted apart from errors, one error shape, API key and Host checks."""

from __future__ import annotations

import json
import select
import socket
import threading
import time

import pytest

pytest.importorskip("uvicorn", reason="the serve extra is not installed")
import uvicorn  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from budgeted_attention.serving import http  # noqa: E402
from budgeted_attention.serving.app import create_app, hide_paths  # noqa: E402
from budgeted_attention.serving.config import ServeConfig  # noqa: E402

FAST = dict(freeze_gc=False, warmup_batches=0, calibration_batch_sizes=[1], max_texts=4, max_text_chars=200, max_batch_size=4, engine_process=False)
LIMITS = dict(max_headers=40, max_header_bytes=4096, header_timeout_s=1.0, body_timeout_s=1.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(client, seconds=60.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if client.get("/readyz").status_code == 200:
            return
        time.sleep(0.05)
    raise AssertionError("server never became ready")


@pytest.fixture(scope="module")
def server(tiny_run):
    """(port, app) of a real uvicorn serving the tiny run with small limits, in a thread."""
    cfg = ServeConfig(budgets=[0.5, 1.0], **FAST, **LIMITS)
    app = create_app(tiny_run, cfg)
    port = free_port()
    protocol = http.GuardedHttpProtocol
    saved = protocol.limits
    protocol.limits = http.HeadLimits.of(cfg)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, http=http.GUARDED_HTTP, log_level="warning", timeout_keep_alive=1)
    runner = uvicorn.Server(config)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (runner.started and app.state.baa.serving()):
        time.sleep(0.05)
    assert app.state.baa.serving(), "server never became ready"
    yield port, app
    runner.should_exit = True
    thread.join(30)
    protocol.limits = saved


def exchange(port: int, data: bytes, *, read_timeout: float = 10.0, pause: float = 0.0) -> tuple[int | None, bytes, float]:
    """Send ``data`` on a new connection; (status, response bytes, seconds until the server closed)."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.settimeout(read_timeout)
        try:
            conn.sendall(data)
            if pause:
                time.sleep(pause)
        except OSError:  # the server closed while we were still sending: read what it answered
            pass
        chunks = []
        try:
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        except (ConnectionResetError, TimeoutError):
            pass
    raw = b"".join(chunks)
    status = int(raw.split(b" ", 2)[1]) if raw.startswith(b"HTTP/1.1 ") else None
    return status, raw, time.monotonic() - start


def body_of(raw: bytes) -> dict:
    return json.loads(raw.split(b"\r\n\r\n", 1)[1])


def request_head(path="/v1/classify", method="POST", extra=b"", length: int | None = None) -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n".encode() + extra
    if length is not None:
        head += f"content-length: {length}\r\n".encode()
    return head + b"\r\n"


def test_a_good_request_passes_the_guards(server):
    port, _ = server
    body = json.dumps({"texts": ["the team won"], "budget": 0.5}).encode()
    status, raw, _ = exchange(port, request_head(length=len(body)) + body + b"", read_timeout=10)
    assert status == 200 and body_of(raw)["budget"] == 0.5


def test_too_many_headers_get_431(server):
    port, _ = server
    extra = b"".join(f"x-h{i}: v\r\n".encode() for i in range(1000))
    status, raw, _ = exchange(port, request_head(method="GET", path="/healthz", extra=extra))
    assert status == 431 and "serve.max_headers" in body_of(raw)["error"]


def test_a_huge_header_is_refused_before_it_arrives_whole(server):
    port, _ = server
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nx-big: ")
        sent, answered_at = 0, None
        try:
            while sent < 1 << 20 and answered_at is None:  # up to 1 MiB of one header value, 1 KiB at a time
                conn.sendall(b"a" * 1024)
                sent += 1024
                if select.select([conn], [], [], 0.002)[0]:
                    answered_at = sent
        except OSError:
            pass
        conn.settimeout(5)
        status_line = conn.recv(65536)
    assert status_line.startswith(b"HTTP/1.1 431"), status_line[:80]
    assert answered_at is not None and answered_at < 256 << 10  # answered after about the 4 KiB limit, not a mebibyte


def test_a_declared_oversized_body_gets_413_without_being_read(server):
    port, app = server
    limit = app.state.baa.cfg.body_limit()
    status, raw, seconds = exchange(port, request_head(length=10**9) + b'{"texts": ["', read_timeout=5)
    assert status == 413 and str(limit) in body_of(raw)["error"] and b"connection: close" in raw.lower()
    assert seconds < 3  # answered from the Content-Length, not after a gigabyte


def test_a_streamed_oversized_body_gets_413_once_past_the_limit(server):
    port, app = server
    limit = app.state.baa.cfg.body_limit()
    chunk = b"a" * 65536
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(request_head(extra=b"transfer-encoding: chunked\r\n"))
        sent = 0
        try:
            while sent < 64 << 20:  # 64 MiB offered
                conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
        except OSError:
            pass
        conn.settimeout(5)
        answer = conn.recv(65536)
    assert answer.startswith(b"HTTP/1.1 413") and str(limit).encode() in answer, answer[:80]
    assert sent < 16 << 20  # closed after the limit; what got through sat in the kernel's socket buffers


def test_a_stalled_head_gets_408_after_the_header_timeout(server):
    port, _ = server
    status, raw, seconds = exchange(port, b"POST /v1/classify HTTP/1.1\r\nHost: x\r\n", read_timeout=10)
    assert status == 408 and "request head" in body_of(raw)["error"]
    assert 0.8 < seconds < 5


def test_a_stalled_body_gets_408_after_the_body_timeout(server):
    port, _ = server
    status, raw, seconds = exchange(port, request_head(length=100) + b'{"texts": ', read_timeout=10)
    assert status == 408 and "serve.body_timeout_s" in body_of(raw)["error"]
    assert 0.8 < seconds < 5


def test_a_dripped_body_gets_408_once_the_whole_body_is_late(server):
    """A body dripped a byte at a time, each well inside body_timeout_s, still has to be whole by then."""
    port, _ = server
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(request_head(length=100))
        raw = b""
        while time.monotonic() - start < 4 and not raw:
            try:
                conn.sendall(b" ")
            except OSError:
                pass
            ready, _, _ = select.select([conn], [], [], 0.25)
            if ready:
                raw = conn.recv(65536)
    seconds = time.monotonic() - start
    assert raw.startswith(b"HTTP/1.1 408") and "serve.body_timeout_s" in body_of(raw)["error"], raw[:200]
    assert seconds < 3


def test_connections_past_max_connections_get_503_and_are_closed():
    """uvicorn's limit_concurrency (serve.max_connections) bounds the connections held open."""

    async def hello(scope, receive, send):
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    port = free_port()
    config = uvicorn.Config(hello, host="127.0.0.1", port=port, http=http.GUARDED_HTTP, log_level="warning", limit_concurrency=3, lifespan="off")
    runner = uvicorn.Server(config)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not runner.started and time.monotonic() < deadline:
            time.sleep(0.02)
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]  # open and silent
        time.sleep(0.2)
        status, raw, seconds = exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", read_timeout=5)
        assert status == 503 and "serve.max_connections = 3" in body_of(raw)["error"] and b"retry-after: 1" in raw.lower()
        assert seconds < 2  # closed at once, not held
        held.pop().close()
        time.sleep(0.2)
        status, raw, _ = exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\nconnection: close\r\n\r\n", read_timeout=5)
        assert status == 200, raw
        for conn in held:
            conn.close()
    finally:
        runner.should_exit = True
        thread.join(30)


def responses(raw: bytes) -> list[tuple[int, bytes]]:
    """(status, body) of each response in ``raw`` (bodies with Content-Length)."""
    found = []
    while raw.startswith(b"HTTP/1.1 "):
        head, _, rest = raw.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        found.append((int(head.split(b" ", 2)[1]), rest[:length]))
        raw = rest[length:]
    return found


def test_a_pipelined_request_whose_body_arrives_after_the_first_answer_is_served(server):
    """The bytes of a body already being parsed are not counted as the next request head (no 431)."""
    port, _ = server
    small = json.dumps({"texts": ["a"], "budget": 1.0}).encode()
    big = json.dumps({"texts": ["\u00e9" * 200] * 4, "budget": 1.0}, ensure_ascii=True).encode()  # 4.8 KB, over max_header_bytes
    assert len(big) > LIMITS["max_header_bytes"]
    second = request_head(length=len(big)) + big
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.settimeout(10)
        conn.sendall(request_head(length=len(small)) + small + second[:200])  # request 1, then the start of request 2
        time.sleep(0.3)  # request 1 is answered meanwhile
        conn.sendall(second[200:])
        raw = b""
        while len(responses(raw)) < 2:
            chunk = conn.recv(65536)
            if not chunk:
                break
            raw += chunk
    assert [status for status, _ in responses(raw)] == [200, 200], raw[:600]


def test_a_get_with_a_chunked_body_gets_one_answer_and_is_closed(server):
    port, _ = server
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.settimeout(10)
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\ntransfer-encoding: chunked\r\n\r\n")
        chunk = b"a" * 8192
        try:
            for _ in range(8):  # 64 KB of body after the answer
                conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                time.sleep(0.02)
        except OSError:
            pass
        raw = b""
        try:
            while True:
                data = conn.recv(65536)
                if not data:
                    break
                raw += data
        except (ConnectionResetError, TimeoutError):
            pass
    assert [status for status, _ in responses(raw)] == [200], raw[:600]


def test_an_idle_connection_is_closed(server):
    port, _ = server
    status, raw, seconds = exchange(port, b"", read_timeout=10)
    assert status is None and raw == b"" and seconds < 5


def test_a_lone_surrogate_is_a_422_naming_the_text(server):
    port, _ = server
    body = b'{"texts": ["fine", "\\ud800"]}'
    status, raw, _ = exchange(port, request_head(length=len(body)) + body)
    assert status == 422 and "texts[1] is not valid Unicode" in body_of(raw)["error"]


def test_a_client_that_leaves_mid_body_is_counted_apart_from_errors(server, caplog):
    port, app = server
    before = app.state.baa.metrics.disconnects._value.get()
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(request_head(length=1000) + b'{"texts": ["a')
        time.sleep(0.2)
    deadline = time.monotonic() + 5
    while app.state.baa.metrics.disconnects._value.get() == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert app.state.baa.metrics.disconnects._value.get() == before + 1
    status, raw, _ = exchange(port, request_head(method="GET", path="/metrics"))
    assert b'baa_requests_total{status="500"}' not in raw and b"baa_client_disconnects_total" in raw
    assert not [r for r in caplog.records if r.exc_info]  # one line, no traceback


def test_unknown_routes_and_methods_use_the_one_error_shape(server):
    port, _ = server
    garbage = b"\x16\x03\x01 not HTTP at all\r\n\r\n"  # e.g. a TLS client on the plain port
    for head, code in ((request_head(method="GET", path="/nope"), 404), (request_head(method="GET"), 405), (garbage, 400)):
        status, raw, _ = exchange(port, head)
        assert status == code and set(body_of(raw)) == {"error"}


# ---------------------------------------------------------------- access (the middleware alone)


@pytest.fixture(scope="module")
def locked(tiny_run):
    app = create_app(tiny_run, ServeConfig(budgets=[1.0], min_budget=1.0, allowed_hosts=["api.example.com", "*.internal"], **FAST), api_key="s3cret-key")
    with TestClient(app, base_url="http://api.example.com") as client:
        wait_ready(client)
        yield client


def test_the_api_key_is_required_except_on_the_probes(locked):
    refused = locked.post("/v1/classify", json={"texts": ["a"]})
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer" and "API key" in refused.json()["error"]
    assert locked.post("/v1/classify", json={"texts": ["a"]}, headers={"Authorization": "Bearer wrong-key"}).status_code == 401
    assert locked.post("/v1/classify", json={"texts": ["a"]}, headers={"Authorization": "Bearer s3cret-key"}).status_code == 200
    for probe in ("/healthz", "/readyz", "/metrics"):
        assert locked.get(probe).status_code == 200


def test_the_probes_can_be_locked_too(tiny_run):
    app = create_app(tiny_run, ServeConfig(budgets=[1.0], min_budget=1.0, auth_probes=True, **FAST), api_key="s3cret-key")
    with TestClient(app) as client:
        assert client.get("/healthz").status_code == 401
        assert client.get("/healthz", headers={"Authorization": "Bearer s3cret-key"}).status_code == 200


def test_hosts_outside_the_allowed_list_are_refused(locked):
    key = {"Authorization": "Bearer s3cret-key"}
    assert locked.get("/v1/info", headers={**key, "Host": "evil.example.org"}).status_code == 400
    assert locked.get("/v1/info", headers={**key, "Host": "a.b.internal:8000"}).status_code == 200
    assert locked.get("/healthz", headers={"Host": "evil.example.org"}).status_code == 200  # probes come by IP


def guard_answers(guard: http.RequestGuard, headers: list[tuple[bytes, bytes]], path: str = "/v1/info") -> list[int]:
    """The statuses ``guard`` answers a GET of ``path`` with ``headers`` (200: passed to the app)."""
    import asyncio  # noqa: PLC0415

    sent = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def send(message):
        if message["type"] == "http.response.start":
            sent.append(message["status"])

    guard.app = app
    asyncio.run(guard({"type": "http", "method": "GET", "path": path, "headers": headers}, None, send))
    return sent


def test_a_second_host_or_authorization_header_is_refused():
    cfg = ServeConfig(allowed_hosts=["api.example.com"], **FAST)
    guard = http.RequestGuard(None, cfg, "s3cret-key", lambda status: None, lambda: None)
    key = (b"authorization", b"Bearer s3cret-key")
    assert guard_answers(guard, [(b"host", b"api.example.com"), key]) == [200]
    assert guard_answers(guard, [(b"host", b"evil.example.org"), (b"host", b"api.example.com"), key]) == [400]
    assert guard_answers(guard, [(b"host", b"api.example.com"), (b"host", b"evil.example.org"), key]) == [400]
    assert guard_answers(guard, [(b"host", b"api.example.com"), key, (b"authorization", b"Bearer other")]) == [400]
    assert guard_answers(guard, [(b"host", b"x"), (b"host", b"y")], path="/healthz") == [400]  # probes too


def test_info_tells_no_paths_or_process_ids(locked, tiny_run):
    info = locked.get("/v1/info", headers={"Authorization": "Bearer s3cret-key"})
    text = info.text
    assert str(tiny_run) not in text and '"pid"' not in text and "s3cret-key" not in text
    assert info.json()["checkpoint"].startswith("checkpoints/")


def test_hide_paths_keeps_the_last_part():
    assert hide_paths("no tokenizer.json in '/srv/runs/x' (needs /a/b/c.json)") == "no tokenizer.json in 'x' (needs c.json)"
    assert hide_paths("ratio 1/2 and http://host/path") == "ratio 1/2 and http://host/path"
    # a quoted path is taken whole: no tail of a folder name with spaces leaks
    assert hide_paths("no tokenizer.json in '/srv/my secret runs/run 1' (needs \"/a b/c d.json\")") == "no tokenizer.json in 'run 1' (needs \"c d.json\")"


def test_a_request_cancelled_by_the_shutdown_is_answered_503():
    import asyncio  # noqa: PLC0415

    async def never_answers(scope, receive, send):
        await asyncio.Event().wait()

    counted, sent = [], []
    guard = http.RequestGuard(never_answers, ServeConfig(**FAST), None, counted.append, lambda: None)

    async def main():
        scope = {"type": "http", "method": "GET", "path": "/v1/info", "headers": [(b"host", b"x")]}

        async def send(message):
            sent.append(message)

        task = asyncio.create_task(guard(scope, None, send))
        await asyncio.sleep(0.01)
        task.cancel()  # what uvicorn does past serve.shutdown_timeout_s
        await task  # ends normally: no traceback, no text 500 from uvicorn

    asyncio.run(main())
    assert counted == [503] and sent[0]["status"] == 503 and b"shutting down" in sent[1]["body"]
