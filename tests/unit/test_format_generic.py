"""The generic adapter: options, routes, both layouts, counts, removals, properties.

Where the shapes come from: the hits layout is the in-house API of the
configuration example in the adapter's brief (``results`` of ``{doc_id,
score, content: {text}}`` with ``total`` and ``facets``), here also batched
(``batches[*].results``); the parallel-arrays layout is Chroma's query
response (``chromadb.api.types.QueryResult``, the ``POST .../query`` response
of Chroma's OpenAPI spec: ``ids``, ``documents``, ``metadatas``,
``distances``, ``embeddings``, ``uris``, ``data``, one list per query, any of
them but ``ids`` null) and the flat variant of the brief's example. The
builders are in ``tests.fixtures.generic_bodies``.

No client library exists for an in-house API and chromadb's ``QueryResult``
is a TypedDict pydantic cannot build (numpy fields) nor chromadb's HTTP client
checks, so every filtered body is validated with the pydantic models below,
which state each shape's consistency rules: counts equal the hits they count,
parallel arrays align with the ids, removed fields are gone.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, model_validator

from sidecar.core.hits import Candidate, Replacement, Route, RouteKind
from sidecar.core.integrity import canonical_fields
from sidecar.formats.base import SUBSTITUTED_FOR, MalformedBody, ParsedBody
from sidecar.formats.registry import build_format_table
from tests.fixtures.format_strategies import PROPERTIES, json_scalars, json_values
from tests.fixtures.generic_bodies import (
    BATCHES,
    CHROMA,
    CHROMA_ARRAYS,
    FLAT,
    INHOUSE,
    Body,
    Hit,
    Row,
    batches_body,
    chroma_body,
    encode,
    flat_body,
    generic_format,
    hit,
    inhouse_body,
    route_of,
)


def _parse(config: Mapping[str, Any], body: Body) -> ParsedBody:
    return generic_format(config).parse(encode(body), route_of(config))


# -- fixtures: models that validate filtered bodies -----------------------------


class _Hit(BaseModel):
    model_config = ConfigDict(extra="allow")
    score: float


class InHouseResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")  # no facets after filtering
    took_ms: int
    results: list[_Hit]
    total: int

    @model_validator(mode="after")
    def _total_counts_results(self) -> InHouseResponse:
        assert self.total == len(self.results), "total is not the number of results"
        return self


class _Batch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: str
    total: int
    results: list[_Hit]

    @model_validator(mode="after")
    def _total_counts_results(self) -> _Batch:
        assert self.total == len(self.results), "total is not the number of results"
        return self


class BatchesResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")
    batches: list[_Batch]
    total: int

    @model_validator(mode="after")
    def _total_counts_all(self) -> BatchesResponse:
        assert self.total == sum(len(b.results) for b in self.batches)
        return self


class ChromaQueryResponse(BaseModel):
    """Chroma's QueryResponse, with ids that may be null (the generic adapter allows it)."""

    model_config = ConfigDict(extra="forbid")
    ids: list[list[str | int | None]]
    documents: list[list[str | None] | None] | None
    metadatas: list[list[dict[str, Any] | None] | None] | None
    distances: list[list[float | None] | None] | None
    embeddings: list[list[Any] | None] | None
    uris: list[list[Any] | None] | None
    data: list[list[Any] | None] | None
    include: list[str]

    @model_validator(mode="after")
    def _aligned(self) -> ChromaQueryResponse:
        for name in CHROMA_ARRAYS:
            arrays = getattr(self, name)
            if arrays is None:
                continue
            assert len(arrays) == len(self.ids), f"{name} has another number of queries"
            for ids, array in zip(self.ids, arrays, strict=True):
                assert array is None or len(array) == len(ids), f"{name} is not aligned"
        return self


class FlatResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ids: list[Any]
    documents: list[str | None] | None
    scores: list[float] | None
    metadatas: list[dict[str, Any] | None] | None
    next: None

    @model_validator(mode="after")
    def _aligned(self) -> FlatResponse:
        for array in (self.documents, self.scores, self.metadatas):
            assert array is None or len(array) == len(self.ids)
        return self


MODELS: dict[str, type[BaseModel]] = {
    "inhouse": InHouseResponse,
    "batched": BatchesResponse,
    "chroma-like": ChromaQueryResponse,
    "columns": FlatResponse,
}


def _filtered(
    config: Mapping[str, Any],
    body: Body,
    keep: Collection[int],
    replacements: Mapping[int, Replacement] | None = None,
) -> Body:
    out = _parse(config, body).render(keep, replacements=replacements)
    MODELS[config["name"]].model_validate_json(out)
    return orjson.loads(out)


HITS = [
    hit(1, "alpha", score=0.9, lang="en"),
    hit("b", "beta", score=0.8),
    hit(3, "gamma", score=0.7, tags=["x"]),
    hit("d-4", "delta", score=0.6),
    hit(5, "", score=0.5),
]
ROWS: list[Row] = [
    ("a", "alpha", {"lang": "en"}, 0.1),
    ("b", "beta", None, 0.2),
    ("c", "gamma", {"page": 3}, 0.3),
    ("d", None, {}, 0.4),
    ("e", "epsilon", {"x": [1, None]}, 0.5),
]


# The configurations with every content field of HITS declared releasable.
INHOUSE_ALL = {**INHOUSE, "releasable_fields": ["content.lang", "content.tags"]}
BATCHES_ALL = {**BATCHES, "releasable_fields": ["content.lang", "content.tags"]}


def _kept(items: Sequence[Any], keep: Collection[int], start: int = 0) -> list[Any]:
    return [item for i, item in enumerate(items, start) if i in keep]


def _halves(items: Sequence[Any], keep: Collection[int] | None = None) -> list[list[Any]]:
    """Two batches (first two items, the rest), keeping only positions in ``keep``."""
    every = range(len(items)) if keep is None else keep
    return [_kept(items[:2], every), _kept(items[2:], every, 2)]


