import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from budgeted_attention.errors import ConfigError
from budgeted_attention.io import set_writes_enabled, write_json_atomic
from budgeted_attention.training import distributed
from budgeted_attention.training.distributed import Runtime, resolve_device, shard

WORKER = Path(__file__).parent / "ddp_worker.py"


def run_worker(args, tmp_path, nproc=1, expect_success=True):
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    if nproc == 1:
        command = [sys.executable, str(WORKER), *args]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", str(WORKER), *args]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    if expect_success:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_shards_cover_the_global_batch_with_scales_that_average_to_one():
    batch = (torch.arange(10).view(10, 1),)
    pieces = [shard(batch, Runtime(rank=r, world_size=3)) for r in range(3)]
    assert torch.cat([p[0][0] for p in pieces]).flatten().tolist() == list(range(10))
    assert [p[1] for p in pieces] == pytest.approx([3 * 4 / 10, 3 * 3 / 10, 3 * 3 / 10])
    assert sum(p[1] for p in pieces) / 3 == pytest.approx(1.0)
    tiny = [shard((torch.arange(1).view(1, 1),), Runtime(rank=r, world_size=2)) for r in range(2)]
    assert tiny[1][1] == 0.0 and tiny[1][0][0].shape[0] == 1  # an empty shard joins with scale 0
    assert shard(batch, Runtime()) == (batch, 1.0)


def test_device_choices_are_checked():
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ConfigError, match="device must be one of"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        assert resolve_device("auto") == torch.device("cpu")
        with pytest.raises(ConfigError, match="no CUDA GPU"):
            resolve_device("cuda")
        with pytest.raises(ConfigError, match="bf16"):
            distributed.setup("cpu", bf16=True)


def test_a_process_with_writes_disabled_leaves_no_file(tmp_path):
    set_writes_enabled(False)
    try:
        write_json_atomic(tmp_path / "x.json", {"a": 1})
    finally:
        set_writes_enabled(True)
    assert list(tmp_path.iterdir()) == []
    write_json_atomic(tmp_path / "x.json", {"a": 1})
    assert json.loads((tmp_path / "x.json").read_text()) == {"a": 1}


@pytest.mark.slow
def test_two_gloo_processes_train_the_same_weights_as_one(tmp_path):
    """20 steps (dense, then budgeted with a teacher and sampled budgets) on a global batch of 8 with
    a last partial batch: 2 processes x 4 rows == 1 process x 8 rows."""
    run_worker(["steps", str(tmp_path / "one")], tmp_path)
    run_worker(["steps", str(tmp_path / "two")], tmp_path, nproc=2)
    one = load_file(str(tmp_path / "one" / "weights.safetensors"))
    two = load_file(str(tmp_path / "two" / "weights.safetensors"))
    assert one.keys() == two.keys()
    # The key bias is left out: its gradient is exactly zero in exact arithmetic (softmax is
    # invariant to a per-query constant), so what it receives is rounding noise that AdamW scales
    # to learning-rate-sized steps. It cannot change any output, which the logits check shows.
    for name in [k for k in one if k.endswith("attn.qkv_bias")]:
        one[name], two[name] = (t.view(2, 3, -1)[:, [0, 2]] for t in (one[name], two[name]))
    worst = max(float((one[k] - two[k]).abs().max()) for k in one)
    assert worst <= 1e-5, worst
    assert json.loads((tmp_path / "two" / "replaced-rank1.json").read_text()) == []


@pytest.mark.slow
def test_experiment_under_torchrun_matches_one_process_and_only_rank_0_writes(tmp_path, tiny_data_and_model):
    # Two seeds, so units follow a rank-0-only bench unit: every rank must make the same
    # collectives per unit there, or the job hangs (it did once).
    config = tmp_path / "tiny.yaml"
    config.write_text(f"""
name: tiny-ddp
seeds: [0, 1]
methods: [dense, budgeted, budgeted-hard, ladder]
budgets: [0.5, 1.0]
ladder: [{{n_layers: 1}}]
{tiny_data_and_model}
train: {{dense_steps: 6, budgeted_steps: 6, hard_steps: 4, batch_size: 8, device: cpu}}
bench: {{rounds: 1, min_run_time: 0.005}}
""")
    run_worker(["experiment", str(config), str(tmp_path / "one")], tmp_path)
    run_worker(["experiment", str(config), str(tmp_path / "two")], tmp_path, nproc=2)
    assert json.loads((tmp_path / "two" / "replaced-rank1.json").read_text()) == []
    assert json.loads((tmp_path / "two" / "replaced-rank0.json").read_text())  # rank 0 wrote the run
    # Only rank 0 times (the bench units and the ladder's timing): timing beside another rank contends.
    assert json.loads((tmp_path / "two" / "timed-rank1.json").read_text()) == []
    assert "bench_against_reference" in json.loads((tmp_path / "two" / "timed-rank0.json").read_text())  # the ladder

    def accuracies(run):
        rows = json.loads((run / "results.json").read_text())["rows"]
        return {(r["method"], r["budget"]): (r["accuracy"], r["val_accuracy"]) for r in rows}

    assert accuracies(tmp_path / "one" / "run") == accuracies(tmp_path / "two" / "run")
    ladder = [r for r in json.loads((tmp_path / "two" / "run" / "results.json").read_text())["rows"] if r["method"] == "ladder"]
    assert len(ladder) == 2 and all(r["speedup"] > 0 for r in ladder)  # timed by rank 0 alone
    files = lambda run: sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file())  # noqa: E731
    assert files(tmp_path / "one" / "run") == files(tmp_path / "two" / "run")
    # Resume under torchrun: every unit is read back, nothing is retrained or rewritten by rank 1.
    run_worker(["experiment", str(config), str(tmp_path / "two")], tmp_path, nproc=2)
    assert json.loads((tmp_path / "two" / "replaced-rank1.json").read_text()) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
def test_training_on_cuda_matches_the_cpu(tiny_run):
    """The dense and budgeted stages on the GPU (data, teacher, costs and masks on the device)."""
    from budgeted_attention.data.dataset import Split
    from budgeted_attention.model.config import ModelConfig
    from budgeted_attention.model.transformer import EncoderClassifier
    from budgeted_attention.training.config import TrainConfig
    from budgeted_attention.training.stages import train_budgeted, train_dense

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 40, (32, 10), generator=generator)
    train = Split(ids, torch.ones_like(ids), torch.randint(0, 3, (32,), generator=generator))
    cfg = TrainConfig(batch_size=8, dense_steps=5, budgeted_steps=5)
    results = {}
    for device in ("cpu", "cuda"):
        distributed.use(Runtime(torch.device(device)))
        try:
            torch.manual_seed(0)
            model = EncoderClassifier(ModelConfig(vocab_size=40, n_classes=3, max_len=10, d_model=16, n_layers=2, n_heads=2, d_ff=32, dropout=0.0))
            train_dense(model, train.to(device), cfg, seed=0, progress=False)
            train_budgeted(model, train.to(device), cfg, model.unit_costs(10), seed=0, teacher=model, progress=False)
            results[device] = {k: v.cpu() for k, v in model.state_dict().items()}
        finally:
            distributed.use(Runtime())
    assert max(float((results["cpu"][k] - results["cuda"][k]).abs().max()) for k in results["cpu"] if not k.endswith("qkv_bias")) < 1e-3


@pytest.mark.slow
def test_a_failing_rank_ends_the_job_instead_of_hanging(tmp_path):
    result = run_worker(["fail", str(tmp_path / "fail")], tmp_path, nproc=2, expect_success=False)
    assert result.returncode != 0 and "rank 1 failed on purpose" in result.stderr
