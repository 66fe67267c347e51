"""The Qdrant REST adapter: routes, candidates, filtering, malformed bodies.

The body shapes come from Qdrant's OpenAPI spec and qdrant-client's models
(``qdrant_client.http.models``); every filtered body is checked by validating it
with the qdrant-client pydantic model of its endpoint.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter
from qdrant_client.http import models

from sidecar.core.hits import Candidate, Replacement, Route, RouteKind
from sidecar.formats.base import (
    SUBSTITUTED_FOR,
    AbsentAnswer,
    MalformedBody,
    ParsedBody,
    Unreleasable,
)
from sidecar.formats.options import AdapterOptions
from sidecar.formats.qdrant.rest import GROUP_ID_NOT_RELEASED, OPTIMIZER_ERROR, QdrantFormat
from tests.fixtures.format_strategies import PROPERTIES, json_values
from tests.fixtures.qdrant_bodies import (
    BUILDERS,
    TIME,
    Body,
    Point,
    batch_body,
    encode,
    get_point_body,
    group,
    groups_body,
    point,
    query_batch_body,
    query_body,
    retrieve_body,
    route,
    scroll_body,
    search_body,
)
from tests.fixtures.qdrant_models import RESPONSE_MODELS

UUID_A = "5c56c793-69f3-4fbf-87e6-c4bf54c28c26"
USAGE = {
    "hardware": {
        "cpu": 3,
        "payload_io_read": 10,
        "payload_io_write": 0,
        "payload_index_io_read": 2,
        "payload_index_io_write": 0,
        "vector_io_read": 40,
        "vector_io_write": 0,
    }
}


SUFFIXES = sorted(RESPONSE_MODELS)


def _build(suffix: str, points: Sequence[Point], keep: Collection[int] | None = None) -> Body:
    """The body for ``points`` laid out as ``suffix`` returns them (keep None), or as
    the gate releases it keeping only the points whose index is in ``keep``.

    A released body has only the keys Qdrant's spec gives it, payloads hold
    only the text (and a group's hits the grouped-by field, declared
    releasable), and scroll's cursor follows the last released point.
    Batches split the points in two halves and groups take two points each, so
    hit positions equal indexes in ``points``. This is the oracle for filtering.
    """

    def kept(start: int, hits: Sequence[Point]) -> list[Point]:
        if keep is None:
            return list(hits)
        return [_released(hit) for i, hit in enumerate(hits, start) if i in keep]

    half = len(points) // 2
    halves = [kept(0, points[:half]), kept(half, points[half:])]
    last = suffix.rsplit("/", 1)[-1]
    if suffix == "{id}":
        (single,) = kept(0, points[:1])  # a rejected single point is AbsentAnswer
        body = get_point_body(single)
    elif suffix == "":
        body = retrieve_body(kept(0, points))
    elif suffix == "scroll":
        released = kept(0, points)
        if keep is None:
            body = scroll_body(released, next_page_offset=UUID_A)
        else:
            body = scroll_body(released, next_page_offset=_after(released))
    elif suffix == "query":
        body = query_body(kept(0, points))
    elif suffix == "query/batch":
        body = query_batch_body(halves)
    elif last == "batch":
        body = batch_body(halves)
    elif last == "groups":
        keys = [f"doc-{i // 2}" for i in range(0, len(points), 2)]
        pairs = [
            (key, kept(i, in_group(points[i : i + 2], key)))
            for i, key in zip(range(0, len(points), 2), keys, strict=True)
        ]
        body = groups_body([group(key, hits) for key, hits in pairs if hits])
    else:
        body = search_body(kept(0, points))
    if keep is None:
        body["usage"] = USAGE
        body["x-unknown"] = {"kept": [1, 2.5, None]}
    return body


def _released(hit: Point) -> Point:
    """A point as ``GROUPED`` releases it: its payload is the text alone (and the
    grouped-by field, where a group's hit has it)."""
    payload = hit["payload"]
    grouped = {GROUP_FIELD: payload[GROUP_FIELD]} if GROUP_FIELD in payload else {}
    return {**hit, "payload": {"text": payload["text"], **grouped}}


# The payload field the groups of these tests are grouped by, declared releasable:
# a group's id is its value, which goes out only when the caller gets it anyway.
GROUP_FIELD = "doc"
GROUPED = QdrantFormat(AdapterOptions(releasable_fields=[GROUP_FIELD]))


def in_group(hits: Sequence[Point], key: int | str) -> list[Point]:
    """``hits`` as a group_by on ``GROUP_FIELD`` finds them for the group ``key``."""
    return [{**hit, "payload": {**hit["payload"], GROUP_FIELD: key}} for hit in hits]


def _after(points: Sequence[Point]) -> int | str | None:
    """Scroll's cursor after the released ``points``: the next id in Qdrant's order."""
    if not points:
        return None
    last = points[-1]["id"]
    if isinstance(last, int):
        return last + 1 if last < 2**64 - 1 else "00000000-0000-0000-0000-000000000000"
    return str(uuid.UUID(int=uuid.UUID(last).int + 1))


def _parse(body: Body, suffix: str, fmt: QdrantFormat | None = None) -> ParsedBody:
    return (fmt or GROUPED).parse(encode(body), route(suffix))


def _filtered(body: Body, suffix: str, keep: Collection[int]) -> Body:
    out = _parse(body, suffix).render(keep)
    RESPONSE_MODELS[suffix].model_validate_json(out)
    decoded: Body = orjson.loads(out)
    return decoded


POINTS = [
    point(1, "alpha", score=0.91, doc_id="a"),
    point(UUID_A, "beta", score=0.87, vector=[0.1, 0.2]),
    point(3, "gamma", score=0.5, tags=["x", "y"]),
    point("00000000-0000-0000-0000-000000000004", "delta", score=0.4),
    point(18446744073709551615, "epsilon", score=0.3),
    point(6, "zeta", score=0.2, nested={"a": {"b": [1, None]}}),
]


# -- routes ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/collections/docs/points/search"),
        ("POST", "/collections/docs/points/search/batch"),
        ("POST", "/collections/docs/points/search/groups"),
        ("POST", "/collections/docs/points/query"),
        ("POST", "/collections/docs/points/query/batch"),
        ("POST", "/collections/docs/points/query/groups"),
        ("POST", "/collections/docs/points/recommend"),
        ("POST", "/collections/docs/points/recommend/batch"),
        ("POST", "/collections/docs/points/recommend/groups"),
        ("POST", "/collections/docs/points/discover"),
        ("POST", "/collections/docs/points/discover/batch"),
        ("POST", "/collections/docs/points/scroll"),
        ("POST", "/collections/docs/points"),
        ("GET", "/collections/docs/points/42"),
        ("GET", f"/collections/docs/points/{UUID_A}"),
        ("POST", "/collections/docs/points/search/"),
        ("POST", "/collections/docs/points/"),
        ("GET", "/collections/docs/points/42/"),
        ("POST", "/collections/my-collection_2/points/query"),
        ("POST", "/collections/%D0%B4%D0%BE%D0%BA/points/query"),
        ("post", "/collections/docs/points/search"),
    ],
)
def test_filters_point_reading_routes(method: str, path: str) -> None:
    assert QdrantFormat().route_kind(Route(method, path)) is RouteKind.FILTERED


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("PUT", "/collections/docs/points"),  # upsert
        ("GET", "/collections/docs/points"),
        ("GET", "/collections/docs/points/"),
        ("POST", "/collections/docs/points/count"),
        ("POST", "/collections/docs/points/delete"),
        ("POST", "/collections/docs/points/payload"),
        ("POST", "/collections/docs/points/search/matrix/pairs"),
        ("POST", "/collections/docs/points/discover/groups"),
        ("POST", "/collections/docs/points/search/batch/extra"),
        ("POST", "/collections/docs/points/search//"),
        ("POST", "/collections//points/search"),
        ("POST", "/collection/docs/points/search"),
        ("POST", "/v1/collections/docs/points/search"),
        ("POST", "collections/docs/points/search"),
        ("GET", "/collections/docs/points/search/batch"),
        ("DELETE", "/collections/docs/points/42"),
        ("POST", "/collections/docs/points/42"),
        ("POST", "/"),
        ("POST", ""),
    ],
)
def test_filters_no_other_routes(method: str, path: str) -> None:
    assert QdrantFormat().route_kind(Route(method, path)) is not RouteKind.FILTERED


