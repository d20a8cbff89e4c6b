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
