"""The ext_proc servicer on gRPC calls, spoken to directly: what Envoy sends for them.

Refusals are gRPC statuses, bodies are frames (compressed or not), trailers
are allowlisted like headers, and an upstream's own gRPC error keeps its
status but never its message. The same calls through a real Envoy and the
databases' clients are in the test_envoy_*_grpc.py modules.
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
from qdrant_client import grpc as qdrant

from sidecar.config import IdentityMode
from sidecar.formats import grpc_frames
from sidecar.runtime.server import Sidecar
from sidecar.wire import ext_proc_pb2 as ext_proc
from tests.fixtures.ext_proc_stream import (
    audit_records,
    client_headers,
    headers,
    request_headers,
    response_body,
    response_headers,
    run_open_stream,
    run_stream,
    sidecar,
)
from tests.fixtures.records import text_for
from tests.fixtures.settings import settings_of, with_values
from tests.fixtures.stores import new_sqlite_url

__all__ = ["sidecar"]  # the fixture

QUERY = "/qdrant.Points/Query"
GRPC = "application/grpc"
PERMISSION_DENIED, NOT_FOUND, UNAUTHENTICATED = 7, 5, 16


def point(number: int, text: str) -> Any:
    payload = {"text": qdrant.Value(string_value=text)}
    return qdrant.ScoredPoint(id=qdrant.PointId(num=number), score=0.5, payload=payload)


# Point 1 is a record the gate admits; point 3 has none.
REPLY = qdrant.QueryResponse(result=[point(1, text_for("1")), point(3, "unknown")], time=0.1)
BODY = grpc_frames.frame(REPLY.SerializeToString())


def released_ids(answer: ext_proc.ProcessingResponse) -> list[int]:
    (message,) = grpc_frames.messages(answer.response_body.response.body_mutation.body)
    return [found.id.num for found in qdrant.QueryResponse.FromString(message).result]


def set_header_names(common: ext_proc.CommonResponse) -> set[str]:
    return {option.header.key for option in common.header_mutation.set_headers}


def test_a_refused_call_is_a_grpc_status_not_an_http_body(sidecar: Sidecar) -> None:
    (answer,) = run_stream(sidecar, [request_headers(QUERY, identity=False, content_type=GRPC)])
    refusal = answer.immediate_response
    assert refusal.grpc_status.status == UNAUTHENTICATED
    assert "content-type" not in {o.header.key for o in refusal.headers.set_headers}
    assert orjson.loads(refusal.body) == {"error": "identity_missing"}


def test_a_grpc_answer_is_filtered_frame_by_frame_with_its_trailers(sidecar: Sidecar) -> None:
    trailers = ext_proc.ProcessingRequest(
        response_trailers=ext_proc.HttpTrailers(
            trailers=headers(grpc_status="0", grpc_message="fine", x_db_hits="2")
        )
    )
    answers = run_stream(
        sidecar,
        [
            request_headers(QUERY, content_type=GRPC),
            response_headers(grpc_encoding="identity", server="qdrant", content_type=GRPC),
            # A gRPC body is followed by trailers, so it does not end the stream.
            response_body(BODY, end=False),
            trailers,
        ],
    )
    # The gate asks for the trailers of a call it filters.
    mode = answers[0].mode_override
    assert mode.response_trailer_mode == mode.SEND
    assert mode.response_body_mode == mode.BUFFERED
    removed = set(answers[1].response_headers.response.header_mutation.remove_headers)
    assert removed == {"server"}
    assert released_ids(answers[2]) == [1]
    # Frames carry their lengths: no content-length on a gRPC answer.
    assert "content-length" not in set_header_names(answers[2].response_body.response)
    kept = answers[3].response_trailers.header_mutation
    assert set(kept.remove_headers) == {"grpc-message", "x-db-hits"}


def test_the_grpc_request_headers_asking_for_compression_are_removed(sidecar: Sidecar) -> None:
    (answer,) = run_stream(
        sidecar, [request_headers(QUERY, grpc_accept_encoding="gzip", content_type=GRPC)]
    )
    removed = answer.request_headers.response.header_mutation.remove_headers
    assert "grpc-accept-encoding" in removed


def test_a_compressed_grpc_answer_is_decoded_and_sent_uncompressed(sidecar: Sidecar) -> None:
    squeezed = gzip.compress(REPLY.SerializeToString())
    body = struct.pack(">BI", 1, len(squeezed)) + squeezed
    answers = run_stream(
        sidecar,
        [
            request_headers(QUERY, content_type=GRPC),
            response_headers(grpc_encoding="gzip", content_type=GRPC),
            response_body(body, end=False),
        ],
    )
    assert released_ids(answers[2]) == [1]
    assert "grpc-encoding" in answers[2].response_body.response.header_mutation.remove_headers


def test_an_undecodable_grpc_answer_is_refused_with_a_status_no_client_retries(
    sidecar: Sidecar,
) -> None:
    answers = run_stream(
        sidecar,
        [
            request_headers(QUERY, content_type=GRPC),
            response_headers(grpc_encoding="snappy", content_type=GRPC),
            response_body(struct.pack(">BI", 1, 3) + b"abc", end=False),
        ],
    )
    refusal = answers[2].immediate_response
    assert refusal.grpc_status.status == PERMISSION_DENIED
    assert orjson.loads(refusal.body)["error"] == "upstream_body_unreadable"


def test_an_upstream_grpc_error_keeps_its_status_and_loses_its_message(
    sidecar: Sidecar,
) -> None:
    quoting = "collection docs: point 'Text of chunk 2' not found"
    answers = run_stream(
        sidecar,
        [
            request_headers(QUERY, content_type=GRPC),
            # Trailers-only: the status is in the headers, and there is no body.
            response_headers(end=True, grpc_status="5", grpc_message=quoting, content_type=GRPC),
        ],
    )
    refusal = answers[1].immediate_response
    (record,) = audit_records(sidecar)
    assert refusal.grpc_status.status == NOT_FOUND
    assert orjson.loads(refusal.body) == {
        "error": "upstream_error",
        "decision_id": record["decision_id"],
    }
    # The status as sent (a trailers-only error is HTTP 200), the gRPC status as
    # the upstream's code, and its message as the text.
    assert (record["upstream_status"], record["upstream_code"]) == (200, "grpc:5")
    assert record["upstream_text"] == quoting
    assert (record["outcome"], record["error"]) == ("error", "upstream_error")


def test_a_grpc_message_is_recorded_percent_decoded(sidecar: Sidecar) -> None:
    # gRPC percent-encodes grpc-message; the record keeps the text it stands for.
    answers = run_stream(
        sidecar,
        [
            request_headers(QUERY, content_type=GRPC),
            response_headers(
                end=True, grpc_status="13", grpc_message="caf%C3%A9 100%25", content_type=GRPC
            ),
        ],
    )
    assert answers[1].immediate_response.grpc_status.status == 13
    (record,) = audit_records(sidecar)
    assert (record["upstream_code"], record["upstream_text"]) == ("grpc:13", "café 100%")


def trailers(**values: str) -> ext_proc.ProcessingRequest:
    return ext_proc.ProcessingRequest(
        response_trailers=ext_proc.HttpTrailers(trailers=headers(**values))
    )


def set_trailers(answer: ext_proc.ProcessingResponse) -> dict[str, str]:
    mutation = answer.response_trailers.header_mutation
    return {o.header.key: o.header.raw_value.decode() for o in mutation.set_headers}


def test_a_grpc_error_in_trailers_after_the_headers_is_an_upstream_error(
    sidecar: Sidecar,
) -> None:
    # A server that sent its headers first fails the call in its trailers, with no reply.
    quoting = "point 'Text of chunk 2' failed"
    answers = run_stream(
        sidecar,
        [
            request_headers(QUERY, content_type=GRPC),
            response_headers(content_type=GRPC),
            trailers(grpc_status="3", grpc_message=quoting, x_db_hits="2"),
        ],
    )
    (record,) = audit_records(sidecar)
    assert (record["outcome"], record["error"]) == ("error", "upstream_error")
    assert (record["upstream_status"], record["upstream_code"]) == (200, "grpc:3")
    assert record["upstream_text"] == quoting
    # The client keeps the status, and gets the gate's error in place of the message.
    assert set_trailers(answers[2]) == {
        "grpc-status": "3",
        "grpc-message": orjson.dumps(
            {"error": "upstream_error", "decision_id": record["decision_id"]}
        ).decode(),
    }
    assert set(answers[2].response_trailers.header_mutation.remove_headers) == {"x-db-hits"}


def test_a_grpc_error_in_trailers_after_a_reply_gets_a_record_of_its_own(
    sidecar: Sidecar,
) -> None:
    answers = run_stream(
        sidecar,
        [
            request_headers(QUERY, content_type=GRPC),
            response_headers(content_type=GRPC),
            response_body(BODY, end=False),
            trailers(grpc_status="13", grpc_message="after a reply"),
        ],
    )
    decided, failed = audit_records(sidecar)
    assert (decided["outcome"], decided["released"]) == ("filtered", ["1"])
    assert (failed["outcome"], failed["upstream_code"]) == ("error", "grpc:13")
    assert set_trailers(answers[3])["grpc-status"] == "13"
    assert failed["decision_id"] in set_trailers(answers[3])["grpc-message"]


def test_an_ok_status_in_trailers_is_no_error(sidecar: Sidecar) -> None:
    run_stream(
        sidecar,
        [
            request_headers(QUERY, content_type=GRPC),
            response_headers(content_type=GRPC),
            response_body(BODY, end=False),
            trailers(grpc_status="0"),
        ],
    )
    assert [record["outcome"] for record in audit_records(sidecar)] == ["filtered"]


def test_envoys_own_grpc_error_without_request_headers_passes(sidecar: Sidecar) -> None:
    # jwt_authn or a mesh refusing a gRPC call: HTTP 200 with a grpc-status.
    (answer,) = run_stream(
        sidecar, [response_headers(end=True, grpc_status="16", content_type=GRPC)]
    )
    assert not answer.HasField("immediate_response")


def test_an_undecodable_grpc_request_is_refused_invalid_argument(sidecar: Sidecar) -> None:
    answers = run_stream(
        sidecar,
        [
            request_headers(QUERY, grpc_encoding="gzip", content_type=GRPC),
            ext_proc.ProcessingRequest(
                request_body=ext_proc.HttpBody(
                    body=struct.pack(">BI", 1, 3) + b"abc", end_of_stream=True
                )
            ),
        ],
    )
    assert answers[1].immediate_response.grpc_status.status == 3


def test_a_grpc_write_is_refused_when_its_body_names_a_collection_of_another_tenant(
    tmp_path: Path,
) -> None:
    # A gRPC path names no collection; with writes allowed, the body's must pass.
    data = tmp_path / "data.json"
    data.write_bytes(
        orjson.dumps(
            {
                "retrieval_gate": {
                    "collections": {"finance": {"tenants": ["globex"]}},
                    "routes": {"allow_writes": True},
                }
            }
        )
    )
    settings = with_values(
        settings_of(identity=IdentityMode.TRUSTED_HEADERS),
        store=new_sqlite_url(tmp_path / "gate.db"),
        policy_data=data,
    )
    built = Sidecar.from_settings(settings)

    def upsert(collection: str) -> list[ext_proc.ProcessingResponse]:
        message = qdrant.UpsertPoints(collection_name=collection).SerializeToString()
        return run_stream(
            built,
            [
                client_headers("/qdrant.Points/Upsert", content_type=GRPC),
                ext_proc.ProcessingRequest(
                    request_body=ext_proc.HttpBody(
                        body=grpc_frames.frame(message), end_of_stream=True
                    )
                ),
            ],
        )

    refused = upsert("finance")
    # The body is read, and only read: the response is not the gate's business.
    mode = refused[0].mode_override
    assert (mode.request_body_mode, mode.response_body_mode) == (mode.BUFFERED, mode.NONE)
    assert refused[1].immediate_response.grpc_status.status == PERMISSION_DENIED
    passed = upsert("docs")
    assert not passed[1].HasField("immediate_response")
    assert not passed[1].request_body.response.HasField("body_mutation")


def test_the_grpc_health_check_passes_without_a_caller_and_unread(sidecar: Sidecar) -> None:
    (answer,) = run_stream(
        sidecar,
        [request_headers("/grpc.health.v1.Health/Check", identity=False, content_type=GRPC)],
    )
    assert not answer.HasField("immediate_response")
    mode = answer.mode_override
    assert (mode.response_header_mode, mode.response_body_mode) == (mode.SKIP, mode.NONE)


def test_a_grpc_stream_stays_open_for_its_trailers_and_ends_after_them(sidecar: Sidecar) -> None:
    before_trailers = [
        request_headers(QUERY, content_type=GRPC),
        response_headers(content_type=GRPC),
        response_body(BODY),
    ]
    answers, status = run_open_stream(sidecar, before_trailers, wait_s=0.5)
    assert (len(answers), status) == (3, None)
    trailers = ext_proc.ProcessingRequest(
        response_trailers=ext_proc.HttpTrailers(trailers=headers(grpc_status="0"))
    )
    answers, status = run_open_stream(sidecar, [*before_trailers, trailers])
    assert (len(answers), status) == (4, grpc.StatusCode.OK)


def test_a_failure_while_planning_a_grpc_call_is_a_grpc_status(
    sidecar: Sidecar, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def bug(*args: object, **kwargs: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(sidecar.request_path, "plan", bug)
    (answer,) = run_stream(sidecar, [request_headers(QUERY, content_type=GRPC)])
    refusal = answer.immediate_response
    assert refusal.grpc_status.status == PERMISSION_DENIED  # never one pymilvus retries
    assert orjson.loads(refusal.body) == {"error": "gate_internal_error"}
