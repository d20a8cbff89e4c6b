"""``baa serve``: settings, checks before start-up, and uvicorn (one or several workers)."""

from __future__ import annotations

import argparse
import errno
import ipaddress
import json
import os
import signal
import socket
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from budgeted_attention.config import apply_overrides, from_dict, load_yaml
from budgeted_attention.errors import CheckpointError, ConfigError
from budgeted_attention.rundir import RunDir
from budgeted_attention.serving.config import ServeConfig
from budgeted_attention.serving.http import ENV_LIMITS, GUARDED_HTTP, HeadLimits


def load_serve_config(path: str | None, overrides: list[str], backend: str | None = None, int8: bool = False) -> ServeConfig:
    """Server settings from an optional YAML file (keys at top level or under ``serve:``) and
    ``key=value`` overrides; ``backend`` and ``int8`` (the --backend and --int8 flags) win over both."""
    data: dict[str, Any] = load_yaml(path) if path else {}
    if isinstance(data.get("serve"), dict) and len(data) == 1:
        data = data["serve"]
    data = apply_overrides(data, [o.removeprefix("serve.") for o in overrides])
    if backend:
        data["backend"] = backend
    if int8:
        data["int8"] = True
    return from_dict(ServeConfig, data, "serve")


def check_port(host: str, port: int) -> None:
    """Fail at once (one line, exit 2) when ``host:port`` cannot be bound, before the model loads.

    Binds every address ``host`` resolves to, as uvicorn's server does (``localhost`` may be both
    ``127.0.0.1`` and ``::1``: checking only the first ``getaddrinfo`` answer could pass a port
    that is busy on the other), with ``SO_REUSEADDR`` so a port in TIME_WAIT is not refused, and
    releases them. A server that takes the port in between still fails in uvicorn's own bind.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"--host {host!r}: cannot resolve it ({exc.strerror})") from None
    probes: list[socket.socket] = []
    bound = 0
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            probe = socket.socket(family, kind, proto)
            probes.append(probe)
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # as asyncio's create_server
            try:
                probe.bind(address)
                bound += 1
            except OSError as exc:
                if exc.errno == errno.EADDRNOTAVAIL and (bound or len(infos) > 1):
                    continue  # a family this machine lacks (no IPv6): asyncio skips it too
                why = "is already in use" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc.strerror})"
                raise ConfigError(f"--port {port}: {host}:{port} {why}") from None
        if not bound:
            raise ConfigError(f"--port {port}: {host}:{port} cannot be bound (no address of {host!r} is available here)")
    finally:
        for probe in probes:
            probe.close()


def is_loopback(host: str) -> bool:
    """Whether ``host`` only listens on this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def api_key_from(args: argparse.Namespace) -> str | None:
    """The API key: ``--api-key``, else ``$BAA_API_KEY`` (either may be empty: no key)."""
    from budgeted_attention.serving.app import ENV_API_KEY  # noqa: PLC0415 - the app module imports FastAPI

    key = getattr(args, "api_key", None) or os.environ.get(ENV_API_KEY) or None
    if key is not None and (len(key) < 8 or any(c.isspace() for c in key)):
        raise ConfigError("--api-key: the key must have at least 8 characters and no spaces")
    return key


