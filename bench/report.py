"""The issue's targets, judged from a suite result, and the result as Markdown tables.

Usage: .venv/bin/python bench/report.py bench/results/<file>.json   (prints the tables)
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from machine import one_line


def core_rows(core: Mapping[str, Any], chunks: int = 20) -> dict[str, dict[str, Any]]:
    """bench/core.py's rows for a ``chunks``-hit response, by verdict cache ("cold": Rego
    evaluates every chunk; "hot": steady state; "none": a gate without a verdict cache),
    at the largest text size it measured (the conservative one)."""
    rows: dict[str, dict[str, Any]] = {}
    for row in core.get("scaling", []):
        cache = row.get("verdict_cache")
        if row.get("chunks") == chunks and row.get("text_bytes", 0) >= rows.get(cache, {}).get(
            "text_bytes", 0
        ):
            rows[cache] = row
    return rows


def judge(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, each met (True), not met (False) or not measured (None)."""
    targets: list[dict[str, Any]] = []

    def add(target: str, limit: str, measured: float | None, met: bool | None, **more: str) -> None:
        targets.append(
            {"target": target, "limit": limit, "measured": measured, "met": met}
            | {"unit": "", "note": ""}
            | more
        )

    by_connections = results.get("headline", {}).get("connections", {})
    one, eight = by_connections.get("1"), by_connections.get("8")
    if one:
        p50, p99 = one["compare"]["added_p50_ms"], one["compare"]["added_p99_ms"]
        add("added p50 at 1 connection", "<= 1 ms", p50, p50 <= 1.0, unit="ms")
        add("added p99 at 1 connection", "<= 3 ms", p99, p99 <= 3.0, unit="ms")
    cpu = max((h["gate"]["sidecar_cpu_s_per_1k"] * 1000 for h in (one, eight) if h), default=None)
    if cpu is not None:
        note = "the worse of 1 and 8 connections"
        add("sidecar CPU per filtered response", "<= 400 µs", cpu, cpu <= 400, unit="µs", note=note)
    if eight:
        ratio = eight["compare"]["rps_ratio"]
        add(
            "throughput at 8 connections, gate / alone",
            ">= 25%",
            100 * ratio,
            ratio >= 0.25,
            unit="%",
        )
    core = results.get("core", {}).get("results") or {}
    what = "decision core per 20-chunk response, Rego included"
    rows = core_rows(core)
    for cache, label in (("cold", "Rego on every chunk"), ("none", ""), ("hot", "steady state")):
        if cache in rows:
            us, size = rows[cache]["median_us"], rows[cache]["text_bytes"]
            note = f"verdict cache {cache}" + (f" = {label}" if label else "")
            note += f", {size} B text, median"
            add(what, "<= 400 µs", us, us <= 400, unit="µs", note=note)
    if "core" in results and not rows:
        note = results["core"].get("skipped") or "no 20-chunk row from bench/core.py"
        add(what, "<= 400 µs", None, None, note=note)
    corpus = {(r["corpus"], r["metadata_cache"]): r["median_us"] for r in core.get("corpus", [])}
    if (1_000, "hot") in corpus and (100_000, "hot") in corpus:
        growth = corpus[(100_000, "hot")] / corpus[(1_000, "hot")]
        add(
            "decision core, 100k vs 1k records in the store",
            "no growth (<= 1.25x: noise)",
            growth,
            growth <= 1.25,
            unit="x",
            note="metadata cache hot",
        )
    cold = results.get("postgres", {}).get("cold")
    if cold:
        lookups = cold["store"]["lookups_per_response"]
        add(
            "cold cache (PostgreSQL): store round trips per response",
            "1",
            lookups,
            abs(lookups - 1) < 0.05,
            note="the sidecar's /metrics",
        )
        p99 = cold["compare"]["added_p99_ms"]
        add(
            "cold cache (PostgreSQL): added p99, 1 connection",
            "<= 6 ms",
            p99,
            p99 <= 6.0,
            unit="ms",
        )
    return targets


# The targets a per-request ext_proc design answers for, whatever the gate does inside.
FLOOR_PATHS = ("gate", "floor", "floor+body", "floor 4 msg", "floor 1 msg")


def gate_over_floor(floor: Mapping[str, Any], conns: str) -> tuple[str, Mapping[str, float]]:
    """(the floor's name, the gate's cost over it) at ``conns``; runs before issue 15
    compared with floor+body, which had the gate's messages then."""
    at = floor["connections"][conns]
    if "gate_over_floor" in at:
        return floor.get("matched_floor", "floor 4 msg"), at["gate_over_floor"]
    return "floor+body", at["gate_over_floor_body"]


