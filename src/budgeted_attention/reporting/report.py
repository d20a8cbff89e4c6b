"""``baa report RUN_DIR ... --out docs/results.md``: a results document written from run directories.

Nothing in the output is typed by hand: every section is rebuilt from what a run directory
records (:class:`~budgeted_attention.rundir.RunDir`: config, run info, results, benchmarks, units,
figures), so regenerating the document after a rerun can never leave a stale figure behind.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from budgeted_attention.benchmark.routing import routing_bench_markdown
from budgeted_attention.errors import BAAError
from budgeted_attention.io import atomic_path, write_text_atomic
from budgeted_attention.reporting.bench_table import bench_table
from budgeted_attention.reporting.int8 import int8_notes
from budgeted_attention.reporting.ladder import ladder_markdown
from budgeted_attention.reporting.per_input import routed_markdown
from budgeted_attention.reporting.results import LOSS_METRIC, aggregate, markdown_table, metric_of, routing_table
from budgeted_attention.reporting.serve_load import serve_load_markdown
from budgeted_attention.reporting.serve_soak import serve_soak_markdown
from budgeted_attention.reporting.summary import headline, headline_markdown
from budgeted_attention.rundir import RunDir


class ReportError(BAAError):
    """A run directory cannot be reported (missing, without results, malformed files)."""


# ------------------------------------------------------------------ reading a run directory


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ReportError(f"malformed JSON in '{path}': {exc.msg} (line {exc.lineno})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"cannot read '{path}': {exc}") from None


def _optional_json(path: Path, what: str, list_key: str | None = None) -> Any:
    """The JSON object in ``path`` (None when there is no such file), with a list under ``list_key``."""
    if not path.is_file():
        return None
    data = _read_json(path)
    if not isinstance(data, dict) or (list_key is not None and not isinstance(data.get(list_key), list)):
        expected = f'{{"{list_key}": [...], ...}}' if list_key else "a JSON object"
        raise ReportError(f"malformed {what} in '{path}': expected {expected}")
    return data


def _read_config(run: RunDir) -> dict[str, Any]:
    if not run.config.is_file():
        return {}
    try:
        config = yaml.safe_load(run.config.read_text(encoding="utf-8"))
    except (yaml.YAMLError, OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"malformed YAML in '{run.config}': {str(exc).splitlines()[0]}") from None
    return config if isinstance(config, dict) else {}


def load_run(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Everything the report needs from one run directory; errors name the offending path."""
    run = RunDir.open(run_dir, require=(RunDir.results_json,), hint="run it to completion first")
    results = _optional_json(run.results_json, "results", "rows")
    rows = results["rows"]
    for index, row in enumerate(rows):
        if not isinstance(row, dict) or "method" not in row or "budget" not in row:
            raise ReportError(f"malformed results in '{run.results_json}': row {index} lacks 'method' or 'budget'")
    config = _read_config(run)
    # A section is named after its run directory: one config can make several runs (`--set
    # seeds=[0] --out runs/x_seed0`), and a name taken from the config would collide.
    config_name = config.get("name") if isinstance(config.get("name"), str) and config.get("name") else None
    return {
        "path": run.path,
        "name": run.path.resolve().name,
        "config_name": config_name,
        "config": config,
        "info": _optional_json(run.run_info, "run info") or {},
        "results": results,
        "rows": rows,
        "benches": [(path, _optional_json(path, "benchmark", "rows")) for path in run.benches()],
        "routing_bench": _optional_json(run.routing_bench_json, "routing benchmark", "rows"),
        "routed": _optional_json(run.routed_json, "per-input routing results"),
        "serve_load": _optional_json(run.serve_load, "load test", "trials"),
        "serve_soak": _optional_json(run.serve_soak, "soak test", "probes"),
        "decode_bench": _optional_json(run.decode_bench, "generation benchmark", "rows"),
        "figures": run.figures(),
        "wall_time": _wall_time(run, results),
    }


