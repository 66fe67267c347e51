"""Benchmark: the decision core alone, in process, per response, in microseconds.

Not a test. Measures ``ResponseFilter.filter`` (parse, cached store lookup,
integrity, Rego via regorus, render, metrics, audit record) for one Qdrant
search response at a time, with no gRPC or Envoy around it, so that protocol
cost and decision work can be told apart.

Every response holds ``n`` hits of ``size`` bytes of text; half of them are
rejected, for a mix of reasons (revoked, principal mismatch, expired, hash
mismatch). The metadata cache is hot unless said otherwise; the audit log
(JSON Lines, hash-chained) and the Prometheus metrics are on.

- verdict cache ``hot``: the gate's Rego verdict cache is warm, as in steady
  traffic;
- verdict cache ``cold``: it is cleared before every call, so Rego evaluates
  every chunk of every response;
- corpus check: the same 20-hit responses against a store of 1,000 and of
  100,000 records (hits drawn from the whole corpus), with the metadata cache
  hot and with it cleared before every call (one SQLite lookup per response).

Medians, p90 and p99 over many calls after a warm-up; each configuration runs
in ``--rounds`` slices interleaved with the others, so that a burst of load
from another process spreads over all of them. The machine this runs on is
usually noisy: compare medians, and re-run before trusting a difference of
less than ~10%.

Usage: .venv/bin/python bench/core.py [--out FILE] [--seconds 1.5] [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

import sidecar
from sidecar.audit.jsonl import JsonlAuditSink
from sidecar.config import Settings, format_table
from sidecar.core.caller import Caller
from sidecar.core.chunk_record import ChunkRecord, Status
from sidecar.core.decision_core import DecisionCore
from sidecar.core.hits import Route
from sidecar.core.integrity import canonical_sha256
from sidecar.core.modes import RoutePolicies
from sidecar.enforcement.response_filter import ResponseFilter
from sidecar.metrics import GateMetrics
from sidecar.rego.regorus_engine import RegorusEngine
from sidecar.store.cache import CachedStore
from sidecar.store.sqlite import SqliteStore, migrate

ROOT = Path(__file__).resolve().parents[1]
ROUTE = Route("POST", "/collections/docs/points/search")
CALLER = Caller("acme", frozenset({"user:alice", "group:qa"}))
EFFECTIVE = datetime(2025, 1, 1, tzinfo=UTC)
EXPIRED_AT = datetime(2025, 6, 1, tzinfo=UTC)

CHUNK_COUNTS = (1, 10, 20, 50, 100)
TEXT_SIZES = (200, 2048)
CORPUS_SIZES = (1_000, 100_000)
CORPUS_CHUNKS = 20
CORPUS_TEXT = 800
CORPUS_BODIES = 16  # distinct responses cycled through in the corpus check


def text_for(i: int, size: int) -> str:
    return (f"chunk {i} " + "lorem ipsum dolor sit amet " * (size // 20 + 2))[:size]


def make_record(i: int, size: int) -> ChunkRecord:
    """Record ``i``: even ids are admitted; odd ones are rejected for a rotating reason."""
    kind = i % 8
    return ChunkRecord(
        chunk_id=str(i),
        doc_id=f"doc-{i}",
        version="1",
        tenant_id="acme",
        allowed_principals=("group:hr",) if kind == 3 else ("group:qa",),
        status=Status.REVOKED if kind == 1 else Status.APPROVED,
        effective_at=EFFECTIVE,
        expires_at=EXPIRED_AT if kind == 5 else None,
        # kind 7: the index's text was edited after ingestion.
        sha256="0" * 64 if kind == 7 else canonical_sha256(text_for(i, size)),
        source_uri=f"https://docs.example/{i}",
    )


def make_body(ids: list[int], size: int) -> bytes:
    hits = [
        {"id": i, "version": 1, "score": 1 - n / 1000, "payload": {"text": text_for(i, size)}}
        for n, i in enumerate(ids)
    ]
    return orjson.dumps({"result": hits, "status": "ok", "time": 0.001})


class Core:
    """A ResponseFilter wired as the sidecar wires it, over a private SQLite store."""

    def __init__(self, workdir: Path, name: str) -> None:
        settings = Settings()
        migrate(workdir / f"{name}.db")
        self.inner = SqliteStore(workdir / f"{name}.db")
        self.metrics = GateMetrics()
        self.store = CachedStore(self.inner, ttl=3600.0, observer=self.metrics)
        self.core = DecisionCore(RegorusEngine.from_directory(settings.policy.dir))
        self.audit = JsonlAuditSink(workdir / f"{name}-audit.jsonl")
        self.filter = ResponseFilter(
            formats=format_table(settings),
            store=self.store,
            core=self.core,
            audit=self.audit,
            metrics=self.metrics,
            policies=RoutePolicies(settings.route_policy),
        )
        self.format = self.filter.format_for(ROUTE)
        assert self.format is not None

    def clear_verdicts(self) -> Callable[[], None] | None:
        """The gate's verdict-cache reset, where this version of the gate has one."""
        clear: Callable[[], None] | None = getattr(self.core, "clear_verdict_cache", None)
        return clear

    async def call(self, body: bytes) -> None:
        assert self.format is not None
        result = await self.filter.filter(self.format, ROUTE, CALLER, "bench", body)
        if result.status != 200:
            raise SystemExit(f"unexpected outcome {result.outcome} {result.status}")

    def close(self) -> None:
        self.audit.close()
        self.store.close()


