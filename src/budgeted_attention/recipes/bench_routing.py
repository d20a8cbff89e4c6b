"""``baa bench-routing RUN_DIR``: a Meta-Attention LM run's hard routing against full attention at
long sequences, on blocks of its test documents (the final evaluation of a finished model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from budgeted_attention.benchmark.routing import bench_routing, routing_bench_markdown
from budgeted_attention.checkpoint import load_model, verify_artifacts
from budgeted_attention.config import load_yaml
from budgeted_attention.data.lm import load_documents, split_documents, token_blocks
from budgeted_attention.errors import ConfigError, DataError
from budgeted_attention.io import write_json_atomic, write_text_atomic
from budgeted_attention.pipeline import config_from_dict
from budgeted_attention.rundir import RunDir


def run_bench_routing(
    run_dir: str | Path, *, seed: int | None, seq_lens: list[int], blocks: int, threads: int, rounds: int,
    min_run_time: float, soft_loss: bool = True, progress: bool = True, log=print,
) -> dict[str, Any]:
    """Time and evaluate the run's routed model at ``seq_lens``; writes ``routing_bench.{json,md}``."""

    run = RunDir.open(run_dir)
    cfg = config_from_dict(load_yaml(run.config))
    if cfg.task != "lm" or cfg.model.attention != "meta":
        raise ConfigError(f"'{run.path}' is not a Meta-Attention language-model run (task {cfg.task!r}, attention {cfg.model.attention!r})")
    checkpoint = run.find_checkpoint(seed, name="dense", command="baa lm CONFIG")
    model, description = load_model(checkpoint)
    verify_artifacts(checkpoint, description, run.path, model)
    tokenizer = Tokenizer.from_file(str(run.tokenizer))
    _, _, test_docs = split_documents(load_documents(cfg.lm_data), cfg.lm_data)
    blocks_by_len = {}
    for seq in seq_lens:
        split = token_blocks(tokenizer, test_docs, seq)
        if len(split) < blocks:
            raise DataError(f"the test documents hold {len(split)} blocks of {seq} tokens, fewer than --blocks {blocks}")
        blocks_by_len[seq] = split.input_ids[:blocks]
    result = bench_routing(model, blocks_by_len, threads=threads, rounds=rounds, min_run_time=min_run_time, soft_loss=soft_loss, progress=progress)
    result["checkpoint"] = str(checkpoint)
    write_json_atomic(run.routing_bench_json, result)
    table = routing_bench_markdown(result)
    write_text_atomic(run.routing_bench_md, f"# baa bench-routing\n\nCheckpoint: `{result['checkpoint']}`\n\n{table}")
    log(table)
    return result
