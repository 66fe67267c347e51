"""gRPC framing, decompression, the private message pool and refusals as gRPC statuses."""

from __future__ import annotations

import gzip
import struct
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.hits import Route, RouteKind
from sidecar.envoy import grpc_body
from sidecar.envoy.content_encoding import UndecodableBody
from sidecar.envoy.messages import refusal_answer
from sidecar.formats import grpc_frames, grpc_messages
from sidecar.formats.base import MalformedBody
from sidecar.formats.grpc_adapter import GrpcAdapter, decode_unary, encode_unary, grpc_method
from sidecar.formats.registry import BUILT_IN, FormatTable
from sidecar.refusals import FORBIDDEN, GrpcStatus, grpc_status_for

GRPC_FORMATS = [name for name in BUILT_IN if name.endswith("_grpc")]


def compressed_frame(message: bytes) -> bytes:
    data = gzip.compress(message)
    return struct.pack(">BI", 1, len(data)) + data


@given(st.lists(st.binary(max_size=300), max_size=5))
def test_frames_round_trip(messages: list[bytes]) -> None:
    body = b"".join(grpc_frames.frame(m) for m in messages)
    assert grpc_frames.messages(body) == messages


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"\x00\x00\x00", "prefix"),
        (b"\x00\x00\x00\x00\x05abc", "inside a message"),
        (b"\x02\x00\x00\x00\x00", "unknown flag"),
        (b"\x80\x00\x00\x00\x00", "unknown flag"),  # grpc-web's trailer frame
        (compressed_frame(b"x"), "compressed"),
    ],
)
def test_frames_refuse_what_is_not_exact_uncompressed_frames(body: bytes, problem: str) -> None:
    with pytest.raises(MalformedBody, match=problem):
        grpc_frames.messages(body)


def test_compressed_frames_are_decompressed_and_others_kept() -> None:
    body = grpc_frames.frame(b"plain") + compressed_frame(b"squeezed")
    assert grpc_frames.messages(grpc_body.uncompressed(body, "gzip", 1000)) == [
        b"plain",
        b"squeezed",
    ]
    plain = grpc_frames.frame(b"plain")
    assert grpc_body.uncompressed(plain, "gzip", 1000) is plain


@pytest.mark.parametrize(
    ("body", "encoding", "limit"),
    [
        (compressed_frame(b"x"), "snappy", 1000),  # an encoding the gate cannot decode
        (compressed_frame(b"x"), "", 1000),  # compressed with no encoding named
        (compressed_frame(b"\x00" * 100_000), "gzip", 50_000),  # a bomb
        (struct.pack(">BI", 1, 3) + b"abc", "gzip", 1000),  # not gzip data
        (b"\x00\x00", "gzip", 1000),  # not frames
    ],
)
def test_undecodable_grpc_bodies_are_refused(body: bytes, encoding: str, limit: int) -> None:
    with pytest.raises(UndecodableBody):
        grpc_body.uncompressed(body, encoding, limit)


@pytest.mark.parametrize(
    ("content_type", "expected"),
    [
        ("application/grpc", True),
        ("application/grpc+proto", True),
        ("Application/GRPC; charset=x", True),
        ("application/grpc-web", False),  # trailers in the body: not what the adapters read
        ("application/json", False),
        ("", False),
    ],
)
def test_grpc_is_recognised_by_content_type(content_type: str, expected: bool) -> None:
    assert grpc_body.is_grpc({"content-type": content_type}) is expected


def test_grpc_method_routes() -> None:
    assert grpc_method(Route("POST", "/qdrant.Points/Query"), "qdrant.Points") == "Query"
    assert grpc_method(Route("GET", "/qdrant.Points/Query"), "qdrant.Points") is None
    assert grpc_method(Route("POST", "/qdrant.Points/"), "qdrant.Points") is None
    assert grpc_method(Route("POST", "/qdrant.Points/Query/x"), "qdrant.Points") is None
    assert grpc_method(Route("POST", "/qdrant.Collections/List"), "qdrant.Points") is None


def test_the_private_pool_lives_beside_the_vendors_own_modules() -> None:
    # qdrant-client registers qdrant.ScoredPoint in the default pool; the gate's
    # copy must load in the same process, and the two must read each other's bytes.
    from qdrant_client.grpc import PointId, ScoredPoint

    ours = grpc_messages.message_class("qdrant.ScoredPoint")
    assert ours is not ScoredPoint
    vendor = ScoredPoint(id=PointId(num=7), score=0.5)
    assert ours.FromString(vendor.SerializeToString()).id.num == 7


