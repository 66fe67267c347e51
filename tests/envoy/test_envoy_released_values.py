"""Cursors and values behind allowlisted keys, through a real Envoy (issue 27, items 5 and 6).

What a released answer carries besides its hits is rebuilt from what goes out
or from the request, and a value is checked against what it may be. Each case
is probed through Envoy and the sidecar, with a control that shows the probe
is real: the fake upstream did send the other tenant's (or the forbidden)
value, and the client did not get it; where two worlds are compared, the
client's answers are the same whether or not the value exists.

The upstreams are fakes answering in the databases' own shapes (no server of
Weaviate, Qdrant or Elasticsearch runs here, and Milvus Lite 3.2.2 has no
search iterator v2: pymilvus falls back to its v1 iterator against it):

- gRPC (``tests.fixtures.grpc_upstream``): Weaviate's ``Search`` with a
  filtered cursor as Weaviate implements it on its ``filtered_cursor_next_uuid``
  branch (b374aa396d: the scan stops after 10 x limit objects and
  ``iterator_next_uuid``, field 6, names the object it stopped at, the nil
  UUID when it did not stop early), built with weaviate-client's own message
  classes and field 6 added on the wire; Milvus' ``Search`` as its proxy
  answers a search iterator v2 page (``getLastBound``: the last row's score,
  the incoming bound when no row comes back), plus the ``Connect`` and
  ``DescribeCollection`` pymilvus calls first, built with pymilvus' messages.
  pymilvus' own ``search_iterator`` (V2) iterates through the gate.
- HTTP (``sidecar.demo.upstream``, with responders): Qdrant group searches
  grouping by the request's ``group_by`` field, Chroma get answers echoing
  (and planting in) ``include``, Elasticsearch searches with highlights and
  scrolls.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import grpc
import orjson
import pytest
from pymilvus import MilvusClient
from pymilvus.client.iterator.search_iterator import SearchIteratorV2
from pymilvus.grpc_gen import common_pb2, milvus_pb2, milvus_pb2_grpc, schema_pb2
from weaviate.proto.v1 import base_pb2, properties_pb2, search_get_pb2

from sidecar.demo.upstream import CannedResponse, SeenRequest
from tests.fixtures import tokens
from tests.fixtures.grpc_upstream import FakeGrpcUpstream
from tests.fixtures.harness import GateStack, HttpResult
from tests.fixtures.records import record_dict, text_for

pytestmark = pytest.mark.envoy

SECRET = tokens.hmac_secret()


def jwt() -> str:
    return tokens.token(SECRET, tokens.claims(groups=["qa"]))


def _fields(raw: bytes) -> Iterator[tuple[int, bytes | int]]:
    """The top-level fields of a protobuf message: (number, value), for the wire types
    the replies here use (varint, 64-bit, length-delimited, 32-bit)."""
    position = 0

    def varint() -> int:
        nonlocal position
        shift = value = 0
        while True:
            byte = raw[position]
            position += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value

    while position < len(raw):
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            yield number, varint()
        elif wire == 1:
            yield number, raw[position : position + 8]
            position += 8
        elif wire == 2:
            length = varint()
            yield number, raw[position : position + length]
            position += length
        elif wire == 5:
            yield number, raw[position : position + 4]
            position += 4
        else:
            raise ValueError(f"wire type {wire}")


# -- Weaviate: the filtered iteration cursor ----------------------------------------

WEAVIATE_SEARCH: Final = "/weaviate.v1.Weaviate/Search"
NIL: Final = bytes(16)
SCAN_FACTOR: Final = 10  # Weaviate scans at most 10 x limit objects per cursor page


def _object_uuid(number: int) -> uuid.UUID:
    """Objects sort by UUID, as Weaviate's objects bucket does: ``number`` orders them."""
    return uuid.UUID(int=(number << 64) | 0x4000_8000_0000_0000)


@dataclass(frozen=True)
class WeaviateObject:
    number: int
    tenant: str

    @property
    def id(self) -> uuid.UUID:
        return _object_uuid(self.number)

    @property
    def text(self) -> str:
        return text_for(str(self.id))


def _tenant_of(filters: Any) -> str | None:
    """The tenant an EQUAL condition on ``tenant`` asks for, anywhere in ``filters``."""
    if filters.target.property == "tenant" and filters.operator == base_pb2.Filters.OPERATOR_EQUAL:
        return str(filters.value_text)
    for inner in filters.filters:
        found = _tenant_of(inner)
        if found is not None:
            return found
    return None


