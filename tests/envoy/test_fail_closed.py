"""Fail closed through a real Envoy: no failure ever hands the client an unfiltered body."""

from __future__ import annotations

import gzip
import signal
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import brotli
import pytest
import zstandard

from sidecar.demo.upstream import CannedResponse
from tests.fixtures import qdrant_bodies as qb
from tests.fixtures.harness import GateStack, HttpResult, wait_until
from tests.fixtures.records import record_dict, text_for

pytestmark = pytest.mark.envoy

SECRET = "confidential text of a revoked chunk"
POINTS = [qb.point(1, text_for("1")), qb.point(2, SECRET)]
SEARCH = "/collections/docs/points/search"


@pytest.fixture
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateStack]:
    gate = GateStack(
        tmp_path_factory.mktemp("failclosed"),
        [record_dict("1"), record_dict("2", status="revoked")],
        max_body_bytes=64 * 1024,
    ).start()
    gate.upstream.respond("POST", SEARCH, CannedResponse(qb.encode(qb.search_body(POINTS))))
    yield gate
    gate.stop()


def _slow_search(stack: GateStack, during: Callable[[], None]) -> HttpResult:
    """A search whose upstream answers after 1 s, with ``during`` run meanwhile."""
    body = qb.encode(qb.search_body(POINTS))
    stack.upstream.respond("POST", SEARCH, CannedResponse(body, delay_seconds=1.0))
    seen = len(stack.upstream.requests)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(stack.search, SEARCH)
        # Polled, not slept: once the database has the request, it is past
        # ext_authz and ext_proc's stream is open; the DB is "working" for 1 s.
        assert wait_until(lambda: len(stack.upstream.requests) > seen, timeout=10)
        during()
        return pending.result()


def test_sidecar_killed_mid_request_gives_5xx_never_the_body(stack: GateStack) -> None:
    # ext_proc, not ext_authz, is what fails here: failure_mode_allow true would leak.
    response = _slow_search(stack, stack.kill_sidecar)
    assert 500 <= response.status < 600, response.status
    assert SECRET.encode() not in response.body
    assert b"Text of chunk" not in response.body


def test_sidecar_too_slow_gives_5xx_never_the_body(stack: GateStack) -> None:
    assert stack.sidecar is not None
    sidecar = stack.sidecar

    def freeze() -> None:
        sidecar.send_signal(signal.SIGSTOP)

    try:
        response = _slow_search(stack, freeze)  # Envoy's message_timeout (2 s) expires
    finally:
        sidecar.send_signal(signal.SIGCONT)
    assert 500 <= response.status < 600, response.status
    assert SECRET.encode() not in response.body


def test_sidecar_killed_while_envoy_runs_gives_5xx_never_the_body(stack: GateStack) -> None:
    assert stack.search(SEARCH).status == 200
    stack.kill_sidecar()
    for _ in range(3):
        response = stack.search(SEARCH)
        assert 500 <= response.status < 600
        assert SECRET.encode() not in response.body
        assert b"Text of chunk" not in response.body
    stack.start_sidecar()
    recovered = stack.search(SEARCH)
    assert recovered.status == 200
    assert [hit["id"] for hit in recovered.json()["result"]] == [1]


def test_malformed_upstream_json_on_a_search_route_is_502(stack: GateStack) -> None:
    broken = qb.encode(qb.search_body(POINTS))[:-7]
    stack.upstream.respond("POST", SEARCH, CannedResponse(broken))
    response = stack.search(SEARCH)
    assert response.status == 502
    assert response.json()["error"] == "upstream_body_malformed"
    assert SECRET.encode() not in response.body


def test_wrong_shape_on_a_search_route_is_502(stack: GateStack) -> None:
    stack.upstream.respond("POST", SEARCH, CannedResponse(b'{"result":{"oops":[]}}'))
    assert stack.search(SEARCH).status == 502


def test_body_over_the_limit_is_an_error_not_a_pass(stack: GateStack) -> None:
    padding = [qb.point(1000 + i, "x" * 1000) for i in range(100)]  # ~100 KiB > 64 KiB
    stack.upstream.respond(
        "POST", SEARCH, CannedResponse(qb.encode(qb.search_body(POINTS + padding)))
    )
    response = stack.search(SEARCH)
    assert response.status >= 500
    assert SECRET.encode() not in response.body


@pytest.mark.parametrize(
    ("coding", "encode"),
    [
        ("gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("br", brotli.compress),
        ("zstd", zstandard.ZstdCompressor().compress),
    ],
)
def test_compressed_body_from_an_upstream_that_ignores_accept_encoding_is_decoded_and_filtered(
    stack: GateStack, coding: str, encode: Callable[[bytes], bytes]
) -> None:
    stack.upstream.respond(
        "POST",
        SEARCH,
        CannedResponse(
            encode(qb.encode(qb.search_body(POINTS))),
            headers={"content-type": "application/json", "content-encoding": coding},
        ),
    )
    response = stack.search(SEARCH, headers={"accept-encoding": "gzip, deflate, br, zstd"})
    assert response.status == 200, response.body
    # The upstream was asked for no compression; the client gets the filtered body plain.
    assert stack.upstream.requests[-1].headers.get("accept-encoding") is None
    assert "content-encoding" not in response.headers
    assert [hit["id"] for hit in response.json()["result"]] == [1]
    assert SECRET.encode() not in response.body


@pytest.mark.parametrize(
    ("coding", "body"),
    [
        ("compress", b"\x1f\x9d\x90 not readable"),
        ("gzip", b"not gzip at all"),
        ("br", b"\x8b\x03\x80truncated"),
    ],
)
def test_compressed_body_the_gate_cannot_read_is_502(
    stack: GateStack, coding: str, body: bytes
) -> None:
    stack.upstream.respond(
        "POST",
        SEARCH,
        CannedResponse(
            body, headers={"content-type": "application/json", "content-encoding": coding}
        ),
    )
    response = stack.search(SEARCH, headers={"accept-encoding": "gzip"})
    assert response.status == 502
    assert response.json()["error"] == "upstream_body_unreadable"


def test_a_decompression_bomb_is_502(stack: GateStack) -> None:
    bomb = gzip.compress(b'{"result":[' + b" " * (10 * 1024 * 1024) + b'],"status":"ok"}')
    stack.upstream.respond(
        "POST",
        SEARCH,
        CannedResponse(
            bomb, headers={"content-type": "application/json", "content-encoding": "gzip"}
        ),
    )
    response = stack.search(SEARCH, headers={"accept-encoding": "gzip"})
    assert response.status == 502
    assert response.json()["error"] == "upstream_body_unreadable"


@pytest.mark.parametrize(
    "path",
    [
        "/collections/docs/points/%73earch",
        "/collections/%64ocs/points/search",
        "/collections//docs/points/search",
        "/collections/docs/points/./search",
        "/collections/docs/points/x/../search",
        "/collections/docs%2Fpoints/search",
    ],
)
def test_encoded_or_dotted_paths_never_skip_the_filter(stack: GateStack, path: str) -> None:
    response = stack.search(path)
    assert SECRET.encode() not in response.body, (path, response.status)
    if response.status == 200:
        # Envoy normalised the path to the real search route: filtered as usual.
        assert [hit["id"] for hit in response.json()["result"]] == [1]
    else:
        assert response.status == 400, (path, response.status)
