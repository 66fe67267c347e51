"""The benchmark suite of issue 6: Envoy alone vs Envoy + gate, side by side, in one run.

Not a test. Starts on loopback a static upstream (an Envoy answering from
memory), `retrieval-gate serve` and a front Envoy built by the gate's own
bootstrap with a second, plain listener, then drives both listeners with wrk
in interleaved rounds and reports medians and ratios:

  headline  20 chunks x 800 B, half rejected, hot cache, 1 and 8 connections
  scaling   1, 10, 20, 50, 100 chunks x 800 B and 20 chunks x 200 B / 2 KB, 1 connection
  floor     the design's floor: the same front Envoy and processing mode in front of
            bench/floor_servicer.py, a Python grpc.aio ext_proc that does no work,
            interleaved with Envoy alone and the gate, 1 and 8 connections
  channel   Envoy's channel to the sidecar: a unix socket (the default) against loopback
            TCP, the same gate, interleaved, 1 and 8 connections, with paired differences
  postgres  hot vs cold metadata cache against PostgreSQL (scratch database), 1 connection
  core      the decision core alone: bench/core.py, run as a subprocess

plus sidecar CPU per 1,000 responses (its whole process tree), the issue's
targets (met / not met) and the machine. Results: a JSON file under
bench/results/ and Markdown tables on stdout (`bench/report.py FILE` prints
them again).

Usage: .venv/bin/python bench/suite.py [--quick] [--workers N] [--out FILE]
Needs wrk (apt-get install wrk) and, for the postgres section, PostgreSQL on
127.0.0.1:5432 (--pg-url). --quick is a ~3.5-minute smoke run; the full run
takes about 28 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pieces
from cpu import postmaster_pid, tree_cpu_seconds
from load import SEARCH_BODY, compare, measure, medians, write_script
from machine import describe
from report import judge, judge_floor, judge_round_two, markdown
from stack import (
    GateStack,
    Processes,
    http,
    load_store,
    scratch_database,
    start_envoy,
    start_floor,
    start_gate,
    static_upstream_bootstrap,
)
from workloads import ALL, HEADLINE, SCALING, Workload

from sidecar.runtime.ports import free_port

BENCH = Path(__file__).resolve().parent
SECTIONS = ("headline", "scaling", "floor", "pieces", "sweep", "channel", "postgres", "core")
HOT = {"cache_ttl_seconds": 3600.0}
# Every response is one store round trip: a TTL must be > 0, and a record kept for
# 1 ms has expired before the next request at one connection (~3 ms apart).
COLD = {"cache_ttl_seconds": 0.001, "negative_cache_ttl_seconds": 0.001}


@dataclass(frozen=True)
class Floor:
    """A floor variant: bench/floor_servicer.py behind the gate's front Envoy."""

    key: str
    messages: int  # ext_proc messages per request
    echo_body: bool  # the body goes back to Envoy (as the gate's filtered body does)
    processing_mode: Mapping[str, str]  # overrides of the gate's processing mode
    what: str
    echo_request_body: bool = False  # the request body too (as the gate's push-down does)


# The gate's searches push the tenant down (the default): request headers, request
# body, response headers, response body. Its own work is measured above this floor.
MATCHED_FLOOR = "floor 4 msg"

FLOORS = (
    Floor("floor", 3, False, {}, "the gate's processing mode, empty continue answers"),
    Floor(
        "floor+body",
        3,
        True,
        {},
        "the gate's processing mode, the body sent back unchanged",
    ),
    Floor(
        "floor 4 msg",
        4,
        True,
        {"request_body_mode": "BUFFERED"},
        "the gate's processing mode with the request body sent too, both bodies sent back "
        "unchanged: what the gate does on a search with tenant push-down (the default)",
        echo_request_body=True,
    ),
    Floor(
        "floor 1 msg",
        1,
        True,
        {"request_header_mode": "SKIP", "response_header_mode": "SKIP"},
        "response body only (headers skipped), the body sent back unchanged: the least "
        "a per-request ext_proc stream that rewrites bodies can do",
    ),
)


