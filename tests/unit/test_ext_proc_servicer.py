"""The ext_proc servicer spoken to directly over gRPC, for what Envoy rarely sends.

Envoy-driven behaviour is covered in test_envoy_qdrant.py; these cases feed
the stream messages a misconfigured Envoy (or a bug) could produce and check
that every one of them ends in an error answer, never in "continue".
"""

from __future__ import annotations

import asyncio
import gzip
import threading
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import brotli
import grpc
import orjson
import pytest
import zstandard
from google.protobuf import struct_pb2

from sidecar.config import IdentityMode, RouteOptions
from sidecar.core.hits import Route
from sidecar.core.modes import Mode
from sidecar.envoy.ext_proc import ExternalProcessorServicer
from sidecar.request.request_path import IDENTITY_NAMESPACE
from sidecar.runtime.server import Sidecar
from sidecar.store.loader import parse_record
from sidecar.wire import ext_proc_pb2 as ext_proc
from sidecar.wire import ext_proc_pb2_grpc as ext_proc_grpc
from tests.fixtures import qdrant_bodies as qb
from tests.fixtures.ext_proc_stream import (
    SEARCH,
    audit_records,
    client_headers,
    headers,
    request_body,
    request_headers,
    response_body,
    response_headers,
    run_open_stream,
    run_stream,
    sidecar,
)
from tests.fixtures.records import record_dict, text_for
from tests.fixtures.settings import settings_of, with_values
from tests.fixtures.stores import new_sqlite_url

__all__ = ["sidecar"]  # the fixture

BODY = qb.encode(qb.search_body([qb.point(1, text_for("1")), qb.point(3, "unknown chunk")]))


def test_filtered_body_replaces_content_length_and_adds_decision_headers(
    sidecar: Sidecar,
) -> None:
    answers = run_stream(
        sidecar, [request_headers(SEARCH), response_headers(), response_body(BODY)]
    )
    assert answers[0].request_headers.response.header_mutation.remove_headers == ["accept-encoding"]
    assert not answers[1].HasField("mode_override")
    common = answers[2].response_body.response
    new_body = common.body_mutation.body
    assert [h["id"] for h in orjson.loads(new_body)["result"]] == [1]
    set_headers = {
        o.header.key: o.header.raw_value.decode() for o in common.header_mutation.set_headers
    }
    assert set_headers["content-length"] == str(len(new_body))
    assert set_headers["x-retrieval-gate-admitted"] == "1"
    assert "x-retrieval-gate-rejected" not in set_headers


def test_the_stream_admits_the_caller_itself_without_ext_authz(sidecar: Sidecar) -> None:
    answers = run_stream(sidecar, [client_headers(SEARCH), response_headers(), response_body(BODY)])
    removed = answers[0].request_headers.response.header_mutation.remove_headers
    assert sorted(removed) == ["accept-encoding", "x-gate-principals", "x-gate-tenant"]
    new_body = answers[2].response_body.response.body_mutation.body
    assert [h["id"] for h in orjson.loads(new_body)["result"]] == [1]


def test_a_request_without_identity_is_refused_before_the_upstream(sidecar: Sidecar) -> None:
    (answer,) = run_stream(sidecar, [request_headers(SEARCH, identity=False)])
    assert answer.immediate_response.status.code == 401
    assert orjson.loads(answer.immediate_response.body) == {"error": "identity_missing"}


def test_the_request_policy_refuses_writes_before_the_upstream(sidecar: Sidecar) -> None:
    (answer,) = run_stream(sidecar, [client_headers("/collections/docs/points/delete")])
    assert answer.immediate_response.status.code == 403
    assert orjson.loads(answer.immediate_response.body) == {
        "error": "forbidden",
        "reasons": ["ROUTE_FORBIDDEN"],
    }


def test_a_non_canonical_path_is_400_even_with_a_caller_from_ext_authz(sidecar: Sidecar) -> None:
    (answer,) = run_stream(sidecar, [request_headers("/collections/docs/points/%73earch")])
    assert answer.immediate_response.status.code == 400


