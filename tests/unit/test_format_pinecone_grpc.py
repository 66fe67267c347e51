"""The Pinecone gRPC adapter: methods, candidates, filtering, fail-closed release, properties.

Replies are built with the message classes of the gate's own copy of
Pinecone's proto (``proto/vendor/pinecone``, loaded from the gate's private
descriptor pool). An independent check of that copy here: its methods are
exactly the method paths compiled into the pinecone client's gRPC extension.
The unchanged client decoding filtered replies through Envoy is
tests/envoy/test_envoy_pinecone_grpc.py. Requests: tests/unit/test_pinecone_grpc_request.py.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping, Sequence
from importlib import util
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.hits import Candidate, Replacement, Route, RouteKind
from sidecar.core.integrity import canonical_fields
from sidecar.formats import grpc_adapter, grpc_frames, grpc_messages
from sidecar.formats.base import SUBSTITUTED_FOR, MalformedBody
from sidecar.formats.options import AdapterOptions
from sidecar.formats.pinecone.grpc import PineconeGrpcFormat
from tests.fixtures.format_strategies import PROPERTIES, adapter

QUERY = Route("POST", "/VectorService/Query")
FETCH = Route("POST", "/VectorService/Fetch")
NAMESPACE = "example-namespace"

ScoredVector = grpc_messages.message_class("ScoredVector")
Vector = grpc_messages.message_class("Vector")
QueryResponse = grpc_messages.message_class("QueryResponse")
FetchResponse = grpc_messages.message_class("FetchResponse")


# -- builders (the gate's own message classes) -----------------------------------------


def _filled(hit: Any, text: str | None, metadata: Mapping[str, Any] | None, **fields: Any) -> Any:
    sparse = fields.pop("sparse", None)
    if sparse is not None:
        hit.sparse_values.indices.extend(sparse[0])
        hit.sparse_values.values.extend(sparse[1])
    if metadata is not None or text is not None or fields:
        hit.metadata.SetInParent()
        hit.metadata.update({**({} if text is None else {"text": text}), **(metadata or {})})
        hit.metadata.update(fields)
    return hit


def scored(
    vector_id: str,
    text: str | None,
    *,
    score: float = 0.5,
    values: Sequence[float] = (),
    metadata: Mapping[str, Any] | None = None,
    **fields: Any,
) -> Any:
    """A ``ScoredVector`` whose metadata holds ``text`` and ``fields``; ``sparse=(i, v)``
    adds sparse values. ``text`` None and no fields: no metadata at all."""
    return _filled(ScoredVector(id=vector_id, score=score, values=values), text, metadata, **fields)


def vector(
    vector_id: str, text: str | None, *, values: Sequence[float] = (0.5,), **fields: Any
) -> Any:
    """A ``Vector`` as ``Fetch`` returns it."""
    return _filled(Vector(id=vector_id, values=values), text, None, **fields)


def query_reply(
    matches: Sequence[Any],
    *,
    namespace: str = NAMESPACE,
    read_units: int | None = 5,
    results: Sequence[tuple[Sequence[Any], str]] = (),
) -> Any:
    """A ``QueryResponse``; ``results`` fills the deprecated per-query entries."""
    reply = QueryResponse(matches=matches, namespace=namespace)
    for entry_matches, entry_namespace in results:
        reply.results.add(matches=entry_matches, namespace=entry_namespace)
    if read_units is not None:
        reply.usage.read_units = read_units
    return reply


def fetch_reply(vectors: Sequence[Any], *, read_units: int | None = 1) -> Any:
    """A ``FetchResponse`` keyed by each vector's id."""
    reply = FetchResponse(namespace=NAMESPACE)
    for item in vectors:
        reply.vectors[item.id].CopyFrom(item)
    if read_units is not None:
        reply.usage.read_units = read_units
    return reply


def framed(message: Any) -> bytes:
    return grpc_adapter.encode_unary(message)


def decoded(body: bytes, route: Route = QUERY) -> Any:
    """The one reply message of ``body``; fails on unknown fields (none may go out)."""
    reply = grpc_adapter.decode_unary(body, "QueryResponse" if route == QUERY else "FetchResponse")
    assert not grpc_messages.has_unknown_fields(reply)
    return reply