@dataclass(frozen=True)
class Plan:
    headline_seconds: int
    headline_rounds: int
    scaling_seconds: int
    scaling_rounds: int
    postgres_seconds: int
    postgres_rounds: int
    warmup_seconds: int
    floor_seconds: int
    floor_rounds: int
    pieces_seconds: int
    pieces_rounds: int
    sweep_seconds: int
    sweep_rounds: int
    channel_seconds: int
    channel_rounds: int


PLANS = {
    "full": Plan(15, 5, 10, 3, 10, 5, 2, 10, 4, 10, 3, 8, 2, 10, 6),
    "quick": Plan(5, 2, 3, 1, 4, 2, 1, 3, 2, 4, 1, 3, 1, 3, 2),
}
# Connection counts of the sweep section (throughput against connections).
SWEEP = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class Case:
    """One thing to measure: a URL at a concurrency, and whose CPU to count."""

    key: str
    url: str
    connections: int
    cpu_of: Mapping[str, Callable[[], float]]


@dataclass(frozen=True)
class Setup:
    """What every gate stack of a run shares: the upstream, and the options it ran with."""

    processes: Processes
    upstream_port: int
    sidecar_options: Mapping[str, Any]  # e.g. workers
    envoy_concurrency: int

    def gate(self, name: str, config: Mapping[str, Any]) -> GateStack:
        return start_gate(
            self.processes,
            name,
            {**config, **self.sidecar_options},
            self.upstream_port,
            probe_path=HEADLINE.path,
            envoy_concurrency=self.envoy_concurrency,
        )

    def floor(self, floor: Floor) -> GateStack:
        return start_floor(
            self.processes,
            floor.key.replace(" ", "-").replace("+", "-"),
            self.upstream_port,
            probe_path=HEADLINE.path,
            echo_body=floor.echo_body,
            echo_request_body=floor.echo_request_body,
            processing_mode=floor.processing_mode,
            workers=int(self.sidecar_options.get("workers", 1)),
            envoy_concurrency=self.envoy_concurrency,
        )

    def stop(self, stack: GateStack) -> None:
        self.processes.stop(stack.envoy)
        self.processes.stop(stack.sidecar)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Runner:
    """Runs cases in interleaved rounds and collects what looks wrong."""

    def __init__(self, plan: Plan, script: Path) -> None:
        self.plan = plan
        self.script = script
        self.anomalies: list[str] = []
        # CPU counted in every run besides the case's own (the static upstream).
        self.always: dict[str, Callable[[], float]] = {}

    def warm_up(self, cases: Sequence[Case]) -> None:
        """A short unmeasured run per case: fills caches, opens connections."""
        for case in cases:
            measure(case.url, case.connections, self.plan.warmup_seconds, self.script, {})

    def rounds(
        self, section: str, cases: Sequence[Case], rounds: int, seconds: int
    ) -> dict[str, list[dict[str, float]]]:
        """Every case once per round, alternating the order each round (A B, B A, ...), so
        drift on a shared machine hits every case alike."""
        runs: dict[str, list[dict[str, float]]] = {case.key: [] for case in cases}
        for n in range(rounds):
            for case in cases if n % 2 == 0 else reversed(cases):
                cpu = {**self.always, **case.cpu_of}
                run = measure(case.url, case.connections, seconds, self.script, cpu)
                runs[case.key].append(run)
                log(
                    f"[{section}] {n + 1}/{rounds} {case.key:<22} {run['rps']:>8,.0f} req/s  "
                    f"p50 {run['p50_ms']:6.2f}  p99 {run['p99_ms']:6.2f} ms  "
                    f"other load {run['other_cores']:.2f} cores"
                )
                self._check(section, case.key, run)
        return runs

    def _check(self, section: str, key: str, run: Mapping[str, float]) -> None:
        where = f"{section} {key}"
        if run["non_2xx"]:
            self.anomalies.append(f"{where}: {run['non_2xx']:.0f} non-2xx responses")
        if run["socket_errors"]:
            self.anomalies.append(f"{where}: {run['socket_errors']:.0f} socket errors")

    def summarise(
        self, section: str, runs: Mapping[str, list[dict[str, float]]]
    ) -> dict[str, dict[str, float]]:
        summary = {key: medians(r) for key, r in runs.items()}
        for key, s in summary.items():
            if s["rps_spread_pct"] > 30 and len(runs[key]) > 1:
                self.anomalies.append(
                    f"{section} {key}: requests/s varied {s['rps_spread_pct']:.0f}% across rounds"
                )
        busy = sorted(s["other_cores"] for s in summary.values())
        if busy[-1] > 0.25:
            self.anomalies.append(
                f"{section}: other processes on the machine used {busy[0]:.2f} to "
                f"{busy[-1]:.2f} cores during the runs (median per case); 2 cores in all"
            )
        return summary


