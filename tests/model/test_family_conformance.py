"""Every registered model family honours the one GatedModel interface.

Runs over :data:`budgeted_attention.model.registry.FAMILIES`: a family registered without a tiny
builder here fails, so a new family gets the whole check, not a subset.
"""

from __future__ import annotations

import copy

import pytest
import torch

from budgeted_attention import checkpoint
from budgeted_attention.errors import BAAError
from budgeted_attention.model.config import ModelConfig
from budgeted_attention.model.registry import FAMILIES, families_with, get_family
from budgeted_attention.pruning.selection import Ranking
from budgeted_attention.pruning.surgery import prune_to_budget, sort_heads
from budgeted_attention.pruning.switching import SlicedModel
from conftest import randomize_gates

SEQ = 9


def _encoder():
    from budgeted_attention.model.transformer import EncoderClassifier

    return EncoderClassifier(ModelConfig(vocab_size=31, n_classes=3, max_len=16, d_model=16, n_layers=2, n_heads=4, d_ff=32, ffn_group_size=8))


def _decoder():
    from budgeted_attention.model.decoder import CausalLM, DecoderConfig

    return CausalLM(DecoderConfig(vocab_size=31, n_classes=31, max_len=16, d_model=16, n_layers=2, n_heads=4, d_ff=32, ffn_group_size=8))


def _bert():
    transformers = pytest.importorskip("transformers")
    from budgeted_attention.hf.bert import GatedBertClassifier

    cfg = transformers.BertConfig(
        vocab_size=1100, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=32, num_labels=3,
        max_position_embeddings=16, attn_implementation="sdpa",
    )
    return GatedBertClassifier(transformers.BertForSequenceClassification(cfg), ffn_group_size=8)


def _tiny_gemma():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Gemma3TextConfig(
        vocab_size=31, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        intermediate_size=32, max_position_embeddings=16, sliding_window=4, query_pre_attn_scalar=8,
        layer_types=["sliding_attention", "full_attention"], attn_implementation="sdpa",
    )
    return transformers.Gemma3ForCausalLM(cfg)


def _hf_decoder():
    from budgeted_attention.hf.decoder import GatedDecoderLM

    return GatedDecoderLM(_tiny_gemma(), ffn_group_size=8)


def _hf_decoder_classifier():
    from budgeted_attention.hf.decoder_classifier import GatedDecoderClassifier

    return GatedDecoderClassifier(_tiny_gemma(), 3, ffn_group_size=8)


TINY = {"encoder": _encoder, "decoder": _decoder, "bert": _bert, "hf-decoder": _hf_decoder, "hf-decoder-classifier": _hf_decoder_classifier}


def test_every_registered_family_has_a_tiny_builder_here():
    assert set(TINY) == set(FAMILIES)


@pytest.fixture(params=list(FAMILIES))
def family(request):
    torch.manual_seed(0)
    model = TINY[request.param]()
    randomize_gates(model)
    if model.ffn_gates is not None:
        with torch.no_grad():
            gen = torch.Generator().manual_seed(1)
            model.ffn_gates.bias.copy_(torch.randn(model.ffn_gates.bias.shape, generator=gen))
    return request.param, model.eval()


def _ids(model, batch: int = 3) -> torch.Tensor:
    low = model.first_ordinary_id()
    return torch.randint(low, model.input_embedding().num_embeddings, (batch, SEQ), generator=torch.Generator().manual_seed(2))


def test_class_and_registry_agree(family):
    name, model = family
    assert model.family == name
    assert get_family(name).load_class() is type(model)
    assert get_family(name).supports("routing") == type(model).supports_routing
    assert get_family(name).supports("ffn_units") == model.has_ffn_units


def test_forward_soft_budget_and_bad_budget(family):
    _, model = family
    ids = _ids(model)
    with torch.no_grad():
        dense = model(ids)
        assert dense.shape[0] == ids.shape[0] and torch.isfinite(dense).all()
        torch.testing.assert_close(model(ids, budget=1.0), dense)
        assert not torch.allclose(model(ids, budget=0.3), dense)
    for bad in (0.0, 1.5, float("nan")):
        with pytest.raises(BAAError, match="budget"):
            model(ids, budget=bad)


