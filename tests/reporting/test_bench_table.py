"""The one bench renderer: `baa bench` rows with data-length inputs, the library model's and ORT
columns, and older records (other key names, fewer fields)."""

from budgeted_attention.reporting.bench_table import bench_table


def _row(**extra):
    return {"budget": 0.5, "scope": "all", "input": "random", "batch_size": 1, "seq_len": 128, "threads": 1, "heads_kept": 8,
            "heads_per_layer": [2, 2, 2, 2], "ffn_per_layer": [64, 64, 64, 64], "flops_fraction": 0.5, "dense_latency_ms": 20.0,
            "latency_ms": 11.0, "speedup": 1.82, "ideal_speedup": 2.0, "efficiency": 0.91, **extra}


def test_lengths_rows_and_library_columns():
    rows = [_row(library="transformers", library_speedup=1.9, transformers_speedup=1.9, lean_speedup=1.82), _row(input="lengths", seq_len=57)]
    result = {"rows": rows, "setting": {"library": "transformers", "dense_reference": "CompactBert at b = 1", "length_batches": 16, "rounds": 5},
              "switch": {"switch_ms": 0.035}}
    text = bench_table(result)
    assert ("| budget | scope | input | batch | seq | threads | heads kept | FFN neurons per layer | FLOPs | dense ms | pruned ms | speedup | "
            "FLOP-ideal | speedup / ideal | vs transformers |") in text
    assert "| 0.50 | all | random | 1 | 128 | 1 | 8 [2, 2, 2, 2] | [64, 64, 64, 64] | 50% | 20.000 | 11.000 | 1.82x | 2.00x | 0.91 | 1.90x |" in text
    assert "| 0.50 | all | lengths | 1 | 57 |" in text and "Dense reference: CompactBert at b = 1." in text
    assert "over 16 batches" in text and "35.0 µs" in text and "vs transformers = the unmodified transformers model's" in text and "5 round(s)" in text


def test_records_of_earlier_releases_show_their_library_speedup():
    legacy = {"rows": [_row(transformers_speedup=1.9, lean_speedup=2.0)], "setting": {"library_references": ["transformers"], "lean": "CompactBert"},
              "gate_overhead": [{"batch_size": 1, "seq_len": 128, "overhead": "bad"}]}
    text = bench_table(legacy)
    assert "| vs transformers |" in text and "| 1.82x | 2.00x | 0.91 | 1.90x |" in text and "lean executor" not in text


def test_older_records_without_input_scope_or_ffn_fields():
    heads_scope = bench_table({"rows": [{**_row(scope="heads"), "ffn_per_layer": None, "flops_fraction": 0.62}]})
    assert "| FFN neurons per layer |" not in heads_scope and "| 8 [2, 2, 2, 2] | 62% |" in heads_scope  # FLOPs kept without FFN widths
    row = {k: v for k, v in _row().items() if k not in ("scope", "input", "ffn_per_layer", "flops_fraction")}
    text = bench_table({"rows": [row]})
    assert text.splitlines()[0] == "| budget | batch | seq | threads | heads kept | dense ms | pruned ms | speedup | FLOP-ideal | speedup / ideal |"
