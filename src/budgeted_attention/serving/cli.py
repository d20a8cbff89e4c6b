"""``baa serve``: settings, checks before start-up, and uvicorn (one or several workers)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from budgeted_attention.config import apply_overrides, from_dict, load_yaml
from budgeted_attention.errors import CheckpointError, ConfigError
from budgeted_attention.serving.config import ServeConfig


def load_serve_config(path: str | None, overrides: list[str], backend: str | None = None) -> ServeConfig:
    """Server settings from an optional YAML file (keys at top level or under ``serve:``) and
    ``key=value`` overrides; ``backend`` (the --backend flag) wins over both."""
    data: dict[str, Any] = load_yaml(path) if path else {}
    if isinstance(data.get("serve"), dict) and len(data) == 1:
        data = data["serve"]
    data = apply_overrides(data, [o.removeprefix("serve.") for o in overrides])
    if backend:
        data["backend"] = backend
    return from_dict(ServeConfig, data, "serve")


def preflight(run_dir: str, cfg: ServeConfig, seed: int | None, onnx_dir: str | None) -> None:
    """Fail before the server starts (one line, exit 2) on what would only fail in the background
    loader: no run directory, no budgeted-hard checkpoint or ranking, no tokenizer, missing graphs."""
    from budgeted_attention.checkpoint import parse_ranking, read_description  # noqa: PLC0415
    from budgeted_attention.export.onnx import graph_path  # noqa: PLC0415
    from budgeted_attention.recipes.bench import find_hard_checkpoint  # noqa: PLC0415

    checkpoint = find_hard_checkpoint(run_dir, seed, command="baa experiment")
    description = read_description(checkpoint)
    parse_ranking(checkpoint, description)
    if description.get("family") not in ("encoder", "bert"):
        raise CheckpointError(f"'{checkpoint}' is a {description.get('family')!r} model; baa serve classifies texts (encoder or bert runs)")
    folder = Path(run_dir) if Path(run_dir).is_dir() else checkpoint.parent
    if not (folder / "tokenizer.json").is_file():
        raise CheckpointError(f"no tokenizer.json in '{folder}' (baa serve needs the run's tokenizer)")
    if cfg.min_accuracy > 0:
        from budgeted_attention.serving.engine import floor_budget, validation_accuracy  # noqa: PLC0415

        floor_budget(cfg, validation_accuracy(folder, int(description.get("seed", seed or 0))))
    if cfg.backend == "onnxruntime":
        graphs = Path(onnx_dir) if onnx_dir else folder / "onnx"
        missing = [b for b in cfg.budgets if not graph_path(graphs, b).is_file()]
        if missing:
            budgets = ",".join(f"{b:g}" for b in cfg.budgets)
            raise ConfigError(f"no ONNX graph for budgets {missing} in '{graphs}' (run 'baa export {run_dir} --budget {budgets}' first)")


def serve(args: argparse.Namespace) -> None:
    """Start uvicorn with the app of ``args.run_dir``; returns when the server has shut down."""
    import uvicorn  # noqa: PLC0415

    cfg = load_serve_config(args.config, args.overrides, args.backend)
    preflight(args.run_dir, cfg, args.seed, args.onnx_dir)
    # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal with the handler it found;
    # this one turns that into a clean exit (code 0) instead of death by signal (-15).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    common = {"host": args.host, "port": args.port, "log_level": args.log_level, "timeout_graceful_shutdown": 30}
    if args.workers == 1:
        from budgeted_attention.serving.app import create_app  # noqa: PLC0415

        uvicorn.run(create_app(args.run_dir, cfg, seed=args.seed, onnx_dir=args.onnx_dir), **common)
        return
    # Several workers: each process builds its own app from the environment; metrics are shared
    # through files in a fresh directory (prometheus_client's multiprocess mode).
    from budgeted_attention.serving.app import ENV_SETTINGS  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="baa-metrics-") as metrics_dir:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
        os.environ[ENV_SETTINGS] = json.dumps(
            {"run_dir": args.run_dir, "serve": asdict(cfg), "seed": args.seed, "onnx_dir": args.onnx_dir}
        )
        uvicorn.run("budgeted_attention.serving.app:app_from_env", factory=True, workers=args.workers, **common)
