import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from budgeted_attention.model.gates import UnitGates
from budgeted_attention.pruning.selection import Ranking

shapes = st.tuples(st.integers(1, 5), st.integers(1, 6))


@settings(max_examples=100, deadline=None)
@given(shape=shapes, seed=st.integers(0, 10_000), b1=st.floats(0.01, 1.0), b2=st.floats(0.01, 1.0), min_one=st.booleans())
def test_kept_sets_are_nested(shape, seed, b1, b2, min_one):
    scores = torch.rand(shape, generator=torch.Generator().manual_seed(seed))
    ranking = Ranking.from_scores(UnitGates(scores), min_one_per_layer=min_one)
    lo, hi = sorted((b1, b2))
    small = {(layer, h) for layer, heads in enumerate(ranking.kept(lo).heads) for h in heads}
    large = {(layer, h) for layer, heads in enumerate(ranking.kept(hi).heads) for h in heads}
    assert small <= large
    if min_one:
        assert all(ranking.kept(lo).heads_per_layer)


@settings(max_examples=50, deadline=None)
@given(shape=shapes, seed=st.integers(0, 10_000), b=st.floats(0.01, 1.0))
def test_count_and_mask_agree(shape, seed, b):
    ranking = Ranking.from_scores(UnitGates(torch.rand(shape, generator=torch.Generator().manual_seed(seed))))
    mask = ranking.masks(b)
    assert mask.ffn is None and int(mask.heads.sum()) == ranking.count_for_budget(b) == sum(ranking.kept(b).heads_per_layer)
    assert ranking.count_for_budget(b) >= shape[0]


def test_top_heads_win_and_empty_layers_allowed_when_asked():
    scores = torch.tensor([[0.9, 0.8, 0.7], [0.1, 0.05, 0.0]])
    ranking = Ranking.from_scores(UnitGates(scores), min_one_per_layer=False)
    assert ranking.kept(0.5).heads == [[0, 1, 2], []]
    forced = Ranking.from_scores(UnitGates(scores))
    assert forced.kept(0.5).heads == [[0, 1], [0]]
    assert forced.count_for_budget(1.0) == 6 and forced.count_for_budget(0.01) == 2


def test_round_trip_and_validation():
    scores = torch.rand(2, 3)
    ranking = Ranking.from_scores(UnitGates(scores))
    assert Ranking.from_dict(ranking.to_dict()) == ranking
    stored = ranking.to_dict()  # heads only: the (layer, head) pairs every saved ranking has
    assert "scope" not in stored and stored["order"][0] == list(ranking.order[0][1:])
    broken = ranking.to_dict()
    broken["order"] = broken["order"][:-1]
    with pytest.raises(ValueError, match="every"):
        Ranking.from_dict(broken)


@settings(max_examples=50, deadline=None)
@given(layers=st.integers(1, 4), heads=st.integers(1, 4), groups=st.integers(0, 3), seed=st.integers(0, 10_000), min_one=st.booleans())
def test_admission_budgets_increase_along_the_order_and_centred_gates_rank_the_same(layers, heads, groups, seed, min_one):
    from budgeted_attention.model.gates import BudgetGates

    gen = torch.Generator().manual_seed(seed)
    scores = UnitGates(torch.rand(layers, heads, generator=gen), torch.rand(layers, groups, generator=gen) if groups else None)
    costs = UnitGates(torch.full((layers, heads), 3.0), torch.full((layers, groups), 5.0) if groups else None)
    ranking = Ranking.from_scores(scores, costs if groups else None, min_one_per_layer=min_one)
    entry = ranking.admission_budgets()
    along = [float((entry.heads if kind == "head" else entry.ffn)[layer, index]) for kind, layer, index in ranking.order]
    assert all(0 < a < b < 1 for a, b in zip(along, along[1:])) and 0 < along[0] and along[-1] < 1
    if not groups:
        assert along == pytest.approx([(k + 0.5) / (layers * heads) for k in range(layers * heads)])
    head_gates, ffn_gates = BudgetGates(layers, heads), BudgetGates(layers, max(groups, 1))
    head_gates.centre(entry.heads)
    if groups:
        ffn_gates.centre(entry.ffn)
    for (kind, layer, index), budget in zip(ranking.order, along):  # each gate is 1/2 at its own entry budget
        gate = (head_gates if kind == "head" else ffn_gates)(budget)[layer, index].detach()
        assert float(gate) == pytest.approx(0.5, abs=1e-5)
    again = Ranking.from_scores(UnitGates(head_gates.importance(), ffn_gates.importance() if groups else None), costs if groups else None, min_one_per_layer=min_one)
    assert again.order == ranking.order
