"""A lean inference copy of our (pruned) encoder classifier: the same weights and kernels, less Python.

:class:`~budgeted_attention.model.transformer.EncoderClassifier` runs a module per block,
LayerNorm, attention and feed-forward, each call with its gate and slicing checks, on 3-D
activations. At batch 1 those calls cost about as much per layer as a small sub-layer's
arithmetic, whatever the layer's width (d256 at sequence 128: about 0.1 ms per layer).
:class:`CompactEncoder` runs the same kernels in one flat loop on (batch * seq, d) activations:

* token + position embeddings;
* each pre-LN block: ``F.layer_norm``, the head-subset attention the model runs
  (:func:`~budgeted_attention.model.heads.attend` on the model's own weights, with its boolean
  key mask built only when the batch has padding) and the residual added in place; then ``F.layer_norm``, ``addmm``, GELU, ``addmm``
  with the second FFN weight stored transposed (a copy, so a prefix of neurons is a contiguous
  view) and the residual added in place;
* a sub-layer running no heads (or no FFN neurons) adds only its output bias, as the model does;
* final LayerNorm, ``cls`` or mask-aware mean pooling, classifier.

Every weight but the transposed second FFN weight is shared with the model. Supported: the
softmax encoder without QK-norm or residual gains (see :func:`compact_unsupported`); those run
through the module tree. A model with a per-input router gets a copy only when asked for one
(``routed=True``): the copy then runs the head sets it is given, which
:class:`~budgeted_attention.model.routed_inference.RoutedInference` takes from the router.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from budgeted_attention.model.lean import LeanCopy, LeanLayer, keep, needs_mask, untrackable
from budgeted_attention.model.transformer import pool_states

if TYPE_CHECKING:
    from budgeted_attention.model.transformer import EncoderBlock, EncoderClassifier


def compact_unsupported(model: EncoderClassifier, *, routed: bool = False) -> str | None:
    """Why ``model`` has no :class:`CompactEncoder` copy (None when it can have one). ``routed``: a copy for
    a model with a per-input router, which runs the head sets it is given (the router stays with
    the model: :class:`~budgeted_attention.model.routed_inference.RoutedInference`)."""
    cfg = model.config
    if cfg.attention != "softmax" or cfg.positions != "learned" or any(block.attn.causal for block in model.blocks):
        return "not the bidirectional softmax encoder with learned positions"
    if model.router is not None and not routed:
        return "a per-input router is attached (routing runs through the module tree)"
    if cfg.qk_norm or cfg.residual_gate:
        return "qk_norm / residual_gate (only the plain pre-LN block has a lean copy)"
    return untrackable(model)


class _CompactBlock(LeanLayer):
    """One pre-LN block's weights (shared with the model but the transposed second FFN weight)."""

    def __init__(self, block: EncoderBlock) -> None:
        super().__init__()
        attention = block.attn
        self.stored_heads, self.n_heads, self.head_dim = attention.n_heads, attention.active_heads, attention.head_dim
        for name in ("qkv_weight", "qkv_bias", "out_weight_t", "out_bias"):
            keep(self, name, getattr(attention, name).detach())
        keep(self, "ln_attn_weight", block.ln_attn.weight.detach())
        keep(self, "ln_attn_bias", block.ln_attn.bias.detach())
        self.ln_attn_eps = block.ln_attn.eps
        self.stored_width = self.ffn_width = 0
        self.has_ffn = block.has_ffn
        if block.has_ffn:
            self.keep_ffn(block.ffn.fc1, block.ffn.fc2, block.ln_ffn, block.ffn.active_width)

    def forward(
        self, x: torch.Tensor, batch: int, seq: int, mask: torch.Tensor | None, heads: tuple[int, ...] | None = None
    ) -> torch.Tensor:
        """(batch * seq, d) -> (batch * seq, d); ``mask``: None or boolean (batch, 1, 1, seq);
        ``heads``: None (the active prefix) or the stored heads to run (a routed input's set)."""
        d = x.shape[1]
        if self.running_heads(heads):  # the residual added in place to the fresh attention output
            h = F.layer_norm(x, (d,), self.ln_attn_weight, self.ln_attn_bias, self.ln_attn_eps)
            x = self.attend(h, batch, seq, mask, heads=heads).add_(x)
        else:  # no heads: the output projection adds its bias only
            x = x + self.out_bias
        if not self.has_ffn:
            return x
        if self.ffn_width == 0:
            return x + self.fc2_bias
        return self.feed_forward(F.layer_norm(x, (d,), self.ln_ffn_weight, self.ln_ffn_bias, self.ln_ffn_eps), F.gelu).add_(x)


class CompactEncoder(LeanCopy):
    """The logits of an encoder classifier's current layout (pruned heads/neurons, active
    prefixes) in one flat loop of kernels: ``(input_ids, attention_mask) -> (batch, n_classes)``.

    Equal to ``model(ids, mask)`` without gates up to float rounding. Inference only.
    """

    def __init__(self, model: EncoderClassifier, *, routed: bool = False) -> None:
        super().__init__()
        reason = compact_unsupported(model, routed=routed)
        if reason is not None:
            raise ValueError(f"no compact inference copy for this model: {reason}")
        keep(self, "token_embedding", model.token_embedding.weight.detach())
        keep(self, "position_embedding", model.position_embedding.weight.detach())
        self.layers = nn.ModuleList(_CompactBlock(block) for block in model.blocks)
        keep(self, "ln_final_weight", model.ln_final.weight.detach())
        keep(self, "ln_final_bias", model.ln_final.bias.detach())
        self.ln_final_eps = model.ln_final.eps
        keep(self, "classifier_weight", model.classifier.weight.detach())
        keep(self, "classifier_bias", model.classifier.bias.detach())
        self.pooling = model.config.pooling
        self.max_len = model.config.max_len
        self.track(model)
        self.eval()

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, token_type_ids: torch.Tensor | None = None,
        *, head_sets: list[tuple[int, ...]] | None = None,
    ) -> torch.Tensor:
        """(batch, seq) token ids (and optional 0/1 mask) -> (batch, n_classes) logits.

        ``token_type_ids``: accepted for interface parity; this model has no segment embeddings,
        so anything but all zeros is refused, as by the model. ``head_sets``: per layer, the
        stored heads (ascending positions) the whole batch runs instead of the active prefixes.
        """
        self.check_inference()
        batch, seq = input_ids.shape
        if seq > self.max_len:
            raise ValueError(f"sequence length {seq} exceeds model max_len {self.max_len}")
        if token_type_ids is not None and bool(token_type_ids.any()):
            raise ValueError("this encoder model has no segment embeddings: token_type_ids must be None or all zeros")
        d = self.token_embedding.shape[1]
        x = (F.embedding(input_ids, self.token_embedding) + self.position_embedding[:seq]).reshape(batch * seq, d)
        mask = None  # SDPA runs its unmasked kernel when nothing is padded, as the model does
        if attention_mask is not None and needs_mask(attention_mask):
            mask = attention_mask.to(device=input_ids.device, dtype=torch.bool).reshape(batch, 1, 1, seq)
        for index, layer in enumerate(self.layers):
            x = layer(x, batch, seq, mask, None if head_sets is None else head_sets[index])
        x = F.layer_norm(x, (d,), self.ln_final_weight, self.ln_final_bias, self.ln_final_eps).view(batch, seq, d)
        return F.linear(pool_states(x, attention_mask, self.pooling), self.classifier_weight, self.classifier_bias)
