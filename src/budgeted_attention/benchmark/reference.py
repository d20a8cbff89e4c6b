"""Plain dense encoder and decoder with no gate code, used as the latency references.

Every speedup in ``baa bench`` is ``reference latency / pruned latency``, so the reference must
run exactly the kernels the (pruned) :class:`EncoderClassifier` runs on its dense path, or part
of the "speedup" is just a slower reference. :class:`PlainEncoder` therefore mirrors the
model's dense path op for op:

* one fused Q/K/V ``F.linear`` per layer, in the model's own per-head interleaved weight layout
  (rows of head h are ``[q_h; k_h; v_h]``), so the GEMM shape *and* the strides of the q/k/v
  views handed to SDPA are identical;
* ``F.scaled_dot_product_attention`` with the same boolean key mask (True = attend), built only
  when the batch actually contains padding, as the model does;
* ``torch.addmm`` with the transposed output weight for the output projection;
* the same ``nn.LayerNorm`` / ``nn.Linear`` + ``F.gelu`` feed-forward ops and pooling
  (``cls`` or mask-aware ``mean``).

What it leaves out is exactly the part under test: gate resolution, the per-head gate
multiply, the active-head prefix slicing and the (inference-time no-op) dropout modules.

:class:`PlainDecoder` does the same for :class:`~budgeted_attention.model.decoder.CausalLM`:
causal SDPA (``is_causal``), the optional per-head QK RMS-norm and residual gains, and the tied
output layer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from budgeted_attention.model.transformer import EncoderClassifier, pool_states


class _PlainAttention(nn.Module):
    """Dense multi-head self-attention: one fused Q/K/V GEMM, SDPA, one ``addmm``.

    Parameters use the :class:`GatedSelfAttention` layout: ``qkv_weight`` (n_heads * 3 *
    head_dim, d_model) with per-head ``[q_h; k_h; v_h]`` rows and ``out_weight_t`` (n_heads *
    head_dim, d_model), the output projection stored transposed.
    """

    def __init__(self, d_model: int, n_heads: int, head_dim: int, causal: bool = False, qk_norm: bool = False) -> None:
        super().__init__()
        self.d_model, self.n_heads, self.head_dim, self.causal = d_model, n_heads, head_dim, causal
        self.qk_norm = qk_norm
        if qk_norm:
            self.q_norm = nn.RMSNorm(head_dim)
            self.k_norm = nn.RMSNorm(head_dim)
        self.qkv_weight = nn.Parameter(torch.empty(n_heads * 3 * head_dim, d_model))
        self.qkv_bias = nn.Parameter(torch.empty(n_heads * 3 * head_dim))
        self.out_weight_t = nn.Parameter(torch.empty(n_heads * head_dim, d_model))
        self.out_bias = nn.Parameter(torch.empty(d_model))

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        """(batch, seq, d_model) -> (batch, seq, d_model), before the residual add.

        ``attn_mask``: None or boolean (batch, 1, 1, seq), True where keys may be attended.
        """
        batch, seq, _ = x.shape
        h, hd = self.n_heads, self.head_dim
        qkv = F.linear(x, self.qkv_weight, self.qkv_bias)
        q, k, v = qkv.view(batch, seq, h, 3, hd).permute(3, 0, 2, 1, 4).unbind(0)  # each (B, h, T, hd)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        # The decoder runs unmasked (right padding never precedes a real token): causal only.
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=self.causal and attn_mask is None)
        y = y.transpose(1, 2).reshape(batch * seq, h * hd)
        return torch.addmm(self.out_bias, y, self.out_weight_t).view(batch, seq, self.d_model)


class _PlainBlock(nn.Module):
    """x + Attn(LN(x)), then x + FFN(LN(x)) (no FFN when d_ff == 0); optional residual gains."""

    def __init__(
        self, d_model: int, n_heads: int, head_dim: int, d_ff: int, *, causal: bool = False, qk_norm: bool = False, residual_gate: bool = False
    ) -> None:
        super().__init__()
        self.ln_attn = nn.LayerNorm(d_model)
        self.attn = _PlainAttention(d_model, n_heads, head_dim, causal, qk_norm)
        self.has_ffn = d_ff > 0
        if self.has_ffn:
            self.ln_ffn = nn.LayerNorm(d_model)
            self.fc1 = nn.Linear(d_model, d_ff)
            self.fc2 = nn.Linear(d_ff, d_model)
        self.residual_gate = residual_gate
        if residual_gate:
            self.attn_gain = nn.Parameter(torch.ones(()))
            self.ffn_gain = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        y = self.attn(self.ln_attn(x), attn_mask)
        x = x + (self.attn_gain * y if self.residual_gate else y)
        if self.has_ffn:
            y = self.fc2(F.gelu(self.fc1(self.ln_ffn(x))))
            x = x + (self.ffn_gain * y if self.residual_gate else y)
        return x

    @torch.no_grad()
    def copy_from(self, block: nn.Module) -> None:
        """Copy the weights of an unpruned :class:`~budgeted_attention.model.transformer.EncoderBlock`
        (same layouts, so the tensors copy one to one as contiguous clones)."""
        self.ln_attn.load_state_dict(block.ln_attn.state_dict())
        for name in ("qkv_weight", "qkv_bias", "out_weight_t", "out_bias"):
            getattr(self.attn, name).copy_(getattr(block.attn, name))
        if self.attn.qk_norm:
            self.attn.q_norm.load_state_dict(block.attn.q_norm.state_dict())
            self.attn.k_norm.load_state_dict(block.attn.k_norm.state_dict())
        if self.has_ffn:
            self.ln_ffn.load_state_dict(block.ln_ffn.state_dict())
            self.fc1.load_state_dict(block.ffn.fc1.state_dict())
            self.fc2.load_state_dict(block.ffn.fc2.state_dict())
        if self.residual_gate:
            self.attn_gain.copy_(block.attn_gain)
            if self.has_ffn:
                self.ffn_gain.copy_(block.ffn_gain)


def _check_unpruned(source: nn.Module, name: str, allow_meta: bool = False) -> None:
    """The reference is the full dense model: refuse a pruned or prefix-serving source."""
    cfg = source.config
    if getattr(cfg, "attention", "softmax") != "softmax" and not allow_meta:
        raise ValueError(f"{name} mirrors softmax attention; a model with attention {cfg.attention!r} is timed against itself (routing soft vs hard)")
    if cfg.is_pruned:
        raise ValueError(f"{name} mirrors the unpruned model only; got heads_per_layer={cfg.heads_per_layer}")
    active = [block.attn.active_heads for block in source.blocks]
    if any(a != cfg.n_heads for a in active):
        raise ValueError(f"{name} needs all {cfg.n_heads} heads active per layer; got {active}")


class PlainEncoder(nn.Module):
    """Dense, gate-free copy of an unpruned :class:`EncoderClassifier` (inference only).

    ``PlainEncoder(model)(ids, mask)`` equals ``model(ids, mask)`` (the model at b = 1, no gates)
    up to float rounding, for either pooling, with or without padding and with ``d_ff == 0``.
    The weights are copied, so later changes to ``source`` do not affect the reference.

    Raises:
        ValueError: ``source`` is structurally pruned, or serves only a prefix of its heads
            (``set_active_heads``): the reference is the full dense model.
    """

    def __init__(self, source: EncoderClassifier) -> None:
        super().__init__()
        _check_unpruned(source, "PlainEncoder")
        cfg = source.config
        self.max_len = cfg.max_len
        self.pooling = cfg.pooling
        self.token_embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.position_embedding = nn.Embedding(cfg.max_len, cfg.d_model)
        self.blocks = nn.ModuleList(
            _PlainBlock(cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.d_ff, qk_norm=cfg.qk_norm, residual_gate=cfg.residual_gate)
            for _ in range(cfg.n_layers)
        )
        self.ln_final = nn.LayerNorm(cfg.d_model)
        self.classifier = nn.Linear(cfg.d_model, cfg.n_classes)
        self._copy_from(source)
        self.eval()

    @torch.no_grad()
    def _copy_from(self, source: EncoderClassifier) -> None:
        self.token_embedding.load_state_dict(source.token_embedding.state_dict())
        self.position_embedding.load_state_dict(source.position_embedding.state_dict())
        self.ln_final.load_state_dict(source.ln_final.state_dict())
        self.classifier.load_state_dict(source.classifier.state_dict())
        for plain, block in zip(self.blocks, source.blocks):
            plain.copy_from(block)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Class logits.

        Args:
            input_ids: (batch, seq) token ids, seq <= max_len.
            attention_mask: optional (batch, seq), 1 for real tokens and 0 for padding.

        Returns:
            (batch, n_classes) logits.
        """
        batch, seq = input_ids.shape
        if seq > self.max_len:
            raise ValueError(f"sequence length {seq} exceeds model max_len {self.max_len}")
        positions = torch.arange(seq, device=input_ids.device)
        x = self.token_embedding(input_ids) + self.position_embedding(positions)
        # Same rule as the model: an all-ones mask is dropped so SDPA can take its unmasked
        # (fastest) kernel; otherwise keys at padding are masked out.
        sdpa_mask = None
        if attention_mask is not None and not bool(attention_mask.all()):
            sdpa_mask = attention_mask.bool().view(batch, 1, 1, seq)
        for block in self.blocks:
            x = block(x, sdpa_mask)
        x = self.ln_final(x)
        return self.classifier(self._pool(x, attention_mask))

    def _pool(self, x: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """(batch, seq, d) -> (batch, d): first position, or the mean over real tokens."""
        return pool_states(x, attention_mask, self.pooling)


class PlainDecoder(nn.Module):
    """Dense, gate-free copy of an unpruned :class:`~budgeted_attention.model.decoder.CausalLM`.

    ``PlainDecoder(model)(ids)`` equals ``model(ids)`` up to float rounding (causal attention,
    QK-norm, residual gains, ``d_ff == 0`` included). Inference only; weights are copied.

    ``full_attention=True`` accepts a Meta-Attention model and builds the same network with
    softmax attention for every token (its controller dropped): the full-attention reference of
    hard routing, with the same weights and the standard kernels.

    Raises:
        ValueError: ``source`` is pruned or serves a prefix of its heads.
    """

    def __init__(self, source: nn.Module, full_attention: bool = False) -> None:
        super().__init__()
        _check_unpruned(source, "PlainDecoder", allow_meta=full_attention)
        cfg = source.config
        self.max_len = cfg.max_len
        self.token_embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.position_embedding = nn.Embedding(cfg.max_len, cfg.d_model) if source.position_embedding is not None else None
        self.blocks = nn.ModuleList(
            _PlainBlock(cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.d_ff, causal=True, qk_norm=cfg.qk_norm, residual_gate=cfg.residual_gate)
            for _ in range(cfg.n_layers)
        )
        self.ln_final = nn.LayerNorm(cfg.d_model)
        with torch.no_grad():
            self.token_embedding.load_state_dict(source.token_embedding.state_dict())
            if self.position_embedding is not None:
                self.position_embedding.load_state_dict(source.position_embedding.state_dict())
            self.ln_final.load_state_dict(source.ln_final.state_dict())
            for plain, block in zip(self.blocks, source.blocks):
                plain.copy_from(block)
        self.eval()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(batch, seq) ids -> (batch, seq, vocab) next-token logits. ``attention_mask`` is unused
        (right padding: causal attention never reaches it), as in the model."""
        seq = input_ids.shape[1]
        if seq > self.max_len:
            raise ValueError(f"sequence length {seq} exceeds model max_len {self.max_len}")
        x = self.token_embedding(input_ids)
        if self.position_embedding is not None:
            x = x + self.position_embedding(torch.arange(seq, device=input_ids.device))
        for block in self.blocks:
            x = block(x, None)
        return F.linear(self.ln_final(x), self.token_embedding.weight)
