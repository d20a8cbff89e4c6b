"""Loopback load test of ``baa serve``: fixed b = 1, fixed b = 0.5 and SLO mode under Poisson and
bursty arrivals, from below capacity to overload, then a schema fuzz run and a graceful shutdown.

    python benchmarks/serve_load.py runs/minilm_bbc_short_all --out runs/serve_load_minilm

Bounded: 127.0.0.1 only, ``--trial-seconds`` and ``--max-requests`` per trial. Steps:

1. start ``baa serve RUN_DIR`` (a subprocess; its start-to-ready time is recorded);
2. dense capacity: answered requests/s of b = 1 with a closed loop of clients;
3. the deadline: p95 latency of fixed b = 1 at 0.5x capacity (Poisson) -- the target the dense
   model meets at half load;
4. each (arrivals, load, mode): open-loop requests, one test-split text each; fixed modes send
   ``budget``, SLO mode sends ``latency_ms`` (a fraction of the deadline, leaving room for the HTTP
   round trip); every request is scored against the same deadline;
5. a schema fuzz run (hypothesis bodies from the OpenAPI schema) counting 5xx;
6. SIGTERM, and the exit code.

A/B of a server setting: ``--variant KEY=VALUE`` (repeatable) starts a second server with those
settings added, and every trial runs on both servers, one after the other with the same arrivals
(the second server first on odd repeats), so a slow spell of the machine falls on both (its modes
are named ``<mode> [KEY=VALUE]``).
Capacity and deadline are measured on the first server.

On a small machine the load generator competes with the server for cores: ``--loadgen-cpus``
pins it (once the servers are up; they keep every CPU) to CPUs of its own, for example the one the
server process keeps when ``--set engine_cpus=[1]`` gives the engine the other. The load
generator's own garbage collector is off during each trial and capacity measurement (it collects
between them): a full collection stalls its event loop, and answers arriving meanwhile would be
timed late.

Writes ``serve_load.json``, ``results.json`` (no accuracy rows), ``run_info.json``,
``results.md`` and ``slo.png`` into ``--out``; ``baa report`` renders the directory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import aiohttp
import httpx

from budgeted_attention.config import from_dict, load_yaml
from budgeted_attention.data.sources import load_source
from budgeted_attention.data.text import TextDataConfig, split_examples
from budgeted_attention.errors import ConfigError
from budgeted_attention.io import environment_info, write_json_atomic, write_text_atomic
from budgeted_attention.reporting.serve_load import serve_load_markdown
from budgeted_attention.rundir import RunDir, resume_script
from budgeted_attention.serving.load import (
    ARRIVALS,
    BURST_OFF_S,
    BURST_ON_S,
    closed_loop_capacity,
    percentile,
    send_open_loop,
    served_budgets,
    summarise,
)
from budgeted_attention.serving.process import check_cpus, pin_process

MODES = {"fixed-1": {"budget": 1.0}, "fixed-0.5": {"budget": 0.5}, "slo": {}}


def test_examples(run_dir: Path) -> list[tuple[str, int]]:
    """The run's test split as (text, label), split exactly as the run split it."""
    data = load_yaml(RunDir(run_dir).config)["data"]
    cfg = from_dict(TextDataConfig, data, "data")
    _, _, test = split_examples(cfg, load_source(cfg))
    return [(e.text, e.label) for e in test]


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants: uvicorn workers, engine processes (``serve.engine_process``).
    Children are listed per thread (``/proc/PID/task/TID/children``): an engine process started from
    the server's loader thread is a child of that thread, not of the main one."""
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                pending += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
    return found


def rss_mib(pid: int) -> float:
    """Resident memory of a process and all its descendants, MiB."""
    total = 0.0
    for p in process_tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
        except OSError:
            continue
    return total