# -- options ----------------------------------------------------------------------


def test_the_brief_examples_build() -> None:
    assert generic_format(INHOUSE).name == "inhouse"
    assert generic_format(FLAT).name == "columns"
    assert generic_format(BATCHES).name == "batched"
    assert generic_format(CHROMA).name == "chroma-like"


@pytest.mark.parametrize("option", ["text_field", "id_field"])
def test_text_field_and_id_field_are_not_options(option: str) -> None:
    # The selectors say where the id and text are: an option it would not use is refused.
    options = {"adapter": "generic", **{k: v for k, v in INHOUSE.items() if k != "name"}}
    with pytest.raises(ValueError, match=rf"^formats\.inhouse: unknown option '{option}'$"):
        build_format_table(
            {"inhouse": {**options, option: "x"}}, {}, text_field="body", id_field="chunk"
        )
    # The global defaults are for the formats that take them.
    built = build_format_table({"inhouse": options}, {}, text_field="body", id_field="chunk")
    parsed = built.formats[0].parse(encode(inhouse_body(HITS)), route_of(INHOUSE))
    assert parsed.candidates[0] == Candidate(0, "1", "alpha")


HITS_OPTIONS = {k: v for k, v in INHOUSE.items() if k in ("name", "routes")}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"name": ""}, "^name: "),
        ({"name": "In House"}, "^name: "),
        ({"name": "x" * 33}, "^name: "),
        ({"name": "inhouse.v1"}, "^name: "),
        ({"name": 5}, "^name: "),
        ({"routes": "POST /api/retrieve"}, "^routes: expected a list"),
        ({"routes": []}, "^routes: at least one"),
        ({"routes": [5]}, "^routes: expected a list of strings"),
        ({"routes": ["/api/retrieve"]}, r"^routes\[0\]: expected 'METHOD /path'"),
        ({"routes": ["POST /a", "POST api"]}, r"^routes\[1\]: expected 'METHOD /path'"),
        ({"routes": ["POST  /a"]}, r"^routes\[0\]: expected 'METHOD /path'"),
        ({"routes": ["PO5T /a"]}, r"^routes\[0\]: expected 'METHOD /path'"),
        ({"routes": ["POST /a/{b"]}, r"^routes\[0\]: path segment '\{b'"),
        ({"routes": ["POST /a/x{b}"]}, r"^routes\[0\]: path segment 'x\{b\}'"),
        ({"routes": ["POST /a/{1b}"]}, r"^routes\[0\]: path segment"),
        ({"routes": ["POST /a//b"]}, r"^routes\[0\]: path segment ''"),
        ({"routes": ["POST /a/%72"]}, r"^routes\[0\]: path segment '%72'"),
        ({"routes": ["POST /a/../b"]}, r"^routes\[0\]: path segment '..'"),
        ({"routes": ["POST /a?b=1"]}, r"^routes\[0\]: path segment 'a\?b=1'"),
        ({"routes": ["POST /a b"]}, r"^routes\[0\]: path segment 'a b'"),
    ],
)
def test_invalid_common_options(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        generic_format(INHOUSE, **changes)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "^hits, ids: give either"),
        ({"hits": "$.r[*]", "id": "i", "text": "t", "ids": "$.i[*]"}, "^hits, ids: "),
        ({"hits": "$.r[*]", "id": "i", "text": "t", "texts": "$.t[*]"}, "^hits, ids: "),
        ({"hits": "$.r[*]", "id": "i", "text": "t", "parallel": ["$.s[*]"]}, "^hits, ids: "),
        ({"ids": "$.i[*]", "texts": "$.t[*]", "id": "i"}, "^hits, ids: "),
        ({"hits": "$.r[*]", "text": "t"}, "^id, text: both"),
        ({"hits": "$.r[*]", "id": "i"}, "^id, text: both"),
        ({"hits": "$.results", "id": "i", "text": "t"}, r"^hits: .* must end with \[\*\]"),
        ({"hits": "$", "id": "i", "text": "t"}, r"^hits: .* must end with \[\*\]"),
        ({"hits": "$..r[*]", "id": "i", "text": "t"}, r"^hits: selector '\$\.\.r\[\*\]': .*2$"),
        ({"hits": ["$.r[*]"], "id": "i", "text": "t"}, "^hits: expected a selector string"),
        ({"hits": "$.r[*]", "id": "m.ids[*].v", "text": "t"}, r"^id: .*one value \(no \[\*\]\)"),
        ({"hits": "$.r[*]", "id": "$.a[*].b", "text": "t"}, r"^id: .*one value"),
        ({"hits": "$.r[*]", "id": "$", "text": "t"}, "^id: .* must end with a field name"),
        ({"hits": "$.r[*]", "id": "i", "text": ""}, "^text: selector '': empty selector"),
        ({"hits": "$.r[*]", "id": "i", "text": "a b"}, r"^text: selector 'a b': .*position 1$"),
        ({"ids": "$.i[*]"}, "^texts: needed with ids"),
        ({"ids": "$.i", "texts": "$.t[*]"}, r"^ids: .* must end with \[\*\]"),
        ({"ids": "$.i[*]", "texts": "$.t"}, r"^texts: .* must end with \[\*\]"),
        ({"ids": "$.i[*][*]", "texts": "$.t[*]"}, r"^texts: .* as many \[\*\] as ids"),
        (
            {"ids": "$.i[*]", "texts": "$.t[*]", "parallel": ["$.s[*]", "$.m[*][*]"]},
            r"^parallel\[1\]: .* as many \[\*\] as ids",
        ),
        (
            {"ids": "$.i[*]", "texts": "$.t[*]", "parallel": ["$.s"]},
            r"^parallel\[0\]: .* must end with \[\*\]",
        ),
        ({"ids": "$.i[*]", "texts": "$.t[*]", "parallel": "$.s[*]"}, "^parallel: expected a list"),
        ({"ids": "$.i[*]", "texts": "$.i[*]"}, r"^texts: selector '\$\.i\[\*\]' overlaps ids"),
        (
            {"ids": "$.i[*]", "texts": "$.t[*]", "parallel": ["$.t[*]"]},
            r"^parallel\[0\]: .* overlaps texts",
        ),
        (
            {"ids": "$.i[*][*]", "texts": "$.t[*][*]", "parallel": ["$.i[*].x[*]"]},
            r"^parallel\[0\]: .*overlaps ids",
        ),
        (
            {"ids": "$[*]", "texts": "$.t[*]"},
            r"^texts: selector '\$\.t\[\*\]' overlaps ids",
        ),
    ],
)
def test_invalid_layouts(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        generic_format(HITS_OPTIONS, **options)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"count_fields": "$.total"}, "^count_fields: expected a list"),
        ({"count_fields": ["$.total", 1]}, "^count_fields: expected a list of strings"),
        ({"count_fields": ["$.counts[*]"]}, r"^count_fields\[0\]: .*must end with a field name"),
        ({"count_fields": ["$.results[*].n"]}, r"^count_fields\[0\]: .*does not enclose"),
        ({"count_fields": ["$.x[*].n"]}, r"^count_fields\[0\]: .*does not enclose"),
        ({"count_fields": ["$.results"]}, r"^count_fields\[0\]: .*overlaps hits"),
        ({"count_fields": ["$.total", "$.total"]}, r"^count_fields\[1\]: .*overlaps count"),
        ({"count_fields": ["$.t", "$.t.n"]}, r"^count_fields\[1\]: .*overlaps count_fields\[0\]"),
        ({"count_fields": ["$.bad["]}, r"^count_fields\[0\]: selector '\$\.bad\[': "),
        ({"remove_fields": "$.facets"}, "^remove_fields: expected a list"),
        ({"remove_fields": ["$"]}, r"^remove_fields\[0\]: .*must end with a field name"),
        ({"remove_fields": ["$.results"]}, r"^remove_fields\[0\]: .*overlaps hits"),
        ({"remove_fields": ["$.results[*].hl"]}, r"^remove_fields\[0\]: .*overlaps hits"),
        ({"remove_fields": ["$.total"]}, r"^remove_fields\[0\]: .*overlaps count_fields\[0\]"),
        ({"remove_fields": ["$.total.x"]}, r"^remove_fields\[0\]: .*overlaps count_fields"),
        ({"hits": "$[*]"}, r"^count_fields\[0\]: .*overlaps hits"),
        ({"keep_fields": "$.took_ms"}, "^keep_fields: expected a list"),
        ({"keep_fields": ["$.x[*]"]}, r"^keep_fields\[0\]: .*must end with a field name"),
        ({"keep_fields": ["$.results[*].score"]}, r"^keep_fields\[0\]: .*does not enclose"),
        ({"keep_fields": ["$.results"]}, r"^keep_fields\[0\]: .*overlaps hits"),
        ({"keep_fields": ["$.total"]}, r"^keep_fields\[0\]: .*overlaps count_fields\[0\]"),
        ({"keep_fields": ["$.facets"]}, r"^remove_fields\[0\]: .*overlaps keep_fields\[0\]"),
    ],
)
def test_invalid_count_and_remove_fields(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        generic_format(INHOUSE, **changes)


def test_counts_and_removals_of_nested_batches_are_accepted() -> None:
    generic_format(BATCHES, remove_fields=["$.batches[*].facets", "$.batches[*].debug.trace"])
    generic_format(BATCHES, count_fields=["$.stats.total", "$.batches[*].stats.n"])
    generic_format(CHROMA, count_fields=["$.n"], remove_fields=["$.answer"])


# -- routes -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "kind"),
    [
        ("POST", "/api/retrieve", RouteKind.FILTERED),
        ("post", "/api/retrieve", RouteKind.FILTERED),
        ("POST", "/api/retrieve/", RouteKind.FILTERED),
        ("POST", "/API/Retrieve", None),
        ("POST", "/api/v1/collections/docs/search", RouteKind.FILTERED),
        ("POST", "/api/v1/collections/my-coll_2.v1/search/", RouteKind.FILTERED),
        ("POST", "/api/v1/collections/{name}/search", RouteKind.FILTERED),
        ("GET", "/api/retrieve", None),
        ("PUT", "/api/retrieve", None),
        ("DELETE", "/api/v1/collections/docs/search", None),
        ("POST", "/api/retrieve/batch", None),
        ("POST", "/api/retrieves", None),
        ("POST", "/api/retriev", None),
        ("POST", "/api", None),
        ("POST", "/v2/api/retrieve", None),
        ("POST", "api/retrieve", None),
        ("POST", "/api/retrieve//", None),
        ("POST", "/api/v1/collections//search", None),
        ("POST", "/api/v1/collections/search", None),
        ("POST", "/api/v1/collections/a/b/search", None),
        ("POST", "/api/v1/collections/docs/search/batch", None),
        ("POST", "/api/v1/collections/docs", None),
        ("POST", "/collections/docs/points/search", None),
        ("POST", "/", None),
        ("POST", "", None),
    ],
)
def test_route_kind(method: str, path: str, kind: RouteKind | None) -> None:
    assert generic_format(INHOUSE).route_kind(Route(method, path)) is kind


