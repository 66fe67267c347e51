"""The Pinecone data-plane adapter: routes, candidates, filtering, malformed bodies.

Body shapes come from the data-plane OpenAPI specs (pinecone-io/pinecone-api,
2025-10 and 2026-07 ``db_data`` specs) and the pinecone client's models. Every
filtered body is validated the way the client reads it: with
``VectorsAdapter.to_query_response`` / ``to_search_response`` (the entry points
``Index.query`` and ``Index.search`` use), which decode the JSON strictly into
``QueryResponse`` / ``SearchRecordsResponse`` with msgspec. The client ignores
the deprecated ``results`` array, so each of its entries is decoded as a
``QueryResponse`` too (``SingleQueryResults`` has the same fields).
Requests are tested in tests/unit/test_pinecone_request.py.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pinecone._internal.adapters.vectors_adapter import VectorsAdapter

from sidecar.core.hits import Candidate, Replacement, Route, RouteKind
from sidecar.core.integrity import canonical_fields
from sidecar.formats.base import SUBSTITUTED_FOR, MalformedBody, ParsedBody
from sidecar.formats.options import AdapterOptions
from sidecar.formats.pinecone.rest import PineconeFormat
from tests.fixtures.format_strategies import PROPERTIES, adapter
from tests.fixtures.pinecone_bodies import (
    NAMESPACE,
    QUERY_ROUTE,
    Body,
    Hit,
    encode,
    match,
    query_body,
    query_result,
    record_hit,
    search_body,
    search_route,
)

SEARCH_ROUTE = search_route()


def validate(out: bytes, route: Route) -> Body:
    """Decode ``out`` as the pinecone client does; the decoded JSON."""
    decoded: Body = orjson.loads(out)
    if route == QUERY_ROUTE:
        VectorsAdapter.to_query_response(out)
        for entry in decoded.get("results", []):
            VectorsAdapter.to_query_response(orjson.dumps(entry))
    else:
        VectorsAdapter.to_search_response(out)
    return decoded


# The metadata fields of MATCHES and HITS beyond the text, declared releasable.
EXTRA = ["doc_id", "tags", "year", "draft", "title", "nested"]


def _parse(body: Body, route: Route, fmt: PineconeFormat | None = None) -> ParsedBody:
    return (fmt or PineconeFormat(AdapterOptions(releasable_fields=EXTRA))).parse(
        encode(body), route
    )


def _filtered(body: Body, route: Route, keep: Collection[int], **kwargs: Any) -> Body:
    return validate(_parse(body, route).render(keep, **kwargs), route)


MATCHES = [
    match("doc-1#0", "alpha", score=0.91, doc_id="doc-1"),
    match("doc-1#1", "beta", score=0.87, values=[0.1, 0.2]),
    match("doc-2#0", "gamma", score=0.5, tags=["x", "y"], sparse=([1, 7], [0.3, 0.4])),
    match("doc-3#0", "delta", score=0.4, year=2019, draft=False),
    match("doc-4#0", "epsilon", score=0.3),
]
HITS = [
    record_hit("rec-1", "alpha", score=0.93, title="A"),
    record_hit("rec-2", "beta", score=0.81, nested={"a": [1, None]}),
    record_hit("rec-3", "gamma", score=0.2),
]


def _legacy(batches: Sequence[Sequence[Hit]], matches: Sequence[Hit]) -> Body:
    return query_body(matches, results=[query_result(batch) for batch in batches])


def _kept(hits: Sequence[Hit], keep: Collection[int], start: int = 0) -> list[Hit]:
    return [hit for position, hit in enumerate(hits, start) if position in keep]


# -- routes ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "kind"),
    [
        ("POST", "/query", RouteKind.FILTERED),
        ("post", "/query/", RouteKind.FILTERED),
        ("POST", "/QUERY", RouteKind.FILTERED),
        ("POST", "/records/namespaces/example-namespace/search", RouteKind.FILTERED),
        ("POST", "/records/namespaces/__default__/search", RouteKind.FILTERED),
        ("GET", "/query", RouteKind.CONTENT),
        ("GET", "/records/namespaces/ns/search", RouteKind.CONTENT),
        ("GET", "/vectors/fetch", RouteKind.CONTENT),
        ("GET", "/vectors/fetch/", RouteKind.CONTENT),
        ("POST", "/vectors/fetch_by_metadata", RouteKind.CONTENT),
        ("POST", "/vectors/scan", RouteKind.CONTENT),
        ("GET", "/vectors/fetch/extra", RouteKind.CONTENT),
        ("GET", "/vectors", RouteKind.CONTENT),
        ("POST", "/records/namespaces/ns/fetch", RouteKind.CONTENT),
        ("POST", "/records/namespaces//search", RouteKind.CONTENT),
        ("POST", "/records", RouteKind.CONTENT),
        ("POST", "/namespaces/ns/documents/search", RouteKind.CONTENT),
        ("POST", "/namespaces/ns/documents/fetch", RouteKind.CONTENT),
        ("POST", "/namespaces/ns/documents/export", RouteKind.CONTENT),
        ("POST", "/namespaces/ns/documents", RouteKind.CONTENT),
        ("GET", "/namespaces/ns/records", RouteKind.CONTENT),
        ("GET", "/vectors/list", RouteKind.CONTENT),
        ("POST", "/describe_index_stats", RouteKind.CONTENT),
        ("GET", "/describe_index_stats", RouteKind.CONTENT),
        ("POST", "/namespaces/ns/documents/list", RouteKind.CONTENT),
        ("GET", "/namespaces", RouteKind.CONTENT),
        ("GET", "/namespaces/ns", RouteKind.CONTENT),
        ("HEAD", "/namespaces/ns", RouteKind.CONTENT),
        ("GET", "/namespace-aliases", RouteKind.CONTENT),
        ("GET", "/namespace-aliases/current", RouteKind.CONTENT),
        ("GET", "/bulk/imports", RouteKind.CONTENT),
        ("GET", "/bulk/imports/101", RouteKind.CONTENT),
        ("POST", "/vectors/upsert", RouteKind.WRITE),
        ("POST", "/vectors/update", RouteKind.WRITE),
        ("POST", "/vectors/delete", RouteKind.WRITE),
        ("DELETE", "/vectors/delete", RouteKind.WRITE),
        ("POST", "/records/namespaces/ns/upsert", RouteKind.WRITE),
        ("POST", "/namespaces/ns/documents/upsert", RouteKind.WRITE),
        ("POST", "/namespaces/ns/documents/update", RouteKind.WRITE),
        ("POST", "/namespaces/ns/documents/delete", RouteKind.WRITE),
        ("POST", "/namespaces", RouteKind.WRITE),
        ("DELETE", "/namespaces/ns", RouteKind.WRITE),
        ("POST", "/namespace-aliases", RouteKind.WRITE),
        ("PATCH", "/namespace-aliases/current", RouteKind.WRITE),
        ("DELETE", "/namespace-aliases/current", RouteKind.WRITE),
        ("POST", "/bulk/imports", RouteKind.WRITE),
        ("DELETE", "/bulk/imports/101", RouteKind.WRITE),
        # Not the index host's API: control plane, inference and other databases.
        ("GET", "/indexes", None),
        ("POST", "/collections", None),
        ("POST", "/collections/docs/points/search", None),
        ("POST", "/embed", None),
        ("POST", "/rerank", None),
        ("POST", "/v1/query", None),
        ("POST", "/query/batch", None),
        ("POST", "/queryx", None),
        ("POST", "/v2/vectordb/entities/search", None),
        ("POST", "/v2/namespaces/ns/query", None),
        ("POST", "/api/v2/collections/c/query", None),
        ("GET", "/bulk", None),
        ("POST", "/", None),
        ("POST", "", None),
    ],
)
def test_route_kind(method: str, path: str, kind: RouteKind | None) -> None:
    assert PineconeFormat().route_kind(Route(method, path)) is kind


def test_name() -> None:
    assert PineconeFormat().name == "pinecone"


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"text_field": ""}, "text_field"),
        ({"text_field": None}, "text_field"),
        ({"id_field": ""}, "id_field"),
        ({"id_field": 3}, "id_field"),
        ({"text_field": "chunk", "id_field": "chunk"}, "id_field"),
        ({"hashed_fields": "title"}, "hashed_fields"),
        ({"releasable_fields": [".x"]}, "releasable_fields"),
    ],
)
def test_invalid_options_name_the_option(kwargs: dict[str, Any], option: str) -> None:
    with pytest.raises(ValueError, match=option):
        adapter(PineconeFormat, **kwargs)


@pytest.mark.parametrize("route", [Route("GET", "/vectors/fetch"), Route("GET", "/query")])
def test_parse_rejects_a_route_it_does_not_filter(route: Route) -> None:
    with pytest.raises(ValueError, match="not handled"):
        PineconeFormat().parse(encode(query_body(MATCHES)), route)


# -- candidates ---------------------------------------------------------------


def test_query_candidates_number_matches_in_order() -> None:
    parsed = _parse(query_body(MATCHES), QUERY_ROUTE)
    assert list(parsed.candidates) == [
        Candidate(i, hit["id"], hit["metadata"]["text"]) for i, hit in enumerate(MATCHES)
    ]


def test_legacy_results_number_before_matches_in_key_order() -> None:
    body = _legacy([MATCHES[:2], [], MATCHES[2:3]], MATCHES[3:])
    ids = [c.chunk_id for c in _parse(body, QUERY_ROUTE).candidates]
    assert ids == [hit["id"] for hit in MATCHES]
    # Key order, not a fixed order: matches first when the body says so.
    reordered = {"matches": body["matches"], "results": body["results"]}
    ids = [c.chunk_id for c in _parse(reordered, QUERY_ROUTE).candidates]
    assert ids == [hit["id"] for hit in MATCHES[3:] + MATCHES[:3]]


def test_search_candidates_number_hits_in_order() -> None:
    parsed = _parse(search_body(HITS), SEARCH_ROUTE)
    assert list(parsed.candidates) == [
        Candidate(i, hit["_id"], hit["fields"]["text"]) for i, hit in enumerate(HITS)
    ]


@pytest.mark.parametrize(
    ("hit", "chunk_id", "text", "problem"),
    [
        ({"id": "v1", "score": 1.0, "metadata": {"text": "t"}}, "v1", "t", None),
        ({"id": "v1", "score": 1.0, "values": []}, "v1", None, "no metadata"),
        ({"id": "v1", "score": 1.0, "metadata": None}, "v1", None, "no metadata"),
        ({"id": "v1", "metadata": ["SECRET"]}, "v1", None, "metadata is not an object"),
        ({"id": "v1", "metadata": {}}, "v1", None, "metadata field 'text' missing"),
        ({"id": "v1", "metadata": {"text": None}}, "v1", None, "metadata field 'text' missing"),
        (
            {"id": "v1", "metadata": {"text": 3}},
            "v1",
            None,
            "metadata field 'text' is not a string",
        ),
        ({"metadata": {"text": "t"}}, None, "t", "hit id missing"),
        ({"id": "", "metadata": {"text": "t"}}, None, "t", "hit id is empty"),
        ({"id": True, "metadata": {"text": "t"}}, None, "t", "hit id is not a string or integer"),
        ({"id": ""}, None, None, "hit id is empty; no metadata"),
    ],
)
def test_query_candidate_from_hit_id(
    hit: Hit, chunk_id: str | None, text: str | None, problem: str | None
) -> None:
    parsed = _parse(query_body([hit]), QUERY_ROUTE)
    assert parsed.candidates == (Candidate(0, chunk_id, text, problem),)


@pytest.mark.parametrize(
    ("fields", "chunk_id", "text", "problem"),
    [
        ({"chunk": "c-1", "body": "b"}, "c-1", "b", None),
        ({"chunk": 12, "body": "b"}, "12", "b", None),
        ({"chunk": "c-1", "text": "wrong field"}, "c-1", None, "fields field 'body' missing"),
        ({"body": "b"}, None, "b", "fields field 'chunk' missing"),
        ({"chunk": 1.5, "body": "b"}, None, "b", "fields field 'chunk' is not a string or integer"),
        (None, None, None, "no fields"),
        ("SECRET", None, None, "fields is not an object"),
    ],
)
def test_search_candidate_from_fields(
    fields: Any, chunk_id: str | None, text: str | None, problem: str | None
) -> None:
    fmt = PineconeFormat(AdapterOptions(text_field="body", id_field="chunk"))
    hit = {"_id": "rec-9", "_score": 0.1, "fields": fields}
    parsed = _parse(search_body([hit]), SEARCH_ROUTE, fmt)
    assert parsed.candidates == (Candidate(0, chunk_id, text, problem),)


def test_search_candidate_from_record_id() -> None:
    hit = {"_score": 0.1, "fields": {"text": "t"}}
    parsed = _parse(search_body([hit, {**hit, "_id": "r"}]), SEARCH_ROUTE)
    assert [(c.chunk_id, c.problem) for c in parsed.candidates] == [
        (None, "hit id missing"),
        ("r", None),
    ]


def test_problems_never_contain_values() -> None:
    hit = {"id": ["SECRET-ID"], "metadata": {"text": {"v": "SECRET-TEXT"}}}
    (candidate,) = _parse(query_body([hit]), QUERY_ROUTE).candidates
    assert candidate.problem is not None
    assert "SECRET" not in candidate.problem


# -- filtering ----------------------------------------------------------------

KEEPS = [set(), {0}, {1, 3}, {0, 2, 4}, set(range(5)), {4, 99, -1}]


def _sent(body: Body) -> Body:
    """A query body as the gate sends it: without usage."""
    return {key: value for key, value in body.items() if key != "usage"}


@pytest.mark.parametrize("keep", KEEPS)
def test_query_render_keeps_exactly_the_kept_matches(keep: set[int]) -> None:
    assert _filtered(query_body(MATCHES), QUERY_ROUTE, keep) == query_body(
        _kept(MATCHES, keep), read_units=None
    )


@pytest.mark.parametrize("keep", KEEPS)
def test_legacy_results_keep_every_entry_and_filter_each(keep: set[int]) -> None:
    batches = [MATCHES[:2], [], MATCHES[2:3]]
    expected = _legacy(
        [_kept(MATCHES[:2], keep), [], _kept(MATCHES[2:3], keep, 2)], _kept(MATCHES[3:], keep, 3)
    )
    assert _filtered(_legacy(batches, MATCHES[3:]), QUERY_ROUTE, keep) == _sent(expected)


@pytest.mark.parametrize("keep", KEEPS)
def test_search_render_keeps_exactly_the_kept_hits(keep: set[int]) -> None:
    body = search_body(HITS, embed_total_tokens=12)
    expected = search_body(_kept(HITS, keep), read_units=0, embed_total_tokens=12)
    assert _filtered(body, SEARCH_ROUTE, keep) == expected


@pytest.mark.parametrize(
    ("body", "sent", "route"),
    [
        (query_body(MATCHES), query_body(MATCHES, read_units=None), QUERY_ROUTE),
        (
            _legacy([MATCHES[:1]], MATCHES[1:]),
            _sent(_legacy([MATCHES[:1]], MATCHES[1:])),
            QUERY_ROUTE,
        ),
        (search_body(HITS), search_body(HITS, read_units=0), SEARCH_ROUTE),
    ],
)
def test_render_all_is_the_body_without_read_units(body: Body, sent: Body, route: Route) -> None:
    parsed = _parse(body, route)
    assert parsed.render(range(len(parsed.candidates))) == encode(sent)
    assert parsed.released_positions(range(len(parsed.candidates))) == list(
        range(len(parsed.candidates))
    )


def test_render_keeps_only_known_keys_in_their_order() -> None:
    body = {
        "x-first": [1, 2.5, None],
        "matches": MATCHES[:3],
        "namespace": "",
        "usage": {"readUnits": 7},
        "x-last": {"k": "v"},
    }
    out = _parse(body, QUERY_ROUTE).render({1})
    assert out == orjson.dumps({"matches": [MATCHES[1]], "namespace": ""})
    validate(out, QUERY_ROUTE)


def test_search_usage_is_written_by_the_gate() -> None:
    body = {
        "result": {"hits": HITS[:1], "next": "SECRET"},
        "usage": {"read_units": 9, "rerank_units": 3, "embed_total_tokens": 4, "x": 1},
        "x-other": "SECRET",
    }
    out = validate(_parse(body, SEARCH_ROUTE).render({0}), SEARCH_ROUTE)
    assert out == {
        "result": {"hits": HITS[:1]},
        "usage": {"read_units": 0, "embed_total_tokens": 4},
    }
    for usage in (None, {}, {"embed_total_tokens": True}):
        written = validate(
            _parse({"result": {"hits": []}, "usage": usage}, SEARCH_ROUTE).render(set()),
            SEARCH_ROUTE,
        )
        assert written["usage"] == {"read_units": 0}


def test_undeclared_metadata_is_dropped_and_declared_metadata_kept() -> None:
    hit = match(
        "v1", "t", score=0.2, title="T", source={"url": "u", "secret": "SECRET"}, x="SECRET"
    )
    hit["extra-key"] = "SECRET"
    fmt = PineconeFormat(AdapterOptions(hashed_fields=["title"], releasable_fields=["source.url"]))
    out = fmt.parse(encode(query_body([hit])), QUERY_ROUTE).render({0})
    assert b"SECRET" not in out
    (sent,) = validate(out, QUERY_ROUTE)["matches"]
    assert sent == {
        "id": "v1",
        "score": 0.2,
        "values": [],
        "metadata": {"text": "t", "title": "T", "source": {"url": "u"}},
    }


def test_record_fields_are_projected_too() -> None:
    hit = record_hit("r1", "t", title="T", secret="SECRET")
    hit["_rerank"] = "SECRET"
    out = PineconeFormat().parse(encode(search_body([hit])), SEARCH_ROUTE).render({0})
    assert b"SECRET" not in out
    assert validate(out, SEARCH_ROUTE)["result"]["hits"] == [
        {"_id": "r1", "_score": 0.5, "fields": {"text": "t"}}
    ]


def test_hashed_metadata_reaches_the_candidate() -> None:
    hit = match("v1", "t", title="T", n=1)
    fmt = PineconeFormat(AdapterOptions(hashed_fields=["title", "missing"]))
    (candidate,) = fmt.parse(encode(query_body([hit])), QUERY_ROUTE).candidates
    assert candidate.fields == canonical_fields({"title": "T"})


def test_a_query_body_without_matches_is_malformed() -> None:
    # An in-house /query API answering something else is never passed.
    for body in ({"namespace": NAMESPACE, "usage": {"readUnits": 1}}, {}, {"answer": "SECRET"}):
        with pytest.raises(MalformedBody, match="no 'matches'"):
            _parse(body, QUERY_ROUTE)


def test_an_empty_query_response() -> None:
    body = {"matches": [], "namespace": NAMESPACE, "usage": {"readUnits": 1}}
    parsed = _parse(body, QUERY_ROUTE)
    assert parsed.candidates == ()
    assert validate(parsed.render(set()), QUERY_ROUTE) == {"matches": [], "namespace": NAMESPACE}


def test_legacy_entry_without_matches_is_kept() -> None:
    body = query_body([], results=[{"namespace": "a", "x": 1}, query_result(MATCHES[:1]), {}])
    filtered = _filtered(body, QUERY_ROUTE, set())
    assert filtered["results"] == [{"namespace": "a"}, query_result([]), {}]


def test_released_positions_are_the_kept_ones_in_order() -> None:
    parsed = _parse(_legacy([MATCHES[:2]], MATCHES[2:]), QUERY_ROUTE)
    assert parsed.released_positions([4, 0, 2, 9]) == [0, 2, 4]
    assert parsed.released_positions(set(), ()) == []


# -- over-fetch: the request's limit trims the hits ------------------------------------


def test_limit_trims_the_matches_and_each_legacy_result() -> None:
    # Multi-queries are never over-fetched: a limit means the answer is a single
    # query's, and none of its lists may carry more than the app's topK.
    body = _legacy([MATCHES[:2]], MATCHES[2:])
    parsed = _parse(body, QUERY_ROUTE)
    out = validate(parsed.render({0, 1, 2, 3, 4}, [1]), QUERY_ROUTE)
    assert out == _sent(_legacy([MATCHES[:1]], MATCHES[2:3]))
    assert parsed.released_positions({0, 1, 3, 4}, [1]) == [0, 3]
    assert parsed.render({0, 1, 2}, [None]) == parsed.render({0, 1, 2})


def test_limit_trims_the_record_hits() -> None:
    parsed = _parse(search_body(HITS), SEARCH_ROUTE)
    out = validate(parsed.render({1, 2}, [1]), SEARCH_ROUTE)
    assert out == search_body([HITS[1]], read_units=0)
    assert parsed.render({1, 2}, [None]) == parsed.render({1, 2})


@pytest.mark.parametrize("limits", [[3, 1], [None, None]])
def test_render_takes_one_limit(limits: list[int | None]) -> None:
    parsed = _parse(query_body(MATCHES), QUERY_ROUTE)
    with pytest.raises(MalformedBody):
        parsed.render({0}, limits)
    with pytest.raises(MalformedBody):
        parsed.released_positions({0}, limits)


def test_render_is_repeatable_and_never_changes_the_document() -> None:
    body = _legacy([MATCHES[:2]], MATCHES[2:])
    parsed = _parse(body, QUERY_ROUTE)
    first = parsed.render({0, 3})
    parsed.render({0, 1, 2, 3, 4}, replacements={0: Replacement("new", "new text")})
    assert parsed.render({0, 3}) == first
    assert orjson.loads(parsed.render(range(5))) == _sent(body)


# -- substitution -------------------------------------------------------------


def test_query_substitute_replaces_id_and_text_and_keeps_the_hits_own_keys() -> None:
    body = query_body(MATCHES[:2])
    out = _filtered(body, QUERY_ROUTE, {0, 1}, replacements={0: Replacement("doc-1#0-v2", "new")})
    first, second = out["matches"]
    assert first["id"] == "doc-1#0-v2"
    assert first["score"] == MATCHES[0]["score"]
    assert first["values"] == MATCHES[0]["values"]
    # Declared metadata described the replaced document: the substitute has none.
    assert first["metadata"] == {"text": "new", SUBSTITUTED_FOR: "doc-1#0"}
    assert second == MATCHES[1]


def test_query_substitute_in_id_field_mode() -> None:
    hit = match("vec-7", "old", chunk_id="sop-7-v2", doc="SOP-7")
    fmt = PineconeFormat(AdapterOptions(id_field="chunk_id", releasable_fields=["doc"]))
    parsed = fmt.parse(encode(query_body([hit])), QUERY_ROUTE)
    out = validate(
        parsed.render({0}, replacements={0: Replacement("sop-7-v3", "rev 3")}), QUERY_ROUTE
    )
    (rendered,) = out["matches"]
    assert rendered["id"] == "vec-7"
    assert rendered["metadata"] == {
        "text": "rev 3",
        "chunk_id": "sop-7-v3",
        SUBSTITUTED_FOR: "sop-7-v2",
    }


def test_search_substitute_replaces_record_id_and_field() -> None:
    out = _filtered(
        search_body(HITS), SEARCH_ROUTE, {0, 2}, replacements={2: Replacement("rec-3b", "new")}
    )
    assert out["result"]["hits"] == [
        HITS[0],
        {"_id": "rec-3b", "_score": 0.2, "fields": {"text": "new", SUBSTITUTED_FOR: "rec-3"}},
    ]


# -- malformed bodies ---------------------------------------------------------


@pytest.mark.parametrize(
    ("route", "body"),
    [
        (QUERY_ROUTE, b""),
        (QUERY_ROUTE, b"{not json"),
        (QUERY_ROUTE, b'{"matches": [], "namespace": "\xff"}'),
        (QUERY_ROUTE, b"[" * 2000),
        (QUERY_ROUTE, b"[]"),
        (QUERY_ROUTE, b'"SECRET"'),
        (QUERY_ROUTE, b"null"),
        (QUERY_ROUTE, b"{}"),
        (QUERY_ROUTE, b'{"SECRET": []}'),
        (QUERY_ROUTE, b'{"matches": null}'),
        (QUERY_ROUTE, b'{"matches": {"id": "SECRET"}}'),
        (QUERY_ROUTE, b'{"matches": ["SECRET"]}'),
        (QUERY_ROUTE, b'{"matches": [[]]}'),
        (QUERY_ROUTE, b'{"matches": [], "namespace": ["SECRET"]}'),
        (QUERY_ROUTE, b'{"matches": [], "results": {}}'),
        (QUERY_ROUTE, b'{"matches": [], "results": ["SECRET"]}'),
        (QUERY_ROUTE, b'{"results": [{"matches": null}]}'),
        (QUERY_ROUTE, b'{"results": [{"matches": [1]}]}'),
        (QUERY_ROUTE, b'{"results": [{"matches": [], "namespace": 5}]}'),
        (QUERY_ROUTE, b'{"matches": [], "matches": [{"id": "SECRET"}]}'),
        (SEARCH_ROUTE, b"{}"),
        (SEARCH_ROUTE, b'{"result": null, "usage": {"read_units": 1}}'),
        (SEARCH_ROUTE, b'{"result": [], "usage": {"read_units": 1}}'),
        (SEARCH_ROUTE, b'{"result": {}, "usage": {"read_units": 1}}'),
        (SEARCH_ROUTE, b'{"result": {"hits": null}}'),
        (SEARCH_ROUTE, b'{"result": {"hits": {"_id": "SECRET"}}}'),
        (SEARCH_ROUTE, b'{"result": {"hits": ["SECRET"]}}'),
        (SEARCH_ROUTE, b'{"result": {"hits": []}, "usage": ["SECRET"]}'),
        (SEARCH_ROUTE, b'{"matches": []}'),
    ],
)
def test_malformed_bodies(route: Route, body: bytes) -> None:
    with pytest.raises(MalformedBody) as raised:
        PineconeFormat().parse(body, route)
    assert "SECRET" not in str(raised.value)
    assert raised.value.__cause__ is None
    assert raised.value.__context__ is None


# -- properties (the shared ones are in tests/unit/test_format_contract.py) ----------

_floats = st.floats(allow_nan=False, allow_infinity=False, width=32)
# Pinecone metadata values: strings, numbers, booleans and lists of strings.
_metadata_values = (
    st.text(max_size=8)
    | st.integers(min_value=-(2**53), max_value=2**53)
    | _floats
    | st.booleans()
    | st.lists(st.text(max_size=4), max_size=3)
)
_texts = st.none() | st.text(max_size=12) | st.integers(min_value=-(2**53), max_value=2**53)


@st.composite
def _fields(draw: st.DrawFn) -> dict[str, Any]:
    fields: dict[str, Any] = draw(
        st.dictionaries(st.text(max_size=6), _metadata_values, max_size=3)
    )
    text = draw(_texts)
    if text is not None or draw(st.booleans()):
        fields["text"] = text
    return fields


@st.composite
def _matches(draw: st.DrawFn, min_size: int = 0, max_size: int = 6) -> list[Hit]:
    hits: list[Hit] = []
    ids = st.lists(st.text(min_size=1, max_size=8), min_size=min_size, max_size=max_size)
    for vector_id in draw(ids):
        hit: Hit = {"id": vector_id, "score": draw(_floats)}
        hit["values"] = draw(st.lists(_floats, max_size=3))
        if draw(st.booleans()):
            size = draw(st.integers(min_value=1, max_value=3))
            indices = draw(st.lists(st.integers(0, 2**32 - 1), min_size=size, max_size=size))
            weights = draw(st.lists(_floats, min_size=size, max_size=size))
            hit["sparseValues"] = {"indices": indices, "values": weights}
        # Absent or null without includeMetadata; an object otherwise.
        metadata = draw(st.sampled_from(["absent", "null", "object"]))
        if metadata != "absent":
            hit["metadata"] = None if metadata == "null" else draw(_fields())
        hits.append(hit)
    return hits


@st.composite
def _record_hits(draw: st.DrawFn) -> list[Hit]:
    return [
        {"_id": record_id, "_score": draw(_floats), "fields": draw(_fields())}
        for record_id in draw(st.lists(st.text(min_size=1, max_size=8), max_size=6))
    ]


def _text_of(fields: Any) -> str | None:
    text = fields.get("text") if isinstance(fields, dict) else None
    return text if isinstance(text, str) else None


def _released(hit: Hit, fields_key: str) -> Hit:
    """A hit as the default format sends it: of its metadata, only the text."""
    fields = hit.get(fields_key)
    if not isinstance(fields, dict):
        return hit
    return {**hit, fields_key: {k: v for k, v in fields.items() if k == "text"}}


@PROPERTIES
@given(
    batches=st.none() | st.lists(_matches(max_size=3), max_size=3),
    matches=_matches(),
    limit=st.none() | st.integers(min_value=0, max_value=6),
    data=st.data(),
)
def test_property_query_render_keeps_exactly_the_kept_matches(
    batches: list[list[Hit]] | None, matches: list[Hit], limit: int | None, data: st.DataObject
) -> None:
    body = query_body(matches) if batches is None else _legacy(batches, matches)
    hits = [hit for batch in batches or [] for hit in batch] + matches
    parsed = PineconeFormat().parse(encode(body), QUERY_ROUTE)
    assert [(c.chunk_id, c.text) for c in parsed.candidates] == [
        (hit["id"], _text_of(hit.get("metadata"))) for hit in hits
    ]
    keep = data.draw(st.sets(st.integers(min_value=-1, max_value=len(hits))))

    kept_batches, start = [], 0
    for batch in batches or []:
        kept_batches.append([_released(h, "metadata") for h in _kept(batch, keep, start)][:limit])
        start += len(batch)
    kept_matches = [_released(h, "metadata") for h in _kept(matches, keep, start)][:limit]
    expected = query_body(kept_matches) if batches is None else _legacy(kept_batches, kept_matches)
    assert validate(parsed.render(keep, [limit]), QUERY_ROUTE) == _sent(expected)
    released = parsed.released_positions(keep, [limit])
    assert set(released) <= keep and released == sorted(released)


@PROPERTIES
@given(hits=_record_hits(), tokens=st.none() | st.integers(0, 2**31 - 1), data=st.data())
def test_property_search_render_keeps_exactly_the_kept_hits(
    hits: list[Hit], tokens: int | None, data: st.DataObject
) -> None:
    body = search_body(hits, embed_total_tokens=tokens)
    parsed = PineconeFormat().parse(encode(body), SEARCH_ROUTE)
    assert [(c.chunk_id, c.text) for c in parsed.candidates] == [
        (hit["_id"], _text_of(hit["fields"])) for hit in hits
    ]
    keep = data.draw(st.sets(st.integers(min_value=0, max_value=max(len(hits) - 1, 0))))
    expected = search_body(
        [_released(h, "fields") for h in _kept(hits, keep)], read_units=0, embed_total_tokens=tokens
    )
    assert validate(parsed.render(keep), SEARCH_ROUTE) == expected


@PROPERTIES
@given(matches=_matches(min_size=1), data=st.data())
def test_property_substitutes_keep_everything_else(matches: list[Hit], data: st.DataObject) -> None:
    parsed = PineconeFormat().parse(encode(query_body(matches)), QUERY_ROUTE)
    keep = data.draw(st.sets(st.integers(min_value=0, max_value=len(matches) - 1)))
    replaced = data.draw(st.sets(st.sampled_from(sorted(keep)))) if keep else set()
    replacements = {p: Replacement(f"new-{p}", f"text {p}") for p in replaced}
    out = validate(parsed.render(keep, replacements=replacements), QUERY_ROUTE)
    for rendered, position in zip(out["matches"], sorted(keep), strict=True):
        original = _released(matches[position], "metadata")
        if position not in replaced:
            assert rendered == original
            continue
        assert rendered["id"] == f"new-{position}"
        assert rendered["score"] == original["score"]
        assert rendered["metadata"][SUBSTITUTED_FOR] == original["id"]
        assert rendered["metadata"]["text"] == f"text {position}"
