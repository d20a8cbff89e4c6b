"""Budget gates and structural pruning for transformers causal LMs: the ``hf-decoder`` family.

:class:`GatedDecoderLM` wraps a ``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``
or ``Gemma3ForCausalLM`` (layouts in :mod:`budgeted_attention.hf.decoder_layouts`) with the one
:class:`~budgeted_attention.model.family.GatedModel` interface, as
:class:`~budgeted_attention.hf.bert.GatedBertClassifier` does for encoders: it installs its own
attention and FFN modules (same parameter names, so pretrained weights and state-dict keys are
unchanged) and runs its own layer loop over the transformers submodules (the embedding, Gemma's
embedding scale, rotary tables per layer type, RMSNorms, Gemma's four norms per layer, final norm,
output layer, Gemma's final-logit soft-capping), so that each layer's
:class:`~budgeted_attention.model.gates.LayerSelection` is an argument of the call.

Units, under one nested budget:

* query heads, the (n_layers, n_heads) grid of the unpruned model. Queries run through SDPA with
  their K/V heads repeated (GQA: each query head reads the K/V head of its group); a head's gate
  scales its output before ``o_proj``. Surgery removes a head's rows of ``q_proj`` and columns of
  ``o_proj`` (``q_norm`` is per head dim and stays);
* whole K/V groups: a group whose query heads all left is removed with them (its rows of
  ``k_proj`` and ``v_proj``), so the K/V projections and the K/V cache shrink. Layers then hold
  uneven head counts; :meth:`GatedDecoderLM.describe` records them per layer (``kv_heads``);
* gated-FFN neuron groups (``ffn_group_size`` consecutive neurons): rows of ``gate_proj`` and
  ``up_proj``, columns of ``down_proj``.

Cost (:class:`DecoderLMCostModel`): b is the fraction of the prunable forward FLOPs. A query head
costs its Q and output projections, its scores and weighted sums (causal pairs, capped by the
layer's sliding window) and its share (1 / heads per group) of its group's K/V projections, so the
K/V work of a group is fully counted exactly when the whole group leaves; the output layer
(vocabulary projection at every position) is fixed cost, its share reported by
:meth:`DecoderLMCostModel.fixed_fraction`.

Padding: any side. Positions are 0..seq-1 whatever the mask (as transformers' forward without
``position_ids``); padded keys are masked; a padded query attends to itself only (its logits are
meaningless and the LM loss ignores them, but never NaN).

Lean executor and decoding: :class:`~budgeted_attention.hf.decoder_cache.DecoderLMRunner` (the
hard selection with a K/V cache, whose width per layer is that layer's surviving K/V groups).

Not in this family yet (refused by name): per-input routing, ONNX export, layer units.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from budgeted_attention.errors import BAAError
from budgeted_attention.hf.decoder_cache import DecoderLMRunner, KVCache, attention_masks
from budgeted_attention.hf.decoder_layouts import (
    check_modules,
    causal_lm_from_config,
    check_tokenizer,
    load_causal_lm,
    load_tokenizer,
)
from budgeted_attention.model.family import GatedModel
from budgeted_attention.model.gates import LayerSelection, UnitGates
from budgeted_attention.model.heads import attend_projected


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary positions on (batch, heads, seq, hd) with (batch or 1, seq, hd) tables (transformers' formula)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + _rotate_half(x) * sin


def _rows(linear: nn.Linear, index: torch.Tensor | slice | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, bias) of the output rows ``index`` of ``linear`` (None: all; a slice: a view)."""
    if index is None:
        return linear.weight, linear.bias
    if isinstance(index, slice):
        return linear.weight[index], None if linear.bias is None else linear.bias[index]
    return linear.weight.index_select(0, index), None if linear.bias is None else linear.bias.index_select(0, index)


def _index(positions: list[int], width: int, total: int, device: torch.device) -> torch.Tensor | slice | None:
    """Rows (or columns) of the units at ``positions``, ``width`` each, among ``total`` stored
    units: None for all of them in order, a slice for one run of adjacent units, else an index."""
    if positions == list(range(total)):
        return None
    if positions == list(range(positions[0], positions[0] + len(positions))):
        return slice(positions[0] * width, (positions[-1] + 1) * width)
    return torch.tensor([p * width + i for p in positions for i in range(width)], dtype=torch.long, device=device)


