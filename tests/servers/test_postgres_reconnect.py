"""Lookups after the database comes back: answered within 1 s of its return, fail closed before.

The shared PostgreSQL server is never stopped here: its outage is simulated
by a TCP forwarder between the store and the server (``cut`` resets every
connection and refuses new ones, ``restore`` listens again), or by killing
and restarting a PgBouncer in between. Lookups keep arriving during the
outage, as under traffic; each must fail (StoreUnavailable, so the gate
rejects METADATA_UNAVAILABLE) and none may wait past the query timeout.
psycopg_pool's own reconnection schedule (attempts 1, 2, 4, 8... s apart)
failed these tests by seconds; see ``RECONNECT_WINDOW_S`` in
sidecar/store/postgres.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

import pytest

from sidecar.store.postgres import DEFAULT_QUERY_TIMEOUT_S, PostgresStore
from sidecar.store.store import StoreUnavailable
from tests.fixtures.pgbouncer import running_pgbouncer, server_address
from tests.fixtures.records import chunk_record as record
from tests.fixtures.tcp_forwarder import tcp_forwarder

pytestmark = [pytest.mark.timeout(60), pytest.mark.postgres]

OUTAGE_S = 4.0  # psycopg_pool alone would try at about 0, 1, 3 and 7 s: 3 s late
BACK_WITHIN_S = 1.0


def via_port(url: str, port: int) -> str:
    """``url`` with its server at 127.0.0.1:``port``."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{userinfo}@127.0.0.1:{port}"))


async def outage_then_return(
    store: PostgresStore, go_down: Callable[[], object], come_back: Callable[[], object]
) -> float:
    """Seconds from ``come_back`` to the first answered lookup; checks the outage fails closed."""
    assert set(await store.fetch(["c-1"])) == {"c-1"}
    go_down()
    ends = time.monotonic() + OUTAGE_S
    while time.monotonic() < ends:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await store.fetch(["c-1"])
        assert time.monotonic() - started < DEFAULT_QUERY_TIMEOUT_S + 0.5
        await asyncio.sleep(0.05)
    await asyncio.to_thread(come_back)
    back = time.monotonic()
    while time.monotonic() - back < 10:
        try:
            found = await store.fetch(["c-1"])
        except StoreUnavailable:
            await asyncio.sleep(0.01)
            continue
        assert set(found) == {"c-1"}
        return time.monotonic() - back
    pytest.fail("lookups did not recover within 10 s")


def test_lookups_answer_within_a_second_of_the_server_returning(postgres_url: str) -> None:
    with tcp_forwarder(server_address(postgres_url)) as forwarder:
        store = PostgresStore(via_port(postgres_url, forwarder.port))
        store.upsert([record("c-1")])

        async def main() -> float:
            try:
                return await outage_then_return(store, forwarder.cut, forwarder.restore)
            finally:
                await store.aclose()

        assert asyncio.run(main()) < BACK_WITHIN_S


@pytest.mark.pgbouncer
def test_lookups_answer_within_a_second_of_pgbouncer_restarting(postgres_url: str) -> None:
    with running_pgbouncer() as bouncer:
        store = PostgresStore(bouncer.url(postgres_url), pgbouncer=True)
        store.upsert([record("c-1")])

        async def main() -> float:
            try:
                return await outage_then_return(store, bouncer.kill, bouncer.start)
            finally:
                await store.aclose()

        assert asyncio.run(main()) < BACK_WITHIN_S


@pytest.mark.pgbouncer
def test_lookups_through_pgbouncer_answer_within_a_second_of_postgres_returning(
    postgres_url: str,
) -> None:
    # PostgreSQL goes away behind PgBouncer, which stays up. PgBouncer pauses
    # server_login_retry after a failed server login (15 s by default): the
    # documented setting (docs/postgresql.md) is what this test runs with.
    with (
        tcp_forwarder(server_address(postgres_url)) as forwarder,
        running_pgbouncer(
            server=("127.0.0.1", forwarder.port), server_login_retry_s=0.25
        ) as bouncer,
    ):
        store = PostgresStore(bouncer.url(postgres_url), pgbouncer=True)
        store.upsert([record("c-1")])

        async def main() -> float:
            try:
                return await outage_then_return(store, forwarder.cut, forwarder.restore)
            finally:
                await store.aclose()

        assert asyncio.run(main()) < BACK_WITHIN_S
