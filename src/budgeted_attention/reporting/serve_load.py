"""Markdown tables of a ``benchmarks/serve_load.py`` run (``serve_load.json``)."""

from __future__ import annotations

import statistics
from typing import Any


def peak_rate(arrivals: str, rate: float, on_off_s: tuple[float, float]) -> float:
    """Arrival rate (requests/s) while requests arrive: ``rate`` for Poisson, the in-burst rate for
    bursty arrivals of ``on_off_s`` = (seconds on, seconds off)."""
    on_s, off_s = on_off_s
    return rate * (on_s + off_s) / on_s if arrivals == "bursty" else rate


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def _budget(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def _pct(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.1f}"


def _variant_lines(result: dict[str, Any]) -> list[str]:
    """The A/B line when a second server ran every trial too (``--variant``)."""
    variant = result.get("setting", {}).get("variant")
    if not variant:
        return []
    added = ", ".join(f"`{v}`" for v in variant.get("settings", []))
    ready = f" (ready {variant['ready_seconds']:.1f} s after start)" if variant.get("ready_seconds") is not None else ""
    alternating = any(t.get("order") for t in result.get("trials", []))
    order = "the second server first on odd repeats" if alternating else "the first server first in every repeat"
    return [
        f"A/B: a second server (`{variant.get('server_command', '')}`{ready}) adds {added}; every trial ran on both servers, one after "
        f"the other with the same arrivals ({order}; its modes are marked [{', '.join(variant.get('settings', []))}]); capacity and "
        "deadline are the first server's."
    ]


def serve_load_markdown(result: dict[str, Any]) -> str:
    """Set-up facts, then one row per (arrivals, load, mode): throughput, latency percentiles,
    SLO attainment, effective accuracy, shed requests, server errors, budgets used, peak memory."""
    setting = result.get("setting", {})
    lines = [
        f"Server: `{setting.get('server_command', '')}`; ready {setting.get('ready_seconds', float('nan')):.1f} s after start.",
        f"Dense capacity (closed loop, b = 1, {setting.get('capacity_concurrency')} clients): {_capacity_text(result)}. "
        f"Deadline: {_deadline_text(result)}; "
        f"SLO-mode requests ask for {setting.get('slo_request_fraction', 1.0):g} of it (room for the HTTP round trip).",
        f"Test split: {setting.get('texts')} texts with their labels, one text per request; "
        f"{setting.get('trial_seconds')} s per trial (at most {setting.get('max_requests')} requests).",
        *_variant_lines(result),
        *([f"Load generator pinned to CPU(s) {', '.join(map(str, setting['loadgen_cpus']))} (`--loadgen-cpus`) once the servers were up."]
          if setting.get("loadgen_cpus") else []),
        "",
        "| arrivals | load | mode | repeat | requests | throughput /s | p50 ms | p95 ms | p99 ms | SLO attainment % | effective acc. % | "
        "acc. of answered % | shed | 5xx | no response | mean budget | peak RSS MiB |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for trial in result.get("trials", []):
        s = trial["summary"]
        lines.append(
            f"| {trial['arrivals']} | {trial['load']:g}x | {trial['mode']} | {trial.get('repeat', 0)} | {s['requests']} | {s['throughput_rps']:.1f} | "
            f"{_ms(s['p50_ms'])} | {_ms(s['p95_ms'])} | {_ms(s['p99_ms'])} | {_pct(s['slo_attainment'])} | "
            f"{_pct(s['effective_accuracy'])} | {_pct(s['accuracy_answered'])} | {s['shed']} | {s['server_errors']} | "
            f"{s['no_response']} | {_budget(s['mean_budget'])} | "
            f"{trial.get('peak_rss_mib', 0):.0f} |"
        )
    lines += _repeat_means(result.get("trials", []))
    lines += _feasibility(result)
    fuzz = result.get("fuzz")
    if fuzz:
        lines += ["", f"Schema fuzz: {fuzz['requests']} generated bodies against the live server's OpenAPI schema; "
                  f"status counts {fuzz['status_counts']}; 5xx: {fuzz['server_errors']}."]
    if result.get("shutdown"):
        lines += ["", f"Shutdown (SIGTERM): exit code {result['shutdown']['exit_code']} after {result['shutdown']['seconds']:.1f} s."]
    return "\n".join(lines) + "\n"


def _given(result: dict[str, Any], key: str) -> bool:
    """Whether ``key`` was given on the command line (it differs from the value this run measured)."""
    measured = result.get(f"measured_{key}")
    return measured is not None and measured != result.get(key)


def _capacity_text(result: dict[str, Any]) -> str:
    text = f"{result.get('capacity_rps', float('nan')):.1f} requests/s"
    return text + (f" (given; {result['measured_capacity_rps']:.1f} measured in this run)" if _given(result, "capacity_rps") else "")


def _deadline_text(result: dict[str, Any]) -> str:
    text = f"{result.get('deadline_ms', float('nan')):.1f} ms"
    rule = "the p95 of fixed b = 1 at 0.5x capacity (Poisson)"
    if _given(result, "deadline_ms"):
        return text + f" (given; {rule} measured in this run: {result['measured_deadline_ms']:.1f} ms)"
    return text + f" = {rule}"


def _repeat_means(trials: list[dict[str, Any]]) -> list[str]:
    """Mean ± std (min) over the repeats of each (arrivals, load, mode), when any was repeated."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for trial in trials:
        groups.setdefault((trial["arrivals"], trial["load"], trial["mode"]), []).append(trial["summary"])
    if all(len(summaries) == 1 for summaries in groups.values()):
        return []
    lines = ["", "Over the repeats (mean ± std, min): the same trial with its own arrival seed; timing on this shared machine "
             "varies from trial to trial.", "",
             "| arrivals | load | mode | repeats | SLO attainment % | min % | effective acc. % | min % | 5xx |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for (arrivals, load, mode), summaries in groups.items():
        cells = []
        for key in ("slo_attainment", "effective_accuracy"):
            values = [100 * s[key] for s in summaries if s.get(key) is not None]
            spread = f" ± {statistics.stdev(values):.1f}" if len(values) > 1 else ""
            cells += [f"{statistics.fmean(values):.1f}{spread}" if values else "", f"{min(values):.1f}" if values else ""]
        lines.append(f"| {arrivals} | {load:g}x | {mode} | {len(summaries)} | " + " | ".join(cells)
                     + f" | {sum(s['server_errors'] for s in summaries)} |")
    return lines


def _feasibility(result: dict[str, Any]) -> list[str]:
    """Arrival rate while requests arrive against the capacity at each measured fixed budget: a
    rate above the capacity at the lowest budget the policy may use grows a queue, whatever it picks."""
    by_budget = result.get("capacity_by_budget")
    if not by_budget:
        return []
    budgets = sorted(by_budget, key=float, reverse=True)
    on_off = tuple(result.get("setting", {}).get("bursty_on_off_s", (1.0, 1.0)))
    lines = ["", "Capacity (closed loop, same clients) at fixed budgets: "
             + ", ".join(f"b = {b}: {by_budget[b]:.1f} requests/s" for b in budgets) + ".", "",
             "| arrivals | load | arrival rate while arriving /s | " + " | ".join(f"rate / capacity at b = {b}" for b in budgets) + " |",
             "|---|---:|---:|" + "---:|" * len(budgets)]
    for arrivals, load in dict.fromkeys((t["arrivals"], t["load"]) for t in result.get("trials", [])):  # one row per pair, in order
        rate = peak_rate(arrivals, load * result["capacity_rps"], on_off)
        ratios = [f"{rate / by_budget[b]:.2f}" if by_budget[b] > 0 else "no answers" for b in budgets]
        lines.append(f"| {arrivals} | {load:g}x | {rate:.0f} | " + " | ".join(ratios) + " |")
    lines += ["", "A ratio above 1 at the lowest budget the SLO policy may use means requests arrive faster than the server "
              "can answer them at any budget it may pick: the queue grows through each burst and the deadline is missed "
              "for the rest of it, whatever the policy does."]
    return lines
