"""Meta-Attention: every expert causal and padding-aware in soft and hard mode, hard routing equal
to soft routing with one-hot weights, controllers, KL, measured FLOPs, training and save/load."""

import pytest
import torch

from budgeted_attention.checkpoint import load_model, save_model
from budgeted_attention.errors import BAAError, ConfigError
from budgeted_attention.model.config import MetaConfig, ModelConfig
from budgeted_attention.model.decoder import CausalLM, DecoderConfig
from budgeted_attention.model.meta_attention import MetaSelfAttention
from budgeted_attention.model.transformer import EncoderClassifier

T, D = 12, 16


def _layer(controller="bayesian", window=3, seed=0) -> MetaSelfAttention:
    torch.manual_seed(seed)
    layer = MetaSelfAttention(D, 2, 8, 0.0, MetaConfig(controller=controller, window=window), max_len=32)
    with torch.no_grad():  # a controller that really depends on the input
        layer.controller.mlp[2].weight.normal_(std=1.0)
    return layer.eval()


def _qkv(seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 2, T, 8, generator=gen) for _ in range(3)]


def _one_hot_forward(layer, x, choice, key_mask=None, mode="soft"):
    """The layer's forward with its controller forced to one-hot weights of ``choice``."""
    weights = torch.nn.functional.one_hot(choice, 3).float()
    layer.controller.forward = lambda _x: (weights, None)
    layer.routing = mode
    attn_mask = None if key_mask is None else key_mask.view(2, 1, 1, T)
    return layer(x, attn_mask)


@pytest.mark.parametrize("expert", [0, 1, 2])
def test_each_expert_is_causal(expert):
    layer = _layer()
    q, k, v = _qkv()
    t = 5
    q2, k2, v2 = (z.clone() for z in (q, k, v))
    for z in (q2, k2, v2):
        z[:, :, t + 1:] += 3.0
    before = layer.experts(q, k, v, None)[expert]
    after = layer.experts(q2, k2, v2, None)[expert]
    torch.testing.assert_close(after[:, :, : t + 1], before[:, :, : t + 1])
    assert not torch.allclose(after[:, :, t + 1:], before[:, :, t + 1:])


@pytest.mark.parametrize("mode", ["soft", "hard"])
@pytest.mark.parametrize("controller", ["bayesian", "prior-free", "softmax"])
def test_routed_layer_is_causal_in_soft_and_hard_mode(mode, controller):
    layer = _layer(controller)
    layer.routing = mode
    x = torch.randn(2, T, D, generator=torch.Generator().manual_seed(3))
    for t in (0, 4, 9):
        changed = x.clone()
        changed[:, t + 1:] = torch.randn(2, T - t - 1, D)
        with torch.no_grad():
            torch.testing.assert_close(layer(changed)[:, : t + 1], layer(x)[:, : t + 1])


@pytest.mark.parametrize("mode", ["soft", "hard"])
@pytest.mark.parametrize("expert", [0, 1, 2])
def test_padded_keys_never_change_real_outputs(mode, expert):
    layer = _layer()
    x = torch.randn(2, T, D, generator=torch.Generator().manual_seed(4))
    key_mask = torch.ones(2, T, dtype=torch.bool)
    key_mask[0, :3] = False  # left padding in row 0
    key_mask[1, 7:] = False  # right padding in row 1
    changed = x.clone()
    changed[~key_mask] = torch.randn(int((~key_mask).sum()), D)
    choice = torch.full((2, T), expert)
    with torch.no_grad():
        a = _one_hot_forward(layer, x, choice, key_mask, mode)
        b = _one_hot_forward(layer, changed, choice, key_mask, mode)
    torch.testing.assert_close(a[key_mask], b[key_mask])


@pytest.mark.parametrize("padded", [False, True])
def test_hard_routing_equals_soft_routing_with_one_hot_weights(padded):
    layer = _layer(window=4)
    x = torch.randn(2, T, D, generator=torch.Generator().manual_seed(5))
    choice = torch.randint(0, 3, (2, T), generator=torch.Generator().manual_seed(6))
    key_mask = None
    if padded:
        key_mask = torch.ones(2, T, dtype=torch.bool)
        key_mask[1, 9:] = False
    with torch.no_grad():
        soft = _one_hot_forward(layer, x, choice, key_mask, "soft")
        hard = _one_hot_forward(layer, x, choice, key_mask, "hard")
    rows = slice(None) if key_mask is None else key_mask
    torch.testing.assert_close(hard[rows], soft[rows], atol=1e-5, rtol=1e-5)


def test_hard_routing_computes_less_than_full_attention():
    layer = _layer(window=2)
    x = torch.randn(1, T, D)
    with torch.no_grad():
        _one_hot_forward(layer, x, torch.full((1, T), 2), mode="hard")  # every token: window
    full_attention = 4 * 2 * 8 * T * T
    assert layer.flops["full"] == 0 and layer.flops["linear"] == 0
    assert layer.flops["window"] == 4 * 2 * 8 * T * 2 < full_attention