def test_route_kind_of_the_root_and_of_other_methods() -> None:
    fmt = generic_format(INHOUSE, routes=["GET /", "PATCH /search/{a}/{b}"])
    assert fmt.route_kind(Route("GET", "/")) is RouteKind.FILTERED
    assert fmt.route_kind(Route("PATCH", "/search/x/y")) is RouteKind.FILTERED
    assert fmt.route_kind(Route("PATCH", "/search/x")) is None
    assert fmt.route_kind(Route("POST", "/")) is None


def test_parse_rejects_a_route_it_does_not_handle() -> None:
    with pytest.raises(ValueError, match="not handled by the inhouse format"):
        generic_format(INHOUSE).parse(encode(inhouse_body(HITS)), Route("GET", "/api/retrieve"))


# -- hits layout --------------------------------------------------------------------


def test_candidates_number_hits_in_document_order() -> None:
    parsed = _parse(INHOUSE, inhouse_body(HITS))
    assert list(parsed.candidates) == [
        Candidate(i, str(h["doc_id"]), h["content"]["text"]) for i, h in enumerate(HITS)
    ]


@pytest.mark.parametrize("keep", [set(), {0}, {1, 3}, {0, 2, 3, 4}, set(range(5)), {4, 9, -1}])
def test_render_keeps_exactly_the_kept_hits(keep: set[int]) -> None:
    filtered = _filtered(INHOUSE_ALL, inhouse_body(HITS), keep)
    assert filtered == inhouse_body(_kept(HITS, keep), facets=False)


