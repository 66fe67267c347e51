"""Benchmark: Envoy alone vs Envoy + Retrieval Gate, side by side in one run.

Not a test. Starts, all on loopback:
  * a static upstream: an Envoy whose route answers every request with the same
    20-hit Qdrant search body (direct_response), so the upstream is never the
    bottleneck;
  * `retrieval-gate serve` (SQLite store, hot cache, Rego, audit log, metrics);
  * one front Envoy with two listeners on the same upstream: one plain, one
    with the gate's ext_authz + ext_proc filters (the `proxy` bootstrap);
then drives both listeners with wrk, interleaved, and prints requests/s and
p50/p90/p99 for each plus their ratios (medians over the rounds).

Usage: .venv/bin/python bench/envoy_vs_gate.py [--seconds 10] [--rounds 3]
Needs `wrk` (Debian: apt-get install wrk).
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from sidecar.config import IdentityMode, Settings
from sidecar.envoy.bootstrap import Upstream, build_bootstrap
from sidecar.envoy.process import envoy_command, read_admin_address
from sidecar.integrity import canonical_sha256

ROOT = Path(__file__).resolve().parents[1]
SEARCH = "/collections/docs/points/search"
CHUNKS = 20
TEXT_BYTES = 800
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def corpus() -> tuple[list[dict[str, Any]], bytes]:
    """20 records (half of them rejected for the caller) and the matching search body."""
    records, hits = [], []
    for i in range(CHUNKS):
        text = (f"chunk {i} " + "lorem ipsum dolor sit amet " * 40)[:TEXT_BYTES]
        records.append(
            {
                "chunk_id": str(i),
                "doc_id": f"doc-{i}",
                "version": "1",
                "tenant_id": "acme",
                "allowed_principals": ["group:qa"],
                "status": "approved" if i % 2 == 0 else "revoked",
                "effective_at": "2025-01-01T00:00:00Z",
                "expires_at": None,
                "sha256": canonical_sha256(text),
            }
        )
        hits.append({"id": i, "version": 1, "score": 1 - i / 100, "payload": {"text": text}})
    body = orjson.dumps({"result": hits, "status": "ok", "time": 0.001})
    return records, body


def static_upstream_bootstrap(port: int, body: bytes) -> dict[str, Any]:
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network."
        "http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "static",
        "route_config": {
            "max_direct_response_body_size_bytes": len(body) + 1024,
            "virtual_hosts": [
                {
                    "name": "static",
                    "domains": ["*"],
                    "routes": [
                        {
                            "match": {"prefix": "/"},
                            "direct_response": {
                                "status": 200,
                                "body": {"inline_string": body.decode()},
                            },
                            "response_headers_to_add": [
                                {"header": {"key": "content-type", "value": "application/json"}}
                            ],
                        }
                    ],
                }
            ],
        },
        "http_filters": [
            {
                "name": "envoy.filters.http.router",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                },
            }
        ],
    }
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "static",
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": hcm,
                                }
                            ]
                        }
                    ],
                }
            ]
        },
    }


def front_bootstrap(settings: Settings, gated: int, plain: int, upstream: int) -> dict[str, Any]:
    """The proxy's bootstrap, plus a second listener without the gate's filters."""
    bootstrap = build_bootstrap(
        settings, listen=("127.0.0.1", gated), upstream=Upstream("127.0.0.1", upstream, False)
    )
    listeners = bootstrap["static_resources"]["listeners"]
    bare = copy.deepcopy(listeners[0])
    bare["name"] = "plain"
    bare["address"]["socket_address"]["port_value"] = plain
    hcm = bare["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"].endswith("router")]
    listeners.append(bare)
    return bootstrap


def start_envoy(bootstrap: dict[str, Any], workdir: Path, name: str) -> subprocess.Popen[bytes]:
    config = workdir / f"{name}.json"
    config.write_text(json.dumps(bootstrap))
    admin = workdir / f"{name}.admin"
    log = (workdir / f"{name}.log").open("ab")
    process = subprocess.Popen(envoy_command(config, admin), stdout=log, stderr=log)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        address = read_admin_address(admin)
        if address is not None:
            try:
                with _OPENER.open(f"http://{address[0]}:{address[1]}/ready", timeout=2) as r:
                    if r.status == 200:
                        return process
            except OSError:
                pass
        time.sleep(0.05)
    raise RuntimeError(f"{name} envoy did not start: {(workdir / f'{name}.log').read_text()}")


_LATENCY = re.compile(r"^\s+(50|90|99)%\s+([\d.]+)(us|ms|s)\s*$", re.M)
_RPS = re.compile(r"^Requests/sec:\s+([\d.]+)", re.M)
_NON_2XX = re.compile(r"Non-2xx or 3xx responses:\s+(\d+)")
_UNIT_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def run_wrk(url: str, connections: int, seconds: int, script: Path) -> dict[str, float]:
    out = subprocess.run(
        [
            "wrk",
            f"-t{min(connections, 2)}",
            f"-c{connections}",
            f"-d{seconds}s",
            "--latency",
            "-s",
            str(script),
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    result = {f"p{p}_ms": float(v) * _UNIT_MS[u] for p, v, u in _LATENCY.findall(out)}
    result["rps"] = float(_RPS.search(out).group(1))  # type: ignore[union-attr]
    errors = _NON_2XX.search(out)
    result["non_2xx"] = float(errors.group(1)) if errors else 0.0
    return result


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime + stime
    import os

    return ticks / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "latest.json")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        print("wrk not found: apt-get install wrk", file=sys.stderr)
        return 2

    records, body = corpus()
    with tempfile.TemporaryDirectory(prefix="gate-bench-") as tmp:
        workdir = Path(tmp)
        chunks = workdir / "chunks.jsonl"
        chunks.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
        store = f"sqlite:///{workdir / 'gate.db'}"
        cli = [sys.executable, "-m", "sidecar.cli"]
        subprocess.run([*cli, "store", "load", "--store", store, str(chunks)], check=True)
        sock = workdir / "gate.sock"
        sidecar_log = (workdir / "sidecar.log").open("ab")
        sidecar = subprocess.Popen(
            [
                *cli,
                "serve",
                "--identity",
                "trusted-headers",
                "--store",
                store,
                "--grpc-listen",
                f"unix:{sock}",
                "--audit-log",
                str(workdir / "audit.jsonl"),
                "--metrics",
                f"127.0.0.1:{free_port()}",
            ],
            stdout=sidecar_log,
            stderr=sidecar_log,
        )
        processes: list[subprocess.Popen[bytes]] = [sidecar]
        try:
            while not sock.exists():
                if sidecar.poll() is not None:
                    raise RuntimeError((workdir / "sidecar.log").read_text())
                time.sleep(0.05)
            upstream_port, gated_port, plain_port = free_port(), free_port(), free_port()
            processes.append(
                start_envoy(static_upstream_bootstrap(upstream_port, body), workdir, "upstream")
            )
            settings = Settings(identity=IdentityMode.TRUSTED_HEADERS, grpc_listen=f"unix:{sock}")
            processes.append(
                start_envoy(
                    front_bootstrap(settings, gated_port, plain_port, upstream_port),
                    workdir,
                    "front",
                )
            )
            script = workdir / "search.lua"
            script.write_text(
                'wrk.method = "POST"\n'
                'wrk.body = \'{"vector":[0.1,0.2,0.3],"limit":20,"with_payload":true}\'\n'
                'wrk.headers["content-type"] = "application/json"\n'
                'wrk.headers["x-gate-tenant"] = "acme"\n'
                'wrk.headers["x-gate-principals"] = "user:alice,group:qa"\n'
            )
            urls = {
                "envoy": f"http://127.0.0.1:{plain_port}{SEARCH}",
                "gate": f"http://127.0.0.1:{gated_port}{SEARCH}",
            }
            # Warm-up: fills the metadata cache and the policy engine.
            for url in urls.values():
                run_wrk(url, 1, 2, script)
            results: dict[str, Any] = {}
            for connections in args.connections:
                runs: dict[str, list[dict[str, float]]] = {"envoy": [], "gate": []}
                cpu_per_1k: list[float] = []
                for _ in range(args.rounds):
                    for name, url in urls.items():
                        before = cpu_seconds(sidecar.pid)
                        run = run_wrk(url, connections, args.seconds, script)
                        if name == "gate":
                            used = cpu_seconds(sidecar.pid) - before
                            cpu_per_1k.append(used / (run["rps"] * args.seconds) * 1000)
                        runs[name].append(run)
                summary = {
                    name: {
                        key: statistics.median(r[key] for r in rs)
                        for key in ("rps", "p50_ms", "p90_ms", "p99_ms", "non_2xx")
                    }
                    for name, rs in runs.items()
                }
                summary["ratio"] = {
                    "rps_gate_over_envoy": summary["gate"]["rps"] / summary["envoy"]["rps"],
                    "added_p50_ms": summary["gate"]["p50_ms"] - summary["envoy"]["p50_ms"],
                    "added_p99_ms": summary["gate"]["p99_ms"] - summary["envoy"]["p99_ms"],
                    "sidecar_cpu_seconds_per_1000_responses": statistics.median(cpu_per_1k),
                }
                results[f"{connections}_connections"] = {"median": summary, "runs": runs}
        finally:
            for process in reversed(processes):
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=10)

    report = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, "
        f"{__import__('os').cpu_count()} cores, Python {platform.python_version()}",
        "workload": f"{CHUNKS} hits x {TEXT_BYTES} B text ({len(body)} B body), "
        "half rejected, hot cache, audit + metrics on, Envoy --concurrency 1",
        "seconds_per_run": args.seconds,
        "rounds": args.rounds,
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{report['workload']}; medians of {args.rounds} interleaved {args.seconds}s runs")
    print(f"{'conns':>5} {'path':<6} {'req/s':>9} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8}")
    for key, value in results.items():
        for name in ("envoy", "gate"):
            m = value["median"][name]
            print(
                f"{key.split('_')[0]:>5} {name:<6} {m['rps']:>9.0f} {m['p50_ms']:>8.2f} "
                f"{m['p90_ms']:>8.2f} {m['p99_ms']:>8.2f}"
            )
        r = value["median"]["ratio"]
        print(
            f"      gate/envoy throughput {r['rps_gate_over_envoy']:.2f}, added p50 "
            f"{r['added_p50_ms']:.2f} ms, added p99 {r['added_p99_ms']:.2f} ms, sidecar CPU "
            f"{r['sidecar_cpu_seconds_per_1000_responses']:.2f} s per 1000 responses"
        )
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
