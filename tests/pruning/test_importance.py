"""DynaBERT's FFN neuron score: |sum over tokens of a_j * dL/da_j| per layer, from the activations'
gradients alone (no weight gradient is computed), on the whole split or a seeded sample."""

import pytest
import torch

from budgeted_attention.data.dataset import Split
from budgeted_attention.model.transformer import EncoderClassifier
from budgeted_attention.pruning.importance import ffn_neuron_importance, sort_ffn_by_importance
from conftest import tiny_config


def _model_and_split():
    torch.manual_seed(0)
    model = EncoderClassifier(tiny_config(ffn_group_size=12))
    ids = torch.randint(4, model.vocab_size, (10, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[3, 5:] = 0
    return model, Split(ids, mask, torch.arange(10) % 3)


def _reference(model, split, batch_size):
    """The score by its definition: retain the activations' gradients, backward the loss."""
    from budgeted_attention.tasks import CLASSIFY

    model.eval()
    captured, scores = {}, None

    def keep(index):
        def hook(_module, _inputs, output):
            output.retain_grad()
            captured[index] = output

        return hook

    handles = [m.register_forward_hook(keep(i)) for i, m in enumerate(model.ffn_activations())]
    for ids, attn, labels in split.batches(batch_size):
        model.zero_grad(set_to_none=True)
        CLASSIFY.loss(model(ids, attn), ids, attn, labels).backward()
        parts = [(captured[i].detach() * captured[i].grad).flatten(0, -2).sum(dim=0).abs() for i in range(len(captured))]
        scores = parts if scores is None else [s + p for s, p in zip(scores, parts)]
    for handle in handles:
        handle.remove()
    model.zero_grad(set_to_none=True)
    return scores


def test_scores_equal_the_definition_and_leave_no_weight_gradients():
    model, split = _model_and_split()
    expected = _reference(model, split, 4)
    scores = ffn_neuron_importance(model, split, batch_size=4)
    assert len(scores) == model.n_layers and all(s.shape == (model.ffn_widths()[0],) for s in scores)
    for got, want in zip(scores, expected):
        torch.testing.assert_close(got, want)
    assert all(p.grad is None for p in model.parameters())


def test_a_seeded_sample_reads_only_those_examples():
    model, split = _model_and_split()
    sample = ffn_neuron_importance(model, split, batch_size=4, max_examples=4, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(sample, ffn_neuron_importance(model, split, batch_size=4, max_examples=4, seed=3)))
    chosen = torch.randperm(10, generator=torch.Generator().manual_seed(3))[:4].sort().values
    subset = Split(split.input_ids[chosen], split.attention_mask[chosen], split.labels[chosen])
    for got, want in zip(sample, ffn_neuron_importance(model, subset, batch_size=4)):
        torch.testing.assert_close(got, want)
    whole = ffn_neuron_importance(model, split, batch_size=4)
    assert all(torch.equal(a, b) for a, b in zip(whole, ffn_neuron_importance(model, split, batch_size=4, max_examples=10)))


def test_sorting_is_function_preserving_and_puts_the_best_neurons_first():
    model, split = _model_and_split()
    ids, mask, _ = next(split.batches(10))
    with torch.no_grad():
        before = model(ids, mask)
    orders = sort_ffn_by_importance(model, split, batch_size=4)
    with torch.no_grad():
        torch.testing.assert_close(model(ids, mask), before, atol=1e-5, rtol=1e-5)
    again = ffn_neuron_importance(model, split, batch_size=4)
    assert all(bool((s[:-1] >= s[1:] - 1e-6).all()) for s in again) and all(sorted(o) == list(range(len(o))) for o in orders)


def test_an_activation_module_that_runs_twice_is_refused():
    model, split = _model_and_split()
    module = model.ffn_activations()[1]
    calls = {"n": 0}

    def run_again(mod, args, output):  # a second call of the same module within one forward pass
        calls["n"] += 1
        if calls["n"] % 2:
            mod(args[0])

    handle = module.register_forward_hook(run_again)
    with pytest.raises(RuntimeError, match=r"once per forward pass; calls per layer: \[1, 2, 1\]"):
        ffn_neuron_importance(model, split, batch_size=4)
    handle.remove()
