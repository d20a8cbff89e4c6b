"""Routing statistics of Meta-Attention models: measured hard-routing FLOPs, entropy, input dependence."""

import math

import pytest
import torch

from budgeted_attention.data.dataset import Split
from budgeted_attention.model.config import MetaConfig
from budgeted_attention.model.decoder import CausalLM, DecoderConfig
from budgeted_attention.training.routing import mutual_information_bits, routing_statistics


def test_mutual_information_of_independent_and_determined_choices():
    features = torch.tensor([0, 1, 2, 3] * 25)
    assert mutual_information_bits(features, torch.zeros(100, dtype=torch.long)) == pytest.approx(0.0, abs=1e-9)
    assert mutual_information_bits(features, features % 2) == pytest.approx(1.0)


def test_routing_statistics_of_an_input_independent_controller():
    torch.manual_seed(0)
    model = CausalLM(DecoderConfig(vocab_size=11, max_len=16, d_model=16, n_layers=2, n_heads=2, d_ff=16, attention="meta", meta=MetaConfig(window=4)))
    ids = torch.randint(0, 11, (6, 16), generator=torch.Generator().manual_seed(1))
    stats = routing_statistics(model, Split(ids, torch.ones_like(ids), torch.zeros(6, dtype=torch.long)), batch_size=4)
    # The controller's last layer starts at zero: every token's posterior is beta + softplus(0).
    posterior = torch.tensor(MetaConfig().prior_concentration()) + math.log(2.0)
    mean = posterior / posterior.sum()
    assert stats["projected_cost"] == pytest.approx(float((mean * torch.tensor([1.0, 0.15, 0.3])).sum()), rel=1e-5)
    assert stats["expert_fractions"]["linear"] == 1.0 and stats["prior_agreement"] == 1.0
    assert stats["mi_token_bits"] == pytest.approx(0.0, abs=1e-9)
    assert stats["entropy_pct"] == pytest.approx(100 * float(-(mean * mean.log()).sum()) / math.log(3), rel=1e-4)
    # Every token is linear, one chunk of C = T = 16: chunk states 2 hd^2 per key, state reads
    # 2 hd^2 and the own-chunk block 4 C hd per query, against causal softmax attention's
    # 2 hd T (T + 1) per head: T (4 hd^2 + 4 C hd) / (2 hd T (T + 1)) = (2 hd + 2 C) / (T + 1).
    # At 16 tokens and hd 8 linear attention costs more than the causal kernel: 48 / 17.
    assert stats["attention_flops_fraction"] == pytest.approx(48 / 17)
    assert stats["hard_flops_by_expert"]["full"] == 0 and stats["hard_loss"] > 0


def test_routing_statistics_on_padded_batches_align_tokens_and_weights():
    torch.manual_seed(0)
    model = CausalLM(DecoderConfig(vocab_size=11, max_len=16, d_model=16, n_layers=2, n_heads=2, d_ff=16, attention="meta", meta=MetaConfig(window=4)))
    with torch.no_grad():
        for layer in model.meta_layers():
            layer.controller.mlp[2].weight.normal_(std=2.0)
    ids = torch.randint(1, 11, (6, 16), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, 10:] = 0
    mask[3, 5:] = 0
    stats = routing_statistics(model, Split(ids.masked_fill(mask == 0, 0), mask, torch.zeros(6, dtype=torch.long)), batch_size=4)
    assert sum(stats["expert_fractions"].values()) == pytest.approx(1.0) and stats["attention_flops_fraction"] > 0


def test_input_dependence_subtracts_the_shuffled_baseline():
    from budgeted_attention.training.routing import input_dependence

    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 500, (4000,), generator=gen)
    independent = torch.randint(0, 3, (4000,), generator=gen)
    bits, _ = input_dependence(tokens, independent)
    assert abs(bits) < 0.05 < mutual_information_bits(tokens, independent)  # the raw plug-in estimate is biased
    determined, fraction = input_dependence(tokens, tokens % 3)
    assert determined > 1.0 and fraction > 0.6