def percentile(ordered: list[float], q: float) -> float:
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


@dataclass
class Case:
    """One configuration: what it is (``labels``) and how to run one call of it."""

    labels: dict[str, Any]
    core: Core
    bodies: list[bytes]
    before: Callable[[], None] | None = None  # runs before each call, not timed
    samples: list[float] = field(default_factory=list)
    calls: int = 0

    async def warm_up(self) -> None:
        for i in range(max(30, len(self.bodies) * 3)):
            if self.before is not None:
                self.before()
            await self.core.call(self.bodies[i % len(self.bodies)])

    async def run(self, seconds: float, min_calls: int, max_calls: int) -> None:
        """Time calls (µs) for about ``seconds``: at least ``min_calls``, at most ``max_calls``."""
        # Untimed: the cases before this slice may have cleared what this one keeps warm.
        for body in self.bodies:
            if self.before is not None:
                self.before()
            await self.core.call(body)
        deadline = time.perf_counter() + seconds
        taken = 0
        while taken < max_calls and (taken < min_calls or time.perf_counter() < deadline):
            body = self.bodies[self.calls % len(self.bodies)]
            self.calls += 1
            taken += 1
            if self.before is not None:
                self.before()
            started = time.perf_counter_ns()
            await self.core.call(body)
            self.samples.append((time.perf_counter_ns() - started) / 1000)

    def row(self) -> dict[str, Any]:
        ordered = sorted(self.samples)
        return {
            **self.labels,
            "iterations": len(ordered),
            "median_us": round(percentile(ordered, 0.5), 1),
            "p90_us": round(percentile(ordered, 0.9), 1),
            "p99_us": round(percentile(ordered, 0.99), 1),
            "mean_us": round(sum(ordered) / len(ordered), 1),
        }


