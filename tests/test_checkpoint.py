import json

import pytest
import torch

from budgeted_attention.checkpoint import load_model, save_model
from budgeted_attention.errors import CheckpointError
from budgeted_attention.model.gates import UnitGates
from budgeted_attention.pruning.selection import Ranking
from budgeted_attention.pruning.surgery import keep_heads


def test_round_trip(tiny_model, tiny_ids, tmp_path):
    ranking = Ranking.from_scores(UnitGates(torch.rand(3, 4)))
    save_model(tiny_model, tmp_path / "m", ranking=ranking.to_dict())
    loaded, description = load_model(tmp_path / "m.json")
    assert Ranking.from_dict(description["ranking"]) == ranking
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


def _tokenizer(folder, texts, permute=False):
    """A word-level tokenizer of ``texts`` saved as ``folder/tokenizer.json`` (``permute``: the same
    vocabulary with its ids reversed: same size, other digest)."""
    from budgeted_attention.data.text import build_tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tokenizer.json"
    build_tokenizer(texts, max_len=8, min_frequency=1, max_vocab=100).save(str(path))
    if permute:
        _reorder_vocabulary(path)
    return path


def _reorder_vocabulary(path):
    """Reverse the ids of a word-level ``tokenizer.json`` in place (same words and size, other digest)."""
    data = json.loads(path.read_text())
    vocab = data["model"]["vocab"]
    data["model"]["vocab"] = {token: len(vocab) - 1 - index for token, index in vocab.items()}
    path.write_text(json.dumps(data))


def test_checkpoint_records_its_tokenizer_and_labels_and_refuses_others(tiny_model, tmp_path):
    from budgeted_attention.checkpoint import read_description, verify_artifacts
    from budgeted_attention.io import sha256_file

    run = tmp_path / "run"
    tokenizer = _tokenizer(run, ["a cat sat", "a dog ran far"])
    (run / "labels.json").write_text(json.dumps({"class_names": ["x", "y", "z"]}))
    save_model(tiny_model, run / "m", artifacts_dir=run)
    description = read_description(run / "m")
    assert description["tokenizer"] == {"file": "tokenizer.json", "sha256": sha256_file(tokenizer), "vocab_size": 9}
    assert description["labels"]["sha256"] == sha256_file(run / "labels.json") and description["labels"]["n_labels"] == 3
    verify_artifacts(run / "m", description, run)  # its own files
    verify_artifacts(run / "m", description, tmp_path / "empty")  # absent files are not checked here

    other = _tokenizer(tmp_path / "other", ["the quick brown fox", "jumps"])  # another run's
    with pytest.raises(CheckpointError, match=f"'{other}' is not the tokenizer '{run / 'm.json'}' was trained with"):
        verify_artifacts(run / "m", description, tmp_path / "other")
    reordered = _tokenizer(tmp_path / "reordered", ["a cat sat", "a dog ran far"], permute=True)
    assert json.loads(reordered.read_text())["model"]["vocab"] != json.loads(tokenizer.read_text())["model"]["vocab"]
    with pytest.raises(CheckpointError, match=r"reordered/tokenizer.json' is not the tokenizer .* 9 tokens; recorded .* 9 tokens"):
        verify_artifacts(run / "m", description, tmp_path / "reordered")
    (tmp_path / "reordered" / "labels.json").write_text(json.dumps({"class_names": ["z", "y", "x"]}))
    (tmp_path / "reordered" / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match="labels.json' is not the labels file .*m.json"):
        verify_artifacts(run / "m", description, tmp_path / "reordered")


def test_old_checkpoints_without_provenance_still_refuse_a_tokenizer_too_big_for_the_model(tiny_model, tmp_path):
    from budgeted_attention.checkpoint import verify_artifacts

    save_model(tiny_model, tmp_path / "m")  # no artifacts_dir: what older code wrote
    model, description = load_model(tmp_path / "m")
    assert "tokenizer" not in description
    small = _tokenizer(tmp_path / "small", ["a cat sat"])  # 6 tokens, the model has 29 rows
    verify_artifacts(tmp_path / "m", description, small.parent, model)
    big = _tokenizer(tmp_path / "big", [" ".join(f"w{i}" for i in range(40))])
    for given in (model, None):  # the model's embedding, or the description's vocab_size
        with pytest.raises(CheckpointError, match=f"'{big}' has 43 tokens, more than the 29 embedding rows of '.*m.json'"):
            verify_artifacts(tmp_path / "m", description, big.parent, given)
    (small.parent / "labels.json").write_text(json.dumps({"class_names": ["x", "y"]}))  # the model has 3 outputs
    with pytest.raises(CheckpointError, match="names 2 classes, '.*m.json' has 3 outputs"):
        verify_artifacts(tmp_path / "m", description, small.parent)


@pytest.mark.filterwarnings("ignore:skipped")
@pytest.mark.parametrize("command", ["bench", "export"])
def test_bench_and_export_refuse_another_runs_tokenizer_with_one_line(tiny_run, tmp_path, capsys, command):
    import shutil

    from budgeted_attention.cli import main

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    _reorder_vocabulary(run / "tokenizer.json")
    bench = (run / "bench.json").read_bytes()
    fast = ["--budgets", "0.5", "--batch-sizes", "1", "--seq-lens", "8", "--rounds", "1", "--min-run-time", "0.001", "--no-progress"]
    code = main([command, str(run), *(fast if command == "bench" else ["--budget", "0.5"])])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("baa: error:"), err
    assert f"'{run / 'tokenizer.json'}' is not the tokenizer" in err[0] and "budgeted-hard.json" in err[0]
    assert (run / "bench.json").read_bytes() == bench and not (run / "onnx").exists()  # refused before anything was written