def released(reply: Any, fmt: PineconeGrpcFormat | None = None, **kwargs: Any) -> Any:
    """``reply`` as the gate sends it with every hit kept."""
    route = QUERY if reply.DESCRIPTOR.name == "QueryResponse" else FETCH
    parsed = (fmt or PineconeGrpcFormat()).parse(framed(reply), route)
    return decoded(parsed.render(range(len(parsed.candidates)), **kwargs), route)


def without_usage(reply: Any) -> Any:
    out = type(reply)()
    out.CopyFrom(reply)
    out.ClearField("usage")
    return out


def python(struct_message: Any) -> dict[str, Any]:
    return {key: value for key, value in struct_message.items()}


MATCHES = [
    scored("doc-1#0", "alpha", score=0.91, doc_id="doc-1"),
    scored("doc-1#1", "beta", score=0.87, values=[0.1, 0.2]),
    scored("doc-2#0", "gamma", score=0.5, tags=["x", "y"], sparse=([1, 7], [0.3, 0.4])),
    scored("doc-3#0", "delta", score=0.25, year=2019, draft=False),
    scored("doc-4#0", "epsilon", score=0.125),
]
EXTRA = ["doc_id", "tags", "year", "draft"]
FMT = PineconeGrpcFormat(AdapterOptions(releasable_fields=EXTRA))


def _ids(matches: Any) -> list[str]:
    return [match.id for match in matches]


# -- methods ----------------------------------------------------------------------------

KINDS = {
    "Query": RouteKind.FILTERED,
    "Fetch": RouteKind.FILTERED,
    "Upsert": RouteKind.WRITE,
    "Update": RouteKind.WRITE,
    "Delete": RouteKind.WRITE,
    "List": RouteKind.CONTENT,
    "DescribeIndexStats": RouteKind.CONTENT,
    "ListNamespaces": RouteKind.CONTENT,
    "DescribeNamespace": RouteKind.CONTENT,
    "FetchByMetadata": RouteKind.CONTENT,
    "CreateNamespace": RouteKind.WRITE,
    "DeleteNamespace": RouteKind.WRITE,
}


def _service_methods() -> set[str]:
    """The methods of ``VectorService`` in the gate's compiled copy of the proto."""
    service = grpc_messages.message_class("QueryRequest").DESCRIPTOR.file.pool
    return {m.name for m in service.FindServiceByName("VectorService").methods}


def test_every_method_of_the_service_is_classified() -> None:
    assert _service_methods() == set(KINDS)
    fmt = PineconeGrpcFormat()
    for name, kind in KINDS.items():
        assert fmt.route_kind(Route("POST", f"/VectorService/{name}")) is kind, name


def test_the_client_calls_exactly_the_methods_of_the_gates_proto() -> None:
    # An independent check of the copy: the paths compiled into the pinecone
    # client's gRPC extension (Rust, so its strings run together).
    spec = util.find_spec("pinecone._grpc")
    assert spec is not None and spec.origin is not None
    binary = Path(spec.origin).read_bytes()
    methods = sorted(_service_methods(), key=len, reverse=True)
    called = set()
    for found in re.finditer(rb"/VectorService/", binary):
        rest = binary[found.end() : found.end() + 40].decode("latin-1")
        name = next((m for m in methods if rest.startswith(m)), None)
        assert name is not None, rest
        called.add(name)
    assert called == set(KINDS)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/VectorService/Query"),
        ("POST", "/VectorService"),
        ("POST", "/VectorService/"),
        ("POST", "/VectorService/Query/extra"),
        ("POST", "/pinecone.VectorService/Query"),
        ("POST", "/qdrant.Points/Query"),
        ("POST", "/query"),
        ("POST", "/vectors/fetch"),
    ],
)
def test_paths_outside_the_service_are_not_its(method: str, path: str) -> None:
    assert PineconeGrpcFormat().route_kind(Route(method, path)) is None


