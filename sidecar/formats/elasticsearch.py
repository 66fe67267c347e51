"""Elasticsearch and OpenSearch search responses: search, scroll, templates, kNN, multi-search.

Both databases answer every search endpoint with the same body (``took``,
``timed_out``, ``_shards``, ``hits: {total, max_score, hits: [...]}``, ...);
multi-search wraps one such body, or an error item, per request in
``responses``. Each hit is a candidate: its id is ``_id`` (or the ``_source``
field ``id_field``), its text the ``_source`` field ``text_field`` (top level
of ``_source``; a hit without ``_source`` is a malformed chunk).

A substitute takes the hit's text and id, the marker goes into its
``_source``, and it loses its highlights and the ``fields`` entries of the
text and id field (they quote the replaced document).

Removing hits leaves the rest of a body describing documents that were never
checked, so rendering rebuilds it:

- ``hits.total`` is recomputed from the kept hits (``gte`` when more matched
  than were returned), or removed; the integer form stays an integer.
- ``hits.max_score`` (and a top-level ``max_score``) becomes the best kept
  ``_score``.
- ``aggregations`` and ``suggest`` are computed over every matching document
  (``top_hits`` and completion suggestions even carry their ``_source``): they
  are removed unless the operator keeps them.
- ``inner_hits`` of a kept hit may be other documents (parent/child, collapse):
  removed unless kept.
- ``fields`` entries shaped like a lookup runtime field (objects of value
  lists, which is also how nested fields come back) are removed: a lookup
  field copies fields of documents in another index.
- ``profile`` is removed: its rewritten queries can hold terms read from
  stored documents (``more_like_this``, terms lookup) and its collector counts
  cover every matching document.
- Any other key of a response or of its ``hits`` object is removed, known or
  not, because nothing says it was not computed from rejected hits;
  OpenSearch's ``ext`` holds search pipeline output such as a RAG answer
  generated from every hit. A multi-search body keeps ``took`` and
  ``responses``; its error items pass untouched.
- Kept as they are: ``took``, ``timed_out``, ``_shards``, ``_clusters``,
  ``_scroll_id``, ``pit_id`` (the next page is a filtered search too),
  ``num_reduce_phases``, ``terminated_early``, ``phase_took``, ``status``,
  and every other field of a kept hit (``highlight``, ``sort``,
  ``matched_queries``, ``_explanation``, ...), which describe that hit's own
  document.

These rules hold for every render, even one that keeps every hit (to
substitute a chunk): aggregations and the rest were computed over matches
beyond the returned page as well.

The adapter claims only paths with an API segment (``_name``) first or after
an index expression, plus ``/``. Index-level paths (``PUT /{index}``, ``GET
/{index}``) are left unclaimed: the request policy reads unknown GETs as
reads and other unknown methods as writes, which is what they are. Legacy
typed paths (``/{index}/{type}/{id}``, Elasticsearch 7 and REST
compatibility mode) are not recognised.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, get_args

from sidecar.core.hits import Replacement, Route, RouteKind
from sidecar.formats import elasticsearch_routes as routes
from sidecar.formats.base import MalformedBody, ResponseAdapter, id_field_option, text_field_option
from sidecar.formats.body import HitBody, Selection
from sidecar.formats.hits import Field, HitLayout, Hits

TotalMode = Literal["recompute", "remove"]
KeepMode = Literal["remove", "keep"]

# Top-level keys of a search response that say nothing about rejected hits.
_KEPT_KEYS: Final = frozenset(
    {
        "took",
        "timed_out",
        "_shards",
        "_clusters",
        "_scroll_id",
        "pit_id",
        "num_reduce_phases",
        "terminated_early",
        "phase_took",  # OpenSearch per-phase timings
        "status",  # on multi-search items
    }
)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_score(value: Any, label: str) -> None:
    if value is not None and not _is_number(value):
        raise MalformedBody(f"{label} is not a number")


def _check_total(total: Any) -> None:
    """``hits.total``: absent, an integer (rest_total_hits_as_int) or ``{value, relation}``."""
    if total is None or (isinstance(total, int) and not isinstance(total, bool)):
        return
    if (
        isinstance(total, dict)
        and isinstance(total.get("value"), int)
        and not isinstance(total["value"], bool)
        and total.get("relation") in ("eq", "gte")
    ):
        return
    raise MalformedBody("hits.total is neither a count nor {value, relation}")


def _lookup_shaped(values: Any) -> bool:
    """True for a ``fields`` entry shaped like a lookup runtime field: ``[{"f": [..]}]``."""
    return isinstance(values, list) and any(
        isinstance(value, dict) and value and all(isinstance(v, list) for v in value.values())
        for value in values
    )


@dataclass(frozen=True, slots=True)
class _Response:
    """One search response: the whole body, or one item of a multi-search."""

    document: dict[str, Any]
    hits: dict[str, Any]  # the ``hits`` object, its list already checked
    start: int  # position of the first hit


def _response(document: Any, hits: Hits) -> _Response:
    """Check a search response and number its hits."""
    if not isinstance(document, dict):
        raise MalformedBody("a search response is not a JSON object")
    found = document.get("hits")
    if not isinstance(found, dict) or not isinstance(found.get("hits"), list):
        # filter_path can drop hits.hits; a body without them cannot be checked.
        raise MalformedBody("a search response has no hits.hits list")
    _check_total(found.get("total"))
    _check_score(found.get("max_score"), "hits.max_score")
    _check_score(document.get("max_score"), "max_score")
    start = len(hits.candidates)
    for hit in found["hits"]:
        if isinstance(hit, dict):
            _check_score(hit.get("_score"), "a hit's _score")
            if "fields" in hit and not isinstance(hit["fields"], dict):
                raise MalformedBody("a hit's fields is not an object")
        hits.add(hit)
    return _Response(document, found, start)


def _item(item: Any, hits: Hits) -> _Response | None:
    """A multi-search item: a search response, or None for an error item."""
    if isinstance(item, dict) and "hits" not in item and "error" in item:
        return None
    return _response(item, hits)


@dataclass(frozen=True, slots=True)
class _Options:
    text_field: str
    id_field: str | None
    total: TotalMode
    aggregations: KeepMode
    suggest: KeepMode
    inner_hits: KeepMode


def _max_score(upstream: Any, hits: Sequence[dict[str, Any]]) -> Any:
    """The best kept ``_score``; null when the upstream had none or no kept hit has one."""
    if upstream is None:
        return None
    scores = [hit["_score"] for hit in hits if _is_number(hit.get("_score"))]
    return max(scores, default=None)


def _total(upstream: Any, returned: int, kept: int) -> Any:
    if not isinstance(upstream, dict):
        return kept  # the integer form cannot say "at least"
    # Matches beyond this page were never checked: the kept count is a lower bound.
    more = upstream["relation"] == "gte" or upstream["value"] > returned
    return {**upstream, "value": kept, "relation": "gte" if more else "eq"}


# Shard and cluster statistics: their counts stay, their failure lists go
# (a failure's reason can quote a document, e.g. a script error on a hit the
# gate removed).
_COUNTS_ONLY: Final = frozenset({"_shards", "_clusters"})


def _counts(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    return {
        k: v for k, v in value.items() if isinstance(v, int | float) and not isinstance(v, bool)
    }


def _error_item(item: Any) -> Any:
    """A multi-search error item as sent on: its status and error type, not its reason text."""
    error = item.get("error") if isinstance(item, dict) else None
    kind = error.get("type") if isinstance(error, dict) else None
    out: dict[str, Any] = {"error": {"type": kind if isinstance(kind, str) else "error"}}
    if isinstance(item, dict) and "status" in item:
        out["status"] = item["status"]
    return out


@dataclass(eq=False)
class _ElasticsearchBody(HitBody):
    """Side structures are rebuilt as the module docstring describes."""

    document: dict[str, Any]
    # A plain search: its response. A multi-search: one entry per item, None
    # for error items, which pass untouched.
    single: _Response | None
    items: tuple[_Response | None, ...]
    options: _Options

    def _rebuild(self, selection: Selection) -> dict[str, Any]:
        if self.single is not None:
            return self._response(self.single, selection)
        responses = [
            self._response(item, selection) if item is not None else _error_item(original)
            for item, original in zip(self.items, self.document["responses"], strict=True)
        ]
        # A multi-search body has nothing else to say about its searches.
        return {
            key: responses if key == "responses" else value
            for key, value in self.document.items()
            if key in ("took", "responses")
        }

    def _response(self, response: _Response, selection: Selection) -> dict[str, Any]:
        items: list[Any] = response.hits["hits"]
        hits = [self._hit(hit) for hit in selection.sent(items, response.start)]
        options = self.options
        hits_object: dict[str, Any] = {}
        for key, value in response.hits.items():
            if key == "hits":
                hits_object[key] = hits
            elif key == "total" and options.total == "recompute":
                hits_object[key] = _total(value, len(items), len(hits))
            elif key == "max_score":
                hits_object[key] = _max_score(value, hits)
        out: dict[str, Any] = {}
        for key, value in response.document.items():
            if key == "hits":
                out[key] = hits_object
            elif key == "max_score":
                out[key] = _max_score(value, hits)
            elif key in _COUNTS_ONLY:
                out[key] = _counts(value)
            elif (
                key in _KEPT_KEYS
                or (key == "aggregations" and options.aggregations == "keep")
                or (key == "suggest" and options.suggest == "keep")
            ):
                out[key] = value
        return out

    def _hit(self, hit: dict[str, Any]) -> dict[str, Any]:
        out = dict(hit)
        if self.options.inner_hits == "remove":
            out.pop("inner_hits", None)
        if "fields" in out:
            out["fields"] = {k: v for k, v in out["fields"].items() if not _lookup_shaped(v)}
        return out

    def _substituted(self, hit: Any, replacement: Replacement) -> dict[str, Any]:
        out = self._layout.substituted(hit, replacement)
        # Highlights quote the replaced text, and fields may hold copies of it
        # (stored or docvalue fields); the substitute's own would need a new search.
        out.pop("highlight", None)
        if "fields" in out:
            dropped = (self.options.text_field, self.options.id_field)
            out["fields"] = {k: v for k, v in out["fields"].items() if k not in dropped}
        return out


class ElasticsearchFormat(ResponseAdapter[str]):
    """Adapter for Elasticsearch's and OpenSearch's REST APIs (same search response).

    ``total``: "recompute" (default) or "remove" ``hits.total``.
    ``aggregations``, ``suggest``, ``inner_hits``: "remove" (default) or
    "keep". Keeping them is unsafe: they are computed from, or are, documents
    the gate never checked.
    """

    name = "elasticsearch"

    def __init__(
        self,
        *,
        text_field: str = "text",
        id_field: str | None = None,
        total: TotalMode = "recompute",
        aggregations: KeepMode = "remove",
        suggest: KeepMode = "remove",
        inner_hits: KeepMode = "remove",
    ) -> None:
        text_field = text_field_option(text_field)
        id_field = id_field_option(id_field)
        for option, value, allowed in (
            ("total", total, get_args(TotalMode)),
            ("aggregations", aggregations, get_args(KeepMode)),
            ("suggest", suggest, get_args(KeepMode)),
            ("inner_hits", inner_hits, get_args(KeepMode)),
        ):
            if value not in allowed:
                raise ValueError(f"{option} must be one of {', '.join(map(repr, allowed))}")
        self._options = _Options(text_field, id_field, total, aggregations, suggest, inner_hits)
        text = Field((text_field,), f"_source field {text_field!r}", "_source")
        if id_field is None:
            chunk_id = Field(("_id",), "_id")
        else:
            chunk_id = Field((id_field,), f"_source field {id_field!r}", "_source")
        self._layout = HitLayout("hit", chunk_id, text, ("_source",))

    def route_kind(self, route: Route) -> RouteKind | None:
        """FILTERED for the search endpoints; the kind of any other API path.

        Searches: ``_search``, ``_search/scroll``, ``_search/template``,
        ``_msearch``, ``_msearch/template``, ``_knn_search``, search
        applications and Fleet searches. Document reads (``_doc``,
        ``_source``, ``_mget``, ...), query languages (SQL, ES|QL, EQL, PPL),
        async searches and snapshots are CONTENT; counts, PIT, cat and
        cluster reads are READ; anything that changes data is WRITE. Unknown
        API paths count as content when read and as writes otherwise. Paths
        without an API segment are not claimed, except ``/``.
        """
        return routes.route_kind(route)

    def _shape(self, route: Route) -> str | None:
        return routes.shape(route)

    def _read(self, document: dict[str, Any], shape: str) -> _ElasticsearchBody:
        hits = Hits(self._layout)
        if shape == routes.SINGLE:
            single = _response(document, hits)
            return _ElasticsearchBody(hits, document, single, (), self._options)
        responses = document.get("responses")
        if not isinstance(responses, list):
            raise MalformedBody("a multi-search body has no responses list")
        items = tuple(_item(item, hits) for item in responses)
        return _ElasticsearchBody(hits, document, None, items, self._options)
