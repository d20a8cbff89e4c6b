"""Meta-Attention at long sequences: hard routing against full attention, measured.

For each sequence length T, a routed model (:class:`~budgeted_attention.model.decoder.CausalLM`
with ``attention: meta``) runs in hard mode (each token computes only its chosen expert) and is
timed, interleaved, against the same network with causal softmax attention for every token (the
standard SDPA kernel; :func:`full_attention_copy`: the same weights without the controllers), both
through their module trees. FLOPs are counted from what the hard pass computed (attention core;
the projections are the same for both), and the loss of hard routing is compared with the same
network under full attention and under soft routing (every expert mixed, as trained).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from tqdm.auto import tqdm

from budgeted_attention.benchmark.latency import measure_interleaved
from budgeted_attention.data.dataset import Split
from budgeted_attention.model.config import EXPERTS
from budgeted_attention.model.decoder import CausalLM
from budgeted_attention.tasks import LANGUAGE_MODEL
from budgeted_attention.training.routing import causal_attention_flops


def _loss(model: torch.nn.Module, blocks: torch.Tensor) -> float:
    """Token-weighted next-token loss (nats) of ``model`` on (n, T) blocks, one block per batch."""
    return LANGUAGE_MODEL.evaluate(model, Split(blocks, torch.ones_like(blocks), torch.zeros(len(blocks), dtype=torch.long)), batch_size=1)["loss"]


def full_attention_copy(model: CausalLM) -> CausalLM:
    """``model`` (unpruned, Meta-Attention) with softmax attention for every token: the same
    weights, its controllers dropped (eval mode). The full-attention reference of hard routing."""
    if model.is_pruned:
        raise ValueError(f"the full-attention reference mirrors the unpruned model only; got heads_per_layer={model.heads_per_layer}")
    full = CausalLM(dataclasses.replace(model.config, attention="softmax"))
    state = {key: value for key, value in model.state_dict().items() if ".attn.controller." not in key}
    full.load_state_dict(state)
    return full.eval()


def bench_routing(
    model: torch.nn.Module,
    blocks_by_len: dict[int, torch.Tensor],
    *,
    threads: int = 1,
    rounds: int = 5,
    min_run_time: float = 0.2,
    soft_loss: bool = True,
    progress: bool = True,
) -> dict[str, Any]:
    """One row per sequence length.

    Args:
        model: a routed CausalLM (``meta_layers()`` non-empty), unpruned.
        blocks_by_len: T -> (n, T) token blocks (e.g. from the test documents); the first block is
            timed (batch 1), all n are used for losses and FLOP counts.
        soft_loss: also the soft-routing loss (costs three T x T experts per layer).

    Returns:
        ``{"rows": [...], "threads": threads}``; each row: ``seq_len``, ``blocks``, ``hard_ms``,
        ``full_ms``, ``speedup`` (full / hard), ``attention_flops_fraction`` (measured),
        ``flops_by_expert``, ``hard_loss``, ``full_loss``, ``soft_loss``, ``loss_change``
        (hard - full, nats), ``expert_fractions``.
    """
    layers = model.meta_layers()
    if not layers:
        raise ValueError("bench_routing needs a model with Meta-Attention layers (model.attention: meta)")
    model.eval()
    reference = full_attention_copy(model)
    rows = []
    for seq, blocks in tqdm(sorted(blocks_by_len.items()), desc="routing bench", disable=not progress, leave=False):
        if seq > model.config.max_len:
            raise ValueError(f"sequence length {seq} exceeds the model's max_len {model.config.max_len}")
        timed = blocks[:1]
        model.set_routing("hard")
        try:
            latency = measure_interleaved(
                {"hard": lambda: model(timed), "full": lambda: reference(timed)}, threads=threads, rounds=rounds, min_run_time=min_run_time
            )
            for layer in layers:
                layer.reset_flops()
                layer.record, layer.records = True, []
            hard_loss = _loss(model, blocks)
            computed = {name: sum(layer.flops[name] for layer in layers) for name in EXPERTS}
            fractions = _fractions(layers)
        finally:
            model.set_routing("soft")
            for layer in layers:
                layer.record, layer.records = False, []
        full_flops = sum(causal_attention_flops(layer.active_heads, layer.head_dim, seq) for layer in layers) * len(blocks)
        with torch.inference_mode():
            full_loss = _loss(reference, blocks)
            soft = _loss(model, blocks) if soft_loss else None
        rows.append({
            "seq_len": seq, "blocks": len(blocks), "threads": threads,
            "hard_ms": latency["hard"], "full_ms": latency["full"], "speedup": latency["full"] / latency["hard"],
            "attention_flops_fraction": sum(computed.values()) / full_flops,
            "flops_by_expert": {name: value / full_flops for name, value in computed.items()},
            "hard_loss": hard_loss, "full_loss": full_loss, "soft_loss": soft, "loss_change": hard_loss - full_loss,
            "loss_change_vs_soft": None if soft is None else hard_loss - soft,
            "expert_fractions": fractions,
        })
    return {"rows": rows, "threads": threads}


def _fractions(layers: list[torch.nn.Module]) -> dict[str, float]:
    """Share of tokens (all layers) whose argmax expert is each expert, from the layers' records."""
    counts = torch.zeros(len(EXPERTS))
    for layer in layers:
        for weights, _ in layer.records:
            counts += torch.bincount(weights.argmax(-1).flatten(), minlength=len(EXPERTS)).float()
    return {name: float(c / counts.sum().clamp_min(1)) for name, c in zip(EXPERTS, counts)}


def routing_bench_markdown(result: dict[str, Any]) -> str:
    """The long-sequence table: time, measured FLOPs and loss of hard routing vs full attention."""
    lines = [
        "| seq | blocks | full attn. ms | hard-routed ms | speedup | measured attn. FLOPs % | tokens full / linear / window % | "
        "loss full | loss hard | loss soft | hard − full (nats) | hard − soft (nats) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        f = r["expert_fractions"]
        soft = "" if r["soft_loss"] is None else f"{r['soft_loss']:.3f}"
        lines.append(
            f"| {r['seq_len']} | {r['blocks']} | {r['full_ms']:.1f} | {r['hard_ms']:.1f} | {r['speedup']:.2f}x | "
            f"{100 * r['attention_flops_fraction']:.1f} | {100 * f['full']:.1f} / {100 * f['linear']:.1f} / {100 * f['window']:.1f} | "
            f"{r['full_loss']:.3f} | {r['hard_loss']:.3f} | {soft} | {r['loss_change']:+.3f} | "
            f"{'' if r.get('loss_change_vs_soft') is None else format(r['loss_change_vs_soft'], '+.3f')} |"
        )
    return "\n".join(lines) + (
        f"\n\nBatch 1, {result['threads']} thread(s). Attention FLOPs: the attention core the hard pass computed (scores and "
        "values, window gathers, chunked prefix states) over causal softmax attention's 2 n hd T (T + 1) per layer (the causal CPU "
        "kernel skips the masked half). Loss full: the same weights with softmax attention for every token (never trained "
        "that way); loss soft: every expert mixed, as trained.\n"
    )
