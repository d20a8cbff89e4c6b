import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from budgeted_attention.model.cost import CostModel, estimated_cost
from budgeted_attention.model.gates import BudgetGates

budgets = st.floats(min_value=1e-4, max_value=1.0, allow_nan=False)
params = st.floats(min_value=-6.0, max_value=6.0, allow_nan=False)


def _gates(a: float, s: float) -> BudgetGates:
    gates = BudgetGates(1, 1).requires_grad_(False)
    with torch.no_grad():
        gates.bias.fill_(a)
        gates.slope_raw.fill_(s)
    return gates


@settings(max_examples=200, deadline=None)
@given(a=params, s=params, b1=budgets, b2=budgets)
def test_gate_is_monotone_in_budget(a, s, b1, b2):
    lo, hi = sorted((b1, b2))
    gates = _gates(a, s)
    assert float(gates(lo)) <= float(gates(hi)) + 1e-6


@settings(max_examples=100, deadline=None)
@given(a=params, s=params, b=budgets)
def test_gate_in_unit_interval_and_one_at_full_budget(a, s, b):
    gates = _gates(a, s)
    assert 0.0 <= float(gates(b)) <= 1.0
    assert float(gates(1.0)) == 1.0


def test_initial_gates_equal_budget():
    gates = BudgetGates(2, 3)
    for b in (0.1, 0.37, 0.9):
        assert torch.allclose(gates(b), torch.full((2, 3), b), atol=1e-6)


@torch.no_grad()
def test_cost_is_one_at_full_budget_and_vanishes_at_zero(tiny_model):
    costs = CostModel(tiny_model.config, seq_len=11).unit_costs()
    assert float(estimated_cost(tiny_model.unit_gates(1.0), costs)) == pytest.approx(1.0)
    previous = 1.0
    for b in (0.5, 1e-2, 1e-4, 1e-8, 1e-12):
        value = float(estimated_cost(tiny_model.unit_gates(b), costs))
        assert value <= previous + 1e-9
        previous = value
    assert previous < 0.05


@pytest.mark.parametrize("bad", [0.0, -1.0, 1.5, math.nan, math.inf])
def test_gates_reject_invalid_budget(bad):
    with pytest.raises(ValueError, match="budget"):
        BudgetGates(1, 1)(bad)


def test_importance_ranks_by_area_under_gate_curve():
    gates = BudgetGates(1, 3)
    with torch.no_grad():
        gates.bias.copy_(torch.tensor([[-3.0, 0.0, 3.0]]))
    score = gates.importance()
    assert score[0, 2] > score[0, 1] > score[0, 0]


def test_centred_gates_are_one_half_at_their_entry_budget_and_keep_the_expected_cost_near_b():
    entry = (torch.arange(20, dtype=torch.float64) + 0.5).view(4, 5) / 20
    gates = BudgetGates(4, 5)
    gates.centre(entry)
    with torch.no_grad():
        for b in (0.125, 0.375, 0.625):  # a unit's gate is 1/2 exactly at its own entry budget
            unit = int(b * 20 - 0.5)
            assert float(gates(b).flatten()[unit]) == pytest.approx(0.5, abs=1e-6)
        for b in (0.25, 0.5, 0.75):  # C(b) with equal costs: the mean gate, near b
            assert float(gates(b).mean()) == pytest.approx(b, abs=0.02)
        assert torch.equal(gates(1.0), torch.ones(4, 5))
    with pytest.raises(ValueError, match="shape"):
        gates.centre(entry.view(5, 4))
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        gates.centre(torch.ones(4, 5))
