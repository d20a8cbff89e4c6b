"""CompactBert: the lean executor of a (pruned) BERT-family classifier (BERT, RoBERTa, XLM-R, ELECTRA) computes the module tree's logits."""

from unittest.mock import patch

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed")
import transformers  # noqa: E402
from transformers import BertConfig, BertForSequenceClassification  # noqa: E402

from budgeted_attention.errors import BAAError  # noqa: E402
from budgeted_attention.model.gates import UnitGates  # noqa: E402
from budgeted_attention.hf.bert import GatedBertClassifier  # noqa: E402
from budgeted_attention.hf.compact import CompactBert  # noqa: E402
from budgeted_attention.model.router import RouterConfig  # noqa: E402


def _tiny_bert(ffn_group_size=0, **overrides):
    torch.manual_seed(0)
    # initializer_range 0.2 (BERT's default is 0.02): attention far from uniform, so a wrong
    # scale or swapped q/k moves the logits well past the tolerance.
    settings = dict(vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=16,
                    num_labels=3, attn_implementation="sdpa", hidden_act="gelu", initializer_range=0.2)
    settings.update(overrides)
    return GatedBertClassifier(BertForSequenceClassification(BertConfig(**settings)).eval(), ffn_group_size=ffn_group_size).eval()


def _inputs():
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 99, (4, 9), generator=generator)
    mask = torch.ones_like(ids)
    mask[0, 5:] = 0
    mask[2, 2:] = 0
    mask[3] = 0  # a fully padded row: the same (finite) logits on both paths
    segments = torch.zeros_like(ids)
    segments[:, 4:] = 1
    return ids, mask, segments


def _assert_same_logits(model, compact):
    ids, mask, segments = _inputs()
    with torch.no_grad():
        for attention_mask, token_type_ids in ((None, None), (mask, None), (mask, segments)):
            expected = model(ids, attention_mask, token_type_ids)
            assert torch.allclose(compact(ids, attention_mask, token_type_ids), expected, atol=1e-5), (attention_mask, token_type_ids)


def test_dense_compact_copy_equals_the_unmodified_transformers_model():
    model = _tiny_bert()
    compact = model.inference_module()
    assert isinstance(compact, CompactBert)
    reference = model.library_references()["transformers"]
    ids, mask, segments = _inputs()
    with torch.no_grad():
        assert torch.allclose(compact(ids, mask, segments), reference(ids, mask, segments), atol=1e-5)
        # Negative control: the attention scale matters at this initialisation.
        for layer in compact.layers:
            layer.attend_options["scale"] *= 2
        assert (compact(ids, mask, segments) - reference(ids, mask, segments)).abs().max() > 1e-2


@pytest.mark.parametrize("act", ["gelu", "relu", "gelu_new"])
def test_pruned_compact_copy_equals_the_pruned_model_with_uneven_empty_and_one_group_layers(act):
    """Uneven heads, an attention layer without heads, an FFN reduced to one group and one without neurons."""
    model = _tiny_bert(ffn_group_size=4, hidden_act=act)
    with torch.no_grad():
        model.keep_units([[0, 2, 3], [], [1]], [[1], [0, 1, 2, 3], []])
    assert model.heads_per_layer == [3, 0, 1] and model.ffn_widths() == [4, 16, 0]
    compact = model.inference_module()
    assert [layer.n_heads for layer in compact.layers] == [3, 0, 1] and [layer.ffn_width for layer in compact.layers] == [4, 16, 0]
    _assert_same_logits(model, compact)
    full = _tiny_bert(ffn_group_size=4, hidden_act=act).inference_module()
    ids, mask, _ = _inputs()
    with torch.no_grad():  # pruning changed the logits: the comparison above is not vacuous
        assert not torch.allclose(full(ids, mask), compact(ids, mask), atol=1e-4)


def test_compact_copy_follows_the_active_prefixes_of_a_sorted_model():
    model = _tiny_bert(ffn_group_size=4)
    model.set_active([2, 4, 0], [1, 4, 0])
    compact = model.inference_module()
    assert [layer.n_heads for layer in compact.layers] == [2, 4, 0]
    _assert_same_logits(model, compact)