@dataclass
class FilteredCursorWeaviate:
    """Weaviate's gRPC Search over ``objects`` with a filtered cursor (see the module
    docstring); records the cursor it sent for each call."""

    objects: list[WeaviateObject] = field(default_factory=list)
    sent_cursors: list[bytes | None] = field(default_factory=list)

    def search(self, data: bytes) -> bytes:
        request = search_get_pb2.SearchRequest.FromString(data)
        # `after` is optional on such servers: present and empty starts an iteration.
        cursor_request = any(number == 33 for number, _ in _fields(data))
        tenant = _tenant_of(request.filters) if request.HasField("filters") else None
        ordered = sorted(self.objects, key=lambda o: o.id.bytes)
        if request.after:
            after = uuid.UUID(request.after).bytes
            ordered = [o for o in ordered if o.id.bytes > after]
        found: list[WeaviateObject] = []
        stopped_at = None
        for scanned, obj in enumerate(ordered, 1):
            if tenant is None or obj.tenant == tenant:
                found.append(obj)
            if cursor_request and scanned == SCAN_FACTOR * request.limit:
                stopped_at = obj.id.bytes  # matched or not: where the scan stopped
                break
            if len(found) == request.limit:
                break
        reply = search_get_pb2.SearchReply(took=0.1)
        for obj in found:
            values = {"text": obj.text, "tenant": obj.tenant}
            reply.results.add(
                properties=search_get_pb2.PropertiesResult(
                    non_ref_props=properties_pb2.Properties(
                        fields={k: properties_pb2.Value(text_value=v) for k, v in values.items()}
                    ),
                    target_collection="Docs",
                ),
                metadata=search_get_pb2.MetadataResult(id_as_bytes=obj.id.bytes),
            )
        out = reply.SerializeToString()
        cursor = (stopped_at or NIL) if cursor_request else None
        self.sent_cursors.append(cursor)
        if cursor is not None:
            # iterator_next_uuid = 6, which weaviate-client 4.16.2's SearchReply predates.
            out += b"\x32\x10" + cursor
        return bytes(out)


@dataclass(frozen=True)
class Page:
    """One page as the client reads it: the object UUIDs and the cursor."""

    ids: tuple[str, ...]
    cursor: bytes | None


def _weaviate_page(channel: grpc.Channel, after: str | None, limit: int) -> Page:
    request = search_get_pb2.SearchRequest(
        collection="Docs",
        limit=limit,
        metadata=search_get_pb2.MetadataRequest(uuid=True),
        properties=search_get_pb2.PropertiesRequest(non_ref_properties=["text"]),
    ).SerializeToString()
    # `after` present, empty on the first page (Weaviate's own iterator test does so).
    after_bytes = (after or "").encode()
    request += b"\x8a\x02" + bytes([len(after_bytes)]) + after_bytes
    call = channel.unary_unary(WEAVIATE_SEARCH)
    raw = call(request, metadata=(("authorization", f"Bearer {jwt()}"),), timeout=10)
    reply = search_get_pb2.SearchReply.FromString(raw)
    cursor = next((v for n, v in _fields(raw) if n == 6), None)
    assert cursor is None or isinstance(cursor, bytes)
    ids = tuple(str(uuid.UUID(bytes=r.metadata.id_as_bytes)) for r in reply.results)
    return Page(ids, cursor)


def _iterate(channel: grpc.Channel, limit: int = 2) -> list[Page]:
    """A filtered cursor iteration as Weaviate's branch expects a client to run it:
    after the cursor when it is not nil, else after the last object; done on an
    empty page with a nil cursor."""
    pages: list[Page] = []
    after: str | None = None
    for _ in range(20):
        page = _weaviate_page(channel, after, limit)
        pages.append(page)
        if page.cursor not in (None, NIL):
            assert page.cursor is not None
            after = str(uuid.UUID(bytes=page.cursor))
        elif page.ids:
            after = page.ids[-1]
        else:
            return pages
    raise AssertionError("the iteration never ended")


# -- Milvus: the search iterator's bound ------------------------------------------

MILVUS: Final = "/milvus.proto.milvus.MilvusService/"
MAX_FLOAT32: Final = 3.4028234663852886e38