@pytest.mark.parametrize("keep", [set(), {0}, {1, 2}, {0, 2, 3, 4}, set(range(5))])
def test_batches_number_through_and_count_per_batch(keep: set[int]) -> None:
    body = batches_body(_halves(HITS))
    parsed = _parse(BATCHES, body)
    assert [c.chunk_id for c in parsed.candidates] == ["1", "b", "3", "d-4", "5"]
    filtered = _filtered(BATCHES_ALL, body, keep)
    assert filtered == batches_body(_halves(HITS, keep), facets=False)


def test_empty_batches_and_no_batches() -> None:
    body = batches_body([[], HITS[:2], []])
    assert [c.position for c in _parse(BATCHES, body).candidates] == [0, 1]
    assert _filtered(BATCHES_ALL, body, {1}) == batches_body([[], HITS[1:2], []], facets=False)
    empty = batches_body([])
    assert _parse(BATCHES, empty).candidates == ()
    assert _filtered(BATCHES, empty, set()) == batches_body([], facets=False)


def test_count_fields_become_the_kept_number_even_when_larger() -> None:
    # A paging API's total counts matches beyond the page, other tenants' too.
    body = {**inhouse_body(HITS), "total": 1234}
    assert _filtered(INHOUSE, body, {0, 1})["total"] == 2
    assert _filtered(INHOUSE, body, range(5))["total"] == 5


@pytest.mark.parametrize("total", [2.0, 1e30, -1, 0])
def test_any_number_is_a_count(total: float) -> None:
    body = {**inhouse_body(HITS), "total": total}
    assert _filtered(INHOUSE, body, {3})["total"] == 1


def test_null_or_missing_count_is_left_alone() -> None:
    body = {**inhouse_body(HITS), "total": None}
    out = orjson.loads(_parse(INHOUSE, body).render({0}))
    assert out["total"] is None
    del body["total"]
    assert "total" not in orjson.loads(_parse(INHOUSE, body).render({0}))


def test_unconfigured_fields_are_left_out_even_when_every_hit_is_kept() -> None:
    body = batches_body(_halves(HITS))
    out = _filtered(BATCHES, body, range(5))
    assert "facets" not in out
    assert all("facets" not in batch for batch in out["batches"])
    # Absent already: nothing to do.
    del body["facets"]
    assert _filtered(BATCHES, body, range(5)) == out


def test_count_fields_of_several_levels_and_names() -> None:
    config = {
        **BATCHES,
        "count_fields": ["$.meta.total", "$.batches[*].stats['n.hits']"],
        "remove_fields": [],
    }
    body = {
        "meta": {"total": 5, "x": 1},
        "batches": [
            {"stats": {"n.hits": 2}, "results": HITS[:2]},
            {"stats": {"n.hits": 3}, "results": HITS[2:]},
        ],
    }
    out = orjson.loads(_parse(config, body).render({0, 3}))
    assert out["meta"] == {"total": 2}
    assert [b["stats"] for b in out["batches"]] == [{"n.hits": 1}, {"n.hits": 1}]


def test_top_level_array_of_hits() -> None:
    config = {
        **INHOUSE_ALL,
        "hits": "$[*]",
        "count_fields": [],
        "keep_fields": [],
        "remove_fields": [],
    }
    parsed = _parse(config, HITS)
    assert len(parsed.candidates) == 5
    assert orjson.loads(parsed.render({1, 4})) == [HITS[1], HITS[4]]
    assert orjson.loads(parsed.render(set())) == []


def test_quoted_names_in_selectors() -> None:
    config = {
        **INHOUSE,
        "hits": "$['@search.results'][*]",
        "id": "['meta.id']",
        "text": "$.body['text']",
        "count_fields": ["$['@odata.count']"],
        "remove_fields": ["$['@search.facets']"],
    }
    hits = [{"meta.id": f"m{i}", "body": {"text": f"t{i}"}} for i in range(3)]
    body = {"@odata.count": 3, "@search.facets": {}, "@search.results": hits}
    parsed = _parse(config, body)
    assert [(c.chunk_id, c.text) for c in parsed.candidates] == [
        ("m0", "t0"),
        ("m1", "t1"),
        ("m2", "t2"),
    ]
    assert orjson.loads(parsed.render({2})) == {"@odata.count": 1, "@search.results": hits[2:]}


def test_render_keeps_only_the_configured_places_in_key_order() -> None:
    body = {
        "z": 1,
        "took_ms": 4,
        "results": HITS[:2],
        "a": [None, {"k": 2.5}],
        "total": 2,
        "facets": {},
        "next": "SECRET",
    }
    out = orjson.loads(_parse(INHOUSE_ALL, body).render({1}))
    assert out == {"took_ms": 4, "results": HITS[1:2], "total": 1}
    assert list(out) == ["took_ms", "results", "total"]


def test_keep_fields_go_out_as_they_came_where_present() -> None:
    config = {**BATCHES, "keep_fields": ["$.batches[*].query", "$.meta.request_id"]}
    body = {
        "meta": {"request_id": {"id": "r-1"}, "debug": "SECRET"},
        "batches": [{"query": "q0", "results": []}, {"results": [], "trace": "SECRET"}],
        "total": 0,
    }
    out = _parse(config, body).render(set())
    assert out == orjson.dumps(
        {
            "meta": {"request_id": {"id": "r-1"}},
            "batches": [{"query": "q0", "results": []}, {"results": []}],
            "total": 0,
        }
    )


