"""Hard head selection for a budget from one global, budget-invariant head order.

Nesting: the kept set for a budget is a prefix of one global order, so every head kept at
b1 <= b2 is also kept at b2, and one weight layout sorted by importance serves every budget.

"At least one head per layer" (the default) is made compatible with nesting by putting the
best head of every layer first in the order (those L heads sorted by score), then all other
heads by score; every prefix of length >= L then covers every layer, and budgets asking for
fewer than L heads are raised to L.

One :class:`Ranking` serves both budget scopes; heads only is the whole-model case without FFN
units:

* ``budget_scope: heads`` (the paper, ``n_groups == 0``): every head costs the same, so a budget
  keeps round(b * heads) heads;
* ``budget_scope: all``: one global order over heads *and* feed-forward neuron groups; a budget
  keeps the longest prefix whose FLOPs fit b times the prunable FLOPs, so the kept set is nested
  and its cost never exceeds b (beyond the per-layer minimum).
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

    @property
    def scope(self) -> str:
        """``heads`` (the FFN kept whole) or ``all``."""
        return "heads" if self.groups is None else "all"

    def masks(self, n_heads: int, n_groups: int = 0) -> UnitGates:
        """Full-grid 0/1 masks of the kept heads (n_layers, n_heads) and, when groups are kept,
        FFN groups (n_layers, n_groups)."""
        return UnitGates(_mask(self.heads, n_heads), None if self.groups is None else _mask(self.groups, n_groups))


def _mask(kept: list[list[int]], n_units: int) -> torch.Tensor:
    """(n_layers, n_units) 0/1 mask of the kept units of every layer."""
    mask = torch.zeros(len(kept), n_units)
    for layer, ids in enumerate(kept):
        mask[layer, ids] = 1.0
    return mask


@dataclass(frozen=True)
class Ranking:
    """One global order over a model's gated units, with their FLOP costs, and the rule that turns
    a budget into a kept set (a prefix of the order).

    Attributes:
        order: ("head" | "ffn", layer, index) triples, most important first; every unit once.
        n_layers, n_heads: the full head grid.
        n_groups: FFN groups per layer (``group_size`` neurons each); 0 when the FFN is not under
            the budget (heads only).
        head_cost, group_cost: FLOPs of one head and of one group (at the reference length);
            unused (1.0) for heads only, where every unit costs the same.
        min_one_per_layer: keep at least one head (and one group) in every layer (their best
            units lead the order); otherwise a layer may lose all of them (whole-layer skip).
    """

    order: tuple[tuple[str, int, int], ...]
    n_layers: int
    n_heads: int
    n_groups: int = 0
    head_cost: float = 1.0
    group_cost: float = 1.0
    min_one_per_layer: bool = True

    @classmethod
    def from_scores(cls, scores: UnitGates, costs: UnitGates | None = None, min_one_per_layer: bool = True) -> Ranking:
        """Order units by importance ``scores`` (higher = more important; ties by kind, layer,
        index); FFN groups need ``costs`` (FLOPs per unit) to fit budgets."""
        n_layers, n_heads = scores.heads.shape
        n_groups = 0 if scores.ffn is None else scores.ffn.shape[1]
        head_cost = group_cost = 1.0
        if n_groups:
            if costs is None or costs.ffn is None:
                raise ValueError("ranking FFN groups needs their FLOP costs")
            head_cost, group_cost = float(costs.heads.flatten()[0]), float(costs.ffn.flatten()[0])
        values = {"head": scores.heads.detach().double().tolist(), "ffn": [] if scores.ffn is None else scores.ffn.detach().double().tolist()}
        units = [("head", layer, h) for layer in range(n_layers) for h in range(n_heads)]
        units += [("ffn", layer, g) for layer in range(n_layers) for g in range(n_groups)]
        everything = sorted(units, key=lambda u: (-values[u[0]][u[1]][u[2]], u[0] == "ffn", u[1], u[2]))
        if min_one_per_layer:
            leaders: dict[tuple[str, int], tuple[str, int, int]] = {}
            for unit in everything:
                leaders.setdefault(unit[:2], unit)
            lead = set(leaders.values())
            everything = [u for u in everything if u in lead] + [u for u in everything if u not in lead]
        return cls(tuple(everything), n_layers, n_heads, n_groups, head_cost, group_cost, min_one_per_layer)

    @property
    def scope(self) -> str:
        """``heads`` (no FFN units) or ``all``."""
        return "all" if self.n_groups else "heads"

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
        """Units kept for ``budget``: the longest prefix of the order whose FLOPs are <= b * total
        (heads only: round(b * heads), half up), never fewer than the per-layer minimum (one head,
        and one group, per layer) or 1."""
        b = validate_budget(budget)
        if not self.n_groups:
            # floor(x + 0.5) rather than round(): Python's banker's rounding would make 0.5 * 6 -> 3
            # but 0.5 * 10 -> 5 and 2.5 -> 2, which is surprising for users.
            count = min(int(math.floor(b * self.total_units + 0.5)), self.total_units)
        elif b == 1.0:
            count = self.total_units
        else:
            allowance = b * self.total_cost * (1.0 + 1e-9)
            spent, count = 0.0, 0
            for unit in self.order:
                spent += self._unit_cost(unit)
                if spent > allowance:
                    break
                count += 1
        minimum = self.n_layers * (2 if self.n_groups else 1) if self.min_one_per_layer else 1
        return max(minimum, count)

    def _per_layer(self, units: tuple[tuple[str, int, int], ...]) -> KeptUnits:
        heads: list[list[int]] = [[] for _ in range(self.n_layers)]
        groups: list[list[int]] = [[] for _ in range(self.n_layers)]
        for kind, layer, index in units:
            (heads if kind == "head" else groups)[layer].append(index)
        return KeptUnits(heads, groups if self.n_groups else None)

    def kept(self, budget: float) -> KeptUnits:
        """Per layer, the kept heads (and groups) in rank order."""
        return self._per_layer(self.order[: self.count_for_budget(budget)])

    def kept_cost(self, budget: float) -> float:
        """FLOPs of the kept units as a fraction of all prunable FLOPs."""
        return sum(self._unit_cost(u) for u in self.order[: self.count_for_budget(budget)]) / self.total_cost

    def masks(self, budget: float) -> UnitGates:
        """0/1 masks of the kept units: heads (n_layers, n_heads), groups (n_layers, n_groups) or None."""
        return self.kept(budget).masks(self.n_heads, self.n_groups)

    def heads_per_layer(self, budget: float) -> list[int]:
        """Heads kept per layer for ``budget``."""
        return self.kept(budget).heads_per_layer

    def layer_orders(self) -> KeptUnits:
        """Per layer, every head (and group) in rank order (the sorted weight layout)."""
        return self._per_layer(self.order)

    def admission_budgets(self) -> UnitGates:
        """Per unit, the budget at which this order admits it: the middle of its slice of the
        cumulative cost, as a fraction of the total (in (0, 1), increasing along the order).
        Full grids: heads (n_layers, n_heads), FFN groups (n_layers, n_groups) or None."""
        heads = torch.zeros(self.n_layers, self.n_heads, dtype=torch.float64)
        groups = torch.zeros(self.n_layers, self.n_groups, dtype=torch.float64) if self.n_groups else None
        spent, total = 0.0, self.total_cost
        for kind, layer, index in self.order:
            cost = self._unit_cost((kind, layer, index))
            (heads if kind == "head" else groups)[layer, index] = (spent + cost / 2) / total
            spent += cost
        return UnitGates(heads, groups)

    def heads_only(self) -> Ranking:
        """The heads of this order alone (head-only pruning with the FFN whole, for comparisons)."""
        heads = tuple(unit for unit in self.order if unit[0] == "head")
        return Ranking(heads, self.n_layers, self.n_heads, min_one_per_layer=self.min_one_per_layer)

    def to_dict(self) -> dict[str, object]:
        """The stored form: heads only as (layer, head) pairs (the format of every saved ranking),
        with FFN groups as ``scope: all`` with unit triples and costs."""
        if not self.n_groups:
            return {
                "order": [[layer, index] for _, layer, index in self.order],
                "n_layers": self.n_layers,
                "n_heads": self.n_heads,
                "min_one_per_layer": self.min_one_per_layer,
            }
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
    def from_dict(cls, data: dict[str, Any]) -> Ranking:
        """A stored ranking of either form (:meth:`to_dict`), checked."""
        if data.get("scope") == "all":
            order = tuple((str(u[0]), int(u[1]), int(u[2])) for u in data["order"])
            ranking = Ranking(
                order, int(data["n_layers"]), int(data["n_heads"]), int(data["n_groups"]),
                float(data["head_cost"]), float(data["group_cost"]), bool(data["min_one_per_layer"]),
            )
            if not (ranking.head_cost > 0 and ranking.group_cost > 0):
                raise ValueError("unit ranking costs must be positive")
        else:
            order = tuple(("head", int(p[0]), int(p[1])) for p in data["order"])
            ranking = Ranking(order, int(data["n_layers"]), int(data["n_heads"]), min_one_per_layer=bool(data["min_one_per_layer"]))
        expected = {("head", layer, h) for layer in range(ranking.n_layers) for h in range(ranking.n_heads)}
        expected |= {("ffn", layer, g) for layer in range(ranking.n_layers) for g in range(ranking.n_groups)}
        if set(order) != expected or len(order) != len(expected):
            raise ValueError("ranking must list every head (and every FFN group) exactly once")
        return ranking
