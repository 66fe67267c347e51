"""The unchanged pinecone gRPC client through a real Envoy: only admitted vectors come back.

``FakePinecone`` is a fake Pinecone index host: a real gRPC server
(``tests.fixtures.grpc_upstream.FakeGrpcUpstream``) serving
``/VectorService/Query`` and ``/VectorService/Fetch`` with replies built from
the message classes of the gate's own copy of Pinecone's proto (there is no
Pinecone server to run here). The independent check of those replies is the
client itself: pinecone 10's gRPC transport (a Rust extension with its own
compiled proto) decodes what the fake sends and what the gate releases; the
unit tests compare the gate's method list with the one compiled into it.

The client is used as an application would, with the caller's JWT where it
takes its Pinecone API key (``api-key`` metadata, identity ``jwt``): it
offers no way to send other metadata. ``grpc_scheme="http"`` dials the
plaintext listener, as for a local gateway.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from pinecone.errors.exceptions import ApiError, UnauthorizedError
from pinecone.grpc import GrpcIndex

from sidecar.formats import grpc_messages
from sidecar.formats.pinecone.grpc_request import python_struct
from tests.fixtures import tokens
from tests.fixtures.grpc_upstream import FakeGrpcUpstream
from tests.fixtures.harness import GateStack
from tests.fixtures.records import record_dict, text_for

pytestmark = pytest.mark.envoy

QUERY = "/VectorService/Query"
FETCH = "/VectorService/Fetch"

# Vector id -> (record overrides, or None when the store has no record; stored text)
CORPUS: dict[str, tuple[dict[str, Any] | None, str]] = {
    "pc-1": ({}, text_for("pc-1")),
    "pc-2": ({"status": "revoked"}, text_for("pc-2")),
    "pc-3": ({"tenant_id": "globex"}, text_for("pc-3")),
    "pc-4": ({}, text_for("pc-4")),
    "pc-5": ({}, text_for("pc-5") + " (edited in the index)"),
    "pc-6": (None, text_for("pc-6")),
    "pc-7": ({"allowed_principals": ["group:hr"]}, text_for("pc-7")),
    "pc-8": ({}, text_for("pc-8")),
}
ADMITTED = ["pc-1", "pc-4", "pc-8"]


def _vector(cls: Any, vector_id: str, *, with_metadata: bool = True) -> Any:
    index = list(CORPUS).index(vector_id)
    hit = cls(id=vector_id, values=[0.25 * index, 0.5])
    if with_metadata:
        record = CORPUS[vector_id][0] or {}
        hit.metadata.update(
            {
                "text": CORPUS[vector_id][1],
                "tenant": record.get("tenant_id", "acme"),
                "source": f"SECRET-source-{vector_id}",  # never released: not declared
            }
        )
    return hit


class FakePinecone:
    """A fake Pinecone index host: every query matches the whole corpus, in order."""

    def __init__(self) -> None:
        self.server = FakeGrpcUpstream({QUERY: self._query, FETCH: self._fetch})

    def _query(self, data: bytes) -> bytes:
        request = grpc_messages.message_class("QueryRequest").FromString(data)
        reply = grpc_messages.message_class("QueryResponse")(namespace=request.namespace)
        for rank, vector_id in enumerate(CORPUS):
            hit = _vector(
                grpc_messages.message_class("ScoredVector"),
                vector_id,
                with_metadata=request.include_metadata,
            )
            hit.score = 1 - rank / 16
            reply.matches.append(hit)
        reply.usage.read_units = 8
        return bytes(reply.SerializeToString())

    def _fetch(self, data: bytes) -> bytes:
        request = grpc_messages.message_class("FetchRequest").FromString(data)
        reply = grpc_messages.message_class("FetchResponse")(namespace=request.namespace)
        vector_cls = grpc_messages.message_class("Vector")
        for vector_id in request.ids:
            if vector_id in CORPUS:
                reply.vectors[vector_id].CopyFrom(_vector(vector_cls, vector_id))
        reply.usage.read_units = 1
        return bytes(reply.SerializeToString())

    def received(self, method: str) -> Any:
        """The last request message the fake got on ``method``."""
        call = self.server.last_call(method)
        name = "QueryRequest" if method == QUERY else "FetchRequest"
        return call, grpc_messages.message_class(name).FromString(call.request)


SECRET = tokens.hmac_secret()


def jwt(**claims: Any) -> str:
    return tokens.token(SECRET, tokens.claims(groups=["qa"], **claims))


@pytest.fixture(scope="module")
def fake() -> Iterator[FakePinecone]:
    upstream = FakePinecone()
    upstream.server.start()
    yield upstream
    upstream.server.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, fake: FakePinecone) -> Iterator[GateStack]:
    workdir = tmp_path_factory.mktemp("pinecone-grpc")
    records = [record_dict(vid, **o) for vid, (o, _) in CORPUS.items() if o is not None]
    gate = GateStack(
        workdir,
        records,
        config={
            **tokens.hmac_identity(workdir, SECRET),
            "overfetch_factor": 2,
        },
        grpc_upstream_url=fake.server.url,
    ).start()
    yield gate
    gate.stop()


def index(stack: GateStack, api_key: str | None = None) -> GrpcIndex:
    """The unchanged client, dialling the gate with a JWT as its API key."""
    return GrpcIndex(
        host=stack.url,
        api_key=api_key or jwt(),
        grpc_scheme="http",
        timeout=10,
        connect_timeout=5,
    )


def _metadata(value: Mapping[str, Any] | None) -> dict[str, Any]:
    return dict(value or {})


@pytest.mark.parametrize("namespace", ["docs", ""])
def test_query_returns_only_admitted_vectors(
    stack: GateStack, fake: FakePinecone, namespace: str
) -> None:
    response = index(stack).query(
        vector=[0.1, 0.2], top_k=8, include_metadata=True, namespace=namespace
    )
    assert [match.id for match in response.matches] == ADMITTED  # rank order kept
    for match in response.matches:
        # Only the text goes out of the metadata: nothing else was declared.
        assert _metadata(match.metadata) == {"text": CORPUS[match.id][1]}
        assert match.values == pytest.approx([0.25 * list(CORPUS).index(match.id), 0.5])
    assert response.namespace == namespace
    assert response.usage is None  # read units counted every tenant's records
    call, request = fake.received(QUERY)
    # The tenant went down into the filter, k was over-fetched, the key stayed here.
    assert python_struct(request.filter) == {"tenant": {"$eq": "acme"}}
    assert (request.top_k, request.namespace, request.include_metadata) == (16, namespace, True)
    assert call.header("api-key") is None
    record = stack.audit_records()[-1]
    assert record["released"] == ADMITTED
    assert record["tenant_filter"] is True


def test_query_trims_the_overfetched_matches_to_k(stack: GateStack, fake: FakePinecone) -> None:
    response = index(stack).query(
        vector=[0.1, 0.2], top_k=2, include_metadata=True, filter={"genre": {"$eq": "sop"}}
    )
    assert [match.id for match in response.matches] == ADMITTED[:2]
    _, request = fake.received(QUERY)
    assert request.top_k == 4
    assert python_struct(request.filter) == {
        "$and": [{"tenant": {"$eq": "acme"}}, {"genre": {"$eq": "sop"}}]
    }


def test_a_query_without_metadata_returns_nothing_the_gate_cannot_check(
    stack: GateStack,
) -> None:
    response = index(stack).query(vector=[0.1, 0.2], top_k=8, include_metadata=False)
    assert response.matches == []


def test_fetch_returns_only_admitted_vectors(stack: GateStack, fake: FakePinecone) -> None:
    response = index(stack).fetch(ids=[*CORPUS, "absent"], namespace="docs")
    assert sorted(response.vectors) == ADMITTED
    for vector_id, vector in response.vectors.items():
        assert vector.id == vector_id
        assert _metadata(vector.metadata) == {"text": CORPUS[vector_id][1]}
    assert response.namespace == "docs"
    call, request = fake.received(FETCH)
    assert list(request.ids) == [*CORPUS, "absent"]
    assert call.header("api-key") is None


def test_a_rejected_vector_is_fetched_like_an_absent_one(stack: GateStack) -> None:
    client = index(stack)
    rejected = client.fetch(ids=["pc-3"], namespace="docs")
    absent = client.fetch(ids=["absent"], namespace="docs")
    assert rejected.vectors == absent.vectors == {}
    assert rejected.namespace == absent.namespace


def test_a_query_by_stored_vector_id_is_refused(stack: GateStack, fake: FakePinecone) -> None:
    calls = len(fake.server.calls)
    with pytest.raises(ApiError) as raised:
        index(stack).query(id="pc-3", top_k=3)
    assert raised.value.error_code == "INVALID_ARGUMENT"
    assert "request_not_filterable" in str(raised.value)
    assert "pc-3" not in str(raised.value)
    assert len(fake.server.calls) == calls  # never forwarded


def test_a_bad_token_fails_fast(stack: GateStack, fake: FakePinecone) -> None:
    calls = len(fake.server.calls)
    other = tokens.token(tokens.hmac_secret(), tokens.claims(groups=["qa"]))
    for api_key in ("not-a-jwt", other):
        started = time.monotonic()
        with pytest.raises(UnauthorizedError) as raised:
            index(stack, api_key).query(vector=[0.1, 0.2], top_k=3)
        # UNAUTHENTICATED is not one of the codes the client retries.
        assert time.monotonic() - started < 5
        assert raised.value.error_code == "UNAUTHENTICATED"
    assert len(fake.server.calls) == calls


def test_the_gates_proto_file_is_the_one_the_fake_speaks() -> None:
    # The fake and the gate share one descriptor set; the client, its own.
    assert grpc_messages.message_class("QueryResponse").DESCRIPTOR.file.name == (
        "pinecone/db_data_2025_10.proto"
    )
