"""Start-up and stop through a real Envoy: nothing in flight is reset, nothing outlives `proxy`,
and a metadata store that is down at start delays readiness instead of ending the process.

- SIGTERM to ``retrieval-gate proxy`` while slow requests are in flight: Envoy
  drains first, so every one of them gets its complete 200 answer.
- SIGKILL of ``proxy``: the kernel stops its Envoy (PR_SET_PDEATHSIG), and the
  listen port is free again.
- ``serve`` with its PostgreSQL store behind a port where nothing listens yet:
  alive, NOT_SERVING, every request refused 503 ``metadata_unavailable``;
  SERVING and deciding once a forwarder to the real server appears there.
- A misconfigured store (unknown database, malformed URL) still exits 2 at once.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sidecar.demo.upstream import CannedResponse, FixtureUpstream
from sidecar.runtime.ports import free_port
from tests.fixtures import qdrant_bodies as qb
from tests.fixtures.harness import CLI, GateStack, HttpResult, http, search_ids, write_records
from tests.fixtures.postgres import fresh_database
from tests.fixtures.records import record_dict, text_for
from tests.fixtures.stores import new_sqlite_url

pytestmark = pytest.mark.envoy

SEARCH = "/collections/docs/points/search"
IN_FLIGHT = 16
UPSTREAM_DELAY_SECONDS = 0.5


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for a reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@contextmanager
def running_proxy(
    tmp_path: Path, upstream: FixtureUpstream
) -> Iterator[tuple[subprocess.Popen[bytes], int, int]]:
    """``retrieval-gate proxy`` in front of ``upstream``: (process, listen port, Envoy's pid)."""
    store = new_sqlite_url(tmp_path / "gate.db")
    chunks = write_records(tmp_path / "chunks.jsonl", [record_dict("1"), record_dict("2")])
    assert run_cli("store", "load", "--store", store, str(chunks)).returncode == 0
    port = free_port()
    log_path = tmp_path / "proxy.log"
    proxy = subprocess.Popen(
        [
            *CLI,
            "proxy",
            "--upstream",
            upstream.url,
            "--listen",
            f"127.0.0.1:{port}",
            "--store",
            store,
            "--identity",
            "trusted-headers",
            "--drain-seconds",
            "10",
        ],
        stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while b"proxy ready" not in log_path.read_bytes():
            assert proxy.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "proxy did not become ready"
            time.sleep(0.1)
        envoy_pid = int(log_path.read_text().split("envoy pid ", 1)[1].split(")")[0])
        yield proxy, port, envoy_pid
    finally:
        if proxy.poll() is None:
            proxy.kill()
            proxy.wait()


def _slow_upstream() -> FixtureUpstream:
    upstream = FixtureUpstream().start()
    body = qb.encode(qb.search_body([qb.point(1, text_for("1")), qb.point(2, text_for("2"))]))
    upstream.respond("POST", SEARCH, CannedResponse(body, delay_seconds=UPSTREAM_DELAY_SECONDS))
    return upstream


def _search(port: int) -> HttpResult | BaseException:
    try:
        return http(
            "POST",
            f"http://127.0.0.1:{port}{SEARCH}",
            b'{"vector":[0.1],"limit":2}',
            {"x-gate-tenant": "acme", "x-gate-principals": "group:qa"},
        )
    except BaseException as exc:  # a reset or a refused connection: the failure counted
        return exc


def test_sigterm_under_load_answers_every_request_in_flight(tmp_path: Path) -> None:
    upstream = _slow_upstream()
    try:
        with running_proxy(tmp_path, upstream) as (proxy, port, envoy_pid):
            assert search_ids(_search(port)) == [1, 2]  # type: ignore[arg-type]
            with ThreadPoolExecutor(IN_FLIGHT) as pool:
                futures = [pool.submit(_search, port) for _ in range(IN_FLIGHT)]
                # Every request has reached the slow upstream (0.5 s) before the signal.
                deadline = time.monotonic() + 5
                while len(upstream.requests) < IN_FLIGHT + 1 and time.monotonic() < deadline:
                    time.sleep(0.02)
                assert len(upstream.requests) == IN_FLIGHT + 1
                signalled = time.monotonic()
                proxy.send_signal(signal.SIGTERM)
                answers = [future.result() for future in futures]
            failures = [a for a in answers if not isinstance(a, HttpResult)]
            assert failures == []
            for answer in answers:
                assert isinstance(answer, HttpResult)
                assert answer.status == 200
                assert search_ids(answer) == [1, 2]  # the whole body, filtered
            assert proxy.wait(timeout=20) == 0
            # It stopped once the requests were answered, not after the drain time.
            assert time.monotonic() - signalled < 8
            assert not _alive(envoy_pid)
            assert _port_free(port)
            log = (tmp_path / "proxy.log").read_text()
            assert "draining envoy" in log
            assert "did not drain" not in log and "still had" not in log
    finally:
        upstream.stop()


def test_the_prestop_drain_waits_for_the_requests_in_flight(tmp_path: Path) -> None:
    # What the gateway's preStop hook runs, against an Envoy with requests in flight.
    gate = GateStack(tmp_path, [record_dict("1"), record_dict("2")])
    body = qb.encode(qb.search_body([qb.point(1, text_for("1")), qb.point(2, text_for("2"))]))
    gate.upstream.respond(
        "POST", SEARCH, CannedResponse(body, delay_seconds=UPSTREAM_DELAY_SECONDS)
    )
    try:
        gate.start()
        assert gate.envoy_admin is not None
        host, admin_port = gate.envoy_admin
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(gate.search, SEARCH) for _ in range(4)]
            deadline = time.monotonic() + 5
            while len(gate.upstream.requests) < 4 and time.monotonic() < deadline:
                time.sleep(0.02)
            started = time.monotonic()
            hook = run_cli_module(
                "sidecar.runtime.envoy_drain", f"--admin={host}:{admin_port}", "--max-seconds=10"
            )
            took = time.monotonic() - started
            answers = [future.result() for future in futures]
        assert hook.returncode == 0, hook.stdout + hook.stderr
        assert took < 5  # returned once they were answered, not after --max-seconds
        assert [search_ids(answer) for answer in answers] == [[1, 2]] * 4
        # Draining: still answering (a load balancer may still send some), telling
        # every client to close.
        late = gate.search(SEARCH)
        assert late.status == 200 and late.headers.get("connection") == "close"
    finally:
        gate.stop()


def run_cli_module(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI[0], "-m", module, *args], capture_output=True, text=True, timeout=60)