class GatedDecoderAttention(nn.Module):
    """Drop-in for a Llama / Qwen2 / Qwen3 / Gemma 3 self-attention module with query-head gates,
    prefix slicing and head surgery (whole K/V groups leave with their last query head).

    Keeps ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj`` (and ``q_norm``/``k_norm``) under their
    names. ``q_group[i]``: the original K/V group of stored query head i; ``kv_ids``: the original
    groups of the stored K/V heads, ascending.
    """

    def __init__(self, source: nn.Module, config: Any) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = source.q_proj, source.k_proj, source.v_proj, source.o_proj
        self.q_norm = getattr(source, "q_norm", None)
        self.k_norm = getattr(source, "k_norm", None)
        self.head_dim = int(source.head_dim)
        self.scaling = float(source.scaling)
        self.dropout_p = float(getattr(source, "attention_dropout", 0.0) or 0.0)
        window = getattr(source, "sliding_window", None)
        self.sliding_window = None if window is None else int(window)
        self.layer_type = getattr(source, "layer_type", None)
        n_heads, n_kv = int(config.num_attention_heads), int(config.num_key_value_heads)
        self.group_width = n_heads // n_kv  # query heads per K/V group in the unpruned model
        self.q_group = [h // self.group_width for h in range(n_heads)]
        self.kv_ids = list(range(n_kv))
        self.active_heads = n_heads
        self._plans: dict[tuple, tuple] = {}

    @property
    def num_heads(self) -> int:
        return len(self.q_group)

    @property
    def num_kv_heads(self) -> int:
        return len(self.kv_ids)

    def _plan(self, heads: tuple[int, ...], device: torch.device) -> tuple:
        """(query rows, K/V rows, per running head the position of its K/V head among those
        computed, None when that is the identity) for the stored query heads ``heads`` (cached
        per head set and device)."""
        key = (heads, device)
        plan = self._plans.get(key)
        if plan is None:
            groups = [self.q_group[h] for h in heads]
            needed = sorted(set(groups))
            kv_positions = [self.kv_ids.index(g) for g in needed]
            hd = self.head_dim
            q_rows = _index(list(heads), hd, self.num_heads, device)
            kv_rows = _index(kv_positions, hd, self.num_kv_heads, device)
            order = [needed.index(g) for g in groups]
            # None: one K/V head per query head, in order (no repeat needed)
            expand = None if order == list(range(len(order))) else torch.tensor(order, dtype=torch.long, device=device)
            plan = (q_rows, kv_rows, expand)
            self._plans[key] = plan
        return plan

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None, selection: LayerSelection,
        cache: KVCache | None = None, index: int = 0,
    ) -> torch.Tensor:
        """(batch, seq, d) -> (batch, seq, d): the heads ``selection`` names among the active
        prefix, each scaled by its gate, through ``o_proj`` (bias included). ``mask``: None (plain
        causal attention is exact) or boolean (batch, 1, seq, keys), True where a query may attend
        a key. ``cache``: the new positions' keys and values are stored as layer ``index``'s and
        the queries attend the cached ones too (the head set must not change within a cache)."""
        if selection.chosen is not None:
            raise ValueError("the hf-decoder family has no per-input head routing (a per-input selection was given)")
        batch, seq, _ = x.shape
        heads = tuple(range(self.active_heads)) if selection.heads is None else tuple(selection.heads)
        if not heads:
            bias = self.o_proj.bias
            return x.new_zeros(batch, seq, self.o_proj.out_features) if bias is None else bias.expand(batch, seq, -1)
        q_rows, kv_rows, expand = self._plan(heads, x.device)
        hd, n = self.head_dim, len(heads)
        q = F.linear(x, *_rows(self.q_proj, q_rows)).view(batch, seq, n, hd).transpose(1, 2)
        k = F.linear(x, *_rows(self.k_proj, kv_rows)).view(batch, seq, -1, hd).transpose(1, 2)
        v = F.linear(x, *_rows(self.v_proj, kv_rows)).view(batch, seq, -1, hd).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        if cache is not None:
            k, v = cache.store(index, k, v, self.sliding_window)  # the cache holds the computed K/V heads only
        if expand is not None:
            k, v = k.index_select(1, expand), v.index_select(1, expand)  # GQA: each query head reads its group's K/V
        weight = self.o_proj.weight
        if q_rows is not None:
            weight = weight[:, q_rows] if isinstance(q_rows, slice) else weight.index_select(1, q_rows)
        out = attend_projected(  # no mask: causal from position 0, or one query that sees every key
            q, k, v, [(None, None, weight.t())], self.o_proj.bias, gates=selection.gates, mask=mask, causal=mask is None and seq > 1,
            scale=self.scaling, dropout=self.dropout_p if self.training else 0.0,
        )
        return out.view(batch, seq, -1)

    @torch.no_grad()
    def keep_heads(self, positions: list[int]) -> None:
        """Keep the stored query heads at ``positions`` (in that order), their rows of ``q_proj``
        and columns of ``o_proj``; K/V heads no kept query head reads leave too."""
        hd = self.head_dim
        q_group = [self.q_group[p] for p in positions]
        kv_ids = sorted(set(q_group))
        kv_positions = [self.kv_ids.index(g) for g in kv_ids]
        q_rows = torch.tensor([p * hd + i for p in positions for i in range(hd)], dtype=torch.long)
        kv_rows = torch.tensor([p * hd + i for p in kv_positions for i in range(hd)], dtype=torch.long)
        for linear, rows in ((self.q_proj, q_rows), (self.k_proj, kv_rows), (self.v_proj, kv_rows)):
            linear.weight = nn.Parameter(linear.weight[rows].clone())
            if linear.bias is not None:
                linear.bias = nn.Parameter(linear.bias[rows].clone())
            linear.out_features = len(rows)
        self.o_proj.weight = nn.Parameter(self.o_proj.weight[:, q_rows].clone())
        self.o_proj.in_features = len(q_rows)
        self.q_group, self.kv_ids = q_group, kv_ids
        self.active_heads = len(positions)
        self._plans = {}


