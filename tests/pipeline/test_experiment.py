import json
from pathlib import Path

import pytest

from budgeted_attention.errors import CheckpointError, ConfigError
from budgeted_attention.pipeline import Experiment, context, load_experiment_config
from budgeted_attention.pipeline.methods.budgeted import Budgeted
from budgeted_attention.pipeline.methods.dense import Dense
from budgeted_attention.pipeline.methods.hard import BudgetedHard
from budgeted_attention.pipeline.methods.ladder import Ladder
from budgeted_attention.pipeline.methods.static import Static
from conftest import TINY_DATA_AND_MODEL

LATENCY_FIELDS = {"latency_ms", "dense_latency_ms", "speedup", "bench_batch_size", "bench_seq_len", "threads", "bench_input"}

CONFIG = f"""
name: tiny
seeds: [0, 1]
budgets: [0.5, 1.0]
static_budgets: [0.5]
{TINY_DATA_AND_MODEL}
train: {{dense_steps: 6, budgeted_steps: 6, hard_steps: 4, recovery_steps: 2, batch_size: 8}}
bench: {{rounds: 1, min_run_time: 0.005}}
"""


def _config(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(CONFIG)
    return load_experiment_config(str(path))


def _accuracy_rows(out: Path):
    rows = json.loads((out / "results.json").read_text())["rows"]
    return [{k: v for k, v in row.items() if k not in LATENCY_FIELDS and not k.endswith("_speedup") or k == "ideal_speedup"} for row in rows]


@pytest.mark.filterwarnings("ignore:skipped")
def test_interrupted_run_resumes_to_identical_results(tmp_path, monkeypatch):
    cfg = _config(tmp_path)
    Experiment(cfg, tmp_path / "straight", progress=False, log=lambda *_: None).run()

    original = Static.train
    calls = {"n": 0}

    def crash_once(self, ctx, unit):
        calls["n"] += 1
        if calls["n"] == 2:  # seed 1's static unit: seed 0's units are finished by then
            raise KeyboardInterrupt
        return original(self, ctx, unit)

    monkeypatch.setattr(Static, "train", crash_once)
    with pytest.raises(KeyboardInterrupt):
        Experiment(cfg, tmp_path / "resumed", progress=False, log=lambda *_: None).run()
    assert not (tmp_path / "resumed" / "results.json").exists()
    finished = sorted(p.name for p in (tmp_path / "resumed" / "units" / "seed0").glob("*.json"))
    assert "dense.json" in finished and "static-b0.5.json" in finished and "bench-static-b0.5.json" in finished
    static = [r for r in json.loads((tmp_path / "straight" / "results.json").read_text())["rows"] if r["method"] == "static"]
    assert static and all(r["speedup"] > 0 for r in static)  # timed by its own unit (bench-static-b0.5)

    monkeypatch.setattr(Static, "train", original)
    messages = []
    Experiment(cfg, tmp_path / "resumed", progress=False, log=messages.append).run()
    assert any("resuming" in str(m) for m in messages)
    assert _accuracy_rows(tmp_path / "straight") == _accuracy_rows(tmp_path / "resumed")

    methods = {r["method"] for r in _accuracy_rows(tmp_path / "resumed")}
    assert methods == {"dense", "dense-long", "budgeted", "budgeted-hard", "static", "static-soft", "posthoc",
                       "posthoc-recovered", "posthoc-recovered-1ep"}
    for name in ("results.csv", "results.md", "accuracy_vs_budget.png", "accuracy_vs_speedup.png", "tokenizer.json", "config.yaml"):
        assert (tmp_path / "resumed" / name).is_file()


@pytest.mark.filterwarnings("ignore:skipped")
def test_refuses_to_resume_with_another_config(tmp_path):
    cfg = _config(tmp_path)
    cfg.methods = ["dense"]
    Experiment(cfg, tmp_path / "run", progress=False, log=lambda *_: None).run()
    cfg.train.dense_steps = 7
    with pytest.raises(ConfigError, match="different configuration"):
        Experiment(cfg, tmp_path / "run", progress=False, log=lambda *_: None)


def test_config_errors_name_the_bad_value(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("methods: [dense, magic]\n")
    with pytest.raises(ConfigError, match="magic"):
        load_experiment_config(str(path))
    path.write_text("budgets: [0.5, 2]\n")
    with pytest.raises(ConfigError, match="2"):
        load_experiment_config(str(path))


def test_shipped_configs_parse():
    root = Path(__file__).parents[2] / "configs"
    for name in ("synthetic", "ag_news", "dbpedia14", "bbc_short", "bbc_news", "minilm_bbc_short", "bert_mini_ag_news", "bert_mini_dbpedia14",
                 "bbc_short_all", "minilm_bbc_short_all"):
        cfg = load_experiment_config(str(root / f"{name}.yaml"))
        assert cfg.name
    from budgeted_attention.recipes.demo import load_demo_config

    for name in ("synthetic_d256", "demo_ablation", "demo_all", "d256_all"):
        assert load_demo_config(str(root / f"{name}.yaml"), [], quick=False).name


@pytest.mark.filterwarnings("ignore:skipped")
def test_rows_record_steps_and_equal_step_controls(tmp_path):
    cfg = _config(tmp_path)
    cfg.seeds = [0]
    experiment = Experiment(cfg, tmp_path / "run", progress=False, log=lambda *_: None)
    experiment.run()
    rows = json.loads((tmp_path / "run" / "results.json").read_text())["rows"]
    steps = {(r["method"], r["budget"]): r["steps"] for r in rows}
    train = cfg.train
    path = train.budgeted_steps + train.hard_steps
    assert steps[("dense", 1.0)] == train.dense_steps
    assert steps[("dense-long", 1.0)] == train.dense_steps + path == steps[("budgeted-hard", 0.5)]
    assert steps[("budgeted", 0.5)] == train.dense_steps + train.budgeted_steps
    assert steps[("static", 0.5)] == train.dense_steps + path
    assert steps[("posthoc", 0.5)] == train.dense_steps
    assert steps[("posthoc-recovered", 0.5)] == train.dense_steps + train.recovery_steps
    assert steps[("posthoc-recovered-1ep", 0.5)] == train.dense_steps + train.epoch_steps(len(experiment.context.splits.train))
    kinds = {r["method"]: r["cost_kind"] for r in rows}
    assert kinds["budgeted"] == kinds["static-soft"] == "soft-estimate"
    assert kinds["static"] == kinds["budgeted-hard"] == kinds["posthoc"] == "kept-heads"
    for row in rows:
        assert row["val_accuracy"] is not None
        if row["cost_kind"] != "kept-heads":
            assert row.get("speedup") is None  # soft estimates never get a measured speed
    static = [r for r in rows if r["method"] == "static"][0]
    assert static["speedup"] > 0 and static["heads_kept"] == 2

    # The budgeted-hard checkpoint: the ranking its (frozen) gates define is the stored one.
    from budgeted_attention.checkpoint import load_model, load_ranking
    from budgeted_attention.model.gates import UnitGates
    from budgeted_attention.pruning.selection import Ranking

    path = tmp_path / "run" / "checkpoints" / "seed0" / "budgeted-hard"
    model, description = load_model(path)
    expected = Ranking.from_scores(UnitGates(model.gates.importance()), min_one_per_layer=cfg.min_one_per_layer)
    assert expected == load_ranking(path, description, model)

    # A corrupted finished-unit record is a one-line error naming the file, not a traceback.
    (tmp_path / "run" / "units" / "seed0" / "posthoc.json").write_text("{oops")
    with pytest.raises(CheckpointError, match="posthoc.json"):
        Experiment(cfg, tmp_path / "run", progress=False, log=lambda *_: None).run()


@pytest.mark.filterwarnings("ignore:skipped")
def test_test_split_is_read_only_in_final_evaluation(tmp_path, monkeypatch):
    from budgeted_attention.data.dataset import SealedSplit, TestSplitSealedError

    inside = {"depth": 0, "reads": 0}
    original_evaluate = context.evaluate_model
    original_open = SealedSplit.final_evaluation

    def tracking_evaluate(*args, **kwargs):
        inside["depth"] += 1
        try:
            return original_evaluate(*args, **kwargs)
        finally:
            inside["depth"] -= 1

    def guarded_open(self):
        assert inside["depth"] == 1, "test split opened outside the final evaluation"
        inside["reads"] += 1
        return original_open(self)

    monkeypatch.setattr(context, "evaluate_model", tracking_evaluate)
    monkeypatch.setattr(SealedSplit, "final_evaluation", guarded_open)
    cfg = _config(tmp_path)
    cfg.seeds = [0]
    experiment = Experiment(cfg, tmp_path / "run", progress=False, log=lambda *_: None)
    experiment.run()
    assert inside["reads"] > 0
    with pytest.raises(TestSplitSealedError):  # any other read fails loudly
        experiment.context.splits.test.labels


def test_a_run_that_failed_validation_can_be_rerun_into_the_same_out(tmp_path):
    out = tmp_path / "run"
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG.replace("max_len: 16, dropout", "max_len: 4, dropout"))  # model shorter than the data
    with pytest.raises(ConfigError, match="max_len"):
        Experiment(load_experiment_config(str(path)), out, progress=False, log=lambda *_: None)
    assert not (out / "config.sha256").exists()
    cfg = _config(tmp_path)
    cfg.seeds, cfg.methods = [0], ["dense"]
    Experiment(cfg, out, progress=False, log=lambda *_: None).run()
    assert (out / "results.json").is_file()


def test_lengths_and_budgets_are_checked_before_any_training(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG.replace("bench: {{rounds: 1".replace("{{", "{"), "bench: {seq_lens: [64], rounds: 1"))
    with pytest.raises(ConfigError, match=r"bench.seq_lens \[64\]"):
        Experiment(load_experiment_config(str(path)), tmp_path / "run", progress=False, log=lambda *_: None)
    assert not (tmp_path / "run" / "config.sha256").exists()
    with pytest.raises(ConfigError, match="listed twice"):
        load_experiment_config(str(path), ["budgets=[0.5, 0.5, 1.0]"])


@pytest.mark.filterwarnings("ignore:skipped")
def test_all_scope_pipeline_prunes_heads_and_ffn_and_benches_both_scopes(tmp_path):
    path = tmp_path / "all.yaml"
    path.write_text(CONFIG.replace("name: tiny", "name: tiny-all\nbudget_scope: all\nffn_group_size: 8")
                    .replace("seeds: [0, 1]", "seeds: [0]"))
    cfg = load_experiment_config(str(path), ["methods=[dense,budgeted,budgeted-hard,budgeted-sandwich,budgeted-hard-sandwich,static,posthoc,posthoc-recovered]"])
    experiment = Experiment(cfg, tmp_path / "run", progress=False, log=lambda *_: None)
    experiment.run()
    rows = json.loads((tmp_path / "run" / "results.json").read_text())["rows"]
    hard = {(r["method"], r["budget"]): r for r in rows if r["cost_kind"] == "kept-heads"}
    for method in ("budgeted-hard", "budgeted-hard-sandwich", "static", "posthoc", "posthoc-recovered"):
        row = hard[(method, 0.5)]
        assert row["scope"] == "all"
        assert row["cost"] <= 0.5 + 1e-9  # the kept units' FLOPs fit the budget
        assert row["ffn_per_layer"] and all(w % 8 == 0 for w in row["ffn_per_layer"])
        assert sum(row["ffn_per_layer"]) < 2 * 32  # the FFN was pruned too
        assert row["ideal_speedup"] > 1.0
    for method in ("budgeted-hard", "budgeted-hard-sandwich"):
        assert hard[(method, 0.5)]["speedup"] > 0  # measured
    bench = json.loads((tmp_path / "run" / "bench.json").read_text())
    assert {r["scope"] for r in bench["rows"]} == {"heads", "all"}
    assert (tmp_path / "run" / "bench-sandwich.json").is_file()

    from budgeted_attention.checkpoint import load_model, load_ranking
    from budgeted_attention.pruning.selection import Ranking

    ckpt = tmp_path / "run" / "checkpoints" / "seed0" / "budgeted-hard"
    model, description = load_model(ckpt)
    ranking = load_ranking(ckpt, description, model)
    assert isinstance(ranking, Ranking)
    costs = model.unit_costs(experiment.context.splits.seq_len)  # reference_seq_len 0: the data's padded length
    assert Ranking.from_scores(model.unit_importance(), costs, cfg.min_one_per_layer) == ranking


def test_scope_config_is_validated(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG)
    with pytest.raises(ConfigError, match="budget_scope"):
        load_experiment_config(str(path), ["budget_scope=everything"])
    with pytest.raises(ConfigError, match="ffn_group_size"):
        Experiment(load_experiment_config(str(path), ["budget_scope=all", "ffn_group_size=5"]), tmp_path / "r", progress=False)
    with pytest.raises(ConfigError, match="budget_sampling"):
        load_experiment_config(str(path), ["train.budget_sampling=sometimes"])


@pytest.mark.filterwarnings("ignore:skipped")
def test_ladder_trains_smaller_dense_models_for_equal_steps_and_times_them(tmp_path):
    path = tmp_path / "ladder.yaml"
    path.write_text(CONFIG.replace("seeds: [0, 1]", "seeds: [0]") + "ladder: [{d_model: 8, n_layers: 1, d_ff: 16}]\n")
    cfg = load_experiment_config(str(path), ["methods=[dense,ladder]"])
    Experiment(cfg, tmp_path / "run", progress=False, log=lambda *_: None).run()
    rows = json.loads((tmp_path / "run" / "results.json").read_text())["rows"]
    ladder = [r for r in rows if r["method"] == "ladder"]
    assert len(ladder) == 1
    row = ladder[0]
    assert row["cost_kind"] == "smaller-dense" and 0 < row["cost"] < 0.5
    assert row["steps"] == cfg.train.dense_steps + cfg.path_steps  # equal steps with budgeted-hard
    assert row["speedup"] > 0 and row["ideal_speedup"] == pytest.approx(1 / row["cost"])
    # The timing is a unit of its own: redone (on a quiet machine) without retraining the model.
    units = tmp_path / "run" / "units" / "seed0"
    trained = (units / "ladder-0.json").read_text()
    (units / "bench-ladder-0.json").unlink()
    Experiment(cfg, tmp_path / "run", progress=False, log=lambda *_: None).run()
    assert (units / "ladder-0.json").read_text() == trained and (units / "bench-ladder-0.json").exists()
    again = [r for r in json.loads((tmp_path / "run" / "results.json").read_text())["rows"] if r["method"] == "ladder"][0]
    assert again["accuracy"] == row["accuracy"] and again["speedup"] > 0
    # A run from before ladder models were saved: the training record holds the timing, which is reused.
    old_style = json.loads(trained)
    old_style["bench"] = json.loads((units / "bench-ladder-0.json").read_text())["bench"]
    (units / "ladder-0.json").write_text(json.dumps(old_style))
    (units / "bench-ladder-0.json").unlink()
    for path in (tmp_path / "run" / "checkpoints" / "seed0").glob("ladder-0.*"):
        path.unlink()
    Experiment(cfg, tmp_path / "run", progress=False, log=lambda *_: None).run()
    reused = [r for r in json.loads((tmp_path / "run" / "results.json").read_text())["rows"] if r["method"] == "ladder"][0]
    assert reused["speedup"] == again["speedup"] and reused["ideal_speedup"] == pytest.approx(1 / row["cost"])
    # Neither the model nor a timing: the error says what to delete.
    (units / "bench-ladder-0.json").unlink()
    (units / "ladder-0.json").write_text(trained)
    with pytest.raises(CheckpointError, match="delete that record to retrain it"):
        Experiment(cfg, tmp_path / "run", progress=False, log=lambda *_: None).run()


@pytest.mark.filterwarnings("ignore:skipped")
def test_ladder_is_early_stopped_on_validation_like_the_dense_warm_start(tmp_path):
    path = tmp_path / "ladder.yaml"
    path.write_text(CONFIG.replace("seeds: [0, 1]", "seeds: [0]") + "ladder: [{d_model: 8, n_layers: 1, d_ff: 16}]\n")
    cfg = load_experiment_config(str(path), ["methods=[dense,ladder]", "train.early_stopping_patience=1", "train.eval_every=5"])
    Experiment(cfg, tmp_path / "run", progress=False, log=lambda *_: None).run()
    units = tmp_path / "run" / "units" / "seed0"
    dense, ladder = (json.loads((units / f"{unit}.json").read_text()) for unit in ("dense", "ladder-0"))
    assert dense["val_history"] and ladder["val_history"]  # both chose their weights on validation
    most = dense["rows"][0]["steps"] + cfg.path_steps  # the ladder's maximum: the path's total steps
    assert ladder["val_history"][-1][0] <= most and ladder["rows"][0]["steps"] <= ladder["steps_run"] <= most


def test_dense_long_is_early_stopped_with_the_budgeted_stages(tmp_path):
    path = tmp_path / "long.yaml"
    path.write_text(CONFIG.replace("seeds: [0, 1]", "seeds: [0]"))
    base = ["methods=[dense,dense-long]", "train.early_stopping_patience=1", "train.eval_every=2"]
    for flag in ("false", "true"):
        cfg = load_experiment_config(str(path), [*base, f"train.early_stop_budgeted={flag}"])
        Experiment(cfg, tmp_path / flag, progress=False, log=lambda *_: None).run()
    units = {flag: tmp_path / flag / "units" / "seed0" for flag in ("false", "true")}
    fixed = json.loads((units["false"] / "dense-long.json").read_text())
    assert "val_history" not in fixed  # the published configs' fixed schedule
    dense, long = (json.loads((units["true"] / f"{unit}.json").read_text()) for unit in ("dense", "dense-long"))
    assert long["val_history"]  # its weights were chosen on validation, as the warm start's were
    extra = long["rows"][0]["steps"] - dense["rows"][0]["steps"]
    assert 0 < extra <= long["steps_run"] <= cfg.path_steps


@pytest.mark.filterwarnings("ignore:skipped")
def test_budgeted_stages_early_stop_on_validation_only_when_asked(tmp_path):
    path = tmp_path / "es.yaml"
    path.write_text(CONFIG.replace("seeds: [0, 1]", "seeds: [0]"))
    base = ["methods=[dense,budgeted,budgeted-hard]", "train.early_stopping_patience=1", "train.eval_every=2"]
    for flag, out in ((False, "plain"), (True, "stopped")):
        cfg = load_experiment_config(str(path), [*base, f"train.early_stop_budgeted={str(flag).lower()}"])
        Experiment(cfg, tmp_path / out, progress=False, log=lambda *_: None).run()
    units = {out: tmp_path / out / "units" / "seed0" for out in ("plain", "stopped")}
    for stage, most in (("budgeted", 6), ("budgeted-hard", 4)):  # train.budgeted_steps, train.hard_steps
        plain = json.loads((units["plain"] / f"{stage}.json").read_text())
        stopped = json.loads((units["stopped"] / f"{stage}.json").read_text())
        assert "val_history" not in plain  # the default: the paper's fixed schedules
        assert stopped["val_history"] and 0 < stopped["val_history"][0][0] <= most
        assert stopped["steps_run"] <= most
    dense = json.loads((units["stopped"] / "dense.json").read_text())["rows"][0]["steps"]
    soft = json.loads((units["stopped"] / "budgeted.json").read_text())
    hard = json.loads((units["stopped"] / "budgeted-hard.json").read_text())
    # Each stage's row counts the steps of the weights it kept: the path is dense + soft + hard best steps.
    soft_best = max(soft["val_history"], key=lambda point: point[1])[0]
    assert soft["rows"][0]["steps"] == dense + soft_best
    assert soft["rows"][0]["steps"] < hard["rows"][0]["steps"] <= soft["rows"][0]["steps"] + 4
    with pytest.raises(ConfigError, match="train.early_stop_budgeted"):
        load_experiment_config(str(path), ["train.early_stop_budgeted=3"])


@pytest.mark.filterwarnings("ignore:skipped")
def test_retime_times_the_saved_models_again_and_trains_nothing(tmp_path, monkeypatch):
    path = tmp_path / "retime.yaml"
    path.write_text(CONFIG.replace("seeds: [0, 1]", "seeds: [0]") + "ladder: [{d_model: 8, n_layers: 1, d_ff: 16}]\n")
    cfg = load_experiment_config(str(path), ["methods=[dense,budgeted,budgeted-hard,ladder]"])
    out = tmp_path / "run"
    Experiment(cfg, out, progress=False, log=lambda *_: None).run()
    units = out / "units" / "seed0"
    before = {p.name: p.read_text() for p in units.glob("*.json")}

    def no_training(*_args, **_kwargs):
        raise AssertionError("a retime must not train")

    for method in (Dense, Budgeted, BudgetedHard, Ladder):
        monkeypatch.setattr(method, "train", no_training)
    messages = []
    Experiment(cfg, out, progress=False, log=messages.append).run(retime=True)
    after = {p.name: p.read_text() for p in units.glob("*.json")}
    timing = {name for name in before if name.startswith("bench")}
    assert timing == {"bench.json", "bench-ladder-0.json"}
    assert all(after[name] == before[name] for name in before if name not in timing)  # training records untouched
    assert all(json.loads(after[name])["seconds"] != json.loads(before[name])["seconds"] for name in timing)  # timed again
    assert any("retiming: 2 timing unit(s) run again" in m for m in messages)
    with pytest.raises(ConfigError, match="--retime"):
        Experiment(cfg, out, progress=False, log=lambda *_: None).run(retime=True, finished_only=True)

    # A timing that fails leaves the records of the others (retimed or not) in place.
    retimed = {name: after[name] for name in timing}

    def broken_bench(*_args, **_kwargs):
        raise RuntimeError("timing failed")

    monkeypatch.setattr(Ladder, "bench", broken_bench)
    with pytest.raises(RuntimeError, match="timing failed"):
        Experiment(cfg, out, progress=False, log=lambda *_: None).run(retime=True)
    assert (units / "bench-ladder-0.json").read_text() == retimed["bench-ladder-0.json"]  # kept, not deleted
    assert (units / "bench.json").read_text() != retimed["bench.json"]  # the unit before it was redone

    # A run that is not finished is refused: a retime trains nothing.
    (units / "ladder-0.json").unlink()
    with pytest.raises(ConfigError, match="misses 1 training unit\\(s\\) \\(seed0/ladder-0\\)"):
        Experiment(cfg, out, progress=False, log=lambda *_: None).run(retime=True)


def test_split_off_timing_units_take_no_seed_index():
    from budgeted_attention.pipeline import Unit, UnitId, seed_indices

    def unit(kind, seed=0, seeded=True, **where):
        return Unit(UnitId(kind, seed, **where), work=None, seeded=seeded)

    plan = [unit("dense"), unit("static", budget=0.5), unit("bench-static", budget=0.5, seeded=False), unit("ladder", index=0),
            unit("bench-ladder", index=0, seeded=False), unit("ladder", index=1), unit("dense", seed=1)]
    # The indices the units had before timing was split off: dense 0, static 1, ladder-0 2, ladder-1 3, seed 1's dense 4.
    assert seed_indices(plan) == [0, 1, 2, 2, 3, 3, 4]


def test_ladder_config_is_validated(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG)
    with pytest.raises(ConfigError, match="ladder"):
        load_experiment_config(str(path), ["methods=[dense,ladder]"])
    with pytest.raises(ConfigError, match="ladder\\[0\\].width"):
        load_experiment_config(str(path), ["methods=[dense,ladder]", "ladder=[{width: 3}]"])
    with pytest.raises(ConfigError, match="ladder\\[0\\]"):
        load_experiment_config(str(path), ["methods=[dense,ladder]", "ladder=[{d_model: 10, n_heads: 3}]"])


def test_digest_of_configs_from_before_the_new_keys_is_unchanged(tmp_path):
    """A run stamped before budget_scope & co. existed still resumes: keys at their defaults are
    left out of the digest; a non-default value changes it."""
    import hashlib

    from budgeted_attention.config import to_dict
    from budgeted_attention.pipeline import config_digest

    path = tmp_path / "c.yaml"
    path.write_text(CONFIG)
    cfg = load_experiment_config(str(path))
    old = to_dict(cfg)
    for key in ("budget_scope", "ffn_group_size", "reference_seq_len", "ladder", "task", "lm_data", "notes", "router", "ffn_sort_examples", "head_cost_weight"):
        del old[key]
    del old["synthetic"]["mixed_markers"]
    for key in ("budget_sampling", "sandwich_random", "device", "bf16", "early_stop_budgeted", "gate_forward", "freeze_embeddings", "gate_init", "hard_budget_min"):
        del old["train"][key]
    for key in ("onnx", "int8", "device", "compile", "cuda_graphs"):
        del old["bench"][key]
    for key in ("ffn_group_size", "ffn_group_ids", "qk_norm", "residual_gate", "attention", "meta", "positions"):
        del old["model"][key]
    assert config_digest(cfg) == hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()
    assert config_digest(load_experiment_config(str(path), ["budget_scope=all", "ffn_group_size=8"])) != config_digest(cfg)
    # Where a run trains does not change what it computes: resumable on another device.
    assert config_digest(load_experiment_config(str(path), ["train.device=cpu"])) == config_digest(cfg)


@pytest.mark.filterwarnings("ignore:skipped")
def test_finished_only_writes_a_partial_run_marked_as_such(tmp_path):
    from budgeted_attention.reporting.report import load_run, run_section

    cfg = _config(tmp_path)
    cfg.methods = ["dense", "budgeted"]
    out = tmp_path / "run"
    experiment = Experiment(cfg, out, progress=False, log=lambda *_: None)
    experiment.run_unit(experiment.plan()[0], 0)  # seed 0's dense model only
    Experiment(cfg, out, progress=False, log=lambda *_: None).run(finished_only=True)
    results = json.loads((out / "results.json").read_text())
    assert {r["method"] for r in results["rows"]} == {"dense"}
    assert "PARTIAL RUN: 1 of 4 units" in results["partial"]
    assert "PARTIAL RUN" in run_section(load_run(out), figures_dir=None, out=None)


def test_per_input_routing_methods_train_calibrate_and_time_at_equal_steps(tmp_path):
    path = tmp_path / "routed.yaml"
    path.write_text(CONFIG.replace("seeds: [0, 1]", "seeds: [0]").replace("budgets: [0.5, 1.0]", "budgets: [0.5, 0.75, 1.0]")
                    .replace("n_heads: 2", "n_heads: 4").replace("rounds: 1", "rounds: 1, batch_sizes: [1, 4]"))
    cfg = load_experiment_config(str(path), ["methods=[dense,budgetformer,capped-routing]"])
    Experiment(cfg, tmp_path / "run", progress=False, log=lambda *_: None).run()
    rows = json.loads((tmp_path / "run" / "results.json").read_text())["rows"]
    learned = [r for r in rows if r["method"] == "budgetformer"]
    capped = {r["budget"]: r for r in rows if r["method"] == "capped-routing"}
    assert len(learned) == 1 and learned[0]["variant"] == "learned budget" and learned[0]["cost_kind"] == "routed"
    assert set(capped) == {0.5, 0.75, 1.0}
    for row in learned + list(capped.values()):
        assert row["steps"] == cfg.train.dense_steps + cfg.path_steps  # equal steps with budgeted-hard
        assert 0 < row["cost"] <= 1 and row["mean_heads"] == pytest.approx(4 * row["cost"])
    assert capped[1.0]["cost"] == 1.0
    assert capped[0.5]["cost"] <= 0.5 + 0.15  # calibrated on validation; test may differ by a few inputs
    timed = [r for r in rows if r.get("speedup") is not None]
    assert {r["method"] for r in timed} == {"budgetformer", "capped-routing"} and all(r["bench_batch_size"] == 1 for r in timed)
    record = json.loads((tmp_path / "run" / "routed.json").read_text())
    assert {r["batch_size"] for r in record["bench"]["0"]["rows"]} == {1, 4}
    assert set(record["calibration"]["capped-routing"]["0"]) == {"0.5", "0.75"}
    spread = record["spread"]["capped-routing"]["0"]
    assert set(spread) == {"0.5", "0.75"} and all(choice["scale"] in (0.0, 0.5, 1.0) for choice in spread.values())
    not_as_trained = {b for b, choice in spread.items() if choice["scale"] != 1.0}
    assert set(record["difficulty_as_trained"]["capped-routing"]["0"]) == not_as_trained  # shown beside the choice
    text = (tmp_path / "run" / "routed.md").read_text()
    assert "Heads per layer by input difficulty" in text and "chosen per budget on the validation split" in text


def test_routing_methods_are_refused_where_they_cannot_run(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG)
    with pytest.raises(ConfigError, match="budget_scope 'heads'"):
        load_experiment_config(str(path), ["methods=[dense,budgetformer]", "budget_scope=all", "ffn_group_size=16"])
    with pytest.raises(ConfigError, match="router.mode"):
        load_experiment_config(str(path), ["methods=[dense,budgetformer]", "router.mode=never"])


@pytest.mark.filterwarnings("ignore:skipped")
def test_unit_records_carry_the_config_digest_and_resume_refuses_another(tmp_path):
    import subprocess
    import sys

    from budgeted_attention.pipeline import UNIT_DIGEST_KEY, unit_config_digest

    cfg = _config(tmp_path)
    cfg.seeds, cfg.methods = [0], ["dense"]
    out = tmp_path / "run"
    Experiment(cfg, out, progress=False, log=lambda *_: None).run()
    unit = out / "units" / "seed0" / "dense.json"
    record = json.loads(unit.read_text())
    assert record[UNIT_DIGEST_KEY] == unit_config_digest(cfg)
    assert not (out / ".lock").exists()  # released at the end of the run

    mine = record[UNIT_DIGEST_KEY]
    unit.write_text(json.dumps({**record, UNIT_DIGEST_KEY: "0" * 64}))  # a row of another config
    with pytest.raises(ConfigError, match=f"'{unit}' was made with another configuration .*{'0' * 64}, this run's {mine}"):
        Experiment(cfg, out, progress=False, log=lambda *_: None).run()
    del record[UNIT_DIGEST_KEY]  # a record written before units carried digests: still resumes
    unit.write_text(json.dumps(record))
    # Temporary files of writes killed before their rename: the writer's PID is dead (removed),
    # or it is this process (kept: a live writer's).
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = out / "units" / "seed0" / f".dense.json.p{dead.pid}.abcd_123.tmp"
    live = out / "units" / "seed0" / f".dense.json.p{__import__('os').getpid()}.abcd_123.tmp"
    stale.write_text("")
    live.write_text("")
    messages = []
    Experiment(cfg, out, progress=False, log=messages.append).run()
    assert not stale.exists() and live.exists()
    assert any(str(stale) in str(m) for m in messages)


def test_gate_init_importance_starts_the_budgeted_gates_ordered_as_the_posthoc_ranking(tmp_path):
    from budgeted_attention.checkpoint import load_model
    from budgeted_attention.pruning.selection import Ranking

    path = tmp_path / "all.yaml"
    path.write_text(CONFIG.replace("name: tiny", "name: tiny-all\nbudget_scope: all\nffn_group_size: 8").replace("seeds: [0, 1]", "seeds: [0]"))
    cfg = load_experiment_config(str(path), ["methods=[dense,budgeted]", "train.gate_init=importance", "train.budgeted_steps=0"])
    experiment = Experiment(cfg, tmp_path / "run", progress=False, log=lambda *_: None)
    experiment.run()
    saved = json.loads((tmp_path / "run" / "units" / "seed0" / "posthoc-ranking.json").read_text())
    model, _ = load_model(tmp_path / "run" / "checkpoints" / "seed0" / "budgeted")
    costs = model.unit_costs(experiment.context.splits.seq_len)
    assert Ranking.from_scores(model.unit_importance(), costs, cfg.min_one_per_layer) == Ranking.from_dict(saved)
    assert model.gates.bias.abs().min() > 0 and model.ffn_gates.bias.abs().min() > 0  # centred, not the zero init
    record = json.loads((tmp_path / "run" / "units" / "seed0" / "budgeted.json").read_text())
    assert len(record["rows"]) == 2  # budgeted is listed: its soft rows are evaluated
    with pytest.raises(ConfigError, match="gate_init 'importance'.*posthoc_importance 'gradient'"):
        load_experiment_config(str(path), ["train.gate_init=importance", "posthoc_importance=leave-one-out"])


def test_quick_merges_the_configs_quick_section_and_is_refused_without_one(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG + "quick:\n  name: tiny_quick\n  train: {dense_steps: 2}\n  bench: {rounds: 2}\n")
    full, quick = load_experiment_config(str(path)), load_experiment_config(str(path), ["train.hard_steps=1"], quick=True)
    assert (full.name, full.train.dense_steps, full.bench.rounds) == ("tiny", 6, 1)
    assert (quick.name, quick.train.dense_steps, quick.bench.rounds, quick.train.hard_steps, quick.train.budgeted_steps) == ("tiny_quick", 2, 2, 1, 6)
    plain = tmp_path / "plain.yaml"
    plain.write_text(CONFIG)
    from budgeted_attention.pipeline import config_digest

    assert config_digest(load_experiment_config(str(plain))) == config_digest(full)  # the quick section is no part of the config
    with pytest.raises(ConfigError, match="no quick: section"):
        load_experiment_config(str(plain), quick=True)
    path.write_text(CONFIG + "quick: [1, 2]\n")
    with pytest.raises(ConfigError, match="quick must be a mapping"):
        load_experiment_config(str(path))
    path.write_text(CONFIG + "quick: {train: {dense_steps: -1}}\n")  # a bad quick: key fails the full run too
    with pytest.raises(ConfigError, match=r"quick: .*train.dense_steps"):
        load_experiment_config(str(path))
    from budgeted_attention.recipes.demo import load_demo_config

    path.write_text(CONFIG + "quick:\n  name: tiny_quick\n")
    assert load_demo_config(str(path), [], quick=False).name == "tiny"  # demo --config ignores an experiment's quick variant


def test_a_required_unit_evaluates_no_rows_of_an_unlisted_method(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG.replace("seeds: [0, 1]", "seeds: [0]"))
    cfg = load_experiment_config(str(path), ["methods=[dense,budgeted-hard]"])
    Experiment(cfg, tmp_path / "run", progress=False, log=lambda *_: None).run()
    assert json.loads((tmp_path / "run" / "units" / "seed0" / "budgeted.json").read_text())["rows"] == []
    assert {r["method"] for r in json.loads((tmp_path / "run" / "results.json").read_text())["rows"]} == {"dense", "budgeted-hard"}


def test_freeze_embeddings_is_refused_for_a_family_trained_from_scratch(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG)
    with pytest.raises(ConfigError, match="train.freeze_embeddings.*'encoder'"):
        load_experiment_config(str(path), ["train.freeze_embeddings=true"])


def test_the_gemma_configs_quick_variants_parse():
    root = Path(__file__).parents[2] / "configs"
    short = load_experiment_config(str(root / "gemma_bbc_short.yaml"), quick=True)
    lm = load_experiment_config(str(root / "gemma_bbc_lm.yaml"), task="lm", quick=True)
    assert (short.name, short.train.dense_steps, lm.name, lm.lm_data.max_documents) == ("gemma_bbc_short_quick", 8, "gemma_bbc_lm_quick", 60)


def test_head_cost_weight_makes_heads_dearer_in_the_budget_and_is_validated(tmp_path, monkeypatch):
    """head_cost_weight w: each head costs w times its FLOPs against the FFN groups, in the budget
    penalty (the budgeted stage gets the weighted costs) and in the ranking (which records them),
    so an order that puts heads first keeps fewer of them at one budget; the digest of a config
    without the key is unchanged; bad values and a weight under budget_scope heads are refused."""
    import torch

    from budgeted_attention.model.gates import UnitGates
    from budgeted_attention.pipeline import config_digest
    from budgeted_attention.pipeline.config import check_head_cost_weight
    from budgeted_attention.pipeline.methods import budgeted as budgeted_module

    path = tmp_path / "all.yaml"
    path.write_text(CONFIG.replace("name: tiny", "name: tiny-all\nbudget_scope: all\nffn_group_size: 8").replace("seeds: [0, 1]", "seeds: [0]"))
    plain = load_experiment_config(str(path))
    weighted = load_experiment_config(str(path), ["head_cost_weight=3"])
    assert config_digest(load_experiment_config(str(path), ["head_cost_weight=1.0"])) == config_digest(plain) != config_digest(weighted)
    heads_kept = {}
    for cfg in (plain, weighted):
        experiment = Experiment(cfg, tmp_path / f"r{cfg.head_cost_weight}", progress=False, log=lambda *_: None)
        ctx = experiment.context
        model = ctx.builder.create()
        flops, costs = model.unit_costs(ctx.splits.seq_len), ctx.unit_costs(model)
        assert torch.equal(costs.heads, flops.heads * cfg.head_cost_weight) and torch.equal(costs.ffn, flops.ffn)
        heads_first = ctx.rank(model, UnitGates(torch.ones(flops.heads.shape), torch.zeros(flops.ffn.shape)))
        heads_kept[cfg.head_cost_weight] = [sum(heads_first.kept(b).heads_per_layer) for b in (0.6, 0.75)]
    assert all(w < p for w, p in zip(heads_kept[3], heads_kept[1.0])), heads_kept

    seen = []
    real = budgeted_module.train_budgeted
    monkeypatch.setattr(budgeted_module, "train_budgeted", lambda model, split, cfg, costs, **kw: seen.append(costs) or real(model, split, cfg, costs, **kw))
    weighted.methods = ["dense", "budgeted"]
    experiment = Experiment(weighted, tmp_path / "trained", progress=False, log=lambda *_: None)
    experiment.run()
    model = experiment.context.builder.create()
    assert len(seen) == 1 and torch.equal(seen[0].heads, model.unit_costs(experiment.context.splits.seq_len).heads * 3)

    for bad in ("0", "-1", "nan", "inf", "1000", "fast"):
        with pytest.raises(ConfigError, match="head_cost_weight"):
            load_experiment_config(str(path), [f"head_cost_weight={bad}"])
    with pytest.raises(ConfigError, match=r"head_cost_weight must be a number in \[0.01, 100\], got True"):
        check_head_cost_weight(True, "all")  # Python callers skip from_dict's type check
    plain_path = tmp_path / "heads.yaml"
    plain_path.write_text(CONFIG)
    with pytest.raises(ConfigError, match="head_cost_weight 2.0 .* budget_scope 'all'"):
        load_experiment_config(str(plain_path), ["head_cost_weight=2.0"])
