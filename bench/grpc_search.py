"""Issue 13's benchmark: a Milvus gRPC search next to a Qdrant REST search, in one run.

Not a test. Starts on loopback

  * the suite's static upstream: an Envoy answering the headline's canned Qdrant body
    (20 hits x 800 B) from memory;
  * a real Milvus Lite server (`milvus-lite server`) holding the same 20 chunks (same ids,
    same texts, a tenant field and 4-dimensional vectors), loaded with pymilvus;
  * `retrieval-gate serve` on a SQLite store with the headline's records (every other chunk
    revoked: half of the 20 hits are removed), hot cache, no format configured;
  * a front Envoy built by the gate's own `build_bootstrap` (REST to the static upstream,
    gRPC to Milvus through its `vector_db_grpc` cluster), with a second, plain listener
    without the gate's filters, as bench/stack.py's front_bootstrap does;

then drives Qdrant REST and Milvus gRPC each through Envoy alone and through Envoy + gate,
plus Milvus through Envoy alone with the request as the gate forwards it (its tenant
push-down filter in it: what Milvus' own filtering costs, apart from the gate), in
interleaved rounds (order reversed every other round) with the same Python closed loop at
one connection, and reports medians over rounds: p50/p90/p99, requests/s, added latency,
and CPU per response of the sidecar (its whole process tree, from /proc), the front Envoy,
the upstreams and the client.

wrk cannot speak gRPC, so both APIs are driven from Python: a keep-alive http.client
connection for REST, one grpc channel for gRPC sending the SearchRequest bytes and metadata
that pymilvus' `MilvusClient.search(limit=20)` sent (captured once at setup), so the
client's own cost is small and the same through both listeners. Replies are checked
before measuring (20 hits alone, the 10 approved ones through the gate) and by size during
the runs; the sidecar's /metrics confirm every gated call was filtered with a hot cache.

Usage: .venv/bin/python bench/grpc_search.py [--quick] [--out FILE] [--apis ...]
--quick is a ~70-second smoke run; the default run takes about 4.5 minutes. --apis
qdrant_rest (or milvus_grpc) measures one API alone (debugging; not a comparison).
"""

from __future__ import annotations

import argparse
import http.client as http_client
import importlib
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib import metadata as package_metadata
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import orjson
from cpu import machine_busy_seconds, tree_cpu_seconds
from load import CALLER_HEADERS, SEARCH_BODY, compare
from machine import describe
from stack import GateStack, Processes, http, load_store, start_envoy
from stack import start_gate as start_gate_stack
from stack import static_upstream_bootstrap as qdrant_upstream_bootstrap
from workloads import HEADLINE

from sidecar.config import load_settings
from sidecar.core.hits import Route
from sidecar.formats.grpc_frames import frame, messages
from sidecar.formats.milvus.grpc import MilvusGrpcFormat
from sidecar.runtime.ports import free_port