async def watch_memory(pid: int, peak: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        peak[0] = max(peak[0], rss_mib(pid))
        try:
            await asyncio.wait_for(stop.wait(), 0.25)
        except TimeoutError:
            pass


@contextlib.contextmanager
def no_garbage_collection():
    """No garbage collection in this process while requests are in flight: a full collection of
    the objects this process holds stalls its event loop for tens of milliseconds, the answers that
    arrive meanwhile would be timed late and the sends due meanwhile go out in one clump."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def trial(client, url, pid, examples, mode, arrivals_name, rate, seconds, max_requests, deadline_ms, slo_fraction, seed):
    rng = random.Random(seed)
    arrivals = ARRIVALS[arrivals_name](rate, seconds, rng)[:max_requests]
    offset = rng.randrange(len(examples))

    def make(i):
        text, label = examples[(offset + i) % len(examples)]
        body = {"texts": [text], **MODES[mode]}
        if mode == "slo":
            body["latency_ms"] = deadline_ms * slo_fraction
        return body, label

    peak, stop = [0.0], asyncio.Event()
    watcher = asyncio.create_task(watch_memory(pid, peak, stop))
    with no_garbage_collection():
        records = await send_open_loop(client, url, arrivals, make, timeout_s=30.0)
    stop.set()
    await watcher
    return records, peak[0]


def fuzz(base: str, examples: int) -> dict:
    """POST hypothesis-generated bodies built from the live server's request schema; count statuses."""
    from hypothesis import HealthCheck, given, settings

    from budgeted_attention.serving.fuzz import encode_body, request_bodies

    schema = httpx.get(f"{base}/openapi.json").json()["components"]["schemas"]["ClassifyRequest"]
    statuses: Counter = Counter()

    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(body=request_bodies(schema))
    def send(body):
        response = httpx.post(f"{base}/v1/classify", content=encode_body(body), headers={"content-type": "application/json"}, timeout=30)
        statuses[response.status_code] += 1

    send()
    return {"requests": sum(statuses.values()), "status_counts": dict(sorted(statuses.items())),
            "server_errors": sum(n for s, n in statuses.items() if s >= 500 and s != 503)}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arrivals = sorted({t["arrivals"] for t in result["trials"]})
    fig, axes = plt.subplots(2, len(arrivals), figsize=(5 * len(arrivals), 7), squeeze=False)
    for column, name in enumerate(arrivals):
        for mode in dict.fromkeys(t["mode"] for t in result["trials"]):  # in order of first appearance
            trials = [t for t in result["trials"] if t["arrivals"] == name and t["mode"] == mode]
            if not trials:  # a mode this run did not test gets no legend entry
                continue
            loads = sorted({t["load"] for t in trials})
            for row, key in enumerate(("slo_attainment", "effective_accuracy")):  # mean over repeats, each repeat a dot
                means = [100 * statistics.fmean(t["summary"][key] for t in trials if t["load"] == load) for load in loads]
                line, = axes[row][column].plot(loads, means, marker="o", label=mode)
                axes[row][column].scatter([t["load"] for t in trials], [100 * t["summary"][key] for t in trials], s=10, color=line.get_color(), alpha=0.5)
        axes[0][column].set_title(f"{name} arrivals")
        axes[0][column].set_ylabel("SLO attainment %")
        axes[1][column].set_ylabel("effective accuracy %")
        axes[1][column].set_xlabel("offered load (x dense capacity)")
        axes[0][column].legend()
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


async def run(args) -> dict:
    run_dir = Path(args.run_dir)
    examples = test_examples(run_dir)
    base = f"http://127.0.0.1:{args.port}"
    command = [sys.executable, "-m", "budgeted_attention.cli", "serve", str(run_dir), "--port", str(args.port), "--log-level", "warning",
               *[item for s in args.set for item in ("--set", s)]]
    started = time.perf_counter()
    server = subprocess.Popen(command)
    servers = [(server, base, "")]
    variant_command = []
    if args.variant:  # the B server: same command, its own port, the variant settings added
        variant_command = [*command, *[item for s in args.variant for item in ("--set", s)]]
        variant_command[variant_command.index("--port") + 1] = str(args.port + 1)
    result: dict = {"setting": {"server_command": " ".join(["baa", *command[3:]]), "texts": len(examples), "trial_seconds": args.trial_seconds,
                                "max_requests": args.max_requests, "slo_request_fraction": args.slo_fraction,
                                "capacity_concurrency": args.capacity_concurrency, "seed": args.seed,
                                "bursty_on_off_s": [BURST_ON_S, BURST_OFF_S]}, "trials": []}
    if variant_command:
        result["setting"]["variant"] = {"settings": args.variant, "server_command": " ".join(["baa", *variant_command[3:]])}
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1024)) as client:
            await wait_ready(client, server, base)
            result["setting"]["ready_seconds"] = time.perf_counter() - started
            if variant_command:  # started once the first is ready, so neither start-up slows the other
                started = time.perf_counter()
                servers.append((subprocess.Popen(variant_command), f"http://127.0.0.1:{args.port + 1}", f" [{', '.join(args.variant)}]"))
                await wait_ready(client, servers[1][0], servers[1][1])
                result["setting"]["variant"]["ready_seconds"] = time.perf_counter() - started
            if args.loadgen_cpus:  # pinned once every server has started, so that none inherits it
                pin_process(args.loadgen_cpus)
                result["setting"]["loadgen_cpus"] = args.loadgen_cpus
            url = f"{base}/v1/classify"
            warm = lambda i: ({"texts": [examples[i % len(examples)][0]], "budget": 1.0}, 0)  # noqa: E731
            await closed_loop_capacity(client, url, warm, args.capacity_concurrency, 2.0)  # warm-up
            with no_garbage_collection():
                measured = await closed_loop_capacity(client, url, warm, args.capacity_concurrency, args.capacity_seconds)
            # Offered loads are multiples of the dense capacity; measured afresh it varies by about
            # 10 % between runs on a shared machine, so A/B runs can fix it (--capacity-rps).
            capacity = args.capacity_rps or measured
            result["capacity_rps"] = capacity
            result["measured_capacity_rps"] = measured
            print(f"dense capacity {measured:.1f} requests/s measured, {capacity:.1f} used", flush=True)
            # Capacity at lower fixed budgets: a burst whose arrival rate exceeds the capacity at
            # the policy's floor budget queues up whatever budgets the policy picks.
            result["capacity_by_budget"] = {"1": measured}  # measured, like the other budgets
            async with client.get(f"{base}/v1/info") as response:
                served = sorted(float(b) for b in (await response.json())["budgets"])
            budgets, moved = served_budgets(args.capacity_budgets, served)
            for asked, runs in moved.items():
                print(f"capacity budget {asked:g} is not served; the server runs it at b = {runs:g}", flush=True)
            for budget in budgets:
                body = lambda i, b=budget: ({"texts": [examples[i % len(examples)][0]], "budget": b}, 0)  # noqa: E731
                with no_garbage_collection():
                    result["capacity_by_budget"][f"{budget:g}"] = await closed_loop_capacity(client, url, body, args.capacity_concurrency, args.capacity_seconds)
                print(f"capacity at b = {budget:g}: {result['capacity_by_budget'][f'{budget:g}']:.1f} requests/s", flush=True)
            records, _ = await trial(client, url, server.pid, examples, "fixed-1", "poisson", 0.5 * capacity, args.trial_seconds,
                                     args.max_requests, 1e9, 1.0, args.seed)
            measured_deadline = percentile([r.latency_ms for r in records if r.status == 200], 95)
            deadline = args.deadline_ms or measured_deadline
            result["deadline_ms"] = deadline
            result["measured_deadline_ms"] = measured_deadline
            print(f"deadline (p95 of b=1 at 0.5x) {measured_deadline:.1f} ms measured, {deadline:.1f} ms used", flush=True)
            # Repeats interleave the modes (mode inside repeat) so that a slow spell of the machine
            # does not fall on one mode's trials only.
            for arrivals in args.arrivals:
                for load in args.loads:
                    for repeat in range(args.repeats):
                        for mode in args.modes:
                            # A then B with the same arrivals; B first on odd repeats, so neither
                            # always runs right after the other's backlog or in its slot of a drift.
                            for position, (process, address, label) in enumerate(servers if repeat % 2 == 0 else servers[::-1]):
                                await asyncio.sleep(1.0)  # let the previous trial's queue drain
                                seed = args.seed + int(load * 100) + 1000 * repeat
                                records, peak = await trial(client, f"{address}/v1/classify", process.pid, examples, mode, arrivals,
                                                            load * capacity, args.trial_seconds, args.max_requests, deadline, args.slo_fraction, seed)
                                summary = summarise(records, deadline, args.trial_seconds)
                                entry = {"arrivals": arrivals, "load": load, "mode": mode + label, "repeat": repeat, "summary": summary,
                                         "peak_rss_mib": peak, "order": position,
                                         "latency_correction": await latency_correction(client, address)}
                                if args.keep_records:
                                    entry["records"] = [dataclasses.asdict(r) for r in records]
                                result["trials"].append(entry)
                                print(f"{arrivals} {load:g}x {mode + label} (repeat {repeat}): attainment {summary['slo_attainment']:.3f}, "
                                      f"effective acc. {summary['effective_accuracy']:.3f}, p95 {summary['p95_ms']}, shed {summary['shed']}, "
                                      f"5xx {summary['server_errors']}, mean budget {summary['mean_budget']}", flush=True)
        if args.fuzz_examples:
            result["fuzz"] = fuzz(base, args.fuzz_examples)
            print(f"fuzz: {result['fuzz']}", flush=True)
    finally:
        stop = time.perf_counter()
        codes = [shut_down(process) for process, _, _ in servers]
        result["shutdown"] = {"exit_code": max(codes, key=abs), "seconds": time.perf_counter() - stop}
    return result