def _wall_time(run: RunDir, results: dict[str, Any]) -> str | None:
    """A sentence on how long the run took, from what the run recorded (None if nothing)."""
    for key in ("wall_time_s", "wall_seconds", "seconds"):
        value = results.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return f"{value:,.0f} s"
    seconds, count = 0.0, 0
    for unit in run.unit_records():
        try:
            value = json.loads(unit.read_text(encoding="utf-8")).get("seconds")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            seconds += value
            count += 1
    if count:
        return f"{seconds:,.0f} s of compute over {count} finished unit(s) (sum of {RunDir.units_dir.name}/*/*.json)"
    md = run.results_md
    if md.is_file():
        try:
            found = re.findall(r"Wall time[^:\n]*:\s*([0-9][0-9,.]*)\s*s", md.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            found = []
        if found:
            return f"{found[-1]} s (as recorded in {RunDir.results_md.name})"
    return None


# ------------------------------------------------------------------ formatting


def render_command(command: Any) -> str:
    """An invocation as a shell line; the console script (or ``python -m budgeted_attention.cli``) as ``baa``."""
    if isinstance(command, str):
        return command
    if not isinstance(command, (list, tuple)) or not command:
        return "(not recorded)"
    argv = [str(part) for part in command]
    program = Path(argv[0]).name
    if program in ("baa", "cli.py", "__main__.py") or argv[0].endswith(os.path.join("budgeted_attention", "cli.py")):
        program = "baa"
    return shlex.join([program, *argv[1:]])


def _environment_lines(info: dict[str, Any]) -> list[str]:
    env = info.get("environment") if isinstance(info.get("environment"), dict) else {}
    invocations = [i for i in info.get("invocations", []) if isinstance(i, dict)] if isinstance(info.get("invocations"), list) else []
    lines = []
    commit = env.get("commit")
    if commit:
        dirty = env.get("dirty")
        flag = " (dirty: uncommitted changes)" if dirty else (" (clean)" if dirty is False else " (dirty flag not recorded)")
        lines.append(f"- Code: commit `{commit}`{flag}")
    else:
        lines.append("- Code: commit not recorded")
    per_invocation = [
        (f"`{str(i['commit'])[:12]}`" + (" (dirty)" if i.get("dirty") else "")) if i.get("commit") else "not recorded" for i in invocations
    ]
    if len(set(per_invocation)) > 1 and any(i.get("commit") for i in invocations):  # units from different (or unknown) code
        lines.append("- Invocations ran at commits " + ", ".join(per_invocation) + " (in order; the line above is the latest)")
    started = [str(i["started"]) for i in invocations if i.get("started")]
    if started:
        lines.append(f"- Date: {started[0]}" + (f" (last resumed {started[-1]})" if len(started) > 1 else ""))
    if env:
        packages = env.get("packages") if isinstance(env.get("packages"), dict) else {}
        parts = [
            str(env.get("processor") or "unknown processor"),
            f"{env['cpu_count']} CPUs" if env.get("cpu_count") else None,
            f"Python {env['python']}" if env.get("python") else None,
            f"torch {packages['torch']}" if packages.get("torch") else None,
            f"transformers {packages['transformers']}" if packages.get("transformers") else None,
            str(env["platform"]) if env.get("platform") else None,
        ]
        lines.append("- Machine: " + ", ".join(p for p in parts if p))
    return lines


def _commands(info: dict[str, Any]) -> list[str]:
    invocations = info.get("invocations") if isinstance(info.get("invocations"), list) else []
    merged = any(isinstance(i, dict) and i.get("part") for i in invocations)
    if merged:  # `baa merge`: each part's commands, then the merge (and whatever ran on the merged run)
        header = f"Produced by {len(invocations)} invocations (seeds run as separate parts, then merged with `baa merge`):"
    else:
        header = "Produced by:" if len(invocations) <= 1 else f"Produced by {len(invocations)} invocations (the run was resumed):"
    out = ["", header, ""]
    if not invocations and isinstance(info.get("command"), (list, str)):  # a benchmark script's one command
        invocations = [{"command": info["command"]}]
    if not invocations:
        return ["", f"Produced by: command not recorded (no {RunDir.run_info.name} invocations)."]
    out.append("```")
    for invocation in invocations:
        command = invocation.get("command") if isinstance(invocation, dict) else None
        part = invocation.get("part") if isinstance(invocation, dict) else None
        # A trailing comment, not a line of its own: a "# ..." line reads as a heading to Markdown tools.
        note = (f"  # part {part}" if part else "  # the merged run") if merged else ""
        out.append(render_command(command) + note)
    out.append("```")
    return out


def _relative_link(target: Path, out: Path | None) -> str:
    base = (out.parent if out is not None else Path.cwd()).resolve()
    return Path(os.path.relpath(target.resolve(), base)).as_posix()


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "run"


def _copy_figure(source: Path, target: Path) -> None:
    try:
        with atomic_path(target) as tmp:
            shutil.copyfile(source, tmp)
    except OSError as exc:
        raise ReportError(f"cannot copy figure '{source}' to '{target}': {exc.strerror or exc}") from None


def _has_soft_budgeted(rows: list[dict[str, Any]]) -> bool:
    return any(r.get("method") == "budgeted" and r.get("cost_kind", "soft-estimate") == "soft-estimate" for r in rows)


def run_section(run: dict[str, Any], *, figures_dir: Path | None, out: Path | None) -> str:
    """The Markdown section of one loaded run (see :func:`load_run`); copies its figures."""
    lines = [f"## {run['name']}"]
    lines += _commands(run["info"])
    lines += [""] + _environment_lines(run["info"])
    if run["wall_time"]:
        lines.append(f"- Wall time: {run['wall_time']}")
    lines.append(f"- Run directory: `{run['path']}`")
    if run.get("config_name") and run["config_name"] != run["name"]:
        lines.append(f"- Config name: `{run['config_name']}` (the run directory has another name; the commands show how it was run)")
    if run["results"].get("partial"):
        lines += ["", f"**{run['results']['partial']}**"]
    if isinstance(run["config"].get("notes"), str) and run["config"]["notes"].strip():
        lines += ["", run["config"]["notes"].strip()]
    seeds = sorted({r.get('seed') for r in run["rows"] if r.get("seed") is not None}, key=str)
    lm = metric_of(run["rows"]) is LOSS_METRIC
    units = (
        "Losses in nats per token: `test loss` on the held-out test documents, `val. loss` on the validation documents; "
        "`test ppl.` = exp(test loss)." if lm else
        "Accuracies in %; `test acc.` on the held-out test split, `val. acc.` on the validation split."
    )
    if run["rows"]:  # a load test has no accuracy rows
        lines += ["", f"### {run['name']}: results", "", f"{len(run['rows'])} rows, seeds {', '.join(map(str, seeds)) or 'none'}; mean ± std over seeds. " + units, ""]
        lines.append(markdown_table(aggregate(run["rows"])).rstrip("\n"))
    int8 = int8_notes(run["rows"])
    if int8:
        lines += ["", f"### {run['name']}: int8 graphs against their float graphs and against dense int8", "", *int8]
    routing = routing_table(run["rows"])
    if routing:
        lines += ["", f"### {run['name']}: routing (Meta-Attention, test split)", "", routing.rstrip("\n")]
    if _has_soft_budgeted(run["rows"]) and not lm:
        lines += ["", f"### {run['name']}: headline (soft `budgeted` gates, operating points chosen on validation)", ""]
        lines.append(headline_markdown(headline(run["rows"])).rstrip("\n"))
    ladder = ladder_markdown(run["rows"])
    if ladder:
        lines += ["", f"### {run['name']}: pruned models vs the ladder of smaller models at matched latency", "", ladder.rstrip("\n")]
    for bench_path, bench in run["benches"]:
        lines += ["", f"### {run['name']}: speed (`{bench_path.name}`)", ""]
        if bench.get("checkpoint"):
            lines += [f"Checkpoint: `{bench['checkpoint']}`", ""]
        lines.append(bench_table(bench).rstrip("\n"))
    if run.get("routing_bench"):
        lines += ["", f"### {run['name']}: hard routing vs full attention at long sequences (`{RunDir.routing_bench_json.name}`)", ""]
        if run["routing_bench"].get("checkpoint"):
            lines += [f"Checkpoint: `{run['routing_bench']['checkpoint']}`", ""]
        lines.append(routing_bench_markdown(run["routing_bench"]).rstrip("\n"))
    if run.get("routed"):
        lines += ["", f"### {run['name']}: per-input head routing (`{RunDir.routed_json.name}`)", "", routed_markdown(run["routed"]).rstrip("\n")]
    if run.get("serve_load"):
        lines += ["", f"### {run['name']}: load test of baa serve (`{RunDir.serve_load.name}`)", "", serve_load_markdown(run["serve_load"]).rstrip("\n")]
    if run.get("serve_soak"):
        lines += ["", f"### {run['name']}: faults and hostile clients (`{RunDir.serve_soak.name}`)", "", serve_soak_markdown(run["serve_soak"]).rstrip("\n")]
    if run["figures"]:
        lines += ["", f"### {run['name']}: figures", ""]
        for figure in run["figures"]:
            if figures_dir is None:
                target = figure
            else:
                target = figures_dir / f"{_safe_name(run['name'])}_{figure.name}"
                _copy_figure(figure, target)
            lines += [f"![{run['name']}: {figure.stem.replace('_', ' ')}]({_relative_link(target, out)})", ""]
        lines.pop()
    return "\n".join(lines) + "\n"


def build_report(
    run_dirs: list[Path],
    *,
    figures_dir: Path | None,
    title: str = "Results",
    out: Path | None = None,
    command: list[str] | str | None = None,
) -> str:
    """The whole Markdown document for ``run_dirs`` (one section each, in the given order).

    ``figures_dir``: where each run's ``*.png`` are copied as ``<name>_<file>.png`` (None: link
    the run directory's files in place). ``out``: the file the text will be written to, for
    relative figure links (None: relative to the working directory). ``command``: the command
    named in the header (default ``sys.argv``). Every run directory is read before anything is
    copied, so a bad one fails the whole report without side effects.
    """
    if not run_dirs:
        raise ReportError("no run directory given")
    runs = [load_run(p) for p in run_dirs]
    seen: dict[str, Path] = {}
    for run in runs:
        if run["name"] in seen and figures_dir is not None and run["figures"]:
            raise ReportError(f"two run directories named '{run['name']}' ('{seen[run['name']]}' and '{run['path']}'): their figures would overwrite each other")
        seen[run["name"]] = run["path"]
    if figures_dir is not None and out is not None:
        _refuse_figures_of_other_pages(runs, figures_dir, out)
    header = [
        f"# {title}",
        "",
        f"Generated by `{render_command(sys.argv if command is None else command)}` on {time.strftime('%Y-%m-%d %H:%M:%S %z')}.",
        "",
        "Every table and figure below is written from the run directories by this command; do not edit by hand, "
        "rerun it instead. Run directories hold the resolved config, seeds, package versions, the commands that "
        f"produced them and the raw rows ({RunDir.results_json.name}).",
        "",
        "Contents: " + ", ".join(f"[{r['name']}](#{_anchor(r['name'])})" for r in runs) + ".",
    ]
    sections = [run_section(run, figures_dir=figures_dir, out=out) for run in runs]
    return "\n".join(header) + "\n\n" + "\n".join(sections)


def _refuse_figures_of_other_pages(runs: list[dict[str, Any]], figures_dir: Path, out: Path) -> None:
    """Refuse to copy a figure over one that another Markdown page beside ``out`` shows: two pages
    of run directories with the same name would otherwise silently share (and swap) figures."""
    pages = [page for page in sorted(out.parent.glob("*.md")) if page.resolve() != out.resolve()]
    if not pages:
        return
    texts = {page: page.read_text(encoding="utf-8", errors="replace") for page in pages}
    for run in runs:
        for figure in run["figures"]:
            target = figures_dir / (_safe_name(run["name"]) + "_" + figure.name)
            link = "](" + _relative_link(target, out) + ")"
            for page, text in texts.items():
                if link in text:
                    raise ReportError(f"figure '{target}' is shown by '{page}': give this report its own --figures-dir (run directory '{run['path']}')")


def _anchor(heading: str) -> str:
    """GitHub-style anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def write_report(
    run_dirs: list[Path],
    out: Path,
    figures_dir: Path | None = None,
    title: str = "Results",
    command: list[str] | str | None = None,
) -> Path:
    """Build the report and write it atomically to ``out``; figures go to ``figures_dir``
    (default ``<out dir>/figures``). Returns ``out``."""
    out = Path(out)
    figures = Path(figures_dir) if figures_dir is not None else out.parent / "figures"
    text = build_report([Path(p) for p in run_dirs], figures_dir=figures, title=title, out=out, command=command)
    try:
        write_text_atomic(out, text)
    except OSError as exc:
        raise ReportError(f"cannot write '{out}': {exc.strerror or exc}") from None
    return out