def test_hit_fields_go_out_only_when_declared() -> None:
    result = {
        "doc_id": 1,
        "score": 0.5,
        "rank": 3,
        "content": {"text": "t", "title": "T", "source": {"url": "u", "key": "SECRET"}},
        "highlight": "SECRET",
    }
    body = {"results": [result], "total": 1}
    plain = _parse({**INHOUSE, "hit_fields": []}, body).render({0})
    declared = _parse(
        {
            **INHOUSE,
            "hit_fields": ["score", "rank"],
            "hashed_fields": ["content.title"],
            "releasable_fields": ["content.source.url"],
        },
        body,
    ).render({0})
    assert orjson.loads(plain)["results"] == [{"doc_id": 1, "content": {"text": "t"}}]
    assert orjson.loads(declared)["results"] == [
        {
            "doc_id": 1,
            "score": 0.5,
            "rank": 3,
            "content": {"text": "t", "title": "T", "source": {"url": "u"}},
        }
    ]
    assert b"SECRET" not in plain + declared


def test_substitutes_keep_hit_fields_and_drop_declared_ones() -> None:
    config = {**INHOUSE, "releasable_fields": ["content.title"]}
    result = {"doc_id": 1, "score": 0.5, "content": {"text": "t", "title": "T"}}
    parsed = _parse(config, {"results": [result], "total": 1})
    out = orjson.loads(parsed.render({0}, replacements={0: Replacement("2", "new")}))
    assert out["results"] == [
        {"doc_id": 2, "score": 0.5, "content": {"text": "new", SUBSTITUTED_FOR: 1}}
    ]


@pytest.mark.parametrize(
    ("changes", "name"),
    [
        ({"hit_fields": ["content"]}, "content"),
        ({"hit_fields": ["doc_id"]}, "doc_id"),
        ({"hit_fields": ["x", ""]}, ""),
        ({"hit_fields": ["meta"], "releasable_fields": ["meta.source"]}, "meta"),
        ({"hit_fields": ["m"], "hashed_fields": ["m"]}, "m"),
    ],
)
def test_hit_fields_cannot_hold_the_document(changes: dict[str, Any], name: str) -> None:
    with pytest.raises(ValueError, match=f"^hit_fields: '{name}' is empty or holds"):
        generic_format(INHOUSE, **changes)
    with pytest.raises(ValueError, match=r"^hit_fields: expected a list"):
        generic_format(INHOUSE, hit_fields="score")


def test_hashed_hit_fields_reach_the_candidate() -> None:
    config = {**INHOUSE, "hit_fields": [], "hashed_fields": ["content.title", "score"]}
    result = {"doc_id": 1, "score": 0.5, "content": {"text": "t", "title": "T"}}
    (candidate,) = _parse(config, {"results": [result], "total": 1}).candidates
    assert candidate == Candidate(
        0, "1", "t", None, canonical_fields({"content.title": "T", "score": 0.5})
    )


@pytest.mark.parametrize("config", [CHROMA, FLAT])
def test_declared_fields_need_the_hits_layout(config: dict[str, Any]) -> None:
    for option in ("hashed_fields", "releasable_fields"):
        with pytest.raises(ValueError, match="only with hits"):
            generic_format(config, **{option: ["x"]})


def test_render_is_repeatable_and_never_changes_the_parsed_body() -> None:
    body = batches_body(_halves(HITS))
    original = copy.deepcopy(body)
    parsed = _parse(BATCHES_ALL, body)
    first = parsed.render({0, 3}, replacements={0: Replacement("x", "new")})
    assert parsed.render(set()) == encode(batches_body([[], []], facets=False))
    assert parsed.render({0, 3}, replacements={0: Replacement("x", "new")}) == first
    assert orjson.loads(parsed.render(range(5))) == batches_body(_halves(HITS), facets=False)
    assert body == original


def test_released_positions_and_limits() -> None:
    parsed = _parse(INHOUSE, inhouse_body(HITS))
    assert parsed.released_positions({4, 0, 2, 7}) == [0, 2, 4]
    assert parsed.released_positions(set(), None) == []
    assert parsed.render({1}, None) == parsed.render({1}, ())
    with pytest.raises(MalformedBody, match="does not trim"):
        parsed.render({1}, [1])
    with pytest.raises(MalformedBody, match="does not trim"):
        parsed.released_positions({1}, [None])


@pytest.mark.parametrize(
    ("result", "chunk_id", "text", "problem"),
    [
        ({"doc_id": 7, "content": {"text": "t"}}, "7", "t", None),
        ({"doc_id": "", "content": {"text": "t"}}, None, "t", "hit field 'doc_id' is empty"),
        ({"content": {"text": "t"}}, None, "t", "hit field 'doc_id' missing"),
        ({"doc_id": None, "content": {"text": "t"}}, None, "t", "hit field 'doc_id' missing"),
        (
            {"doc_id": True, "content": {"text": "t"}},
            None,
            "t",
            "hit field 'doc_id' is not a string or integer",
        ),
        (
            {"doc_id": {"SECRET": 1}, "content": {"text": "t"}},
            None,
            "t",
            "hit field 'doc_id' is not a string or integer",
        ),
        ({"doc_id": 7}, "7", None, "hit field 'content.text' missing"),
        ({"doc_id": 7, "content": None}, "7", None, "hit field 'content.text' missing"),
        ({"doc_id": 7, "content": "SECRET"}, "7", None, "hit field 'content.text' missing"),
        ({"doc_id": 7, "content": {}}, "7", None, "hit field 'content.text' missing"),
        (
            {"doc_id": 7, "content": {"text": ["SECRET"]}},
            "7",
            None,
            "hit field 'content.text' is not a string",
        ),
        ({}, None, None, "hit field 'doc_id' missing; hit field 'content.text' missing"),
    ],
)
def test_candidate_problems_name_the_field(
    result: Hit, chunk_id: str | None, text: str | None, problem: str | None
) -> None:
    parsed = _parse(INHOUSE, {"results": [result], "total": 1})
    assert parsed.candidates == (Candidate(0, chunk_id, text, problem),)
    # A hit without usable id or text is still a hit: the gate rejects it.
    (sent,) = orjson.loads(parsed.render({0}))["results"]
    assert sent == _released_hit(result)


