"""Starting and stopping what the benchmark measures, all on loopback.

* the static upstream: an Envoy whose routes answer each workload's search
  path with that workload's canned Qdrant body (direct_response), so the
  upstream is never the bottleneck;
* a gate stack: `retrieval-gate serve --config gate.toml` plus a front Envoy
  built by the gate's own `build_bootstrap` (what `retrieval-gate proxy`
  runs), with a second, plain listener on the same upstream: Envoy alone and
  Envoy + gate go through the same Envoy process;
* a floor stack: bench/floor_servicer.py (an ext_proc servicer that does no
  work) behind a front Envoy built the same way, to measure what the design
  costs before the gate does anything;
* a scratch PostgreSQL database.
"""

from __future__ import annotations

import copy
import http.client as http_client
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from cpu import process_tree, tree_cpu_seconds
from load import CALLER_HEADERS, SEARCH_BODY

from sidecar.config import grouped, load_settings
from sidecar.runtime.bootstrap import SIDECAR_CLUSTER, Upstream, build_bootstrap
from sidecar.runtime.envoy_process import envoy_command, read_admin_address
from sidecar.runtime.ports import free_port
from sidecar.runtime.workers import worker_addresses

CLI = [sys.executable, "-m", "sidecar.cli"]
FLOOR_SERVICER = Path(__file__).resolve().parent / "floor_servicer.py"
EXT_PROC_FILTER = "envoy.filters.http.ext_proc"
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only


