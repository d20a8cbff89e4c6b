"""Causal language models with budget-gated heads (and FFN groups): the ``decoder`` family.

The same pre-LN blocks, gates, surgery and slicing as the encoder (:class:`BlockStack`), with
causal self-attention, a tied output layer (the token embedding matrix) and two options of
Simple Attention Networks (SAN): ``d_ff: 0`` removes the feed-forward blocks (attention-only),
``qk_norm`` RMS-normalises every head's queries and keys, and ``residual_gate`` puts a learned
scalar on each residual branch.

Padding: sequences are right-padded (real tokens first), so causal attention alone keeps every
real position away from padding; the loss ignores padded targets (:func:`lm_loss`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from budgeted_attention.model.compact import CompactDecoder
from budgeted_attention.model.config import ModelConfig
from budgeted_attention.model.cost import CostModel
from budgeted_attention.model.gates import UnitGates
from budgeted_attention.model.transformer import BlockStack, sinusoidal_positions


@dataclass
class DecoderConfig(ModelConfig):
    """Shape of a :class:`CausalLM`: the fields of :class:`ModelConfig` (``n_classes`` and
    ``pooling`` are unused; ``qk_norm`` and ``residual_gate`` are the SAN options)."""


@dataclass(frozen=True)
class DecoderCostModel(CostModel):
    """FLOPs of one forward pass of a :class:`CausalLM` over ``seq_len`` tokens: the blocks as in
    the encoder, except that every query scores and mixes only the keys up to itself (T (T + 1) / 2
    pairs, not T x T: the causal CPU SDPA kernel skips the masked half, 7.0 vs 11.0 ms at T = 2048
    on this machine), plus the tied output layer at every position as fixed cost."""

    def attention_pairs(self) -> int:
        return self.seq_len * (self.seq_len + 1) // 2

    def classifier_flops(self) -> int:
        return 2 * self.seq_len * self.config.d_model * self.config.vocab_size


class CausalLM(BlockStack):
    """Token + learned position embeddings -> causal pre-LN blocks -> final LN -> tied output layer.

    Gating as in :class:`~budgeted_attention.model.transformer.EncoderClassifier`: ``budget=b``
    for the soft gates, ``gates=`` for explicit full-grid gates, neither for the dense path.
    """

    family = "decoder"
    config_class = DecoderConfig

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self._build(config, causal=True, qk_norm=config.qk_norm, residual_gate=config.residual_gate)
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        if self.position_embedding is not None:
            with torch.no_grad():
                self.position_embedding.weight.copy_(sinusoidal_positions(config.max_len, config.d_model, amplitude=0.02))

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        *,
        budget: float | None = None,
        gates: torch.Tensor | UnitGates | None = None,
    ) -> torch.Tensor:
        """Next-token logits.

        Args:
            input_ids: (batch, seq) token ids, seq <= max_len, right-padded.
            attention_mask: optional (batch, seq), 1 for real tokens; unused by the blocks (causal
                attention never reaches right padding), accepted for interface parity.
            token_type_ids: must be None or all zeros (no segments).
            budget, gates: as for every family.

        Returns:
            (batch, seq, vocab_size) logits; position t predicts token t + 1.
        """
        x = self._hidden_states(input_ids, token_type_ids, None, self.layer_selections(input_ids, None, budget, gates))
        return F.linear(x, self.token_embedding.weight)

    def cost_model(self, seq_len: int) -> DecoderCostModel:
        return DecoderCostModel(self.config.unpruned(), seq_len)

    def inference_module(self, *, routed: bool = False) -> CompactDecoder:
        """:class:`~budgeted_attention.model.compact.CompactDecoder` of the current layout (softmax attention only)."""
        return CompactDecoder(self, routed=routed)

    # ------------------------------------------------------------------ Meta-Attention

    def meta_layers(self) -> list[nn.Module]:
        """The Meta-Attention modules (``model.attention: meta``), one per block; else empty."""
        return [block.attn for block in self.blocks] if self.config.attention == "meta" else []

    def set_routing(self, mode: str) -> None:
        """``soft`` (mix every expert) or ``hard`` (each token computes its argmax expert only, in eval mode)."""
        if mode not in ("soft", "hard"):
            raise ValueError(f"routing must be 'soft' or 'hard', got {mode!r}")
        layers = self.meta_layers()
        if not layers:
            raise ValueError("this model has no Meta-Attention layers (model.attention is 'softmax')")
        for layer in layers:
            layer.routing = mode

    def auxiliary_loss(self) -> torch.Tensor | None:
        """kl_weight x the mean over layers (and training forward passes) of the routing KL."""
        terms = [kl for kl in (layer.take_kl() for layer in self.meta_layers()) if kl is not None]
        if not terms:
            return None
        return self.config.meta.kl_weight * torch.stack(terms).mean()


def lm_loss(logits: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean next-token cross-entropy in nats over real target tokens.

    Args:
        logits: (batch, seq, vocab) from :class:`CausalLM`.
        input_ids: (batch, seq); the target of position t is token t + 1.
        attention_mask: optional (batch, seq), 1 for real tokens (padded targets are ignored).
    """
    targets = input_ids[:, 1:]
    if attention_mask is not None:
        targets = targets.masked_fill(attention_mask[:, 1:] == 0, -100)
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)