def test_controllers_weights_and_kl():
    x = torch.randn(2, T, D)
    bayes = _layer("bayesian")
    weights, beta = bayes.controller(x)
    torch.testing.assert_close(weights, beta / beta.sum(-1, keepdim=True))  # eval: posterior mean
    assert torch.allclose(weights.sum(-1), torch.ones(2, T))
    bayes.train()
    sampled, _ = bayes.controller(x)
    assert not torch.allclose(sampled, weights)  # training: Dirichlet samples
    assert float(bayes.controller.kl(beta, None)) > 0
    softmax_weights, none = _layer("softmax").controller(x)
    assert none is None and torch.allclose(softmax_weights.sum(-1), torch.ones(2, T))
    assert MetaConfig().prior_concentration() == pytest.approx([0.01, 0.86, 0.71])
    assert MetaConfig(controller="prior-free").kl_weight == 0.0


def _lm(controller="bayesian") -> CausalLM:
    torch.manual_seed(0)
    return CausalLM(DecoderConfig(vocab_size=23, max_len=16, d_model=16, n_layers=2, n_heads=2, d_ff=32, attention="meta", meta=MetaConfig(controller=controller, window=4)))


def test_routed_language_model_is_causal_and_its_kl_is_a_training_loss():
    model = _lm()
    ids = torch.randint(0, 23, (2, 12))
    changed = ids.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % 23
    model.eval()
    for mode in ("soft", "hard"):
        model.set_routing(mode)
        with torch.no_grad():
            torch.testing.assert_close(model(changed)[:, :8], model(ids)[:, :8])
    model.train()
    assert model.auxiliary_loss() is None
    model(ids).sum().backward()
    aux = model.auxiliary_loss()
    assert aux is not None and float(aux) > 0 and aux.requires_grad
    assert model.auxiliary_loss() is None  # taken once
    model.train()
    prior_free = _lm("prior-free").train()
    prior_free(ids)
    assert prior_free.auxiliary_loss() is None


def test_meta_language_model_trains_and_round_trips(tmp_path):
    from budgeted_attention.data.dataset import Split
    from budgeted_attention.tasks import LANGUAGE_MODEL
    from budgeted_attention.training.config import TrainConfig
    from budgeted_attention.training.stages import train_dense

    model = _lm()
    ids = torch.randint(0, 23, (16, 12), generator=torch.Generator().manual_seed(0))
    log = train_dense(model, Split(ids, torch.ones_like(ids), torch.zeros(16, dtype=torch.long)), TrainConfig(dense_steps=3, batch_size=8), seed=0, progress=False, task=LANGUAGE_MODEL)
    assert len(log.losses) == 3 and all(torch.isfinite(torch.tensor(log.losses)))
    save_model(model, tmp_path / "m", method="dense", seed=0, steps=3)
    loaded, _ = load_model(tmp_path / "m")
    assert loaded.config.meta.window == 4 and loaded.config.attention == "meta"
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(ids), model.eval()(ids))


def test_meta_attention_is_refused_where_it_does_not_apply():
    with pytest.raises(ConfigError, match="decoder family"):
        EncoderClassifier(ModelConfig(attention="meta"))
    with pytest.raises(ConfigError, match="needs position embeddings"):
        EncoderClassifier(ModelConfig(positions="none"))
    with pytest.raises(ConfigError, match="model.attention"):
        ModelConfig(attention="sparse")
    with pytest.raises(ConfigError, match="model.meta.controller"):
        MetaConfig(controller="oracle")
    with pytest.raises(BAAError, match="the decoder family's lean executor does not run meta-attention"):
        _lm().inference_module()
    assert "meta-attention" in _lm().lean_unsupported()


@pytest.mark.parametrize("seq", [64, 150])
def test_chunked_linear_rows_equal_the_parallel_form_across_chunks(seq):
    from budgeted_attention.model.meta_attention import LINEAR_CHUNK, linear_attention_causal

    assert seq <= LINEAR_CHUNK or seq > 2 * LINEAR_CHUNK  # one chunk, or several with a ragged last one
    layer = MetaSelfAttention(16, 2, 8, 0.0, MetaConfig(window=4), seq)
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, seq, 8, generator=gen) for _ in range(3))
    real = torch.ones(seq, dtype=torch.bool)
    real[5:9] = False  # padded keys inside the sequence contribute nothing
    rows = torch.tensor([0, 3, 63, 64, 65, 100, seq - 1]).clamp(max=seq - 1).unique()
    if seq > 2 * LINEAR_CHUNK:  # rows ending before the sequence does, skipping a chunk
        rows = torch.tensor([3, 5, 130, 140])
    layer.reset_flops()
    chunked = layer._linear_rows(q, k, v, rows, real)
    expected = linear_attention_causal(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), real.unsqueeze(0))[0][:, rows]
    assert torch.allclose(chunked, expected, atol=1e-5)
    assert layer.flops["linear"] > 0