BENCH = Path(__file__).resolve().parent
COLLECTION = "bench_grpc_20x800"
SEARCH_METHOD = "/milvus.proto.milvus.MilvusService/Search"
HOT = {"cache_ttl_seconds": 3600.0}
CASE_FILTER = "milvus_grpc envoy+filter"
# API measured -> the gate's format name for it (its metric label).
FORMATS = {"qdrant_rest": "qdrant", "milvus_grpc": "milvus_grpc"}
# The caller's tenant (load.CALLER_HEADERS): the gate's push-down keeps every row.
MILVUS_TENANT = CALLER_HEADERS["x-gate-tenant"]
# Metric series worth a delta over the measured rounds.
_COUNTED = (
    "retrieval_gate_responses_total",
    "retrieval_gate_chunks_total",
    "retrieval_gate_cache_misses_total",
    "retrieval_gate_request_refusals_total",
)
_SAMPLE = re.compile(r"^(\w+)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Plan:
    rounds: int
    seconds: float
    warmup_seconds: float


PLANS = {"full": Plan(5, 10.0, 2.0), "quick": Plan(2, 5.0, 1.0)}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class CallFailed(Exception):
    """A call answered with an error or a reply of the wrong size."""


# --- Milvus Lite ------------------------------------------------------------------------


def start_milvus(processes: Processes) -> tuple[subprocess.Popen[bytes], int]:
    """`milvus-lite server` on 127.0.0.1 (its default host is 0.0.0.0); (process, port)."""
    port = free_port()
    data = processes.workdir / "milvus-data"
    command = [str(Path(sys.executable).with_name("milvus-lite")), "server"]
    command += ["--data-dir", str(data), "--host", "127.0.0.1", "--port", str(port)]
    process = processes.spawn("milvus", command)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        grpc.channel_ready_future(channel).result(timeout=60)
    except grpc.FutureTimeoutError:
        raise RuntimeError(f"Milvus Lite did not start:\n{processes.log_tail('milvus')}") from None
    finally:
        channel.close()
    return process, port


def headline_rows() -> list[tuple[int, str]]:
    """(id, text) of the headline's 20 hits, as the static upstream returns them."""
    hits = orjson.loads(HEADLINE.body())["result"]
    return [(int(hit["id"]), str(hit["payload"]["text"])) for hit in hits]


def vendor(module: str) -> ModuleType:
    """Import a module of pymilvus (no type information; imported only when needed:
    it pulls in pandas)."""
    return importlib.import_module(module)


def load_milvus(port: int) -> tuple[bytes, list[tuple[str, str]]]:
    """Create the collection with pymilvus, insert the headline's rows, search once with
    `MilvusClient.search(limit=20)`; return the SearchRequest bytes and the metadata that
    pymilvus sent (read off its stub), so the benchmark replays exactly that call."""
    pymilvus = vendor("pymilvus")
    types = pymilvus.DataType
    client = pymilvus.MilvusClient(uri=f"http://127.0.0.1:{port}")
    schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", types.INT64, is_primary=True)
    schema.add_field("vector", types.FLOAT_VECTOR, dim=4)
    schema.add_field("text", types.VARCHAR, max_length=4096)
    schema.add_field("tenant", types.VARCHAR, max_length=64)
    index = client.prepare_index_params()
    index.add_index("vector", metric_type="COSINE", index_type="FLAT")
    client.create_collection(COLLECTION, schema=schema, index_params=index)
    rows = [
        {"id": pk, "vector": [1.0, i / 10, 0.2, 0.3], "text": text, "tenant": MILVUS_TENANT}
        for i, (pk, text) in enumerate(headline_rows())
    ]
    client.insert(COLLECTION, rows)
    client.load_collection(COLLECTION)
    stub = client._get_connection()._stub
    search = stub.Search
    sent: dict[str, Any] = {}

    def spy(request: Any, timeout: float | None = None, metadata: Any = None) -> Any:
        sent["request"], sent["metadata"] = request.SerializeToString(), list(metadata or ())
        return search(request, timeout=timeout, metadata=metadata)

    stub.Search = spy
    try:
        found = client.search(COLLECTION, [[1.0, 0.0, 0.2, 0.3]], limit=20, output_fields=["text"])
    finally:
        stub.Search = search
        client.close()
    if len(found[0]) != HEADLINE.chunks:
        raise RuntimeError(f"Milvus Lite returned {len(found[0])} hits, not {HEADLINE.chunks}")
    return sent["request"], [(str(k), str(v)) for k, v in sent["metadata"]]


def pushed_down(request: bytes, config: Mapping[str, Any]) -> bytes:
    """``request`` as the gate forwards it for the benchmark's caller: restricted to its
    tenant by the gate's own Milvus rewriter, with the gate's settings (``config``)."""
    settings = load_settings(None, dict(config))
    rewrite = MilvusGrpcFormat().rewrite_request(
        frame(request),
        Route("POST", SEARCH_METHOD),
        tenant=CALLER_HEADERS["x-gate-tenant"],
        tenant_key=settings.filter.tenant_key,
        overfetch_factor=settings.filter.overfetch_factor,
        overfetch_cap=settings.filter.overfetch_cap,
    )
    if not rewrite.tenant_filter:
        raise RuntimeError("the gate's rewriter added no tenant filter")
    (message,) = messages(rewrite.body)
    return message


def search_ids(reply: bytes) -> list[int]:
    """The hit ids of a Milvus SearchResults reply (vendor classes: a check, not timed)."""
    results = vendor("pymilvus.grpc_gen.milvus_pb2").SearchResults.FromString(reply)
    if results.status.code != 0:
        raise CallFailed(f"Milvus status {results.status.code}")
    return list(results.results.ids.int_id.data)


# --- the gate ---------------------------------------------------------------------------


def start_gate(processes: Processes, store: str, upstream_port: int, milvus_port: int) -> GateStack:
    """`retrieval-gate serve` and its front Envoy (gRPC calls to Milvus); return once a
    REST search through the gate answers 200."""
    config = {"store": store, **HOT}
    return start_gate_stack(
        processes,
        "gate",
        config,
        upstream_port,
        probe_path=HEADLINE.path,
        grpc_upstream_port=milvus_port,
    )


def counters(stack: GateStack) -> dict[str, float]:
    """The sidecar's counters of responses, chunks, misses and refusals, by label set."""
    status, body = http(stack.metrics_url)
    if status != 200:
        raise RuntimeError(f"{stack.metrics_url} answered {status}")
    found: dict[str, float] = {}
    for line in body.decode().splitlines():
        sample = _SAMPLE.match(line)
        if sample and sample.group(1) in _COUNTED:
            labels = dict(_LABEL.findall(sample.group(2) or ""))
            labels.pop("collection", None)
            key = sample.group(1) + "{" + ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
            found[key + "}"] = found.get(key + "}", 0.0) + float(sample.group(3))
    return found


# --- clients ----------------------------------------------------------------------------


class RestSearch:
    """The suite's Qdrant search (load.SEARCH_BODY, load.CALLER_HEADERS) on one keep-alive
    HTTP/1.1 connection."""

    def __init__(self, base_url: str) -> None:
        host, port = base_url.removeprefix("http://").rsplit(":", 1)
        self._connection = http_client.HTTPConnection(host, int(port), timeout=10)
        self._body = SEARCH_BODY.encode()
        self.expected_bytes = 0  # the reply's size, once checked

    def send(self) -> bytes:
        self._connection.request("POST", HEADLINE.path, self._body, CALLER_HEADERS)
        response = self._connection.getresponse()
        body = response.read()
        if response.status != 200:
            raise CallFailed(f"HTTP {response.status}")
        return body

    def __call__(self) -> None:
        try:
            body = self.send()
        except (OSError, http_client.HTTPException) as error:
            self._connection.close()  # reconnects on the next request
            raise CallFailed(type(error).__name__) from error
        if len(body) != self.expected_bytes:
            raise CallFailed(f"{len(body)} bytes, expected {self.expected_bytes}")

    def hit_ids(self) -> list[int]:
        return [int(hit["id"]) for hit in orjson.loads(self.send())["result"]]

    def close(self) -> None:
        self._connection.close()


class GrpcSearch:
    """pymilvus' captured Search call, replayed on one grpc channel (one HTTP/2
    connection) with the caller's identity as gRPC metadata."""

    def __init__(self, base_url: str, request: bytes, metadata: Sequence[tuple[str, str]]) -> None:
        self._channel = grpc.insecure_channel(base_url.removeprefix("http://"))
        # No serialisers: request and reply stay bytes (no protobuf work in the loop).
        self._call = self._channel.unary_unary(SEARCH_METHOD)
        self._request = request
        identity = [(k, v) for k, v in CALLER_HEADERS.items() if k.startswith("x-gate-")]
        self._metadata = [*metadata, *identity]
        self.expected_bytes = 0

    def send(self) -> bytes:
        reply: bytes = self._call(self._request, metadata=self._metadata, timeout=10)
        return reply

    def __call__(self) -> None:
        try:
            reply = self.send()
        except grpc.RpcError as error:
            raise CallFailed(str(error.code())) from error
        # A Milvus error inside an OK reply (or a reply cut short) differs in size; the
        # session timestamp's varint can change it by a byte or two.
        if abs(len(reply) - self.expected_bytes) > 8:
            raise CallFailed(f"{len(reply)} bytes, expected {self.expected_bytes}")

    def hit_ids(self) -> list[int]:
        return search_ids(self.send())

    def close(self) -> None:
        self._channel.close()


@dataclass
class Case:
    key: str
    api: str  # "qdrant_rest" or "milvus_grpc"
    path: str  # "envoy" (alone) or "gate"
    client: RestSearch | GrpcSearch


def check(cases: Sequence[Case]) -> dict[str, Any]:
    """Before measuring: Envoy alone returns all 20 hits, the gate the 10 approved ones
    (even positions), the same for both APIs; record each reply's size."""
    rows = headline_rows()
    expected = {
        "envoy": [pk for pk, _ in rows],
        "envoy+filter": [pk for pk, _ in rows],  # every row is the caller's tenant's
        "gate": [pk for i, (pk, _) in enumerate(rows) if i % 2 == 0],
    }
    seen: dict[str, Any] = {}
    for case in cases:
        try:
            ids = case.client.hit_ids()
        except grpc.RpcError as error:
            raise GateRefused(case.key, f"{error.code()}: {error.details()}") from error
        if ids != expected[case.path]:
            raise RuntimeError(f"{case.key}: hits {ids}, expected {expected[case.path]}")
        case.client.expected_bytes = len(case.client.send())
        seen[case.key] = {"hits": len(ids), "reply_bytes": case.client.expected_bytes}
    return seen


class GateRefused(RuntimeError):
    """A case's call was refused (e.g. the gate does not filter that method yet)."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(f"{key}: {why}")
        self.key = key


# --- measuring --------------------------------------------------------------------------


def own_cpu_seconds() -> float:
    """CPU of this process, every thread (the client loop and grpc's own threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def closed_loop(call: Callable[[], None], seconds: float) -> tuple[list[int], int]:
    """Call back to back for ``seconds``: (latency of each call in ns, failed calls)."""
    latencies: list[int] = []
    failed = 0
    now = time.perf_counter_ns()
    end = now + int(seconds * 1e9)
    while now < end:
        try:
            call()
        except CallFailed:
            failed += 1
        done = time.perf_counter_ns()
        latencies.append(done - now)
        now = done
    return latencies, failed


def percentile(ordered: Sequence[int], p: float) -> float:
    """Nearest-rank percentile of sorted ns latencies, in ms."""
    rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank] / 1e6


def measure(
    call: Callable[[], None], seconds: float, cpu_of: Mapping[str, Callable[[], float]]
) -> dict[str, float]:
    """One run: latency percentiles, requests/s, CPU µs per response of each watched
    process tree and of this process (the client), and the other load on the machine."""
    before = {name: read() for name, read in cpu_of.items()}
    busy, client = machine_busy_seconds(), own_cpu_seconds()
    wall = time.monotonic()
    latencies, failed = closed_loop(call, seconds)
    wall = time.monotonic() - wall
    client = own_cpu_seconds() - client
    busy = machine_busy_seconds() - busy
    used = {name: read() - before[name] for name, read in cpu_of.items()}
    ordered = sorted(latencies)
    run = {
        "rps": len(latencies) / wall,
        "p50_ms": percentile(ordered, 50),
        "p90_ms": percentile(ordered, 90),
        "p99_ms": percentile(ordered, 99),
        "requests": float(len(latencies)),
        "failed": float(failed),
    }
    per_response = 1e6 / max(len(latencies), 1)
    for name, seconds_used in used.items():
        run[f"{name}_cpu_us"] = seconds_used * per_response
    run["client_cpu_us"] = client * per_response
    run["other_cores"] = max(0.0, busy - client - sum(used.values())) / wall
    return run


def medians(runs: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Median of every field over rounds; requests and failures summed."""
    summary = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    for key in ("requests", "failed"):
        summary[key] = sum(r[key] for r in runs)
    rps = [r["rps"] for r in runs]
    summary["rps_spread_pct"] = 100 * (max(rps) - min(rps)) / max(statistics.median(rps), 1e-9)
    return summary


def rounds(
    cases: Sequence[Case], plan: Plan, cpu_of: Mapping[str, Callable[[], float]]
) -> dict[str, list[dict[str, float]]]:
    """Every case once per round, the order reversed every other round."""
    runs: dict[str, list[dict[str, float]]] = {case.key: [] for case in cases}
    for n in range(plan.rounds):
        for case in cases if n % 2 == 0 else list(reversed(cases)):
            run = measure(case.client, plan.seconds, cpu_of)
            runs[case.key].append(run)
            log(
                f"{n + 1}/{plan.rounds} {case.key:<18} {run['rps']:>7,.0f} req/s  "
                f"p50 {run['p50_ms']:6.2f}  p99 {run['p99_ms']:6.2f} ms  "
                f"sidecar {run['sidecar_cpu_us']:6,.0f} µs  other load "
                f"{run['other_cores']:.2f} cores"
            )
    return runs


# --- report -----------------------------------------------------------------------------


def summarise(
    runs: Mapping[str, list[dict[str, float]]], metrics: Mapping[str, float]
) -> tuple[dict[str, Any], list[str]]:
    """Per API: Envoy alone, gate, their comparison; and what looks wrong."""
    anomalies: list[str] = []
    summary = {key: medians(r) for key, r in runs.items()}
    results: dict[str, Any] = {}
    for api, fmt in FORMATS.items():
        if f"{api} envoy" not in summary:
            continue
        envoy, gate = summary[f"{api} envoy"], summary[f"{api} gate"]
        filtered = metrics.get(
            f"retrieval_gate_responses_total{{format={fmt},outcome=filtered}}", 0.0
        )
        admitted = sum(
            v
            for k, v in metrics.items()
            if k.startswith("retrieval_gate_chunks_total{") and "decision=admit" in k
            if f"format={fmt}," in k
        )
        results[api] = {
            "envoy": envoy,
            "gate": gate,
            "compare": {
                **compare(envoy, gate),
                "p50_ratio": gate["p50_ms"] / envoy["p50_ms"],
                "added_front_envoy_cpu_us": gate["front_envoy_cpu_us"]
                - envoy["front_envoy_cpu_us"],
            },
            "gate_metrics": {
                "filtered_responses": filtered,
                "admitted_chunks_per_response": admitted / max(filtered, 1.0),
            },
        }
        if api == "milvus_grpc" and CASE_FILTER in summary:
            alone_filtered = summary[CASE_FILTER]
            results[api]["envoy_with_filter"] = alone_filtered
            # Milvus' own work on the tenant filter, and the gate's cost apart from it.
            results[api]["filter_over_envoy"] = compare(envoy, alone_filtered)
            results[api]["gate_over_filter"] = compare(alone_filtered, gate)
        # Warm-up, check and measured calls all go through the gate: at least the measured.
        if filtered < gate["requests"]:
            anomalies.append(
                f"{api} gate: {filtered:.0f} responses filtered as {fmt}, "
                f"{gate['requests']:.0f} calls measured"
            )
    for key, s in summary.items():
        if s["failed"]:
            anomalies.append(f"{key}: {s['failed']:.0f} failed calls")
        if s["rps_spread_pct"] > 30 and len(runs[key]) > 1:
            anomalies.append(f"{key}: requests/s varied {s['rps_spread_pct']:.0f}% over rounds")
    misses = sum(v for k, v in metrics.items() if "cache_misses" in k)
    if misses:
        anomalies.append(f"{misses:.0f} metadata cache misses during the measured rounds")
    refusals = sum(v for k, v in metrics.items() if "request_refusals" in k)
    if refusals:
        anomalies.append(f"{refusals:.0f} requests refused by the gate during the rounds")
    busy = max(s["other_cores"] for s in summary.values())
    if busy > 0.25:
        anomalies.append(f"other processes used up to {busy:.2f} cores during the runs")
    return results, anomalies


def markdown(report: Mapping[str, Any]) -> str:
    results, plan = report["results"], report["plan"]
    lines = [
        f"Run {report['when']}, `{report['command']}` ({report['duration_seconds']} s)",
        "",
        f"Machine: {machine_line(report['machine'])}; {report['versions']}.",
        "",
        f"**A Milvus gRPC search next to a Qdrant REST search** (20 hits x 800 B, half "
        f"rejected, hot cache; 1 connection, Python closed loop; Envoy alone and Envoy + gate "
        f"interleaved, {plan['rounds']} x {plan['seconds']:g} s per case; medians; latency in "
        f"ms, CPU in µs per response)",
        "",
        "| API | alone req/s | + gate req/s | ratio | alone p50 / p90 / p99 "
        "| + gate p50 / p90 / p99 | added p50 / p99 | sidecar CPU | front Envoy CPU "
        "alone / + gate | upstream CPU alone / + gate |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    names = {"qdrant_rest": "Qdrant REST", "milvus_grpc": "Milvus gRPC"}
    for api, name in names.items():
        if api not in results:
            continue
        r = results[api]
        e, g, c = r["envoy"], r["gate"], r["compare"]
        lines.append(
            f"| {name} | {e['rps']:,.0f} | {g['rps']:,.0f} | {100 * c['rps_ratio']:.1f}% "
            f"| {e['p50_ms']:.2f} / {e['p90_ms']:.2f} / {e['p99_ms']:.2f} "
            f"| {g['p50_ms']:.2f} / {g['p90_ms']:.2f} / {g['p99_ms']:.2f} "
            f"| {c['added_p50_ms']:+.2f} / {c['added_p99_ms']:+.2f} "
            f"| {g['sidecar_cpu_us']:,.0f} "
            f"| {e['front_envoy_cpu_us']:,.0f} / {g['front_envoy_cpu_us']:,.0f} "
            f"| {e[api + '_upstream_cpu_us']:,.0f} / {g[api + '_upstream_cpu_us']:,.0f} |"
        )
    m, q = results.get("milvus_grpc"), results.get("qdrant_rest")
    if m is not None and "envoy_with_filter" in m:
        f, over = m["envoy_with_filter"], m["gate_over_filter"]
        lines += [
            "",
            "Milvus evaluates the tenant filter the gate pushes down: Envoy alone with the "
            f"request the gate forwards, p50 / p90 / p99 {f['p50_ms']:.2f} / {f['p90_ms']:.2f} / "
            f"{f['p99_ms']:.2f} ms ({m['filter_over_envoy']['added_p50_ms']:+.2f} ms p50 over "
            f"the unfiltered request); the gate over that: {over['added_p50_ms']:+.2f} ms p50, "
            f"{over['added_p99_ms']:+.2f} ms p99.",
        ]
    lines += (
        []
        if m is None or q is None
        else [
            "",
            "Milvus gRPC over Qdrant REST: added p50 "
            f"{m['compare']['added_p50_ms']:+.2f} vs {q['compare']['added_p50_ms']:+.2f} ms "
            f"(x{m['compare']['added_p50_ms'] / q['compare']['added_p50_ms']:.2f}), sidecar CPU "
            f"{m['gate']['sidecar_cpu_us']:,.0f} vs {q['gate']['sidecar_cpu_us']:,.0f} µs per "
            f"response (x{m['gate']['sidecar_cpu_us'] / q['gate']['sidecar_cpu_us']:.2f}).",
        ]
    )
    if report["anomalies"]:
        lines += ["", "Anomalies:", *(f"- {a}" for a in report["anomalies"])]
    return "\n".join(lines)


def machine_line(machine: Mapping[str, Any]) -> str:
    """machine.one_line without wrk (not used here), with the load around the run."""
    return (
        f"{machine['cpu']}, nproc {machine['nproc']}, {machine['memory_gib']} GiB, "
        f"{machine['kernel']}, Python {machine['python']}, Envoy {machine['envoy']}, "
        f"revision {machine['git_revision']}, {machine['busy_cores_before_start']} cores busy "
        f"before the start, load average {machine['load_average_at_start'][0]} at the start "
        f"and {machine['load_average_at_end'][0]} at the end"
    )


def versions() -> str:
    found = []
    for name in ("grpcio", "protobuf", "pymilvus", "milvus-lite"):
        try:
            found.append(f"{name} {package_metadata.version(name)}")
        except package_metadata.PackageNotFoundError:
            found.append(f"{name} ?")
    return ", ".join(found)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="~1-minute smoke run")
    parser.add_argument("--out", type=Path, help="JSON results (default: bench/results/...)")
    parser.add_argument(
        "--apis", nargs="+", choices=FORMATS, default=list(FORMATS), help="what to measure"
    )
    args = parser.parse_args()
    plan_name = "quick" if args.quick else "full"
    plan = PLANS[plan_name]
    started = datetime.now(UTC)
    out = args.out or BENCH / "results" / f"{started:%Y-%m-%d-%H%M}-grpc-search-{plan_name}.json"
    machine = describe()
    machine.pop("wrk", None)  # not used here
    log(f"{plan_name} run, {machine['cpu']}, nproc {machine['nproc']}, Envoy {machine['envoy']}")
    clock = time.monotonic()
    cases: list[Case] = []
    with tempfile.TemporaryDirectory(prefix="gate-grpc-search-") as tmp:
        processes = Processes(Path(tmp))
        try:
            upstream_port = free_port()
            upstream = start_envoy(
                processes,
                "qdrant-upstream",
                qdrant_upstream_bootstrap(upstream_port, {HEADLINE.path: HEADLINE.body()}),
            )
            milvus, milvus_port = start_milvus(processes)
            request, milvus_metadata = load_milvus(milvus_port)
            store = f"sqlite:///{processes.workdir / 'gate.db'}"
            load_store(store, HEADLINE.records(), processes.workdir)
            stack = start_gate(processes, store, upstream_port, milvus_port)
            for path, base in (("envoy", stack.plain), ("gate", stack.gated)):
                if "qdrant_rest" in args.apis:
                    cases.append(Case(f"qdrant_rest {path}", "qdrant_rest", path, RestSearch(base)))
                if "milvus_grpc" in args.apis:
                    client = GrpcSearch(base, request, milvus_metadata)
                    cases.append(Case(f"milvus_grpc {path}", "milvus_grpc", path, client))
            if "milvus_grpc" in args.apis:
                # Envoy alone with the request the gate forwards: what Milvus' own filtering
                # of the pushed-down tenant costs, apart from the gate.
                client = GrpcSearch(
                    stack.plain, pushed_down(request, stack.config), milvus_metadata
                )
                cases.insert(1, Case(CASE_FILTER, "milvus_grpc", "envoy+filter", client))
            try:
                checked = check(cases)
            except GateRefused as refused:
                log(f"not measured: {refused} (is the milvus_grpc format registered?)")
                return 3
            cpu_of: dict[str, Callable[[], float]] = {
                "sidecar": stack.sidecar_cpu,
                "front_envoy": stack.envoy_cpu,
                "qdrant_rest_upstream": lambda: tree_cpu_seconds(upstream.pid),
                "milvus_grpc_upstream": lambda: tree_cpu_seconds(milvus.pid),
            }
            for case in cases:  # unmeasured: opens connections, fills caches
                closed_loop(case.client, plan.warmup_seconds)
            before = counters(stack)
            runs = rounds(cases, plan, cpu_of)
            after = counters(stack)
            delta = {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k)}
            results, anomalies = summarise(runs, delta)
            results["checked"] = checked
            results["gate_metrics_delta"] = delta
            results["stack"] = stack.describe()
        finally:
            for case in cases:
                case.client.close()
            processes.close()
            warnings = processes.warnings()
    for name, lines in warnings.items():
        anomalies.append(f"{name} logged warnings or errors, e.g. {lines[-1][:200]!r}")
    machine["load_average_at_end"] = [round(v, 2) for v in os.getloadavg()]
    report = {
        "when": started.isoformat(timespec="seconds"),
        "command": ("python bench/grpc_search.py " + " ".join(sys.argv[1:])).strip(),
        "plan_name": plan_name,
        "plan": asdict(plan),
        "machine": machine,
        "versions": versions(),
        "duration_seconds": round(time.monotonic() - clock),
        "results": results,
        "anomalies": anomalies,
        "sidecar_warnings": warnings,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    print(markdown(report))
    log(f"written to {out} after {report['duration_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