def test_an_unknown_method_may_return_content() -> None:
    assert (
        PineconeGrpcFormat().route_kind(Route("POST", "/VectorService/Scan")) is RouteKind.CONTENT
    )


def test_name_and_collections() -> None:
    fmt = PineconeGrpcFormat()
    assert fmt.name == "pinecone_grpc"
    assert fmt.route_collections(QUERY) == []


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"text_field": ""}, "text_field"),
        ({"id_field": ""}, "id_field"),
        ({"text_field": "chunk", "id_field": "chunk"}, "id_field"),
        ({"hashed_fields": "title"}, "hashed_fields"),
        ({"releasable_fields": [".x"]}, "releasable_fields"),
    ],
)
def test_invalid_options_name_the_option(kwargs: dict[str, Any], option: str) -> None:
    with pytest.raises(ValueError, match=option):
        adapter(PineconeGrpcFormat, **kwargs)


@pytest.mark.parametrize("name", ["List", "DescribeIndexStats", "FetchByMetadata", "Upsert"])
def test_parse_rejects_a_method_it_does_not_filter(name: str) -> None:
    with pytest.raises(ValueError, match="not handled"):
        FMT.parse(framed(query_reply(MATCHES)), Route("POST", f"/VectorService/{name}"))


# -- candidates -------------------------------------------------------------------------


def test_query_candidates_number_legacy_results_then_matches() -> None:
    reply = query_reply(MATCHES[3:], results=[(MATCHES[:2], "a"), ([], "b"), (MATCHES[2:3], "")])
    parsed = FMT.parse(framed(reply), QUERY)
    texts = ["alpha", "beta", "gamma", "delta", "epsilon"]
    assert list(parsed.candidates) == [
        Candidate(i, match.id, text)
        for i, (match, text) in enumerate(zip(MATCHES, texts, strict=True))
    ]


@pytest.mark.parametrize(
    ("hit", "chunk_id", "text", "problem"),
    [
        (scored("v1", "t"), "v1", "t", None),
        (scored("v1", None), "v1", None, "no metadata"),
        (scored("v1", None, metadata={}), "v1", None, "metadata field 'text' missing"),
        (scored("v1", None, metadata={"text": None}), "v1", None, "metadata field 'text' missing"),
        (
            scored("v1", None, metadata={"text": 3}),
            "v1",
            None,
            "metadata field 'text' is not a string",
        ),
        (
            scored("v1", None, metadata={"text": ["SECRET"]}),
            "v1",
            None,
            "metadata field 'text' is not a string",
        ),
        (scored("", "t"), None, "t", "hit id is empty"),
        (scored("", None), None, None, "hit id is empty; no metadata"),
    ],
)
def test_query_candidate(
    hit: Any, chunk_id: str | None, text: str | None, problem: str | None
) -> None:
    parsed = FMT.parse(framed(query_reply([hit])), QUERY)
    assert parsed.candidates == (Candidate(0, chunk_id, text, problem),)
    assert "SECRET" not in (parsed.candidates[0].problem or "")


@pytest.mark.parametrize(
    ("value", "chunk_id", "problem"),
    [
        ("c-1", "c-1", None),
        (12, "12", None),  # a double on the wire, integral: the REST API writes 12
        (1.5, None, "metadata field 'chunk' is not a string or integer"),
        (None, None, "metadata field 'chunk' missing"),
    ],
)
def test_candidate_from_id_field(value: Any, chunk_id: str | None, problem: str | None) -> None:
    fmt = PineconeGrpcFormat(AdapterOptions(text_field="body", id_field="chunk"))
    hit = scored("vec-9", None, body="b", chunk=value)
    assert fmt.parse(framed(query_reply([hit])), QUERY).candidates == (
        Candidate(0, chunk_id, "b", problem),
    )


def test_hashed_metadata_reaches_the_candidate_as_the_rest_api_writes_it() -> None:
    hit = scored("v1", "t", title="T", year=2019, ratio=0.5, big=2.0**60)
    fmt = PineconeGrpcFormat(
        AdapterOptions(hashed_fields=["title", "year", "ratio", "big", "missing"])
    )
    (candidate,) = fmt.parse(framed(query_reply([hit])), QUERY).candidates
    assert candidate.fields == canonical_fields(
        {"title": "T", "year": 2019, "ratio": 0.5, "big": 2.0**60}
    )