def test_unreadable_ext_authz_metadata_is_401(sidecar: Sidecar) -> None:
    message = request_headers(SEARCH, identity=False)
    metadata = struct_pb2.Struct()
    metadata.update({"tenant": 7})
    message.metadata_context.filter_metadata[IDENTITY_NAMESPACE].CopyFrom(metadata)
    (answer,) = run_stream(sidecar, [message])
    assert answer.immediate_response.status.code == 401


def test_a_route_the_gate_does_not_filter_ends_the_stream_at_the_request_headers(
    sidecar: Sidecar,
) -> None:
    (answer,) = run_stream(sidecar, [client_headers("/collections/docs/exists", method="GET")])
    mode = answer.mode_override
    assert mode.response_header_mode == mode.SKIP
    assert mode.response_body_mode == mode.NONE
    assert mode.request_body_mode == mode.NONE
    removed = answer.request_headers.response.header_mutation.remove_headers
    assert sorted(removed) == ["x-gate-principals", "x-gate-tenant"]  # accept-encoding stays


# The servicer ends each stream itself once Envoy will send nothing more: a
# stream Envoy cancels instead leaks native memory in grpcio's asyncio server
# (grpc/grpc#43360; found by the soak, bench/soak.py). Never earlier: Envoy
# goes on without the sidecar after the stream ends.


def test_the_stream_ends_ok_after_the_filtered_body(sidecar: Sidecar) -> None:
    answers, status = run_open_stream(
        sidecar, [request_headers(SEARCH), response_headers(), response_body(BODY)]
    )
    assert status is grpc.StatusCode.OK
    assert [a.WhichOneof("response") for a in answers] == [
        "request_headers",
        "response_headers",
        "response_body",
    ]


@pytest.mark.parametrize(
    "message",
    [
        client_headers("/collections/docs/exists", method="GET"),  # not read: _NOTHING_MORE
        client_headers("/collections/docs/points/delete"),  # refused
    ],
    ids=["not-read", "refused"],
)
def test_the_stream_ends_ok_after_an_answer_that_ends_the_exchange(
    sidecar: Sidecar, message: ext_proc.ProcessingRequest
) -> None:
    answers, status = run_open_stream(sidecar, [message])
    assert (len(answers), status) == (1, grpc.StatusCode.OK)


def test_the_stream_stays_open_while_a_body_is_still_to_come(sidecar: Sidecar) -> None:
    answers, status = run_open_stream(
        sidecar, [request_headers(SEARCH), response_headers()], wait_s=0.5
    )
    assert (len(answers), status) == (2, None)


def responses_counted(sidecar: Sidecar, outcome: str) -> float:
    labels = {"outcome": outcome, "format": "qdrant", "collection": "other"}
    value = sidecar.metrics.registry.get_sample_value("retrieval_gate_responses_total", labels)
    return value or 0.0


# An upstream error that quotes a document, as an Elasticsearch script error can.
QUOTING_ERROR = b'{"status":{"error":"script failed near \'Text of chunk 2\'"},"time":0.1}'


def test_an_upstream_error_is_read_and_answered_with_the_gates_body(sidecar: Sidecar) -> None:
    answers = run_stream(
        sidecar,
        [
            request_headers(SEARCH),
            response_headers("503", content_type="application/json", retry_after="5"),
            response_body(QUOTING_ERROR),
        ],
    )
    # The body is wanted (buffered): no mode override skips it.
    assert not answers[1].HasField("mode_override")
    assert not answers[1].HasField("immediate_response")
    answer = answers[2].immediate_response
    (record,) = audit_records(sidecar)
    assert answer.status.code == 503
    assert orjson.loads(answer.body) == {
        "error": "upstream_error",
        "decision_id": record["decision_id"],
    }
    sent = {o.header.key: o.header.raw_value.decode() for o in answer.headers.set_headers}
    assert sent == {
        "content-type": "application/json",
        "x-retrieval-gate-decision-id": record["decision_id"],
        "x-retrieval-gate-admitted": "0",
    }
    assert record["outcome"] == "error"
    assert record["error"] == "upstream_error"
    assert record["upstream_status"] == 503
    assert record["upstream_text"] == QUOTING_ERROR.decode()
    assert "candidates" not in record and "released" not in record
    assert responses_counted(sidecar, "upstream_error") == 1
    assert responses_counted(sidecar, "passthrough") == 0


