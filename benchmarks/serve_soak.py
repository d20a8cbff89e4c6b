"""Faults and hostile clients against a real ``baa serve`` on loopback: the HTTP-limit probes,
then a soak of mixed clients with one engine kill and one engine hang, then a SIGTERM with slow
connections open.

    python benchmarks/serve_soak.py RUN_DIR --out runs/serve_soak [--seconds 120] [--docs docs/serving.md]

* **Probes**, one at a time on an idle server, each with the peak resident memory of the server
  and its engine processes over idle (sampled every 20 ms): a 1 GB body declared by
  ``Content-Length`` and one streamed chunked, 50 MB of 10 M tiny texts (with ``/readyz``'s latency
  meanwhile), 10,000 headers, one 1 MiB header, 20 MB of headers, a stalled head, a stalled body,
  a body dripped a byte every 0.5 s, an idle connection, a lone surrogate, a client that leaves mid-body, an unknown route.
* **Soak** (``--seconds``): good requests (the run's test texts, Poisson at ``--rate``), bad ones
  (malformed JSON, wrong types, lone surrogates, unknown fields), oversized bodies and clients
  that disconnect mid-body, all at once; SIGKILL of the engine process at a third of the time and
  SIGSTOP of its successor at two thirds (the watchdog must kill and replace it). Responses by
  client kind and status, the time to the first 200 after each fault, restarts and disconnects
  from ``/metrics``, resident memory over time.
* **Shutdown**: three slow connections, then SIGTERM: exit code, seconds, what they were answered.

Writes ``serve_soak.json``, ``results.json`` (no accuracy rows), ``run_info.json`` and
``results.md`` into ``--out``; ``baa report`` renders the directory. With ``--docs FILE`` the
block between ``<!-- serve_soak:begin -->`` and ``<!-- serve_soak:end -->`` in FILE is replaced
by the same tables. Bounded: about ``--seconds`` + 90 s in all (well under 10 minutes by default).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import rss_mib, test_examples  # noqa: E402 - the sibling benchmark's helpers

from budgeted_attention.io import environment_info, write_json_atomic, write_text_atomic  # noqa: E402
from budgeted_attention.reporting.serve_soak import serve_soak_markdown  # noqa: E402
from budgeted_attention.rundir import RunDir  # noqa: E402

BEGIN, END = "<!-- serve_soak:begin -->", "<!-- serve_soak:end -->"


class MemoryWatch:
    """Peak resident memory of a process tree while a ``with`` block runs (a sampling thread)."""

    def __init__(self, pid: int, every_s: float = 0.02) -> None:
        self.pid, self.every_s, self.peak = pid, every_s, 0.0
        self._stop = threading.Event()

    def __enter__(self) -> MemoryWatch:
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_mib(self.pid))
            self._stop.wait(self.every_s)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mib(self.pid))


def get_json(url: str, timeout: float = 10.0) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {}


def status_of(raw: bytes) -> int | None:
    match = re.match(rb"HTTP/1\.1 (\d{3})", raw)
    return int(match.group(1)) if match else None


def raw_exchange(port: int, head: bytes, body_chunks=(), *, read_timeout: float = 30.0, answer_first: bool = True) -> dict:
    """Send ``head`` then the body chunks on a new connection, stopping as soon as the server answers
    (or closes); returns the status, the seconds until the answer and the bytes the client got out."""
    start = time.monotonic()
    sent, raw = 0, b""
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.settimeout(read_timeout)
        try:
            conn.sendall(head)
            sent += len(head)
            conn.setblocking(False)
            for chunk in body_chunks:
                view = memoryview(chunk)
                while view:
                    try:
                        n = conn.send(view)
                        view, sent = view[n:], sent + n
                    except BlockingIOError:
                        pass
                    if answer_first:
                        try:
                            raw = conn.recv(65536)
                            if raw or raw == b"":
                                raise StopIteration
                        except BlockingIOError:
                            pass
                    if not view:
                        break
                    time.sleep(0.0005)
        except (StopIteration, OSError):
            pass
        conn.setblocking(True)
        conn.settimeout(read_timeout)
        try:
            while True:
                chunk = conn.recv(65536)
                raw += chunk
                if not chunk or b"\r\n\r\n" in raw:
                    break
        except OSError:
            pass
    return {"status": status_of(raw), "seconds": time.monotonic() - start, "bytes_sent": sent}


def drip(port: int, head: bytes, *, every_s: float, give_up_s: float = 120.0) -> dict:
    """Send ``head``, then one byte of body every ``every_s`` seconds (each well inside the body
    timeout) until the server answers or closes; the status and the seconds until then."""
    start = time.monotonic()
    sent, raw = 0, b""
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(head)
        sent += len(head)
        while time.monotonic() - start < give_up_s:
            try:
                conn.sendall(b" ")
                sent += 1
            except OSError:
                pass
            readable, _, _ = select.select([conn], [], [], every_s)
            if readable:
                try:
                    raw = conn.recv(65536)
                except OSError:
                    pass
                break
    return {"status": status_of(raw), "seconds": time.monotonic() - start, "bytes_sent": sent}


def repeat(chunk: bytes, total: int):
    """``total`` bytes as ``chunk``-sized pieces (a generator: nothing is built in memory)."""
    for _ in range(total // len(chunk)):
        yield chunk


def chunked(chunk: bytes, total: int):
    for piece in repeat(chunk, total):
        yield b"%x\r\n%s\r\n" % (len(piece), piece)


def head(method: str = "POST", path: str = "/v1/classify", extra: str = "", length: int | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "content-type: application/json"]
    if length is not None:
        lines.append(f"content-length: {length}")
    return ("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode()


def metric(url: str, name: str) -> float:
    """The sum of one metric's samples in ``/metrics``."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name) and not line.startswith("#"))


