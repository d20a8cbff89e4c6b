"""Start-to-ready time of ``baa serve``: start the server several times, poll ``/readyz`` until it
answers 200, stop it with SIGTERM; report each start.

    python benchmarks/serve_ready.py runs/minilm_all_seed0 --out runs/serve_ready_minilm

"Ready" is what a load balancer waits for: the model loaded in its engine process, warmed, its
latency calibrated (``/readyz`` 200). Each start is a fresh process, so imports, the model load and
calibration all count. Writes ``ready.json`` and ``results.md`` into ``--out``. Run it alone: a
busy machine slows every start.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from budgeted_attention.io import environment_info, write_json_atomic, write_text_atomic
from budgeted_attention.rundir import RunDir
from serve_load import shut_down  # this script's directory is on sys.path when it runs

POLL_S = 0.05


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def one_start(command: list[str], port: int, limit_s: float) -> float:
    """Seconds from starting the server process to its first 200 from /readyz."""
    started = time.perf_counter()
    server = subprocess.Popen(command, stderr=subprocess.DEVNULL)
    try:
        while not ready(port):
            if server.poll() is not None:
                raise SystemExit(f"the server exited with code {server.returncode} before it was ready")
            if time.perf_counter() - started > limit_s:
                raise SystemExit(f"the server was not ready within {limit_s:.0f} s")
            time.sleep(POLL_S)
        return time.perf_counter() - started
    finally:
        shut_down(server)


def markdown(result: dict) -> str:
    seconds = result["ready_seconds"]
    spread = f", {statistics.median(seconds):.1f} s median" if len(seconds) > 1 else ""
    return (
        f"Server: `{result['server_command']}`; polled `/readyz` every {POLL_S * 1000:.0f} ms.\n\n"
        f"Start to ready over {len(seconds)} start(s): {', '.join(f'{s:.1f}' for s in seconds)} s{spread}; "
        f"slowest {max(seconds):.1f} s.\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--out", required=True, help="directory for ready.json and results.md")
    parser.add_argument("--starts", type=int, default=3, help="how many fresh starts to time")
    parser.add_argument("--port", type=int, default=8777)
    parser.add_argument("--limit-s", type=float, default=300.0, help="give up on a start after this long")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="server setting, passed to baa serve --set")
    args = parser.parse_args()
    if args.starts < 1:
        parser.error(f"--starts must be at least 1, got {args.starts}")
    command = [sys.executable, "-m", "budgeted_attention.cli", "serve", args.run_dir, "--port", str(args.port), "--log-level", "warning",
               *[item for s in args.set for item in ("--set", s)]]
    environment = environment_info()  # the code the servers start with, not the tree at the end
    seconds = [one_start(command, args.port, args.limit_s) for _ in range(args.starts)]
    result = {"server_command": " ".join(["baa", *command[3:]]), "ready_seconds": seconds}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "ready.json", result)
    write_json_atomic(RunDir(out).run_info, {"environment": environment, "invocations": [{"command": ["python", *sys.argv]}]})
    write_text_atomic(RunDir(out).results_md, "# baa serve: start to ready\n\n" + markdown(result))
    print(json.dumps(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
