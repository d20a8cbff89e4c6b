"""``baa report --studies studies.yaml --out docs/results.md [--readme README.md]``: the results
page of the studies the project stands behind, and README's headline table.

``studies.yaml`` lists each study: ``name``, ``question`` (one line), ``config``, ``seeds``,
``commands`` (the exact lines; the run directories are their ``--out``), ``table`` (what answers
the question: ``kind`` sweep, bench, ladder, serve or decode, with the rows it keeps and its ``target``),
``figure`` (a file of the run directory), ``headline`` (rows for README, one per selector) and
``replicas`` (run directories of the same commands run elsewhere, e.g. copied from another
machine; the parts of a merged run directory count too). Every row of a table is shown alike, none bolded; a row that misses the study's target
says so. A study whose run directory is missing here is one line, never numbers. The machine is
read from each run's ``run_info.json``.

Run directories do not outlive the machine they ran on, so with a top-level ``archive: FOLDER``
the report first copies the record files of every study run directory it finds here
(:meth:`RunDir.archive`: results, configs, run info, benchmarks, unit records, figures; no weights)
to ``FOLDER/<run dir without its leading runs/>``, and then reads every study from the archive:
the page is a function of committed files, and a study measured on an earlier machine keeps its
table (with that machine named) until its commands run again.

A study measured before the archive existed has neither: rather than turn its measured table into
"not run here", the report keeps that study's section of the page it replaces (and its README
rows, its figure and its replication rows), under a line that says so and names the command that
measures it again (:func:`keep_unmeasured`). Its next run replaces the kept section.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import statistics
from pathlib import Path
from typing import Any, Callable

import yaml

from budgeted_attention.io import write_text_atomic
from budgeted_attention.reporting.int8 import int8_notes, int8_target_failures
from budgeted_attention.reporting.ladder import ladder_comparison
from budgeted_attention.reporting.plots import (
    plot_accuracy_vs_budget, plot_accuracy_vs_cost, plot_accuracy_vs_latency, plot_accuracy_vs_speedup,
)
from budgeted_attention.reporting.report import ReportError, _copy_figure, _relative_link, load_run, render_command
from budgeted_attention.reporting.results import aggregate, display_method, metric_of
from budgeted_attention.rundir import RunDir

BEGIN, END = "<!-- headline:begin -->", "<!-- headline:end -->"
KINDS = ("sweep", "bench", "ladder", "serve", "decode")
_REQUIRED = ("name", "question", "config", "seeds", "commands", "table")
_OPTIONAL = ("figure", "headline", "replicas")
MAX_STUDIES, MAX_HEADLINE = 10, 12


# The keys each table kind judges by (see its function): a misspelt key would judge nothing.
_TARGET_KEYS = {
    "sweep": {"max_drop", "min_speedup", "reference", "only", "min_speedup_over_dense_int8", "on_smaller_curve"},
    "bench": {"min_speedup"}, "ladder": set(), "serve": {"min_slo"}, "decode": {"min_efficiency", "phases"},
}


def load_studies(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The studies of ``path``, checked (each error names the study and the key)."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ReportError(f"cannot read studies file '{path}': {str(exc).splitlines()[0]}") from None
    studies = data.get("studies") if isinstance(data, dict) else None
    if not isinstance(studies, list) or not studies:
        raise ReportError(f"'{path}' has no 'studies: [...]' list")
    if len(studies) > MAX_STUDIES:
        raise ReportError(f"'{path}' lists {len(studies)} studies; at most {MAX_STUDIES}")
    names = set()
    for index, study in enumerate(studies):
        where = f"'{path}', study {study.get('name', index) if isinstance(study, dict) else index}"
        if not isinstance(study, dict) or (missing := [k for k in _REQUIRED if k not in study]):
            raise ReportError(f"{where}: missing {', '.join(missing) if isinstance(study, dict) else 'everything'}")
        if unknown := sorted(set(study) - set(_REQUIRED) - set(_OPTIONAL)):
            raise ReportError(f"{where}: unknown key(s) {', '.join(unknown)}")
        if not re.fullmatch(r"[a-z0-9_]+", str(study["name"])) or study["name"] in names:
            raise ReportError(f"{where}: names are unique, lower case, digits and '_'")
        names.add(study["name"])
        if not isinstance(study["commands"], list) or not all(isinstance(c, str) for c in study["commands"]) or not run_dirs(study):
            raise ReportError(f"{where}: 'commands' is a list of command lines, one or more with '--out RUN_DIR'")
        if not isinstance(study["table"], dict) or study["table"].get("kind") not in KINDS:
            raise ReportError(f"{where}: 'table.kind' is one of {', '.join(KINDS)}")
        target = study["table"].get("target", {})
        allowed = _TARGET_KEYS[study["table"]["kind"]]
        if not isinstance(target, dict) or (unknown := sorted(set(target) - allowed)):
            raise ReportError(f"{where}: 'table.target' of a {study['table']['kind']} table takes {', '.join(sorted(allowed)) or 'no keys'}"
                              + (f"; not {', '.join(unknown)}" if isinstance(target, dict) else ""))
        only = target.get("only")
        if only is not None and not (isinstance(only, list) and only and all(isinstance(s, dict) and s and set(s) <= {"method", "budget"} for s in only)):
            raise ReportError(f"{where}: 'table.target.only' is a list of selectors, each with 'method' and/or 'budget' (got {only!r})")
        if "\n" in str(study["question"]).strip():
            raise ReportError(f"{where}: the question is one line")
    if sum(len(s.get("headline") or [None]) for s in studies) > MAX_HEADLINE:
        raise ReportError(f"'{path}': README's headline has at most {MAX_HEADLINE} rows (one per selector, one per study without)")
    return studies


def archive_folder(path: str | os.PathLike[str]) -> Path | None:
    """The folder named by the studies file's top-level ``archive:`` key (relative to the file), or None."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ReportError(f"cannot read studies file '{path}': {str(exc).splitlines()[0]}") from None
    folder = data.get("archive") if isinstance(data, dict) else None
    if folder is None:
        return None
    if not isinstance(folder, str) or not folder.strip() or Path(folder).is_absolute() or ".." in Path(folder).parts:
        raise ReportError(f"'{path}': 'archive' is a folder relative to the studies file, got {folder!r}")
    return Path(path).parent / folder


