"""The K/V cache, the attention masks and the lean executor of the ``hf-decoder`` family.

:class:`KVCache` holds, per layer, the keys (after QK-norm and RoPE) and values of the K/V heads
that layer computes: a pruned layer's cache is as narrow as its surviving K/V groups, and a
sliding-window layer keeps only its last ``window - 1`` positions (all a later query can reach).

:class:`DecoderLMRunner` is the family's lean executor: the model's own modules at their hard
selection (every stored head and neuron, no gate arithmetic) with a K/V cache, so prefill and each
decode step compute only the new positions. ``runner(ids, mask)`` returns the full logits, equal
to the module tree's; :meth:`DecoderLMRunner.generate` is a greedy decode loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from budgeted_attention.errors import BAAError
from budgeted_attention.model.gates import DENSE

if TYPE_CHECKING:
    from budgeted_attention.hf.decoder import GatedDecoderLM


@dataclass
class KVCache:
    """Per layer (batch, kv_heads, positions, head_dim) keys and values, and the (batch, length)
    key mask (True for real tokens; None while nothing is padded).

    ``length``: tokens seen so far (the position of the next token). The head set a layer runs
    must stay the same for the whole generation (its cached K/V heads are those it computed).
    """

    n_layers: int
    keys: list[torch.Tensor | None] = field(default_factory=list)
    values: list[torch.Tensor | None] = field(default_factory=list)
    key_mask: torch.Tensor | None = None
    length: int = 0

    def __post_init__(self) -> None:
        self.keys = [None] * self.n_layers
        self.values = [None] * self.n_layers

    def store(self, layer: int, keys: torch.Tensor, values: torch.Tensor, window: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the new positions' (batch, kv_heads, new, head_dim) keys and values of
        ``layer``; returns all the keys and values the new queries attend (past + new). A
        sliding-window layer then keeps its last ``window - 1`` positions."""
        if self.keys[layer] is not None:
            keys = torch.cat([self.keys[layer], keys], dim=2)
            values = torch.cat([self.values[layer], values], dim=2)
        first = 0 if window is None else max(keys.shape[2] - (window - 1), 0)
        self.keys[layer], self.values[layer] = keys[:, :, first:], values[:, :, first:]
        return keys, values

    def extend_mask(self, attention_mask: torch.Tensor | None, batch: int, new: int, device: torch.device) -> torch.Tensor | None:
        """The key mask over ``length + new`` positions after ``new`` tokens with
        ``attention_mask`` (batch, new) arrive (None: nothing padded so far)."""
        padded = attention_mask is not None and not bool(attention_mask.all())
        if not padded and self.key_mask is None:
            return None
        new_mask = torch.ones(batch, new, dtype=torch.bool, device=device) if attention_mask is None else attention_mask.to(device=device, dtype=torch.bool)
        old = self.key_mask if self.key_mask is not None else torch.ones(batch, self.length, dtype=torch.bool, device=device)
        return torch.cat([old, new_mask], dim=1)

    def nbytes(self) -> int:
        """Bytes the cache holds now (keys and values of every layer)."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values) if t is not None)


def attention_masks(
    windows: set[int | None], key_mask: torch.Tensor | None, batch: int, seq: int, start: int, device: torch.device,
) -> dict[int | None, torch.Tensor | None]:
    """Per sliding window (None: full causal) the boolean (batch, 1, seq, keys) mask of ``seq``
    queries at positions ``start..start+seq-1`` over the keys a layer of that window attends (its
    cached past, ``min(start, window - 1)`` positions, then the new ones); True where a query may
    attend a key. None where plain SDPA is exact: causal from position 0 (``is_causal``), or one
    query that may see every key.

    ``key_mask``: (batch, start + seq) True for real tokens, or None (nothing padded). A padded
    query sees itself only: its logits are ignored, but never NaN.
    """
    masks: dict[int | None, torch.Tensor | None] = {}
    queries = torch.arange(start, start + seq, device=device)
    for window in windows:
        past = start if window is None else min(start, window - 1)
        limited = window is not None and past + seq > window  # some query cannot reach some key
        if key_mask is None and not limited and (start == 0 or seq == 1):
            masks[window] = None
            continue
        keys = torch.arange(start - past, start + seq, device=device)
        distance = queries.view(-1, 1) - keys.view(1, -1)  # query - key
        allowed = distance >= 0
        if window is not None:
            allowed = allowed & (distance < window)
        mask = allowed.view(1, 1, seq, past + seq)
        if key_mask is not None:
            real = key_mask[:, start - past : start + seq].view(batch, 1, 1, past + seq)
            mask = (mask & real) | (distance == 0).view(1, 1, seq, past + seq)
        masks[window] = mask.expand(batch, 1, seq, past + seq)
    return masks


class DecoderLMRunner(nn.Module):
    """The lean executor of a :class:`GatedDecoderLM`: its hard selection (every active head and
    neuron, ungated) with a K/V cache. Shares the model's weights and layout (nothing is copied:
    a budget set on the model reaches it)."""

    def __init__(self, model: GatedDecoderLM) -> None:
        super().__init__()
        if model.router is not None:
            raise BAAError("the hf-decoder family's lean executor does not run per-input routing")
        self.model = model.eval()

    def is_current(self, model: nn.Module) -> bool:
        """Always current for its own model: it holds no copy of the weights or the layout."""
        return model is self.model

    def set_active(self, heads: list[int], ffn_widths: list[int] | None = None) -> None:
        """The runner runs its model's active prefixes: this only checks that they are the ones
        asked for (set the budget on the model; :class:`~budgeted_attention.model.lean.LeanFollower`
        asks for the model's own)."""
        if heads != self.model.active_heads() or (ffn_widths is not None and ffn_widths != self.model.active_ffn_widths()):
            raise BAAError("the hf-decoder lean executor shares its model's layout: set the active heads on the model")

    def new_cache(self) -> KVCache:
        return KVCache(self.model.n_layers)

    @torch.no_grad()
    def step(self, input_ids: torch.Tensor, cache: KVCache, attention_mask: torch.Tensor | None = None, *, last_only: bool = False) -> torch.Tensor:
        """Run ``input_ids`` (batch, new) after the cached positions: (batch, new, vocab) logits,
        or (batch, 1, vocab) of the last position with ``last_only`` (prefill before decoding:
        the output layer then runs once). ``attention_mask``: (batch, new), 1 for real tokens."""
        selections = [DENSE] * self.model.n_layers
        hidden = self.model.hidden_states(input_ids, attention_mask, selections, cache=cache)
        return self.model.logits(hidden[:, -1:] if last_only else hidden)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """(batch, seq, vocab) logits of a whole sequence (through the cache path), as the module tree's."""
        return self.step(input_ids, self.new_cache(), attention_mask)

    @torch.no_grad()
    def decode(self, input_ids: torch.Tensor, max_new_tokens: int, attention_mask: torch.Tensor | None = None) -> Iterator[torch.Tensor]:
        """Greedy decoding: yields each new (batch,) token, prefill first; the cache stays with the loop."""
        if max_new_tokens < 1:
            raise BAAError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if input_ids.shape[1] + max_new_tokens > self.model.max_len:
            raise BAAError(f"{input_ids.shape[1]} prompt + {max_new_tokens} new tokens exceed the model's {self.model.max_len} positions")
        cache = self.new_cache()
        logits = self.step(input_ids, cache, attention_mask, last_only=True)
        for _ in range(max_new_tokens):
            token = logits[:, -1].argmax(-1)
            yield token
            logits = self.step(token.view(-1, 1), cache)

    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(batch, prompt + max_new_tokens) ids: the prompt and its greedy continuation."""
        tokens = list(self.decode(input_ids, max_new_tokens, attention_mask))
        return torch.cat([input_ids, torch.stack(tokens, dim=1)], dim=1)