@dataclass(frozen=True)
class MilvusRow:
    key: int
    tenant: str
    distance: float

    @property
    def text(self) -> str:
        return text_for(str(self.key))


@dataclass
class IteratingMilvus:
    """Milvus' proxy answering pymilvus' search iterator v2 (L2: nearer first); records
    the ``last_bound`` of each search it answered."""

    rows: list[MilvusRow] = field(default_factory=list)
    sent_bounds: list[float] = field(default_factory=list)
    handlers: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.handlers = {
            MILVUS + "Connect": self.connect,
            MILVUS + "DescribeCollection": self.describe,
            MILVUS + "Search": self.search,
        }

    def connect(self, data: bytes) -> bytes:
        reply = milvus_pb2.ConnectResponse(
            status=common_pb2.Status(),
            server_info=common_pb2.ServerInfo(build_tags="v2.5.4"),
            identifier=1,
        )
        return bytes(reply.SerializeToString())

    def describe(self, data: bytes) -> bytes:
        schema = schema_pb2.CollectionSchema(
            name="docs",
            fields=[
                schema_pb2.FieldSchema(
                    fieldID=100, name="id", is_primary_key=True, data_type=schema_pb2.DataType.Int64
                ),
                schema_pb2.FieldSchema(
                    fieldID=101,
                    name="vec",
                    data_type=schema_pb2.DataType.FloatVector,
                    type_params=[common_pb2.KeyValuePair(key="dim", value="2")],
                ),
                schema_pb2.FieldSchema(
                    fieldID=102,
                    name="text",
                    data_type=schema_pb2.DataType.VarChar,
                    type_params=[common_pb2.KeyValuePair(key="max_length", value="200")],
                ),
            ],
        )
        reply = milvus_pb2.DescribeCollectionResponse(
            status=common_pb2.Status(), schema=schema, collectionID=7, collection_name="docs"
        )
        return bytes(reply.SerializeToString())

    def search(self, data: bytes) -> bytes:
        request = milvus_pb2.SearchRequest.FromString(data)
        params: dict[str, str] = {}
        for pair in request.search_params:
            params.setdefault(pair.key, pair.value)
        confined = [r for r in self.rows if f'tenant == "{r.tenant}"' in request.dsl]
        incoming = params.get("search_iter_last_bound")
        bound = None if incoming is None else float(incoming)
        nearer_first = sorted(confined, key=lambda r: r.distance)
        page = [r for r in nearer_first if bound is None or r.distance > bound]
        page = page[: int(params["topk"])]
        results = schema_pb2.SearchResultData(
            num_queries=1,
            top_k=int(params["topk"]),
            topks=[len(page)],
            scores=[r.distance for r in page],
            output_fields=["text"],
            primary_field_name="id",
        )
        results.ids.int_id.data.extend(r.key for r in page)
        text = results.fields_data.add(
            type=schema_pb2.DataType.VarChar, field_name="text", field_id=102
        )
        text.scalars.string_data.data.extend(r.text for r in page)
        # getLastBound: the last row's score; with no row, the incoming bound (on a
        # first page, the closest bound).
        last_bound = -MAX_FLOAT32 if bound is None else bound
        if page:
            last_bound = page[-1].distance
        self.sent_bounds.append(last_bound)
        results.search_iterator_v2_results.token = params.get("search_iter_id", "iterator-1")
        results.search_iterator_v2_results.last_bound = last_bound
        reply = milvus_pb2.SearchResults(
            status=common_pb2.Status(), results=results, collection_name="docs", session_ts=1
        )
        return bytes(reply.SerializeToString())


# -- the gRPC stack -------------------------------------------------------------------

# Acme's objects, by number (their UUIDs sort so): admitted ones, one revoked and
# one HR-only (both rejected for the caller, who is not in group:hr).
ACME = [WeaviateObject(n, "acme") for n in (100, 200, 300, 400, 500, 600)]
REVOKED, HR_ONLY = WeaviateObject(150, "acme"), WeaviateObject(350, "acme")
GLOBEX_NUMBERS: Final = range(101, 700)  # any object of globex sits at one of these
# Milvus rows: 102, 104 and 105 are HR-only (rejected for the caller); 199 is globex's.
MILVUS_RECORDS: Final[dict[int, dict[str, Any]]] = {
    101: {},
    102: {"allowed_principals": ["group:hr"]},
    103: {},
    104: {"allowed_principals": ["group:hr"]},
    105: {"allowed_principals": ["group:hr"]},
    106: {},
    199: {"tenant_id": "globex"},
}