def test_an_upstream_error_without_a_body_is_answered_at_its_headers(sidecar: Sidecar) -> None:
    answers = run_stream(
        sidecar, [request_headers(SEARCH), response_headers("302", end=True, location="/elsewhere")]
    )
    answer = answers[1].immediate_response
    assert answer.status.code == 302
    assert orjson.loads(answer.body)["error"] == "upstream_error"
    assert "location" not in {o.header.key for o in answer.headers.set_headers}
    (record,) = audit_records(sidecar)
    assert (record["upstream_status"], record["upstream_text"]) == (302, "")


def test_an_interim_status_as_the_final_answer_becomes_502(sidecar: Sidecar) -> None:
    answers = run_stream(sidecar, [request_headers(SEARCH), response_headers("101", end=True)])
    assert answers[1].immediate_response.status.code == 502
    assert audit_records(sidecar)[0]["upstream_status"] == 101


def test_a_compressed_upstream_error_is_decoded_for_the_audit_record(sidecar: Sidecar) -> None:
    run_stream(
        sidecar,
        [
            request_headers(SEARCH),
            response_headers("500", content_encoding="gzip"),
            response_body(gzip.compress(QUOTING_ERROR)),
        ],
    )
    assert audit_records(sidecar)[0]["upstream_text"] == QUOTING_ERROR.decode()


def routed_sidecar(tmp_path: Path, **routes: RouteOptions) -> Sidecar:
    """A sidecar whose ``routes`` are keyed by collection name."""
    settings = with_values(
        settings_of(identity=IdentityMode.TRUSTED_HEADERS),
        store=new_sqlite_url(tmp_path / "gate.db"),
        audit_log=tmp_path / "audit.jsonl",
        routes={f"/collections/{name}": options for name, options in routes.items()},
    )
    return Sidecar.from_settings(settings)


def test_a_route_that_passes_upstream_errors_never_reads_them(tmp_path: Path) -> None:
    sidecar = routed_sidecar(tmp_path, docs=RouteOptions(pass_upstream_errors=True))
    answers = run_stream(sidecar, [request_headers(SEARCH), response_headers("503")])
    assert answers[1].mode_override.response_body_mode == answers[1].mode_override.NONE
    assert not answers[1].HasField("immediate_response")
    assert not answers[1].response_headers.response.HasField("header_mutation")
    assert responses_counted(sidecar, "passthrough") == 1
    assert audit_records(sidecar) == []


def test_audit_mode_passes_an_upstream_error_unchanged_and_records_it(tmp_path: Path) -> None:
    sidecar = routed_sidecar(tmp_path, docs=RouteOptions(mode=Mode.AUDIT))
    answers = run_stream(
        sidecar,
        [request_headers(SEARCH), response_headers("500", etag="x"), response_body(QUOTING_ERROR)],
    )
    assert not answers[1].response_headers.response.HasField("header_mutation")
    assert answers[2].response_body == ext_proc.BodyResponse()  # the body goes on unchanged
    (record,) = audit_records(sidecar)
    assert record["outcome"] == "passthrough"
    assert record["upstream_text"] == QUOTING_ERROR.decode()
    assert responses_counted(sidecar, "passthrough") == 1


def test_an_upstream_error_that_cannot_be_recorded_is_500(tmp_path: Path) -> None:
    settings = with_values(
        settings_of(identity=IdentityMode.TRUSTED_HEADERS),
        store=new_sqlite_url(tmp_path / "gate.db"),
        audit_log=Path("/dev/full"),
    )
    answers = run_stream(
        Sidecar.from_settings(settings),
        [request_headers(SEARCH), response_headers("500"), response_body(QUOTING_ERROR)],
    )
    assert answers[2].immediate_response.status.code == 500
    assert orjson.loads(answers[2].immediate_response.body) == {"error": "audit_unavailable"}