def test_fetch_candidates_are_the_map_keys() -> None:
    reply = fetch_reply([vector("a", "ta"), vector("b", "tb"), vector("c", None)])
    parsed = FMT.parse(framed(reply), FETCH)
    by_id = {c.chunk_id: c for c in parsed.candidates}
    assert by_id == {
        "a": Candidate(by_id["a"].position, "a", "ta"),
        "b": Candidate(by_id["b"].position, "b", "tb"),
        "c": Candidate(by_id["c"].position, "c", None, "no metadata"),
    }
    assert sorted(c.position for c in parsed.candidates) == [0, 1, 2]


def test_a_fetched_vector_whose_id_differs_from_its_key_is_refused() -> None:
    reply = FetchResponse()
    reply.vectors["mine"].CopyFrom(vector("SECRET-other", "t"))
    reply.vectors["no-id"].CopyFrom(vector("", "u"))
    parsed = FMT.parse(framed(reply), FETCH)
    by_text = {c.text: c for c in parsed.candidates}
    assert by_text["t"].chunk_id is None
    assert by_text["t"].problem == "vector id differs from its map key"
    assert by_text["u"].chunk_id == "no-id" and by_text["u"].problem is None
    out = decoded(parsed.render([by_text["u"].position]), FETCH)
    assert list(out.vectors) == ["no-id"] and out.vectors["no-id"].id == ""


# -- filtering ---------------------------------------------------------------------------

KEEPS = [set(), {0}, {1, 3}, {0, 2, 4}, set(range(5)), {4, 99, -1}]


@pytest.mark.parametrize("keep", KEEPS)
def test_query_render_keeps_exactly_the_kept_matches(keep: set[int]) -> None:
    parsed = FMT.parse(framed(query_reply(MATCHES)), QUERY)
    out = decoded(parsed.render(keep))
    kept = [m for i, m in enumerate(MATCHES) if i in keep]
    assert out == query_reply(kept, read_units=None)
    assert parsed.released_positions(keep) == sorted(p for p in keep if 0 <= p < 5)


@pytest.mark.parametrize("keep", KEEPS)
def test_legacy_results_keep_every_entry_and_filter_each(keep: set[int]) -> None:
    reply = query_reply(MATCHES[3:], results=[(MATCHES[:2], "a"), ([], "b"), (MATCHES[2:3], "")])
    out = decoded(FMT.parse(framed(reply), QUERY).render(keep))
    assert [entry.namespace for entry in out.results] == ["a", "b", ""]
    sent = [_ids(entry.matches) for entry in out.results]
    assert sent == [
        [m.id for i, m in enumerate(MATCHES[:2]) if i in keep],
        [],
        [m.id for i, m in enumerate(MATCHES[2:3], 2) if i in keep],
    ]
    assert _ids(out.matches) == [m.id for i, m in enumerate(MATCHES[3:], 3) if i in keep]
    assert out.namespace == NAMESPACE and not out.HasField("usage")


def test_nothing_removed_goes_out_byte_for_byte() -> None:
    for reply, route in (
        (query_reply(MATCHES, read_units=None, results=[(MATCHES[:1], "a")]), QUERY),
        (fetch_reply([vector("a", "ta", doc_id="d"), vector("b", "tb")], read_units=None), FETCH),
    ):
        body = framed(reply)
        parsed = FMT.parse(body, route)
        assert parsed.render(range(len(parsed.candidates))) is body


def test_usage_is_dropped() -> None:
    # Read units count every record the database read, whichever tenant's.
    assert not released(query_reply(MATCHES), FMT).HasField("usage")
    assert not released(fetch_reply([vector("a", "t")]), FMT).HasField("usage")


