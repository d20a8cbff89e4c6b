"""Hard head selection for a budget from one global, budget-invariant head order.

Nesting: the kept set for a budget is a prefix of one global order, so every head kept at
b1 <= b2 is also kept at b2, and one weight layout sorted by importance serves every budget.

"At least one head per layer" (the default) is made compatible with nesting by putting the
best head of every layer first in the order (those L heads sorted by score), then all other
heads by score; every prefix of length >= L then covers every layer, and budgets asking for
fewer than L heads are raised to L.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from budgeted_attention.budget import validate_budget


@dataclass(frozen=True)
class HeadRanking:
    """A global head order and the rule that turns a budget into a kept set.

    Attributes:
        order: (layer, head) pairs, most important first; covers every head once.
        n_layers: layers of the model.
        n_heads: heads per layer of the unpruned model.
        min_one_per_layer: keep at least one head in every layer.
    """

    order: tuple[tuple[int, int], ...]
    n_layers: int
    n_heads: int
    min_one_per_layer: bool = True

    @classmethod
    def from_scores(cls, scores: torch.Tensor, min_one_per_layer: bool = True) -> HeadRanking:
        """Order heads by ``scores`` (n_layers, n_heads), higher = more important.

        Ties are broken by (layer, head) index so the order is deterministic.
        """
        n_layers, n_heads = scores.shape
        values = scores.detach().double().tolist()
        everything = sorted(
            ((layer, head) for layer in range(n_layers) for head in range(n_heads)),
            key=lambda lh: (-values[lh[0]][lh[1]], lh[0], lh[1]),
        )
        if not min_one_per_layer:
            return cls(tuple(everything), n_layers, n_heads, False)
        best_per_layer: dict[int, tuple[int, int]] = {}
        for layer, head in everything:
            best_per_layer.setdefault(layer, (layer, head))
        leaders = [lh for lh in everything if best_per_layer[lh[0]] == lh]
        rest = [lh for lh in everything if best_per_layer[lh[0]] != lh]
        return cls(tuple(leaders + rest), n_layers, n_heads, True)

    @property
    def total_heads(self) -> int:
        return self.n_layers * self.n_heads

    def count_for_budget(self, budget: float) -> int:
        """Heads kept for ``budget``: round(b * total), at least L (or 1 when layers may be empty)."""
        b = validate_budget(budget)
        # floor(x + 0.5) rather than round(): Python's banker's rounding would make 0.5 * 6 -> 3
        # but 0.5 * 10 -> 5 and 2.5 -> 2, which is surprising for users.
        count = int(math.floor(b * self.total_heads + 0.5))
        minimum = self.n_layers if self.min_one_per_layer else 1
        return max(minimum, min(count, self.total_heads))

    def kept_heads(self, budget: float) -> list[list[int]]:
        """Per layer, the kept head indices in rank order (most important first)."""
        kept: list[list[int]] = [[] for _ in range(self.n_layers)]
        for layer, head in self.order[: self.count_for_budget(budget)]:
            kept[layer].append(head)
        return kept

    def heads_per_layer(self, budget: float) -> list[int]:
        return [len(heads) for heads in self.kept_heads(budget)]

    def mask(self, budget: float) -> torch.Tensor:
        """(n_layers, n_heads) float mask with 1 for kept heads."""
        mask = torch.zeros(self.n_layers, self.n_heads)
        for layer, heads in enumerate(self.kept_heads(budget)):
            mask[layer, heads] = 1.0
        return mask

    def layer_orders(self) -> list[list[int]]:
        """Per layer, all heads sorted by global rank (the sorted weight layout)."""
        orders: list[list[int]] = [[] for _ in range(self.n_layers)]
        for layer, head in self.order:
            orders[layer].append(head)
        return orders

    def to_dict(self) -> dict[str, object]:
        return {
            "order": [list(pair) for pair in self.order],
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "min_one_per_layer": self.min_one_per_layer,
        }

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> HeadRanking:
        order = tuple((int(p[0]), int(p[1])) for p in data["order"])  # type: ignore[index,union-attr]
        ranking = cls(order, int(data["n_layers"]), int(data["n_heads"]), bool(data["min_one_per_layer"]))  # type: ignore[arg-type]
        expected = {(layer, head) for layer in range(ranking.n_layers) for head in range(ranking.n_heads)}
        if set(order) != expected or len(order) != len(expected):
            raise ValueError("head ranking must list every (layer, head) pair exactly once")
        return ranking