def check_filtering(stack: GateStack, workload: Workload, admitted: int | None = None) -> None:
    """The gate must really filter (else we would benchmark a pass-through); a floor
    (``admitted`` = every chunk) must pass every hit through."""
    admitted = workload.admitted if admitted is None else admitted
    for base, expected in ((stack.plain, workload.chunks), (stack.gated, admitted)):
        status, raw = http(base + workload.path, SEARCH_BODY.encode())
        hits = len(orjson.loads(raw)["result"]) if status == 200 else -1
        if hits != expected:
            raise RuntimeError(
                f"{base}{workload.path}: status {status}, {hits} hits, expected {expected}"
            )


def gate_cpu(stack: GateStack) -> dict[str, Callable[[], float]]:
    return {"sidecar": stack.sidecar_cpu, "front_envoy": stack.envoy_cpu}


def pair(stack: GateStack, workload: Workload, connections: int, suffix: str = "") -> list[Case]:
    cpu = gate_cpu(stack)
    return [
        Case(f"envoy{suffix}", stack.plain + workload.path, connections, cpu),
        Case(f"gate{suffix}", stack.gated + workload.path, connections, cpu),
    ]


def headline(runner: Runner, stack: GateStack) -> dict[str, Any]:
    plan = runner.plan
    check_filtering(stack, HEADLINE)
    cases = [*pair(stack, HEADLINE, 1, " c1"), *pair(stack, HEADLINE, 8, " c8")]
    runner.warm_up(cases)
    before = store_counters(stack)
    runs = runner.rounds("headline", cases, plan.headline_rounds, plan.headline_seconds)
    summary = runner.summarise("headline", runs)
    result: dict[str, Any] = {
        "workload": f"{HEADLINE.chunks} chunks x {HEADLINE.text_bytes} B",
        "store": per_response(before, store_counters(stack)),
    }
    result["connections"] = {
        str(c): {
            "envoy": summary[f"envoy c{c}"],
            "gate": summary[f"gate c{c}"],
            "compare": compare(summary[f"envoy c{c}"], summary[f"gate c{c}"]),
        }
        for c in (1, 8)
    }
    return result


def scaling(runner: Runner, stack: GateStack) -> dict[str, Any]:
    plan = runner.plan
    cases: list[Case] = []
    for workload in SCALING:
        check_filtering(stack, workload)
        cases += pair(stack, workload, 1, f" {workload.name}")
    runner.warm_up(cases)
    summary = runner.summarise(
        "scaling", runner.rounds("scaling", cases, plan.scaling_rounds, plan.scaling_seconds)
    )
    result = {}
    for w in SCALING:
        envoy, gate = summary[f"envoy {w.name}"], summary[f"gate {w.name}"]
        result[w.name] = {
            "chunks": w.chunks,
            "text_bytes": w.text_bytes,
            "body_bytes": len(w.body()),
            "envoy": envoy,
            "gate": gate,
            "compare": compare(envoy, gate),
        }
    return result


