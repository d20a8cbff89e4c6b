"""The family interface: head identity of pruned/sorted/sliced models and their budget gates."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from budgeted_attention.model.gates import UnitGates
from budgeted_attention.model.family import GatedModel
from budgeted_attention.pruning.selection import Ranking
from budgeted_attention.pruning.surgery import keep_heads, prune_to_budget, sort_heads
from budgeted_attention.pruning.switching import SlicedModel


def _restricted(model, ids, kept, budget):
    """The full model at ``budget`` with every head outside ``kept`` switched off."""
    mask = torch.zeros(model.n_layers, model.n_heads)
    for layer, heads in enumerate(kept):
        mask[layer, heads] = 1.0
    return model(ids, gates=model.gates(budget) * mask)


def test_encoder_implements_the_interface(tiny_model):
    assert isinstance(tiny_model, GatedModel) and tiny_model.family == "encoder"
    assert tiny_model.head_ids == [[0, 1, 2, 3]] * 3 and not tiny_model.is_pruned


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 1000), budget=st.floats(0.05, 0.999))
def test_pruned_model_budget_means_the_full_model_restricted_to_its_heads(tiny_model, tiny_ids, seed, budget):
    ranking = Ranking.from_scores(UnitGates(torch.rand(3, 4, generator=torch.Generator().manual_seed(seed))), min_one_per_layer=False)
    kept = ranking.kept(0.5).heads
    pruned = prune_to_budget(tiny_model, ranking, 0.5)
    with torch.no_grad():
        assert torch.allclose(pruned(tiny_ids, budget=budget), _restricted(tiny_model, tiny_ids, kept, budget), atol=1e-5)


def test_sorted_and_sliced_models_keep_gate_meaning(tiny_model, tiny_ids):
    ranking = Ranking.from_scores(UnitGates(torch.rand(3, 4, generator=torch.Generator().manual_seed(5))))
    sorted_model = sort_heads(tiny_model, ranking)
    served = SlicedModel(tiny_model, ranking)
    served.set_budget(0.5)
    kept = ranking.kept(0.5).heads
    with torch.no_grad():
        for b in (0.2, 0.7):
            assert torch.allclose(sorted_model(tiny_ids, budget=b), tiny_model(tiny_ids, budget=b), atol=1e-5)
            assert torch.allclose(served(tiny_ids, budget=b), _restricted(tiny_model, tiny_ids, kept, b), atol=1e-5)


def test_the_old_positional_indexing_would_have_been_wrong(tiny_model, tiny_ids):
    """Guard against a test that cannot fail: positions differ from head ids here."""
    pruned = keep_heads(tiny_model, [[3, 1], [2], [0, 3]])
    with torch.no_grad():
        right = _restricted(tiny_model, tiny_ids, [[3, 1], [2], [0, 3]], 0.4)
        positional = torch.zeros(3, 4)
        positional[0, :2] = positional[1, :1] = positional[2, :2] = 1.0
        wrong = tiny_model(tiny_ids, gates=tiny_model.gates(0.4) * positional)
        assert torch.allclose(pruned(tiny_ids, budget=0.4), right, atol=1e-5)
        assert not torch.allclose(right, wrong, atol=1e-3)


def test_full_grid_gates_are_required(tiny_model, tiny_ids):
    pruned = keep_heads(tiny_model, [[0], [1], [2]])
    with pytest.raises(ValueError, match="full-grid shape"):
        pruned(tiny_ids, gates=torch.ones(3, 1))
    with pytest.raises(ValueError, match="no longer has head"):
        pruned.keep_units([[1], [1], [2]])


def test_token_type_ids_are_refused_when_the_model_cannot_use_them(tiny_model, tiny_ids):
    with torch.no_grad():
        assert torch.equal(tiny_model(tiny_ids, None, torch.zeros_like(tiny_ids)), tiny_model(tiny_ids))
    with pytest.raises(ValueError, match="token_type_ids"):
        tiny_model(tiny_ids, None, torch.ones_like(tiny_ids))
