"""A lean inference copy of a (pruned) BERT classifier: the same weights and kernel types, less Python.

A pruned :class:`~budgeted_attention.hf.bert.GatedBertClassifier` runs a loop over the
transformers submodules: module calls, dropout and LayerNorm modules, the selection and gate
bookkeeping of each layer. At batch 1 that fixed cost does not shrink with the model, so it eats
a growing share of a pruned model's latency (on MiniLM at sequence 128 it held b = 0.5 to about
1.7x of the FLOP-ideal 2x).

:class:`CompactBert` computes the same logits with one flat loop of the kernels the module tree
calls anyway:

* embeddings: ``F.embedding`` of words, absolute positions and token types, ``F.layer_norm``;
* each layer: the library's head-subset attention (:func:`~budgeted_attention.model.heads.attend`:
  one fused Q/K/V projection in the per-head interleaved layout, SDPA with a boolean
  (batch, 1, 1, seq) key mask built only when the batch has padding, the output projection),
  residual add and ``F.layer_norm``; then the FFN as ``addmm``, the model's own activation
  function, ``addmm`` (second weight stored transposed), residual add and ``F.layer_norm``;
* a layer running no heads (or no FFN neurons) adds only its output bias before its LayerNorm,
  as the module tree does;
* BERT's pooler (``tanh`` of a linear map of the first token) and the classifier.

Weights: the fused Q/K/V weights (shared with the module tree's inference copy) and the
transposed output and second FFN weights (so that prefixes are contiguous views) are copies;
everything else is shared with the model. Heads and FFN neurons run as prefixes of the stored
ones, and the copy is a snapshot (:class:`~budgeted_attention.model.lean.LeanCopy`). Timing its
pruned copy against its dense copy is like for like.

Runs every supported model type: BERT (absolute positions, the pooler's tanh of the first token,
then the classifier), RoBERTa / XLM-R (positions counted from the padding id over real tokens,
the head's ``dense``, tanh, ``out_proj`` on the first token) and ELECTRA (the embedding
projection to the hidden width, the head's ``dense``, GELU, ``out_proj``). Refused by name
(:meth:`~budgeted_attention.hf.bert.GatedBertClassifier.lean_unsupported`): decoder configs and
relative position embeddings, which the module tree runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from budgeted_attention.hf.architectures import base_model, encoder_layers, model_type
from budgeted_attention.model.lean import LeanCopy, LeanLayer, keep, key_mask

if TYPE_CHECKING:
    from budgeted_attention.hf.bert import GatedBertClassifier


class _CompactLayer(LeanLayer):
    """One encoder layer's weights in the compact layout."""

    def __init__(self, layer: nn.Module, attention: nn.Module, activation: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        # Stored heads, and the prefix of them that runs (instant switching: a view).
        self.stored_heads, self.n_heads, self.head_dim = attention.num_heads, attention.active_heads, attention.head_dim
        self.attend_options = {"scale": attention.scaling}
        out = layer.attention.output
        with torch.no_grad():  # rows [q_h; k_h; v_h] per head h, the copy the module tree runs on
            qkv_weight, qkv_bias, _ = attention.weights(out.dense)
        keep(self, "qkv_weight", qkv_weight)
        keep(self, "qkv_bias", qkv_bias)
        keep(self, "out_weight_t", out.dense.weight.detach().t().contiguous())  # (width, d)
        keep(self, "out_bias", out.dense.bias.detach())
        keep(self, "ln_attn_weight", out.LayerNorm.weight.detach())
        keep(self, "ln_attn_bias", out.LayerNorm.bias.detach())
        self.ln_attn_eps = out.LayerNorm.eps
        inter = layer.intermediate
        self.activation = activation
        self.keep_ffn(inter.dense, layer.output.dense, layer.output.LayerNorm, getattr(inter, "active_width", inter.dense.out_features))

    def forward(
        self, x: torch.Tensor, batch: int, seq: int, mask: torch.Tensor | None, heads: tuple[int, ...] | None = None
    ) -> torch.Tensor:
        """(batch * seq, d) -> (batch * seq, d); ``mask``: None or boolean (batch, 1, 1, seq);
        ``heads``: None (the active prefix) or the stored heads to run (a routed input's set)."""
        d = x.shape[1]
        # A sub-layer without heads (neurons) adds its output bias only.
        y = self.attend(x, batch, seq, mask, heads) if self.running_heads(heads) else self.out_bias
        x = F.layer_norm(y + x, (d,), self.ln_attn_weight, self.ln_attn_bias, self.ln_attn_eps)
        y = self.feed_forward(x, self.activation) if self.ffn_width else self.fc2_bias
        return F.layer_norm(y + x, (d,), self.ln_ffn_weight, self.ln_ffn_bias, self.ln_ffn_eps)


class CompactBert(LeanCopy):
    """The logits of a BERT-family classifier's current layout (pruned heads/neurons, active
    prefixes), computed by one flat loop of kernels. Called like our models: ``(input_ids,
    attention_mask, token_type_ids) -> (batch, n_classes)``.

    Equal to ``model(ids, mask, token_type_ids)`` without gates up to float rounding. Inference
    only: no dropout, no gates, no routing.
    """

    def __init__(self, model: GatedBertClassifier, *, routed: bool = False) -> None:
        super().__init__()
        self.refuse_unsupported(model, routed=routed)
        base = base_model(model.hf)
        embeddings = base.embeddings
        keep(self, "word_embeddings", embeddings.word_embeddings.weight.detach())
        keep(self, "position_embeddings", embeddings.position_embeddings.weight.detach())
        keep(self, "token_type_embeddings", embeddings.token_type_embeddings.weight.detach())
        keep(self, "ln_embeddings_weight", embeddings.LayerNorm.weight.detach())
        keep(self, "ln_embeddings_bias", embeddings.LayerNorm.bias.detach())
        self.ln_embeddings_eps = embeddings.LayerNorm.eps
        # RoBERTa / XLM-R count positions from the padding id over real tokens; BERT and ELECTRA from 0.
        self.padding_idx = embeddings.padding_idx if model_type(model.hf) in ("roberta", "xlm-roberta") else None
        project = getattr(base, "embeddings_project", None)  # ELECTRA: embedding width -> hidden width
        self.has_projection = project is not None
        if project is not None:
            keep(self, "projection_weight", project.weight.detach())
            keep(self, "projection_bias", project.bias.detach())
        self.layers = nn.ModuleList(
            _CompactLayer(layer, attention, layer.intermediate.intermediate_act_fn)
            for layer, attention in zip(encoder_layers(model.hf), model.attentions)
        )
        # The head on the first token: dense, activation, output layer (BERT: its pooler, then the classifier).
        pooler = getattr(base, "pooler", None)
        head = model.hf.classifier
        dense, self.head_activation, out = (pooler.dense, pooler.activation, head) if pooler is not None else (
            # RoBERTa's head applies tanh in its forward; ELECTRA's holds its activation (GELU).
            head.dense, getattr(head, "activation", torch.tanh), head.out_proj
        )
        keep(self, "head_dense_weight", dense.weight.detach())
        keep(self, "head_dense_bias", dense.bias.detach())
        keep(self, "classifier_weight", out.weight.detach())
        keep(self, "classifier_bias", out.bias.detach())
        self.max_len = model.max_len
        self.track(model)
        self.eval()

    def _positions(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Position embeddings, (seq, d) or per input (batch, seq, d) for RoBERTa-style ids."""
        if self.padding_idx is None:
            return self.position_embeddings[: input_ids.shape[1]]
        real = input_ids.ne(self.padding_idx).int()
        return F.embedding(torch.cumsum(real, dim=1).type_as(real) * real + self.padding_idx, self.position_embeddings)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, token_type_ids: torch.Tensor | None = None,
        *, head_sets: list[tuple[int, ...]] | None = None,
    ) -> torch.Tensor:
        """(batch, seq) token ids (and optional 0/1 mask, segment ids) -> (batch, n_classes) logits.

        ``head_sets``: per layer, the stored heads (ascending positions) the whole batch runs
        instead of the active prefixes (a routed input's sets)."""
        self.check_inference()
        batch, seq = input_ids.shape
        if seq > self.max_len:
            raise ValueError(f"sequence length {seq} exceeds the model's max_len {self.max_len}")
        width = self.word_embeddings.shape[1]
        segments = self.token_type_embeddings[0] if token_type_ids is None else F.embedding(token_type_ids, self.token_type_embeddings)
        x = F.embedding(input_ids, self.word_embeddings) + segments + self._positions(input_ids)
        x = F.layer_norm(x, (width,), self.ln_embeddings_weight, self.ln_embeddings_bias, self.ln_embeddings_eps)
        if self.has_projection:
            x = F.linear(x, self.projection_weight, self.projection_bias)
        d = x.shape[-1]
        x = x.reshape(batch * seq, d)
        mask = key_mask(attention_mask, input_ids.device)
        for index, layer in enumerate(self.layers):
            x = layer(x, batch, seq, mask, None if head_sets is None else head_sets[index])
        first = x.view(batch, seq, d)[:, 0]
        pooled = self.head_activation(F.linear(first, self.head_dense_weight, self.head_dense_bias))
        return F.linear(pooled, self.classifier_weight, self.classifier_bias)