def test_hard_selection_prune_and_switch_agree(family):
    _, model = family
    ids = _ids(model)
    ranking = Ranking.from_scores(model.unit_importance(), model.unit_costs(SEQ))
    sliced = SlicedModel(sort_heads(copy.deepcopy(model), ranking), ranking)
    with torch.no_grad():
        for budget in (0.3, 0.6, 1.0):
            masked = model(ids, gates=ranking.masks(budget))
            pruned = prune_to_budget(copy.deepcopy(model), ranking, budget)
            assert pruned.is_pruned == (budget < 1.0)
            torch.testing.assert_close(pruned(ids), masked, atol=1e-5, rtol=1e-5)
            sliced.set_budget(budget)
            torch.testing.assert_close(sliced(ids), masked, atol=1e-5, rtol=1e-5)


def test_save_load_round_trip_of_a_pruned_model(family, tmp_path):
    _, model = family
    ids = _ids(model)
    ranking = Ranking.from_scores(model.unit_importance(), model.unit_costs(SEQ))
    pruned = prune_to_budget(copy.deepcopy(model), ranking, 0.5)
    path = checkpoint.save_model(pruned, tmp_path / "m.safetensors")
    loaded, _ = checkpoint.load_model(path)
    assert loaded.heads_per_layer == pruned.heads_per_layer and loaded.groups_per_layer == pruned.groups_per_layer
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(ids), pruned(ids), atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(loaded(ids, budget=0.4), pruned(ids, budget=0.4), atol=1e-6, rtol=1e-6)


def test_lean_executor_equals_the_module_tree(family):
    name, model = family
    ids = _ids(model)
    mask = torch.ones_like(ids)
    mask[-1, SEQ // 2 :] = 0
    ranking = Ranking.from_scores(model.unit_importance(), model.unit_costs(SEQ))
    pruned = prune_to_budget(copy.deepcopy(model), ranking, 0.5)
    if not get_family(name).supports("lean"):
        with pytest.raises(BAAError, match=f"the {name} family's lean executor does not run"):
            pruned.inference_module()
        return
    lean = pruned.inference_module()
    with torch.no_grad():
        torch.testing.assert_close(lean(ids, mask), pruned(ids, mask), atol=1e-5, rtol=1e-5)


def test_onnx_export_where_capable(family, tmp_path):
    name, model = family
    pytest.importorskip("onnx")
    from budgeted_attention.export.onnx import check_graph, export_model

    if name not in families_with("onnx"):
        with pytest.raises(BAAError, match=f"ONNX export needs .*this is a '{name}' model"):
            export_model(model, tmp_path / "m.onnx")
        return
    pytest.importorskip("onnxruntime")

    ranking = Ranking.from_scores(model.unit_importance(), model.unit_costs(SEQ))
    pruned = prune_to_budget(copy.deepcopy(model), ranking, 0.5)
    path = export_model(pruned, tmp_path / "m.onnx")
    assert check_graph(pruned, path) < 1e-4


def test_first_ordinary_id_is_not_special(family):
    """The token-id rule of synthetic inputs comes from the model: never the pad id."""
    _, model = family
    assert 0 <= model.pad_id < model.vocab_size == model.input_embedding().num_embeddings
    assert model.first_ordinary_id() > model.pad_id


def test_per_input_selection_of_the_wrong_head_count_is_refused():
    """A (batch, n) boolean selection must cover the layer's active heads, not fewer."""
    from budgeted_attention.model.gates import LayerSelection
    from budgeted_attention.model.heads import attend_selection

    x = torch.randn(2, 5, 8)
    weights = (torch.randn(4 * 3 * 2, 8), torch.zeros(4 * 3 * 2), torch.randn(4 * 2, 8))
    with pytest.raises(ValueError, match=r"head selection must have shape \(2, 4\)"):
        attend_selection(x, weights, torch.zeros(8), 2, 4, LayerSelection(chosen=torch.ones(2, 2, dtype=torch.bool)))


def test_first_ordinary_id_skips_a_pad_id_above_the_special_ids():
    from budgeted_attention.model.transformer import EncoderClassifier

    model = EncoderClassifier(ModelConfig(vocab_size=31, n_classes=3, max_len=16, d_model=16, n_layers=1, n_heads=2, d_ff=16, pad_id=5))
    assert model.first_ordinary_id() == 6