def test_sigkill_of_proxy_leaves_no_envoy_behind(tmp_path: Path) -> None:
    upstream = _slow_upstream()
    try:
        with running_proxy(tmp_path, upstream) as (proxy, port, envoy_pid):
            assert _alive(envoy_pid)
            proxy.send_signal(signal.SIGKILL)
            proxy.wait()
            deadline = time.monotonic() + 5
            while _alive(envoy_pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not _alive(envoy_pid), "envoy outlived its proxy"
            deadline = time.monotonic() + 5
            while not _port_free(port) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _port_free(port)
    finally:
        with_pid = locals().get("envoy_pid")
        if isinstance(with_pid, int) and _alive(with_pid):
            os.kill(with_pid, signal.SIGKILL)
        upstream.stop()


class Forwarder:
    """A TCP forwarder from a local port to ``target``, started when a test says so."""

    def __init__(self, port: int, target: tuple[str, int]) -> None:
        self._listener = socket.create_server(("127.0.0.1", port))
        self._target = target
        self._stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._target)
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=_pump, args=(source, sink), daemon=True).start()

    def stop(self) -> None:
        self._stopped = True
        self._listener.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for end in (source, sink):
            with suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)


def _health(socket_path: Path) -> str:
    with grpc.insecure_channel(f"unix:{socket_path}") as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=3
            )
        except grpc.RpcError as error:
            return str(error.code().name)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


@pytest.mark.postgres
def test_a_store_down_at_start_delays_readiness_and_refuses_meanwhile(tmp_path: Path) -> None:
    with fresh_database() as database:
        real = database.split("@", 1)[-1].split("/", 1)[0]
        host, _, real_port = real.rpartition(":")
        later_port = free_port()
        later = database.replace(f"{host}:{real_port}", f"127.0.0.1:{later_port}", 1)
        assert later != database
        gate = GateStack(tmp_path, [record_dict("1"), record_dict("2")], store_url=later)
        assert run_cli("store", "migrate", "--store", database).returncode == 0
        chunks = write_records(tmp_path / "records.jsonl", [record_dict("1"), record_dict("2")])
        assert run_cli("store", "load", "--store", database, str(chunks)).returncode == 0
        points = [qb.point(i, text_for(str(i))) for i in (1, 2)]
        gate.upstream.respond("POST", SEARCH, CannedResponse(qb.encode(qb.search_body(points))))
        forwarder = None
        try:
            gate.start_sidecar()
            gate._start_envoy()
            time.sleep(1.0)  # a few attempts
            assert gate.sidecar is not None and gate.sidecar.poll() is None
            assert _health(gate.socket) == "NOT_SERVING"
            assert gate.metric("retrieval_gate_serving") == 0
            for _ in range(3):
                refused = gate.search(SEARCH)
                assert refused.status == 503
                assert refused.json() == {"error": "metadata_unavailable"}
            log = (tmp_path / "sidecar.log").read_text()
            assert log.count("unreachable at start") == 1
            assert log.count("still unreachable") <= 1  # once per change, not per attempt

            forwarder = Forwarder(later_port, (host or "127.0.0.1", int(real_port)))
            deadline = time.monotonic() + 15
            while _health(gate.socket) != "SERVING":
                assert time.monotonic() < deadline, (tmp_path / "sidecar.log").read_text()
                time.sleep(0.1)
            assert gate.metric("retrieval_gate_serving") == 1
            assert search_ids(gate.search(SEARCH)) == [1, 2]
            assert gate.sidecar.poll() is None
        finally:
            gate.stop()
            if forwarder is not None:
                forwarder.stop()


@pytest.mark.postgres
def test_a_misconfigured_store_still_exits_2_at_once(tmp_path: Path) -> None:
    with fresh_database() as database:
        unknown = database.rsplit("/", 1)[0] + "/rg_no_such_database"
        for url, says in (
            (unknown, 'database "rg_no_such_database" does not exist'),
            ("postgresql://127.0.0.1:notaport/test", 'invalid integer value "notaport"'),
        ):
            started = time.monotonic()
            done = run_cli("serve", "--identity", "trusted-headers", "--store", url, timeout=30)
            assert done.returncode == 2, done.stderr
            assert time.monotonic() - started < 15
            errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
            assert len(errors) == 1 and says in errors[0], done.stderr