def _globex(numbers: Sequence[int]) -> list[WeaviateObject]:
    return [WeaviateObject(n, "globex") for n in numbers]


@dataclass
class GrpcUpstreams:
    weaviate: FilteredCursorWeaviate
    milvus: IteratingMilvus
    server: FakeGrpcUpstream


@pytest.fixture(scope="module")
def upstreams() -> Iterator[GrpcUpstreams]:
    weaviate, milvus = FilteredCursorWeaviate(), IteratingMilvus()
    server = FakeGrpcUpstream({WEAVIATE_SEARCH: weaviate.search, **milvus.handlers}).start()
    yield GrpcUpstreams(weaviate, milvus, server)
    server.stop()


@pytest.fixture(scope="module")
def grpc_stack(
    tmp_path_factory: pytest.TempPathFactory, upstreams: GrpcUpstreams
) -> Iterator[GateStack]:
    workdir = tmp_path_factory.mktemp("released-values-grpc")
    acme = {o.number for o in ACME}
    records = [record_dict(str(o.id)) for o in ACME]
    records.append(record_dict(str(REVOKED.id), status="revoked"))
    records.append(record_dict(str(HR_ONLY.id), allowed_principals=["group:hr"]))
    records += [
        record_dict(str(_object_uuid(n)), tenant_id="globex")
        for n in GLOBEX_NUMBERS
        if n not in acme and n not in (REVOKED.number, HR_ONLY.number)
    ]
    records += [record_dict(str(key), **o) for key, o in MILVUS_RECORDS.items()]
    gate = GateStack(
        workdir,
        records,
        config=tokens.hmac_identity(workdir, SECRET),
        grpc_upstream_url=upstreams.server.url,
    ).start()
    yield gate
    gate.stop()


@pytest.fixture
def channel(grpc_stack: GateStack) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{grpc_stack.listen_port}") as opened:
        yield opened


# -- Weaviate ----------------------------------------------------------------------


def test_the_weaviate_cursor_never_names_the_object_the_scan_stopped_at(
    upstreams: GrpcUpstreams, channel: grpc.Channel
) -> None:
    # Between acme's second and third object lie 25 of globex's: the second page's
    # scan of 20 objects (10 x limit 2) stops at one of them.
    a1, a2, a3, a4 = ACME[:4]
    upstreams.weaviate.objects = [a1, a2, *_globex(range(201, 226)), a3, a4]
    upstreams.weaviate.sent_cursors.clear()
    pages = _iterate(channel)
    # The control: the database answered the second page with a cursor naming the
    # other tenant's object at which its scan stopped.
    globex = {o.id.bytes for o in upstreams.weaviate.objects if o.tenant == "globex"}
    assert upstreams.weaviate.sent_cursors[:2] == [NIL, _object_uuid(220).bytes]
    assert upstreams.weaviate.sent_cursors[1] in globex
    # The client got the first page with a cursor after its last object, then an
    # empty page with the nil cursor, which ended the iteration (a page that
    # releases nothing ends it: the price of never naming what the scan passed).
    assert pages == [Page((str(a1.id), str(a2.id)), a2.id.bytes), Page((), NIL)]


@pytest.mark.parametrize("gaps", [0, 3], ids=["no-other-tenant", "other-tenant-between"])
def test_a_weaviate_iteration_skips_and_repeats_nothing_past_rejected_objects(
    upstreams: GrpcUpstreams, channel: grpc.Channel, gaps: int
) -> None:
    # Acme's objects with a revoked and an HR-only one among them, and (second world)
    # a few of globex's between each two: fewer than a scan's 20, so the database
    # finds the same objects of acme on every page either way.
    objects: list[WeaviateObject] = []
    for obj in sorted([*ACME, REVOKED, HR_ONLY], key=lambda o: o.number):
        objects += [obj, *_globex(range(obj.number + 1, obj.number + 1 + gaps))]
    upstreams.weaviate.objects = objects
    upstreams.weaviate.sent_cursors.clear()
    pages = _iterate(channel)
    # Every admitted object once, in order: each page continues right after the last
    # object released, so the rejected ones are read again (and refused again).
    seen = [object_id for page in pages for object_id in page.ids]
    assert seen == [str(o.id) for o in ACME]
    for page in pages:
        assert page.cursor == (uuid.UUID(page.ids[-1]).bytes if page.ids else NIL)
    assert pages == EXPECTED_PAGES


