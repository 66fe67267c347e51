"""A metadata store that cannot be reached at start: retried and refused meanwhile, not fatal.

What is an outage (retried) and what a misconfiguration (exit 2), the store
that answers StoreUnavailable until it is opened, the servicers' refusal while
the gate is not ready, and the server's NOT_SERVING state. Through a real
Envoy and a store that appears later: tests/envoy/test_lifecycle.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import orjson
import psycopg
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sidecar.config import ConfigError, IdentityMode
from sidecar.config.groups import StoreSettings
from sidecar.envoy.ext_authz import AuthorizationServicer
from sidecar.envoy.ext_proc import ExternalProcessorServicer
from sidecar.runtime import server as server_module
from sidecar.runtime.envoy_drain import active_requests
from sidecar.runtime.ports import free_port
from sidecar.runtime.server import Sidecar, SidecarServer, open_store_at_start
from sidecar.store.open import PendingStore, is_outage
from sidecar.store.store import SchemaMismatch, StoreUnavailable
from sidecar.wire import ext_authz_pb2 as authz
from sidecar.wire import ext_proc_pb2 as ext_proc
from tests.fixtures.ext_proc_stream import SEARCH, request_headers
from tests.fixtures.settings import settings_of, with_values
from tests.fixtures.stores import new_sqlite_url

REFUSED = 'connection failed: connection to server at "127.0.0.1", port 5999 failed: ' + (
    "Connection refused\n\tIs the server running on that host and accepting TCP/IP connections?"
)


def failure(driver_message: str) -> StoreUnavailable:
    """A StoreUnavailable as PostgresStore raises it: from a driver error, context kept."""
    try:
        try:
            raise psycopg.OperationalError(driver_message)
        except psycopg.OperationalError:
            raise StoreUnavailable("cannot connect to PostgreSQL metadata store") from None
    except StoreUnavailable as exc:
        return exc


@pytest.mark.parametrize(
    "message",
    [
        REFUSED,
        'connection failed: connection to server at "10.0.0.9", port 5432 failed: timeout expired',
        "failed to resolve host 'pg.db.svc': [Errno -3] Temporary failure in name resolution",
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: '
        "FATAL:  the database system is starting up",
        "FATAL:  sorry, too many clients already",
        'connection is bad: connection to server on socket "/run/pg/.s.PGSQL.5432" failed: '
        "No such file or directory",
    ],
)
def test_an_unreachable_server_is_an_outage(message: str) -> None:
    assert is_outage(failure(message))


@pytest.mark.parametrize(
    "message",
    [
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: '
        'FATAL:  password authentication failed for user "gate"',
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: '
        'FATAL:  database "gate" does not exist',
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: '
        'FATAL:  role "gate" does not exist',
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: '
        'FATAL:  no pg_hba.conf entry for host "10.1.2.3", user "gate", database "gate"',
        'connection is bad: invalid integer value "x" for connection option "port"',
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: '
        "server does not support SSL, but SSL was required",
    ],
)
def test_what_waiting_does_not_change_is_a_misconfiguration(message: str) -> None:
    assert not is_outage(failure(message))


def test_a_schema_at_another_version_and_other_errors_are_not_outages() -> None:
    assert not is_outage(SchemaMismatch("has no retrieval-gate schema"))
    assert not is_outage(StoreUnavailable("closed"))


def test_open_store_at_start_defers_an_outage_and_raises_a_misconfiguration() -> None:
    url = f"postgresql://127.0.0.1:{free_port()}/gate"
    pending = open_store_at_start(StoreSettings(url=url))
    assert isinstance(pending, PendingStore) and not pending.opened
    assert "\n" not in pending.reason and "Connection refused" in pending.reason
    with pytest.raises(ValueError):
        open_store_at_start(
            StoreSettings(url="postgresql://127.0.0.1:5432/gate?sslmode=bogus&x=%zz")
        )


def test_a_pending_store_is_unavailable_until_attached(tmp_path: Path) -> None:
    pending = PendingStore("postgresql://127.0.0.1:1/gate", "Connection refused")
    with pytest.raises(StoreUnavailable, match="not reached yet: Connection refused"):
        asyncio.run(pending.fetch(["1"]))
    with pytest.raises(StoreUnavailable):
        pending.get("1")

    class Found:
        async def fetch(self, chunk_ids: Any) -> dict[str, Any]:
            return {"1": "record"}

    pending.attach(Found())  # type: ignore[arg-type]
    assert pending.opened
    found: Any = asyncio.run(pending.fetch(["1"]))
    assert found == {"1": "record"}


class _Context:
    """What the servicers use of a gRPC context: nothing."""


async def _messages(*messages: ext_proc.ProcessingRequest) -> AsyncIterator[Any]:
    for message in messages:
        yield message


def _sidecar(tmp_path: Path) -> Sidecar:
    settings = with_values(
        settings_of(identity=IdentityMode.TRUSTED_HEADERS),
        store=new_sqlite_url(tmp_path / "gate.db"),
    )
    return Sidecar.from_settings(settings)


def test_ext_proc_refuses_every_stream_while_not_ready(tmp_path: Path) -> None:
    sidecar = _sidecar(tmp_path)
    ready = False
    servicer = ExternalProcessorServicer(
        sidecar.request_path, sidecar.response_filter, max_body_bytes=1 << 20, ready=lambda: ready
    )

    async def first_answer() -> ext_proc.ProcessingResponse:
        stream = servicer.Process(_messages(request_headers(SEARCH)), _Context())
        answers = [answer async for answer in stream]
        return answers[0]

    answer = asyncio.run(first_answer())
    assert answer.immediate_response.status.code == 503
    assert orjson.loads(answer.immediate_response.body) == {"error": "metadata_unavailable"}
    ready = True
    assert not asyncio.run(first_answer()).HasField("immediate_response")


def test_ext_authz_denies_while_not_ready(tmp_path: Path) -> None:
    sidecar = _sidecar(tmp_path)
    servicer = AuthorizationServicer(sidecar.request_path.admission, ready=lambda: False)
    request = authz.CheckRequest()
    request.attributes.request.http.method = "POST"
    request.attributes.request.http.path = SEARCH
    answer = asyncio.run(servicer.Check(request, _Context()))
    assert answer.denied_response.status.code == 503
    assert orjson.loads(answer.denied_response.body) == {"error": "metadata_unavailable"}


def test_the_server_waits_not_serving_for_a_store_down_at_start(tmp_path: Path) -> None:
    settings = with_values(
        settings_of(identity=IdentityMode.TRUSTED_HEADERS),
        store=f"postgresql://127.0.0.1:{free_port()}/gate",
        grpc_listen=f"unix:{tmp_path / 'gate.sock'}",
    )

    async def run() -> tuple[str, float, bool]:
        server = SidecarServer(Sidecar.from_settings(settings))
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"unix:{tmp_path / 'gate.sock'}") as channel:
                reply = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=3
                )
            status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            return status, server.sidecar.metrics.serving._value.get(), server.store_ready()
        finally:
            await server.stop(grace=0.1)

    assert asyncio.run(run()) == ("NOT_SERVING", 0.0, False)


def test_a_store_reached_and_then_refusing_the_login_ends_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The network came up and the password is wrong: ConfigError (exit 2), as at start.
    settings = with_values(
        settings_of(identity=IdentityMode.TRUSTED_HEADERS),
        store=f"postgresql://127.0.0.1:{free_port()}/gate",
        grpc_listen=f"unix:{tmp_path / 'gate.sock'}",
    )

    def refused_login(store: StoreSettings) -> None:
        raise failure('FATAL:  password authentication failed for user "gate"')

    async def run() -> None:
        server = SidecarServer(Sidecar.from_settings(settings))
        monkeypatch.setattr(server_module, "open_metadata_store", refused_login)
        await server.start()
        try:
            await asyncio.wait_for(server.failure(), 5)
        finally:
            await server.stop(grace=0.1)

    with pytest.raises(ConfigError, match="cannot connect to PostgreSQL"):
        asyncio.run(run())


def test_active_requests_leave_out_the_admin_endpoint() -> None:
    stats = (
        b"http.admin.downstream_rq_active: 1\n"
        b"http.retrieval_gate.downstream_rq_active: 3\n"
        b"http.envoy_ready.downstream_rq_active: 1\n"
        b"listener.admin.downstream_cx_active: 1\n"
    )
    assert active_requests(stats) == 4
    assert active_requests(b"") == 0
