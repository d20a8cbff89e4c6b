"""CompactEncoder: the lean executor of our encoder computes the model's logits."""

from unittest.mock import patch

import pytest
import torch

from budgeted_attention.model.gates import UnitGates
from budgeted_attention.errors import BAAError
from budgeted_attention.model.compact import CompactEncoder
from budgeted_attention.model.router import RouterConfig
from budgeted_attention.model.transformer import EncoderClassifier
from budgeted_attention.pruning.selection import Ranking
from budgeted_attention.pruning.switching import SlicedModel
from conftest import tiny_config


def _encoder(**overrides):
    torch.manual_seed(0)
    model = EncoderClassifier(tiny_config(**overrides))
    with torch.no_grad():  # non-zero output biases: an empty sub-layer's constant is exercised
        for block in model.blocks:
            block.attn.out_bias.normal_(std=0.1)
            if block.has_ffn:
                block.ffn.fc2.bias.normal_(std=0.1)
    return model.eval()


def _inputs():
    ids = torch.randint(0, 29, (4, 11), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    mask[2, 3:] = 0
    return ids, mask


def _assert_same(model, compact):
    ids, mask = _inputs()
    with torch.no_grad():
        for attention_mask in (None, mask):
            assert torch.allclose(compact(ids, attention_mask), model(ids, attention_mask), atol=1e-5)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_compact_copy_equals_the_pruned_encoder_with_empty_sub_layers(pooling):
    model = _encoder(pooling=pooling, ffn_group_size=12)
    with torch.no_grad():
        model.keep_units([[0, 2, 3], [], [1]], [[1], [0, 1, 2, 3], []])
    compact = model.inference_module()
    assert isinstance(compact, CompactEncoder)
    assert [layer.n_heads for layer in compact.layers] == [3, 0, 1] and [layer.ffn_width for layer in compact.layers] == [12, 48, 0]
    _assert_same(model, compact)
    ids, mask = _inputs()
    with torch.no_grad():  # surgery changed the logits: the comparison above is not vacuous
        assert not torch.allclose(_encoder(pooling=pooling, ffn_group_size=12).inference_module()(ids, mask), compact(ids, mask), atol=1e-4)


def test_compact_copy_follows_active_prefixes_and_models_without_ffn():
    model = _encoder(ffn_group_size=12)
    model.set_active([2, 4, 0], [1, 4, 0])
    _assert_same(model, model.inference_module())
    attention_only = _encoder(d_ff=0)
    _assert_same(attention_only, attention_only.inference_module())


def test_compact_copy_shares_weights_and_knows_when_it_is_stale():
    model = _encoder()
    compact = model.inference_module()
    assert compact.layers[0].qkv_weight.data_ptr() == model.blocks[0].attn.qkv_weight.data_ptr()
    assert not list(compact.state_dict()) and compact.is_current(model)
    with torch.no_grad():
        model.classifier.bias.add_(1.0)
    assert not compact.is_current(model)


def test_sliced_encoder_serves_through_the_lean_copy():
    model = _encoder()
    ranking = Ranking.from_scores(UnitGates(torch.rand(3, 4, generator=torch.Generator().manual_seed(2))))
    sliced = SlicedModel(model, ranking)
    assert isinstance(sliced.lean, CompactEncoder)
    ids, mask = _inputs()
    with torch.no_grad():
        for budget in (0.25, 0.5, 1.0):
            sliced.set_budget(budget)
            with patch.object(CompactEncoder, "forward", autospec=True, side_effect=CompactEncoder.forward) as spy:
                lean = sliced(ids, mask)
            assert spy.call_count == 1
            assert torch.allclose(lean, sliced.model(ids, mask), atol=1e-5)


@pytest.mark.parametrize("options", [{"qk_norm": True}, {"residual_gate": True}, {"qk_norm": True, "residual_gate": True, "d_ff": 0}])
def test_qk_norm_and_residual_gains_run_in_the_lean_executor(options):
    model = _encoder(**options)
    with torch.no_grad():  # gains away from 1, so a missing gain shows
        for block in model.blocks:
            for name in ("attn_gain", "ffn_gain"):
                if hasattr(block, name):
                    getattr(block, name).fill_(0.7)
    _assert_same(model, model.inference_module())
    model.set_active([0, 2, 4])
    _assert_same(model, model.inference_module())


def test_a_router_is_refused_by_name_unless_the_executor_is_routed():
    routed = _encoder()
    routed.attach_router(RouterConfig())
    assert "per-input router" in routed.lean_unsupported() and routed.lean_unsupported(routed=True) is None
    with pytest.raises(BAAError, match="the encoder family's lean executor does not run a per-input router's decision"):
        routed.inference_module()
    assert isinstance(routed.inference_module(routed=True), CompactEncoder)


def test_segment_ids_and_too_long_inputs_are_refused_as_by_the_model():
    compact = _encoder().inference_module()
    with pytest.raises(ValueError, match="token_type_ids must be None or all zeros"):
        compact(torch.zeros(1, 4, dtype=torch.long), None, torch.ones(1, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="sequence length 17 exceeds model max_len 16"):
        compact(torch.zeros(1, 17, dtype=torch.long))


def test_sliced_encoder_switches_sorted_ffn_groups_through_the_lean_copy():
    from budgeted_attention.model.gates import UnitGates  # noqa: PLC0415
    from budgeted_attention.pruning.selection import Ranking  # noqa: PLC0415

    model = _encoder(ffn_group_size=12)
    generator = torch.Generator().manual_seed(3)
    scores = UnitGates(torch.rand(3, 4, generator=generator), torch.rand(3, 4, generator=generator))
    ranking = Ranking.from_scores(scores, UnitGates(torch.full((3, 4), 3.0), torch.full((3, 4), 2.0)), min_one_per_layer=False)
    sliced = SlicedModel(model, ranking)
    ids, mask = _inputs()
    with torch.no_grad():
        for budget in (0.2, 0.5, 0.8):
            sliced.set_budget(budget)
            kept = ranking.kept(budget)
            assert torch.allclose(sliced(ids, mask), model.pruned_copy(kept.heads, kept.groups)(ids, mask), atol=1e-5)
            assert [layer.ffn_width for layer in sliced.lean.layers] == [12 * g for g in kept.groups_per_layer]


def test_sliced_encoder_rebuilds_its_copy_when_a_parameter_is_replaced_or_converted():
    model = _encoder()
    sliced = SlicedModel(model, Ranking.from_scores(UnitGates(torch.rand(3, 4, generator=torch.Generator().manual_seed(2)))))
    ids, mask = _inputs()
    with torch.no_grad():
        sliced(ids, mask)
        first = sliced.lean
        sliced.model.classifier.weight = torch.nn.Parameter(torch.randn_like(sliced.model.classifier.weight))
        assert torch.allclose(sliced(ids, mask), sliced.model(ids, mask), atol=1e-5) and sliced.lean is not first
        sliced.model.double()
        assert sliced(ids, mask).dtype == torch.float64
        sliced.model.float()
    with torch.inference_mode():  # a parameter without a version counter: the copy is dropped
        replacement = torch.nn.Parameter(sliced.model.classifier.bias.clone())
    sliced.model.classifier.bias = replacement
    with torch.no_grad():
        assert torch.allclose(sliced(ids, mask), sliced.model(ids, mask)) and sliced.lean is None


def test_a_router_attached_to_a_sliced_encoder_sends_calls_to_the_module_tree():
    model = _encoder()
    sliced = SlicedModel(model, Ranking.from_scores(UnitGates(torch.rand(3, 4, generator=torch.Generator().manual_seed(2)))))
    sliced.model.attach_router(RouterConfig())
    ids, mask = _inputs()
    with torch.no_grad(), patch.object(CompactEncoder, "forward", side_effect=AssertionError("lean copy used")):
        sliced(ids, mask)


def test_models_made_under_inference_mode_are_refused_by_name():
    with torch.inference_mode():
        frozen = EncoderClassifier(tiny_config()).eval()
    assert "inference tensors" in frozen.lean_unsupported()
    with pytest.raises(BAAError, match="lean executor does not run parameters that are inference tensors"):
        frozen.inference_module()


def test_a_lean_copy_in_training_mode_refuses():
    compact = _encoder().inference_module().train()
    with pytest.raises(RuntimeError, match="CompactEncoder is an inference copy .* call .eval"):
        compact(torch.zeros(1, 4, dtype=torch.long))
