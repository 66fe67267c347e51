"""Benchmark: over-fetch off (factor 1) against the default (factor 2), side by side, in one run.

Not a test. One `retrieval-gate serve` (SQLite store, hot cache, defaults) behind
its front Envoy, over the suite's static upstream (an Envoy answering from
memory). The app asks for k = 10 Qdrant hits on two collections that differ
only in a route setting: `of1` has `overfetch_factor = 1`, `of2` the default.
The upstream answers each as Qdrant would the request the gate forwards: 10
hits for `of1`, 20 for `of2` (the same 10 first, then the next 10); 800 B of
text each, and 30% of them revoked (3 of every 10). Two parts:

  page fill  how many of the k hits the app gets, with and without over-fetch,
             when each hit is rejected with probability p (10% to 60%): 25
             rankings per p, each answered once through the gate and counted
  cost       wrk through the gate on both collections in interleaved rounds (order
             reversed every other round), 1 and 8 connections, plus Envoy alone on
             both at 1 connection: medians of requests/s, p50/p99 and the sidecar's
             CPU per response (its whole process tree, from /proc)

The database's own extra work (k more hits per search) is not in these numbers:
the upstream answers from memory.

Usage: .venv/bin/python bench/overfetch.py [--quick] [--out FILE]
Needs wrk. The default run takes about 6 minutes, --quick about 1.5.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from cpu import tree_cpu_seconds
from load import measure, medians, write_script
from machine import describe
from stack import (
    GateStack,
    Processes,
    http,
    load_store,
    start_envoy,
    start_gate,
    static_upstream_bootstrap,
)

from sidecar.core.integrity import canonical_sha256
from sidecar.runtime.ports import free_port

BENCH = Path(__file__).resolve().parent
K = 10
TEXT_BYTES = 800
BODY = f'{{"vector":[0.1,0.2,0.3],"limit":{K},"with_payload":true}}'
LOAD_REJECTED = (1, 4, 7)  # of every 10 positions: 30%
FILL_RATES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6)
FILL_SAMPLES = 25
HOT = {"cache_ttl_seconds": 3600.0}


@dataclass(frozen=True)
class Plan:
    rounds: int
    seconds: int
    warmup_seconds: int


PLANS = {"full": Plan(5, 8, 2), "quick": Plan(2, 3, 1)}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Ranking:
    """The hits a database ranks for one search (twice k of them), some revoked."""

    collection: str
    first_id: int
    rejected: frozenset[int]  # positions

    def text(self, position: int) -> str:
        head = f"chunk {self.first_id + position} "
        return (head + "lorem ipsum dolor sit amet " * 40)[:TEXT_BYTES]

    def path(self, factor: int) -> str:
        return f"/collections/of{factor}_{self.collection}/points/search"

    def body(self, factor: int) -> bytes:
        """Qdrant's answer to the forwarded request: k hits, or twice as many."""
        hits = [
            {
                "id": self.first_id + i,
                "version": 1,
                "score": 1 - i / 1000,
                "payload": {"text": self.text(i)},
            }
            for i in range(K * factor)
        ]
        return orjson.dumps({"result": hits, "status": "ok", "time": 0.001})

    def records(self) -> list[dict[str, Any]]:
        return [
            {
                "chunk_id": str(self.first_id + i),
                "doc_id": f"doc-{self.first_id + i}",
                "version": "1",
                "tenant_id": "acme",
                "allowed_principals": ["group:qa"],
                "status": "revoked" if i in self.rejected else "approved",
                "effective_at": "2025-01-01T00:00:00Z",
                "expires_at": None,
                "sha256": canonical_sha256(self.text(i)),
            }
            for i in range(2 * K)
        ]


def rankings() -> tuple[Ranking, list[tuple[float, Ranking]]]:
    """The load's ranking (30% rejected in each ten) and the page-fill rankings (each hit
    rejected with probability p, seeded)."""
    load = Ranking("load", 1_000_000, frozenset(p + d for d in (0, K) for p in LOAD_REJECTED))
    rng = random.Random(26)
    fill = []
    for r, rate in enumerate(FILL_RATES):
        for s in range(FILL_SAMPLES):
            rejected = frozenset(i for i in range(2 * K) if rng.random() < rate)
            fill.append((rate, Ranking(f"p{r}s{s}", 2_000_000 + (r * 100 + s) * 100, rejected)))
    return load, fill


