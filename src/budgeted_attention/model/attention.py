"""Multi-head self-attention with per-head gates and prefix slicing of heads.

Weight layout (chosen so that any prefix of heads is a contiguous, copy-free view):

* ``qkv_weight`` (n_heads * 3 * head_dim, d_model): rows of head h are ``[q_h; k_h; v_h]``.
* ``out_weight_t`` (n_heads * head_dim, d_model): the output projection stored transposed,
  rows of head h are ``head_dim`` consecutive rows.

With heads sorted by importance, serving the first ``n`` heads of a layer is slicing
``qkv_weight[: n * 3 * head_dim]`` and ``out_weight_t[: n * head_dim]``: no copy, no rebuild.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from budgeted_attention.model.gathered import GatherCache, gather_heads


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
        self._gathered = GatherCache()  # per-input head sets' weights, inference only
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

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        head_gates: torch.Tensor | tuple[int, ...] | None = None,
    ) -> torch.Tensor:
        """Attend over ``x``.

        Args:
            x: (batch, seq, d_model) hidden states.
            attn_mask: None, or boolean (batch, 1, 1, seq) with True where keys may be attended.
            head_gates: None (no gating: the fast dense path); float gate values of the heads this
                forward pass runs, (active_heads,) or per input (batch, active_heads); or a boolean
                (batch, active_heads) selection per input: only the selected heads are computed
                (inputs grouped by head set), as a per-input router's hard decision; or a tuple of
                physical head positions, ascending: the one head set the whole batch runs.

        Returns:
            (batch, seq, d_model) attention output, before the residual add.
        """
        if isinstance(head_gates, tuple):
            return self._forward_set(x, attn_mask, head_gates)
        if head_gates is not None and head_gates.dtype == torch.bool:
            return self._forward_selected(x, attn_mask, head_gates)
        n = self.active_heads
        if n == 0:
            return self.out_bias.expand(x.shape[0], x.shape[1], self.d_model)
        hd = self.head_dim
        if n == self.n_heads:  # every stored head: no slicing views on the dense path
            weights = self.qkv_weight, self.qkv_bias, self.out_weight_t
        else:
            weights = self.qkv_weight[: n * 3 * hd], self.qkv_bias[: n * 3 * hd], self.out_weight_t[: n * hd]
        return self._attend(x, attn_mask, n, *weights, head_gates)

    def _attend(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None,
        n: int,
        qkv_weight: torch.Tensor,
        qkv_bias: torch.Tensor,
        out_weight_t: torch.Tensor,
        head_gates: torch.Tensor | None = None,
        out_bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention of ``n`` heads whose weights are given (rows as in the stored layout);
        ``out_bias`` replaces the output bias (a per-head share of the sum adds none)."""
        batch, seq, _ = x.shape
        hd = self.head_dim
        qkv = F.linear(x, qkv_weight, qkv_bias)
        qkv = qkv.view(batch, seq, n, 3, hd).permute(3, 0, 2, 1, 4)  # (3, B, n, T, hd)
        q, k, v = qkv.unbind(0)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        is_causal = False
        if self.causal:
            if attn_mask is None:
                is_causal = True
            else:  # keys must be both earlier (or the same position) and real tokens
                attn_mask = attn_mask & torch.ones(seq, seq, dtype=torch.bool, device=x.device).tril()
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=self.dropout if self.training else 0.0, is_causal=is_causal
        )  # (B, n, T, hd)
        if head_gates is not None:
            y = y * head_gates.to(y.dtype).view(-1, n, 1, 1)
        y = y.transpose(1, 2).reshape(batch * seq, n * hd)
        out = torch.addmm(self.out_bias if out_bias is None else out_bias, y, out_weight_t)
        return out.view(batch, seq, self.d_model)

    def _forward_heads(self, x: torch.Tensor, attn_mask: torch.Tensor | None, heads: torch.Tensor) -> torch.Tensor:
        """Attention of the physical heads at positions ``heads`` (1-D long) only: their weight rows
        are gathered (a copy of 1/seq of the work it saves)."""
        n = int(heads.numel())
        if n == 0:
            return self.out_bias.expand(x.shape[0], x.shape[1], self.d_model)
        if n == self.n_heads:
            return self._attend(x, attn_mask, n, self.qkv_weight, self.qkv_bias, self.out_weight_t)
        return self._attend(x, attn_mask, n, *self._gather(heads))

    def _forward_selected(self, x: torch.Tensor, attn_mask: torch.Tensor | None, selected: torch.Tensor) -> torch.Tensor:
        """Per-input head sets: ``selected`` (batch, active_heads) boolean. Inputs sharing a head
        set run together; each group computes its heads only."""
        if selected.shape != (x.shape[0], self.active_heads):
            raise ValueError(f"head selection must have shape ({x.shape[0]}, {self.active_heads}), got {tuple(selected.shape)}")
        if selected.shape[0] == 1:  # one input (the serving case): no grouping work
            return self._forward_pattern(x, attn_mask, selected[0])
        patterns, inverse = torch.unique(selected, dim=0, return_inverse=True)
        if patterns.shape[0] == 1:
            return self._forward_pattern(x, attn_mask, patterns[0])
        if patterns.shape[0] > self.active_heads:  # more head sets than heads: fewer, larger calls per head
            return self._forward_per_head(x, attn_mask, selected)
        out = x.new_empty(x.shape[0], x.shape[1], self.d_model)
        for group, pattern in enumerate(patterns):
            rows = (inverse == group).nonzero().flatten()
            mask = None if attn_mask is None else attn_mask.index_select(0, rows)
            out[rows] = self._forward_pattern(x.index_select(0, rows), mask, pattern)
        return out

    def _forward_per_head(self, x: torch.Tensor, attn_mask: torch.Tensor | None, selected: torch.Tensor) -> torch.Tensor:
        """Per-input head sets computed head by head: head h runs on the inputs that selected it,
        from its own contiguous weight rows (views, no gather), and its share of the output
        projection is added to those inputs' rows. The same FLOPs as grouping by head set, in at
        most ``active_heads`` calls instead of one per distinct set."""
        batch, seq, _ = x.shape
        hd = self.head_dim
        out = self.out_bias.expand(batch, seq, self.d_model).clone()
        no_bias = torch.zeros_like(self.out_bias)
        for head, chosen in enumerate(selected.t().tolist()):
            rows = [i for i, on in enumerate(chosen) if on]
            if not rows:
                continue
            index = torch.tensor(rows, dtype=torch.long, device=x.device)
            every = len(rows) == batch
            part = self._attend(
                x if every else x.index_select(0, index),
                attn_mask if attn_mask is None or every else attn_mask.index_select(0, index),
                1,
                self.qkv_weight[head * 3 * hd : (head + 1) * 3 * hd],
                self.qkv_bias[head * 3 * hd : (head + 1) * 3 * hd],
                self.out_weight_t[head * hd : (head + 1) * hd],
                out_bias=no_bias,
            )
            if every:
                out += part
            else:
                out.index_add_(0, index, part)
        return out

    def _forward_pattern(self, x: torch.Tensor, attn_mask: torch.Tensor | None, pattern: torch.Tensor) -> torch.Tensor:
        """Attention of the heads selected by ``pattern`` ((active_heads,) bool) only. Without
        autograd, the gathered weights of a head set come from a cache."""
        if torch.is_grad_enabled():
            return self._forward_heads(x, attn_mask, pattern.nonzero().flatten())
        return self._forward_set(x, attn_mask, tuple(i for i, on in enumerate(pattern.tolist()) if on))

    def _forward_set(self, x: torch.Tensor, attn_mask: torch.Tensor | None, heads: tuple[int, ...]) -> torch.Tensor:
        """Attention of the physical heads ``heads`` (ascending positions) only; without autograd
        their gathered weights come from a cache per set."""
        n = len(heads)
        if torch.is_grad_enabled() or n == 0 or n == self.n_heads:
            return self._forward_heads(x, attn_mask, torch.tensor(heads, dtype=torch.long, device=x.device))
        weights = self._gathered.get(
            heads, (self.qkv_weight, self.qkv_bias, self.out_weight_t),
            lambda: self._gather(torch.tensor(heads, dtype=torch.long, device=x.device)),
        )
        return self._attend(x, attn_mask, n, *weights)

    def _gather(self, heads: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(qkv_weight, qkv_bias, out_weight_t) rows of the physical heads ``heads`` (1-D long), copied."""
        return gather_heads(self.qkv_weight, self.qkv_bias, self.out_weight_t, heads, self.head_dim)

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