def floor(runner: Runner, setup: Setup, gate: GateStack) -> dict[str, Any]:
    """What one Python grpc.aio ext_proc stream per request costs before the gate does any
    work: the floor variants, Envoy alone and the gate, interleaved, 1 and 8 connections."""
    plan = runner.plan
    stacks: dict[str, GateStack] = {}
    seen: dict[str, dict[str, Any]] = {}  # what each floor stack ran, while it runs
    try:
        for f in FLOORS:
            stacks[f.key] = setup.floor(f)
            seen[f.key] = stacks[f.key].describe()
            check_filtering(stacks[f.key], HEADLINE, admitted=HEADLINE.chunks)
        check_filtering(gate, HEADLINE)
        paths = {"gate": gate, **stacks}
        cases: list[Case] = []
        for c in (1, 8):
            cases.append(Case(f"envoy c{c}", gate.plain + HEADLINE.path, c, gate_cpu(gate)))
            cases += [
                Case(f"{key} c{c}", s.gated + HEADLINE.path, c, gate_cpu(s))
                for key, s in paths.items()
            ]
        runner.warm_up(cases)
        runs = runner.rounds("floor", cases, plan.floor_rounds, plan.floor_seconds)
        summary = runner.summarise("floor", runs)
    finally:
        for s in stacks.values():
            setup.stop(s)
    result: dict[str, Any] = {
        "workload": f"{HEADLINE.chunks} chunks x {HEADLINE.text_bytes} B",
        "servicer": "bench/floor_servicer.py",
        "variants": {
            f.key: {
                "messages": f.messages,
                "echo_body": f.echo_body,
                "processing_mode": dict(f.processing_mode),
                "what": f.what,
                "stack": seen[f.key],
            }
            for f in FLOORS
        },
        "connections": {},
    }
    for c in (1, 8):
        envoy = summary[f"envoy c{c}"]
        measured = {
            key: {"run": summary[f"{key} c{c}"], "compare": compare(envoy, summary[f"{key} c{c}"])}
            for key in paths
        }
        g, fm = measured["gate"]["run"], measured[MATCHED_FLOOR]["run"]
        result["connections"][str(c)] = {
            "envoy": envoy,
            "paths": measured,
            # What the gate's own work adds on top of the same design, with the same
            # messages, doing nothing.
            "gate_over_floor": {
                "p50_ms": g["p50_ms"] - fm["p50_ms"],
                "p99_ms": g["p99_ms"] - fm["p99_ms"],
                "sidecar_cpu_us": 1000 * (g["sidecar_cpu_s_per_1k"] - fm["sidecar_cpu_s_per_1k"]),
                "rps_ratio": g["rps"] / fm["rps"],
            },
        }
    result["matched_floor"] = MATCHED_FLOOR
    return result


def matched_floor(setup: Setup) -> tuple[Floor, GateStack]:
    """The floor with the gate's messages (MATCHED_FLOOR), started and checked."""
    spec = next(f for f in FLOORS if f.key == MATCHED_FLOOR)
    stack = setup.floor(spec)
    check_filtering(stack, HEADLINE, admitted=HEADLINE.chunks)
    return spec, stack