def released(base: str, path: str) -> int:
    status, raw = http(base + path, BODY.encode())
    if status != 200:
        raise RuntimeError(f"{path}: status {status}: {raw[:200]!r}")
    return len(orjson.loads(raw)["result"])


def page_fill(base: str, fill: Sequence[tuple[float, Ranking]]) -> dict[str, Any]:
    """Per rejection probability and factor: the mean share of k the app got, and how
    often it got all k."""
    table: dict[str, Any] = {}
    for rate in FILL_RATES:
        samples = [ranking for r, ranking in fill if r == rate]
        row: dict[str, Any] = {
            "rejected_of_first_k": statistics.mean(
                len([p for p in x.rejected if p < K]) / K for x in samples
            )
        }
        for factor in (1, 2):
            got = [released(base, x.path(factor)) for x in samples]
            row[f"factor_{factor}"] = {
                "mean_fill": statistics.mean(got) / K,
                "full_pages": sum(g == K for g in got) / len(got),
            }
        table[f"{rate:.0%}"] = row
    return table


def cost(
    plan: Plan, script: Path, stack: GateStack, load: Ranking, upstream_cpu: Callable[[], float]
) -> dict[str, Any]:
    cpu = {"sidecar": stack.sidecar_cpu, "front_envoy": stack.envoy_cpu, "upstream": upstream_cpu}
    cases = [(f"envoy f{factor} c1", stack.plain + load.path(factor), 1) for factor in (1, 2)] + [
        (f"gate f{factor} c{conns}", stack.gated + load.path(factor), conns)
        for conns in (1, 8)
        for factor in (1, 2)
    ]
    for _, url, conns in cases:
        measure(url, conns, plan.warmup_seconds, script, {})
    runs: dict[str, list[dict[str, Any]]] = {key: [] for key, _, _ in cases}
    for n in range(plan.rounds):
        for key, url, conns in cases if n % 2 == 0 else list(reversed(cases)):
            run = measure(url, conns, plan.seconds, script, cpu)
            runs[key].append(run)
            log(
                f"[cost] {n + 1}/{plan.rounds} {key:<12} {run['rps']:>7,.0f} req/s  "
                f"p50 {run['p50_ms']:5.2f}  p99 {run['p99_ms']:5.2f} ms  "
                f"sidecar {run['sidecar_cpu_s_per_1k'] * 1000:5.0f} us/resp  "
                f"other load {run['other_cores']:.2f} cores"
            )
    summary = {key: medians(r) for key, r in runs.items()}
    # Paired per round: the difference factor 2 makes, in the same round.
    paired = {}
    for conns in (1, 8):
        off, on = runs[f"gate f1 c{conns}"], runs[f"gate f2 c{conns}"]
        paired[f"c{conns}"] = {
            "sidecar_cpu_us": statistics.median(
                (b["sidecar_cpu_s_per_1k"] - a["sidecar_cpu_s_per_1k"]) * 1000
                for a, b in zip(off, on, strict=True)
            ),
            "p50_ms": statistics.median(
                b["p50_ms"] - a["p50_ms"] for a, b in zip(off, on, strict=True)
            ),
            "p99_ms": statistics.median(
                b["p99_ms"] - a["p99_ms"] for a, b in zip(off, on, strict=True)
            ),
        }
    return {"summary": summary, "paired_difference": paired}