# The pages either world gives (limit 2): rejected objects are re-read, never shown.
EXPECTED_PAGES: Final = [
    Page((str(ACME[0].id),), ACME[0].id.bytes),  # 100, 150 (revoked)
    Page((str(ACME[1].id),), ACME[1].id.bytes),  # 150 again, 200
    Page((str(ACME[2].id),), ACME[2].id.bytes),  # 300, 350 (HR-only)
    Page((str(ACME[3].id),), ACME[3].id.bytes),  # 350 again, 400
    Page((str(ACME[4].id), str(ACME[5].id)), ACME[5].id.bytes),
    Page((), NIL),
]


# -- Milvus ------------------------------------------------------------------------


def _milvus_rows(hr_distance: float) -> list[MilvusRow]:
    """Acme's rows nearest first, an HR-only pair at ``hr_distance``, and globex's nearest
    of all (push-down keeps it inside Milvus)."""
    return [
        MilvusRow(199, "globex", 0.05),
        MilvusRow(101, "acme", 0.1),
        MilvusRow(102, "acme", 0.2),
        MilvusRow(103, "acme", 0.3),
        MilvusRow(104, "acme", hr_distance),
        MilvusRow(105, "acme", hr_distance + 0.01),
        MilvusRow(106, "acme", 0.9),
    ]


def _raw_page(channel: grpc.Channel, bound: float | None, limit: int = 2) -> tuple[list[int], Any]:
    """One search iterator page through the gate: the keys and the iterator fields."""
    params = {"topk": str(limit), "iterator": "True", "search_iter_v2": "True"}
    params["search_iter_batch_size"] = str(limit)
    if bound is not None:
        params |= {"search_iter_last_bound": repr(bound), "search_iter_id": "iterator-1"}
    request = milvus_pb2.SearchRequest(
        collection_name="docs",
        dsl="",
        dsl_type=common_pb2.DslType.BoolExprV1,
        output_fields=["text"],
        search_params=[common_pb2.KeyValuePair(key=k, value=v) for k, v in params.items()],
        nq=1,
    )
    stub = milvus_pb2_grpc.MilvusServiceStub(channel)
    reply = stub.Search(request, metadata=(("authorization", f"Bearer {jwt()}"),), timeout=10)
    return list(reply.results.ids.int_id.data), reply.results.search_iterator_v2_results


def test_a_milvus_page_of_rejected_rows_carries_none_of_their_scores(
    upstreams: GrpcUpstreams, channel: grpc.Channel
) -> None:
    seen = []
    for hr_distance in (0.45, 0.55):
        upstreams.milvus.rows = _milvus_rows(hr_distance)
        upstreams.milvus.sent_bounds.clear()
        keys, iteration = _raw_page(channel, bound=0.3)
        # The control: the database's bound is the score of the last (rejected) row.
        assert upstreams.milvus.sent_bounds == [pytest.approx(hr_distance + 0.01)]
        # The client gets no row and the bound its page started from, as Milvus answers
        # a page with no row: the empty page ends the iteration.
        assert keys == []
        assert iteration.last_bound == pytest.approx(0.3)
        assert iteration.token == "iterator-1"
        seen.append((keys, iteration.SerializeToString()))
    # Alike whatever the forbidden rows' scores.
    assert seen[0] == seen[1]


def test_pymilvus_iterates_released_rows_and_stops_at_a_rejected_page(
    upstreams: GrpcUpstreams, grpc_stack: GateStack
) -> None:
    upstreams.milvus.rows = _milvus_rows(0.45)
    upstreams.milvus.sent_bounds.clear()
    client = MilvusClient(uri=grpc_stack.url, token=jwt(), timeout=20)
    try:
        iterator = client.search_iterator("docs", data=[[0.1, 0.2]], batch_size=2)
        assert isinstance(iterator, SearchIteratorV2)  # not the v1 fallback
        pages = []
        for _ in range(10):
            page = iterator.next()
            if not page:
                break
            pages.append([hit["id"] for hit in page])
        iterator.close()
    finally:
        client.close()
    # 101 (102 rejected), then 103 (the next page started after 101's score and read
    # 102 again), then 104 and 105, both rejected: an empty page, where pymilvus
    # stops; 106 lies past a page of rejected rows (the iteration ends early).
    assert pages == [[101], [103]]
    # The control: the database's bounds included the rejected rows' scores.
    assert pytest.approx(0.46) in upstreams.milvus.sent_bounds