def judge_round_two(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Issue 15's targets, from the floor section's interleaved rounds: the gate's own CPU
    above the floor with its messages at 1 and 8 connections, added p50 at 1 connection
    and throughput against Envoy alone at 8 connections."""
    floor = results.get("floor", {})
    conns = floor.get("connections", {})
    if "1" not in conns or "8" not in conns:
        return []
    targets = []
    for c in ("1", "8"):
        name, over = gate_over_floor(floor, c)
        targets.append(
            {
                "target": f"gate's own CPU above {name}, {c} connection{'s' if c != '1' else ''}",
                "limit": "<= 200 µs",
                "measured": over["sidecar_cpu_us"],
                "unit": "µs",
                "met": over["sidecar_cpu_us"] <= 200,
            }
        )
    one, eight = conns["1"]["paths"]["gate"]["compare"], conns["8"]["paths"]["gate"]["compare"]
    targets.append(
        {
            "target": "added p50, 1 connection",
            "limit": "<= 1.2 ms",
            "measured": one["added_p50_ms"],
            "unit": "ms",
            "met": one["added_p50_ms"] <= 1.2,
        }
    )
    targets.append(
        {
            "target": "gate / Envoy alone throughput, 8 connections",
            "limit": ">= 20%",
            "measured": 100 * eight["rps_ratio"],
            "unit": "%",
            "met": eight["rps_ratio"] >= 0.20,
        }
    )
    return targets


def judge_floor(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The issue's protocol-bound targets (added p50/p99 at 1 connection, sidecar CPU per
    response, throughput at 8 connections) for the gate and each floor variant, from the
    floor section's interleaved rounds: a floor that misses a target proves that no work
    done inside this design can meet it."""
    floor = results.get("floor", {}).get("connections", {})
    one, eight = floor.get("1"), floor.get("8")
    if not one or not eight:
        return []
    rows = []
    for key in FLOOR_PATHS:
        if key not in one["paths"] or key not in eight["paths"]:
            continue
        c1, c8 = one["paths"][key], eight["paths"][key]
        p50, p99 = c1["compare"]["added_p50_ms"], c1["compare"]["added_p99_ms"]
        cpu = 1000 * max(c1["run"]["sidecar_cpu_s_per_1k"], c8["run"]["sidecar_cpu_s_per_1k"])
        ratio = c8["compare"]["rps_ratio"]
        rows.append(
            {
                "path": key,
                "added_p50_ms": p50,
                "added_p50_met": p50 <= 1.0,
                "added_p99_ms": p99,
                "added_p99_met": p99 <= 3.0,
                "sidecar_cpu_us": cpu,
                "sidecar_cpu_met": cpu <= 400,
                "rps_ratio_c8": ratio,
                "rps_ratio_met": ratio >= 0.25,
            }
        )
    return rows


def _background(machine: Mapping[str, Any]) -> str:
    start, end = machine["load_average_at_start"], machine.get("load_average_at_end", ["?"])
    return (
        f"Other work on the machine: {machine.get('busy_cores_before_start', '?')} cores busy "
        f"just before the run; load average {start[0]} at the start, {end[0]} at the end."
    )


def _seen(results: Mapping[str, Any]) -> str:
    stacks = results.get("stacks") or results.get("postgres", {}).get("stacks") or {}
    if not stacks:
        return ""
    seen = next(iter(stacks.values()))
    return (
        f" (processes in the sidecar's tree: {seen['sidecar_processes']}; endpoints in "
        f"Envoy's sidecar cluster: {seen['envoy_sidecar_endpoints']})"
    )


def _f(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def _lat(m: Mapping[str, float]) -> str:
    return f"{m['p50_ms']:.2f} / {m['p90_ms']:.2f} / {m['p99_ms']:.2f}"


def _mark(value: str, met: bool) -> str:
    return value if met else f"**{value}**"


def _floor(
    floor: Mapping[str, Any], plan: Mapping[str, Any], targets: list[dict[str, Any]]
) -> list[str]:
    variants = floor["variants"]
    out = [
        f"**The floor: Python grpc.aio ext_proc doing no work** ({floor['workload']}, hot "
        f"cache; `{floor['servicer']}` behind the gate's own front Envoy; Envoy alone, the "
        f"gate and every floor interleaved, {plan['floor_rounds']} x {plan['floor_seconds']} s "
        "per path; CPU in µs per response)",
        "",
        "| conns | path | messages | body back | req/s | vs alone | p50 / p90 / p99 "
        "| added p50 / p99 | sidecar CPU | front Envoy CPU |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for conns, f in floor["connections"].items():
        e = f["envoy"]
        out.append(
            f"| {conns} | Envoy alone | | | {e['rps']:,.0f} | | {_lat(e)} | | "
            f"| {1000 * e['front_envoy_cpu_s_per_1k']:,.0f} |"
        )
        for key, m in f["paths"].items():
            g, c = m["run"], m["compare"]
            # The gate has the messages of the floor it is measured against.
            v = variants.get(key) or variants.get(
                floor.get("matched_floor", ""), {"messages": 3, "echo_body": True}
            )
            body = "filtered" if key == "gate" else ("same bytes" if v["echo_body"] else "no")
            out.append(
                f"| {conns} | {key} | {v['messages']} | {body} | {g['rps']:,.0f} "
                f"| {c['rps_ratio']:.1%} | {_lat(g)} "
                f"| {c['added_p50_ms']:+.2f} / {c['added_p99_ms']:+.2f} "
                f"| {1000 * g['sidecar_cpu_s_per_1k']:,.0f} "
                f"| {1000 * g['front_envoy_cpu_s_per_1k']:,.0f} |"
            )
    name = gate_over_floor(floor, next(iter(floor["connections"])))[0]
    over = [
        f"{conns} connection{'s' if conns != '1' else ''}: {o['p50_ms']:+.2f} ms p50, "
        f"{o['p99_ms']:+.2f} ms p99, {o['sidecar_cpu_us']:+,.0f} µs sidecar CPU per response, "
        f"{o['rps_ratio']:.0%} of its requests/s"
        for conns in floor["connections"]
        for o in (gate_over_floor(floor, conns)[1],)
    ]
    out += ["", f"The gate over {name} (its own work): " + "; ".join(over) + ".", ""]
    if targets:
        out += [
            "Against the issue's targets (same rounds; bold: not met):",
            "",
            "| path | added p50, 1 conn (<= 1 ms) | added p99, 1 conn (<= 3 ms) "
            "| sidecar CPU, worse of 1 and 8 conns (<= 400 µs) | gate / alone, 8 conns (>= 25%) |",
            "|---|---|---|---|---|",
        ]
        for t in targets:
            cells = [
                _mark(f"{t['added_p50_ms']:+.2f} ms", t["added_p50_met"]),
                _mark(f"{t['added_p99_ms']:+.2f} ms", t["added_p99_met"]),
                _mark(f"{t['sidecar_cpu_us']:,.0f} µs", t["sidecar_cpu_met"]),
                _mark(f"{t['rps_ratio_c8']:.1%}", t["rps_ratio_met"]),
            ]
            out.append(f"| {t['path']} | " + " | ".join(cells) + " |")
        out.append("")
    return out


def _pieces(p: Mapping[str, Any]) -> list[str]:
    out = [
        f"**Where the sidecar's CPU goes** ({p['workload']}, hot cache; py-spy `--gil` at "
        f"{p['rate_hz']} Hz under wrk load, {p['rounds']} x {p['seconds']} s per path and "
        f"connection count, medians; µs per response; floor: {p['floor_name']})",
        "",
        "| piece | gate, 1 conn | floor, 1 conn | gate, 8 conns | floor, 8 conns |",
        "|---|---|---|---|---|",
    ]
    gate, floor = p["gate"], p["floor"]
    for name in gate["1"]["pieces"]:
        cells = [
            f"{run[c]['pieces'].get(name, 0.0):,.0f}" for c in ("1", "8") for run in (gate, floor)
        ]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    totals = [f"**{run[c]['cpu_us']:,.0f}**" for c in ("1", "8") for run in (gate, floor)]
    out.append("| **sidecar CPU in all** | " + " | ".join(totals) + " |")
    above = [
        f"{c} connection{'s' if c != '1' else ''}: "
        f"{gate[c]['cpu_us'] - floor[c]['cpu_us']:+,.0f} µs"
        for c in ("1", "8")
    ]
    out += ["", "The gate above the floor in these runs: " + "; ".join(above) + ".", ""]
    return out


def _sweep(s: Mapping[str, Any]) -> list[str]:
    out = [
        f"**Throughput against connections** ({s['workload']}, hot cache; Envoy alone, "
        f"{s['floor']} and the gate interleaved per connection count)",
        "",
        "| conns | alone req/s | floor req/s | gate req/s | gate / alone | gate p50 / p99 "
        "| sidecar CPU (µs) |",
        "|---|---|---|---|---|---|---|",
    ]
    paths = s["paths"]
    for i, c in enumerate(s["connections"]):
        e, f, g = paths["envoy"][i], paths["floor"][i], paths["gate"][i]
        out.append(
            f"| {c} | {e['rps']:,.0f} | {f['rps']:,.0f} | {g['rps']:,.0f} "
            f"| {g['rps'] / e['rps']:.1%} | {g['p50_ms']:.2f} / {g['p99_ms']:.2f} "
            f"| {1000 * g['sidecar_cpu_s_per_1k']:,.0f} |"
        )
    out.append("")
    return out


def _channel(ch: Mapping[str, Any]) -> list[str]:
    out = [
        f"**Envoy's channel to the sidecar: unix socket vs loopback TCP** ({ch['workload']}, "
        f"hot cache; two otherwise identical gate stacks, {ch['rounds']} x {ch['seconds']} s "
        "per path, interleaved; CPU in µs per response)",
        "",
        "| conns | channel | req/s | p50 / p90 / p99 | sidecar CPU | front Envoy CPU |",
        "|---|---|---|---|---|---|",
    ]
    for conns, row in ch["connections"].items():
        for key, name in (("unix", "unix socket"), ("tcp", "loopback TCP")):
            m = row[key]
            out.append(
                f"| {conns} | {name} | {m['rps']:,.0f} | {_lat(m)} "
                f"| {1000 * m['sidecar_cpu_s_per_1k']:,.0f} "
                f"| {1000 * m['front_envoy_cpu_s_per_1k']:,.0f} |"
            )
    out += ["", "TCP - unix, paired per round (median, range):", ""]
    for conns, row in ch["connections"].items():
        d = row["tcp_minus_unix"]
        out.append(
            f"- {conns} conn{'s' if conns != '1' else ''}: p50 {_paired(d['p50_ms'], '+.3f')} "
            f"ms, p99 {_paired(d['p99_ms'], '+.3f')} ms, req/s {_paired(d['rps'], '+,.0f')}, "
            f"sidecar CPU {_paired(d['sidecar_cpu_us'], '+,.0f')} µs, Envoy CPU "
            f"{_paired(d['envoy_cpu_us'], '+,.0f')} µs"
        )
    out.append("")
    return out


def _paired(v: Mapping[str, float], fmt: str) -> str:
    return f"{v['median']:{fmt}} ({v['min']:{fmt}} .. {v['max']:{fmt}})"


def markdown(report: Mapping[str, Any]) -> str:
    r = report["results"]
    out = [
        f"Run {report['when']} ({report['plan_name']} run), `{report['command']}`",
        "",
        f"Machine: {one_line(report['machine'])}; revision {report['machine']['git_revision']}.",
        _background(report["machine"]),
        f"Sidecar workers: {report['workers']}{_seen(r)}; Envoy --concurrency "
        f"{report['envoy_concurrency']}; wrk on the same cores. Medians over interleaved "
        "rounds; latency in ms; CPU in ms per response (= s per 1,000 responses).",
        "",
    ]
    if "headline" in r:
        plan = report["plan"]
        out += [
            f"**Envoy alone vs Envoy + gate** ({r['headline']['workload']}, half rejected, hot "
            f"cache: {r['headline']['store']['misses_per_response']:.2f} cache misses per "
            f"response; {plan['headline_rounds']} x {plan['headline_seconds']} s per path)",
            "",
            "| conns | alone req/s | + gate req/s | ratio | alone p50 / p90 / p99 "
            "| + gate p50 / p90 / p99 | added p50 / p99 | sidecar CPU |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for conns, h in r["headline"]["connections"].items():
            e, g, c = h["envoy"], h["gate"], h["compare"]
            out.append(
                f"| {conns} | {e['rps']:,.0f} | {g['rps']:,.0f} | {c['rps_ratio']:.1%} "
                f"| {_lat(e)} | {_lat(g)} | {c['added_p50_ms']:+.2f} / {c['added_p99_ms']:+.2f} "
                f"| {g['sidecar_cpu_s_per_1k']:.2f} |"
            )
        out.append("")
    if "scaling" in r:
        out += [
            "**Scaling** (1 connection, hot cache, half rejected)",
            "",
            "| chunks x text | body | alone req/s | + gate req/s | ratio | added p50 / p99 "
            "| sidecar CPU |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, s in r["scaling"].items():
            e, g, c = s["envoy"], s["gate"], s["compare"]
            out.append(
                f"| {name} | {s['body_bytes'] / 1024:.1f} KiB | {e['rps']:,.0f} | {g['rps']:,.0f} "
                f"| {c['rps_ratio']:.1%} | {c['added_p50_ms']:+.2f} / {c['added_p99_ms']:+.2f} "
                f"| {g['sidecar_cpu_s_per_1k']:.2f} |"
            )
        out.append("")
    if "floor" in r:
        out += _floor(r["floor"], report["plan"], report.get("floor_targets") or judge_floor(r))
    if "pieces" in r:
        if "skipped" in r["pieces"]:
            out += [f"**Pieces**: skipped ({r['pieces']['skipped']})", ""]
        else:
            out += _pieces(r["pieces"])
    if "sweep" in r:
        out += _sweep(r["sweep"])
    if "channel" in r:
        out += _channel(r["channel"])
    pg = r.get("postgres", {})
    if "skipped" in pg:
        out += [f"**PostgreSQL**: skipped ({pg['skipped']})", ""]
    elif pg:
        out += [
            f"**Hot vs cold cache against PostgreSQL** ({pg['workload']}, 1 connection; "
            f"cold: cache TTLs {pg['cold_ttl_seconds']} s)",
            "",
            "| path | req/s | p50 / p90 / p99 | added p50 / p99 | sidecar CPU "
            "| PostgreSQL CPU | store lookups / response | cache misses / response |",
            "|---|---|---|---|---|---|---|---|",
        ]
        e = pg["envoy"]
        out.append(f"| Envoy alone | {e['rps']:,.0f} | {_lat(e)} | | | | | |")
        for name in ("hot", "cold"):
            g, c, st = pg[name]["gate"], pg[name]["compare"], pg[name]["store"]
            out.append(
                f"| + gate, {name} cache | {g['rps']:,.0f} | {_lat(g)} "
                f"| {c['added_p50_ms']:+.2f} / {c['added_p99_ms']:+.2f} "
                f"| {g['sidecar_cpu_s_per_1k']:.2f} | {_f(g.get('postgres_cpu_s_per_1k'))} "
                f"| {st['lookups_per_response']:.2f} | {st['misses_per_response']:.1f} |"
            )
        out.append("")
    core = r.get("core", {})
    if "results" in core:
        rows = core["results"].get("scaling", [])
        out += [
            f"**Decision core alone** (`{core['command']}`; in process, µs per response)",
            "",
            "| chunks | text | verdict cache | median | p90 | p99 |",
            "|---|---|---|---|---|---|",
        ]
        out += [
            f"| {x['chunks']} | {x['text_bytes']} B | {x['verdict_cache']} | {x['median_us']:,.0f} "
            f"| {x['p90_us']:,.0f} | {x['p99_us']:,.0f} |"
            for x in rows
        ]
        out += [
            f"| 20 (corpus {x['corpus']:,}, metadata {x['metadata_cache']}) | {x['text_bytes']} B "
            f"| {x['verdict_cache']} | {x['median_us']:,.0f} | {x['p90_us']:,.0f} "
            f"| {x['p99_us']:,.0f} |"
            for x in core["results"].get("corpus", [])
        ]
        out.append("")
    elif core:
        out += [f"**Decision core alone**: {core.get('skipped') or core.get('error')}", ""]
    out += _targets("**Targets** (issue 6)", report["targets"])
    out += _targets("**Targets, round two** (issue 15)", report.get("round_two_targets") or [])
    if report["anomalies"]:
        out += ["", "Anomalies:", *(f"- {a}" for a in report["anomalies"])]
    return "\n".join(out) + "\n"


def _targets(title: str, targets: list[dict[str, Any]]) -> list[str]:
    if not targets:
        return []
    out = ["", title, "", "| target | limit | measured | |", "|---|---|---|---|"]
    for t in targets:
        verdict = {True: "met", False: "**not met**", None: "not measured"}[t["met"]]
        measured = "n/a" if t["measured"] is None else f"{t['measured']:,.2f} {t['unit']}".strip()
        note = f" ({t['note']})" if t.get("note") else ""
        out.append(f"| {t['target']}{note} | {t['limit']} | {measured} | {verdict} |")
    return out


if __name__ == "__main__":
    saved = json.loads(Path(sys.argv[1]).read_text())
    saved["targets"] = judge(saved["results"])
    saved["floor_targets"] = judge_floor(saved["results"])
    saved["round_two_targets"] = judge_round_two(saved["results"])
    print(markdown(saved), end="")
