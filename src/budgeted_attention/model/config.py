"""The encoder's configuration, a dataclass saved as JSON next to the weights."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from budgeted_attention.config import check_bool, check_float, check_int, from_dict
from budgeted_attention.errors import ConfigError
from budgeted_attention.model.gates import validate_head_ids


EXPERTS = ("full", "linear", "window")
CONTROLLERS = ("bayesian", "prior-free", "softmax")


@dataclass
class MetaConfig:
    """Meta-Attention's routing (``model.attention: meta``; see :mod:`budgeted_attention.model.meta_attention`).

    Attributes:
        controller: ``bayesian`` (Dirichlet posterior + compute-aware prior + KL), ``prior-free``
            (the same without the KL term) or ``softmax`` (deterministic router).
        window: keys of a window-attention token (itself and the ``window - 1`` before it).
        kl_weight: w, the weight of the mean KL(posterior || prior) in the loss (``bayesian`` only).
        hidden: hidden units of the controller MLP.
        costs: relative cost c_i of the experts (full, linear, window), for the prior and the
            projected cost.
        prior_eps, prior_scale: prior concentration beta_i = eps + scale * (1 - c_i).
    """

    controller: str = "bayesian"
    window: int = 16
    kl_weight: float = 0.1
    hidden: int = 64
    costs: list[float] = field(default_factory=lambda: [1.0, 0.15, 0.30])
    prior_eps: float = 0.01
    prior_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.controller not in CONTROLLERS:
            raise ConfigError(f"model.meta.controller must be one of {', '.join(CONTROLLERS)}, got {self.controller!r}")
        check_int(self.window, "model.meta.window", ge=1)
        check_int(self.hidden, "model.meta.hidden", ge=1)
        self.kl_weight = check_float(self.kl_weight, "model.meta.kl_weight", ge=0.0)
        self.prior_eps = check_float(self.prior_eps, "model.meta.prior_eps", gt=0.0)
        self.prior_scale = check_float(self.prior_scale, "model.meta.prior_scale", ge=0.0)
        if not isinstance(self.costs, (list, tuple)) or len(self.costs) != len(EXPERTS):
            raise ConfigError(f"model.meta.costs must list {len(EXPERTS)} costs ({', '.join(EXPERTS)}), got {self.costs!r}")
        self.costs = [check_float(c, "model.meta.costs", ge=0.0, le=1.0) for c in self.costs]
        if self.controller == "prior-free":
            self.kl_weight = 0.0

    def prior_concentration(self) -> list[float]:
        """beta_i = eps + scale * (1 - c_i): cheap experts get more prior mass ([0.01, 0.86, 0.71] by default)."""
        return [self.prior_eps + self.prior_scale * (1.0 - c) for c in self.costs]


@dataclass
class ModelConfig:
    """Shape of an :class:`EncoderClassifier`.

    Attributes:
        vocab_size: number of token ids.
        n_classes: number of output classes.
        max_len: longest sequence (learned position embeddings), tokens.
        d_model: hidden size.
        n_layers: encoder blocks.
        n_heads: heads per layer of the unpruned model.
        head_dim: size of one head; ``d_model // n_heads`` when 0.
        d_ff: feed-forward inner size (0 removes feed-forward blocks: attention-only model).
        dropout: dropout on embeddings, attention and residual branches.
        pad_id: padding token id.
        pooling: ``"cls"`` (first position) or ``"mean"`` (mask-aware mean).
        heads_per_layer: heads physically present per layer; empty means ``n_heads`` everywhere.
            Structurally pruned models have uneven counts (0 allowed: the layer skips attention).
        head_ids: per layer, the original head index of each physical head (storage order);
            empty means the identity layout. Derived from ``heads_per_layer`` when not given.
        ffn_group_size: feed-forward neurons per gated group (``budget_scope: all``); 0 keeps the
            feed-forward blocks out of the budget (the paper). Must divide ``d_ff``.
        ffn_group_ids: per layer, the original group index of each physical FFN group (storage
            order); empty means every group in its original order.
        qk_norm: RMS-normalise every head's queries and keys (gains shared by the heads), as
            Simple Attention Networks do to keep deep attention-only stacks trainable.
        residual_gate: a learned scalar gain on every residual branch.
        attention: ``softmax`` (every token attends with softmax attention) or ``meta``
            (Meta-Attention: per-token routing among full, linear and window attention; decoder only).
        meta: the routing settings of ``attention: meta``.
        positions: ``learned`` position embeddings (``max_len`` of them) or ``none`` (a causal
            decoder infers order from its mask; runs at any length up to ``max_len`` without a
            table, e.g. trained at 256 tokens and evaluated at 8k).
    """

    vocab_size: int = 64
    n_classes: int = 2
    max_len: int = 128
    d_model: int = 64
    n_layers: int = 4
    n_heads: int = 4
    head_dim: int = 0
    d_ff: int = 256
    dropout: float = 0.0
    pad_id: int = 0
    pooling: str = "cls"
    heads_per_layer: list[int] = field(default_factory=list)
    head_ids: list[list[int]] = field(default_factory=list)
    ffn_group_size: int = 0
    ffn_group_ids: list[list[int]] = field(default_factory=list)
    qk_norm: bool = False
    residual_gate: bool = False
    attention: str = "softmax"
    meta: MetaConfig = field(default_factory=MetaConfig)
    positions: str = "learned"

    def __post_init__(self) -> None:
        if self.attention not in ("softmax", "meta"):
            raise ConfigError(f"model.attention must be 'softmax' or 'meta', got {self.attention!r}")
        if self.positions not in ("learned", "none"):
            raise ConfigError(f"model.positions must be 'learned' or 'none', got {self.positions!r}")
        if isinstance(self.meta, dict):  # from dataclasses.replace / JSON round trips
            self.meta = MetaConfig(**self.meta)
        self.qk_norm = check_bool(self.qk_norm, "model.qk_norm")
        self.residual_gate = check_bool(self.residual_gate, "model.residual_gate")
        for name in ("vocab_size", "n_classes", "max_len", "d_model", "n_layers", "n_heads"):
            check_int(getattr(self, name), f"model.{name}", ge=1)
        check_int(self.head_dim, "model.head_dim", ge=0)
        check_int(self.d_ff, "model.d_ff", ge=0)
        check_int(self.pad_id, "model.pad_id", ge=0, le=self.vocab_size - 1)
        if self.head_dim == 0:
            if self.d_model % self.n_heads:
                raise ConfigError(
                    f"model.d_model ({self.d_model}) must be divisible by model.n_heads "
                    f"({self.n_heads}) unless model.head_dim is set"
                )
            self.head_dim = self.d_model // self.n_heads
        self.dropout = check_float(self.dropout, "model.dropout", ge=0.0, lt=1.0)
        if self.pooling not in ("cls", "mean"):
            raise ConfigError(f"model.pooling must be 'cls' or 'mean', got {self.pooling!r}")
        if self.head_ids:
            try:
                self.head_ids = validate_head_ids(self.head_ids, self.n_layers, self.n_heads)
            except ValueError as exc:
                raise ConfigError(f"model.{exc}") from None
            derived = [len(h) for h in self.head_ids]
            if self.heads_per_layer and self.heads_per_layer != derived:
                raise ConfigError(f"model.heads_per_layer {self.heads_per_layer!r} does not match model.head_ids {self.head_ids!r}")
            self.heads_per_layer = derived
        if not self.heads_per_layer:
            self.heads_per_layer = [self.n_heads] * self.n_layers
        if (
            not isinstance(self.heads_per_layer, (list, tuple))
            or len(self.heads_per_layer) != self.n_layers
            or any(isinstance(h, bool) or not isinstance(h, int) or not 0 <= h <= self.n_heads for h in self.heads_per_layer)
        ):
            raise ConfigError(
                f"model.heads_per_layer must list {self.n_layers} counts in [0, {self.n_heads}], "
                f"got {self.heads_per_layer!r}"
            )
        if not self.head_ids:
            self.head_ids = [list(range(n)) for n in self.heads_per_layer]
        self._check_ffn_groups()

    def _check_ffn_groups(self) -> None:
        check_int(self.ffn_group_size, "model.ffn_group_size", ge=0)
        if self.ffn_group_size == 0:
            if self.ffn_group_ids:
                raise ConfigError("model.ffn_group_ids needs model.ffn_group_size > 0")
            return
        if self.d_ff == 0 or self.d_ff % self.ffn_group_size:
            raise ConfigError(f"model.ffn_group_size ({self.ffn_group_size}) must divide model.d_ff ({self.d_ff}), which must be > 0")
        if self.ffn_group_ids:
            try:
                self.ffn_group_ids = validate_head_ids(self.ffn_group_ids, self.n_layers, self.n_groups)
            except ValueError as exc:
                raise ConfigError(f"model.ffn_group_ids: {exc}") from None
        else:
            self.ffn_group_ids = [list(range(self.n_groups)) for _ in range(self.n_layers)]

    @property
    def n_groups(self) -> int:
        """FFN neuron groups per unpruned layer (0 when the FFN is not gated)."""
        return self.d_ff // self.ffn_group_size if self.ffn_group_size else 0

    @property
    def ffn_widths(self) -> list[int]:
        """Physical FFN neurons per layer."""
        if not self.ffn_group_size:
            return [self.d_ff] * self.n_layers
        return [len(ids) * self.ffn_group_size for ids in self.ffn_group_ids]

    def unpruned(self, **changes: Any) -> ModelConfig:
        """The same shape (with ``changes``, e.g. ``d_model=96``) and every head (and FFN group)
        present in its original order."""
        return dataclasses.replace(self, **{**changes, "heads_per_layer": [], "head_ids": [], "ffn_group_ids": []})

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json_dict(cls, data: dict[str, Any]) -> ModelConfig:
        return from_dict(cls, data, "model")