@pytest.mark.parametrize(
    ("method", "path", "kind"),
    [
        ("GET", "/collections/docs", RouteKind.FILTERED),
        ("GET", "/collections/docs/exists", RouteKind.READ),
        ("GET", "/collections/docs/aliases", RouteKind.CONTENT),
        ("HEAD", "/collections/docs/points", RouteKind.CONTENT),
        ("GET", "/collections/docs/cluster", RouteKind.CONTENT),  # points per shard
        ("POST", "/collections/docs/points/count", RouteKind.CONTENT),
        ("POST", "/collections/docs/points/search/matrix/pairs", RouteKind.CONTENT),
        ("POST", "/collections/docs/points/payload/clear", RouteKind.WRITE),
        ("PUT", "/collections/docs/points", RouteKind.WRITE),
        ("POST", "/collections/docs/points/delete", RouteKind.WRITE),
        ("POST", "/collections/docs/points/payload", RouteKind.WRITE),
        ("DELETE", "/collections/docs", RouteKind.WRITE),
        ("POST", "/collections/docs/facet", RouteKind.CONTENT),
        ("GET", "/collections/docs/snapshots/s1.snapshot", RouteKind.CONTENT),
        ("POST", "/collections/docs/snapshots", RouteKind.CONTENT),
        ("GET", "/snapshots", RouteKind.CONTENT),
        ("GET", "/collections", RouteKind.CONTENT),  # every collection's name
        ("GET", "/aliases", RouteKind.CONTENT),
        ("POST", "/collections/aliases", RouteKind.WRITE),  # alias changes
        ("GET", "/collections/docs/shards", RouteKind.CONTENT),  # shard keys
        ("PUT", "/collections/docs/shards", RouteKind.WRITE),
        ("POST", "/collections/docs/shards/delete", RouteKind.WRITE),
        ("POST", "/collections/docs/cluster", RouteKind.WRITE),
        ("GET", "/telemetry", RouteKind.CONTENT),  # points per collection and shard
        ("GET", "/metrics", RouteKind.CONTENT),
        ("GET", "/cluster/telemetry", RouteKind.CONTENT),
        ("POST", "/collections", None),
        ("GET", "/cluster", None),
        ("POST", "/api/v2/tenants/t/databases/d/collections/c/query", None),
        ("POST", "/docs/_search", None),
    ],
)
def test_route_kinds(method: str, path: str, kind: RouteKind | None) -> None:
    assert QdrantFormat().route_kind(Route(method, path)) is kind


