"""Result tables read old rows and the new ones (val_accuracy, cost + cost_kind, steps, transformers_speedup)."""

from budgeted_attention.reporting.results import METHOD_ORDER, aggregate, markdown_table, write_results

OLD = [
    {"method": "budgeted-hard", "budget": 0.5, "seed": 0, "accuracy": 0.9, "estimated_cost": 0.5, "heads_kept": 8,
     "heads_per_layer": [2, 2, 2, 2], "accuracy_before_adaptation": 0.8, "latency_ms": 1.0, "dense_latency_ms": 1.3,
     "speedup": 1.3, "ideal_speedup": 1.33, "bench_batch_size": 1, "bench_seq_len": 128, "threads": 1},
    {"method": "dense", "budget": 1.0, "seed": 0, "accuracy": 0.95, "estimated_cost": 1.0},
    {"method": "budgeted", "budget": 0.5, "seed": 0, "accuracy": 0.93, "estimated_cost": 0.41},
]
NEW = [
    {"method": "budgeted", "budget": 0.5, "seed": s, "accuracy": 0.9 + s / 100, "val_accuracy": 0.8 + s / 100,
     "cost": 0.4, "cost_kind": "soft-estimate", "steps": 3000}
    for s in (0, 1)
] + [
    {"method": "posthoc-recovered-1ep", "budget": 0.5, "seed": 0, "accuracy": 0.7, "val_accuracy": None,
     "cost": 0.5, "cost_kind": "kept-heads", "steps": 2100, "transformers_speedup": 1.42},
    {"method": "dense-long", "budget": 1.0, "seed": 0, "accuracy": 0.96, "val_accuracy": 0.94, "cost": 1.0,
     "cost_kind": "dense", "steps": 4000},
]


def test_method_order_has_new_methods():
    order = ["dense", "dense-long", "budgeted", "budgeted-hard", "budgeted-sandwich", "budgeted-hard-sandwich",
             "budgeted-scratch", "static", "static-soft", "posthoc", "posthoc-recovered", "posthoc-recovered-1ep", "ladder",
             "budgetformer", "capped-routing"]
    assert METHOD_ORDER == order
    methods = [e["method"] for e in aggregate(OLD + NEW)]
    assert methods == sorted(methods, key=order.index)


def test_aggregate_new_fields():
    summary = {(e["method"], e["budget"]): e for e in aggregate(NEW)}
    soft = summary[("budgeted", 0.5)]
    assert abs(soft["val_accuracy_mean"] - 0.805) < 1e-9 and soft["steps_mean"] == 3000
    assert soft["cost_mean"] == 0.4 and soft["cost_kind"] == "soft-estimate"
    post = summary[("posthoc-recovered-1ep", 0.5)]
    assert "val_accuracy_mean" not in post and post["transformers_speedup_mean"] == 1.42


def test_table_columns_and_soft_mark():
    table = markdown_table(aggregate(NEW))
    header = table.splitlines()[0]
    for column in ("steps", "val. acc. %", "test acc. %", "cost", "vs transformers"):
        assert column in header
    lines = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    assert "~0.400" in lines["budgeted"] and "3,000" in lines["budgeted"] and "80.50 ± 0.71" in lines["budgeted"]
    assert "~" not in lines["posthoc-recovered-1ep"] and "1.42x" in lines["posthoc-recovered-1ep"]
    assert "`~` marks a soft-gate estimate" in table


def test_old_rows_still_render(tmp_path):
    table = write_results(tmp_path, OLD, title="old")
    lines = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    assert "~0.410" in lines["budgeted"]  # old soft rows: estimated_cost, kind from the method
    assert "| 0.500 |" in lines["budgeted-hard"] and "1.30x" in lines["budgeted-hard"]
    assert "vs transformers" not in table
    assert (tmp_path / "results.md").read_text().startswith("# old")
