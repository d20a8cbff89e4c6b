"""The causal LM family: causality (also through gates, pruning and QK-norm), SAN options,
tied output layer, pruning and slicing of heads and FFN groups, save/load."""

import pytest
import torch

from budgeted_attention.checkpoint import load_model, save_model
from budgeted_attention.errors import ConfigError
from budgeted_attention.model.compact import CompactDecoder
from budgeted_attention.model.decoder import CausalLM, DecoderConfig, lm_loss
from budgeted_attention.pruning.selection import Ranking
from budgeted_attention.pruning.surgery import prune_to_budget
from budgeted_attention.pruning.switching import SlicedModel


def _model(**overrides) -> CausalLM:
    base = dict(vocab_size=31, max_len=16, d_model=32, n_layers=3, n_heads=4, d_ff=48, ffn_group_size=12)
    base.update(overrides)
    torch.manual_seed(0)
    model = CausalLM(DecoderConfig(**base))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for gates in (model.gates, model.ffn_gates):
            if gates is not None:
                gates.bias.copy_(torch.randn(gates.bias.shape, generator=gen))
    return model.eval()


IDS = torch.randint(0, 31, (2, 12), generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize("options", [{}, {"qk_norm": True, "residual_gate": True}, {"d_ff": 0, "ffn_group_size": 0, "qk_norm": True}])
def test_future_tokens_never_change_earlier_logits(options):
    model = _model(**options)
    changed = IDS.clone()
    changed[:, 7:] = (changed[:, 7:] + 5) % 31
    ranking = Ranking.from_scores(model.unit_importance(), model.unit_costs(12))
    pruned = prune_to_budget(model, ranking, 0.5)
    with torch.no_grad():
        for call in (lambda m, x: m(x), lambda m, x: m(x, budget=0.4)):
            for m in (model, pruned):
                a, b = call(m, IDS), call(m, changed)
                assert torch.allclose(a[:, :7], b[:, :7], atol=1e-5)
                assert not torch.allclose(a[:, 7:], b[:, 7:], atol=1e-3)


def test_output_layer_is_tied_to_the_embedding_and_loss_is_in_nats():
    model = _model()
    logits = model(IDS)
    assert logits.shape == (2, 12, 31)
    names = [n for n, _ in model.named_parameters()]
    assert not any("lm_head" in n or "classifier" in n for n in names)
    loss = lm_loss(logits, IDS)
    assert abs(float(loss) - torch.log(torch.tensor(31.0)).item()) < 1.0  # near-uniform at init
    mask = torch.ones_like(IDS)
    mask[1, 6:] = 0
    masked = lm_loss(logits, IDS, mask)
    manual = torch.nn.functional.cross_entropy(
        torch.cat([logits[0, :-1], logits[1, :5]]), torch.cat([IDS[0, 1:], IDS[1, 1:6]])
    )
    assert torch.allclose(masked, manual, atol=1e-6)


def test_attention_only_san_has_no_ffn_and_qk_norm_gains():
    model = _model(d_ff=0, ffn_group_size=0, qk_norm=True, residual_gate=True)
    assert not model.has_ffn_units and all(not b.has_ffn for b in model.blocks)
    assert model.blocks[0].attn.q_norm.weight.shape == (8,)
    assert model.ffn_widths() == [0, 0, 0]
    with pytest.raises(ValueError, match="no feed-forward"):
        model.ffn_activations()


def test_pruned_equals_masked_sliced_serves_budgets_and_save_load(tmp_path):
    model = _model(qk_norm=True)
    ranking = Ranking.from_scores(model.unit_importance(), model.unit_costs(12), min_one_per_layer=False)
    sliced = SlicedModel(model, ranking)
    with torch.no_grad():
        for budget in (0.2, 0.5, 1.0):
            pruned = prune_to_budget(model, ranking, budget)
            assert torch.allclose(pruned(IDS), model(IDS, gates=ranking.masks(budget)), atol=1e-5)
            sliced.set_budget(budget)
            assert torch.allclose(sliced(IDS), pruned(IDS), atol=1e-5)
    save_model(pruned, tmp_path / "lm", ranking=ranking.to_dict())
    loaded, _ = load_model(tmp_path / "lm")
    assert isinstance(loaded, CausalLM) and loaded.config.qk_norm
    assert torch.equal(loaded(IDS), pruned(IDS))


def test_decoder_cost_counts_the_tied_output_layer_as_fixed():
    model = _model(d_ff=0, ffn_group_size=0)
    cost = model.cost_model(12)
    assert cost.classifier_flops() == 2 * 12 * 32 * 31
    # attention-only: the heads are all of the prunable compute
    assert cost.ideal_speedup([2, 2, 2], [0, 0, 0]) > 1.5


def test_bad_decoder_options_are_refused():
    with pytest.raises(ConfigError, match="qk_norm"):
        DecoderConfig(vocab_size=10, qk_norm="yes")
    with pytest.raises(ValueError, match="max_len"):
        _model()(torch.zeros(1, 17, dtype=torch.long))


@pytest.mark.parametrize("options", [{}, {"qk_norm": True, "residual_gate": True}, {"d_ff": 0, "ffn_group_size": 0, "qk_norm": True, "residual_gate": True}])
def test_lean_executor_equals_the_decoder_dense_and_pruned(options):
    model = _model(**options)
    with torch.no_grad():  # move the QK-norm gains and residual gains off their init values
        for name, param in model.named_parameters():
            if "norm" in name or "gain" in name:
                param.add_(0.3 * torch.randn(param.shape))
    lean = model.inference_module()
    assert isinstance(lean, CompactDecoder)
    mask = torch.ones_like(IDS)
    mask[1, 7:] = 0  # right padding: unused, as by the model
    with torch.no_grad():
        torch.testing.assert_close(lean(IDS, mask), model(IDS, mask), atol=1e-5, rtol=1e-5)
        assert lean(IDS).shape == (2, 12, 31)
        pruned = prune_to_budget(model, Ranking.from_scores(model.unit_importance(), model.unit_costs(12)), 0.5)
        torch.testing.assert_close(pruned.inference_module()(IDS), pruned(IDS), atol=1e-5, rtol=1e-5)


def test_decoder_without_positions_runs_at_any_length_through_its_lean_executor():
    model = _model(positions="none", max_len=64)
    assert model.position_embedding is None
    ids = torch.randint(0, 31, (1, 64))
    with torch.no_grad():
        torch.testing.assert_close(model.inference_module()(ids), model(ids), atol=1e-5, rtol=1e-5)
    with pytest.raises(ConfigError, match="model.positions"):
        DecoderConfig(positions="rope")


def test_decoder_cost_counts_causal_key_pairs_and_the_output_layer():
    model = _model()
    cost = model.cost_model(12)
    hd, d = model.config.head_dim, model.config.d_model
    assert cost.head_flops() == 8 * 12 * d * hd + 4 * (12 * 13 // 2) * hd
    assert cost.classifier_flops() == 2 * 12 * d * model.config.vocab_size
