"""Sequence classification with a pretrained decoder: the ``hf-decoder-classifier`` family.

:class:`GatedDecoderClassifier` is a :class:`~budgeted_attention.hf.decoder.GatedDecoderLM`
(same layouts, units, cost, surgery, slicing and save format) whose output layer is a new
``score`` projection of the last real token's final-normed hidden state to the labels, as
transformers' ``LlamaForSequenceClassification`` / ``Gemma3ForSequenceClassification`` do (no
bias). The vocabulary projection is dropped: it is most of a small decoder's parameters (168 M of
Gemma 3 270M's 270 M, tied to the input embedding, which stays) and a classifier never runs it.

Pooling: the last position whose ``attention_mask`` is 1, so either padding side works; without a
mask, the last position. Under causal attention that token has read the whole text.

Cost: the classifier scores one position (``output_every_position=False``), so b is the fraction
of the body's prunable FLOPs and almost nothing is fixed.

Lean executor: :class:`DecoderClassifierRunner` (the hard selection ungated, no K/V cache: one
pass over the whole text). The library reference is the unmodified transformers decoder body with
the same weights, pooled and scored the same way (what ``AutoModelForSequenceClassification``
runs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from budgeted_attention.errors import BAAError
from budgeted_attention.hf.decoder import GatedDecoderLM, fresh_copy
from budgeted_attention.hf.decoder_cache import DecoderLMRunner, KVCache
from budgeted_attention.hf.decoder_layouts import check_tokenizer, load_causal_lm, load_tokenizer
from budgeted_attention.model.gates import DENSE


def last_real_positions(attention_mask: torch.Tensor | None, batch: int, seq: int, device: torch.device) -> torch.Tensor:
    """(batch,) index of each row's last real token (mask 1); the last position without a mask.
    A row with no real token pools position 0."""
    if attention_mask is None:
        return torch.full((batch,), seq - 1, dtype=torch.long, device=device)
    positions = torch.arange(seq, device=device).expand(batch, seq)
    return (positions * (attention_mask != 0)).amax(dim=1)


def pool_last(hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """(batch, seq, d) -> (batch, d): the hidden state of each row's last real token."""
    batch, seq, _ = hidden.shape
    index = last_real_positions(attention_mask, batch, seq, hidden.device)
    return hidden[torch.arange(batch, device=hidden.device), index]


class GatedDecoderClassifier(GatedDecoderLM):
    """A transformers decoder (Llama, Qwen2, Qwen3, Gemma 3 text) as a sequence classifier with
    budget gates over its query heads (and FFN neuron groups).

    ``model(ids, mask)`` returns (batch, num_labels) logits; ``budget=`` / ``gates=`` as for every
    family.
    """

    family = "hf-decoder-classifier"

    def __init__(
        self,
        hf_model: nn.Module,
        num_labels: int,
        head_ids: list[list[int]] | None = None,
        *,
        ffn_group_size: int = 0,
        group_ids: list[list[int]] | None = None,
    ) -> None:
        """Wrap the causal LM ``hf_model`` (its vocabulary projection is dropped) with a new
        ``num_labels``-way ``score`` layer, initialised as transformers initialises one."""
        if num_labels < 2:
            raise BAAError(f"num_labels must be >= 2, got {num_labels}")
        hf_model.lm_head = nn.Identity()  # never run by a classifier; the input embedding stays
        hf_model.config.num_labels = int(num_labels)  # its id2label: the class count checkpoints and labels files are checked by
        super().__init__(hf_model, head_ids, ffn_group_size=ffn_group_size, group_ids=group_ids)
        cfg = hf_model.config
        self.score = nn.Linear(int(cfg.hidden_size), int(num_labels), bias=False)
        nn.init.normal_(self.score.weight, std=float(getattr(cfg, "initializer_range", 0.02)))

    @property
    def tied_output(self) -> bool:
        return False  # no output layer of the vocabulary: nothing tied to drop or restore

    @property
    def num_labels(self) -> int:
        return self.score.out_features

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        raise BAAError("the hf-decoder-classifier family has no next-token output layer: it classifies (call the model)")

    def output(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """(batch, seq, d) final-normed hidden states -> (batch, num_labels) logits of the last real
        token: what ``model(ids, mask, budget=...)`` returns."""
        return self.score(pool_last(hidden, attention_mask))

    def cost_model(self, seq_len: int):
        model = super().cost_model(seq_len)
        return type(model)(**{**model.__dict__, "vocab_size": self.num_labels, "output_every_position": False})

    def inference_module(self, *, routed: bool = False) -> nn.Module:
        """The lean executor (:class:`DecoderClassifierRunner`); shares this model's weights."""
        if routed:
            raise BAAError(f"the {self.family} family's lean executor does not run {self.lean_unsupported(routed=True)}")
        return DecoderClassifierRunner(self)

    def library_references(self) -> dict[str, nn.Module]:
        if self.is_pruned:
            return {}
        return {"transformers": _TransformersClassifierCall(fresh_copy(self.hf.model), self.score)}

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "num_labels": self.num_labels}

    @classmethod
    def _description_args(cls, description: dict[str, Any]) -> tuple:
        if int(description.get("num_labels", 0)) < 2:
            raise ValueError(f"num_labels must be >= 2, got {description.get('num_labels')!r}")
        return (int(description["num_labels"]),)


class DecoderClassifierRunner(DecoderLMRunner):
    """The lean executor of a :class:`GatedDecoderClassifier`: its hard selection ungated in one
    pass (no K/V cache: nothing is generated). Shares the model's weights and layout."""

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """(batch, num_labels) logits, as the module tree's at its hard selection."""
        hidden = self.model.hidden_states(input_ids, attention_mask, [DENSE] * self.model.n_layers)
        return self.model.output(hidden, attention_mask)

    def step(self, input_ids: torch.Tensor, cache: KVCache, attention_mask: torch.Tensor | None = None, *, last_only: bool = False) -> torch.Tensor:
        raise BAAError("the hf-decoder-classifier family classifies; it does not generate")


class _TransformersClassifierCall(nn.Module):
    """The unmodified transformers decoder body, pooled and scored like the classifier:
    ``(ids, mask) -> (batch, num_labels)``."""

    def __init__(self, body: nn.Module, score: nn.Linear) -> None:
        super().__init__()
        self.body, self.score = body, score

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        hidden = self.body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.score(pool_last(hidden, attention_mask))


def load_hf_decoder_classifier(
    path: str | Path, num_labels: int, *, gguf_file: str | None = None, ffn_group_size: int = 0, tokenizer: Any | None = None,
) -> GatedDecoderClassifier:
    """A supported transformers decoder as a ``num_labels``-way classifier with gates (new score
    layer), from a local folder, a GGUF file in a folder or a hub name (see
    :func:`~budgeted_attention.hf.decoder.load_hf_decoder`)."""
    hf = load_causal_lm(path, gguf_file=gguf_file)
    if tokenizer is True:
        tokenizer = load_tokenizer(path, gguf_file=gguf_file)
    if tokenizer is not None:
        check_tokenizer(hf, tokenizer)
    return GatedDecoderClassifier(hf, num_labels, ffn_group_size=ffn_group_size)