def test_undeclared_metadata_is_dropped_and_declared_metadata_kept() -> None:
    hit = scored(
        "v1", "t", score=0.25, title="T", source={"url": "u", "secret": "SECRET"}, x="SECRET"
    )
    fmt = PineconeGrpcFormat(
        AdapterOptions(hashed_fields=["title"], releasable_fields=["source.url"])
    )
    out = fmt.parse(framed(query_reply([hit])), QUERY).render({0})
    assert b"SECRET" not in out
    (sent,) = decoded(out).matches
    assert sent.id == "v1" and sent.score == 0.25
    assert python(sent.metadata) == {"text": "t", "title": "T", "source": {"url": "u"}}


def test_the_hits_own_fields_stay() -> None:
    (sent,) = released(query_reply([MATCHES[2]]), FMT).matches
    assert sent == MATCHES[2]
    assert list(sent.sparse_values.indices) == [1, 7]
    (sent,) = released(query_reply([MATCHES[1]]), PineconeGrpcFormat()).matches
    assert list(sent.values) == pytest.approx([0.1, 0.2])


def _unknown_field(number: int, payload: bytes) -> bytes:
    """A length-delimited field the gate's proto does not declare."""
    return bytes([number << 3 | 2, len(payload)]) + payload


def test_unknown_fields_never_go_out() -> None:
    # A newer server's per-hit field, reply field and metadata value kind.
    hit = scored("v1", "t").SerializeToString() + _unknown_field(15, b"SECRET-hit")
    reply = QueryResponse(namespace=NAMESPACE).SerializeToString()
    reply += bytes([2 << 3 | 2, len(hit)]) + hit  # matches = 2
    reply += _unknown_field(14, b"SECRET-reply")
    body = grpc_frames.frame(reply)
    parsed = PineconeGrpcFormat().parse(body, QUERY)
    assert [c.chunk_id for c in parsed.candidates] == ["v1"]
    out = parsed.render({0})
    assert out != body and b"SECRET" not in out
    assert _ids(decoded(out).matches) == ["v1"]


def test_a_field_sent_twice_is_sent_once() -> None:
    # Protobuf keeps the last of two occurrences of a field; a client reading the
    # first would see a namespace the gate never read. The gate sends what it read.
    first = QueryResponse(namespace="SECRET").SerializeToString()
    reply = query_reply(MATCHES[:1], read_units=None)
    body = grpc_frames.frame(first + reply.SerializeToString())
    parsed = FMT.parse(body, QUERY)
    out = parsed.render({0})
    assert b"SECRET" not in out
    assert decoded(out) == reply


def test_limit_trims_the_matches_not_the_legacy_results() -> None:
    reply = query_reply(MATCHES[2:], results=[(MATCHES[:2], "a")])
    parsed = FMT.parse(framed(reply), QUERY)
    out = decoded(parsed.render(range(5), [1]))
    assert [_ids(e.matches) for e in out.results] == [_ids(MATCHES[:2])]
    assert _ids(out.matches) == _ids(MATCHES[2:3])
    assert parsed.released_positions({0, 1, 3, 4}, [1]) == [0, 1, 3]
    assert parsed.render({1, 2}, [None]) == parsed.render({1, 2})


@pytest.mark.parametrize("limits", [[3, 1], [None, None]])
def test_query_takes_one_limit(limits: list[int | None]) -> None:
    parsed = FMT.parse(framed(query_reply(MATCHES)), QUERY)
    with pytest.raises(MalformedBody):
        parsed.render({0}, limits)


def test_fetch_is_never_trimmed() -> None:
    parsed = FMT.parse(framed(fetch_reply([vector("a", "t")])), FETCH)
    with pytest.raises(MalformedBody):
        parsed.render({0}, [1])
    assert list(decoded(parsed.render({0}, ()), FETCH).vectors) == ["a"]


