"""Pre-LayerNorm transformer encoder classifier with budget-gated attention heads."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from budgeted_attention.errors import ConfigError
from budgeted_attention.model.attention import GatedSelfAttention
from budgeted_attention.model.compact import CompactEncoder, pool_states
from budgeted_attention.model.config import ModelConfig
from budgeted_attention.model.cost import CostModel
from budgeted_attention.model.family import GatedModel
from budgeted_attention.model.gates import DENSE, LayerSelection, UnitGates
from budgeted_attention.model.lean import unsupported_by_any
from budgeted_attention.model.meta_attention import MetaSelfAttention


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


def gated_hidden(
    linear: nn.Linear, act: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, width: int, group_gates: torch.Tensor | None, group_size: int
) -> torch.Tensor:
    """``act`` of the first ``width`` (> 0) neurons of ``linear`` over ``x`` (a view of its rows),
    each group of ``group_size`` neurons scaled by its gate (``group_gates``: (groups,) or None)."""
    h = act(linear(x) if width == linear.out_features else F.linear(x, linear.weight[:width], linear.bias[:width]))
    return h if group_gates is None else h * group_gates.to(h.dtype).repeat_interleave(group_size)


def prefix_linear(linear: nn.Linear, h: torch.Tensor) -> torch.Tensor:
    """``linear`` reading only the first ``h.shape[-1]`` of its input features (the FFN's active
    neurons: a view of its weight's columns); width 0 gives the bias alone."""
    width = h.shape[-1]
    if width == linear.in_features:
        return linear(h)
    if width == 0:
        return linear.bias.expand(*h.shape[:-1], linear.out_features)
    return F.linear(h, linear.weight[:, :width], linear.bias)


@torch.no_grad()
def keep_neurons(first: nn.Linear, second: nn.Linear, neurons: list[int]) -> None:
    """Keep only the FFN neurons at ``neurons`` (storage indices, in this order): rows of
    ``first``, input columns of ``second``."""
    index = torch.tensor(neurons, dtype=torch.long)
    first.weight = nn.Parameter(first.weight[index].clone())
    first.bias = nn.Parameter(first.bias[index].clone())
    second.weight = nn.Parameter(second.weight[:, index].clone())
    first.out_features = second.in_features = len(neurons)


class FeedForward(nn.Module):
    """fc2(GELU(fc1(x))) with optional gates over groups of ``group_size`` consecutive neurons.

    Prefix slicing (instant switching): the first ``active_width`` neurons run, i.e. rows of
    ``fc1`` and columns of ``fc2`` (strided views, no copies). Width 0 returns ``fc2``'s bias,
    the constant fully-gated neurons would give.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float, group_size: int = 0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)
        self.group_size = group_size
        self.active_width = d_ff

    @property
    def width(self) -> int:
        """Physical neurons."""
        return self.fc1.out_features

    def forward(self, x: torch.Tensor, group_gates: torch.Tensor | None = None) -> torch.Tensor:
        """(batch, seq, d_model) -> (batch, seq, d_model); ``group_gates``: (active groups,) or None."""
        if self.active_width == 0:
            return self.fc2.bias.expand(*x.shape[:-1], self.fc2.out_features)
        y = prefix_linear(self.fc2, gated_hidden(self.fc1, self.act, x, self.active_width, group_gates, self.group_size))
        # Dropout modules only in training: in eval they are identities whose calls cost time.
        return self.dropout(y) if self.training else y

    def keep_neurons(self, neurons: list[int]) -> None:
        """Physically keep only the neurons at ``neurons`` (storage indices, in this order)."""
        keep_neurons(self.fc1, self.fc2, neurons)
        self.active_width = len(neurons)


class EncoderBlock(nn.Module):
    """x + Attn(LN(x)), then x + FFN(LN(x)) (FFN omitted when d_ff == 0): the pre-LN block of the
    encoder and, with ``causal``, of the decoder.

    Options: ``causal`` and ``qk_norm`` (see :class:`GatedSelfAttention`); ``residual_gate``: a
    learned scalar (initialised to 1) on each residual branch, as Simple Attention Networks allow.
    """

    def __init__(
        self, cfg: ModelConfig, n_heads: int, ffn_width: int | None = None, *,
        causal: bool = False, qk_norm: bool = False, residual_gate: bool = False,
    ) -> None:
        super().__init__()
        self.ln_attn = nn.LayerNorm(cfg.d_model)
        if cfg.attention == "meta":
            self.attn = MetaSelfAttention(cfg.d_model, n_heads, cfg.head_dim, cfg.dropout, cfg.meta, cfg.max_len, qk_norm=qk_norm)
        else:
            self.attn = GatedSelfAttention(cfg.d_model, n_heads, cfg.head_dim, cfg.dropout, causal=causal, qk_norm=qk_norm)
        self.dropout = nn.Dropout(cfg.dropout)
        self.has_ffn = cfg.d_ff > 0
        if self.has_ffn:
            self.ln_ffn = nn.LayerNorm(cfg.d_model)
            self.ffn = FeedForward(cfg.d_model, cfg.d_ff if ffn_width is None else ffn_width, cfg.dropout, cfg.ffn_group_size)
        self.residual_gate = residual_gate
        if residual_gate:
            self.attn_gain = nn.Parameter(torch.ones(()))
            if self.has_ffn:
                self.ffn_gain = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None, selection: LayerSelection = DENSE) -> torch.Tensor:
        """(batch, seq, d_model) -> (batch, seq, d_model), running the heads and FFN groups ``selection`` names."""
        # A sub-layer without units adds only its output bias: skip its LayerNorm (whole-layer
        # skip when both are empty).
        if self.attn.active_heads == 0:
            y = self.attn.out_bias
        else:
            y = self.attn(self.ln_attn(x), attn_mask, selection)
            y = self.dropout(y) if self.training else y
        x = x + (self.attn_gain * y if self.residual_gate else y)
        if self.has_ffn:
            y = self.ffn.fc2.bias if self.ffn.active_width == 0 else self.ffn(self.ln_ffn(x), selection.ffn)
            x = x + (self.ffn_gain * y if self.residual_gate else y)
        return x


class BlockStack(GatedModel):
    """The family hooks shared by models built from :class:`EncoderBlock` s (``self.blocks``) and
    a dataclass config (``self.config``, of type ``config_class``): the encoder and the decoder."""

    config_class: ClassVar[type] = ModelConfig
    blocks: nn.ModuleList

    def _build(self, config: ModelConfig, *, causal: bool = False, qk_norm: bool = False, residual_gate: bool = False) -> None:
        """Embeddings, blocks and the final LayerNorm of ``config`` (then the gate grids)."""
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        # No position table with ``positions: none`` (causal decoders only).
        self.position_embedding = nn.Embedding(config.max_len, config.d_model) if config.positions == "learned" else None
        self.embedding_dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(
            EncoderBlock(config, h, w, causal=causal, qk_norm=qk_norm, residual_gate=residual_gate)
            for h, w in zip(config.heads_per_layer, config.ffn_widths)
        )
        self.ln_final = nn.LayerNorm(config.d_model)
        self._init_heads(
            config.n_layers, config.n_heads, config.head_ids,
            ffn_width=config.d_ff, group_size=config.ffn_group_size, group_ids=config.ffn_group_ids or None,
        )

    def _hidden_states(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None,
        sdpa_mask: torch.Tensor | None,
        selections: list[LayerSelection],
    ) -> torch.Tensor:
        """Embeddings through every block and the final LayerNorm: (batch, seq) -> (batch, seq, d_model).

        ``sdpa_mask``: None or boolean (batch, 1, 1, seq), True where keys may be attended;
        ``selections``: one per block (:meth:`GatedModel.layer_selections`).
        """
        seq = input_ids.shape[1]
        if seq > self.config.max_len:
            raise ValueError(f"sequence length {seq} exceeds model max_len {self.config.max_len}")
        if token_type_ids is not None and bool(token_type_ids.any()):
            raise ValueError(f"this {self.family} model has no segment embeddings: token_type_ids must be None or all zeros")
        x = self.token_embedding(input_ids)
        if self.position_embedding is not None:
            x = x + self.position_embedding(torch.arange(seq, device=input_ids.device))
        if self.training:
            x = self.embedding_dropout(x)
        for block, selection in zip(self.blocks, selections):
            x = block(x, sdpa_mask, selection)
        return self.ln_final(x)

    @property
    def max_len(self) -> int:
        return self.config.max_len

    def input_embedding(self) -> nn.Embedding:
        return self.token_embedding

    @property
    def pad_id(self) -> int:
        return int(self.config.pad_id)

    def _physical_keep(self, positions: list[list[int]]) -> None:
        for block, layer_positions in zip(self.blocks, positions):
            block.attn.keep_heads(layer_positions)

    def _after_surgery(self) -> None:
        self.config = dataclasses.replace(
            self.config, heads_per_layer=self.heads_per_layer, head_ids=self.head_ids,
            ffn_group_ids=self.group_ids if self.has_ffn_units else [],
        )

    def _set_active(self, counts: list[int]) -> None:
        for block, count in zip(self.blocks, counts):
            block.attn.set_active_heads(count)

    def _keep_neurons(self, neurons: list[list[int]]) -> None:
        for block, layer_neurons in zip(self.blocks, neurons):
            block.ffn.keep_neurons(layer_neurons)

    def _set_active_ffn(self, counts: list[int]) -> None:
        for block, count in zip(self.blocks, counts):
            block.ffn.active_width = count * self.group_size

    def ffn_widths(self) -> list[int]:
        return [block.ffn.width if block.has_ffn else 0 for block in self.blocks]

    def ffn_activations(self) -> list[nn.Module]:
        if not self.config.d_ff:
            raise ValueError("this model has no feed-forward blocks (d_ff = 0)")
        return [block.ffn.act for block in self.blocks]

    def cost_model(self, seq_len: int) -> CostModel:
        return CostModel(self.config.unpruned(), seq_len)

    def describe(self) -> dict:
        return {"model_config": json.loads(self.config.to_json())}

    @classmethod
    def from_description(cls, description: dict) -> BlockStack:
        return cls(cls.config_class.from_json_dict(description["model_config"]))

    def lean_unsupported(self, *, routed: bool = False) -> str | None:
        if self.config.attention == "meta":
            return "meta-attention (model.attention: meta; its module tree runs it)"
        return unsupported_by_any(self, routed=routed)


class EncoderClassifier(BlockStack):
    """Token + learned position embeddings -> pre-LN blocks -> final LN -> pooling -> linear.

    Gating: ``forward(ids, budget=b)`` multiplies each head's output by its budget gate g(b);
    ``forward(ids, gates=G)`` uses explicit full-grid gates (e.g. hard 0/1 masks); with neither,
    no gate code runs at all (the dense fast path). Pruned and sorted copies re-index the gates
    to the heads they hold (see :mod:`budgeted_attention.model.family`).
    """

    family = "encoder"
    supports_routing = True

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if config.attention != "softmax":
            raise ConfigError(f"model.attention {config.attention!r} is causal routing for the decoder family; the encoder uses 'softmax'")
        if config.positions != "learned":
            raise ConfigError("model.positions 'none' is for the causal decoder; a bidirectional encoder needs position embeddings")
        self._build(config, qk_norm=config.qk_norm, residual_gate=config.residual_gate)
        self.classifier = nn.Linear(config.d_model, config.n_classes)
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
        gates: torch.Tensor | UnitGates | None = None,
    ) -> torch.Tensor:
        """Class logits.

        Args:
            input_ids: (batch, seq) token ids, seq <= max_len.
            attention_mask: optional (batch, seq), 1 for real tokens and 0 for padding.
            token_type_ids: accepted for interface parity; this model has no segment embeddings,
                so anything but all zeros is refused.
            budget: attention budget in (0, 1] for the budget gates.
            gates: explicit full-grid gate values (overrides ``budget``): a (n_layers, n_heads)
                tensor, or :class:`UnitGates` with FFN group gates too.

        Returns:
            (batch, n_classes) logits.
        """
        batch, seq = input_ids.shape
        sdpa_mask = None
        if attention_mask is not None and not bool(attention_mask.all()):
            sdpa_mask = attention_mask.bool().view(batch, 1, 1, seq)
        # Without padding the router pools without the mask's ops (the same numbers).
        selections = self.layer_selections(input_ids, None if sdpa_mask is None else attention_mask, budget, gates)
        x = self._hidden_states(input_ids, token_type_ids, sdpa_mask, selections)
        return self.classifier(pool_states(x, attention_mask, self.config.pooling))

    # ------------------------------------------------------------------ family hooks

    def inference_module(self, *, routed: bool = False) -> CompactEncoder:
        """:class:`~budgeted_attention.model.compact.CompactEncoder` of the current layout."""
        return CompactEncoder(self, routed=routed)