def test_name() -> None:
    assert QdrantFormat().name == "qdrant"


# -- filtering ----------------------------------------------------------------


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_candidates_number_hits_in_document_order(suffix: str) -> None:
    points = POINTS[:1] if suffix == "{id}" else POINTS
    parsed = _parse(_build(suffix, points), suffix)
    assert list(parsed.candidates) == [
        Candidate(i, str(hit["id"]), hit["payload"]["text"]) for i, hit in enumerate(points)
    ]


@pytest.mark.parametrize("suffix", sorted(set(SUFFIXES) - {"{id}"}))
@pytest.mark.parametrize("keep", [set(), {0}, {1, 4}, {0, 2, 3, 5}, set(range(6)), {5, 99, -1}])
def test_render_keeps_exactly_the_kept_hits(suffix: str, keep: set[int]) -> None:
    assert _filtered(_build(suffix, POINTS), suffix, keep) == _build(suffix, POINTS, keep)


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_render_all_is_the_allowlisted_body(suffix: str) -> None:
    points = POINTS[:1] if suffix == "{id}" else POINTS
    everything = range(len(points))
    assert _filtered(_build(suffix, points), suffix, everything) == _build(
        suffix, points, everything
    )


@pytest.mark.parametrize(
    ("point_id", "shown"),
    [("42", "42"), ("0042", "42"), (UUID_A.upper(), UUID_A), ("not-an-id", "not-an-id")],
)
def test_rejected_single_point_is_answered_as_missing(point_id: str, shown: str) -> None:
    parsed = QdrantFormat().parse(
        encode(_build("{id}", POINTS[:1])), route("{id}", point_id=point_id)
    )
    with pytest.raises(AbsentAnswer) as raised:
        parsed.render(set())
    # Qdrant's own answer for a point that does not exist.
    assert raised.value.status == 404
    assert orjson.loads(raised.value.body) == {
        "status": {"error": f"Not found: No point with id {shown} found"},
        "time": 0.0,
    }


def test_envelope_and_result_keep_only_the_specs_keys() -> None:
    body = {
        "x-first": True,
        "result": {"next_page_offset": 7, "points": [POINTS[0], POINTS[2]], "extra": 1},
        "time": 1e-06,
        "status": "ok",
        "usage": USAGE,
    }
    out = QdrantFormat().parse(orjson.dumps(body), route("scroll")).render({0})
    assert orjson.loads(out) == {
        "result": {"points": [_released(POINTS[0])], "next_page_offset": 2},
        "time": 1e-06,
        "status": "ok",
    }


@pytest.mark.parametrize(
    ("kept", "upstream_next", "released_next"),
    [
        ({0, 1}, 99, "5c56c793-69f3-4fbf-87e6-c4bf54c28c27"),  # after the last released
        ({0}, 99, 2),  # rejected points after it are read again, never named
        (set(), 99, None),  # nothing released: any cursor would name a rejected point
        ({0, 1}, None, None),  # Qdrant says there is no more
        ({4}, 5, "00000000-0000-0000-0000-000000000000"),  # the largest integer id
    ],
)
def test_scroll_cursor_follows_the_last_released_point(
    kept: set[int], upstream_next: int | None, released_next: int | str | None
) -> None:
    body = scroll_body(POINTS, next_page_offset=upstream_next)
    out = orjson.loads(QdrantFormat().parse(encode(body), route("scroll")).render(kept))
    assert out["result"]["next_page_offset"] == released_next