@pytest.mark.parametrize("keep", [set(), {0}, {1, 2}, {0, 1, 2}])
def test_fetch_render_keeps_exactly_the_kept_vectors(keep: set[int]) -> None:
    vectors = [vector("a", "ta", doc_id="d", secret="SECRET"), vector("b", "tb"), vector("c", "tc")]
    parsed = FMT.parse(framed(fetch_reply(vectors)), FETCH)
    out = parsed.render(keep)
    assert b"SECRET" not in out
    kept_ids = {c.chunk_id for c in parsed.candidates if c.position in keep}
    reply = decoded(out, FETCH)
    assert set(reply.vectors) == kept_ids
    assert reply.namespace == NAMESPACE
    for key in kept_ids:
        assert reply.vectors[key].id == key
        assert list(reply.vectors[key].values) == [0.5]
        assert python(reply.vectors[key].metadata)["text"] == f"t{key}"


# -- substitution -------------------------------------------------------------------------


def test_query_substitute_replaces_id_and_text_and_keeps_the_hits_own_fields() -> None:
    parsed = FMT.parse(framed(query_reply(MATCHES[:2])), QUERY)
    out = decoded(parsed.render({0, 1}, replacements={0: Replacement("doc-1#0-v2", "new")}))
    first, second = out.matches
    assert first.id == "doc-1#0-v2" and first.score == MATCHES[0].score
    # Declared metadata described the replaced document: the substitute has none.
    assert python(first.metadata) == {"text": "new", SUBSTITUTED_FOR: "doc-1#0"}
    assert second == MATCHES[1]


def test_query_substitute_in_id_field_mode() -> None:
    hit = scored("vec-7", "old", chunk_id="sop-7-v2", doc="SOP-7")
    fmt = PineconeGrpcFormat(AdapterOptions(id_field="chunk_id", releasable_fields=["doc"]))
    parsed = fmt.parse(framed(query_reply([hit])), QUERY)
    (sent,) = decoded(
        parsed.render({0}, replacements={0: Replacement("sop-7-v3", "rev 3")})
    ).matches
    assert sent.id == "vec-7"
    assert python(sent.metadata) == {
        "text": "rev 3",
        "chunk_id": "sop-7-v3",
        SUBSTITUTED_FOR: "sop-7-v2",
    }


def test_fetch_substitute_moves_to_its_own_key() -> None:
    parsed = FMT.parse(framed(fetch_reply([vector("a", "ta")])), FETCH)
    out = decoded(parsed.render({0}, replacements={0: Replacement("a2", "new")}), FETCH)
    assert list(out.vectors) == ["a2"]
    assert out.vectors["a2"].id == "a2"
    assert python(out.vectors["a2"].metadata) == {"text": "new", SUBSTITUTED_FOR: "a"}


def test_a_fetch_substitute_never_displaces_an_admitted_vector() -> None:
    # "a" is superseded by "b", which the app fetched too: "b" goes out once, as itself.
    parsed = FMT.parse(framed(fetch_reply([vector("a", "ta"), vector("b", "tb")])), FETCH)
    position = {c.chunk_id: c.position for c in parsed.candidates}
    replacements = {position["a"]: Replacement("b", "tb")}
    out = decoded(parsed.render({0, 1}, replacements=replacements), FETCH)
    assert list(out.vectors) == ["b"]
    assert python(out.vectors["b"].metadata) == {"text": "tb"}
    assert parsed.released_positions({0, 1}) == [position["b"]]
    # Two substitutes for one successor: it goes out once.
    parsed = FMT.parse(framed(fetch_reply([vector("a", "ta"), vector("c", "tc")])), FETCH)
    both = {0: Replacement("b", "tb"), 1: Replacement("b", "tb")}
    assert list(decoded(parsed.render({0, 1}, replacements=both), FETCH).vectors) == ["b"]


def test_released_positions_follow_the_render() -> None:
    parsed = FMT.parse(framed(fetch_reply([vector("a", "ta"), vector("b", "tb")])), FETCH)
    position = {c.chunk_id: c.position for c in parsed.candidates}
    parsed.render({0, 1}, replacements={position["a"]: Replacement("b", "tb")})
    assert parsed.released_positions({0, 1}) == [position["b"]]


def test_render_is_repeatable() -> None:
    parsed = FMT.parse(framed(query_reply(MATCHES)), QUERY)
    first = parsed.render({0, 3})
    parsed.render({0, 1, 2, 3, 4}, replacements={0: Replacement("new", "new text")})
    assert parsed.render({0, 3}) == first