# -- the HTTP stack ------------------------------------------------------------------

# Routes: the default (push-down, enforce); without push-down; passing the database's
# answer (the controls).
CONFINED, UNCONFINED, EXPOSED = "docs", "unconfined", "exposed"
CHROMA_COLLECTION = "5c56c793-69f3-4fbf-87e6-c4bf54c28c26"
CHROMA_EXPOSED = "7d1f0b5e-2a44-4c38-9d2e-0c3f6b1a9e10"
CHROMA = "/api/v2/tenants/t/databases/d/collections/{}/{}"
PLANTED = "text of another tenant's chunk"
OTHER_TEXT = text_for("9")  # globex's document


def _json(document: Any, status: int = 200) -> CannedResponse:
    return CannedResponse(orjson.dumps(document), status)


def _qdrant_groups(request: SeenRequest) -> CannedResponse:
    """Qdrant's search/groups over acme's points 1-3: grouped by the request's group_by
    field (each point's ``project`` and ``doc_id`` payload values)."""
    body = orjson.loads(request.body)
    key = body["group_by"]
    groups: dict[Any, list[Any]] = {}
    for n in (1, 2, 3):
        payload = {
            "text": text_for(str(n)),
            "tenant": "acme",
            "project": "acme merger" if n < 3 else "acme audit",
            "doc_id": f"doc-{n % 2}",
        }
        point = {"id": n, "version": 1, "score": 1 - n / 10, "payload": payload}
        groups.setdefault(payload[key], []).append(point)
    result = {"groups": [{"id": k, "hits": v} for k, v in groups.items()]}
    return _json({"result": result, "status": "ok", "time": 0.001})


def _qdrant_search_with_status(request: SeenRequest) -> CannedResponse:
    """A Qdrant search answered 200 with an envelope status that is no Qdrant status."""
    hit = {"id": 1, "version": 1, "score": 0.9, "payload": {"text": text_for("1")}}
    return _json({"result": [hit], "status": PLANTED, "time": 0.001})


def _chroma_get(request: SeenRequest) -> CannedResponse:
    """Chroma's get, echoing the request's include with a planted name added."""
    body = orjson.loads(request.body)
    include = [*body.get("include", ["documents", "metadatas"]), PLANTED]
    return _json(
        {
            "ids": ["1", "2"],
            "embeddings": None,
            "documents": [text_for("1"), text_for("2")],
            "uris": None,
            "metadatas": [{"tenant": "acme"}, {"tenant": "acme"}],
            "include": include,
        }
    )


def _es_highlighted() -> CannedResponse:
    """An Elasticsearch search whose hit's highlight quotes its own text, another
    document's text and a field the gate does not release."""
    hit = {
        "_index": "docs",
        "_id": "1",
        "_score": 1.0,
        "_source": {"text": text_for("1"), "tenant": "acme", "secret": "acme merger"},
        "highlight": {
            "text": ["Text of <em>chunk</em> 1", f"<em>{OTHER_TEXT}</em>"],
            "secret": ["<em>acme</em> merger"],
        },
    }
    return _json(_es_answer([hit]))


def _es_answer(hits: list[Any], **more: Any) -> dict[str, Any]:
    return {
        "took": 1,
        "timed_out": False,
        "_shards": {"total": 1, "successful": 1, "skipped": 0, "failed": 0},
        "hits": {"total": {"value": len(hits), "relation": "eq"}, "max_score": 1.0, "hits": hits},
        **more,
    }