def run_probes(port: int, pid: int) -> list[dict]:
    """Each hostile request once, on an idle server."""
    url = f"http://127.0.0.1:{port}"
    idle = rss_mib(pid)
    gigabyte = 10**9
    zeros = b"0" * (1 << 20)
    probes = []

    def probe(name: str, what: str, work) -> None:
        with MemoryWatch(pid) as watch:
            outcome = work()
        outcome.update(name=name, what=what, rss_peak_delta_mb=max(0.0, watch.peak - idle))
        probes.append(outcome)
        print(f"probe {name}: {outcome.get('status')} in {outcome.get('seconds', 0):.2f} s", file=sys.stderr)
        time.sleep(0.5)

    probe("body-1gb-declared", "POST with `Content-Length: 10^9`, then streams zeros",
          lambda: raw_exchange(port, head(length=gigabyte), repeat(zeros, gigabyte)))
    probe("body-1gb-chunked", "POST `Transfer-Encoding: chunked`, streams 1 GB",
          lambda: raw_exchange(port, head(extra="transfer-encoding: chunked\r\n"), chunked(zeros, gigabyte)))

    def tiny_texts() -> dict:
        # 50 MB of 10 M one-character texts, with /readyz timed from another connection meanwhile.
        body_size = 2 + 10_000_000 * 5  # ["a", ...]
        readyz: list[float] = []
        done = threading.Event()

        def probe_ready() -> None:
            while not done.is_set():
                start = time.monotonic()
                get_json(f"{url}/readyz")
                readyz.append((time.monotonic() - start) * 1e3)
                done.wait(0.05)

        watcher = threading.Thread(target=probe_ready, daemon=True)
        watcher.start()
        pieces = (b'["a", ' * 200_000 for _ in range(50))  # 50 x 1.2 MB of tiny texts
        outcome = raw_exchange(port, head(length=body_size), pieces)
        done.set()
        watcher.join()
        outcome["answer"] = f"{outcome['status']} (/readyz max {max(readyz):.0f} ms)" if readyz else None
        return outcome

    probe("texts-10m", "50 MB body of 10 M tiny texts (declared length)", tiny_texts)
    probe("headers-10k", "10,000 header lines", lambda: raw_exchange(port, head("GET", "/healthz", "".join(f"x-h{i}: v\r\n" for i in range(10_000)))))
    probe("header-1mib", "one 1 MiB header value, streamed", lambda: raw_exchange(
        port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nx-big: ", repeat(b"a" * 4096, 1 << 20)))
    probe("headers-20mb", "20 MB of 1 KiB header lines, streamed", lambda: raw_exchange(
        port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n", repeat(b"x-pad: " + b"a" * 1015 + b"\r\n", 20 << 20)))
    probe("slow-head", "sends half a request head, then nothing", lambda: raw_exchange(port, b"POST /v1/classify HTTP/1.1\r\nHost: x\r\n"))
    probe("slow-body", "declares 500 bytes, sends 10, then nothing", lambda: raw_exchange(port, head(length=500) + b'{"texts": '))
    probe("drip-body", "declares 500 bytes, sends 1 byte every 0.5 s", lambda: drip(port, head(length=500), every_s=0.5))
    probe("idle-connection", "connects and sends nothing", lambda: raw_exchange(port, b""))
    surrogate = b'{"texts": ["\\ud800"]}'
    probe("lone-surrogate", '`{"texts": ["\\ud800"]}`', lambda: raw_exchange(port, head(length=len(surrogate)) + surrogate))

    def leaves() -> dict:
        before = metric(url, "baa_client_disconnects_total")
        errors = metric(url, 'baa_requests_total{status="500"}')
        start = time.monotonic()
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall(head(length=1000) + b'{"texts": ["a')
            time.sleep(0.2)
        time.sleep(0.5)
        counted = metric(url, "baa_client_disconnects_total") - before
        new_errors = metric(url, 'baa_requests_total{status="500"}') - errors
        return {"status": None, "seconds": time.monotonic() - start, "answer": f"counted as disconnect: {counted:g}, 500s: {new_errors:g}"}

    probe("disconnect-mid-body", "sends part of a body and closes", leaves)
    probe("unknown-route", "GET /nope", lambda: raw_exchange(port, head("GET", "/nope")))
    return probes


# ---------------------------------------------------------------------------- the soak


BAD_BODIES = [b'{"texts": ["a"', b'{"texts": "not a list"}', b'{"texts": ["\\udfff"]}', b'{"texts": ["a"], "extra": 1}', b'{"texts": []}', b"\xff\xfe"]


async def soak(port: int, server_pid: int, texts: list[str], seconds: float, good_rate: float, body_limit: int, seed: int) -> dict:
    url = f"http://127.0.0.1:{port}"
    rng = random.Random(seed)
    records: list[tuple[float, str, str]] = []  # (seconds from start, client kind, status or "none")
    rss_series: list[tuple[float, float]] = []
    events: list[dict] = []
    start = time.monotonic()
    oversized = b'{"texts": ["' + b"a" * body_limit + b'"]}'

    def now() -> float:
        return time.monotonic() - start

    async def post(session: aiohttp.ClientSession, kind: str, data: bytes) -> None:
        try:
            async with session.post(f"{url}/v1/classify", data=data, headers={"content-type": "application/json"},
                                    timeout=aiohttp.ClientTimeout(total=30)) as response:
                await response.read()
                records.append((now(), kind, str(response.status)))
        except Exception:  # noqa: BLE001 - a reset or timeout is "no answer", counted as such
            records.append((now(), kind, "none"))

    async def disconnect() -> None:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(head(length=2000) + b'{"texts": ["half a')
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.close()
            records.append((now(), "disconnecting", "left"))
        except OSError:
            records.append((now(), "disconnecting", "none"))

    async def engine_pid() -> int | None:
        status, info = await asyncio.to_thread(get_json, f"{url}/v1/info")
        return info.get("engine_pid") if status == 200 else None

    async def fault(at: float, what: str, sig: int) -> None:
        await asyncio.sleep(max(0.0, at - now()))
        pid = await engine_pid()
        while pid is None and now() < seconds:  # the engine is still restarting from the last fault
            await asyncio.sleep(0.2)
            pid = await engine_pid()
        if pid is None:
            events.append({"what": what, "at_s": now(), "error": "no engine pid"})
            return
        os.kill(pid, sig)
        events.append({"what": what, "at_s": now(), "pid": pid})
        print(f"soak: {what} of engine {pid} at {now():.1f} s", file=sys.stderr)

    async def watch_memory() -> None:
        while now() < seconds:
            rss_series.append((now(), rss_mib(server_pid)))
            await asyncio.sleep(0.5)

    async def clients(session: aiohttp.ClientSession) -> None:
        pending = []
        rates = {"good": good_rate, "bad": good_rate / 5, "oversized": good_rate / 20, "disconnecting": good_rate / 10}
        clock = {kind: rng.expovariate(rate) for kind, rate in rates.items()}
        while True:
            kind = min(clock, key=clock.get)
            at = clock[kind]
            if at >= seconds:
                break
            clock[kind] = at + rng.expovariate(rates[kind])
            await asyncio.sleep(max(0.0, at - now()))
            if kind == "good":
                body = json.dumps({"texts": [rng.choice(texts)]}).encode()
                pending.append(asyncio.create_task(post(session, kind, body)))
            elif kind == "bad":
                pending.append(asyncio.create_task(post(session, kind, rng.choice(BAD_BODIES))))
            elif kind == "oversized":
                pending.append(asyncio.create_task(post(session, kind, oversized)))
            else:
                pending.append(asyncio.create_task(disconnect()))
        await asyncio.gather(*pending)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
        await asyncio.gather(clients(session), fault(seconds / 3, "SIGKILL", signal.SIGKILL),
                             fault(2 * seconds / 3, "SIGSTOP (hang)", signal.SIGSTOP), watch_memory())
    for event in events:
        later = [t for t, kind, status in records if kind == "good" and status == "200" and t > event["at_s"]]
        event["recovered_s"] = (min(later) - event["at_s"]) if later else None
    by_kind: dict[str, Counter] = defaultdict(Counter)
    for _, kind, status in records:
        by_kind[kind][status] += 1
    good = by_kind["good"]
    return {
        "seconds": seconds, "good_rate": good_rate, "events": events,
        "by_kind": {kind: dict(counts) for kind, counts in by_kind.items()},
        "good_ok": good.get("200", 0), "good_total": sum(good.values()),
        "good_unanswered": good.get("none", 0),  # a reset or a timeout: no answer at all (a 503 is an answer)
        "server_errors": sum(n for counts in by_kind.values() for s, n in counts.items() if s.isdigit() and int(s) >= 500 and s != "503"),
        "rss_series": rss_series, "rss_idle_mb": rss_series[0][1] if rss_series else None,
        "rss_peak_mb": max((m for _, m in rss_series), default=None), "rss_end_mb": rss_mib(server_pid),
    }


def shutdown_with_slow_clients(server: subprocess.Popen, port: int, drain_s: float) -> dict:
    slow = []
    for partial in (b"POST /v1/classify HTTP/1.1\r\nHost: x\r\n", head(length=500) + b'{"texts": [', head(length=500)):
        conn = socket.create_connection(("127.0.0.1", port))
        conn.sendall(partial)
        slow.append(conn)
    time.sleep(0.3)
    start = time.monotonic()
    server.send_signal(signal.SIGTERM)
    code = server.wait(timeout=120)
    seconds = time.monotonic() - start
    answers = []
    for conn in slow:
        conn.settimeout(5)
        try:
            answers.append(str(status_of(conn.recv(4096)) or "closed"))
        except OSError:
            answers.append("reset")
        conn.close()
    return {"slow_connections": len(slow), "shutdown_timeout_s": drain_s, "exit_code": code, "seconds": seconds, "answers": answers}


def replace_block(path: Path, markdown: str, command: str) -> None:
    text = path.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise SystemExit(f"error: '{path}' has no {BEGIN} ... {END} block to replace")
    block = f"{BEGIN}\n<!-- written by: {command} -->\n\n{markdown.rstrip()}\n\n{END}"
    before, rest = text.split(BEGIN, 1)
    write_text_atomic(path, before + block + rest.split(END, 1)[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--out", required=True, help="run directory for the results, e.g. runs/serve_soak")
    parser.add_argument("--port", type=int, default=8791)
    parser.add_argument("--seconds", type=float, default=120.0, help="length of the soak")
    parser.add_argument("--rate", type=float, default=20.0, help="good requests per second during the soak")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="server setting, passed to baa serve --set")
    parser.add_argument("--docs", help="also replace the serve_soak block of this Markdown file (docs/serving.md)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run_dir = Path(args.run_dir)
    texts = [text for text, _ in test_examples(run_dir)]
    drain_s = 5.0
    settings = ["expose_paths=true", f"shutdown_timeout_s={drain_s:g}", *args.set]  # the engine's pid, to kill it
    command = [sys.executable, "-m", "budgeted_attention.cli", "serve", str(run_dir), "--port", str(args.port), "--log-level", "warning"]
    for setting in settings:
        command += ["--set", setting]
    started = time.monotonic()
    server = subprocess.Popen(command, stderr=open(out / "server.log", "w"))  # noqa: SIM115 - lives as long as the server
    url = f"http://127.0.0.1:{args.port}"
    while time.monotonic() - started < 300:
        try:
            if get_json(f"{url}/readyz", 2)[0] == 200:
                break
        except OSError:
            pass
        if server.poll() is not None:
            raise SystemExit(f"error: the server exited with code {server.returncode} (see {out / 'server.log'})")
        time.sleep(0.2)
    ready = time.monotonic() - started
    info = get_json(f"{url}/v1/info")[1]
    body_limit = int(info["config"]["max_body_bytes"]) or int(info["config"]["max_texts"]) * (12 * int(info["config"]["max_text_chars"]) + 8) + 4096
    wall = time.monotonic()
    try:
        probes = run_probes(args.port, server.pid)
        soak_result = asyncio.run(soak(args.port, server.pid, texts, args.seconds, args.rate, body_limit, args.seed))
        # The SIGSTOPped engine may still be restarting: wait for ready, then read the counters.
        while time.monotonic() - wall < args.seconds + 600 and get_json(f"{url}/readyz")[0] != 200:
            time.sleep(0.2)
        soak_result["restarts"] = metric(url, "baa_engine_restarts_total")
        soak_result["disconnects"] = metric(url, "baa_client_disconnects_total")
        shutdown = shutdown_with_slow_clients(server, args.port, drain_s)
    finally:
        if server.poll() is None:
            server.kill()
    environment = environment_info()
    shown = " ".join(["baa serve", str(run_dir), "--port", str(args.port), *[f"--set {s}" for s in settings]])
    result = {
        "setting": {"server_command": shown, "ready_seconds": ready, "cpu": environment.get("processor"), "body_limit": body_limit},
        "probes": probes, "soak": soak_result, "shutdown": shutdown, "wall_time_s": time.monotonic() - wall,
    }
    markdown = serve_soak_markdown(result)
    invocation = " ".join(["python", "benchmarks/serve_soak.py", *sys.argv[1:]])
    run = RunDir(out)
    write_json_atomic(run.serve_soak, result)
    write_json_atomic(run.results_json, {"rows": [], "wall_time_s": result["wall_time_s"], "kind": "serve_soak"})
    write_json_atomic(run.run_info, {"seeds": [args.seed], "environment": environment,
                                    "invocations": [{"command": ["python", "benchmarks/serve_soak.py", *sys.argv[1:]]}]})
    write_text_atomic(run.results_md, markdown)
    if args.docs:
        replace_block(Path(args.docs), markdown, invocation)
    print(markdown)


if __name__ == "__main__":
    main()
