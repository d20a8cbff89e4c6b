"""Hard head selection for a budget from one global, budget-invariant head order.

Nesting: the kept set for a budget is a prefix of one global order, so every head kept at
b1 <= b2 is also kept at b2, and one weight layout sorted by importance serves every budget.

"At least one head per layer" (the default) is made compatible with nesting by putting the
best head of every layer first in the order (those L heads sorted by score), then all other
heads by score; every prefix of length >= L then covers every layer, and budgets asking for
fewer than L heads are raised to L.

Two rankings share one interface (``kept``, ``mask``, ``layer_orders_units``, ``to_dict``):

* :class:`HeadRanking` (``budget_scope: heads``, the paper): a budget keeps round(b * heads) heads.
* :class:`UnitRanking` (``budget_scope: all``): one global order over heads *and* feed-forward
  neuron groups; a budget keeps the longest prefix whose FLOPs fit b times the prunable FLOPs, so
  the kept set is nested and its cost never exceeds b (beyond the per-layer minimum).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from budgeted_attention.budget import validate_budget
from budgeted_attention.model.gates import UnitGates


@dataclass(frozen=True)
class KeptUnits:
    """Per layer, the kept original indices of heads and (None: FFN not pruned) FFN groups."""

    heads: list[list[int]]
    groups: list[list[int]] | None = None

    @property
    def heads_per_layer(self) -> list[int]:
        return [len(h) for h in self.heads]

    @property
    def groups_per_layer(self) -> list[int] | None:
        return None if self.groups is None else [len(g) for g in self.groups]

    def masks(self, n_heads: int, n_groups: int = 0) -> UnitGates:
        """Full-grid 0/1 masks of the kept heads (n_layers, n_heads) and, when groups are kept,
        FFN groups (n_layers, n_groups)."""
        heads = torch.zeros(len(self.heads), n_heads)
        for layer, ids in enumerate(self.heads):
            heads[layer, ids] = 1.0
        if self.groups is None:
            return UnitGates(heads, None)
        groups = torch.zeros(len(self.groups), n_groups)
        for layer, ids in enumerate(self.groups):
            groups[layer, ids] = 1.0
        return UnitGates(heads, groups)


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

    # The scope-generic interface shared with UnitRanking.
    scope = "heads"

    def kept(self, budget: float) -> KeptUnits:
        return KeptUnits(self.kept_heads(budget), None)

    def masks(self, budget: float) -> UnitGates:
        return UnitGates(self.mask(budget), None)

    def layer_orders_units(self) -> KeptUnits:
        return KeptUnits(self.layer_orders(), None)

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


@dataclass(frozen=True)
class UnitRanking:
    """One global order over attention heads and FFN neuron groups, with their FLOP costs.

    Attributes:
        order: ("head" | "ffn", layer, index) triples, most important first; every unit once.
        n_layers, n_heads, n_groups: the full grid (groups of ``group_size`` FFN neurons per layer).
        head_cost, group_cost: FLOPs of one head and of one group (at the reference length).
        min_one_per_layer: keep at least one head and one group in every layer (their best
            units lead the order); otherwise a layer may lose all of them (whole-layer skip).
    """

    order: tuple[tuple[str, int, int], ...]
    n_layers: int
    n_heads: int
    n_groups: int
    head_cost: float
    group_cost: float
    min_one_per_layer: bool = True

    scope = "all"

    @classmethod
    def from_scores(cls, scores: UnitGates, head_cost: float, group_cost: float, min_one_per_layer: bool = True) -> UnitRanking:
        """Order units by ``scores`` (higher = more important; ties by kind, layer, index)."""
        if scores.ffn is None:
            raise ValueError("a unit ranking needs FFN group scores")
        n_layers, n_heads = scores.heads.shape
        n_groups = scores.ffn.shape[1]
        values = {"head": scores.heads.detach().double().tolist(), "ffn": scores.ffn.detach().double().tolist()}
        units = [("head", layer, h) for layer in range(n_layers) for h in range(n_heads)]
        units += [("ffn", layer, g) for layer in range(n_layers) for g in range(n_groups)]
        everything = sorted(units, key=lambda u: (-values[u[0]][u[1]][u[2]], u[0] == "ffn", u[1], u[2]))
        if min_one_per_layer:
            leaders: dict[tuple[str, int], tuple[str, int, int]] = {}
            for unit in everything:
                leaders.setdefault(unit[:2], unit)
            lead = set(leaders.values())
            everything = [u for u in everything if u in lead] + [u for u in everything if u not in lead]
        return cls(tuple(everything), n_layers, n_heads, n_groups, float(head_cost), float(group_cost), min_one_per_layer)

    @property
    def total_units(self) -> int:
        return len(self.order)

    @property
    def total_cost(self) -> float:
        """FLOPs of every prunable unit (the denominator of the budget)."""
        return self.n_layers * (self.n_heads * self.head_cost + self.n_groups * self.group_cost)

    def _unit_cost(self, unit: tuple[str, int, int]) -> float:
        return self.head_cost if unit[0] == "head" else self.group_cost

    def count_for_budget(self, budget: float) -> int:
        """Units kept for ``budget``: the longest prefix of the order whose FLOPs are <= b * total.

        Never fewer than the per-layer minimum (2 units per layer, or 1 unit overall).
        """
        b = validate_budget(budget)
        if b == 1.0:
            return self.total_units
        allowance = b * self.total_cost * (1.0 + 1e-9)
        spent, count = 0.0, 0
        for unit in self.order:
            spent += self._unit_cost(unit)
            if spent > allowance:
                break
            count += 1
        minimum = 2 * self.n_layers if self.min_one_per_layer else 1
        return max(minimum, count)

    def kept(self, budget: float) -> KeptUnits:
        """Per layer, kept heads and groups in rank order."""
        heads: list[list[int]] = [[] for _ in range(self.n_layers)]
        groups: list[list[int]] = [[] for _ in range(self.n_layers)]
        for kind, layer, index in self.order[: self.count_for_budget(budget)]:
            (heads if kind == "head" else groups)[layer].append(index)
        return KeptUnits(heads, groups)

    def kept_heads(self, budget: float) -> list[list[int]]:
        return self.kept(budget).heads

    def heads_per_layer(self, budget: float) -> list[int]:
        return self.kept(budget).heads_per_layer

    def kept_cost(self, budget: float) -> float:
        """FLOPs of the kept units as a fraction of all prunable FLOPs."""
        return sum(self._unit_cost(u) for u in self.order[: self.count_for_budget(budget)]) / self.total_cost

    def masks(self, budget: float) -> UnitGates:
        """0/1 masks of the kept units: heads (n_layers, n_heads), groups (n_layers, n_groups)."""
        return self.kept(budget).masks(self.n_heads, self.n_groups)

    def mask(self, budget: float) -> UnitGates:
        return self.masks(budget)

    def layer_orders_units(self) -> KeptUnits:
        """Per layer, every head and every group in rank order (the sorted weight layout)."""
        heads: list[list[int]] = [[] for _ in range(self.n_layers)]
        groups: list[list[int]] = [[] for _ in range(self.n_layers)]
        for kind, layer, index in self.order:
            (heads if kind == "head" else groups)[layer].append(index)
        return KeptUnits(heads, groups)

    def layer_orders(self) -> list[list[int]]:
        return self.layer_orders_units().heads

    def head_ranking(self) -> HeadRanking:
        """The heads of this order alone (head-only pruning with the FFN whole, for comparisons)."""
        heads = tuple((layer, index) for kind, layer, index in self.order if kind == "head")
        return HeadRanking(heads, self.n_layers, self.n_heads, self.min_one_per_layer)

    def to_dict(self) -> dict[str, object]:
        return {
            "scope": "all",
            "order": [list(unit) for unit in self.order],
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "n_groups": self.n_groups,
            "head_cost": self.head_cost,
            "group_cost": self.group_cost,
            "min_one_per_layer": self.min_one_per_layer,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> UnitRanking:
        order = tuple((str(u[0]), int(u[1]), int(u[2])) for u in data["order"])
        ranking = cls(
            order, int(data["n_layers"]), int(data["n_heads"]), int(data["n_groups"]),
            float(data["head_cost"]), float(data["group_cost"]), bool(data["min_one_per_layer"]),
        )
        expected = {("head", layer, h) for layer in range(ranking.n_layers) for h in range(ranking.n_heads)}
        expected |= {("ffn", layer, g) for layer in range(ranking.n_layers) for g in range(ranking.n_groups)}
        if set(order) != expected or len(order) != len(expected):
            raise ValueError("unit ranking must list every head and every FFN group exactly once")
        if not (ranking.head_cost > 0 and ranking.group_cost > 0):
            raise ValueError("unit ranking costs must be positive")
        return ranking


Ranking = HeadRanking | UnitRanking


def ranking_from_dict(data: dict[str, Any]) -> Ranking:
    """A stored ranking of either scope (``scope: all`` marks a unit ranking)."""
    if data.get("scope") == "all":
        return UnitRanking.from_dict(data)
    return HeadRanking.from_dict(data)


def rank_units(scores: UnitGates, costs: UnitGates | None = None, min_one_per_layer: bool = True) -> Ranking:
    """The ranking of a model's importance ``scores``: heads only, or heads and FFN groups
    (then ``costs``, FLOPs per unit, are needed to fit budgets)."""
    if scores.ffn is None:
        return HeadRanking.from_scores(scores.heads, min_one_per_layer)
    if costs is None or costs.ffn is None:
        raise ValueError("ranking FFN groups needs their FLOP costs")
    return UnitRanking.from_scores(scores, float(costs.heads.flatten()[0]), float(costs.ffn.flatten()[0]), min_one_per_layer)
