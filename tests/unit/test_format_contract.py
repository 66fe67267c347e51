"""The format contract, one property suite run against every adapter.

Each adapter's cases (``CONTRACT_CASES`` of ``tests/fixtures/<db>_bodies.py``)
give a format, the shapes of its filtered routes and a body builder. Built
from the kept hits alone, a body is what rendering must give; whatever else
the adapter parses, what it renders holds exactly the hits it says it
released. Database-specific cases stay in ``tests/test_format_<db>.py``.

On the request side every adapter, REST and gRPC, reads the collections a
body names (``request_collections``) exactly as its rewrite names them, over
the request fuzz corpus (``tests/corpus/request-*``) and arbitrary bodies.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.hits import Replacement, Route
from sidecar.formats.base import (
    SUBSTITUTED_FOR,
    AbsentAnswer,
    MalformedBody,
    MalformedRequest,
    ParsedBody,
    RequestCapabilities,
    RequestRewrite,
    ResponseFormat,
    Unreleasable,
)
from sidecar.formats.generic.rest import GenericFormat
from sidecar.formats.hits import Hits
from sidecar.formats.registry import BUILT_IN
from tests.fixtures import (
    chroma_bodies,
    elasticsearch_bodies,
    generic_bodies,
    milvus_bodies,
    pinecone_bodies,
    qdrant_bodies,
    weaviate_bodies,
)
from tests.fixtures.format_strategies import (
    PROPERTIES,
    FormatCase,
    Hit,
    Json,
    Shape,
    batches,
    json_values,
    mutated,
)

CASES = [
    *qdrant_bodies.CONTRACT_CASES,
    *chroma_bodies.CONTRACT_CASES,
    *weaviate_bodies.CONTRACT_CASES,
    *elasticsearch_bodies.CONTRACT_CASES,
    *pinecone_bodies.CONTRACT_CASES,
    *milvus_bodies.CONTRACT_CASES,
    *generic_bodies.CONTRACT_CASES,
]
contract = pytest.mark.parametrize("case", CASES, ids=str)


def _parse(case: FormatCase, shape: Shape, body: Json) -> ParsedBody:
    return case.format.parse(orjson.dumps(body), shape.route)


def _some(count: int) -> st.SearchStrategy[set[int]]:
    """Some of the positions of ``count`` hits."""
    return _some_of(range(count))


def _some_of(positions: Collection[int]) -> st.SearchStrategy[set[int]]:
    return st.sets(st.sampled_from(sorted(positions))) if positions else st.just(set())


def _kept(hits: list[list[Hit]], keep: Collection[int]) -> list[list[Hit]]:
    """``hits`` with only the positions in ``keep`` (positions number through all batches)."""
    out, position = [], 0
    for batch in hits:
        out.append([hit for i, hit in enumerate(batch, position) if i in keep])
        position += len(batch)
    return out


def _identities(parsed: ParsedBody, positions: Collection[int] | None = None) -> list[Any]:
    return [
        (c.chunk_id, c.text, c.problem)
        for c in parsed.candidates
        if positions is None or c.position in positions
    ]


# -- bodies the database sends ------------------------------------------------------


@PROPERTIES
@contract
@given(data=st.data())
def test_candidates_number_hits_in_body_order(case: FormatCase, data: st.DataObject) -> None:
    shape = data.draw(st.sampled_from(case.shapes))
    hits = data.draw(batches(shape))
    parsed = _parse(case, shape, case.build(shape, hits))
    assert _identities(parsed) == [(h.chunk_id, h.text, None) for b in hits for h in b]
    assert [c.position for c in parsed.candidates] == list(range(len(parsed.candidates)))


@PROPERTIES
@contract
@given(data=st.data())
def test_render_keeps_exactly_the_kept_hits(case: FormatCase, data: st.DataObject) -> None:
    shape = data.draw(st.sampled_from(case.shapes))
    hits = data.draw(batches(shape))
    body = case.build(shape, hits)
    parsed = _parse(case, shape, body)
    count = len(parsed.candidates)
    keep = data.draw(st.sets(st.integers(min_value=-1, max_value=count)))

    out = parsed.render(keep)

    assert orjson.loads(out) == case.build(shape, _kept(hits, keep))
    released = parsed.released_positions(keep)
    assert released == sorted(keep & set(range(count)))
    # Side structures (counts, scores, aligned arrays) let the body parse again
    # into exactly the released hits, in order.
    assert _reparsed(case, shape.route, out, released) == _identities(parsed, released)


@PROPERTIES
@contract
@given(data=st.data())
def test_render_never_mutates_and_can_be_called_again(
    case: FormatCase, data: st.DataObject
) -> None:
    shape = data.draw(st.sampled_from(case.shapes))
    body = case.build(shape, data.draw(batches(shape)))
    raw = orjson.dumps(body)
    parsed = case.format.parse(raw, shape.route)
    fresh = case.format.parse(raw, shape.route)
    count = len(parsed.candidates)

    for _ in range(3):
        keep = data.draw(_some(count))
        replacements = _replacements(parsed, keep, data)
        first = parsed.render(keep, replacements=replacements)
        # After a render, what it released is known without rendering again.
        released = parsed.released_positions(keep)
        assert released == fresh.released_positions(keep)
        released.append(-1)  # a copy is handed out
        assert parsed.released_positions(keep) == fresh.released_positions(keep)
        assert parsed.render(keep, replacements=replacements) == first
    assert orjson.loads(parsed.render(range(count))) == body
    assert orjson.loads(raw) == body


@PROPERTIES
@contract
@given(data=st.data())
def test_substitutes_take_the_hits_place_and_are_marked(
    case: FormatCase, data: st.DataObject
) -> None:
    shape = data.draw(st.sampled_from(case.shapes))
    hits = data.draw(batches(shape))
    parsed = _parse(case, shape, case.build(shape, hits))
    count = len(parsed.candidates)
    keep = data.draw(_some(count))
    replaced = data.draw(_some_of(keep))
    new_ids = iter(range(2**60, 2**61))
    replacements = {p: Replacement(str(next(new_ids)), f"new text {p}") for p in replaced}

    out = parsed.render(keep, replacements=replacements)

    substituted: list[list[Hit]] = []
    position = 0
    for batch in hits:
        substituted.append([])
        for hit in batch:
            new = replacements.get(position)
            if new is not None:
                hit = Hit(new.chunk_id, new.text, hit.score, hit.ordinal, replaced=hit.chunk_id)
            substituted[-1].append(hit)
            position += 1
    assert orjson.loads(out) == case.build(shape, _kept(substituted, keep))
    markers = _values_of(orjson.loads(out), SUBSTITUTED_FOR)
    assert len(markers) == (len(replacements) if case.marks else 0)
    assert _reparsed(case, shape.route, out, keep) == [
        (replacements[p].chunk_id, replacements[p].text, None)
        if p in replacements
        else _identities(parsed, {p})[0]
        for p in sorted(keep)
    ]


def _values_of(value: Json, key: str) -> list[Json]:
    """Every value of ``key`` anywhere in ``value``."""
    if isinstance(value, dict):
        found = [value[key]] if key in value else []
        return found + [v for child in value.values() for v in _values_of(child, key)]
    if isinstance(value, list):
        return [v for child in value for v in _values_of(child, key)]
    return []


# -- anything else the adapter is handed --------------------------------------------


def _replacements(
    parsed: ParsedBody, keep: Collection[int], data: st.DataObject
) -> dict[int, Replacement]:
    """Substitutes for some kept hits that have an id and a text, as the gate makes them."""
    usable = {c.position for c in parsed.candidates if c.position in keep and c.problem is None}
    chosen = data.draw(_some_of(usable))
    return {p: Replacement(str(9000 + p), f"new {p}") for p in chosen}


def _reparsed(case: FormatCase, route: Route, out: bytes, released: Collection[int]) -> list[Any]:
    """The hits a client reads in a rendered body: it parses again."""
    try:
        return _identities(case.format.parse(out, route))
    except MalformedBody:
        # Only a render that releases nothing may leave a body without the
        # container of its hits.
        assert case.empty_may_not_parse and not released
        return []


def _check_parses_or_is_malformed(
    case: FormatCase, route: Route, body: bytes, data: st.DataObject
) -> None:
    """MalformedBody (chaining nothing), or a body whose every render holds exactly
    the hits it releases, substitutes included: never a rejected hit."""
    try:
        parsed = case.format.parse(body, route)
    except MalformedBody as exc:
        assert exc.__cause__ is None and exc.__context__ is None
        return
    count = len(parsed.candidates)
    for keep in (set(range(count)), set(), data.draw(_some(count))):
        replacements = _replacements(parsed, keep, data)
        try:
            out = parsed.render(keep, replacements=replacements)
        except AbsentAnswer:
            # The database's own "not found" for a route that asks for one hit:
            # only when that hit is not kept.
            assert count == 1 and not keep
            continue
        except Unreleasable:
            # Refused whole: nothing goes out.
            assert case.may_refuse
            continue
        released = parsed.released_positions(keep)
        if case.releases_all_kept:
            assert released == sorted(keep)
        assert released == sorted(set(released)) and set(released) <= keep
        assert _reparsed(case, route, out, released) == [
            (replacements[p].chunk_id, replacements[p].text, None)
            if p in replacements
            else _identities(parsed, {p})[0]
            for p in released
        ]
        if len(keep) < count:
            assert orjson.loads(out) != orjson.loads(body)
    if case.renders_all_unchanged:
        assert orjson.loads(parsed.render(range(count))) == orjson.loads(body)


@PROPERTIES
@contract
@given(body=st.binary(max_size=64), data=st.data())
def test_any_bytes_parse_or_are_malformed(
    case: FormatCase, body: bytes, data: st.DataObject
) -> None:
    shape = data.draw(st.sampled_from(case.shapes))
    _check_parses_or_is_malformed(case, shape.route, body, data)


@PROPERTIES
@contract
@given(value=json_values, data=st.data())
def test_any_json_parses_or_is_malformed(
    case: FormatCase, value: Json, data: st.DataObject
) -> None:
    shape = data.draw(st.sampled_from(case.shapes))
    wrap = data.draw(st.sampled_from(case.wrappers))
    _check_parses_or_is_malformed(case, shape.route, orjson.dumps(wrap(value)), data)


@PROPERTIES
@contract
@given(data=st.data())
def test_mutated_bodies_parse_or_are_malformed(case: FormatCase, data: st.DataObject) -> None:
    built = [(s.route, case.build(s, data.draw(batches(s)))) for s in case.shapes]
    route, body = data.draw(st.sampled_from([*built, *case.seeds]))
    _check_parses_or_is_malformed(case, route, orjson.dumps(data.draw(mutated(body))), data)


# -- the parse guard ---------------------------------------------------------------------


def _a_body(case: FormatCase) -> tuple[Route, bytes]:
    shape = case.shapes[0]
    hit = Hit("7", "SECRET text", 0.5, 0)
    return shape.route, orjson.dumps(case.build(shape, [[hit]] * shape.batches[1]))


@contract
def test_invalid_json_does_not_chain_the_body(case: FormatCase) -> None:
    # orjson's decode error keeps the whole document in its .doc attribute.
    with pytest.raises(MalformedBody) as raised:
        case.format.parse(b'{"result": "SECRET', case.shapes[0].route)
    assert raised.value.__cause__ is None
    assert raised.value.__context__ is None
    assert "SECRET" not in str(raised.value)


@contract
@pytest.mark.parametrize("where", ["adapter", "collector"])
def test_adapter_bugs_become_malformed_body(
    case: FormatCase, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object) -> Any:
        raise KeyError("SECRET")

    if where == "adapter":
        monkeypatch.setattr(type(case.format), "_read", broken)
        monkeypatch.setattr(type(case.format), "_read_echoed", broken)
    else:
        monkeypatch.setattr(Hits, "add", broken)
        monkeypatch.setattr(Hits, "add_found", broken)
    route, body = _a_body(case)
    with pytest.raises(MalformedBody, match=case.format.name) as raised:
        case.format.parse(body, route)
    assert raised.value.__context__ is None
    assert "SECRET" not in str(raised.value)


@contract
def test_parse_refuses_a_route_it_does_not_handle(case: FormatCase) -> None:
    _, body = _a_body(case)
    with pytest.raises(ValueError, match=f"route is not handled by the {case.format.name} format"):
        case.format.parse(body, case.unhandled)


# -- trimming an over-fetched answer back to what the app asked for -------------------

# Every format that over-fetches, with its shapes whose limit counts hits (a group
# search's counts groups: tests/unit/test_format_qdrant.py).
TRIMMING = [
    (case, [shape for shape in case.shapes if "groups" not in shape.name])
    for case in CASES
    if not isinstance(case.format, GenericFormat)
]


@PROPERTIES
@pytest.mark.parametrize(("case", "shapes"), TRIMMING, ids=[str(c) for c, _ in TRIMMING])
@given(data=st.data())
def test_trimming_sends_the_first_kept_hits_up_to_each_limit(
    case: FormatCase, shapes: list[Shape], data: st.DataObject
) -> None:
    """An over-fetched answer goes out with exactly the first ``limit`` kept hits of each
    sub-result (all of them when fewer are kept), in rank order, and nothing else:
    what the app would have got had the database been asked for that many."""
    shape = data.draw(st.sampled_from(shapes))
    hits = data.draw(batches(shape))
    parsed = _parse(case, shape, case.build(shape, hits))
    keep = data.draw(_some(len(parsed.candidates)))
    sub_results = getattr(parsed, "sub_results", None)
    if sub_results is None:
        # A body never over-fetched (a batch of GraphQL operations) refuses limits.
        with pytest.raises(MalformedBody, match="does not trim"):
            parsed.render(keep, [1])
        return
    assert sub_results in (1, len(hits)), "one limit for the answer, or one per sub-result"
    limits = data.draw(
        st.lists(st.none() | st.integers(0, 6), min_size=sub_results, max_size=sub_results)
    )
    # One limit holds for every list of the answer (Chroma's query embeddings).
    per_batch = limits * len(hits) if sub_results == 1 else limits

    out = parsed.render(keep, limits)

    sent = [batch[:limit] for batch, limit in zip(_kept(hits, keep), per_batch, strict=True)]
    assert orjson.loads(out) == case.build(shape, sent)
    released = parsed.released_positions(keep, limits)
    sent_ids = [(h.chunk_id, h.text, None) for batch in sent for h in batch]
    assert _identities(parsed, released) == sent_ids
    assert _reparsed(case, shape.route, out, released) == sent_ids


def test_every_format_that_over_fetches_runs_the_trimming_contract() -> None:
    trimmed = {case.format.name for case, shapes in TRIMMING if shapes}
    # The gRPC formats trim in their own modules (tests/unit/test_format_*_grpc.py).
    assert trimmed == {name for name in BUILT_IN if not name.endswith("_grpc")}


# The generic adapter pushes the tenant down when configured, but never over-fetches.
@pytest.mark.parametrize("case", [c for c in CASES if isinstance(c.format, GenericFormat)], ids=str)
def test_formats_that_never_over_fetch_refuse_limits(case: FormatCase) -> None:
    route, body = _a_body(case)
    parsed = case.format.parse(body, route)
    with pytest.raises(MalformedBody, match="does not trim"):
        parsed.render({0}, [1])
    with pytest.raises(MalformedBody, match="does not trim"):
        parsed.released_positions({0}, [1])
    assert parsed.render({0}, []) == parsed.render({0}, None)


def test_every_adapter_runs_the_contract() -> None:
    assert {type(case.format).__name__ for case in CASES} == {
        "QdrantFormat",
        "ChromaFormat",
        "WeaviateFormat",
        "ElasticsearchFormat",
        "PineconeFormat",
        "MilvusFormat",
        "GenericFormat",
    }


# -- the request side: the collections a body names ----------------------------------------

# The request fuzz targets live with the fuzzer (bench/ holds scripts).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from fuzz_requests import request_inputs  # noqa: E402

REQUESTS = list(request_inputs())
REQUEST_TARGETS = sorted({name for name, *_ in REQUESTS})
# What a rewrite applies, beside reading: nothing, push-down, over-fetch, both.
REWRITES = [(None, 1.0), ("tenant", 1.0), (None, 2.0), ("tenant", 2.0)]


def _named(read: Callable[..., tuple[str, ...]], *args: Any) -> tuple[str, ...] | str:
    """The collections ``read(*args)`` gives, or the refusal it raises."""
    try:
        return read(*args)
    except MalformedRequest as exc:
        return f"{type(exc).__name__}: {exc}"


def _rewrite_names(
    fmt: ResponseFormat, body: bytes, route: Route, tenant_key: str | None, factor: float
) -> tuple[str, ...]:
    rewrite = fmt.rewrite_request(
        body,
        route,
        tenant="acme",
        tenant_key=tenant_key,
        overfetch_factor=factor,
        overfetch_cap=100,
    )
    return rewrite.collections


def _check_request_collections(fmt: ResponseFormat, route: Route, body: bytes) -> None:
    """``request_collections`` is what a rewrite without anything to apply names (or
    refuses), and what every rewrite that goes through names."""
    read = _named(fmt.request_collections, body, route)
    for tenant_key, factor in REWRITES:
        rewritten = _named(_rewrite_names, fmt, body, route, tenant_key, factor)
        if tenant_key is None and factor == 1.0:
            assert read == rewritten
        elif not isinstance(rewritten, str):
            # Push-down and over-fetch refuse more, never name other collections.
            assert read == rewritten


@pytest.mark.parametrize("target", REQUEST_TARGETS)
def test_request_collections_are_what_the_rewrite_names(target: str) -> None:
    inputs = [(fmt, route, body) for name, fmt, route, body in REQUESTS if name == target]
    assert inputs
    for fmt, route, body in inputs:
        _check_request_collections(fmt, route, body)


@PROPERTIES
@given(
    request=st.sampled_from([(fmt, route) for _, fmt, route, _ in REQUESTS]),
    body=st.one_of(st.binary(max_size=64), json_values.map(orjson.dumps)),
)
def test_request_collections_of_any_body_are_what_the_rewrite_names(
    request: tuple[ResponseFormat, Route], body: bytes
) -> None:
    _check_request_collections(*request, body)


def test_every_adapter_reads_the_collections_of_its_requests() -> None:
    assert {fmt.name for _, fmt, _, _ in REQUESTS} >= set(BUILT_IN)
    assert any(isinstance(fmt, GenericFormat) for _, fmt, _, _ in REQUESTS)
    named = {
        fmt.name
        for _, fmt, route, body in REQUESTS
        if isinstance(found := _named(fmt.request_collections, body, route), tuple) and found
    }
    # The formats whose bodies name collections beyond the path.
    assert named >= {
        "qdrant",
        "milvus",
        "pinecone",
        "elasticsearch",
        "weaviate",
        "qdrant_grpc",
        "milvus_grpc",
        "pinecone_grpc",
        "weaviate_grpc",
    }


def test_a_format_that_reads_no_request_declares_so() -> None:
    defaults = RequestCapabilities()
    route = Route("POST", "/collections/docs/points/search")
    assert not defaults.rewrites_request(route)
    assert defaults.request_collections(b"not read", route) == ()
    rewrite = defaults.rewrite_request(
        b"as sent", route, tenant="acme", tenant_key="tenant", overfetch_factor=2, overfetch_cap=9
    )
    assert rewrite == RequestRewrite(b"as sent", (), tenant_filter=False, overfetched=False)
    assert defaults.query_string_problem(route, "q=x") is None
    assert defaults.overfetch_problem(route, "size=1") is None
    assert defaults.route_collections(route) is None