# -- malformed replies ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\x00\x00\x00",  # a truncated prefix
        b"\x00\x00\x00\x00\x09abc",  # a truncated message
        b"\x01\x00\x00\x00\x00",  # compressed: the sidecar decompresses before adapters
        b"\x02\x00\x00\x00\x00",  # an unknown flag
        grpc_frames.frame(b"") * 2,  # two messages in a unary reply
        grpc_frames.frame(b"\xff\xff\xff"),  # not a protobuf message
        grpc_frames.frame(b"\x12\x05SECRET"),  # a match that is cut short
    ],
)
def test_undecodable_replies_are_malformed(body: bytes) -> None:
    with pytest.raises(MalformedBody) as raised:
        FMT.parse(body, QUERY)
    assert "SECRET" not in str(raised.value)


def test_a_metadata_value_without_kind_is_malformed() -> None:
    hit = scored("v1", "t")
    hit.metadata.fields["x"].SetInParent()  # a Value with no kind: no JSON value
    with pytest.raises(MalformedBody):
        FMT.parse(framed(query_reply([hit])), QUERY)


def test_an_empty_reply_has_no_hits() -> None:
    parsed = FMT.parse(grpc_frames.frame(b""), QUERY)
    assert parsed.candidates == ()
    assert decoded(parsed.render(set())) == QueryResponse()


# -- properties -----------------------------------------------------------------------------

struct_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not f.is_integer())
    | st.text(max_size=8)
)
struct_values = st.recursive(
    struct_scalars,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)
float32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@st.composite
def scored_lists(draw: st.DrawFn, min_size: int = 0) -> list[Any]:
    ids = draw(
        st.lists(st.text(min_size=1, max_size=8), min_size=min_size, max_size=6, unique=True)
    )
    hits = []
    for vector_id in ids:
        # Short keys, so that the released ones (from the same letters) often match.
        keys = st.text(alphabet="ab.x", min_size=1, max_size=3)
        extra = draw(st.dictionaries(keys, struct_values, max_size=3))
        extra.pop("text", None)
        hit = scored(
            vector_id,
            draw(st.text(max_size=12)),
            score=draw(float32),
            values=draw(st.lists(float32, max_size=3)),
            metadata=extra,
        )
        if draw(st.booleans()):
            hit.sparse_values.indices.extend(draw(st.lists(st.integers(0, 2**32 - 1), max_size=2)))
        hits.append(hit)
    return hits


def _projected(hit: Any, keys: set[str]) -> Any:
    out = type(hit)()
    out.CopyFrom(hit)
    for key in list(out.metadata.fields):
        if key not in keys:
            del out.metadata.fields[key]
    return out


@PROPERTIES
@given(
    matches=scored_lists(),
    legacy=st.lists(scored_lists(), max_size=2),
    keep=st.sets(st.integers(0, 20)),
    limit=st.none() | st.integers(0, 6),
    data=st.data(),
)
def test_property_query_release(
    matches: list[Any], legacy: list[list[Any]], keep: set[int], limit: int | None, data: Any
) -> None:
    reply = query_reply(matches, results=[(entry, f"ns{i}") for i, entry in enumerate(legacy)])
    released_keys = set(data.draw(st.lists(st.text(alphabet="abx", min_size=1, max_size=3))))
    fmt = PineconeGrpcFormat(AdapterOptions(releasable_fields=sorted(released_keys)))
    parsed = fmt.parse(framed(reply), QUERY)
    every = [hit for entry in legacy for hit in entry] + matches
    assert [c.chunk_id for c in parsed.candidates] == [hit.id for hit in every]
    out = decoded(parsed.render(keep, [limit]))
    released = {"text", *released_keys}
    expected_sent: list[int] = []
    start = 0
    for i, entry in enumerate(legacy):
        positions = [p for p in range(start, start + len(entry)) if p in keep]
        assert out.results[i].namespace == f"ns{i}"
        assert list(out.results[i].matches) == [_projected(every[p], released) for p in positions]
        expected_sent += positions
        start += len(entry)
    kept_positions = [p for p in range(start, start + len(matches)) if p in keep][:limit]
    assert list(out.matches) == [_projected(every[p], released) for p in kept_positions]
    assert parsed.released_positions(keep, [limit]) == expected_sent + kept_positions
    assert not out.HasField("usage") and out.namespace == NAMESPACE