def test_scroll_cursor_after_the_largest_uuid_ends_the_scroll() -> None:
    last = point("ffffffff-ffff-ffff-ffff-ffffffffffff", "omega")
    body = scroll_body([last], next_page_offset=None)
    body["result"]["next_page_offset"] = 1
    out = orjson.loads(QdrantFormat().parse(encode(body), route("scroll")).render({0}))
    assert out["result"]["next_page_offset"] is None


def test_declared_payload_fields_go_out_and_nothing_else() -> None:
    fmt = QdrantFormat(AdapterOptions(hashed_fields=["title"], releasable_fields=["meta.page"]))
    hit = point(1, "alpha", title="T", meta={"page": 3, "secret": "x"}, other="y")
    hit["shard_key"] = "s1"
    hit["x-extra"] = 1
    parsed = fmt.parse(encode(search_body([hit])), route("search"))
    assert parsed.candidates[0].fields == '{"title":"T"}'
    (released,) = orjson.loads(parsed.render({0}))["result"]
    assert released == {
        "id": 1,
        "version": 1,
        "score": 0.5,
        "shard_key": "s1",
        "payload": {"text": "alpha", "title": "T", "meta": {"page": 3}},
    }


def test_collection_info_goes_out_without_point_counts() -> None:
    info = {
        "status": "green",
        "optimizer_status": "ok",
        "segments_count": 2,
        "points_count": 1234,
        "indexed_vectors_count": 1200,
        "config": {"params": {"vectors": {"size": 4, "distance": "Cosine"}}},
        "payload_schema": {"tenant": {"data_type": "keyword", "params": None, "points": 1234}},
        "x-new": "dropped",
    }
    body = {"result": info, "status": "ok", "time": TIME, "usage": USAGE}
    parsed = QdrantFormat().parse(encode(body), Route("GET", "/collections/docs"))
    assert parsed.candidates == ()
    out = orjson.loads(parsed.render(set()))
    assert out == {
        "status": "ok",
        "time": TIME,
        "result": {
            "status": "green",
            "optimizer_status": "ok",
            "segments_count": 2,
            "config": info["config"],
            "payload_schema": {"tenant": {"data_type": "keyword", "params": None, "points": 0}},
        },
    }


@pytest.mark.parametrize(
    "optimizer",
    [{"error": "segment /var/lib/qdrant/acme-secret.bin is broken"}],
)
def test_an_optimizer_error_keeps_its_shape_with_the_gates_text(optimizer: Any) -> None:
    info = {"status": "red", "optimizer_status": optimizer, "segments_count": 1}
    body = {"result": info, "status": "ok", "time": TIME}
    out = orjson.loads(
        QdrantFormat().parse(encode(body), Route("GET", "/collections/docs")).render(set())
    )
    assert out["result"]["optimizer_status"] == {"error": OPTIMIZER_ERROR}
    assert b"acme-secret" not in orjson.dumps(out)
    # qdrant-client reads it as Qdrant's own optimizer error.
    status = TypeAdapter(models.OptimizersStatus).validate_python(out["result"]["optimizer_status"])
    assert status == models.OptimizersStatusOneOf1(error=OPTIMIZER_ERROR)


@pytest.mark.parametrize(
    "info",
    [
        {"status": "text of another tenant's chunk", "optimizer_status": "ok"},
        {"status": "green", "optimizer_status": "text of another tenant's chunk"},
        {"status": "green", "optimizer_status": {"error": 1}},
        {"status": "green", "optimizer_status": {"error": "e", "more": "x"}},
        {"status": "green", "segments_count": "2"},
        {"status": "green", "segments_count": -1},
        {"status": "green", "segments_count": True},
    ],
)
def test_collection_info_values_outside_their_enumeration_are_malformed(
    info: dict[str, Any],
) -> None:
    body = encode({"result": info, "status": "ok", "time": TIME})
    with pytest.raises(MalformedBody):
        QdrantFormat().parse(body, Route("GET", "/collections/docs"))


@pytest.mark.parametrize(
    "envelope",
    [
        {"status": "text of another tenant's chunk"},
        {"status": {"error": "quoting a document"}},
        {"status": "accepted"},  # an asynchronous write's, never a read's
        {"status": None},
        {"time": "text of another tenant's chunk"},
        {"time": True},
    ],
)
def test_an_envelope_status_or_time_that_is_no_reads_is_malformed(
    envelope: dict[str, Any],
) -> None:
    body = {**search_body(POINTS[:1]), **envelope}
    with pytest.raises(MalformedBody):
        _parse(body, "search")


# -- group ids are released values --------------------------------------------------


