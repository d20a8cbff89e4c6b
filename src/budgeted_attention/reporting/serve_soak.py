"""Markdown of a ``benchmarks/serve_soak.py`` run (``serve_soak.json``): the HTTP-limit probes,
the soak's responses by client kind and status, restarts, and resident memory over time."""

from __future__ import annotations

from typing import Any


def _num(value: Any, digits: int = 1) -> str:
    return "" if value is None else f"{value:,.{digits}f}"


def probes_markdown(probes: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| probe | what the client did | answer | seconds | bytes the client got out | peak RSS over idle (MB) |",
        "|---|---|---|---:|---:|---:|",
    ]
    for probe in probes:
        answer = probe.get("answer") or ("closed" if probe.get("status") is None else str(probe["status"]))
        sent = "" if probe.get("bytes_sent") is None else f"{probe['bytes_sent']:,}"
        lines.append(
            f"| {probe['name']} | {probe['what']} | {answer} | {_num(probe.get('seconds'), 2)} | {sent} | {_num(probe.get('rss_peak_delta_mb'))} |"
        )
    return lines


def soak_markdown(soak: dict[str, Any]) -> list[str]:
    statuses = sorted({s for counts in soak["by_kind"].values() for s in counts}, key=lambda s: (s == "none", s))
    faults = ", ".join(f"{e['what']} at {e['at_s']:.0f} s" for e in soak["events"])
    lines = [
        f"{soak['seconds']:.0f} s of mixed clients ({soak['good_rate']:g} good requests/s, Poisson, plus bad, oversized and "
        f"disconnecting clients); engine faults: {faults}.",
        "",
        "| client kind | requests | " + " | ".join(f"{s}" for s in statuses) + " |",
        "|---|---:|" + "---:|" * len(statuses),
    ]
    for kind, counts in soak["by_kind"].items():
        lines.append(f"| {kind} | {sum(counts.values()):,} | " + " | ".join(f"{counts.get(s, 0):,}" for s in statuses) + " |")
    recovery = ", ".join(f"{e['what']}: first 200 again {_num(e.get('recovered_s'))} s after" for e in soak["events"])
    lines += [
        "",
        f"Good requests answered 200: {soak['good_ok']:,} of {soak['good_total']:,} ({100 * soak['good_ok'] / max(1, soak['good_total']):.1f} %), "
        f"not answered at all (reset or timed out): **{soak.get('good_unanswered', soak['by_kind'].get('good', {}).get('none', 0)):,}**; "
        f"server errors (5xx other than 503): **{soak['server_errors']}**; engine restarts (`baa_engine_restarts_total`): "
        f"**{soak['restarts']:g}**; client disconnects counted (`baa_client_disconnects_total`): {soak['disconnects']:g}. {recovery}.",
        "",
        f"Resident memory (server + engine processes): idle {_num(soak['rss_idle_mb'])} MB, peak {_num(soak['rss_peak_mb'])} MB, "
        f"end {_num(soak['rss_end_mb'])} MB.",
    ]
    series = soak.get("rss_series", [])
    if series:
        step = max(1, len(series) // 12)
        picked = series[::step]
        lines += ["", "| t (s) | " + " | ".join(f"{t:.0f}" for t, _ in picked) + " |", "|---|" + "---:|" * len(picked),
                  "| RSS (MB) | " + " | ".join(f"{m:.0f}" for _, m in picked) + " |"]
    return lines


def serve_soak_markdown(result: dict[str, Any]) -> str:
    """The whole section body: set-up, probes, soak, shutdown."""
    setting = result["setting"]
    lines = [
        f"Server: `{setting['server_command']}` (ready {setting['ready_seconds']:.1f} s after start), loopback, "
        f"CPU: {setting.get('cpu') or 'unknown'}; body limit {setting['body_limit']:,} bytes.",
        "",
        "**Probes** (one at a time on an idle server; peak resident memory of the server and engine processes over idle, sampled every 20 ms):",
        "",
        *probes_markdown(result["probes"]),
        "",
        "**Soak**:",
        "",
        *soak_markdown(result["soak"]),
    ]
    shutdown = result.get("shutdown")
    if shutdown:
        lines += [
            "",
            f"**Shutdown**: SIGTERM with {shutdown['slow_connections']} slow connections open (`shutdown_timeout_s` "
            f"{shutdown['shutdown_timeout_s']:g}): exit code {shutdown['exit_code']} after {shutdown['seconds']:.2f} s; "
            f"the slow connections got {', '.join(shutdown['answers'])}.",
        ]
    return "\n".join(lines) + "\n"
