import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from budgeted_attention.model.gates import UnitGates
from budgeted_attention.pruning.selection import Ranking
from budgeted_attention.pruning.surgery import keep_heads, prune_to_budget, sort_heads
from budgeted_attention.pruning.switching import SlicedModel


def _ranking(model, seed: int, min_one: bool = True) -> Ranking:
    scores = torch.rand(3, 4, generator=torch.Generator().manual_seed(seed))
    return Ranking.from_scores(UnitGates(scores), min_one_per_layer=min_one)


# The fixtures are read-only here, so sharing them across examples is safe.
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(budget=st.floats(0.05, 1.0), seed=st.integers(0, 1000), min_one=st.booleans())
def test_pruned_equals_hard_masked(tiny_model, tiny_ids, budget, seed, min_one):
    ranking = _ranking(tiny_model, seed, min_one)
    pruned = prune_to_budget(tiny_model, ranking, budget)
    assert pruned.config.heads_per_layer == ranking.kept(budget).heads_per_layer
    with torch.no_grad():
        masked = tiny_model(tiny_ids, gates=ranking.masks(budget))
        assert torch.allclose(pruned(tiny_ids), masked, atol=1e-5)


def test_uneven_layers_and_an_empty_layer(tiny_model, tiny_ids):
    kept = [[3, 0, 2], [], [1]]
    mask = torch.zeros(3, 4)
    for layer, heads in enumerate(kept):
        mask[layer, heads] = 1
    pruned = keep_heads(tiny_model, kept)
    assert pruned.config.heads_per_layer == [3, 0, 1]
    assert pruned.blocks[1].attn.qkv_weight.shape[0] == 0
    with torch.no_grad():
        assert torch.allclose(pruned(tiny_ids), tiny_model(tiny_ids, gates=mask), atol=1e-5)


def test_sorted_model_is_function_preserving(tiny_model, tiny_ids):
    ranking = _ranking(tiny_model, 7)
    sorted_model = sort_heads(tiny_model, ranking)
    with torch.no_grad():
        for b in (0.3, 0.7, 1.0):
            assert torch.allclose(sorted_model(tiny_ids, budget=b), tiny_model(tiny_ids, budget=b), atol=1e-5)


def test_sliced_model_serves_every_budget_without_copies(tiny_model, tiny_ids):
    ranking = _ranking(tiny_model, 3)
    served = SlicedModel(tiny_model, ranking)
    pointers = [p.data_ptr() for p in served.parameters()]
    with torch.no_grad():
        for b in (0.25, 0.5, 0.75, 1.0, 0.5):
            served.set_budget(b)
            expected = tiny_model(tiny_ids, gates=ranking.masks(b))
            assert torch.allclose(served(tiny_ids), expected, atol=1e-5)
    assert pointers == [p.data_ptr() for p in served.parameters()]


def test_pruning_rejects_mismatched_ranking(tiny_model):
    with pytest.raises(ValueError, match="ranking"):
        prune_to_budget(tiny_model, Ranking.from_scores(UnitGates(torch.rand(2, 4))), 0.5)
