"""Artifacts written by the code before the one-core redesign (commit 0cdbf34) still load and
mean what they meant: checkpoints of every family give the logits they gave, and the run
directory still reports, benches and exports. The fixture was written once by
tests/fixtures/legacy/make_legacy.py at that commit and must not be regenerated."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from budgeted_attention import checkpoint
from budgeted_attention.cli import main

LEGACY = Path(__file__).parent / "fixtures" / "legacy"


@pytest.mark.parametrize("name", ["decoder", "bert"])
def test_legacy_family_checkpoints_give_the_same_logits(name):
    pytest.importorskip("transformers")
    model, _ = checkpoint.load_model(LEGACY / f"{name}.safetensors")
    expected = load_file(LEGACY / f"{name}.expected.safetensors")
    ids = expected["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(ids), expected["dense"], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(model(ids, budget=0.5), expected["b0.5"], atol=1e-5, rtol=1e-5)


def test_legacy_run_checkpoints_give_the_same_logits():
    expected = load_file(LEGACY / "run.expected.safetensors")
    ids = expected["input_ids"]
    for name in ("dense", "budgeted", "budgeted-hard"):
        model, description = checkpoint.load_model(LEGACY / "run" / "checkpoints" / "seed0" / f"{name}.safetensors")
        checkpoint.verify_artifacts(LEGACY / "run" / "checkpoints" / "seed0" / f"{name}.safetensors", description, LEGACY / "run", model)
        with torch.no_grad():
            torch.testing.assert_close(model.eval()(ids), expected[f"{name}.dense"], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(model(ids, budget=0.5), expected[f"{name}.b0.5"], atol=1e-5, rtol=1e-5)


@pytest.fixture
def legacy_run(tmp_path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(LEGACY / "run", run)
    return run


def test_legacy_run_reports(legacy_run, tmp_path):
    out = tmp_path / "doc" / "results.md"
    assert main(["report", str(legacy_run), "--out", str(out)]) in (0, None)
    text = out.read_text()
    assert "budgeted-hard" in text


def test_legacy_run_benches_and_exports(legacy_run, tmp_path):
    pytest.importorskip("onnxruntime")
    bench = ["bench", str(legacy_run), "--budgets", "0.5", "--batch-sizes", "1", "--seq-lens", "8", "--rounds", "1", "--min-run-time", "0.005"]
    assert main(bench) in (0, None)
    assert main(["export", str(legacy_run), "--budget", "0.5", "--out", str(tmp_path / "onnx")]) in (0, None)
    assert list((tmp_path / "onnx").glob("*.onnx"))