def test_compact_copy_is_a_snapshot_that_knows_when_it_is_stale_and_moves_with_to():
    model = _tiny_bert()
    compact = model.inference_module()
    assert compact.is_current(model) and not list(compact.state_dict())  # weights are saved with the model only
    with torch.no_grad():
        model.hf.classifier.bias.add_(1.0)  # values written in place
    assert not compact.is_current(model)
    compact = model.inference_module()
    with torch.no_grad():
        model.keep_units([[0], [1], [2]])  # surgery replaces parameters
    assert [layer.n_heads for layer in compact.layers] == [4, 4, 4] and not compact.is_current(model)
    assert all(buffer.dtype == torch.float64 for buffer in compact.to(torch.float64).buffers())


def test_decoder_configs_are_refused_by_name():
    model = _tiny_bert(is_decoder=True)
    assert "decoder config" in model.lean_unsupported()
    with pytest.raises(BAAError, match="the bert family's lean executor does not run a decoder config"):
        model.inference_module()


def test_too_long_inputs_are_refused_naming_the_length():
    compact = _tiny_bert(max_position_embeddings=16).inference_module()
    with pytest.raises(ValueError, match="sequence length 17 exceeds the model's max_len 16"):
        compact(torch.zeros(1, 17, dtype=torch.long))


@pytest.mark.parametrize("kind", ["roberta", "xlm-roberta", "electra"])
def test_roberta_xlmr_and_electra_run_in_the_lean_executor(kind):
    """RoBERTa-style positions (counted from the padding id over real tokens, so padding moves
    them), ELECTRA's embedding projection, and both heads (dense, tanh or GELU, out_proj)."""
    torch.manual_seed(0)
    names = {"roberta": "Roberta", "xlm-roberta": "XLMRoberta", "electra": "Electra"}[kind]
    extra = {"embedding_size": 16} if kind == "electra" else {"max_position_embeddings": 20}
    config = getattr(transformers, f"{names}Config")(
        vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=16, num_labels=3,
        pad_token_id=1, attn_implementation="sdpa", initializer_range=0.2, **extra,
    )
    model = GatedBertClassifier(getattr(transformers, f"{names}ForSequenceClassification")(config).eval(), ffn_group_size=4).eval()
    ids, mask, _ = _inputs()
    ids = ids.masked_fill(mask == 0, 1)  # padded with the padding id, as a tokenizer does
    with torch.no_grad():
        for attention_mask in (None, mask):
            torch.testing.assert_close(model.inference_module()(ids, attention_mask), model(ids, attention_mask), atol=1e-5, rtol=1e-5)
        model.keep_units([[0, 2], [], [1, 3]], [[1], [0, 1, 2, 3], []])
        torch.testing.assert_close(model.inference_module()(ids, mask), model(ids, mask), atol=1e-5, rtol=1e-5)


def test_a_router_is_refused_by_name_unless_the_executor_is_routed():
    routed = _tiny_bert()
    routed.attach_router(RouterConfig())
    with pytest.raises(BAAError, match="the bert family's lean executor does not run a per-input router's decision"):
        routed.inference_module()
    assert isinstance(routed.inference_module(routed=True), CompactBert)


def test_sliced_bert_serves_every_budget_through_the_lean_copy():
    from budgeted_attention.model.gates import UnitGates  # noqa: PLC0415
    from budgeted_attention.pruning.selection import Ranking  # noqa: PLC0415
    from budgeted_attention.pruning.switching import SlicedModel  # noqa: PLC0415

    model = _tiny_bert(ffn_group_size=4)
    generator = torch.Generator().manual_seed(5)
    scores = UnitGates(torch.rand(3, 4, generator=generator), torch.rand(3, 4, generator=generator))
    ranking = Ranking.from_scores(scores, UnitGates(torch.full((3, 4), 3.0), torch.full((3, 4), 2.0)), min_one_per_layer=False)
    sliced = SlicedModel(model, ranking)  # not .eval(): the wrapped model's mode decides
    module_tree = SlicedModel(model, ranking, lean=False).eval()
    assert isinstance(sliced.lean, CompactBert) and module_tree.lean is None
    ids, mask, _ = _inputs()
    with torch.no_grad():
        for budget in (0.25, 0.5, 1.0):
            sliced.set_budget(budget)
            module_tree.set_budget(budget)
            kept = ranking.kept(budget)
            assert torch.allclose(sliced(ids, mask), module_tree(ids, mask), atol=1e-5)
            assert [layer.n_heads for layer in sliced.lean.layers] == kept.heads_per_layer
            assert [layer.ffn_width for layer in sliced.lean.layers] == [4 * g for g in kept.groups_per_layer]
            pruned = model.pruned_copy(kept.heads, kept.groups).eval()
            assert torch.allclose(sliced(ids, mask), pruned(ids, mask), atol=1e-5)
    sliced.set_budget(0.5)
    with torch.no_grad(), patch.object(CompactBert, "forward", autospec=True, side_effect=CompactBert.forward) as spy:
        sliced(ids, mask)  # hard selections in eval mode without autograd: the lean copy
    assert spy.call_count == 1
    with torch.no_grad(), patch.object(CompactBert, "forward", side_effect=AssertionError("lean copy used")):
        sliced(ids, mask, budget=0.5)  # soft gates run the module tree
        sliced.train()
        sliced(ids, mask)  # so does training mode
    with torch.enable_grad():  # and autograd
        sliced.eval()
        assert sliced(ids, mask).requires_grad


