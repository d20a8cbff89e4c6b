import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from budgeted_attention.pruning.selection import HeadRanking

shapes = st.tuples(st.integers(1, 5), st.integers(1, 6))


@settings(max_examples=100, deadline=None)
@given(shape=shapes, seed=st.integers(0, 10_000), b1=st.floats(0.01, 1.0), b2=st.floats(0.01, 1.0), min_one=st.booleans())
def test_kept_sets_are_nested(shape, seed, b1, b2, min_one):
    scores = torch.rand(shape, generator=torch.Generator().manual_seed(seed))
    ranking = HeadRanking.from_scores(scores, min_one_per_layer=min_one)
    lo, hi = sorted((b1, b2))
    small = {(layer, h) for layer, heads in enumerate(ranking.kept_heads(lo)) for h in heads}
    large = {(layer, h) for layer, heads in enumerate(ranking.kept_heads(hi)) for h in heads}
    assert small <= large
    if min_one:
        assert all(ranking.heads_per_layer(lo))


@settings(max_examples=50, deadline=None)
@given(shape=shapes, seed=st.integers(0, 10_000), b=st.floats(0.01, 1.0))
def test_count_and_mask_agree(shape, seed, b):
    ranking = HeadRanking.from_scores(torch.rand(shape, generator=torch.Generator().manual_seed(seed)))
    mask = ranking.mask(b)
    assert int(mask.sum()) == ranking.count_for_budget(b) == sum(ranking.heads_per_layer(b))
    assert ranking.count_for_budget(b) >= shape[0]


def test_top_heads_win_and_empty_layers_allowed_when_asked():
    scores = torch.tensor([[0.9, 0.8, 0.7], [0.1, 0.05, 0.0]])
    ranking = HeadRanking.from_scores(scores, min_one_per_layer=False)
    assert ranking.kept_heads(0.5) == [[0, 1, 2], []]
    forced = HeadRanking.from_scores(scores)
    assert forced.kept_heads(0.5) == [[0, 1], [0]]
    assert forced.count_for_budget(1.0) == 6 and forced.count_for_budget(0.01) == 2


def test_round_trip_and_validation():
    ranking = HeadRanking.from_scores(torch.rand(2, 3))
    assert HeadRanking.from_dict(ranking.to_dict()) == ranking
    broken = ranking.to_dict()
    broken["order"] = broken["order"][:-1]
    with pytest.raises(ValueError, match="every"):
        HeadRanking.from_dict(broken)