def archived(archive: Path, run_dir: str) -> Path | None:
    """Where ``archive`` keeps the records of the run directory ``run_dir`` (``runs/x`` -> ``ARCHIVE/x``);
    None for a run directory outside the studies' folder (absolute, or with ``..``): not archived."""
    parts = Path(run_dir).parts
    if Path(run_dir).is_absolute() or ".." in parts:
        return None
    return archive.joinpath(*(parts[1:] if len(parts) > 1 and parts[0] == "runs" else parts))


def study_dirs(study: dict[str, Any], root: Path) -> list[str]:
    """Every run directory a study reads: its commands' ``--out``, ``table.run``, ``replicas`` and
    the parts a ``baa merge`` made its table's run from (as found under ``root``), once each."""
    primary = study["table"].get("run", run_dirs(study)[0])
    return list(dict.fromkeys([*run_dirs(study), primary, *(study.get("replicas") or []), *_parts(root / primary)]))


def refresh_archive(studies: list[dict[str, Any]], root: Path, archive: Path) -> list[Path]:
    """Archive every study run directory found under ``root`` that holds finished results (the
    newer measurement replaces the archived one; a partial run never does); the archives written."""
    written = []
    for study in studies:
        for run_dir in study_dirs(study, root):
            results, target = root / run_dir / RunDir.results_json.name, archived(archive, run_dir)
            if target is None or not results.is_file():
                continue
            try:
                finished = "partial" not in json.loads(results.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, ValueError, TypeError):
                finished = False
            if finished:
                written.append(RunDir(root / run_dir).archive(target).path)
    return written