def test_lean_copy_refuses_active_counts_it_does_not_store():
    compact = _tiny_bert().inference_module()
    with pytest.raises(ValueError, match="active heads 5 / FFN neurons 16 outside the stored 4 / 16"):
        compact.set_active([5, 4, 4])
    with pytest.raises(ValueError, match=r"one head count \(and FFN width\) per layer \(3\)"):
        compact.set_active([1, 1])


def test_sliced_bert_keeps_its_lean_copy_in_step_with_the_model():
    from budgeted_attention.pruning.selection import Ranking  # noqa: PLC0415
    from budgeted_attention.pruning.switching import SlicedModel  # noqa: PLC0415

    model = _tiny_bert()
    sliced = SlicedModel(model, Ranking.from_scores(UnitGates(torch.rand(3, 4, generator=torch.Generator().manual_seed(2)))))
    ids, mask, _ = _inputs()
    with torch.no_grad():
        sliced.set_budget(0.5)
        first = sliced.lean
        sliced.model.set_active([1, 2, 3])  # set directly on the model: the copy follows
        assert torch.allclose(sliced(ids, mask), sliced.model(ids, mask), atol=1e-5)
        assert [layer.n_heads for layer in sliced.lean.layers] == [1, 2, 3] and sliced.lean is first
        sliced.model.hf.classifier.bias.add_(1.0)  # changed values: the copy is rebuilt
        assert torch.allclose(sliced(ids, mask), sliced.model(ids, mask), atol=1e-5)
        assert sliced.lean is not first and [layer.n_heads for layer in sliced.lean.layers] == [1, 2, 3]


def test_lean_copy_widths_stay_when_not_given():
    compact = _tiny_bert(ffn_group_size=4).inference_module()
    compact.set_active([4, 4, 4], [8, 4, 0])
    compact.set_active([1, 2, 3])
    assert [layer.ffn_width for layer in compact.layers] == [8, 4, 0] and [layer.n_heads for layer in compact.layers] == [1, 2, 3]


@pytest.mark.parametrize("mode", ["capped", "learned"])
def test_routed_inputs_through_the_copy_equal_the_routed_model(mode):
    from budgeted_attention.model.routed_inference import RoutedInference

    model = _tiny_bert(ffn_group_size=4)
    router = model.attach_router(RouterConfig(mode=mode))
    with torch.no_grad():  # distinct head sets per input
        router.scorer.weight.normal_(std=2.0)
        router.controller[2].weight.normal_(std=2.0)
    model.eval()
    runtime = RoutedInference(model)
    assert isinstance(runtime.lean, CompactBert)
    ids, mask, segments = _inputs()
    budget = 0.5 if mode == "capped" else None
    sets = set()
    with torch.no_grad():
        for i in range(ids.shape[0]):
            one, one_mask, one_segments = ids[i : i + 1], mask[i : i + 1], segments[i : i + 1]
            expected = model(one, one_mask, one_segments, budget=budget)
            assert torch.allclose(runtime(one, one_mask, one_segments, budget=budget), expected, atol=1e-5)
            sets.add(tuple(runtime.head_sets(one, one_mask, budget=budget)))
    gapped = any(s[-1] - s[0] + 1 != len(s) for layer_sets in sets for s in layer_sets)
    assert len(sets) > 1 and (sum(layer._gathered.misses for layer in runtime.lean.layers) > 0) == gapped
    with torch.inference_mode():  # a stale copy rebuilt under inference mode still has versioned tensors to cache from
        model.hf.classifier.bias.add_(0.0)
        runtime(ids[:1], mask[:1], segments[:1], budget=budget)
    assert not runtime.lean.layers[0].qkv_weight.is_inference()
