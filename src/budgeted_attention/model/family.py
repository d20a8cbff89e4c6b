"""The one interface every model family implements (our encoder, the BERT family, and later
decoders, attention-only and routed models).

Bench, save/load, pruning, instant switching and the experiment pipeline are written once
against :class:`GatedModel`. A family implements the few methods marked "family" below; the
gate bookkeeping shared by all of them lives here.

Head identity. Gates are defined on the *full* (n_layers, n_heads) grid of the unpruned model.
A pruned or re-ordered model records, per layer, which original head each of its physical heads
is (``head_ids``). Every forward pass re-indexes the full-grid gates to the physical heads, so
``model(ids, budget=b)`` on a pruned or sorted model means exactly what it means on the full
model restricted to the heads it still has.
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar

import torch
from torch import nn

from budgeted_attention.model.cost import CostModel
from budgeted_attention.model.gates import BudgetGates


def identity_head_ids(n_layers: int, n_heads: int) -> list[list[int]]:
    """``[[0, 1, ..., n_heads - 1]] * n_layers``: the unpruned, unsorted layout."""
    return [list(range(n_heads)) for _ in range(n_layers)]


def validate_head_ids(head_ids: list[list[int]], n_layers: int, n_heads: int) -> list[list[int]]:
    """Check a per-layer list of distinct original head indices; returns it as plain ints."""
    if not isinstance(head_ids, (list, tuple)) or len(head_ids) != n_layers:
        raise ValueError(f"head_ids must list {n_layers} layers, got {head_ids!r}")
    result = []
    for layer, heads in enumerate(head_ids):
        ints = [int(h) for h in heads]
        if len(set(ints)) != len(ints) or any(not 0 <= h < n_heads for h in ints):
            raise ValueError(f"head_ids of layer {layer} must be distinct indices in [0, {n_heads}), got {heads!r}")
        result.append(ints)
    return result


class GatedModel(nn.Module):
    """Base class of gated classifiers: budget gates over a (layer, head) grid, prunable heads.

    Family subclasses set ``family`` and implement ``_run`` (the forward pass with per-layer
    gates), ``_physical_keep`` (remove heads), ``_set_active`` (prefix slicing), ``cost_model``,
    ``plain_reference``, ``describe`` and ``from_description``.

    Attributes:
        gates: :class:`BudgetGates` of shape (n_layers, n_heads), the full grid.
        n_layers, n_heads: the full grid.
        head_ids: per layer, the original head index of each physical head, in storage order.
    """

    family: ClassVar[str] = ""

    def _init_heads(self, n_layers: int, n_heads: int, head_ids: list[list[int]] | None = None) -> None:
        self.n_layers, self.n_heads = n_layers, n_heads
        self.gates = BudgetGates(n_layers, n_heads)
        self.head_ids = validate_head_ids(head_ids, n_layers, n_heads) if head_ids else identity_head_ids(n_layers, n_heads)
        self._active = [len(h) for h in self.head_ids]
        self._gate_index: list[torch.Tensor] | None = None

    # ------------------------------------------------------------------ shape

    @property
    def heads_per_layer(self) -> list[int]:
        """Heads physically present per layer."""
        return [len(h) for h in self.head_ids]

    @property
    def is_pruned(self) -> bool:
        return any(n != self.n_heads for n in self.heads_per_layer)

    @property
    def is_identity_layout(self) -> bool:
        """True when every head is present in its original order (no surgery, no sorting)."""
        return self.head_ids == identity_head_ids(self.n_layers, self.n_heads)

    @property
    def max_len(self) -> int:  # pragma: no cover - abstract
        """Longest input sequence the model accepts, in tokens."""
        raise NotImplementedError

    def active_heads(self) -> list[int]:
        """Heads used per layer in forward: a prefix of the physical heads (instant switching)."""
        return list(self._active)

    def active_head_ids(self) -> list[list[int]]:
        """Original indices of the heads the forward pass runs, per layer."""
        return [ids[:n] for ids, n in zip(self.head_ids, self._active)]

    # ------------------------------------------------------------------ gates

    def layer_gates(self, budget: float | None = None, gates: torch.Tensor | None = None) -> list[torch.Tensor | None] | None:
        """Per layer, the gates of the active physical heads (re-indexed from the full grid).

        Args:
            budget: attention budget in (0, 1]; b = 1 is the ungated dense path.
            gates: explicit (n_layers, n_heads) full-grid gate values (overrides ``budget``).

        Returns:
            None for the ungated fast path, else one (active heads,) tensor per layer.
        """
        if gates is not None and tuple(gates.shape) != (self.n_layers, self.n_heads):
            raise ValueError(
                f"gates must have the full-grid shape ({self.n_layers}, {self.n_heads}) even for a pruned model, "
                f"got {tuple(gates.shape)}"
            )
        matrix = self.gates.resolve(budget, gates)
        if matrix is None:
            return None
        if self._gate_index is None:
            self._gate_index = [torch.tensor(ids, dtype=torch.long) for ids in self.active_head_ids()]
            self._identity = self.active_head_ids() == identity_head_ids(self.n_layers, self.n_heads)
        if self._identity:
            return list(matrix.unbind(0))
        return [matrix[layer].index_select(0, index.to(matrix.device)) for layer, index in enumerate(self._gate_index)]

    def full_grid_mask(self) -> torch.Tensor:
        """(n_layers, n_heads) 0/1 mask of the heads the forward pass runs."""
        mask = torch.zeros(self.n_layers, self.n_heads)
        for layer, heads in enumerate(self.active_head_ids()):
            mask[layer, heads] = 1.0
        return mask

    # ------------------------------------------------------------------ surgery and slicing

    @torch.no_grad()
    def keep_heads(self, kept: list[list[int]]) -> None:
        """Physically keep, per layer, the heads ``kept[l]`` (ORIGINAL head indices, in that order).

        Works on pruned and sorted models too, as long as every requested head is still present.
        Uneven counts and empty layers are allowed.
        """
        if len(kept) != self.n_layers:
            raise ValueError(f"expected {self.n_layers} head lists, got {len(kept)}")
        kept = validate_head_ids(kept, self.n_layers, self.n_heads)
        positions = []
        for layer, heads in enumerate(kept):
            present = self.head_ids[layer]
            missing = [h for h in heads if h not in present]
            if missing:
                raise ValueError(f"layer {layer} no longer has head(s) {missing} (present: {present})")
            positions.append([present.index(h) for h in heads])
        self._physical_keep(positions)
        self.head_ids = [[int(h) for h in heads] for heads in kept]
        self._active = [len(h) for h in self.head_ids]
        self._gate_index = None

    def set_active_heads(self, counts: list[int]) -> None:
        """Run only the first ``counts[l]`` physical heads of layer l (views, no copies)."""
        if len(counts) != self.n_layers:
            raise ValueError(f"expected {self.n_layers} head counts, got {counts!r}")
        for layer, (count, present) in enumerate(zip(counts, self.heads_per_layer)):
            if not 0 <= count <= present:
                raise ValueError(f"active head count of layer {layer} must be in [0, {present}], got {count!r}")
        self._set_active(list(counts))
        self._active = list(counts)
        self._gate_index = None

    def pruned_copy(self, kept: list[list[int]]) -> GatedModel:
        """A physically smaller copy keeping ``kept[l]`` original heads per layer (eval mode)."""
        copied = copy.deepcopy(self)
        copied.keep_heads(kept)
        return copied.eval()

    # ------------------------------------------------------------------ family hooks

    def _physical_keep(self, positions: list[list[int]]) -> None:  # pragma: no cover - abstract
        """Keep physical heads at ``positions[l]`` (storage positions, in that order)."""
        raise NotImplementedError

    def _set_active(self, counts: list[int]) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def cost_model(self, seq_len: int) -> CostModel:  # pragma: no cover - abstract
        """FLOP cost model of the full (unpruned) architecture at ``seq_len`` tokens."""
        raise NotImplementedError

    def plain_reference(self) -> nn.Module:  # pragma: no cover - abstract
        """A dense model without gate code running the same kernels, same weights (unpruned only).

        Called as ``reference(input_ids, attention_mask)``; logits equal ``self(ids, mask)`` at b = 1.
        """
        raise NotImplementedError

    def library_references(self) -> dict[str, nn.Module]:
        """Other timing references, e.g. the unmodified transformers model (name -> callable module)."""
        return {}

    def describe(self) -> dict[str, Any]:  # pragma: no cover - abstract
        """JSON-serialisable architecture (including ``head_ids``) that :meth:`from_description` rebuilds."""
        raise NotImplementedError

    @classmethod
    def from_description(cls, description: dict[str, Any]) -> GatedModel:  # pragma: no cover - abstract
        """A model of the described architecture (weights to be loaded afterwards)."""
        raise NotImplementedError
