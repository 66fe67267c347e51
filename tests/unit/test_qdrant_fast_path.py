"""The hit collector's and the Qdrant adapter's shortcuts agree with their full checks.

``Hits.add`` takes a fast path for well-formed hits; ``add_checked`` is the
full check. ``released_positions`` reuses what the last ``render`` released,
also when the render trimmed to Qdrant's over-fetch limits. Both must give
exactly what the long way gives, for any input.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.core.hits import Replacement, Route
from sidecar.formats.base import MalformedBody
from sidecar.formats.elasticsearch.rest import ElasticsearchFormat
from sidecar.formats.hits import Field, HitLayout, Hits
from sidecar.formats.milvus.rest import MilvusFormat
from sidecar.formats.options import AdapterOptions
from sidecar.formats.qdrant.rest import QdrantFormat
from tests.fixtures.format_strategies import PROPERTIES

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 2**64),
    st.floats(allow_nan=False),
    st.sampled_from(["", "c1", "0", "5c56c793-69f3-4fbf-87e6-c4bf54c28c26", "\u00e9"]),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=2), st.dictionaries(st.sampled_from(["a", "text"]), inner)
    ),
    max_leaves=4,
)
_payloads = st.one_of(
    _values,
    st.fixed_dictionaries(
        {},
        optional={"text": _values, "chunk": _values, "doc_id": _values},
    ),
)
_hits = st.one_of(
    _values,
    st.fixed_dictionaries({}, optional={"id": _values, "payload": _payloads, "score": _values}),
)


def outcome(add: Any, hit: Any) -> Any:
    try:
        return add(hit)
    except MalformedBody as exc:
        return ("malformed", str(exc))


def _layouts(id_field: str | None) -> list[HitLayout]:
    """Layouts of every kind the fast path takes: id beside the text's object (Qdrant's
    point id), both in one object (a payload id field), both in the hit (Milvus);
    and one it does not take (a nested id)."""
    return [
        QdrantFormat(AdapterOptions(id_field=id_field))._layout,
        ElasticsearchFormat(AdapterOptions(text_field="text", id_field=id_field))._layout,
        MilvusFormat(AdapterOptions(id_field=id_field or "doc_id"))._layout,
        HitLayout("hit", Field(("payload", "chunk"), "nested id"), Field(("text",), "text"), None),
    ]


@settings(max_examples=400)
@given(hit=_hits, id_field=st.sampled_from([None, "chunk", "doc_id"]), data=st.data())
def test_the_fast_path_gives_what_the_full_checks_give(
    hit: Any, id_field: str | None, data: st.DataObject
) -> None:
    layout = data.draw(st.sampled_from(_layouts(id_field)))
    fast, checked = Hits(layout), Hits(layout)
    assert outcome(fast.add, hit) == outcome(checked.add_checked, hit)
    assert fast.candidates == checked.candidates


@pytest.mark.parametrize(
    ("hit", "expected"),
    [
        ({"id": 7, "payload": {"text": "t"}}, ("7", "t", None)),
        ({"id": "u-1", "payload": {"text": "t"}}, ("u-1", "t", None)),
        (
            {"id": True, "payload": {"text": "t"}},
            (None, "t", "point id is not a string or integer"),
        ),
        ({"id": "", "payload": {"text": "t"}}, (None, "t", "point id is empty")),
        ({"id": 7, "payload": {"text": 3}}, ("7", None, "payload field 'text' is not a string")),
        ({"id": 7, "payload": None}, ("7", None, "no payload")),
    ],
)
def test_hits_the_fast_path_declines_are_still_named(
    hit: dict[str, Any], expected: tuple[Any, ...]
) -> None:
    hits = Hits(QdrantFormat()._layout)
    hits.add(hit)
    candidate = hits.candidates[0]
    assert (candidate.chunk_id, candidate.text, candidate.problem) == expected


SEARCH = Route("POST", "/collections/docs/points/search")
BATCH = Route("POST", "/collections/docs/points/search/batch")


def search_body(n: int) -> bytes:
    hits = [{"id": i, "score": 1.0, "payload": {"text": f"t{i}"}} for i in range(n)]
    return orjson.dumps({"result": hits, "status": "ok", "time": 0.0})


@PROPERTIES
@given(
    n=st.integers(0, 8),
    keeps=st.lists(st.frozensets(st.integers(0, 9)), min_size=1, max_size=3),
    limit=st.one_of(st.none(), st.integers(0, 5)),
)
def test_released_positions_after_render_match_a_fresh_computation(
    n: int, keeps: list[frozenset[int]], limit: int | None
) -> None:
    fmt = QdrantFormat()
    parsed = fmt.parse(search_body(n), SEARCH)
    fresh = fmt.parse(search_body(n), SEARCH)
    limits = None if limit is None else [limit]
    for keep in keeps:
        parsed.render(keep, limits, {0: Replacement("c9", "new")} if 0 in keep else None)
        for asked in (keep, keeps[0]):
            assert parsed.released_positions(asked, limits) == fresh.released_positions(
                asked, limits
            )
        # Other limits than the last render's are computed, not reused.
        assert parsed.released_positions(keep, [1]) == fresh.released_positions(keep, [1])


def test_released_positions_still_checks_the_limits() -> None:
    parsed = QdrantFormat().parse(search_body(3), SEARCH)
    parsed.render(frozenset({0, 1}))
    with pytest.raises(MalformedBody, match="sub-results"):
        parsed.released_positions(frozenset({0, 1}), [1, 1])


def test_a_released_list_handed_out_is_a_copy() -> None:
    parsed = QdrantFormat().parse(search_body(3), SEARCH)
    parsed.render(frozenset({0, 2}))
    first = parsed.released_positions(frozenset({0, 2}))
    first.append(99)
    assert parsed.released_positions(frozenset({0, 2})) == [0, 2]


def test_batch_released_positions_follow_each_sub_result() -> None:
    body = orjson.dumps(
        {
            "result": [
                [{"id": i, "score": 1.0, "payload": {"text": "t"}} for i in range(3)],
                [{"id": i, "score": 1.0, "payload": {"text": "t"}} for i in range(3, 5)],
            ],
            "status": "ok",
            "time": 0.0,
        }
    )
    parsed = QdrantFormat().parse(body, BATCH)
    keep = frozenset({1, 2, 3})
    parsed.render(keep, [1, None])
    assert parsed.released_positions(keep, [1, None]) == [1, 3]
    assert parsed.released_positions(keep, None) == [1, 2, 3]