def run_dirs(study: dict[str, Any]) -> list[str]:
    """The run directories the study's commands write (their ``--out``), in order, once each."""
    found: list[str] = []
    for line in study["commands"]:
        argv = shlex.split(line)
        found += [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--out" and argv[i + 1] not in found]
    return found


def study_commands(studies: list[dict[str, Any]], names: list[str]) -> list[str]:
    """The command lines of the named studies (all when ``names`` is empty), in file order."""
    if unknown := sorted(set(names) - {s["name"] for s in studies}):
        raise ReportError(f"no study named {', '.join(unknown)} (the studies: {', '.join(s['name'] for s in studies)})")
    return [line for s in studies if not names or s["name"] in names for line in s["commands"]]


# ------------------------------------------------------------------ the tables, by kind
# Each gives (header, rows); a row is {"key": fields the headline selects on, "cells", "brief", "fail"}.


def _pm(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    if not values:
        return ""
    scaled = [scale * v for v in values]
    spread = f" ± {statistics.stdev(scaled):.{digits}f}" if len(scaled) > 1 else ""
    return f"{statistics.fmean(scaled):.{digits}f}{spread}"


_NOT_JUDGING = {"reference", "only"}  # target keys that say how to judge, not what


def _targeted(target: dict[str, Any], method: str, budget: float) -> bool:
    """Whether ``target`` judges the row: it has a judging key, and the row matches one of the
    ``only`` selectors ({method, budget}; without ``only``, every row does)."""
    if not set(target) - _NOT_JUDGING:
        return False
    selectors = target.get("only")
    if selectors is None:
        return True
    return any(s.get("method", method) == method and abs(float(s.get("budget", budget)) - budget) < 1e-9 for s in selectors)


def _sweep(run: dict[str, Any], table: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    """Rows of ``results.json`` per (method, budget), judged by ``target``: ``max_drop`` against
    the b = 1 rows of ``reference`` (default ``dense``), ``min_speedup`` (the rows' measured
    ``speedup``), the int8 keys of :func:`int8_target_failures`; ``only`` limits the judged rows
    (the others say "no target"), and a table without a target judges none."""
    methods, target = table.get("methods"), table.get("target") or {}
    rows = [r for r in run["rows"] if not methods or r["method"] in methods]
    metric = metric_of(rows)
    scale, digits, lm = metric.scale, metric.digits, metric.key == "loss"
    by_group: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for row in rows:
        by_group.setdefault((display_method(row), float(row["budget"])), []).append(row)
    reference = target.get("reference", "dense")
    dense = [r[metric.key] for r in by_group.get((reference, 1.0), []) if r.get(metric.key) is not None]
    out = []
    for entry in aggregate(rows):
        group = by_group[(entry["method"], entry["budget"])]
        values = [r[metric.key] for r in group if r.get(metric.key) is not None]
        speed = [r["speedup"] for r in group if r.get("speedup") is not None]
        fails = int8_target_failures(run["rows"], entry["budget"], target) if entry["method"] == "budgeted-hard-int8" else []
        if "max_drop" in target and not dense:
            fails.append(f"no {reference} rows at b = 1 to compare with")
        elif dense and values and "max_drop" in target:
            drop = scale * ((statistics.fmean(values) - statistics.fmean(dense)) if lm else (statistics.fmean(dense) - statistics.fmean(values)))
            if drop > target["max_drop"] + 1e-9:
                fails.append(f"{drop:.{digits}f} {'nats above' if lm else 'points below'} {reference} (target ≤ {target['max_drop']:g})")
        # a row whose selection removed nothing (FLOP-ideal 1x) has no speedup to meet
        removed = entry.get("ideal_speedup_mean", float("inf")) > 1.0 + 1e-6
        if speed and removed and "min_speedup" in target and statistics.fmean(speed) < target["min_speedup"]:
            fails.append(f"{statistics.fmean(speed):.2f}x (target ≥ {target['min_speedup']:g}x)")
        span = f" [{scale * min(values):.{digits}f}, {scale * max(values):.{digits}f}]" if len(values) > 1 else ""
        cost = entry.get("cost_mean", entry.get("estimated_cost_mean"))
        measured = _pm(speed) + ("x" if speed else "")
        ideal = f"{entry['ideal_speedup_mean']:.2f}x" if "ideal_speedup_mean" in entry else ""
        cells = [entry["method"], f"{entry['budget']:.2f}", str(len(group)), _pm(values, scale, digits) + span,
                 "" if cost is None else f"{cost:.3f}", measured, ideal]
        brief = f"{entry['method']} b = {entry['budget']:g}: {metric.short} {_pm(values, scale, digits)}" + (f" ({reference} {_pm(dense, scale, digits)})" if dense else "")
        judged = _targeted(target, entry["method"], entry["budget"])
        out.append({"key": {"method": entry["method"], "budget": entry["budget"]}, "cells": cells,
                    "brief": brief + (f", {measured} measured" if speed else ""), "fail": "; ".join(fails) if judged and fails else None,
                    "untargeted": not judged})
    header = ["method", "budget", "seeds", f"test {metric.short}: mean ± std [min, max] over seeds", "cost", "speedup (measured, ± std)", "FLOP-ideal"]
    return header, out


def _bench(run: dict[str, Any], table: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    bench = next((b for p, b in run["benches"] if p.name == table.get("file", "bench.json")), None)
    if bench is None:
        raise FileNotFoundError(table.get("file", "bench.json"))
    key, minimum = table.get("speedup", "speedup"), (table.get("target") or {}).get("min_speedup")
    out = []
    for r in bench["rows"]:
        value = r.get(key)
        fail = f"{value:.2f}x (target ≥ {minimum:g}x)" if value is not None and minimum is not None and value < minimum else None
        text = "" if value is None else f"{value:.2f}x"
        out.append({"key": {"budget": r["budget"], "batch_size": r["batch_size"], "seq_len": r["seq_len"]},
                    "cells": [f"{r['budget']:.2f}", str(r["batch_size"]), str(r["seq_len"]), str(r.get("threads", "")), text,
                              f"{r['ideal_speedup']:.2f}x" if r.get("ideal_speedup") is not None else ""],
                    "brief": f"{text} at batch {r['batch_size']}, seq {r['seq_len']}", "fail": fail, "untargeted": minimum is None})
    return ["budget", "batch", "seq", "threads", f"{key} (over b = 1, same runtime)", "FLOP-ideal"], out


def _ladder(run: dict[str, Any], table: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    out = []
    for e in ladder_comparison(run["rows"]):
        diff = e.get("difference")
        below = diff is not None and (e["interval"][1] < 0 if "interval" in e else diff[0] < 0)
        interval = f"[{100 * e['interval'][0]:+.2f}, {100 * e['interval'][1]:+.2f}]" if "interval" in e else ""
        pair = lambda p: "" if p is None else f"{100 * p[0]:.2f} ± {100 * p[1]:.2f}"  # noqa: E731
        cells = [e["method"], e["ladder"], f"{e['matched']} of {e['seeds']}", f"{e['speedup'][0]:.2f}x", pair(e.get("ladder_accuracy")),
                 pair(e.get("curve_accuracy")), "" if diff is None else f"{100 * diff[0]:+.2f} ± {100 * diff[1]:.2f}", interval]
        brief = "no seed matched" if diff is None else f"{100 * diff[0]:+.2f} points vs {e['ladder']} at {e['speedup'][0]:.2f}x, 95% CI {interval or 'n/a'}"
        fail = "below the ladder model" if below else ("no seed matched" if diff is None else None)
        out.append({"key": {"method": e["method"], "ladder": e["ladder"]}, "cells": cells, "brief": brief, "fail": fail})
    header = ["curve", "ladder model", "matched seeds", "speedup", "ladder acc. %", "curve acc. % there", "difference (points)", "95% CI"]
    return header, out


def _serve(run: dict[str, Any], table: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    if not run.get("serve_load"):
        raise FileNotFoundError("serve_load.json")
    minimum = (table.get("target") or {}).get("min_slo")
    groups: dict[tuple[str, float, str], list[dict[str, Any]]] = {}
    for trial in run["serve_load"]["trials"]:
        groups.setdefault((trial["arrivals"], trial["load"], trial["mode"]), []).append(trial["summary"])
    out = []
    for (arrivals, load, mode), summaries in groups.items():
        slo = [s["slo_attainment"] for s in summaries if s.get("slo_attainment") is not None]
        errors = sum(s.get("server_errors", 0) for s in summaries)
        fails = [f"{errors} server errors"] if errors else []
        if minimum is not None and slo and statistics.fmean(slo) < minimum:
            fails.append(f"SLO attainment {100 * statistics.fmean(slo):.1f}% (target ≥ {100 * minimum:g}%)")
        span = f" [{100 * min(slo):.1f}, {100 * max(slo):.1f}]" if len(slo) > 1 else ""
        acc = [s["effective_accuracy"] for s in summaries if s.get("effective_accuracy") is not None]
        p99 = [s["p99_ms"] for s in summaries if s.get("p99_ms") is not None]
        cells = [arrivals, f"{load:g}x", mode, str(len(summaries)), _pm(slo, 100, 1) + span, _pm(acc, 100, 1), _pm(p99, 1, 1), str(errors)]
        out.append({"key": {"arrivals": arrivals, "load": load, "mode": mode}, "cells": cells, "fail": "; ".join(fails) or None,
                    "untargeted": minimum is None and not errors,  # server errors fail a row whatever the target
                    "brief": f"SLO attainment {_pm(slo, 100, 1)}%, effective acc. {_pm(acc, 100, 1)}% ({mode}, {arrivals} {load:g}x)"})
    header = ["arrivals", "load", "mode", "repeats", "SLO attainment %: mean ± std [min, max]", "effective acc. %", "p99 ms", "5xx"]
    return header, out


def _decode(run: dict[str, Any], table: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    """Prefill and decode rows of a generation benchmark (benchmarks/gemma_decode.py's
    ``decode_bench.json``): latency, tokens/s, speedups over the family's own dense executor and
    the unmodified library model, the FLOP-ideal (output layer included) and the fraction of it
    reached; target ``min_efficiency`` (of the pruned rows of the target's ``phases``, default all)."""
    bench = run.get("decode_bench")
    if bench is None:
        raise FileNotFoundError("decode_bench.json")
    target = table.get("target") or {}
    minimum = target.get("min_efficiency")
    phases = set(target.get("phases") or [r["phase"] for r in bench["rows"]])
    out = []
    for r in bench["rows"]:
        efficiency = r["speedup"] / r["ideal_speedup"] if r.get("ideal_speedup") else None
        pruned = r["budget"] < 1.0
        fail = (f"{efficiency:.2f} of the FLOP-ideal (target ≥ {minimum:g})"
                if pruned and r["phase"] in phases and minimum is not None and efficiency is not None and efficiency < minimum else None)
        rate = f"{r['tokens_per_s']:.1f}" if r.get("tokens_per_s") is not None else ""
        kv = f"{r['kv_bytes_per_token'] / 1024:.1f} KiB + {r['kv_sliding_cap_bytes'] / 2**20:.1f} MiB" if "kv_bytes_per_token" in r else ""
        cells = [r["phase"], f"{r['budget']:.2f}", str(r["batch_size"]), str(r["tokens"]), str(r.get("threads", "")), f"{r['ms']:.0f}", rate,
                 f"{r['speedup']:.2f}x" if pruned else "", f"{r['library_speedup']:.2f}x", f"{r['ideal_speedup']:.2f}x" if pruned else "",
                 f"{efficiency:.2f}" if pruned and efficiency is not None else "", f"{100 * r['output_layer_share']:.0f}%", kv]
        what = f"{r['phase']} batch {r['batch_size']}, {r['tokens']} tokens"
        brief = (f"{r['speedup']:.2f}x over dense ({efficiency:.2f} of FLOP-ideal {r['ideal_speedup']:.2f}x), {what}" if pruned
                 else f"{r['library_speedup']:.2f}x over transformers, {what}")
        out.append({"key": {"phase": r["phase"], "budget": r["budget"], "batch_size": r["batch_size"], "tokens": r["tokens"]},
                    "cells": cells, "brief": brief, "fail": fail, "untargeted": minimum is None or not pruned or r["phase"] not in phases})
    header = ["phase", "budget", "batch", "tokens", "threads", "ms", "tokens/s", "speedup over b = 1 (own executor)", "over transformers",
              "FLOP-ideal", "of ideal", "output layer share of FLOPs", "K/V cache: per token + sliding-layer cap"]
    return header, out


def _decode_notes(run: dict[str, Any], table: dict[str, Any]) -> list[str]:
    """The benchmark's ``checks`` (one line each) under the decode table."""
    checks = (run.get("decode_bench") or {}).get("checks") or {}
    def shown(value: Any) -> str:
        if isinstance(value, str):
            return value
        if isinstance(value, float):
            return f"{value:.3g}"
        return json.dumps(value)

    return [f"- {name.replace('_', ' ')}: {shown(value)}" for name, value in checks.items()]


_TABLES = {"sweep": _sweep, "bench": _bench, "ladder": _ladder, "serve": _serve, "decode": _decode}
def _sweep_notes(run: dict[str, Any], table: dict[str, Any]) -> list[str]:
    """Under a table of quantized models (benchmarks/int8_peers.py): :func:`int8_notes`."""
    return int8_notes(run["rows"])


_NOTES = {"decode": _decode_notes, "sweep": _sweep_notes}
# A sweep run's figures that the report draws from its results rows (the names the pipeline and
# benchmarks/int8_peers.py give them).
_REDRAWN = {"accuracy_vs_budget.png": plot_accuracy_vs_budget, "accuracy_vs_cost.png": plot_accuracy_vs_cost,
            "accuracy_vs_speedup.png": plot_accuracy_vs_speedup, "accuracy_vs_latency.png": plot_accuracy_vs_latency}


# ------------------------------------------------------------------ the page


def _machine(run: dict[str, Any]) -> str:
    env = run["info"].get("environment") if isinstance(run["info"].get("environment"), dict) else {}
    parts = [env.get("processor") or "machine not recorded", f"{env['cpu_count']} CPUs" if env.get("cpu_count") else None]
    return ", ".join(p for p in parts if p)


def _other_machines(runs: list[dict[str, Any]]) -> bool:
    """Whether ``runs`` ran on more than one machine: two runs differ when their CPUs (processor and
    count) differ, or both record a host (a hash) and the hosts differ. A run without a recorded
    processor is no second machine, nor is one without a host beside one with it (older runs did
    not record hosts: the same CPU is then taken as the same machine)."""
    envs = [r["info"].get("environment") if isinstance(r["info"].get("environment"), dict) else {} for r in runs]
    known = [(env.get("host"), _machine(run)) for env, run in zip(envs, runs) if env.get("processor")]
    return any(cpu_a != cpu_b or (host_a and host_b and host_a != host_b)
               for i, (host_a, cpu_a) in enumerate(known) for host_b, cpu_b in known[i + 1:])


def _markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def _target_cell(row: dict[str, Any]) -> str:
    if row.get("untargeted"):
        return "no target"
    return f"FAILS: {row['fail']}" if row["fail"] else "meets"


def _measure(path: Path, study: dict[str, Any]) -> tuple[dict[str, Any], list[str], list[dict[str, Any]]] | None:
    """(run, header, rows) of the study's table from the run directory ``path``; None if not there."""
    if not (path / "results.json").is_file():
        return None
    run = load_run(path)
    try:
        return (run, *_TABLES[study["table"]["kind"]](run, study["table"]))
    except FileNotFoundError:
        return None


def _parts(path: Path) -> list[str]:
    """The parts a ``baa merge`` made ``path`` from, as its run_info.json records them (each ran
    on its own machine, perhaps): a merged study is replicated by its parts where they are here."""
    try:
        invocations = json.loads((path / "run_info.json").read_text(encoding="utf-8")).get("invocations", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [i["part"] for i in invocations if isinstance(i, dict) and isinstance(i.get("part"), str)]


def _selected(study: dict[str, Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first row matching each headline selector (a selector without a match: no row)."""
    picked = []
    for selector in study.get("headline") or []:
        match = next((r for r in rows if all(r["key"].get(k) == v for k, v in selector.items())), None)
        picked += [match] if match else []
    return picked


def build_studies(
    studies: list[dict[str, Any]], root: Path, out: Path, figures_dir: Path, command: str, archive: Path | None = None
) -> tuple[str, list[list[str]], list[tuple[Path | Callable[[Path], None], Path]]]:
    """(the page, README's headline rows, the figures to write as (source, target) pairs: a source
    is a run's PNG to copy, or a function that draws the figure to the path it is given).

    With ``archive``, every run directory is read from its archived copy (:func:`archived`)."""

    def where(run_dir: str) -> Path:
        return root / run_dir if archive is None else (archived(archive, run_dir) or root / run_dir)

    def shown(run_dir: str) -> str:
        return run_dir if archive is None else os.path.relpath(where(run_dir), root)

    lines = [
        "# Results", "",
        f"Generated by `{command}` from the run directories of [`studies.yaml`]({_relative_link(root / 'studies.yaml', out)}); do not edit by hand.",
        "Each study: its question, the commands that make its run directories (`make study-NAME` runs them; they resume), "
        "the seeds and machine the run directories record, and the table that answers the question. Every row is shown alike; "
        "a row that misses the study's target says `FAILS`. A study not run on this machine is one line, "
        "or its section from this page's previous generation, under a line saying so.",
        f"The historical per-run research log is [lab/results-log.md]({_relative_link(root / 'docs' / 'lab' / 'results-log.md', out)}) (not maintained).",
    ]
    headline, copies, replicated = [], [], []
    for study in studies:
        name, table = study["name"], study["table"]
        lines += ["", f"## {name}", "", f"**Question.** {' '.join(str(study['question']).split())}", ""]
        primary = table.get("run", run_dirs(study)[0])
        dirs = [*run_dirs(study), *(study.get("replicas") or []), *_parts(where(primary))]
        measured = {d: _measure(where(d), study) for d in dict.fromkeys(dirs)}
        if measured.get(primary) is None:
            lines.append(f"not run here: `make study-{name}`")
            headline.append([name, study["question"], f"not run here: `make study-{name}`", ""])
            continue
        run, header, rows = measured[primary]
        seeds = sorted({r.get("seed") for r in run["rows"] if r.get("seed") is not None}) or run["info"].get("seeds") or []
        lines += ["Commands:", "", "```", *study["commands"], "```", "",
                  f"- Config: `{study['config']}`; seeds: {', '.join(map(str, seeds)) or 'none recorded'}"
                  + ("" if list(seeds) == list(study["seeds"]) else f" (studies.yaml says {', '.join(map(str, study['seeds']))})"),
                  f"- Machine: {_machine(run)} (from `{shown(primary)}/run_info.json`)"]
        if run["results"].get("partial"):
            lines.append(f"- **Partial run**: {run['results']['partial']}")
        lines += ["", *_markdown_table([*header, "target"], [[*r["cells"], _target_cell(r)] for r in rows])]
        notes = _NOTES[table["kind"]](run, table) if table["kind"] in _NOTES else []
        if notes:
            lines += ["", *notes]
        for row in _selected(study, rows) or rows[:1]:
            headline.append([name, study["question"], row["brief"], _target_cell(row)])
        if not rows:
            headline.append([name, study["question"], f"no rows in `{primary}`", ""])
        figure = where(primary) / str(study.get("figure", ""))
        if study.get("figure") and figure.is_file():
            redraw = _REDRAWN.get(figure.name) if table["kind"] == "sweep" else None
            # a sweep's accuracy plots are drawn anew from its results rows, so a plotting fix reaches
            # the page without rerunning the study; other figures are the run's own
            source = figure if redraw is None else (lambda target, plot=redraw, rows=run["rows"], title=run.get("config_name") or run["name"]: plot(rows, target, title))
            copies.append((source, figures_dir / f"{name}_{figure.name}"))
            spread = " Points: mean over seeds; error bars: ± one std over seeds." if figure.name.startswith("accuracy_vs_") else ""
            lines += ["", f"![{name}: {figure.stem}]({_relative_link(copies[-1][1], out)})", "", f"Figure: `{figure.name}` of `{shown(primary)}`.{spread}"]
        elif study.get("figure"):
            lines += ["", f"Figure `{study['figure']}`: not in `{shown(primary)}`."]
        found = [(d, m) for d, m in measured.items() if m is not None]
        if _other_machines([m[0] for _, m in found]):  # one machine's runs replicate nothing across machines
            wanted = {tuple(sorted(r["key"].items())) for r in _selected(study, rows) or rows}
            for d, (other, _, other_rows) in found:
                replicated += [[name, _label(r), r["brief"], f"`{shown(d)}`", _machine(other), _target_cell(r)]
                               for r in other_rows if tuple(sorted(r["key"].items())) in wanted]
    if replicated:
        lines += ["", "## Replication", "",
                  "The headline rows of each study measured on more than one machine (its commands, its `replicas`, the parts "
                  "of a merged run), "
                  "with the machine each run directory records.", "",
                  *_markdown_table(["study", "row", "measured", "run directory", "machine", "target"], replicated)]
    return "\n".join(lines) + "\n", headline, copies


def _label(row: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in row["key"].items())


def _headline_block(rows: list[list[str]], results_link: str, command: str) -> str:
    table = _markdown_table(["study", "question", "measured", "target"], [[f"[{r[0]}]({results_link}#{r[0]})", *r[1:]] for r in rows])
    return "\n".join([f"Generated by `{command}` from the run directories ([all results]({results_link})).", "", *table]) + "\n"


def _headline_span(path: Path) -> tuple[str, int, int]:
    """(the text of ``path``, where its headline block starts, where its ``END`` line starts)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ReportError(f"cannot read '{path}': {exc.strerror or exc}") from None
    start, end = text.find(BEGIN + "\n"), text.find(END)
    if start < 0 or end < start:
        raise ReportError(f"'{path}' has no '{BEGIN}' line followed by a '{END}' line: add both where the headline table goes")
    return text, start + len(BEGIN) + 1, end


def write_studies_report(
    studies_file: Path, out: Path, readme: Path | None = None, figures_dir: Path | None = None, command: list[str] | str | None = None
) -> Path:
    """Write the studies page to ``out`` (figures to ``figures_dir``, default ``<out dir>/figures``)
    and, with ``readme``, its headline table between the markers; run directories are relative
    to the studies file's folder. Figures of these studies left from an earlier page are removed."""
    studies_file, out = Path(studies_file), Path(out)
    studies, archive = load_studies(studies_file), archive_folder(studies_file)
    figures = Path(figures_dir) if figures_dir is not None else out.parent / "figures"
    shown = render_command(command if command is not None else ["baa", "report", "--studies", str(studies_file), "--out", str(out)])
    old_readme, start, end = _headline_span(Path(readme)) if readme is not None else ("", 0, 0)  # markers checked before the archive changes
    if archive is not None:
        refresh_archive(studies, studies_file.parent, archive)
    text, headline, copies = build_studies(studies, studies_file.parent, out, figures, shown, archive)
    block = _headline_block(headline, _relative_link(out, Path(readme)), shown) if readme is not None else ""
    text, block, unmeasured = keep_unmeasured(text, _read(out), block, old_readme[start:end], studies)
    readme_text = None if readme is None else old_readme[:start] + block + old_readme[end:]
    if copies:
        figures.mkdir(parents=True, exist_ok=True)
    kept = {target.name for _, target in copies}
    for stale in figures.glob("*.png") if figures.is_dir() else []:
        owners = [s["name"] for s in studies if stale.name.startswith(f"{s['name']}_")]
        owner = max(owners, key=len) if owners else None  # 'a_b_x.png' is study a_b's, not a's
        if stale.name not in kept and owner is not None and owner not in unmeasured:
            stale.unlink()
    for source, target in copies:
        if callable(source):
            source(target)
        else:
            _copy_figure(source, target)
    write_text_atomic(out, text)
    if readme_text is not None:
        write_text_atomic(readme, readme_text)
    return out



KEPT_NOTE = (
    "*Kept from this page's previous generation: this study's run directories could not be read here and "
    "were not archived, so the table below is the one measured then, its target column as judged then. "
    "`make study-{name}` measures it anew.*"
)
KEPT_ROW = "kept from an earlier run: "  # README's measured cell of a kept study
JUDGED_THEN = "judged then: "  # its target cell: the target of then, which studies.yaml may have changed since
KEPT_COMMANDS_NOTE = "*studies.yaml has changed this study's commands since: the table below was measured with the commands it shows.*"
_NOTE_STARTS = ("*Kept from this page's previous generation", "*studies.yaml has changed this study's commands")
# README's measured cell of a kept study whose commands changed: its old figures answer another question
NOT_RUN_WITH_THESE_COMMANDS = "not run here with its current commands: `make study-{name}` (the results page keeps the earlier table)"


def _judged_then(cell: str) -> str:
    return f"{JUDGED_THEN}{cell.removeprefix(JUDGED_THEN)}" if cell.strip() else cell


def _read(path: Path) -> str:
    """The text of ``path``, or "" when there is none yet."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""
    except OSError as exc:
        raise ReportError(f"cannot read '{path}': {exc.strerror or exc}") from None


def _page_sections(text: str, names: list[str]) -> tuple[str, dict[str, str]]:
    """(what precedes the first section, heading -> that section's text up to the next one), split
    only at the headings the report writes (``## <study>`` and ``## Replication``), so a line of a
    section that happens to start with ``## `` stays inside it."""
    headings = "|".join(re.escape(name) for name in [*names, "Replication"])
    parts = re.split(rf"\n(?=## (?:{headings})\n)", text)
    return parts[0], {part.split("\n", 1)[0][3:]: part for part in parts[1:]}


def _study_rows(block: str, name: str) -> list[str]:
    """README headline lines of study ``name`` (they start with its link)."""
    return [line for line in block.splitlines() if line.startswith(f"| [{name}](")]


def _kept_section(fresh: str, old: str, study: dict[str, Any]) -> str:
    """The measured ``old`` section under the heading and question of the ``fresh`` one (studies.yaml
    may have reworded them), with :data:`KEPT_NOTE` (and :data:`KEPT_COMMANDS_NOTE` when the old
    section's commands are no longer the study's)."""
    name = study["name"]
    body = old.split("\n\n", 2)[2] if old.count("\n\n") >= 2 else old
    notes = [KEPT_NOTE.format(name=name)]
    paragraphs = body.split("\n\n")
    while paragraphs and paragraphs[0].startswith(_NOTE_STARTS):  # an earlier keep's notes, whatever their wording
        paragraphs.pop(0)
    body = "\n\n".join(paragraphs)
    commands = "Commands:\n\n```\n" + "\n".join(study["commands"]) + "\n```"
    if not body.startswith(commands):
        notes.append(KEPT_COMMANDS_NOTE)
    title_and_question = "\n\n".join(fresh.split("\n\n", 2)[:2])
    return "\n\n".join([title_and_question, *notes, body])


def keep_unmeasured(
    text: str, old_text: str, block: str, old_block: str, studies: list[dict[str, Any]]
) -> tuple[str, str, set[str]]:
    """The new page and README block, with each study the report could not read (its section says
    "not run here") given back its measured section of ``old_text`` (:func:`_kept_section`), its
    README lines of ``old_block`` (their question column the study's current one) and its rows of
    the old replication table; and the names of the studies so kept (their figures stay)."""
    names = [study["name"] for study in studies]
    head, sections = _page_sections(text, names)
    _, old_sections = _page_sections(old_text, names)
    unmeasured = set()
    for study in studies:
        name = study["name"]
        new, old = sections.get(name, ""), old_sections.get(name, "")
        if "\nnot run here: " not in new or not old or "\nnot run here: " in old:
            continue
        unmeasured.add(name)
        sections[name] = _kept_section(new, old, study)
        lines = block.splitlines()
        at = next((i for i, line in enumerate(lines) if line.startswith(f"| [{name}](")), None)
        question = " ".join(str(study["question"]).split())
        if KEPT_COMMANDS_NOTE in sections[name]:
            kept_rows = [f"| {lines[at][2:].split(' | ', 1)[0]} | {question} | {NOT_RUN_WITH_THESE_COMMANDS.format(name=name)} |  |"] if at is not None else []
        else:
            # link | question | measured | target: the question may hold " | ", so the measured and target cells are read from the right
            kept_rows = [f"| {cells[0]} | {question} | {KEPT_ROW}{cells[-2].removeprefix(KEPT_ROW)} | {_judged_then(cells[-1])} |"
                         for cells in (row[2:-2].split(" | ") for row in _study_rows(old_block, name))
                         if len(cells) >= 4 and not cells[-2].startswith("not run here")]
        if at is not None and kept_rows:
            lines[at:at + 1] = kept_rows
            block = "\n".join(lines) + "\n"
    if not unmeasured:
        return text, block, unmeasured
    old_replication = old_sections.get("Replication", "")
    kept_rows = [line for line in old_replication.splitlines() if any(line.startswith(f"| {name} |") for name in unmeasured)]
    machines: dict[str, set[str]] = {}  # study -> the machines of its kept rows (the fifth cell)
    for line in kept_rows:
        cells = line[2:-2].split(" | ")
        machines.setdefault(cells[0], set()).add(cells[4] if len(cells) > 4 else "")
    kept_rows = [line for line in kept_rows if len(machines[line[2:].split(" | ", 1)[0]]) > 1]
    if kept_rows:
        if "Replication" not in sections:
            intro = old_replication.split("\n\n")[:2]
            header = [line for line in old_replication.splitlines() if line.startswith("| study |") or line.startswith("|---")]
            sections["Replication"] = "\n\n".join([*intro, "\n".join(header)])
        sections["Replication"] = sections["Replication"].rstrip("\n") + "\n" + "\n".join(kept_rows) + "\n"
    order = [*[n for n in names if n in sections], *(["Replication"] if "Replication" in sections else [])]
    return head + "".join("\n" + sections[k].rstrip("\n") + "\n" for k in order), block, unmeasured