class GatedDecoderMLP(nn.Module):
    """Drop-in for a gated FFN (``down(act(gate(x)) * up(x))``) with gates over neuron groups,
    prefix slicing and neuron surgery; the weights stay ``gate_proj``/``up_proj``/``down_proj``.

    ``activation`` (an identity) sees the gated hidden activation (batch, seq, width): importance
    scoring hooks it. Width 0 gives ``down_proj``'s bias (zeros without one).
    """

    def __init__(self, source: nn.Module, group_size: int) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = source.gate_proj, source.up_proj, source.down_proj
        self.act_fn = source.act_fn
        self.group_size = group_size
        self.active_width = self.gate_proj.out_features
        self.activation = nn.Identity()

    def forward(self, x: torch.Tensor, group_gates: torch.Tensor | None = None) -> torch.Tensor:
        width, full = self.active_width, self.gate_proj.out_features
        if width == 0:
            bias = self.down_proj.bias
            return x.new_zeros(*x.shape[:-1], self.down_proj.out_features) if bias is None else bias.expand(*x.shape[:-1], -1)
        index = None if width == full else slice(0, width)
        h = self.act_fn(F.linear(x, *_rows(self.gate_proj, index))) * F.linear(x, *_rows(self.up_proj, index))
        if group_gates is not None:
            h = h * group_gates.to(h.dtype).repeat_interleave(self.group_size)
        h = self.activation(h)
        weight = self.down_proj.weight if index is None else self.down_proj.weight[:, :width]
        return F.linear(h, weight, self.down_proj.bias)

    @torch.no_grad()
    def keep_neurons(self, neurons: list[int]) -> None:
        """Keep only the neurons at ``neurons`` (in that order): gate/up rows, down columns."""
        index = torch.tensor(neurons, dtype=torch.long)
        for linear in (self.gate_proj, self.up_proj):
            linear.weight = nn.Parameter(linear.weight[index].clone())
            if linear.bias is not None:
                linear.bias = nn.Parameter(linear.bias[index].clone())
            linear.out_features = len(neurons)
        self.down_proj.weight = nn.Parameter(self.down_proj.weight[:, index].clone())
        self.down_proj.in_features = len(neurons)
        self.active_width = len(neurons)


