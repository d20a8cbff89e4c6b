import json

import pytest
import torch

from budgeted_attention.checkpoint import load_model, save_model
from budgeted_attention.errors import CheckpointError
from budgeted_attention.pruning.selection import HeadRanking
from budgeted_attention.pruning.surgery import keep_heads


def test_round_trip(tiny_model, tiny_ids, tmp_path):
    ranking = HeadRanking.from_scores(torch.rand(3, 4))
    save_model(tiny_model, tmp_path / "m", ranking=ranking.to_dict())
    loaded, description = load_model(tmp_path / "m.json")
    assert HeadRanking.from_dict(description["ranking"]) == ranking
    with torch.no_grad():
        assert torch.equal(loaded(tiny_ids, budget=0.4), tiny_model(tiny_ids, budget=0.4))


def test_pruned_round_trip_with_uneven_and_empty_layers(tiny_model, tiny_ids, tmp_path):
    pruned = keep_heads(tiny_model, [[1, 2], [], [0, 1, 3]])
    save_model(pruned, tmp_path / "p", kept_heads=[[1, 2], [], [0, 1, 3]])
    loaded, description = load_model(tmp_path / "p")
    assert loaded.config.heads_per_layer == [2, 0, 3]
    assert description["kept_heads"] == [[1, 2], [], [0, 1, 3]]
    with torch.no_grad():
        assert torch.equal(loaded(tiny_ids), pruned(tiny_ids))


def test_truncated_weights_fail_clearly(tiny_model, tmp_path):
    save_model(tiny_model, tmp_path / "m")
    weights = tmp_path / "m.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="SHA-256"):
        load_model(tmp_path / "m")


def test_corrupted_description_and_missing_files(tiny_model, tmp_path):
    save_model(tiny_model, tmp_path / "m")
    (tmp_path / "m.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_model(tmp_path / "m")
    with pytest.raises(CheckpointError, match="not found"):
        load_model(tmp_path / "absent")


def test_mismatched_config_fails_clearly(tiny_model, tmp_path):
    save_model(tiny_model, tmp_path / "m")
    description = json.loads((tmp_path / "m.json").read_text())
    description["architecture"]["model_config"]["d_ff"] = 40
    (tmp_path / "m.json").write_text(json.dumps(description))
    with pytest.raises(CheckpointError, match="does not fit"):
        load_model(tmp_path / "m")


def test_weights_from_another_checkpoint_fail(tiny_model, tmp_path):
    save_model(tiny_model, tmp_path / "a")
    other = keep_heads(tiny_model, [[0], [1], [2]])
    save_model(other, tmp_path / "b")
    (tmp_path / "a.safetensors").write_bytes((tmp_path / "b.safetensors").read_bytes())
    with pytest.raises(CheckpointError, match="does not match"):
        load_model(tmp_path / "a")


def test_malformed_ranking_is_a_checkpoint_error(tiny_model, tmp_path):
    from budgeted_attention.checkpoint import load_ranking

    save_model(tiny_model, tmp_path / "m", ranking={"order": [[0, 0]], "n_layers": 3})
    model, description = load_model(tmp_path / "m")
    with pytest.raises(CheckpointError, match="malformed head ranking"):
        load_ranking(tmp_path / "m", description, model)
    save_model(tiny_model, tmp_path / "n")
    model, description = load_model(tmp_path / "n")
    with pytest.raises(CheckpointError, match="no head ranking"):
        load_ranking(tmp_path / "n", description, model)


def test_unknown_family_and_old_format_fail_clearly(tiny_model, tmp_path):
    save_model(tiny_model, tmp_path / "m")
    description = json.loads((tmp_path / "m.json").read_text())
    description["family"] = "mystery"
    (tmp_path / "m.json").write_text(json.dumps(description))
    with pytest.raises(CheckpointError, match="unknown model family 'mystery'"):
        load_model(tmp_path / "m")
    description["format"] = "budgeted_attention.encoder/1"
    (tmp_path / "m.json").write_text(json.dumps(description))
    with pytest.raises(CheckpointError, match="not a budgeted_attention/2 checkpoint"):
        load_model(tmp_path / "m")


def test_sorted_and_pruned_models_keep_their_head_identity_through_save_load(tiny_model, tiny_ids, tmp_path):
    pruned = keep_heads(tiny_model, [[3, 1], [], [2]])
    save_model(pruned, tmp_path / "p")
    loaded, _ = load_model(tmp_path / "p")
    assert loaded.head_ids == [[3, 1], [], [2]]
    with torch.no_grad():
        assert torch.equal(loaded(tiny_ids, budget=0.6), pruned(tiny_ids, budget=0.6))