def pieces_section(runner: Runner, setup: Setup, gate: GateStack) -> dict[str, Any]:
    """Per-piece CPU per response under wrk load (bench/pieces.py), for the gate and the
    matched floor, at 1 and 8 connections; medians over interleaved rounds."""
    missing = pieces.available()
    if missing is not None:
        return {"skipped": missing}
    if int(setup.sidecar_options.get("workers", 1)) != 1:
        return {"skipped": "pieces are sampled in one sidecar process: run without --workers"}
    plan = runner.plan
    _, floor_stack = matched_floor(setup)
    try:
        stacks = {"gate": gate, "floor": floor_stack}
        runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for n in range(plan.pieces_rounds):
            order = list(stacks.items()) if n % 2 == 0 else list(reversed(stacks.items()))
            for c in (1, 8):
                for key, stack in order:
                    run = pieces.profile(
                        stack.gated + HEADLINE.path,
                        c,
                        plan.pieces_seconds,
                        runner.script,
                        stack.sidecar.pid,
                    )
                    runs.setdefault((key, c), []).append(run)
                    log(
                        f"[pieces] {n + 1}/{plan.pieces_rounds} {key:<6} c{c}  "
                        f"{run['cpu_us']:,.0f} µs CPU, {run['main_thread_us']:,.0f} main thread, "
                        f"{run['sampled_us']:,.0f} sampled "
                        f"({run['samples']} samples)"
                    )
    finally:
        setup.stop(floor_stack)
    result: dict[str, Any] = {
        "workload": f"{HEADLINE.chunks} chunks x {HEADLINE.text_bytes} B",
        "floor_name": MATCHED_FLOOR,
        "rate_hz": pieces.RATE_HZ,
        "seconds": plan.pieces_seconds,
        "rounds": plan.pieces_rounds,
    }
    for key in stacks:
        result[key] = {str(c): _median_pieces(runs[(key, c)]) for c in (1, 8)}
    result["gate_above_floor"] = {
        str(c): pieces.above(result["gate"][str(c)], result["floor"][str(c)]) for c in (1, 8)
    }
    return result