# -- hits layout: replacements ------------------------------------------------------


def test_replacement_sets_id_and_text_and_marks_the_text_object() -> None:
    body = inhouse_body(HITS)
    out = _filtered(
        INHOUSE_ALL, body, {0, 1}, {0: Replacement("11", "new"), 1: Replacement("z", "Z")}
    )
    first, second = out["results"]
    # An integer id stays an integer; the score stays, the declared lang goes.
    assert first == {
        "doc_id": 11,
        "score": 0.9,
        "content": {"text": "new", SUBSTITUTED_FOR: 1},
    }
    assert second == {"doc_id": "z", "score": 0.8, "content": {"text": "Z", SUBSTITUTED_FOR: "b"}}


@pytest.mark.parametrize(
    ("old", "new", "written"),
    [
        (1, "007", "007"),
        (1, "-3", "-3"),
        (1, "x", "x"),
        (1, "²", "²"),
        ("1", "2", "2"),
        (1, "2", 2),
    ],
)
def test_replacement_id_type(old: Any, new: str, written: Any) -> None:
    out = _filtered(INHOUSE, inhouse_body([hit(old, "t")]), {0}, {0: Replacement(new, "n")})
    assert out["results"][0]["doc_id"] == written


def test_replacement_with_top_level_text_and_nested_id() -> None:
    config = {
        **INHOUSE,
        "id": "meta.chunk",
        "text": "text",
        "count_fields": [],
        "keep_fields": [],
        "releasable_fields": ["meta.doc"],
    }
    results = [{"meta": {"chunk": "c1", "doc": "D"}, "text": "old", "score": 1.0}]
    parsed = _parse(config, {"results": results})
    out = orjson.loads(parsed.render({0}, replacements={0: Replacement("c2", "rev 2")}))
    assert out["results"] == [
        {"meta": {"chunk": "c2"}, "text": "rev 2", "score": 1.0, SUBSTITUTED_FOR: "c1"}
    ]
    assert orjson.loads(parsed.render({0}))["results"] == results


def test_replacement_of_a_hit_without_text_object_creates_it() -> None:
    parsed = _parse(INHOUSE, {"results": [{"doc_id": 1, "content": None}]})
    out = orjson.loads(parsed.render({0}, replacements={0: Replacement("2", "t")}))
    assert out["results"] == [{"doc_id": 2, "content": {SUBSTITUTED_FOR: 1, "text": "t"}}]
    parsed = _parse(INHOUSE, {"results": [{"doc_id": 1, "content": "SECRET"}]})
    with pytest.raises(MalformedBody, match="cannot be placed"):
        parsed.render({0}, replacements={0: Replacement("2", "t")})


def test_replacements_of_unkept_positions_are_ignored() -> None:
    parsed = _parse(INHOUSE, inhouse_body(HITS))
    assert parsed.render({1}, replacements={0: Replacement("x", "y")}) == parsed.render({1})


# -- parallel arrays ----------------------------------------------------------------


def test_chroma_like_candidates_and_render() -> None:
    body = chroma_body([ROWS[:2], [], ROWS[2:]])
    parsed = _parse(CHROMA, body)
    assert list(parsed.candidates) == [
        Candidate(0, "a", "alpha"),
        Candidate(1, "b", "beta"),
        Candidate(2, "c", "gamma"),
        Candidate(3, "d", None, "entry of '$.documents[*][*]' missing"),
        Candidate(4, "e", "epsilon"),
    ]
    out = _filtered(CHROMA, body, {1, 2, 4})
    assert out == chroma_body([ROWS[1:2], [], [ROWS[2], ROWS[4]]])


@pytest.mark.parametrize("keep", [set(), {0}, {1, 3}, set(range(5))])
def test_flat_parallel_arrays(keep: set[int]) -> None:
    body = flat_body(ROWS)
    assert [c.chunk_id for c in _parse(FLAT, body).candidates] == ["a", "b", "c", "d", "e"]
    assert _filtered(FLAT, body, keep) == flat_body(_kept(ROWS, keep))


def test_null_arrays_are_skipped_and_null_texts_are_problems() -> None:
    body = chroma_body([ROWS[:2], ROWS[2:]], nulls=("documents", "embeddings", "uris", "data"))
    parsed = _parse(CHROMA, body)
    assert {c.problem for c in parsed.candidates} == {"entry of '$.documents[*][*]' missing"}
    assert [c.text for c in parsed.candidates] == [None] * 5
    out = _filtered(CHROMA, body, {0, 4})
    assert out == chroma_body(
        [ROWS[:1], ROWS[4:]], nulls=("documents", "embeddings", "uris", "data")
    )


def test_null_list_of_one_query_is_skipped() -> None:
    body = chroma_body([ROWS[:2], ROWS[2:]], null_queries={"metadatas": [0], "documents": [1]})
    parsed = _parse(CHROMA, body)
    assert [c.text for c in parsed.candidates] == ["alpha", "beta", None, None, None]
    out = _filtered(CHROMA, body, {1, 2})
    assert out == chroma_body(
        [ROWS[1:2], ROWS[2:3]], null_queries={"metadatas": [0], "documents": [1]}
    )


