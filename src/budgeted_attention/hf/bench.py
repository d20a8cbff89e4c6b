"""Latency of a gated BERT-family model's pruned versions vs the unmodified transformers model."""

from __future__ import annotations

import copy
from typing import Any

import torch
from tqdm.auto import tqdm

from budgeted_attention.benchmark.latency import measure_interleaved
from budgeted_attention.benchmark.config import BenchConfig
from budgeted_attention.benchmark.runner import speed_row
from budgeted_attention.hf.bert import GatedBertClassifier, bert_cost_model
from budgeted_attention.pruning.selection import HeadRanking


def unmodified_reference(model: GatedBertClassifier) -> torch.nn.Module:
    """A plain ``BertForSequenceClassification`` (SDPA attention) with the same weights."""
    from transformers import BertForSequenceClassification  # noqa: PLC0415

    if any(n != model.n_heads for n in model.heads_per_layer):
        raise ValueError("the reference needs the unpruned model")
    reference = BertForSequenceClassification(copy.deepcopy(model.hf.config))
    reference.load_state_dict(model.hf.state_dict())
    return reference.eval()


def bench_bert(model: GatedBertClassifier, ranking: HeadRanking, cfg: BenchConfig, *, progress: bool = True) -> dict[str, Any]:
    """Rows as :func:`budgeted_attention.benchmark.runner.bench_models`, dense = unmodified transformers."""
    model = model.eval()
    reference = unmodified_reference(model)
    pruned = {}
    for b in cfg.budgets:
        pm = copy.deepcopy(model)
        pm.keep_heads(ranking.kept_heads(b))
        pruned[b] = pm.eval()
    rows, overhead = [], []
    vocab = model.hf.config.vocab_size
    for batch, seq in tqdm([(b, t) for b in cfg.batch_sizes for t in cfg.seq_lens], desc="bench", disable=not progress, leave=False):
        ids = torch.randint(1000 if vocab > 2000 else 0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))
        functions = {"plain": lambda: reference(input_ids=ids).logits, "gated_b1": lambda: model(ids, budget=1.0)}
        for b, pm in pruned.items():
            functions[f"pruned_{b}"] = (lambda m: lambda: m(ids))(pm)
        latency = measure_interleaved(functions, threads=cfg.threads, rounds=cfg.rounds, min_run_time=cfg.min_run_time)
        cost = bert_cost_model(model.hf.config, seq)
        for b, pm in pruned.items():
            rows.append(speed_row(b, batch, seq, cfg.threads, latency["plain"], latency[f"pruned_{b}"], pm.heads_per_layer, cost))
        overhead.append({"batch_size": batch, "seq_len": seq, "threads": cfg.threads, "plain_latency_ms": latency["plain"],
                         "gated_b1_latency_ms": latency["gated_b1"], "overhead": latency["gated_b1"] / latency["plain"] - 1.0})
    return {"rows": rows, "gate_overhead": overhead, "setting": {"threads": cfg.threads, "rounds": cfg.rounds,
            "dense_reference": "unmodified transformers BertForSequenceClassification (SDPA)"}}