def removed_headers(answer: ext_proc.ProcessingResponse) -> set[str]:
    return set(answer.response_headers.response.header_mutation.remove_headers)


UPSTREAM_HEADERS = {
    "content_type": "application/json",
    "date": "Mon, 01 Jun 2026 12:00:00 GMT",
    "x_elastic_product": "Elasticsearch",
    "content_length": str(len(BODY)),
    "etag": '"v1"',
    "server": "qdrant",
    "x_total_hits": "2",
    "x_retrieval_gate_admitted": "9",
}


def with_upstream_headers(status: str = "200", *, end: bool = False) -> ext_proc.ProcessingRequest:
    """Response headers carrying ``UPSTREAM_HEADERS``."""
    return ext_proc.ProcessingRequest(
        response_headers=ext_proc.HttpHeaders(
            headers=headers(colon_status=status, **UPSTREAM_HEADERS), end_of_stream=end
        )
    )


def test_only_allowlisted_upstream_headers_reach_the_client(sidecar: Sidecar) -> None:
    answers = run_stream(
        sidecar,
        [request_headers(SEARCH), with_upstream_headers(), response_body(BODY)],
    )
    assert removed_headers(answers[1]) == {
        "etag",
        "server",
        "x-total-hits",
        "x-retrieval-gate-admitted",  # the gate sets its own
    }
    # An answer without a body has no hits to filter, but its headers are.
    answers = run_stream(sidecar, [request_headers(SEARCH), with_upstream_headers("204", end=True)])
    assert answers[1].mode_override.response_body_mode == answers[1].mode_override.NONE
    assert "etag" in removed_headers(answers[1])


def test_audit_mode_leaves_upstream_headers_alone(tmp_path: Path) -> None:
    sidecar = routed_sidecar(tmp_path, docs=RouteOptions(mode=Mode.AUDIT))
    answers = run_stream(
        sidecar,
        [request_headers(SEARCH), with_upstream_headers(), response_body(BODY)],
    )
    assert removed_headers(answers[1]) == set()


def test_body_in_parts_is_an_error_not_a_pass(sidecar: Sidecar) -> None:
    answers = run_stream(
        sidecar,
        [request_headers(SEARCH), response_headers(), response_body(BODY[:10], end=False)],
    )
    assert answers[2].immediate_response.status.code == 500


