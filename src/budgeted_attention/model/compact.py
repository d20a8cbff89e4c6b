"""The lean executor of our block stacks (the encoder and the decoder): the same weights and kernels, less Python.

:class:`~budgeted_attention.model.transformer.BlockStack` models run a module per block,
LayerNorm, attention and feed-forward, each call with its gate and slicing checks, on 3-D
activations. At batch 1 those calls cost about as much per layer as a small sub-layer's
arithmetic, whatever the layer's width (d256 at sequence 128: about 0.1 ms per layer).
:class:`CompactStack` runs the same kernels in one flat loop on (batch * seq, d) activations:

* token (+ learned position) embeddings;
* each pre-LN block: ``F.layer_norm``, the head-subset attention the model runs
  (:func:`~budgeted_attention.model.heads.attend` on the model's own weights: causal or with its
  boolean key mask built only when the batch has padding, QK RMS-norm where the model has it),
  the residual gain where the model has one and the residual added in place; then
  ``F.layer_norm``, ``addmm``, GELU, ``addmm`` with the second FFN weight stored transposed (a
  copy, so a prefix of neurons is a contiguous view), gain and residual likewise;
* a sub-layer running no heads (or no FFN neurons) adds only its (gained) output bias, as the model does;
* final LayerNorm and the family's head: :class:`CompactEncoder` pools (``cls`` or mask-aware
  mean) and classifies, :class:`CompactDecoder` applies the tied output layer at every position.

Every weight but the transposed second FFN weight is shared with the model. Not run:
Meta-Attention (``model.attention: meta``), refused by name (:meth:`BlockStack.lean_unsupported`).
A model with a per-input router gets an executor only when asked for one (``routed=True``): it
then runs the head sets it is given, which
:class:`~budgeted_attention.model.routed_inference.RoutedInference` takes from the router.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from budgeted_attention.model.lean import LeanCopy, LeanLayer, keep, key_mask

if TYPE_CHECKING:
    from budgeted_attention.model.transformer import BlockStack, EncoderBlock, EncoderClassifier


def pool_states(x: torch.Tensor, attention_mask: torch.Tensor | None, pooling: str) -> torch.Tensor:
    """(batch, seq, d) -> (batch, d): the first position (``cls``), or the mean over real tokens."""
    if pooling == "cls":
        return x[:, 0]
    if attention_mask is None:
        return x.mean(dim=1)
    weights = attention_mask.to(x.dtype).unsqueeze(-1)
    return (x * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1.0)


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
        self.attend_options = {"causal": attention.causal}
        if attention.qk_norm:  # bound methods: they read the buffers at call time, wherever .to() moved them
            for name in ("q_norm", "k_norm"):
                keep(self, f"{name}_weight", getattr(attention, name).weight.detach())
            self.norm_eps = attention.q_norm.eps
            self.attend_options.update(q_norm=self._q_norm, k_norm=self._k_norm)
        self.has_gains = block.residual_gate
        if block.residual_gate:
            keep(self, "attn_gain", block.attn_gain.detach())
        self.stored_width = self.ffn_width = 0
        self.has_ffn = block.has_ffn
        if block.has_ffn:
            self.keep_ffn(block.ffn.fc1, block.ffn.fc2, block.ln_ffn, block.ffn.active_width)
            if block.residual_gate:
                keep(self, "ffn_gain", block.ffn_gain.detach())

    def _q_norm(self, q: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(q, (self.head_dim,), self.q_norm_weight, self.norm_eps)

    def _k_norm(self, k: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(k, (self.head_dim,), self.k_norm_weight, self.norm_eps)

    def forward(
        self, x: torch.Tensor, batch: int, seq: int, mask: torch.Tensor | None, heads: tuple[int, ...] | None = None
    ) -> torch.Tensor:
        """(batch * seq, d) -> (batch * seq, d); ``mask``: None or boolean (batch, 1, 1, seq);
        ``heads``: None (the active prefix) or the stored heads to run (a routed input's set)."""
        d = x.shape[1]
        if self.running_heads(heads):  # gain and residual applied in place to the fresh attention output
            y = self.attend(F.layer_norm(x, (d,), self.ln_attn_weight, self.ln_attn_bias, self.ln_attn_eps), batch, seq, mask, heads)
            x = (y.mul_(self.attn_gain) if self.has_gains else y).add_(x)
        else:  # no heads: the output projection adds its bias only
            x = x + (self.attn_gain * self.out_bias if self.has_gains else self.out_bias)
        if not self.has_ffn:
            return x
        if self.ffn_width == 0:
            return x + (self.ffn_gain * self.fc2_bias if self.has_gains else self.fc2_bias)
        y = self.feed_forward(F.layer_norm(x, (d,), self.ln_ffn_weight, self.ln_ffn_bias, self.ln_ffn_eps), F.gelu)
        return (y.mul_(self.ffn_gain) if self.has_gains else y).add_(x)


class CompactStack(LeanCopy):
    """The blocks of a :class:`~budgeted_attention.model.transformer.BlockStack`'s current layout
    (pruned heads/neurons, active prefixes) in one flat loop of kernels; the family's subclass
    adds its head (:meth:`head`). Equal to the model without gates up to float rounding.
    Inference only.

    ``mask_padding``: whether keys at padding are masked (the encoder); the causal decoder never
    reaches right padding, so it runs unmasked, as its module tree does.
    """

    mask_padding = True

    def __init__(self, model: BlockStack, *, routed: bool = False) -> None:
        super().__init__()
        self.refuse_unsupported(model, routed=routed)
        keep(self, "token_embedding", model.token_embedding.weight.detach())
        self.has_positions = model.position_embedding is not None
        if self.has_positions:
            keep(self, "position_embedding", model.position_embedding.weight.detach())
        self.layers = nn.ModuleList(_CompactBlock(block) for block in model.blocks)
        keep(self, "ln_final_weight", model.ln_final.weight.detach())
        keep(self, "ln_final_bias", model.ln_final.bias.detach())
        self.ln_final_eps = model.ln_final.eps
        self.max_len = model.config.max_len
        self.family = model.family
        self.track(model)
        self.eval()

    def head(self, x: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """The family's output of the final (batch, seq, d) states."""
        raise NotImplementedError

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, token_type_ids: torch.Tensor | None = None,
        *, head_sets: list[tuple[int, ...]] | None = None,
    ) -> torch.Tensor:
        """(batch, seq) token ids (and optional 0/1 mask) -> the family's logits (:meth:`head`).

        ``token_type_ids``: accepted for interface parity; these models have no segment
        embeddings, so anything but all zeros is refused, as by the model. ``head_sets``: per
        layer, the stored heads (ascending positions) the whole batch runs instead of the active
        prefixes.
        """
        self.check_inference()
        batch, seq = input_ids.shape
        if seq > self.max_len:
            raise ValueError(f"sequence length {seq} exceeds model max_len {self.max_len}")
        if token_type_ids is not None and bool(token_type_ids.any()):
            raise ValueError(f"this {self.family} model has no segment embeddings: token_type_ids must be None or all zeros")
        d = self.token_embedding.shape[1]
        x = F.embedding(input_ids, self.token_embedding)
        if self.has_positions:
            x = x + self.position_embedding[:seq]
        x = x.reshape(batch * seq, d)
        mask = key_mask(attention_mask, input_ids.device) if self.mask_padding else None
        for index, layer in enumerate(self.layers):
            x = layer(x, batch, seq, mask, None if head_sets is None else head_sets[index])
        x = F.layer_norm(x, (d,), self.ln_final_weight, self.ln_final_bias, self.ln_final_eps).view(batch, seq, d)
        return self.head(x, attention_mask)


class CompactEncoder(CompactStack):
    """The encoder classifier's lean executor: ``(input_ids, attention_mask) -> (batch, n_classes)``."""

    def __init__(self, model: EncoderClassifier, *, routed: bool = False) -> None:
        super().__init__(model, routed=routed)
        keep(self, "classifier_weight", model.classifier.weight.detach())
        keep(self, "classifier_bias", model.classifier.bias.detach())
        self.pooling = model.config.pooling

    def head(self, x: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """Pooling and the classifier: (batch, seq, d) -> (batch, n_classes)."""
        return F.linear(pool_states(x, attention_mask, self.pooling), self.classifier_weight, self.classifier_bias)


class CompactDecoder(CompactStack):
    """The causal language model's lean executor: ``(input_ids, attention_mask) -> (batch, seq,
    vocab)`` next-token logits (``attention_mask`` unused: right padding, as in the model)."""

    mask_padding = False

    def head(self, x: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """The tied output layer (the token embedding matrix) at every position: (batch, seq, vocab)."""
        return F.linear(x, self.token_embedding)
