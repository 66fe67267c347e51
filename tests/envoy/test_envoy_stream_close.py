"""Through a real Envoy: every ext_proc stream to the sidecar ends cleanly, never reset.

Envoy without the runtime value ``ext_proc_graceful_grpc_close`` resets each
stream right after half-closing it. A reset that overtakes the sidecar's final
status makes grpcio's asyncio server leak the status batch's op array
(grpc/grpc#43360): the sidecar's memory climbed by about 35 bytes a request in
the soak (docs/reliability.md). The generated bootstrap carries that value;
Envoy's own counter of streams it reset shows it working, and a stack without
it shows that the counter sees the resets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.demo.upstream import CannedResponse
from sidecar.runtime.bootstrap import SIDECAR_CLUSTER
from tests.fixtures import qdrant_bodies as qb
from tests.fixtures.harness import GateStack, http
from tests.fixtures.records import record_dict, text_for

pytestmark = pytest.mark.envoy

SEARCH = "/collections/docs/points/search"
FAILING_SEARCH = "/collections/broken/points/search"
EXISTS = "/collections/docs/exists"
CALLER = {"x-gate-tenant": "acme", "x-gate-principals": "group:qa"}
JSON = {"content-type": "application/json"}
QUERY = b'{"vector":[0.1,0.2],"limit":3}'
ROUNDS = 25

# One request for each way a stream ends, with the status the client gets.
SHAPES: dict[str, tuple[str, str, dict[str, str], int]] = {
    # Ends after the filtered response body.
    "filtered search": ("POST", SEARCH, CALLER, 200),
    # Ends at the request headers with an immediate answer.
    "refused caller": ("POST", SEARCH, {}, 401),
    # Ends at the request headers: a route whose answer the gate does not read.
    "unfiltered route": ("GET", EXISTS, CALLER, 200),
    # Ends after the upstream's error body, answered with the gate's own.
    "upstream error": ("POST", FAILING_SEARCH, CALLER, 500),
}


def _started(tmp_path: Path, edit_bootstrap: Callable[[dict[str, Any]], None] | None) -> GateStack:
    stack = GateStack(tmp_path, [record_dict("1")], edit_bootstrap=edit_bootstrap).start()
    hits = qb.search_body([qb.point(1, text_for("1")), qb.point(2, "no record")])
    stack.upstream.respond("POST", SEARCH, CannedResponse(qb.encode(hits)))
    exists = b'{"result":{"exists":true},"status":"ok","time":0.0001}'
    stack.upstream.respond("GET", EXISTS, CannedResponse(exists))
    stack.upstream.respond("POST", FAILING_SEARCH, CannedResponse(b'{"status":"down"}', 500))
    return stack


def _run_every_shape(stack: GateStack) -> int:
    """Send each shape ``ROUNDS`` times, checking its status; the number of requests."""
    for _ in range(ROUNDS):
        for name, (method, path, caller, status) in SHAPES.items():
            body = QUERY if method == "POST" else None
            got = http(method, stack.url + path, body, {**JSON, **caller})
            assert got.status == status, name
    return ROUNDS * len(SHAPES)


def _sidecar_streams(stack: GateStack, counter: str) -> int:
    return stack.envoy_stat(f"cluster.{SIDECAR_CLUSTER}.{counter}")


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[GateStack]:
    gate = _started(tmp_path, None)
    yield gate
    gate.stop()


def test_envoy_resets_no_stream_to_the_sidecar(stack: GateStack) -> None:
    sent = _run_every_shape(stack)
    assert _sidecar_streams(stack, "upstream_rq_completed") == sent
    assert _sidecar_streams(stack, "upstream_rq_tx_reset") == 0


def test_without_graceful_close_envoy_resets_the_streams(tmp_path: Path) -> None:
    def without_runtime(bootstrap: dict[str, Any]) -> None:
        del bootstrap["layered_runtime"]

    stack = _started(tmp_path, without_runtime)
    try:
        sent = _run_every_shape(stack)
        assert _sidecar_streams(stack, "upstream_rq_tx_reset") > sent // 2
    finally:
        stack.stop()
