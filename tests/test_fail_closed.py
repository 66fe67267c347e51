"""Fail closed through a real Envoy: no failure ever hands the client an unfiltered body."""

from __future__ import annotations

import gzip
from collections.abc import Iterator

import pytest

from sidecar.demo.upstream import CannedResponse
from tests.fixtures import qdrant_bodies as qb
from tests.fixtures.records import record_dict, text_for
from tests.harness import GateStack

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


def test_gzip_body_from_an_upstream_that_ignores_accept_encoding_is_502(
    stack: GateStack,
) -> None:
    compressed = gzip.compress(qb.encode(qb.search_body(POINTS)))
    stack.upstream.respond(
        "POST",
        SEARCH,
        CannedResponse(
            compressed,
            headers={"content-type": "application/json", "content-encoding": "gzip"},
        ),
    )
    response = stack.search(SEARCH, headers={"accept-encoding": "gzip"})
    assert response.status == 502
    assert response.json()["error"] == "upstream_body_unreadable"
    assert compressed not in response.body