def http(url: str, body: bytes | None = None) -> tuple[int, bytes]:
    """POST a search (GET without body) as the benchmark's caller; (status, body)."""
    request = urllib.request.Request(url, data=body, headers=CALLER_HEADERS)
    try:
        with _OPENER.open(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


class Processes:
    """Every process the benchmark starts, stopped in reverse order by ``close``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._started: list[subprocess.Popen[bytes]] = []

    def spawn(self, name: str, command: Sequence[str]) -> subprocess.Popen[bytes]:
        with (self.workdir / f"{name}.log").open("ab") as log:
            process = subprocess.Popen(command, stdout=log, stderr=log)
        self._started.append(process)
        return process

    def log_tail(self, name: str) -> str:
        return (self.workdir / f"{name}.log").read_text(errors="replace")[-3000:]

    def warnings(self, limit: int = 10) -> dict[str, list[str]]:
        """The last warnings and errors each sidecar logged (the expected warning that
        trusted-headers identity is for development only left out)."""
        found = {}
        for log in sorted(self.workdir.glob("*-sidecar.log")):
            lines = [
                line
                for line in log.read_text(errors="replace").splitlines()
                if ("WARNING" in line or "ERROR" in line or "Traceback" in line)
                and "trusted-headers" not in line
            ]
            if lines:
                found[log.stem] = lines[-limit:]
        return found

    def stop(self, process: subprocess.Popen[bytes]) -> None:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process in self._started:
            self._started.remove(process)

    def close(self) -> None:
        for process in reversed(list(self._started)):
            self.stop(process)


def _wait(ready: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def start_envoy(
    processes: Processes, name: str, bootstrap: dict[str, Any], concurrency: int = 1
) -> subprocess.Popen[bytes]:
    """Start an Envoy on ``bootstrap``; return once its admin /ready answers 200."""
    config = processes.workdir / f"{name}.json"
    config.write_text(json.dumps(bootstrap))
    admin = processes.workdir / f"{name}.admin"
    process = processes.spawn(name, envoy_command(config, admin, concurrency=concurrency))

    def ready() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited:\n{processes.log_tail(name)}")
        address = read_admin_address(admin)
        try:
            return address is not None and http(f"http://{address[0]}:{address[1]}/ready")[0] == 200
        except OSError:
            return False

    _wait(ready, f"{name} to be ready")
    return process


def _hcm(stat_prefix: str, routes: list[dict[str, Any]], max_body: int) -> dict[str, Any]:
    return {
        "@type": "type.googleapis.com/envoy.extensions.filters.network."
        "http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": stat_prefix,
        "route_config": {
            "max_direct_response_body_size_bytes": max_body,
            "virtual_hosts": [{"name": stat_prefix, "domains": ["*"], "routes": routes}],
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


def static_upstream_bootstrap(port: int, bodies: Mapping[str, bytes]) -> dict[str, Any]:
    """An Envoy that answers each path in ``bodies`` with that body, from memory."""
    routes = [
        {
            "match": {"path": path},
            "direct_response": {"status": 200, "body": {"inline_string": body.decode()}},
            "response_headers_to_add": [
                {"header": {"key": "content-type", "value": "application/json"}}
            ],
        }
        for path, body in bodies.items()
    ]
    largest = max(len(b) for b in bodies.values())
    listener = {
        "name": "static",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [
            {
                "filters": [
                    {
                        "name": "envoy.filters.network.http_connection_manager",
                        "typed_config": _hcm("static", routes, largest + 1024),
                    }
                ]
            }
        ],
    }
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {"listeners": [listener]},
    }


def front_bootstrap(
    config: Mapping[str, Any],
    gated: int,
    plain: int,
    upstream: int,
    processing_mode: Mapping[str, str] | None = None,
    grpc_upstream: int | None = None,
) -> dict[str, Any]:
    """The gate's own bootstrap for ``config``, plus a listener without the gate's filters.

    ``processing_mode`` overrides fields of the ext_proc filter's processing mode
    (floor variants only; the gate always runs with its own). gRPC calls go to
    ``grpc_upstream``, by default ``upstream``."""
    settings = load_settings(None, dict(config))
    bootstrap: dict[str, Any] = build_bootstrap(
        settings,
        listen=("127.0.0.1", gated),
        upstream=Upstream("127.0.0.1", upstream, False),
        grpc_upstream=None
        if grpc_upstream is None
        else Upstream("127.0.0.1", grpc_upstream, False),
    )
    listeners = bootstrap["static_resources"]["listeners"]
    if processing_mode:
        hcm = listeners[0]["filter_chains"][0]["filters"][0]["typed_config"]
        (ext_proc,) = (f for f in hcm["http_filters"] if f["name"] == EXT_PROC_FILTER)
        ext_proc["typed_config"]["processing_mode"].update(processing_mode)
    bare = copy.deepcopy(listeners[0])
    bare["name"] = "plain"
    bare["address"]["socket_address"]["port_value"] = plain
    hcm = bare["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["stat_prefix"] = "plain"
    hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"].endswith(".router")]
    listeners.append(bare)
    return bootstrap


def _endpoints(bootstrap: Mapping[str, Any], cluster_name: str) -> int:
    for cluster in bootstrap["static_resources"]["clusters"]:
        if cluster["name"] == cluster_name:
            groups = cluster["load_assignment"]["endpoints"]
            return sum(len(group["lb_endpoints"]) for group in groups)
    return 0


def _toml(config: Mapping[str, Any]) -> str:
    # Strings, numbers, booleans and lists of them are valid TOML as JSON; a table
    # (routes, formats) is written inline.
    return "".join(
        f"[{group}]\n"
        + "".join(f"{json.dumps(key)} = {_value(value)}\n" for key, value in keys.items())
        for group, keys in grouped(config).items()
    )


def _value(value: Any) -> str:
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{json.dumps(k)} = {_value(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


def load_store(store: str, records: Sequence[Mapping[str, Any]], workdir: Path) -> None:
    """`retrieval-gate store migrate` and `store load`, as an operator would."""
    chunks = workdir / "chunks.jsonl"
    chunks.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    commands = [
        ["store", "migrate", "--store", store],
        ["store", "load", "--store", store, str(chunks)],
    ]
    for command in commands:
        done = subprocess.run([*CLI, *command], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"retrieval-gate {command[0]} {command[1]}: {done.stderr}")


class SidecarExited(RuntimeError):
    """The sidecar stopped before serving (e.g. it refused its configuration)."""


@dataclass
class GateStack:
    """One sidecar (all its processes) and the front Envoy in front of it."""

    name: str
    sidecar: subprocess.Popen[bytes]
    envoy: subprocess.Popen[bytes]
    gated: str  # base URL through the gate's filters
    plain: str  # base URL through the same Envoy, no gate
    metrics_url: str
    config: dict[str, Any]  # the sidecar's gate.toml
    sidecar_endpoints: int  # in the front Envoy's sidecar cluster

    def describe(self) -> dict[str, Any]:
        """What was started, as seen: the config, processes in the sidecar's tree, endpoints."""
        return {
            "config": self.config,
            "sidecar_processes": len(process_tree(self.sidecar.pid)),
            "envoy_sidecar_endpoints": self.sidecar_endpoints,
        }

    def sidecar_cpu(self) -> float:
        """CPU seconds of the sidecar's whole process tree (workers included)."""
        return tree_cpu_seconds(self.sidecar.pid)

    def envoy_cpu(self) -> float:
        return tree_cpu_seconds(self.envoy.pid)

    def metrics(self) -> dict[str, float]:
        """Samples from the sidecar's /metrics, summed over labels: name -> value."""
        status, body = http(self.metrics_url)
        if status != 200:
            raise RuntimeError(f"{self.metrics_url} answered {status}")
        totals: dict[str, float] = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                sample, _, value = line.rpartition(" ")
                name = sample.split("{", 1)[0]
                totals[name] = totals.get(name, 0.0) + float(value)
        return totals


def start_gate(
    processes: Processes,
    name: str,
    config: Mapping[str, Any],
    upstream_port: int,
    *,
    probe_path: str,
    envoy_concurrency: int = 1,
    grpc_upstream_port: int | None = None,
) -> GateStack:
    """Start `retrieval-gate serve --config <name>.toml` and its front Envoy; return once a
    search through the gate answers 200 (however many processes the sidecar runs).

    gRPC calls go to ``grpc_upstream_port``, by default ``upstream_port``."""
    workdir = processes.workdir
    metrics_port = free_port()
    config = {
        "identity": "trusted-headers",
        "grpc_listen": f"unix:{workdir / name}.sock",
        "metrics": f"127.0.0.1:{metrics_port}",
        "audit_log": str(workdir / f"{name}-audit.jsonl"),
        **config,
    }
    toml = workdir / f"{name}.toml"
    toml.write_text(_toml(config))
    sidecar = processes.spawn(f"{name}-sidecar", [*CLI, "serve", "--config", str(toml)])
    gated, plain = free_port(), free_port()
    bootstrap = front_bootstrap(
        config, gated, plain, upstream_port, grpc_upstream=grpc_upstream_port
    )
    envoy = start_envoy(processes, f"{name}-envoy", bootstrap, envoy_concurrency)
    stack = GateStack(
        name,
        sidecar,
        envoy,
        f"http://127.0.0.1:{gated}",
        f"http://127.0.0.1:{plain}",
        f"http://127.0.0.1:{metrics_port}/metrics",
        config,
        _endpoints(bootstrap, SIDECAR_CLUSTER),
    )

    def serving() -> bool:
        if sidecar.poll() is not None:
            raise SidecarExited(f"sidecar {name}: {processes.log_tail(f'{name}-sidecar')}")
        try:
            # With several workers, /metrics (served by the parent) comes up last.
            return (
                http(stack.gated + probe_path, SEARCH_BODY.encode())[0] == 200
                and http(stack.metrics_url)[0] == 200
            )
        except OSError:
            return False

    try:
        _wait(serving, f"the {name} sidecar to serve")
    except BaseException:
        processes.stop(envoy)
        processes.stop(sidecar)
        raise
    return stack


def _listening(address: str) -> bool:
    """Whether something accepts connections at a gRPC address (unix:/path or host:port)."""
    target: str | tuple[str, int]
    if address.startswith("unix:"):
        family, target = socket.AF_UNIX, address.removeprefix("unix:")
    else:
        host, _, port = address.rpartition(":")
        family, target = socket.AF_INET, (host.strip("[]"), int(port))
    with socket.socket(family) as s:
        try:
            s.connect(target)
        except OSError:
            return False
    return True


def start_floor(
    processes: Processes,
    name: str,
    upstream_port: int,
    *,
    probe_path: str,
    echo_body: bool,
    echo_request_body: bool = False,
    processing_mode: Mapping[str, str] | None = None,
    workers: int = 1,
    envoy_concurrency: int = 1,
) -> GateStack:
    """Start bench/floor_servicer.py (``workers`` processes, as the sidecar would run) and
    a front Envoy built by the gate's own bootstrap in front of it; return once a search
    through it answers 200. The stack has no /metrics (``metrics_url`` is empty)."""
    workdir = processes.workdir
    config: dict[str, Any] = {
        "identity": "trusted-headers",
        "grpc_listen": f"unix:{workdir / name}.sock",
        "workers": workers,
    }
    settings = load_settings(None, dict(config))
    command = [sys.executable, str(FLOOR_SERVICER)]
    command += ["--max-message-bytes", str(settings.listen.grpc_max_message_bytes)]
    command += ["--echo-body"] if echo_body else []
    command += ["--echo-request-body"] if echo_request_body else []
    addresses = worker_addresses(settings.listen.grpc, workers)
    command += addresses
    # "-sidecar" in the log name: Processes.warnings() reports what it logged.
    servicer = processes.spawn(f"{name}-sidecar", command)
    gated, plain = free_port(), free_port()
    bootstrap = front_bootstrap(config, gated, plain, upstream_port, processing_mode)
    envoy = start_envoy(processes, f"{name}-envoy", bootstrap, envoy_concurrency)
    stack = GateStack(
        name,
        servicer,
        envoy,
        f"http://127.0.0.1:{gated}",
        f"http://127.0.0.1:{plain}",
        "",
        {
            **config,
            "echo_body": echo_body,
            "echo_request_body": echo_request_body,
            "processing_mode": dict(processing_mode or {}),
        },
        _endpoints(bootstrap, SIDECAR_CLUSTER),
    )

    def serving() -> bool:
        if servicer.poll() is not None:
            raise SidecarExited(f"floor {name}: {processes.log_tail(f'{name}-sidecar')}")
        try:
            # Every process must listen: Envoy spreads streams over all of them.
            return (
                all(_listening(address) for address in addresses)
                and http(stack.gated + probe_path, SEARCH_BODY.encode())[0] == 200
            )
        except (OSError, http_client.HTTPException):
            # Until the servicer listens, Envoy may cut a response short.
            return False

    try:
        _wait(serving, f"the {name} floor servicer to serve")
    except BaseException:
        processes.stop(envoy)
        processes.stop(servicer)
        raise
    return stack


@contextmanager
def scratch_database(admin_url: str) -> Iterator[str]:
    """A new, empty PostgreSQL database on the server of ``admin_url``; dropped afterwards."""
    import psycopg

    name = f"rg_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=3) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{admin_url.rsplit('/', 1)[0]}/{name}"
    finally:
        with psycopg.connect(admin_url, autocommit=True, connect_timeout=3) as connection:
            connection.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            )
            connection.execute(f'DROP DATABASE IF EXISTS "{name}"')
