"""The unchanged Weaviate v4 client through a real Envoy: only admitted objects come back.

``FakeWeaviate`` is a fake Weaviate: a real gRPC server
(``tests.fixtures.grpc_upstream.FakeGrpcUpstream``) serving
``/weaviate.v1.Weaviate/Search`` with replies built from weaviate-client's own
generated message classes (``weaviate.proto.v1``, Weaviate's protos as the
client ships them; there is no Weaviate server to run here). Every search
matches the whole corpus, in order; ``group_by`` groups it by topic and
``generative`` adds generated text. The REST calls the client makes when it
connects (``GET /v1/meta``) go through the same Envoy to the fixture HTTP
upstream (``sidecar.demo.upstream``), which answers as a Weaviate 1.32 would.

The client is used as an application would: ``weaviate.connect_to_custom``
with the caller's JWT as its API key (the client sends ``authorization:
Bearer <key>`` on REST and gRPC alike; identity ``jwt``), then
``collection.query.*`` and ``collection.generate.*``. At connect the client
also calls the standard gRPC health check, without credentials: the gate
lets that one call through unauthenticated (its answer is a serving status).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import weaviate
from weaviate.classes.init import Auth
from weaviate.classes.query import Filter, GroupBy, MetadataQuery
from weaviate.exceptions import WeaviateBaseError
from weaviate.proto.v1 import (
    base_pb2,
    properties_pb2,
    search_get_pb2,
    weaviate_pb2_grpc,
)

from sidecar.demo.upstream import CannedResponse
from tests.fixtures import tokens
from tests.fixtures.grpc_upstream import FakeGrpcUpstream
from tests.fixtures.harness import GateStack
from tests.fixtures.records import record_dict, text_for

pytestmark = pytest.mark.envoy

SEARCH = "/weaviate.v1.Weaviate/Search"
COLLECTION = "Docs"


def _uuid(number: int) -> str:
    return str(uuid.UUID(f"00000000-0000-4000-8000-{number:012d}"))


# Object UUID -> (record overrides, or None when the store has no record; stored text)
CORPUS: dict[str, tuple[dict[str, Any] | None, str]] = {
    _uuid(1): ({}, text_for(_uuid(1))),
    _uuid(2): ({"status": "revoked"}, text_for(_uuid(2))),
    _uuid(3): ({"tenant_id": "globex"}, text_for(_uuid(3))),
    _uuid(4): ({}, text_for(_uuid(4))),
    _uuid(5): ({}, text_for(_uuid(5)) + " (edited in the index)"),
    _uuid(6): (None, text_for(_uuid(6))),
    _uuid(7): ({"allowed_principals": ["group:hr"]}, text_for(_uuid(7))),
    _uuid(8): ({}, text_for(_uuid(8))),
}
ORDER = list(CORPUS)
ADMITTED = [_uuid(1), _uuid(4), _uuid(8)]


def _topic(object_id: str) -> str:
    return "alpha" if ORDER.index(object_id) < 4 else "beta"


def _object(object_id: str, rank: int, generative: bool) -> Any:
    record = CORPUS[object_id][0] or {}
    values = {
        "text": CORPUS[object_id][1],
        "tenant": record.get("tenant_id", "acme"),
        "topic": _topic(object_id),
        "source": f"SECRET-source-{object_id}",  # never released: not declared
    }
    result = search_get_pb2.SearchResult(
        properties=search_get_pb2.PropertiesResult(
            non_ref_props=properties_pb2.Properties(
                fields={k: properties_pb2.Value(text_value=v) for k, v in values.items()}
            ),
            target_collection=COLLECTION,
        ),
        metadata=search_get_pb2.MetadataResult(
            id_as_bytes=uuid.UUID(object_id).bytes,
            distance=rank / 10,
            distance_present=True,
            explain_score="SECRET explanation",
            explain_score_present=True,
        ),
    )
    if generative:
        result.generative.values.add(result=f"about {object_id}")
    return result


HEALTH_CHECK = "/grpc.health.v1.Health/Check"


def _serving(_: bytes) -> bytes:
    """grpc.health.v1.HealthCheckResponse{status: SERVING}."""
    return b"\x08\x01"


class FakeWeaviate:
    """A fake Weaviate gRPC server: every search matches the whole corpus, in order."""

    def __init__(self) -> None:
        self.server = FakeGrpcUpstream({SEARCH: self._search, HEALTH_CHECK: _serving})

    def _search(self, data: bytes) -> bytes:
        request = search_get_pb2.SearchRequest.FromString(data)
        generative = request.HasField("generative")
        objects = [_object(oid, rank, generative) for rank, oid in enumerate(ORDER)]
        reply = search_get_pb2.SearchReply(took=0.5)
        if request.HasField("group_by"):
            for topic in ("alpha", "beta"):
                members = [o for o, oid in zip(objects, ORDER, strict=True) if _topic(oid) == topic]
                reply.group_by_results.add(
                    name=topic,
                    objects=members,
                    number_of_objects=len(members),
                    min_distance=members[0].metadata.distance,
                    max_distance=members[-1].metadata.distance,
                )
        else:
            reply.results.extend(objects)
        if generative:
            reply.generative_grouped_results.values.add(result="a summary of every object")
        return bytes(reply.SerializeToString())

    def received(self) -> tuple[Any, Any]:
        """The last Search call (its metadata) and its request message."""
        call = self.server.last_call(SEARCH)
        return call, search_get_pb2.SearchRequest.FromString(call.request)


SECRET = tokens.hmac_secret()


def jwt(**claims: Any) -> str:
    return tokens.token(SECRET, tokens.claims(groups=["qa"], **claims))


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeWeaviate]:
    upstream = FakeWeaviate()
    upstream.server.start()
    yield upstream
    upstream.server.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, fake: FakeWeaviate) -> Iterator[GateStack]:
    workdir = tmp_path_factory.mktemp("weaviate-grpc")
    records = [record_dict(oid, **o) for oid, (o, _) in CORPUS.items() if o is not None]
    gate = GateStack(
        workdir,
        records,
        config={
            **tokens.hmac_identity(workdir, SECRET),
            "overfetch_factor": 2,
            "formats": {"weaviate_grpc": {"releasable_fields": ["topic"]}},
        },
        grpc_upstream_url=fake.server.url,
    ).start()
    # What a Weaviate 1.32 answers the client's connect-time REST call.
    meta = b'{"version":"1.32.0","hostname":"http://[::]:8080","modules":{}}'
    gate.upstream.respond("GET", "/v1/meta", CannedResponse(meta))
    yield gate
    gate.stop()


@pytest.fixture
def client(stack: GateStack) -> Iterator[weaviate.WeaviateClient]:
    """The unchanged client, connected to the gate with a JWT as its API key."""
    with _connect(stack, jwt()) as connected:
        yield connected


def _connect(stack: GateStack, api_key: str) -> weaviate.WeaviateClient:
    # One listener serves both; the client wants two addresses, so the gRPC one is
    # spelled by name (it resolves to the same loopback listener).
    return weaviate.connect_to_custom(
        http_host="127.0.0.1",
        http_port=stack.listen_port,
        http_secure=False,
        grpc_host="localhost",
        grpc_port=stack.listen_port,
        grpc_secure=False,
        auth_credentials=Auth.api_key(api_key),
    )


def _ids(objects: Any) -> list[str]:
    return [str(obj.uuid) for obj in objects]


def _check_released(objects: Any) -> None:
    for obj in objects:
        oid = str(obj.uuid)
        # The text and the declared topic go out; the tenant and source were not declared.
        assert obj.properties == {"text": CORPUS[oid][1], "topic": _topic(oid)}


def _check_pushed_down(fake: FakeWeaviate, limit: int) -> Any:
    call, request = fake.received()
    assert request.collection == COLLECTION
    tenant = base_pb2.Filters(
        operator=base_pb2.Filters.OPERATOR_EQUAL,
        target=base_pb2.FilterTarget(property="tenant"),
        value_text="acme",
    )
    assert request.filters == tenant or request.filters.filters[0] == tenant
    assert request.limit == limit
    # The caller's credential stays at the gate.
    assert call.header("authorization") is None
    return request


@pytest.mark.parametrize(
    "search",
    [
        lambda docs: docs.query.fetch_objects(limit=8),
        lambda docs: docs.query.near_vector([0.1, 0.2], limit=8),
        lambda docs: docs.query.bm25("policy", limit=8),
        lambda docs: docs.query.hybrid("policy", limit=8),
    ],
    ids=["fetch_objects", "near_vector", "bm25", "hybrid"],
)
def test_searches_return_only_admitted_objects(
    client: weaviate.WeaviateClient, fake: FakeWeaviate, stack: GateStack, search: Any
) -> None:
    response = search(client.collections.get(COLLECTION))
    assert _ids(response.objects) == ADMITTED  # rank order kept
    _check_released(response.objects)
    _check_pushed_down(fake, 16)
    record = stack.audit_records()[-1]
    assert record["released"] == ADMITTED
    assert record["tenant_filter"] is True


def test_the_apps_filter_is_kept_and_k_is_trimmed(
    client: weaviate.WeaviateClient, fake: FakeWeaviate
) -> None:
    docs = client.collections.get(COLLECTION)
    response = docs.query.near_vector(
        [0.1, 0.2],
        limit=2,
        filters=Filter.by_property("topic").equal("alpha"),
        return_metadata=MetadataQuery(distance=True, explain_score=True),
    )
    assert _ids(response.objects) == ADMITTED[:2]
    for obj in response.objects:
        assert obj.metadata.distance == pytest.approx(ORDER.index(str(obj.uuid)) / 10)
        assert obj.metadata.explain_score is None  # text about the other results
    request = _check_pushed_down(fake, 4)
    assert request.filters.operator == base_pb2.Filters.OPERATOR_AND
    assert request.filters.filters[1].target.property == "topic"


def test_group_by_returns_only_admitted_objects_in_recounted_groups(
    client: weaviate.WeaviateClient, fake: FakeWeaviate
) -> None:
    response = client.collections.get(COLLECTION).query.near_vector(
        [0.1, 0.2],
        limit=8,
        group_by=GroupBy(prop="topic", number_of_groups=2, objects_per_group=4),
    )
    assert sorted(response.groups) == ["alpha", "beta"]
    assert _ids(response.groups["alpha"].objects) == [_uuid(1), _uuid(4)]
    assert _ids(response.groups["beta"].objects) == [_uuid(8)]
    assert response.groups["alpha"].number_of_objects == 2
    assert response.groups["beta"].number_of_objects == 1
    assert _ids(response.objects) == ADMITTED
    # Groups are never over-fetched: their limits count groups.
    _check_pushed_down(fake, 8)


def test_generated_text_over_removed_objects_is_withheld(
    client: weaviate.WeaviateClient, fake: FakeWeaviate
) -> None:
    response = client.collections.get(COLLECTION).generate.near_vector(
        [0.1, 0.2],
        limit=8,
        single_prompt="Summarise {text}",
        grouped_task="Summarise all",
    )
    assert _ids(response.objects) == ADMITTED
    # Each admitted object keeps the text generated from it alone ...
    assert [obj.generated for obj in response.objects] == [f"about {oid}" for oid in ADMITTED]
    # ... the summary of every object (rejected ones too) is withheld.
    assert response.generated is None
    # A grouped task is not over-fetched: its answer covers every object returned.
    _check_pushed_down(fake, 8)


def test_a_search_near_a_stored_object_is_refused(
    client: weaviate.WeaviateClient, fake: FakeWeaviate
) -> None:
    calls = len(fake.server.calls)
    with pytest.raises(WeaviateBaseError) as raised:
        client.collections.get(COLLECTION).query.near_object(_uuid(3), limit=3)
    assert "request_not_filterable" in str(raised.value)
    assert _uuid(3) not in str(raised.value)
    assert len(fake.server.calls) == calls  # never forwarded


def test_aggregate_is_refused(client: weaviate.WeaviateClient, fake: FakeWeaviate) -> None:
    calls = len(fake.server.calls)
    with pytest.raises(WeaviateBaseError):
        client.collections.get(COLLECTION).aggregate.over_all(total_count=True)
    assert len(fake.server.calls) == calls


def test_a_bad_token_fails_fast(stack: GateStack, fake: FakeWeaviate) -> None:
    calls = len(fake.server.calls)
    other = tokens.token(tokens.hmac_secret(), tokens.claims(groups=["qa"]))
    for key in ("not-a-jwt", other):
        started = time.monotonic()
        # The client's own stub, as its connection calls it, past the REST connect.
        with grpc.insecure_channel(f"127.0.0.1:{stack.listen_port}") as channel:
            stub = weaviate_pb2_grpc.WeaviateStub(channel)  # type: ignore[no-untyped-call]
            with pytest.raises(grpc.RpcError) as raised:
                stub.Search(
                    search_get_pb2.SearchRequest(collection=COLLECTION, limit=3),
                    metadata=(("authorization", f"Bearer {key}"),),
                    timeout=10,
                )
        assert raised.value.code() is grpc.StatusCode.UNAUTHENTICATED
        assert time.monotonic() - started < 5
        # Connecting fails at its first REST call, just as fast.
        with pytest.raises(WeaviateBaseError):
            _connect(stack, key)
        assert time.monotonic() - started < 10
    assert len(fake.server.calls) == calls