def preflight(run_dir: str, cfg: ServeConfig, seed: int | None, onnx_dir: str | None) -> None:
    """Fail before the server starts (one line, exit 2) on what would only fail in the background
    loader: no run directory, no budgeted-hard checkpoint or ranking, weights that fail their hash,
    no tokenizer or another run's tokenizer or labels, missing graphs."""
    from budgeted_attention.checkpoint import checkpoint_paths, parse_ranking, read_description, verify_artifacts  # noqa: PLC0415 - torch
    from budgeted_attention.io import sha256_file  # noqa: PLC0415 - with the checkpoint imports
    from budgeted_attention.serving.engine import check_classifier, check_graphs, floor_budget, validation_accuracy  # noqa: PLC0415 - torch

    run, checkpoint = RunDir.locate(run_dir, seed, command="baa experiment")
    description = read_description(checkpoint)
    parse_ranking(checkpoint, description)
    weights, meta = checkpoint_paths(checkpoint)
    if not weights.is_file():
        raise CheckpointError(f"checkpoint weights not found: '{weights}'")
    if sha256_file(weights) != description.get("weights_sha256"):
        raise CheckpointError(f"'{weights}' does not match '{meta}' (SHA-256 differs: truncated, corrupted or from another checkpoint)")
    check_classifier(checkpoint, description["family"])
    if not run.tokenizer.is_file():
        raise CheckpointError(f"no {RunDir.tokenizer.name} in '{run.path}' (baa serve needs the run's tokenizer)")
    verify_artifacts(checkpoint, description, run.path)
    if cfg.min_accuracy > 0:
        floor_budget(cfg, validation_accuracy(run.path, int(description.get("seed", seed or 0))))
    if cfg.backend == "onnxruntime":
        check_graphs(Path(onnx_dir) if onnx_dir else run.onnx_dir, cfg.budgets, run_dir, int8=cfg.int8)


def serve(args: argparse.Namespace) -> None:
    """Start uvicorn with the app of ``args.run_dir``; returns when the server has shut down."""
    import uvicorn  # noqa: PLC0415 - the serve extra loads after the pre-start checks (their errors need none of it)

    cfg = load_serve_config(args.config, args.overrides, args.backend, getattr(args, "int8", False))
    api_key = api_key_from(args)
    check_port(args.host, args.port)
    preflight(args.run_dir, cfg, args.seed, args.onnx_dir)
    if api_key is None and not is_loopback(args.host):
        print(f"baa serve: warning: listening on {args.host} without an API key: anyone who reaches the port can use the model "
              "(set --api-key or $BAA_API_KEY)", file=sys.stderr)
    # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal with the handler it found;
    # this one turns that into a clean exit (code 0) instead of death by signal (-15).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # The request-head limits reach uvicorn's protocol in every worker through the environment.
    os.environ[ENV_LIMITS] = json.dumps(asdict(HeadLimits.of(cfg)))
    common = {
        "host": args.host, "port": args.port, "log_level": args.log_level, "http": GUARDED_HTTP,
        "timeout_keep_alive": cfg.keep_alive_s, "timeout_graceful_shutdown": cfg.shutdown_timeout_s,
        "limit_concurrency": cfg.max_connections,  # per worker; answered 503 by the guarded protocol
    }
    from budgeted_attention.serving.app import ENV_API_KEY, ENV_FAILED_FILE, ENV_SETTINGS, create_app  # noqa: PLC0415 - FastAPI

    if args.workers == 1:
        uvicorn.run(create_app(args.run_dir, cfg, seed=args.seed, onnx_dir=args.onnx_dir, api_key=api_key), **common)
        return
    # Several workers: each process builds its own app from the environment; metrics are shared
    # through files in a fresh directory (prometheus_client's multiprocess mode).
    if api_key is not None:
        os.environ[ENV_API_KEY] = api_key

    with tempfile.TemporaryDirectory(prefix="baa-metrics-") as metrics_dir:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
        os.environ[ENV_SETTINGS] = json.dumps(
            {"run_dir": args.run_dir, "serve": asdict(cfg), "seed": args.seed, "onnx_dir": args.onnx_dir}
        )
        failed = Path(metrics_dir) / "failed.txt"
        os.environ[ENV_FAILED_FILE] = str(failed)
        uvicorn.run("budgeted_attention.serving.app:app_from_env", factory=True, workers=args.workers, **common)
        if failed.is_file():  # a worker's model could not load: uvicorn stopped every worker
            print(f"baa serve: error: a worker stopped the server: {failed.read_text(encoding='utf-8')}", file=sys.stderr)
            sys.exit(1)
