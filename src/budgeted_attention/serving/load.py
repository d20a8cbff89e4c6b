"""Load generation and its summary for the loopback load test of ``baa serve``
(``benchmarks/serve_load.py``): open-loop Poisson and bursty (on/off) arrivals, closed-loop
capacity, and per-trial throughput, latency percentiles, SLO attainment and effective accuracy.

Open loop: every request is sent at its scheduled time whether or not earlier ones have been
answered, as independent users do, so an overloaded server shows queueing and shedding instead of
slowing the client down (the closed-loop mistake).

The client is an ``aiohttp`` session: the load generator shares the machine with the server, and
on 2 cores httpx's per-request CPU cost capped a do-nothing server at about 240 requests/s where
aiohttp reached about 2,600, so an httpx client would have measured itself, not the server.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from budgeted_attention.serving.config import snap_to


def aiohttp_timeout(seconds: float):
    import aiohttp  # noqa: PLC0415 - the load test's client (the serve extra), not needed by the server

    return aiohttp.ClientTimeout(total=seconds)


def poisson_arrivals(rate: float, seconds: float, rng: random.Random) -> list[float]:
    """Send times (s from the start) of a Poisson process of ``rate`` requests/s over ``seconds``."""
    times, clock = [], 0.0
    while True:
        clock += rng.expovariate(rate)
        if clock >= seconds:
            return times
        times.append(clock)


BURST_ON_S, BURST_OFF_S = 1.0, 1.0  # bursty arrivals: 1 s bursts at twice the mean rate, 1 s pauses


def bursty_arrivals(rate: float, seconds: float, rng: random.Random, on_s: float = BURST_ON_S, off_s: float = BURST_OFF_S) -> list[float]:
    """On/off arrivals with mean ``rate``: Poisson at ``rate * (on_s + off_s) / on_s`` during each
    ``on_s`` burst, nothing during the ``off_s`` pause after it."""
    burst_rate = rate * (on_s + off_s) / on_s
    times, period = [], on_s + off_s
    for start in poisson_arrivals(burst_rate, seconds * on_s / period, rng):
        cycle = math.floor(start / on_s)
        times.append(cycle * period + (start - cycle * on_s))
    return [t for t in times if t < seconds]


ARRIVALS: dict[str, Callable[[float, float, random.Random], list[float]]] = {"poisson": poisson_arrivals, "bursty": bursty_arrivals}


@dataclass
class Record:
    """One request: when it was sent, how long it took, what came back."""

    sent_s: float
    latency_ms: float
    status: int  # HTTP status; 0 = no response (timeout, connection error)
    label: int | None = None  # the true label
    predicted: int | None = None
    budget: float | None = None
    queue_ms: float | None = None  # the server's own account of the wait before its batch ran
    batch_size: int | None = None  # texts in the batch it ran in


async def send_open_loop(
    client: Any, url: str, arrivals: list[float], make_request: Callable[[int], tuple[dict[str, Any], int]], timeout_s: float,
) -> list[Record]:
    """Send request i at ``arrivals[i]`` seconds through ``client`` (an ``aiohttp.ClientSession``);
    ``make_request(i)`` gives (JSON body, true label)."""
    start = time.perf_counter()

    async def one(index: int, at: float) -> Record:
        delay = start + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        body, label = make_request(index)
        sent = time.perf_counter()
        try:
            async with client.post(url, json=body, timeout=aiohttp_timeout(timeout_s)) as response:
                status = response.status
                payload = await response.json() if status == 200 else {}
                if status != 200:
                    await response.read()
        except Exception:  # noqa: BLE001 - timeouts and refused connections count as "no response"
            status, payload = 0, {}
        latency = (time.perf_counter() - sent) * 1e3
        predicted = payload.get("label_ids", [None])[0]
        return Record(sent - start, latency, status, label, predicted, payload.get("budget"), payload.get("queue_ms"), payload.get("batch_size"))

    return list(await asyncio.gather(*(one(i, at) for i, at in enumerate(arrivals))))


async def closed_loop_capacity(
    client: Any, url: str, make_request: Callable[[int], tuple[dict[str, Any], int]], concurrency: int, seconds: float,
) -> float:
    """Answered requests per second with ``concurrency`` clients each sending as soon as answered."""
    stop = time.perf_counter() + seconds
    done = [0]
    counter = [0]

    async def user() -> None:
        while time.perf_counter() < stop:
            counter[0] += 1
            body, _ = make_request(counter[0])
            async with client.post(url, json=body, timeout=aiohttp_timeout(30.0)) as response:
                await response.read()
                done[0] += response.status == 200

    begin = time.perf_counter()
    await asyncio.gather(*(user() for _ in range(concurrency)))
    return done[0] / (time.perf_counter() - begin)


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (0-100) by linear interpolation, None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarise(records: list[Record], deadline_ms: float, seconds: float) -> dict[str, Any]:  # noqa: D417
    """Throughput, latency percentiles of answered requests, SLO attainment (share of *all*
    requests answered within ``deadline_ms``), effective accuracy (share answered correctly within
    it), shed (503) and server errors (other 5xx, or no response)."""
    answered = [r for r in records if r.status == 200]
    in_time = [r for r in answered if r.latency_ms <= deadline_ms]
    latencies = [r.latency_ms for r in answered]
    budgets = [r.budget for r in answered if r.budget is not None]
    n = len(records)
    # Answers per second over the span from the first send to the last answer (answers of an
    # overloaded trial arrive long after its last send).
    span = max((r.sent_s + r.latency_ms / 1e3 for r in answered), default=0.0)
    return {
        "requests": n,
        "answered": len(answered),
        "throughput_rps": len(answered) / max(span, seconds) if answered else 0.0,
        "p50_ms": percentile(latencies, 50),
        "p95_ms": percentile(latencies, 95),
        "p99_ms": percentile(latencies, 99),
        "slo_attainment": len(in_time) / n if n else None,
        "effective_accuracy": sum(r.predicted == r.label for r in in_time) / n if n else None,
        "accuracy_answered": sum(r.predicted == r.label for r in answered) / len(answered) if answered else None,
        "shed": sum(r.status == 503 for r in records),
        "client_errors": sum(400 <= r.status < 500 for r in records),
        "server_errors": sum(r.status >= 500 and r.status != 503 for r in records),
        "no_response": sum(r.status == 0 for r in records),
        "mean_budget": statistics.fmean(budgets) if budgets else None,
        "budget_counts": {f"{b:g}": budgets.count(b) for b in sorted(set(budgets))},
        "server_queue_p95_ms": percentile([r.queue_ms for r in answered if r.queue_ms is not None], 95),
    }


def served_budgets(asked: list[float], served: list[float]) -> tuple[list[float], dict[float, float]]:
    """The budgets the server runs for ``asked`` (it rounds a budget down to a configured one, or up
    to the smallest), once each and without b = 1, so each capacity is labelled with the budget
    that actually ran; and the asked budgets it does not serve, with the one it runs instead."""
    result, moved = [], {}
    for budget in asked:
        runs = snap_to(budget, served)
        if abs(runs - budget) > 1e-9:
            moved[budget] = runs
        if runs != 1.0 and runs not in result:
            result.append(runs)
    return result, moved
