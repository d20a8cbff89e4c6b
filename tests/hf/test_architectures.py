import json
import warnings

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed")
import transformers  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from budgeted_attention.errors import CheckpointError  # noqa: E402
from budgeted_attention.hf.architectures import (  # noqa: E402
    ARCHITECTURES,
    SUPPORTED,
    architecture_of,
    attention_output_dense,
    base_model,
    classifier_from_config,
    encoder_layers,
    load_pretrained_classifier,
    model_type,
    self_attention,
    set_self_attention,
    unmodified_reference,
)
from budgeted_attention.hf.bert import GatedBertClassifier, GatedBertSelfAttention  # noqa: E402

TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
# model_type -> (config class, base model class, pad token id)
KINDS = {
    "bert": ("BertConfig", "BertModel", 0),
    "electra": ("ElectraConfig", "ElectraModel", 0),
    "roberta": ("RobertaConfig", "RobertaModel", 1),
    "xlm-roberta": ("XLMRobertaConfig", "XLMRobertaModel", 1),
}


def _config(kind, **overrides):
    config_cls, _, pad = KINDS[kind]
    extra = {"bert": {}, "electra": {"embedding_size": 16}}.get(kind, {"type_vocab_size": 1, "max_position_embeddings": 66})
    return getattr(transformers, config_cls)(**{**TINY, "pad_token_id": pad, **extra, **overrides})


def _save(model, folder):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(folder)
    return folder


def _save_base(kind, folder, **overrides):
    torch.manual_seed(0)
    model = getattr(transformers, KINDS[kind][1])(_config(kind, **overrides)).eval()
    return _save(model, folder), model


def _edit_config(folder, **changes):
    path = folder / "config.json"
    description = json.loads(path.read_text())
    description.update(changes)
    path.write_text(json.dumps(description))


