"""Which budgets should the hard stage train? Reruns the hard stage of a finished run's budgeted
checkpoint with other budget ranges and reports the validation score of every budget's hard model.

    python benchmarks/hard_stage_ranges.py runs/gemma_bbc_short_v2 --ranges 0.5-1,0.5 --out runs/hard_ranges

A range ``LOW-HIGH`` samples b ~ Uniform[LOW, HIGH] (and b = 1 with ``train.full_budget_prob``),
as ``train.hard_budget_min`` = LOW does; a single budget ``B`` trains that budget's sub-model
alone (no b = 1 steps). Every range starts from the same saved ``budgeted`` checkpoint with the
run's config, seed and ranking, so the run's own ``budgeted-hard`` unit is the range
[``hard_budget_min`` or ``budget_min``, ``budget_max``]. Only the validation split is read (the
test split stays sealed): this chooses a setting, it does not report one.

The run directory is only read; the data are rebuilt from its config (a tokenizer trained on the
data goes to a temporary folder). Writes ``hard_stage_ranges.json`` and ``hard_stage_ranges.md``
to ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import torch

from budgeted_attention.io import environment_info, write_json_atomic, write_text_atomic
from budgeted_attention.pipeline import load_experiment_config, unit_config_digest
from budgeted_attention.pipeline.builders import make_builder
from budgeted_attention.pipeline.context import RunContext, make_splits
from budgeted_attention.pipeline.units import UnitId
from budgeted_attention.rundir import RunDir
from budgeted_attention.training.stages import train_hard


def _range(text: str) -> tuple[float, float]:
    low, _, high = text.partition("-")
    return (float(low), float(high or low))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a finished run directory with a budgeted checkpoint")
    parser.add_argument("--ranges", default="0.5-1", help="comma-separated LOW-HIGH ranges or single budgets")
    parser.add_argument("--seed", type=int, default=None, help="the seed's checkpoint (default: the run's first seed)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()

    cfg = load_experiment_config(args.run / "config.yaml")
    seed = cfg.seeds[0] if args.seed is None else args.seed
    builder = make_builder(cfg.model_family, cfg.model, cfg.pretrained, cfg.group_size)
    with tempfile.TemporaryDirectory() as scratch:
        splits = make_splits(cfg, RunDir(Path(scratch)), builder.pretrained_tokenizer())
    builder.prepare(splits, cfg.bench.seq_lens)
    ctx = RunContext(cfg, RunDir(args.run), splits, builder, False, print, unit_config_digest(cfg))
    metric = "accuracy" if ctx.task.kind == "classify" else "loss"

    def scores(model, ranking) -> dict[str, float]:
        return {f"{b:g}": ctx.task.evaluate(model, splits.val, cfg.train.eval_batch_size, gates=ranking.masks(b))[metric] for b in cfg.budgets}

    model, _ = ctx.load(UnitId("budgeted", seed))
    ranking = ctx.rank(model, model.unit_importance())
    rows = [{"range": "before the hard stage", "steps": 0, "val": scores(model, ranking)}]
    print(f"before: {rows[0]['val']} ({time.perf_counter() - started:.0f} s)", flush=True)
    for text in [t for t in args.ranges.split(",") if t.strip()]:
        low, high = _range(text)
        model, _ = ctx.load(UnitId("budgeted", seed))
        single = low == high
        train_cfg = dataclasses.replace(cfg.train, full_budget_prob=0.0) if single else cfg.train
        log = train_hard(model, splits.train, train_cfg, ranking, seed=seed, progress=False, task=ctx.task, budgets=(low, high))
        rows.append({"range": text, "steps": log.steps, "val": scores(model, ranking)})
        print(f"{text}: {rows[-1]['val']} ({time.perf_counter() - started:.0f} s)", flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    record = {"run": str(args.run), "seed": seed, "metric": f"validation {metric}", "rows": rows, "threads": args.threads,
              "command": ["python", *sys.argv], "environment": environment_info()}
    write_json_atomic(args.out / "hard_stage_ranges.json", record)
    scale = 100.0 if metric == "accuracy" else 1.0
    head = "| hard stage budgets | steps | " + " | ".join(f"val. {metric} b = {b:g}" for b in cfg.budgets) + " |"
    env = record["environment"]
    machine = f"{env.get('processor') or 'unknown CPU'}, {env.get('cpu_count')} CPUs, {args.threads} thread(s), commit {str(env.get('commit'))[:12]}"
    lines = [f"# Hard stage budget ranges: `{args.run}` (seed {seed})", "", f"Command: `{' '.join(record['command'])}`", "",
             f"Machine: {machine}{' (uncommitted changes)' if env.get('dirty') else ''}; validation split only.", "",
             head, "|---|---:|" + "---:|" * len(cfg.budgets)]
    for row in rows:
        lines.append(f"| {row['range']} | {row['steps']} | " + " | ".join(f"{row['val'][f'{b:g}'] * scale:.2f}" for b in cfg.budgets) + " |")
    write_text_atomic(args.out / "hard_stage_ranges.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
