import pytest

from budgeted_attention.model.config import ModelConfig
from budgeted_attention.model.cost import CostModel


def test_ideal_speedup_matches_hand_count():
    cfg = ModelConfig(vocab_size=10, n_classes=2, d_model=256, n_layers=4, n_heads=8, d_ff=1024, max_len=128)
    cost = CostModel(cfg, 128)
    t, d, hd = 128, 256, 32
    head = 3 * 2 * t * d * hd + 2 * t * hd * d + 4 * t * t * hd
    ffn = 4 * t * d * 1024
    assert cost.head_flops() == head
    dense = 4 * (8 * head + ffn) + 2 * d * 2
    half = 4 * (4 * head + ffn) + 2 * d * 2
    assert cost.ideal_speedup([4] * 4) == pytest.approx(dense / half)
    # The physical limit quoted in the reference notes: about 1.24x at half the heads.
    assert 1.2 < cost.ideal_speedup([4] * 4) < 1.3


def test_attention_only_model_is_nearly_proportional():
    cfg = ModelConfig(vocab_size=10, n_classes=2, d_model=256, n_layers=4, n_heads=8, d_ff=0, max_len=128)
    assert CostModel(cfg, 128).ideal_speedup([4] * 4) == pytest.approx(2.0, rel=0.01)