async def latency_correction(client, address: str) -> float | None:
    """The server's latency-model correction (observed / calibrated batch time) after a trial."""
    try:
        async with client.get(f"{address}/v1/info") as response:
            return (await response.json())["latency_model"]["correction"]
    except (aiohttp.ClientError, KeyError, ValueError):
        return None


async def wait_ready(client, process: subprocess.Popen, address: str) -> None:
    while True:
        if process.poll() is not None:
            raise SystemExit(f"server {address} exited with code {process.returncode} before it was ready")
        try:
            async with client.get(f"{address}/readyz") as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)


def shut_down(process: subprocess.Popen) -> int:
    """SIGTERM (graceful shutdown), then the exit code; killed after 60 s."""
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--out", required=True, help="run directory for the results, e.g. runs/serve_load")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--loads", default="0.5,1,1.5,2", help="offered loads as multiples of the dense capacity")
    parser.add_argument("--arrivals", default="poisson,bursty")
    parser.add_argument("--modes", default="fixed-1,fixed-0.5,slo")
    parser.add_argument("--trial-seconds", type=float, default=20.0)
    parser.add_argument("--max-requests", type=int, default=3000)
    parser.add_argument("--capacity-seconds", type=float, default=10.0)
    parser.add_argument("--capacity-concurrency", type=int, default=32)
    parser.add_argument("--capacity-budgets", default="0.5,0.25",
                        help="also measure the closed-loop capacity at these fixed budgets (ones the server serves: it rounds others down)")
    parser.add_argument("--slo-fraction", type=float, default=0.85, help="SLO-mode requests ask for this fraction of the deadline")
    parser.add_argument("--fuzz-examples", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--capacity-rps", type=float, default=0.0,
                        help="dense capacity (requests/s) that loads are multiples of; 0: the one measured in this run. "
                             "Fix it to compare two server settings at the same absolute arrival rates")
    parser.add_argument("--deadline-ms", type=float, default=0.0,
                        help="the deadline every request is scored against; 0: the p95 of fixed b = 1 at 0.5x load measured in this run")
    parser.add_argument("--repeats", type=int, default=1,
                        help="trials per (arrivals, load, mode), each with its own arrival seed; the report gives mean ± std (timing on a shared machine is noisy)")
    parser.add_argument("--keep-records", action="store_true", help="store every request (send time, latency, status, budget, queue ms) in serve_load.json")
    parser.add_argument("--loadgen-cpus", default="",
                        help="comma-separated CPU ids this load generator runs on (after the servers have started; Linux), "
                             "e.g. the ones left to the server process by --set engine_cpus=[1]; empty: the operating system decides")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="server setting, passed to baa serve --set")
    parser.add_argument("--variant", action="append", default=[], metavar="KEY=VALUE",
                        help="A/B: a second server with this setting added (repeatable); every trial runs on both, interleaved")
    parser.add_argument("--force", action="store_true", help="measure anew even when --out holds this measurement already")
    args = parser.parse_args()
    if (done := resume_script(args.out, "benchmarks/serve_load.py", sys.argv[1:], args.force, sources=(args.run_dir,))) is not None:
        return done
    if args.capacity_rps < 0:
        parser.error(f"--capacity-rps must be >= 0, got {args.capacity_rps}")
    if args.deadline_ms < 0:
        parser.error(f"--deadline-ms must be >= 0, got {args.deadline_ms}")
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    try:
        args.loadgen_cpus = check_cpus([int(x) for x in args.loadgen_cpus.split(",") if x.strip()], "--loadgen-cpus")
    except (ValueError, ConfigError) as exc:
        parser.error(str(exc) if isinstance(exc, ConfigError) else f"--loadgen-cpus must be comma-separated CPU ids: {exc}")
    args.loads = [float(x) for x in args.loads.split(",")]
    args.capacity_budgets = [float(x) for x in args.capacity_budgets.split(",") if x and float(x) != 1.0]  # b = 1 is the dense capacity
    args.arrivals = [a for a in args.arrivals.split(",") if a]
    args.modes = [m for m in args.modes.split(",") if m]
    for mode in args.modes:
        if mode not in MODES:
            parser.error(f"unknown mode {mode!r} (known: {', '.join(MODES)})")
    for name in args.arrivals:
        if name not in ARRIVALS:
            parser.error(f"unknown arrivals {name!r} (known: {', '.join(ARRIVALS)})")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    began = time.time()
    environment = environment_info()  # the code the servers start with, not the tree at the end
    result = asyncio.run(run(args))
    result["wall_time_s"] = time.time() - began
    out_dir = RunDir(out)
    write_json_atomic(out_dir.serve_load, result)
    write_json_atomic(out_dir.results_json, {"rows": [], "wall_time_s": result["wall_time_s"], "kind": "serve_load"})
    write_text_atomic(out_dir.results_md, "# serve load test\n\n" + serve_load_markdown(result))
    plot(result, out / "slo.png")
    # run_info.json last: what a resumed study reads as done
    write_json_atomic(out_dir.run_info, {"seeds": [args.seed], "environment": environment,
                                        "invocations": [{"command": ["python", *sys.argv], "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(began))}]})
    print(serve_load_markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
