"""The Milvus RESTful v2 adapter: routes, candidates, filtering, errors, malformed bodies.

Body shapes come from the Milvus RESTful v2 reference and the proxy's REST
handler (see tests/fixtures/milvus_bodies.py). No Python client models the
REST v2 responses (pymilvus speaks gRPC), so every filtered body is checked
structurally against the documented schema by ``validate``: an integer
success ``code``, ``data`` a list of row objects carrying the primary key
(and ``distance`` for searches), ``topks`` non-negative counts adding up to
the rows, and nothing the gate does not write: ``cost`` 0, no ``recalls``.
Requests are tested in tests/unit/test_milvus_request.py.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.hits import Candidate, Replacement, Route, RouteKind
from sidecar.core.integrity import canonical_fields
from sidecar.formats.base import SUBSTITUTED_FOR, MalformedBody, ParsedBody
from sidecar.formats.milvus.rest import ERROR_MESSAGE, MilvusFormat
from sidecar.formats.options import AdapterOptions
from tests.fixtures.format_strategies import PROPERTIES, adapter, json_values
from tests.fixtures.milvus_bodies import (
    FETCHES,
    SEARCHES,
    Body,
    Row,
    encode,
    error_body,
    query_body,
    route,
    row,
    search_body,
)

ACTIONS = SEARCHES + FETCHES


def validate(out: bytes, action: str, id_field: str = "id") -> Body:
    """Check ``out`` against the documented response schema; the decoded JSON."""
    body = orjson.loads(out)
    assert isinstance(body, dict)
    assert body.keys() <= {"code", "cost", "data", "topks"}
    assert body["code"] in (0, 200)
    assert body.get("cost", 0) == 0
    rows = body["data"]
    assert isinstance(rows, list)
    for hit in rows:
        assert isinstance(hit, dict)
        assert id_field in hit
        if action in SEARCHES:
            assert isinstance(hit["distance"], int | float)
    if action in FETCHES:
        assert "topks" not in body
    if body.get("topks") is not None:
        topks = body["topks"]
        assert all(isinstance(topk, int) and topk >= 0 for topk in topks)
        assert sum(topks) == len(rows)
    return body


# The fields of ROWS beyond id, text and distance, declared releasable.
EXTRA = ["doc_id", "tags", "meta", "year"]


def _parse(body: Body, action: str, fmt: MilvusFormat | None = None) -> ParsedBody:
    return (fmt or MilvusFormat(AdapterOptions(releasable_fields=EXTRA))).parse(
        encode(body), route(action)
    )


def _kept(rows: Sequence[Row], keep: Collection[int], start: int = 0) -> list[Row]:
    return [hit for position, hit in enumerate(rows, start) if position in keep]


def _kept_groups(groups: Sequence[Sequence[Row]], keep: Collection[int]) -> list[list[Row]]:
    kept, start = [], 0
    for group in groups:
        kept.append(_kept(group, keep, start))
        start += len(group)
    return kept


ROWS = [
    row(101, "alpha", distance=0.91, doc_id="a"),
    row(102, "beta", distance=0.87, tags=["x"]),
    row(103, "gamma", distance=0.5, meta={"nested": [1, None]}),
    row(104, "delta", distance=0.4),
    row(105, "epsilon", distance=0.3, year=2019),
]
GROUPS = [ROWS[:2], [], ROWS[2:]]


def _body(action: str, rows: Sequence[Row] = ROWS, cost: int = 6) -> Body:
    if action in SEARCHES:
        return search_body([rows[:2], [], rows[2:]], cost=cost)
    return query_body(rows, cost=cost)


# -- routes ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "kind"),
    [
        ("POST", "/v2/vectordb/entities/search", RouteKind.FILTERED),
        ("POST", "/v2/vectordb/entities/hybrid_search", RouteKind.FILTERED),
        ("POST", "/v2/vectordb/entities/advanced_search", RouteKind.FILTERED),
        ("POST", "/v2/vectordb/entities/query", RouteKind.FILTERED),
        ("POST", "/v2/vectordb/entities/get", RouteKind.FILTERED),
        ("post", "/v2/vectordb/entities/search/", RouteKind.FILTERED),
        ("POST", "/V2/VectorDB/Entities/Query", RouteKind.FILTERED),
        ("GET", "/v2/vectordb/entities/query", RouteKind.CONTENT),
        ("POST", "/v2/vectordb/entities/search_iterator", RouteKind.CONTENT),
        ("POST", "/v2/vectordb/entities/search/batch", RouteKind.CONTENT),
        ("POST", "/v2/vectordb/entities", RouteKind.CONTENT),
        ("POST", "/v2/vectordb/jobs/snapshot/export", RouteKind.CONTENT),
        ("POST", "/v2/vectordb/jobs/snapshot/list", RouteKind.CONTENT),
        ("POST", "/v2/vectordb/snapshots/create", RouteKind.CONTENT),
        ("POST", "/v1/vector/search", RouteKind.CONTENT),
        ("POST", "/v1/vector/query", RouteKind.CONTENT),
        ("POST", "/v1/vector/get", RouteKind.CONTENT),
        ("POST", "/v2/vectordb/collections/list", RouteKind.READ),
        ("POST", "/v2/vectordb/collections/has", RouteKind.READ),
        ("POST", "/v2/vectordb/collections/describe", RouteKind.READ),
        ("POST", "/v2/vectordb/collections/get_stats", RouteKind.CONTENT),
        ("POST", "/v2/vectordb/collections/get_load_state", RouteKind.READ),
        ("POST", "/v2/vectordb/collections/get_compaction_state", RouteKind.READ),
        ("POST", "/v2/vectordb/partitions/list", RouteKind.READ),
        ("POST", "/v2/vectordb/partitions/get_stats", RouteKind.CONTENT),
        ("POST", "/v2/vectordb/indexes/describe", RouteKind.CONTENT),  # indexedRows, totalRows
        ("POST", "/v2/vectordb/indexes/list", RouteKind.READ),  # names only
        ("POST", "/v2/vectordb/aliases/describe", RouteKind.READ),
        ("POST", "/v2/vectordb/databases/list", RouteKind.READ),
        ("POST", "/v2/vectordb/users/describe", RouteKind.READ),
        ("POST", "/v2/vectordb/jobs/import/get_progress", RouteKind.CONTENT),  # rows, files
        ("POST", "/v2/vectordb/jobs/import/describe", RouteKind.CONTENT),
        ("POST", "/v2/vectordb/jobs/import/list", RouteKind.CONTENT),
        ("POST", "/v2/vectordb/jobs/external_collection/describe", RouteKind.CONTENT),
        ("POST", "/v2/vectordb/quotacenter/describe", RouteKind.CONTENT),
        ("POST", "/v1/vector/bulkinsert/describe", RouteKind.CONTENT),
        ("GET", "/v1/vector/bulkinsert/list", RouteKind.CONTENT),
        ("POST", "/v2/vectordb/segments/describe", RouteKind.CONTENT),  # rows per segment
        ("POST", "/v2/vectordb/common/run_analyzer", RouteKind.READ),
        ("GET", "/v1/vector/collections", RouteKind.READ),
        ("GET", "/v1/vector/collections/describe", RouteKind.READ),
        ("POST", "/v2/vectordb/entities/insert", RouteKind.WRITE),
        ("POST", "/v2/vectordb/entities/upsert", RouteKind.WRITE),
        ("POST", "/v2/vectordb/entities/delete", RouteKind.WRITE),
        ("POST", "/v2/vectordb/collections/create", RouteKind.WRITE),
        ("POST", "/v2/vectordb/collections/drop", RouteKind.WRITE),
        ("POST", "/v2/vectordb/collections/load", RouteKind.WRITE),
        ("POST", "/v2/vectordb/collections/release", RouteKind.WRITE),
        ("POST", "/v2/vectordb/collections/truncate", RouteKind.WRITE),
        ("POST", "/v2/vectordb/collections/fields/add", RouteKind.WRITE),
        ("POST", "/v2/vectordb/partitions/create", RouteKind.WRITE),
        ("POST", "/v2/vectordb/indexes/create", RouteKind.WRITE),
        ("POST", "/v2/vectordb/jobs/import/create", RouteKind.WRITE),
        ("POST", "/v2/vectordb/roles/grant_privilege_v2", RouteKind.WRITE),
        # A route the tables do not know (a newer server's) may return rows.
        ("POST", "/v2/vectordb/collections/new_action", RouteKind.CONTENT),
        ("POST", "/v2/vectordb/collections/describe_rows", RouteKind.CONTENT),
        ("POST", "/v2/vectordb/collections", RouteKind.CONTENT),
        ("POST", "/v1/vector/export", RouteKind.CONTENT),
        ("POST", "/v1/vector/insert", RouteKind.WRITE),
        ("POST", "/v1/vector/delete", RouteKind.WRITE),
        ("POST", "/v1/vector/collections/create", RouteKind.WRITE),
        # Not Milvus' REST API: other databases, management ports, bare prefixes.
        ("POST", "/v2/vectordb", None),
        ("POST", "/v1/vector", None),
        ("POST", "/v2/entities/search", None),
        ("POST", "/vectordb/entities/search", None),
        ("POST", "/collections/docs/points/search", None),
        ("POST", "/query", None),
        ("POST", "/api/v1/collections/c/query", None),
        ("GET", "/healthz", None),
        ("POST", "/v1/objects", None),
        ("POST", "", None),
    ],
)
def test_route_kind(method: str, path: str, kind: RouteKind | None) -> None:
    assert MilvusFormat().route_kind(Route(method, path)) is kind


def test_name() -> None:
    assert MilvusFormat().name == "milvus"


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"text_field": ""}, "text_field"),
        ({"text_field": 5}, "text_field"),
        ({"id_field": ""}, "id_field"),
        ({"id_field": ["pk"]}, "id_field"),
        ({"text_field": "id"}, "id_field"),
        ({"text_field": "pk", "id_field": "pk"}, "id_field"),
        ({"hashed_fields": "title"}, "hashed_fields"),
        ({"releasable_fields": ["meta..x"]}, "releasable_fields"),
    ],
)
def test_invalid_options_name_the_option(kwargs: dict[str, Any], option: str) -> None:
    with pytest.raises(ValueError, match=option):
        adapter(MilvusFormat, **kwargs)


@pytest.mark.parametrize(
    "bad_route",
    [Route("POST", "/v2/vectordb/entities/insert"), Route("GET", "/v2/vectordb/entities/query")],
)
def test_parse_rejects_a_route_it_does_not_filter(bad_route: Route) -> None:
    with pytest.raises(ValueError, match="not handled"):
        MilvusFormat().parse(encode(query_body(ROWS)), bad_route)


# -- candidates ---------------------------------------------------------------


@pytest.mark.parametrize("action", ACTIONS)
def test_candidates_number_rows_in_order(action: str) -> None:
    parsed = _parse(_body(action), action)
    assert list(parsed.candidates) == [
        Candidate(i, str(hit["id"]), hit["text"]) for i, hit in enumerate(ROWS)
    ]


@pytest.mark.parametrize(
    ("hit", "chunk_id", "text", "problem"),
    [
        ({"id": 7, "text": "t"}, "7", "t", None),
        ({"id": "pk-7", "text": "t"}, "pk-7", "t", None),
        ({"id": 7}, "7", None, "field 'text' missing"),
        ({"id": 7, "text": None}, "7", None, "field 'text' missing"),
        ({"id": 7, "text": ["SECRET"]}, "7", None, "field 'text' is not a string"),
        ({"text": "t"}, None, "t", "field 'id' missing"),
        ({"id": "", "text": "t"}, None, "t", "field 'id' is empty"),
        ({"id": 1.5, "text": "t"}, None, "t", "field 'id' is not a string or integer"),
        ({"id": False, "text": "t"}, None, "t", "field 'id' is not a string or integer"),
        ({}, None, None, "field 'id' missing; field 'text' missing"),
    ],
)
def test_candidate_from_row(
    hit: Row, chunk_id: str | None, text: str | None, problem: str | None
) -> None:
    parsed = _parse(query_body([hit]), "query")
    assert parsed.candidates == (Candidate(0, chunk_id, text, problem),)


def test_candidate_from_named_fields() -> None:
    fmt = MilvusFormat(AdapterOptions(text_field="chunk_text", id_field="chunk_id"))
    hits = [{"pk": 1, "chunk_id": "c-1", "chunk_text": "b"}, {"pk": 2, "text": "x"}]
    parsed = _parse(query_body(hits), "get", fmt)
    assert parsed.candidates == (
        Candidate(0, "c-1", "b"),
        Candidate(1, None, None, "field 'chunk_id' missing; field 'chunk_text' missing"),
    )


def test_hashed_fields_reach_the_candidate_as_canonical_json() -> None:
    fmt = MilvusFormat(AdapterOptions(hashed_fields=["title", "meta.source"]))
    hit = {"id": 7, "text": "t", "title": "T", "meta": {"source": "s", "page": 3}, "x": 1}
    (candidate,) = _parse(query_body([hit]), "query", fmt).candidates
    assert candidate == Candidate(
        0, "7", "t", None, canonical_fields({"title": "T", "meta.source": "s"})
    )


def test_problems_never_contain_values() -> None:
    (candidate,) = _parse(query_body([{"id": ["SECRET"], "text": 9}]), "query").candidates
    assert candidate.problem is not None
    assert "SECRET" not in candidate.problem


# -- filtering ----------------------------------------------------------------

KEEPS = [set(), {0}, {1, 3}, {0, 2, 4}, set(range(5)), {4, 99, -1}]


@pytest.mark.parametrize("action", SEARCHES)
@pytest.mark.parametrize("keep", KEEPS)
def test_search_render_keeps_kept_rows_and_recounts_topks(action: str, keep: set[int]) -> None:
    body = search_body(GROUPS, recalls=[0.9, 1.0, 0.8])
    out = validate(_parse(body, action).render(keep), action)
    assert out == search_body(_kept_groups(GROUPS, keep), cost=0)


@pytest.mark.parametrize("keep", KEEPS)
def test_search_without_topks_is_one_group(keep: set[int]) -> None:
    body = search_body([ROWS], topks=False)
    out = validate(_parse(body, "search").render(keep), "search")
    assert out == search_body([_kept(ROWS, keep)], topks=False, cost=0)


@pytest.mark.parametrize("action", FETCHES)
@pytest.mark.parametrize("keep", KEEPS)
def test_query_render_keeps_exactly_the_kept_rows(action: str, keep: set[int]) -> None:
    out = validate(_parse(query_body(ROWS), action).render(keep), action)
    assert out == query_body(_kept(ROWS, keep), cost=0)


@pytest.mark.parametrize("action", ACTIONS)
def test_render_all_is_the_body_with_its_cost_zeroed(action: str) -> None:
    parsed = _parse(_body(action), action)
    assert orjson.loads(parsed.render(range(len(ROWS)))) == _body(action, cost=0)
    assert parsed.released_positions(range(len(ROWS))) == list(range(len(ROWS)))


def test_render_keeps_only_what_the_gate_knows() -> None:
    body = {
        "code": 0,
        "cacheHitRatio": 0.5,
        "cost": 3,
        "data": ROWS[:3],
        "recalls": [0.9, 0.4],
        "scannedRemoteBytes": 10,
        "scannedTotalBytes": 99,
        "topks": [1, 2],
        "x-last": [None],
    }
    out = _parse(body, "search").render({0, 2})
    assert out == orjson.dumps({"code": 0, "cost": 0, "data": [ROWS[0], ROWS[2]], "topks": [1, 1]})


def test_a_body_without_cost_gets_none() -> None:
    body = {"code": 0, "data": ROWS[:2], "topks": [2]}
    assert orjson.loads(_parse(body, "search").render({1})) == {
        "code": 0,
        "data": [ROWS[1]],
        "topks": [1],
    }


def test_undeclared_row_fields_are_dropped_and_declared_ones_kept() -> None:
    hit = {
        "id": 7,
        "text": "t",
        "distance": 0.5,
        "title": "T",
        "meta": {"source": "s", "secret": "SECRET"},
        "embedding": [0.1],
        "other": "SECRET",
    }
    fmt = MilvusFormat(AdapterOptions(hashed_fields=["title"], releasable_fields=["meta.source"]))
    out = fmt.parse(encode(search_body([[hit]])), route("search")).render({0})
    assert b"SECRET" not in out
    assert orjson.loads(out)["data"] == [
        {"distance": 0.5, "id": 7, "text": "t", "title": "T", "meta": {"source": "s"}}
    ]


def test_the_primary_key_goes_out_only_as_the_id_field_or_declared() -> None:
    hit = {"pk": 44, "chunk_id": "c-1", "text": "t", "distance": 0.5}
    plain = MilvusFormat(AdapterOptions(id_field="chunk_id"))
    declared = MilvusFormat(AdapterOptions(id_field="chunk_id", releasable_fields=["pk"]))
    body = encode(search_body([[hit]]))
    assert orjson.loads(plain.parse(body, route("search")).render({0}))["data"] == [
        {"chunk_id": "c-1", "text": "t", "distance": 0.5}
    ]
    assert orjson.loads(declared.parse(body, route("search")).render({0}))["data"] == [hit]


def test_empty_search_result_has_no_topks() -> None:
    # TopK 0: Milvus answers data [] and leaves topks out.
    body = {"code": 0, "cost": 0, "data": []}
    parsed = _parse(body, "search")
    assert parsed.candidates == ()
    assert validate(parsed.render(set()), "search") == body


def test_null_topks_is_kept_null() -> None:
    body = {"code": 0, "cost": 1, "data": ROWS[:2], "topks": None}
    out = orjson.loads(_parse(body, "search").render({1}))
    assert out == {"code": 0, "cost": 0, "data": [ROWS[1]], "topks": None}


def test_success_code_200_of_the_2_3_reference_is_filtered() -> None:
    body = {"code": 200, "data": ROWS[:2]}
    parsed = _parse(body, "search")
    assert len(parsed.candidates) == 2
    assert orjson.loads(parsed.render({0})) == {"code": 200, "data": [ROWS[0]]}


def test_released_positions_are_the_kept_ones_in_order() -> None:
    parsed = _parse(search_body(GROUPS), "search")
    assert parsed.released_positions([4, 0, 2, 9]) == [0, 2, 4]
    assert parsed.released_positions(set(), []) == []


def test_a_rejected_get_row_reads_as_a_missing_key() -> None:
    # Milvus answers a get of a key it does not have with the rows it found.
    found = _parse(query_body([ROWS[0], ROWS[1]]), "get")
    missing = _parse(query_body([ROWS[0]]), "get")
    assert found.render({0}) == missing.render({0})


# -- over-fetch: one limit, for each query vector ------------------------------


@pytest.mark.parametrize("action", SEARCHES)
def test_limit_trims_each_query_vectors_rows(action: str) -> None:
    parsed = _parse(search_body(GROUPS), action)
    out = validate(parsed.render({0, 1, 2, 3, 4}, [1]), action)
    assert out == search_body([ROWS[:1], [], ROWS[2:3]], cost=0)
    assert parsed.released_positions({0, 1, 2, 3, 4}, [1]) == [0, 2]
    # Kept rows past the limit are left out, rejected ones do not count.
    assert parsed.released_positions({1, 3, 4}, [1]) == [1, 3]


@pytest.mark.parametrize("action", FETCHES)
def test_limit_trims_query_rows(action: str) -> None:
    parsed = _parse(query_body(ROWS), action)
    assert validate(parsed.render({0, 2, 3}, [2]), action) == query_body([ROWS[0], ROWS[2]], cost=0)
    assert parsed.render({0, 2}, [None]) == parsed.render({0, 2})


@pytest.mark.parametrize("limits", [[3, 1], [None, None]])
def test_render_takes_one_limit(limits: list[int | None]) -> None:
    parsed = _parse(search_body(GROUPS), "search")
    with pytest.raises(MalformedBody):
        parsed.render({0}, limits)
    with pytest.raises(MalformedBody):
        parsed.released_positions({0}, limits)


def test_render_is_repeatable_and_never_changes_the_document() -> None:
    body = search_body(GROUPS)
    parsed = _parse(body, "hybrid_search")
    first = parsed.render({0, 3})
    parsed.render(range(5), replacements={0: Replacement("9", "new text")})
    assert parsed.render({0, 3}) == first
    assert orjson.loads(parsed.render(range(5))) == search_body(GROUPS, cost=0)


# -- errors: the gate's message, Milvus' code ------------------------------------

ERRORS = [
    encode(error_body(100, "collection not found[collection=SECRET]")),
    encode(error_body(1100, "missing required parameters SECRET")),
    encode(error_body(200, "partition not found SECRET")),
    encode({"code": 65535, "data": [], "message": "SECRET"}),
    encode({"code": 1802, "data": None, "message": "SECRET", "cost": 1}),
    encode({"code": 1802, "data": {}, "message": "SECRET", "detail": "SECRET"}),
    b'{ "message" : "SECRET \\u00e9", "code" : 5 }\n',
]


@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize("body", ERRORS)
def test_errors_are_written_by_the_gate(action: str, body: bytes) -> None:
    parsed = MilvusFormat().parse(body, route(action))
    code = orjson.loads(body)["code"]
    expected = orjson.dumps({"code": code, "message": ERROR_MESSAGE})
    assert parsed.candidates == ()
    assert parsed.render(set()) == expected
    assert parsed.render({0, 1}, [3], replacements={0: Replacement("1", "t")}) == expected
    assert parsed.released_positions({0}) == []
    assert b"SECRET" not in parsed.render(set())


# -- substitution -------------------------------------------------------------


def test_int64_key_stays_a_number_and_the_rest_stays() -> None:
    body = search_body([ROWS[:2]])
    out = validate(
        _parse(body, "search").render({0, 1}, replacements={1: Replacement("902", "new")}),
        "search",
    )
    first, second = out["data"]
    assert first == ROWS[0]
    # Declared fields (tags) described the replaced row's document: gone.
    assert second == {"distance": 0.87, "id": 902, "text": "new", SUBSTITUTED_FOR: 102}


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [(5, "-7", -7), (5, "sop-7", "sop-7"), (5, "٣", "٣"), ("5", "7", "7"), (True, "7", "7")],
)
def test_substitute_id_type_follows_the_key(old: Any, new: str, expected: Any) -> None:
    parsed = _parse(query_body([{"id": old, "text": "t"}]), "get")
    (hit,) = orjson.loads(parsed.render({0}, replacements={0: Replacement(new, "n")}))["data"]
    assert hit["id"] == expected
    assert hit[SUBSTITUTED_FOR] == old


def test_substitute_in_id_field_mode_drops_the_declared_primary_key() -> None:
    fmt = MilvusFormat(
        AdapterOptions(text_field="chunk_text", id_field="chunk_id", releasable_fields=["id"])
    )
    hit = {"chunk_id": "sop-7-v2", "chunk_text": "rev 2", "distance": 0.3, "id": 44}
    parsed = fmt.parse(encode(search_body([[hit]])), route("search"))
    out = validate(
        parsed.render({0}, replacements={0: Replacement("sop-7-v3", "rev 3")}),
        "search",
        id_field="chunk_id",
    )
    assert out["data"] == [
        {
            "chunk_id": "sop-7-v3",
            "chunk_text": "rev 3",
            "distance": 0.3,
            SUBSTITUTED_FOR: "sop-7-v2",
        }
    ]


# -- malformed bodies ---------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "body"),
    [
        ("search", b""),
        ("search", b"404 page not found"),
        ("search", b'{"code": 0, "data": [], "x": "\xff"}'),
        ("search", b"[" * 2000),
        ("search", b"[]"),
        ("search", b'"SECRET"'),
        ("search", b"{}"),
        ("search", b'{"data": []}'),
        ("search", b'{"code": "0", "data": []}'),
        ("search", b'{"code": false, "data": []}'),
        ("search", b'{"code": null, "data": []}'),
        ("search", b'{"code": 0}'),
        ("search", b'{"code": 0, "data": null}'),
        ("search", b'{"code": 0, "data": {"id": "SECRET"}}'),
        ("search", b'{"code": 0, "data": ["SECRET"]}'),
        ("search", b'{"code": 0, "data": [[{"id": 1, "text": "SECRET"}]]}'),
        ("search", b'{"code": 1100, "data": [{"id": 1, "text": "SECRET"}]}'),
        ("search", b'{"code": 1100, "data": "SECRET"}'),
        ("search", b'{"code": 0, "data": [{"id": 1}], "topks": [2]}'),
        ("search", b'{"code": 0, "data": [{"id": 1}], "topks": [0]}'),
        ("search", b'{"code": 0, "data": [{"id": 1}], "topks": [2, -1]}'),
        ("search", b'{"code": 0, "data": [{"id": 1}], "topks": [true]}'),
        ("search", b'{"code": 0, "data": [{"id": 1}], "topks": [1.0]}'),
        ("search", b'{"code": 0, "data": [{"id": 1}], "topks": 1}'),
        ("search", b'{"code": 0, "data": [{"id": 1}], "aggTopks": [1]}'),
        ("query", b'{"code": 0, "data": [{"id": 1}], "topks": [3]}'),
        ("get", b'{"code": 0, "data": [1, 2]}'),
        # What a client keeping the first of two keys reads differs from the gate.
        ("query", b'{"code": 0, "data": [{"id": 1, "text": "SECRET"}], "code": 1, "data": null}'),
    ],
)
def test_malformed_bodies(action: str, body: bytes) -> None:
    with pytest.raises(MalformedBody) as raised:
        MilvusFormat().parse(body, route(action))
    assert "SECRET" not in str(raised.value)
    assert raised.value.__cause__ is None
    assert raised.value.__context__ is None


# -- properties (the shared ones are in tests/unit/test_format_contract.py) ----------

_ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_floats = st.floats(allow_nan=False, allow_infinity=False)
_keys = _ints | st.text(min_size=1, max_size=8)


@st.composite
def _rows(draw: st.DrawFn, search: bool, max_size: int = 5) -> list[Row]:
    rows: list[Row] = []
    for key in draw(st.lists(_keys, max_size=max_size)):
        values: Row = draw(st.dictionaries(st.text(max_size=6), json_values, max_size=3))
        values["id"] = key
        if search:
            values["distance"] = draw(_floats)
        text = draw(st.none() | st.text(max_size=12) | _ints)
        if text is not None or draw(st.booleans()):
            values["text"] = text
        rows.append(dict(sorted(values.items())))
    return rows


def _text_of(hit: Row) -> str | None:
    text = hit.get("text")
    return text if isinstance(text, str) else None


def _released(hit: Row) -> Row:
    """A row as the default format sends it: id, text and distance only."""
    return {key: value for key, value in hit.items() if key in ("id", "text", "distance")}


@PROPERTIES
@given(
    action=st.sampled_from(SEARCHES),
    groups=st.lists(_rows(search=True), min_size=1, max_size=4),
    topks=st.booleans(),
    limit=st.none() | st.integers(min_value=0, max_value=4),
    data=st.data(),
)
def test_property_search_keeps_kept_rows_and_consistent_topks(
    action: str,
    groups: list[list[Row]],
    topks: bool,
    limit: int | None,
    data: st.DataObject,
) -> None:
    if not topks:
        groups = [[hit for group in groups for hit in group]]
    body = search_body(groups, topks=topks, recalls=[0.5] * len(groups))
    rows = body["data"]
    parsed = MilvusFormat().parse(encode(body), route(action))
    assert [(c.chunk_id, c.text) for c in parsed.candidates] == [
        (str(hit["id"]), _text_of(hit)) for hit in rows
    ]
    keep = data.draw(st.sets(st.integers(min_value=-1, max_value=len(rows))))
    out = validate(parsed.render(keep, [limit]), action)
    kept = [[_released(hit) for hit in group][:limit] for group in _kept_groups(groups, keep)]
    assert out == search_body(kept, topks=topks, cost=0)
    released = parsed.released_positions(keep, [limit])
    assert set(released) <= keep and released == sorted(released)
    assert len(released) == len(out["data"])


@PROPERTIES
@given(action=st.sampled_from(FETCHES), rows=_rows(search=False), data=st.data())
def test_property_query_keeps_exactly_the_kept_rows(
    action: str, rows: list[Row], data: st.DataObject
) -> None:
    parsed = MilvusFormat().parse(encode(query_body(rows)), route(action))
    assert [(c.chunk_id, c.text) for c in parsed.candidates] == [
        (str(hit["id"]), _text_of(hit)) for hit in rows
    ]
    keep = data.draw(st.sets(st.integers(min_value=0, max_value=max(len(rows) - 1, 0))))
    replaced = data.draw(st.sets(st.sampled_from(sorted(keep)))) if keep else set()
    replacements = {p: Replacement(str(p), f"text {p}") for p in replaced}
    out = validate(parsed.render(keep, replacements=replacements), action)
    expected = [
        {**_released(hit), "id": p if isinstance(hit["id"], int) else str(p), "text": f"text {p}"}
        | {SUBSTITUTED_FOR: hit["id"]}
        if p in replaced
        else _released(hit)
        for p, hit in enumerate(rows)
        if p in keep
    ]
    assert out == query_body(expected, cost=0)


@PROPERTIES
@given(
    action=st.sampled_from(ACTIONS),
    code=_ints.filter(lambda code: code != 0),
    extra=st.dictionaries(st.sampled_from(["message", "cost", "detail"]), json_values, max_size=3),
    rows=st.sampled_from([None, [], {}, "absent"]),
)
def test_property_errors_are_the_gates_whatever_milvus_says(
    action: str, code: int, extra: dict[str, Any], rows: Any
) -> None:
    body = {"code": code, **extra} | ({} if rows == "absent" else {"data": rows})
    parsed = MilvusFormat().parse(encode(body), route(action))
    assert parsed.candidates == ()
    assert orjson.loads(parsed.render(set())) == {"code": code, "message": ERROR_MESSAGE}