@dataclass(frozen=True)
class DecoderLMCostModel:
    """FLOPs of one forward pass of a :class:`GatedDecoderLM` over one sequence of ``seq_len``
    tokens (a multiply-add is 2 FLOPs; norms, softmax, rotary tables and the embedding look-up
    ignored), of the unpruned architecture.

    Attributes:
        windows: per layer, the sliding window (None: full causal attention).
        vocab_size: outputs of the output layer (a classifier's: its labels).
    """

    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_model: int
    d_ff: int
    vocab_size: int
    windows: tuple[int | None, ...]
    seq_len: int
    output_every_position: bool = True  # False: a classifier scores one pooled position

    @property
    def n_layers(self) -> int:
        return len(self.windows)

    def attention_pairs(self, layer: int) -> int:
        """(query, key) pairs one head scores in ``layer``: causal, capped by its window."""
        t, w = self.seq_len, self.windows[layer]
        if w is None or w >= t:
            return t * (t + 1) // 2
        return w * (w + 1) // 2 + (t - w) * w

    def head_flops(self, layer: int = 0) -> int:
        """One query head: Q and output projections, scores and weighted sum, and its share of its
        group's K/V projections."""
        t, d, hd = self.seq_len, self.d_model, self.head_dim
        share = self.n_kv_heads / self.n_heads  # of one K/V head's two projections
        projections = 2 * t * d * hd + 2 * t * hd * d + round(2 * 2 * t * d * hd * share)
        return projections + 2 * 2 * self.attention_pairs(layer) * hd

    def group_flops(self, group_size: int) -> int:
        """``group_size`` FFN neurons: a row of gate_proj and up_proj and a column of down_proj each."""
        return 3 * 2 * self.seq_len * self.d_model * group_size

    def classifier_flops(self) -> int:
        """The output layer (``vocab_size`` outputs: the vocabulary projection at every position,
        or a classifier's labels at one position): fixed cost."""
        positions = self.seq_len if self.output_every_position else 1
        return 2 * positions * self.d_model * self.vocab_size

    def head_costs(self) -> torch.Tensor:
        """(n_layers, n_heads) FLOPs per query head (layers differ by their windows)."""
        return torch.tensor([[float(self.head_flops(layer))] * self.n_heads for layer in range(self.n_layers)], dtype=torch.float64)

    def unit_costs(self, group_size: int = 0) -> UnitGates:
        heads = self.head_costs()
        if group_size <= 0:
            return UnitGates(heads, None)
        groups = torch.full((self.n_layers, self.d_ff // group_size), float(self.group_flops(group_size)), dtype=torch.float64)
        return UnitGates(heads, groups)

    def total_flops(self, heads_per_layer: list[int] | None = None, ffn_widths: list[int] | None = None) -> int:
        heads = [self.n_heads] * self.n_layers if heads_per_layer is None else heads_per_layer
        widths = [self.d_ff] * self.n_layers if ffn_widths is None else ffn_widths
        per_neuron = self.group_flops(1)
        return sum(h * self.head_flops(layer) + w * per_neuron for layer, (h, w) in enumerate(zip(heads, widths))) + self.classifier_flops()

    def ideal_speedup(self, heads_per_layer: list[int], ffn_widths: list[int] | None = None) -> float:
        return self.total_flops() / self.total_flops(heads_per_layer, ffn_widths)

    def fixed_fraction(self) -> float:
        """Share of the dense forward FLOPs no budget reduces (the output layer)."""
        return self.classifier_flops() / self.total_flops()


class GatedDecoderLM(GatedModel):
    """A transformers causal LM (Llama, Qwen2, Qwen3, Gemma 3 text) with budget gates over its
    query heads (and FFN neuron groups).

    ``model(ids, mask)`` returns (batch, seq, vocab) logits equal to the transformers model's
    (within float rounding) at b = 1; ``budget=`` / ``gates=`` as for every family.
    """

    family = "hf-decoder"

    def __init__(
        self,
        hf_model: nn.Module,
        head_ids: list[list[int]] | None = None,
        *,
        ffn_group_size: int = 0,
        group_ids: list[list[int]] | None = None,
    ) -> None:
        """Wrap ``hf_model``; ``ffn_group_size`` > 0 puts its FFN neurons under the budget.
        ``head_ids``/``group_ids`` rebuild a saved pruned or sorted layout (weights loaded after)."""
        super().__init__()
        self.layout = check_modules(hf_model)
        self.hf = hf_model
        cfg = hf_model.config
        if int(cfg.num_attention_heads) % int(cfg.num_key_value_heads):
            raise BAAError(f"num_attention_heads ({cfg.num_attention_heads}) must be a multiple of num_key_value_heads ({cfg.num_key_value_heads})")
        self.attentions: list[GatedDecoderAttention] = []
        self.mlps: list[GatedDecoderMLP] = []
        for layer in hf_model.model.layers:
            if not isinstance(layer.self_attn, GatedDecoderAttention):
                layer.self_attn = GatedDecoderAttention(layer.self_attn, cfg).train(layer.training)
            if not isinstance(layer.mlp, GatedDecoderMLP):
                layer.mlp = GatedDecoderMLP(layer.mlp, ffn_group_size).train(layer.training)
            self.attentions.append(layer.self_attn)
            self.mlps.append(layer.mlp)
        self._init_heads(cfg.num_hidden_layers, cfg.num_attention_heads, ffn_width=cfg.intermediate_size, group_size=ffn_group_size)
        # A tied output layer is the embedding: saved once (safetensors refuses shared tensors).
        self._register_state_dict_hook(_drop_tied_output)
        self._register_load_state_dict_pre_hook(_restore_tied_output, with_module=True)
        if head_ids is not None or group_ids is not None:
            full = [list(range(cfg.num_attention_heads))] * cfg.num_hidden_layers
            self.keep_units(head_ids if head_ids is not None else full, group_ids)

    @property
    def tied_output(self) -> bool:
        return self.hf.lm_head.weight is self.hf.model.embed_tokens.weight

    # ------------------------------------------------------------------ forward

    def hidden_states(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, selections: list[LayerSelection], cache: KVCache | None = None,
    ) -> torch.Tensor:
        """The final-normed hidden states (batch, seq, d) under per-layer ``selections``; with a
        ``cache``, of the new positions after the cached ones (the cache is updated)."""
        base = self.hf.model
        batch, seq = input_ids.shape
        device = input_ids.device
        start = 0 if cache is None else cache.length
        if cache is None:
            key_mask = None if attention_mask is None or bool(attention_mask.all()) else attention_mask.to(torch.bool)
        else:
            key_mask = cache.extend_mask(attention_mask, batch, seq, device)
        x = base.embed_tokens(input_ids)  # Gemma's embedding multiplies by sqrt(d) itself
        positions = torch.arange(start, start + seq, device=device).unsqueeze(0)
        layer_types = {a.layer_type for a in self.attentions}
        if self.layout.rope_per_layer_type:  # Gemma 3: local and global rotary bases
            tables = {t: base.rotary_emb(x, positions, t) for t in layer_types}
        else:
            tables = dict.fromkeys(layer_types, base.rotary_emb(x, positions))
        masks = attention_masks({a.sliding_window for a in self.attentions}, key_mask, batch, seq, start, device)
        sandwich = self.layout.sandwich_norms
        for index, (layer, attention, mlp, selection) in enumerate(zip(base.layers, self.attentions, self.mlps, selections)):
            cos, sin = tables[attention.layer_type]
            h = attention(layer.input_layernorm(x), cos, sin, masks[attention.sliding_window], selection, cache, index)
            if sandwich:
                x = x + layer.post_attention_layernorm(h)
                x = x + layer.post_feedforward_layernorm(mlp(layer.pre_feedforward_layernorm(x), selection.ffn))
            else:
                x = x + h
                x = x + mlp(layer.post_attention_layernorm(x), selection.ffn)
        if cache is not None:
            cache.key_mask, cache.length = key_mask, start + seq
        return base.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(batch, seq, d) final-normed hidden states -> (batch, seq, vocab) logits (Gemma's
        final-logit soft-capping applied)."""
        logits = self.hf.lm_head(hidden)
        cap = getattr(self.hf.config, "final_logit_softcapping", None)
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        *,
        budget: float | None = None,
        gates: torch.Tensor | UnitGates | None = None,
    ) -> torch.Tensor:
        """(batch, seq, vocab) next-token logits (position t predicts token t + 1); a classifier
        subclass returns what its :meth:`output` makes of the hidden states.

        Args:
            input_ids: (batch, seq) token ids; attention_mask: optional (batch, seq), 1 for real
                tokens (either side padded); token_type_ids: unused (no segments).
            budget, gates: as for every family.
        """
        selections = self.layer_selections(input_ids, attention_mask, budget, gates)
        return self.output(self.hidden_states(input_ids, attention_mask, selections), attention_mask)

    def output(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """The model's output from its (batch, seq, d) final-normed hidden states: next-token logits."""
        return self.logits(hidden)

    # ------------------------------------------------------------------ family hooks

    @property
    def max_len(self) -> int:
        return int(self.hf.config.max_position_embeddings)

    def input_embedding(self) -> nn.Embedding:
        return self.hf.model.embed_tokens

    @property
    def pad_id(self) -> int:
        pad = getattr(self.hf.config, "pad_token_id", None)
        return int(pad) if isinstance(pad, int) and 0 <= pad < self.vocab_size else 0

    def kv_heads_per_layer(self) -> list[int]:
        """K/V heads physically present per layer (the K/V cache's width)."""
        return [a.num_kv_heads for a in self.attentions]

    def _physical_keep(self, positions: list[list[int]]) -> None:
        for attention, layer_positions in zip(self.attentions, positions):
            attention.keep_heads(list(layer_positions))

    def _set_active(self, counts: list[int]) -> None:
        for attention, count in zip(self.attentions, counts):
            attention.active_heads = count

    def _keep_neurons(self, neurons: list[list[int]]) -> None:
        for mlp, layer_neurons in zip(self.mlps, neurons):
            mlp.keep_neurons(layer_neurons)

    def _set_active_ffn(self, counts: list[int]) -> None:
        for mlp, count in zip(self.mlps, counts):
            mlp.active_width = count * self.group_size

    def ffn_widths(self) -> list[int]:
        return [mlp.gate_proj.out_features for mlp in self.mlps]

    def ffn_activations(self) -> list[nn.Module]:
        return [mlp.activation for mlp in self.mlps]

    def cost_model(self, seq_len: int) -> DecoderLMCostModel:
        cfg = self.hf.config
        return DecoderLMCostModel(
            n_heads=int(cfg.num_attention_heads), n_kv_heads=int(cfg.num_key_value_heads), head_dim=self.attentions[0].head_dim,
            d_model=int(cfg.hidden_size), d_ff=int(cfg.intermediate_size), vocab_size=self.vocab_size,
            windows=tuple(a.sliding_window for a in self.attentions), seq_len=int(seq_len),
        )

    def lean_unsupported(self, *, routed: bool = False) -> str | None:
        return "per-input routing" if routed else None

    def inference_module(self, *, routed: bool = False) -> nn.Module:
        """The lean executor (:class:`~budgeted_attention.hf.decoder_cache.DecoderLMRunner`): the
        hard selection with a K/V cache and a greedy decode loop; shares this model's weights."""
        if routed:
            raise BAAError(f"the {self.family} family's lean executor does not run {self.lean_unsupported(routed=True)}")
        return DecoderLMRunner(self)

    def library_references(self) -> dict[str, nn.Module]:
        if self.is_pruned:
            return {}
        return {"transformers": _TransformersCall(unmodified_reference(self))}

    def describe(self) -> dict[str, Any]:
        config = {k: v for k, v in self.hf.config.to_dict().items() if k != "quantization_config"}
        description: dict[str, Any] = {"hf_config": config, "head_ids": self.head_ids, "kv_heads": self.kv_heads_per_layer()}
        if self.has_ffn_units:
            description.update(ffn_group_size=self.group_size, group_ids=self.group_ids)
        return description

    @classmethod
    def _description_args(cls, description: dict[str, Any]) -> tuple:
        """Positional constructor arguments after the transformers model (a subclass's own)."""
        return ()

    @classmethod
    def from_description(cls, description: dict[str, Any]) -> GatedDecoderLM:
        model = cls(
            causal_lm_from_config(description["hf_config"]), *cls._description_args(description), head_ids=description.get("head_ids"),
            ffn_group_size=int(description.get("ffn_group_size", 0)), group_ids=description.get("group_ids"),
        )
        expected = description.get("kv_heads")
        if expected is not None and list(expected) != model.kv_heads_per_layer():
            raise ValueError(f"kv_heads {expected} do not follow from head_ids (they give {model.kv_heads_per_layer()})")
        return model


def _drop_tied_output(module: GatedDecoderLM, state: dict, prefix: str, _local: dict) -> None:
    if module.tied_output:
        state.pop(prefix + "hf.lm_head.weight", None)


def _restore_tied_output(module: GatedDecoderLM, state: dict, prefix: str, *_args: Any) -> None:
    embedding = prefix + "hf.model.embed_tokens.weight"
    if module.tied_output and prefix + "hf.lm_head.weight" not in state and embedding in state:
        state[prefix + "hf.lm_head.weight"] = state[embedding]


class _TransformersCall(nn.Module):
    """The unmodified transformers model called like our models: ``(ids, mask) -> logits``."""

    def __init__(self, hf: nn.Module) -> None:
        super().__init__()
        self.hf = hf

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        return self.hf(input_ids=input_ids, attention_mask=attention_mask).logits


def unmodified_reference(model: GatedDecoderLM) -> nn.Module:
    """A fresh transformers model of the same class and config with the same weights (eval mode):
    what the gated model is compared and timed against. Only while nothing was pruned."""
    if model.is_pruned:
        raise ValueError("a pruned model has no unmodified reference")
    return fresh_copy(model.hf)


def fresh_copy(module: nn.Module) -> nn.Module:
    """A new transformers module of ``module``'s class and config (a causal LM or its decoder
    body, unmodified transformers code) holding copies of its weights and buffers, eval mode.
    ``module`` may hold our gated attention and FFN modules: their parameter names are the
    transformers ones."""
    with torch.device("meta"):
        reference = type(module)(copy.deepcopy(module.config))
    reference.load_state_dict({k: v.detach().clone() for k, v in module.state_dict().items()}, assign=True)
    if getattr(module.config, "tie_word_embeddings", False) and hasattr(reference, "lm_head"):
        reference.lm_head.weight = reference.model.embed_tokens.weight
    for name, buffer in module.named_buffers():  # non-persistent buffers (rotary tables, Gemma's embedding scale)
        owner, _, attr = name.rpartition(".")
        reference.get_submodule(owner).register_buffer(attr, buffer.clone(), persistent=False)
    return reference.eval()


def load_hf_decoder(
    path: str | Path, *, gguf_file: str | None = None, ffn_group_size: int = 0, tokenizer: Any | None = None,
) -> GatedDecoderLM:
    """A supported transformers causal LM with gates, from a local folder, a GGUF file in a folder
    (``gguf_file``: its name) or a hub name (:func:`~budgeted_attention.hf.decoder_layouts.load_causal_lm`).

    ``tokenizer``: a transformers tokenizer, or True to load the checkpoint's own; refused when it
    has more tokens than the model's embedding rows.
    """
    hf = load_causal_lm(path, gguf_file=gguf_file)
    if tokenizer is True:
        tokenizer = load_tokenizer(path, gguf_file=gguf_file)
    if tokenizer is not None:
        check_tokenizer(hf, tokenizer)
    return GatedDecoderLM(hf, ffn_group_size=ffn_group_size)