async def measure(cases: list[Case], seconds: float, rounds: int) -> None:
    """Run every case for ``seconds`` in all, in ``rounds`` interleaved slices,
    so that a burst of load from elsewhere spreads over all cases."""
    for case in cases:
        await case.warm_up()
    for _ in range(rounds):
        for case in cases:
            await case.run(seconds / rounds, min_calls=200 // rounds, max_calls=5000 // rounds)


def scaling_cases(workdir: Path, counts: tuple[int, ...]) -> list[Case]:
    cases: list[Case] = []
    for size in TEXT_SIZES:
        core = Core(workdir, f"scaling-{size}")
        core.inner.upsert(make_record(i, size) for i in range(max(counts)))
        clear = core.clear_verdicts()
        for n in counts:
            body = make_body(list(range(n)), size)
            labels = {"chunks": n, "text_bytes": size}
            if clear is None:
                cases.append(Case({**labels, "verdict_cache": "none"}, core, [body]))
                continue
            cases.append(Case({**labels, "verdict_cache": "hot"}, core, [body]))
            cases.append(Case({**labels, "verdict_cache": "cold"}, core, [body], clear))
    return cases


def corpus_cases(workdir: Path) -> list[Case]:
    cases: list[Case] = []
    rng = random.Random(6)
    for corpus in CORPUS_SIZES:
        core = Core(workdir, f"corpus-{corpus}")
        started = time.perf_counter()
        batch = 10_000
        for first in range(0, corpus, batch):
            core.inner.upsert(
                make_record(i, CORPUS_TEXT) for i in range(first, min(corpus, first + batch))
            )
        loaded_s = round(time.perf_counter() - started, 1)
        bodies = [
            make_body(rng.sample(range(corpus), CORPUS_CHUNKS), CORPUS_TEXT)
            for _ in range(CORPUS_BODIES)
        ]
        labels = {
            "corpus": corpus,
            "chunks": CORPUS_CHUNKS,
            "text_bytes": CORPUS_TEXT,
            "verdict_cache": "hot" if core.clear_verdicts() else "none",
            "load_seconds": loaded_s,
        }
        cases.append(Case({**labels, "metadata_cache": "hot"}, core, bodies))
        # Cleared before every call: one SQLite lookup per response.
        cases.append(Case({**labels, "metadata_cache": "store"}, core, bodies, core.store.clear))
    return cases


def print_row(row: dict[str, Any]) -> None:
    where = (
        f"corpus {row['corpus']:>7}, metadata {row['metadata_cache']:<5}"
        if "corpus" in row
        else f"{row['chunks']:>3} chunks x {row['text_bytes']:>4} B"
    )
    print(
        f"{where}  verdicts {row['verdict_cache']:<4}  "
        f"median {row['median_us']:>8.1f}  p90 {row['p90_us']:>8.1f}  "
        f"p99 {row['p99_us']:>8.1f} µs  ({row['iterations']} calls)",
        flush=True,
    )


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    # The checkout whose sidecar package is measured (PYTHONPATH may point elsewhere).
    measured = Path(sidecar.__file__).resolve().parents[1]
    try:
        revision = subprocess.run(
            ["git", "-C", str(measured), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "-C", str(measured), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                check=False,
            ).stdout.strip()
        )
    except OSError:
        revision, dirty = "", False
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "load_average": os.getloadavg(),
        "sidecar": str(measured),
        "git_revision": (revision + ("+changes" if dirty else "")) or "not a git checkout",
    }


def slope(rows: list[dict[str, Any]], size: int, cache: str) -> float | None:
    """Least-squares µs per extra chunk (medians), to check linear growth."""
    points: list[tuple[float, float]] = [
        (r["chunks"], r["median_us"])
        for r in rows
        if r["text_bytes"] == size and r["verdict_cache"] == cache
    ]
    if len(points) < 2:
        return None
    fit = statistics.linear_regression([x for x, _ in points], [y for _, y in points])
    return round(fit.slope, 2)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="JSON results file")
    parser.add_argument("--seconds", type=float, default=1.5, help="time per configuration")
    parser.add_argument(
        "--rounds", type=int, default=3, help="interleaved slices per configuration"
    )
    parser.add_argument("--quick", action="store_true", help="20 chunks only, no corpus check")
    args = parser.parse_args()
    out = args.out or ROOT / "bench" / "results" / f"core-{datetime.now(UTC):%Y-%m-%d}.json"
    logging.disable(logging.WARNING)

    started = time.perf_counter()
    info = machine()
    print(f"{info['cpu']}, {info['cores']} cores, Python {info['python']}, {info['git_revision']}")
    with tempfile.TemporaryDirectory(prefix="gate-bench-") as tmp:
        workdir = Path(tmp)
        counts = (20,) if args.quick else CHUNK_COUNTS
        scaling = scaling_cases(workdir, counts)
        corpus = [] if args.quick else corpus_cases(workdir)
        await measure(scaling + corpus, args.seconds, args.rounds)
        rows = [case.row() for case in scaling]
        corpus_rows = [case.row() for case in corpus]
        for row in rows + corpus_rows:
            print_row(row)
        for core in {id(case.core): case.core for case in scaling + corpus}.values():
            core.close()
    per_chunk = {
        f"{size}B-{cache}": slope(rows, size, cache)
        for size in TEXT_SIZES
        for cache in ("hot", "cold", "none")
        if slope(rows, size, cache) is not None
    }
    result = {
        "benchmark": "decision core (ResponseFilter.filter), in process, per response",
        "command": "python bench/core.py " + " ".join(sys.argv[1:]),
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": info,
        "gc_enabled": gc.isenabled(),
        "scaling": rows,
        "us_per_extra_chunk": per_chunk,
        "corpus": corpus_rows,
        "runtime_seconds": round(time.perf_counter() - started, 1),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"µs per extra chunk (least squares over medians): {per_chunk}")
    print(f"wrote {out} in {result['runtime_seconds']} s")


if __name__ == "__main__":
    asyncio.run(main())