def test_a_group_id_of_a_field_not_released_makes_the_answer_unreleasable() -> None:
    # group_by on "secret" (not declared): the id is a value the caller may not read.
    hits = [point(1, "alpha", secret="acme-merger"), point(2, "beta", secret="acme-merger")]
    body = groups_body([group("acme-merger", hits)])
    parsed = QdrantFormat().parse(encode(body), route("search/groups"))
    with pytest.raises(Unreleasable) as raised:
        parsed.render({0, 1})
    assert raised.value.code == GROUP_ID_NOT_RELEASED
    # Declared releasable, the same value goes out with the field.
    fmt = QdrantFormat(AdapterOptions(releasable_fields=["secret"]))
    out = orjson.loads(fmt.parse(encode(body), route("search/groups")).render({1}))
    assert out["result"]["groups"] == [
        {
            "id": "acme-merger",
            "hits": [{**hits[1], "payload": {"text": "beta", "secret": "acme-merger"}}],
        }
    ]


def test_a_group_id_the_hits_do_not_carry_is_unreleasable_even_when_declared() -> None:
    # The database names a group by a value none of its released hits holds.
    hits = in_group([point(1, "alpha")], "doc-1")
    body = groups_body([group("another tenant's value", hits)])
    with pytest.raises(Unreleasable):
        _parse(body, "search/groups").render({0})


@pytest.mark.parametrize(
    ("group_id", "value"),
    [(7, "7"), ("7", 7), (1, True), (1, 1.0)],
)
def test_a_group_id_matches_a_released_value_of_its_own_type(group_id: Any, value: Any) -> None:
    body = groups_body([group(group_id, [point(1, "alpha", doc=value)])])
    with pytest.raises(Unreleasable):
        _parse(body, "search/groups").render({0})


def test_a_group_id_found_deep_in_a_released_field_or_a_list_is_released() -> None:
    fmt = QdrantFormat(AdapterOptions(releasable_fields=["meta"]))
    for value in ({"tags": ["x", 7]}, [{"a": 7}]):
        body = groups_body([group(7, [point(1, "alpha", meta=value)])])
        out = orjson.loads(fmt.parse(encode(body), route("search/groups")).render({0}))
        assert out["result"]["groups"][0]["id"] == 7


def test_a_group_id_is_released_by_its_released_lookup_point() -> None:
    # with_lookup finds the point whose id is the group id: when it goes out, so may the id.
    body = groups_body([group(42, [point(1, "alpha", secret=42)], lookup=point(42, "doc 42"))])
    parsed = QdrantFormat().parse(encode(body), route("search/groups"))
    out = orjson.loads(parsed.render({0, 1}))
    assert out["result"]["groups"][0]["id"] == 42
    with pytest.raises(Unreleasable):
        parsed.render({0})  # the lookup rejected


def test_render_can_be_called_again_with_another_keep_set() -> None:
    body = _build("query/groups", POINTS)
    parsed = _parse(body, "query/groups")
    first = parsed.render({0, 3})
    assert orjson.loads(parsed.render(set())) == _build("query/groups", POINTS, set())
    assert parsed.render({0, 3}) == first
    assert orjson.loads(parsed.render(range(6))) == _build("query/groups", POINTS, range(6))


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_shared_builders_make_valid_bodies(suffix: str) -> None:
    points = [point(i, f"text {i}", doc_id=f"doc-{i // 2}") for i in range(5)]
    points = points[:1] if suffix == "{id}" else points
    body = encode(BUILDERS[suffix](points))
    RESPONSE_MODELS[suffix].model_validate_json(body)
    parsed = QdrantFormat().parse(body, route(suffix))
    assert [c.chunk_id for c in parsed.candidates] == [str(p["id"]) for p in points]


# -- groups and lookups -------------------------------------------------------


def _groups_with_lookups() -> Body:
    lookup_a = point("doc-a", "document A")
    lookup_b = point("doc-b", "document B")
    return groups_body(
        [
            group("a", in_group(POINTS[0:2], "a"), lookup=lookup_a),  # positions 0, 1; lookup 2
            group("b", in_group(POINTS[2:3], "b"), lookup=lookup_b),  # position 3; lookup 4
            group("c", in_group(POINTS[3:5], "c")),  # positions 5, 6
        ]
    )


def test_group_lookup_is_a_candidate_after_its_hits() -> None:
    parsed = _parse(_groups_with_lookups(), "search/groups")
    assert [c.chunk_id for c in parsed.candidates] == [
        "1",
        UUID_A,
        "doc-a",
        "3",
        "doc-b",
        "00000000-0000-0000-0000-000000000004",
        "18446744073709551615",
    ]
    assert parsed.candidates[2].text == "document A"


def test_rejected_lookup_is_left_out_of_its_group() -> None:
    body = _groups_with_lookups()
    filtered = _filtered(body, "search/groups", {0, 3, 4, 5})
    groups = filtered["result"]["groups"]
    hits = [group["hits"] for group in body["result"]["groups"]]
    assert groups[0] == {"hits": [_released(hits[0][0])], "id": "a"}
    lookup_b = _released(body["result"]["groups"][1]["lookup"])
    assert groups[1] == {"hits": [_released(hits[1][0])], "id": "b", "lookup": lookup_b}
    assert groups[2] == {"hits": [_released(hits[2][0])], "id": "c"}


