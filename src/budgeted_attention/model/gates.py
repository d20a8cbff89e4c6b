"""The paper's budget-conditioned head gates: g(b) = sigmoid(a + softplus(s) * logit(b)).

Gates depend only on the requested budget b, never on the input, which is what allows a
budget to be turned into a structurally smaller model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from budgeted_attention.budget import validate_budget

# softplus(s) = 1 at initialisation, so with a = 0 every gate starts as g(b) = b and C(b) = b.
_UNIT_SLOPE_RAW = math.log(math.e - 1.0)


class BudgetGates(nn.Module):
    """One gate per unit of a (layer, unit) grid, monotone non-decreasing in the budget.

    Units are attention heads (``model.gates``) or feed-forward neuron groups (``model.ffn_gates``).
    Parameters ``bias`` (a) and ``slope_raw`` (s) have shape (n_layers, n_units).
    ``g(1) = 1`` exactly (logit(1) = +inf); ``g(b) -> 0`` as ``b -> 0`` because the slope is positive.
    """

    def __init__(self, n_layers: int, n_heads: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(n_layers, n_heads))
        self.slope_raw = nn.Parameter(torch.full((n_layers, n_heads), _UNIT_SLOPE_RAW))

    def slope(self) -> torch.Tensor:
        """softplus(s) >= 0, shape (n_layers, n_heads)."""
        return nn.functional.softplus(self.slope_raw)

    def forward(self, budget: float) -> torch.Tensor:
        """Gate values for ``budget`` in (0, 1], shape (n_layers, n_heads), values in [0, 1]."""
        b = validate_budget(budget)
        if b == 1.0:
            # logit(1) = inf; define the limit exactly so that b = 1 is the dense model.
            return torch.ones_like(self.bias)
        logit_b = math.log(b) - math.log1p(-b)
        return torch.sigmoid(self.bias + self.slope() * logit_b)

    @torch.no_grad()
    def centre(self, budgets: torch.Tensor, slope: float = 3.0) -> None:
        """Set each gate to g(b) = sigmoid(slope * (logit(b) - logit(budgets))): 1/2 at its unit's
        entry budget ``budgets`` (n_layers, n_heads), values in (0, 1), and the area under g(b)
        orders the units as ``budgets`` do. With entry budgets spread evenly over the cost, the
        expected cost C(b) is within 0.015 of b at slope 3 (0.07 at slope 1: at b = 0.25,
        C = 0.32), so the budget term starts near zero as with the zero init."""
        if budgets.shape != self.bias.shape:
            raise ValueError(f"gate entry budgets must have shape {tuple(self.bias.shape)}, got {tuple(budgets.shape)}")
        if not (0.0 < float(budgets.min()) and float(budgets.max()) < 1.0) or not slope > 0:
            raise ValueError("gate entry budgets must lie in (0, 1) and the slope must be > 0")
        b = budgets.to(torch.float64)
        self.bias.copy_((-slope * (b.log() - (-b).log1p())).to(self.bias.dtype))
        self.slope_raw.fill_(math.log(math.expm1(slope)))

    @torch.no_grad()
    def importance(self, grid_points: int = 20) -> torch.Tensor:
        """Budget-invariant head score: the mean gate over a budget grid (area under g(b)).

        One score per head gives one global order, so the kept sets of all budgets are nested.
        Shape (n_layers, n_heads).
        """
        grid = [(i + 0.5) / grid_points for i in range(grid_points)]
        return torch.stack([self(b) for b in grid]).mean(dim=0)


@dataclass(frozen=True)
class UnitGates:
    """Gate values (or masks, importance scores, FLOP costs) over every gated unit of a model.

    The full grid of the unpruned model, whatever the physical layout:

    * ``heads``: (n_layers, n_heads), one value per attention head;
    * ``ffn``: (n_layers, n_groups), one value per feed-forward neuron group, or None when the
      feed-forward blocks are not under the budget (``budget_scope: heads``, the paper).
    """

    heads: torch.Tensor
    ffn: torch.Tensor | None = None

    def parts(self) -> list[torch.Tensor]:
        """The non-empty tensors, heads first."""
        return [self.heads] if self.ffn is None else [self.heads, self.ffn]

    def map(self, fn) -> UnitGates:
        """``fn`` applied to every part (None stays None)."""
        return UnitGates(fn(self.heads), None if self.ffn is None else fn(self.ffn))


@dataclass(frozen=True)
class LayerSelection:
    """What one layer runs in one forward pass, passed down to its attention and FFN.

    The kind is the field that is set (at most one of the three head fields; none: every active
    head, ungated, the dense path):

    * ``gates``: soft gates of the active heads, (active,) or per input (batch, active);
    * ``chosen``: a per-input hard selection, (batch, active) boolean: only the chosen heads are
      computed (inputs grouped by head set), a per-input router's decision for a batch;
    * ``heads``: the stored positions (ascending) the whole batch runs, one input's decision.

    ``ffn``: gates of the active FFN groups, (active groups,), or None (ungated).
    """

    gates: torch.Tensor | None = None
    chosen: torch.Tensor | None = None
    heads: tuple[int, ...] | None = None
    ffn: torch.Tensor | None = None


DENSE = LayerSelection()


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
