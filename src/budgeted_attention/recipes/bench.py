"""``baa bench RUN_DIR``: latency of a run's pruned models vs its dense model, all through the family's lean executor (any family)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from budgeted_attention.benchmark.config import BenchConfig
from budgeted_attention.benchmark.runner import bench_ranking
from budgeted_attention.reporting.bench_table import bench_table
from budgeted_attention.checkpoint import load_model, load_ranking, parse_ranking, read_description, verify_artifacts
from budgeted_attention.errors import CheckpointError
from budgeted_attention.io import write_json_atomic, write_text_atomic
from budgeted_attention.reporting.plots import plot_speedups
from budgeted_attention.rundir import RunDir


def run_bench(
    run_dir: str | Path, *, seed: int | None, budgets: list[float], batch_sizes: list[int], seq_lens: list[int] | None, threads: int,
    rounds: int, min_run_time: float, json_path: str | None, lengths: bool = False, onnx: bool = False, int8: bool = False, device: str = "cpu",
    compile: bool = False, cuda_graphs: bool = False, progress: bool = True, log=print,
) -> dict[str, Any]:
    """Bench the budgeted-hard checkpoint of a run (any model family) and write JSON/MD/PNG.

    ``seq_lens`` None: 128 tokens, or the model's ``max_len`` when that is shorter."""
    run, checkpoint = RunDir.locate(run_dir, seed)
    description = read_description(checkpoint)
    parse_ranking(checkpoint, description)  # a bad checkpoint fails before any model is built
    verify_artifacts(checkpoint, description, RunDir.of_checkpoint(checkpoint).path)  # and so does another run's tokenizer or labels
    cfg = BenchConfig(
        budgets=budgets, batch_sizes=batch_sizes, seq_lens=seq_lens or [128], threads=threads, rounds=rounds, min_run_time=min_run_time,
        lengths=lengths, onnx=onnx, int8=int8, device=device, compile=compile, cuda_graphs=cuda_graphs,
    )
    model, description = load_model(checkpoint)
    if seq_lens is None:
        cfg = dataclasses.replace(cfg, seq_lens=[min(128, model.max_len)])
    ranking = load_ranking(checkpoint, description, model)
    token_lengths = _run_lengths(run) if lengths else None
    result = bench_ranking(model, ranking, cfg, lengths=token_lengths, pad_id=model.pad_id, progress=progress)
    result["checkpoint"] = str(checkpoint)
    json_file = Path(json_path) if json_path else run.bench_json
    write_json_atomic(json_file, result)
    table = bench_table(result)
    write_text_atomic(json_file.with_suffix(".md"), f"# baa bench\n\nCheckpoint: `{checkpoint}`\n\n{table}")
    plot_speedups(result["rows"], json_file.with_suffix(".png"))
    log(table)
    log(f"wrote {json_file}, {json_file.with_suffix('.md')}, {json_file.with_suffix('.png')}")
    return result


def _run_lengths(run: RunDir) -> list[int]:
    """Real token counts of the run's training split, recorded by the pipeline."""
    path = run.lengths
    try:
        lengths = json.loads(path.read_text(encoding="utf-8"))["lengths"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise CheckpointError(f"--lengths needs the run's {RunDir.lengths.name} ('{path}'): {exc}") from exc
    if not lengths or not all(isinstance(n, int) and n > 0 for n in lengths):
        raise CheckpointError(f"'{path}' holds no valid token lengths")
    return lengths