def test_group_without_kept_hits_is_removed_even_with_a_kept_lookup() -> None:
    body = _groups_with_lookups()
    filtered = _filtered(body, "query/groups", {2, 4, 5})
    (hit, _) = body["result"]["groups"][2]["hits"]
    assert filtered["result"]["groups"] == [{"hits": [_released(hit)], "id": "c"}]


def test_null_lookup_is_not_a_candidate() -> None:
    (hit,) = in_group(POINTS[0:1], 5)
    body = groups_body([{"hits": [hit], "id": 5, "lookup": None}])
    parsed = _parse(body, "search/groups")
    assert len(parsed.candidates) == 1
    # Qdrant leaves out a lookup that does not exist; the gate never sends a null.
    released = groups_body([{"hits": [_released(hit)], "id": 5}])
    assert orjson.loads(parsed.render({0})) == released


# -- trimming to the app's limits ------------------------------------------------


def _sub_results(suffix: str, count: int) -> list[range]:
    """Hit positions of each sub-result of a ``_build`` body."""
    if suffix.endswith("/batch"):
        return [range(count // 2), range(count // 2, count)]
    return [range(count)]


def _trimmed(
    suffix: str, count: int, keep: Collection[int], limits: Sequence[int | None]
) -> set[int]:
    """The oracle for ``render(keep, limits)``: the kept positions that survive
    trimming, in ``_build``'s layout (groups are consecutive pairs)."""
    survivors: set[int] = set()
    for positions, limit in zip(_sub_results(suffix, count), limits, strict=True):
        if suffix.endswith("/groups"):
            pairs = [[p for p in positions[i : i + 2] if p in keep] for i in range(0, count, 2)]
            survivors.update(p for pair in [pair for pair in pairs if pair][:limit] for p in pair)
        else:
            survivors.update([p for p in positions if p in keep][:limit])
    return survivors


TRIMMABLE = sorted(set(SUFFIXES) - {"{id}"})


def _filtered_with_limits(
    body: Body, suffix: str, keep: Collection[int], limits: Sequence[int | None]
) -> Body:
    out = _parse(body, suffix).render(keep, limits)
    RESPONSE_MODELS[suffix].model_validate_json(out)
    decoded: Body = orjson.loads(out)
    return decoded


def test_render_trims_to_k_in_rank_order() -> None:
    # k=5 asked, 10 fetched, 3 of the first 5 rejected: the first 5 admitted.
    hits = [point(i, f"text {i}", score=1 - i / 100) for i in range(10)]
    parsed = _parse(search_body(hits), "search")
    out = orjson.loads(parsed.render(set(range(10)) - {0, 2, 4}, (5,)))
    assert [hit["id"] for hit in out["result"]] == [1, 3, 5, 6, 7]


@pytest.mark.parametrize("suffix", TRIMMABLE)
@pytest.mark.parametrize("keep", [set(range(6)), {1, 2, 4, 5}, {0}, set()])
@pytest.mark.parametrize("limit", [0, 1, 2, 5, None])
def test_render_trims_every_sub_result(suffix: str, keep: set[int], limit: int | None) -> None:
    limits = [limit] * len(_sub_results(suffix, len(POINTS)))
    out = _filtered_with_limits(_build(suffix, POINTS), suffix, keep, limits)
    assert out == _build(suffix, POINTS, _trimmed(suffix, len(POINTS), keep, limits))


@pytest.mark.parametrize("suffix", ["search/batch", "query/batch", "discover/batch"])
def test_render_trims_each_batch_entry_to_its_own_limit(suffix: str) -> None:
    # Positions 0-2 are the first request's hits, 3-5 the second's.
    out = _filtered_with_limits(_build(suffix, POINTS), suffix, {0, 2, 3, 4, 5}, (1, None))
    assert out == _build(suffix, POINTS, {0, 3, 4, 5})


def test_render_limit_counts_groups_that_keep_hits() -> None:
    body = _groups_with_lookups()
    # Group "a" loses both hits and drops out; "b" and "c" are the first two left.
    filtered = _filtered_with_limits(body, "search/groups", {2, 3, 4, 5, 6}, (2,))
    assert [group["id"] for group in filtered["result"]["groups"]] == ["b", "c"]
    # The limit counts groups, never the hits inside one.
    filtered = _filtered_with_limits(body, "search/groups", set(range(7)), (1,))
    (first,) = filtered["result"]["groups"]
    assert first == {
        "id": "a",
        "hits": [_released(hit) for hit in body["result"]["groups"][0]["hits"]],
        "lookup": _released(body["result"]["groups"][0]["lookup"]),
    }


@pytest.mark.parametrize("limits", [None, (), [None]])
def test_render_without_limits_trims_nothing(limits: Sequence[int | None] | None) -> None:
    body = _build("query", POINTS)
    rendered = _parse(body, "query").render(range(6), limits)
    assert orjson.loads(rendered) == _build("query", POINTS, range(6))


@pytest.mark.parametrize(
    ("suffix", "limits"),
    [("search", (5, 5)), ("query/batch", (5,)), ("query/batch", (5, 5, 5)), ("scroll", (1, 2))],
)
def test_render_refuses_limits_for_other_sub_results(
    suffix: str, limits: Sequence[int | None]
) -> None:
    parsed = _parse(_build(suffix, POINTS), suffix)
    with pytest.raises(MalformedBody, match="sub-results"):
        parsed.render(range(6), limits)


# -- candidate fields ---------------------------------------------------------


def _hit(**fields: Any) -> Point:
    return {"version": 1, "score": 0.5, **fields}


@pytest.mark.parametrize(
    ("hit", "chunk_id", "text", "problem"),
    [
        (_hit(id=7, payload={"text": "t"}), "7", "t", None),
        (_hit(id=UUID_A, payload={"text": ""}), UUID_A, "", None),
        (_hit(id=7), "7", None, "no payload"),
        (_hit(id=7, payload=None), "7", None, "no payload"),
        (_hit(id=7, payload=["secret"]), "7", None, "payload is not an object"),
        (_hit(id=7, payload={}), "7", None, "payload field 'text' missing"),
        (_hit(id=7, payload={"text": None}), "7", None, "payload field 'text' missing"),
        (_hit(id=7, payload={"text": 12}), "7", None, "payload field 'text' is not a string"),
        (_hit(payload={"text": "t"}), None, "t", "point id missing"),
        (_hit(id=None, payload={"text": "t"}), None, "t", "point id missing"),
        (_hit(id=True, payload={"text": "t"}), None, "t", "point id is not a string or integer"),
        (_hit(id=1.5, payload={"text": "t"}), None, "t", "point id is not a string or integer"),
        (_hit(id=["x"], payload={"text": "t"}), None, "t", "point id is not a string or integer"),
        (_hit(id="", payload={"text": "t"}), None, "t", "point id is empty"),
        (_hit(id=""), None, None, "point id is empty; no payload"),
    ],
)
def test_candidate_from_point_id(
    hit: Point, chunk_id: str | None, text: str | None, problem: str | None
) -> None:
    parsed = _parse(search_body([hit]), "search")
    assert parsed.candidates == (Candidate(0, chunk_id, text, problem),)


@pytest.mark.parametrize(
    ("payload", "chunk_id", "text", "problem"),
    [
        ({"chunk": "c-1", "body": "b"}, "c-1", "b", None),
        ({"chunk": 12, "body": "b"}, "12", "b", None),
        ({"chunk": "c-1", "text": "wrong field"}, "c-1", None, "payload field 'body' missing"),
        ({"body": "b"}, None, "b", "payload field 'chunk' missing"),
        ({"chunk": None, "body": "b"}, None, "b", "payload field 'chunk' missing"),
        ({"chunk": "", "body": "b"}, None, "b", "payload field 'chunk' is empty"),
        (
            {"chunk": False, "body": "b"},
            None,
            "b",
            "payload field 'chunk' is not a string or integer",
        ),
        (
            {"chunk": {"s": 1}, "body": "b"},
            None,
            "b",
            "payload field 'chunk' is not a string or integer",
        ),
        (None, None, None, "no payload"),
    ],
)
def test_candidate_from_payload_fields(
    payload: dict[str, Any] | None, chunk_id: str | None, text: str | None, problem: str | None
) -> None:
    fmt = QdrantFormat(AdapterOptions(text_field="body", id_field="chunk"))
    parsed = _parse(search_body([_hit(id=99, payload=payload)]), "search", fmt)
    assert parsed.candidates == (Candidate(0, chunk_id, text, problem),)


def test_problems_never_contain_payload_values() -> None:
    hit = _hit(id=["SECRET-ID"], payload={"text": {"v": "SECRET-TEXT"}})
    (candidate,) = _parse(search_body([hit]), "search").candidates
    assert candidate.problem is not None
    assert "SECRET" not in candidate.problem


# -- malformed bodies ---------------------------------------------------------


@pytest.mark.parametrize(
    ("suffix", "body"),
    [
        ("search", b""),
        ("search", b"{not json"),
        ("search", b'{"result": [], "status": "\xff"}'),
        ("search", b"[" * 2000),
        ("search", b"[]"),
        ("search", b'"ok"'),
        ("search", b"null"),
        ("search", b'{"status": "ok", "time": 0.1}'),
        ("search", b'{"result": null}'),
        ("search", b'{"result": {"points": []}}'),
        ("search", b'{"result": ["SECRET"]}'),
        ("search", b'{"result": [[]]}'),
        ("search/batch", b'{"result": [{"points": []}]}'),
        ("search/batch", b'{"result": [[1]]}'),
        ("query", b'{"result": []}'),
        ("query", b'{"result": {"points": null}}'),
        ("query/batch", b'{"result": [[]]}'),
        ("query/batch", b'{"result": {"points": []}}'),
        ("search/groups", b'{"result": []}'),
        ("search/groups", b'{"result": {"groups": {}}}'),
        ("search/groups", b'{"result": {"groups": [[]]}}'),
        ("search/groups", b'{"result": {"groups": [{"id": 1}]}}'),
        ("search/groups", b'{"result": {"groups": [{"id": 1, "hits": [], "lookup": 3}]}}'),
        ("scroll", b'{"result": [], "status": "ok"}'),
        ("", b'{"result": {"points": []}}'),
        ("{id}", b'{"result": null}'),
        ("{id}", b'{"result": []}'),
    ],
)
def test_malformed_bodies(suffix: str, body: bytes) -> None:
    with pytest.raises(MalformedBody) as raised:
        QdrantFormat().parse(body, route(suffix))
    assert "SECRET" not in str(raised.value)
    assert raised.value.__cause__ is None
    assert raised.value.__context__ is None


# -- properties ---------------------------------------------------------------

_point_ids = st.integers(min_value=0, max_value=2**64 - 1) | st.uuids().map(str)


@st.composite
def _points(draw: st.DrawFn, min_size: int = 0, max_size: int = 8) -> list[Point]:
    ids = draw(st.lists(_point_ids, min_size=min_size, max_size=max_size))
    return [
        {
            "id": point_id,
            "version": draw(st.integers(min_value=0, max_value=2**32)),
            "score": draw(st.floats(allow_nan=False, allow_infinity=False)),
            "payload": {
                **draw(st.dictionaries(st.text(max_size=6), json_values, max_size=3)),
                "text": draw(st.text(max_size=12)),
            },
        }
        for point_id in ids
    ]


@st.composite
def _groups(draw: st.DrawFn) -> list[tuple[list[Point], Point | None]]:
    return [
        (
            draw(_points(max_size=3)),
            draw(st.none() | _points(min_size=1, max_size=1).map(lambda p: p[0])),
        )
        for _ in range(draw(st.integers(min_value=0, max_value=4)))
    ]


@PROPERTIES
@given(suffix=st.sampled_from(TRIMMABLE), points=_points(min_size=1), data=st.data())
def test_property_render_trims_to_limits(
    suffix: str, points: list[Point], data: st.DataObject
) -> None:
    keep = data.draw(st.sets(st.integers(min_value=0, max_value=len(points) - 1)))
    limits = [
        data.draw(st.none() | st.integers(min_value=0, max_value=len(points)))
        for _ in _sub_results(suffix, len(points))
    ]
    out = _filtered_with_limits(_build(suffix, points), suffix, keep, limits)
    assert out == _build(suffix, points, _trimmed(suffix, len(points), keep, limits))


@PROPERTIES
@given(groups=_groups(), data=st.data())
def test_property_groups_with_lookups(
    groups: list[tuple[list[Point], Point | None]], data: st.DataObject
) -> None:
    groups = [(in_group(hits, i), lookup) for i, (hits, lookup) in enumerate(groups)]
    body = groups_body([group(i, hits, lookup) for i, (hits, lookup) in enumerate(groups)])
    parsed = _parse(body, "recommend/groups")
    keep = data.draw(st.sets(st.integers(min_value=0, max_value=len(parsed.candidates))))

    expected, position = [], 0
    for i, (hits, lookup) in enumerate(groups):
        kept_hits = [hit for offset, hit in enumerate(hits, position) if offset in keep]
        position += len(hits)
        kept_lookup = lookup is not None and position in keep
        position += lookup is not None
        if kept_hits:
            released = [_released(hit) for hit in kept_hits]
            shown = _released(lookup) if lookup is not None and kept_lookup else None
            expected.append(group(i, released, shown))

    assert len(parsed.candidates) == position
    assert _filtered(body, "recommend/groups", keep) == groups_body(expected)


def test_a_substitute_goes_out_without_the_replaced_documents_fields() -> None:
    # Title and page describe the superseded document and were checked against its record.
    fmt = QdrantFormat(
        AdapterOptions(hashed_fields=["title"], releasable_fields=["meta.page", "meta.lang"])
    )
    hit = point(1, "old text", title="Old SOP", meta={"page": 3, "lang": "en"})
    parsed = fmt.parse(encode(search_body([hit])), route("search"))
    out = parsed.render({0}, replacements={0: Replacement("2", "new text")})
    (released,) = orjson.loads(out)["result"]
    assert released["id"] == 2
    assert released["payload"] == {"text": "new text", SUBSTITUTED_FOR: 1}
