"""The one head-subset attention: every way of running a head set equals masking the others out."""

import pytest
import torch

from budgeted_attention.model.gathered import GatherCache
from budgeted_attention.model.heads import attend, attend_chosen, interleave_qkv

D, H, HD = 16, 5, 4


def _weights():
    torch.manual_seed(0)
    return (torch.randn(H * 3 * HD, D), torch.randn(H * 3 * HD), torch.randn(H * HD, D)), torch.randn(D)


def _masked(x, weights, bias, heads, **options):
    gates = torch.zeros(H)
    gates[list(heads)] = 1.0
    return attend(x, x.shape[0], x.shape[1], weights, bias, HD, gates=gates, **options)


@pytest.mark.parametrize("heads", [range(3), (1, 2), (0, 2, 4), (4,), ()])
@pytest.mark.parametrize("cache", [None, "room", "full"])
def test_views_gathers_and_runs_equal_the_masked_heads(heads, cache):
    weights, bias = _weights()
    x = torch.randn(2, 6, D)
    mask = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    mask[1, ..., 4:] = False
    gathered = {"room": GatherCache(), "full": GatherCache(max_bytes=0), None: None}[cache]
    with torch.no_grad():
        for causal in (False, True):
            got = attend(x, 2, 6, weights, bias, HD, heads, mask=mask, causal=causal, cache=gathered)
            assert torch.allclose(got, _masked(x, weights, bias, heads, mask=mask, causal=causal), atol=1e-5)
    assert gathered is None or len(gathered) == (cache == "room" and heads == (0, 2, 4))


def test_per_input_sets_grouped_or_head_by_head_equal_the_masked_heads():
    weights, bias = _weights()
    x = torch.randn(12, 5, D)
    many = torch.rand(12, H) < 0.5
    assert len(torch.unique(many, dim=0)) > H  # more sets than heads: head by head
    two = torch.tensor([[True, False, True, False, True]] * 6 + [[False, True] * 2 + [True]] * 6)  # two groups
    for chosen in (many, two):
        with torch.no_grad():
            got = attend_chosen(x, 12, 5, weights, bias, HD, chosen).view(12, 5, D)
        for i in range(12):
            heads = tuple(h for h in range(H) if chosen[i, h])
            assert torch.allclose(got[i], _masked(x[i : i + 1], weights, bias, heads), atol=1e-5)


def test_interleave_puts_each_heads_query_key_and_value_rows_together():
    q, k, v = (torch.randn(H * HD, D) for _ in range(3))
    fused = interleave_qkv(q, k, v, HD).view(H, 3, HD, D)
    for h in range(H):
        rows = slice(h * HD, (h + 1) * HD)
        assert torch.equal(fused[h, 0], q[rows]) and torch.equal(fused[h, 1], k[rows]) and torch.equal(fused[h, 2], v[rows])
    assert interleave_qkv(q[:0], k[:0], v[:0], HD).shape == (0, D)  # a layer without heads