@dataclass
class ScrollingElasticsearch:
    """Elasticsearch's search and scroll: a search answers one hit with highlights
    (``_es_highlighted``); ``_search?scroll=`` answers the first of acme's documents
    and a ``_scroll_id``; ``_search/scroll`` with that id answers the next, whoever
    asks (the search, and its tenant condition, are the opener's)."""

    opened: dict[str, list[Any]] = field(default_factory=dict)

    def search(self, request: SeenRequest) -> CannedResponse:
        if "scroll=" not in request.path:
            return _es_highlighted()
        body = orjson.loads(request.body) if request.body else {}
        hits = [
            {"_index": "docs", "_id": n, "_score": 1.0, "_source": {"text": text_for(n)}}
            for n in ("1", "2", "3")
            if _es_tenant(body) in (None, "acme")
        ]
        scroll_id = f"FGluY2x1ZGVfY29udGV4dF91dWlk{len(self.opened)}"
        self.opened[scroll_id] = hits[1:]
        return _json(_es_answer(hits[:1], _scroll_id=scroll_id))

    def scroll(self, request: SeenRequest) -> CannedResponse:
        scroll_id = orjson.loads(request.body)["scroll_id"]
        rest = self.opened.get(scroll_id, [])
        page, self.opened[scroll_id] = rest[:1], rest[1:]
        return _json(_es_answer(page, _scroll_id=scroll_id))


def _es_tenant(body: Any) -> str | None:
    """The tenant a pushed-down search's term asks for (None: no term)."""
    found = [value for key, value in _walk(body) if key == "tenant"]
    return found[0] if found else None


def _walk(value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield key, item
            yield from _walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item)


@pytest.fixture(scope="module")
def scrolling() -> ScrollingElasticsearch:
    return ScrollingElasticsearch()


@pytest.fixture(scope="module")
def http_stack(
    tmp_path_factory: pytest.TempPathFactory, scrolling: ScrollingElasticsearch
) -> Iterator[GateStack]:
    routes: dict[str, Any] = {}
    for prefix in ("/", "/collections/"):
        routes[prefix + UNCONFINED] = {"push_down": False}
        routes[prefix + EXPOSED] = {"push_down": False, "mode": "audit"}
    routes[CHROMA.format(CHROMA_EXPOSED, "").rstrip("/")] = {"push_down": False, "mode": "audit"}
    records = [record_dict(n) for n in ("1", "2", "3")] + [record_dict("9", tenant_id="globex")]
    gate = GateStack(
        tmp_path_factory.mktemp("released-values-http"),
        records,
        config={"routes": routes, "formats": {"qdrant": {"releasable_fields": ["doc_id"]}}},
    ).start()
    upstream = gate.upstream
    for name in (CONFINED, EXPOSED):
        points = f"/collections/{name}/points"
        upstream.respond_with("POST", f"{points}/search/groups", _qdrant_groups)
        upstream.respond_with("POST", f"{points}/search", _qdrant_search_with_status)
    for collection in (CHROMA_COLLECTION, CHROMA_EXPOSED):
        upstream.respond_with("POST", CHROMA.format(collection, "get"), _chroma_get)
    for name in (CONFINED, UNCONFINED, EXPOSED):
        upstream.respond_with("POST", f"/{name}/_search", scrolling.search)
    upstream.respond_with("POST", "/_search/scroll", scrolling.scroll)
    upstream.respond_with("POST", f"/{EXPOSED}/_search/scroll", scrolling.scroll)
    yield gate
    gate.stop()


def _post(stack: GateStack, path: str, body: Any, tenant: str = "acme") -> HttpResult:
    return stack.search(path, body=orjson.dumps(body), tenant=tenant)


# -- Qdrant ------------------------------------------------------------------------


def test_a_qdrant_group_id_of_a_field_not_released_is_refused(http_stack: GateStack) -> None:
    search = {"vector": [0.1, 0.2], "group_by": "project", "limit": 3, "group_size": 3}
    path = "/collections/{}/points/search/groups"
    # The control: the database names the groups by the undeclared field's values.
    exposed = _post(http_stack, path.format(EXPOSED), search)
    assert [g["id"] for g in exposed.json()["result"]["groups"]] == ["acme merger", "acme audit"]
    response = _post(http_stack, path.format(CONFINED), search)
    assert response.status == 403, response.body
    assert response.json()["error"] == "group_id_not_released"
    assert b"merger" not in response.body
    # Grouped by a declared field, the ids are values the caller gets anyway.
    declared = _post(http_stack, path.format(CONFINED), {**search, "group_by": "doc_id"})
    assert declared.status == 200, declared.body
    groups = declared.json()["result"]["groups"]
    assert [g["id"] for g in groups] == ["doc-1", "doc-0"]
    for group in groups:
        assert {hit["payload"]["doc_id"] for hit in group["hits"]} == {group["id"]}


