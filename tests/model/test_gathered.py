"""The gathered-weight cache of per-input head sets: hits, invalidation, size bound."""

import copy

import torch

from budgeted_attention.model.attention import GatedSelfAttention
from budgeted_attention.model.gates import LayerSelection
from budgeted_attention.model.gathered import GatherCache


def _gather(weight: torch.Tensor, heads: tuple[int, ...]):
    return (weight.index_select(0, torch.tensor(heads)),)


def test_a_head_set_is_gathered_once_while_the_weights_are_unchanged():
    weight = torch.randn(8, 4)
    cache = GatherCache()
    first = cache.get((1, 3), (weight,), lambda: _gather(weight, (1, 3)))
    again = cache.get((1, 3), (weight,), lambda: _gather(weight, (1, 3)))
    assert again[0] is first[0] and (cache.hits, cache.misses) == (1, 1)
    other = cache.get((0,), (weight,), lambda: _gather(weight, (0,)))
    assert torch.equal(other[0], weight[:1]) and len(cache) == 2


def test_an_in_place_edit_or_a_new_tensor_invalidates_every_entry():
    weight = torch.randn(8, 4)
    cache = GatherCache()
    cache.get((1, 3), (weight,), lambda: _gather(weight, (1, 3)))
    weight.mul_(2.0)  # e.g. an optimiser step or load_state_dict
    fresh = cache.get((1, 3), (weight,), lambda: _gather(weight, (1, 3)))
    assert torch.equal(fresh[0], weight[[1, 3]])
    replaced = torch.randn(8, 4)
    assert torch.equal(cache.get((1, 3), (replaced,), lambda: _gather(replaced, (1, 3)))[0], replaced[[1, 3]])


def test_the_cache_stays_under_its_byte_bound_dropping_the_least_recent():
    weight = torch.randn(8, 4)  # one row: 16 bytes
    cache = GatherCache(max_bytes=32)
    for heads in [(0,), (1,), (2,)]:
        cache.get(heads, (weight,), lambda h=heads: _gather(weight, h))
    assert len(cache) == 2 and cache.misses == 3
    cache.get((1,), (weight,), lambda: _gather(weight, (1,)))
    assert cache.hits == 1  # (1,) survived, (0,) was dropped
    cache.get((0,), (weight,), lambda: _gather(weight, (0,)))
    assert cache.misses == 4


def test_cached_attention_equals_the_gathering_path_and_training_bypasses_the_cache():
    torch.manual_seed(0)
    attention = GatedSelfAttention(16, 4, 4).eval()
    x = torch.randn(1, 5, 16)
    selected = torch.tensor([[True, False, True, True]])
    reference = attention(x, selection=LayerSelection(gates=torch.tensor([1.0, 0.0, 1.0, 1.0])))
    with torch.no_grad():
        for _ in range(2):
            assert torch.allclose(attention(x, selection=LayerSelection(chosen=selected)), reference, atol=1e-6)
    assert len(attention._gathered) == 1
    with torch.no_grad():
        attention.qkv_weight.mul_(0.5)  # a weight change after caching
        assert torch.allclose(attention(x, selection=LayerSelection(chosen=selected)), attention(x, selection=LayerSelection(gates=torch.tensor([1.0, 0.0, 1.0, 1.0]))), atol=1e-6)
    attention.train()
    out = attention(x, selection=LayerSelection(chosen=selected))
    out.sum().backward()
    assert attention.qkv_weight.grad is not None  # gathered with autograd, not from the cache
    assert len(copy.deepcopy(attention)._gathered) == 0


def test_a_model_made_under_inference_mode_runs_the_selected_heads_uncached():
    with torch.inference_mode():
        attention = GatedSelfAttention(16, 4, 4).eval()  # inference tensors: no version counter
        x = torch.randn(1, 5, 16)
        out = attention(x, selection=LayerSelection(chosen=torch.tensor([[True, False, True, False]])))
        assert torch.allclose(out, attention(x, selection=LayerSelection(gates=torch.tensor([1.0, 0.0, 1.0, 0.0]))), atol=1e-6)
    assert len(attention._gathered) == 0
