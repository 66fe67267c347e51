"""Runs the real stack for integration tests: `retrieval-gate serve` + Envoy + fixture upstream.

The sidecar runs as its own process (the real CLI) and Envoy as another, with
the bootstrap `retrieval-gate proxy` would generate, so a test can kill the
sidecar while Envoy keeps running.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from sidecar.config import IdentityMode, grouped, load_settings
from sidecar.demo.upstream import FixtureUpstream
from sidecar.runtime.bootstrap import Upstream, build_bootstrap
from sidecar.runtime.envoy_process import envoy_command, read_admin_address
from sidecar.runtime.jwt_authn import needs_generated_jwks, write_generated_jwks
from sidecar.runtime.ports import free_port
from sidecar.runtime.workers import worker_addresses

CLI = [sys.executable, "-m", "sidecar.cli"]


@dataclass
class HttpResult:
    status: int
    headers: dict[str, str]  # lowercase names
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


# Loopback only: never route test traffic through an *_proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http(
    method: str, url: str, body: bytes | None = None, headers: Mapping[str, str] | None = None
) -> HttpResult:
    request = urllib.request.Request(url, data=body, headers=dict(headers or {}), method=method)
    try:
        with _OPENER.open(request, timeout=15) as response:
            return HttpResult(
                response.status,
                {k.lower(): v for k, v in response.headers.items()},
                response.read(),
            )
    except urllib.error.HTTPError as error:
        return HttpResult(
            error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()
        )


# What differs between any two answers of the gate: when, and which decision.
PER_REQUEST_HEADERS = frozenset({"date", "x-retrieval-gate-decision-id"})
_TIMING = re.compile(rb'"(took|time)":\s*-?[0-9.eE+-]+')
_DECISION_ID = re.compile(rb'"decision_id":\s*"[^"]*"')


@dataclass(frozen=True)
class ClientView:
    """What a client learns from an answer, but for per-request values: the status,
    the body bytes (timings and the decision id masked) and the headers."""

    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...]


def client_view(response: HttpResult) -> ClientView:
    """``response`` as a ``ClientView``: two views are equal when a client could not
    tell the answers apart except by timing fields (``took``, ``time``), the date
    and the decision id."""
    body = _TIMING.sub(rb'"\1":0', response.body)
    body = _DECISION_ID.sub(b'"decision_id":""', body)
    headers = sorted((k, v) for k, v in response.headers.items() if k not in PER_REQUEST_HEADERS)
    return ClientView(response.status, body, tuple(headers))


def search_ids(response: HttpResult) -> list[int]:
    """The point ids of a Qdrant search response, in order."""
    return [hit["id"] for hit in response.json()["result"]]


def wait_until(predicate: Callable[[], object], timeout: float = 20.0) -> bool:
    """Poll ``predicate`` until it holds (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _wait_for(predicate: Callable[[], object], what: str) -> None:
    if not wait_until(predicate):
        raise TimeoutError(f"timed out waiting for {what}")


def _toml_value(value: Any) -> str:
    if isinstance(value, dict):
        return (
            "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
        )
    return json.dumps(value)


def write_records(path: Path, records: Sequence[Mapping[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


class GateStack:
    """Fixture upstream + sidecar process + Envoy process, in one temp directory."""

    def __init__(
        self,
        workdir: Path,
        records: Sequence[Mapping[str, Any]],
        *,
        config: Mapping[str, Any] | None = None,
        max_body_bytes: int = 4 * 1024 * 1024,
        store_url: str | None = None,
        upstream_url: str | None = None,
        grpc_upstream_url: str | None = None,
        edit_bootstrap: Callable[[dict[str, Any]], None] | None = None,
        policy_data: Mapping[str, Any] | None = None,
    ) -> None:
        """``upstream_url`` puts a real server behind Envoy instead of the fixture upstream.

        ``edit_bootstrap`` may change the generated Envoy bootstrap before Envoy
        starts (e.g. to put a mesh's ext_authz filter in front). ``policy_data``
        is written to a file the sidecar loads as Rego data (the ``policy_data``
        setting), e.g. ``{"retrieval_gate": {"collections": {...}}}``.
        ``grpc_upstream_url`` is where gRPC calls go (``retrieval-gate proxy
        --grpc-upstream``), by default the upstream's address.
        """
        self._grpc_upstream_url = grpc_upstream_url
        self._edit_bootstrap = edit_bootstrap
        self.envoy_admin: tuple[str, int] | None = None
        self.workdir = workdir
        self._fixture = FixtureUpstream().start() if upstream_url is None else None
        self.upstream_url = upstream_url or self.upstream.url
        self.audit_log = workdir / "decisions.jsonl"
        self.store_url = store_url or f"sqlite:///{workdir / 'gate.db'}"
        self.metrics_port = free_port()
        self.socket = workdir / "gate.sock"
        self.listen_port = free_port()
        self._records_file = write_records(workdir / "chunks.jsonl", records)
        if policy_data is not None:
            data_file = workdir / "policy-data.json"
            data_file.write_bytes(orjson.dumps(policy_data))
            config = {"policy_data": str(data_file), **(config or {})}
        self._config = {
            "identity": "trusted-headers",
            "store": self.store_url,
            "audit_log": str(self.audit_log),
            "metrics": f"127.0.0.1:{self.metrics_port}",
            "grpc_listen": f"unix:{self.socket}",
            "max_body_bytes": max_body_bytes,
            **(config or {}),
        }
        self.sidecar: subprocess.Popen[bytes] | None = None
        self.envoy: subprocess.Popen[bytes] | None = None

    @property
    def upstream(self) -> FixtureUpstream:
        """The fixture upstream (absent when a real server was given)."""
        if self._fixture is None:
            raise AttributeError("this stack proxies a real upstream, not the fixture")
        return self._fixture

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listen_port}"

    def start(self) -> GateStack:
        if self.store_url.startswith("postgresql://"):
            subprocess.run(
                [*CLI, "store", "migrate", "--store", self.store_url],
                check=True,
                capture_output=True,
            )
        subprocess.run(
            [*CLI, "store", "load", "--store", self.store_url, str(self._records_file)],
            check=True,
            capture_output=True,
        )
        self.start_sidecar()
        self._start_envoy()
        return self

    def start_sidecar(self) -> None:
        config_file = self.workdir / "gate.toml"
        config_file.write_text(
            "".join(
                f"[{table}]\n"
                + "".join(f"{json.dumps(k)} = {_toml_value(v)}\n" for k, v in keys.items())
                for table, keys in grouped(self._config).items()
            )
        )
        sockets = [
            Path(a.removeprefix("unix:"))
            for a in worker_addresses(f"unix:{self.socket}", int(self._config.get("workers", 1)))
        ]
        for socket_path in sockets:
            socket_path.unlink(missing_ok=True)
        log = (self.workdir / "sidecar.log").open("ab")
        self.sidecar = subprocess.Popen(
            [*CLI, "serve", "--config", str(config_file)], stdout=log, stderr=log
        )

        def listening() -> bool:
            assert self.sidecar is not None
            if self.sidecar.poll() is not None:
                raise RuntimeError((self.workdir / "sidecar.log").read_text()[-3000:])
            return all(path.exists() for path in sockets)

        _wait_for(listening, "the sidecar's gRPC socket")

    def metric(self, name: str) -> float:
        """One sample from /metrics (0 when absent)."""
        return self.metrics().get(name, 0.0)

    def kill_sidecar(self) -> None:
        assert self.sidecar is not None
        self.sidecar.send_signal(signal.SIGKILL)
        self.sidecar.wait()

    def _start_envoy(self) -> None:
        settings = load_settings(None, dict(self._config))
        generated_jwks = None
        if settings.identity.mode is IdentityMode.ENVOY_JWT and needs_generated_jwks(settings):
            generated_jwks = self.workdir / "generated-jwks.json"
            write_generated_jwks(settings, generated_jwks)
        bootstrap = build_bootstrap(
            settings,
            listen=("127.0.0.1", self.listen_port),
            upstream=Upstream.parse(self.upstream_url),
            grpc_upstream=(
                None if self._grpc_upstream_url is None else Upstream.parse(self._grpc_upstream_url)
            ),
            generated_jwks=generated_jwks,
        )
        if self._edit_bootstrap is not None:
            self._edit_bootstrap(bootstrap)
        config = self.workdir / "envoy.json"
        config.write_text(json.dumps(bootstrap))
        admin_file = self.workdir / "envoy-admin"
        log = (self.workdir / "envoy.log").open("ab")
        self.envoy = subprocess.Popen(envoy_command(config, admin_file), stdout=log, stderr=log)

        def ready() -> bool:
            assert self.envoy is not None
            if self.envoy.poll() is not None:
                raise RuntimeError((self.workdir / "envoy.log").read_text()[-3000:])
            address = read_admin_address(admin_file)
            if address is None:
                return False
            try:
                live = http("GET", f"http://{address[0]}:{address[1]}/ready").status == 200
            except OSError:
                return False
            self.envoy_admin = address
            return live

        _wait_for(ready, "Envoy to report LIVE")

    def envoy_stat(self, name: str) -> int:
        """One counter from Envoy's admin /stats (0 when absent)."""
        assert self.envoy_admin is not None
        host, port = self.envoy_admin
        body = http("GET", f"http://{host}:{port}/stats?filter=^{name}$").body.decode()
        for line in body.splitlines():
            key, _, value = line.partition(": ")
            if key == name:
                return int(value)
        return 0

    def search(
        self,
        path: str,
        *,
        tenant: str | None = "acme",
        principals: str | None = "user:alice,group:qa",
        body: bytes = b'{"vector":[0.1,0.2],"limit":10}',
        method: str = "POST",
        headers: Mapping[str, str] | None = None,
    ) -> HttpResult:
        sent = {"content-type": "application/json", **(headers or {})}
        if tenant is not None:
            sent["x-gate-tenant"] = tenant
        if principals is not None:
            sent["x-gate-principals"] = principals
        return http(method, self.url + path, body if method != "GET" else None, sent)

    def metrics(self) -> dict[str, float]:
        """Parsed /metrics samples: 'name{labels}' -> value."""
        text = http("GET", f"http://127.0.0.1:{self.metrics_port}/metrics").body.decode()
        samples: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                samples[name] = float(value)
        return samples

    def audit_records(self) -> list[dict[str, Any]]:
        if not self.audit_log.exists():
            return []
        return [orjson.loads(line) for line in self.audit_log.read_bytes().splitlines()]

    def stop(self) -> None:
        for process in (self.envoy, self.sidecar):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        if self._fixture is not None:
            self._fixture.stop()
