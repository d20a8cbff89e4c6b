"""Multi-head self-attention with per-head gates and prefix slicing of heads.

The weights are in the layout of :mod:`~budgeted_attention.model.heads` (``qkv_weight`` rows
``[q_h; k_h; v_h]`` per head, ``out_weight_t`` transposed), so with heads sorted by importance,
serving the first ``n`` heads of a layer is slicing the first rows: no copy, no rebuild.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from budgeted_attention.model.gates import DENSE, LayerSelection
from budgeted_attention.model.gathered import GatherCache
from budgeted_attention.model.heads import attend_selection


class GatedSelfAttention(nn.Module):
    """Self-attention through ``F.scaled_dot_product_attention`` with optional per-head gates.

    A layer with zero heads skips attention and returns the output-projection bias, so the
    residual stream still receives the same constant it would from fully-gated heads.

    Options for decoders: ``causal`` (each position attends to itself and earlier positions
    only) and ``qk_norm`` (RMS normalisation of every head's queries and keys over the head
    dimension, with gains shared by all heads, as in Simple Attention Networks; shared gains
    need no surgery when heads are removed).
    """

    def __init__(
        self, d_model: int, n_heads: int, head_dim: int, dropout: float = 0.0, *, causal: bool = False, qk_norm: bool = False
    ) -> None:
        super().__init__()
        self.d_model = d_model
        self.n_heads = n_heads
        self.head_dim = head_dim
        self.dropout = dropout
        self.causal = causal
        if qk_norm:
            self.q_norm = nn.RMSNorm(head_dim)
            self.k_norm = nn.RMSNorm(head_dim)
        self.qk_norm = qk_norm
        self.qkv_weight = nn.Parameter(torch.empty(n_heads * 3 * head_dim, d_model))
        self.qkv_bias = nn.Parameter(torch.zeros(n_heads * 3 * head_dim))
        self.out_weight_t = nn.Parameter(torch.empty(n_heads * head_dim, d_model))
        self.out_bias = nn.Parameter(torch.zeros(d_model))
        # Heads used in forward: a prefix of the stored heads (instant budget switching).
        self.active_heads = n_heads
        self._gathered = GatherCache()  # gathered weights of per-input head sets, inference only
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.d_model)
        nn.init.uniform_(self.qkv_weight, -bound, bound)
        nn.init.uniform_(self.out_weight_t, -bound, bound)
        nn.init.zeros_(self.qkv_bias)
        nn.init.zeros_(self.out_bias)

    def set_active_heads(self, count: int) -> None:
        """Use only the first ``count`` stored heads (0 <= count <= n_heads)."""
        if not 0 <= count <= self.n_heads:
            raise ValueError(f"active head count must be in [0, {self.n_heads}], got {count!r}")
        self.active_heads = count

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, selection: LayerSelection = DENSE) -> torch.Tensor:
        """Attend over ``x`` with the active heads, as ``selection`` says (see :class:`LayerSelection`:
        soft gates, a per-input hard selection, or one head set for the batch).

        Args:
            x: (batch, seq, d_model) hidden states.
            attn_mask: None, or boolean (batch, 1, 1, seq) with True where keys may be attended.

        Returns:
            (batch, seq, d_model) attention output, before the residual add.
        """
        return attend_selection(x, self.weights(), self.out_bias, self.head_dim, self.active_heads, selection, mask=attn_mask, **self.options())

    def weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(qkv_weight, qkv_bias, out_weight_t) of every stored head."""
        return self.qkv_weight, self.qkv_bias, self.out_weight_t

    def options(self) -> dict:
        """The keyword options of :func:`~budgeted_attention.model.heads.attend` this module runs with."""
        return {
            "causal": self.causal,
            "q_norm": self.q_norm if self.qk_norm else None,
            "k_norm": self.k_norm if self.qk_norm else None,
            "dropout": self.dropout if self.training else 0.0,
            "cache": self._gathered,
        }

    @torch.no_grad()
    def keep_heads(self, heads: list[int]) -> None:
        """Physically keep only ``heads`` (stored indices, in this order); others are removed."""
        hd = self.head_dim
        index = torch.tensor(heads, dtype=torch.long)
        qkv_w = self.qkv_weight.view(self.n_heads, 3 * hd, self.d_model)[index].reshape(-1, self.d_model)
        qkv_b = self.qkv_bias.view(self.n_heads, 3 * hd)[index].reshape(-1)
        out_w = self.out_weight_t.view(self.n_heads, hd, self.d_model)[index].reshape(-1, self.d_model)
        self.qkv_weight = nn.Parameter(qkv_w.clone())
        self.qkv_bias = nn.Parameter(qkv_b.clone())
        self.out_weight_t = nn.Parameter(out_w.clone())
        self.n_heads = len(heads)
        self.active_heads = self.n_heads