@pytest.mark.parametrize(
    ("entry", "chunk_id", "problem"),
    [
        (None, None, "entry of '$.ids[*]' missing"),
        ("", None, "entry of '$.ids[*]' is empty"),
        (12, "12", None),
        (1.5, None, "entry of '$.ids[*]' is not a string or integer"),
        (["SECRET"], None, "entry of '$.ids[*]' is not a string or integer"),
    ],
)
def test_parallel_id_problems(entry: Any, chunk_id: str | None, problem: str | None) -> None:
    parsed = _parse(FLAT, flat_body([(entry, "text", None, 0.1)]))
    assert parsed.candidates == (Candidate(0, chunk_id, "text", problem),)


def test_parallel_replacement_sets_id_and_text_entries() -> None:
    rows: list[Row] = [(1, "old", {"m": 1}, 0.1), ("b", "other", None, 0.2)]
    out = _filtered(FLAT, flat_body(rows), {0, 1}, {0: Replacement("5", "new")})
    # No object holds a text in parallel arrays, so there is no marker.
    assert out == flat_body([(5, "new", {"m": 1}, 0.1), rows[1]])
    body = chroma_body([ROWS[:2]], nulls=("documents",))
    out = _filtered(CHROMA, body, {1}, {1: Replacement("x", "X")})
    assert out["ids"] == [["x"]]
    assert out["documents"] is None


@pytest.mark.parametrize(
    ("config", "body", "message"),
    [
        (FLAT, {**flat_body(ROWS), "scores": [0.1]}, "'\\$.scores\\[\\*\\]' is not aligned"),
        (FLAT, {**flat_body(ROWS), "documents": {}}, "expected an array"),
        (FLAT, {**flat_body(ROWS), "ids": None}, "expected an array"),
        (FLAT, {k: v for k, v in flat_body(ROWS).items() if k != "scores"}, "field 'scores'"),
        (CHROMA, {**chroma_body([ROWS]), "distances": [[0.1] * 5, []]}, "more arrays"),
        (CHROMA, {**chroma_body([ROWS, ROWS]), "distances": [[0.1] * 5]}, "no array"),
        (CHROMA, {**chroma_body([ROWS]), "distances": [[0.1] * 4]}, "not aligned"),
        (CHROMA, {**chroma_body([ROWS]), "distances": [{}]}, "expected an array"),
        (CHROMA, {**chroma_body([ROWS]), "distances": [[0.1] * 5, None]}, None),
        (CHROMA, {**chroma_body([ROWS]), "ids": [None]}, "expected an array"),
        (CHROMA, {**chroma_body([ROWS]), "ids": [ROWS[0][0]]}, "expected an array"),
        (CHROMA, {**chroma_body([ROWS]), "documents": "SECRET"}, "expected an array"),
    ],
)
def test_misaligned_parallel_arrays(
    config: Mapping[str, Any], body: Body, message: str | None
) -> None:
    if message is None:
        # A null where no ids are holds nothing of any hit.
        assert len(_parse(config, body).candidates) == 5
        return
    with pytest.raises(MalformedBody, match=message) as raised:
        _parse(config, body)
    assert "SECRET" not in str(raised.value)


# -- malformed bodies ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "body"),
    [
        (INHOUSE, b""),
        (INHOUSE, b"{not json"),
        (INHOUSE, b'{"results": [], "x": "\xff"}'),
        (INHOUSE, b"[" * 2000),
        (INHOUSE, b"[]"),
        (INHOUSE, b'"SECRET"'),
        (INHOUSE, b"null"),
        (INHOUSE, b'{"total": 0}'),
        (INHOUSE, b'{"results": null}'),
        (INHOUSE, b'{"results": {"0": {}}}'),
        (INHOUSE, b'{"results": ["SECRET"]}'),
        (INHOUSE, b'{"results": [null]}'),
        (INHOUSE, b'{"results": [], "total": "SECRET"}'),
        (INHOUSE, b'{"results": [], "total": true}'),
        (INHOUSE, b'{"results": [], "total": [1]}'),
        (BATCHES, b'{"batches": {}}'),
        (BATCHES, b'{"batches": [{"results": []}, {"total": 1}]}'),
        (BATCHES, b'{"batches": [null]}'),
        (BATCHES, b'{"batches": [{"results": [], "total": "SECRET"}]}'),
        (CHROMA, b'{"ids": [["a"]]}'),
        (CHROMA, b'{"ids": ["SECRET"], "documents": ["SECRET"]}'),
        (FLAT, b'{"ids": [], "documents": []}'),
    ],
)
def test_malformed_bodies(config: Mapping[str, Any], body: bytes) -> None:
    with pytest.raises(MalformedBody) as raised:
        generic_format(config).parse(body, route_of(config))
    assert "SECRET" not in str(raised.value)
    assert raised.value.__cause__ is None
    assert raised.value.__context__ is None


# -- properties ---------------------------------------------------------------------

_ids = st.integers(min_value=0, max_value=2**63) | st.text(min_size=1, max_size=6)


_ABSENT = object()  # a field left out of a hit


def _without_absent(fields: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in fields.items() if value is not _ABSENT}


@st.composite
def _hits(draw: st.DrawFn) -> list[Hit]:
    """In-house results, with ids and texts missing, null or of a wrong type now and then."""
    texts = st.text(max_size=8) | st.none() | st.just(_ABSENT) | st.integers(0, 2**63)
    contents = (
        st.builds(
            lambda text, extra: _without_absent({**extra, "text": text}),
            texts,
            st.dictionaries(st.sampled_from(["lang", "page", "x"]), json_values, max_size=2),
        )
        | st.none()
        | st.just(_ABSENT)
    )
    return [
        _without_absent(
            {
                "doc_id": draw(_ids | st.none() | st.just(_ABSENT) | st.booleans()),
                "score": draw(st.floats(allow_nan=False, allow_infinity=False)),
                "content": draw(contents),
                "extra": draw(json_values),
            }
        )
        for _ in range(draw(st.integers(min_value=0, max_value=5)))
    ]


