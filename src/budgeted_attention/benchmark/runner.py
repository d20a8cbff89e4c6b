"""``baa bench``: latency of dense vs pruned models for several budgets and input shapes."""

from __future__ import annotations

from typing import Any

import torch
from tqdm.auto import tqdm

from budgeted_attention.benchmark.config import BenchConfig
from budgeted_attention.benchmark.latency import measure_interleaved, time_call
from budgeted_attention.benchmark.reference import PlainEncoder
from budgeted_attention.model.cost import CostModel
from budgeted_attention.model.transformer import EncoderClassifier
from budgeted_attention.pruning.selection import HeadRanking
from budgeted_attention.pruning.surgery import prune_to_budget
from budgeted_attention.pruning.switching import SlicedModel


def _random_inputs(config, batch: int, seq: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, config.vocab_size, (batch, seq), generator=gen)


def speed_row(
    budget: float, batch: int, seq: int, threads: int, dense_ms: float, pruned_ms: float, heads: list[int], cost: CostModel
) -> dict[str, Any]:
    """One benchmark row: latencies, measured and FLOP-ideal speedups and their ratio."""
    ideal = cost.ideal_speedup(list(heads))
    speedup = dense_ms / pruned_ms
    return {
        "budget": budget,
        "batch_size": batch,
        "seq_len": seq,
        "threads": threads,
        "dense_latency_ms": dense_ms,
        "latency_ms": pruned_ms,
        "speedup": speedup,
        "ideal_speedup": ideal,
        "efficiency": speedup / ideal,
        "heads_kept": sum(heads),
        "heads_per_layer": list(heads),
    }


def bench_models(
    model: EncoderClassifier,
    ranking: HeadRanking,
    cfg: BenchConfig,
    *,
    progress: bool = True,
) -> dict[str, Any]:
    """Time the plain dense model, the gated model at b = 1, and one pruned model per budget.

    Returns ``{"rows": [...], "gate_overhead": [...], "switch": {...}, "setting": {...}}``; each row has
    ``budget, batch_size, seq_len, threads, dense_latency_ms, latency_ms, speedup, ideal_speedup,
    efficiency, heads_kept, heads_per_layer`` (and ``sliced_latency_ms`` with ``include_sliced``).
    """
    model = model.eval()
    for seq in cfg.seq_lens:
        if seq > model.config.max_len:
            raise ValueError(f"sequence length {seq} exceeds the model's max_len {model.config.max_len}")
    plain = PlainEncoder(model)
    pruned = {b: prune_to_budget(model, ranking, b) for b in cfg.budgets}
    sliced = SlicedModel(model, ranking) if cfg.include_sliced else None
    rows: list[dict[str, Any]] = []
    overhead: list[dict[str, Any]] = []
    settings = [(b, t) for b in cfg.batch_sizes for t in cfg.seq_lens]
    for batch, seq in tqdm(settings, desc="bench", disable=not progress, leave=False):
        ids = _random_inputs(model.config, batch, seq)
        functions: dict[str, Any] = {
            "plain": lambda: plain(ids),
            "gated_b1": lambda: model(ids, budget=1.0),
        }
        for b, pm in pruned.items():
            functions[f"pruned_{b}"] = (lambda m: lambda: m(ids))(pm)
        if sliced is not None:
            for b in cfg.budgets:
                functions[f"sliced_{b}"] = (lambda budget: lambda: (sliced.set_budget(budget), sliced(ids)))(b)
        latency = measure_interleaved(
            functions, threads=cfg.threads, rounds=cfg.rounds, min_run_time=cfg.min_run_time
        )
        cost = CostModel(model.config, seq)
        dense_ms = latency["plain"]
        for b, pm in pruned.items():
            row = speed_row(b, batch, seq, cfg.threads, dense_ms, latency[f"pruned_{b}"], pm.config.heads_per_layer, cost)
            if sliced is not None:
                row["sliced_latency_ms"] = latency[f"sliced_{b}"]
                row["sliced_speedup"] = dense_ms / latency[f"sliced_{b}"]
            rows.append(row)
        overhead.append(
            {
                "batch_size": batch,
                "seq_len": seq,
                "threads": cfg.threads,
                "plain_latency_ms": dense_ms,
                "gated_b1_latency_ms": latency["gated_b1"],
                "overhead": latency["gated_b1"] / dense_ms - 1.0,
            }
        )
    result: dict[str, Any] = {
        "rows": rows,
        "gate_overhead": overhead,
        "setting": {
            "threads": cfg.threads,
            "rounds": cfg.rounds,
            "min_run_time_s": cfg.min_run_time,
            "timer": "torch.utils.benchmark blocked_autorange, interleaved, median of round medians",
            "dense_reference": "PlainEncoder (same weights, no gate code)",
        },
    }
    if sliced is not None and len(cfg.budgets) >= 1:
        budgets = cfg.budgets if len(cfg.budgets) > 1 else cfg.budgets + [1.0]
        state = {"i": 0}

        def switch() -> None:
            state["i"] += 1
            sliced.set_budget(budgets[state["i"] % len(budgets)])

        result["switch"] = {"switch_ms": time_call(switch, repeats=2000), "budgets": budgets}
    return result


def bench_markdown(result: dict[str, Any]) -> str:
    """Markdown tables of a :func:`bench_models` result."""
    lines = [
        "| budget | batch | seq | threads | heads kept | dense ms | pruned ms | speedup | FLOP-ideal | speedup / ideal | sliced speedup |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        sliced = f"{r['sliced_speedup']:.2f}x" if "sliced_speedup" in r else ""
        lines.append(
            f"| {r['budget']:.2f} | {r['batch_size']} | {r['seq_len']} | {r['threads']} | {r['heads_kept']} "
            f"{r['heads_per_layer']} | {r['dense_latency_ms']:.3f} | {r['latency_ms']:.3f} | {r['speedup']:.2f}x | "
            f"{r['ideal_speedup']:.2f}x | {r['efficiency']:.2f} | {sliced} |"
        )
    lines += ["", "| batch | seq | plain dense ms | gated model at b=1 ms | overhead |", "|---:|---:|---:|---:|---:|"]
    for o in result["gate_overhead"]:
        lines.append(
            f"| {o['batch_size']} | {o['seq_len']} | {o['plain_latency_ms']:.3f} | {o['gated_b1_latency_ms']:.3f} | {100 * o['overhead']:+.1f}% |"
        )
    if "switch" in result:
        lines += ["", f"Budget switch (sliced layout): {1000 * result['switch']['switch_ms']:.1f} µs median."]
    return "\n".join(lines) + "\n"