@PROPERTIES
@given(matches=scored_lists(min_size=1), data=st.data())
def test_property_substitutes_carry_the_replacement(matches: list[Any], data: Any) -> None:
    parsed = FMT.parse(framed(query_reply(matches)), QUERY)
    positions = data.draw(st.sets(st.sampled_from(range(len(matches))), min_size=1))
    replacements = {p: Replacement(f"new-{p}", data.draw(st.text(max_size=8))) for p in positions}
    out = decoded(parsed.render(range(len(matches)), replacements=replacements))
    for position, sent in enumerate(out.matches):
        original = matches[position]
        assert (sent.score, list(sent.values)) == (original.score, list(original.values))
        if position in replacements:
            assert sent.id == replacements[position].chunk_id
            assert python(sent.metadata) == {
                "text": replacements[position].text,
                SUBSTITUTED_FOR: original.id,
            }
        else:
            assert sent.id == original.id


@PROPERTIES
@given(vectors=scored_lists(), keep=st.sets(st.integers(0, 8)))
def test_property_fetch_release(vectors: list[Any], keep: set[int]) -> None:
    reply = fetch_reply(
        [
            _filled(Vector(id=h.id, values=h.values), None, {k: v for k, v in h.metadata.items()})
            for h in vectors
        ]
    )
    parsed = FMT.parse(framed(reply), FETCH)
    kept = {c.chunk_id for c in parsed.candidates if c.position in keep}
    out = decoded(parsed.render(keep), FETCH)
    assert set(out.vectors) == kept
    for key in kept:
        assert out.vectors[key] == _projected(reply.vectors[key], {"text"})
    assert parsed.released_positions(keep) == sorted(p for p in keep if p < len(vectors))


@PROPERTIES
@given(matches=scored_lists(min_size=1), data=st.data())
def test_property_mutated_replies_are_refused_or_released_clean(
    matches: list[Any], data: Any
) -> None:
    message = query_reply(matches).SerializeToString()
    at = data.draw(st.integers(0, len(message)))
    cut = data.draw(st.integers(0, 4))
    inserted = data.draw(st.binary(max_size=6))
    body = grpc_frames.frame(message[:at] + inserted + message[at + cut :])
    try:
        parsed = FMT.parse(body, QUERY)
    except MalformedBody:
        return
    keep = set(range(len(parsed.candidates)))
    out = parsed.render(keep)
    reply = grpc_adapter.decode_unary(out, "QueryResponse")
    # What goes out is known fields only, and every hit in it was a candidate.
    assert not grpc_messages.has_unknown_fields(reply)
    sent = [hit.id for entry in reply.results for hit in entry.matches] + _ids(reply.matches)
    assert sent == [c.chunk_id or "" for c in parsed.candidates]


@PROPERTIES
@given(body=st.binary(max_size=40))
def test_property_arbitrary_bytes_never_pass_unread(body: bytes) -> None:
    for route in (QUERY, FETCH):
        try:
            parsed = FMT.parse(grpc_frames.frame(body), route)
        except MalformedBody:
            continue
        out = parsed.render(range(len(parsed.candidates)))
        assert not grpc_messages.has_unknown_fields(decoded_any(out, route))


def decoded_any(body: bytes, route: Route) -> Any:
    return grpc_adapter.decode_unary(body, "QueryResponse" if route == QUERY else "FetchResponse")


def test_frame_prefix_is_grpcs() -> None:
    # The adapter's bodies are plain gRPC frames: flag 0, big-endian length.
    body = framed(query_reply(MATCHES[:1]))
    assert body[0] == 0 and struct.unpack(">I", body[1:5])[0] == len(body) - 5