def _median_pieces(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    names = list(runs[0]["pieces"])
    return {
        "cpu_us": statistics.median(r["cpu_us"] for r in runs),
        "main_thread_us": statistics.median(r["main_thread_us"] for r in runs),
        "sampled_us": statistics.median(r["sampled_us"] for r in runs),
        "rps": statistics.median(r["rps"] for r in runs),
        "samples": sum(r["samples"] for r in runs),
        "pieces": {n: statistics.median(r["pieces"][n] for r in runs) for n in names},
    }


def sweep(runner: Runner, setup: Setup, gate: GateStack) -> dict[str, Any]:
    """Throughput and latency against connections (SWEEP) for Envoy alone, the matched
    floor and the gate, interleaved per connection count."""
    plan = runner.plan
    _, floor_stack = matched_floor(setup)
    try:
        paths: dict[str, list[dict[str, float]]] = {"envoy": [], "floor": [], "gate": []}
        for c in SWEEP:
            cases = [
                Case("envoy", gate.plain + HEADLINE.path, c, gate_cpu(gate)),
                Case("floor", floor_stack.gated + HEADLINE.path, c, gate_cpu(floor_stack)),
                Case("gate", gate.gated + HEADLINE.path, c, gate_cpu(gate)),
            ]
            runner.warm_up(cases)
            summary = runner.summarise(
                f"sweep c{c}",
                runner.rounds(f"sweep c{c}", cases, plan.sweep_rounds, plan.sweep_seconds),
            )
            for key in paths:
                paths[key].append(summary[key])
    finally:
        setup.stop(floor_stack)
    return {
        "workload": f"{HEADLINE.chunks} chunks x {HEADLINE.text_bytes} B",
        "floor": MATCHED_FLOOR,
        "connections": list(SWEEP),
        "paths": paths,
    }


def channel(runner: Runner, setup: Setup, store: str) -> dict[str, Any]:
    """Envoy's channel to the sidecar: a unix socket (the default since issue 27) against
    loopback TCP (the default before it), two otherwise identical gate stacks, interleaved
    rounds at 1 and 8 connections; with the per-round (paired) differences, TCP - unix."""
    plan = runner.plan
    tcp = {"grpc_listen": f"127.0.0.1:{free_port()}", "expose_grpc_listen": True}
    stacks = {
        "unix": setup.gate("channel-unix", {"store": store, **HOT}),
        "tcp": setup.gate("channel-tcp", {"store": store, **HOT, **tcp}),
    }
    try:
        for stack in stacks.values():
            check_filtering(stack, HEADLINE)
        cases = [
            Case(f"{key} c{c}", stack.gated + HEADLINE.path, c, gate_cpu(stack))
            for c in (1, 8)
            for key, stack in stacks.items()
        ]
        runner.warm_up(cases)
        runs = runner.rounds("channel", cases, plan.channel_rounds, plan.channel_seconds)
        summary = runner.summarise("channel", runs)
        seen = {
            key: {**stack.describe(), "grpc_listen": stack.config["grpc_listen"]}
            for key, stack in stacks.items()
        }
    finally:
        for stack in stacks.values():
            setup.stop(stack)
    result: dict[str, Any] = {
        "workload": f"{HEADLINE.chunks} chunks x {HEADLINE.text_bytes} B",
        "rounds": plan.channel_rounds,
        "seconds": plan.channel_seconds,
        "stacks": seen,
        "connections": {},
    }
    measures = {
        "p50_ms": ("p50_ms", 1.0),
        "p99_ms": ("p99_ms", 1.0),
        "rps": ("rps", 1.0),
        "sidecar_cpu_us": ("sidecar_cpu_s_per_1k", 1000.0),
        "envoy_cpu_us": ("front_envoy_cpu_s_per_1k", 1000.0),
    }
    for c in (1, 8):
        unix, tcp_runs = runs[f"unix c{c}"], runs[f"tcp c{c}"]
        paired = {
            name: sorted(scale * (t[key] - u[key]) for t, u in zip(tcp_runs, unix, strict=True))
            for name, (key, scale) in measures.items()
        }
        result["connections"][str(c)] = {
            "unix": summary[f"unix c{c}"],
            "tcp": summary[f"tcp c{c}"],
            "tcp_minus_unix": {
                name: {"median": statistics.median(d), "min": d[0], "max": d[-1]}
                for name, d in paired.items()
            },
        }
    return result


def store_counters(stack: GateStack) -> dict[str, float]:
    m = stack.metrics()
    return {
        "responses": m.get("retrieval_gate_responses_total", 0.0),
        "misses": m.get("retrieval_gate_cache_misses_total", 0.0),
        "hits": m.get("retrieval_gate_cache_hits_total", 0.0),
        "lookups": m.get("retrieval_gate_store_seconds_count", 0.0),
        "errors": m.get("retrieval_gate_store_errors_total", 0.0),
        "verdict_misses": m.get("retrieval_gate_verdict_cache_misses_total", 0.0),
    }


def per_response(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """Counter deltas between two /metrics readings, and store work per response."""
    delta = {key: after[key] - before[key] for key in before}
    responses = max(delta["responses"], 1.0)
    return {
        **delta,
        "lookups_per_response": delta["lookups"] / responses,
        "misses_per_response": delta["misses"] / responses,
        "verdict_misses_per_response": delta["verdict_misses"] / responses,
    }


def postgres(runner: Runner, setup: Setup, admin_url: str) -> dict[str, Any]:
    """Envoy alone, gate with a hot cache, gate with no cache: all on one PostgreSQL store."""
    import psycopg

    try:
        with psycopg.connect(admin_url, autocommit=True, connect_timeout=3) as connection:
            version = connection.execute("SHOW server_version").fetchone()
            data_dir = connection.execute("SHOW data_directory").fetchone()
    except Exception as exc:
        return {"skipped": f"PostgreSQL not reachable at {admin_url}: {type(exc).__name__}"}
    postmaster = postmaster_pid(data_dir[0]) if data_dir else None
    result: dict[str, Any] = {
        "server": f"PostgreSQL {version[0] if version else '?'}",
        "workload": f"{HEADLINE.chunks} chunks x {HEADLINE.text_bytes} B",
    }
    with scratch_database(admin_url) as database:
        load_store(database, HEADLINE.records(), setup.processes.workdir)
        config = {"store": database}
        stacks = {
            "hot": setup.gate("pg-hot", config | HOT),
            "cold": setup.gate("pg-cold", config | COLD),
        }
        result["cold_ttl_seconds"] = COLD["cache_ttl_seconds"]
        result["stacks"] = {name: s.describe() for name, s in stacks.items()}
        cases = [Case("envoy", stacks["hot"].plain + HEADLINE.path, 1, gate_cpu(stacks["hot"]))]
        for name, s in stacks.items():
            check_filtering(s, HEADLINE)
            cpu = gate_cpu(s)
            if postmaster is not None:
                cpu["postgres"] = lambda: tree_cpu_seconds(postmaster)
            cases.append(Case(name, s.gated + HEADLINE.path, 1, cpu))
        runner.warm_up(cases)
        # Counters around the measured rounds only (the warm-up fills the hot cache).
        before = {name: store_counters(s) for name, s in stacks.items()}
        plan = runner.plan
        runs = runner.rounds("postgres", cases, plan.postgres_rounds, plan.postgres_seconds)
        after = {name: store_counters(s) for name, s in stacks.items()}
        summary = runner.summarise("postgres", runs)
        result["envoy"] = summary["envoy"]
        for name, s in stacks.items():
            result[name] = {
                "gate": summary[name],
                "compare": compare(summary["envoy"], summary[name]),
                "store": per_response(before[name], after[name]),
            }
            if result[name]["store"]["errors"]:
                runner.anomalies.append(f"postgres {name}: store errors during the runs")
            setup.stop(s)
    misses = result["cold"]["store"]["misses_per_response"]
    if misses < HEADLINE.chunks * 0.9:
        runner.anomalies.append(
            f"postgres cold: {misses:.1f} cache misses per response, fewer than its "
            f"{HEADLINE.chunks} chunks: not fully cold"
        )
    return result


def core(quick: bool) -> dict[str, Any]:
    """bench/core.py (the decision core in process) as a subprocess; its JSON folded in."""
    script = BENCH / "core.py"
    if not script.exists():
        return {"skipped": "bench/core.py does not exist yet"}
    with tempfile.TemporaryDirectory(prefix="gate-core-") as tmp:
        out = Path(tmp) / "core.json"
        command = [sys.executable, str(script), "--out", str(out)]
        helps = subprocess.run([*command[:2], "--help"], capture_output=True, text=True)
        if quick and "--quick" in helps.stdout:
            command.append("--quick")
        shown = " ".join(["python", "bench/core.py", *command[4:]])
        log(f"[core] {shown}")
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
        if done.returncode != 0 or not out.exists():
            return {"command": shown, "error": f"exit {done.returncode}: {done.stderr[-2000:]}"}
        return {"command": shown, "results": json.loads(out.read_text())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="~3.5-minute smoke run")
    parser.add_argument("--workers", type=int, help="set `workers` in the sidecar's config")
    parser.add_argument("--envoy-concurrency", type=int, default=1, help="front Envoy workers")
    parser.add_argument(
        "--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS), help="what to run"
    )
    parser.add_argument(
        "--pg-url",
        default=os.environ.get(
            "RETRIEVAL_GATE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test"
        ),
        help="PostgreSQL URL of a database to create the scratch database from",
    )
    parser.add_argument("--out", type=Path, help="JSON results (default: bench/results/<date>-...)")
    parser.add_argument(
        "--update-docs",
        action="store_true",
        help="write the charts into docs/charts/ and the tables into docs/benchmarks.md",
    )
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        log("wrk not found: apt-get install -y wrk")
        return 2
    plan_name = "quick" if args.quick else "full"
    plan = PLANS[plan_name]
    started = datetime.now(UTC)
    out = args.out or BENCH / "results" / f"{started:%Y-%m-%d-%H%M}-suite-{plan_name}.json"
    options = {} if args.workers is None else {"workers": args.workers}
    command = "python bench/suite.py " + " ".join(sys.argv[1:])
    machine = describe()
    log(f"{plan_name} run, {machine['cpu']}, nproc {machine['nproc']}, Envoy {machine['envoy']}")

    results: dict[str, Any] = {}
    clock = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gate-suite-") as tmp:
        workdir = Path(tmp)
        processes = Processes(workdir)
        runner = Runner(plan, write_script(workdir / "search.lua"))
        try:
            upstream_port = free_port()
            bodies = {w.path: w.body() for w in ALL}
            upstream = start_envoy(
                processes, "upstream", static_upstream_bootstrap(upstream_port, bodies)
            )
            runner.always["upstream_envoy"] = lambda: tree_cpu_seconds(upstream.pid)
            setup = Setup(processes, upstream_port, options, args.envoy_concurrency)
            if {"headline", "scaling", "floor", "pieces", "sweep", "channel"} & set(args.sections):
                store = f"sqlite:///{workdir / 'gate.db'}"
                load_store(store, [r for w in ALL for r in w.records()], workdir)
                stack = setup.gate("sqlite-hot", {"store": store, **HOT})
                results["stacks"] = {"sqlite-hot": stack.describe()}
                if "headline" in args.sections:
                    results["headline"] = headline(runner, stack)
                if "scaling" in args.sections:
                    results["scaling"] = scaling(runner, stack)
                if "floor" in args.sections:
                    results["floor"] = floor(runner, setup, stack)
                if "pieces" in args.sections:
                    results["pieces"] = pieces_section(runner, setup, stack)
                if "sweep" in args.sections:
                    results["sweep"] = sweep(runner, setup, stack)
                setup.stop(stack)
                if "channel" in args.sections:
                    results["channel"] = channel(runner, setup, store)
            if "postgres" in args.sections:
                results["postgres"] = postgres(runner, setup, args.pg_url)
                machine["postgresql"] = results["postgres"].get("server")
        finally:
            processes.close()
            logs = processes.warnings()
    for name, lines in logs.items():
        example = [line for line in lines if "Traceback" not in line] or lines
        runner.anomalies.append(f"{name} logged warnings or errors, e.g. {example[-1][:200]!r}")
    if "core" in args.sections:
        results["core"] = core(args.quick)
        if "error" in results["core"]:
            runner.anomalies.append(f"core: {results['core']['error'][:300]}")

    machine["load_average_at_end"] = [round(v, 2) for v in os.getloadavg()]
    report = {
        "when": started.isoformat(timespec="seconds"),
        "command": command.strip(),
        "plan_name": plan_name,
        "plan": asdict(plan),
        "workers": args.workers if args.workers is not None else "default",
        "envoy_concurrency": args.envoy_concurrency,
        "machine": machine,
        "duration_seconds": round(time.monotonic() - clock),
        "results": results,
        "targets": judge(results),
        "floor_targets": judge_floor(results),
        "round_two_targets": judge_round_two(results),
        "anomalies": runner.anomalies,
        "sidecar_warnings": logs,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(markdown(report))
    log(f"written to {out} after {report['duration_seconds']} s")
    if args.update_docs:
        update_docs(report, out)
    return 0


DOCS = BENCH.parent / "docs"
# The part of docs/benchmarks.md that `--update-docs` rewrites.
BEGIN, END = "<!-- suite results: begin -->", "<!-- suite results: end -->"


def update_docs(report: Mapping[str, Any], saved: Path) -> None:
    """Charts into docs/charts/, and the report's tables (with the charts) between the
    markers of docs/benchmarks.md."""
    from charts import write_charts

    written = write_charts(report, DOCS / "charts")
    page = DOCS / "benchmarks.md"
    text = page.read_text()
    if BEGIN not in text or END not in text:
        raise RuntimeError(f"{page}: no {BEGIN} ... {END} section to rewrite")
    where = saved.resolve().relative_to(BENCH.parent) if saved.is_absolute() else saved
    body = [
        f"Results: `{where}` ({report['duration_seconds']:,} s). Written by "
        "`bench/suite.py --update-docs`; edit the text around the markers, not between them.",
        "",
        markdown(report).rstrip("\n"),
        "",
        *(f"![{path.stem}](charts/{path.name})" for path in written),
    ]
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    page.write_text(head + BEGIN + "\n" + "\n".join(body) + "\n" + END + tail)
    log(f"updated {page} and {len(written)} charts in {DOCS / 'charts'}")


if __name__ == "__main__":
    sys.exit(main())