def test_unknown_fields_are_seen_at_any_depth_and_released_without_them() -> None:
    point = grpc_messages.message_class("qdrant.ScoredPoint")()
    point.id.num = 7
    point.score = 0.5
    # Field 900 (a newer server's) inside the id, and at the top.
    nested = point.id.SerializeToString() + b"\xa0\x38\x01"
    data = b"\x0a" + bytes([len(nested)]) + nested + b"\xa0\x38\x02"
    decoded = grpc_messages.decode("qdrant.ScoredPoint", data)
    assert grpc_messages.has_unknown_fields(decoded)
    only_nested = grpc_messages.decode("qdrant.ScoredPoint", data[: -len(b"\xa0\x38\x02")])
    assert grpc_messages.has_unknown_fields(only_nested)
    released = grpc_messages.released(decoded)
    assert not grpc_messages.has_unknown_fields(released)
    assert released.id.num == 7
    assert not grpc_messages.has_unknown_fields(
        grpc_messages.decode("qdrant.ScoredPoint", point.SerializeToString())
    )


def test_unary_bodies_hold_exactly_one_message() -> None:
    point = grpc_messages.message_class("qdrant.PointId")(num=3)
    assert decode_unary(encode_unary(point), "qdrant.PointId").num == 3
    for body in (b"", encode_unary(point) * 2, grpc_frames.frame(b"\xff\xff")):
        with pytest.raises(MalformedBody):
            decode_unary(body, "qdrant.PointId")


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (401, GrpcStatus.UNAUTHENTICATED),
        (403, GrpcStatus.PERMISSION_DENIED),
        (400, GrpcStatus.INVALID_ARGUMENT),
        (405, GrpcStatus.UNIMPLEMENTED),
        (503, GrpcStatus.UNAVAILABLE),
        # Never a status pymilvus retries (UNKNOWN, INTERNAL, UNAVAILABLE) for
        # what asking again cannot change.
        (500, GrpcStatus.PERMISSION_DENIED),
        (502, GrpcStatus.PERMISSION_DENIED),
    ],
)
def test_refusals_become_grpc_statuses(status: int, code: GrpcStatus) -> None:
    assert grpc_status_for(status) is code
    answer = refusal_answer(FORBIDDEN.at_status(status), grpc=True)
    refusal = answer.immediate_response
    assert refusal.grpc_status.status == code
    # Envoy marks it application/grpc; a JSON content type would break the client.
    assert all(h.header.key != "content-type" for h in refusal.headers.set_headers)
    assert refusal.body == b'{"error":"forbidden"}'  # Envoy's grpc-message


def test_an_upstream_status_given_replaces_the_refusals_own() -> None:
    answer = refusal_answer(FORBIDDEN.at_status(502), grpc=True, grpc_status=GrpcStatus.NOT_FOUND)
    assert answer.immediate_response.grpc_status.status == GrpcStatus.NOT_FOUND


def test_an_http_refusal_carries_its_json_body_and_no_grpc_status() -> None:
    answer = refusal_answer(FORBIDDEN, grpc=False).immediate_response
    assert answer.status.code == 403
    assert not answer.HasField("grpc_status")
    assert answer.details == "retrieval_gate_forbidden"
    assert [(h.header.key, h.header.raw_value) for h in answer.headers.set_headers] == [
        ("content-type", b"application/json")
    ]


def test_the_gate_imports_no_database_client_package() -> None:
    # The gRPC adapters read the databases' messages from the gate's own copies;
    # a vendor package would be a run-time dependency and clash in the default pool.
    code = (
        "import sys, sidecar.cli, sidecar.runtime.server, sidecar.formats.registry\n"
        "from sidecar.formats import grpc_messages\n"
        "grpc_messages.message_class('milvus.proto.milvus.SearchResults')\n"
        "vendors = {'pymilvus', 'milvus_lite', 'qdrant_client', 'weaviate', 'pinecone'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in vendors))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_there_are_four_grpc_adapters() -> None:
    assert sorted(GRPC_FORMATS) == ["milvus_grpc", "pinecone_grpc", "qdrant_grpc", "weaviate_grpc"]


@pytest.mark.parametrize("name", GRPC_FORMATS)
def test_every_grpc_adapter_treats_an_unknown_method_of_its_service_as_content(name: str) -> None:
    # A newer server's method may return stored data: never an unknown route,
    # which the request policy alone would answer, with the response unread.
    fmt = BUILT_IN[name]()
    assert isinstance(fmt, GrpcAdapter)
    unknown = Route("POST", f"/{fmt.service}/MethodOfANewerServer")
    assert fmt.route_kind(unknown) is RouteKind.CONTENT
    assert FormatTable([fmt]).route_kind(unknown) is RouteKind.CONTENT
    assert FormatTable([fmt]).response_format(unknown) is None
    assert not fmt.rewrites_request(unknown)
    assert fmt.route_kind(Route("GET", f"/{fmt.service}/MethodOfANewerServer")) is None