def _batch(hf, kind):
    pad = KINDS[kind][2]
    ids = torch.randint(3, 99, (3, 11), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    mask[2, 9:] = 0
    ids = ids.masked_fill(mask == 0, pad)
    batch = {"input_ids": ids, "attention_mask": mask}
    if kind in ("bert", "electra"):  # pretrained with segment ids (RoBERTa / XLM-R are not)
        types = torch.zeros_like(ids)
        types[:, 4:] = 1
        batch["token_type_ids"] = types * mask
    return batch


def test_registry_lists_families_with_bert_self_attention_layout():
    assert SUPPORTED == ("bert", "electra", "roberta", "xlm-roberta")
    for kind in SUPPORTED:
        family = ARCHITECTURES[kind]
        model = family.classifier()(_config(kind, num_labels=3))
        attention = self_attention(encoder_layers(model)[0])
        for name in ("query", "key", "value", "dropout", "attention_head_size", "num_attention_heads", "scaling"):
            assert hasattr(attention, name), (kind, name)
        assert all(isinstance(getattr(attention, n), torch.nn.Linear) for n in ("query", "key", "value"))
        assert isinstance(attention_output_dense(encoder_layers(model)[0]), torch.nn.Linear)
        head_keys = [k for k in model.state_dict() if k.startswith(family.head_prefixes)]
        assert head_keys and all(k.startswith(("classifier.", "bert.pooler.")) for k in head_keys)


@pytest.mark.parametrize("kind", SUPPORTED)
def test_base_checkpoint_loads_every_encoder_weight_and_says_head_is_new_once(kind, tmp_path, capfd):
    folder, saved = _save_base(kind, tmp_path / kind)
    assert architecture_of(folder) == kind
    capfd.readouterr()
    verbosity = hf_logging.get_verbosity()
    messages = []
    hf = load_pretrained_classifier(folder, 5, log=messages.append)
    assert type(hf).__name__ == ARCHITECTURES[kind].classifier_class
    assert hf.config._attn_implementation == "sdpa" and not hf.training
    assert len(messages) == 1 and "\n" not in messages[0]
    assert "new classification head" in messages[0] and "5 labels" in messages[0]
    # transformers' own load report is silenced for this call, and the verbosity restored
    assert "LOAD REPORT" not in "".join(capfd.readouterr())
    assert hf_logging.get_verbosity() == verbosity
    loaded = base_model(hf).state_dict()
    for key, tensor in saved.state_dict().items():
        if key in loaded:
            assert torch.equal(loaded[key], tensor), key
        else:
            assert kind in ("roberta", "xlm-roberta") and key.startswith("pooler."), key
    assert model_type(hf) == kind


@pytest.mark.parametrize("kind", SUPPORTED)
def test_classifier_checkpoint_loads_head_too_and_another_label_count_gets_a_new_head(kind, tmp_path):
    torch.manual_seed(0)
    saved = ARCHITECTURES[kind].classifier()(_config(kind, num_labels=3)).eval()
    folder = _save(saved, tmp_path / kind)
    messages = []
    hf = load_pretrained_classifier(folder, 3, log=messages.append)
    assert messages == []
    expected = saved.state_dict()
    for key, tensor in hf.state_dict().items():
        assert torch.equal(tensor, expected[key]), key
    hf = load_pretrained_classifier(folder, 2, log=messages.append)
    assert len(messages) == 1 and "another label count" in messages[0]
    assert hf.config.num_labels == 2


def test_default_log_is_one_warning(tmp_path):
    folder, _ = _save_base("bert", tmp_path / "bert")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_pretrained_classifier(folder, 2)
    mine = [w for w in caught if "new classification head" in str(w.message)]
    assert len(mine) == 1


def test_bert_base_model_without_pooler_gets_new_pooler_and_head(tmp_path):
    torch.manual_seed(0)
    saved = transformers.BertModel(_config("bert"), add_pooling_layer=False)
    folder = _save(saved, tmp_path / "nopool")
    messages = []
    load_pretrained_classifier(folder, 2, log=messages.append)
    assert len(messages) == 1 and "bert.pooler.dense" in messages[0]


@pytest.mark.parametrize("kind, ctor", [("distilbert", "DistilBertModel"), ("gpt2", "GPT2Model")])
def test_unsupported_families_are_refused_with_the_supported_list(kind, ctor, tmp_path):
    if kind == "distilbert":
        config = transformers.DistilBertConfig(vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=37)
    else:
        config = transformers.GPT2Config(vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=32)
    folder = _save(getattr(transformers, ctor)(config), tmp_path / kind)
    expected = f"model type '{kind}' is not supported (supported: bert, electra, roberta, xlm-roberta)"
    with pytest.raises(CheckpointError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        architecture_of(folder)
    with pytest.raises(CheckpointError, match="supported: bert, electra, roberta, xlm-roberta"):
        load_pretrained_classifier(folder, 2)


def test_unreadable_paths_name_the_path(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(CheckpointError, match="nowhere"):
        architecture_of(missing)
    with pytest.raises(CheckpointError, match="nowhere"):
        load_pretrained_classifier(missing, 2)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="broken"):
        architecture_of(broken)
    weightless = tmp_path / "weightless"
    _config("bert").save_pretrained(weightless)
    with pytest.raises(CheckpointError, match="weightless"):
        load_pretrained_classifier(weightless, 2)


def test_encoder_shape_mismatch_is_refused(tmp_path):
    folder, _ = _save_base("bert", tmp_path / "ffn")
    _edit_config(folder, intermediate_size=41)
    with pytest.raises(CheckpointError, match=r"another shape: bert\.encoder\.layer\.0\.intermediate\.dense"):
        load_pretrained_classifier(folder, 2, log=lambda _: None)


def test_hidden_size_differing_from_config_is_refused(tmp_path):
    folder, _ = _save_base("bert", tmp_path / "hidden")
    _edit_config(folder, hidden_size=48)
    with pytest.raises(CheckpointError, match="does not fit BertForSequenceClassification"):
        load_pretrained_classifier(folder, 2, log=lambda _: None)


def test_extra_encoder_layers_in_the_checkpoint_are_refused(tmp_path):
    folder, _ = _save_base("bert", tmp_path / "layers", num_hidden_layers=3)
    _edit_config(folder, num_hidden_layers=2)
    with pytest.raises(CheckpointError, match=r"no place for: encoder\.layer\.2\."):
        load_pretrained_classifier(folder, 2, log=lambda _: None)


def test_missing_encoder_weights_are_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    folder, _ = _save_base("electra", tmp_path / "holes")
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["encoder.layer.1.attention.self.value.weight"]
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"missing from the checkpoint: electra\.encoder\.layer\.1\.attention\.self\.value"):
        load_pretrained_classifier(folder, 2, log=lambda _: None)


@pytest.mark.parametrize(
    "kind, ctor, dropped",
    [
        ("electra", "ElectraForPreTraining", "discriminator_predictions."),
        ("bert", "BertForPreTraining", "cls."),
        ("roberta", "RobertaForMaskedLM", "lm_head."),
        ("xlm-roberta", "XLMRobertaForTokenClassification", "classifier."),
    ],
)
def test_pretraining_checkpoints_load_but_not_silently(kind, ctor, dropped, tmp_path):
    torch.manual_seed(0)
    saved = getattr(transformers, ctor)(_config(kind))
    folder = _save(saved, tmp_path / ctor)
    messages = []
    hf = load_pretrained_classifier(folder, 2, log=messages.append)
    assert len(messages) == 1
    assert "new classification head" in messages[0] and f"ignored ({dropped}" in messages[0]
    expected, loaded = base_model(saved).state_dict(), base_model(hf).state_dict()
    for key, tensor in loaded.items():
        if not key.startswith("pooler."):
            assert torch.equal(tensor, expected[key]), key


def test_decoder_configs_are_refused(tmp_path):
    folder, _ = _save_base("bert", tmp_path / "decoder")
    _edit_config(folder, is_decoder=True)
    with pytest.raises(CheckpointError, match="decoder"):
        load_pretrained_classifier(folder, 2, log=lambda _: None)


@pytest.mark.parametrize("kind", SUPPORTED)
def test_gated_classifier_equals_unmodified_model_with_padding_and_segments(kind, tmp_path):
    folder, _ = _save_base(kind, tmp_path / kind, num_hidden_layers=3)
    hf = load_pretrained_classifier(folder, 3, log=lambda _: None)
    reference = unmodified_reference(hf)
    assert type(reference) is type(hf) and not reference.training
    batch = _batch(hf, kind)
    assert ("token_type_ids" in batch) == (kind in ("bert", "electra"))
    gated = GatedBertClassifier(hf)  # our layer loop over the family's own submodules
    assert all(isinstance(self_attention(layer), GatedBertSelfAttention) for layer in encoder_layers(hf))
    assert not any(self_attention(layer).training for layer in encoder_layers(hf))  # took the model's eval mode
    with torch.no_grad():
        expected = reference(**batch).logits
        got = gated(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
        # the second segment really changes the result where the family uses it
        if "token_type_ids" in batch:
            without = reference(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            assert not torch.allclose(without, expected, atol=1e-5)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    # the reference of a gated (unpruned) model is still the plain transformers model
    assert not any(isinstance(self_attention(layer), GatedBertSelfAttention) for layer in encoder_layers(unmodified_reference(hf)))


def test_pruned_model_has_no_unmodified_reference(tmp_path):
    folder, _ = _save_base("roberta", tmp_path / "roberta")
    hf = load_pretrained_classifier(folder, 2, log=lambda _: None)
    layer = encoder_layers(hf)[1]
    gated = GatedBertSelfAttention(self_attention(layer))
    set_self_attention(layer, gated)
    gated.keep_heads([0, 2], attention_output_dense(layer))
    assert attention_output_dense(layer).in_features == 2 * gated.head_dim
    with pytest.raises(ValueError, match="layer 1 has 2 of 4 heads"):
        unmodified_reference(hf)


@pytest.mark.parametrize("kind", SUPPORTED)
def test_classifier_from_config_round_trips_a_saved_config(kind):
    torch.manual_seed(0)
    source = ARCHITECTURES[kind].classifier()(_config(kind, num_labels=4))
    rebuilt = classifier_from_config(source.config.to_dict())
    assert type(rebuilt) is type(source)
    assert rebuilt.config._attn_implementation == "sdpa"
    rebuilt.load_state_dict(source.state_dict())


def test_classifier_from_config_refuses_unsupported_types():
    with pytest.raises(CheckpointError, match="'distilbert' is not supported"):
        classifier_from_config(transformers.DistilBertConfig().to_dict())
    with pytest.raises(CheckpointError, match="None is not supported"):
        classifier_from_config({})