@pytest.mark.parametrize(
    ("coding", "encode"),
    [
        ("gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("br", brotli.compress),
        ("zstd", zstandard.ZstdCompressor().compress),
    ],
)
def test_compressed_search_response_is_decoded_filtered_and_sent_uncompressed(
    sidecar: Sidecar, coding: str, encode: Callable[[bytes], bytes]
) -> None:
    answers = run_stream(
        sidecar,
        [
            request_headers(SEARCH),
            response_headers(content_encoding=coding),
            response_body(encode(BODY)),
        ],
    )
    common = answers[2].response_body.response
    assert [h["id"] for h in orjson.loads(common.body_mutation.body)["result"]] == [1]
    assert list(common.header_mutation.remove_headers) == ["content-encoding"]


def test_unknown_content_coding_is_502(sidecar: Sidecar) -> None:
    answers = run_stream(
        sidecar, [request_headers(SEARCH), response_headers(content_encoding="compress")]
    )
    assert answers[1].immediate_response.status.code == 502


def test_corrupt_compressed_body_is_502(sidecar: Sidecar) -> None:
    answers = run_stream(
        sidecar,
        [request_headers(SEARCH), response_headers(content_encoding="gzip"), response_body(BODY)],
    )
    assert answers[2].immediate_response.status.code == 502
    assert b"unknown chunk" not in answers[2].immediate_response.body


def test_compressed_body_over_the_limit_once_decoded_is_502(tmp_path: Path) -> None:
    settings = with_values(
        settings_of(identity=IdentityMode.TRUSTED_HEADERS),
        store=new_sqlite_url(tmp_path / "gate.db"),
        max_body_bytes=len(BODY) - 1,
    )
    answers = run_stream(
        Sidecar.from_settings(settings),
        [
            request_headers(SEARCH),
            response_headers(content_encoding="gzip"),
            response_body(gzip.compress(BODY)),
        ],
    )
    assert answers[2].immediate_response.status.code == 502


def test_unexpected_failure_answers_500(sidecar: Sidecar, monkeypatch: pytest.MonkeyPatch) -> None:
    fmt = sidecar.response_filter.format_for(Route("POST", SEARCH))
    assert fmt is not None

    def bug(body: bytes, route: Route, echo: object = None) -> object:
        raise RuntimeError("bug")

    # The format the request path planned with is the one that parses the body.
    monkeypatch.setattr(fmt, "parse", bug)
    answers = run_stream(
        sidecar, [request_headers(SEARCH), response_headers(), response_body(BODY)]
    )
    assert len(answers) == 3  # the request and the response headers were answered as usual
    assert answers[-1].immediate_response.status.code == 500
    assert answers[-1].immediate_response.body == b'{"error":"gate_internal_error"}'


@pytest.fixture
def pushing_sidecar(tmp_path: Path) -> Sidecar:
    settings = with_values(
        settings_of(identity=IdentityMode.TRUSTED_HEADERS),
        store=new_sqlite_url(tmp_path / "gate.db"),
        tenant_key="tenant_id",
        overfetch_factor=2.0,
    )
    built = Sidecar.from_settings(settings)
    built.store.upsert([parse_record(record_dict("1"))])
    return built


def test_search_request_body_gets_the_tenant_filter(pushing_sidecar: Sidecar) -> None:
    answers = run_stream(
        pushing_sidecar,
        [request_headers(SEARCH), request_body(b'{"vector":[0.1],"limit":3}')],
    )
    assert answers[0].mode_override.request_body_mode == answers[0].mode_override.BUFFERED
    assert answers[0].mode_override.response_body_mode == answers[0].mode_override.BUFFERED
    common = answers[1].request_body.response
    sent = orjson.loads(common.body_mutation.body)
    assert sent["filter"] == {"must": [{"key": "tenant_id", "match": {"value": "acme"}}]}
    assert sent["limit"] == 6
    lengths = [o.header.raw_value for o in common.header_mutation.set_headers]
    assert lengths == [str(len(common.body_mutation.body)).encode()]


def test_malformed_search_request_is_400(pushing_sidecar: Sidecar) -> None:
    answers = run_stream(pushing_sidecar, [request_headers(SEARCH), request_body(b"{nope")])
    assert answers[1].immediate_response.status.code == 400


def test_request_body_in_parts_is_an_error(pushing_sidecar: Sidecar) -> None:
    answers = run_stream(
        pushing_sidecar, [request_headers(SEARCH), request_body(b'{"limit":', end=False)]
    )
    assert answers[1].immediate_response.status.code == 500


def test_response_that_does_not_match_the_rewritten_batch_is_502(
    pushing_sidecar: Sidecar,
) -> None:
    batch = "/collections/docs/points/search/batch"
    two_searches = b'{"searches":[{"vector":[0.1],"limit":2},{"vector":[0.2],"limit":2}]}'
    one_result = qb.encode(qb.batch_body([[qb.point(1, text_for("1"))]]))
    answers = run_stream(
        pushing_sidecar,
        [
            request_headers(batch),
            request_body(two_searches),
            response_headers(),
            response_body(one_result),
        ],
    )
    assert answers[-1].immediate_response.status.code == 502


def test_an_upstream_answer_on_a_stream_without_request_headers_is_refused(
    sidecar: Sidecar,
) -> None:
    # request_header_mode SKIP would mean a request nobody admitted.
    (answer,) = run_stream(sidecar, [response_headers()])
    assert answer.immediate_response.status.code == 500
    assert orjson.loads(answer.immediate_response.body) == {"error": "gate_misconfigured"}
    (answer,) = run_stream(sidecar, [response_body(BODY)])
    assert answer.immediate_response.status.code == 500


def test_an_envoy_local_reply_without_request_headers_passes(sidecar: Sidecar) -> None:
    # An earlier filter's refusal (e.g. a mesh's ext_authz 401) reaches only
    # the response side of the stream.
    (answer,) = run_stream(sidecar, [response_headers("401")])
    assert not answer.HasField("immediate_response")
    assert answer.mode_override.response_body_mode == answer.mode_override.NONE


def test_a_large_body_is_parsed_off_the_event_loop_while_small_ones_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Near the issue's case (~95,000 distinct ids): other streams go on meanwhile.

    The large body's parse is held until the small exchanges are done. Were it
    parsed on the event loop, the hold would stall every stream, the small
    ones could only finish after it, and the large one would be done first.
    """
    settings = with_values(
        settings_of(identity=IdentityMode.TRUSTED_HEADERS),
        store=new_sqlite_url(tmp_path / "gate.db"),
        audit_log=tmp_path / "audit.jsonl",
        max_hits=100_000,
        max_body_bytes=32 * 1024 * 1024,
    )
    sidecar = Sidecar.from_settings(settings)
    sidecar.store.upsert([parse_record(record_dict("1")), parse_record(record_dict("2"))])
    large = qb.encode(qb.search_body([qb.point(i, text_for(str(i))) for i in range(1, 95_001)]))
    fmt = sidecar.response_filter.format_for(Route("POST", SEARCH))
    assert fmt is not None
    parse = fmt.parse
    parsing, resume = threading.Event(), threading.Event()
    resumed: list[bool] = []  # False: the hold timed out, nothing resumed it

    def held(body: bytes, route: Route, echo: object = None) -> Any:
        if len(body) == len(large):
            parsing.set()
            # On the event loop, this would block every stream until the timeout.
            resumed.append(resume.wait(timeout=10))
        return parse(body, route, echo)

    monkeypatch.setattr(fmt, "parse", held)

    async def go() -> tuple[bool, list[bytes], bytes]:
        limit = settings.listen.grpc_max_message_bytes
        options = [("grpc.max_receive_message_length", limit)]
        server = grpc.aio.server(options=options)
        ext_proc_grpc.add_ExternalProcessorServicer_to_server(
            ExternalProcessorServicer(
                sidecar.request_path,
                sidecar.response_filter,
                max_body_bytes=settings.listen.max_body_bytes,
            ),
            server,
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = ext_proc_grpc.ExternalProcessorStub(channel)

                async def exchange(body: bytes) -> bytes:
                    messages = [request_headers(SEARCH), response_headers(), response_body(body)]
                    answers = [answer async for answer in stub.Process(iter(messages))]
                    return bytes(answers[-1].response_body.response.body_mutation.body)

                pending = asyncio.create_task(exchange(large))
                assert await asyncio.to_thread(parsing.wait, 10)
                small = [await exchange(BODY) for _ in range(3)]
                large_was_done = pending.done()
                resume.set()
                return large_was_done, small, await pending
        finally:
            await server.stop(0)

    large_was_done, small, filtered = asyncio.run(go())
    assert resumed == [True]  # the small exchanges ran to their end during the hold
    assert not large_was_done
    assert [[hit["id"] for hit in orjson.loads(body)["result"]] for body in small] == [[1]] * 3
    assert [hit["id"] for hit in orjson.loads(filtered)["result"]] == [1, 2]
    decided = [record["candidates"] for record in audit_records(sidecar)]
    assert [len(candidates) for candidates in decided] == [2, 2, 2, 95_000]


# -- what the request path refuses before the database is asked ------------------


def test_a_search_without_a_body_on_a_push_down_route_is_refused(sidecar: Sidecar) -> None:
    # Envoy cannot add a body to GET /docs/_search, which would search every tenant.
    message = request_headers("/docs/_search", method="GET")
    message.request_headers.end_of_stream = True
    (answer,) = run_stream(sidecar, [message])
    assert answer.immediate_response.status.code == 400
    assert orjson.loads(answer.immediate_response.body) == {"error": "request_not_filterable"}


def test_url_parameters_that_replace_the_query_are_refused(sidecar: Sidecar) -> None:
    (answer,) = run_stream(sidecar, [request_headers("/docs/_search?q=merger")])
    assert answer.immediate_response.status.code == 400
    assert b"merger" not in answer.immediate_response.body


def test_a_collection_the_body_names_passes_the_ownership_check(tmp_path: Path) -> None:
    data = tmp_path / "data.json"
    data.write_text('{"retrieval_gate": {"collections": {"finance": {"tenants": ["globex"]}}}}')
    settings = with_values(
        settings_of(identity=IdentityMode.TRUSTED_HEADERS),
        store=new_sqlite_url(tmp_path / "gate.db"),
        policy_data=data,
    )
    built = Sidecar.from_settings(settings)
    lookup = b'{"positive":[[0.1]],"limit":3,"lookup_from":{"collection":"finance"}}'
    answers = run_stream(
        built,
        [client_headers("/collections/docs/points/recommend"), request_body(lookup)],
    )
    assert answers[1].immediate_response.status.code == 403
    assert orjson.loads(answers[1].immediate_response.body)["reasons"] == ["COLLECTION_FORBIDDEN"]


def test_a_tenant_key_the_format_cannot_use_is_a_configuration_error(tmp_path: Path) -> None:
    settings = with_values(
        settings_of(identity=IdentityMode.TRUSTED_HEADERS),
        store=new_sqlite_url(tmp_path / "gate.db"),
        tenant_key="not a field",
    )
    built = Sidecar.from_settings(settings)
    search = b'{"collectionName":"docs","data":[[0.1]],"limit":3}'
    answers = run_stream(
        built, [request_headers("/v2/vectordb/entities/search"), request_body(search)]
    )
    assert answers[1].immediate_response.status.code == 500
    assert orjson.loads(answers[1].immediate_response.body) == {"error": "gate_misconfigured"}


def refusals_counted(sidecar: Sidecar, status: str) -> float:
    value = sidecar.metrics.registry.get_sample_value(
        "retrieval_gate_request_refusals_total", {"status": status}
    )
    return value or 0.0


def test_requests_refused_before_the_database_are_counted_by_status(sidecar: Sidecar) -> None:
    before = {status: refusals_counted(sidecar, status) for status in ("400", "401", "403")}
    run_stream(sidecar, [request_headers(SEARCH, identity=False)])  # no identity
    run_stream(sidecar, [client_headers("/collections/docs/points/delete")])  # a write
    run_stream(sidecar, [request_headers("/docs/_search?q=merger")])  # unfilterable
    run_stream(sidecar, [client_headers(SEARCH), request_body(b"{nope")])  # unreadable body
    after = {status: refusals_counted(sidecar, status) for status in before}
    assert {s: after[s] - before[s] for s in before} == {"400": 2, "401": 1, "403": 1}
    # A search that reaches the database is no refusal.
    run_stream(sidecar, [client_headers(SEARCH), request_body(b'{"vector":[0.1],"limit":3}')])
    assert refusals_counted(sidecar, "400") == after["400"]


def test_a_request_body_the_plan_did_not_ask_for_passes_unread(sidecar: Sidecar) -> None:
    # Collection info is filtered, but carries no query: the plan reads no request body.
    info = "/collections/docs"
    body_in_parts = ext_proc.ProcessingRequest(
        request_body=ext_proc.HttpBody(body=b'{"partial": ', end_of_stream=False)
    )
    answers = run_stream(sidecar, [request_headers(info, method="GET"), body_in_parts])
    assert not answers[0].HasField("mode_override")  # the filter's own mode: no body asked
    assert answers[1] == ext_proc.ProcessingResponse(request_body=ext_proc.BodyResponse())
