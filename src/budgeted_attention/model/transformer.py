"""Pre-LayerNorm transformer encoder classifier with budget-gated attention heads."""

from __future__ import annotations

import dataclasses
import json
import math

import torch
import torch.nn.functional as F
from torch import nn

from budgeted_attention.model.attention import GatedSelfAttention
from budgeted_attention.model.config import ModelConfig
from budgeted_attention.model.cost import CostModel
from budgeted_attention.model.family import GatedModel


def sinusoidal_positions(max_len: int, d_model: int, amplitude: float = 0.5) -> torch.Tensor:
    """(max_len, d_model) sinusoidal table used to *initialise* the learned position embeddings.

    Offsets between positions become (near-)linear maps of the embedding, which makes
    "attend to the neighbouring token" quick to learn; the table stays trainable.
    """
    positions = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)
    frequencies = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(positions * frequencies)
    table[:, 1::2] = torch.cos(positions * frequencies)[:, : d_model // 2]
    return amplitude * table


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc2(F.gelu(self.fc1(x)))
        # Dropout modules only in training: in eval they are identities whose calls cost time.
        return self.dropout(y) if self.training else y


class EncoderBlock(nn.Module):
    """x + Attn(LN(x)), then x + FFN(LN(x)) (FFN omitted when d_ff == 0)."""

    def __init__(self, cfg: ModelConfig, n_heads: int) -> None:
        super().__init__()
        self.ln_attn = nn.LayerNorm(cfg.d_model)
        self.attn = GatedSelfAttention(cfg.d_model, n_heads, cfg.head_dim, cfg.dropout)
        self.dropout = nn.Dropout(cfg.dropout)
        self.has_ffn = cfg.d_ff > 0
        if self.has_ffn:
            self.ln_ffn = nn.LayerNorm(cfg.d_model)
            self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.dropout)

    def forward(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None, head_gates: torch.Tensor | None
    ) -> torch.Tensor:
        y = self.attn(self.ln_attn(x), attn_mask, head_gates)
        x = x + (self.dropout(y) if self.training else y)
        if self.has_ffn:
            x = x + self.ffn(self.ln_ffn(x))
        return x


class EncoderClassifier(GatedModel):
    """Token + learned position embeddings -> pre-LN blocks -> final LN -> pooling -> linear.

    Gating: ``forward(ids, budget=b)`` multiplies each head's output by its budget gate g(b);
    ``forward(ids, gates=G)`` uses explicit full-grid gates (e.g. hard 0/1 masks); with neither,
    no gate code runs at all (the dense fast path). Pruned and sorted copies re-index the gates
    to the heads they hold (see :mod:`budgeted_attention.model.family`).
    """

    family = "encoder"

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.position_embedding = nn.Embedding(config.max_len, config.d_model)
        self.embedding_dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(EncoderBlock(config, h) for h in config.heads_per_layer)
        self.ln_final = nn.LayerNorm(config.d_model)
        self.classifier = nn.Linear(config.d_model, config.n_classes)
        self._init_heads(config.n_layers, config.n_heads, config.head_ids)
        nn.init.normal_(self.token_embedding.weight, std=0.35)
        with torch.no_grad():
            self.position_embedding.weight.copy_(sinusoidal_positions(config.max_len, config.d_model))

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        *,
        budget: float | None = None,
        gates: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Class logits.

        Args:
            input_ids: (batch, seq) token ids, seq <= max_len.
            attention_mask: optional (batch, seq), 1 for real tokens and 0 for padding.
            token_type_ids: accepted for interface parity; this model has no segment embeddings,
                so anything but all zeros is refused.
            budget: attention budget in (0, 1] for the budget gates.
            gates: explicit (n_layers, n_heads) full-grid gate values (overrides ``budget``).

        Returns:
            (batch, n_classes) logits.
        """
        batch, seq = input_ids.shape
        if seq > self.config.max_len:
            raise ValueError(f"sequence length {seq} exceeds model max_len {self.config.max_len}")
        if token_type_ids is not None and bool(token_type_ids.any()):
            raise ValueError("this encoder has no segment embeddings: token_type_ids must be None or all zeros")
        positions = torch.arange(seq, device=input_ids.device)
        x = self.token_embedding(input_ids) + self.position_embedding(positions)
        if self.training:
            x = self.embedding_dropout(x)
        sdpa_mask = None
        if attention_mask is not None and not bool(attention_mask.all()):
            sdpa_mask = attention_mask.bool().view(batch, 1, 1, seq)
        per_layer = self.layer_gates(budget, gates)
        for layer, block in enumerate(self.blocks):
            x = block(x, sdpa_mask, None if per_layer is None else per_layer[layer])
        x = self.ln_final(x)
        return self.classifier(self.pool(x, attention_mask))

    def pool(self, x: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """(batch, seq, d) -> (batch, d)."""
        if self.config.pooling == "cls":
            return x[:, 0]
        if attention_mask is None:
            return x.mean(dim=1)
        weights = attention_mask.to(x.dtype).unsqueeze(-1)
        return (x * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1.0)

    # ------------------------------------------------------------------ family hooks

    @property
    def max_len(self) -> int:
        return self.config.max_len

    def _physical_keep(self, positions: list[list[int]]) -> None:
        for block, layer_positions in zip(self.blocks, positions):
            block.attn.keep_heads(layer_positions)

    def keep_heads(self, kept: list[list[int]]) -> None:
        super().keep_heads(kept)
        self.config = dataclasses.replace(self.config, heads_per_layer=self.heads_per_layer, head_ids=self.head_ids)

    def _set_active(self, counts: list[int]) -> None:
        for block, count in zip(self.blocks, counts):
            block.attn.set_active_heads(count)

    def cost_model(self, seq_len: int) -> CostModel:
        return CostModel(self.config.unpruned(), seq_len)

    def plain_reference(self) -> nn.Module:
        from budgeted_attention.benchmark.reference import PlainEncoder  # noqa: PLC0415

        return PlainEncoder(self)

    def describe(self) -> dict:
        return {"model_config": json.loads(self.config.to_json())}

    @classmethod
    def from_description(cls, description: dict) -> EncoderClassifier:
        return cls(ModelConfig.from_json_dict(description["model_config"]))
