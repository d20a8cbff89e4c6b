"""``baa bench RUN_DIR``: latency of the plain dense model vs the pruned models of a run."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from budgeted_attention.benchmark.config import BenchConfig
from budgeted_attention.benchmark.runner import bench_markdown, bench_models
from budgeted_attention.checkpoint import load_model
from budgeted_attention.errors import CheckpointError
from budgeted_attention.io import write_json_atomic, write_text_atomic
from budgeted_attention.pruning.selection import HeadRanking
from budgeted_attention.reporting.plots import plot_speedups


def find_hard_checkpoint(run_dir: str | Path, seed: int | None) -> Path:
    """The budgeted-hard checkpoint of a run directory (or the given checkpoint path)."""
    path = Path(run_dir)
    if path.suffix == ".json" and path.is_file():
        return path
    if not path.is_dir():
        raise CheckpointError(f"run directory not found: '{path}'")
    candidates = sorted((path / "checkpoints").glob("seed*/budgeted-hard.json"))
    if seed is not None:
        candidates = [c for c in candidates if c.parent.name == f"seed{seed}"]
    if not candidates:
        which = f" for seed {seed}" if seed is not None else ""
        raise CheckpointError(f"no budgeted-hard checkpoint{which} in '{path}/checkpoints' (run 'baa demo --out {path}' first)")
    return candidates[0]


def _is_hf_checkpoint(checkpoint: Path) -> bool:
    from budgeted_attention.hf.bert import HF_FORMAT  # noqa: PLC0415

    try:
        return json.loads(checkpoint.read_text(encoding="utf-8")).get("format") == HF_FORMAT
    except (OSError, json.JSONDecodeError, AttributeError):
        return False


def _ranking(checkpoint: Path, description: dict[str, Any]) -> HeadRanking:
    if "ranking" not in description:
        raise CheckpointError(f"'{checkpoint}' has no head ranking (not a budgeted-hard checkpoint)")
    return HeadRanking.from_dict(description["ranking"])


def run_bench(
    run_dir: str | Path,
    *,
    seed: int | None,
    budgets: list[float],
    batch_sizes: list[int],
    seq_lens: list[int],
    threads: int,
    rounds: int,
    min_run_time: float,
    json_path: str | None,
    progress: bool = True,
    log=print,
) -> dict[str, Any]:
    checkpoint = find_hard_checkpoint(run_dir, seed)
    cfg = BenchConfig(budgets=budgets, batch_sizes=batch_sizes, seq_lens=seq_lens, threads=threads, rounds=rounds, min_run_time=min_run_time)
    if _is_hf_checkpoint(checkpoint):
        # A pretrained BERT-family run: the reference is the unmodified transformers model.
        from budgeted_attention.hf.bench import bench_bert  # noqa: PLC0415
        from budgeted_attention.hf.bert import load_saved_gated_bert  # noqa: PLC0415

        model, description = load_saved_gated_bert(checkpoint)
        ranking = _ranking(checkpoint, description)
        result = bench_bert(model, ranking, dataclasses.replace(cfg, include_sliced=False), progress=progress)
    else:
        model, description = load_model(checkpoint)
        ranking = _ranking(checkpoint, description)
        result = bench_models(model, ranking, cfg, progress=progress)
    result["checkpoint"] = str(checkpoint)
    out_dir = checkpoint.parent.parent.parent if Path(run_dir).is_dir() else checkpoint.parent
    json_file = Path(json_path) if json_path else out_dir / "bench.json"
    write_json_atomic(json_file, result)
    table = bench_markdown(result)
    write_text_atomic(json_file.with_suffix(".md"), f"# baa bench\n\nCheckpoint: `{checkpoint}`\n\n{table}")
    plot_speedups(result["rows"], json_file.with_suffix(".png"))
    log(table)
    log(f"wrote {json_file}, {json_file.with_suffix('.md')}, {json_file.with_suffix('.png')}")
    return result