def markdown(report: Mapping[str, Any]) -> str:
    lines = [
        f"k = {K}, {TEXT_BYTES} B per hit; run {report['when']}, {report['plan_name']} plan, "
        f"`{report['command']}`",
        "",
        "Page fill (mean share of k the app got; full pages in parentheses):",
        "",
        "| hits rejected | factor 1 (off) | factor 2 (default) |",
        "|---|---|---|",
    ]
    for rate, row in report["fill"].items():
        cells = [
            f"{row[f'factor_{f}']['mean_fill']:.0%} ({row[f'factor_{f}']['full_pages']:.0%})"
            for f in (1, 2)
        ]
        lines.append(f"| {rate} | {cells[0]} | {cells[1]} |")
    summary = report["cost"]["summary"]
    lines += [
        "",
        "Cost at 30% rejected (medians of rounds; factor 1: 7 of 10 hits released, "
        "factor 2: 10 of 20, the other 4 admitted ones trimmed):",
        "",
        "| path | conns | req/s | p50 ms | p99 ms | sidecar CPU us/response |",
        "|---|---|---|---|---|---|",
    ]
    for key, s in summary.items():
        path, factor, conns = key.split()
        label = f"{'Envoy alone' if path == 'envoy' else 'gate'}, factor {factor[1:]}"
        cpu = f"{s['sidecar_cpu_s_per_1k'] * 1000:.0f}" if path == "gate" else "-"
        lines.append(
            f"| {label} | {conns[1:]} | {s['rps']:,.0f} | {s['p50_ms']:.2f} | "
            f"{s['p99_ms']:.2f} | {cpu} |"
        )
    lines += ["", "Factor 2 minus factor 1, paired per round (median):", ""]
    for conns, d in report["cost"]["paired_difference"].items():
        lines.append(
            f"- {conns[1:]} connection(s): sidecar CPU {d['sidecar_cpu_us']:+.0f} us/response, "
            f"p50 {d['p50_ms']:+.2f} ms, p99 {d['p99_ms']:+.2f} ms"
        )
    if report["anomalies"]:
        lines += ["", "Anomalies: " + "; ".join(report["anomalies"])]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="~1.5-minute smoke run")
    parser.add_argument("--out", type=Path, help="JSON results (default: bench/results/...)")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        log("wrk not found: apt-get install -y wrk")
        return 2
    plan_name = "quick" if args.quick else "full"
    plan = PLANS[plan_name]
    started = datetime.now(UTC)
    out = args.out or BENCH / "results" / f"{started:%Y-%m-%d-%H%M}-overfetch-{plan_name}.json"
    load, fill = rankings()
    clock = time.monotonic()
    anomalies: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gate-overfetch-") as tmp:
        workdir = Path(tmp)
        processes = Processes(workdir)
        try:
            every = [load, *(ranking for _, ranking in fill)]
            bodies = {x.path(f): x.body(f) for x in every for f in (1, 2)}
            upstream_port = free_port()
            upstream = start_envoy(
                processes, "upstream", static_upstream_bootstrap(upstream_port, bodies)
            )
            store = f"sqlite:///{workdir / 'gate.db'}"
            load_store(store, [r for x in every for r in x.records()], workdir)
            routes = {f"/collections/of1_{x.collection}/": {"overfetch_factor": 1} for x in every}
            stack = start_gate(
                processes,
                "gate",
                {"store": store, **HOT, "routes": routes},
                upstream_port,
                probe_path=load.path(2),
            )
            if (released(stack.gated, load.path(1)), released(stack.gated, load.path(2))) != (7, K):
                anomalies.append("the load's pages are not 7 and 10 hits")
            fill_table = page_fill(stack.gated, fill)
            script = write_script(workdir / "search.lua", BODY)
            results = cost(plan, script, stack, load, lambda: tree_cpu_seconds(upstream.pid))
        finally:
            processes.close()
            warnings = processes.warnings()
    anomalies += [f"{name}: {lines[-1][:200]}" for name, lines in warnings.items()]
    for key, s in results["summary"].items():
        if s["non_2xx"] or s["socket_errors"]:
            anomalies.append(f"{key}: {s['non_2xx']:.0f} non-2xx, {s['socket_errors']:.0f} errors")
        if s["other_cores"] > 0.25:
            anomalies.append(f"{key}: other processes used {s['other_cores']:.2f} cores")
    report = {
        "when": started.isoformat(timespec="seconds"),
        "command": ("python bench/overfetch.py " + " ".join(sys.argv[1:])).strip(),
        "plan_name": plan_name,
        "machine": describe(),
        "duration_seconds": round(time.monotonic() - clock),
        "fill": fill_table,
        "cost": results,
        "anomalies": anomalies,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(markdown(report))
    log(f"written to {out} after {report['duration_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