def test_a_qdrant_answer_whose_status_is_no_qdrant_status_is_refused(
    http_stack: GateStack,
) -> None:
    search = {"vector": [0.1, 0.2], "limit": 1, "with_payload": True}
    exposed = _post(http_stack, f"/collections/{EXPOSED}/points/search", search)
    assert exposed.json()["status"] == PLANTED  # the control
    response = _post(http_stack, f"/collections/{CONFINED}/points/search", search)
    assert response.status == 502
    assert response.json()["error"] == "upstream_body_malformed"
    assert PLANTED.encode() not in response.body


# -- Chroma ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_body", "include"),
    [
        ({"include": ["documents"]}, ["documents"]),
        ({}, ["documents", "metadatas"]),  # the server's default, as it echoes it
    ],
)
def test_chromas_include_is_the_requests_not_the_databases(
    http_stack: GateStack, request_body: dict[str, Any], include: list[str]
) -> None:
    exposed = _post(http_stack, CHROMA.format(CHROMA_EXPOSED, "get"), request_body)
    assert exposed.json()["include"] == [*include, PLANTED]  # the control
    response = _post(http_stack, CHROMA.format(CHROMA_COLLECTION, "get"), request_body)
    assert response.status == 200, response.body
    assert response.json()["include"] == include
    assert PLANTED.encode() not in response.body


# -- Elasticsearch -------------------------------------------------------------------


def test_elasticsearch_highlights_keep_only_fragments_of_the_released_text(
    http_stack: GateStack,
) -> None:
    search = {"query": {"match": {"text": "chunk"}}, "highlight": {"fields": {"*": {}}}}
    exposed = _post(http_stack, f"/{EXPOSED}/_search", search)
    (hit,) = exposed.json()["hits"]["hits"]
    # The control: the database's highlight quotes another document and an unreleased field.
    assert OTHER_TEXT in hit["highlight"]["text"][1]
    assert hit["highlight"]["secret"] == ["<em>acme</em> merger"]
    response = _post(http_stack, f"/{CONFINED}/_search", search)
    (hit,) = response.json()["hits"]["hits"]
    assert hit["highlight"] == {"text": ["Text of <em>chunk</em> 1"]}
    assert OTHER_TEXT.encode() not in response.body
    assert b"merger" not in response.body


def test_elasticsearch_scrolls_are_refused(
    http_stack: GateStack, scrolling: ScrollingElasticsearch
) -> None:
    http_stack.upstream.requests.clear()
    opened = _post(http_stack, f"/{CONFINED}/_search?scroll=1m", {"query": {}})
    continued = _post(http_stack, "/_search/scroll", {"scroll_id": "FGluY2x1ZGVfY29udGV4dF91dWlk0"})
    for response in (opened, continued):
        assert response.status == 400, response.body
        assert response.json()["error"] == "request_not_filterable"
    assert http_stack.upstream.requests == []


def test_control_a_scroll_id_lets_another_tenant_continue_the_openers_search(
    http_stack: GateStack, scrolling: ScrollingElasticsearch
) -> None:
    # Where the gate passes the database's answers, acme's scroll id reaches acme,
    # and globex continuing with it reads acme's documents: what refusing closes.
    opened = _post(http_stack, f"/{EXPOSED}/_search?scroll=1m", {"query": {}})
    scroll_id = opened.json()["_scroll_id"]
    stolen = _post(http_stack, f"/{EXPOSED}/_search/scroll", {"scroll_id": scroll_id}, "globex")
    assert [hit["_id"] for hit in stolen.json()["hits"]["hits"]] == ["2"]


def test_a_scroll_id_never_reaches_the_client(http_stack: GateStack) -> None:
    # Without push-down the URL parameters are not checked: the database opens the
    # scroll and sends its id, which the client does not get.
    response = _post(http_stack, f"/{UNCONFINED}/_search?scroll=1m", {"query": {}})
    assert response.status == 200, response.body
    (seen,) = [r for r in http_stack.upstream.requests if "scroll=" in r.path][-1:]
    assert seen.path.startswith(f"/{UNCONFINED}/_search")
    assert "_scroll_id" not in response.json()
    assert [hit["_id"] for hit in response.json()["hits"]["hits"]] == ["1"]