def _expected_hit_candidate(position: int, result: Hit) -> tuple[Any, ...]:
    doc_id = result.get("doc_id")
    chunk_id = (
        str(doc_id) if isinstance(doc_id, int | str) and not isinstance(doc_id, bool) else None
    )
    content = result.get("content")
    text = content.get("text") if isinstance(content, dict) else None
    text = text if isinstance(text, str) else None
    if chunk_id == "":
        chunk_id = None
    return position, chunk_id, text, chunk_id is None or text is None


def _released_hit(result: Hit) -> Hit:
    """A result as BATCHES sends it: its id, score and text (and marker) only."""
    sent: Hit = {key: result[key] for key in ("doc_id", "score") if key in result}
    content = result.get("content")
    if isinstance(content, dict):
        kept = {k: v for k, v in content.items() if k in ("text", SUBSTITUTED_FOR)}
        if kept:
            sent["content"] = kept
    return sent


def _candidate_tuple(candidate: Candidate) -> tuple[Any, ...]:
    return (
        candidate.position,
        candidate.chunk_id,
        candidate.text,
        candidate.problem is not None,
    )


@PROPERTIES
@given(batches=st.lists(_hits(), max_size=3), data=st.data())
def test_property_hits_render_keeps_exactly_the_kept_hits(
    batches: list[list[Hit]], data: st.DataObject
) -> None:
    body = batches_body(batches)
    flat = [result for results in batches for result in results]
    keep = data.draw(st.sets(st.integers(min_value=-1, max_value=len(flat) + 1)))
    parsed = _parse(BATCHES, body)
    assert [_candidate_tuple(c) for c in parsed.candidates] == [
        _expected_hit_candidate(i, result) for i, result in enumerate(flat)
    ]
    expected, start = [], 0
    for results in batches:
        expected.append([_released_hit(result) for result in _kept(results, keep, start)])
        start += len(results)
    assert _filtered(BATCHES, body, keep) == batches_body(expected, facets=False)
    assert parsed.released_positions(keep) == sorted(k for k in keep if 0 <= k < len(flat))


_rows = st.tuples(
    _ids | st.none(),
    st.text(max_size=8) | st.none(),
    st.none() | st.dictionaries(st.sampled_from(["lang", "page"]), json_scalars, max_size=2),
    st.floats(allow_nan=False, allow_infinity=False),
)


@PROPERTIES
@given(
    queries=st.lists(st.lists(_rows, max_size=4), max_size=3),
    nulls=st.sets(st.sampled_from(CHROMA_ARRAYS)),
    data=st.data(),
)
def test_property_parallel_arrays_stay_aligned(
    queries: list[list[Row]], nulls: set[str], data: st.DataObject
) -> None:
    null_queries = {
        name: data.draw(st.sets(st.integers(min_value=0, max_value=len(queries) - 1)))
        for name in CHROMA_ARRAYS
        if queries and name not in nulls
    }
    body = chroma_body(queries, nulls=nulls, null_queries=null_queries)
    rows = [row for q in queries for row in q]
    texts = [
        None if "documents" in nulls or qi in null_queries.get("documents", ()) else row[1]
        for qi, q in enumerate(queries)
        for row in q
    ]
    keep = data.draw(st.sets(st.integers(min_value=0, max_value=max(len(rows) - 1, 0))))
    parsed = _parse(CHROMA, body)
    assert [(c.chunk_id, c.text) for c in parsed.candidates] == [
        (None if row[0] is None else str(row[0]), text)
        for row, text in zip(rows, texts, strict=True)
    ]
    expected, start = [], 0
    for q in queries:
        expected.append(_kept(q, keep, start))
        start += len(q)
    filtered = _filtered(CHROMA, body, keep)
    assert filtered == chroma_body(expected, nulls=nulls, null_queries=null_queries)


@PROPERTIES
@given(rows=st.lists(_rows, max_size=6), nulls=st.sets(st.sampled_from(["scores", "metadatas"])))
def test_property_flat_arrays_with_replacements(rows: list[Row], nulls: set[str]) -> None:
    body = flat_body(rows, nulls=nulls)
    parsed = _parse(FLAT, body)
    keep = {i for i, c in enumerate(parsed.candidates) if i % 3 != 1}
    replacements = {i: Replacement(f"r{i}", f"text {i}") for i in keep if i % 2 == 0}
    out = parsed.render(keep, replacements=replacements)
    FlatResponse.model_validate_json(out)
    again = generic_format(FLAT).parse(out, route_of(FLAT))
    kept_candidates = [parsed.candidates[i] for i in sorted(keep)]
    assert [(c.chunk_id, c.text) for c in again.candidates] == [
        (f"r{c.position}", f"text {c.position}")
        if c.position in replacements
        else (c.chunk_id, c.text)
        for c in kept_candidates
    ]


@PROPERTIES
@given(batches=st.lists(_hits(), max_size=3), data=st.data())
def test_property_hit_replacements_change_only_id_text_and_marker(
    batches: list[list[Hit]], data: st.DataObject
) -> None:
    body = batches_body(batches)
    parsed = _parse(BATCHES, body)
    usable = [c.position for c in parsed.candidates if c.problem is None]
    replaced = data.draw(st.sets(st.sampled_from(usable))) if usable else set()
    replacements = {i: Replacement(data.draw(_ids).__str__(), f"new {i}") for i in replaced}
    out = orjson.loads(parsed.render(range(len(parsed.candidates)), replacements=replacements))
    originals = [result for results in batches for result in results]
    rendered = [result for batch in out["batches"] for result in batch["results"]]
    for position, (original, after) in enumerate(zip(originals, rendered, strict=True)):
        before = _released_hit(original)
        if position not in replacements:
            assert after == before
            continue
        assert str(after["doc_id"]) == replacements[position].chunk_id
        assert after["content"]["text"] == replacements[position].text
        assert after["content"][SUBSTITUTED_FOR] == before["doc_id"]
        strip = {"doc_id", "content"}
        assert {k: v for k, v in after.items() if k not in strip} == {
            k: v for k, v in before.items() if k not in strip
        }
