"""A lean inference copy of a (pruned) BERT classifier: the same weights and kernel types, less Python.

A pruned :class:`~budgeted_attention.hf.bert.GatedBertClassifier` still runs through the
transformers module tree: mask construction, keyword plumbing, output dataclasses, three Q/K/V
``F.linear`` calls and the gate bookkeeping of each layer. At batch 1 that fixed cost does not
shrink with the model, so it eats a growing share of a pruned model's latency (on MiniLM at
sequence 128 it held b = 0.5 to about 1.7x of the FLOP-ideal 2x).

:class:`CompactBert` computes the same logits with one flat loop of the kernel types the module
tree calls anyway:

* embeddings: ``F.embedding`` of words, absolute positions and token types, ``F.layer_norm``;
* each layer: one fused Q/K/V ``addmm`` in the per-head interleaved layout of our own encoder
  (rows of head h are ``[q_h; k_h; v_h]``, so any prefix of heads is a contiguous view and the
  q/k/v views SDPA gets have our encoder's strides), ``F.scaled_dot_product_attention`` with a
  boolean (batch, 1, 1, seq) key mask built only when the batch has padding, ``addmm`` with the
  output weight stored transposed, residual add and ``F.layer_norm``; then the FFN as ``addmm``,
  the model's own activation function, ``addmm`` (second weight stored transposed), residual add
  and ``F.layer_norm``;
* a layer running no heads (or no FFN neurons) adds only its output bias before its LayerNorm,
  as the module tree does;
* BERT's pooler (``tanh`` of a linear map of the first token) and the classifier.

So it differs from the module tree in three ways besides the Python it leaves out: the fused Q/K/V
GEMM, the transposed storage of the output and second FFN weights, and the mask shape. Timing it
against the module tree or transformers measures all of these together; timing its pruned copy
against its dense copy is like for like.

Weights: the fused Q/K/V weights and the two transposed weights are copies; everything else
(embeddings, LayerNorms, biases, the first FFN weight) is shared with the model. Heads and FFN
neurons run as prefixes of the stored ones (:meth:`CompactBert.set_active`), so one copy of a
sorted layout serves every budget, as :class:`~budgeted_attention.pruning.switching.SlicedModel`
does with it. The copy is a snapshot: :meth:`CompactBert.is_current` says whether the model has
had surgery or a parameter written in place since.

Supported: transformers' ``bert`` model type used as an encoder (BERT, BERT-Mini/Tiny,
all-MiniLM). Other families (RoBERTa's padding-offset positions, ELECTRA's embedding projection
and head) and decoder configs keep running through the module tree: see :func:`compact_unsupported`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from budgeted_attention.hf.architectures import base_model, encoder_layers, model_type

if TYPE_CHECKING:
    from budgeted_attention.hf.bert import GatedBertClassifier


def compact_unsupported(model: GatedBertClassifier) -> str | None:
    """Why ``model`` has no :class:`CompactBert` copy (None when it can have one)."""
    kind = model_type(model.hf)
    config = model.hf.config
    if kind != "bert":
        return f"model type {kind!r} (only 'bert' has a compact inference copy)"
    if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
        return "a decoder config (is_decoder / add_cross_attention): the copy attends bidirectionally"
    if getattr(config, "position_embedding_type", "absolute") != "absolute":
        return f"position_embedding_type {config.position_embedding_type!r} (only 'absolute')"
    if getattr(base_model(model.hf), "pooler", None) is None:
        return "no pooler"
    if model.router is not None:
        return "a per-input router is attached (routing runs through the module tree)"
    return None


def _keep(module: nn.Module, name: str, tensor: torch.Tensor) -> None:
    """A weight as a buffer (``.to()`` moves it), never saved: the model's weights are saved with
    the model, so these stay out of every state dict."""
    module.register_buffer(name, tensor, persistent=False)


class _CompactLayer(nn.Module):
    """One encoder layer's weights in the compact layout."""

    def __init__(self, layer: nn.Module, attention: nn.Module, activation: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        n, hd = attention.num_heads, attention.head_dim
        width = n * hd
        # Stored heads / neurons, and the prefix of them that runs (instant switching: a view).
        self.stored_heads, self.n_heads, self.head_dim, self.scaling = n, attention.active_heads, hd, attention.scaling
        q, k, v = (getattr(attention, name) for name in ("query", "key", "value"))
        d = q.weight.shape[1]
        # (n, 3, hd, d) -> rows [q_h; k_h; v_h] per head h (stack copies once).
        weight = torch.stack([t.weight.detach().reshape(n, hd, d) for t in (q, k, v)], dim=1)
        bias = torch.stack([t.bias.detach().reshape(n, hd) for t in (q, k, v)], dim=1)
        _keep(self, "qkv_weight", weight.reshape(3 * width, d))
        _keep(self, "qkv_bias", bias.reshape(3 * width))
        out = layer.attention.output
        _keep(self, "out_weight_t", out.dense.weight.detach().t().contiguous())  # (width, d)
        _keep(self, "out_bias", out.dense.bias.detach())
        _keep(self, "ln_attn_weight", out.LayerNorm.weight.detach())
        _keep(self, "ln_attn_bias", out.LayerNorm.bias.detach())
        self.ln_attn_eps = out.LayerNorm.eps
        inter = layer.intermediate
        self.stored_width = inter.dense.out_features
        self.ffn_width = getattr(inter, "active_width", self.stored_width)
        self.activation = activation
        _keep(self, "fc1_weight", inter.dense.weight.detach())
        _keep(self, "fc1_bias", inter.dense.bias.detach())
        ffn_out = layer.output
        _keep(self, "fc2_weight_t", ffn_out.dense.weight.detach().t().contiguous())  # (stored_width, d)
        _keep(self, "fc2_bias", ffn_out.dense.bias.detach())
        _keep(self, "ln_ffn_weight", ffn_out.LayerNorm.weight.detach())
        _keep(self, "ln_ffn_bias", ffn_out.LayerNorm.bias.detach())
        self.ln_ffn_eps = ffn_out.LayerNorm.eps

    def set_active(self, heads: int, ffn_width: int) -> None:
        """Run the first ``heads`` stored heads and ``ffn_width`` stored FFN neurons."""
        if not (0 <= heads <= self.stored_heads and 0 <= ffn_width <= self.stored_width):
            raise ValueError(
                f"active heads {heads} / FFN neurons {ffn_width} outside the stored {self.stored_heads} / {self.stored_width}"
            )
        self.n_heads, self.ffn_width = heads, ffn_width

    def forward(self, x: torch.Tensor, batch: int, seq: int, mask: torch.Tensor | None) -> torch.Tensor:
        """(batch * seq, d) -> (batch * seq, d); ``mask``: None or boolean (batch, 1, 1, seq)."""
        d = x.shape[1]
        n, hd, width = self.n_heads, self.head_dim, self.ffn_width
        if n:
            qkv_weight, qkv_bias, out_weight_t = self.qkv_weight, self.qkv_bias, self.out_weight_t
            if n != self.stored_heads:  # a prefix of heads: contiguous views in this layout
                qkv_weight, qkv_bias, out_weight_t = qkv_weight[: 3 * n * hd], qkv_bias[: 3 * n * hd], out_weight_t[: n * hd]
            qkv = torch.addmm(qkv_bias, x, qkv_weight.t())
            q, k, v = qkv.view(batch, seq, n, 3, hd).permute(3, 0, 2, 1, 4).unbind(0)  # each (B, n, T, hd)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling)
            y = torch.addmm(self.out_bias, y.transpose(1, 2).reshape(batch * seq, n * hd), out_weight_t)
        else:  # no heads: the output projection adds its bias only
            y = self.out_bias
        x = F.layer_norm(y + x, (d,), self.ln_attn_weight, self.ln_attn_bias, self.ln_attn_eps)
        if width:
            fc1_weight, fc1_bias, fc2_weight_t = self.fc1_weight, self.fc1_bias, self.fc2_weight_t
            if width != self.stored_width:
                fc1_weight, fc1_bias, fc2_weight_t = fc1_weight[:width], fc1_bias[:width], fc2_weight_t[:width]
            h = self.activation(torch.addmm(fc1_bias, x, fc1_weight.t()))
            y = torch.addmm(self.fc2_bias, h, fc2_weight_t)
        else:
            y = self.fc2_bias
        return F.layer_norm(y + x, (d,), self.ln_ffn_weight, self.ln_ffn_bias, self.ln_ffn_eps)


def _needs_mask(attention_mask: torch.Tensor) -> bool:
    """True unless every token is real. While compiling or capturing a CUDA graph the check (a
    host sync) is skipped and the mask always built, as transformers does."""
    if torch.compiler.is_compiling() or (attention_mask.is_cuda and torch.cuda.is_current_stream_capturing()):
        return True
    return not bool(attention_mask.all())


class CompactBert(nn.Module):
    """The logits of a BERT classifier's current layout (pruned heads/neurons, active prefixes),
    computed by one flat loop of kernels. Called like our models: ``(input_ids, attention_mask,
    token_type_ids) -> (batch, n_classes)``.

    Equal to ``model(ids, mask, token_type_ids)`` without gates up to float rounding. Inference
    only: no dropout, no gates, no routing.
    """

    def __init__(self, model: GatedBertClassifier) -> None:
        super().__init__()
        reason = compact_unsupported(model)
        if reason is not None:
            raise ValueError(f"no compact inference copy for this model: {reason}")
        base = base_model(model.hf)
        embeddings = base.embeddings
        _keep(self, "word_embeddings", embeddings.word_embeddings.weight.detach())
        _keep(self, "position_embeddings", embeddings.position_embeddings.weight.detach())
        _keep(self, "token_type_embeddings", embeddings.token_type_embeddings.weight.detach())
        _keep(self, "ln_embeddings_weight", embeddings.LayerNorm.weight.detach())
        _keep(self, "ln_embeddings_bias", embeddings.LayerNorm.bias.detach())
        self.ln_embeddings_eps = embeddings.LayerNorm.eps
        self.layers = nn.ModuleList(
            _CompactLayer(layer, attention, layer.intermediate.intermediate_act_fn)
            for layer, attention in zip(encoder_layers(model.hf), model.attentions)
        )
        _keep(self, "pooler_weight", base.pooler.dense.weight.detach())
        _keep(self, "pooler_bias", base.pooler.dense.bias.detach())
        _keep(self, "classifier_weight", model.hf.classifier.weight.detach())
        _keep(self, "classifier_bias", model.hf.classifier.bias.detach())
        self.max_len = int(self.position_embeddings.shape[0])
        # What is_current compares: the model's surgery count and its parameters' in-place
        # versions (a plain list, not registered: the parameters belong to the model).
        self._layout_version = model.layout_version
        self._parameters_seen = list(model.parameters())
        self._versions = self._parameter_versions()
        self.eval()

    def _parameter_versions(self) -> tuple[int, ...]:
        return tuple(p._version for p in self._parameters_seen)

    def is_current(self, model: GatedBertClassifier) -> bool:
        """True while ``model`` (the one copied) has had no surgery (``keep_units``,
        ``sort_ffn_neurons``) and no parameter written in place (optimiser steps,
        ``load_state_dict``) since; a few microseconds."""
        return model.layout_version == self._layout_version and self._parameter_versions() == self._versions

    def set_active(self, heads: list[int], ffn_widths: list[int] | None = None) -> None:
        """Run a prefix of each layer's stored heads and FFN neurons (``ffn_widths`` None: the
        widths stay as they are, as :meth:`GatedModel.set_active` does with group counts): views,
        no copies."""
        if len(heads) != len(self.layers) or (ffn_widths is not None and len(ffn_widths) != len(self.layers)):
            raise ValueError(f"need one head count (and FFN width) per layer ({len(self.layers)}), got {heads} / {ffn_widths}")
        for index, layer in enumerate(self.layers):
            layer.set_active(heads[index], layer.ffn_width if ffn_widths is None else ffn_widths[index])

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, token_type_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(batch, seq) token ids (and optional 0/1 mask, segment ids) -> (batch, n_classes) logits."""
        batch, seq = input_ids.shape
        if seq > self.max_len:
            raise ValueError(f"sequence length {seq} exceeds the model's max_len {self.max_len}")
        d = self.word_embeddings.shape[1]
        segments = self.token_type_embeddings[0] if token_type_ids is None else F.embedding(token_type_ids, self.token_type_embeddings)
        x = F.embedding(input_ids, self.word_embeddings) + segments + self.position_embeddings[:seq]
        x = F.layer_norm(x, (d,), self.ln_embeddings_weight, self.ln_embeddings_bias, self.ln_embeddings_eps).reshape(batch * seq, d)
        mask = None  # SDPA runs its unmasked kernel when nothing is padded, as transformers does
        if attention_mask is not None and _needs_mask(attention_mask):
            mask = attention_mask.to(device=input_ids.device, dtype=torch.bool).reshape(batch, 1, 1, seq)
        for layer in self.layers:
            x = layer(x, batch, seq, mask)
        first = x.view(batch, seq, d)[:, 0]
        pooled = torch.tanh(F.linear(first, self.pooler_weight, self.pooler_bias))
        return F.linear(pooled, self.classifier_weight, self.classifier_bias)
